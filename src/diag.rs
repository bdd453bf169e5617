//! Diagnostics: errors that point at a file, line and column of the config
//! repository, collected rather than stopped at the first.

use serde::Serialize;
use std::fmt;

/// What an I/O error means, in words and without the OS's error number
/// (`no such file or directory`, not `No such file or directory (os error
/// 2)`): the text people read where a file could not be read or written.
pub fn io_words(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::NotFound => "no such file or directory".to_owned(),
        K::PermissionDenied => "permission denied".to_owned(),
        K::AlreadyExists => "it already exists".to_owned(),
        K::IsADirectory => "it is a directory".to_owned(),
        K::NotADirectory => "a part of its path is not a directory".to_owned(),
        K::StorageFull => "no space left on the device".to_owned(),
        K::ReadOnlyFilesystem => "the file system is read-only".to_owned(),
        _ => {
            let text = e.to_string();
            match text.find(" (os error") {
                Some(i) => text[..i].to_lowercase(),
                None => text,
            }
        }
    }
}

/// One problem found in the config repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// Path relative to the repository root, e.g. `environments/stage.toml`.
    pub file: String,
    /// 1-based line; 0 when the problem is not tied to a line (a missing file).
    pub line: usize,
    /// 1-based column; 0 when not tied to a position.
    pub column: usize,
    /// What is wrong and what would be valid.
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic for a whole file (no position).
    pub fn file(file: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: file.into(),
            line: 0,
            column: 0,
            message: message.into(),
        }
    }

    /// A diagnostic at a byte offset of `text`, converted to line and column.
    pub fn at(
        file: impl Into<String>,
        text: &str,
        offset: usize,
        message: impl Into<String>,
    ) -> Self {
        let (line, column) = line_col(text, offset);
        Self {
            file: file.into(),
            line,
            column,
            message: message.into(),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: error: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: error: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_map_to_lines_and_columns() {
        let text = "a = 1\nbb = \"x\"\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 6), (2, 1));
        assert_eq!(line_col(text, 11), (2, 6));
        assert_eq!(line_col(text, 999), (3, 1));
    }
}
