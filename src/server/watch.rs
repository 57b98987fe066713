//! The server's background duties: health that follows the store, and the
//! retention sweep, run by one replica at a time.

use std::sync::Arc;
use std::time::Duration;

use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::coord::{CoordinationState, CoordinationStatus};
use crate::ledger::Ledger;
use crate::store::Store;

/// How often health asks the store whether it answers.
const STORE_HEALTH_PERIOD: Duration = Duration::from_secs(1);

/// Sets health from one ping of the store now, then keeps it following the
/// store in a task: `NOT_SERVING` for the `RetryBudget` service while the
/// store does not answer, `SERVING` again once it does. The server's own
/// name (`""`) stays `SERVING` (the process is alive, and a liveness probe
/// must not restart every replica while their database is down); only a
/// drain turns it `NOT_SERVING`. Readiness and load balancers ask for the
/// service by name.
pub(super) async fn spawn_store_health<S: Store, N: NamedService>(
    ledger: Arc<Ledger<S>>,
    health: HealthReporter,
) -> tokio::task::JoinHandle<()> {
    let mut serving = ping(&ledger).await;
    set(&health, serving, N::NAME).await;
    health.set_service_status("", ServingStatus::Serving).await;
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(STORE_HEALTH_PERIOD);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let now = ping(&ledger).await;
            if now != serving {
                serving = now;
                set(&health, serving, N::NAME).await;
            }
        }
    })
}

async fn ping<S: Store>(ledger: &Ledger<S>) -> bool {
    match ledger.store().ping().await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, "the store does not answer: health NOT_SERVING");
            false
        }
    }
}

async fn set(health: &HealthReporter, serving: bool, service: &str) {
    let status = if serving {
        tracing::info!("the store answers: health SERVING");
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    health.set_service_status(service, status).await;
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
