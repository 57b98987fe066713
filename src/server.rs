//! The wiring: a store, the ledger, the `RetryBudget` service behind the
//! retry-token layer, health and reflection on one tonic server, a retention
//! sweeper, and a graceful drain.
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
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::auth::{AuthLayer, Authenticator};
use crate::bucket::{BucketConfigError, FairBucket, RetryTokenLayer};
use crate::budget::activity::Defaults;
use crate::budget::classify::{RuleError, RuleSet};
use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use crate::config::{Config, ConfigError};
use crate::coord::{CoordinationConfigError, Coordinator};
use crate::grpc::limit::MessageLimit;
use crate::grpc::pb::retry_budget_server::RetryBudgetServer;
use crate::grpc::{Draining, RetryBudgetService, SERVICE_NAME, pb};
use crate::ledger::Ledger;
use crate::metrics::{Metrics, RpcMetricsLayer, Sources};
use crate::store::{CommitStats, PgStore, RedbStore, Store, StoreError};

mod deadline;
mod incoming;
mod reload;
mod tls;
mod watch;

pub use reload::Reload;
pub use tls::TlsError;

pub use watch::COORDINATION_HEALTH;

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
    if let Some(options) = config.store.postgres_options() {
        let store = PgStore::open(&options)?;
        let counted = store.clone();
        let pool = store.coordination_pool().clone();
        let result = serve_with(listener, store, config, shutdown, Some(pool), reloads).await;
        let [commits, saves, ..] = counted.commit_stats().snapshot();
        tracing::info!(commits, saves, "group commit totals");
        return result;
    }
    let store = RedbStore::open(&config.store.redb_options())?;
    // A clone shares the counters; it is dropped when `run` returns, after
    // `serve` has released the ledger, so the file is freed as before.
    let counted = store.clone();
    let result = serve_with(listener, store, config, shutdown, None, reloads).await;
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
    mut reloads: Option<mpsc::UnboundedReceiver<Reload>>,
) -> Result<(), ServerError> {
    // Before anything else: a server that cannot serve its certificate
    // does not start.
    let certs = tls::Certs::load(&config.tls)?;
    let local = listener
        .local_addr()
        .map_or_else(|_| "unknown".to_owned(), |a: SocketAddr| a.to_string());
    let defaults = Defaults {
        policy: config.policy.policy(),
        max_hint_ms: config.hints.max_hint_ms(),
    };
    let rules = Arc::new(ArcSwap::from_pointee(RuleSet::new(
        config.classification.rules.clone(),
    )?));
    let auth = Arc::new(Authenticator::new(&config.auth).map_err(ServerError::Auth)?);
    let ledger = Arc::new(Ledger::new(store, defaults));
    let bucket = FairBucket::with_dependencies(&config.bucket, config.dependencies.clone())?;
    let draining = Draining::default();
    let replica = config.coordination.clone().resolved();
    // Refused before anything starts that would need stopping.
    if coordination.is_some() {
        config.coordination.validate()?;
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    // The first ping brings the schema up to date.
    let store_answers = watch::ping(&ledger).await;
    // After that first ping, so that the first interval finds the leases'
    // table on a new database; before the first request, so that a replica
    // admits no retry until the database has given it a part of the global
    // budget.
    let coordinator = coordination
        .map(|pool| {
            Coordinator::start(pool, bucket.clone(), config.bucket.clone(), replica.clone())
        })
        .transpose()?;
    // Serving only while it would admit: the store answers and, with
    // coordination, a part of the global budget is held.
    let store_health = watch::spawn_readiness::<S, RetryBudgetServer<RetryBudgetService<S>>>(
        Arc::clone(&ledger),
        health.clone(),
        store_answers,
        coordinator.as_ref().map(Coordinator::state),
    )
    .await;
    let coordination_health = coordinator
        .as_ref()
        .map(|c| tokio::spawn(watch::coordination_health(c.state(), health.clone())));

    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let sweeper = tokio::spawn(watch::sweep(
        Arc::clone(&ledger),
        replica.replica_id().to_owned(),
        config.store.retention,
        config.store.sweep_interval,
    ));

    let stop = CancellationToken::new();
    let metrics = match config.metrics.listen {
        Some(addr) => Some(
            start_metrics(
                addr,
                &config,
                &ledger,
                &bucket,
                coordinator.as_ref(),
                stop.clone(),
            )
            .await?,
        ),
        None => None,
    };
    if let (Some(certs), Some(metrics)) = (&certs, &metrics) {
        certs.set_metrics(metrics.clone());
    }
    let tls_watch = certs
        .as_ref()
        .map(|c| tokio::spawn(Arc::clone(c).watch(config.tls.watch_interval)));
    let rpc_metrics = metrics
        .as_ref()
        .map_or_else(RpcMetricsLayer::off, Metrics::rpc_layer);
    // What a reload reaches, kept until the drain starts.
    let reload_ledger = Arc::clone(&ledger);
    let reload_bucket = bucket.clone();
    let reload_metrics = metrics.clone();
    let service = RetryBudgetService::new(
        Arc::clone(&ledger),
        draining.clone(),
        Some(bucket.clone()),
        Arc::clone(&rules),
    )
    .with_metrics(metrics)
    .with_time_bounds(config.limits.time_bounds());
    let max_message_bytes = config.limits.max_message_bytes;
    let limits = &config.server;
    let accept = incoming::Accept {
        tls: certs.clone(),
        handshake_timeout: config.tls.handshake_timeout,
        max_connections: limits.max_connections,
        health: health_service.clone(),
        metrics: reload_metrics.clone(),
    };
    // h2 refuses the streams past `max_concurrent_streams` (REFUSED_STREAM,
    // which clients retry, and which well-behaved ones never see: they
    // queue) and answers a header list past `max_header_list_size` with
    // HTTP 431, before any service sees the call: neither has a gRPC
    // status to carry a stable code.
    let router = Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_max_header_list_size(limits.max_header_list_size)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .layer(rpc_metrics)
        // Who asks is decided first, once: refusals are counted by the
        // metrics layer outside and never reach the bucket or a handler.
        .layer(AuthLayer::new(Arc::clone(&auth)))
        .layer(deadline::RequestTimeoutLayer::new(limits.request_timeout))
        .layer(RetryTokenLayer::new(bucket))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        // tonic's own limit stays behind ours (src/grpc/limit.rs).
        .add_service(MessageLimit::new(
            RetryBudgetServer::new(service).max_decoding_message_size(max_message_bytes),
            max_message_bytes,
        ));
    // The ledger (hence the store) is held from here on by the service,
    // each connection's copy of it, and the sweeper; `released` tells when
    // the last of them is gone.
    let released = Arc::downgrade(&ledger);
    drop(ledger);
    let mut serving = Box::pin(router.serve_with_incoming_shutdown(
        incoming::incoming(listener, stop.clone(), accept),
        stop.clone().cancelled_owned(),
    ));
    tracing::info!(
        addr = %local,
        service = SERVICE_NAME,
        retry_rate = config.bucket.rate,
        retry_burst = config.bucket.burst,
        auth = config.auth.mode.as_str(),
        max_batch = config.store.max_batch,
        commit_window = ?config.store.commit_window,
        tls = certs.is_some(),
        client_certificates = config.tls.client_ca.is_some(),
        max_connections = config.server.max_connections,
        "serving"
    );

    let result = async {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut reloadable = reload::Reloadable {
            running: config.clone(),
            ledger: &reload_ledger,
            bucket: &reload_bucket,
            coordinator: coordinator.as_ref(),
            rules: &rules,
            metrics: reload_metrics.as_ref(),
            auth: &auth,
            tls: certs.as_deref(),
        };
        loop {
            tokio::select! {
                result = &mut serving => {
                    if let Some(task) = tls_watch {
                        stop_task(task).await;
                    }
                    stop_task(sweeper).await;
                    stop_task(store_health).await;
                    if let Some(task) = coordination_health {
                        stop_task(task).await;
                    }
                    return result.map_err(Into::into);
                }
                () = &mut shutdown => break,
                reload = next_reload(&mut reloads) => reloadable.apply(reload),
            }
        }
        drop(reloadable);
        drop(reload_ledger);
        if let Some(task) = tls_watch {
            stop_task(task).await;
        }

        tracing::info!(drain_delay = ?config.server.drain_delay, "draining: health NOT_SERVING, calls still answered");
        stop_task(store_health).await;
        if let Some(task) = coordination_health {
            stop_task(task).await;
        }
        health
            .set_not_serving::<RetryBudgetServer<RetryBudgetService<S>>>()
            .await;
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        stop_task(sweeper).await;

        // Keep answering every call as before, the grant still held, so
        // that balancers and meshes see NOT_SERVING and move away before a
        // connection goes or a call is refused.
        let drained = tokio::time::timeout(config.server.drain_delay, &mut serving).await;
        // Then stop accepting, refuse what still arrives on open
        // connections, and let the calls in flight finish.
        draining.start();
        stop.cancel();
        let result = match drained {
            Ok(result) => result.map_err(Into::into),
            Err(_) => match tokio::time::timeout(config.server.grace_period, &mut serving).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => {
                    tracing::warn!(grace_period = ?config.server.grace_period, "calls still in flight after the grace period; stopping");
                    Ok(())
                }
            },
        };
        // Its part of the global budget goes to the others at their next
        // interval, not when its lease lapses; after the calls in flight,
        // which may still need a token.
        if let Some(coordinator) = coordinator {
            coordinator.leave().await;
        }
        result
    }
    .await;
    drop(serving);
    wait_released(&released, config.server.grace_period).await;
    result
}

