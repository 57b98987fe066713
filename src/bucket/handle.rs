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
use super::dependencies::{Dependencies, DependencyReport, DependencyStats, FleetGrant};
use super::fair::{Booking, FairShares};
use super::pace::DependenciesConfig;
use super::reports::ReportLimiter;
use super::stats::{BucketStats, Counters, TenantStats};
use crate::budget::token::{Answer, Ask, Observed, PaceRecord};

/// The shared retry-token bucket. Clones share one bucket.
#[derive(Clone)]
pub struct FairBucket {
    /// The bucket, its clock and its counters.
    inner: Arc<Inner>,
}

struct Inner {
    /// The budgets, under one lock.
    budgets: Mutex<Budgets>,
    /// Time zero of the algorithm's clock.
    epoch: Instant,
    /// Counters for metrics, outside the lock.
    counters: Counters,
    /// Shadow mode: deferrals are computed and counted, never made.
    shadow: AtomicBool,
}

/// The global bucket and the dependencies' budgets nested in it, under
/// one lock: a retry asks both in one step.
struct Budgets {
    global: FairShares,
    dependencies: Dependencies,
    reports: ReportLimiter,
}

impl FairBucket {
    /// A full bucket with the default dependency budgets, its clock
    /// starting now.
    ///
    /// # Errors
    /// The [`BucketConfigError`] of an invalid configuration.
    pub fn new(config: &BucketConfig) -> Result<Self, BucketConfigError> {
        Self::with_dependencies(config, DependenciesConfig::default())
    }

    /// A full bucket, with `dependencies` paced inside it, its clock
    /// starting now.
    ///
    /// # Errors
    /// The [`BucketConfigError`] of an invalid configuration.
    pub fn with_dependencies(
        config: &BucketConfig,
        dependencies: DependenciesConfig,
    ) -> Result<Self, BucketConfigError> {
        Ok(Self {
            inner: Arc::new(Inner {
                budgets: Mutex::new(Budgets {
                    global: FairShares::new(config)?,
                    reports: ReportLimiter::new(
                        dependencies.max_reports_per_second,
                        config.max_tenants,
                    ),
                    dependencies: Dependencies::new(dependencies, config)?,
                }),
                epoch: Instant::now(),
                counters: Counters::default(),
                shadow: AtomicBool::new(config.mode == BucketMode::Shadow),
            }),
        })
    }

    /// Time since the bucket was built, on tokio's clock.
    pub fn now(&self) -> Duration {
        self.inner.epoch.elapsed()
    }

    /// A token for `tenant` now, spent for good, or its next slot booked
    /// ([`FairShares::admit`] on the global bucket alone, without a limit
    /// on the wait).
    pub fn admit(&self, tenant: &str) -> Booking {
        self.admit_within(tenant, Duration::MAX)
    }

    /// A token for `tenant` now, spent for good, or its next slot booked if
    /// it comes within `max_wait` (the global bucket alone).
    pub fn admit_within(&self, tenant: &str, max_wait: Duration) -> Booking {
        self.lock().global.admit(tenant, self.now(), max_wait)
    }

    /// A token for `tenant`'s retry to `dependency` (empty: the default
    /// one) from the dependency's lanes and the global bucket, now, or when
    /// to ask again (the rule is `bucket::dependencies`).
    pub fn take(&self, tenant: &str, dependency: &str, ask: &Ask<'_>) -> Answer {
        let mut answer = {
            let mut state = self.lock();
            let Budgets {
                global,
                dependencies,
                ..
            } = &mut *state;
            dependencies.admit(global, tenant, dependency, ask, self.now())
        };
        self.inner.counters.admission(&answer.admission);
        if self.inner.shadow.load(Ordering::Relaxed) {
            answer.admission = answer.admission.shadowed();
        }
        answer
    }

    /// Counts a fresh failure `tenant` asked about: evidence of the
    /// dependency's health.
    pub fn observe(&self, tenant: &str, dependency: &str, observed: Observed) {
        let now = self.now();
        self.lock()
            .dependencies
            .observe(tenant, dependency, observed, now);
    }

    /// Counts a success `tenant` recorded: its own lane's, and, for an
    /// activity the service holds (`known`), a request seen.
    pub fn record_success(&self, tenant: &str, dependency: &str, known: bool) {
        let now = self.now();
        self.lock()
            .dependencies
            .record_success(tenant, dependency, known, now);
    }

    /// Takes one traffic report of `tenant`'s, or says when it may send the
    /// next (`[dependencies] max_reports_per_second`).
    ///
    /// # Errors
    /// The rate, and the wait until the next report is accepted.
    pub fn admit_report(&self, tenant: &str) -> Result<(), (f64, Duration)> {
        let now = self.now();
        let mut state = self.lock();
        let rate = state.reports.rate();
        state
            .reports
            .admit(tenant, now)
            .map_err(|wait| (rate, wait))
    }

    /// Counts `tenant`'s calls to `dependency` since its last report, and
    /// how they went; returns the dependency's pace as the tenant sees it.
    pub fn report_traffic(
        &self,
        tenant: &str,
        dependency: &str,
        calls: u64,
        successes: u64,
        failures: u64,
    ) -> DependencyStats {
        let now = self.now();
        self.lock()
            .dependencies
            .report(tenant, dependency, now, calls, successes, failures)
    }

