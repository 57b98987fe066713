//! TLS to PostgreSQL with rustls: the system's roots, plus a CA file for a
//! database whose certificate a private CA signed.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};
use tokio_postgres_rustls::MakeRustlsConnect;

/// A connector that trusts the system's roots and the certificates of
/// `ca_file`.
pub(super) fn connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, String> {
    let mut roots = RootCertStore::empty();
    // A system without a readable store still works with a CA file.
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("{}: no certificate in it", path.display()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    if roots.is_empty() {
        return Err("no root certificate to verify the database with: give a CA file".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}
