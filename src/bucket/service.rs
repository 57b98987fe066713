//! [`RetryToken`]: the middleware that gives each `NextAction` request a
//! [`PermitSlot`], without decoding its body.
//!
//! # What it reads
//! Only the request's path and its tenant, as the authentication layer
//! (`crate::auth`) put it in the extensions: the decision
//! whether the request is a retry needs the body and the stored activity,
//! which are the handler's. So the layer takes a token *if the tenant's
//! share has one free now* and lets the handler commit it or not; it never
//! waits and never refuses a request (a deferral is an answer the handler
//! gives, not an error of the transport). That is also why, unlike tower's
//! rate limits, nothing is reserved in `poll_ready`: the tenant is known
//! only in `call`.
//!
//! # Tenants
//! The authentication layer decided who asks before this layer runs, and
//! refused what it could not resolve; this layer charges that tenant.
//! Without the authentication layer in front (a service driven in-process)
//! the `x-tenant-id` header is read as the `none` mode reads it: absent is
//! the [`DEFAULT_TENANT`], and a value that is not a valid tenant id (1 to
//! 128 printable ASCII characters, so not empty) gets no permit at all: the
//! handler rejects the request with `INVALID_ARGUMENT`, and the bucket
//! never tracks an id made of garbage.

use std::task::{Context, Poll};

use tower::Service;

use super::handle::FairBucket;
#[cfg(doc)]
use super::permit::PermitSlot;

/// The one method whose requests take retry tokens.
pub const NEXT_ACTION_PATH: &str = "/retrybudget.v1.RetryBudget/NextAction";
pub use crate::budget::tenant::{DEFAULT_TENANT, TENANT_HEADER};

/// Inserts a [`PermitSlot`] into the extensions of every `NextAction`
/// request with a tenant; passes everything else through untouched.
#[derive(Debug, Clone)]
pub struct RetryToken<S> {
    /// The wrapped service.
    inner: S,
    /// Where tokens come from.
    bucket: FairBucket,
}

impl<S> RetryToken<S> {
    /// Wraps `inner`, taking tokens from `bucket`.
    pub fn new(inner: S, bucket: FairBucket) -> Self {
        Self { inner, bucket }
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
        let slot = if request.uri().path() == NEXT_ACTION_PATH {
            crate::auth::tenant_of(request.extensions(), request.headers())
                .ok()
                .map(|tenant| self.bucket.acquire(tenant))
        } else {
            None
        };
        if let Some(slot) = slot {
            request.extensions_mut().insert(slot);
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests;
