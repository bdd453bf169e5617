//! A push of one branch: its tip on the remote read from the advertisement
//! of the very connection the update goes over (the rest of that list
//! dropped as it streams by: receive-pack has no protocol v2), then the one
//! update and the pack of what the remote lacks, and the remote's report.

use super::refs::{self, Asked};
use super::{local, open, remote_error, Conn, Endpoint};
use crate::source::{Error, SourceConfig};
use git2::{Oid, Repository};
use gix_transport::client::blocking_io::Transport;
use gix_transport::client::{Capabilities, MessageKind, WriteMode};
use gix_transport::Service;
use std::cell::RefCell;
use std::io::{Read, Write};
use std::ops::ControlFlow;
use std::rc::Rc;

/// Most bytes kept of the remote's report and of what it prints.
const REPORT_MAX: u64 = 64 * 1024;
/// Most bytes kept of what the remote prints (a hook's reason).
const SAID_MAX: usize = 1024;

/// What the remote did with the update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Update {
    /// The branch now points where it was asked to.
    Done,
    /// Refused: the remote's status for the ref ("non-fast-forward",
    /// "pre-receive hook declined", "stale info", ...).
    Rejected(String),
}

enum Ends {
    Local(local::Local),
    Remote(Conn, Capabilities),
}

/// A connection to push one branch over, its tip already read.
pub(crate) struct PushConn<'c> {
    cfg: &'c SourceConfig,
    ends: Ends,
    branch: String,
    tip: Option<Oid>,
}

impl<'c> PushConn<'c> {
    /// Connect to push `branch_ref` (a full name) and read its tip.
    pub(crate) fn open(cfg: &'c SourceConfig, branch_ref: &str) -> Result<Self, Error> {
        let asked = Asked {
            exact: vec![branch_ref.to_owned()],
            prefixes: vec![],
            max: 1,
        };
        let (ends, tip) = match open(cfg, Service::ReceivePack)? {
            Endpoint::Local(path) => {
                let remote = local::open(&path)?;
                let tip = remote.lookup(branch_ref)?;
                (Ends::Local(remote), tip)
            }
            Endpoint::Remote(mut conn) => {
                let found = refs::discover(&mut conn, Service::ReceivePack, &asked).map_err(
                    |e| match e {
                        refs::Error::Malformed(_) => Error::Remote {
                            url: crate::source::redact(&cfg.url),
                            detail: e.to_string(),
                        },
                        e => remote_error(cfg, &e),
                    },
                )?;
                let tip = found.refs.get(branch_ref).copied();
                (Ends::Remote(conn, found.capabilities), tip)
            }
        };
        Ok(Self {
            cfg,
            ends,
            branch: branch_ref.to_owned(),
            tip,
        })
    }

    /// The branch's tip on the remote, `None` where it does not exist.
    pub(crate) fn tip(&self) -> Option<Oid> {
        self.tip
    }

    /// Move the branch from its tip to `new` (`None` deletes it), sending
    /// the objects of `repo` reachable from `new` and not from the tip nor
    /// from `known` (commits the remote is known to have). Returns what
    /// the remote did and the first bytes of what it printed.
    pub(crate) fn send(
        self,
        repo: &Repository,
        new: Option<Oid>,
        known: &[Oid],
        go_on: &dyn Fn() -> bool,
    ) -> Result<(Update, Vec<u8>), Error> {
        let mut have: Vec<Oid> = known.to_vec();
        have.extend(self.tip);
        match self.ends {
            Ends::Local(remote) => {
                if let Some(n) = new {
                    local::copy_objects(repo, &remote.repo, &[n], &have, go_on)?;
                }
                Ok((
                    update_local(&remote, &self.branch, self.tip, new)?,
                    Vec::new(),
                ))
            }
            Ends::Remote(mut conn, caps) => {
                let said = Rc::new(RefCell::new(Vec::new()));
                let update = update_remote(
                    &mut conn,
                    &caps,
                    repo,
                    &self.branch,
                    self.tip,
                    new,
                    &have,
                    &said,
                )
                .map_err(|e| remote_error(self.cfg, &*e))?;
                let said = said.borrow().clone();
                Ok((update, said))
            }
        }
    }
}

