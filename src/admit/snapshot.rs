//! A commit's config and policy, read out of git with the bounds of a
//! config file, its report signers checked (the policy's `report_signers`
//! file at the promotion key), and the few most recent kept for the
//! readers that ask for the same commits again.

use super::{Error, Policy};
use crate::config::{self, RepoConfig, ROOT_FILE};
use crate::diag::Diagnostic;
use crate::trust::{self, AllowedSigners};
use chrono::{DateTime, Utc};
use git2::{Oid, Repository, Tree};
use std::path::Path;

/// A commit's config and policy.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The commit.
    pub commit: Oid,
    /// Its validated config.
    pub config: RepoConfig,
    /// Its promotion policy.
    pub policy: Policy,
}

pub(super) fn read_small(
    repo: &Repository,
    tree: &Tree<'_>,
    path: &str,
) -> Result<Option<String>, String> {
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return Ok(None);
    };
    let odb = repo.odb().map_err(|e| e.to_string())?;
    let (size, _) = odb.read_header(entry.id()).map_err(|e| e.to_string())?;
    // Bounded as a config file is: one line per cluster of the fleet.
    if size as u64 > config::MAX_FILE_BYTES {
        return Err(format!(
            "{size} bytes; an allowed-signers file may have at most {} KiB",
            config::MAX_FILE_BYTES / 1024
        ));
    }
    let blob = repo.find_blob(entry.id()).map_err(|e| e.to_string())?;
    String::from_utf8(blob.content().to_vec())
        .map(Some)
        .map_err(|_| "not UTF-8".to_string())
}

/// A diagnostic at the value of `[promotion] key` in `drover.toml`'s
/// `text`, or at the `[promotion]` table when the key is not written (its
/// default is what is wrong), or at the file when neither can be found.
pub fn at_promotion_key(text: Option<&str>, key: &str, message: String) -> Diagnostic {
    let at = text.and_then(|text| {
        let doc = toml::de::DeTable::parse(text).ok()?;
        let (table_key, table) = doc
            .get_ref()
            .iter()
            .find(|(k, _)| k.get_ref() == "promotion")?;
        let toml::de::DeValue::Table(t) = table.get_ref() else {
            return Some(table_key.span().start);
        };
        Some(
            t.iter()
                .find(|(k, _)| k.get_ref() == key)
                .map_or(table_key.span().start, |(_, v)| v.span().start),
        )
    });
    match (text, at) {
        (Some(text), Some(at)) => Diagnostic::at(ROOT_FILE, text, at, message),
        _ => Diagnostic::file(ROOT_FILE, message),
    }
}

pub(super) fn missing_signers(root_text: Option<&str>, path: &str) -> Diagnostic {
    at_promotion_key(
        root_text,
        "report_signers",
        format!(
            "report_signers names {path}, which does not exist in the repository; \
             it must be an allowed-signers file naming each cluster's key as <env>/<cluster>"
        ),
    )
}

/// `[promotion] report_signers` as `drover check` validates it
/// (docs/design.md §2): with `evidence = "status"` and an environment to
/// gate (a chain of two or more), it is required, and the file it names
/// must exist, be readable, and hold valid allowed-signers lines. Each
/// problem is at the key's line of `drover.toml`, or at the file's line.
pub fn check_report_signers(files: &dyn config::Files, cfg: &RepoConfig) -> Vec<Diagnostic> {
    let root_text = files
        .read(ROOT_FILE)
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok());
    let root = root_text.as_deref();
    let Some(path) = &cfg.root.report_signers else {
        if cfg.root.evidence == config::Evidence::Status && cfg.root.chain.len() > 1 {
            return vec![at_promotion_key(
                root,
                "evidence",
                "evidence = \"status\" needs `report_signers` in [promotion]: the path of an \
                 allowed-signers file naming each cluster's key as <env>/<cluster>, such as \
                 report_signers = \"agents.allowed_signers\"; without it no status report can \
                 count and every gate refuses"
                    .to_owned(),
            )];
        }
        return Vec::new();
    };
    let text = match files.read(path) {
        // Bounded as a config file is: one line per cluster of the fleet.
        Ok(Some(bytes)) if bytes.len() as u64 > config::MAX_FILE_BYTES => Err(format!(
            "{} bytes; an allowed-signers file may have at most {} KiB",
            bytes.len(),
            config::MAX_FILE_BYTES / 1024
        )),
        Ok(Some(bytes)) => String::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned()),
        Ok(None) => return vec![missing_signers(root, path)],
        Err(why) => Err(why),
    };
    match text {
        Err(why) => vec![at_promotion_key(
            root,
            "report_signers",
            format!("report_signers names {path}, which cannot be read: {why}"),
        )],
        Ok(text) => match AllowedSigners::parse(&text) {
            Err(trust::Error::Signers { line, message, .. }) => vec![Diagnostic {
                file: path.clone(),
                line,
                column: 1,
                message: format!("not a valid allowed-signers line: {message}"),
            }],
            _ => Vec::new(),
        },
    }
}

/// The config and policy at `commit`; `Ok(Err(..))` when its config is invalid.
pub fn snapshot(
    repo: &Repository,
    commit: Oid,
    now: DateTime<Utc>,
) -> Result<Result<Snapshot, Vec<Diagnostic>>, Error> {
    let tree = repo.find_commit(commit)?.tree()?;
    let files = config::GitTreeFiles::new(repo, tree.clone());
    let config = match config::load_at(&files, now) {
        Ok(c) => c,
        Err(d) => return Ok(Err(d)),
    };
    let signers_text = match &config.root.report_signers {
        None => None,
        Some(path) => match read_small(repo, &tree, path) {
            Ok(Some(t)) => Some(t),
            Ok(None) => {
                let root = read_small(repo, &tree, ROOT_FILE).ok().flatten();
                return Ok(Err(vec![missing_signers(root.as_deref(), path)]));
            }
            Err(why) => return Ok(Err(vec![Diagnostic::file(path.clone(), why)])),
        },
    };
    if let (Some(path), Some(text)) = (&config.root.report_signers, &signers_text) {
        if let Err(trust::Error::Signers { line, message, .. }) = AllowedSigners::parse(text) {
            return Ok(Err(vec![Diagnostic {
                file: path.clone(),
                line,
                column: 1,
                message: format!("not a valid allowed-signers line: {message}"),
            }]));
        }
    }
    let policy = Policy::of(&config, signers_text);
    Ok(Ok(Snapshot {
        commit,
        config,
        policy,
    }))
}

/// Configs [`judge_span`] read lately, by commit. A commit id names its
/// tree and so its config exactly, so an entry never goes stale, whatever
/// repository it came from; the agent judges each new head over the same
/// last applied commit and reads that config once, not once per head.
pub(super) const RECENT_SNAPSHOTS: usize = 8;

pub(super) type Loaded = Result<Snapshot, Vec<Diagnostic>>;

pub(super) static RECENT: std::sync::Mutex<std::collections::VecDeque<(Oid, Loaded)>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

/// [`snapshot`], through [`RECENT`].
pub(super) fn snapshot_recent(
    repo: &Repository,
    commit: Oid,
    now: DateTime<Utc>,
) -> Result<Loaded, Error> {
    let recent = || RECENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, hit)) = recent().iter().find(|(c, _)| *c == commit) {
        return Ok(hit.clone());
    }
    let loaded = snapshot(repo, commit, now)?;
    let mut r = recent();
    r.push_front((commit, loaded.clone()));
    r.truncate(RECENT_SNAPSHOTS);
    Ok(loaded)
}
