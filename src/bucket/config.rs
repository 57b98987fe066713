//! The bucket's configuration: how fast retry tokens refill, how many may
//! pile up, how tenants are weighed, and how far ahead a deferral may book.
//!
//! It derives `serde::Deserialize` with a default for every field, so a
//! configuration file names only what it changes; [`BucketConfig::validate`]
//! rejects what would make the arithmetic meaningless (a zero rate, a zero
//! weight) with a message that names the field.
//!
//! ```toml
//! [bucket]
//! rate = 100.0              # tokens a second
//! burst = 100               # tokens that may pile up
//! success_deposit = 0.1     # tokens back per recorded success (0: off)
//! max_reservation_ms = 2000 # how far the bucket may run ahead for a tenant within its share
//! max_deferral = "10s"      # how far ahead a deferral may point a worker
//! max_tenants = 1024
//! default_weight = 1
//! weights = { acme = 2, batch = 1 }
//! ```

use std::collections::BTreeMap;

/// The least refill rate accepted, in tokens a second (one an hour would be
/// 0.0003; below this the arithmetic is no longer worth trusting).
pub const MIN_RATE: f64 = 0.001;
/// The greatest refill rate accepted, in tokens a second (one a
/// microsecond: beyond it a token interval rounds to nothing useful).
pub const MAX_RATE: f64 = 1_000_000.0;
pub use crate::budget::activity::MAX_TENANT_BYTES;

/// Default refill rate, tokens a second.
pub const DEFAULT_RATE: f64 = 100.0;
/// Default burst: one second of the default rate.
pub const DEFAULT_BURST: u32 = 100;
/// Default deposit per success: off, the budget is a plain rate.
pub const DEFAULT_SUCCESS_DEPOSIT: f64 = 0.0;
/// Default weight of a tenant the configuration does not name.
pub const DEFAULT_WEIGHT: u32 = 1;
/// Default bound on the tenants tracked one by one.
pub const DEFAULT_MAX_TENANTS: usize = 1024;
/// Default reservation horizon: two seconds.
pub const DEFAULT_MAX_RESERVATION_MS: u64 = 2_000;
/// Default deferral horizon: a deferred worker asks again within 10 s,
/// one cheap call per horizon, and is never locked into a far turn.
pub const DEFAULT_MAX_DEFERRAL: std::time::Duration = std::time::Duration::from_secs(10);
/// Shortest and longest deferral horizon accepted.
pub const MAX_DEFERRAL_RANGE: std::ops::RangeInclusive<std::time::Duration> =
    std::time::Duration::from_millis(100)..=std::time::Duration::from_secs(3600);

/// The bucket's configuration. Every field has a documented default.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BucketConfig {
    /// Tokens added a second: the sustained retry rate of the whole service.
    /// Default [`DEFAULT_RATE`].
    pub rate: f64,
    /// Tokens the bucket holds when full: how many retries may go at once
    /// after a quiet spell. Default [`DEFAULT_BURST`].
    pub burst: u32,
    /// Tokens each recorded success adds (capped by `burst`), so a healthy
    /// stream of successes earns retries, as in Finagle's and gRPC's ratio
    /// budgets. Fractions add up. Default [`DEFAULT_SUCCESS_DEPOSIT`] (off).
    pub success_deposit: f64,
    /// Weight of every tenant not named in `weights`. Default
    /// [`DEFAULT_WEIGHT`].
    pub default_weight: u32,
    /// Weights of named tenants: under contention a tenant's share of the
    /// refill is proportional to its weight.
    pub weights: BTreeMap<String, u32>,
    /// How many tenants are tracked one by one. Idle tenants are evicted
    /// (losing nothing); past the bound, new tenants share one entry of the
    /// default weight. Default [`DEFAULT_MAX_TENANTS`].
    pub max_tenants: usize,
    /// `enforce` (the default) defers retries past the budget; `shadow`
    /// computes every admission as it would but never defers: a retry it
    /// would have deferred goes ahead, marked `would_defer`, and is counted.
    pub mode: BucketMode,
    /// How far ahead of its rate, in milliseconds, the bucket may run to
    /// grant a tenant within its share at once while others flood it (the
    /// over-commit is twice this; see `docs/fairness.md`). At least one
    /// token interval (`1000 / rate`). Default
    /// [`DEFAULT_MAX_RESERVATION_MS`].
    pub max_reservation_ms: u64,
    /// The furthest a deferral points a worker ahead: its `not_before` is
    /// at most this far away (jittered per activity between half of it and
    /// all of it, so deferred workers do not wake together), and sooner
    /// when its turn in line comes sooner. Default [`DEFAULT_MAX_DEFERRAL`].
    #[serde(with = "crate::setting::duration")]
    pub max_deferral: std::time::Duration,
}

