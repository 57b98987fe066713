//! What the rule counts and works within: a second's counts, the limits
//! of a step, the fates of granted retries, and a tenant's sums over its
//! window of seconds.

use super::{PROBE_BACKOFF, RECENT_SECONDS, TenantHealth, WINDOW_SECONDS};
use crate::bucket::config::MIN_RATE;

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
    /// Successes the tenant recorded or reported in the second: a burst of
    /// its calls brings its failures and its successes together, before
    /// the success rate (a window of seconds) has counted them.
    pub successes: u32,
}

impl Second {
    pub(super) fn add(&mut self, other: &Second) {
        self.failures = self.failures.saturating_add(other.failures);
        self.seen = self.seen.saturating_add(other.seen);
        self.granted = self.granted.saturating_add(other.granted);
        self.retries_failed = self.retries_failed.saturating_add(other.retries_failed);
        self.deferred = self.deferred.saturating_add(other.deferred);
        self.successes = self.successes.saturating_add(other.successes);
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

    /// Within the cap, and no lower than the floor's probes spaced out by
    /// [`PROBE_BACKOFF`]: where a trouble that lasts takes the allowance.
    pub(super) fn clamp_low(&self, rate: f64) -> f64 {
        let lowest = (self.floor / PROBE_BACKOFF).max(MIN_RATE).min(self.floor);
        rate.min(self.cap).max(lowest)
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

/// The slot of `second` in a tenant's window (the window and the second
/// under way).
pub(super) fn slot(second: u64) -> usize {
    (second % (WINDOW_SECONDS as u64 + 1)) as usize
}

/// A tenant's sums over its window of seconds.
impl TenantHealth {
    /// The requests seen in the window (the tenant's weight).
    pub fn seen(&self, now: u64) -> u64 {
        let w = self.window_before(now);
        u64::from(w.seen)
    }

    /// Sums of the window's whole seconds before `second`.
    pub(super) fn window_before(&self, second: u64) -> Second {
        let mut sum = Second::default();
        let oldest = second.saturating_sub(WINDOW_SECONDS as u64);
        for s in oldest..second {
            if s <= self.newest && self.newest - s <= WINDOW_SECONDS as u64 {
                sum.add(&self.slots[slot(s)]);
            }
        }
        sum
    }

    /// The window's sums before `now`, for a dependency's totals.
    pub fn window(&self, now: u64) -> Second {
        self.window_before(now)
    }

    /// This replica's own fates before `now`, for the fleet's sums.
    pub fn own_fates(&self, now: u64) -> Fates {
        let window = self.window_before(now);
        Fates {
            granted: window.granted,
            failed: window.retries_failed,
            failed_recently: self.recent_before(now).retries_failed,
        }
    }

    /// Sums of the last [`RECENT_SECONDS`] whole seconds before `second`.
    pub(super) fn recent_before(&self, second: u64) -> Second {
        let mut sum = Second::default();
        for s in second.saturating_sub(RECENT_SECONDS)..second {
            if s <= self.newest && self.newest - s <= WINDOW_SECONDS as u64 {
                sum.add(&self.slots[slot(s)]);
            }
        }
        sum
    }

    /// The last whole second's counts (stepped up to `now`).
    pub fn last_second(&self, now: u64) -> Second {
        if self.newest == now && now > 0 {
            self.slots[slot(now - 1)]
        } else {
            Second::default()
        }
    }
}

/// The dependency's allowance from its tenants' `(allowance, seen)`: their
/// average weighted by requests seen; when none was seen in the window,
/// their plain average; with no tenant, `initial`.
pub fn blend(tenants: impl IntoIterator<Item = (f64, u64)>, initial: f64) -> f64 {
    let (mut weighted, mut weight, mut plain, mut n) = (0.0, 0.0, 0.0, 0.0);
    for (allowance, seen) in tenants {
        weighted += allowance * seen as f64;
        weight += seen as f64;
        plain += allowance;
        n += 1.0;
    }
    if weight > 0.0 {
        weighted / weight
    } else if n > 0.0 {
        plain / n
    } else {
        initial
    }
}
