//! `drover windows` end to end through the binary.
//!
//! NOTE for the merge: these tests read the config through `config::load`,
//! which is a placeholder on the `gate` branch, so they fail there and are
//! meant to pass once the config parser is merged. The window computations
//! themselves are tested without config parsing in `windows_schedule.rs`.

use crate::support::cli::drover_output_at as drover;

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("environments")).expect("mkdir");
    std::fs::write(
        root.join("drover.toml"),
        "[promotion]\nchain = [\"test\", \"stage\"]\nreport_signers = \"agents.allowed_signers\"\n\n[clusters]\ntest = [\"test-1\"]\nstage = [\"stage-1\"]\n",
    )
    .expect("write");
    // No cluster reports here: an empty allowed-signers file.
    std::fs::write(root.join("agents.allowed_signers"), "").expect("write");
    std::fs::write(
        root.join("environments/test.toml"),
        "version = \"1.13.2\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\n",
    )
    .expect("write");
    std::fs::write(
        root.join("environments/stage.toml"),
        "version = \"1.13.2\"\n\n[window]\nschedule = \"0 2 8 * *\"\nduration = \"6h\"\ntimezone = \"Europe/Madrid\"\n",
    )
    .expect("write");
    dir
}

#[test]
fn json_lists_the_next_windows_in_utc() {
    let dir = repo();
    let out = drover(
        dir.path(),
        &[
            "--format",
            "json",
            "windows",
            "--env",
            "stage",
            "--from",
            "2026-12-08T03:00:00Z",
            "--count",
            "2",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        v,
        serde_json::json!({
            "ok": true,
            "errors": [],
            "env": "stage",
            "timezone": "Europe/Madrid",
            "paused": false,
            "windows": [
                {"start": "2026-12-08T01:00:00Z", "end": "2026-12-08T07:00:00Z"},
                {"start": "2027-01-08T01:00:00Z", "end": "2027-01-08T07:00:00Z"},
            ]
        })
    );
}

#[test]
fn timezone_defaults_to_utc_and_count_to_five() {
    let dir = repo();
    let out = drover(
        dir.path(),
        &[
            "--format",
            "json",
            "windows",
            "--env",
            "test",
            "--from",
            "2026-12-01T00:00:00Z",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["timezone"], "UTC");
    assert_eq!(v["windows"].as_array().map(Vec::len), Some(5));
    assert_eq!(v["windows"][0]["start"], "2026-12-01T02:00:00Z");
}

#[test]
fn text_shows_local_and_utc_times() {
    let dir = repo();
    let out = drover(
        dir.path(),
        &[
            "windows",
            "--env",
            "stage",
            "--from",
            "2026-12-01T00:00:00Z",
            "--count",
            "1",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("2026-12-08 02:00 CET"), "{text}");
    assert!(text.contains("2026-12-08T01:00:00Z"), "{text}");
}

#[test]
fn unknown_env_is_rejected_with_the_valid_ones() {
    let dir = repo();
    let out = drover(dir.path(), &["windows", "--env", "prod"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"prod\"")
            && err.contains("valid environments: ")
            && err.contains("stage")
            && err.contains("test"),
        "{err}"
    );
}

/// Overlapping windows are one window, valid whatever `--now` says, and an
/// `all` freeze cuts them while a `minor` one marks them "patch only".
#[test]
fn overlapping_windows_merge_and_freezes_cut_them_for_any_now() {
    let dir = repo();
    std::fs::write(
        dir.path().join("environments/stage.toml"),
        "version = \"1.13.2\"\n\n\
         [[window]]\nschedule = \"0 22 * * 5\"\nduration = \"10h\"\ntimezone = \"UTC\"\n\n\
         [[window]]\nschedule = \"0 6 * * 6\"\nduration = \"12h\"\ntimezone = \"UTC\"\n\n\
         [[freeze]]\nstart = 2026-12-05T10:00:00\nend = 2026-12-05T12:00:00\nreason = \"holiday\"\n\n\
         [[freeze]]\nstart = 2026-12-05T14:00:00Z\nend = 2026-12-05T20:00:00Z\nscope = \"minor\"\nreason = \"sale\"\n",
    )
    .expect("write");
    for now in [
        "2026-01-01T00:00:00Z",
        "2028-06-01T00:00:00Z",
        "2061-02-28T00:00:00Z",
    ] {
        let out = drover(dir.path(), &["check", "--now", now]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{now}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = drover(
        dir.path(),
        &[
            "--format",
            "json",
            "windows",
            "--env",
            "stage",
            "--from",
            "2026-12-04T00:00:00Z",
            "--count",
            "4",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    // Fri 22:00 + 10h and Sat 06:00 + 12h overlap: one window 22:00–18:00,
    // cut by the holiday (10:00–12:00), its end marked patch only (14:00–).
    assert_eq!(
        v["windows"],
        serde_json::json!([
            {"start": "2026-12-04T22:00:00Z", "end": "2026-12-05T10:00:00Z"},
            {"start": "2026-12-05T12:00:00Z", "end": "2026-12-05T14:00:00Z"},
            {"start": "2026-12-05T14:00:00Z", "end": "2026-12-05T18:00:00Z", "patch_only": "sale"},
            {"start": "2026-12-11T22:00:00Z", "end": "2026-12-12T18:00:00Z"},
        ])
    );
    let text = drover(
        dir.path(),
        &[
            "windows",
            "--env",
            "stage",
            "--from",
            "2026-12-04T00:00:00Z",
            "--count",
            "3",
        ],
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("patch updates only: sale"), "{text}");
    assert!(text.contains("holiday"), "{text}");
}
