//! [`FairBucket`]: the algorithm behind a lock, with a clock and counters,
//! cheap to clone and share between the layer, the handler and metrics.
//!
//! # The clock
//! The bucket reads `tokio::time::Instant`, relative to the instant it was
//! built, and reads it while holding its lock, so the times the algorithm
//! sees never go backwards. Tests pause tokio time and advance it; nothing
//! sleeps. The handler never needs the bucket's time: a deferral is
//! answered as a wait, which the handler adds to its own clock.
//!
//! # The lock
//! One `std::sync::Mutex` around [`FairShares`]: every operation is a few
//! comparisons and at most a heap update (O(log tenants)), with no I/O and
//! no `.await` inside, so a plain mutex held for well under a microsecond
//! is cheaper than anything cleverer.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::capacity::Capacity;
use std::sync::atomic::{AtomicBool, Ordering};

use super::config::{BucketConfig, BucketConfigError, BucketMode};
use super::fair::{Admission, FairShares};
use super::stats::{BucketStats, Counters, TenantStats};

/// The shared retry-token bucket. Clones share one bucket.
#[derive(Clone)]
pub struct FairBucket {
    /// The bucket, its clock and its counters.
    shared: Arc<Shared>,
}

struct Shared {
    /// The algorithm's state.
    shares: Mutex<FairShares>,
    /// Time zero of the algorithm's clock.
    epoch: Instant,
    /// Counters for metrics, outside the lock.
    counters: Counters,
    /// Shadow mode: deferrals are computed and counted, never made.
    shadow: AtomicBool,
}

impl FairBucket {
    /// A full bucket, its clock starting now.
    ///
    /// # Errors
    /// The [`BucketConfigError`] of an invalid configuration.
    pub fn new(config: &BucketConfig) -> Result<Self, BucketConfigError> {
        Ok(Self {
            shared: Arc::new(Shared {
                shares: Mutex::new(FairShares::new(config)?),
                epoch: Instant::now(),
                counters: Counters::default(),
                shadow: AtomicBool::new(config.mode == BucketMode::Shadow),
            }),
        })
    }

    /// Time since the bucket was built, on tokio's clock.
    pub fn now(&self) -> Duration {
        self.shared.epoch.elapsed()
    }

    /// A token for `tenant` now, spent for good, or its next slot booked:
    /// [`FairShares::admit`] without a limit on the wait.
    pub fn admit(&self, tenant: &str) -> Admission {
        self.admit_within(tenant, Duration::MAX)
    }

    /// A token for `tenant` now, spent for good, or its next slot booked if
    /// it comes within `max_wait`.
    pub fn admit_within(&self, tenant: &str, max_wait: Duration) -> Admission {
        let admission = {
            let mut shares = self.lock();
            shares.admit(tenant, self.now(), max_wait)
        };
        self.shared.counters.admission(&admission);
        if self.shared.shadow.load(Ordering::Relaxed) {
            return admission.shadowed();
        }
        admission
    }

    /// Sets the tokens each recorded success deposits from now on.
    pub fn set_success_deposit(&self, success_deposit: f64) {
        self.lock().set_success_deposit(success_deposit);
    }

    /// Enforces deferrals, or only computes them (shadow mode), from now on.
    pub fn set_mode(&self, mode: BucketMode) {
        self.shared
            .shadow
            .store(mode == BucketMode::Shadow, Ordering::Relaxed);
    }

    /// Adds the configured success deposit to the bucket: call it for every
    /// recorded success (a no-op when `success_deposit` is 0).
    pub fn deposit_success(&self) {
        self.lock().deposit_success(self.now());
        self.shared.counters.deposit();
    }

    /// Changes the rate, burst and weights from now on
    /// ([`FairShares::set_capacity`]): a configuration reloaded, or a
    /// replica's part of a global budget. Tokens held beyond the new burst
    /// are dropped; tokens granted and slots booked stay.
    pub fn set_capacity(&self, capacity: &Capacity) {
        self.lock().set_capacity(capacity, self.now());
    }

    /// Whether the bucket has no rate and so admits nothing.
    pub fn is_closed(&self) -> bool {
        self.lock().is_closed()
    }

    /// The burst in force, tokens.
    pub fn burst(&self) -> u32 {
        self.lock().capacity().burst
    }

    /// The refill rate in force, tokens a second (0 when closed).
    pub fn rate(&self) -> f64 {
        self.lock().rate()
    }

    /// Each tenant's count of tokens asked for since the last call, and
    /// whether any was held back (deferred or refused), and resets the
    /// counts ([`FairShares::take_demand`]). Allocates, under the lock, one
    /// entry per tenant that asked: meant for a reader once a second or
    /// so, not for the request path.
    pub fn take_demand(&self) -> Vec<(String, u64, bool)> {
        let mut demand = Vec::new();
        self.lock().take_demand(|tenant, asked, held_back| {
            demand.push((tenant.to_owned(), asked, held_back > 0));
        });
        demand
    }

    /// The counters, the bucket's level and each tracked tenant's tokens.
    pub fn stats(&self) -> BucketStats {
        let mut stats = self.shared.counters.snapshot();
        let shares = self.lock();
        stats.level = shares.level(self.now());
        stats.tracked_tenants = shares.tracked_tenants();
        stats.tenants = shares
            .tenants()
            .map(|(tenant, weight, tokens)| TenantStats {
                tenant: tenant.to_owned(),
                weight,
                tokens,
            })
            .collect();
        stats
    }

    /// The state. A panic while it was held cannot leave it half-changed
    /// (the algorithm has no panicking path between two writes), so a
    /// poisoned lock is taken as it is.
    fn lock(&self) -> MutexGuard<'_, FairShares> {
        self.shared
            .shares
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for FairBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairBucket")
            .field("now", &self.now())
            .finish_non_exhaustive()
    }
}
