//! The wiring: a store, the ledger, the `RetryBudget` service behind the
//! retry-token layer, health and reflection on one tonic server, a retention
//! sweeper, and a graceful drain. [`run`] opens the configured store; `App`
//! (`app.rs`) builds the parts from the configuration, serves, reloads and
//! drains.
//!
//! # Draining
//! When `shutdown` resolves: health turns `NOT_SERVING` for every service
//! name, and for `drain_delay` the server keeps answering every call as
//! before, so that balancers and meshes move away first. Then it stops
//! accepting connections, refuses calls that still arrive on open ones with
//! `UNAVAILABLE` (`shutting_down`), waits for calls in flight, at most
//! `grace_period`, gives its part of the global budget back, and returns.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bucket::{BucketConfigError, FairBucket};
use crate::budget::classify::RuleError;
use tokio::sync::mpsc;

use crate::config::{Backend, Config, ConfigError};
use crate::coord::{CoordinationConfigError, Coordinator};
use crate::grpc::pb;
use crate::ledger::Ledger;
use crate::metrics::{Metrics, Sources};
use crate::store::{CommitStats, EmbeddedStore, PgStore, Store, StoreError};

mod app;
mod deadline;
mod incoming;
mod reload;
mod tls;
mod watch;

pub use reload::Reload;
pub use tls::TlsError;

pub use watch::COORDINATION_HEALTH;

use app::App;

/// The server failed to start or to serve.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A classification rule is invalid.
    #[error(transparent)]
    Rules(#[from] RuleError),
    /// The bucket configuration is invalid.
    #[error(transparent)]
    Bucket(#[from] BucketConfigError),
    /// The replicas' coordination is configured wrongly.
    #[error(transparent)]
    Coordination(#[from] CoordinationConfigError),
    /// The metrics' address could not be bound.
    #[error("metrics: cannot listen on {0}: {1}")]
    Metrics(SocketAddr, #[source] std::io::Error),
    /// Reflection could not be built from the descriptor set.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The authentication settings are invalid (or the keys file cannot be
    /// read).
    #[error(transparent)]
    Auth(ConfigError),
    /// The TLS certificate, key or client CA cannot be used.
    #[error("tls: {0}")]
    Tls(#[from] TlsError),
}

/// Serves on `listener` until `shutdown` resolves, then drains and returns.
///
/// # Errors
/// [`ServerError`] when the store cannot be opened or the transport fails.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    run_reloading(listener, config, shutdown, None).await
}

/// [`run`], applying each configuration `reloads` brings (see `reload`):
/// the binary reads the file again on SIGHUP and sends it here.
///
/// # Errors
/// As [`run`].
pub async fn run_reloading(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
    reloads: Option<mpsc::UnboundedReceiver<Reload>>,
) -> Result<(), ServerError> {
    let options = match config.store.backend() {
        Backend::Postgres(options) => {
            let store = PgStore::open(&options)?;
            let counted = store.clone();
            let pool = store.coordination_pool().clone();
            let result = serve_with(listener, store, config, shutdown, Some(pool), reloads).await;
            let [commits, saves] = counted.commit_stats().snapshot();
            tracing::info!(commits, saves, "group commit totals");
            return result;
        }
        Backend::Embedded(options) => options,
    };
    let store = EmbeddedStore::open(&options)?;
    // A clone shares the counters; it is dropped when `run` returns, after
    // `serve` has released the ledger, so the file is freed as before.
    let counted = store.clone();
    let result = serve_with(listener, store, config, shutdown, None, reloads).await;
    let [commits, saves] = counted.commit_stats().snapshot();
    tracing::info!(commits, saves, "group commit totals");
    result
}

/// [`run`] over any store.
///
/// # Errors
/// [`ServerError`] when the transport fails.
pub async fn serve<S: Store>(
    listener: TcpListener,
    store: S,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    serve_with(listener, store, config, shutdown, None, None).await
}

/// [`serve`], the bucket's rate and burst shared with the other replicas
/// on `coordination`'s database when given (see `coord`).
async fn serve_with<S: Store>(
    listener: TcpListener,
    store: S,
    config: Config,
    shutdown: impl Future<Output = ()>,
    coordination: Option<deadpool_postgres::Pool>,
    reloads: Option<mpsc::UnboundedReceiver<Reload>>,
) -> Result<(), ServerError> {
    let app = App::build(store, config, coordination).await?;
    app.serve(listener, shutdown, reloads).await
}

/// Binds `addr` and serves the metrics there until `stop`: the bucket's,
/// the store's and the coordination's figures read at each scrape, and
/// each group commit observed as it happens.
pub(super) async fn start_metrics<S: Store>(
    addr: SocketAddr,
    config: &Config,
    ledger: &Arc<Ledger<S>>,
    bucket: &FairBucket,
    coordinator: Option<&Coordinator>,
    tasks: &TaskTracker,
    stop: CancellationToken,
) -> Result<Metrics, ServerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| ServerError::Metrics(addr, e))?;
    // Weak: the metrics must not keep the store open after the server.
    let weak = Arc::downgrade(ledger);
    let sources = Sources {
        bucket: Some(bucket.clone()),
        commits: Box::new(move || {
            weak.upgrade()
                .and_then(|l| l.store().commit_stats().map(CommitStats::snapshot))
        }),
        coordination: coordinator.map(Coordinator::state),
    };
    let metrics = Metrics::new(
        &reload::config_sha256(config),
        sources,
        crate::metrics::Top {
            tenants: config.metrics.top_tenants,
            dependencies: config.metrics.top_dependencies,
        },
    );
    if let Some(stats) = ledger.store().commit_stats() {
        let observer = metrics.clone();
        stats.observe(Box::new(move |saves, took| {
            observer.commit(saves, took.as_secs_f64());
        }));
    }
    let served = listener.local_addr().map_or(addr, |a| a);
    tracing::info!(addr = %served, "metrics on /metrics");
    tasks.spawn(crate::metrics::serve(listener, metrics.clone(), stop));
    Ok(metrics)
}

/// Reflection over every service the server hosts, both reflection versions
/// included, whichever version the client asks (grpcurl 1.8 asks v1alpha).
pub(super) fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        // google.rpc's error details (ErrorInfo, RetryInfo), so that
        // grpcurl decodes every refusal's details without a proto file.
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}
