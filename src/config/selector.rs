//! Kubernetes label selectors (the string form `kubectl -l` takes), parsed
//! here so a typo fails `drover check` instead of the agent's first list call.

use std::collections::BTreeMap;
use std::fmt;

/// What a valid selector looks like, appended to every parse error.
pub const SELECTOR_SYNTAX: &str = "a label selector is a comma-separated list of `key`, `!key`, \
`key=value`, `key==value`, `key!=value`, `key in (a,b)` or `key notin (a,b)`; keys are \
`name` or `prefix/name` with a DNS-subdomain prefix and a name of at most 63 characters \
`[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`; values are empty or follow the same rule as names";

/// A parsed label selector: all requirements must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    /// The requirements, in source order.
    pub requirements: Vec<Requirement>,
}

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    NotExists(String),
    /// `key=value` or `key==value`.
    Equals(String, String),
    /// `key!=value`: absent, or present with another value.
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)`: absent, or present with a value not listed.
    NotIn(String, Vec<String>),
}

/// Why a selector did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}; {SELECTOR_SYNTAX}")]
pub struct SelectorError {
    /// The specific problem.
    pub reason: String,
}

impl LabelSelector {
    /// Parse the string form; empty or blank selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { requirements });
        }
        let mut p = Parser { s, pos: 0 };
        loop {
            requirements.push(p.requirement()?);
            p.skip_ws();
            match p.peek() {
                None => break,
                Some(',') => p.pos += 1,
                Some(c) => return Err(p.fail(format!("expected `,` or the end, found `{c}`"))),
            }
        }
        Ok(Self { requirements })
    }

    /// Whether a node with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
        })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::NotExists(k) => write!(f, "!{k}")?,
                Requirement::Equals(k, v) => write!(f, "{k}={v}")?,
                Requirement::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
            }
        }
        Ok(())
    }
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        self.s.get(self.pos..).unwrap_or("")
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn fail(&self, reason: String) -> SelectorError {
        SelectorError { reason }
    }

    /// A run of characters that can form a key, value or keyword.
    fn word(&mut self) -> &str {
        self.skip_ws();
        let start = self.pos;
        let rest = self.rest();
        let len = rest
            .find(|c: char| c.is_whitespace() || matches!(c, ',' | '=' | '!' | '(' | ')'))
            .unwrap_or(rest.len());
        self.pos += len;
        self.s.get(start..self.pos).unwrap_or("")
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        self.skip_ws();
        if self.peek() == Some('!') {
            self.pos += 1;
            let key = self.key()?;
            return Ok(Requirement::NotExists(key));
        }
        let key = self.key()?;
        self.skip_ws();
        let rest = self.rest();
        if rest.starts_with("==") {
            self.pos += 2;
            Ok(Requirement::Equals(key, self.value()?))
        } else if rest.starts_with("!=") {
            self.pos += 2;
            Ok(Requirement::NotEquals(key, self.value()?))
        } else if rest.starts_with('=') {
            self.pos += 1;
            Ok(Requirement::Equals(key, self.value()?))
        } else if rest.is_empty() || rest.starts_with(',') {
            Ok(Requirement::Exists(key))
        } else {
            let op = self.word().to_owned();
            match op.as_str() {
                "in" => Ok(Requirement::In(key, self.set()?)),
                "notin" => Ok(Requirement::NotIn(key, self.set()?)),
                "" => Err(self.fail(format!(
                    "unexpected `{}` after key `{key}`",
                    self.peek().unwrap_or(' ')
                ))),
                other => Err(self.fail(format!(
                    "unknown operator `{other}` after key `{key}` (valid: =, ==, !=, in, notin)"
                ))),
            }
        }
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        let k = self.word().to_owned();
        if k.is_empty() {
            return Err(self.fail("expected a label key".to_owned()));
        }
        validate_key(&k).map_err(|r| self.fail(r))?;
        Ok(k)
    }

    fn value(&mut self) -> Result<String, SelectorError> {
        let v = self.word().to_owned();
        validate_value(&v).map_err(|r| self.fail(r))?;
        Ok(v)
    }

    fn set(&mut self) -> Result<Vec<String>, SelectorError> {
        self.skip_ws();
        if self.peek() != Some('(') {
            return Err(self.fail("expected `(` to open the set of values".to_owned()));
        }
        self.pos += 1;
        let mut values = Vec::new();
        loop {
            values.push(self.value()?);
            self.skip_ws();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some(')') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.fail("expected `,` or `)` in the set of values".to_owned())),
            }
        }
        if values.iter().all(String::is_empty) {
            return Err(self.fail("a set of values must not be empty".to_owned()));
        }
        Ok(values)
    }
}

fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            b.len() <= 63
                && f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            matches!((b.first(), b.last()), (Some(f), Some(l))
                if (f.is_ascii_lowercase() || f.is_ascii_digit())
                    && (l.is_ascii_lowercase() || l.is_ascii_digit()))
                && b.len() <= 63
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Check a label key (`name` or `prefix/name`).
pub fn validate_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        if !is_dns_subdomain(p) {
            return Err(format!(
                "invalid label key `{k}`: prefix `{p}` is not a DNS subdomain"
            ));
        }
    }
    if !is_name(name) {
        return Err(format!(
            "invalid label key `{k}`: name `{name}` is not valid"
        ));
    }
    Ok(())
}

/// Check a label value (may be empty).
pub fn validate_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_name(v) {
        Ok(())
    } else {
        Err(format!("invalid label value `{v}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn parses_every_operator() {
        let s = LabelSelector::parse(
            "node-role.kubernetes.io/worker, !gpu, zone=a, tier==web, arch != arm64, \
             pool in (x, y), os notin (windows)",
        )
        .expect("valid selector");
        assert_eq!(
            s.requirements,
            vec![
                Requirement::Exists("node-role.kubernetes.io/worker".into()),
                Requirement::NotExists("gpu".into()),
                Requirement::Equals("zone".into(), "a".into()),
                Requirement::Equals("tier".into(), "web".into()),
                Requirement::NotEquals("arch".into(), "arm64".into()),
                Requirement::In("pool".into(), vec!["x".into(), "y".into()]),
                Requirement::NotIn("os".into(), vec!["windows".into()]),
            ]
        );
        assert_eq!(
            s.to_string(),
            "node-role.kubernetes.io/worker,!gpu,zone=a,tier=web,arch!=arm64,pool in (x,y),os notin (windows)"
        );
    }

    #[test]
    fn empty_selects_all() {
        let s = LabelSelector::parse("  ").expect("blank is valid");
        assert!(s.requirements.is_empty());
        assert!(s.matches(&labels(&[])));
    }

    #[test]
    fn empty_value_is_allowed() {
        let s = LabelSelector::parse("a=").expect("empty value");
        assert_eq!(
            s.requirements,
            vec![Requirement::Equals("a".into(), "".into())]
        );
    }

    #[test]
    fn rejects_bad_syntax() {
        for bad in [
            ",",
            "a,",
            "=b",
            "a=b=c",
            "a in b",
            "a in (b",
            "a in ()",
            "a > 3",
            "a b",
            "-a",
            "a-",
            "Upper.Case/x",
            "a/b/c",
            "/x",
            "x/",
            "a=-b",
            "a=b c",
            &"k".repeat(64),
            "a==b,,c",
            "!",
            "!a=b",
        ] {
            let err = LabelSelector::parse(bad).expect_err(bad);
            assert!(err.to_string().contains("comma-separated"), "{bad}: {err}");
        }
    }

    #[test]
    fn matching_follows_kubernetes_semantics() {
        let node = labels(&[("zone", "a"), ("pool", "x")]);
        let yes = |s: &str| LabelSelector::parse(s).expect(s).matches(&node);
        assert!(yes("zone"));
        assert!(!yes("!zone"));
        assert!(yes("zone=a,pool in (x,y)"));
        assert!(!yes("zone=b"));
        assert!(yes("missing!=v"));
        assert!(yes("missing notin (v)"));
        assert!(!yes("missing in (v)"));
        assert!(!yes("pool notin (x)"));
    }
}
