//! TLS, and mutual TLS, on the gRPC port: the certificate, its key and the
//! clients' CA read from PEM files into one rustls [`ServerConfig`], read
//! again on SIGHUP and when the files change.
//!
//! # Reloading without dropping a connection
//! The config in force is behind an [`ArcSwap`]: each handshake takes the
//! one current when it starts, and a connection keeps it for its life. A
//! reload builds a whole new config and swaps it in; connections already
//! open are not touched, new ones get the new certificate.
//!
//! A new set of files that does not load (unreadable, not PEM, a key that
//! is not the certificate's, a certificate past its expiry, a CA that
//! verifies nothing) changes nothing: the running config stays, the log
//! says why, and `retry_budget_tls_reloads_total{result="failed"}` counts
//! it. The watch compares the files' contents, not their modification
//! times: a Kubernetes secret volume swaps a symbolic link, and a copy
//! may keep the time it had.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use sha2::Digest;

use crate::config::TlsConfig;
use crate::metrics::Metrics;

/// The TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("{path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file's contents cannot be used.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The files one config is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

impl Files {
    fn of(config: &TlsConfig) -> Option<Self> {
        Some(Self {
            cert: config.cert.clone()?,
            key: config.key.clone()?,
            client_ca: config.client_ca.clone(),
        })
    }

    /// The files' contents, each read once.
    fn read(&self) -> Result<Contents, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Unreadable {
                path: path.to_owned(),
                source,
            })
        };
        Ok(Contents {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
            client_ca: self.client_ca.as_deref().map(read).transpose()?,
        })
    }
}

struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// What the watch compares: the files' bytes, or why they could not be
/// read, so that one failure is logged once and not at every look.
fn fingerprint(read: &Result<Contents, TlsError>) -> [u8; 32] {
    let mut hash = sha2::Sha256::new();
    match read {
        Ok(contents) => {
            for part in [
                Some(&contents.cert),
                Some(&contents.key),
                contents.client_ca.as_ref(),
            ] {
                let part = part.map_or(&[][..], Vec::as_slice);
                hash.update((part.len() as u64).to_le_bytes());
                hash.update(part);
            }
        }
        Err(error) => hash.update(error.to_string().as_bytes()),
    }
    hash.finalize().into()
}

/// The serving certificate, as the log and the metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leaf {
    /// Its subject (RFC 4514).
    pub subject: String,
    /// Its serial number, in hex.
    pub serial: String,
    /// When it expires, in seconds since the Unix epoch.
    pub not_after: u64,
}

