//! `drover check`: validate the config repository's working tree and, with
//! `--base`, judge version changes against the promotion gate (docs/design.md §4).

use super::{output, parse_time, Global, Outcome, Problem};
use crate::admit::{ChangeReport, ConfirmationSource, StatusRead};
use crate::config::{self, DirFiles, RepoConfig};
use crate::gate::{Basis, Decision, Reason};
use crate::terminal::escape;
use anyhow::Context;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

/// Arguments of `drover check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Also judge every environment whose version changed between REV and
    /// HEAD against the promotion gate (use the pull request's base, such as
    /// origin/main).
    #[arg(long, value_name = "REV")]
    pub base: Option<String>,
    /// The time soak periods and window overlaps are measured from (default: now).
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub now: Option<DateTime<Utc>>,
}

/// The fields `drover check` adds to the document (docs/cli.schema.json):
/// the status reports the gate ignored (each with its path, commit and
/// why), and with `--base` the evidence behind each judged change, passing
/// or not.
#[derive(Debug, Serialize)]
struct Report<'a> {
    #[serde(skip_serializing_if = "<[IgnoredReport]>::is_empty")]
    ignored_reports: &'a [IgnoredReport],
    #[serde(skip_serializing_if = "Option::is_none")]
    changes: Option<&'a [Change]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status_branches: Option<&'a StatusRead>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    notes: &'a [String],
}

/// A status report the gate did not count, and why.
#[derive(Debug, Serialize)]
struct IgnoredReport {
    env: String,
    cluster: String,
    /// The report's file on the status branch.
    path: String,
    /// The status commit that wrote it.
    commit: String,
    /// Why it does not count.
    reason: String,
}

impl From<&crate::status::Ignored> for IgnoredReport {
    fn from(i: &crate::status::Ignored) -> Self {
        IgnoredReport {
            env: i.env.clone(),
            cluster: i.cluster.clone(),
            path: crate::status::report_path(&i.env, &i.cluster),
            commit: i.commit.clone(),
            reason: i.why.clone(),
        }
    }
}

/// One environment whose version the change moves, with the evidence behind the verdict.
#[derive(Debug, Serialize)]
struct Change {
    env: String,
    version: String,
    previous: Option<String>,
    /// `allowed` or `refused`.
    verdict: &'static str,
    /// The refusal's code (`not_confirmed`, `soaking`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    /// The verdict in one line.
    message: String,
    /// The environment whose evidence counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    lower: Option<String>,
    /// Its clusters' standing confirmations of the version.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    confirmations: Vec<Confirmation>,
    /// Its clusters without one, each with why when the branch says.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    missing: Vec<Missing>,
    /// History evidence: configured at the version since then (commit time).
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<String>,
    /// When the soak passed (allowed) or passes (refused while soaking).
    #[serde(skip_serializing_if = "Option::is_none")]
    soak_passes_at: Option<String>,
}

#[derive(Debug, Serialize)]
struct Confirmation {
    cluster: String,
    at: String,
    /// The signed status commit, the branch it is on and the key that signed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    status_commit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    config_commit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    branch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    signer: Option<String>,
}

#[derive(Debug, Serialize)]
struct Missing {
    cluster: String,
    why: Option<String>,
}

