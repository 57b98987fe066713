//! Where a tenant's evidence stands, and how it reads in a decision's
//! reason and its listing: "38 of the last 40 granted retries failed".

use std::fmt;

use super::{Evidence, HealthState, Limits, RECOVERED_WITHIN, TenantHealth, WINDOW_SECONDS};

impl TenantHealth {
    /// The evidence as of `now` (stepped up to it).
    pub fn evidence(&self, now: u64, limits: &Limits) -> Evidence {
        let window = self.window_before(now);
        let just = self.last_second(now);
        let in_trouble = self
            .cut_at
            .is_some_and(|at| now.saturating_sub(at) <= WINDOW_SECONDS as u64);
        let state = if in_trouble {
            HealthState::Trouble
        } else if !self.seen_any {
            HealthState::NoEvidence
        } else if self.allowance < self.rest(limits) - RECOVERED_WITHIN {
            HealthState::Recovering
        } else {
            HealthState::Healthy
        };
        Evidence {
            state,
            failures: just.failures,
            baseline: self.baseline,
            granted: self.fates.map_or(window.granted, |f| f.granted),
            retries_failed: self.fates.map_or(window.retries_failed, |f| f.failed),
            surged: self.surged,
        }
    }

    /// Whether this tenant holds evidence of trouble worth keeping: cut
    /// recently, or still below its resting allowance.
    pub fn holds_trouble(&self, now: u64, limits: &Limits) -> bool {
        matches!(
            self.evidence(now, limits).state,
            HealthState::Trouble | HealthState::Recovering
        )
    }
}

impl fmt::Display for Evidence {
    /// "38 of the last 40 granted retries failed", "failures surged to 90/s
    /// from 3/s", "no evidence yet".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let window = WINDOW_SECONDS;
        match self.state {
            HealthState::NoEvidence => f.write_str("no evidence yet: its starting allowance"),
            HealthState::Static => f.write_str("a static rate"),
            HealthState::Trouble if self.surged => write!(
                f,
                "failures surged to {}/s from {}/s",
                self.failures,
                crate::bucket::pace::Rate(self.baseline)
            ),
            HealthState::Trouble => write!(
                f,
                "{} of the {} retries granted in the last {window} s failed",
                self.retries_failed
                    .min(self.granted.max(self.retries_failed)),
                self.granted.max(self.retries_failed)
            ),
            HealthState::Recovering => write!(
                f,
                "recovering: {} of the {} retries granted in the last {window} s failed",
                self.retries_failed.min(self.granted),
                self.granted
            ),
            HealthState::Healthy if self.granted == 0 => write!(
                f,
                "healthy: no retry granted in the last {window} s to fail"
            ),
            HealthState::Healthy => write!(
                f,
                "{} of the {} retries granted in the last {window} s failed",
                self.retries_failed.min(self.granted),
                self.granted
            ),
        }
    }
}
