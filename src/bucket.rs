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
//! # Why a deferral takes a place in line
//! Refusing a retry and letting the caller ask again at once turns the
//! limiter into a busy loop; booking it a slot far ahead locks it into a
//! turn it may no longer need once the dependency recovers. So a durable
//! retry with no token takes a place in its tenant's line of the
//! dependency, by the time of its first deferral, and is told to ask again
//! when its turn should come, never further than `max_deferral` ahead. The
//! tokens the tenant's share brings go to the places oldest first, before
//! the tenant's fresh failures; a worker asking again after the pace rose
//! is told its new, sooner turn.
//!
//! # Layout
//! - [`config`]: [`BucketConfig`], its defaults and validation.
//! - `capacity`: [`Capacity`], the rate, burst and weights a running bucket
//!   is given (at start-up, by a reload, or by the replicas' coordination).
//! - `fair`: [`FairShares`], the algorithm, pure (time is a parameter).
//! - `tenants`: the bounded table of tenants behind it.
//! - [`pace`] and `health`: a dependency's pace, from what the service sees
//!   of it and what its tenants report.
//! - `line`: a tenant's line of deferred retries to a dependency.
//! - `dependencies`: every dependency's budget, nested in the global one.
//! - `handle`: [`FairBucket`], the shared, locked, clocked bucket.
//! - `gate` and `layer`: [`TenantGate`], what [`RetryTokenLayer`] hands
//!   every call that spends budget.
//! - `stats`: [`BucketStats`], counters for metrics.
//!
//! The handler's side, in short: take the call's [`TenantGate`] from its
//! extensions and give the decision [`TenantGate::dependency`]; the
//! decision asks it once, only for a retry. Nothing is taken before, so
//! nothing is given back.

mod capacity;
pub mod config;
mod dependencies;
mod fair;
mod gate;
mod handle;
pub mod health;
mod layer;
mod line;
pub mod pace;
mod reports;
mod stats;
mod tenants;

pub use capacity::Capacity;
pub use config::{BucketConfig, BucketConfigError, BucketMode};
pub use dependencies::{
    DependencyCounters, DependencyReport, DependencyStats, FleetGrant, MAX_TENANTS_PER_DEPENDENCY,
};
pub use fair::{Booking, FairShares, Grant};
pub use gate::{DependencyGate, TenantGate};
pub use handle::FairBucket;
pub use layer::{RetryToken, RetryTokenLayer};
pub use pace::{DEFAULT_DEPENDENCY, DependenciesConfig, OVERFLOW_DEPENDENCY, PaceConfig};
pub use stats::{BucketStats, DEFER_REASONS, TenantStats};
pub use tenants::OVERFLOW_TENANT;

pub use crate::budget::codes::{
    DEPENDENCY_BUDGET_EXHAUSTED, GLOBAL_CAPACITY_EXHAUSTED, RESERVATION_PAST_MAX_WAIT,
    TENANT_BACKLOG_FULL, TENANT_SHARE_EXHAUSTED,
};
pub use crate::budget::tenant::{DEFAULT_TENANT, TENANT_HEADER};
