//! An activity's durable record: its policy, where it stands, and every
//! decision and transition with the inputs that made it. The state machine
//! in [`super::activity`] produces new versions of it; the store keeps them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::action::{Action, ErrorClass};
use super::decision::Deadline;
use super::delay::{DEFAULT_BASE, DEFAULT_CAP, DelayParams};
use super::hint::Hint;
use super::token::Payment;

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
    /// How the retry is paid: a token taken now (granted, or the
    /// activity's turn in line came), a place in line (a deferral), or
    /// nothing.
    #[serde(default)]
    pub payment: Payment,
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
    /// The dependency the failed call went to, when the report named one
    /// (decisions only; `None` is the default dependency).
    #[serde(default)]
    pub dependency: Option<String>,
    /// The dependency was not tracked on its own when this was decided.
    #[serde(default)]
    pub dependency_untracked: bool,
    /// When the service recorded it, unix milliseconds (audit only).
    pub recorded_at_ms: i64,
}

impl Event {
    /// Whether the call answered with this event took a token itself: not
    /// a replay (which returns a decision taken before, whose token was
    /// that call's), and not a dry run (which takes nothing). The recorded
    /// event keeps its own payment: its history.
    pub fn taken_by_this_call(&self, replayed: bool, dry_run: bool) -> bool {
        self.payment.is_token() && !replayed && !dry_run
    }

    /// Whether the call answered with this event holds a place in line: a
    /// deferral that took one, answered now or replayed while it is
    /// pending; never a dry run's.
    pub fn place_held_for_caller(&self, dry_run: bool) -> bool {
        self.payment.place().is_some() && !dry_run
    }
}

/// A pending deferral of an activity's retry. Asked again before
/// `not_before_ms`, the same attempt gets the same deferral without touching
/// the budget (no busy loop, no write). At or after it, the attempt is
/// decided afresh, keeping its place in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deferral {
    /// The attempt that was deferred.
    pub attempt: u32,
    /// When to ask again, unix milliseconds (service clock).
    pub not_before_ms: i64,
    /// Its place in line: the time of its first deferral, unix
    /// milliseconds; `None` when it holds none (the line was full).
    #[serde(default)]
    pub waiting_since_ms: Option<i64>,
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
    /// A pending deferral, if any.
    #[serde(default)]
    pub deferral: Option<Deferral>,
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
            Status::Open => Some(self.deadline().at_ms()),
            Status::Parked => None,
        }
    }

    /// When no retry of the activity may start any more.
    pub fn deadline(&self) -> Deadline {
        Deadline {
            started_at_ms: self.started_at_ms,
            seconds: self.policy.deadline_seconds,
        }
    }

    /// The recorded decision of `attempt`, if it was decided.
    pub(super) fn decision_of(&self, attempt: u32) -> Option<&Arc<Event>> {
        self.events.iter().rev().find(|e| {
            e.kind == EventKind::Decision
                && e.attempt == attempt
                && e.action != Some(Action::Deferred)
        })
    }

    /// The latest deferral of `attempt`, if any.
    pub(super) fn deferral_of(&self, attempt: u32) -> Option<&Arc<Event>> {
        self.events.iter().rev().find(|e| {
            e.kind == EventKind::Decision
                && e.attempt == attempt
                && e.action == Some(Action::Deferred)
        })
    }

    pub(super) fn close(&mut self, code: &str, now_ms: i64) {
        self.status = Status::Closed;
        self.closed_code = Some(code.to_owned());
        self.closed_at_ms = Some(now_ms);
        self.deferral = None;
    }
}
