//! The server's background duties: health that follows the store, the
//! retention sweep, run by one replica at a time, and the dependencies'
//! paces kept across restarts.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::bucket::FairBucket;
use crate::budget::token::PaceRecord;
use crate::coord::{CoordinationState, CoordinationStatus};
use crate::ledger::Ledger;
use crate::store::Store;

/// How often health asks the store whether it answers.
const STORE_HEALTH_PERIOD: Duration = Duration::from_secs(1);

/// Sets health now, then keeps it following the store and the
/// coordination in a task. The `RetryBudget` service is `SERVING` only
/// while it would admit: the store answers, and, with coordination, the
/// replica holds a part of the global budget (its first grant taken, or
/// its fallback share). A replica that starts says `NOT_SERVING` until its
/// first grant, so a balancer sends it nothing it would defer; one whose
/// database went away says so, and says `SERVING` again once it answers.
/// The server's own name (`""`) stays `SERVING` (the process is alive, and
/// a liveness probe must not restart every replica while their database is
/// down); only a drain turns it `NOT_SERVING`. Readiness probes and load
/// balancers ask for the service by name.
///
/// Sets the statuses now, and returns the task that keeps them.
pub(super) async fn readiness<S: Store, N: NamedService>(
    ledger: Arc<Ledger<S>>,
    health: HealthReporter,
    store_answers: bool,
    mut coordination: Option<tokio::sync::watch::Receiver<CoordinationState>>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    health.set_service_status("", ServingStatus::Serving).await;
    let mut readiness = Readiness {
        health,
        name: N::NAME,
        store_ok: store_answers,
        serving: None,
    };
    readiness.update(&mut coordination).await;
    async move {
        let mut ticks = tokio::time::interval(STORE_HEALTH_PERIOD);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => readiness.store_ok = ping(&ledger).await,
                () = changed(&mut coordination) => {}
            }
            readiness.update(&mut coordination).await;
        }
    }
}

/// The `RetryBudget` service's health and what it follows.
struct Readiness {
    health: HealthReporter,
    /// The service's health name.
    name: &'static str,
    /// Whether the store answered its last ping.
    store_ok: bool,
    /// The status last set, if any.
    serving: Option<bool>,
}

impl Readiness {
    /// Sets the status when it changed, saying why in the log.
    async fn update(
        &mut self,
        coordination: &mut Option<tokio::sync::watch::Receiver<CoordinationState>>,
    ) {
        let granted = coordination
            .as_mut()
            .is_none_or(|c| admitting(&c.borrow_and_update()));
        let now = self.store_ok && granted;
        if self.serving == Some(now) {
            return;
        }
        let status = if now {
            tracing::info!("admitting: health SERVING");
            ServingStatus::Serving
        } else {
            if self.store_ok {
                tracing::info!("no grant from the coordination yet: health NOT_SERVING");
            }
            ServingStatus::NotServing
        };
        self.health.set_service_status(self.name, status).await;
        self.serving = Some(now);
    }
}

/// Whether a replica in `state` admits retries: it holds a grant, or its
/// fallback share.
fn admitting(state: &CoordinationState) -> bool {
    state.status != CoordinationStatus::NoGrant
}

/// The next change of the coordination's state; never, without
/// coordination or once it has stopped (its last state stands: a replica
/// whose coordination is gone is not thereby granted anything).
async fn changed(coordination: &mut Option<tokio::sync::watch::Receiver<CoordinationState>>) {
    if let Some(c) = coordination
        && c.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Whether the store answers a ping. The server's first one also brings
/// the schema up to date before anything else uses it.
pub(super) async fn ping<S: Store>(ledger: &Ledger<S>) -> bool {
    match ledger.store().ping().await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, "the store does not answer: health NOT_SERVING");
            false
        }
    }
}

/// The health name that tells whether this replica holds a part of the
/// global budget from the database: `SERVING` with a grant, `NOT_SERVING`
/// with none yet (it admits no retry) or on its fallback share (its lease
/// lapsed). The log says which, with the figures.
pub const COORDINATION_HEALTH: &str = "retrybudget.v1.Coordination";

