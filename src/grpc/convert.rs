//! Conversions between protobuf messages and core types, with the input
//! checks that belong to the wire (enum values, timestamps, metadata).

use crate::metrics::DecisionLabels;
use prost_types::Timestamp;
use tonic::metadata::MetadataMap;

use super::pb;
use crate::budget::activity::{
    ActivityRecord, BudgetError, Event, EventKind, Policy, Resolution, Status,
};
use crate::budget::classify::{Failure, NetworkFailure, Reach, Safety};
use crate::budget::hint::{Hint, RawHints, RetryInfoDelay};
use crate::budget::timestamp::{self, TimeBounds};
use crate::budget::token::DEFAULT_DEPENDENCY;
use crate::budget::{Action, ErrorClass};
use crate::ledger::Decided;

/// The tenant the request acts for, as the authentication layer resolved
/// it (see `crate::auth::tenant_of`): read once a call, and what the
/// decision's token gate charges.
pub(super) fn tenant<'a>(
    extensions: &'a http::Extensions,
    metadata: &'a MetadataMap,
) -> Result<&'a str, BudgetError> {
    crate::auth::tenant_of(extensions, metadata.as_ref())
}

/// The class of a wire `ErrorClass`; unspecified and unknown numbers are the
/// reference's `unknown_error_class`.
pub(super) fn error_class(value: i32) -> Result<ErrorClass, BudgetError> {
    match pb::ErrorClass::try_from(value) {
        Ok(pb::ErrorClass::Transient) => Ok(ErrorClass::Transient),
        Ok(pb::ErrorClass::Permanent) => Ok(ErrorClass::Permanent),
        Ok(pb::ErrorClass::Unknown) => Ok(ErrorClass::Unknown),
        Ok(pb::ErrorClass::Unspecified) | Err(_) => Err(BudgetError::UnknownErrorClass),
    }
}

/// The raw failure of a wire `ErrorDetail`, for the classifier.
pub(super) fn failure<'a>(d: &pb::ErrorDetail, tenant: &'a str) -> Failure<'a> {
    Failure {
        http_status: u16::try_from(d.http_status).ok().filter(|&s| s != 0),
        grpc_code: d.grpc_code,
        network: match pb::NetworkFailure::try_from(d.network_failure) {
            Ok(pb::NetworkFailure::Dns) => Some(NetworkFailure::Dns),
            Ok(pb::NetworkFailure::ConnectionRefused) => Some(NetworkFailure::ConnectionRefused),
            Ok(pb::NetworkFailure::ConnectTimeout) => Some(NetworkFailure::ConnectTimeout),
            Ok(pb::NetworkFailure::Tls) => Some(NetworkFailure::Tls),
            Ok(pb::NetworkFailure::ConnectionReset) => Some(NetworkFailure::ConnectionReset),
            Ok(pb::NetworkFailure::ConnectionClosed) => Some(NetworkFailure::ConnectionClosed),
            Ok(pb::NetworkFailure::Timeout) => Some(NetworkFailure::Timeout),
            // A kind this version does not know is still a network failure.
            Ok(pb::NetworkFailure::Other) | Err(_) => Some(NetworkFailure::Other),
            Ok(pb::NetworkFailure::Unspecified) => None,
        },
        safety: match pb::Safety::try_from(d.safety) {
            Ok(pb::Safety::ReadOnly) => Safety::ReadOnly,
            Ok(pb::Safety::Idempotent) => Safety::Idempotent,
            Ok(pb::Safety::NonIdempotent) => Safety::NonIdempotent,
            Ok(pb::Safety::Unspecified) | Err(_) => Safety::Unspecified,
        },
        reached: match pb::Reach::try_from(d.reached) {
            Ok(pb::Reach::NotSent) => Reach::NotSent,
            Ok(pb::Reach::MayHaveReached) => Reach::MayHaveReached,
            Ok(pb::Reach::Unspecified) | Err(_) => Reach::Unknown,
        },
        tenant,
    }
}

/// The server's hints of a wire `ErrorDetail`; `None` when it carries none.
pub(super) fn raw_hints(d: &pb::ErrorDetail) -> Option<RawHints<'_>> {
    let raw = RawHints {
        retry_after: &d.retry_after,
        date: &d.date,
        grpc_retry_pushback_ms: d.grpc_retry_pushback_ms,
        retry_info_delay: d.retry_info_delay.map(|d| RetryInfoDelay {
            seconds: d.seconds,
            nanos: d.nanos,
        }),
    };
    let given = !raw.retry_after.trim().is_empty()
        || raw.grpc_retry_pushback_ms.is_some()
        || raw.retry_info_delay.is_some();
    given.then_some(raw)
}

impl From<&Hint> for pb::ServerHint {
    fn from(h: &Hint) -> Self {
        Self {
            delay_ms: h.delay_ms,
            source: h.source.map(|s| s.as_str().to_owned()).unwrap_or_default(),
            capped: h.capped,
            do_not_retry: h.do_not_retry,
            ignored: h.ignored.codes().map(str::to_owned).collect(),
        }
    }
}

