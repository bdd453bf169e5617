//! Build facts `drover version` prints: the commit the binary was built
//! from and the build date; and the updater image a release build defaults
//! to.
//!
//! The commit is `DROVER_GIT_COMMIT` when set (an image build without
//! `.git`, deploy/Dockerfile), else `git rev-parse HEAD` of the source tree,
//! else `unknown`. The date honours `SOURCE_DATE_EPOCH` (reproducible
//! builds), else it is the day of the build. The script reruns only when
//! HEAD moves, so an unchanged tree is not rebuilt for a new date.
//!
//! `DROVER_UPDATER_IMAGE` is the Bottlerocket updater image the release
//! built (`REPOSITORY@sha256:<digest>`, the digest `deploy/updater/build`
//! computed): the default `[driver] image` of this binary. It must be
//! pinned by a digest that is not all zeros, or the build fails; unset, the
//! binary has no default (src/config/model.rs, docs/drivers.md).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// `YYYY-MM-DD` of a Unix time (days to civil date, proleptic Gregorian).
fn date(secs: i64) -> String {
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// `REPOSITORY@sha256:<64 lowercase hex digits>`, the digest not all zeros.
fn pinned(image: &str) -> bool {
    image.rsplit_once("@sha256:").is_some_and(|(repo, hex)| {
        !repo.is_empty()
            && !repo.contains(char::is_whitespace)
            && hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && hex.bytes().any(|b| b != b'0')
    })
}

fn main() {
    println!("cargo:rerun-if-env-changed=DROVER_UPDATER_IMAGE");
    let updater = std::env::var("DROVER_UPDATER_IMAGE").unwrap_or_default();
    if !updater.is_empty() && !pinned(&updater) {
        panic!(
            "DROVER_UPDATER_IMAGE={updater:?}: expected REPOSITORY@sha256:<64 lowercase hex \
             digits> of the updater image the release built (deploy/updater/build prints it), \
             not a tag or a placeholder"
        );
    }
    println!("cargo:rustc-env=DROVER_RELEASE_UPDATER_IMAGE={updater}");
    println!("cargo:rerun-if-env-changed=DROVER_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = std::env::var("DROVER_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    // Rerun when HEAD moves: HEAD itself (a switch), the branch it names
    // (a commit) and packed-refs.
    // A path that does not exist would rerun the script on every build.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for path in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        });
    println!("cargo:rustc-env=DROVER_COMMIT={commit}");
    println!("cargo:rustc-env=DROVER_BUILD_DATE={}", date(secs));
}
