//! The durable activity: the state machine that owns an activity's attempt
//! budget, so that a worker restart can never reset it.
//!
//! Everything here is pure. [`plan`] takes the recorded activity (if any), a
//! failure [`Report`] and the service's clock reading `now_ms` (used only to
//! stamp a missing time, which is then recorded), and returns either the
//! recorded decision to replay or a [`Draft`]: the new decision and the new
//! record, waiting for the global retry token. The caller settles the token
//! ([`Draft::take_token`] or [`Draft::settle`]), makes the record durable, and only
//! then replies.
//!
//! # Logical time
//! `started_at` is the `occurred_at` of the first report. A decision measures
//! `elapsed = occurred_at - started_at` in the caller's own logical time, so a
//! worker replaying its history gets the same plan whatever the wall clock
//! says. A retry is refused (`deadline_exceeded`) when its planned start
//! `occurred_at + delay` falls after `started_at + deadline`: a retry that
//! could never run is not scheduled.
//!
//! # Replay
//! Attempt numbers identify decisions: reporting an attempt that was already
//! decided returns the recorded event unchanged, spends nothing and writes
//! nothing, whatever changed meanwhile (clock, configuration, tokens).

use std::sync::Arc;

use super::action::{Action, Budget, ErrorClass};
use super::codes;
use super::decision::{Deadline, Failure, RetryPlan, decide, exceed, settle};
use super::hint::RawHints;
use super::token::{Answer, TokenGate};

pub use super::error::{
    BudgetError, ErrorKind, MAX_DEPENDENCY_BYTES, MAX_ID_BYTES, validate_activity_id,
    validate_dependency, validate_workflow_id,
};
pub use super::record::{
    ActivityKey, ActivityRecord, Event, EventKind, Policy, Reservation, Status,
};
pub use super::tenant::{DEFAULT_TENANT, MAX_TENANT_BYTES, validate as validate_tenant};

/// A failure report of the durable form of `NextAction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report<'a> {
    /// The 1-based attempt that just failed.
    pub attempt: u32,
    /// The failure's class.
    pub class: ErrorClass,
    /// The classification rule that gave `class`, when the service
    /// classified a raw failure.
    pub rule: Option<&'a str>,
    /// The server's retry hints, raw as the worker received them.
    pub hints: Option<RawHints<'a>>,
    /// The caller's policy; read on the first report only.
    pub policy: Option<Policy>,
    /// The logical time of the failure, unix milliseconds; `None` means now.
    pub occurred_at_ms: Option<i64>,
    /// The workflow, recorded on the first report.
    pub workflow_id: &'a str,
    /// The dependency the failed call went to; empty for the default one.
    /// Its budget and the global one pay for a retry.
    pub dependency: &'a str,
}

/// What [`plan`] found.
#[derive(Debug)]
// A plan lives on the stack for one decision and is taken apart at once:
// boxing the draft would cost an allocation a decision to save a copy.
#[allow(clippy::large_enum_variant)]
pub enum Plan {
    /// The attempt was decided before: return this event unchanged.
    Replay(Replay),
    /// A new decision, waiting for its token to be settled.
    Fresh(Draft),
}

/// A recorded decision returned again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The recorded event.
    pub event: Arc<Event>,
    /// The recorded policy.
    pub policy: Policy,
}

/// A new decision and the record it produces. Settle the token
/// ([`Draft::settle`]), then [`finish`](Self::finish) it and make the record
/// durable before replying.
#[derive(Debug)]
pub struct Draft {
    record: ActivityRecord,
    event: Event,
    /// True when a deferral's booked slot pays for this retry.
    reserved: bool,
    /// True when a deferral decided now has a token booked.
    booked: bool,
}

impl Draft {
    /// Whether the decision is a retry that needs a global token from the
    /// bucket. False for stops, and for a retry paid by a reservation.
    pub fn wants_token(&self) -> bool {
        self.event.action == Some(Action::ScheduleRetry) && !self.reserved
    }

    /// The action decided so far.
    pub fn action(&self) -> Action {
        self.event.action.unwrap_or(Action::ScheduleRetry)
    }

    /// Asks `gate` for the retry's token when it wants one (see
    /// [`Draft::wants_token`]), and applies the answer: a retry, a deferral
    /// (the attempt is not consumed), or `deadline_exceeded` when the slot
    /// comes too late. A gate not asked gives its token back when dropped.
    pub fn take_token(&mut self, gate: impl TokenGate, now_ms: i64) {
        if self.wants_token() {
            let answer = gate.take(self.max_wait(now_ms));
            self.settle(answer, now_ms);
        }
    }

    /// Applies the bucket's answer for this retry (see
    /// [`decision::settle`](super::decision::settle)).
    pub fn settle(&mut self, answer: impl Into<Answer>, now_ms: i64) {
        let deadline = self.deadline();
        self.booked = settle(&mut self.event, answer, now_ms, Some(deadline));
    }

