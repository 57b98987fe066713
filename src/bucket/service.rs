//! [`RetryToken`]: the middleware that gives every request a [`Gate`] to
//! the bucket, without reading it.
//!
//! # What it does not do
//! It reads neither the path nor the tenant, and takes nothing: whether a
//! request needs a token is decided by the handler, from the body and the
//! stored activity, and only a retry asks the gate (once, for the tenant
//! the authentication layer resolved). It never waits and never refuses a
//! request: a deferral is an answer the handler gives, not an error of the
//! transport. That is also why nothing is reserved in `poll_ready`.

use std::task::{Context, Poll};

use tower::Service;

use super::gate::Gate;
use super::handle::FairBucket;

pub use crate::budget::tenant::{DEFAULT_TENANT, TENANT_HEADER};

/// Inserts a [`Gate`] to its bucket into the extensions of every request.
#[derive(Debug, Clone)]
pub struct RetryToken<S> {
    /// The wrapped service.
    inner: S,
    /// The gate every request is given (a clone shares the bucket).
    gate: Gate,
}

impl<S> RetryToken<S> {
    /// Wraps `inner`, giving its requests a gate to `bucket`.
    pub fn new(inner: S, bucket: FairBucket) -> Self {
        Self {
            inner,
            gate: Gate::new(bucket),
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<http::Request<B>> for RetryToken<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        request.extensions_mut().insert(self.gate.clone());
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests;