/// The next configuration `reloads` brings; never, once there is no
/// sender (or no channel at all).
async fn next_reload(reloads: &mut Option<mpsc::UnboundedReceiver<Reload>>) -> Reload {
    if let Some(channel) = reloads {
        if let Some(reload) = channel.recv().await {
            return reload;
        }
        *reloads = None;
    }
    std::future::pending().await
}

/// Binds `addr` and serves the metrics there until `stop`: the bucket's,
/// the store's and the coordination's figures read at each scrape, and
/// each group commit observed as it happens.
async fn start_metrics<S: Store>(
    addr: SocketAddr,
    config: &Config,
    ledger: &Arc<Ledger<S>>,
    bucket: &FairBucket,
    coordinator: Option<&Coordinator>,
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
    tokio::spawn(crate::metrics::serve(listener, metrics.clone(), stop));
    Ok(metrics)
}

/// Waits, at most `bound`, until nothing holds the ledger any more: a
/// connection's task may still hold a copy of the service for a moment
/// after the server stopped, and the store's file must be free when `run`
/// returns, so that the same data directory can be opened again at once.
async fn wait_released<T>(ledger: &std::sync::Weak<T>, bound: Duration) {
    let waited = tokio::time::timeout(bound, async {
        while ledger.strong_count() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    if waited.await.is_err() {
        tracing::warn!(
            holders = ledger.strong_count(),
            "the store is still held after the grace period; returning anyway"
        );
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
        // google.rpc's error details (ErrorInfo, RetryInfo), so that
        // grpcurl decodes every refusal's details without a proto file.
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}