    /// How long a booked slot may be from `now_ms` and still leave the
    /// worker time to ask again before the deadline
    /// ([`Deadline::latest_deferral_ms`]); zero when that moment has passed.
    pub fn max_wait(&self, now_ms: i64) -> std::time::Duration {
        let left = self
            .deadline()
            .latest_deferral_ms()
            .saturating_sub(now_ms)
            .max(0);
        std::time::Duration::from_millis(left.unsigned_abs())
    }

    fn deadline(&self) -> Deadline {
        self.record.deadline()
    }

    /// Appends the event and applies the decision to the record.
    pub fn finish(mut self) -> (ActivityRecord, Arc<Event>) {
        let now_ms = self.event.recorded_at_ms;
        let action = self.action();
        match action {
            Action::Deferred => {
                self.record.reservation = Some(Reservation {
                    attempt: self.event.attempt,
                    not_before_ms: self.event.not_before_ms.unwrap_or(now_ms),
                    booked: self.booked,
                });
            }
            _ => {
                self.record.attempts = self.event.attempt;
                self.record.reservation = None;
                if action.is_terminal() {
                    self.record.close(action.code(), now_ms);
                } else if action == Action::ManualReview {
                    self.record.status = Status::Parked;
                }
            }
        }
        let event = Arc::new(self.event);
        self.record.events.push(Arc::clone(&event));
        (self.record, event)
    }
}

/// The service's settings that shape decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// The policy of an activity whose first report carries none.
    pub policy: Policy,
    /// The longest delay a server's hint may ask for, in milliseconds.
    pub max_hint_ms: u64,
}

/// Decides a failure report against the recorded activity.
///
/// `now_ms` is the service's clock, read once by the caller: it stamps a
/// report without `occurred_at` (and the stamp is recorded), dates the event
/// for audits, and tells whether a booked slot has come; it never enters
/// the budget arithmetic.
///
/// # Errors
/// [`BudgetError`] for attempt 0, an attempt that skips ahead, a closed or
/// parked activity, or a time before the activity's start.
pub fn plan(
    existing: Option<ActivityRecord>,
    key: &ActivityKey,
    report: &Report<'_>,
    defaults: &Defaults,
    now_ms: i64,
) -> Result<Plan, BudgetError> {
    if report.attempt == 0 {
        return Err(BudgetError::AttemptMustBePositive);
    }
    let recorded = existing.as_ref().map_or(0, |r| r.attempts);
    if let Some(record) = &existing
        && report.attempt <= record.attempts
    {
        if let Some(event) = record.decision_of(report.attempt) {
            return Ok(Plan::Replay(Replay {
                event: Arc::clone(event),
                policy: record.policy,
            }));
        }
    }
    let expected = recorded.saturating_add(1);
    // Past its last decision, a closed or parked activity says so whatever
    // attempt is reported: pointing at the next attempt would point at a
    // call that is refused too.
    if let Some(record) = &existing
        && report.attempt >= expected
    {
        match record.status {
            Status::Closed => {
                return Err(BudgetError::ActivityClosed {
                    code: record.closed_code.clone().unwrap_or_default(),
                    attempts: record.attempts,
                });
            }
            Status::Parked => {
                return Err(BudgetError::ActivityParked {
                    attempts: record.attempts,
                });
            }
            Status::Open => {}
        }
    }
    if report.attempt != expected {
        return Err(BudgetError::AttemptOutOfOrder {
            expected,
            got: report.attempt,
        });
    }
    let mut reserved = false;
    // Asked again after a deferral: the worker is here now, on the
    // service's clock, so the retry cannot start before `now_ms`.
    let mut asked_again = false;
    if let Some(record) = &existing {
        if let Some(reservation) = record.reservation
            && reservation.attempt == report.attempt
        {
            if now_ms < reservation.not_before_ms
                && let Some(event) = record.deferral_of(report.attempt)
            {
                // Asked again before the booked slot: the same deferral,
                // without touching the bucket (no busy loop).
                return Ok(Plan::Replay(Replay {
                    event: Arc::clone(event),
                    policy: record.policy,
                }));
            }
            reserved = reservation.booked;
            asked_again = true;
        }
    }

    let occurred_at_ms = report.occurred_at_ms.unwrap_or(now_ms);
    let record = match existing {
        Some(record) => record,
        None => ActivityRecord {
            tenant: key.tenant.clone(),
            activity_id: key.activity_id.clone(),
            workflow_id: report.workflow_id.to_owned(),
            policy: report
                .policy
                .map_or(defaults.policy, |p| p.or_defaults(defaults.policy)),
            started_at_ms: occurred_at_ms,
            attempts: 0,
            status: Status::Open,
            closed_code: None,
            closed_at_ms: None,
            reservation: None,
            events: Vec::new(),
        },
    };
    if occurred_at_ms < record.started_at_ms {
        return Err(BudgetError::OccurredBeforeStart {
            occurred_at_ms,
            started_at_ms: record.started_at_ms,
        });
    }
    let elapsed_ms = occurred_at_ms.abs_diff(record.started_at_ms);
    let policy = record.policy;
    let budget = Budget {
        attempts: report.attempt,
        max_attempts: policy.max_attempts,
        elapsed: elapsed_ms / 1000,
        deadline: policy.deadline_seconds,
    };
    let failure = Failure {
        class: report.class,
        rule: report.rule,
        hints: report.hints,
        occurred_at_ms: Some(occurred_at_ms),
    };
    let retry = RetryPlan {
        activity_id: &key.activity_id,
        params: policy.delay_params(),
        deadline: Some(record.deadline()),
    };
    let mut event = decide(
        &budget,
        &failure,
        elapsed_ms,
        Some(retry),
        defaults.max_hint_ms,
        now_ms,
    )?;
    event.occurred_at_stamped = report.occurred_at_ms.is_none();
    event.dependency = (!report.dependency.is_empty()).then(|| report.dependency.to_owned());
    if reserved
        && event.action == Some(Action::ScheduleRetry)
        && let Some(planned) = event.not_before_ms
    {
        // The booked slot's token is this retry's: recorded as taken when
        // the decision is (a dry run records nothing, and answers that it
        // took nothing: see `Event::taken_by_this_call`).
        event.token_taken = true;
        event
            .reason
            .push_str("; paid by the slot booked when it was deferred");
        let slot = record.reservation.map_or(planned, |r| r.not_before_ms);
        event.not_before_ms = Some(planned.max(slot));
    }
    let deadline = record.deadline();
    if asked_again && event.action == Some(Action::ScheduleRetry) && now_ms >= deadline.at_ms() {
        // Whatever `occurred_at` says, a retry granted now would start
        // past the deadline; a booked slot's token goes unused.
        exceed(
            &mut event,
            deadline,
            now_ms,
            "the deferred attempt was asked again",
        );
        reserved = false;
    }
    Ok(Plan::Fresh(Draft {
        record,
        event,
        reserved,
        booked: false,
    }))
}

