//! The refs a fetch or push asked for, found on the server without holding
//! the others: named as `ls-refs` prefixes where the server speaks protocol
//! v2, picked out of the v0 advertisement as it streams by where not.

use super::Conn;
use gix_transport::client::blocking_io::{ReadlineBufRead, TransportV2Ext};
use gix_transport::client::Capabilities;
use gix_transport::{Protocol, Service};
use std::collections::BTreeMap;

/// What to keep of the server's refs: these names, and those under these
/// prefixes (a refspec's `*`), at most `max` in all.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    /// Full ref names, e.g. `refs/heads/main`.
    pub exact: Vec<String>,
    /// Ref name prefixes, e.g. `refs/heads/drover/status.d/`.
    pub prefixes: Vec<String>,
    /// Most refs kept; more matching is an error, never a longer list.
    pub max: usize,
}

impl Asked {
    fn wants(&self, name: &[u8]) -> bool {
        self.exact.iter().any(|e| e.as_bytes() == name)
            || self.prefixes.iter().any(|p| name.starts_with(p.as_bytes()))
    }
}

/// The server's answer: its protocol, capabilities and the refs asked for.
pub(crate) struct Found {
    pub protocol: Protocol,
    pub capabilities: Capabilities,
    /// Ref name to the object it points at (peeled tags are not asked for).
    pub refs: BTreeMap<String, git2::Oid>,
}

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Transport(#[from] gix_transport::client::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the server lists more than {max} refs under {prefixes}: refused rather than held")]
    TooMany { max: usize, prefixes: String },
    #[error("the server sent a ref line that is not `<object id> <name>`: {0}")]
    Malformed(String),
}

/// `drover/<version>`, the agent capability sent to servers.
pub(crate) fn agent() -> String {
    format!("drover/{}", env!("CARGO_PKG_VERSION"))
}

/// Shake hands for `service` and find the refs `asked` names. For
/// upload-pack, protocol v2 is asked for and `ls-refs` sent with the asked
/// names as prefixes; receive-pack (no v2) and v0 servers have their
/// advertisement read line by line, each line not asked for dropped.
pub(crate) fn discover(conn: &mut Conn, service: Service, asked: &Asked) -> Result<Found, Error> {
    let mut keep = Kept::new(asked);
    let params: &[(&str, Option<&str>)] = &[];
    let shake = conn.handshake(service, params)?;
    let protocol = shake.actual_protocol;
    let capabilities = shake.capabilities.clone();
    if let Some(mut advertised) = shake.refs {
        read_lines(&mut advertised, &mut keep)?;
        return Ok(Found {
            protocol,
            capabilities,
            refs: keep.refs,
        });
    }
    drop(shake);
    if protocol != Protocol::V2 || service != Service::UploadPack {
        return Err(Error::Malformed(format!(
            "protocol {protocol:?} without a ref advertisement"
        )));
    }
    let agent = agent();
    let mut features = vec![("agent", Some(agent.as_str()))];
    let format = capabilities
        .capability("object-format")
        .and_then(|c| c.value().map(|v| v.to_string()));
    if let Some(f) = &format {
        features.push(("object-format", Some(f.as_str())));
    }
    let arguments: Vec<gix_transport::bstr::BString> = asked
        .exact
        .iter()
        .chain(&asked.prefixes)
        .map(|p| format!("ref-prefix {p}").into())
        .collect();
    let mut listed = conn.invoke(
        "ls-refs",
        features.into_iter(),
        Some(arguments.into_iter()),
        false,
    )?;
    read_lines(&mut listed, &mut keep)?;
    Ok(Found {
        protocol,
        capabilities,
        refs: keep.refs,
    })
}

/// The refs kept so far.
struct Kept<'a> {
    asked: &'a Asked,
    refs: BTreeMap<String, git2::Oid>,
}

impl<'a> Kept<'a> {
    fn new(asked: &'a Asked) -> Self {
        Self {
            asked,
            refs: BTreeMap::new(),
        }
    }

    /// One line of an advertisement or of `ls-refs`: `<oid> <name>`, then
    /// (v2) attributes after a space, or (v0) a newline.
    fn line(&mut self, line: &[u8]) -> Result<(), Error> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let Some(space) = line.iter().position(|&b| b == b' ') else {
            return Err(Error::Malformed(lossy(line)));
        };
        let (oid, rest) = (&line[..space], &line[space + 1..]);
        let name = rest.split(|&b| b == b' ').next().unwrap_or(rest);
        if oid == b"shallow" || !self.asked.wants(name) {
            return Ok(());
        }
        // Names asked for are UTF-8; one under a prefix that is not is no
        // branch drover reads.
        let (Ok(name), Some(oid)) = (
            std::str::from_utf8(name),
            std::str::from_utf8(oid)
                .ok()
                .and_then(|o| git2::Oid::from_str(o).ok()),
        ) else {
            return Ok(());
        };
        if self.refs.len() >= self.asked.max && !self.refs.contains_key(name) {
            return Err(Error::TooMany {
                max: self.asked.max,
                prefixes: self.asked.prefixes.join(", "),
            });
        }
        self.refs.insert(name.to_owned(), oid);
        Ok(())
    }
}

/// Read packet lines to the flush that ends the list.
fn read_lines(
    lines: &mut (impl ReadlineBufRead + ?Sized),
    keep: &mut Kept<'_>,
) -> Result<(), Error> {
    while let Some(line) = lines.readline() {
        let line = line?.map_err(|e| Error::Malformed(e.to_string()))?;
        if let Some(data) = line.as_slice() {
            keep.line(data)?;
        }
    }
    Ok(())
}

fn lossy(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(200)]);
    s.into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_names_asked_for_are_kept_whatever_their_bytes() {
        let asked = Asked {
            exact: vec!["refs/heads/main".into()],
            prefixes: vec!["refs/heads/s.d/".into()],
            max: 2,
        };
        let mut keep = Kept::new(&asked);
        let oid = "1111111111111111111111111111111111111111";
        for l in [
            format!("{oid} refs/heads/main\n").into_bytes(),
            format!("{oid} refs/heads/main-junk\n").into_bytes(),
            [format!("{oid} refs/heads/").as_bytes(), b"\xff\xfe\n"].concat(),
            [format!("{oid} refs/heads/s.d/").as_bytes(), b"\xfe\n"].concat(),
            format!("{oid} refs/heads/s.d/a symref-target:x").into_bytes(),
            format!("shallow {oid}").into_bytes(),
        ] {
            keep.line(&l).unwrap();
        }
        assert_eq!(
            keep.refs.keys().collect::<Vec<_>>(),
            ["refs/heads/main", "refs/heads/s.d/a"]
        );
        let more = format!("{oid} refs/heads/s.d/b");
        assert!(matches!(
            keep.line(more.as_bytes()),
            Err(Error::TooMany { max: 2, .. })
        ));
    }
}
