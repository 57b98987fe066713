//! Where activities live. Every store implements [`Store`], and every store
//! passes the one conformance suite in `tests/store_conformance.rs`.
//!
//! The contract a store keeps:
//! - [`Store::save`] returns only when the record is durable: a decision is
//!   never acknowledged before it would survive a crash.
//! - Saves that arrive together may share one durable commit (group commit),
//!   so durability does not cost one fsync a request.
//! - The caller serialises work on one activity (see `ledger`); a store needs
//!   no lock of its own per activity.

pub mod codec;
mod journal;
mod redb;

pub use self::redb::{CommitStats, RedbStore, RedbStoreOptions, RuntimeIdle};

use std::future::Future;

use crate::budget::activity::{ActivityKey, ActivityRecord};

/// A store failed. The gRPC edge reports it as `UNAVAILABLE`: nothing was
/// acknowledged, so the caller may safely ask again.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed an operation.
    #[error("store_unavailable: {0}")]
    Backend(String),
    /// A stored record could not be decoded.
    #[error("store_corrupt: record {key}: {detail}")]
    Corrupt {
        /// Which record.
        key: String,
        /// What was wrong.
        detail: String,
    },
    /// The store is shutting down and takes no more writes.
    #[error("store_closed: the store is shutting down")]
    Closed,
}

/// What a store needs to know of the version a save replaces, taken before
/// the state machine consumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    /// Where the replaced version sits in the purge order
    /// ([`ActivityRecord::purgeable_from_ms`]).
    pub purgeable_from_ms: Option<i64>,
}

impl Replaced {
    /// The description of `record`, about to be replaced.
    pub fn of(record: &ActivityRecord) -> Self {
        Self {
            purgeable_from_ms: record.purgeable_from_ms(),
        }
    }
}

/// Durable storage of activity records.
pub trait Store: Send + Sync + 'static {
    /// The record of `key`, if the store holds it.
    fn load(
        &self,
        key: &ActivityKey,
    ) -> impl Future<Output = Result<Option<ActivityRecord>, StoreError>> + Send;

    /// The record of `key` read at once, when this store reads without
    /// waiting (an embedded store's read from memory or its own file), the
    /// same answer [`Store::load`] would give. `None`, the default, means
    /// that it cannot: the caller awaits `load` instead.
    ///
    /// A decision on an activity whose lock is free then runs whole in the
    /// call that brought its request, and only the wait for its save stays
    /// alive (see `Ledger::try_report`).
    fn load_now(&self, _key: &ActivityKey) -> Option<Result<Option<ActivityRecord>, StoreError>> {
        None
    }

    /// Writes `record` in place of the version the caller loaded (described
    /// by `replaces`, `None` for a new activity), and returns once it is
    /// durable.
    ///
    /// A store that can should hand the write over in this call and return
    /// a future that only waits for it: every decision waiting to be durable
    /// holds that future, so its size is paid once a request in flight.
    fn save(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes up to `limit` activities purgeable before `cutoff_ms` (see
    /// [`ActivityRecord::purgeable_from_ms`]) and returns how many.
    fn purge(
        &self,
        cutoff_ms: i64,
        limit: usize,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// How many activities the store holds.
    fn count(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;
}