/// Closes an activity because an attempt succeeded. Returns `None` when it
/// was already closed: success is idempotent and changes nothing then.
pub fn record_success(
    mut record: ActivityRecord,
    occurred_at_ms: Option<i64>,
    now_ms: i64,
) -> Option<ActivityRecord> {
    if record.status == Status::Closed {
        return None;
    }
    let occurred = occurred_at_ms.unwrap_or(now_ms);
    record.events.push(transition(
        EventKind::Success,
        record.attempts.saturating_add(1),
        occurred,
        occurred_at_ms.is_none(),
        record.started_at_ms,
        codes::SUCCEEDED,
        "an attempt succeeded".to_owned(),
        now_ms,
    ));
    record.close(codes::SUCCEEDED, now_ms);
    Some(record)
}

/// A reviewer's decision on a parked activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Close it as failed.
    Fail,
    /// Reopen it: the next attempt may be reported.
    Retry,
}

/// Applies a reviewer's resolution to a parked activity.
///
/// # Errors
/// [`BudgetError::ActivityNotParked`] when it is not parked.
pub fn resolve(
    mut record: ActivityRecord,
    resolution: Resolution,
    note: &str,
    now_ms: i64,
) -> Result<ActivityRecord, BudgetError> {
    if record.status != Status::Parked {
        return Err(BudgetError::ActivityNotParked {
            status: record.status.as_str(),
        });
    }
    let (code, what) = match resolution {
        Resolution::Fail => (codes::RESOLVED_FAILED, "closed as failed by a reviewer"),
        Resolution::Retry => (codes::RESOLVED_RETRY, "reopened for retry by a reviewer"),
    };
    let reason = if note.is_empty() {
        what.to_owned()
    } else {
        format!("{what}: {note}")
    };
    record.events.push(transition(
        EventKind::Resolution,
        record.attempts,
        now_ms,
        true,
        record.started_at_ms,
        code,
        reason,
        now_ms,
    ));
    match resolution {
        Resolution::Fail => record.close(code, now_ms),
        Resolution::Retry => record.status = Status::Open,
    }
    Ok(record)
}

#[allow(clippy::too_many_arguments)]
fn transition(
    kind: EventKind,
    attempt: u32,
    occurred_at_ms: i64,
    stamped: bool,
    started_at_ms: i64,
    code: &str,
    reason: String,
    now_ms: i64,
) -> Arc<Event> {
    Arc::new(Event {
        kind,
        attempt,
        class: None,
        occurred_at_ms,
        occurred_at_stamped: stamped,
        elapsed_ms: occurred_at_ms
            .saturating_sub(started_at_ms)
            .max(0)
            .unsigned_abs(),
        backoff_ms: 0,
        delay_seconds: 0,
        delay_ms: 0,
        not_before_ms: None,
        action: None,
        code: code.to_owned(),
        reason,
        token_taken: false,
        slot_booked: false,
        defer_reason: None,
        rule: None,
        hint: None,
        dependency: None,
        recorded_at_ms: now_ms,
    })
}

#[cfg(test)]
mod tests;
