//! The protobuf codec of `retrybudget.v1`: tonic-prost's, except that a
//! message is decoded from one contiguous slice.
//!
//! tonic hands a decoder the message through `DecodeBuf`, a `Buf` over the
//! connection's buffer, and prost's decoding then goes through it for every
//! field: each varint asks for the chunk and advances the `BytesMut` under
//! it. The message's bytes are always contiguous there, so this codec gives
//! prost the slice instead (a `&[u8]` is a `Buf` whose reads inline), and
//! advances the buffer once. Encoding is tonic-prost's, untouched. Malformed
//! messages are refused as tonic-prost refuses them (`INTERNAL`, with
//! prost's reason).

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::Buf;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

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
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = SliceDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        SliceDecoder(PhantomData)
    }
}

/// Decodes a `U` from the contiguous bytes of one message.
#[derive(Debug, Clone, Default)]
pub struct SliceDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for SliceDecoder<U> {
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
        item.map(Some)
            .map_err(|error| Status::internal(error.to_string()))
    }
}
