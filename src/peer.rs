//! Who is at the other end of a connection, as the transport proved it:
//! the address it connects from and, under mutual TLS, the leaf certificate
//! it presented. tonic puts each connection's [`Peer`] into the extensions
//! of every request on it (the `ConnectInfo` of the server's connections),
//! where authentication reads the client's identity.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;

/// What the transport knows of a connection's client.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// The client's address, when the socket could tell it.
    pub remote_addr: Option<SocketAddr>,
    /// The leaf certificate the client presented and the server verified
    /// (mutual TLS); `None` on plaintext and on TLS without a client
    /// certificate.
    pub client_certificate: Option<Arc<CertificateDer<'static>>>,
}

impl Peer {
    /// The [`Peer`] of a request's extensions; the default (nothing known)
    /// when the request did not come through the server's listener (an
    /// in-process test calling a service directly).
    pub fn of(extensions: &http::Extensions) -> Peer {
        extensions.get::<Peer>().cloned().unwrap_or_default()
    }
}
