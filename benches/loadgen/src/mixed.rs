//! The mixed scenario: what a pool of workers sends over many tenants.
//!
//! Each virtual client works through activities of tenants drawn uniformly
//! among `--tenants`: it reports attempts `1..=--attempts` of an activity as
//! transient failures (durable `NextAction`, each at the previous answer's
//! `not_before` in logical time, as the durable scenario does), then records
//! its success (`RecordSuccess`). A deferred report is set aside and asked
//! again, same attempt, once its `not_before` has passed by the wall clock,
//! as a worker waits out a deferral; meanwhile the client goes on with
//! other activities. Run the server with a retry rate below the retries
//! sent and the mix holds durable reports, deferrals and successes
//! (`benches/soak.sh`).

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost_types::Timestamp;
use retry_budget::grpc::TENANT_HEADER;
use retry_budget::grpc::pb::{self, retry_budget_client::RetryBudgetClient};
use tonic::Request;
use tonic::metadata::{Ascii, MetadataValue};

use crate::conn::Conn;
use crate::scenario::{durable_report, now};
use crate::stored::Rng;

/// Deferred activities a client holds at most; past that a deferral is
/// counted as `deferred_queue_full` and its activity dropped, which a run
/// whose deferrals last at most `max_reservation` never reaches.
const MAX_DEFERRED: usize = 4096;
/// Asked again this long after `not_before`, so the client's clock being
/// a little ahead of the server's never asks early.
const MARGIN: Duration = Duration::from_millis(1);

/// One activity a client is working through.
#[derive(Debug)]
struct Activity {
    id: String,
    tenant: MetadataValue<Ascii>,
    /// The attempt to report next, 1-based.
    attempt: u32,
    /// When that attempt failed, in the service's logical time.
    occurred_at: Timestamp,
    /// Every attempt was reported: what is left is its success.
    succeeded: bool,
}

/// A virtual client's activities.
pub struct Mixed {
    prefix: String,
    seq: u64,
    attempts: u32,
    tenants: u64,
    rng: Rng,
    /// The activity being worked through, if any.
    current: Option<Activity>,
    /// Deferred activities and when to ask again (wall clock).
    deferred: VecDeque<(Activity, SystemTime)>,
}

impl Mixed {
    /// A client whose activity ids start with `prefix`, `attempts` failures
    /// an activity, tenants `t0000` to `t{tenants - 1}` drawn from `seed`.
    pub fn new(prefix: &str, attempts: u32, tenants: u64, seed: u64) -> Self {
        Self {
            prefix: prefix.to_owned(),
            seq: 0,
            attempts: attempts.max(1),
            tenants: tenants.max(1),
            rng: Rng::new(seed),
            current: None,
            deferred: VecDeque::new(),
        }
    }

    /// The next activity to work on: the current one, else a deferred one
    /// whose time has come, else a new one.
    fn next(&mut self) -> Activity {
        if let Some(activity) = self.current.take() {
            return activity;
        }
        let wall = SystemTime::now();
        if let Some(i) = self.deferred.iter().position(|(_, at)| *at <= wall) {
            if let Some((activity, _)) = self.deferred.remove(i) {
                return activity;
            }
        }
        self.seq += 1;
        let tenant = format!("t{:04}", self.rng.below(self.tenants));
        Activity {
            id: format!("{}{}", self.prefix, self.seq),
            tenant: MetadataValue::try_from(tenant)
                .unwrap_or_else(|_| MetadataValue::from_static("t0000")),
            attempt: 1,
            occurred_at: now(),
            succeeded: false,
        }
    }

    /// Sends the next step of an activity and checks the answer.
    ///
    /// # Errors
    /// The gRPC code of a failed call, or `unexpected_*` for an answer a
    /// worker would not expect; the activity is dropped.
    pub async fn call(&mut self, budget: &mut RetryBudgetClient<Conn>) -> Result<(), String> {
        let mut activity = self.next();
        if activity.succeeded {
            let mut request = Request::new(pb::RecordSuccessRequest {
                activity_id: activity.id,
                occurred_at: Some(activity.occurred_at),
                ..Default::default()
            });
            request
                .metadata_mut()
                .insert(TENANT_HEADER, activity.tenant);
            let answer = budget
                .record_success(request)
                .await
                .map_err(|s| format!("{:?}", s.code()))?;
            if !answer.get_ref().changed {
                return Err("unexpected_unchanged".into());
            }
            return Ok(());
        }
        let mut request = Request::new(durable_report(
            activity.id.clone(),
            activity.attempt,
            activity.occurred_at,
        ));
        request
            .metadata_mut()
            .insert(TENANT_HEADER, activity.tenant.clone());
        let answer = budget
            .next_action(request)
            .await
            .map_err(|s| format!("{:?}", s.code()))?
            .into_inner();
        if answer.replayed {
            return Err("unexpected_replay".into());
        }
        let not_before = answer.not_before.unwrap_or_else(now);
        if answer.action == pb::Action::Deferred as i32 {
            if self.deferred.len() >= MAX_DEFERRED {
                return Err("deferred_queue_full".into());
            }
            self.deferred
                .push_back((activity, wall_time(&not_before) + MARGIN));
            return Ok(());
        }
        if answer.action != pb::Action::ScheduleRetry as i32 {
            return Err(format!("unexpected_action_{}", answer.code));
        }
        if activity.attempt >= self.attempts {
            activity.succeeded = true;
        } else {
            activity.attempt += 1;
        }
        activity.occurred_at = not_before;
        self.current = Some(activity);
        Ok(())
    }
}

/// A protobuf timestamp as wall-clock time.
fn wall_time(t: &Timestamp) -> SystemTime {
    let seconds = u64::try_from(t.seconds).unwrap_or(0);
    let nanos = u32::try_from(t.nanos).unwrap_or(0);
    UNIX_EPOCH + Duration::new(seconds, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_activities_spread_over_the_tenants() {
        let mut mixed = Mixed::new("m-", 3, 1000, 7);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20_000 {
            let activity = mixed.next();
            seen.insert(
                activity
                    .tenant
                    .to_str()
                    .map(str::to_owned)
                    .unwrap_or_default(),
            );
        }
        assert!(seen.len() > 990, "{} tenants of 1000", seen.len());
        assert!(seen.iter().all(|t| t.len() == 5 && t.starts_with('t')));
    }

    #[test]
    fn a_deferred_activity_comes_back_once_due_and_not_before() {
        let mut mixed = Mixed::new("m-", 3, 10, 1);
        let first = mixed.next();
        let id = first.id.clone();
        mixed
            .deferred
            .push_back((first, SystemTime::now() + Duration::from_secs(3600)));
        assert_ne!(mixed.next().id, id, "not due yet: a new activity");
        let (mut held, _) = mixed.deferred.pop_front().expect("still held");
        held.attempt = 2;
        mixed.deferred.push_back((held, SystemTime::now()));
        let again = mixed.next();
        assert_eq!((again.id.as_str(), again.attempt), (id.as_str(), 2));
    }
}
