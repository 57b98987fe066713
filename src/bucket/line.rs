//! A tenant's line of deferred retries to one dependency: each takes a
//! place when it is first deferred, and the tokens the tenant's share
//! brings go to the places in order, oldest first. Pure: time is a
//! parameter.
//!
//! # Why a line
//! After an outage the retries deferred during it are the work users wait
//! for; whoever waited longest should go first, and a fresh failure of the
//! same tenant should wait behind them. The worker of a deferred activity
//! is not present while it sleeps: it comes back at its `not_before`. So
//! the line hands a token to its first place as soon as the tenant's share
//! has one (the place is *served*), whether or not its worker is here yet;
//! the worker finds its place served when it asks again and goes at once.
//! Its `not_before` was chosen for about then: the line's length over the
//! tenant's rate, never more than the deferral horizon.
//!
//! # Places whose workers do not come back
//! A place is *live* while its worker asked within the last
//! [`Line::liveness`] (a deferral horizon and a few seconds: a live worker
//! asks at least once a horizon). Places that are no longer live are skipped, not served,
//! so an activity abandoned meanwhile costs no token; a served place whose
//! worker does not come back within the same time is forgotten, its token
//! spent (erring towards fewer retries).
//!
//! # After a restart, or on another replica
//! The place is the time of the first deferral, kept in the activity's
//! record: a worker asking a line that does not know it (a restarted
//! service, another replica) takes its place again by that time, so the
//! order of first deferral holds among the workers that come back, within
//! one horizon.

use std::collections::{BTreeMap, HashMap};

use foldhash::fast::RandomState;

/// Times in nanoseconds of the bucket's clock.
type Nanos = i64;

/// How late a worker may come back after the time it was given and keep
/// its place: its scheduler's delay and a round trip.
const LATENESS: Nanos = 5_000_000_000;

/// Most places a line holds: past it, a deferral takes no place (and is
/// told so).
pub const MAX_PLACES: usize = 100_000;

/// A place in line: when the activity was first deferred (unix
/// milliseconds, from its record), and the activity's id, hashed, to tell
/// places of the same millisecond apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    /// The first deferral, unix milliseconds.
    pub since_ms: i64,
    /// The activity.
    pub id: u64,
}

/// One tenant's line to one dependency.
#[derive(Debug, Default)]
pub struct Line {
    /// Places not served yet, oldest first, with when their worker last
    /// asked.
    waiting: BTreeMap<Place, Nanos>,
    /// Places served and not yet claimed, with when they were served.
    served: HashMap<u64, Nanos, RandomState>,
}

/// What a line says of a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Its turn came: its token is taken.
    Served,
    /// Waiting behind `ahead` live places (counted up to the bound asked).
    Waiting {
        /// Live places ahead of it.
        ahead: usize,
    },
    /// The line is full: no place was taken.
    Full,
}

impl Line {
    /// How long a place stays live after its worker last asked, or a served
    /// place waits for its worker: a deferral horizon (a worker is never
    /// told to come back later than that) and a few seconds of lateness.
    pub fn liveness(horizon: Nanos) -> Nanos {
        horizon.saturating_add(LATENESS)
    }

    /// Whether the line has a live place waiting, forgetting the ones at
    /// its head that are no longer live.
    pub fn has_waiting(&mut self, now: Nanos, horizon: Nanos) -> bool {
        let live = Self::liveness(horizon);
        while let Some((_, &asked)) = self.waiting.first_key_value() {
            if now.saturating_sub(asked) <= live {
                return true;
            }
            self.waiting.pop_first();
        }
        false
    }

    /// Serves the first live place: a token was taken for it. Returns it.
    pub fn serve(&mut self, now: Nanos, horizon: Nanos) -> Option<Place> {
        if !self.has_waiting(now, horizon) {
            return None;
        }
        let (place, _) = self.waiting.pop_first()?;
        self.served.insert(place.id, now);
        Some(place)
    }

