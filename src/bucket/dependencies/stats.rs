//! Listing the dependencies (see the module doc of [`super`]): each one's
//! counters and pace as it is now, whole or as one tenant sees it.

use std::time::Duration;

use super::Dependencies;
use super::entry::DependencyEntry;
use crate::budget::token::Pace;

/// Counters of one dependency (or of one tenant's use of it), since it was
/// first tracked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DependencyCounters {
    /// Calls workers reported.
    pub calls: u64,
    /// Successes: reported in traffic counts, or recorded one by one.
    pub successes: u64,
    /// Failures workers reported in traffic counts.
    pub failures: u64,
    /// Retries granted a token.
    pub admitted: u64,
    /// Retries deferred by this dependency's budget.
    pub deferred: u64,
}

impl DependencyCounters {
    pub(super) fn report(&mut self, calls: u64, successes: u64, failures: u64) {
        self.calls = self.calls.saturating_add(calls);
        self.successes = self.successes.saturating_add(successes);
        self.failures = self.failures.saturating_add(failures);
    }
}

/// What one dependency looks like now, for metrics and `ReportTraffic`.
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyStats {
    /// Its name.
    pub name: String,
    /// Its pace now (with the asking tenant's own lane, for a tenant's
    /// listing).
    pub pace: Pace,
    /// The rate of the shared lane this replica hands out (its part of
    /// `pace.allowed` on PostgreSQL; equal to it otherwise).
    pub local_rate: f64,
    /// Its successes a second over the pace window, summed over tenants.
    pub success_rate: f64,
    /// Its counters: the whole dependency's, or the asking tenant's.
    pub counters: DependencyCounters,
}

impl Dependencies {
    /// Each tracked dependency as it is now, with its whole counters.
    pub fn stats(&mut self, now: Duration) -> Vec<DependencyStats> {
        (0..self.entries.len())
            .map(|i| {
                self.repace(i, now);
                let e = &self.entries[i];
                let config = self.config.pace_of(&e.name);
                DependencyStats {
                    name: e.name.to_string(),
                    pace: e.pace(None, config, now),
                    local_rate: e.shares.rate(),
                    success_rate: success_rate(e, now),
                    counters: e.counters,
                }
            })
            .collect()
    }

    /// The dependencies `tenant` used, as it sees them: its own lane and
    /// its own counters, nothing of the other tenants.
    pub fn stats_of_tenant(&mut self, tenant: &str, now: Duration) -> Vec<DependencyStats> {
        let mine: Vec<usize> = (0..self.entries.len())
            .filter(|&i| self.entries[i].tenants.iter().any(|t| &*t.name == tenant))
            .collect();
        mine.into_iter()
            .map(|i| {
                self.repace(i, now);
                self.stats_for_tenant(i, tenant, now)
            })
            .collect()
    }

    pub(super) fn stats_for_tenant(
        &self,
        i: usize,
        tenant: &str,
        now: Duration,
    ) -> DependencyStats {
        let e = &self.entries[i];
        let config = self.config.pace_of(&e.name);
        let t = e.tenants.iter().find(|t| &*t.name == tenant);
        DependencyStats {
            name: e.name.to_string(),
            pace: e.pace(t, config, now),
            local_rate: e.shares.rate(),
            success_rate: t.map_or(0.0, |t| t.success_rate(now)),
            counters: t.map_or_else(DependencyCounters::default, |t| t.counters),
        }
    }
}

pub(super) fn success_rate(e: &DependencyEntry, now: Duration) -> f64 {
    e.tenants
        .iter()
        .map(|t| t.successes.clone().rate(now))
        .sum()
}
