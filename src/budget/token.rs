//! Retry tokens as the core sees them: what a retry asks the budget
//! ([`Ask`]), what the budget answers ([`Admission`], [`Answer`]), how a
//! retry is paid ([`Payment`]), and the [`TokenGate`] a decision asks.
//!
//! The bucket (`crate::bucket`) implements the gate; the core only decides
//! what a granted or deferred token means for a decision (see
//! [`super::decision::settle`]), so that the pure and the durable
//! `NextAction` read the same answer the same way.

use std::time::Duration;

#[cfg(doc)]
use super::codes::{
    DEPENDENCY_BUDGET_EXHAUSTED, GLOBAL_CAPACITY_EXHAUSTED, TENANT_BACKLOG_FULL,
    TENANT_SHARE_EXHAUSTED,
};

/// What a retry asks of its dependency's budget and the global one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// The activity, when the service holds its record: only such a retry
    /// may take a place in line (the place is kept in the record).
    pub activity_id: Option<&'a str>,
    /// The activity's place in line, when it was deferred before: the time
    /// of its first deferral, unix milliseconds.
    pub waiting_since_ms: Option<i64>,
    /// Now, unix milliseconds: the place a first deferral takes.
    pub now_ms: i64,
    /// The retry's planned start, unix milliseconds, when later than now:
    /// a deferred worker comes back no earlier, and its place waits for it
    /// until then.
    pub planned_ms: Option<i64>,
    /// The fresh failure this retry follows, counted as evidence of the
    /// dependency's health before the token is asked for (so that one
    /// visit to the budget does both); `None` for a deferred attempt asked
    /// again, whose failure was counted when it was first deferred.
    pub observed: Option<Observed>,
}

/// The answer to a request for a retry token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admission {
    /// A token is taken now: retry. For an activity waiting in line, its
    /// turn came.
    Granted,
    /// No token now: ask again after `wait`, which is at most the deferral
    /// horizon (`[bucket] max_deferral`, jittered by activity) and no later
    /// than the line's pace allows.
    Deferred {
        /// When to ask again.
        wait: Duration,
        /// Why: [`DEPENDENCY_BUDGET_EXHAUSTED`], [`TENANT_SHARE_EXHAUSTED`],
        /// [`GLOBAL_CAPACITY_EXHAUSTED`] or [`TENANT_BACKLOG_FULL`] (the
        /// line is full: no place taken).
        reason: &'static str,
        /// The activity's place in line (the time of its first deferral,
        /// unix milliseconds), when it holds one.
        waiting_since_ms: Option<i64>,
    },
    /// Shadow mode: the budget would have deferred the retry for `reason`,
    /// and lets it go now instead. Nothing is taken or held for it; the
    /// budget counted the admission as it would have made it.
    WouldDefer {
        /// Why it would have been deferred.
        reason: &'static str,
    },
}

impl Admission {
    /// What shadow mode makes of an answer: a deferral becomes
    /// [`Admission::WouldDefer`], with its reason.
    pub fn shadowed(self) -> Self {
        match self {
            Self::Granted | Self::WouldDefer { .. } => self,
            Self::Deferred { reason, .. } => Self::WouldDefer { reason },
        }
    }
}

/// How a retry is paid: the one place where a decision says whether it
/// holds a token, a place in line, or nothing yet.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum Payment {
    /// Nothing: a stop, a dry run, a shadow-mode retry, a replay, or a
    /// deferral that holds no place.
    #[default]
    Nothing,
    /// A token taken now: the budget granted one, or the activity's turn in
    /// line came.
    Token,
    /// A place in line, taken at the first deferral (unix milliseconds): no
    /// token yet; the turn comes in the order of first deferral.
    Turn {
        /// The first deferral, unix milliseconds.
        since_ms: i64,
    },
}

impl Payment {
    /// Whether a token was taken.
    pub fn is_token(self) -> bool {
        self == Self::Token
    }

    /// The place in line held, if any.
    pub fn place(self) -> Option<i64> {
        match self {
            Self::Turn { since_ms } => Some(since_ms),
            _ => None,
        }
    }
}

/// The dependency of a report that names none.
pub const DEFAULT_DEPENDENCY: &str = "default";

/// Where a dependency stands, from what the service sees of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HealthState {
    /// Nothing seen yet: its starting allowance.
    #[default]
    NoEvidence,
    /// Granted retries do not fail.
    Healthy,
    /// Cut within the evidence window: failures surged, or granted retries
    /// failed.
    Trouble,
    /// Below its starting allowance and growing: the trouble has passed.
    Recovering,
    /// A static rate pinned by the configuration.
    Static,
}

impl HealthState {
    /// Every state, in the order of their persisted codes.
    pub const ALL: [HealthState; 5] = [
        HealthState::NoEvidence,
        HealthState::Healthy,
        HealthState::Trouble,
        HealthState::Recovering,
        HealthState::Static,
    ];

    /// The stable name, for the metric's label and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoEvidence => "no_evidence",
            Self::Healthy => "healthy",
            Self::Trouble => "trouble",
            Self::Recovering => "recovering",
            Self::Static => "static",
        }
    }

    /// The state a persisted code names; an unknown code is no evidence.
    pub fn from_code(code: u32) -> Self {
        Self::ALL
            .get(code as usize)
            .copied()
            .unwrap_or(Self::NoEvidence)
    }

    /// The persisted code.
    pub fn code(self) -> u32 {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) as u32
    }
}

