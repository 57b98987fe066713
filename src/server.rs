//! The wiring: a store, the ledger, the `RetryBudget` service behind the
//! retry-token layer, health and reflection on one tonic server, a retention
//! sweeper, and a graceful drain.
//!
//! # Draining
//! When `shutdown` resolves: health turns `NOT_SERVING` for every service
//! name, new `RetryBudget` calls are refused with `UNAVAILABLE`
//! (`shutting_down`), and for `drain_delay` the server keeps answering so a
//! mesh sees the change. Then it stops accepting connections and waits for
//! calls in flight, at most `grace_period`, and returns.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::bucket::{BucketConfig, BucketConfigError, FairBucket, RetryTokenLayer};
use crate::budget::activity::{Defaults, Policy};
use crate::budget::classify::{RuleError, RuleSet, RuleSpec};
use crate::grpc::pb::retry_budget_server::RetryBudgetServer;
use crate::grpc::{Draining, RetryBudgetService, SERVICE_NAME, pb};
use crate::ledger::Ledger;
use crate::store::{RedbStore, RedbStoreOptions, RuntimeIdle, Store, StoreError};

mod incoming;

/// Everything the server needs besides its listener and shutdown signal.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the embedded store keeps its file.
    pub data_dir: PathBuf,
    /// The most decisions one group commit (one fsync) carries.
    pub max_batch: usize,
    /// Under load, the least time from one group commit to the next.
    pub commit_window: Duration,
    /// A journal segment this large is checkpointed into the database.
    pub journal_segment_bytes: u64,
    /// A journal segment this old is checkpointed even when small.
    pub journal_segment_age: Duration,
    /// The policy of activities whose first report names none.
    pub default_policy: Policy,
    /// How long a closed (or expired) activity is kept before it is purged.
    pub retention: Duration,
    /// How often the retention sweeper runs.
    pub sweep_interval: Duration,
    /// How long health says `NOT_SERVING` before the listener closes.
    pub drain_delay: Duration,
    /// How long calls in flight may take to finish after the listener closes.
    pub grace_period: Duration,
    /// The global retry-token bucket and its tenant weights.
    pub bucket: BucketConfig,
    /// The operator's classification rules, tried before the defaults.
    pub classification_rules: Vec<RuleSpec>,
    /// The longest delay a server's hint may ask for.
    pub max_hint: Duration,
    /// Set by the binary, whose runtime calls it when a worker parks: ends
    /// a group commit's window when no more decisions are coming.
    pub runtime_idle: Option<RuntimeIdle>,
}

impl ServerConfig {
    /// The documented defaults, with the store under `data_dir` (the
    /// store's own defaults for its journal).
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let store = RedbStoreOptions::new(data_dir);
        Self {
            max_batch: store.max_batch,
            commit_window: store.commit_window,
            journal_segment_bytes: store.segment_bytes,
            journal_segment_age: store.segment_age,
            data_dir: store.data_dir,
            default_policy: Policy {
                max_attempts: 5,
                deadline_seconds: 3600,
                base: None,
                cap: None,
            },
            retention: Duration::from_secs(7 * 24 * 3600),
            sweep_interval: Duration::from_secs(60),
            drain_delay: Duration::from_secs(2),
            grace_period: Duration::from_secs(10),
            bucket: BucketConfig::default(),
            classification_rules: Vec::new(),
            max_hint: Duration::from_secs(3600),
            runtime_idle: None,
        }
    }
}

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
    /// Reflection could not be built from the descriptor set.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Serves on `listener` until `shutdown` resolves, then drains and returns.
