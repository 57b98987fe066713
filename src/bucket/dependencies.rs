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
//! entry ([`OVERFLOW_DEPENDENCY`](super::pace::OVERFLOW_DEPENDENCY)),
//! paced by the default pace, and a retry to one of them is told so.
//! Dependencies the operator names are always tracked. A tenant may have
//! introduced at most `max_dependencies_per_tenant` of the tracked ones.
//! An idle entry is evicted for a new name, never while it holds evidence
//! of trouble.
//!
//! # Where
//! This file holds [`Dependencies`] and what workers report to it;
//! `admit` a retry's admission, `entry` one dependency's budget,
//! `tracking` which dependencies are tracked, `stats` the listings,
//! `coordination` what is published to and given by the fleet, and
//! `persist` the paces snapshotted and restored.

mod admit;
mod coordination;
mod entry;
mod persist;
mod stats;
mod tracking;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use self::admit::{give_back, place_id};
use self::entry::{DependencyEntry, Nanos};
use super::config::{BucketConfig, BucketConfigError};
use super::fair::FairShares;
use super::health::{Limits, Second};
use super::line::Place;
use super::pace::{DEFAULT_DEPENDENCY, DependenciesConfig, PaceConfig};
use crate::budget::token::Observed;

pub use self::coordination::{DependencyReport, FleetGrant};
pub use self::entry::MAX_TENANTS_PER_DEPENDENCY;
pub use self::stats::{DependencyCounters, DependencyStats};

/// Seconds an entry must have been idle before it is evicted for a new
/// dependency name.
pub const IDLE_EVICTION_SECONDS: u64 = 60;

/// The longest a reported success rate restored at start-up is held while
/// its tenant reports nothing new: a replica restarted on PostgreSQL admits
/// nothing until its first grant, some coordination intervals later, and
/// its workers' first reports may come later still.
pub const RESTORED_HOLD_SECONDS: u64 = 60;

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
        te.health.count(
            second,
            &Second {
                seen: u32::from(known),
                successes: 1,
                ..Second::default()
            },
            &limits,
        );
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
        e.tenants[t].health.count(
            second,
            &Second {
                successes: u32::try_from(successes).unwrap_or(u32::MAX),
                ..Second::default()
            },
            &limits,
        );
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

    fn repace(&mut self, i: usize, now: Duration) {
        let config = self.config.pace_of(&self.entries[i].name);
        self.entries[i].repace(now, config, self.global_rate, &self.template);
    }

    fn count_health(&mut self, tenant: &str, dependency: &str, what: &Second, now: Duration) {
        let i = self.entry(dependency, tenant, now);
        let config = self.config.pace_of(&self.entries[i].name).clone();
        let limits = config.limits(self.global_rate);
        let t = self.entries[i].tenant(tenant, now.as_secs(), &config, &limits);
        self.count_in(i, t, what, now, &config, &limits);
    }

    /// Counts `what` in the health of entry `i`'s tenant `t`. A surge cut
    /// by it is paid from now on, not from the next second's pace: the
    /// lanes fall to the cut allowance and lose the tokens it no longer
    /// holds, and the tenant's own lane stops (`DependencyEntry::repace`),
    /// so the rest of the second grants nothing at the pace the surge has
    /// just disproved.
    fn count_in(
        &mut self,
        i: usize,
        t: usize,
        what: &Second,
        now: Duration,
        config: &PaceConfig,
        limits: &Limits,
    ) {
        let second = now.as_secs();
        let e = &mut self.entries[i];
        let health = &mut e.tenants[t].health;
        let cut_before = health.cut_in(second);
        health.count(second, what, limits);
        if !cut_before && health.cut_in(second) {
            e.paced_at = None;
            e.repace(now, config, self.global_rate, &self.template);
        }
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

fn name_of(dependency: &str) -> &str {
    if dependency.is_empty() {
        DEFAULT_DEPENDENCY
    } else {
        dependency
    }
}

pub(super) fn nanos(d: Duration) -> Nanos {
    d.as_nanos().min(i64::MAX as u128 / 4) as Nanos
}

#[cfg(test)]
mod tests;
