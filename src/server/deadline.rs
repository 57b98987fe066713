//! `[server] request_timeout`: a call still running that long after it
//! arrived is answered `DEADLINE_EXCEEDED` with the stable code
//! `request_timeout`, and the work behind it is dropped.
//!
//! tonic's own `Server::timeout` answers `CANCELLED` with no code, which a
//! client cannot tell from its own cancellation; this layer answers as
//! every other refusal does (`crate::refusal::Refusal`). The client's
//! `grpc-timeout`, when shorter, still ends the call first (tonic's).
//!
//! What a timed-out `NextAction` leaves: a decision whose record was
//! already handed to the store commits all the same (the store's writer
//! owns it; only the wait for it is dropped), one that was not is not
//! recorded. Either way the client, told nothing, asks again with the same
//! attempt, and the ledger is idempotent per attempt: it replays the
//! recorded decision, or decides it now. The time is to the response's
//! headers: for these unary calls the whole call; a stream (health's
//! `Watch`, reflection) is not cut once it has answered.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;
use tonic::Code;
use tower::{Layer, Service};

use crate::budget::codes;
use crate::refusal::Refusal;

/// The layer that bounds every call to `limit`.
#[derive(Debug, Clone, Copy)]
pub(super) struct RequestTimeoutLayer {
    limit: Duration,
}

impl RequestTimeoutLayer {
    pub(super) fn new(limit: Duration) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestTimeout {
            inner,
            limit: self.limit,
        }
    }
}

/// A service whose calls end at `limit`.
#[derive(Debug, Clone)]
pub(super) struct RequestTimeout<S> {
    inner: S,
    limit: Duration,
}

impl<S, B, R> Service<http::Request<B>> for RequestTimeout<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    R: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Bounded<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        Bounded {
            call: self.inner.call(request),
            sleep: None,
            limit: self.limit,
        }
    }
}

pin_project_lite::pin_project! {
    /// A call, or its refusal once its time is up.
    ///
    /// The timer starts when the call first waits: most calls (a pure
    /// decision, health) are answered in their first poll, which runs as
    /// they arrive, and then pay for no clock read and no timer.
    pub(super) struct Bounded<F> {
        #[pin]
        call: F,
        #[pin]
        sleep: Option<Sleep>,
        limit: Duration,
    }
}

impl<F, R, E> Future for Bounded<F>
where
    F: Future<Output = Result<http::Response<R>, E>>,
    R: Default,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(answer) = this.call.poll(cx) {
            return Poll::Ready(answer);
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(tokio::time::sleep(*this.limit)));
        }
        let sleep = this.sleep.as_pin_mut().expect("set above");
        if sleep.poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(Ok(timed_out(*this.limit).into_http()))
    }
}

/// A call that ran past the server's `request_timeout`.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: the call ran past the server's request_timeout ({} ms); \
     a report is idempotent per attempt: send the same one again",
    codes::REQUEST_TIMEOUT,
    .0.as_millis()
)]
struct TimedOut(Duration);

impl Refusal for TimedOut {
    fn grpc_code(&self) -> Code {
        Code::DeadlineExceeded
    }
    fn stable_code(&self) -> &'static str {
        codes::REQUEST_TIMEOUT
    }
    fn details(&self) -> Vec<(&'static str, String)> {
        vec![("request_timeout_ms", self.0.as_millis().to_string())]
    }
}

/// The answer to a call that ran past `limit`.
fn timed_out(limit: Duration) -> tonic::Status {
    TimedOut(limit).status()
}

#[cfg(test)]
mod tests {
    use tonic_types::StatusExt;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_past_the_limit_is_refused_with_its_code_and_a_quick_one_is_not() {
        let slow = tower::service_fn(|wait: http::Request<Duration>| async move {
            tokio::time::sleep(*wait.body()).await;
            Ok::<_, std::convert::Infallible>(http::Response::new(String::from("done")))
        });
        let bounded = RequestTimeoutLayer::new(Duration::from_secs(2)).layer(slow);
        let quick = bounded
            .clone()
            .oneshot(http::Request::new(Duration::from_secs(1)))
            .await
            .unwrap();
        assert_eq!(quick.body(), "done");
        let late = bounded
            .oneshot(http::Request::new(Duration::from_secs(3)))
            .await
            .unwrap();
        let status = tonic::Status::from_header_map(late.headers()).expect("a gRPC status");
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(
            status.message().starts_with("request_timeout: "),
            "{status:?}"
        );
        let info = status.get_details_error_info().expect("ErrorInfo");
        assert_eq!(info.reason, codes::REQUEST_TIMEOUT);
        assert_eq!(
            info.metadata.get("request_timeout_ms").map(String::as_str),
            Some("2000")
        );
    }
}
