//! The global retry-token bucket with weighted fair per-tenant shares, and
//! the tower layer that hands its tokens to the gRPC handler.
//!
//! # Why a global budget
//! Per-activity budgets (attempts, deadline) bound what one activity costs,
//! not what all of them cost together: when a dependency goes down, every
//! activity that uses it fails at once, and each one's own budget still
//! allows a retry. A global bucket caps the retries of the whole service at
//! `rate` a second (plus a `burst`), so an outage of a dependency cannot be
//! turned into a retry storm against it.
//!
//! # Why fair shares
//! A single bucket is drained by whoever retries most: one tenant's outage
//! would starve every other tenant of retries. So the refill is shared by
//! weight among the tenants that want it (weighted max-min fairness): a
//! tenant that asks for less than its share gets what it asks, the rest is
//! split among the others, and a tenant arriving in the middle of a flood
//! gets a token within one interval of its share.
//!
//! # Why a deferral books a slot
//! Refusing a retry and letting the caller ask again at once turns the
//! limiter into a busy loop. So when no token is free, the bucket books the
//! tenant's next free slot and says how long to wait; the activity records
//! the reservation and, asked again at that time, is granted without asking
//! the bucket. Slots of one tenant are one share interval apart, so a burst
//! of deferrals wakes spread out, not all at once. How far ahead a slot may
//! be booked is bounded (`max_reservation`), which also bounds how far the
//! bucket may promise beyond its rate: see `docs/fairness.md`. Past that
//! horizon a request is refused, nothing booked, and told when its turn to
//! ask again comes, one share interval after the previous refused request
//! of its tenant: it asks about twice, not in a loop.
//!
//! # Layout
//! - [`config`]: [`BucketConfig`], its defaults and validation.
//! - `capacity`: [`Capacity`], the rate, burst and weights a running bucket
//!   is given (at start-up, by a reload, or by the replicas' coordination).
//! - `fair`: [`FairShares`], the algorithm, pure (time is a parameter).
//! - `tenants`: the bounded table of tenants behind it.
//! - `handle`: [`FairBucket`], the shared, locked, clocked bucket.
//! - `gate`: [`Gate`], what the layer hands every request.
//! - `layer` and `service`: [`RetryTokenLayer`] and [`RetryToken`].
//! - `stats`: [`BucketStats`], counters for metrics.
//!
//! The handler's side, in short: take the request's [`Gate`] from its
//! extensions and give the decision [`Gate::tenant`]; the decision asks it
//! once, only for a retry, with the time left before the activity's
//! deadline. Nothing is taken before, so nothing is given back.

mod capacity;
pub mod config;
mod dependencies;
mod fair;
mod gate;
mod handle;
mod layer;
pub mod pace;
mod service;
mod stats;
mod tenants;

pub use capacity::Capacity;
pub use config::{BucketConfig, BucketConfigError, BucketMode};
pub use dependencies::{Dependencies, DependencyCounters, DependencyReport, DependencyStats};
pub use fair::{Admission, FairShares, Grant};
pub use gate::{Gate, TenantGate};
pub use handle::FairBucket;
pub use layer::RetryTokenLayer;
pub use pace::{DEFAULT_DEPENDENCY, DependenciesConfig, PaceConfig};
pub use service::{DEFAULT_TENANT, RetryToken, TENANT_HEADER};
pub use stats::{BucketStats, TenantStats};
pub use tenants::OVERFLOW_TENANT;

pub use crate::budget::codes::{
    DEPENDENCY_BUDGET_EXHAUSTED, GLOBAL_CAPACITY_EXHAUSTED, RESERVATION_PAST_MAX_WAIT,
    TENANT_BACKLOG_FULL, TENANT_SHARE_EXHAUSTED,
};
