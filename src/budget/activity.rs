//! The durable activity: the state machine that owns an activity's attempt
//! budget, so that a worker restart can never reset it.
//!
//! Everything here is pure. [`plan`] takes the recorded activity (if any), a
//! failure [`Report`] and the service's clock reading `now_ms` (used only to
//! stamp a missing time, which is then recorded), and returns either the
//! recorded decision to replay or a [`Draft`]: the new decision and the new
//! record, waiting for the global retry token. The caller settles the token
//! ([`Draft::grant`], [`Draft::defer`]), makes the record durable, and only
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

use serde::{Deserialize, Serialize};

use super::action::{Action, Budget, ErrorClass, explain, next_action};
use super::codes;
use super::delay::{DEFAULT_BASE, DEFAULT_CAP, DelayParams, retry_delay};
use super::hint::{Hint, RawHints, normalize};

/// The longest activity or workflow id, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// The longest tenant id, in bytes.
pub const MAX_TENANT_BYTES: usize = 128;
/// The tenant of requests that name none.
pub const DEFAULT_TENANT: &str = "default";

/// A request the core refuses. Each variant has a stable [`code`](Self::code)
/// and a [`kind`](Self::kind) that the gRPC edge maps to a status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// Attempt numbers start at 1.
    #[error("{}: attempt must be at least 1", codes::ATTEMPT_MUST_BE_POSITIVE)]
    AttemptMustBePositive,
    /// The class is not transient, permanent or unknown.
    #[error(
        "{}: the error class must be transient, permanent or unknown",
        codes::UNKNOWN_ERROR_CLASS
    )]
    UnknownErrorClass,
    /// An empty activity id.
    #[error("{}: activity_id must not be empty", codes::EMPTY_ACTIVITY_ID)]
    EmptyActivityId,
    /// An activity id over [`MAX_ID_BYTES`].
    #[error(
        "{}: activity_id is {len} bytes, at most {MAX_ID_BYTES} allowed",
        codes::ACTIVITY_ID_TOO_LONG
    )]
    ActivityIdTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// An activity id with a control character.
    #[error(
        "{}: activity_id has a control character at byte {at}",
        codes::ACTIVITY_ID_CONTROL_CHARACTER
    )]
    ActivityIdControlCharacter {
        /// Byte offset of the first one.
        at: usize,
    },
    /// A tenant id that is empty, too long or not printable ASCII.
    #[error(
        "{}: x-tenant-id must be 1 to {MAX_TENANT_BYTES} printable ASCII characters",
        codes::INVALID_TENANT
    )]
    InvalidTenant,
    /// A workflow id that is too long or has a control character.
    #[error(
        "{}: workflow_id must be at most {MAX_ID_BYTES} bytes without control characters",
        codes::INVALID_WORKFLOW_ID
    )]
    InvalidWorkflowId,
    /// A timestamp the service cannot represent in milliseconds.
    #[error("{}: {field} is out of range", codes::INVALID_TIMESTAMP)]
    InvalidTimestamp {
        /// The field that holds it.
        field: &'static str,
    },
    /// A failure reported before the activity's first failure.
    #[error(
        "{}: occurred_at {occurred_at_ms} ms is before the activity's started_at {started_at_ms} ms",
        codes::OCCURRED_BEFORE_START
    )]
    OccurredBeforeStart {
        /// The report's logical time.
        occurred_at_ms: i64,
        /// The activity's recorded start.
        started_at_ms: i64,
    },
    /// A resolution that is neither fail nor retry.
    #[error("{}: resolution must be fail or retry", codes::UNKNOWN_RESOLUTION)]
    UnknownResolution,
    /// A report that skips attempts.
    #[error(
        "{}: expected attempt {expected} (or an earlier one to replay), got {got}",
        codes::ATTEMPT_OUT_OF_ORDER
    )]
    AttemptOutOfOrder {
        /// The next attempt the activity expects.
        expected: u32,
        /// The attempt reported.
        got: u32,
    },
    /// A new report for a closed activity.
    #[error(
        "{}: the activity was closed with {code} after attempt {attempts}",
        codes::ACTIVITY_CLOSED
    )]
    ActivityClosed {
        /// The code that closed it.
        code: String,
        /// Its last recorded attempt.
        attempts: u32,
    },
    /// A new report for an activity parked for manual review.
    #[error(
        "{}: attempt {attempts} is waiting for manual review; resolve it first",
        codes::ACTIVITY_PARKED
    )]
    ActivityParked {
        /// The attempt that was parked.
        attempts: u32,
    },
    /// A resolution for an activity that is not parked.
    #[error(
        "{}: only an activity parked for manual review can be resolved; this one is {status}",
        codes::ACTIVITY_NOT_PARKED
    )]
    ActivityNotParked {
        /// Where it stands.
        status: &'static str,
    },
    /// An activity the store does not hold.
    #[error(
        "{}: no activity {activity_id:?} for tenant {tenant:?}",
        codes::ACTIVITY_NOT_FOUND
    )]
    ActivityNotFound {
        /// The tenant asked for.
        tenant: String,
        /// The activity asked for.
        activity_id: String,
    },
}

