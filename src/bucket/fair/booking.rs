//! The booking of places (see the module doc of [`super`]): a token granted
//! now from a tenant's share or spare capacity, else the tenant's next slot
//! booked, else a refusal with the request's turn in the tenant's queue of
//! refused requests.

use super::shares::share_interval;
use super::{Booking, FairShares, Grant, Nanos, ToBook, duration};
use crate::bucket::{
    GLOBAL_CAPACITY_EXHAUSTED, RESERVATION_PAST_MAX_WAIT, TENANT_BACKLOG_FULL,
    TENANT_SHARE_EXHAUSTED,
};

impl FairShares {
    /// Grants a token now if the tenant is within its share (and the meter
    /// within its bound) or the bucket holds a spare one.
    pub(super) fn grant_now(&mut self, tenant: &str, now: Nanos) -> Result<Grant, ToBook> {
        self.tenants.expire(now);
        let capacity = &self.capacity;
        let index = self.tenants.lookup(tenant, |name| capacity.weight_of(name));
        if self.closed.is_some() {
            return Err(ToBook {
                index,
                next: now,
                share: 0,
                others: 0,
            });
        }
        self.refill(now);
        let t = self.tenants.get(index);
        let (weight, next, generation) = (u64::from(t.weight), t.next, t.generation);
        let backlogged = next > now;
        let others = self.tenants.backlogged_weight() - if backlogged { weight } else { 0 };
        let share = share_interval(self.token, others + weight, weight);
        let within_bound = self.meter + self.token <= now + self.overcommit;

        let charged = if !backlogged && within_bound {
            self.tenants.set_next(index, now + share, now);
            share
        } else if backlogged && self.meter + self.token <= now {
            0 // a spare token: nobody has a claim on it
        } else {
            return Err(ToBook {
                index,
                next,
                share,
                others,
            });
        };
        self.meter += self.token;
        self.tenants.get_mut(index).tokens += 1;
        Ok(Grant {
            index,
            generation,
            charged,
        })
    }

    /// Books the tenant's next free slot, or refuses.
    pub(super) fn book(&mut self, p: ToBook, now: Nanos, max_wait: Nanos) -> Booking {
        if let Some(closed) = self.closed {
            return Booking::Refused {
                retry_after: duration(closed.retry_after),
                reason: if closed.retry_after > max_wait {
                    past_max_wait(max_wait, GLOBAL_CAPACITY_EXHAUSTED)
                } else {
                    GLOBAL_CAPACITY_EXHAUSTED
                },
            };
        }
        let room = now + self.booking_bound;
        // Not granted although within the over-commit bound: backlogged, so
        // the slot is in the future.
        let (earliest, reason) = if self.meter + self.token > room {
            (
                now + (self.meter + self.token - room),
                GLOBAL_CAPACITY_EXHAUSTED,
            )
        } else if p.next - now > self.horizon {
            (p.next - self.horizon, TENANT_BACKLOG_FULL)
        } else {
            let wait = p.next - now;
            let reason = if p.others > 0 {
                TENANT_SHARE_EXHAUSTED
            } else {
                GLOBAL_CAPACITY_EXHAUSTED
            };
            if wait > max_wait {
                return Booking::Refused {
                    retry_after: duration(wait),
                    reason: past_max_wait(max_wait, reason),
                };
            }
            self.meter += self.token;
            self.tenants.get_mut(p.index).tokens += 1;
            self.tenants.set_next(p.index, p.next + p.share, now);
            return Booking::Booked {
                wait: duration(wait),
                reason,
            };
        };
        // Refused: the request takes the next turn in the tenant's queue of
        // refused requests, one share interval after the previous one, so it
        // comes back about when a slot can be booked for it (and not with
        // the others).
        let t = self.tenants.get_mut(p.index);
        let turn = t.refused_until.max(earliest);
        let retry_after = turn - now;
        if retry_after > max_wait {
            // It will not come back: it takes no turn.
            return Booking::Refused {
                retry_after: duration(retry_after),
                reason: past_max_wait(max_wait, reason),
            };
        }
        t.refused_until = turn.saturating_add(p.share);
        Booking::Refused {
            retry_after: duration(retry_after),
            reason,
        }
    }
}

/// The reason of a refusal because the slot comes later than `max_wait`: a
/// caller that cannot wait at all (0, the stateless pure form) is told why
/// there is no token now, not that it cannot wait.
fn past_max_wait(max_wait: Nanos, reason: &'static str) -> &'static str {
    if max_wait == 0 {
        reason
    } else {
        RESERVATION_PAST_MAX_WAIT
    }
}
