//! The connections the server accepts: TCP_NODELAY on, TLS handshakes
//! done beside the accept loop, at most `max_connections` served, and a
//! connection whose client has not sent a byte yet closed as soon as the
//! server stops.
//!
//! # Handshakes
//! A TLS handshake runs in a task of its own, bounded by
//! `tls.handshake_timeout`: a client that connects and sends nothing, or
//! sends its handshake a byte a second, delays nobody else. Its place among
//! `max_connections` is taken from the accept, so handshakes in flight are
//! bounded with the rest.
//!
//! # Past `max_connections`
//! A connection over the bound is not left in the kernel's backlog: there
//! a client sees only a connect that hangs until its own timeout, a load
//! balancer cannot tell a full replica from a dead one, and the backlog's
//! overflow drops SYNs silently. It is accepted (and its TLS handshake
//! done, so the client can read the answer), and every call on it is
//! answered `UNAVAILABLE` with the stable code `too_many_connections` and
//! a `RetryInfo`; after the first such answer the server sends GOAWAY, so
//! the client's next call opens a new connection, which finds room or,
//! behind a balancer, another replica. Health checks on it are answered as
//! usual: a full replica is alive, and a liveness probe must not restart
//! it. Such a connection lasts a few seconds at most (see `excess`), and
//! at most `max_connections` of them exist at once; past that, a
//! connection is closed as soon as it is accepted.
//!
//! # Silent connections when the server stops
//!
//! hyper's HTTP/2 server (1.5.1 and later) leaves a connection that is still
//! waiting for the client's preface out of a graceful shutdown
//! (hyperium/hyper#4170, open): a load balancer's TCP check, a port scan or a
//! client stuck before its first write, holding a connection open without a
//! byte, kept the drain waiting for the whole grace period (10 s by default)
//! and ended it with a warning about calls in flight when there were none.
//! Such a connection carries no call, so it loses nothing by being closed:
//! its reads end (end of stream) once the server stops, and hyper lets it go.
//! A connection whose client has spoken is left to hyper's own drain
//! (GOAWAY, then calls in flight finish). A connection still in its TLS
//! handshake when the server stops is dropped.

mod excess;
mod handshake;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::either::Either;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use super::tls::Certs;
use crate::peer::Peer;

/// Connections accepted (and through their handshake) that tonic has not
/// taken yet: it takes each at once, so this is only slack.
const HANDED_OVER: usize = 64;

/// How the server accepts connections.
pub(super) struct Accept<H> {
    /// TLS, when configured; plaintext otherwise.
    pub tls: Option<Arc<Certs>>,
    /// A handshake not done in this long is abandoned.
    pub handshake_timeout: Duration,
    /// The most connections served at once.
    pub max_connections: usize,
    /// Health, answered on connections past `max_connections` too.
    pub health: H,
    /// Where connections past `max_connections` are counted.
    pub metrics: Option<crate::metrics::Metrics>,
}

/// The service a connection past `max_connections` hands health checks to.
pub(super) trait Health:
    tower::Service<
        http::Request<tonic::body::Body>,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static
{
}

impl<H> Health for H where
    H: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}

/// The connections `listener` accepts, through their TLS handshake when
/// `accept.tls` is set; `stop` is cancelled when the server stops
/// accepting. The accept loop is a task of its own, which ends with `stop`
/// or when the stream is dropped.
///
/// TCP_NODELAY is set as tonic's own `serve` sets it (a listener handed in
/// keeps the kernel's default). With Nagle's algorithm on, a small response
/// written while another is still unacknowledged waits for the client's
/// delayed ACK, a stall of about 40 ms.
pub(super) fn incoming<H: Health>(
    listener: TcpListener,
    stop: CancellationToken,
    accept: Accept<H>,
) -> impl Stream<Item = io::Result<Conn>> {
    let (handed, taken) = mpsc::channel(HANDED_OVER);
    tokio::spawn(accept_loop(listener, stop, accept, handed));
    tokio_stream::StreamExt::map(ReceiverStream::new(taken), Ok)
}

async fn accept_loop<H: Health>(
    listener: TcpListener,
    stop: CancellationToken,
    accept: Accept<H>,
    handed: mpsc::Sender<Conn>,
) {
    let places = Arc::new(Semaphore::new(accept.max_connections));
    let refusals = Arc::new(Semaphore::new(accept.max_connections));
    let mut full = false;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
            () = handed.closed() => return,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                accept_failed(&error).await;
                continue;
            }
        };
        // As tonic's own listener: a socket that refuses it still serves.
        let _ = stream.set_nodelay(true);
        let peer = Peer {
            remote_addr: Some(remote),
            client_certificate: None,
        };
        let place = match Arc::clone(&places).try_acquire_owned() {
            Ok(place) => {
                if full {
                    full = false;
                    tracing::info!(
                        max_connections = accept.max_connections,
                        "back under max_connections"
                    );
                }
                place
            }
            Err(_) => {
                if let Some(metrics) = &accept.metrics {
                    metrics.connection_refused();
                }
                if !full {
                    full = true;
                    tracing::warn!(
                        max_connections = accept.max_connections,
                        "max_connections reached: new connections are answered too_many_connections"
                    );
                }
                match Arc::clone(&refusals).try_acquire_owned() {
                    Ok(refusal) => {
                        tokio::spawn(excess::refuse(
                            stream,
                            accept.tls.as_ref().map(|certs| certs.acceptor()),
                            accept.handshake_timeout,
                            accept.health.clone(),
                            refusal,
                            stop.clone(),
                        ));
                    }
                    // Dropped: closed at once.
                    Err(_) => {
                        tracing::debug!(%remote, "too many connections refused at once: closed")
                    }
                }
                continue;
            }
        };
        match &accept.tls {
            None => {
                if handed
                    .send(Conn::new(Either::Left(stream), peer, place, &stop))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Some(certs) => {
                tokio::spawn(handshake::handshake(
                    stream,
                    certs.acceptor(),
                    accept.handshake_timeout,
                    peer,
                    place,
                    stop.clone(),
                    handed.clone(),
                ));
            }
        }
    }
}

