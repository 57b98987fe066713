//! The durable activity: the state machine that owns an activity's attempt
//! budget, so that a worker restart can never reset it.
//!
//! Everything here is pure. [`draft_or_replay`] takes the recorded activity
//! (if any), a failure [`Report`] and the service's clock reading `now_ms`
//! (used only to stamp a missing time, which is then recorded), and returns
//! either the recorded decision to replay or a [`Draft`]: the new decision
//! and the new record, waiting for the global retry token. The caller
//! settles the token ([`Draft::take_token`]), makes the record durable, and
//! only then replies.
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
use super::decision::{ClassifiedFailure, RetryTerms, draft_event, exceed, settle};
use super::hint::RawHints;
use super::token::{Ask, Observed, Payment, TokenGate};

pub use super::error::{
    BudgetError, ErrorKind, MAX_DEPENDENCY_BYTES, MAX_ID_BYTES, validate_activity_id,
    validate_dependency, validate_workflow_id,
};
pub use super::record::{ActivityKey, ActivityRecord, Deferral, Event, EventKind, Policy, Status};
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

/// What [`draft_or_replay`] found.
#[derive(Debug)]
// It lives on the stack for one decision and is taken apart at once:
// boxing the draft would cost an allocation a decision to save a copy.
#[allow(clippy::large_enum_variant)]
pub enum DraftOrReplay {
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

/// A new decision and the record it produces. Ask the budget
/// ([`Draft::take_token`]), then [`finish`](Self::finish) it and make the
/// record durable before replying, unless [`Draft::needs_write`] says
/// nothing changed.
#[derive(Debug)]
pub struct Draft {
    record: ActivityRecord,
    event: Event,
    /// A deferred attempt asked again: its failure was counted when it was
    /// first deferred, and a deferral again writes nothing.
    asked_again: bool,
    /// Its place in line, from its first deferral.
    waiting_since_ms: Option<i64>,
}

impl Draft {
    /// The action decided so far.
    pub fn action(&self) -> Action {
        self.event.action.unwrap_or(Action::ScheduleRetry)
    }

    /// Tells `gate` of a fresh failure, asks it for the retry's token when
    /// the decision is a retry, and applies the answer: a retry, or a
    /// deferral (the attempt is not consumed). A deferred attempt that
    /// stops gives up its place in line.
    pub fn take_token(&mut self, mut gate: impl TokenGate, now_ms: i64) {
        let observed = (!self.asked_again).then_some(Observed {
            retry_failed: self.event.attempt >= 2,
        });
        if self.action() != Action::ScheduleRetry {
            if let Some(observed) = observed {
                gate.observe(observed);
            }
            if let Some(since_ms) = self.waiting_since_ms {
                gate.leave(&self.record.activity_id, since_ms);
            }
            return;
        }
        let ask = Ask {
            activity_id: Some(&self.record.activity_id),
            waiting_since_ms: self.waiting_since_ms,
            now_ms,
            planned_ms: self.event.not_before_ms,
            observed,
        };
        let answer = gate.take(&ask);
        settle(
            &mut self.event,
            answer,
            now_ms,
            Some(self.record.deadline()),
        );
        if self.asked_again && self.event.payment.is_token() {
            // The worker is here now: the retry starts now, or at its
            // planned start if that is later.
            let planned = self.event.not_before_ms.unwrap_or(now_ms);
            self.event.not_before_ms = Some(planned.max(now_ms));
            if self.waiting_since_ms.is_some() {
                self.event
                    .reason
                    .push_str("; its turn in line came after it was deferred");
            }
        }
    }

    /// Whether the record changes: not when a deferred attempt asked again
    /// is deferred again keeping its place (its place and first deferral
    /// stand; the answer is not recorded, so asking costs no write). One
    /// that held no place and takes one now is written, so it keeps it.
    pub fn needs_write(&self) -> bool {
        !(self.asked_again
            && self.action() == Action::Deferred
            && self.event.payment.place() == self.waiting_since_ms)
    }

