//! The platform's trusted root certificates, read once per process and
//! shared by every HTTPS client drover makes (git over HTTPS, webhooks,
//! Prometheus). Reading and parsing the system bundle costs tens of
//! milliseconds each time, and the agent builds its clients again with
//! every leadership term: a restarted term must not pay it again.
//! `SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured, as by
//! `rustls-native-certs`, read when the first client is built.

use std::sync::{Arc, LazyLock};

/// Why no HTTPS client can be configured.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// No usable root certificate on this system.
    #[error("no trusted root certificate found on this system ({errors} errors reading it)")]
    NoRoots { errors: usize },
    /// The crypto provider refused the protocol versions.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The system's roots, read at most once.
pub fn roots() -> Result<Arc<rustls::RootCertStore>, Error> {
    static ROOTS: LazyLock<Result<Arc<rustls::RootCertStore>, Error>> = LazyLock::new(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(Error::NoRoots {
                errors: found.errors.len(),
            });
        }
        Ok(Arc::new(roots))
    });
    ROOTS.clone()
}

/// A client configuration as every drover client has it: rustls with ring,
/// its safe default protocol versions and the system's roots.
pub fn client_config() -> Result<rustls::ClientConfig, Error> {
    let roots = roots()?;
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Config(e.to_string()))?;
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roots_are_read_once_and_shared() {
        let (Ok(a), Ok(b)) = (roots(), roots()) else {
            panic!("this machine has root certificates: {:?}", roots().err());
        };
        assert!(
            Arc::ptr_eq(&a, &b),
            "every client shares one read of the roots"
        );
        assert!(!a.is_empty());
        assert!(client_config().is_ok());
    }
}
