//! How a dependency's evidence reads in a decision's reason and its
//! listing: "38 of the last 40 granted retries failed".

use std::fmt;

use super::{Evidence, HealthState, WINDOW_SECONDS};

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
