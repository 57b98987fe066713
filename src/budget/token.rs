//! Global retry tokens as the core sees them: one [`Admission`] type for
//! every answer about a token, and the [`TokenGate`] a decision asks.
//!
//! The bucket (`crate::bucket`) implements the gate; the core only decides
//! what a granted, deferred or refused token means for a decision (see
//! [`super::decision::settle`]), so that the pure and the durable
//! `NextAction` read the same answer the same way.

use std::time::Duration;

#[cfg(doc)]
use super::codes::{
    GLOBAL_CAPACITY_EXHAUSTED, RESERVATION_PAST_MAX_WAIT, TENANT_BACKLOG_FULL,
    TENANT_SHARE_EXHAUSTED,
};

/// The answer to a request for a retry token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admission {
    /// A token is taken now: retry.
    Granted,
    /// No token now: the tenant's next free slot is booked for this request,
    /// `wait` from now. Asked again then, the same retry is granted without
    /// asking the bucket: the token is already counted.
    Deferred {
        /// How long until the booked slot.
        wait: Duration,
        /// Why: [`TENANT_SHARE_EXHAUSTED`] or [`GLOBAL_CAPACITY_EXHAUSTED`].
        reason: &'static str,
    },
    /// No token now and no slot booked: ask the bucket again after
    /// `retry_after`. Nothing is promised, but the wait is the request's
    /// turn in the tenant's queue of refused requests (one share interval
    /// after the previous turn), so it usually finds a slot then, and
    /// refused requests do not come back together. With reason
    /// [`RESERVATION_PAST_MAX_WAIT`], the request takes no turn:
    /// `retry_after` is when its slot or turn would have come.
    Refused {
        /// When to ask again.
        retry_after: Duration,
        /// Why: [`TENANT_BACKLOG_FULL`], [`GLOBAL_CAPACITY_EXHAUSTED`] or
        /// [`RESERVATION_PAST_MAX_WAIT`].
        reason: &'static str,
    },
    /// Shadow mode: the bucket would have deferred or refused the retry for
    /// `reason`, and lets it go now instead. Nothing is booked for it; the
    /// bucket counted the admission as it would have made it.
    WouldDefer {
        /// Why it would have been deferred.
        reason: &'static str,
    },
}

impl Admission {
    /// What shadow mode makes of an answer: a deferral or a refusal becomes
    /// [`Admission::WouldDefer`], with its reason.
    pub fn shadowed(self) -> Self {
        match self {
            Self::Granted | Self::WouldDefer { .. } => self,
            Self::Deferred { reason, .. } | Self::Refused { reason, .. } => {
                Self::WouldDefer { reason }
            }
        }
    }
}

/// The dependency of a report that names none.
pub const DEFAULT_DEPENDENCY: &str = "default";

/// Which part of a dependency's pace rule set its allowed rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PaceRule {
    /// A share of its successes.
    Ratio,
    /// Its floor: the share of its successes was less.
    Floor,
    /// Its ceiling: the share of its successes was more.
    Ceiling,
    /// A static rate pinned by the configuration.
    Static,
}

/// A dependency's retry budget as it stood when a retry asked it: what the
/// decision's explanation quotes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    /// Retries a second allowed to the dependency (fleet-wide on
    /// PostgreSQL).
    pub allowed: f64,
    /// Its successes a second over its window (fleet-wide on PostgreSQL).
    pub successes: f64,
    /// The share of successes its rule allows as retries.
    pub ratio: f64,
    /// What set `allowed`.
    pub rule: PaceRule,
}

/// A gate's answer: the admission, and the pace of the dependency when its
/// budget, not the global one, deferred or refused the retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    /// Granted, deferred, refused, or let through by shadow mode.
    pub admission: Admission,
    /// The dependency's pace, when its budget deferred or refused.
    pub pace: Option<Pace>,
}

impl From<Admission> for Answer {
    fn from(admission: Admission) -> Self {
        Self {
            admission,
            pace: None,
        }
    }
}

/// Hands out retry tokens: the dependency's and the global one. Asked at
/// most once per decision, and only for a fresh retry.
pub trait TokenGate {
    /// Takes a token for a retry now, or books a slot at most `max_wait`
    /// later (the time left before the activity's deadline).
    fn take(self, max_wait: Duration) -> Answer;
}

/// No gate (no token layer in front of the service): every retry is
/// granted.
impl<G: TokenGate> TokenGate for Option<G> {
    fn take(self, max_wait: Duration) -> Answer {
        self.map_or(Admission::Granted.into(), |gate| gate.take(max_wait))
    }
}

/// A gate that always grants: for callers that enforce no global limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unlimited;

impl TokenGate for Unlimited {
    fn take(self, _max_wait: Duration) -> Answer {
        Admission::Granted.into()
    }
}
