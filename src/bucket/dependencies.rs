//! The dependencies' budgets, nested inside the global one. Pure: time is a
//! parameter, as in [`FairShares`].
//!
//! # Nesting
//! A retry takes a token from its dependency first, then from the global
//! bucket:
//! - from the dependency's *shared lane*, a [`FairShares`] at the allowance
//!   its health sets (`super::health`), where tenants keep weighted fair
//!   shares; or else from the tenant's *own lane*, earned by the successes
//!   it reported (`ratio` of them), which no other tenant can use;
//! - then from the global bucket; when it refuses, the dependency's token
//!   goes back.
//!
//! So a dependency that is down never spends the capacity retries to
//! healthy ones need, the retries of a dependency never exceed its own
//! lanes, and all retries together never exceed the global bound.
//!
//! # Lines
//! A durable retry that gets no token takes a place in its tenant's line
//! of the dependency (`super::line`), by the time of its first deferral.
//! Whenever the tenant's lanes have a token, the first live place gets it,
//! and its worker goes when it asks again. A fresh failure of the tenant
//! waits behind the line; a pure retry (which keeps no record to hold a
//! place) does too, without a place. Deferrals point workers at about when
//! their turn comes, never further than the deferral horizon.
//!
//! # Tracking
//! At most `max_dependencies` are tracked one by one; the rest share one
//! entry ([`OVERFLOW_DEPENDENCY`]), paced by the default pace, and a
//! retry to one of them is told so. Dependencies the operator names are
//! always tracked. A tenant may have introduced at most
//! `max_dependencies_per_tenant` of the tracked ones. An idle entry is
//! evicted for a new name, never while it holds evidence of trouble.

mod admit;
mod entry;
mod tracking;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use self::admit::{give_back, place_id};
use self::entry::{DependencyEntry, Nanos};
use super::capacity::Capacity;
use super::config::{BucketConfig, BucketConfigError};
use super::fair::FairShares;
use super::health::{Fates, Second, TenantHealth};
use super::line::Place;
use super::pace::{DEFAULT_DEPENDENCY, DependenciesConfig};
use crate::budget::token::{Observed, Pace, PaceRecord, TenantPaceRecord};

pub use self::entry::MAX_TENANTS_PER_DEPENDENCY;

/// Seconds an entry must have been idle before it is evicted for a new
/// dependency name.
pub const IDLE_EVICTION_SECONDS: u64 = 60;

/// The longest a reported success rate restored at start-up is held while
/// its tenant reports nothing new: a replica restarted on PostgreSQL admits
/// nothing until its first grant, some coordination intervals later, and
/// its workers' first reports may come later still.
pub const RESTORED_HOLD_SECONDS: u64 = 60;

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
    fn report(&mut self, calls: u64, successes: u64, failures: u64) {
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

/// What the coordination publishes of one dependency each interval.
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyReport {
    /// Its name.
    pub name: String,
    /// Successes a second here over its pace window.
    pub success_rate: f64,
    /// The allowance this replica's evidence argues for.
    pub allowance: f64,
    /// Requests seen here in the evidence window: its weight in the
    /// fleet's allowance.
    pub seen: u64,
    /// Tokens each tenant asked for, and whether any was held back.
    pub demand: Vec<(String, u64, bool)>,
    /// Each tenant's retries granted here in the evidence window, and the
    /// retries whose failure was reported here: summed over the fleet, the
    /// fates of every replica's grants.
    pub fates: Vec<(String, Fates)>,
}

/// What the coordination gives one dependency each interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetGrant {
    /// The fleet's allowance, retries a second.
    pub allowed: f64,
    /// Each tenant's retries granted and failed in the evidence window,
    /// summed over the replicas.
    pub fates: HashMap<String, Fates>,
}

/// Every dependency's budget.
#[derive(Debug)]
pub struct Dependencies {
    config: DependenciesConfig,
    /// What each dependency's bucket is built from (tenant bound, weights);
    /// its rate and burst are the pace's.
    template: BucketConfig,
    /// The global rate: no dependency's allowance grows past it.
    global_rate: f64,
    /// How far ahead a deferral may point, nanoseconds.
    horizon: Nanos,
    entries: Vec<DependencyEntry>,
    index: HashMap<Arc<str>, usize>,
    /// Tracked entries each tenant introduced.
    introduced: HashMap<Arc<str>, usize>,
}

