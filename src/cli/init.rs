//! `drover init`: start a config repository a newcomer can take to a first
//! `drover check --base` without editing anything but a version: a
//! `drover.toml` with the chain and one placeholder cluster per
//! environment, an environment file per link of the chain (staggered
//! monthly windows, as in docs/design.md §0), and the report-signers file
//! with the steps that fill it. The files are checked as `drover check`
//! checks them before any is written; nothing is overwritten.

use super::{print_ok, reject, Global, Outcome, Problem};
use crate::config::{self, DirFiles, ENV_DIR, ROOT_FILE};
use anyhow::Context as _;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Arguments of `drover init`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory to start the repository in (created if missing; `git init`
    /// when it is not inside a git work tree). Default: --repo, else `.`.
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The OS version every cluster runs today (exact, such as 1.12.0): each
    /// environment starts pinned to it, so nothing moves until a pull request
    /// bumps one.
    #[arg(long = "version", value_name = "VERSION")]
    pub version: String,
    /// The promotion chain, lowest first.
    #[arg(long, value_delimiter = ',', default_value = "test,stage,production")]
    pub envs: Vec<String>,
    /// IANA time zone the windows are read in.
    #[arg(long, default_value = "UTC")]
    pub timezone: String,
}

/// The file of report signers `drover init` writes.
pub const SIGNERS_FILE: &str = "agents.allowed_signers";

/// The document of `drover init -o json`.
#[derive(Debug, Serialize)]
struct Output {
    /// The repository's directory.
    dir: String,
    /// Files written, relative to `dir`.
    files: Vec<String>,
    /// Whether `git init` was run.
    git_init: bool,
}

/// Run `drover init`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let dir = args
        .dir
        .clone()
        .or_else(|| g.repo_arg.clone())
        .unwrap_or_else(|| PathBuf::from("."));
    let files = match files(&args) {
        Ok(f) => f,
        Err(problems) => return reject(g, problems),
    };
    let existing: Vec<String> = files
        .iter()
        .filter(|(p, _)| dir.join(p).exists())
        .map(|(p, _)| p.clone())
        .collect();
    if !existing.is_empty() {
        return reject(
            g,
            vec![format!(
                "{} already holds {}: drover init writes a new config repository and \
                 overwrites nothing; run it in an empty directory (or check this one \
                 with `drover check`)",
                dir.display(),
                existing.join(", ")
            )
            .into()],
        );
    }
    // The files pass `drover check` before one is written.
    let staged = tempfile::tempdir().context("creating a temporary directory")?;
    write_all(staged.path(), &files)?;
    if let Err(diags) = config::load(&DirFiles::new(staged.path())) {
        return reject(g, diags.into_iter().map(Problem::from).collect());
    }
    write_all(&dir, &files)?;
    let git_init = !inside_work_tree(&dir);
    if git_init {
        crate::promote::git(&dir, &["init", "--quiet", "--initial-branch=main"])
            .context("git init")?;
    }
    let out = Output {
        dir: dir.display().to_string(),
        files: files.iter().map(|(p, _)| p.clone()).collect(),
        git_init,
    };
    if g.format.is_document() {
        print_ok(g.format, &out)?;
    } else {
        print!("{}", next_steps(&out, &args));
    }
    Ok(Outcome::Ok)
}

/// What to do next, in order.
fn next_steps(out: &Output, args: &Args) -> String {
    let first = args.envs.first().map_or("test", String::as_str);
    let mut s = format!("drover init: a config repository in {}\n", out.dir);
    for f in &out.files {
        s.push_str(&format!("  wrote {f}\n"));
    }
    if out.git_init {
        s.push_str("  ran git init (branch main)\n");
    }
    let last = args.envs.last().map_or("production", String::as_str);
    s.push_str(&format!(
        "next:\n  1. name your clusters under [clusters] in {ROOT_FILE} (one placeholder each now)\n  \
         2. add each cluster's report key to {SIGNERS_FILE} (the file says how)\n  \
         3. sign your commits: the agents verify every commit (verify = \"all\") against the\n     \
         keys of their allowed-signers Secret (docs/install.md, step 2), so list yours there:\n       \
         git config gpg.format ssh\n       \
         git config user.signingkey ~/.ssh/id_ed25519.pub\n       \
         git config commit.gpgsign true\n  \
         4. git add -A && git commit -m \"Start the config repository\" and push it\n  \
         5. install the agent in each cluster (docs/install.md; to try it first on a test\n     \
         cluster with simulated nodes, docs/quickstart.md). It adopts a repository whose\n     \
         every commit is signed; if the first one is not (a forge's first push), name the\n     \
         commit you reviewed as the one to trust (it and everything before it are trusted,\n     \
         every later commit is verified), for example:\n       \
         kubectl -n drover-system annotate droverstatus {last}-{last}-1 \\\n         \
         drover.dev/trust-commit=$(git rev-parse origin/main)\n  \
         6. bump `version` in {ENV_DIR}/{first}.toml in a pull request; CI runs \
         `drover check --base origin/main`\n"
    ));
    s
}