/// An accept that failed: a connection reset before it was taken costs
/// nothing; running out of file descriptors would fail again at once, so
/// the loop waits a little, as hyper's listener used to.
async fn accept_failed(error: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(%error, "accept failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// The socket of a connection, under TLS or not.
type Socket = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// An accepted connection.
pub(super) struct Conn {
    stream: Socket,
    peer: Peer,
    /// Until the client's first byte: resolves when the server stops, which
    /// then ends this connection's reads.
    silent: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    /// Its place among `max_connections`, given back when hyper drops it.
    _place: OwnedSemaphorePermit,
}

impl Conn {
    fn new(
        stream: Socket,
        peer: Peer,
        place: OwnedSemaphorePermit,
        stop: &CancellationToken,
    ) -> Self {
        Self {
            stream,
            peer,
            silent: Some(Box::pin(stop.clone().cancelled_owned())),
            _place: place,
        }
    }

    #[cfg(test)]
    pub(super) fn tcp(&self) -> &TcpStream {
        match &self.stream {
            Either::Left(tcp) => tcp,
            Either::Right(tls) => tls.get_ref().0,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(stop) = this.silent.as_mut() else {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.silent = None;
                read
            }
            Poll::Pending if stop.as_mut().poll(cx).is_ready() => {
                // The server stops and the client never spoke: end of stream.
                this.silent = None;
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    use super::*;

    async fn accept_one() -> (Conn, TcpStream, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let accept = Accept {
            tls: None,
            handshake_timeout: Duration::from_secs(10),
            max_connections: 16,
            health: tonic_health::server::health_reporter().1,
            metrics: None,
        };
        let accepted = incoming(listener, stop.clone(), accept);
        tokio::pin!(accepted);
        let client = TcpStream::connect(addr).await.unwrap();
        let conn = accepted.next().await.unwrap().unwrap();
        (conn, client, stop)
    }

    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let (conn, _client, _stop) = accept_one().await;
        assert!(conn.tcp().nodelay().unwrap());
    }

    #[tokio::test]
    async fn a_silent_connection_ends_when_the_server_stops() {
        let (mut conn, _client, stop) = accept_one().await;
        let mut buf = [0u8; 16];
        let read = tokio::spawn(async move { conn.read(&mut buf).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!read.is_finished(), "no byte, no stop: the read waits");
        stop.cancel();
        let n = tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("the read ends once the server stops")
            .unwrap()
            .unwrap();
        assert_eq!(n, 0, "end of stream");
    }

    #[tokio::test]
    async fn a_connection_that_spoke_is_left_to_hyper() {
        let (mut conn, mut client, stop) = accept_one().await;
        client.write_all(b"PRI").await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 3);
        stop.cancel();
        let read = tokio::spawn(async move {
            let n = conn.read(&mut buf).await.unwrap();
            (n, buf)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!read.is_finished(), "stopping does not end its reads");
        client.write_all(b" * HTTP/2.0").await.unwrap();
        let (n, buf) = read.await.unwrap();
        assert_eq!(&buf[..n], b" * HTTP/2.0");
    }

    #[tokio::test]
    async fn under_mutual_tls_a_connection_carries_the_verified_client_certificate() {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

        let dir = tempfile::tempdir().unwrap();
        let mut authority = CertificateParams::new(Vec::<String>::new()).unwrap();
        authority.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(authority, KeyPair::generate().unwrap()).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&server_key, &ca)
            .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client.subject_alt_names = vec![SanType::URI(
            "spiffe://example.org/ns/payments/sa/worker"
                .try_into()
                .unwrap(),
        )];
        let client = client.signed_by(&client_key, &ca).unwrap();
        let path = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            Some(path)
        };
        let config = crate::config::TlsConfig {
            cert: path("server.crt", &server.pem()),
            key: path("server.key", &server_key.serialize_pem()),
            client_ca: path("ca.crt", &ca.pem()),
            ..crate::config::TlsConfig::default()
        };
        let certs = Certs::load(&config).unwrap().expect("TLS configured");

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = Accept {
            tls: Some(certs),
            handshake_timeout: Duration::from_secs(10),
            max_connections: 16,
            health: tonic_health::server::health_reporter().1,
            metrics: None,
        };
        let accepted = incoming(listener, CancellationToken::new(), accept);
        tokio::pin!(accepted);

        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![client.der().clone()],
            PrivateKeyDer::from_pem_slice(client_key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let local = tcp.local_addr().unwrap();
        let connecting = tokio::spawn(async move {
            tokio_rustls::TlsConnector::from(Arc::new(client_config))
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
        });
        let conn = accepted.next().await.unwrap().unwrap();
        let _client = connecting.await.unwrap().unwrap();
        let peer = conn.connect_info();
        assert_eq!(peer.remote_addr, Some(local));
        let presented: &CertificateDer<'_> = client.der();
        assert_eq!(peer.client_certificate.as_deref(), Some(presented));
    }
}
