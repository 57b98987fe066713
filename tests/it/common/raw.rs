//! Request messages sent as raw bytes, exactly as given (malformed or
//! oversized ones included), for the tests of what the server does with
//! bodies no generated client would send. Declared with
//! `#[path = "common/raw.rs"]` next to `mod common`.

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::BufMut;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::ProstDecoder;

use crate::common::TestServer;

/// Sends the bytes it is given as the request message, unchanged.
#[derive(Default)]
struct RawCodec<U>(PhantomData<U>);

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl<U: Message + Default + Send + 'static> Codec for RawCodec<U> {
    type Encode = Vec<u8>;
    type Decode = U;
    type Encoder = RawEncoder;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> ProstDecoder<U> {
        ProstDecoder::new(BufferSettings::default())
    }
}

/// `method` of the service with `body` as its request message.
pub async fn raw<U: Message + Default + Send + 'static>(
    server: &TestServer,
    method: &'static str,
    body: Vec<u8>,
) -> Result<U, Status> {
    let mut grpc = tonic::client::Grpc::new(server.channel().await)
        // The server's limit is what is tested, not the client's.
        .max_encoding_message_size(usize::MAX);
    grpc.ready().await.expect("ready");
    let path = http::uri::PathAndQuery::try_from(format!("/retrybudget.v1.RetryBudget/{method}"))
        .expect("path");
    grpc.unary(tonic::Request::new(body), path, RawCodec::<U>::default())
        .await
        .map(tonic::Response::into_inner)
}
