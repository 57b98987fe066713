//! The generator's HTTP/2 connections: one for tonic's generated clients on hyper without
//! tonic's `Channel` (its buffer task and layers cost the generator about a tenth more CPU a
//! request), and the `h2` client, each scenario's one request prepared once. The server
//! receives the same request from either: method, path, authority, `content-type`, `te`,
//! `user-agent`, connection settings (hyper's) and DATA frames (the message, then an empty
//! frame that ends the stream); `tests/loadgen_e2e.rs` compares them.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, TE, USER_AGENT};
use http::uri::{Authority, Scheme, Uri};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::net::TcpStream;

use crate::Scenario;
use crate::scenario::{self as s};

/// The `user-agent` a tonic `Channel` sends.
const AGENT: &str = "tonic/0.14";

/// A TCP connection to `http://host:port` with `TCP_NODELAY`, and its authority.
async fn tcp(target: &str) -> Result<(TcpStream, Authority), String> {
    let uri: Uri = target
        .parse()
        .map_err(|e: http::uri::InvalidUri| e.to_string())?;
    let authority = match (uri.scheme(), uri.authority()) {
        (Some(scheme), Some(authority)) if *scheme == Scheme::HTTP => authority.clone(),
        _ => return Err("only http://host:port targets are supported".into()),
    };
    let stream = TcpStream::connect((authority.host(), authority.port_u16().unwrap_or(80)))
        .await
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    Ok((stream, authority))
}

/// Drives a connection on a task of the current runtime; says so if it fails.
fn drive<E: std::fmt::Display>(connection: impl Future<Output = Result<(), E>> + Send + 'static) {
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("retry-budget-loadgen: connection ended: {error}");
        }
    });
}

/// One connection for tonic's clients; its clones share it.
#[derive(Clone)]
pub struct Conn {
    send: http2::SendRequest<tonic::body::Body>,
    authority: Authority,
}

