//! Fair shares and demand (see the module doc of [`super`]): a tenant's
//! share interval and share of the rate, why a token it did not get was
//! held back, and the counts of tokens asked for that a replica publishes.

use std::time::Duration;

use super::{FairShares, NANOS_LIMIT, Nanos, nanos};
use crate::bucket::{GLOBAL_CAPACITY_EXHAUSTED, TENANT_SHARE_EXHAUSTED};

impl FairShares {
    /// Hands each tenant's count of tokens asked for since the last call,
    /// and of those held back (deferred or refused), to `each`, and resets
    /// the counts. Tenants that asked for nothing are
    /// left out; an evicted tenant's count is lost with it (it was idle the
    /// longest, so it is small).
    pub fn take_demand(&mut self, mut each: impl FnMut(&str, u64, u64)) {
        self.tenants
            .take_asked(|name, asked, held_back| each(name, asked, held_back));
    }

    /// Counts a token `tenant` asked for and did not get (a [`take`] that
    /// failed) as held back, and says why, for a deferral's reason: its
    /// share is spent while others want theirs ([`TENANT_SHARE_EXHAUSTED`]),
    /// or the bucket is ([`GLOBAL_CAPACITY_EXHAUSTED`]). Held back, the
    /// tenant's demand is published as wanting more than it asked: a
    /// deferred worker waits its turn before asking again, so what it asks
    /// is what it gets.
    ///
    /// [`take`]: FairShares::take
    pub fn refuse(&mut self, tenant: &str, now: Duration) -> &'static str {
        let now = nanos(now);
        self.tenants.expire(now);
        self.hold_back(tenant);
        let others = match self.tenants.find(tenant) {
            Some(i) => {
                let t = self.tenants.get(i);
                let own = if t.next > now { u64::from(t.weight) } else { 0 };
                self.tenants.backlogged_weight() - own
            }
            None => self.tenants.backlogged_weight(),
        };
        if self.closed.is_none() && others > 0 {
            TENANT_SHARE_EXHAUSTED
        } else {
            GLOBAL_CAPACITY_EXHAUSTED
        }
    }

    /// Counts a token `tenant` wanted and did not ask for as held back: a
    /// retry waiting behind its tenant's line, which asks for no token
    /// while older places want theirs.
    pub fn hold_back(&mut self, tenant: &str) {
        if let Some(i) = self.tenants.find(tenant) {
            let t = self.tenants.get_mut(i);
            t.asked += 1;
            t.held_back += 1;
        }
    }

    /// Tokens a second `tenant` may count on now: its weighted share of the
    /// rate among the tenants that want theirs, itself included, over the
    /// replicas it asks ([`Capacity::spread`](crate::bucket::Capacity::spread)).
    pub fn share_rate(&mut self, tenant: &str, now: Duration) -> f64 {
        if self.closed.is_some() {
            return 0.0;
        }
        let now = nanos(now);
        self.tenants.expire(now);
        let weight = match self.tenants.find(tenant) {
            Some(i) => u64::from(self.tenants.get(i).weight),
            None => u64::from(self.capacity.weight_of(tenant)),
        };
        let own_backlogged = self
            .tenants
            .find(tenant)
            .is_some_and(|i| self.tenants.get(i).next > now);
        let total = self.tenants.backlogged_weight() + if own_backlogged { 0 } else { weight };
        self.rate() * weight as f64 / total.max(1) as f64 * self.capacity.spread_of(tenant)
    }
}

/// `token * total / weight`, clamped (u128 arithmetic: no overflow).
pub(super) fn share_interval(token: Nanos, total: u64, weight: u64) -> Nanos {
    let share = token as u128 * u128::from(total) / u128::from(weight.max(1));
    share.min(NANOS_LIMIT as u128) as Nanos
}
