//! The stored schema's types and the core's, converted both ways: what a
//! save writes, and what a load reads, refusing what this release cannot
//! represent.

use std::sync::Arc;

use super::{DecodeError, pb};
use crate::budget::action::{Action, ErrorClass};
use crate::budget::activity::{ActivityRecord, Deferral, Event, EventKind, Policy, Status};
use crate::budget::hint::{Hint, HintSource, IgnoredHints};
use crate::budget::token::{HealthState, PaceRecord, Payment, TenantPaceRecord};

impl From<Status> for pb::Status {
    fn from(status: Status) -> Self {
        match status {
            Status::Open => Self::Open,
            Status::Parked => Self::Parked,
            Status::Closed => Self::Closed,
        }
    }
}

impl From<EventKind> for pb::EventKind {
    fn from(kind: EventKind) -> Self {
        match kind {
            EventKind::Decision => Self::Decision,
            EventKind::Success => Self::Success,
            EventKind::Resolution => Self::Resolution,
        }
    }
}

impl From<Option<ErrorClass>> for pb::ErrorClass {
    fn from(class: Option<ErrorClass>) -> Self {
        match class {
            None => Self::Unspecified,
            Some(ErrorClass::Transient) => Self::Transient,
            Some(ErrorClass::Permanent) => Self::Permanent,
            Some(ErrorClass::Unknown) => Self::Unknown,
        }
    }
}

impl From<Option<Action>> for pb::Action {
    fn from(action: Option<Action>) -> Self {
        match action {
            None => Self::Unspecified,
            Some(Action::ScheduleRetry) => Self::ScheduleRetry,
            Some(Action::AttemptsExhausted) => Self::AttemptsExhausted,
            Some(Action::DeadlineExceeded) => Self::DeadlineExceeded,
            Some(Action::FailPermanent) => Self::FailPermanent,
            Some(Action::ManualReview) => Self::ManualReview,
            Some(Action::Deferred) => Self::Deferred,
        }
    }
}

impl From<Option<HintSource>> for pb::HintSource {
    fn from(source: Option<HintSource>) -> Self {
        match source {
            None => Self::Unspecified,
            Some(HintSource::RetryAfterSeconds) => Self::RetryAfterSeconds,
            Some(HintSource::RetryAfterDate) => Self::RetryAfterDate,
            Some(HintSource::GrpcRetryPushback) => Self::GrpcRetryPushback,
            Some(HintSource::RetryInfo) => Self::RetryInfo,
        }
    }
}

/// A record taken apart for a save: the message without its events, and
/// the events. Its strings move into the message rather than being copied
/// (a save has no further use for the record).
pub(super) fn split(record: ActivityRecord) -> (pb::ActivityRecord, Vec<Arc<Event>>) {
    let message = pb::ActivityRecord {
        tenant: record.tenant,
        activity_id: record.activity_id,
        workflow_id: record.workflow_id,
        policy: Some(pb::Policy {
            max_attempts: record.policy.max_attempts,
            deadline_seconds: record.policy.deadline_seconds,
            base: record.policy.base,
            cap: record.policy.cap,
        }),
        started_at_ms: record.started_at_ms,
        attempts: record.attempts,
        status: pb::Status::from(record.status).into(),
        closed_code: record.closed_code,
        closed_at_ms: record.closed_at_ms,
        reservation: record.deferral.map(|d| pb::Reservation {
            attempt: d.attempt,
            not_before_ms: d.not_before_ms,
            booked: false,
            waiting_since_ms: d.waiting_since_ms,
        }),
        events: Vec::new(),
    };
    (message, record.events)
}

/// An event's strings move too, unless someone else holds it (a loaded
/// history is the record's alone; only the new event is shared, with the
/// answer): then they are copied.
impl From<Arc<Event>> for pb::Event {
    fn from(e: Arc<Event>) -> Self {
        Self::from(Arc::unwrap_or_clone(e))
    }
}

