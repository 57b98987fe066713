//! The allocation, pure: from the live replicas' published demand and
//! grants, this replica's part of the global rate and burst, and the
//! weights its bucket shares it by.
//!
//! # Steps
//! 1. Demand is summed per tenant over the replicas. A replica's unnamed
//!    tenants (past the row's bound) are one claim of that replica alone,
//!    weighing the default weight times their count.
//! 2. Weighted max-min (water-filling) of the global rate over the claims'
//!    total demand: claims asking less than their weighted share get what
//!    they ask; the others share the rest by weight, each getting
//!    `level * weight`. Where a tenant's traffic lands plays no part, so a
//!    tenant pinned to one replica gets what one spread over all gets. A
//!    tenant held back on any replica (a request deferred or refused) asks
//!    for as much as it may get: its workers wait out their deferrals, so
//!    what it asked is only what it was given.
//! 3. Each claim's share is split over the replicas in proportion to its
//!    demand there: a replica's *need*. The rate nobody asks for (the
//!    spare) is cut into `replicas + 1` equal parts: each replica holds one
//!    beside its need, as headroom (a tenant new on it, or demand that
//!    grows, finds tokens at once), and the last part is held by nobody.
//!    So a replica that starts finds its whole target unclaimed at its
//!    first interval, without waiting for the others to give theirs back,
//!    and a replica whose demand grows takes up to that part at once.
//! 4. A replica takes `min(target, rate - others' current grants)`: never
//!    what another still holds. One that holds nothing yet takes at most
//!    half of that, so that replicas starting together, each before the
//!    others have lowered, all get a positive grant at their first
//!    interval. A replica over its target lowers to it; one under it takes
//!    what is unclaimed at once, and grows into what the others free at
//!    its next interval.
//! 5. Its burst is the global burst in proportion to its rate (rounded
//!    down, so the bursts never sum past the global one), and its bucket's
//!    weights are the tenants' rates on it, so the local fair shares
//!    reproduce the global ones. A tenant with no demand here yet weighs
//!    what a saturated tenant of its configured weight would get.

use std::collections::{BTreeMap, HashMap};

use super::demand::Demand;
use crate::bucket::BucketConfig;

/// Largest local weight: weights are rates scaled so the largest is this.
const WEIGHT_SCALE: f64 = 1_000_000.0;

/// What one live replica published.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaView {
    /// Its recent demand.
    pub demand: Demand,
    /// The rate it holds now, tokens a second.
    pub granted_rate: f64,
}

/// This replica's part of the global budget.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaGrant {
    /// Tokens a second it may hand out.
    pub rate: f64,
    /// Tokens it may hold.
    pub burst: u32,
    /// What it would take if the others held no more than their targets.
    pub target: f64,
    /// Local weights of tenants named here (rates, scaled).
    pub weights: BTreeMap<String, u32>,
    /// Local weight of every other tenant.
    pub default_weight: u32,
    /// For tenants that asked several replicas: their share of the global
    /// rate over their part here.
    pub spread: BTreeMap<String, f64>,
}

/// One claim on the global rate: a tenant, or a replica's unnamed tenants.
#[derive(Debug, Clone)]
struct Claim {
    /// Its weight under contention.
    weight: f64,
    /// Its demand on each replica, by replica index.
    demand: Vec<(usize, f64)>,
    /// Its share of the global rate (filled by `water_fill`).
    share: f64,
    /// Held back on some replica: it wants more than it asked.
    saturated: bool,
}

impl Claim {
    fn total(&self) -> f64 {
        self.demand.iter().map(|(_, d)| d).sum()
    }

    /// The part of its share that goes to a replica where it asked `here`:
    /// in proportion to what it asked there, or, when it was held back,
    /// evenly over the replicas where it asked. A tenant held back asks a
    /// replica that defers it only as fast as the replica grants (its
    /// workers wait their turn), so proportions of what it asked would
    /// starve it where it is held back; a balancer that spreads a tenant
    /// spreads it evenly.
    fn part(&self, here: f64) -> f64 {
        if self.saturated {
            self.share / self.demand.len() as f64
        } else {
            self.share * here / self.total()
        }
    }
}

/// The global split: every claim's share and every replica's target.
#[derive(Debug)]
struct Split<'a> {
    /// Named tenants' claims by name, then one claim per replica's rest.
    named: HashMap<&'a str, usize>,
    claims: Vec<Claim>,
    /// The rate each unit of weight gets under contention (`None`: nobody
    /// is held back).
    level: Option<f64>,
    /// Each replica's target rate: its need and its part of the spare.
    targets: Vec<f64>,
}

