//! The mixed scenario (soak.sh): what a pool of workers sends over many tenants. Each
//! virtual client reports attempts 1 to `--attempts` of an activity of a tenant drawn
//! uniformly, each at the previous answer's `not_before` as the durable scenario does, then
//! its success. A deferred report is set aside and asked again, same attempt, once its
//! `not_before` has passed by the wall clock; meanwhile the client goes on with others.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost_types::Timestamp;
use retry_budget::grpc::pb::{self, retry_budget_client::RetryBudgetClient};
use tonic::metadata::{Ascii, MetadataValue};

use crate::conn::Conn;
use crate::scenario::{code, durable_report, now, with_tenant};
use crate::stored::Rng;

/// Deferred activities a client holds at most (a run whose deferrals last at most
/// `max_reservation` never reaches it); past it the deferral is `deferred_queue_full`.
const MAX_DEFERRED: usize = 4096;
/// Asked again this long after `not_before`, so a client clock a little ahead never asks early.
const MARGIN: Duration = Duration::from_millis(1);

#[derive(Debug)]
struct Activity {
    id: String,
    tenant: MetadataValue<Ascii>,
    /// The attempt to report next, and when it failed in the service's logical time.
    attempt: u32,
    occurred_at: Timestamp,
    /// Every attempt reported: its success is what is left.
    succeeded: bool,
}

pub struct Mixed {
    prefix: String,
    seq: u64,
    attempts: u32,
    tenants: u64,
    rng: Rng,
    current: Option<Activity>,
    /// Deferred activities and when to ask again (wall clock).
    deferred: VecDeque<(Activity, SystemTime)>,
}

impl Mixed {
    /// A client's activities `{prefix}{seq}`; its draws of tenants seeded by its prefix.
    pub fn new(prefix: &str, attempts: u32, tenants: u64) -> Self {
        let seed = prefix.bytes().fold(0u64, |h, b| {
            h.wrapping_mul(0x100_0000_01B3).wrapping_add(u64::from(b))
        });
        let (attempts, tenants, rng) = (attempts.max(1), tenants.max(1), Rng::new(seed));
        Self {
            prefix: prefix.to_owned(),
            seq: 0,
            attempts,
            tenants,
            rng,
            current: None,
            deferred: VecDeque::new(),
        }
    }

    /// The current activity, else a deferred one whose time has come, else a new one.
    fn next(&mut self) -> Activity {
        if let Some(activity) = self.current.take() {
            return activity;
        }
        let wall = SystemTime::now();
        if let Some(i) = self.deferred.iter().position(|(_, at)| *at <= wall) {
            return self.deferred.remove(i).expect("found").0;
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

    /// Sends the next step of an activity and checks the answer; a failure drops it.
    pub async fn call(&mut self, budget: &mut RetryBudgetClient<Conn>) -> Result<(), String> {
        let mut activity = self.next();
        if activity.succeeded {
            let success = pb::RecordSuccessRequest {
                activity_id: activity.id,
                occurred_at: Some(activity.occurred_at),
                ..Default::default()
            };
            let answer = budget
                .record_success(with_tenant(success, &activity.tenant))
                .await
                .map_err(code)?;
            return answer
                .get_ref()
                .changed
                .then_some(())
                .ok_or_else(|| "unexpected_unchanged".into());
        }
        let report = durable_report(activity.id.clone(), activity.attempt, activity.occurred_at);
        let answer = budget
            .next_action(with_tenant(report, &activity.tenant))
            .await
            .map_err(code)?
            .into_inner();
        if answer.replayed {
            return Err("unexpected_replay".into());
        }
        let not_before = answer.not_before.unwrap_or_else(now);
        if answer.action == pb::Action::Deferred as i32 {
            if self.deferred.len() >= MAX_DEFERRED {
                return Err("deferred_queue_full".into());
            }
            let wall = UNIX_EPOCH
                + Duration::new(
                    not_before.seconds.max(0) as u64,
                    not_before.nanos.max(0) as u32,
                );
            self.deferred.push_back((activity, wall + MARGIN));
            return Ok(());
        }
        if answer.action != pb::Action::ScheduleRetry as i32 {
            return Err(format!("unexpected_action_{}", answer.code));
        }
        activity.succeeded = activity.attempt >= self.attempts;
        activity.attempt += u32::from(!activity.succeeded);
        activity.occurred_at = not_before;
        self.current = Some(activity);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deferred_activity_comes_back_once_due_and_not_before() {
        let mut mixed = Mixed::new("m-", 3, 10);
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
