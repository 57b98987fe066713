//! The task that runs a replica's interval: measure demand, run the
//! transaction, set the bucket, watch the lease.
//!
//! This file holds the task's state, its loop and an interval's
//! transaction (the demand published, the rows read and written);
//! `fleet` the fleet's grants computed and applied, `lapse` what happens
//! when the grant goes (a failed interval, a lapsed lease, leaving).

mod fleet;
mod lapse;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use super::allocation::{ReplicaGrant, ReplicaView, allocate};
use super::demand::{
    Demand, DependencyDemand, MAX_PUBLISHED_DEPENDENCY_TENANTS, MAX_PUBLISHED_TENANTS,
};
use super::lease::{self, LeaseWrite};
use super::{CoordinationConfig, CoordinationState, CoordinationStatus};
use crate::bucket::{BucketConfig, Capacity, FairBucket};

/// Transactions tried per interval when they fail with SQLSTATE 40001.
const SERIALIZATION_ATTEMPTS: u32 = 5;
/// A lapsed row is deleted after this many lease lengths.
const STALE_LEASES: u32 = 20;

/// Why an interval's transaction did not commit.
#[derive(Debug, thiserror::Error)]
enum TickError {
    #[error("database pool: {}", crate::store::error_chain(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("database: {}", described(.0))]
    Database(#[from] tokio_postgres::Error),
    #[error("the transaction took longer than the time left")]
    Timeout,
    #[error("the lease row is held under another epoch: is replica_id {0:?} used twice?")]
    Lost(String),
}

/// What a committed transaction established.
struct Committed {
    epoch: i64,
    grant: ReplicaGrant,
    replicas: usize,
}

/// The task's state.
pub(super) struct Replica {
    /// Connections to the database that holds the leases.
    pool: deadpool_postgres::Pool,
    /// The bucket whose capacity this task sets.
    bucket: FairBucket,
    /// The global budget, as read at the start of the interval.
    budget: BucketConfig,
    /// The global budget as configured now (a reload sends a new one).
    budgets: watch::Receiver<BucketConfig>,
    /// The interval and this replica's id.
    config: CoordinationConfig,
    /// What readers see (health details).
    state: watch::Sender<CoordinationState>,
    /// The lease's epoch, once taken.
    epoch: Option<i64>,
    /// The rate and burst the bucket hands out now.
    applied: (f64, u32),
    /// The rate and burst of each dependency's budget it applied last.
    applied_dependencies: std::collections::HashMap<String, (f64, u32)>,
    /// When the last committed transaction began: the lease lapses, by the
    /// database's clock, no earlier than a TTL after it.
    renewed_at: Option<Instant>,
    /// Since when demand is being counted.
    counting_since: Instant,
}

impl Replica {
    /// The task's state, its bucket closed, and the state's receiver.
    pub fn new(
        pool: deadpool_postgres::Pool,
        bucket: FairBucket,
        budgets: watch::Receiver<BucketConfig>,
        config: CoordinationConfig,
    ) -> (Self, watch::Receiver<CoordinationState>) {
        let budget = budgets.borrow().clone();
        bucket.set_capacity(&Capacity::closed(config.interval));
        let (state, receiver) = watch::channel(CoordinationState {
            status: CoordinationStatus::NoGrant,
            rate: 0.0,
            burst: 0,
            target: 0.0,
            replicas: 1,
            epoch: None,
            renewed_at: None,
            last_error: None,
        });
        let replica = Self {
            pool,
            bucket,
            budget,
            budgets,
            config,
            state,
            epoch: None,
            applied: (0.0, 0),
            applied_dependencies: std::collections::HashMap::new(),
            renewed_at: None,
            counting_since: Instant::now(),
        };
        (replica, receiver)
    }

    /// Runs an interval at a time until `stop` fires (then leaves) or the
    /// task is aborted (then the row lapses).
    pub async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        let mut ticks = tokio::time::interval(self.config.interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first interval runs at once (no grant before it); the next
        // ones at a random phase, so that replicas started together do not
        // run their transactions together and fail each other's.
        let mut phased = false;
        loop {
            // The grant goes when the lease would lapse, not at the next
            // interval after.
            let lapse = self.lapse();
            let far = Instant::now() + Duration::from_secs(86_400);
            // Biased: a lapse due is handled before another interval starts.
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(lapse.unwrap_or(far)), if lapse.is_some() => {
                    self.fall_back();
                }
                _ = &mut stop => break,
                _ = ticks.tick() => {
                    self.interval().await;
                    if !phased {
                        phased = true;
                        ticks.reset_after(self.config.interval + random_part(self.config.interval));
                    }
                }
            }
        }
        self.leave().await;
    }

