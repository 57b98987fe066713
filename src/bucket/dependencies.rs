//! The dependencies' budgets, nested inside the global one. Pure: time is a
//! parameter, as in [`FairShares`].
//!
//! # Nesting
//! Each dependency has a bucket of its own ([`FairShares`]: its meter, and
//! its tenants' weighted fair shares), paced by its health
//! ([`PaceConfig::allowed`]). A retry asks its dependency's bucket first
//! and the global one second:
//! - the dependency refuses: nothing is taken from the global bucket, so a
//!   dependency that is down never spends the capacity retries to healthy
//!   ones need;
//! - the dependency grants or books, the global bucket refuses: a token the
//!   dependency granted now is given back; a slot it booked stays spent
//!   (erring towards fewer retries, never more);
//! - both grant or book: the retry waits for the later of the two.
//!
//! So the retries of a dependency never exceed its own bound (its bucket's,
//! `docs/fairness.md`), and all retries together never exceed the global
//! bound.
//!
//! # Pace
//! A dependency's allowed rate is recomputed from its window of successes
//! at most once a second, when it is asked or told of a success. On
//! PostgreSQL the coordination sets it instead, from the fleet's successes
//! and this replica's part of the demand ([`Dependencies::set_grant`]).
//!
//! # Bounded
//! At most `max_dependencies` are tracked one by one; the rest share one
//! entry ([`OVERFLOW_DEPENDENCY`]), paced by the default pace.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::capacity::Capacity;
use super::config::{BucketConfig, BucketConfigError};
use super::fair::{Admission, FairShares};
use super::pace::{DEFAULT_DEPENDENCY, DependenciesConfig, OVERFLOW_DEPENDENCY, SuccessWindow};
use super::{DEPENDENCY_BUDGET_EXHAUSTED, GLOBAL_CAPACITY_EXHAUSTED, TENANT_BACKLOG_FULL};
use crate::budget::token::{Answer, Pace};

/// One dependency's budget.
#[derive(Debug)]
struct Entry {
    name: Arc<str>,
    shares: FairShares,
    successes: SuccessWindow,
    /// The pace in force.
    pace: Pace,
    /// The second of the bucket's clock the pace was last computed in.
    paced_at: Option<u64>,
    /// Set by the coordination: the pace and this replica's part of it
    /// come from the fleet, not from the local window.
    coordinated: bool,
    counters: DependencyCounters,
}

impl Entry {
    fn stats(&self) -> DependencyStats {
        DependencyStats {
            name: self.name.to_string(),
            pace: self.pace,
            local_rate: self.shares.rate(),
            counters: self.counters,
        }
    }
}

/// Counters of one dependency, since it was first tracked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DependencyCounters {
    /// Calls workers reported.
    pub calls: u64,
    /// Successes: reported in traffic counts, or recorded one by one.
    pub successes: u64,
    /// Failures workers reported in traffic counts.
    pub failures: u64,
    /// Retries granted a token at once.
    pub admitted: u64,
    /// Retries deferred or refused by this dependency's budget.
    pub deferred: u64,
}

/// What one dependency looks like now, for metrics and `ReportTraffic`.
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyStats {
    /// Its name.
    pub name: String,
    /// Its pace now.
    pub pace: Pace,
    /// The rate this replica may hand out (its part of `pace.allowed` on
    /// PostgreSQL; equal to it otherwise).
    pub local_rate: f64,
    /// Its counters.
    pub counters: DependencyCounters,
}

/// What the coordination publishes of one dependency each interval.
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyReport {
    /// Its name.
    pub name: String,
    /// Successes a second here over its pace window.
    pub success_rate: f64,
    /// Tokens each tenant asked for, and whether any was held back.
    pub demand: Vec<(String, u64, bool)>,
}

/// Every dependency's budget.
#[derive(Debug)]
pub struct Dependencies {
    config: DependenciesConfig,
    /// What each dependency's bucket is built from (tenant bound, weights,
    /// reservation horizon); its rate and burst are the pace's.
    template: BucketConfig,
    entries: Vec<Entry>,
    index: HashMap<Arc<str>, usize>,
}

