//! Where activities live. Every store implements [`Store`], and every store
//! passes the one conformance suite in `tests/it/store_conformance.rs`.
//!
//! The contract a store keeps:
//! - [`Store::save`] returns only when the record is durable: a decision is
//!   never acknowledged before it would survive a crash.
//! - Saves that arrive together may share one durable commit (group commit),
//!   so durability does not cost one fsync a request.
//! - A save names the version it replaces ([`Replaced`]) and is written
//!   only if the activity is still at that version (or, for a new one,
//!   still absent); otherwise it fails with [`StoreError::Conflict`], and
//!   the caller decides again on what is stored now. One process serialises
//!   its own work on an activity (see `ledger`), so an embedded store never
//!   conflicts; replicas sharing a database do.

pub mod codec;
mod commit_stats;
pub mod copy;
mod embedded;
mod postgres;

pub use self::commit_stats::{CommitObserver, CommitStats};
pub use self::embedded::{DEFAULT_MAX_BATCH, EmbeddedStore, EmbeddedStoreOptions};
pub(crate) use self::postgres::error_chain;
pub use self::postgres::{MIGRATIONS, MigrateError, PgStore, PostgresOptions, migrate};

use std::error::Error;
use std::future::Future;
use std::time::Duration;

use crate::budget::activity::{ActivityKey, ActivityRecord};
use crate::budget::codes;
use crate::budget::token::PaceRecord;

/// A store failed or refused a save. Nothing was acknowledged, so the caller
/// may safely ask again: the gRPC edge reports [`Backend`](Self::Backend),
/// [`Closed`](Self::Closed) and [`Backlogged`](Self::Backlogged) as
/// `UNAVAILABLE`, and [`Corrupt`](Self::Corrupt) as `INTERNAL`;
/// [`Conflict`](Self::Conflict) is the ledger's to handle (it decides
/// again), and `ABORTED` only if it keeps coming. The message
/// starts with the variant's stable [`code`](Self::code); the cause, when
/// there is one, is also the error's `source()`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed an operation.
    #[error("{}: {op}: {source}", codes::STORE_UNAVAILABLE)]
    Backend {
        /// What the store was doing, for people.
        op: &'static str,
        /// Why it failed.
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
    /// A stored record could not be decoded.
    #[error("{}: record {key}: {source}", codes::STORE_CORRUPT)]
    Corrupt {
        /// Which record.
        key: String,
        /// What is wrong with its bytes.
        #[source]
        source: codec::DecodeError,
    },
    /// The store is shutting down and takes no more writes.
    #[error("{}: the store is shutting down", codes::STORE_CLOSED)]
    Closed,
    /// Another writer changed or created the activity since the version
    /// this save replaces was loaded: nothing was written.
    #[error(
        "{}: activity {key} was changed by another replica",
        codes::STORE_CONFLICT
    )]
    Conflict {
        /// Which activity, as `tenant/activity_id`.
        key: String,
    },
    /// Too many saves wait for the store's writer (the disk is slower than
    /// the requests): the save is refused rather than held in memory
    /// without bound.
    #[error(
        "{}: too many saves wait to be written; retry after {} ms",
        codes::STORE_BACKLOGGED,
        retry_after.as_millis()
    )]
    Backlogged {
        /// How long the caller should wait before asking again.
        retry_after: Duration,
    },
}

impl StoreError {
    /// The stable code that starts the message.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Backend { .. } => codes::STORE_UNAVAILABLE,
            Self::Corrupt { .. } => codes::STORE_CORRUPT,
            Self::Closed => codes::STORE_CLOSED,
            Self::Backlogged { .. } => codes::STORE_BACKLOGGED,
            Self::Conflict { .. } => codes::STORE_CONFLICT,
        }
    }

    /// How long to wait before asking again: what the store said, or for
    /// a store that failed or lost a race, [`UNAVAILABLE_RETRY_AFTER`];
    /// `None` when asking again cannot help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Backlogged { retry_after } => Some(*retry_after),
            Self::Backend { .. } | Self::Conflict { .. } => Some(UNAVAILABLE_RETRY_AFTER),
            Self::Corrupt { .. } | Self::Closed => None,
        }
    }
}

/// How long a caller is asked to wait after the store failed: about the
/// time a database takes to fail over or a pool to reconnect, not so long
/// that a brief blip holds retries back.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What a store needs to know of the version a save replaces, taken before
/// the state machine consumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    /// Where the replaced version sits in the purge order
    /// ([`ActivityRecord::purgeable_from_ms`]).
    pub purgeable_from_ms: Option<i64>,
    /// Its number of events: the version a conditional write expects
    /// (every change of an activity appends one).
    pub events: usize,
}

impl Replaced {
    /// The description of `record`, about to be replaced.
    pub fn of(record: &ActivityRecord) -> Self {
        Self {
            purgeable_from_ms: record.purgeable_from_ms(),
            events: record.events.len(),
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

    /// The store's group-commit counters, when it has them (for metrics).
    fn commit_stats(&self) -> Option<&CommitStats> {
        None
    }

    /// Keeps the dependencies' paces (replacing those of the same names),
    /// so that a restarted service finds each where it stood. Called about
    /// once a second with the paces that changed; not on the request path.
    fn save_paces(
        &self,
        paces: Vec<PaceRecord>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every pace kept (read once, at start-up).
    fn load_paces(&self) -> impl Future<Output = Result<Vec<PaceRecord>, StoreError>> + Send;

    /// Whether the store answers now, for health. The default, for a store
    /// in the process, always does.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    /// Claims, or renews, the right to run the retention sweep for `ttl`,
    /// so that replicas sharing a store do not sweep together; true when
    /// `holder` holds it. The default, for a store one process owns, always
    /// grants it.
    fn claim_sweep(
        &self,
        _holder: &str,
        _ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        std::future::ready(Ok(true))
    }
}
