//! [`RetryTokenLayer`]: wraps a service (the tonic server's routes) in
//! [`RetryToken`], so every request carries a gate to the retry bucket.

use tower::Layer;

use super::handle::FairBucket;
use super::service::RetryToken;

/// Builds [`RetryToken`] services that share one bucket.
#[derive(Debug, Clone)]
pub struct RetryTokenLayer {
    /// The bucket every wrapped service takes tokens from.
    bucket: FairBucket,
}

impl RetryTokenLayer {
    /// A layer taking tokens from `bucket`.
    pub fn new(bucket: FairBucket) -> Self {
        Self { bucket }
    }
}

impl<S> Layer<S> for RetryTokenLayer {
    type Service = RetryToken<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryToken::new(inner, self.bucket.clone())
    }
}
