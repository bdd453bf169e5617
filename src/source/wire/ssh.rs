//! SSH for the wire client: libssh2 (through `ssh2`, over the libssh2
//! git2 already links), the server's host key checked against the agent's
//! known_hosts ([`crate::source::known_hosts`]) before any credential is
//! sent, the deploy key offered, then the service run over the channel.
//! Protocol v2 is asked for with `GIT_PROTOCOL`, which a server passes on
//! only if its sshd accepts that variable (forges do); otherwise the
//! server speaks v0 and its advertisement is filtered as it streams by.

use super::{parsed, remote_error, Conn};
use crate::source::{known_hosts, redact, ssh_host_port, Auth, Error, SourceConfig};
use gix_transport::{Protocol, Service};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;

/// Connect to the SSH server of `cfg.url` and start `service` there.
pub(super) fn connect(cfg: &SourceConfig, service: Service) -> Result<Conn, Error> {
    let url = parsed(cfg)?;
    let (host, port) = ssh_host_port(&cfg.url).ok_or_else(|| Error::Url(cfg.url.clone()))?;
    let shown = if port == 22 {
        host.clone()
    } else {
        format!("[{host}]:{port}")
    };
    let refuse = |detail: &str, kh: &str| Error::HostKey {
        host: shown.clone(),
        detail: detail.to_owned(),
        known_hosts: kh.to_owned(),
    };
    let Auth::Ssh {
        username,
        private_key,
        known_hosts,
    } = &cfg.auth
    else {
        return Err(refuse("no known_hosts file is configured", "none"));
    };
    let fail = |e: &(dyn std::error::Error + 'static)| remote_error(cfg, e);
    let timeout = super::at_least_a_second(cfg.timeout);
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| fail(&e))?
        .next()
        .ok_or_else(|| Error::Url(cfg.url.clone()))?;
    let tcp = TcpStream::connect_timeout(&addr, timeout).map_err(|e| fail(&e))?;
    let mut session = ssh2::Session::new().map_err(|e| fail(&e))?;
    session.set_timeout(timeout.as_millis().min(u32::MAX as u128) as u32);
    session.set_tcp_stream(tcp);
    session.handshake().map_err(|e| fail(&e))?;

    let kh_name = known_hosts.display().to_string();
    let text = std::fs::read_to_string(known_hosts)
        .map_err(|e| refuse(&format!("cannot read known_hosts: {e}"), &kh_name))?;
    let Some((key, _)) = session.host_key() else {
        return Err(refuse("the server's raw host key is unavailable", &kh_name));
    };
    match known_hosts::check(&text, &host, port, key) {
        known_hosts::HostKeyCheck::Known => {}
        known_hosts::HostKeyCheck::Unknown => {
            return Err(refuse("the host is not listed in known_hosts", &kh_name))
        }
        known_hosts::HostKeyCheck::Changed => return Err(refuse(
            "the host key does not match the key listed in known_hosts (changed key or man in the middle)",
            &kh_name,
        )),
        known_hosts::HostKeyCheck::Revoked => {
            return Err(refuse("the host key is marked @revoked", &kh_name))
        }
    }

    let user = url.user().or(username.as_deref()).unwrap_or("git");
    let pubkey = PathBuf::from(format!("{}.pub", private_key.display()));
    let pubkey = pubkey.exists().then_some(pubkey);
    let authed = session.userauth_pubkey_file(user, pubkey.as_deref(), private_key, None);
    if authed.is_err() || !session.authenticated() {
        return Err(Error::Auth {
            url: redact(&cfg.url),
            tried: cfg.auth.tried(&cfg.url),
        });
    }
    let mut channel = session.channel_session().map_err(|e| fail(&e))?;
    let version = match service {
        Service::UploadPack => {
            // Refused by an sshd without `AcceptEnv GIT_PROTOCOL`: v0 then.
            let _ = channel.setenv("GIT_PROTOCOL", "version=2");
            Protocol::V2
        }
        Service::ReceivePack => Protocol::V1,
    };
    let path = url.path.to_string();
    channel
        .exec(&format!("{} {}", service.as_str(), single_quoted(&path)))
        .map_err(|e| fail(&e))?;
    let (read, write) = (channel.stream(0), channel.stream(0));
    Ok(Box::new(
        gix_transport::client::git::blocking_io::Connection::new(
            read,
            write,
            version,
            path,
            None::<(String, Option<u16>)>,
            gix_transport::client::git::ConnectMode::Process,
            false,
        ),
    ))
}

/// `s` quoted for the remote shell, as git quotes the path it sends.
fn single_quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_path_reaches_the_remote_shell_as_one_word() {
        assert_eq!(super::single_quoted("/srv/a b.git"), "'/srv/a b.git'");
        assert_eq!(super::single_quoted("it's"), r"'it'\''s'");
    }
}