/// Run `drover check`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let repo = &g.repo;
    // A missing or unreadable directory is "could not run" (exit 2), not a
    // config error: nothing was judged.
    std::fs::read_dir(repo)
        .with_context(|| format!("cannot read the config repository {}", repo.display()))?;

    if let Some(p) = super::no_repo_found(g) {
        return super::reject(g, vec![p]);
    }
    let now = args.now.unwrap_or_else(Utc::now);
    let files = DirFiles::new(repo);
    let (config, mut errors) = match config::load_at(&files, now) {
        // The report signers file is the one file of the repository that
        // only the gate reads: checked here so that a pull request cannot
        // pass with a gate that would refuse everything (docs/design.md §2).
        Ok(c) => match crate::admit::check_report_signers(&files, &c) {
            d if d.is_empty() => (Some(c), Vec::new()),
            d => (None, d),
        },
        Err(d) => (None, d),
    };

    // The gate judges versions of a config that is known to be valid; on
    // an invalid tree its verdicts would be noise on top of the real errors.
    let mut ignored = Vec::new();
    let mut ignored_reports = Vec::new();
    let mut judged: Option<(Vec<Change>, Option<StatusRead>)> = None;
    let mut notes = Vec::new();
    if let (Some(base), Some(_)) = (&args.base, &config) {
        // --base judges commits (HEAD against the base): an edit not yet
        // committed would be checked above but not judged by the gate, so
        // a pass would say nothing about it. Refuse, naming the files.
        let dirty = uncommitted(repo);
        if !dirty.is_empty() {
            let shown: Vec<&str> = dirty.iter().take(5).map(String::as_str).collect();
            let more = dirty.len().saturating_sub(shown.len());
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            return super::reject(
                g,
                vec![format!(
                    "the working tree differs from HEAD ({}{more}): --base judges HEAD's commits against {base}, not uncommitted edits; commit them (or stash them) and run again (as a git hook, run it from pre-push, which sees commits)",
                    shown.join(", ")
                )
                .into()],
            );
        }
        let mut gate = crate::admit::check_base(repo, base, now)
            .with_context(|| format!("cannot judge the changes since {base}"))?;
        if let Some(note) = unfetched(gate.status.as_ref()) {
            // On the refusal too: that is what the pull request shows.
            for d in &mut gate.diagnostics {
                if d.message.contains("has confirmed it on") {
                    d.message = format!("{}; {note}", d.message);
                }
            }
            notes.push(note);
        }
        ignored = std::mem::take(&mut gate.warnings);
        ignored_reports = gate.ignored.iter().map(IgnoredReport::from).collect();
        let changes = changes(&gate);
        errors.extend(gate.diagnostics);
        judged = Some((changes, gate.status));
    }

    let ok = errors.is_empty();
    if !ok {
        super::mark_rejected();
    }
    if !g.format.is_document() {
        // Named whether or not the check passes: an ignored report is a
        // forgery, a misconfigured agent, or a key that needs listing.
        for i in &ignored {
            eprintln!("note: ignored status report {}", escape(i));
        }
        for n in &notes {
            eprintln!("note: {n}");
        }
    }
    if g.format.is_document() {
        let problems: Vec<Problem> = errors.iter().cloned().map(Problem::from).collect();
        output::print_document(
            g.format,
            ok,
            &problems,
            &Report {
                ignored_reports: &ignored_reports,
                changes: judged.as_ref().map(|(c, _)| c.as_slice()),
                status_branches: judged.as_ref().and_then(|(_, s)| s.as_ref()),
                notes: &notes,
            },
        )?;
    } else {
        match (&config, ok) {
            (Some(c), true) => println!("{}", summary(c)),
            _ => {
                for e in &errors {
                    println!("{}", escape(&e.to_string()));
                }
            }
        }
        // The evidence, passing or not: which environment moved, who
        // confirmed when, signed by which key, and when the soak passes.
        for c in judged.iter().flat_map(|(c, _)| c) {
            print!("{}", evidence_text(c));
        }
        if !ok {
            let n = errors.len();
            eprintln!("drover check: {n} error{}", if n == 1 { "" } else { "s" });
        }
    }
    Ok(if ok { Outcome::Ok } else { Outcome::Rejected })
}

/// The note for a judgement that needed status evidence and found no branch.
fn unfetched(status: Option<&StatusRead>) -> Option<String> {
    let s = status.filter(|s| s.refs.is_empty())?;
    let ns = crate::status::cluster_namespace(&s.branch);
    Some(format!(
        "no status branches found locally or under origin/{ns} (nor {}): did CI fetch them? \
         (git fetch origin '+refs/heads/{ns}*:refs/remotes/origin/{ns}*')",
        s.branch
    ))
}

