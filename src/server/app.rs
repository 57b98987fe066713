//! [`App`]: a server's parts, built once from its configuration, the
//! router over them, what a reload reaches, and the drain.
//!
//! # Tasks
//! Every task the server starts runs on one [`TaskTracker`]: the
//! readiness and coordination health, the retention sweep and the TLS
//! watch until `background` is cancelled (the drain's start), the metrics
//! endpoint until `stop` (when the listener closes). Stopping is cancelling
//! a token and waiting for the tracker; nothing is aborted midway.
//!
//! # The store's release
//! The ledger holds the store; the service's copies on each connection and
//! the sweep hold the ledger. A caller that reopens the same store once
//! [`App::serve`] returns (a restart in a test, the binary's exit) needs it
//! closed: the ledger's [`Ledger::released`] token says when the last
//! holder is gone.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Server;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

use super::{
    Reload, ServerError, deadline, incoming, reflection, reload, start_metrics, tls, watch,
};
use tower::Layer;

use crate::auth::{AuthLayer, Authenticator};
use crate::bucket::{FairBucket, RetryTokenLayer};
use crate::budget::activity::Defaults;
use crate::budget::classify::RuleSet;
use crate::config::Config;
use crate::coord::Coordinator;
use crate::grpc::limit::MessageLimit;
use crate::grpc::pb::retry_budget_server::RetryBudgetServer;
use crate::grpc::{Draining, RetryBudgetService, SERVICE_NAME};
use crate::ledger::Ledger;
use crate::metrics::{Metrics, RpcMetricsLayer};
use crate::store::Store;

/// A server's parts.
pub(super) struct App<S: Store> {
    config: Config,
    ledger: Arc<Ledger<S>>,
    bucket: FairBucket,
    auth: Arc<Authenticator>,
    rules: Arc<ArcSwap<RuleSet>>,
    certs: Option<Arc<tls::Certs>>,
    coordinator: Option<Coordinator>,
    health: HealthReporter,
    metrics: Option<Metrics>,
    draining: Draining,
    /// The background tasks, stopped when the drain starts.
    tasks: TaskTracker,
    /// Cancelled when the drain starts.
    background: CancellationToken,
    /// The metrics endpoint, stopped when the listener closes.
    endpoints: TaskTracker,
    /// Cancelled when the listener closes.
    stop: CancellationToken,
}

