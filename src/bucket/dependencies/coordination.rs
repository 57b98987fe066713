//! The coordination's side (see the module doc of [`super`]): what this
//! replica publishes of each dependency every interval, and the fleet's
//! allowance it is given back, or none when the coordination lapsed.

use std::collections::HashMap;
use std::time::Duration;

use super::Dependencies;
use super::stats::success_rate;
use crate::bucket::capacity::Capacity;
use crate::bucket::health::Fates;

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

impl Dependencies {
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
}
