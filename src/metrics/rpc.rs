//! The RPC layer: one tower layer around every service of the server
//! (`RetryBudget`, health, reflection) that counts and times each call by
//! service, method and gRPC status, counts refusals by stable code, and
//! keeps the number of calls in flight.
//!
//! The status is read from the response's headers: tonic sends a refusal
//! as a trailers-only response, its `grpc-status` among the headers; a
//! response without one is a message, which ends `OK`. The time is to the
//! response's headers, which for these unary calls is the whole call but
//! the last bytes written.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use http::HeaderName;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tower::{Layer, Service};

use crate::budget::codes;

/// gRPC's status codes by number, as Prometheus labels.
use crate::budget::classify::grpc::NAMES as STATUS;

// Read from every response: by name, a lookup skips parsing a `&str`.
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// The methods the server hosts, by path; anything else is `other`.
const METHODS: [(&str, &str, &str); 11] = [
    (
        "/retrybudget.v1.RetryBudget/NextAction",
        "retrybudget.v1.RetryBudget",
        "NextAction",
    ),
    (
        "/retrybudget.v1.RetryBudget/RetryDelay",
        "retrybudget.v1.RetryBudget",
        "RetryDelay",
    ),
    (
        "/retrybudget.v1.RetryBudget/RecordSuccess",
        "retrybudget.v1.RetryBudget",
        "RecordSuccess",
    ),
    (
        "/retrybudget.v1.RetryBudget/GetActivity",
        "retrybudget.v1.RetryBudget",
        "GetActivity",
    ),
    (
        "/retrybudget.v1.RetryBudget/ResolveActivity",
        "retrybudget.v1.RetryBudget",
        "ResolveActivity",
    ),
    (
        "/retrybudget.v1.RetryBudget/ReportTraffic",
        "retrybudget.v1.RetryBudget",
        "ReportTraffic",
    ),
    (
        "/grpc.health.v1.Health/Check",
        "grpc.health.v1.Health",
        "Check",
    ),
    (
        "/grpc.health.v1.Health/Watch",
        "grpc.health.v1.Health",
        "Watch",
    ),
    (
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "grpc.reflection.v1.ServerReflection",
        "ServerReflectionInfo",
    ),
    (
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "grpc.reflection.v1alpha.ServerReflection",
        "ServerReflectionInfo",
    ),
    ("", "other", "other"),
];

/// The refusals an alert reads (`RetryBudgetStoreBacklogged`,
/// `RetryBudgetReplicaNotReady` in deploy/prometheus/retry-budget.rules.yaml):
/// exported at 0 from the start for every method of the service, so that
/// the first one is a rise.
const ALERTED_REFUSALS: [&str; 4] = [
    codes::STORE_BACKLOGGED,
    codes::STORE_UNAVAILABLE,
    codes::STORE_CLOSED,
    codes::SHUTTING_DOWN,
];

type CallLabels = [(&'static str, &'static str); 3];

/// The calls of one method with one status: created on first use, so that
/// only what happened is exported.
type Cell = OnceLock<(Counter, Histogram)>;

/// The RPC metrics, shared by every clone of the layer.
#[derive(Clone, Debug)]
pub struct RpcMetrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    calls: Family<CallLabels, Counter>,
    seconds: Family<CallLabels, Histogram>,
    refusals: Family<[(&'static str, &'static str); 2], Counter>,
    in_flight: Gauge,
    /// `[method][status]`, in [`METHODS`] and [`STATUS`] order.
    cells: Vec<[Cell; 17]>,
}

fn latency() -> Histogram {
    // 50 µs to about 3.3 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 17))
}