impl<S: Store> App<S> {
    /// Every part, from `config`, over `store`; the bucket's rate and burst
    /// shared with the other replicas on `coordination`'s database when
    /// given. Nothing is served yet, but the background tasks run: the
    /// schema is brought up to date (the first ping) and a replica takes
    /// its first part of the global budget before its first request.
    ///
    /// # Errors
    /// [`ServerError`] for a configuration that cannot serve.
    pub(super) async fn build(
        store: S,
        config: Config,
        coordination: Option<deadpool_postgres::Pool>,
    ) -> Result<Self, ServerError> {
        // Before anything else: a server that cannot serve its certificate
        // does not start.
        let certs = tls::Certs::load(&config.tls)?;
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
        let replica = config.coordination.clone().resolved();
        // Refused before anything starts that would need stopping.
        if coordination.is_some() {
            config.coordination.validate()?;
        }
        let (health, _) = tonic_health::server::health_reporter();
        // The first ping brings the schema up to date; the coordination
        // starts after it, so that its first interval finds the leases'
        // table on a new database.
        let store_answers = watch::ping(&ledger).await;
        // Each dependency where it stood before a restart, before the first
        // request.
        watch::restore_paces(&ledger, &bucket).await;
        let coordinator = coordination
            .map(|pool| {
                Coordinator::start(pool, bucket.clone(), config.bucket.clone(), replica.clone())
            })
            .transpose()?;
        let mut app = Self {
            ledger,
            bucket,
            auth,
            rules,
            certs,
            coordinator,
            health,
            metrics: None,
            draining: Draining::default(),
            tasks: TaskTracker::new(),
            background: CancellationToken::new(),
            endpoints: TaskTracker::new(),
            stop: CancellationToken::new(),
            config,
        };
        // Serving only while it would admit: the store answers and, with
        // coordination, a part of the global budget is held.
        let readiness = watch::readiness::<S, RetryBudgetServer<RetryBudgetService<S>>>(
            Arc::clone(&app.ledger),
            app.health.clone(),
            store_answers,
            app.coordinator.as_ref().map(Coordinator::state),
        )
        .await;
        app.spawn(readiness);
        if let Some(state) = app.coordinator.as_ref().map(Coordinator::state) {
            app.spawn(watch::coordination_health(state, app.health.clone()));
        }
        // Not through `spawn`: it stops itself at the drain, after a last
        // save, never in the middle of one.
        app.tasks.spawn(watch::save_paces(
            Arc::clone(&app.ledger),
            app.bucket.clone(),
            app.background.clone(),
        ));
        app.spawn(watch::sweep(
            Arc::clone(&app.ledger),
            replica.replica_id().to_owned(),
            app.config.store.retention,
            app.config.store.sweep_interval,
        ));
        if let Some(addr) = app.config.metrics.listen {
            let metrics = start_metrics(
                addr,
                &app.config,
                &app.ledger,
                &app.bucket,
                app.coordinator.as_ref(),
                &app.endpoints,
                app.stop.clone(),
            )
            .await?;
            if let Some(certs) = &app.certs {
                certs.set_metrics(metrics.clone());
            }
            app.metrics = Some(metrics);
        }
        if let Some(certs) = &app.certs {
            let watched = Arc::clone(certs).watch(app.config.tls.watch_interval);
            app.spawn(watched);
        }
        Ok(app)
    }

    /// Runs `task` on the tracker until the drain starts.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let background = self.background.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                () = background.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Serves on `listener`, applying each configuration `reloads` brings,
    /// until `shutdown` resolves; then drains (see the module doc of
    /// `server`) and returns once the store is released.
    ///
    /// # Errors
    /// [`ServerError`] when the transport fails.
    pub(super) async fn serve(
        mut self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
        mut reloads: Option<mpsc::UnboundedReceiver<Reload>>,
    ) -> Result<(), ServerError> {
        let local = listener
            .local_addr()
            .map_or_else(|_| "unknown".to_owned(), |a: SocketAddr| a.to_string());
        let limits = &self.config.server;
        let health_service =
            HealthServer::new(HealthService::from_health_reporter(self.health.clone()));
        let service = RetryBudgetService::new(
            Arc::clone(&self.ledger),
            self.draining.clone(),
            Arc::clone(&self.rules),
        )
        .with_metrics(self.metrics.clone())
        .with_time_bounds(self.config.limits.time_bounds());
        let max_message_bytes = self.config.limits.max_message_bytes;
        let accept = incoming::Accept {
            tls: self.certs.clone(),
            handshake_timeout: self.config.tls.handshake_timeout,
            max_connections: limits.max_connections,
            health: health_service.clone(),
            metrics: self.metrics.clone(),
        };
        let rpc_metrics = self
            .metrics
            .as_ref()
            .map_or_else(RpcMetricsLayer::off, Metrics::rpc_layer);
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
            .layer(AuthLayer::new(Arc::clone(&self.auth)))
            .layer(deadline::RequestTimeoutLayer::new(limits.request_timeout))
            .add_service(health_service)
            .add_service(reflection().build_v1()?)
            .add_service(reflection().build_v1alpha()?)
            // The retry budget wraps the one service that spends it; tonic's
            // own limit stays behind ours (src/grpc/limit.rs).
            .add_service(
                RetryTokenLayer::new(self.bucket.clone()).layer(MessageLimit::new(
                    RetryBudgetServer::new(service).max_decoding_message_size(max_message_bytes),
                    max_message_bytes,
                )),
            );
        let mut serving = Box::pin(router.serve_with_incoming_shutdown(
            incoming::incoming(listener, self.stop.clone(), accept),
            self.stop.clone().cancelled_owned(),
        ));
        let config = &self.config;
        tracing::info!(
            addr = %local,
            service = SERVICE_NAME,
            retry_rate = config.bucket.rate,
            retry_burst = config.bucket.burst,
            auth = config.auth.mode.as_str(),
            max_batch = config.store.max_batch,
            tls = self.certs.is_some(),
            client_certificates = config.tls.client_ca.is_some(),
            max_connections = config.server.max_connections,
            "serving"
        );
        let mut shutdown = std::pin::pin!(shutdown);
        let mut reloadable = self.reloadable();
        let stopped = loop {
            tokio::select! {
                result = &mut serving => break Some(result),
                () = &mut shutdown => break None,
                reload = next_reload(&mut reloads) => reloadable.apply(reload),
            }
        };
        drop(reloadable);
        let result = match stopped {
            // The transport failed: nothing left to drain.
            Some(result) => {
                self.stop_background().await;
                result.map_err(Into::into)
            }
            None => self.drain(&mut serving).await,
        };
        drop(serving);
        self.stop.cancel();
        self.endpoints.close();
        self.endpoints.wait().await;
        let released = self.ledger.released();
        let grace = self.config.server.grace_period;
        drop(self);
        if tokio::time::timeout(grace, released.cancelled())
            .await
            .is_err()
        {
            tracing::warn!("the store is still held after the grace period; returning anyway");
        }
        result
    }

