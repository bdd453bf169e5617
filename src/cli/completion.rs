//! `drover completion bash|zsh|fish` and `drover man`: generated from the
//! clap definition the parser itself uses, so neither can drift from the
//! flags (clap_complete, clap_mangen). A static script cannot know the
//! environments of the repository it is used in, so every `--env` asks
//! the binary (`DROVER_COMPLETE=envs drover`: the chain of the repository
//! found as every command finds it, one name a line, nothing on any error)
//! instead of offering file names. An environment variable, not a hidden
//! subcommand: clap_complete lists hidden subcommands in its scripts.

use super::{print_ok, Global, Outcome};
use serde::Serialize;

/// Arguments of `drover completion`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell: bash, zsh or fish.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Shells `drover completion` writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    /// `source <(drover completion bash)`, or save it under
    /// /etc/bash_completion.d/drover.
    Bash,
    /// Save it as `_drover` in a directory of `$fpath`.
    Zsh,
    /// Save it as ~/.config/fish/completions/drover.fish.
    Fish,
}

/// The document of `drover completion SHELL -o json`.
#[derive(Serialize)]
struct Script<'a> {
    shell: &'a str,
    script: String,
}

/// The document of `drover man -o json`.
#[derive(Serialize)]
struct Page {
    roff: String,
}

/// Run `drover completion SHELL`: the script on stdout (in JSON or YAML,
/// inside the document, as every command's output is).
pub fn run(g: &Global, args: Args, mut cmd: clap::Command) -> anyhow::Result<Outcome> {
    let (shell, name) = match args.shell {
        Shell::Bash => (clap_complete::Shell::Bash, "bash"),
        Shell::Zsh => (clap_complete::Shell::Zsh, "zsh"),
        Shell::Fish => (clap_complete::Shell::Fish, "fish"),
    };
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "drover", &mut buf);
    let buf = with_env_names(args.shell, &String::from_utf8_lossy(&buf)).into_bytes();
    emit(g, buf, |script| Script {
        shell: name,
        script,
    })
}

/// The variable that makes `drover` print the environments and exit.
pub const ASK: &str = "DROVER_COMPLETE";

/// How a script asks for the environments.
const ENVS: &str = "DROVER_COMPLETE=envs drover 2>/dev/null";

/// `script` with every `--env` value completed from [`ENVS`] rather than
/// from file names (`--envs` of `init` names environments not yet made).
/// The patterns are clap_complete's own; `completion_offers_the_environments`
/// fails when a new clap_complete writes them otherwise.
pub fn with_env_names(shell: Shell, script: &str) -> String {
    match shell {
        Shell::Bash => script.replace(
            "--env)\n                    COMPREPLY=($(compgen -f \"${cur}\"))",
            &format!(
                "--env)\n                    COMPREPLY=($(compgen -W \"$({ENVS})\" -- \"${{cur}}\"))"
            ),
        ),
        Shell::Zsh => {
            let mut out = String::with_capacity(script.len() + 200);
            for line in script.split_inclusive('\n') {
                if line.starts_with("'--env=[") {
                    out.push_str(&line.replace(":ENV:_default'", ":ENV:_drover_envs'"));
                } else {
                    out.push_str(line);
                }
                if line.starts_with("autoload -U is-at-least") {
                    out.push_str(&format!(
                        "\n_drover_envs() {{\n    local -a envs\n    envs=(${{(f)\"$({ENVS})\"}})\n    compadd -a envs\n}}\n"
                    ));
                }
            }
            out
        }
        Shell::Fish => script
            .split_inclusive('\n')
            .map(|line| {
                if line.contains(" -l env -d ") && line.trim_end().ends_with(" -r") {
                    format!("{} -f -a \"({ENVS})\"\n", line.trim_end())
                } else {
                    line.to_owned()
                }
            })
            .collect(),
    }
}

/// `DROVER_COMPLETE=envs drover`: the chain of the repository
/// (`DROVER_REPO_DIR`, else the nearest `drover.toml` upward), one name a
/// line, for the completion scripts; nothing at all when there is none or
/// it does not parse (a completion never prints an error into the command
/// line being typed).
pub fn envs() {
    let dir = match std::env::var_os("DROVER_REPO_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => match std::env::current_dir()
            .ok()
            .and_then(|cwd| super::find_repo_root(&cwd))
        {
            Some(d) => d,
            None => return,
        },
    };
    let path = dir.join(crate::config::ROOT_FILE);
    let Ok(bytes) = crate::config::read_regular(&path, "config files") else {
        return;
    };
    let text = String::from_utf8_lossy(&bytes);
    if let Ok(root) = crate::config::parse_root(crate::config::ROOT_FILE, &text) {
        for env in &root.chain {
            println!("{}", crate::terminal::escape(env));
        }
    }
}

/// Run `drover man`: the manual page in roff (`drover man | man -l -`).
pub fn man(g: &Global, cmd: clap::Command) -> anyhow::Result<Outcome> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd).render(&mut buf)?;
    emit(g, buf, |roff| Page { roff })
}

/// `buf` on stdout, or inside the document `doc` makes of it.
fn emit<T: Serialize>(
    g: &Global,
    buf: Vec<u8>,
    doc: impl FnOnce(String) -> T,
) -> anyhow::Result<Outcome> {
    if g.format.is_document() {
        print_ok(g.format, &doc(String::from_utf8_lossy(&buf).into_owned()))?;
    } else {
        use std::io::Write;
        match std::io::stdout().lock().write_all(&buf) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
            _ => {}
        }
    }
    Ok(Outcome::Ok)
}
