//! A tenant's line of deferred retries to one dependency: each takes a
//! place when it is first deferred, and the tokens the tenant's share
//! brings go to the places in order, oldest first. Pure: time is a
//! parameter.
//!
//! # Why a line
//! After an outage the retries deferred during it are the work users wait
//! for; whoever waited longest should go first, and a fresh failure of the
//! same tenant should wait behind them. The worker of a deferred activity
//! is not present while it sleeps: it comes back at the time it was told,
//! chosen for when its turn should come (the places ahead over the
//! tenant's rate, never past the deferral horizon). So each token the
//! tenant's share brings goes to the oldest place whose worker is *due*,
//! here or about to be ([`Line::has_ready`]); the place is *served*, and
//! its worker, asking, takes the token at once. A place whose worker is
//! not due yet gets none: its token would wait idle for its worker, who on
//! several replicas may be asking another one, and tokens held for absent
//! workers would reach the dependency together when they come back, past
//! the bucket's burst. A token no place is due for stays in the bucket.
//! A fresh failure takes a place at the back while any live place waits.
//!
//! # Places whose workers do not come back
//! A place is *live* until a little after the time its worker was told to
//! come back ([`Line::promise`]). Places that are no longer live are
//! skipped, not served, so an activity abandoned meanwhile costs no token.
//! A served place holds its token (`T`) until its worker claims it; one
//! whose worker is past due is forgotten and its token handed back
//! ([`Line::expire`]): on several replicas the worker may have asked
//! another replica meanwhile, and a token nobody claims must not be lost
//! to the tenant.
//!
//! # After a restart, or on another replica
//! The place is the time of the first deferral, kept in the activity's
//! record: a worker asking a line that does not know it (a restarted
//! service, another replica) takes its place again by that time, so the
//! order of first deferral holds among the workers that come back, within
//! one horizon.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use foldhash::fast::RandomState;

/// Times in nanoseconds of the bucket's clock.
type Nanos = i64;

/// How late a worker may come back after the time it was given and keep
/// its place: its scheduler's delay and a round trip. Short, because a
/// worker later than that loses little: it takes its place again by the
/// time of its first deferral.
const LATENESS: Nanos = 1_000_000_000;

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

/// How soon a place must be due for a token to go to it: its worker is
/// here, or about to be. A token served to a place due later would wait
/// idle for its worker (who, on several replicas, may be asking another).
const READY: Nanos = 500_000_000;

/// One tenant's line to one dependency; `T` is the token a served place
/// holds.
#[derive(Debug)]
pub struct Line<T = ()> {
    /// Places not served yet, oldest first, with when their worker is due
    /// back.
    waiting: BTreeMap<Place, Nanos>,
    /// The waiting places due within [`READY`], oldest first: the ones the
    /// tokens go to.
    ready: BTreeSet<Place>,
    /// The other waiting places, by when they are due.
    upcoming: BTreeSet<(Nanos, Place)>,
    /// Places served and not yet claimed, with when their worker is due
    /// and the token they hold.
    served: HashMap<u64, (Nanos, T), RandomState>,
}

impl<T> Default for Line<T> {
    fn default() -> Self {
        Self {
            waiting: BTreeMap::new(),
            ready: BTreeSet::new(),
            upcoming: BTreeSet::new(),
            served: HashMap::default(),
        }
    }
}

/// What a line says of a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Its turn came: its token is taken.
    Served,
    /// Waiting: [`Line::ahead`] counts the live places ahead of it.
    Waiting,
    /// The line is full: no place was taken.
    Full,
}

impl<T> Line<T> {
    /// Whether a place due back at `due` is still live at `now`.
    fn live(due: Nanos, now: Nanos) -> bool {
        now <= due.saturating_add(LATENESS)
    }

    /// Puts `place`, waiting, where its due time `due` says.
    fn index(&mut self, place: Place, due: Nanos, now: Nanos) {
        if due <= now.saturating_add(READY) {
            self.ready.insert(place);
        } else {
            self.upcoming.insert((due, place));
        }
    }

    /// Takes `place` out of the waiting places; returns when it was due.
    fn unindex(&mut self, place: Place) -> Option<Nanos> {
        let due = self.waiting.remove(&place)?;
        if !self.ready.remove(&place) {
            self.upcoming.remove(&(due, place));
        }
        Some(due)
    }

    /// Sets `place` waiting, due at `due`.
    fn wait(&mut self, place: Place, due: Nanos, now: Nanos) {
        self.unindex(place);
        self.waiting.insert(place, due);
        self.index(place, due, now);
    }