/// The files of the new repository, relative path and content.
fn files(args: &Args) -> Result<Vec<(String, String)>, Vec<Problem>> {
    let mut problems = Vec::new();
    if args.envs.is_empty() || args.envs.iter().any(|e| e.trim().is_empty()) {
        problems.push(Problem::from(
            "--envs must name at least one environment, lowest first, such as test,stage,production"
                .to_owned(),
        ));
    }
    if let Err(e) = crate::config::parse_exact_version(&args.version) {
        problems.push(Problem::from(format!("--version {:?}: {e}", args.version)));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let mut out = vec![(ROOT_FILE.to_owned(), root_file(&args.envs))];
    for (i, env) in args.envs.iter().enumerate() {
        out.push((
            format!("{ENV_DIR}/{env}.toml"),
            env_file(env, i, args.envs.get(i.wrapping_sub(1)), args),
        ));
    }
    out.push((SIGNERS_FILE.to_owned(), signers_file()));
    Ok(out)
}

fn root_file(envs: &[String]) -> String {
    let chain: Vec<String> = envs.iter().map(|e| format!("{e:?}")).collect();
    let mut s = format!(
        "# The promotion chain and the clusters of each environment (docs/config.md).\n\
         \n\
         [promotion]\n\
         chain = [{}]  # lowest first: a version reaches an environment only after the one before confirmed it\n\
         evidence = \"status\"                        # the agents' signed confirmations are the evidence\n\
         report_signers = \"{SIGNERS_FILE}\"  # whose signed reports count\n\
         \n\
         [clusters]  # one agent runs in each; rename the placeholders to your clusters' names\n",
        chain.join(", ")
    );
    for e in envs {
        s.push_str(&format!("{e} = [\"{e}-1\"]\n"));
    }
    s
}

fn env_file(env: &str, i: usize, lower: Option<&String>, args: &Args) -> String {
    // Staggered monthly windows: the 1st, 8th, 15th, 22nd, then the 22nd again.
    let day = 1 + 7 * i.min(3);
    let mut s = format!(
        "# What {env} runs and when it may change (docs/config.md).\n\
         \n\
         version = \"{}\"  # exact OS version; a pull request changing it is a rollout\n\
         \n\
         [window]\n\
         schedule = \"0 2 {day} * *\"  # cron: 02:00 on the {day}{} of each month\n\
         duration = \"6h\"\n\
         timezone = \"{}\"\n",
        args.version,
        ordinal(day),
        args.timezone
    );
    if let Some(lower) = lower {
        s.push_str(&format!(
            "\n[promotion]\nsoak = \"24h\"  # how long {lower} must have confirmed a version before {env} may take it\n"
        ));
    }
    s
}

fn ordinal(day: usize) -> &'static str {
    match day {
        1 | 21 | 31 => "st",
        2 | 22 => "nd",
        3 | 23 => "rd",
        _ => "th",
    }
}

fn signers_file() -> String {
    "# Report signers (report_signers in drover.toml): the keys whose signed status\n\
     # reports count as evidence for the promotion gate. One line per cluster, in\n\
     # git's allowed-signers format, the principal being exactly <env>/<cluster>:\n\
     #\n\
     #   <env>/<cluster> namespaces=\"git\" <key type> <public key>\n\
     #\n\
     # To add a cluster's key:\n\
     #   1. ssh-keygen -t ed25519 -N '' -C stage/stage-1 -f drover-report-key\n\
     #   2. put the private key in the cluster as the Secret the agent mounts\n\
     #      (docs/install.md):\n\
     #        kubectl -n drover-system create secret generic drover-report-signing-key \\\n\
     #          --from-file=key=drover-report-key\n\
     #   3. add a line here with the public key, e.g.\n\
     #        stage/stage-1 namespaces=\"git\" ssh-ed25519 AAAAC3Nza... stage/stage-1\n\
     #      and merge it in a change of its own (a change that edits this file\n\
     #      and moves a version is refused).\n\
     # Never check a private key in.\n"
        .to_owned()
}

fn write_all(dir: &Path, files: &[(String, String)]) -> anyhow::Result<()> {
    for (rel, text) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Whether `dir` is inside a git work tree already.
fn inside_work_tree(dir: &Path) -> bool {
    git2::Repository::discover(dir).is_ok_and(|r| !r.is_bare())
}
