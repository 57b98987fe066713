//! One HTTP/2 connection to the server for the generated tonic clients,
//! without tonic's `Channel`.
//!
//! A `Channel` puts a buffer task and a stack of layers (origin, user agent,
//! timeout, concurrency limit, reconnection) between a client and its
//! connection: every request is handed to the buffer's task before hyper
//! sees it. Without them the generator spends about a tenth less CPU a
//! request, on the one core it has, and the closed loops it drives are
//! less often bound by it (BENCHMARKS.md, "The load generator"). Here a
//! client calls hyper's `SendRequest` directly. The server receives the
//! same requests: the scheme and authority are filled in from `--target`,
//! and the `user-agent` is a tonic one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::uri::{Authority, Scheme, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tonic::body::Body;

/// The `user-agent` a tonic `Channel` sends, so that the server parses the
/// same headers as from any tonic client.
pub const USER_AGENT: &str = "tonic/0.14";

/// The authority of an `http://host:port` target.
///
/// # Errors
/// What is wrong with the target.
fn http_authority(target: &str) -> Result<Authority, String> {
    let uri: Uri = target
        .parse()
        .map_err(|e: http::uri::InvalidUri| e.to_string())?;
    if uri.scheme() != Some(&Scheme::HTTP) {
        return Err("only http:// targets are supported".into());
    }
    uri.authority()
        .cloned()
        .ok_or_else(|| "no host:port".to_owned())
}

/// A cloneable handle on one HTTP/2 connection; its clones share it.
#[derive(Clone)]
pub struct Conn {
    send: SendRequest<Body>,
    authority: Authority,
}

impl Conn {
    /// Connects to `target` (`http://host:port`) with `TCP_NODELAY`, and
    /// drives the connection on a task of the current runtime.
    ///
    /// # Errors
    /// What is wrong with the target, or why connecting failed.
    pub async fn connect(target: &str) -> Result<Self, String> {
        let (stream, authority) = tcp(target).await?;
        let (send, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        drive(connection);
        Ok(Self { send, authority })
    }
}

/// A TCP connection to `target` (`http://host:port`) with `TCP_NODELAY`,
/// and the target's authority.
///
/// # Errors
/// What is wrong with the target, or why connecting failed.
pub async fn tcp(target: &str) -> Result<(TcpStream, Authority), String> {
    let authority = http_authority(target)?;
    let port = authority.port_u16().unwrap_or(80);
    let stream = TcpStream::connect((authority.host(), port))
        .await
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    Ok((stream, authority))
}

/// Drives an HTTP/2 connection on a task of the current runtime, and says
/// so if it ends with an error.
pub fn drive<E: std::fmt::Display>(
    connection: impl Future<Output = Result<(), E>> + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("retry-budget-loadgen: connection ended: {error}");
        }
    });
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<Incoming>, hyper::Error>> + Send>>;

impl tower::Service<http::Request<Body>> for Conn {
    type Response = http::Response<Incoming>;
    type Error = hyper::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // tonic's clients give the path only, as they do to a `Channel`,
        // which adds the origin.
        let mut uri = std::mem::take(request.uri_mut()).into_parts();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(self.authority.clone());
        *request.uri_mut() = Uri::from_parts(uri).unwrap_or_default();
        request.headers_mut().insert(
            http::header::USER_AGENT,
            http::HeaderValue::from_static(USER_AGENT),
        );
        Box::pin(self.send.send_request(request))
    }
}
