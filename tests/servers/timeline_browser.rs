//! The timeline page in a real browser: headless Chromium (Debian's
//! package; scripts/test installs it) renders `drover demo --html` and
//! `drover status --html`; the tests assert on the screenshot (a PNG of the
//! expected size that is not blank, measured against a blank page rendered
//! in the same run) and on the DOM Chromium built (one row per cluster).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const WIDTH: u32 = 1240;
const HEIGHT: u32 = 900;

fn chromium() -> PathBuf {
    let p = PathBuf::from("/usr/bin/chromium");
    assert!(
        p.exists(),
        "headless Chromium is needed at /usr/bin/chromium; scripts/test installs it (apt-get install chromium)"
    );
    p
}

/// Run Chromium headless on `page` with `mode` (`--screenshot=...` or
/// `--dump-dom`), bounded by `timeout` so a stuck browser fails the test
/// instead of hanging it. Nothing leaves the machine: background
/// networking, component updates and sync are off, and the page is a file.
fn browse(page: &Path, mode: &str, profile: &Path) -> Output {
    let out = Command::new("timeout")
        .arg("120")
        .arg(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            &format!("--window-size={WIDTH},{HEIGHT}"),
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(mode)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium {mode} failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(png.len() > 24, "not a PNG: {} bytes", png.len());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG signature");
    assert_eq!(&png[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&png[16..20]), be(&png[20..24]))
}

fn screenshot(page: &Path, dir: &Path, name: &str) -> Vec<u8> {
    let png = dir.join(format!("{name}.png"));
    browse(
        page,
        &format!("--screenshot={}", png.display()),
        &dir.join(format!("profile-{name}")),
    );
    let bytes = std::fs::read(&png).expect("chromium wrote the screenshot");
    assert_eq!(png_size(&bytes), (WIDTH, HEIGHT), "{name}: screenshot size");
    bytes
}

fn dump_dom(page: &Path, dir: &Path, name: &str) -> String {
    let out = browse(page, "--dump-dom", &dir.join(format!("profile-dom-{name}")));
    String::from_utf8(out.stdout).expect("DOM is UTF-8")
}

/// `data-cluster` values of the rows in `html`, in order.
fn rows(html: &str) -> Vec<String> {
    html.split("class=\"cluster-row\"")
        .skip(1)
        .map(|rest| {
            let start = rest.find("data-cluster=\"").expect("row names its cluster") + 14;
            let end = rest[start..].find('"').unwrap() + start;
            rest[start..end].to_owned()
        })
        .collect()
}

#[test]
fn demo_timeline_renders_in_chromium() {
    let tmp = tempfile::tempdir().unwrap();
    let page = tmp.path().join("demo.html");
    let kept = tmp.path().join("repo");
    let out = crate::support::cli::drover_command()
        .args(["demo", "--html"])
        .arg(&page)
        .arg("--keep-repo")
        .arg(&kept)
        .output()
        .expect("drover demo runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The page stands alone: no script and nothing fetched.
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains("<script"), "the page carries a script");
    for fetch in ["src=", "href=\"http", "@import", "url(http"] {
        assert!(!html.contains(fetch), "the page fetches something: {fetch}");
    }

    // The control: a blank page of the same size, rendered in the same run.
    let blank = tmp.path().join("blank.html");
    std::fs::write(&blank, "<!DOCTYPE html><html><body></body></html>").unwrap();
    let blank_png = screenshot(&blank, tmp.path(), "blank");
    let png = screenshot(&page, tmp.path(), "demo");
    assert!(
        png.len() > 5 * blank_png.len(),
        "the timeline's screenshot ({} bytes) is not much more than a blank page's ({} bytes)",
        png.len(),
        blank_png.len()
    );

    // The DOM Chromium built: one row per cluster, grouped by environment in
    // chain order, with the story's marks, promotions and windows.
    let dom = dump_dom(&page, tmp.path(), "demo");
    assert_eq!(rows(&dom), ["test-1", "stage-1", "prod-eu-1", "prod-us-1"]);
    // Production in two waves: each row names its wave; prod-us-1's row
    // carries its own window (the night after prod-eu-1's, in New York).
    assert!(
        dom.contains("prod-eu-1  · wave 1"),
        "no wave on prod-eu-1's row"
    );
    assert!(
        dom.contains("prod-us-1  · wave 2"),
        "no wave on prod-us-1's row"
    );
    assert!(
        dom.contains("production window 2026-12-21T02:00:00-05:00"),
        "no New York window on prod-us-1's row"
    );
    let envs: Vec<&str> = dom
        .split("class=\"env\" data-env=\"")
        .skip(1)
        .map(|r| &r[..r.find('"').unwrap()])
        .collect();
    assert_eq!(envs, ["test", "stage", "production"]);
    // Confirmations: 1.12.0 at the start by all four, 1.13.2 by all four,
    // 1.13.3 by test-1, 1.13.4 by test-1 and stage-1.
    assert_eq!(dom.matches("class=\"confirmation\"").count(), 11);
    // Promotions: test → stage (1.13.2, 1.13.3, 1.13.4), stage → production (1.13.2).
    let promotions = dom.matches("class=\"promotion\"").count();
    assert_eq!(promotions, 4);
    assert!(dom.contains("class=\"window\""));
    // Hover text names the commit and the signer.
    assert!(dom.contains("status commit "), "no commit in hover text");
    assert!(dom.contains("signer not verified"));
    // test-1 waited for its window with 1.13.3 pinned: that is `pending`, not
    // an alarm; the one thing that failed is stage-1's 1.13.3 (its health
    // checks halted the rollout), outlined in red.
    assert_eq!(dom.matches("class=\"alarm\"").count(), 1);

    // Read back from the DOM Chromium built, the bars say what the nodes
    // ran: test-1 stayed on 1.13.2 while it waited (hatched) for 1.13.3;
    // stage-1 is back on 1.13.2 after its failed 1.13.3 (stage rolls back:
    // the one node that moved was driven back); nothing is solid past now; the revocation of 1.13.3 and the
    // refused pull requests are drawn as events.
    let d = crate::support::timeline::read(&dom);
    let mid_december = "2026-12-15T00:00:00Z".parse().unwrap();
    let mid_january = "2027-01-15T00:00:00Z".parse().unwrap();
    let mix = |c: &str, t, n| d.mix_at(c, t, n);
    let one = |v: &str, n: u32| std::collections::BTreeMap::from([(v.to_owned(), n)]);
    assert_eq!(mix("test-1", mid_december, 5), one("1.13.2", 5));
    assert_eq!(mix("stage-1", mid_january, 5), one("1.13.2", 5));
    assert!(d.row("test-1").rects.iter().any(|r| r.group == "pending"));
    let xn = d.x(d.now);
    for r in &d.rows {
        for rect in r.rects.iter().filter(|r| r.class == "nodes") {
            assert!(rect.x + rect.width <= xn + 0.5, "{}: {rect:?}", r.cluster);
        }
    }
    assert!(
        d.groups.iter().any(|g| g == "event revoked"),
        "{:?}",
        d.groups
    );
    assert!(
        d.groups.iter().any(|g| g.starts_with("event refused")),
        "{:?}",
        d.groups
    );

    // `drover status --now NOW --html` on the demo's repository: the page
    // and its DOM as Chromium reads it. It draws the same rows.
    let status_page = |now: &str, name: &str| {
        let page = tmp.path().join(format!("{name}.html"));
        let out = crate::support::cli::drover_command()
            .arg("--repo")
            .arg(&kept)
            .args(["status", "--now", now, "--html"])
            .arg(&page)
            .output()
            .expect("drover status runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dom = dump_dom(&page, tmp.path(), name);
        (page, dom)
    };
    let (page2, dom2) = status_page("2027-01-02T12:00:00Z", "status");
    assert_eq!(rows(&dom2), ["test-1", "stage-1", "prod-eu-1", "prod-us-1"]);
    // On the 20th, after prod-eu-1 confirmed, the page says what wave 2
    // waits on, on prod-us-1's row right of now: wave 1's soak.
    let (_, dom3) = status_page("2026-12-20T12:00:00Z", "waiting");
    let us = dom3
        .split("class=\"cluster-row\"")
        .find(|r| r.contains("data-cluster=\"prod-us-1\""))
        .expect("prod-us-1's row");
    assert!(us.contains("class=\"waits-on\""), "{us}");
    assert!(
        us.contains("wave 2 waits for wave 1's soak, which passes at 2026-12-21T03:35:00Z"),
        "{us}"
    );
    let png2 = screenshot(&page2, tmp.path(), "status");
    assert!(png2.len() > 5 * blank_png.len());
}