impl From<Event> for pb::Event {
    fn from(e: Event) -> Self {
        Self {
            kind: pb::EventKind::from(e.kind).into(),
            attempt: e.attempt,
            class: pb::ErrorClass::from(e.class).into(),
            occurred_at_ms: e.occurred_at_ms,
            occurred_at_stamped: e.occurred_at_stamped,
            elapsed_ms: e.elapsed_ms,
            backoff_ms: e.backoff_ms,
            delay_seconds: e.delay_seconds,
            delay_ms: e.delay_ms,
            not_before_ms: e.not_before_ms,
            action: pb::Action::from(e.action).into(),
            code: e.code,
            reason: e.reason,
            token_taken: e.payment.is_token(),
            slot_booked: e.payment.place().is_some(),
            waiting_since_ms: e.payment.place(),
            dependency_untracked: e.dependency_untracked,
            defer_reason: e.defer_reason,
            rule: e.rule,
            hint: e.hint.map(|h| pb::Hint {
                delay_ms: h.delay_ms,
                source: pb::HintSource::from(h.source).into(),
                capped: h.capped,
                do_not_retry: h.do_not_retry,
                ignored: (!h.ignored.is_empty()).then_some(pb::IgnoredHints {
                    retry_after: h.ignored.retry_after,
                    date: h.ignored.date,
                    retry_info: h.ignored.retry_info,
                }),
            }),
            dependency: e.dependency,
            recorded_at_ms: e.recorded_at_ms,
        }
    }
}

/// The enum `E` of a stored number, which must be one this release knows.
fn known<E: TryFrom<i32>>(field: &'static str, value: i32) -> Result<E, DecodeError> {
    E::try_from(value).map_err(|_| DecodeError::UnknownValue { field, value })
}

impl TryFrom<pb::ActivityRecord> for ActivityRecord {
    type Error = DecodeError;

    fn try_from(stored: pb::ActivityRecord) -> Result<Self, DecodeError> {
        let policy = stored.policy.ok_or(DecodeError::Missing("policy"))?;
        let status = match known("status", stored.status)? {
            pb::Status::Open => Status::Open,
            pb::Status::Parked => Status::Parked,
            pb::Status::Closed => Status::Closed,
            pb::Status::Unspecified => return Err(DecodeError::Missing("status")),
        };
        Ok(Self {
            tenant: stored.tenant,
            activity_id: stored.activity_id,
            workflow_id: stored.workflow_id,
            policy: Policy {
                max_attempts: policy.max_attempts,
                deadline_seconds: policy.deadline_seconds,
                base: policy.base,
                cap: policy.cap,
            },
            started_at_ms: stored.started_at_ms,
            attempts: stored.attempts,
            status,
            closed_code: stored.closed_code,
            closed_at_ms: stored.closed_at_ms,
            // A slot booked by a release before field 4 is read as a place
            // in line taken at that slot's time.
            deferral: stored.reservation.map(|r| Deferral {
                attempt: r.attempt,
                not_before_ms: r.not_before_ms,
                waiting_since_ms: r.waiting_since_ms.or(r.booked.then_some(r.not_before_ms)),
            }),
            events: stored
                .events
                .into_iter()
                .map(|e| Event::try_from(e).map(Arc::new))
                .collect::<Result<_, _>>()?,
        })
    }
}

impl TryFrom<pb::Event> for Event {
    type Error = DecodeError;

