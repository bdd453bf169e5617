//! Reading only the version pin of an environment file from history. Old
//! commits hold files that may no longer validate (keys renamed, windows
//! malformed), and the version history must still show what each commit
//! pinned, so this reader looks at `version` alone and accepts anything else.

use serde::Deserialize;

/// What an environment file pins, read leniently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// `version = "..."`, as written (not validated).
    Set(String),
    /// `version` holds something other than a string, shown as TOML.
    NotAString(String),
    /// The file has no `version`.
    Missing,
    /// The file is not TOML.
    Unreadable,
}

#[derive(Deserialize)]
struct VersionOnly {
    version: Option<toml::Value>,
}

/// The pin of an environment file's text, whatever else the file holds.
pub fn read_pin(text: &str) -> Pin {
    match toml::from_str::<VersionOnly>(text) {
        Ok(VersionOnly {
            version: Some(toml::Value::String(v)),
        }) => Pin::Set(v),
        Ok(VersionOnly { version: Some(v) }) => Pin::NotAString(v.to_string()),
        Ok(VersionOnly { version: None }) => Pin::Missing,
        Err(_) => Pin::Unreadable,
    }
}

impl Pin {
    /// The pinned version, if the pin is a valid semver version.
    pub fn version(&self) -> Option<semver::Version> {
        match self {
            Pin::Set(s) => semver::Version::parse(s.trim()).ok(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_is_read_whatever_else_the_file_holds() {
        let old = "version = \"1.13.2\"\n[window]\nschedul = \"typo\"\n";
        assert_eq!(read_pin(old), Pin::Set("1.13.2".into()));
        assert_eq!(
            read_pin(old).version(),
            Some(semver::Version::new(1, 13, 2))
        );
        assert_eq!(read_pin("version = 3\n"), Pin::NotAString("3".into()));
        assert_eq!(read_pin("version = 3\n").version(), None);
        assert_eq!(read_pin("[rollout]\n"), Pin::Missing);
        assert_eq!(read_pin("version = \n"), Pin::Unreadable);
        assert_eq!(read_pin("version = \"latest\"\n").version(), None);
    }
}