/// The evidence behind a dependency's allowance, in numbers: what a
/// decision's reason quotes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Evidence {
    /// Where it stands.
    pub state: HealthState,
    /// Fresh failures in the last whole second.
    pub failures: u32,
    /// The recent failure rate a surge is measured against, a second.
    pub baseline: f64,
    /// Retries granted in the evidence window.
    pub granted: u32,
    /// Granted retries that failed in the window.
    pub retries_failed: u32,
    /// Whether the last cut was a surge of failures (else failing
    /// retries).
    pub surged: bool,
}

/// A dependency's retry budget as it stood when a retry asked it: what the
/// decision's explanation quotes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    /// Retries a second the dependency may take (fleet-wide on
    /// PostgreSQL), from what the service sees of it.
    pub allowed: f64,
    /// Retries a second the asking tenant's own reported successes add for
    /// it alone (`ratio` of them).
    pub earned: f64,
    /// The asking tenant's reported successes a second.
    pub successes: f64,
    /// The share of reported successes that may be retried.
    pub ratio: f64,
    /// What the service saw.
    pub evidence: Evidence,
    /// False when the dependency is not tracked on its own (past the
    /// bound): it shares the entry of untracked dependencies.
    pub tracked: bool,
}

/// A gate's answer: the admission, and the pace of the dependency when its
/// budget, not the global one, deferred the retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    /// Granted, deferred, or let through by shadow mode.
    pub admission: Admission,
    /// The dependency's pace, when its budget deferred.
    pub pace: Option<Pace>,
    /// The dependency is not tracked on its own: it shares the entry of
    /// untracked dependencies.
    pub untracked: bool,
}

impl From<Admission> for Answer {
    fn from(admission: Admission) -> Self {
        Self {
            admission,
            pace: None,
            untracked: false,
        }
    }
}

/// What a fresh decision on a failure tells the budget: evidence of the
/// dependency's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The failed attempt followed a granted retry (attempt 2 or later):
    /// that retry failed.
    pub retry_failed: bool,
}

/// The budget as a decision sees it: the dependency's and the global one,
/// for one tenant and one dependency.
pub trait TokenGate {
    /// Takes a token for a retry now, or answers when to ask again.
    fn take(&mut self, ask: &Ask<'_>) -> Answer;

    /// Tells the budget of a fresh failure (each attempt once: not a
    /// replay, a dry run, or a deferred attempt asked again) that asks no
    /// token; one that does says so in its [`Ask::observed`].
    fn observe(&mut self, observed: Observed);

    /// Gives up the place in line `activity_id` took at `waiting_since_ms`
    /// (its deferred attempt stopped). The default keeps no lines.
    fn leave(&mut self, _activity_id: &str, _waiting_since_ms: i64) {}
}

/// No gate (no budget in front of the service): every retry is granted.
impl<G: TokenGate> TokenGate for Option<G> {
    fn take(&mut self, ask: &Ask<'_>) -> Answer {
        self.as_mut()
            .map_or(Admission::Granted.into(), |gate| gate.take(ask))
    }

    fn observe(&mut self, observed: Observed) {
        if let Some(gate) = self {
            gate.observe(observed);
        }
    }

    fn leave(&mut self, activity_id: &str, waiting_since_ms: i64) {
        if let Some(gate) = self {
            gate.leave(activity_id, waiting_since_ms);
        }
    }
}

impl<G: TokenGate + ?Sized> TokenGate for &mut G {
    fn take(&mut self, ask: &Ask<'_>) -> Answer {
        (**self).take(ask)
    }

    fn observe(&mut self, observed: Observed) {
        (**self).observe(observed);
    }

    fn leave(&mut self, activity_id: &str, waiting_since_ms: i64) {
        (**self).leave(activity_id, waiting_since_ms);
    }
}

/// A gate that always grants: for callers that enforce no limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unlimited;

impl TokenGate for Unlimited {
    fn take(&mut self, _ask: &Ask<'_>) -> Answer {
        Admission::Granted.into()
    }

    fn observe(&mut self, _observed: Observed) {}
}

/// A dependency's pace as persisted, so that a restart finds it where it
/// stood (trouble as well as health): kept by the store, read once at
/// start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct PaceRecord {
    /// The dependency.
    pub dependency: String,
    /// The allowance this replica's evidence argued for, retries a second.
    pub allowance: f64,
    /// Where it stood.
    pub state: HealthState,
    /// When it was saved, unix milliseconds.
    pub saved_at_ms: i64,
    /// Each tenant's part.
    pub tenants: Vec<TenantPaceRecord>,
}

/// One tenant's part of a [`PaceRecord`].
#[derive(Debug, Clone, PartialEq)]
pub struct TenantPaceRecord {
    /// The tenant.
    pub tenant: String,
    /// The allowance its evidence argued for.
    pub allowance: f64,
    /// Its recent failure rate, a second.
    pub baseline: f64,
    /// Where its evidence stood.
    pub state: HealthState,
    /// Its reported successes a second (its own lane's input).
    pub success_rate: f64,
    /// Where its growth turns from multiplying to adding, while a recovery
    /// is under way.
    pub threshold: Option<f64>,
}