impl Conn {
    pub async fn connect(target: String) -> Result<Self, String> {
        let (stream, authority) = tcp(&target).await?;
        let (send, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        drive(connection);
        Ok(Self { send, authority })
    }
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<Incoming>, hyper::Error>> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Conn {
    type Response = http::Response<Incoming>;
    type Error = hyper::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        // tonic's clients give the path only; a `Channel` adds the origin.
        let mut uri = std::mem::take(request.uri_mut()).into_parts();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(self.authority.clone());
        *request.uri_mut() = Uri::from_parts(uri).unwrap_or_default();
        request
            .headers_mut()
            .insert(USER_AGENT, HeaderValue::from_static(AGENT));
        Box::pin(self.send.send_request(request))
    }
}

/// One `h2` connection, opened with hyper's client settings; its clones share it.
#[derive(Clone)]
pub struct RawConn {
    send: h2::client::SendRequest<Bytes>,
    authority: Authority,
}

impl RawConn {
    pub async fn connect(target: String) -> Result<Self, String> {
        let (stream, authority) = tcp(&target).await?;
        let (send, connection) = h2::client::Builder::new()
            .initial_max_send_streams(100)
            .initial_window_size(2 << 20)
            .initial_connection_window_size(5 << 20)
            .max_header_list_size(16 << 10)
            .max_send_buffer_size(1 << 20)
            .max_frame_size(16 << 10)
            .enable_push(false)
            .handshake(stream)
            .await
            .map_err(|e| e.to_string())?;
        drive(connection);
        Ok(Self { send, authority })
    }
}

/// Decodes an answer's message and checks it as the tonic client does.
type Check = fn(&[u8]) -> Result<(), String>;

/// A scenario's request in gRPC framing, and the check of its answer.
pub struct Prepared {
    path: &'static str,
    body: Bytes,
    check: Check,
}

impl Prepared {
    pub fn of(scenario: Scenario) -> Result<Self, String> {
        let (path, body, check): (_, _, Check) = match scenario {
            Scenario::Health => (
                "/grpc.health.v1.Health/Check",
                framed(&s::health_request()),
                |b| s::check_health(&decode(b)?),
            ),
            Scenario::RetryDelay => (
                "/retrybudget.v1.RetryBudget/RetryDelay",
                framed(&s::retry_delay_request()),
                |b| s::check_retry_delay(&decode(b)?),
            ),
            Scenario::PureNextAction => (
                "/retrybudget.v1.RetryBudget/NextAction",
                framed(&s::pure_next_action_request()),
                |b| s::check_pure_next_action(&decode(b)?),
            ),
            _ => {
                return Err(
                    "--client h2 sends one request: health, retry-delay or pure-next-action".into(),
                );
            }
        };
        Ok(Self { path, body, check })
    }
}

fn decode<M: Message + Default>(bytes: &[u8]) -> Result<M, String> {
    M::decode(bytes).map_err(|_| "unexpected_body".to_owned())
}

/// Not compressed, its length, the message.
fn framed(message: &impl Message) -> Bytes {
    let mut body = BytesMut::from(&[0][..]);
    body.extend_from_slice(
        &u32::try_from(message.encoded_len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    message.encode(&mut body).expect("a growable buffer");
    body.freeze()
}

/// One virtual client of the `h2` transport.
pub struct RawClient {
    send: h2::client::SendRequest<Bytes>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    check: Check,
    answer: BytesMut,
}

impl RawClient {
    pub fn new(conn: &RawConn, prepared: &Prepared) -> Self {
        let uri = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(conn.authority.clone());
        let mut headers = HeaderMap::with_capacity(4);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        headers.insert(USER_AGENT, HeaderValue::from_static(AGENT));
        Self {
            send: conn.send.clone(),
            uri: uri
                .path_and_query(prepared.path)
                .build()
                .expect("a valid path"),
            headers,
            body: prepared.body.clone(),
            check: prepared.check,
            answer: BytesMut::new(),
        }
    }

    /// Sends the request once and checks the answer, with the tonic client's error keys.
    pub async fn call(&mut self) -> Result<(), String> {
        std::future::poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .map_err(transport)?;
        let mut request = Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        let (response, mut stream) = self.send.send_request(request, false).map_err(transport)?;
        // As hyper sends a tonic body: the message, then an empty frame that ends the stream.
        stream
            .send_data(self.body.clone(), false)
            .map_err(transport)?;
        stream.send_data(Bytes::new(), true).map_err(transport)?;
        let response = response.await.map_err(transport)?;
        if response.status() != StatusCode::OK {
            return Err("Unknown".into());
        }
        if let Some(status) = response.headers().get("grpc-status") {
            return Err(grpc_code(status)); // trailers only: an error, no message
        }
        let mut body = response.into_body();
        self.answer.clear();
        while let Some(data) = body.data().await {
            let data = data.map_err(transport)?;
            let _ = body.flow_control().release_capacity(data.len());
            self.answer.extend_from_slice(&data);
        }
        let trailers = body.trailers().await.map_err(transport)?;
        match trailers.as_ref().and_then(|t| t.get("grpc-status")) {
            Some(status) if status.as_bytes() == b"0" => {}
            Some(status) => return Err(grpc_code(status)),
            None => return Err("Unknown".into()),
        }
        let mut answer = &self.answer[..];
        if answer.len() < 5 || answer.get_u8() != 0 || answer.get_u32() as usize != answer.len() {
            return Err("unexpected_body".into());
        }
        (self.check)(answer)
    }
}

/// The code a tonic client reports for a failed exchange (a failed connection: Unavailable).
fn transport(error: h2::Error) -> String {
    let code = match error.reason() {
        Some(h2::Reason::REFUSED_STREAM) | None => tonic::Code::Unavailable,
        Some(h2::Reason::CANCEL) => tonic::Code::Cancelled,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => tonic::Code::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => tonic::Code::PermissionDenied,
        Some(_) => tonic::Code::Internal,
    };
    format!("{code:?}")
}

fn grpc_code(status: &HeaderValue) -> String {
    format!("{:?}", tonic::Code::from_bytes(status.as_bytes()))
}