impl Default for BucketConfig {
    fn default() -> Self {
        Self {
            rate: DEFAULT_RATE,
            burst: DEFAULT_BURST,
            success_deposit: DEFAULT_SUCCESS_DEPOSIT,
            default_weight: DEFAULT_WEIGHT,
            weights: BTreeMap::new(),
            max_tenants: DEFAULT_MAX_TENANTS,
            max_reservation_ms: DEFAULT_MAX_RESERVATION_MS,
            max_deferral: DEFAULT_MAX_DEFERRAL,
            mode: BucketMode::Enforce,
        }
    }
}

/// Whether the bucket's deferrals are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BucketMode {
    /// Retries past the budget are deferred.
    #[default]
    Enforce,
    /// Retries past the budget go ahead, marked as ones it would defer.
    Shadow,
}

impl std::str::FromStr for BucketMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "enforce" => Ok(Self::Enforce),
            "shadow" => Ok(Self::Shadow),
            other => Err(format!("{other:?} is not enforce or shadow")),
        }
    }
}

/// A configuration the bucket cannot work with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BucketConfigError {
    /// The rate is not a number between [`MIN_RATE`] and [`MAX_RATE`].
    #[error("retry rate must be between {MIN_RATE} and {MAX_RATE} tokens a second, got {0}")]
    Rate(f64),
    /// A bucket that holds nothing could never grant.
    #[error("retry burst must be at least 1 token")]
    BurstZero,
    /// The success deposit is negative or not a number.
    #[error("success deposit must be a finite number of tokens, at least 0, got {0}")]
    SuccessDeposit(f64),
    /// A zero default weight would give unnamed tenants no share.
    #[error("default tenant weight must be at least 1")]
    DefaultWeightZero,
    /// A zero weight would give the tenant no share.
    #[error("weight of tenant {0:?} must be at least 1")]
    WeightZero(String),
    /// A weight names something that is not a valid tenant id.
    #[error(
        "tenant weight names {0:?}, which is not 1 to {MAX_TENANT_BYTES} printable ASCII characters"
    )]
    InvalidTenant(String),
    /// No tenant could be tracked.
    #[error("max_tenants must be at least 1")]
    MaxTenantsZero,
    /// More tenants than any table should hold.
    #[error("max_tenants must be at most {max}, got {0}", max = u32::MAX / 2)]
    MaxTenantsTooLarge(usize),
    /// A horizon shorter than one token interval could book nothing.
    /// The deferral horizon is outside 100 ms to 1 h.
    #[error("max_deferral must be 100ms to 1h, got {0:?}")]
    MaxDeferral(std::time::Duration),
    #[error(
        "max_reservation_ms must be at least one token interval ({min_ms} ms at this rate), got {got_ms}"
    )]
    ReservationTooShort {
        /// The least accepted, in milliseconds.
        min_ms: u64,
        /// The configured value.
        got_ms: u64,
    },
}

