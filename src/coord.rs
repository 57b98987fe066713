//! One global retry budget across replicas: each replica's bucket is given
//! its part of the global rate and burst, agreed through the database.
//!
//! # How
//! Once per interval (default 1 s), each replica runs one short
//! SERIALIZABLE transaction (`lease`): it reads every replica's lease row
//! (demand per tenant, grant) and writes its own, renewed until three
//! intervals later by the database's clock. From the live rows it computes
//! the global weighted max-min split (`allocation`) and takes its part,
//! never more than the others' current grants leave. It lowers its bucket
//! before the transaction commits and raises it only after, so its bucket
//! never runs faster than its published grant, and the published grants
//! never sum past the global rate.
//!
//! # When the database is away
//! - A replica that has never had a grant admits nothing (its bucket is
//!   closed): refusing retries is safe.
//! - A replica that had one keeps it until its lease would lapse (three
//!   intervals after its last successful transaction began, by its own
//!   monotonic clock: never later than the database's expiry), then falls
//!   back to `rate / replicas` and `burst / replicas`, counting the
//!   replicas it last saw. It says so in its logs and its [`CoordinationState`].
//! - The others stop counting a lapsed replica and take its share at their
//!   next interval.
//!
//! # Layout
//! - [`allocation`]: the split, pure.
//! - `demand`: the demand a row publishes, and its encoding.
//! - `lease`: the SQL.
//! - `replica`: the task that runs the interval.

pub mod allocation;
mod demand;
mod lease;
mod replica;

use std::fmt;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::bucket::{BucketConfig, FairBucket};

pub use demand::{Demand, MAX_PUBLISHED_TENANTS};
pub use lease::MIGRATION;

/// Default coordination interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest interval accepted: below it the transactions would be most of
/// what the database does.
pub const MIN_INTERVAL: Duration = Duration::from_millis(20);
/// Intervals a lease lasts without renewal.
pub const LEASE_INTERVALS: u32 = 3;
/// Environment variable holding the host's name (a pod's name, in
/// Kubernetes), the first part of a replica's default id.
pub const HOSTNAME_ENV: &str = "HOSTNAME";

/// The coordination's configuration (`[coordination]`).
///
/// ```toml
/// [coordination]
/// interval = "1s"
/// replica_id = "retry-budget-0"   # default: the host's name and the process id
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinationConfig {
    /// How often each replica runs its transaction; leases last
    /// [`LEASE_INTERVALS`] of it. Default [`DEFAULT_INTERVAL`].
    #[serde(with = "crate::setting::duration")]
    pub interval: Duration,
    /// This replica's id, unique among the replicas: two processes with one
    /// id would each hold a grant under it. Default (`None`): the host's
    /// name ([`HOSTNAME_ENV`], else the kernel's) and the process id, fixed
    /// when the coordination starts ([`CoordinationConfig::resolved`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_id: Option<String>,
}

impl Default for CoordinationConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_INTERVAL,
            replica_id: None,
        }
    }
}

/// A coordination configuration that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoordinationConfigError {
    /// The interval is shorter than [`MIN_INTERVAL`].
    #[error("coordination interval must be at least {MIN_INTERVAL:?}, got {0:?}")]
    IntervalTooShort(Duration),
    /// The replica id is empty or longer than 200 bytes.
    #[error("replica_id must be 1 to 200 bytes, got {0} bytes")]
    ReplicaId(usize),
}

impl CoordinationConfig {
    /// Checks every field.
    ///
    /// # Errors
    /// The first [`CoordinationConfigError`] found.
    pub fn validate(&self) -> Result<(), CoordinationConfigError> {
        if self.interval < MIN_INTERVAL {
            return Err(CoordinationConfigError::IntervalTooShort(self.interval));
        }
        if let Some(id) = &self.replica_id
            && !(1..=200).contains(&id.len())
        {
            return Err(CoordinationConfigError::ReplicaId(id.len()));
        }
        Ok(())
    }

    /// The configuration with its replica id filled in, if it had none.
    pub fn resolved(mut self) -> Self {
        if self.replica_id.is_none() {
            self.replica_id = Some(default_replica_id());
        }
        self
    }

    /// This replica's id (empty before [`CoordinationConfig::resolved`]).
    pub fn replica_id(&self) -> &str {
        self.replica_id.as_deref().unwrap_or_default()
    }

    /// How long a lease lasts without renewal.
    pub fn lease_ttl(&self) -> Duration {
        self.interval * LEASE_INTERVALS
    }
}

fn default_replica_id() -> String {
    let host = std::env::var(HOSTNAME_ENV)
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "replica".to_owned());
    let mut id = format!("{host}-{}", std::process::id());
    id.truncate(200);
    id
}

/// Where a replica's grant comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinationStatus {
    /// No grant yet: the bucket is closed and admits nothing.
    NoGrant,
    /// A grant from a committed transaction, renewed within its lease.
    Granted,
    /// The lease lapsed without renewal: `rate / replicas` last seen.
    Fallback,
}