/// Follows the coordination's state into health and the log.
pub(super) async fn coordination_health(
    mut state: tokio::sync::watch::Receiver<CoordinationState>,
    health: HealthReporter,
) {
    let mut last = None;
    loop {
        let now = state.borrow_and_update().clone();
        if last != Some(now.status) {
            let granted = now.status == CoordinationStatus::Granted;
            // Starting (no interval has run yet) is no cause for a warning.
            let starting = last.is_none() && now.last_error.is_none();
            if granted || starting {
                tracing::info!(coordination = %now, "coordination");
            } else {
                tracing::warn!(coordination = %now, "coordination");
            }
            let serving = if granted {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            health
                .set_service_status(COORDINATION_HEALTH, serving)
                .await;
            last = Some(now.status);
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

/// Purges expired activities every `interval`, when this replica holds the
/// sweep's lease (always, on a store one process owns). The lease lasts two
/// intervals, so another replica takes over when this one is gone.
pub(super) async fn sweep<S: Store>(
    ledger: Arc<Ledger<S>>,
    replica: String,
    retention: Duration,
    interval: Duration,
) {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match ledger.store().claim_sweep(&replica, interval * 2).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(error) => {
                tracing::warn!(%error, "retention sweep: cannot claim its lease");
                continue;
            }
        }
        match ledger.sweep(crate::clock::now_ms(), retention_ms).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "retention sweep"),
            Err(error) => tracing::warn!(%error, "retention sweep failed"),
        }
    }
}

/// How often the dependencies' paces are saved.
const PACE_SAVE_PERIOD: Duration = Duration::from_secs(1);

/// Paces saved longer ago than this are not taken back at start-up: the
/// dependency's health then is no evidence of its health now.
const PACE_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Gives `bucket` the paces the store kept (at start-up, before serving),
/// those saved within [`PACE_MAX_AGE`]. A store that cannot read them
/// leaves every dependency at its starting allowance, and says so.
pub(super) async fn restore_paces<S: Store>(ledger: &Ledger<S>, bucket: &FairBucket) {
    match ledger.store().load_paces().await {
        Ok(paces) => {
            let oldest = crate::clock::now_ms()
                .saturating_sub(i64::try_from(PACE_MAX_AGE.as_millis()).unwrap_or(i64::MAX));
            let recent: Vec<PaceRecord> = paces
                .into_iter()
                .filter(|p| p.saved_at_ms >= oldest)
                .collect();
            if !recent.is_empty() {
                tracing::info!(dependencies = recent.len(), "dependency paces restored");
            }
            bucket.restore_paces(&recent);
        }
        Err(error) => tracing::warn!(%error, "dependency paces not restored"),
    }
}

/// Saves the dependencies' paces that changed, once a second, through the
/// store (each replica its own view on PostgreSQL; the last writer wins),
/// and once more when `stop` is cancelled (the drain's start). A save under
/// way is never abandoned: the store's write would go on without the task,
/// holding the store after the server returns.
pub(super) async fn save_paces<S: Store>(
    ledger: Arc<Ledger<S>>,
    bucket: FairBucket,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(PACE_SAVE_PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut saved: std::collections::HashMap<String, PaceRecord> = std::collections::HashMap::new();
    let mut last = false;
    while !last {
        tokio::select! {
            _ = ticks.tick() => {}
            () = stop.cancelled() => last = true,
        }
        let changed: Vec<PaceRecord> = bucket
            .pace_records(crate::clock::now_ms())
            .into_iter()
            .filter(|p| {
                saved
                    .get(&p.dependency)
                    .is_none_or(|old| !same_pace(old, p))
            })
            .collect();
        if changed.is_empty() {
            continue;
        }
        match ledger.store().save_paces(changed.clone()).await {
            Ok(()) => {
                for p in changed {
                    saved.insert(p.dependency.clone(), p);
                }
            }
            Err(error) => tracing::warn!(%error, "dependency paces not saved"),
        }
    }
}

/// Whether two paces say the same, the time they were saved aside.
fn same_pace(a: &PaceRecord, b: &PaceRecord) -> bool {
    PaceRecord {
        saved_at_ms: 0,
        ..a.clone()
    } == PaceRecord {
        saved_at_ms: 0,
        ..b.clone()
    }
}