    fn try_from(stored: pb::Event) -> Result<Self, DecodeError> {
        let kind = match known("event.kind", stored.kind)? {
            pb::EventKind::Decision => EventKind::Decision,
            pb::EventKind::Success => EventKind::Success,
            pb::EventKind::Resolution => EventKind::Resolution,
            pb::EventKind::Unspecified => return Err(DecodeError::Missing("event.kind")),
        };
        let class = match known("event.class", stored.class)? {
            pb::ErrorClass::Unspecified => None,
            pb::ErrorClass::Transient => Some(ErrorClass::Transient),
            pb::ErrorClass::Permanent => Some(ErrorClass::Permanent),
            pb::ErrorClass::Unknown => Some(ErrorClass::Unknown),
        };
        let action = match known("event.action", stored.action)? {
            pb::Action::Unspecified => None,
            pb::Action::ScheduleRetry => Some(Action::ScheduleRetry),
            pb::Action::AttemptsExhausted => Some(Action::AttemptsExhausted),
            pb::Action::DeadlineExceeded => Some(Action::DeadlineExceeded),
            pb::Action::FailPermanent => Some(Action::FailPermanent),
            pb::Action::ManualReview => Some(Action::ManualReview),
            pb::Action::Deferred => Some(Action::Deferred),
        };
        let booked_before_19 = action == Some(Action::Deferred) && stored.token_taken;
        Ok(Self {
            kind,
            attempt: stored.attempt,
            class,
            occurred_at_ms: stored.occurred_at_ms,
            occurred_at_stamped: stored.occurred_at_stamped,
            elapsed_ms: stored.elapsed_ms,
            backoff_ms: stored.backoff_ms,
            delay_seconds: stored.delay_seconds,
            delay_ms: stored.delay_ms,
            not_before_ms: stored.not_before_ms,
            action,
            code: stored.code,
            reason: stored.reason,
            // Before field 19, a deferral that booked a slot was written
            // with token_taken: it is read as what it was, a booking; a
            // booking before field 21 as a place taken when it was made.
            payment: if stored.token_taken && !booked_before_19 {
                Payment::Token
            } else if stored.slot_booked || booked_before_19 {
                Payment::Turn {
                    since_ms: stored.waiting_since_ms.unwrap_or(stored.recorded_at_ms),
                }
            } else {
                Payment::Nothing
            },
            dependency_untracked: stored.dependency_untracked,
            defer_reason: stored.defer_reason,
            rule: stored.rule,
            hint: stored.hint.map(Hint::try_from).transpose()?,
            dependency: stored.dependency,
            recorded_at_ms: stored.recorded_at_ms,
        })
    }
}

impl TryFrom<pb::Hint> for Hint {
    type Error = DecodeError;

    fn try_from(stored: pb::Hint) -> Result<Self, DecodeError> {
        let source = match known("hint.source", stored.source)? {
            pb::HintSource::Unspecified => None,
            pb::HintSource::RetryAfterSeconds => Some(HintSource::RetryAfterSeconds),
            pb::HintSource::RetryAfterDate => Some(HintSource::RetryAfterDate),
            pb::HintSource::GrpcRetryPushback => Some(HintSource::GrpcRetryPushback),
            pb::HintSource::RetryInfo => Some(HintSource::RetryInfo),
        };
        let ignored = stored.ignored.unwrap_or_default();
        Ok(Self {
            delay_ms: stored.delay_ms,
            source,
            capped: stored.capped,
            do_not_retry: stored.do_not_retry,
            ignored: IgnoredHints {
                retry_after: ignored.retry_after,
                date: ignored.date,
                retry_info: ignored.retry_info,
            },
        })
    }
}

impl From<&PaceRecord> for pb::DependencyPace {
    fn from(p: &PaceRecord) -> Self {
        Self {
            dependency: p.dependency.clone(),
            allowance: p.allowance,
            state: p.state.code(),
            saved_at_ms: p.saved_at_ms,
            tenants: p
                .tenants
                .iter()
                .map(|t| pb::TenantPace {
                    tenant: t.tenant.clone(),
                    allowance: t.allowance,
                    baseline: t.baseline,
                    state: t.state.code(),
                    success_rate: t.success_rate,
                    threshold: t.threshold,
                })
                .collect(),
        }
    }
}

/// A stored pace is advice: an unknown state reads as no evidence, and the
/// bucket checks every number before it takes it.
impl From<pb::DependencyPace> for PaceRecord {
    fn from(p: pb::DependencyPace) -> Self {
        Self {
            dependency: p.dependency,
            allowance: p.allowance,
            state: HealthState::from_code(p.state),
            saved_at_ms: p.saved_at_ms,
            tenants: p
                .tenants
                .into_iter()
                .map(|t| TenantPaceRecord {
                    tenant: t.tenant,
                    allowance: t.allowance,
                    baseline: t.baseline,
                    state: HealthState::from_code(t.state),
                    success_rate: t.success_rate,
                    threshold: t.threshold,
                })
                .collect(),
        }
    }
}