fn ts(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The judged changes of `gate`, with their evidence.
fn changes(gate: &ChangeReport) -> Vec<Change> {
    let source = |env: &str, cluster: &str, version: &semver::Version| {
        gate.sources
            .iter()
            .find(|s| s.env == env && s.cluster == cluster && s.version == *version)
    };
    let confirmations = |lower: &str, version, list: &[(String, DateTime<Utc>)]| {
        list.iter()
            .map(|(cluster, at)| confirmation(cluster, at, source(lower, cluster, version)))
            .collect()
    };
    let mut out = Vec::new();
    for (env, d) in &gate.decisions {
        let mut c = Change {
            env: env.clone(),
            version: String::new(),
            previous: gate.previous.get(env).map(ToString::to_string),
            verdict: if d.is_allowed() { "allowed" } else { "refused" },
            reason: None,
            message: d.to_string(),
            lower: None,
            confirmations: Vec::new(),
            missing: Vec::new(),
            since: None,
            soak_passes_at: None,
        };
        match d {
            Decision::Unchanged => continue,
            Decision::Allowed(a) => {
                c.version = a.version.to_string();
                match &a.basis {
                    Basis::FirstInChain => {}
                    Basis::Confirmed {
                        lower,
                        confirmed,
                        soaked_at,
                    } => {
                        c.confirmations = confirmations(lower, &a.version, confirmed);
                        c.lower = Some(lower.clone());
                        c.soak_passes_at = Some(ts(soaked_at));
                    }
                    Basis::History {
                        lower,
                        since,
                        soaked_at,
                    } => {
                        c.lower = Some(lower.clone());
                        c.since = Some(ts(since));
                        c.soak_passes_at = Some(ts(soaked_at));
                    }
                }
            }
            Decision::Refused(r) => {
                c.version = r.version.to_string();
                c.reason = Some(crate::admit::reason_code(&r.reason));
                match &r.reason {
                    Reason::NotConfirmed {
                        lower,
                        confirmed,
                        missing,
                        ..
                    } => {
                        c.lower = Some(lower.clone());
                        c.confirmations = confirmations(lower, &r.version, confirmed);
                        c.missing = missing
                            .iter()
                            .map(|(cluster, why)| Missing {
                                cluster: cluster.clone(),
                                why: why.clone(),
                            })
                            .collect();
                    }
                    Reason::Soaking {
                        lower,
                        confirmed,
                        passes_at,
                        ..
                    } => {
                        c.lower = Some(lower.clone());
                        c.confirmations = confirmations(lower, &r.version, confirmed);
                        c.soak_passes_at = Some(ts(passes_at));
                    }
                    Reason::HistorySoaking {
                        lower,
                        since,
                        passes_at,
                        ..
                    } => {
                        c.lower = Some(lower.clone());
                        c.since = Some(ts(since));
                        c.soak_passes_at = Some(ts(passes_at));
                    }
                    Reason::LowerNotAtVersion { lower, .. } | Reason::NoLowerClusters { lower } => {
                        c.lower = Some(lower.clone())
                    }
                    _ => {}
                }
            }
        }
        out.push(c);
    }
    out
}

fn confirmation(cluster: &str, at: &DateTime<Utc>, s: Option<&ConfirmationSource>) -> Confirmation {
    Confirmation {
        cluster: cluster.to_owned(),
        at: ts(at),
        status_commit: s.map(|s| s.status_commit.clone()),
        config_commit: s.map(|s| s.config_commit.clone()),
        branch: s.and_then(|s| s.branch.clone()),
        signer: s.and_then(|s| s.signer.clone()),
    }
}

/// A judged change for people, e.g.
/// `stage 1.12.0 -> 1.13.2: allowed` and one indented line per confirmation.
fn evidence_text(c: &Change) -> String {
    let from = c.previous.as_deref().unwrap_or("(new)");
    let mut out = format!("{} {from} -> {}: {}\n", c.env, c.version, c.verdict);
    for k in &c.confirmations {
        out.push_str(&format!(
            "  {} confirmed {} at {}",
            k.cluster, c.version, k.at
        ));
        if let Some(commit) = &k.status_commit {
            out.push_str(&format!(" (report {commit:.10}"));
            if let Some(b) = &k.branch {
                out.push_str(&format!(
                    " on {}",
                    b.strip_prefix("refs/remotes/")
                        .or_else(|| b.strip_prefix("refs/heads/"))
                        .unwrap_or(b)
                ));
            }
            if let Some(s) = &k.signer {
                out.push_str(&format!(", signed by {s}"));
            }
            out.push(')');
        }
        out.push('\n');
    }
    for m in &c.missing {
        match &m.why {
            // A report's own words can be in `why`: escaped.
            Some(why) => out.push_str(&format!(
                "  {} has not confirmed {}: {}\n",
                m.cluster,
                c.version,
                escape(why)
            )),
            None => out.push_str(&format!(
                "  {} has not confirmed {}\n",
                m.cluster, c.version
            )),
        }
    }
    if let (Some(lower), Some(since)) = (&c.lower, &c.since) {
        out.push_str(&format!(
            "  {lower} configured at {} since {since}\n",
            c.version
        ));
    }
    match (c.verdict, &c.soak_passes_at) {
        ("allowed", Some(t)) => out.push_str(&format!("  soak passed at {t}\n")),
        (_, Some(t)) => out.push_str(&format!("  soak passes at {t}\n")),
        _ => {}
    }
    if c.verdict == "allowed" && c.lower.is_none() {
        out.push_str("  first environment of the chain: no gate\n");
    }
    out
}

/// `ok: 3 environments (test 1.12.0, stage 1.12.0, production 1.12.0)`.
fn summary(c: &RepoConfig) -> String {
    let envs: Vec<String> = c
        .root
        .chain
        .iter()
        .filter_map(|e| c.envs.get(e).map(|env| format!("{e} {}", env.version)))
        .collect();
    let n = envs.len();
    format!(
        "ok: {n} environment{} ({})",
        if n == 1 { "" } else { "s" },
        envs.join(", ")
    )
}

/// Files of the working tree that differ from HEAD (modified, staged or
/// deleted, and new environment files), by path; empty when it cannot tell.
fn uncommitted(repo: &std::path::Path) -> Vec<String> {
    let Ok(repo) = git2::Repository::discover(repo) else {
        return Vec::new();
    };
    let mut opts = git2::StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false);
    let Ok(statuses) = repo.statuses(Some(&mut opts)) else {
        return Vec::new();
    };
    // Any change to a tracked file; of the new files, only an environment
    // (config files name the others, and those are tracked once used):
    // a CI checkout may hold untracked tools beside the config.
    statuses
        .iter()
        .filter_map(|s| {
            let path = s.path().ok()?;
            let st = s.status();
            let new = st == git2::Status::WT_NEW;
            let counts = st != git2::Status::CURRENT
                && !st.contains(git2::Status::IGNORED)
                && (!new || path.starts_with(config::ENV_DIR));
            counts.then(|| path.to_owned())
        })
        .collect()
}
