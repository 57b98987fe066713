//! The algorithm: one global token meter, and a timeline of slots per tenant
//! spaced by the tenant's fair share. Pure: time is a parameter (`now`,
//! since an arbitrary monotonic epoch), nothing here reads a clock, locks or
//! allocates for a known tenant, so a simulation is exact and repeatable.
//!
//! # The global meter
//! A token bucket written as a meter (GCRA): `meter` is the time at which
//! the refill will have paid for every token taken so far. The bucket holds
//! `(now - meter) * rate` tokens, at most `burst` (the meter never lags
//! `now` by more than `burst / rate`). Taking a token, granted now or booked
//! for later, moves the meter one token interval (`1 / rate`) ahead; an
//! unused token returned, or a success deposit, moves it back. The meter
//! runs ahead of `now` when the bucket has promised tokens the refill has
//! not paid for yet.
//!
//! # Fair shares
//! A tenant is *backlogged* while its next free slot (`next`) lies in the
//! future. Its share interval is `token interval * W / w`, where `w` is its
//! weight and `W` the summed weight of the backlogged tenants, itself
//! included: with the whole refill shared by weight among the tenants that
//! want it now, a tenant may take one token every share interval. Each token
//! it takes moves its `next` one share interval on.
//!
//! A tenant that asks for less than its share goes idle between requests,
//! so its weight counts only while it holds a share: the others get the
//! rest (work-conserving), and every tenant ends up with about its weighted
//! max-min fair share, as in processor sharing.
//!
//! # Admission
//! - An idle tenant (within its share) is granted at once, even when the
//!   bucket is empty: this is what lets a newcomer through a flood within
//!   one share interval. The bucket pays for it by running ahead of its
//!   rate, up to the over-commit bound (`2 * max_reservation` ahead).
//! - A backlogged tenant is granted at once only from tokens nobody has a
//!   claim on (the bucket holds at least one): spare capacity goes to
//!   whoever asks.
//! - Otherwise, when asked to, the bucket books the tenant's next slot and
//!   answers how long to wait: a reservation, one share interval after the
//!   tenant's previous one, so a burst of deferrals spreads out.
//! - Nothing is booked past the horizon: a slot more than
//!   `max_reservation` away is refused, and so is any booking once
//!   bookings have pushed the meter `3/2 * max_reservation` ahead. Tenants
//!   at their shares book about one horizon ahead together, so the extra
//!   half keeps bookings of different tenants from racing for room, and the
//!   last half-horizon, up to the over-commit bound, is kept for tenants
//!   within their share: newcomers.
//! - A refusal books nothing, but gives the request a turn in the tenant's
//!   queue of refused requests, one share interval after the previous turn:
//!   it comes back about when a slot can be booked for it, so a refused
//!   request asks about twice, not in a loop, and refused requests do not
//!   come back as a herd. The queue promises nothing (the slot is not
//!   counted); a turn later than the caller's `max_wait` is not taken.
//!
//! # The bound
//! Every token moves the meter, and no token moves it past `now + 2 *
//! max_reservation`: the tokens taken by any time `t` (and so those used)
//! never exceed `burst + rate * (t + 2 * max_reservation)` plus the success
//! deposits. Reservations are promises kept even when a newcomer arrives
//! later; this bound is the price of keeping both the promises and the
//! newcomer's share.
//!
//! # A capacity set at run time
//! [`FairShares::set_capacity`] changes the rate, burst and weights. The
//! tokens held carry over as tokens (at most the new burst), and a meter
//! ahead of `now` carries over as the same number of tokens promised, now
//! paid for at the new rate: lowering the rate slows the refill at once,
//! and what was booked stays booked. Slots ahead (`next`, the refused
//! turns) are stretched or shrunk by the ratio of the token intervals, so
//! a tenant's place in the timeline keeps its meaning in tokens. A closed
//! bucket (no rate) grants and books nothing; what it still holds or owes
//! (up to its burst, 0 for [`Capacity::closed`]) waits, frozen, for the
//! next capacity.
//!
//! # Demand
//! Each tenant entry counts the tokens asked for (every admission, and
//! every token taken at once), read and reset by [`FairShares::take_demand`]:
//! a replica publishes these counts so that the global budget can be shared
//! by where the demand is. Counting is one add on an entry the request
//! touches anyway.
//!
//! # Where
//! This file holds the types and the entry points (admission, taking a
//! token); `meter` the global meter, `shares` the fair shares and the
//! demand counts, `booking` granting a token now or booking a slot, and
//! `reconfigure` a capacity set at run time.

