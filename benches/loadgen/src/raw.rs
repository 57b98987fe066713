//! A cheaper client for the open loop: each scenario's one request encoded
//! once, sent over the `h2` crate directly.
//!
//! The open loop is judged only where the generator keeps its own schedule
//! (BENCHMARKS.md, "The open loop's p99 at half saturation"), and with the
//! tonic client on hyper, at half the health check's saturation rate, the
//! generator's one core was nearly always busy and its pacer over 100 us
//! late at p99. Here the request's headers and its gRPC-framed body are
//! built once, a call hands them to h2 and reads back one message and the
//! trailers, with no codec, no tower stack and no hyper body in between.
//! The server receives the same request as from the tonic client: the same
//! method, path, scheme, authority, `content-type`, `te` and `user-agent`
//! headers, the same connection settings (hyper's), and the same
//! frames: the headers, the message, and an empty frame that ends the
//! stream (seen in the server's `h2=debug` log for both clients).
//!
//! Only the scenarios whose every request is the same can use it (health,
//! `RetryDelay`, pure `NextAction`); a durable report differs each time.

use bytes::{Buf, Bytes, BytesMut};
use h2::client::SendRequest;
use http::uri::{Authority, Scheme, Uri};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use prost::Message;

use crate::conn::USER_AGENT;
use crate::scenario::{self, Kind};

/// The settings hyper's HTTP/2 client opens a connection with
/// (`hyper::proto::h2::client`), so that the server sees the same
/// `SETTINGS` and flow control paces this client as it does the tonic one.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
const MAX_FRAME_SIZE: u32 = 16 * 1024;
const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
const MAX_SEND_BUFFER_SIZE: usize = 1024 * 1024;
const INITIAL_MAX_SEND_STREAMS: usize = 100;

/// One HTTP/2 connection; its clones share it.
#[derive(Clone)]
pub struct RawConn {
    send: SendRequest<Bytes>,
    authority: Authority,
}

impl RawConn {
    /// Connects to `target` (`http://host:port`) with `TCP_NODELAY`, and
    /// drives the connection on a task of the current runtime.
    ///
    /// # Errors
    /// What is wrong with the target, or why connecting failed.
    pub async fn connect(target: &str) -> Result<Self, String> {
        let (stream, authority) = crate::conn::tcp(target).await?;
        let (send, connection) = h2::client::Builder::new()
            .initial_max_send_streams(INITIAL_MAX_SEND_STREAMS)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .max_send_buffer_size(MAX_SEND_BUFFER_SIZE)
            .max_frame_size(MAX_FRAME_SIZE)
            .enable_push(false)
            .handshake(stream)
            .await
            .map_err(|e| e.to_string())?;
        crate::conn::drive(connection);
        Ok(Self { send, authority })
    }
}

/// A scenario's request, ready to send any number of times, and the check
/// of its answer.
pub struct Prepared {
    path: &'static str,
    body: Bytes,
    check: Check,
}

/// Decodes an answer's message and checks it, as the tonic client does.
type Check = fn(&[u8]) -> Result<(), String>;

impl Prepared {
    /// The request of `kind`: the message the tonic client sends, framed.
    ///
    /// # Errors
    /// For a durable scenario, whose requests differ each time.
    pub fn of(kind: Kind) -> Result<Self, String> {
        let (path, body, check): (_, _, Check) = match kind {
            Kind::Health => (
                "/grpc.health.v1.Health/Check",
                framed(&scenario::health_request()),
                |bytes| scenario::check_health(&decode(bytes)?),
            ),
            Kind::RetryDelay => (
                "/retrybudget.v1.RetryBudget/RetryDelay",
                framed(&scenario::retry_delay_request()),
                |bytes| scenario::check_retry_delay(&decode(bytes)?),
            ),
            Kind::PureNextAction => (
                "/retrybudget.v1.RetryBudget/NextAction",
                framed(&scenario::pure_next_action_request()),
                |bytes| scenario::check_pure_next_action(&decode(bytes)?),
            ),
            Kind::Durable { .. } | Kind::Stored | Kind::Mixed { .. } => {
                return Err("--client h2 sends the same request every time: health, \
                     retry-delay or pure-next-action"
                    .into());
            }
        };
        Ok(Self { path, body, check })
    }
}

/// An answer's message; `unexpected_body` if it is not one.
fn decode<M: Message + Default>(bytes: &[u8]) -> Result<M, String> {
    M::decode(bytes).map_err(|_| "unexpected_body".to_owned())
}

/// A message in gRPC's framing: not compressed, its length, the bytes.
fn framed(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut body = BytesMut::with_capacity(5 + len);
    body.extend_from_slice(&[0]);
    body.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    message
        .encode(&mut body)
        .expect("the buffer holds the encoded length");
    body.freeze()
}

/// One virtual client of the raw transport.
pub struct RawClient {
    send: SendRequest<Bytes>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    check: Check,
    /// The answer's bytes, kept between calls.
    answer: BytesMut,
}

impl RawClient {
    /// A client sending `prepared` on `conn`.
    pub fn new(conn: &RawConn, prepared: &Prepared) -> Self {
        let uri = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(conn.authority.clone())
            .path_and_query(prepared.path)
            .build()
            .expect("a path from the proto and a parsed authority");
        let mut headers = HeaderMap::with_capacity(4);
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        Self {
            send: conn.send.clone(),
            uri,
            headers,
            body: prepared.body.clone(),
            check: prepared.check,
            answer: BytesMut::new(),
        }
    }

    /// Sends the request once and checks the answer, with the error keys
    /// of the tonic client: a gRPC code's name, or `unexpected_*`.
    pub async fn call(&mut self) -> Result<(), String> {
        std::future::poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .map_err(transport)?;
        let mut request = Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        let (response, mut stream) = self.send.send_request(request, false).map_err(transport)?;
        // The message, then an empty frame that ends the stream: what
        // hyper sends for a tonic client's body, which does not know it
        // has ended until polled again.
        stream
            .send_data(self.body.clone(), false)
            .map_err(transport)?;
        stream.send_data(Bytes::new(), true).map_err(transport)?;
        let response = response.await.map_err(transport)?;
        if response.status() != StatusCode::OK {
            return Err("Unknown".into());
        }
        // A trailers-only answer: an error with no message.
        if let Some(status) = response.headers().get("grpc-status") {
            return Err(grpc_code(status));
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
        if answer.len() < 5 || answer.get_u8() != 0 {
            return Err("unexpected_body".into());
        }
        let len = answer.get_u32() as usize;
        if answer.len() != len {
            return Err("unexpected_body".into());
        }
        (self.check)(answer)
    }
}

/// The error key of a failed exchange: the name of the code a tonic client
/// reports for it (tonic maps a stream's reset reason so; a connection that
/// failed is `Unavailable`).
fn transport(error: h2::Error) -> String {
    use h2::Reason;
    let code = match error.reason() {
        Some(Reason::REFUSED_STREAM) | None => tonic::Code::Unavailable,
        Some(Reason::CANCEL) => tonic::Code::Cancelled,
        Some(Reason::ENHANCE_YOUR_CALM) => tonic::Code::ResourceExhausted,
        Some(Reason::INADEQUATE_SECURITY) => tonic::Code::PermissionDenied,
        Some(_) => tonic::Code::Internal,
    };
    format!("{code:?}")
}

fn grpc_code(status: &HeaderValue) -> String {
    format!("{:?}", tonic::Code::from_bytes(status.as_bytes()))
}