    /// Appends the event and applies the decision to the record.
    pub fn finish(mut self) -> (ActivityRecord, Arc<Event>) {
        let now_ms = self.event.recorded_at_ms;
        let action = self.action();
        match action {
            Action::Deferred => {
                self.record.deferral = Some(Deferral {
                    attempt: self.event.attempt,
                    not_before_ms: self.event.not_before_ms.unwrap_or(now_ms),
                    waiting_since_ms: self.event.payment.place(),
                });
            }
            _ => {
                self.record.attempts = self.event.attempt;
                self.record.deferral = None;
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

/// A failure report decided against the recorded activity: the recorded
/// decision to replay, or a [`Draft`] of a new one.
///
/// `now_ms` is the service's clock, read once by the caller: it stamps a
/// report without `occurred_at` (and the stamp is recorded), dates the event
/// for audits, and tells whether a deferral's time has come; it never enters
/// the budget arithmetic.
///
/// # Errors
/// [`BudgetError`] for attempt 0, an attempt that skips ahead, a closed or
/// parked activity, or a time before the activity's start.
pub fn draft_or_replay(
    existing: Option<ActivityRecord>,
    key: &ActivityKey,
    report: &Report<'_>,
    defaults: &Defaults,
    now_ms: i64,
) -> Result<DraftOrReplay, BudgetError> {
    if report.attempt == 0 {
        return Err(BudgetError::AttemptMustBePositive);
    }
    let recorded = existing.as_ref().map_or(0, |r| r.attempts);
    if let Some(record) = &existing
        && report.attempt <= record.attempts
    {
        if let Some(event) = record.decision_of(report.attempt) {
            return Ok(DraftOrReplay::Replay(Replay {
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
    // Asked again after a deferral: the worker is here now, on the
    // service's clock, so the retry cannot start before `now_ms`.
    let mut asked_again = false;
    let mut waiting_since_ms = None;
    if let Some(record) = &existing
        && let Some(deferral) = record.deferral
        && deferral.attempt == report.attempt
    {
        if now_ms < deferral.not_before_ms
            && let Some(event) = record.deferral_of(report.attempt)
        {
            // Asked again before its time: the same deferral, without
            // touching the budget (no busy loop).
            return Ok(DraftOrReplay::Replay(Replay {
                event: Arc::clone(event),
                policy: record.policy,
            }));
        }
        asked_again = true;
        waiting_since_ms = deferral.waiting_since_ms;
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
            deferral: None,
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
    let failure = ClassifiedFailure {
        class: report.class,
        rule: report.rule,
        hints: report.hints,
        occurred_at_ms: Some(occurred_at_ms),
    };
    let retry = RetryTerms {
        activity_id: Some(&key.activity_id),
        params: policy.delay_params(),
        deadline: Some(record.deadline()),
    };
    let mut event = draft_event(
        &budget,
        &failure,
        elapsed_ms,
        Some(retry),
        defaults.max_hint_ms,
        now_ms,
    )?;
    event.occurred_at_stamped = report.occurred_at_ms.is_none();
    event.dependency = (!report.dependency.is_empty()).then(|| report.dependency.to_owned());
    let deadline = record.deadline();
    if asked_again && event.action == Some(Action::ScheduleRetry) && now_ms >= deadline.at_ms() {
        // Whatever `occurred_at` says, a retry granted now would start
        // past the deadline.
        exceed(
            &mut event,
            deadline,
            now_ms,
            "the deferred attempt was asked again",
        );
    }
    Ok(DraftOrReplay::Fresh(Draft {
        record,
        event,
        asked_again,
        waiting_since_ms,
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
        payment: Payment::Nothing,
        defer_reason: None,
        rule: None,
        hint: None,
        dependency: None,
        dependency_untracked: false,
        recorded_at_ms: now_ms,
    })
}

#[cfg(test)]
mod tests;
