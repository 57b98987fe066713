//! The paces persisted (see the module doc of [`super`]): each tracked
//! dependency's pace and its tenants' evidence snapshotted, and taken back
//! at start-up.

use std::sync::Arc;
use std::time::Duration;

use super::{Dependencies, MAX_TENANTS_PER_DEPENDENCY, RESTORED_HOLD_SECONDS, entry};
use crate::bucket::health::{Saved, TenantHealth};
use crate::budget::token::{PaceRecord, TenantPaceRecord};

impl Dependencies {
    /// Each tracked dependency's pace, to persist.
    pub fn snapshot(&mut self, now: Duration, now_ms: i64) -> Vec<PaceRecord> {
        let second = now.as_secs();
        let tracked: Vec<usize> = (0..self.entries.len())
            .filter(|&i| self.entries[i].tracked)
            .collect();
        tracked
            .into_iter()
            .map(|i| {
                self.repace(i, now);
                let e = &self.entries[i];
                let limits = self.config.pace_of(&e.name).limits(self.global_rate);
                PaceRecord {
                    dependency: e.name.to_string(),
                    allowance: e.local,
                    state: e.evidence.state,
                    saved_at_ms: now_ms,
                    tenants: e
                        .tenants
                        .iter()
                        .map(|t| TenantPaceRecord {
                            tenant: t.name.to_string(),
                            allowance: t.health.allowance(),
                            baseline: t.health.baseline(),
                            state: t.health.evidence(second, &limits).state,
                            success_rate: t.success_rate(now),
                            threshold: t.health.threshold(),
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Takes back what was persisted (at start-up): each dependency's
    /// tenants with their allowance, failure rate, threshold and reported
    /// successes, while there is room. A tenant's reported success rate is
    /// held until its own reports have filled a window
    /// (`TenantEntry::add_successes`), and at most [`RESTORED_HOLD_SECONDS`]
    /// when none come.
    pub fn restore(&mut self, records: &[PaceRecord], now: Duration) {
        let second = now.as_secs();
        for record in records {
            if crate::budget::error::validate_dependency(&record.dependency).is_err()
                || record.dependency.is_empty()
                || (!self.index.contains_key(record.dependency.as_str())
                    && self.tracked_count() >= self.config.max_dependencies)
            {
                continue;
            }
            let i = self.entry(&record.dependency, "", now);
            let config = self.config.pace_of(&record.dependency).clone();
            let limits = config.limits(self.global_rate);
            let e = &mut self.entries[i];
            e.tenants.clear();
            for t in record.tenants.iter().take(MAX_TENANTS_PER_DEPENDENCY) {
                let mut te = entry::TenantEntry::new(
                    Arc::from(t.tenant.as_str()),
                    second,
                    limits.initial,
                    config.window,
                );
                let allowance =
                    finite_or(t.allowance, limits.initial).clamp(limits.floor, limits.cap);
                te.health = TenantHealth::restored(
                    second,
                    Saved {
                        allowance,
                        baseline: finite_or(t.baseline, 0.0).max(0.0),
                        state: t.state,
                        // Above the floor, as one learnt is above the rest.
                        threshold: t
                            .threshold
                            .filter(|v| v.is_finite() && *v > limits.floor)
                            .map(|v| v.min(limits.cap)),
                    },
                );
                let rate = finite_or(t.success_rate, 0.0).clamp(0.0, 1e9);
                te.restored = (rate > 0.0).then_some((rate, second + RESTORED_HOLD_SECONDS));
                e.tenants.push(te);
            }
            e.local = finite_or(record.allowance, limits.initial).clamp(limits.floor, limits.cap);
            e.paced_at = None;
            self.repace(i, now);
        }
    }
}

fn finite_or(value: f64, default: f64) -> f64 {
    if value.is_finite() { value } else { default }
}
