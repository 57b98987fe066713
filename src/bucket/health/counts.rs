//! What the rule counts and works within: a second's counts, the limits
//! of a step, and the fates of granted retries.

/// What one tenant's requests told of a dependency in one second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Second {
    /// Fresh failures asked about.
    pub failures: u32,
    /// Requests seen (fresh failures and recorded successes): the tenant's
    /// weight in the dependency's allowance.
    pub seen: u32,
    /// Retries granted a token.
    pub granted: u32,
    /// Granted retries that failed.
    pub retries_failed: u32,
    /// Retries the dependency's budget deferred.
    pub deferred: u32,
}

impl Second {
    pub(super) fn add(&mut self, other: &Second) {
        self.failures = self.failures.saturating_add(other.failures);
        self.seen = self.seen.saturating_add(other.seen);
        self.granted = self.granted.saturating_add(other.granted);
        self.retries_failed = self.retries_failed.saturating_add(other.retries_failed);
        self.deferred = self.deferred.saturating_add(other.deferred);
    }
}

/// The limits a step works within (from the dependency's pace
/// configuration and the global rate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Never below.
    pub floor: f64,
    /// Where it starts, and where it settles with no evidence.
    pub initial: f64,
    /// Never above (the global rate, or the dependency's ceiling).
    pub cap: f64,
}

impl Limits {
    pub(super) fn clamp(&self, rate: f64) -> f64 {
        rate.min(self.cap).max(self.floor)
    }
}

/// Retries granted and failed in the evidence window, and failed in its
/// last [`RECENT_SECONDS`](super::RECENT_SECONDS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fates {
    /// Granted in the window.
    pub granted: u32,
    /// Failed in the window.
    pub failed: u32,
    /// Failed in the last few seconds.
    pub failed_recently: u32,
}
