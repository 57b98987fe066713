//! The connections past `max_connections`: each call on one is answered
//! `UNAVAILABLE` (`too_many_connections`, with a `RetryInfo`), health
//! checks excepted, then the connection is told to go away (GOAWAY) and
//! closed. See the parent module for why they are answered and not left
//! in the backlog.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tower::ServiceExt;

use super::Health;
use crate::budget::codes;
use crate::refusal::Refusal;

/// The wait a refused call is told to take before it asks again.
pub(crate) const COME_BACK: Duration = Duration::from_secs(1);

/// The longest such a connection lives, its handshake included: long
/// enough for a client to read its answers, short enough that refusing
/// costs little.
const LIFETIME: Duration = Duration::from_secs(10);

/// Calls at once on such a connection.
const STREAMS: u32 = 16;

/// The paths answered as usual on such a connection.
const HEALTH: &str = "/grpc.health.v1.Health/";

/// Serves one connection past the bound, as the module says, for at most
/// [`LIFETIME`]; `_refusal` is its place among the connections being
/// refused.
pub(super) async fn refuse<H: Health>(
    stream: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshake_timeout: Duration,
    health: H,
    _refusal: OwnedSemaphorePermit,
    stop: CancellationToken,
) {
    let remote = stream.peer_addr().ok();
    let served = async {
        let socket = match tls {
            None => Either::Left(stream),
            Some(acceptor) => {
                match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => Either::Right(tls),
                    _ => return,
                }
            }
        };
        serve(socket, health, &stop).await;
    };
    if tokio::time::timeout(LIFETIME, served).await.is_err() {
        tracing::debug!(?remote, "a refused connection outlived its time: closed");
    }
}

async fn serve<H: Health>(
    socket: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    health: H,
    stop: &CancellationToken,
) {
    let refused = Arc::new(Notify::new());
    let answer = {
        let refused = Arc::clone(&refused);
        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let health = health.clone();
            let refused = Arc::clone(&refused);
            async move {
                if request.uri().path().starts_with(HEALTH) {
                    return health.oneshot(request.map(tonic::body::Body::new)).await;
                }
                refused.notify_one();
                Ok(too_many_connections().into_http())
            }
        })
    };
    let connection = http2::Builder::new(TokioExecutor::new())
        .max_concurrent_streams(STREAMS)
        .serve_connection(TokioIo::new(socket), answer);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        () = refused.notified() => {}
        () = stop.cancelled() => {}
    }
    // GOAWAY: the calls under way are answered, the client's next call
    // opens a new connection.
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}

/// A call on a connection past the bound: come back on a new one.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: this server has as many connections as it serves at once; \
     this connection closes, try again on a new one",
    codes::TOO_MANY_CONNECTIONS
)]
pub(crate) struct TooManyConnections;

impl Refusal for TooManyConnections {
    fn grpc_code(&self) -> Code {
        Code::Unavailable
    }
    fn stable_code(&self) -> &'static str {
        codes::TOO_MANY_CONNECTIONS
    }
    fn retry_after(&self) -> Option<Duration> {
        Some(COME_BACK)
    }
}

/// The answer to a call on a connection past the bound.
pub(crate) fn too_many_connections() -> tonic::Status {
    TooManyConnections.status()
}