/// How the gRPC edge should report a [`BudgetError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is malformed.
    InvalidArgument,
    /// The request is well formed but contradicts what is stored.
    FailedPrecondition,
    /// The request names something that does not exist.
    NotFound,
}

impl BudgetError {
    /// The stable code that starts the message.
    pub fn code(&self) -> &'static str {
        match self {
            Self::AttemptMustBePositive => codes::ATTEMPT_MUST_BE_POSITIVE,
            Self::UnknownErrorClass => codes::UNKNOWN_ERROR_CLASS,
            Self::EmptyActivityId => codes::EMPTY_ACTIVITY_ID,
            Self::ActivityIdTooLong { .. } => codes::ACTIVITY_ID_TOO_LONG,
            Self::ActivityIdControlCharacter { .. } => codes::ACTIVITY_ID_CONTROL_CHARACTER,
            Self::InvalidTenant => codes::INVALID_TENANT,
            Self::InvalidWorkflowId => codes::INVALID_WORKFLOW_ID,
            Self::InvalidTimestamp { .. } => codes::INVALID_TIMESTAMP,
            Self::OccurredBeforeStart { .. } => codes::OCCURRED_BEFORE_START,
            Self::UnknownResolution => codes::UNKNOWN_RESOLUTION,
            Self::AttemptOutOfOrder { .. } => codes::ATTEMPT_OUT_OF_ORDER,
            Self::ActivityClosed { .. } => codes::ACTIVITY_CLOSED,
            Self::ActivityParked { .. } => codes::ACTIVITY_PARKED,
            Self::ActivityNotParked { .. } => codes::ACTIVITY_NOT_PARKED,
            Self::ActivityNotFound { .. } => codes::ACTIVITY_NOT_FOUND,
        }
    }

    /// Which kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::AttemptOutOfOrder { .. }
            | Self::ActivityClosed { .. }
            | Self::ActivityParked { .. }
            | Self::ActivityNotParked { .. } => ErrorKind::FailedPrecondition,
            Self::ActivityNotFound { .. } => ErrorKind::NotFound,
            _ => ErrorKind::InvalidArgument,
        }
    }
}

/// Checks an activity id: 1 to [`MAX_ID_BYTES`] bytes, no control character.
///
/// # Errors
/// The matching [`BudgetError`] variant.
pub fn validate_activity_id(id: &str) -> Result<(), BudgetError> {
    if id.is_empty() {
        return Err(BudgetError::EmptyActivityId);
    }
    if id.len() > MAX_ID_BYTES {
        return Err(BudgetError::ActivityIdTooLong { len: id.len() });
    }
    if let Some((at, _)) = id.char_indices().find(|(_, c)| c.is_control()) {
        return Err(BudgetError::ActivityIdControlCharacter { at });
    }
    Ok(())
}

/// Checks a tenant id: 1 to [`MAX_TENANT_BYTES`] printable ASCII characters.
///
/// # Errors
/// [`BudgetError::InvalidTenant`].
pub fn validate_tenant(tenant: &str) -> Result<(), BudgetError> {
    let printable = tenant.bytes().all(|b| b.is_ascii_graphic());
    if tenant.is_empty() || tenant.len() > MAX_TENANT_BYTES || !printable {
        return Err(BudgetError::InvalidTenant);
    }
    Ok(())
}