/// The update of a local repository's ref, refused as a remote refuses a
/// stale one when it is no longer at `old`.
fn update_local(
    remote: &local::Local,
    branch: &str,
    old: Option<Oid>,
    new: Option<Oid>,
) -> Result<Update, Error> {
    Ok(if remote.update(branch, old, new)? {
        Update::Done
    } else {
        Update::Rejected("stale info: the branch moved".into())
    })
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// One command and its pack to receive-pack, then its report (under
/// side-band-64k when offered, so a hook's words arrive as band 2).
#[allow(clippy::too_many_arguments)]
fn update_remote(
    conn: &mut Conn,
    caps: &Capabilities,
    repo: &Repository,
    branch: &str,
    old: Option<Oid>,
    new: Option<Oid>,
    have: &[Oid],
    said: &Rc<RefCell<Vec<u8>>>,
) -> Result<Update, Failure> {
    let zero = Oid::ZERO_SHA1.to_string();
    if new.is_none() && !caps.contains("delete-refs") {
        return Ok(Update::Rejected(
            "the remote does not take deletions".into(),
        ));
    }
    let sideband = caps.contains("side-band-64k");
    let mut wanted = vec!["report-status".to_owned()];
    for c in ["side-band-64k", "quiet"] {
        if caps.contains(c) {
            wanted.push(c.to_owned());
        }
    }
    wanted.push(format!("agent={}", refs::agent()));
    let command = format!(
        "{} {} {branch}\0{}",
        old.map_or(zero.clone(), |o| o.to_string()),
        new.map_or(zero, |n| n.to_string()),
        wanted.join(" ")
    );
    let mut writer = conn.request(WriteMode::Binary, MessageKind::Flush, false)?;
    writer.write_all(command.as_bytes())?;
    writer.write_message(MessageKind::Flush)?;
    let (mut raw, mut reader) = writer.into_parts();
    if let Some(n) = new {
        write_pack(repo, n, have, &mut raw)?;
    }
    raw.flush()?;
    drop(raw);
    let report = if sideband {
        let said = said.clone();
        reader.set_progress_handler(Some(Box::new(move |_is_error, text: &[u8]| {
            let mut s = said.borrow_mut();
            let room = SAID_MAX.saturating_sub(s.len());
            s.extend_from_slice(&text[..text.len().min(room)]);
            ControlFlow::Continue(())
        })));
        let mut data = Vec::new();
        (&mut reader).take(REPORT_MAX).read_to_end(&mut data)?;
        packet_lines(&data)
    } else {
        let mut lines = Vec::new();
        while let Some(line) = reader.readline() {
            let line = line?.map_err(|e| e.to_string())?;
            if let Some(d) = line.as_slice() {
                lines.push(d.to_vec());
            }
            if lines.len() > 64 {
                break;
            }
        }
        lines
    };
    parse_report(&report, branch)
}

/// The pack of what `repo` reaches from `new` and not from `have`.
fn write_pack(
    repo: &Repository,
    new: Oid,
    have: &[Oid],
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let mut walk = repo.revwalk()?;
    walk.push(new)?;
    let odb = repo.odb()?;
    for h in have {
        if odb.exists(*h) {
            let _ = walk.hide(*h);
        }
    }
    let mut pack = repo.packbuilder()?;
    pack.insert_walk(&mut walk)?;
    let mut failed = None;
    let written = pack.foreach(|chunk| match out.write_all(chunk) {
        Ok(()) => true,
        Err(e) => {
            failed = Some(e);
            false
        }
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    written?;
    Ok(())
}

/// The packet lines of a small buffer (band 1 of the report), to its flush.
fn packet_lines(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let Some(len) = std::str::from_utf8(&data[..4])
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
        else {
            break;
        };
        if len == 0 || len < 4 || len > data.len() {
            break;
        }
        out.push(data[4..len].to_vec());
        data = &data[len..];
    }
    out
}

/// receive-pack's report: `unpack ok|<error>`, then `ok <ref>` or
/// `ng <ref> <reason>` for the one ref pushed.
fn parse_report(lines: &[Vec<u8>], branch: &str) -> Result<Update, Failure> {
    let text: Vec<String> = lines
        .iter()
        .map(|l| String::from_utf8_lossy(l).trim_end_matches('\n').to_owned())
        .collect();
    let Some(unpack) = text.first().and_then(|l| l.strip_prefix("unpack ")) else {
        return Err(format!("the remote sent no report (got {:?})", text.first()).into());
    };
    for line in &text[1..] {
        if line.strip_prefix("ok ") == Some(branch) {
            return Ok(if unpack == "ok" {
                Update::Done
            } else {
                Update::Rejected(format!("unpack failed: {unpack}"))
            });
        }
        if let Some(rest) = line.strip_prefix("ng ") {
            let reason = rest.strip_prefix(branch).map_or(rest, str::trim_start);
            return Ok(Update::Rejected(reason.to_owned()));
        }
    }
    if unpack != "ok" {
        return Ok(Update::Rejected(format!("unpack failed: {unpack}")));
    }
    Err(format!("the remote's report does not name {branch}").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_the_branch_and_why() {
        let b = "refs/heads/s";
        let lines = packet_lines(b"000eunpack ok\n0014ok refs/heads/s\n0000");
        assert_eq!(parse_report(&lines, b).unwrap(), Update::Done);
        let lines =
            packet_lines(b"000eunpack ok\n002eng refs/heads/s pre-receive hook declined\n0000");
        assert_eq!(
            parse_report(&lines, b).unwrap(),
            Update::Rejected("pre-receive hook declined".into())
        );
        assert!(parse_report(&[], b).is_err());
    }
}