impl BucketConfig {
    /// Checks every field.
    ///
    /// # Errors
    /// The first [`BucketConfigError`] found.
    pub fn validate(&self) -> Result<(), BucketConfigError> {
        if !(MIN_RATE..=MAX_RATE).contains(&self.rate) {
            return Err(BucketConfigError::Rate(self.rate));
        }
        if self.burst == 0 {
            return Err(BucketConfigError::BurstZero);
        }
        if !self.success_deposit.is_finite() || self.success_deposit < 0.0 {
            return Err(BucketConfigError::SuccessDeposit(self.success_deposit));
        }
        if self.default_weight == 0 {
            return Err(BucketConfigError::DefaultWeightZero);
        }
        for (tenant, &weight) in &self.weights {
            if !is_valid_tenant(tenant) {
                return Err(BucketConfigError::InvalidTenant(tenant.clone()));
            }
            if weight == 0 {
                return Err(BucketConfigError::WeightZero(tenant.clone()));
            }
        }
        if self.max_tenants == 0 {
            return Err(BucketConfigError::MaxTenantsZero);
        }
        if self.max_tenants > (u32::MAX / 2) as usize {
            return Err(BucketConfigError::MaxTenantsTooLarge(self.max_tenants));
        }
        if !MAX_DEFERRAL_RANGE.contains(&self.max_deferral) {
            return Err(BucketConfigError::MaxDeferral(self.max_deferral));
        }
        let min_ms = (1000.0 / self.rate).ceil() as u64;
        if self.max_reservation_ms < min_ms {
            return Err(BucketConfigError::ReservationTooShort {
                min_ms,
                got_ms: self.max_reservation_ms,
            });
        }
        Ok(())
    }

    /// The weight of `tenant`: its configured one, or the default.
    pub fn weight_of(&self, tenant: &str) -> u32 {
        self.weights
            .get(tenant)
            .copied()
            .unwrap_or(self.default_weight)
    }
}

/// Whether `tenant` is a valid tenant id (the core's rule).
fn is_valid_tenant(tenant: &str) -> bool {
    crate::budget::tenant::validate(tenant).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_a_file_names_only_what_it_changes() {
        BucketConfig::default().validate().unwrap();
        let c: BucketConfig =
            serde_json::from_str(r#"{"rate": 5, "weights": {"acme": 3}}"#).unwrap();
        assert_eq!(c.rate, 5.0);
        assert_eq!(c.burst, DEFAULT_BURST);
        assert_eq!(c.weight_of("acme"), 3);
        assert_eq!(c.weight_of("other"), DEFAULT_WEIGHT);
        c.validate().unwrap();
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<BucketConfig>(r#"{"rat": 5}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    #[test]
    fn each_bad_field_gets_its_own_message() {
        let bad = |f: fn(&mut BucketConfig)| {
            let mut c = BucketConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.rate = 0.0).starts_with("retry rate must be"));
        assert!(bad(|c| c.rate = -1.0).starts_with("retry rate must be"));
        assert!(bad(|c| c.rate = f64::NAN).starts_with("retry rate must be"));
        assert!(bad(|c| c.rate = f64::INFINITY).starts_with("retry rate must be"));
        assert_eq!(bad(|c| c.burst = 0), "retry burst must be at least 1 token");
        assert!(bad(|c| c.success_deposit = -0.5).starts_with("success deposit"));
        assert!(bad(|c| c.default_weight = 0).starts_with("default tenant weight"));
        assert_eq!(
            bad(|c| {
                c.weights.insert("acme".into(), 0);
            }),
            "weight of tenant \"acme\" must be at least 1"
        );
        assert!(
            bad(|c| {
                c.weights.insert("has space".into(), 1);
            })
            .contains("printable ASCII")
        );
        assert_eq!(bad(|c| c.max_tenants = 0), "max_tenants must be at least 1");
        assert!(
            bad(|c| {
                c.rate = 0.5;
                c.max_reservation_ms = 1000;
            })
            .contains("(2000 ms at this rate), got 1000")
        );
    }

    #[test]
    fn tenant_ids_follow_the_edges_rule() {
        assert!(is_valid_tenant("acme-prod_1"));
        for bad in ["", "a b", "é", "a\n", &"x".repeat(MAX_TENANT_BYTES + 1)] {
            assert!(!is_valid_tenant(bad), "{bad:?}");
        }
    }
}
