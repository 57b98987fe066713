//! The protobuf codec of `retrybudget.v1`: tonic-prost's, except for bytes
//! that are not a message of their type.
//!
//! Such bytes are the sender's fault when the sender is a client: the
//! server refuses the request with `INVALID_ARGUMENT` and a stable code
//! ([`Received`]): `invalid_utf8` naming the string field,
//! `malformed_request` otherwise, where tonic-prost would answer
//! `INTERNAL`. A client that cannot decode a response says `INTERNAL`, as
//! tonic-prost does.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// The codec the generated service and client use (see `build.rs`).
#[derive(Debug, Clone)]
pub struct ApiCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ApiCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for ApiCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Received + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ApiDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ApiDecoder(PhantomData)
    }
}

/// Decodes a `U`, refusing bytes that are not one as [`Received`] says.
#[derive(Debug, Clone, Default)]
pub struct ApiDecoder<U>(PhantomData<U>);

impl<U: Message + Default + Received> Decoder for ApiDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(U::undecodable)
    }
}

/// A message this API receives, and what its receiver answers when the
/// bytes are not one: each message of `retrybudget.v1` is a request (the
/// server receives it) or a response (a client receives it).
pub trait Received {
    /// The status of bytes that do not decode as this message.
    fn undecodable(error: prost::DecodeError) -> Status;
}

/// Requests: the client sent bytes that are not the message, a refusal
/// with a stable code (`status::undecodable`).
macro_rules! requests {
    ($($message:ident),* $(,)?) => {$(
        impl Received for super::pb::$message {
            fn undecodable(error: prost::DecodeError) -> Status {
                super::status::undecodable(stringify!($message), &error)
            }
        }
    )*};
}

/// Responses: the server sent bytes that are not the message; the client
/// says so as tonic-prost does.
macro_rules! responses {
    ($($message:ident),* $(,)?) => {$(
        impl Received for super::pb::$message {
            fn undecodable(error: prost::DecodeError) -> Status {
                Status::internal(error.to_string())
            }
        }
    )*};
}

requests!(
    RetryDelayRequest,
    NextActionRequest,
    RecordSuccessRequest,
    ResolveActivityRequest,
    GetActivityRequest,
    ReportTrafficRequest,
);
responses!(
    RetryDelayResponse,
    NextActionResponse,
    RecordSuccessResponse,
    ResolveActivityResponse,
    Activity,
    ReportTrafficResponse,
);