    /// Stops the background tasks and waits until they are gone.
    async fn stop_background(&self) {
        self.background.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// What a reload reaches.
    fn reloadable(&self) -> reload::Reloadable<'_, S> {
        reload::Reloadable {
            running: self.config.clone(),
            ledger: &self.ledger,
            bucket: &self.bucket,
            coordinator: self.coordinator.as_ref(),
            rules: &self.rules,
            metrics: self.metrics.as_ref(),
            auth: &self.auth,
            tls: self.certs.as_deref(),
        }
    }

    /// The drain: health `NOT_SERVING` and the background stopped; every
    /// call answered as before for `drain_delay`; then the listener closes,
    /// late calls are refused, and the calls in flight get `grace_period`;
    /// last, the part of the global budget goes back.
    async fn drain(
        &mut self,
        serving: &mut (impl Future<Output = Result<(), tonic::transport::Error>> + Unpin),
    ) -> Result<(), ServerError> {
        let config = &self.config.server;
        tracing::info!(drain_delay = ?config.drain_delay, "draining: health NOT_SERVING, calls still answered");
        // The readiness task would set SERVING again: it stops first.
        self.stop_background().await;
        self.health
            .set_not_serving::<RetryBudgetServer<RetryBudgetService<S>>>()
            .await;
        self.health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        // Keep answering every call as before, the grant still held, so
        // that balancers and meshes see NOT_SERVING and move away before a
        // connection goes or a call is refused.
        let drained = tokio::time::timeout(config.drain_delay, &mut *serving).await;
        // Then stop accepting, refuse what still arrives on open
        // connections, and let the calls in flight finish.
        self.draining.start();
        self.stop.cancel();
        let result = match drained {
            Ok(result) => result.map_err(Into::into),
            Err(_) => match tokio::time::timeout(config.grace_period, &mut *serving).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => {
                    tracing::warn!(grace_period = ?config.grace_period, "calls still in flight after the grace period; stopping");
                    Ok(())
                }
            },
        };
        // Its part of the global budget goes to the others at their next
        // interval, not when its lease lapses; after the calls in flight,
        // which may still need a token.
        if let Some(coordinator) = self.coordinator.take() {
            coordinator.leave().await;
        }
        result
    }
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
