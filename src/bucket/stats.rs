//! Counters of the bucket, for metrics: atomics bumped on the request path
//! (no lock of their own), read together by [`FairBucket::stats`].
//!
//! [`FairBucket::stats`]: super::FairBucket::stats

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{
    DEPENDENCY_BUDGET_EXHAUSTED, GLOBAL_CAPACITY_EXHAUSTED, TENANT_BACKLOG_FULL,
    TENANT_SHARE_EXHAUSTED,
};
use crate::budget::token::Admission;

/// Every reason a retry is deferred, in the order of
/// [`BucketStats::deferred`].
pub const DEFER_REASONS: [&str; 4] = [
    DEPENDENCY_BUDGET_EXHAUSTED,
    TENANT_SHARE_EXHAUSTED,
    GLOBAL_CAPACITY_EXHAUSTED,
    TENANT_BACKLOG_FULL,
];

/// A snapshot of the bucket's counters, all since it was built.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BucketStats {
    /// Tokens granted to retries (a place in line counted when its worker
    /// claims it).
    pub granted: u64,
    /// Success deposits made.
    pub deposits: u64,
    /// Deferrals, by reason, in the order of [`DEFER_REASONS`] (counted as
    /// enforced in shadow mode too).
    pub deferred: [u64; 4],
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
    deferred: [AtomicU64; 4],
}

impl Counters {
    /// Counts a success deposit.
    pub fn deposit(&self) {
        self.deposits.fetch_add(1, Relaxed);
    }

    /// Counts an admission, before shadow mode lets it go.
    pub fn admission(&self, admission: &Admission) {
        match admission {
            Admission::Granted => {
                self.granted.fetch_add(1, Relaxed);
            }
            Admission::Deferred { reason, .. } => {
                let i = DEFER_REASONS.iter().position(|r| r == reason).unwrap_or(2);
                self.deferred[i].fetch_add(1, Relaxed);
            }
            Admission::WouldDefer { .. } => {}
        }
    }

    /// The counters, into a snapshot whose other fields the caller fills.
    pub fn snapshot(&self) -> BucketStats {
        BucketStats {
            granted: self.granted.load(Relaxed),
            deposits: self.deposits.load(Relaxed),
            deferred: std::array::from_fn(|i| self.deferred[i].load(Relaxed)),
            ..BucketStats::default()
        }
    }
}
