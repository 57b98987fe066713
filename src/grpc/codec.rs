//! The protobuf codec of `retrybudget.v1`: tonic-prost's, except that a
//! message is decoded from one contiguous slice.
//!
//! tonic hands a decoder the message through `DecodeBuf`, a `Buf` over the
//! connection's buffer, and prost's decoding then goes through it for every
//! field: each varint asks for the chunk and advances the `BytesMut` under
//! it. The message's bytes are always contiguous there, so this codec gives
//! prost the slice instead (a `&[u8]` is a `Buf` whose reads inline), and
//! advances the buffer once. Encoding is tonic-prost's.
//!
//! Bytes that are not a message of their type are the sender's fault when
//! the sender is a client: the server refuses such a request with
//! `INVALID_ARGUMENT` and a stable code ([`Received`]): `invalid_utf8`
//! naming the string field, `malformed_request` otherwise. A client that
//! cannot decode a response says `INTERNAL`, as tonic-prost does.
//!
//! Both directions start from a buffer of [`BUFFER_SIZE`] instead of
//! tonic's 8 KiB. tonic allocates one a call for the request and one for
//! the response, and grows either in steps of its starting size when a
//! message needs more. This API's messages are mostly under a few hundred
//! bytes, so the 8 KiB buffers only spread each call's bytes over more
//! memory: a durable decision's response buffer stays allocated until h2
//! has written it, a group's worth (about 65 at 128 streams) at once after
//! each fsync.

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::Buf;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// The buffer each call starts with, in either direction. Encoded, the
/// benchmark's `NextActionRequest` is 53 bytes and its answer 131; one with
/// a server's error details and a workflow id, a few hundred. 1 KiB holds
/// them with room to spare and is the largest size mimalloc serves from its
/// fast path. A larger message (an activity's whole history from
/// `GetActivity`) grows the buffer in steps of this size.
pub const BUFFER_SIZE: usize = 1024;

/// tonic's threshold for a streaming response's batch of messages (its
/// default; no RPC of this API streams).
const YIELD_THRESHOLD: usize = 32 * 1024;

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
}

/// The codec the generated service and client use (see `build.rs`).
#[derive(Debug, Clone)]
pub struct SliceCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SliceCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SliceCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Received + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = SliceDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        SliceDecoder(PhantomData)
    }
}

/// Decodes a `U` from the contiguous bytes of one message.
#[derive(Debug, Clone, Default)]
pub struct SliceDecoder<U>(PhantomData<U>);

impl<U: Message + Default + Received> Decoder for SliceDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let len = buf.remaining();
        let item = if buf.chunk().len() == len {
            let item = U::decode(buf.chunk());
            buf.advance(len);
            item
        } else {
            // Not contiguous (not seen with tonic 0.14): prost reads it as is.
            U::decode(buf)
        };
        item.map(Some).map_err(U::undecodable)
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
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