///
/// # Errors
/// [`ServerError`] when the store cannot be opened or the transport fails.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let mut options = RedbStoreOptions::new(&config.data_dir);
    options.max_batch = config.max_batch;
    options.commit_window = config.commit_window;
    options.segment_bytes = config.journal_segment_bytes;
    options.segment_age = config.journal_segment_age;
    options.runtime_idle.clone_from(&config.runtime_idle);
    let store = RedbStore::open(&options)?;
    // A clone shares the counters; it is dropped when `run` returns, after
    // `serve` has released the ledger, so the file is freed as before.
    let counted = store.clone();
    let result = serve(listener, store, config, shutdown).await;
    let [commits, saves, checkpoints, checkpointed] = counted.commit_stats().snapshot();
    tracing::info!(
        commits,
        saves,
        checkpoints,
        checkpointed,
        "group commit totals"
    );
    result
}

/// [`run`] over any store.
///
/// # Errors
/// [`ServerError`] when the transport fails.
pub async fn serve<S: Store>(
    listener: TcpListener,
    store: S,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let local = listener
        .local_addr()
        .map_or_else(|_| "unknown".to_owned(), |a: SocketAddr| a.to_string());
    let defaults = Defaults {
        policy: config.default_policy,
        max_hint_ms: u64::try_from(config.max_hint.as_millis()).unwrap_or(u64::MAX),
    };
    let rules = Arc::new(RuleSet::new(config.classification_rules.clone())?);
    let ledger = Arc::new(Ledger::new(store, defaults));
    let bucket = FairBucket::new(&config.bucket)?;
    let draining = Draining::default();

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RetryBudgetServer<RetryBudgetService<S>>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let sweeper = tokio::spawn(sweep(
        Arc::clone(&ledger),
        config.retention,
        config.sweep_interval,
    ));

    let service = RetryBudgetService::new(
        Arc::clone(&ledger),
        draining.clone(),
        Some(bucket.clone()),
        rules,
    );
    let stop = CancellationToken::new();
    let router = Server::builder()
        .layer(RetryTokenLayer::new(bucket))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(RetryBudgetServer::new(service));
    let serving = router.serve_with_incoming_shutdown(
        incoming::incoming(listener, stop.clone()),
        stop.clone().cancelled_owned(),
    );
    tokio::pin!(serving);
    tracing::info!(
        addr = %local,
        service = SERVICE_NAME,
        retry_rate = config.bucket.rate,
        retry_burst = config.bucket.burst,
        max_batch = config.max_batch,
        commit_window = ?config.commit_window,
        "serving"
    );

    tokio::select! {
        result = &mut serving => {
            stop_task(sweeper).await;
            return result.map_err(Into::into);
        }
        () = shutdown => {}
    }

    tracing::info!(drain_delay = ?config.drain_delay, "draining: health NOT_SERVING, new calls refused");
    draining.start();
    health
        .set_not_serving::<RetryBudgetServer<RetryBudgetService<S>>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    stop_task(sweeper).await;

    // Keep answering (health says NOT_SERVING, calls are refused) so that a
    // mesh notices before connections go away.
    if tokio::time::timeout(config.drain_delay, &mut serving)
        .await
        .is_ok()
    {
        return Ok(());
    }
    stop.cancel();
    match tokio::time::timeout(config.grace_period, &mut serving).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => {
            tracing::warn!(grace_period = ?config.grace_period, "calls still in flight after the grace period; stopping");
            Ok(())
        }
    }
}

/// Aborts a background task and waits until it is gone, so whatever it
/// holds (the ledger, hence the store) is released before `serve` returns.
async fn stop_task(task: tokio::task::JoinHandle<()>) {
    task.abort();
    let _ = task.await;
}

/// Reflection over every service the server hosts, both reflection versions
/// included, whichever version the client asks (grpcurl 1.8 asks v1alpha).
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

/// Purges expired activities every `interval`.
async fn sweep<S: Store>(ledger: Arc<Ledger<S>>, retention: Duration, interval: Duration) {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match ledger.sweep(crate::clock::now_ms(), retention_ms).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "retention sweep"),
            Err(error) => tracing::warn!(%error, "retention sweep failed"),
        }
    }
}