    /// Whether the line has a live place waiting, forgetting the ones at
    /// its head that are no longer live. A fresh failure waits behind any.
    pub fn has_waiting(&mut self, now: Nanos) -> bool {
        while let Some((&place, &due)) = self.waiting.first_key_value() {
            if Self::live(due, now) {
                return true;
            }
            self.unindex(place);
        }
        false
    }

    /// Whether a live place is due now (its worker here or about to be):
    /// the next token goes to the oldest such.
    pub fn has_ready(&mut self, now: Nanos) -> bool {
        let soon = now.saturating_add(READY);
        while let Some(&(due, place)) = self.upcoming.first() {
            if due > soon {
                break;
            }
            self.upcoming.pop_first();
            self.ready.insert(place);
        }
        while let Some(&place) = self.ready.first() {
            match self.waiting.get(&place) {
                Some(&due) if Self::live(due, now) => return true,
                _ => {
                    self.unindex(place);
                    self.ready.remove(&place);
                }
            }
        }
        false
    }

    /// Serves the oldest place due now with `token`, taken for it. Returns
    /// the place, or the token when no place is due.
    pub fn serve(&mut self, now: Nanos, token: T) -> Result<Place, T> {
        let next = if self.has_ready(now) {
            self.ready.first().copied()
        } else {
            None
        };
        match next {
            Some(place) => {
                let due = self.unindex(place).unwrap_or(now);
                self.served.insert(place.id, (due, token));
                Ok(place)
            }
            None => Err(token),
        }
    }

    /// Where `place` stands, its worker asking now: served (its token
    /// claimed, so it is gone from the line), or waiting (taking its place
    /// if the line did not hold it), due now; [`Line::promise`] says when
    /// it is due next.
    pub fn ask(&mut self, place: Place, now: Nanos) -> Standing {
        if self.claim(place) {
            return Standing::Served;
        }
        if !self.waiting.contains_key(&place) && self.waiting.len() >= MAX_PLACES {
            return Standing::Full;
        }
        self.wait(place, now, now);
        Standing::Waiting
    }

    /// Claims `place`'s token if it was served: it is gone from the line.
    pub fn claim(&mut self, place: Place) -> bool {
        if self.served.remove(&place.id).is_some() {
            self.unindex(place);
            return true;
        }
        false
    }

    /// Live places ahead of `place`, counted up to `count_up_to`: a walk
    /// of the places ahead, so the caller bounds it by what the count can
    /// change.
    pub fn ahead(&self, place: Place, now: Nanos, count_up_to: usize) -> usize {
        self.waiting
            .range(..place)
            .filter(|(_, due)| Self::live(**due, now))
            .take(count_up_to)
            .count()
    }

    /// Says when `place`'s worker was told to come back: it gets no token
    /// before, and stays live until a little after.
    pub fn promise(&mut self, place: Place, due: Nanos, now: Nanos) {
        if self.waiting.contains_key(&place) {
            self.wait(place, due, now);
        }
    }

    /// Live places waiting, counted up to `count_up_to`: how far back a
    /// newcomer that takes no place stands.
    pub fn waiting(&self, now: Nanos, count_up_to: usize) -> usize {
        self.waiting
            .values()
            .filter(|due| Self::live(**due, now))
            .take(count_up_to)
            .count()
    }

    /// Removes `place` (its activity stopped, succeeded, or took a token
    /// some other way); returns the token it held if it was served.
    pub fn leave(&mut self, place: Place) -> Option<T> {
        self.unindex(place);
        self.served.remove(&place.id).map(|(_, token)| token)
    }