impl Dependencies {
    /// The dependencies the operator named, tracked from the start.
    ///
    /// # Errors
    /// The [`BucketConfigError`] of an invalid `template`.
    pub fn new(
        config: DependenciesConfig,
        template: &BucketConfig,
    ) -> Result<Self, BucketConfigError> {
        template.validate()?;
        let mut deps = Self {
            config,
            template: template.clone(),
            global_rate: template.rate,
            horizon: nanos(template.max_deferral),
            entries: Vec::new(),
            index: HashMap::new(),
            introduced: HashMap::new(),
        };
        deps.track_named(0);
        Ok(deps)
    }

    /// Counts a fresh failure `tenant` asked about.
    pub fn observe(&mut self, tenant: &str, dependency: &str, observed: Observed, now: Duration) {
        self.count_health(tenant, dependency, &observed_failure(observed), now);
    }

    /// Counts a success `tenant` recorded: one success of its own lane,
    /// and, for an activity the service holds (`known`), one request seen.
    pub fn record_success(&mut self, tenant: &str, dependency: &str, known: bool, now: Duration) {
        let i = self.entry(dependency, tenant, now);
        let second = now.as_secs();
        let config = self.config.pace_of(&self.entries[i].name).clone();
        let limits = config.limits(self.global_rate);
        let e = &mut self.entries[i];
        let t = e.tenant(tenant, second, &config, &limits);
        let te = &mut e.tenants[t];
        te.add_successes(now, 1, config.window);
        te.counters.report(0, 1, 0);
        e.counters.report(0, 1, 0);
        if known {
            te.health.count(
                second,
                &Second {
                    seen: 1,
                    ..Second::default()
                },
                &limits,
            );
        }
    }

    /// Counts a worker's calls to `dependency` since its last report (its
    /// tenant's own lane is paced by the successes); returns the pace as
    /// the tenant sees it.
    pub fn report(
        &mut self,
        tenant: &str,
        dependency: &str,
        now: Duration,
        calls: u64,
        successes: u64,
        failures: u64,
    ) -> DependencyStats {
        let i = self.entry(dependency, tenant, now);
        let second = now.as_secs();
        let config = self.config.pace_of(&self.entries[i].name).clone();
        let limits = config.limits(self.global_rate);
        let e = &mut self.entries[i];
        let t = e.tenant(tenant, second, &config, &limits);
        e.tenants[t].add_successes(now, successes, config.window);
        e.tenants[t].counters.report(calls, successes, failures);
        e.counters.report(calls, successes, failures);
        e.paced_at = None;
        self.repace(i, now);
        self.stats_for_tenant(i, tenant, now)
    }

    /// Gives up `tenant`'s place in `dependency`'s line (its activity
    /// stopped or succeeded while deferred), and the token it held if its
    /// turn had come.
    pub fn leave(
        &mut self,
        global: &mut FairShares,
        tenant: &str,
        dependency: &str,
        activity_id: &str,
        since_ms: i64,
        now: Duration,
    ) {
        let name = name_of(dependency);
        if let Some(&i) = self.index.get(name) {
            let e = &mut self.entries[i];
            if let Some(t) = e.tenants.iter().position(|t| &*t.name == tenant)
                && let Some(token) = e.tenants[t].line.leave(Place {
                    since_ms,
                    id: place_id(activity_id),
                })
            {
                give_back(global, e, t, token, now);
            }
        }
    }

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