/// Checks a workflow id: at most [`MAX_ID_BYTES`] bytes, no control
/// character (empty is allowed: the field is optional).
///
/// # Errors
/// [`BudgetError::InvalidWorkflowId`].
pub fn validate_workflow_id(id: &str) -> Result<(), BudgetError> {
    if id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
        return Err(BudgetError::InvalidWorkflowId);
    }
    Ok(())
}

/// An activity's retry policy, snapshotted on its first report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    /// Attempts allowed in all, the first one included.
    pub max_attempts: u32,
    /// Seconds after `started_at` when nothing may be retried any more.
    pub deadline_seconds: u64,
    /// Backoff base in seconds; `None` means the reference's 2.
    pub base: Option<u32>,
    /// Backoff cap in seconds; `None` means the reference's 60.
    pub cap: Option<u32>,
}

impl Policy {
    /// The backoff parameters, with the reference's defaults filled in.
    pub fn delay_params(&self) -> DelayParams {
        DelayParams {
            base: self.base.unwrap_or(DEFAULT_BASE),
            cap: self.cap.unwrap_or(DEFAULT_CAP),
        }
    }

    /// The policy with its unset fields (0, as proto3 sends an absent
    /// number) taken from `defaults`: a deadline or an attempt budget of 0
    /// would stop every activity at its first failure, which no caller means.
    pub fn or_defaults(self, defaults: Policy) -> Policy {
        Policy {
            max_attempts: if self.max_attempts == 0 {
                defaults.max_attempts
            } else {
                self.max_attempts
            },
            deadline_seconds: if self.deadline_seconds == 0 {
                defaults.deadline_seconds
            } else {
                self.deadline_seconds
            },
            base: self.base.or(defaults.base),
            cap: self.cap.or(defaults.cap),
        }
    }

    /// The deadline in milliseconds after `started_at`, saturating.
    fn deadline_ms(&self) -> i64 {
        i64::try_from(self.deadline_seconds.saturating_mul(1000)).unwrap_or(i64::MAX)
    }
}

/// Where an activity stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Status {
    /// Failed reports may still be retried.
    Open,
    /// Parked by `manual_review` until a person resolves it.
    Parked,
    /// Closed for good; see [`ActivityRecord::closed_code`].
    Closed,
}

impl Status {
    /// A lowercase name for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Parked => "parked",
            Self::Closed => "closed",
        }
    }
}

/// What an [`Event`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// A decision on a failure report.
    Decision,
    /// A success closed the activity.
    Success,
    /// A reviewer resolved a parked activity.
    Resolution,
}

impl EventKind {
    /// A lowercase name for people.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Decision => "decision",
            Self::Success => "success",
            Self::Resolution => "resolution",
        }
    }
}

/// One recorded decision or transition, with every input that made it, so
/// `GetActivity` can explain it without logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The attempt it is about.
    pub attempt: u32,
    /// The failure's class (decisions only).
    pub class: Option<ErrorClass>,
    /// The logical time of the failure or success, unix milliseconds.
    pub occurred_at_ms: i64,
    /// True when the service stamped `occurred_at_ms` with its clock.
    pub occurred_at_stamped: bool,
    /// Logical milliseconds from `started_at` to `occurred_at`.
    pub elapsed_ms: u64,
    /// The reference backoff of this attempt, before any hint.
    pub backoff_ms: u64,
    /// The chosen delay, whole seconds (the reference result).
    pub delay_seconds: u32,
    /// The chosen delay, milliseconds.
    pub delay_ms: u64,
    /// The earliest start of the next attempt, unix milliseconds.
    pub not_before_ms: Option<i64>,
    /// The action decided (decisions only).
    pub action: Option<Action>,
    /// The stable code: an action code or a transition code.
    pub code: String,
    /// Why, for people.
    pub reason: String,
    /// Whether a global retry token was taken (or reserved) for it.
    pub token_taken: bool,
    /// Why the retry was deferred, a stable code (deferrals only).
    #[serde(default)]
    pub defer_reason: Option<String>,
    /// The classification rule that gave the class, when the service
    /// classified a raw failure.
    #[serde(default)]
    pub rule: Option<String>,
    /// The server's hints, normalised, when the report carried any.
    #[serde(default)]
    pub hint: Option<Hint>,
    /// When the service recorded it, unix milliseconds (audit only).
    pub recorded_at_ms: i64,
}

