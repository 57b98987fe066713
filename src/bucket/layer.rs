//! [`RetryTokenLayer`]: the tower layer in front of the `RetryBudget`
//! service. For each call that spends budget it resolves the tenant (the
//! one the authentication layer proved, or the checked `x-tenant-id`) and
//! attaches that tenant's [`TenantGate`]; other calls pass untouched.
//! Health and reflection are other services: the layer does not wrap them.

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::server::NamedService;
use tower::{Layer, Service};

use super::gate::TenantGate;
use super::handle::FairBucket;

/// The methods that spend or count budget: their calls get a gate.
const SPENDING: [&str; 3] = ["/NextAction", "/RecordSuccess", "/ReportTraffic"];

/// Wraps the `RetryBudget` service with [`RetryToken`].
#[derive(Debug, Clone)]
pub struct RetryTokenLayer {
    bucket: FairBucket,
}

impl RetryTokenLayer {
    /// A layer handing out gates on `bucket`.
    pub fn new(bucket: FairBucket) -> Self {
        Self { bucket }
    }
}

impl<S> Layer<S> for RetryTokenLayer {
    type Service = RetryToken<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryToken {
            inner,
            bucket: self.bucket.clone(),
        }
    }
}

/// The service [`RetryTokenLayer`] makes.
#[derive(Debug, Clone)]
pub struct RetryToken<S> {
    inner: S,
    bucket: FairBucket,
}

impl<S: NamedService> NamedService for RetryToken<S> {
    const NAME: &'static str = S::NAME;
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
        let path = request.uri().path();
        if SPENDING.iter().any(|m| path.ends_with(m)) {
            // A tenant that does not parse gets no gate: the handler refuses
            // the call with the tenant's own error.
            let tenant = crate::auth::tenant_of(request.extensions(), request.headers())
                .ok()
                .map(Arc::<str>::from);
            if let Some(tenant) = tenant {
                request
                    .extensions_mut()
                    .insert(TenantGate::new(self.bucket.clone(), tenant));
            }
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{ServiceExt, service_fn};

    use super::*;
    use crate::bucket::BucketConfig;

    /// The tenant of the gate the inner service found on a call to `path`
    /// with `x-tenant-id: tenant`, if it found one.
    async fn gate_on(path: &str, tenant: &str) -> Option<String> {
        let bucket = FairBucket::new(&BucketConfig::default()).unwrap();
        let inner = service_fn(|request: http::Request<()>| async move {
            Ok::<_, Infallible>(
                request
                    .extensions()
                    .get::<TenantGate>()
                    .map(|g| g.tenant().to_owned()),
            )
        });
        let service = RetryTokenLayer::new(bucket).layer(inner);
        let request = http::Request::builder()
            .uri(format!("http://x/retrybudget.v1.RetryBudget/{path}"))
            .header("x-tenant-id", tenant)
            .body(())
            .unwrap();
        service.oneshot(request).await.unwrap()
    }

    #[tokio::test]
    async fn only_the_calls_that_spend_budget_get_a_gate_of_their_tenant() {
        for method in ["NextAction", "RecordSuccess", "ReportTraffic"] {
            assert_eq!(gate_on(method, "acme").await.as_deref(), Some("acme"));
        }
        for method in ["RetryDelay", "GetActivity", "ResolveActivity"] {
            assert_eq!(gate_on(method, "acme").await, None, "{method}");
        }
        assert_eq!(
            gate_on("NextAction", "").await,
            None,
            "a tenant that does not parse gets no gate: the handler refuses"
        );
    }
}
