//! The global meter (see the module doc of [`super`]): refilled up to the
//! burst, moved back by a token returned unused or a success deposit, and
//! read as the tokens held.

use std::time::Duration;

use super::{FairShares, Grant, Nanos, nanos};

impl FairShares {
    /// Gives back a token taken by [`FairShares::take`] and not used: to the
    /// bucket, and to the tenant's share.
    pub fn release(&mut self, grant: Grant, now: Duration) {
        let now = nanos(now);
        self.tenants.expire(now);
        if let Some(closed) = &mut self.closed {
            closed.held += 1.0;
        } else {
            self.refill(now);
            self.meter = (self.meter - self.token).max(now - self.burst);
        }
        let i = grant.index;
        if self.tenants.get(i).generation != grant.generation {
            return; // evicted meanwhile: its share is gone already
        }
        let t = self.tenants.get_mut(i);
        t.tokens = t.tokens.saturating_sub(1);
        if grant.charged > 0 {
            let next = t.next - grant.charged;
            self.tenants.set_next(i, next, now);
        }
    }

    /// Adds the configured `success_deposit` to the bucket (up to `burst`).
    pub fn deposit_success(&mut self, now: Duration) {
        if self.closed.is_some() {
            return; // nothing to deposit into: the next capacity starts afresh
        }
        let now = nanos(now);
        self.refill(now);
        self.meter = (self.meter - self.deposit).max(now - self.burst);
    }

    /// Tokens in the bucket at `now`; negative when it has promised tokens
    /// the refill has not yet paid for.
    pub fn level(&self, now: Duration) -> f64 {
        if let Some(closed) = self.closed {
            return closed.held;
        }
        let now = nanos(now);
        (now - self.meter.max(now - self.burst)) as f64 / self.token as f64
    }

    /// The bucket never holds more than `burst`: time spent full is lost.
    pub(super) fn refill(&mut self, now: Nanos) {
        self.meter = self.meter.max(now - self.burst);
    }
}