impl Dependencies {
    /// No dependency tracked yet.
    ///
    /// # Errors
    /// The [`BucketConfigError`] of an invalid `template`.
    pub fn new(
        config: DependenciesConfig,
        template: &BucketConfig,
    ) -> Result<Self, BucketConfigError> {
        template.validate()?;
        Ok(Self {
            config,
            template: template.clone(),
            entries: Vec::new(),
            index: HashMap::new(),
        })
    }

    /// Asks `dependency`'s budget, then `global`, for `tenant`'s retry (see
    /// the module doc).
    pub fn admit(
        &mut self,
        global: &mut FairShares,
        tenant: &str,
        dependency: &str,
        now: Duration,
        max_wait: Duration,
    ) -> Answer {
        let i = self.entry(dependency, now);
        let entry = &mut self.entries[i];
        // The pace is quoted only where the dependency's budget decided.
        let by_dependency = |admission| Answer {
            admission: scoped(admission),
            pace: Some(entry.pace),
        };
        // A token now, or a slot of the dependency's own.
        let (taken, dependency_wait) = match entry.shares.take(tenant, now) {
            Some(grant) => (Some(grant), None),
            None => match entry.shares.admit(tenant, now, max_wait) {
                Admission::Deferred { wait, reason } => (None, Some((wait, reason))),
                refused => {
                    entry.counters.deferred += 1;
                    return by_dependency(refused);
                }
            },
        };
        let global_answer = global.admit(tenant, now, max_wait);
        match (global_answer, dependency_wait) {
            (Admission::Granted, None) => {
                entry.counters.admitted += 1;
                Admission::Granted.into()
            }
            (Admission::Granted, Some((wait, reason))) => {
                entry.counters.deferred += 1;
                by_dependency(Admission::Deferred { wait, reason })
            }
            (Admission::Deferred { wait, .. }, Some((dependency_wait, dependency_reason)))
                if dependency_wait > wait =>
            {
                entry.counters.deferred += 1;
                by_dependency(Admission::Deferred {
                    wait: dependency_wait,
                    reason: dependency_reason,
                })
            }
            (deferred @ Admission::Deferred { .. }, _) => deferred.into(),
            (refused, _) => {
                if let Some(grant) = taken {
                    entry.shares.release(grant, now);
                }
                refused.into()
            }
        }
    }

    /// Counts successes and calls of `dependency` (a worker's traffic
    /// report, or one recorded success).
    pub fn count(
        &mut self,
        dependency: &str,
        now: Duration,
        calls: u64,
        successes: u64,
        failures: u64,
    ) {
        let i = self.entry(dependency, now);
        let entry = &mut self.entries[i];
        entry.successes.add(now, successes);
        let c = &mut entry.counters;
        c.calls = c.calls.saturating_add(calls);
        c.successes = c.successes.saturating_add(successes);
        c.failures = c.failures.saturating_add(failures);
    }

    /// Each tracked dependency as it is now.
    pub fn stats(&mut self, now: Duration) -> Vec<DependencyStats> {
        for i in 0..self.entries.len() {
            self.repace(i, now);
        }
        self.entries.iter().map(Entry::stats).collect()
    }

    /// The pace and counters of `dependency`, tracking it if it is new.
    pub fn stats_of(&mut self, dependency: &str, now: Duration) -> DependencyStats {
        let i = self.entry(dependency, now);
        self.entries[i].stats()
    }

    /// What the coordination publishes: each dependency's success rate, and
    /// its tenants' demand since the last call, reset.
    pub fn take_reports(&mut self, now: Duration) -> Vec<DependencyReport> {
        self.entries
            .iter_mut()
            .map(|e| {
                let mut demand = Vec::new();
                e.shares.take_demand(|tenant, asked, held_back| {
                    demand.push((tenant.to_owned(), asked, held_back > 0));
                });
                DependencyReport {
                    name: e.name.to_string(),
                    success_rate: e.successes.rate(now),
                    demand,
                }
            })
            .collect()
    }

    /// Sets `dependency`'s pace from the fleet's successes, and this
    /// replica's part of it: the coordination's answer, in force until the
    /// next one (or until [`Dependencies::uncoordinate`]).
    pub fn set_grant(&mut self, dependency: &str, pace: Pace, capacity: &Capacity, now: Duration) {
        // A dependency only other replicas track is taken on while there is
        // room, so that its first retry here finds the fleet's pace; past
        // the bound its grant would land on the shared entry, which is
        // paced by its own name's grant.
        if !self.index.contains_key(dependency)
            && self.entries.len() >= self.config.max_dependencies
        {
            return;
        }
        let i = self.entry(dependency, now);
        let e = &mut self.entries[i];
        e.pace = pace;
        e.coordinated = true;
        e.shares.set_capacity(capacity, now);
    }

