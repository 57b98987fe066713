//! Counters of the bucket, for metrics: atomics bumped on the request path
//! (no lock of their own), read together by [`FairBucket::stats`].
//!
//! [`FairBucket::stats`]: super::FairBucket::stats

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{
    Admission, DEPENDENCY_BUDGET_EXHAUSTED, RESERVATION_PAST_MAX_WAIT, TENANT_BACKLOG_FULL,
    TENANT_SHARE_EXHAUSTED,
};

/// A snapshot of the bucket's counters, all since it was built.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BucketStats {
    /// Tokens granted to retries at once (a booked slot is counted when
    /// booked, under its deferral).
    pub granted: u64,
    /// Success deposits made.
    pub deposits: u64,
    /// Deferrals that booked a slot: the tenant had used its share.
    pub deferred_tenant_share: u64,
    /// Deferrals that booked a slot: the whole bucket was empty.
    pub deferred_global_capacity: u64,
    /// Refusals, nothing booked: the tenant's slots reach the horizon.
    pub refused_tenant_backlog: u64,
    /// Refusals, nothing booked: the bucket promised as far as it may.
    pub refused_global_capacity: u64,
    /// Refusals, nothing booked: the slot came after the caller's limit.
    pub refused_past_max_wait: u64,
    /// Deferrals that booked a slot of a dependency's budget: it was empty.
    pub deferred_dependency: u64,
    /// Refusals, nothing booked: a dependency's budget promised as far as
    /// it may (or has no rate here).
    pub refused_dependency: u64,
    /// Tokens in the bucket now; negative when promised ahead.
    pub level: f64,
    /// Tenants tracked one by one.
    pub tracked_tenants: usize,
    /// Each tracked tenant (and the overflow entry), with its tokens.
    pub tenants: Vec<TenantStats>,
}

/// One tenant's tokens. Reset when an idle tenant is evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantStats {
    /// Its id ([`OVERFLOW_TENANT`](super::OVERFLOW_TENANT) for the shared
    /// entry of tenants past the bound).
    pub tenant: String,
    /// Its weight.
    pub weight: u32,
    /// Tokens granted or booked, less tokens returned.
    pub tokens: u64,
}

/// The live counters.
#[derive(Debug, Default)]
pub(super) struct Counters {
    granted: AtomicU64,
    deposits: AtomicU64,
    deferred_tenant_share: AtomicU64,
    deferred_global_capacity: AtomicU64,
    refused_tenant_backlog: AtomicU64,
    refused_global_capacity: AtomicU64,
    refused_past_max_wait: AtomicU64,
    deferred_dependency: AtomicU64,
    refused_dependency: AtomicU64,
}

impl Counters {
    pub fn deposit(&self) {
        self.deposits.fetch_add(1, Relaxed);
    }

    /// Counts an admission under its outcome and reason.
    pub fn admission(&self, admission: &Admission) {
        let counter = match admission {
            Admission::Granted => &self.granted,
            Admission::Deferred { reason, .. } => match *reason {
                TENANT_SHARE_EXHAUSTED => &self.deferred_tenant_share,
                DEPENDENCY_BUDGET_EXHAUSTED => &self.deferred_dependency,
                _ => &self.deferred_global_capacity,
            },
            Admission::Refused { reason, .. } => match *reason {
                TENANT_BACKLOG_FULL => &self.refused_tenant_backlog,
                RESERVATION_PAST_MAX_WAIT => &self.refused_past_max_wait,
                DEPENDENCY_BUDGET_EXHAUSTED => &self.refused_dependency,
                _ => &self.refused_global_capacity,
            },
            // Counted as the admission it stands for, before shadowing.
            Admission::WouldDefer { .. } => return,
        };
        counter.fetch_add(1, Relaxed);
    }

    /// The counters, into a snapshot whose other fields the caller fills.
    pub fn snapshot(&self) -> BucketStats {
        BucketStats {
            granted: self.granted.load(Relaxed),
            deposits: self.deposits.load(Relaxed),
            deferred_tenant_share: self.deferred_tenant_share.load(Relaxed),
            deferred_global_capacity: self.deferred_global_capacity.load(Relaxed),
            refused_tenant_backlog: self.refused_tenant_backlog.load(Relaxed),
            refused_global_capacity: self.refused_global_capacity.load(Relaxed),
            refused_past_max_wait: self.refused_past_max_wait.load(Relaxed),
            deferred_dependency: self.deferred_dependency.load(Relaxed),
            refused_dependency: self.refused_dependency.load(Relaxed),
            ..BucketStats::default()
        }
    }
}
