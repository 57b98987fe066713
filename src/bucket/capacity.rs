//! [`Capacity`]: what a running bucket may hand out (its rate, burst and
//! tenant weights), changed at run time with [`FairBucket::set_capacity`].
//!
//! The configuration file gives one capacity at start-up; a replica that
//! shares a global budget with others is given its part of it every
//! coordination interval (`crate::coord`), and a reloaded configuration is
//! one more capacity. Everything else in [`BucketConfig`] (the reservation
//! horizon, the tenant bound, the success deposit) stays as built.
//!
//! A capacity is never rejected: a computed grant can be tiny or zero, so
//! a rate below [`MIN_RATE`] closes the bucket instead, weights of 0 count
//! as 1, and a burst of 0 is allowed (nothing piles up, tokens go at the
//! rate).
//!
//! [`FairBucket::set_capacity`]: super::FairBucket::set_capacity

use std::collections::BTreeMap;
use std::time::Duration;

use super::config::{BucketConfig, MIN_RATE};

/// What the bucket may hand out from now on.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// Tokens added a second. Below [`MIN_RATE`] (0 included) the bucket is
    /// closed: it grants nothing and books nothing.
    pub rate: f64,
    /// Tokens the bucket may hold. Tokens held beyond it are dropped when
    /// the capacity is set.
    pub burst: u32,
    /// Weight of every tenant not named in `weights`.
    pub default_weight: u32,
    /// Weights of named tenants.
    pub weights: BTreeMap<String, u32>,
    /// How many times its rate here a tenant gets over the whole fleet,
    /// for tenants a balancer spreads over several replicas (1 for the
    /// others): a worker deferred here may come back to any replica, so
    /// its line drains at the fleet's rate, and its wait is told by it.
    pub spread: BTreeMap<String, f64>,
    /// When a closed bucket tells a request to ask again: about when it may
    /// have capacity (for a replica waiting for its grant, one coordination
    /// interval).
    pub closed_retry_after: Duration,
}

impl Capacity {
    /// The capacity a configuration describes.
    pub fn from_config(config: &BucketConfig) -> Self {
        Self {
            rate: config.rate,
            burst: config.burst,
            default_weight: config.default_weight,
            weights: config.weights.clone(),
            spread: BTreeMap::new(),
            closed_retry_after: Duration::from_secs(1),
        }
    }

    /// No capacity at all: every request is refused with
    /// `global_capacity_exhausted` and told to ask again after
    /// `retry_after`.
    pub fn closed(retry_after: Duration) -> Self {
        Self {
            rate: 0.0,
            burst: 0,
            default_weight: 1,
            weights: BTreeMap::new(),
            spread: BTreeMap::new(),
            closed_retry_after: retry_after,
        }
    }

    /// Whether this capacity admits nothing.
    pub fn is_closed(&self) -> bool {
        // NaN is closed too.
        self.rate.is_nan() || self.rate < MIN_RATE
    }

    /// How many times its rate here `tenant` gets over the fleet (at
    /// least 1).
    pub fn spread_of(&self, tenant: &str) -> f64 {
        self.spread
            .get(tenant)
            .copied()
            .filter(|s| s.is_finite())
            .unwrap_or(1.0)
            .max(1.0)
    }

    /// The weight of `tenant`: its own, or the default; never 0.
    pub fn weight_of(&self, tenant: &str) -> u32 {
        self.weights
            .get(tenant)
            .copied()
            .unwrap_or(self.default_weight)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_rates_and_nan_close_and_zero_weights_count_as_one() {
        let mut c = Capacity::from_config(&BucketConfig::default());
        assert!(!c.is_closed());
        for rate in [0.0, MIN_RATE / 2.0, f64::NAN, -1.0] {
            c.rate = rate;
            assert!(c.is_closed(), "{rate}");
        }
        c.default_weight = 0;
        c.weights.insert("a".into(), 0);
        assert_eq!((c.weight_of("a"), c.weight_of("b")), (1, 1));
    }
}
