//! The bound on a request message's size: [`MessageLimit`] refuses a
//! `RetryBudget` request whose message is larger than
//! `[limits] max_message_bytes` with `RESOURCE_EXHAUSTED` and the stable
//! code `message_too_large`, as soon as the message's gRPC frame header
//! says how large it is, before its bytes are buffered.
//!
//! # Why a body wrapper and not tonic's own limit
//! tonic checks the same header against `max_decoding_message_size` but
//! refuses with `OUT_OF_RANGE` and a message of its own, no stable code and
//! no details. grpc-go refuses an oversized message with
//! `RESOURCE_EXHAUSTED` ("grpc: received message larger than max (N vs. M)",
//! kept, its source says, consistent with grpc-java), and so do the
//! clients people match such errors against. Rewriting tonic's answer afterwards
//! would mean recognising its message text. Instead the request body is
//! read through [`Limited`], which follows the frames' 5-byte headers (flag,
//! then the length, big-endian) as the bytes pass and, at the first header
//! over the limit, ends the body with our refusal: tonic hands a `Status`
//! its body yields back as the call's status unchanged. tonic's own limit
//! is set to the same value behind it, so that nothing larger is ever
//! buffered even if this wrapper were bypassed.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use hyper::body::{Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;
use tower::Service;

use super::status;

/// `inner` (a gRPC service) with its request messages bounded to `limit`
/// bytes.
#[derive(Debug, Clone)]
pub struct MessageLimit<S> {
    inner: S,
    limit: usize,
}

impl<S> MessageLimit<S> {
    /// Bounds the request messages of `inner` to `limit` bytes.
    pub fn new(inner: S, limit: usize) -> Self {
        Self { inner, limit }
    }
}

impl<S: NamedService> NamedService for MessageLimit<S> {
    const NAME: &'static str = S::NAME;
}

// The inner service takes the `Limited` body as it is: tonic's generated
// server is generic over its body, so wrapping it in a `tonic::body::Body`
// here would box it a second time (tonic boxes the body it decodes from)
// and add one dynamic call to every poll.
impl<S> Service<http::Request<Body>> for MessageLimit<S>
where
    S: Service<http::Request<Limited>, Error = Infallible>,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let limit = self.limit;
        self.inner
            .call(request.map(|body| Limited::new(body, limit)))
    }
}

/// A request body whose gRPC messages are checked against a size limit as
/// their frame headers pass.
#[derive(Debug)]
pub struct Limited {
    body: Body,
    limit: usize,
    /// The header being read: its bytes so far, and how many.
    header: [u8; 5],
    have: usize,
    /// Bytes of the current message still to pass before the next header.
    skip: usize,
    /// Set once the refusal is yielded: the body ends there.
    refused: bool,
}

impl Limited {
    fn new(body: Body, limit: usize) -> Self {
        Self {
            body,
            limit,
            header: [0; 5],
            have: 0,
            skip: 0,
            refused: false,
        }
    }

    /// Follows the frames through `data`; the size of the first message
    /// over the limit, if one starts here.
    fn scan(&mut self, mut data: &[u8]) -> Result<(), usize> {
        while data.has_remaining() {
            if self.skip > 0 {
                let passed = self.skip.min(data.len());
                self.skip -= passed;
                data.advance(passed);
                continue;
            }
            let take = (5 - self.have).min(data.len());
            self.header[self.have..self.have + take].copy_from_slice(&data[..take]);
            self.have += take;
            data.advance(take);
            if self.have == 5 {
                self.have = 0;
                let [_, a, b, c, d] = self.header;
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                if len > self.limit {
                    return Err(len);
                }
                self.skip = len;
            }
        }
        Ok(())
    }
}

impl hyper::body::Body for Limited {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.refused {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref()
            && let Err(size) = self.scan(data)
        {
            self.refused = true;
            return Poll::Ready(Some(Err(status::message_too_large(size, self.limit))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.refused || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(len: u32) -> Vec<u8> {
        let mut frame = vec![0];
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend(std::iter::repeat_n(7, len.min(64) as usize));
        frame
    }

    #[test]
    fn headers_are_followed_across_chunks_of_any_size() {
        let mut bytes = framed(10);
        bytes.extend(framed(64));
        let mut over = framed(65);
        over.truncate(5);
        bytes.extend(over);
        for chunk in 1..=bytes.len() {
            let mut limited = Limited::new(Body::empty(), 64);
            let found = bytes
                .chunks(chunk)
                .map(|c| limited.scan(c))
                .find(Result::is_err);
            assert_eq!(found, Some(Err(65)), "chunks of {chunk}");
        }
        let mut within = Limited::new(Body::empty(), 64);
        assert_eq!(within.scan(&[framed(64), framed(0)].concat()), Ok(()));
    }
}