/// Builds the server's config from `contents`: ALPN `h2` only (gRPC), and
/// client certificates required and verified when a client CA is given.
fn build(files: &Files, contents: &Contents) -> Result<(ServerConfig, Leaf), TlsError> {
    let invalid = |path: &Path, message: String| TlsError::Invalid {
        path: path.to_owned(),
        message,
    };
    let chain = CertificateDer::pem_slice_iter(&contents.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(&files.cert, format!("not a PEM certificate chain: {e}")))?;
    let Some(first) = chain.first() else {
        return Err(invalid(&files.cert, "holds no certificate".to_owned()));
    };
    let leaf = describe(first).map_err(|message| invalid(&files.cert, message))?;
    if leaf.not_after < now_seconds() {
        return Err(invalid(
            &files.cert,
            format!(
                "the certificate {} expired at {}",
                leaf.subject,
                rfc3339(leaf.not_after)
            ),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&contents.key)
        .map_err(|e| invalid(&files.key, format!("not a PEM private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(&files.cert, e.to_string()))?;
    let builder = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let mut roots = RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(pem) {
                let ca = ca.map_err(|e| invalid(path, format!("not a PEM certificate: {e}")))?;
                roots
                    .add(ca)
                    .map_err(|e| invalid(path, format!("not a CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| invalid(path, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    // Also checks that the key is the certificate's.
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| invalid(&files.key, e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((config, leaf))
}

/// The subject, serial and expiry of a DER certificate.
pub(crate) fn describe(der: &CertificateDer<'_>) -> Result<Leaf, String> {
    use x509_cert::der::Decode;
    let cert = x509_cert::Certificate::from_der(der)
        .map_err(|e| format!("the first certificate cannot be parsed: {e}"))?;
    let tbs = &cert.tbs_certificate;
    Ok(Leaf {
        subject: tbs.subject.to_string(),
        serial: tbs
            .serial_number
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        not_after: tbs.validity.not_after.to_unix_duration().as_secs(),
    })
}

fn now_seconds() -> u64 {
    u64::try_from(crate::clock::now_ms() / 1000).unwrap_or(0)
}

fn rfc3339(unix_seconds: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(unix_seconds))
        .to_string()
}

/// The TLS config in force and what reloads it.
pub(crate) struct Certs {
    current: ArcSwap<ServerConfig>,
    state: Mutex<ReloadState>,
}

/// What a reload reads and what it updates.
struct ReloadState {
    files: Files,
    /// The contents last loaded or refused: the watch acts on a change.
    seen: [u8; 32],
    leaf: Leaf,
    metrics: Option<Metrics>,
}

impl Certs {
    /// The config of `config`'s files; `None` when no certificate is set
    /// (plaintext).
    ///
    /// # Errors
    /// [`TlsError`] when the files cannot be read or used.
    pub(crate) fn load(config: &TlsConfig) -> Result<Option<Arc<Self>>, TlsError> {
        let Some(files) = Files::of(config) else {
            return Ok(None);
        };
        let read = files.read();
        let seen = fingerprint(&read);
        let (server, leaf) = build(&files, &read?)?;
        log_loaded("TLS certificate loaded", &files, &leaf);
        Ok(Some(Arc::new(Self {
            current: ArcSwap::from_pointee(server),
            state: Mutex::new(ReloadState {
                files,
                seen,
                leaf,
                metrics: None,
            }),
        })))
    }

    /// What a new handshake uses: the config in force now.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }

    /// Reports the serving certificate's expiry, and each reload, to
    /// `metrics`.
    pub(crate) fn set_metrics(&self, metrics: Metrics) {
        let mut state = self.lock();
        metrics.set_tls_certificate(&state.leaf.serial, state.leaf.not_after);
        state.metrics = Some(metrics);
    }

    /// Loads the files `config` names (SIGHUP: read again even when they
    /// did not change). Turning TLS off or on needs a restart.
    pub(crate) fn reload(&self, config: &TlsConfig) {
        let Some(files) = Files::of(config) else {
            tracing::warn!("tls.cert is no longer set: TLS stays on until a restart");
            return;
        };
        let mut state = self.lock();
        state.files = files;
        self.try_load(&mut state, "SIGHUP");
    }

    /// Loads the files again if their contents changed since the last
    /// look.
    fn check(&self) {
        let mut state = self.lock();
        if fingerprint(&state.files.read()) != state.seen {
            self.try_load(&mut state, "the files changed");
        }
    }

    /// Every `interval`, [`Certs::check`]: for as long as the task runs.
    pub(crate) async fn watch(self: Arc<Self>, interval: Duration) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            // Reading a few small files; a slow disk must not stall a
            // runtime worker.
            let certs = Arc::clone(&self);
            if tokio::task::spawn_blocking(move || certs.check())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    fn try_load(&self, state: &mut ReloadState, cause: &'static str) {
        let read = state.files.read();
        state.seen = fingerprint(&read);
        match read.and_then(|contents| build(&state.files, &contents)) {
            Ok((server, leaf)) => {
                self.current.store(Arc::new(server));
                log_loaded("TLS certificate reloaded", &state.files, &leaf);
                if let Some(metrics) = &state.metrics {
                    metrics.tls_reload(true);
                    metrics.set_tls_certificate(&leaf.serial, leaf.not_after);
                }
                state.leaf = leaf;
            }
            Err(error) => {
                tracing::error!(
                    %error,
                    cause,
                    serving = %state.leaf.subject,
                    serial = %state.leaf.serial,
                    "TLS reload refused: the running certificate stays"
                );
                if let Some(metrics) = &state.metrics {
                    metrics.tls_reload(false);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReloadState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn log_loaded(message: &'static str, files: &Files, leaf: &Leaf) {
    let days_left = leaf.not_after.saturating_sub(now_seconds()) / 86_400;
    tracing::info!(
        subject = %leaf.subject,
        serial = %leaf.serial,
        not_after = %rfc3339(leaf.not_after),
        days_left,
        cert = %files.cert.display(),
        client_ca = files.client_ca.as_ref().map(|p| p.display().to_string()),
        "{message}"
    );
    if days_left < 14 {
        tracing::warn!(subject = %leaf.subject, not_after = %rfc3339(leaf.not_after), "the TLS certificate expires in less than 14 days");
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    fn pair(name: &str, not_after: (i32, u8, u8)) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn files() -> Files {
        Files {
            cert: "tls.crt".into(),
            key: "tls.key".into(),
            client_ca: None,
        }
    }

    fn built(cert: &str, key: &str) -> Result<Leaf, String> {
        let contents = Contents {
            cert: cert.as_bytes().to_vec(),
            key: key.as_bytes().to_vec(),
            client_ca: None,
        };
        build(&files(), &contents)
            .map(|(config, leaf)| {
                assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
                leaf
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_certificate_loads_with_its_subject_and_expiry() {
        let (cert, key) = pair("localhost", (2090, 1, 1));
        let leaf = built(&cert, &key).unwrap();
        assert_eq!(leaf.not_after, 3_786_912_000);
        assert!(leaf.subject.contains("rcgen self signed cert"), "{leaf:?}");
    }

    #[test]
    fn an_expired_certificate_a_foreign_key_or_no_pem_is_refused_naming_the_file() {
        let (old, old_key) = pair("localhost", (2001, 1, 1));
        let message = built(&old, &old_key).unwrap_err();
        assert!(
            message.starts_with("tls.crt: ") && message.contains("expired"),
            "{message}"
        );
        let (cert, _) = pair("localhost", (2090, 1, 1));
        let (_, other_key) = pair("localhost", (2090, 1, 1));
        let message = built(&cert, &other_key).unwrap_err();
        assert!(message.starts_with("tls.key: "), "{message}");
        let message = built("not PEM", &other_key).unwrap_err();
        assert!(message.starts_with("tls.crt: "), "{message}");
        let message = built(&cert, "not PEM").unwrap_err();
        assert!(message.starts_with("tls.key: "), "{message}");
    }
}