impl RpcMetrics {
    pub(super) fn new() -> Self {
        let refusals = Family::default();
        for (_, service, method) in METHODS {
            if service == "retrybudget.v1.RetryBudget" {
                for code in ALERTED_REFUSALS {
                    refusals.get_or_create_owned(&[("method", method), ("code", code)]);
                }
            }
        }
        Self {
            inner: Arc::new(Inner {
                calls: Family::default(),
                seconds: Family::new_with_constructor(latency),
                refusals,
                in_flight: Gauge::default(),
                cells: METHODS.iter().map(|_| Default::default()).collect(),
            }),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        let inner = &self.inner;
        registry.register(
            "rpc_calls",
            "gRPC calls answered, by service, method and status",
            inner.calls.clone(),
        );
        registry.register_with_unit(
            "rpc_duration",
            "Time from a call's arrival to its response, by service, method and status",
            Unit::Seconds,
            inner.seconds.clone(),
        );
        registry.register(
            "rpc_refusals",
            "Calls refused, by method and the stable code that starts the message",
            inner.refusals.clone(),
        );
        registry.register(
            "rpc_in_flight",
            "gRPC calls being served now",
            inner.in_flight.clone(),
        );
    }

    pub(super) fn in_flight(&self) -> &Gauge {
        &self.inner.in_flight
    }

    fn method(path: &str) -> usize {
        METHODS
            .iter()
            .position(|(p, _, _)| *p == path)
            .unwrap_or(METHODS.len() - 1)
    }

    fn observe(&self, method: usize, status: usize, seconds: f64) {
        let (calls, histogram) = self.inner.cells[method][status].get_or_init(|| {
            let (_, service, name) = METHODS[method];
            let labels = [
                ("service", service),
                ("method", name),
                ("code", STATUS[status]),
            ];
            (
                self.inner.calls.get_or_create(&labels).clone(),
                self.inner.seconds.get_or_create(&labels).clone(),
            )
        });
        calls.inc();
        histogram.observe(seconds);
    }

    fn refused(&self, method: usize, message: Option<&http::HeaderValue>) {
        // The message is percent-encoded; its stable code, before the
        // first ':', is plain ASCII.
        let code = message
            .and_then(|m| m.as_bytes().split(|b| *b == b':').next())
            .and_then(|c| std::str::from_utf8(c).ok())
            .map_or("other", codes::intern);
        self.inner
            .refusals
            .get_or_create(&[("method", METHODS[method].2), ("code", code)])
            .inc();
    }
}

/// Wraps each service in [`RpcMetricsService`].
#[derive(Clone, Debug)]
pub struct RpcMetricsLayer {
    metrics: Option<RpcMetrics>,
}

impl RpcMetricsLayer {
    pub(super) fn new(metrics: RpcMetrics) -> Self {
        Self {
            metrics: Some(metrics),
        }
    }

    /// A layer that measures nothing: the server without metrics.
    pub fn off() -> Self {
        Self { metrics: None }
    }
}

impl<S> Layer<S> for RpcMetricsLayer {
    type Service = RpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// Counts and times the calls of the service it wraps.
#[derive(Clone, Debug)]
pub struct RpcMetricsService<S> {
    inner: S,
    metrics: Option<RpcMetrics>,
}

impl<S, B, RB> Service<http::Request<B>> for RpcMetricsService<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = self.metrics.as_ref().map(|metrics| {
            metrics.inner.in_flight.inc();
            Call {
                metrics: metrics.clone(),
                method: RpcMetrics::method(request.uri().path()),
                started: Instant::now(),
            }
        });
        ResponseFuture {
            inner: self.inner.call(request),
            call,
        }
    }
}

/// A call being timed; leaves the in-flight count when dropped, answered
/// or not.
struct Call {
    metrics: RpcMetrics,
    method: usize,
    started: Instant,
}

impl Drop for Call {
    fn drop(&mut self) {
        self.metrics.inner.in_flight.dec();
    }
}

pin_project_lite::pin_project! {
    /// The wrapped service's future, timed.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        if let Some(call) = this.call.take() {
            let seconds = call.started.elapsed().as_secs_f64();
            let status = match &output {
                Ok(response) => response
                    .headers()
                    .get(&GRPC_STATUS)
                    .and_then(|s| s.to_str().ok())
                    .and_then(|s| s.parse::<usize>().ok())
                    .filter(|s| *s < STATUS.len())
                    .unwrap_or(0),
                Err(_) => 13,
            };
            call.metrics.observe(call.method, status, seconds);
            if status != 0
                && let Ok(response) = &output
            {
                call.metrics
                    .refused(call.method, response.headers().get(&GRPC_MESSAGE));
            }
        }
        Poll::Ready(output)
    }
}
