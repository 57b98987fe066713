//! TLS for the tests: certificates made here (rcgen), a client that
//! reports the certificate a server presents, and a gRPC client on one
//! TLS connection that never reconnects (so a test can tell that a
//! connection survived).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, in PEM.
#[derive(Clone)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl Pair {
    /// Writes `cert` and `key` as `NAME.crt` and `NAME.key` in `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert).unwrap();
        std::fs::write(&key, &self.key).unwrap();
        (cert, key)
    }
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `localhost` and `127.0.0.1`, named `name`
    /// and numbered `serial`.
    pub fn server(&self, name: &str, serial: u8) -> Pair {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.serial_number = Some(SerialNumber::from_slice(&[serial]));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_after = rcgen::date_time_ymd(2090, 1, 1);
        self.sign(&params)
    }

    /// A client certificate carrying the SPIFFE ID `spiffe` (a URI SAN).
    pub fn client(&self, spiffe: &str) -> Pair {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, "worker");
        params.subject_alt_names = vec![SanType::URI(spiffe.try_into().unwrap())];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&params)
    }

    fn sign(&self, params: &CertificateParams) -> Pair {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// What a server's certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub subject: String,
    pub serial: String,
}

/// A TLS connection to `addr` trusting `ca`, presenting `client` when
/// given, offering ALPN h2 as gRPC clients do.
pub async fn connect(
    addr: SocketAddr,
    ca: &str,
    client: Option<&Pair>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        Some(pair) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(pair.cert.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(pair.key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// The certificate the server at `addr` presents to a new connection.
pub async fn served(addr: SocketAddr, ca: &str) -> Served {
    let tls = connect(addr, ca, None).await.expect("TLS handshake");
    let (_, session) = tls.get_ref();
    assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]), "ALPN h2");
    let leaf = session.peer_certificates().expect("a certificate")[0].clone();
    describe(&leaf)
}

pub fn describe(der: &CertificateDer<'_>) -> Served {
    use x509_cert::der::Decode;
    let cert = x509_cert::Certificate::from_der(der).unwrap();
    Served {
        subject: cert.tbs_certificate.subject.to_string(),
        serial: cert
            .tbs_certificate
            .serial_number
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    }
}

/// A tonic channel over TLS trusting `ca`, presenting `client` when given.
pub async fn channel(
    addr: SocketAddr,
    ca: &str,
    client: Option<&Pair>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(pair) = client {
        tls = tls.identity(Identity::from_pem(&pair.cert, &pair.key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

/// A gRPC client on exactly one TLS connection: when that connection
/// ends, its calls fail instead of reconnecting.
#[derive(Clone)]
pub struct OneConnection(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl OneConnection {
    pub async fn open(addr: SocketAddr, ca: &str, client: Option<&Pair>) -> Self {
        let tls = connect(addr, ca, client).await.expect("TLS handshake");
        let (send, connection) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("HTTP/2 handshake");
        tokio::spawn(connection);
        Self(send)
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for OneConnection {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}