    /// Gives up an activity's place in line (it stopped or succeeded while
    /// deferred).
    pub fn leave_line(&self, tenant: &str, dependency: &str, activity_id: &str, since_ms: i64) {
        let now = self.now();
        let state = &mut *self.lock();
        state.dependencies.leave(
            &mut state.global,
            tenant,
            dependency,
            activity_id,
            since_ms,
            now,
        );
    }

    /// Every tracked dependency's pace and counters (the operator's view:
    /// metrics).
    pub fn dependencies(&self) -> Vec<DependencyStats> {
        let now = self.now();
        self.lock().dependencies.stats(now)
    }

    /// The dependencies `tenant` used, as it sees them.
    pub fn dependencies_of(&self, tenant: &str) -> Vec<DependencyStats> {
        let now = self.now();
        self.lock().dependencies.stats_of_tenant(tenant, now)
    }

    /// Each tracked dependency's pace, to persist.
    pub fn pace_records(&self, now_ms: i64) -> Vec<PaceRecord> {
        let now = self.now();
        self.lock().dependencies.snapshot(now, now_ms)
    }

    /// Takes back the paces persisted before a restart.
    pub fn restore_paces(&self, records: &[PaceRecord]) {
        let now = self.now();
        self.lock().dependencies.restore(records, now);
    }

    /// Each dependency's successes and demand since the last call, reset:
    /// what a replica publishes (see [`FairBucket::take_demand`]).
    pub fn take_dependency_reports(&self) -> Vec<DependencyReport> {
        let now = self.now();
        self.lock().dependencies.take_reports(now)
    }

    /// Sets `dependency`'s fleet-wide allowance and fates, and this
    /// replica's part of the allowance.
    pub fn set_dependency_grant(&self, dependency: &str, grant: FleetGrant, capacity: &Capacity) {
        let now = self.now();
        self.lock()
            .dependencies
            .set_grant(dependency, grant, capacity, now);
    }

    /// Every dependency paced by its local window again.
    pub fn uncoordinate_dependencies(&self) {
        self.lock().dependencies.uncoordinate();
    }

    /// The dependencies' configuration in force.
    pub fn dependencies_config(&self) -> DependenciesConfig {
        self.lock().dependencies.config().clone()
    }

    /// A reloaded dependencies configuration, from now on.
    pub fn set_dependencies(&self, config: DependenciesConfig, template: &BucketConfig) {
        let mut state = self.lock();
        state.reports.set_rate(config.max_reports_per_second);
        state.dependencies.reconfigure(config, template);
    }

    /// Sets the tokens each recorded success deposits from now on.
    pub fn set_success_deposit(&self, success_deposit: f64) {
        self.lock().global.set_success_deposit(success_deposit);
    }

    /// Enforces deferrals, or only computes them (shadow mode), from now on.
    pub fn set_mode(&self, mode: BucketMode) {
        self.inner
            .shadow
            .store(mode == BucketMode::Shadow, Ordering::Relaxed);
    }

    /// Adds the configured success deposit to the bucket: call it for every
    /// recorded success (a no-op when `success_deposit` is 0).
    pub fn deposit_success(&self) {
        self.lock().global.deposit_success(self.now());
        self.inner.counters.deposit();
    }

    /// Changes the rate, burst and weights from now on
    /// ([`FairShares::set_capacity`]): a configuration reloaded, or a
    /// replica's part of a global budget. Tokens held beyond the new burst
    /// are dropped; tokens granted and slots booked stay.
    pub fn set_capacity(&self, capacity: &Capacity) {
        self.lock().global.set_capacity(capacity, self.now());
    }

    /// Whether the bucket has no rate and so admits nothing.
    pub fn is_closed(&self) -> bool {
        self.lock().global.is_closed()
    }

    /// The burst in force, tokens.
    pub fn burst(&self) -> u32 {
        self.lock().global.capacity().burst
    }

    /// The refill rate in force, tokens a second (0 when closed).
    pub fn rate(&self) -> f64 {
        self.lock().global.rate()
    }

    /// Each tenant's count of tokens asked for since the last call, and
    /// whether any was held back (deferred or refused), and resets the
    /// counts ([`FairShares::take_demand`]). Allocates, under the lock, one
    /// entry per tenant that asked: meant for a reader once a second or
    /// so, not for the request path.
    pub fn take_demand(&self) -> Vec<(String, u64, bool)> {
        let mut demand = Vec::new();
        self.lock().global.take_demand(|tenant, asked, held_back| {
            demand.push((tenant.to_owned(), asked, held_back > 0));
        });
        demand
    }

    /// The counters, the bucket's level and each tracked tenant's tokens.
    pub fn stats(&self) -> BucketStats {
        let mut stats = self.inner.counters.snapshot();
        let state = self.lock();
        let shares = &state.global;
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

    /// The budgets. A panic while they were held cannot leave them
    /// half-changed (the algorithm has no panicking path between two
    /// writes), so a poisoned lock is taken as it is.
    fn lock(&self) -> MutexGuard<'_, Budgets> {
        self.inner
            .budgets
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
