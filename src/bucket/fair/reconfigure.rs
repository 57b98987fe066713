//! A running bucket reconfigured: a new capacity (a reload, or a replica's
//! part of the global budget) and a new success deposit, from `now` on.

use std::time::Duration;

use super::{Closed, FairShares, MAX_RATE, NANOS_LIMIT, Nanos, nanos};
use crate::bucket::capacity::Capacity;

impl FairShares {
    /// Changes the rate, burst and weights from `now` on (see the module
    /// doc): tokens held are kept up to the new burst, tokens promised stay
    /// promised, and a rate below the least accepted closes the bucket.
    pub fn set_capacity(&mut self, capacity: &Capacity, now: Duration) {
        let now = nanos(now);
        self.tenants.expire(now);
        let held = match self.closed {
            Some(closed) => closed.held,
            None => {
                self.refill(now);
                (now - self.meter) as f64 / self.token as f64
            }
        };
        let held = held.min(f64::from(capacity.burst));
        if capacity.is_closed() {
            self.closed = Some(Closed {
                retry_after: nanos(capacity.closed_retry_after),
                held,
            });
        } else {
            // Rounded up: the bucket never runs faster than it is given,
            // so the replicas' rates never sum past the global one.
            let token = (1e9 / capacity.rate.min(MAX_RATE)).ceil() as Nanos;
            if self.closed.is_none() {
                self.tenants.rescale_ahead(now, token, self.token);
            }
            self.token = token;
            self.burst = token
                .saturating_mul(Nanos::from(capacity.burst))
                .min(NANOS_LIMIT);
            self.deposit = (self.success_deposit * token as f64).min(NANOS_LIMIT as f64) as Nanos;
            let ahead = (-held * token as f64).clamp(-(self.burst as f64), NANOS_LIMIT as f64);
            self.meter = now.saturating_add(ahead as Nanos).min(NANOS_LIMIT);
            self.closed = None;
        }
        self.tenants.reweigh(
            |name| capacity.weight_of(name),
            capacity.default_weight.max(1),
        );
        self.capacity = capacity.clone();
    }

    /// Sets the tokens each success deposits from now on (a reload).
    pub fn set_success_deposit(&mut self, success_deposit: f64) {
        self.success_deposit = success_deposit;
        self.deposit = (success_deposit * self.token as f64).min(NANOS_LIMIT as f64) as Nanos;
    }
}