/// A pending deferral of an activity's retry. Asked again before
/// `not_before_ms`, the same attempt gets the same deferral without touching
/// the bucket (no busy loop). At or after it, a booked slot pays for the
/// retry without asking the bucket again; an unbooked one asks the bucket
/// anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The attempt that was deferred.
    pub attempt: u32,
    /// When to ask again, unix milliseconds (service clock).
    pub not_before_ms: i64,
    /// Whether a global token is booked for that time.
    #[serde(default)]
    pub booked: bool,
}

/// Identifies an activity: tenants never share one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActivityKey {
    /// The owning tenant.
    pub tenant: String,
    /// The activity's id within the tenant.
    pub activity_id: String,
}

/// An activity's durable state: the budget and its whole history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivityRecord {
    /// The owning tenant.
    pub tenant: String,
    /// The activity's id.
    pub activity_id: String,
    /// The workflow named on the first report (may be empty).
    pub workflow_id: String,
    /// The policy snapshot of the first report.
    pub policy: Policy,
    /// `occurred_at` of the first report, unix milliseconds.
    pub started_at_ms: i64,
    /// The last attempt decided (deferrals do not count).
    pub attempts: u32,
    /// Where it stands.
    pub status: Status,
    /// What closed it: an action code, `succeeded` or `resolved_failed`.
    pub closed_code: Option<String>,
    /// When it was closed, unix milliseconds (service clock).
    pub closed_at_ms: Option<i64>,
    /// A slot booked by a deferral, if one is pending.
    #[serde(default)]
    pub reservation: Option<Reservation>,
    /// Every decision and transition, oldest first. Shared, not copied, by
    /// the copies of a record: each decision extends a copy of the stored
    /// version (which the store keeps until the new one is durable), and an
    /// event is returned to the caller as it is recorded.
    pub events: Vec<Arc<Event>>,
}

impl ActivityRecord {
    /// The key the record is stored under.
    pub fn key(&self) -> ActivityKey {
        ActivityKey {
            tenant: self.tenant.clone(),
            activity_id: self.activity_id.clone(),
        }
    }

    /// From when the record may be purged, before the retention period is
    /// added: its closing time; for an open activity, its deadline (after
    /// which it can never be retried again). `None` while it is parked:
    /// a person still has to look at it.
    pub fn purgeable_from_ms(&self) -> Option<i64> {
        match self.status {
            Status::Closed => self.closed_at_ms,
            Status::Open => Some(self.started_at_ms.saturating_add(self.policy.deadline_ms())),
            Status::Parked => None,
        }
    }

    /// The recorded decision of `attempt`, if it was decided.
    fn decision_of(&self, attempt: u32) -> Option<&Arc<Event>> {
        self.events.iter().rev().find(|e| {
            e.kind == EventKind::Decision
                && e.attempt == attempt
                && e.action != Some(Action::Deferred)
        })
    }

    /// The latest deferral of `attempt`, if any.
    fn deferral_of(&self, attempt: u32) -> Option<&Arc<Event>> {
        self.events.iter().rev().find(|e| {
            e.kind == EventKind::Decision
                && e.attempt == attempt
                && e.action == Some(Action::Deferred)
        })
    }

    fn close(&mut self, code: &str, now_ms: i64) {
        self.status = Status::Closed;
        self.closed_code = Some(code.to_owned());
        self.closed_at_ms = Some(now_ms);
        self.reservation = None;
    }
}

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

