//! The fleet's grants applied here: each dependency's fleet-wide allowance
//! and this replica's part of it, read from the replicas' rows, and the
//! capacities the grants give the bucket and the dependencies' budgets.

use super::Replica;
use crate::bucket::{BucketConfig, Capacity, FleetGrant};
use crate::coord::allocation::{ReplicaGrant, ReplicaView, allocate};
use crate::coord::demand::Demand;

impl Replica {
    /// Each dependency any live replica tracks: its fleet-wide allowance
    /// (the replicas' own, weighted by the requests each saw, as a
    /// replica weighs its tenants) and this replica's part of it, split as
    /// the global rate is ([`allocate`], with the dependency's allowance
    /// for the global one). A dependency new here thus finds its fleet's
    /// pace at its first retry.
    pub(super) fn allocate_dependencies(
        &self,
        views: &[ReplicaView],
    ) -> Vec<(String, FleetGrant, ReplicaGrant)> {
        let config = self.bucket.dependencies_config();
        let names: std::collections::BTreeSet<&str> = views
            .iter()
            .flat_map(|v| v.demand.dependencies.iter().map(|d| d.name.as_str()))
            .collect();
        names
            .into_iter()
            .take(config.max_dependencies.saturating_add(1))
            .map(|name| {
                let pace_config = config.pace_of(name);
                let limits = pace_config.limits(self.budget.rate);
                let allowed = match pace_config.rate {
                    Some(rate) => rate,
                    None => crate::bucket::health::blend(
                        views
                            .iter()
                            .filter_map(|v| v.demand.dependency(name))
                            .filter(|d| d.allowance > 0.0)
                            .map(|d| (d.allowance, d.seen)),
                        limits.initial,
                    )
                    .clamp(limits.floor, limits.cap),
                };
                let budget = BucketConfig {
                    rate: allowed,
                    burst: pace_config.burst(allowed),
                    ..self.budget.clone()
                };
                let dependency_views: Vec<ReplicaView> = views
                    .iter()
                    .map(|v| match v.demand.dependency(name) {
                        Some(d) => ReplicaView {
                            demand: d.demand.clone(),
                            granted_rate: d.granted_rate,
                        },
                        None => ReplicaView {
                            demand: Demand::default(),
                            granted_rate: 0.0,
                        },
                    })
                    .collect();
                let mut fates: std::collections::HashMap<String, crate::bucket::health::Fates> =
                    std::collections::HashMap::new();
                for d in views.iter().filter_map(|v| v.demand.dependency(name)) {
                    for (tenant, f) in &d.fates {
                        let sum = fates.entry(tenant.clone()).or_default();
                        sum.granted = sum.granted.saturating_add(f.granted);
                        sum.failed = sum.failed.saturating_add(f.failed);
                        sum.failed_recently = sum.failed_recently.saturating_add(f.failed_recently);
                    }
                }
                (
                    name.to_owned(),
                    FleetGrant { allowed, fates },
                    allocate(&budget, &dependency_views, 0),
                )
            })
            .collect()
    }

    /// Gives dependency `name`'s budget `rate` and `burst` with the grant's
    /// weights, and the fleet's allowance.
    pub(super) fn apply_dependency(
        &mut self,
        name: &str,
        fleet: &FleetGrant,
        grant: &ReplicaGrant,
        (rate, burst): (f64, u32),
    ) {
        self.bucket
            .set_dependency_grant(name, fleet.clone(), &self.capacity(grant, rate, burst));
        self.applied_dependencies
            .insert(name.to_owned(), (rate, burst));
    }

    /// Gives the bucket `rate` and `burst` with the grant's weights.
    pub(super) fn apply(&mut self, grant: &ReplicaGrant, (rate, burst): (f64, u32)) {
        self.bucket.set_capacity(&self.capacity(grant, rate, burst));
        self.applied = (rate, burst);
    }

    /// `rate` and `burst` with the grant's weights and spread.
    fn capacity(&self, grant: &ReplicaGrant, rate: f64, burst: u32) -> Capacity {
        Capacity {
            rate,
            burst,
            default_weight: grant.default_weight,
            weights: grant.weights.clone(),
            spread: grant.spread.clone(),
            closed_retry_after: self.config.interval,
        }
    }
}
