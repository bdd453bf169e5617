//! `drover completion bash|zsh|fish` and `drover man`: generated from the
//! clap definition the parser itself uses, so neither can drift from the
//! flags (clap_complete, clap_mangen).

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
    emit(g, buf, |script| Script {
        shell: name,
        script,
    })
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