use std::sync::Arc;
use std::time::Duration;

use super::capacity::Capacity;
use super::config::{BucketConfig, BucketConfigError, MAX_RATE};
use super::tenants::{OVERFLOW, Tenants};

/// Times and durations inside, in nanoseconds. Every input is clamped below
/// a quarter of `i64::MAX` (73 years), so sums never overflow.
type Nanos = i64;

const NANOS_LIMIT: Nanos = i64::MAX / 4;

/// What booking a token answers ([`FairShares::admit`]): a token now, a
/// slot booked for later, or a refusal with when to ask again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Booking {
    /// A token is taken now.
    Granted,
    /// The tenant's next free slot is booked, `wait` from now.
    Booked {
        /// How long until the booked slot.
        wait: Duration,
        /// Why: `tenant_share_exhausted` or `global_capacity_exhausted`.
        reason: &'static str,
    },
    /// Nothing booked: ask again after `retry_after` (the request's turn in
    /// the tenant's queue of refused requests).
    Refused {
        /// When to ask again.
        retry_after: Duration,
        /// Why: `tenant_backlog_full`, `global_capacity_exhausted` or
        /// `reservation_past_max_wait`.
        reason: &'static str,
    },
}

/// A token taken now that may still be returned unused
/// ([`FairShares::release`]). Opaque: it says which tenant's share to give
/// back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The tenant's entry.
    index: u32,
    /// The entry's generation, so a token returned after the tenant was
    /// evicted does not touch its successor.
    generation: u32,
    /// How far the grant moved the tenant's next slot (0 for spare tokens).
    charged: Nanos,
}

/// A request that could not be granted now, with what booking needs.
struct ToBook {
    /// The tenant's entry.
    index: u32,
    /// Its next free slot.
    next: Nanos,
    /// Its share interval now.
    share: Nanos,
    /// Summed weight of the other backlogged tenants.
    others: u64,
}

/// A closed bucket's state.
#[derive(Debug, Clone, Copy)]
struct Closed {
    /// When to ask again.
    retry_after: Nanos,
    /// Tokens held when it closed (negative: promised ahead), kept for the
    /// next capacity.
    held: f64,
}

/// The global bucket with weighted fair per-tenant shares, as pure state.
#[derive(Debug)]
pub struct FairShares {
    /// One token interval (`1 / rate`).
    token: Nanos,
    /// `burst` token intervals: how far the meter may lag `now`.
    burst: Nanos,
    /// The reservation horizon: the latest slot bookable is `now + horizon`.
    horizon: Nanos,
    /// How far ahead of `now` bookings may push the meter: 3/2 of the
    /// horizon (see the module doc).
    booking_bound: Nanos,
    /// The over-commit bound: the meter never runs further than this
    /// ahead of `now` (twice the horizon, see the module doc).
    overcommit: Nanos,
    /// What one success deposit moves the meter back.
    deposit: Nanos,
    /// Tokens a success deposits, to scale `deposit` when the rate changes.
    success_deposit: f64,
    /// The current capacity, for the weights of new tenants.
    capacity: Capacity,
    /// Set while the bucket has no rate: what it holds and what it answers.
    closed: Option<Closed>,
    /// The time at which the refill has paid for every token taken.
    meter: Nanos,
    /// The tenants and their slots.
    tenants: Tenants,
}