    /// Where `place` stands, its worker asking now: served (and claimed,
    /// so it is gone from the line), or waiting (taking its place if the
    /// line did not hold it), with the live places ahead counted up to
    /// `count_up_to`.
    pub fn ask(
        &mut self,
        place: Place,
        now: Nanos,
        horizon: Nanos,
        count_up_to: usize,
    ) -> Standing {
        if self.served.remove(&place.id).is_some() {
            self.waiting.remove(&place);
            return Standing::Served;
        }
        if let Some(asked) = self.waiting.get_mut(&place) {
            *asked = now;
        } else if self.waiting.len() >= MAX_PLACES {
            return Standing::Full;
        } else {
            self.waiting.insert(place, now);
        }
        let live = Self::liveness(horizon);
        let ahead = self
            .waiting
            .range(..place)
            .filter(|(_, asked)| now.saturating_sub(**asked) <= live)
            .take(count_up_to)
            .count();
        Standing::Waiting { ahead }
    }

    /// Live places waiting, counted up to `count_up_to`: how far back a
    /// newcomer that takes no place stands.
    pub fn waiting(&self, now: Nanos, horizon: Nanos, count_up_to: usize) -> usize {
        let live = Self::liveness(horizon);
        self.waiting
            .values()
            .filter(|asked| now.saturating_sub(**asked) <= live)
            .take(count_up_to)
            .count()
    }

    /// Removes `place` (its activity stopped, succeeded, or took a token
    /// some other way).
    pub fn leave(&mut self, place: Place) {
        self.waiting.remove(&place);
        self.served.remove(&place.id);
    }

    /// Forgets served places whose workers did not come back in time.
    pub fn expire(&mut self, now: Nanos, horizon: Nanos) {
        let live = Self::liveness(horizon);
        if !self.served.is_empty() {
            self.served
                .retain(|_, served| now.saturating_sub(*served) <= live);
        }
    }

    /// Whether the line holds nothing.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.served.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const HORIZON: Nanos = 10 * S;

    fn place(since_ms: i64, id: u64) -> Place {
        Place { since_ms, id }
    }

    #[test]
    fn places_are_served_oldest_first_whatever_the_order_they_ask_in() {
        let mut line = Line::default();
        assert_eq!(
            line.ask(place(300, 3), 0, HORIZON, 100),
            Standing::Waiting { ahead: 0 }
        );
        assert_eq!(
            line.ask(place(100, 1), 0, HORIZON, 100),
            Standing::Waiting { ahead: 0 }
        );
        assert_eq!(
            line.ask(place(200, 2), 0, HORIZON, 100),
            Standing::Waiting { ahead: 1 }
        );
        assert_eq!(
            line.ask(place(300, 3), S, HORIZON, 100),
            Standing::Waiting { ahead: 2 }
        );
        assert_eq!(line.serve(S, HORIZON), Some(place(100, 1)));
        assert_eq!(
            line.ask(place(300, 3), S, HORIZON, 100),
            Standing::Waiting { ahead: 1 }
        );
        assert_eq!(
            line.ask(place(100, 1), 2 * S, HORIZON, 100),
            Standing::Served
        );
        assert_eq!(
            line.ask(place(100, 1), 2 * S, HORIZON, 100),
            Standing::Waiting { ahead: 0 },
            "claimed once; asking again takes a new place"
        );
    }

    #[test]
    fn places_whose_workers_went_away_are_skipped_not_served() {
        let mut line = Line::default();
        line.ask(place(1, 1), 0, HORIZON, 10);
        line.ask(place(2, 2), 10 * S, HORIZON, 10);
        // Place 1 last asked at 0: no longer live at 16 s.
        assert_eq!(line.serve(16 * S, HORIZON), Some(place(2, 2)));
        assert_eq!(line.serve(16 * S, HORIZON), None);
        assert!(!line.has_waiting(16 * S, HORIZON));
    }

    #[test]
    fn served_places_not_claimed_are_forgotten_and_leaving_frees_a_place() {
        let mut line = Line::default();
        line.ask(place(1, 1), 0, HORIZON, 10);
        line.ask(place(2, 2), 0, HORIZON, 10);
        line.serve(0, HORIZON);
        line.expire(31 * S, HORIZON);
        assert!(!line.is_empty(), "place 2 still waits");
        line.leave(place(2, 2));
        assert!(line.is_empty());
    }

    #[test]
    fn counting_the_places_ahead_is_bounded() {
        let mut line = Line::default();
        for i in 0..1000 {
            line.ask(place(i, i as u64), 0, HORIZON, 0);
        }
        assert_eq!(
            line.ask(place(5000, 5000), 0, HORIZON, 50),
            Standing::Waiting { ahead: 50 }
        );
        assert_eq!(line.waiting(0, HORIZON, 10), 10);
    }
}
