//! When the grant goes: a failed interval kept in the state, the lease
//! lapsing (the fallback to the global rate over the replicas last seen),
//! and leaving on shutdown.

use tokio::time::Instant;

use super::{Replica, TickError};
use crate::bucket::Capacity;
use crate::coord::lease;
use crate::coord::{CoordinationState, CoordinationStatus};

impl Replica {
    /// When the granted lease would lapse, by this replica's clock: a TTL
    /// after the last committed transaction began, which is no later than
    /// the database's expiry (its `now()` came after). `None` without a
    /// grant: once fallen back, nothing more lapses, and the next
    /// transaction is given a whole interval to take the lease again.
    pub(super) fn lapse(&self) -> Option<Instant> {
        self.renewed_at
            .filter(|_| self.status() == CoordinationStatus::Granted)
            .map(|at| at + self.config.lease_ttl())
    }

    fn status(&self) -> CoordinationStatus {
        self.state.borrow().status
    }

    /// A failed interval: logged (once until the next success) and kept in
    /// the state. The grant stays until the lease would lapse.
    pub(super) fn failed(&mut self, error: TickError) {
        let previous = self.state.borrow().clone();
        if let TickError::Lost(_) = error {
            // Another process holds the row: neither may trust its grant.
            tracing::error!(%error, "coordination: closing the bucket");
            self.bucket
                .set_capacity(&Capacity::closed(self.config.interval));
            self.applied = (0.0, 0);
            self.renewed_at = None;
            self.state.send_replace(CoordinationState {
                status: CoordinationStatus::NoGrant,
                rate: 0.0,
                burst: 0,
                renewed_at: None,
                last_error: Some(error.to_string()),
                ..previous
            });
            return;
        }
        if previous.last_error.is_none() {
            tracing::warn!(%error, status = ?previous.status, "coordination: transaction failed");
        }
        self.state.send_replace(CoordinationState {
            last_error: Some(error.to_string()),
            ..previous
        });
    }

    /// The lease would have lapsed: the others no longer count this
    /// replica, so it takes the global rate over the replicas it last saw.
    pub(super) fn fall_back(&mut self) {
        let previous = self.state.borrow().clone();
        let replicas = previous.replicas.max(1);
        let rate = self.budget.rate / replicas as f64;
        let burst = self.budget.burst / u32::try_from(replicas).unwrap_or(u32::MAX);
        self.bucket.set_capacity(&Capacity {
            rate,
            burst,
            closed_retry_after: self.config.interval,
            ..Capacity::from_config(&self.budget)
        });
        self.applied = (rate, burst);
        // Each dependency paced by the successes this replica sees alone.
        self.bucket.uncoordinate_dependencies();
        self.applied_dependencies.clear();
        tracing::warn!(
            rate,
            burst,
            replicas,
            last_error = previous.last_error.as_deref().unwrap_or("none"),
            "coordination: lease lapsed without renewal, falling back to the global rate over the replicas last seen"
        );
        self.state.send_replace(CoordinationState {
            status: CoordinationStatus::Fallback,
            rate,
            burst,
            ..previous
        });
    }

    /// Deletes the row (best effort: if it fails, it lapses) and closes the
    /// bucket.
    pub(super) async fn leave(&mut self) {
        self.bucket
            .set_capacity(&Capacity::closed(self.config.interval));
        let Some(epoch) = self.epoch else { return };
        let deleted = tokio::time::timeout(self.config.interval, async {
            let client = self.pool.get().await.map_err(TickError::from)?;
            Ok::<_, TickError>(lease::leave(&client, self.config.replica_id(), epoch).await?)
        })
        .await;
        match deleted {
            Ok(Ok(_)) => tracing::info!("coordination: left, lease row deleted"),
            Ok(Err(error)) => tracing::warn!(%error, "coordination: leaving, the row will lapse"),
            Err(_) => tracing::warn!("coordination: leaving timed out, the row will lapse"),
        }
    }
}