impl FairShares {
    /// A full bucket at time zero.
    ///
    /// # Errors
    /// The [`BucketConfigError`] of an invalid configuration.
    pub fn new(config: &BucketConfig) -> Result<Self, BucketConfigError> {
        config.validate()?;
        // Validated: rate within [MIN_RATE, MAX_RATE], so the interval is
        // between 1 µs and 1000 s.
        let token = (1e9 / config.rate).round() as Nanos;
        let horizon = nanos(Duration::from_millis(config.max_reservation_ms));
        let burst = token
            .saturating_mul(Nanos::from(config.burst))
            .min(NANOS_LIMIT);
        Ok(Self {
            token,
            burst,
            horizon,
            booking_bound: horizon / 2 * 3,
            overcommit: horizon.saturating_mul(2).min(NANOS_LIMIT),
            deposit: (config.success_deposit * token as f64).min(NANOS_LIMIT as f64) as Nanos,
            meter: -burst,
            tenants: Tenants::new(config.max_tenants, config.default_weight),
            success_deposit: config.success_deposit,
            capacity: Capacity::from_config(config),
            closed: None,
        })
    }

    /// Whether the bucket has no rate (see [`FairShares::set_capacity`]).
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// The capacity in force (see [`FairShares::set_capacity`]).
    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    /// The refill rate in force, tokens a second (0 when closed).
    pub fn rate(&self) -> f64 {
        if self.closed.is_some() {
            0.0
        } else {
            1e9 / self.token as f64
        }
    }

    /// Takes a token for `tenant` now if its share or spare capacity allows,
    /// without booking anything otherwise. The token can be returned with
    /// [`FairShares::release`].
    pub fn take(&mut self, tenant: &str, now: Duration) -> Option<Grant> {
        let grant = self.grant_now(tenant, nanos(now)).ok()?;
        self.tenants.get_mut(grant.index).asked += 1;
        Some(grant)
    }

    /// Takes a token for `tenant` now, or books its next free slot if that
    /// comes within `max_wait` and the horizon; a token granted here is
    /// spent for good.
    pub fn admit(&mut self, tenant: &str, now: Duration, max_wait: Duration) -> Booking {
        let now = nanos(now);
        match self.grant_now(tenant, now) {
            Ok(grant) => {
                self.tenants.get_mut(grant.index).asked += 1;
                Booking::Granted
            }
            Err(pending) => {
                let t = self.tenants.get_mut(pending.index);
                t.asked += 1;
                t.held_back += 1;
                self.book(pending, now, nanos(max_wait))
            }
        }
    }

    /// Tenants tracked one by one (the overflow entry not counted).
    pub fn tracked_tenants(&self) -> usize {
        self.tenants.len()
    }

    /// Each tracked tenant, the overflow entry first: its id, weight, and
    /// tokens granted or booked less tokens returned.
    pub fn tenants(&self) -> impl Iterator<Item = (&str, u32, u64)> {
        self.tenants
            .iter()
            .map(|t| (t.name.as_ref(), t.weight, t.tokens))
    }

    /// [`FairShares::take`], and the tracked id equal to `tenant`, shared
    /// rather than copied, or `None` when `tenant` is not tracked on its
    /// own (it is counted in the overflow entry). One lookup for both.
    pub fn take_named(&mut self, tenant: &str, now: Duration) -> (Option<Grant>, Option<Arc<str>>) {
        let (grant, index) = match self.grant_now(tenant, nanos(now)) {
            Ok(grant) => {
                let index = grant.index;
                self.tenants.get_mut(index).asked += 1;
                (Some(grant), index)
            }
            Err(pending) => (None, pending.index),
        };
        let name = (index != OVERFLOW).then(|| Arc::clone(&self.tenants.get(index).name));
        (grant, name)
    }
}

fn nanos(d: Duration) -> Nanos {
    d.as_nanos().min(NANOS_LIMIT as u128) as Nanos
}

fn duration(n: Nanos) -> Duration {
    Duration::from_nanos(n.max(0) as u64)
}

mod booking;
mod meter;
mod reconfigure;
mod shares;
#[cfg(test)]
mod tests;