/// A new decision and the record it produces. Settle the token, then
/// [`finish`](Self::finish) it and make the record durable before replying.
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

    /// Records that a token was taken for the retry.
    pub fn grant(&mut self) {
        self.event.token_taken = true;
    }

    /// No token now: the retry is deferred to `slot_ms` (service clock),
    /// where a token is `booked` for this activity, or not (then the bucket
    /// is asked again at that time). The attempt is not consumed. When that
    /// time (or the planned backoff, if later) falls past the deadline, the
    /// decision becomes `deadline_exceeded` instead.
    pub fn defer(&mut self, slot_ms: i64, reason: &str, booked: bool) {
        let planned = self.event.not_before_ms.unwrap_or(slot_ms);
        let not_before = planned.max(slot_ms);
        let deadline = self
            .record
            .started_at_ms
            .saturating_add(self.record.policy.deadline_ms());
        if not_before > deadline {
            self.event.action = Some(Action::DeadlineExceeded);
            self.event.code = codes::DEADLINE_EXCEEDED.to_owned();
            self.event.reason = format!(
                "retry capacity is exhausted ({reason}) until {} after the start, past the {} s deadline",
                seconds(not_before - self.record.started_at_ms),
                self.record.policy.deadline_seconds
            );
            self.event.not_before_ms = None;
            self.event.delay_seconds = 0;
            self.event.delay_ms = 0;
            return;
        }
        self.event.action = Some(Action::Deferred);
        self.event.code = codes::DEFERRED.to_owned();
        self.event.token_taken = booked;
        self.event.defer_reason = Some(reason.to_owned());
        let what = if booked {
            "a slot is booked for this activity"
        } else {
            "no slot could be booked yet; the next turn comes"
        };
        self.event.reason = format!(
            "retry capacity is exhausted ({reason}); {what} {} from now: report attempt {} again then",
            seconds(not_before - self.event.recorded_at_ms),
            self.event.attempt
        );
        self.event.not_before_ms = Some(not_before);
        self.booked = booked;
    }

    /// The latest time a booked slot may come and still let the retry start
    /// before the deadline, as a wait from `now_ms` (0 when already late).
    pub fn max_wait_ms(&self, now_ms: i64) -> i64 {
        self.record
            .started_at_ms
            .saturating_add(self.record.policy.deadline_ms())
            .saturating_sub(now_ms)
            .max(0)
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
    if report.attempt != expected {
        return Err(BudgetError::AttemptOutOfOrder {
            expected,
            got: report.attempt,
        });
    }
    let mut reserved = false;
    if let Some(record) = &existing {
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
    let mut event = Event {
        kind: EventKind::Decision,
        attempt: report.attempt,
        class: Some(report.class),
        occurred_at_ms,
        occurred_at_stamped: report.occurred_at_ms.is_none(),
        elapsed_ms,
        backoff_ms: 0,
        delay_seconds: 0,
        delay_ms: 0,
        not_before_ms: None,
        action: None,
        code: String::new(),
        reason: String::new(),
        token_taken: false,
        defer_reason: None,
        rule: report.rule.map(str::to_owned),
        hint: report
            .hints
            .map(|raw| normalize(&raw, occurred_at_ms, defaults.max_hint_ms)),
        recorded_at_ms: now_ms,
    };
    let mut action = next_action(&budget, report.class);
    if action == Action::ScheduleRetry && event.hint.is_some_and(|h| h.do_not_retry) {
        action = Action::FailPermanent;
        event.reason = format!(
            "the server asked not to retry ({})",
            crate::budget::hint::GRPC_PUSHBACK_DO_NOT_RETRY
        );
    } else if action != Action::ScheduleRetry {
        // A planned retry gets its own reason below, with the delay.
        event.reason = explain(action, &budget);
    }
    if action == Action::ScheduleRetry {
        let planned = plan_delay(
            &key.activity_id,
            report.attempt,
            policy.delay_params(),
            event.hint.as_ref(),
        )?;
        let not_before = occurred_at_ms.saturating_add_unsigned(planned.millis);
        let deadline = record.started_at_ms.saturating_add(policy.deadline_ms());
        event.backoff_ms = planned.backoff_ms;
        if not_before > deadline {
            action = Action::DeadlineExceeded;
            event.reason = format!(
                "the next attempt could start {} after the start{}, past the {} s deadline",
                seconds(not_before - record.started_at_ms),
                if planned.from_hint {
                    " (as the server asked)"
                } else {
                    ""
                },
                policy.deadline_seconds
            );
        } else {
            event.delay_seconds = planned.seconds;
            event.delay_ms = planned.millis;
            event.not_before_ms = Some(not_before);
            event.reason = planned.describe(&budget);
            if reserved {
                event.token_taken = true;
                event
                    .reason
                    .push_str("; paid by the slot booked when it was deferred");
                let slot = record.reservation.map_or(not_before, |r| r.not_before_ms);
                if slot > not_before {
                    event.not_before_ms = Some(slot);
                }
            }
        }
    }
    event.action = Some(action);
    event.code = action.code().to_owned();
    Ok(Plan::Fresh(Draft {
        record,
        event,
        reserved,
        booked: false,
    }))
}

/// A retry's delay: the reference backoff, or the server's hint when it
/// asks for longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedDelay {
    /// The delay in whole seconds (`millis / 1000`).
    pub seconds: u32,
    /// The delay in milliseconds: `max(backoff, hint)`.
    pub millis: u64,
    /// The reference backoff in milliseconds, before any hint.
    pub backoff_ms: u64,
    /// True when the hint was longer than the backoff and decided.
    pub from_hint: bool,
}