/// This replica's grant: `replicas[me]` is this replica, with the demand it
/// is about to publish.
pub fn allocate(config: &BucketConfig, replicas: &[ReplicaView], me: usize) -> ReplicaGrant {
    let split = split(config, replicas);
    let others: f64 = replicas
        .iter()
        .enumerate()
        .filter(|&(r, _)| r != me)
        .map(|(_, v)| v.granted_rate.max(0.0))
        .sum();
    let target = split.targets.get(me).copied().unwrap_or(0.0);
    // Holding nothing yet, it takes at most half of what nobody holds:
    // replicas that start together, each before the others have lowered,
    // all find some.
    let room = (config.rate - others).max(0.0);
    let holds = replicas.get(me).is_some_and(|v| v.granted_rate > 0.0);
    let rate = target.min(if holds { room } else { room / 2.0 });
    let burst = (f64::from(config.burst) * rate / config.rate).floor() as u32;

    // Local weights: the rates the split gives tenants here; a tenant not
    // yet seen here weighs what a saturated tenant of its weight gets.
    let per_weight = split.level.unwrap_or_else(|| {
        let weights: f64 = split.claims.iter().map(|c| c.weight).sum();
        let most = split
            .claims
            .iter()
            .map(|c| c.share / c.weight)
            .fold(0.0, f64::max);
        (config.rate / weights.max(1.0)).max(most)
    });
    let mut rates: BTreeMap<String, f64> = config
        .weights
        .iter()
        .map(|(t, &w)| (t.clone(), per_weight * f64::from(w)))
        .collect();
    let mut spread = BTreeMap::new();
    for (tenant, &i) in &split.named {
        let claim = &split.claims[i];
        if let Some(&(_, here)) = claim.demand.iter().find(|(r, _)| *r == me) {
            let part = claim.part(here);
            rates.insert((*tenant).to_owned(), part);
            if claim.demand.len() > 1 && part > 0.0 {
                spread.insert((*tenant).to_owned(), claim.share / part);
            }
        }
    }
    let default_rate = per_weight * f64::from(config.default_weight);
    let most = rates.values().copied().fold(default_rate, f64::max);
    let scale = |r: f64| (r / most * WEIGHT_SCALE).round().clamp(1.0, WEIGHT_SCALE) as u32;
    ReplicaGrant {
        rate,
        burst,
        target,
        weights: rates.into_iter().map(|(t, r)| (t, scale(r))).collect(),
        default_weight: scale(default_rate),
        spread,
    }
}

/// Steps 1 to 3 of the module doc.
fn split<'a>(config: &BucketConfig, replicas: &'a [ReplicaView]) -> Split<'a> {
    let mut named: HashMap<&'a str, usize> = HashMap::new();
    let mut claims: Vec<Claim> = Vec::new();
    for (r, view) in replicas.iter().enumerate() {
        // A tenant that asked for nothing claims nothing (and would divide
        // by zero below).
        for (tenant, rate) in view.demand.tenants.iter().filter(|(_, r)| *r > 0.0) {
            let i = *named.entry(tenant.as_str()).or_insert_with(|| {
                claims.push(Claim {
                    weight: f64::from(config.weight_of(tenant)),
                    demand: Vec::new(),
                    share: 0.0,
                    saturated: false,
                });
                claims.len() - 1
            });
            claims[i].demand.push((r, *rate));
            claims[i].saturated |= view.demand.saturated.iter().any(|s| s == tenant);
        }
    }
    for (r, view) in replicas.iter().enumerate() {
        if view.demand.rest_rate > 0.0 {
            claims.push(Claim {
                weight: f64::from(config.default_weight)
                    * f64::from(view.demand.rest_tenants.max(1)),
                demand: vec![(r, view.demand.rest_rate)],
                share: 0.0,
                saturated: false,
            });
        }
    }
    let level = water_fill(config.rate, &mut claims);
    let mut targets = vec![0.0; replicas.len()];
    let mut given = 0.0;
    for c in &claims {
        for &(r, d) in &c.demand {
            targets[r] += c.part(d);
        }
        given += c.share;
    }
    let headroom = (config.rate - given).max(0.0) / (replicas.len() + 1) as f64;
    for t in &mut targets {
        *t += headroom;
    }
    Split {
        named,
        claims,
        level,
        targets,
    }
}

/// Weighted max-min of `rate` over the claims' total demand; returns the
/// rate per unit of weight of the claims held back, if any is.
fn water_fill(rate: f64, claims: &mut [Claim]) -> Option<f64> {
    let mut order: Vec<usize> = (0..claims.len()).collect();
    // A tenant held back asks for as much as it may get.
    let ask = |c: &Claim| {
        if c.saturated {
            f64::INFINITY
        } else {
            c.total() / c.weight
        }
    };
    order.sort_unstable_by(|&a, &b| ask(&claims[a]).total_cmp(&ask(&claims[b])));
    let mut left = rate;
    let mut weight: f64 = claims.iter().map(|c| c.weight).sum();
    for (k, &i) in order.iter().enumerate() {
        let level = left / weight;
        if ask(&claims[i]) <= level {
            claims[i].share = claims[i].total();
            left -= claims[i].share;
            weight -= claims[i].weight;
        } else {
            for &j in &order[k..] {
                claims[j].share = level * claims[j].weight;
            }
            return Some(level);
        }
    }
    None
}

#[cfg(test)]
mod tests;