/// What the coordination is doing, for health details and metrics. Cheap
/// to read: a [`watch::Receiver`] from [`Coordinator::state`].
#[derive(Debug, Clone, PartialEq)]
pub struct CoordinationState {
    /// Where the grant comes from.
    pub status: CoordinationStatus,
    /// The rate the bucket hands out, tokens a second.
    pub rate: f64,
    /// The tokens it may hold.
    pub burst: u32,
    /// What the split gives this replica (it takes less while others still
    /// hold more than theirs).
    pub target: f64,
    /// Live replicas at the last successful transaction, this one included.
    pub replicas: usize,
    /// The lease's epoch, once taken.
    pub epoch: Option<i64>,
    /// When the last committed transaction began, by this replica's
    /// clock: the lease lasts [`CoordinationConfig::lease_ttl`] from it.
    pub renewed_at: Option<tokio::time::Instant>,
    /// The last failure since the last success, if any.
    pub last_error: Option<String>,
}

impl fmt::Display for CoordinationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            CoordinationStatus::NoGrant => write!(f, "no grant yet, admitting nothing")?,
            CoordinationStatus::Granted => write!(
                f,
                "granted {:.3}/s burst {} (target {:.3}/s) of {} replicas",
                self.rate, self.burst, self.target, self.replicas
            )?,
            CoordinationStatus::Fallback => write!(
                f,
                "fallback {:.3}/s burst {}: the global rate over the {} replicas last seen, \
                 the lease having lapsed",
                self.rate, self.burst, self.replicas
            )?,
        }
        if let Some(error) = &self.last_error {
            write!(f, "; last error: {error}")?;
        }
        Ok(())
    }
}

/// A running coordination. Dropping it stops the task and closes the bucket
/// without deleting the row (it lapses on its own, and the others take the
/// share then); [`Coordinator::leave`] deletes the row first.
#[derive(Debug)]
pub struct Coordinator {
    /// The task's view, for readers.
    state: watch::Receiver<CoordinationState>,
    /// Tells the task to leave.
    stop: Option<oneshot::Sender<()>>,
    /// The task.
    task: JoinHandle<()>,
    /// The bucket, closed when the coordinator is dropped without leaving:
    /// its lease is no longer renewed, so its grant must go.
    bucket: FairBucket,
    /// Whether [`Coordinator::leave`] ran (the task closed the bucket).
    left: bool,
    /// The global budget, for a reload.
    budget: watch::Sender<BucketConfig>,
}

impl Coordinator {
    /// Closes `bucket` at once (nothing is admitted before a grant) and
    /// starts the task that gives it its part of `bucket_config`'s rate and
    /// burst. Call it before the bucket serves requests.
    ///
    /// `pool` reaches the leases' table. The task holds one connection at a
    /// time; a pool of its own (`PgStore::coordination_pool`) keeps its
    /// transaction from waiting behind other work for a connection.
    ///
    /// # Errors
    /// The [`CoordinationConfigError`] of an invalid configuration.
    ///
    /// # Panics
    /// Outside a tokio runtime (it spawns the task).
    pub fn start(
        pool: deadpool_postgres::Pool,
        bucket: FairBucket,
        bucket_config: BucketConfig,
        config: CoordinationConfig,
    ) -> Result<Self, CoordinationConfigError> {
        config.validate()?;
        let config = config.resolved();
        let (stop, stopped) = oneshot::channel();
        let (budget, budgets) = watch::channel(bucket_config);
        let (replica, state) = replica::Replica::new(pool, bucket.clone(), budgets, config);
        let task = tokio::spawn(replica.run(stopped));
        Ok(Self {
            state,
            stop: Some(stop),
            task,
            bucket,
            left: false,
            budget,
        })
    }

    /// A new global budget (a reloaded configuration): its rate, burst and
    /// weights apply from the next interval on. Validate it first; the
    /// bucket's other settings (horizon, tenant bound, deposit) stay as
    /// built.
    pub fn set_budget(&self, bucket_config: BucketConfig) {
        self.budget.send_replace(bucket_config);
    }

    /// A handle on the state, updated at each change.
    pub fn state(&self) -> watch::Receiver<CoordinationState> {
        self.state.clone()
    }

    /// Deletes this replica's row, so the others take its share at their
    /// next interval, closes the bucket, and ends the task.
    pub async fn leave(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // A task that panicked has nothing left to delete.
        let _ = (&mut self.task).await;
        self.left = true;
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.task.abort();
        if !self.left {
            self.bucket
                .set_capacity(&crate::bucket::Capacity::closed(DEFAULT_INTERVAL));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_names_only_what_it_changes_and_bad_values_are_named() {
        let c: CoordinationConfig = toml::from_str("interval = \"250ms\"").unwrap();
        assert_eq!(c.interval, Duration::from_millis(250));
        assert!(!c.clone().resolved().replica_id().is_empty());
        assert_eq!(c.lease_ttl(), Duration::from_millis(750));
        c.validate().unwrap();
        let short = CoordinationConfig {
            interval: Duration::from_millis(5),
            ..c.clone()
        };
        assert!(
            short
                .validate()
                .unwrap_err()
                .to_string()
                .contains("at least")
        );
        let unnamed = CoordinationConfig {
            replica_id: Some(String::new()),
            ..c
        };
        assert!(unnamed.validate().is_err());
        assert!(toml::from_str::<CoordinationConfig>("intervl = \"1s\"").is_err());
    }
}