impl PlannedDelay {
    /// The reason of a planned retry. Every durable retry writes one, so the
    /// numbers go through `itoa` and the pieces are joined once.
    fn describe(&self, budget: &Budget) -> String {
        // The delay's clause: its words, and the second number in it.
        let (opening, between, closing, second) = if self.from_hint {
            (
                "the server's hint of ",
                " ms, longer than the backoff of ",
                " ms from occurred_at",
                self.backoff_ms,
            )
        } else {
            (
                "backoff ",
                " ms (",
                " s) from occurred_at",
                u64::from(self.seconds),
            )
        };
        let (mut attempts, mut max_attempts) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (mut millis, mut other) = (itoa::Buffer::new(), itoa::Buffer::new());
        [
            "attempt ",
            attempts.format(budget.attempts),
            " of ",
            max_attempts.format(budget.max_attempts),
            " failed transiently; ",
            opening,
            millis.format(self.millis),
            between,
            other.format(second),
            closing,
        ]
        .concat()
    }
}

/// Plans a retry's delay: the reference backoff of `attempt`, or the
/// server's normalised hint when it is longer (`max(backoff, hint)`).
///
/// # Errors
/// [`BudgetError::AttemptMustBePositive`] for attempt 0.
pub fn plan_delay(
    activity_id: &str,
    attempt: u32,
    params: DelayParams,
    hint: Option<&Hint>,
) -> Result<PlannedDelay, BudgetError> {
    let backoff = retry_delay(activity_id, attempt, params)
        .map_err(|_| BudgetError::AttemptMustBePositive)?;
    let hinted = hint.map_or(0, |h| h.delay_ms);
    Ok(if hinted > backoff.millis {
        PlannedDelay {
            seconds: u32::try_from(hinted / 1000).unwrap_or(u32::MAX),
            millis: hinted,
            backoff_ms: backoff.millis,
            from_hint: true,
        }
    } else {
        PlannedDelay {
            seconds: backoff.seconds,
            millis: backoff.millis,
            backoff_ms: backoff.millis,
            from_hint: false,
        }
    })
}

/// Milliseconds as seconds with three decimals, for reasons people read.
fn seconds(ms: i64) -> String {
    format!("{}.{:03} s", ms / 1000, (ms % 1000).abs())
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
        defer_reason: None,
        rule: None,
        hint: None,
        recorded_at_ms: now_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planned_retry_reads_as_the_sentence_it_always_was() {
        let budget = Budget {
            attempts: 2,
            max_attempts: 5,
            elapsed: 7,
            deadline: 30,
        };
        let backoff = PlannedDelay {
            seconds: 4,
            millis: 4_250,
            backoff_ms: 4_250,
            from_hint: false,
        };
        assert_eq!(
            backoff.describe(&budget),
            "attempt 2 of 5 failed transiently; backoff 4250 ms (4 s) from occurred_at"
        );
        let hinted = PlannedDelay {
            seconds: 120,
            millis: 120_000,
            backoff_ms: 4_250,
            from_hint: true,
        };
        assert_eq!(
            hinted.describe(&budget),
            "attempt 2 of 5 failed transiently; the server's hint of 120000 ms, \
             longer than the backoff of 4250 ms from occurred_at"
        );
    }
}