    fn stats_for_tenant(&self, i: usize, tenant: &str, now: Duration) -> DependencyStats {
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

    /// What the coordination publishes: each dependency's successes,
    /// allowance and weight, and its tenants' demand since the last call,
    /// reset.
    pub fn take_reports(&mut self, now: Duration) -> Vec<DependencyReport> {
        let second = now.as_secs();
        (0..self.entries.len())
            .map(|i| {
                self.repace(i, now);
                let e = &mut self.entries[i];
                let mut demand = Vec::new();
                e.shares.take_demand(|tenant, asked, held_back| {
                    demand.push((tenant.to_owned(), asked, held_back > 0));
                });
                let fates = e
                    .tenants
                    .iter()
                    .map(|t| (t.name.to_string(), t.health.own_fates(second)))
                    .filter(|(_, f)| f.granted + f.failed > 0)
                    .collect();
                DependencyReport {
                    name: e.name.to_string(),
                    success_rate: success_rate(e, now),
                    allowance: e.local,
                    seen: e.tenants.iter().map(|t| t.health.seen(second)).sum(),
                    demand,
                    fates,
                }
            })
            .collect()
    }

    /// Sets `dependency`'s allowance from the fleet's, and this replica's
    /// part of it: the coordination's answer, in force until the next one
    /// (or until [`Dependencies::uncoordinate`]).
    pub fn set_grant(
        &mut self,
        dependency: &str,
        grant: FleetGrant,
        capacity: &Capacity,
        now: Duration,
    ) {
        // A dependency only other replicas track is taken on while there is
        // room, so that its first retry here finds the fleet's pace.
        if !self.index.contains_key(dependency)
            && self.tracked_count() >= self.config.max_dependencies
        {
            return;
        }
        let i = self.entry(dependency, "", now);
        let e = &mut self.entries[i];
        e.fleet = Some(grant.allowed);
        e.fleet_fates = Some(grant.fates);
        // The fleet's fates step the rule from the next second on.
        e.paced_at = None;
        e.shares.set_capacity(capacity, now);
    }

    /// Every dependency paced from its local evidence again (a replica
    /// whose coordination lapsed).
    pub fn uncoordinate(&mut self) {
        for e in &mut self.entries {
            e.fleet = None;
            e.fleet_fates = None;
            e.paced_at = None;
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &DependenciesConfig {
        &self.config
    }

    /// A new configuration (a reload): every dependency is paced by it from
    /// its next second on; places in line stay.
    pub fn reconfigure(&mut self, config: DependenciesConfig, template: &BucketConfig) {
        self.config = config;
        self.template = template.clone();
        self.global_rate = template.rate;
        self.horizon = nanos(template.max_deferral);
        for e in &mut self.entries {
            e.paced_at = None;
            e.named = self.config.named.contains_key(&*e.name);
            let pace = self.config.pace_of(&e.name);
            let limits = pace.limits(self.global_rate);
            for t in &mut e.tenants {
                t.successes.resize(pace.window);
                t.health.reconfigure(&limits);
            }
        }
        self.track_named(0);
    }

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
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Takes back what was persisted (at start-up): each dependency's
    /// tenants with their allowance, failure rate and reported successes,
    /// while there is room. A tenant's reported success rate is held until
    /// its own reports have filled a window (`TenantEntry::add_successes`),
    /// and at most [`RESTORED_HOLD_SECONDS`] when none come.
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
                    allowance,
                    finite_or(t.baseline, 0.0).max(0.0),
                    t.state,
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

    fn repace(&mut self, i: usize, now: Duration) {
        let config = self.config.pace_of(&self.entries[i].name);
        self.entries[i].repace(now, config, self.global_rate, &self.template);
    }

    fn count_health(&mut self, tenant: &str, dependency: &str, what: &Second, now: Duration) {
        let i = self.entry(dependency, tenant, now);
        let second = now.as_secs();
        let config = self.config.pace_of(&self.entries[i].name).clone();
        let limits = config.limits(self.global_rate);
        let e = &mut self.entries[i];
        let t = e.tenant(tenant, second, &config, &limits);
        e.tenants[t].health.count(second, what, &limits);
    }
}

/// A fresh failure asked about, as the health rule counts it.
fn observed_failure(observed: Observed) -> Second {
    Second {
        failures: 1,
        seen: 1,
        retries_failed: u32::from(observed.retry_failed),
        ..Second::default()
    }
}

fn success_rate(e: &DependencyEntry, now: Duration) -> f64 {
    e.tenants
        .iter()
        .map(|t| t.successes.clone().rate(now))
        .sum()
}

fn name_of(dependency: &str) -> &str {
    if dependency.is_empty() {
        DEFAULT_DEPENDENCY
    } else {
        dependency
    }
}

fn finite_or(value: f64, default: f64) -> f64 {
    if value.is_finite() { value } else { default }
}

pub(super) fn nanos(d: Duration) -> Nanos {
    d.as_nanos().min(i64::MAX as u128 / 4) as Nanos
}

#[cfg(test)]
mod tests;