    /// Forgets served places whose workers are past due, handing each
    /// one's token to `give_back`.
    pub fn expire(&mut self, now: Nanos, mut give_back: impl FnMut(T)) {
        if self.served.is_empty() {
            return;
        }
        let gone: Vec<u64> = self
            .served
            .iter()
            .filter(|(_, (due, _))| !Self::live(*due, now))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some((_, token)) = self.served.remove(&id) {
                give_back(token);
            }
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

    fn place(since_ms: i64, id: u64) -> Place {
        Place { since_ms, id }
    }

    #[test]
    fn tokens_go_to_the_oldest_place_due_whatever_the_order_they_ask_in() {
        let mut line: Line = Line::default();
        assert_eq!(line.ask(place(300, 3), 0), Standing::Waiting);
        assert_eq!(line.ahead(place(300, 3), 0, 100), 0);
        assert_eq!(line.ask(place(100, 1), 0), Standing::Waiting);
        assert_eq!(line.ahead(place(100, 1), 0, 100), 0);
        assert_eq!(line.ask(place(200, 2), 0), Standing::Waiting);
        assert_eq!(line.ahead(place(200, 2), 0, 100), 1);
        for p in [place(100, 1), place(200, 2), place(300, 3)] {
            line.promise(p, 2 * S, 0);
        }
        assert_eq!(
            line.serve(2 * S, ()),
            Ok(place(100, 1)),
            "all due: the oldest"
        );
        assert_eq!(line.ask(place(300, 3), 2 * S), Standing::Waiting);
        assert_eq!(line.ahead(place(300, 3), 2 * S, 100), 1);
        assert_eq!(line.ask(place(100, 1), 2 * S), Standing::Served);
        assert_eq!(line.serve(2 * S, ()), Ok(place(200, 2)));
        assert_eq!(
            line.ask(place(100, 1), 2 * S),
            Standing::Waiting,
            "claimed once; asking again takes a new place"
        );
        assert_eq!(line.ahead(place(100, 1), 2 * S, 100), 0);
    }

    #[test]
    fn a_place_here_now_goes_before_one_due_later_which_gets_none_yet() {
        let mut line: Line = Line::default();
        line.ask(place(1, 1), 0);
        line.promise(place(1, 1), 5 * S, 0);
        line.ask(place(2, 2), S);
        assert!(line.has_waiting(S));
        assert!(line.has_ready(S));
        assert_eq!(line.serve(S, ()), Ok(place(2, 2)), "1 is not due until 5 s");
        assert!(!line.has_ready(S));
        assert_eq!(
            line.serve(S, ()),
            Err(()),
            "no token held for an absent worker"
        );
        assert_eq!(line.serve(5 * S - READY, ()), Ok(place(1, 1)), "due soon");
    }

    #[test]
    fn places_whose_workers_went_away_are_skipped_not_served() {
        let mut line: Line = Line::default();
        line.ask(place(1, 1), 0);
        line.promise(place(1, 1), 3 * S, 0);
        line.ask(place(2, 2), 3 * S);
        line.promise(place(2, 2), 8 * S, 3 * S);
        // Place 1 was due back at 3 s: no longer live past 4 s.
        assert!(line.has_waiting(4 * S));
        assert_eq!(line.serve(4 * S + 1, ()), Err(()), "1 skipped, 2 not due");
        assert_eq!(line.serve(8 * S, ()), Ok(place(2, 2)));
        assert_eq!(line.ask(place(2, 2), 8 * S), Standing::Served);
        assert!(!line.has_waiting(8 * S));
        line.ask(place(3, 3), 10 * S);
        assert!(line.has_waiting(11 * S), "never told: live a second");
        assert!(!line.has_waiting(11 * S + 1));
        assert!(line.is_empty());
    }

    #[test]
    fn served_places_not_claimed_give_their_token_back_and_leaving_frees_a_place() {
        let mut line: Line<u32> = Line::default();
        for i in 1..=3 {
            line.ask(place(i, i as u64), 0);
        }
        line.promise(place(2, 2), 4 * S, 0);
        line.promise(place(3, 3), 9 * S, 0);
        assert_eq!(line.serve(0, 7), Ok(place(1, 1)), "due at 0");
        assert_eq!(line.serve(4 * S, 8), Ok(place(2, 2)));
        let mut back = Vec::new();
        line.expire(S, |t| back.push(t));
        assert!(back.is_empty(), "1 due at 0: live until 1 s");
        line.expire(S + 1, |t| back.push(t));
        assert_eq!(back, [7], "1 past due: its token given back");
        line.expire(5 * S + 1, |t| back.push(t));
        assert_eq!(back, [7, 8]);
        assert!(!line.is_empty(), "place 3 still waits");
        assert_eq!(line.leave(place(3, 3)), None, "never served: no token");
        assert!(line.is_empty());
        line.ask(place(4, 4), 20 * S);
        line.serve(20 * S, 9).unwrap();
        assert_eq!(
            line.leave(place(4, 4)),
            Some(9),
            "served then left: its token back"
        );
    }

    #[test]
    fn counting_the_places_ahead_is_bounded() {
        let mut line: Line = Line::default();
        for i in 0..1000 {
            line.ask(place(i, i as u64), 0);
        }
        assert_eq!(line.ask(place(5000, 5000), 0), Standing::Waiting);
        assert_eq!(line.ahead(place(5000, 5000), 0, 50), 50);
        assert_eq!(line.waiting(0, 10), 10);
    }
}