pub(super) fn error_class_to_pb(class: ErrorClass) -> pb::ErrorClass {
    match class {
        ErrorClass::Transient => pb::ErrorClass::Transient,
        ErrorClass::Permanent => pb::ErrorClass::Permanent,
        ErrorClass::Unknown => pb::ErrorClass::Unknown,
    }
}

pub(super) fn resolution(value: i32) -> Result<Resolution, BudgetError> {
    match pb::Resolution::try_from(value) {
        Ok(pb::Resolution::Fail) => Ok(Resolution::Fail),
        Ok(pb::Resolution::Retry) => Ok(Resolution::Retry),
        Ok(pb::Resolution::Unspecified) | Err(_) => Err(BudgetError::UnknownResolution),
    }
}

pub(super) fn action_to_pb(action: Action) -> pb::Action {
    match action {
        Action::ScheduleRetry => pb::Action::ScheduleRetry,
        Action::AttemptsExhausted => pb::Action::AttemptsExhausted,
        Action::DeadlineExceeded => pb::Action::DeadlineExceeded,
        Action::FailPermanent => pb::Action::FailPermanent,
        Action::ManualReview => pb::Action::ManualReview,
        Action::Deferred => pb::Action::Deferred,
    }
}

pub(super) fn status_to_pb(status: Status) -> pb::ActivityStatus {
    match status {
        Status::Open => pb::ActivityStatus::Open,
        Status::Parked => pb::ActivityStatus::Parked,
        Status::Closed => pb::ActivityStatus::Closed,
    }
}

/// The unix milliseconds of the client's timestamp in `field`, if sent,
/// as the core checks it (see [`crate::budget::timestamp`]) against the
/// server's clock `now_ms`.
pub(super) fn client_time(
    ts: Option<&Timestamp>,
    field: &'static str,
    now_ms: i64,
    bounds: &TimeBounds,
) -> Result<Option<i64>, BudgetError> {
    ts.map(|ts| timestamp::check(ts.seconds, ts.nanos, field, now_ms, bounds))
        .transpose()
}