    /// Every dependency paced from its local window again (a replica whose
    /// coordination lapsed).
    pub fn uncoordinate(&mut self) {
        for e in &mut self.entries {
            e.coordinated = false;
            e.paced_at = None;
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &DependenciesConfig {
        &self.config
    }

    /// A new configuration (a reload): every dependency is paced by it from
    /// its next second on; tokens booked stay booked.
    pub fn reconfigure(&mut self, config: DependenciesConfig, template: &BucketConfig) {
        self.config = config;
        self.template = template.clone();
        for e in &mut self.entries {
            e.paced_at = None;
            let window = self.config.pace_of(&e.name).window;
            e.successes.resize(window);
        }
    }

    /// The entry of `dependency` (the default one for an empty name, the
    /// shared one past the bound), its pace brought up to `now`.
    fn entry(&mut self, dependency: &str, now: Duration) -> usize {
        let name = if dependency.is_empty() {
            DEFAULT_DEPENDENCY
        } else {
            dependency
        };
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => self.insert(name),
        };
        self.repace(i, now);
        i
    }

    fn insert(&mut self, name: &str) -> usize {
        // Past the bound, the shared entry (itself tracked once).
        let name = if self.entries.len() >= self.config.max_dependencies {
            match self.index.get(OVERFLOW_DEPENDENCY) {
                Some(&i) => return i,
                None => OVERFLOW_DEPENDENCY,
            }
        } else {
            name
        };
        let config = self.config.pace_of(name);
        let pace = config.pace(0.0);
        let capacity = self.capacity(name, pace.allowed);
        // Built full at its own burst, then given its own rate.
        let full = BucketConfig {
            burst: capacity.burst,
            ..self.template.clone()
        };
        let mut shares = FairShares::new(&full).expect("the template was validated when built");
        shares.set_capacity(&capacity, Duration::ZERO);
        let name: Arc<str> = Arc::from(name);
        self.entries.push(Entry {
            name: Arc::clone(&name),
            shares,
            successes: SuccessWindow::new(config.window),
            pace,
            paced_at: None,
            coordinated: false,
            counters: DependencyCounters::default(),
        });
        self.index.insert(name, self.entries.len() - 1);
        self.entries.len() - 1
    }

    /// Recomputes entry `i`'s pace from its window, at most once a second,
    /// unless the coordination sets it.
    fn repace(&mut self, i: usize, now: Duration) {
        let second = now.as_secs();
        let e = &mut self.entries[i];
        if e.coordinated || e.paced_at == Some(second) {
            return;
        }
        e.paced_at = Some(second);
        let pace = self.config.pace_of(&e.name).pace(e.successes.rate(now));
        if pace != e.pace || e.shares.rate() == 0.0 {
            e.pace = pace;
            let capacity = self.capacity(&self.entries[i].name, pace.allowed);
            self.entries[i].shares.set_capacity(&capacity, now);
        }
    }

    /// The capacity of `dependency`'s bucket at `rate`.
    fn capacity(&self, dependency: &str, rate: f64) -> Capacity {
        let burst = self.config.pace_of(dependency).burst(rate);
        Capacity {
            rate,
            burst,
            ..Capacity::from_config(&self.template)
        }
    }
}

/// A refusal or deferral of a dependency's bucket, in its terms: its bucket
/// empty, or booked as far ahead as it books, is the dependency's budget
/// exhausted, not the global capacity nor the tenant's backlog. A tenant
/// past its share of it while others want theirs stays
/// `tenant_share_exhausted`.
fn scoped(admission: Admission) -> Admission {
    let rename = |reason| {
        if reason == GLOBAL_CAPACITY_EXHAUSTED || reason == TENANT_BACKLOG_FULL {
            DEPENDENCY_BUDGET_EXHAUSTED
        } else {
            reason
        }
    };
    match admission {
        Admission::Deferred { wait, reason } => Admission::Deferred {
            wait,
            reason: rename(reason),
        },
        Admission::Refused {
            retry_after,
            reason,
        } => Admission::Refused {
            retry_after,
            reason: rename(reason),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests;
