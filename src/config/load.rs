//! Loading the whole repository: `drover.toml`, then every environment
//! file the chain names, with problems that involve several files (stray or
//! missing environment files). Every problem of every file is collected.

use super::env::{env_inner, env_with_sites};
use super::files::EntryKind;
use super::root::{root_inner, RootParsed};
use super::values::quoted_list;
use super::{EnvConfig, Files, RepoConfig, RootConfig, ENV_DIR, ROOT_FILE};
use crate::diag::Diagnostic;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};

/// Load and validate the whole repository; all problems are returned together.
pub fn load(files: &dyn Files) -> Result<RepoConfig, Vec<Diagnostic>> {
    load_at(files, Utc::now())
}

/// [`load`] as of `now`. Validation no longer depends on the time (windows
/// may overlap, so nothing is measured from `now`); kept for `check --now`.
pub fn load_at(files: &dyn Files, _now: DateTime<Utc>) -> Result<RepoConfig, Vec<Diagnostic>> {
    let mut diags = Vec::new();

    // Anything in environments/ but `<env>.toml` regular files is reported,
    // never silently skipped (a stray entry is usually a mistake).
    let mut on_disk: Vec<String> = Vec::new();
    for entry in files.list(ENV_DIR) {
        match (entry.kind, entry.name.strip_suffix(".toml")) {
            (EntryKind::File, Some(name)) => on_disk.push(name.to_owned()),
            (kind, _) => diags.push(super::files::stray_entry(&entry.name, kind)),
        }
    }

    let root = match read_text(files, ROOT_FILE) {
        Ok(text) => {
            let parsed = root_inner(ROOT_FILE, &text, Some(&on_disk));
            diags.extend(parsed.diags.iter().cloned());
            Some((text, parsed))
        }
        Err(d) => {
            diags.push(d);
            None
        }
    };

    // Environments to parse: the chain's (valid names only, so a name like
    // `../x` never becomes a path) and every file on disk.
    let mut names: BTreeSet<String> = on_disk.iter().cloned().collect();
    if let Some((_, r)) = &root {
        names.extend(r.chain.iter().map(|(n, _)| n.clone()));
    }

    let mut envs = BTreeMap::new();
    for name in &names {
        if !on_disk.contains(name) {
            continue;
        }
        let path = env_path(name);
        match read_text(files, &path) {
            Ok(text) => match env_with_sites(&path, name, &text) {
                Ok((env, sites)) => {
                    // Waves name drover.toml's clusters: checked once both are read.
                    if let Some((
                        _,
                        RootParsed {
                            config: Some(root), ..
                        },
                    )) = &root
                    {
                        let clusters = root.clusters.get(name).map_or(&[][..], Vec::as_slice);
                        diags.extend(super::waves::check_clusters(
                            &path, &text, name, &env.waves, &sites, clusters,
                        ));
                    }
                    envs.insert(name.clone(), env);
                }
                Err(d) => diags.extend(d),
            },
            Err(d) => diags.push(d),
        }
    }

    if let Some((text, r)) = &root {
        for (name, span) in &r.chain {
            if !on_disk.contains(name) {
                // A file the chain does not name, spelled nearly alike: the
                // chain's name is the typo.
                let strays = on_disk
                    .iter()
                    .filter(|d| !r.chain.iter().any(|(n, _)| n == *d))
                    .map(String::as_str);
                let fix = match super::nearest(name, strays) {
                    Some(d) => format!(
                        "did you mean `{d}`? ({} exists: correct the chain)",
                        env_path(d)
                    ),
                    None => format!("create it or remove `{name}` from the chain"),
                };
                diags.push(Diagnostic::at(
                    ROOT_FILE,
                    text,
                    span.start,
                    format!(
                        "environment `{name}` has no file `{}`; {fix}",
                        env_path(name)
                    ),
                ));
            }
        }
        if r.chain_known {
            for name in &on_disk {
                if !r.chain.iter().any(|(n, _)| n == name) {
                    let path = env_path(name);
                    let text = read_text(files, &path).unwrap_or_default();
                    // A chain name without a file, spelled nearly alike.
                    let fileless = r
                        .chain
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .filter(|n| !on_disk.iter().any(|d| d == n));
                    let fix = match super::nearest(name, fileless) {
                        Some(n) => format!("correct `{n}` in the chain to `{name}`"),
                        None => "add it to the chain or delete this file".to_owned(),
                    };
                    diags.push(Diagnostic::at(
                        path,
                        &text,
                        0,
                        format!(
                            "environment `{name}` is not in [promotion] chain of {ROOT_FILE} \
                             ({}); {fix}",
                            quoted_list(r.chain.iter().map(|(n, _)| n.as_str()))
                        ),
                    ));
                }
            }
        }
    }

    diags.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
    diags.dedup();
    match root {
        Some((
            _,
            RootParsed {
                config: Some(root), ..
            },
        )) if diags.is_empty() => Ok(RepoConfig { root, envs }),
        _ if diags.is_empty() => Err(vec![Diagnostic::file(
            ROOT_FILE,
            "the configuration could not be read",
        )]),
        _ => Err(diags),
    }
}

/// Parse and validate `drover.toml` from its text.
pub fn parse_root(file: &str, text: &str) -> Result<RootConfig, Vec<Diagnostic>> {
    let parsed = root_inner(file, text, None);
    match parsed.config {
        Some(c) if parsed.diags.is_empty() => Ok(c),
        _ => Err(parsed.diags),
    }
}

/// Parse and validate an environment file from its text.
pub fn parse_env(file: &str, name: &str, text: &str) -> Result<EnvConfig, Vec<Diagnostic>> {
    env_inner(file, name, text)
}

/// Path of the file of environment `name`.
pub(super) fn env_path(name: &str) -> String {
    format!("{ENV_DIR}/{name}.toml")
}

pub(super) fn read_text(files: &dyn Files, path: &str) -> Result<String, Diagnostic> {
    let bytes = files
        .read(path)
        .map_err(|why| Diagnostic::file(path, why))?
        .ok_or_else(|| {
            let why = if path == ROOT_FILE {
                format!("missing file `{path}`: a config repository needs {ROOT_FILE} at its root")
            } else {
                format!("cannot read `{path}`")
            };
            Diagnostic::file(path, why)
        })?;
    String::from_utf8(bytes).map_err(|e| {
        let (valid, _) = e.as_bytes().split_at(e.utf8_error().valid_up_to());
        let text = String::from_utf8_lossy(valid);
        Diagnostic::at(
            path,
            &text,
            text.len(),
            "the file is not UTF-8 text; TOML files must be UTF-8",
        )
    })
}
