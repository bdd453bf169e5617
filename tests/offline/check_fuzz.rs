//! Property test: mutated example repositories never make the loader
//! panic, and every diagnostic points inside the file it names.

use drover::config::{self, DirEntry, EntryKind, Files};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// A repository held in memory.
struct MemFiles(BTreeMap<String, Vec<u8>>);

impl Files for MemFiles {
    fn read(&self, path: &str) -> Result<Option<Vec<u8>>, String> {
        Ok(self.0.get(path).cloned())
    }

    fn list(&self, dir: &str) -> Vec<DirEntry> {
        let prefix = format!("{dir}/");
        self.0
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|rest| !rest.contains('/'))
            .map(|name| DirEntry {
                name: name.to_owned(),
                kind: EntryKind::File,
            })
            .collect()
    }
}

const FILES: [&str; 4] = [
    "drover.toml",
    "environments/test.toml",
    "environments/stage.toml",
    "environments/production.toml",
];

/// Fragments that are likely to reach deep into validation when inserted.
const TOKENS: &[&str] = &[
    "[",
    "]",
    "{",
    "}",
    "\"",
    "'",
    "=",
    ",",
    "\n",
    "#",
    "%",
    "*",
    "0",
    "-1",
    "1.2",
    "true",
    "\"\"",
    "[window]",
    "[rollout]",
    "[clusters]",
    "[[nodes]]",
    "schedule = \"* * * * *\"",
    "duration = \"999d\"",
    "version = \"1.2\"",
    "kind = \"job\"",
    "chain = []",
    "x = 1",
    "max_unavailable = \"0%\"",
    "\u{e9}",
    "\u{1F600}",
    "\\u0000",
    "(",
    ")",
    "!",
    "in",
    "timezone = \"\"",
    "'''",
    "\"\"\"",
    "1979-05-27T07:32:00Z",
    "inf",
    "nan",
    "0x1F",
];

#[derive(Debug, Clone)]
enum Mutation {
    SetByte {
        file: usize,
        pos: usize,
        byte: u8,
    },
    DeleteLine {
        file: usize,
        line: usize,
    },
    DuplicateLine {
        file: usize,
        line: usize,
    },
    Insert {
        file: usize,
        pos: usize,
        token: usize,
    },
    Truncate {
        file: usize,
        pos: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let f = 0..FILES.len();
    prop_oneof![
        (f.clone(), any::<usize>(), any::<u8>()).prop_map(|(file, pos, byte)| Mutation::SetByte {
            file,
            pos,
            byte
        }),
        (f.clone(), any::<usize>()).prop_map(|(file, line)| Mutation::DeleteLine { file, line }),
        (f.clone(), any::<usize>()).prop_map(|(file, line)| Mutation::DuplicateLine { file, line }),
        (f.clone(), any::<usize>(), 0..TOKENS.len())
            .prop_map(|(file, pos, token)| Mutation::Insert { file, pos, token }),
        (f, any::<usize>()).prop_map(|(file, pos)| Mutation::Truncate { file, pos }),
    ]
}

fn example() -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("example-repo");
    FILES
        .iter()
        .map(|f| std::fs::read(root.join(f)).expect("example file"))
        .collect()
}

fn apply(files: &mut [Vec<u8>], m: &Mutation) {
    fn lines(b: &[u8]) -> Vec<Vec<u8>> {
        b.split_inclusive(|c| *c == b'\n')
            .map(<[u8]>::to_vec)
            .collect()
    }
    match *m {
        Mutation::SetByte { file, pos, byte } => {
            let b = &mut files[file];
            if !b.is_empty() {
                let i = pos % b.len();
                b[i] = byte;
            }
        }
        Mutation::DeleteLine { file, line } => {
            let mut ls = lines(&files[file]);
            if !ls.is_empty() {
                let i = line % ls.len();
                ls.remove(i);
            }
            files[file] = ls.concat();
        }
        Mutation::DuplicateLine { file, line } => {
            let mut ls = lines(&files[file]);
            if !ls.is_empty() {
                let i = line % ls.len();
                let l = ls[i].clone();
                ls.insert(i, l);
            }
            files[file] = ls.concat();
        }
        Mutation::Insert { file, pos, token } => {
            let b = &mut files[file];
            let i = pos % (b.len() + 1);
            b.splice(i..i, TOKENS[token].bytes());
        }
        Mutation::Truncate { file, pos } => {
            let b = &mut files[file];
            let i = pos % (b.len() + 1);
            b.truncate(i);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mutated_repos_load_or_point_inside_the_file(muts in prop::collection::vec(mutation(), 1..5)) {
        let mut files = example();
        for m in &muts {
            apply(&mut files, m);
        }
        let mem = MemFiles(
            FILES.iter().map(|f| (*f).to_owned()).zip(files.iter().cloned()).collect(),
        );
        if let Err(diags) = config::load(&mem) {
            prop_assert!(!diags.is_empty());
            for d in &diags {
                let idx = FILES.iter().position(|f| *f == d.file);
                prop_assert!(idx.is_some(), "diagnostic for unknown file: {d}");
                let bytes = &files[idx.unwrap_or(0)];
                let line_count = bytes.iter().filter(|c| **c == b'\n').count() + 1;
                prop_assert!(d.line <= line_count, "{d} beyond {line_count} lines");
                prop_assert!(d.line > 0 || d.column == 0, "{d}");
                prop_assert!(!d.message.is_empty());
            }
        }
    }
}