/// The timestamp of unix milliseconds.
pub(super) fn timestamp(ms: i64) -> Timestamp {
    Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

impl From<pb::Policy> for Policy {
    fn from(p: pb::Policy) -> Self {
        Self {
            max_attempts: p.max_attempts,
            deadline_seconds: p.deadline_seconds,
            base: p.base,
            cap: p.cap,
        }
    }
}

impl From<Policy> for pb::Policy {
    fn from(p: Policy) -> Self {
        Self {
            max_attempts: p.max_attempts,
            deadline_seconds: p.deadline_seconds,
            base: p.base,
            cap: p.cap,
        }
    }
}

impl From<&Event> for pb::ActivityEvent {
    fn from(e: &Event) -> Self {
        Self {
            kind: e.kind.as_str().to_owned(),
            attempt: e.attempt,
            error_class: e
                .class
                .map_or(pb::ErrorClass::Unspecified, error_class_to_pb)
                as i32,
            occurred_at: Some(timestamp(e.occurred_at_ms)),
            occurred_at_stamped: e.occurred_at_stamped,
            elapsed_seconds: e.elapsed_ms / 1000,
            backoff_ms: e.backoff_ms,
            delay_seconds: e.delay_seconds,
            delay_ms: e.delay_ms,
            not_before: e.not_before_ms.map(timestamp),
            action: e.action.map_or(pb::Action::Unspecified, action_to_pb) as i32,
            code: e.code.clone(),
            reason: e.reason.clone(),
            token_taken: e.payment.is_token(),
            slot_booked: e.payment.place().is_some(),
            waiting_since: e.payment.place().map(timestamp),
            recorded_at: Some(timestamp(e.recorded_at_ms)),
            defer_reason: e.defer_reason.clone().unwrap_or_default(),
            rule: e.rule.clone().unwrap_or_default(),
            hint: e.hint.as_ref().map(pb::ServerHint::from),
            dependency: dependency_of(e),
        }
    }
}

/// The dependency a decision names, "default" when its report named none;
/// empty for other events.
fn dependency_of(e: &Event) -> String {
    match (&e.dependency, e.kind) {
        (Some(name), _) => name.clone(),
        (None, EventKind::Decision) => DEFAULT_DEPENDENCY.to_owned(),
        (None, _) => String::new(),
    }
}

impl From<ActivityRecord> for pb::Activity {
    fn from(r: ActivityRecord) -> Self {
        Self {
            events: r
                .events
                .iter()
                .map(|e| pb::ActivityEvent::from(&**e))
                .collect(),
            tenant: r.tenant,
            activity_id: r.activity_id,
            workflow_id: r.workflow_id,
            policy: Some(r.policy.into()),
            started_at: Some(timestamp(r.started_at_ms)),
            attempts: r.attempts,
            status: status_to_pb(r.status) as i32,
            closed_code: r.closed_code.unwrap_or_default(),
            closed_at: r.closed_at_ms.map(timestamp),
            reservation_not_before: r.deferral.map(|d| timestamp(d.not_before_ms)),
        }
    }
}

/// A decision as `NextAction` answers it: the event, moved, as the call
/// answered with it sees it (`replayed`, `dry_run`: see
/// [`Event::taken_by_this_call`]).
pub(super) fn decision(e: Event, replayed: bool, dry_run: bool) -> pb::NextActionResponse {
    debug_assert_eq!(e.kind, EventKind::Decision);
    let token_taken = e.taken_by_this_call(replayed, dry_run);
    let place = e
        .payment
        .place()
        .filter(|_| e.place_held_for_caller(dry_run));
    pb::NextActionResponse {
        dependency_untracked: e.dependency_untracked,
        waiting_since: place.map(timestamp),
        dependency: dependency_of(&e),
        action: e.action.map_or(pb::Action::Unspecified, action_to_pb) as i32,
        code: e.code,
        delay_seconds: e.delay_seconds,
        delay_ms: e.delay_ms,
        not_before: e.not_before_ms.map(timestamp),
        replayed,
        reason: e.reason,
        attempt: e.attempt,
        policy: None,
        policy_conflict: false,
        class_conflict: false,
        dry_run,
        error_class: e
            .class
            .map_or(pb::ErrorClass::Unspecified, error_class_to_pb) as i32,
        hint: e.hint.as_ref().map(pb::ServerHint::from),
        rule: e.rule.unwrap_or_default(),
        // A retry with a reason to defer is one shadow mode let go.
        would_defer: e.action == Some(Action::ScheduleRetry) && e.defer_reason.is_some(),
        token_taken,
        slot_booked: place.is_some(),
        defer_reason: e.defer_reason.unwrap_or_default(),
    }
}

/// A durable decision: the recorded event (shared with the record just
/// saved, or the stored one for a replay) and what the ledger says of it.
pub(super) fn durable_decision(d: Decided, dry_run: bool) -> pb::NextActionResponse {
    pb::NextActionResponse {
        policy: Some(d.policy.into()),
        policy_conflict: d.policy_conflict,
        class_conflict: d.class_conflict,
        ..decision(
            std::sync::Arc::unwrap_or_clone(d.event),
            d.replayed,
            dry_run,
        )
    }
}

/// A dependency's pace as `ReportTraffic` answers it.
pub(super) fn pace_to_pb(d: crate::bucket::DependencyStats) -> pb::DependencyPace {
    let state = d.pace.evidence.state.as_str().to_owned();
    pb::DependencyPace {
        explanation: d.pace.to_string(),
        dependency: d.name,
        allowed_rate: d.pace.allowed,
        success_rate: d.success_rate,
        ratio: d.pace.ratio,
        rule: state.clone(),
        state,
        earned_rate: d.pace.earned,
        window_retries_granted: d.pace.evidence.granted,
        window_retries_failed: d.pace.evidence.retries_failed,
        untracked: !d.pace.tracked,
        replica_rate: d.local_rate,
        calls: d.counters.calls,
        successes: d.counters.successes,
        failures: d.counters.failures,
        retries_admitted: d.counters.admitted,
        retries_deferred: d.counters.deferred,
    }
}

/// What a `NextAction` answer says, for the metrics.
pub(super) fn decision_labels(response: &pb::NextActionResponse) -> DecisionLabels<'_> {
    fn non_empty(s: &str) -> Option<&str> {
        (!s.is_empty()).then_some(s)
    }
    DecisionLabels {
        action: pb::Action::try_from(response.action)
            .map_or("ACTION_UNSPECIFIED", |a| a.as_str_name()),
        code: &response.code,
        defer_reason: non_empty(&response.defer_reason).filter(|_| !response.would_defer),
        would_defer: non_empty(&response.defer_reason).filter(|_| response.would_defer),
        replayed: response.replayed,
        policy_conflict: response.policy_conflict,
        class_conflict: response.class_conflict,
    }
}

/// The trace id of a W3C `traceparent` header
/// (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`), when the
/// request has a valid one; an all-zero id is not one.
pub(super) fn trace_id(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    let header = metadata.get("traceparent")?.to_str().ok()?;
    let mut parts = header.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && hex(flags, 2);
    valid.then_some(trace)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_traceparent_gives_its_trace_id_and_a_malformed_one_none() {
        let with = |value: &str| {
            let mut metadata = tonic::metadata::MetadataMap::new();
            metadata.insert("traceparent", value.parse().unwrap());
            super::trace_id(&metadata).map(str::to_owned)
        };
        assert_eq!(
            with("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "nonsense",
        ] {
            assert_eq!(with(bad), None, "{bad}");
        }
    }

    use super::*;

    #[test]
    fn timestamps_round_trip_including_before_1970() {
        let loose = TimeBounds {
            max_past: std::time::Duration::MAX,
            max_future: std::time::Duration::MAX,
        };
        for ms in [0, 1, 999, 1000, -1, -999, -1001, 1_700_000_000_123] {
            let read = client_time(Some(&timestamp(ms)), "t", 0, &loose).unwrap();
            assert_eq!(read, Some(ms));
        }
    }

    #[test]
    fn unknown_enum_numbers_are_unknown_error_class() {
        for v in [0, 4, -1, 99] {
            assert_eq!(error_class(v), Err(BudgetError::UnknownErrorClass));
        }
    }
}