    /// One interval: the transaction, then what its outcome means for the
    /// bucket.
    async fn interval(&mut self) {
        let began = Instant::now();
        // A reloaded budget applies from this interval on: the split and
        // the fallback use it, and grants follow within an interval.
        self.budget = self.budgets.borrow_and_update().clone();
        let counts = self.bucket.take_demand();
        let elapsed = began - self.counting_since;
        let mut demand = Demand::from_counts(counts, elapsed, MAX_PUBLISHED_TENANTS);
        demand.dependencies = self
            .bucket
            .take_dependency_reports()
            .into_iter()
            .map(|report| DependencyDemand {
                granted_rate: self
                    .applied_dependencies
                    .get(&report.name)
                    .map_or(0.0, |applied| applied.0),
                demand: Demand::from_counts(
                    report.demand,
                    elapsed,
                    MAX_PUBLISHED_DEPENDENCY_TENANTS,
                ),
                success_rate: report.success_rate,
                allowance: report.allowance,
                seen: report.seen,
                fates: {
                    let mut fates = report.fates;
                    let size = |f: &crate::bucket::health::Fates| f.granted + f.failed;
                    fates.sort_unstable_by(|a, b| size(&b.1).cmp(&size(&a.1)).then(a.0.cmp(&b.0)));
                    fates.truncate(MAX_PUBLISHED_DEPENDENCY_TENANTS);
                    fates
                },
                name: report.name,
            })
            .collect();
        self.counting_since = began;
        // A slow transaction may still renew the lease, so it is given
        // until the lease would lapse (then the grant goes), or an
        // interval when there is no grant to lose.
        let limit = match self.lapse() {
            Some(lapse) => lapse.saturating_duration_since(began),
            None => self.config.interval,
        };
        let outcome = match tokio::time::timeout(limit, self.transact(&demand)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(TickError::Timeout),
        };
        match outcome {
            Ok(done) => {
                self.epoch = Some(done.epoch);
                self.renewed_at = Some(began);
                self.state.send_replace(CoordinationState {
                    status: CoordinationStatus::Granted,
                    rate: done.grant.rate,
                    burst: done.grant.burst,
                    target: done.grant.target,
                    replicas: done.replicas,
                    epoch: self.epoch,
                    renewed_at: self.renewed_at,
                    last_error: None,
                });
            }
            Err(error) => self.failed(error),
        }
    }

    /// The transaction, retried on serialization failures.
    async fn transact(&mut self, demand: &Demand) -> Result<Committed, TickError> {
        let mut client = self.pool.get().await?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.attempt(&mut client, demand).await {
                Err(TickError::Database(e))
                    if lease::is_serialization_failure(&e) && attempt < SERIALIZATION_ATTEMPTS =>
                {
                    // Jittered, so that the replicas that collided do not
                    // collide again.
                    tokio::time::sleep(random_part(self.config.interval / 10)).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// One try: read every row, compute, write ours, lower, commit, raise.
    async fn attempt(
        &mut self,
        client: &mut deadpool_postgres::Client,
        demand: &Demand,
    ) -> Result<Committed, TickError> {
        let stale_after = self.config.lease_ttl() * STALE_LEASES;
        let tx = lease::begin(client).await?;
        let rows = lease::read(&tx, stale_after).await?;
        let me = self.config.replica_id();
        let mut views = vec![ReplicaView {
            demand: demand.clone(),
            granted_rate: self.applied.0,
        }];
        views.extend(
            rows.iter()
                .filter(|r| r.live && r.replica_id != me)
                .map(|r| ReplicaView {
                    demand: Demand::decode(&r.demand).unwrap_or_default(),
                    granted_rate: r.granted_rate,
                }),
        );
        let grant = allocate(&self.budget, &views, 0);
        let dependencies = self.allocate_dependencies(&views);
        // The row says the dependency grants it holds from this commit on.
        let mut published = demand.clone();
        for (name, _, grant) in &dependencies {
            match published.dependencies.iter_mut().find(|d| d.name == *name) {
                Some(d) => d.granted_rate = grant.rate,
                None => published.dependencies.push(DependencyDemand {
                    name: name.clone(),
                    granted_rate: grant.rate,
                    ..DependencyDemand::default()
                }),
            }
        }
        let encoded = published.encode();
        if rows.iter().any(|r| r.stale) {
            lease::delete_stale(&tx, stale_after).await?;
        }
        let written = lease::write(
            &tx,
            &LeaseWrite {
                replica_id: me,
                epoch: self.epoch,
                ttl: self.config.lease_ttl(),
                granted_rate: grant.rate,
                granted_burst: grant.burst,
                demand: &encoded,
            },
        )
        .await?;
        let Some(epoch) = written else {
            self.epoch = None;
            return Err(TickError::Lost(me.to_owned()));
        };
        // Lower before the commit: from here on the row may say less.
        let lowered = (
            grant.rate.min(self.applied.0),
            grant.burst.min(self.applied.1),
        );
        self.apply(&grant, lowered);
        for (name, pace, grant) in &dependencies {
            let applied = self
                .applied_dependencies
                .get(name)
                .copied()
                .unwrap_or((grant.rate, grant.burst));
            let lowered = (grant.rate.min(applied.0), grant.burst.min(applied.1));
            self.apply_dependency(name, pace, grant, lowered);
        }
        tx.commit().await?;
        // Raise after it: the row says at least as much from now on.
        self.apply(&grant, (grant.rate, grant.burst));
        for (name, pace, grant) in &dependencies {
            self.apply_dependency(name, pace, grant, (grant.rate, grant.burst));
        }
        Ok(Committed {
            epoch,
            grant,
            replicas: views.len(),
        })
    }
}

/// The error with what the database said, its SQLSTATE first: the error's
/// own text is only its kind ("db error").
fn described(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("SQLSTATE {}: {db}", db.code().code()),
        None => crate::store::error_chain(error),
    }
}

/// A random duration below `limit`.
fn random_part(limit: Duration) -> Duration {
    let nanos = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX).max(1);
    Duration::from_nanos(RandomState::new().hash_one(Instant::now()) % nanos)
}
