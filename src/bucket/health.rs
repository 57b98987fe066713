//! A dependency's health as the service sees it, and the retries a second
//! it argues for. Pure: time is a parameter, in whole seconds of the
//! bucket's clock.
//!
//! # What the service sees
//! Every failure it is asked about, and the fate of every retry it grants:
//! the same activity reports its next attempt failed, or records a success,
//! or does not come back. It needs no worker to report its successes for
//! that. Counted per tenant of the dependency, in one-second slots over the
//! last [`WINDOW_SECONDS`]:
//! - `failures`: fresh failures asked about (each attempt once; replays and
//!   deferred attempts asked again are not fresh);
//! - `granted`: retries granted a token;
//! - `retries_failed`: attempts reported after a retry, that is, granted
//!   retries that failed;
//! - `deferred`: retries this dependency's budget deferred (the allowance
//!   bound).
//!
//! # The rule (one step a second, on the second just ended)
//! - **Trouble** cuts the allowance: out of calm (no cut in the
//!   [`CALM_SECONDS`] before, no recovery's backlog being released) to the
//!   floor at once, else by half, down past the floor to
//!   [`PROBE_BACKOFF`] times under it while it lasts (see
//!   `TenantHealth::cut`):
//!   - a *surge*: at least [`SURGE_MIN`] fresh failures in the second, more
//!     than [`SURGE_FACTOR`] times the tenant's own recent failure rate (an
//!     average over about [`BASELINE_SECONDS`]) and than twice
//!     [`SURGE_SHARE`] of the successes it reports a second, or, for a
//!     tenant that reports none, than [`SILENT_SURGE_FACTOR`] times the
//!     starting allowance; it is seen at once, before any retry's fate, and
//!     cut within the second that makes it (once a second);
//!   - or *failing retries*: at least [`MIN_FATES`] granted retries failed
//!     in the window, at least half of those granted, and some within the
//!     last [`RECENT_SECONDS`].
//! - **Health** grows it: while granted retries do not fail (or none were
//!   granted: no evidence), by [`GROWTH`] a second (by adding, past half
//!   of where the last recovery overloaded: `growth`), up to the cap (the
//!   global rate, or the dependency's ceiling) while the allowance bound,
//!   else up to the starting allowance; never within [`HOLD_SECONDS`] of a
//!   cut, nor of a second with at least [`ELEVATED_MIN`] fresh failures and
//!   more than [`ELEVATED_FACTOR`] times the recent rate (and than
//!   [`ORDINARY_SHARE`] of its reported successes).
//! - **Unused** (nothing deferred, and under [`IN_USE_SHARE`] of it granted
//!   in the second), it decays towards its resting allowance, so that months
//!   of health do not leave a whole second of the global rate ready for the
//!   first second of an outage.
//!
//! A tenant's *resting* allowance, once it has evidence (requests the
//! service saw, or successes it reports), is the starting
//! allowance less what its own lane already pays (the retries a second its reported successes earn
//! it), never below the floor: the starting allowance is there for the
//! retries nothing else pays for, and a tenant whose lane pays for them
//! would otherwise bring both to the first second of an overload.
//!
//! A retry granted now fails only after its backoff and its call's timeout,
//! so its fate arrives seconds later, inside the window; a surge of first
//! failures arrives at once. Together: the first second of an overload is
//! cut by the surge, a flaky dependency (failures at random, retries that
//! succeed) keeps growing, and after an outage the allowance grows again as
//! soon as its few probing retries stop failing.
//!
//! # Tenants
//! Each tenant of a dependency keeps its own evidence and its own allowance
//! ([`TenantHealth`]); the dependency's allowance is their average,
//! weighted by each tenant's share of the requests the service saw for the
//! dependency in the window ([`blend`]). A tenant inventing failures for
//! activities of its own thus lowers the dependency's allowance by at most
//! its share of those requests, and never drives it to the floor for the
//! others; a tenant's claims (reported successes) never enter it.

pub use crate::budget::token::{Evidence, HealthState};
use counts::slot;
pub use counts::{Fates, Limits, Second, blend};
pub use growth::{ADDITIVE_SHARE, GROWTH};
use growth::{grow, threshold_of};

/// Seconds of evidence the rule reads (whole seconds, the one under way
/// left out).
pub const WINDOW_SECONDS: usize = 10;
/// Fewest fresh failures in a second that can be a surge: below it, a
/// handful of failures is noise, and the retries' fates decide.
pub const SURGE_MIN: u32 = 10;
/// Fewest fresh failures in a second that can hold growth back (above the
/// recent rate): a tenant's small part of an overload fails a few times a
/// second, not dozens.
pub const ELEVATED_MIN: u32 = 3;
/// A second's failures above this many times the recent rate hold growth
/// back: a dependency failing as usual (its rate's own noise) does not.
pub const ELEVATED_FACTOR: f64 = 1.5;
/// A second's failures above this many times the recent rate are a surge.
pub const SURGE_FACTOR: f64 = 2.0;
/// Failures up to this share of the successes a tenant reports a second
/// are its traffic's ordinary failures: they do not hold growth back.
pub const ORDINARY_SHARE: f64 = 0.05;
/// Failures up to this share of the successes a tenant reports a second
/// are what its traffic explains: twice it is a surge. Above a flaky
/// dependency's tenth of its calls, whose noise from second to second must
/// not read as an overload.
pub const SURGE_SHARE: f64 = 0.1;
/// For a tenant that tells no successes, a second's failures above this
/// many times the starting allowance are a surge: past a steady failure
/// rate's noise at the allowance, under a small tenant's part of an overload.
pub const SILENT_SURGE_FACTOR: f64 = 1.5;
/// The recent failure rate is an average over about this many seconds.
pub const BASELINE_SECONDS: f64 = 30.0;
/// Fewest failed retries in the window that can say a dependency fails.
pub const MIN_FATES: u32 = 3;
/// Seconds in which a failed retry still counts as lately: the trouble
/// lasts while retries fail within them.
pub const RECENT_SECONDS: u64 = 3;
/// The allowance's decay a second, towards the resting allowance, while
/// it is unused.
pub const DECAY: f64 = 0.9;
/// An allowance is unused while nothing is deferred and the last second's
/// granted retries were under this share of it: one a tenant's steady
/// retries fill does not decay under them.
pub const IN_USE_SHARE: f64 = 0.5;
/// An allowance within this many retries a second of its rest has
/// recovered: the rest moves with the tenant's lane, and one step of growth
/// (at least one a second) closes a gap this small.
pub const RECOVERED_WITHIN: f64 = 1.0;
/// The cut of one second of trouble.
pub const CUT: f64 = 0.5;
/// Trouble that lasts keeps halving the allowance past the floor, down to
/// the floor over this: a failing dependency's probes space out from one a
/// second to one every 8 (default floor). A failing probe repeats the last
/// one's news, and in an overload's drain adds to the queue the spare
/// capacity alone drains; a recovery shows in fresh calls failing less.
pub const PROBE_BACKOFF: f64 = 8.0;
/// Seconds with no cut after which trouble is out of calm (the recent
/// failure rate's own span), unless a recovery's backlog is still being
/// released (`growth`): a surge out of calm pauses the tenant's own lane
/// ([`TenantHealth::lane_paused`]).
pub const CALM_SECONDS: u64 = BASELINE_SECONDS as u64;
/// Seconds after a cut (or a second failing well above the usual) in which
/// the allowance does not grow: the fates of the retries granted before it
/// come back only after their backoff and their call's timeout, as failures
/// lately count ([`RECENT_SECONDS`]), and an overloaded dependency drains
/// its queue at its spare capacity alone, which retries granted meanwhile
/// would take.
pub const HOLD_SECONDS: u64 = 3;

/// One tenant's evidence of one dependency, and the allowance it argues
/// for.
#[derive(Debug, Clone)]
pub struct TenantHealth {
    /// The last [`WINDOW_SECONDS`] whole seconds and the one under way, by
    /// second modulo.
    slots: [Second; WINDOW_SECONDS + 1],
    /// The second the newest slot counts; the seconds before it are
    /// stepped.
    newest: u64,
    /// The recent failure rate, failures a second.
    baseline: f64,
    /// Retries a second this tenant's evidence allows the dependency.
    allowance: f64,
    /// The second of the last cut.
    cut_at: Option<u64>,
    /// Where growth turns from multiplying to adding (`growth`).
    threshold: Option<f64>,
    /// The first second counted: before a window has passed since, an
    /// empty window is no news (a restart's, not a recovery's end).
    counted_since: u64,
    /// The last second whose fresh failures were well above the recent
    /// rate (at least [`ELEVATED_MIN`], more than [`ELEVATED_FACTOR`] times
    /// it): growth holds for [`HOLD_SECONDS`] after it.
    elevated_at: Option<u64>,
    /// Whether that cut was a surge.
    surged: bool,
    /// The second of the last surge out of calm: the tenant's own lane
    /// pauses for the window after it ([`Self::lane_paused`]).
    surge_began: Option<u64>,
    /// Whether any evidence was ever counted.
    seen_any: bool,
    /// The fleet's retries granted and failed in the window, when replicas
    /// share a ledger (the coordination's sums): a retry granted here may
    /// fail on another replica, so the fates are read fleet-wide.
    fates: Option<Fates>,
    /// The successes a second the tenant reports of it (0 when it reports
    /// none): failures its own traffic explains are no surge.
    successes: f64,
    /// The retries a second the tenant's own lane pays for (earned by
    /// those successes): its resting allowance is what they leave.
    lane: f64,
}

/// What a restart takes back of a tenant's evidence
/// ([`TenantHealth::restored`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Saved {
    /// The allowance its evidence argued for.
    pub allowance: f64,
    /// Its recent failure rate, a second.
    pub baseline: f64,
    /// Where its evidence stood.
    pub state: HealthState,
    /// Its threshold (`growth`), if a recovery was under way.
    pub threshold: Option<f64>,
}

impl TenantHealth {
    /// A tenant first seen at `now` (seconds), starting at `allowance`.
    pub fn new(now: u64, allowance: f64) -> Self {
        Self {
            slots: [Second::default(); WINDOW_SECONDS + 1],
            newest: now,
            baseline: 0.0,
            allowance,
            cut_at: None,
            threshold: None,
            counted_since: now,
            elevated_at: None,
            surged: false,
            surge_began: None,
            seen_any: false,
            fates: None,
            successes: 0.0,
            lane: 0.0,
        }
    }

    /// A tenant restored from what was persisted: its allowance, recent
    /// failure rate, state and threshold (a recovery under way when it was
    /// saved keeps growing by adding past it), the window empty.
    pub fn restored(now: u64, saved: Saved) -> Self {
        Self {
            baseline: saved.baseline,
            cut_at: (saved.state == HealthState::Trouble).then_some(now),
            threshold: saved.threshold,
            seen_any: saved.state != HealthState::NoEvidence,
            ..Self::new(now, saved.allowance)
        }
    }

    /// New limits (a reload): a tenant with no evidence yet starts again at
    /// the new starting allowance; any other keeps its allowance within
    /// the new floor and cap.
    pub fn reconfigure(&mut self, limits: &Limits) {
        self.allowance = if self.seen_any {
            limits.clamp(self.allowance)
        } else {
            limits.initial
        };
    }

    /// The fleet's retries granted and failed in the window (the
    /// coordination's), read instead of this replica's from now on; `None`
    /// goes back to this replica's own.
    pub fn set_fates(&mut self, fates: Option<Fates>) {
        self.fates = fates;
    }

    /// The successes a second the tenant reports or records of the
    /// dependency (a worker records each success, as the README's loop
    /// does, or reports its calls' counts). Reported successes are evidence: from them on the tenant rests at
    /// what its own lane leaves of the starting allowance, so that lane and
    /// allowance together bring the starting allowance, not more, to the
    /// first second of an overload.
    pub fn set_successes(&mut self, successes: f64) {
        self.successes = if successes.is_finite() {
            successes.max(0.0)
        } else {
            0.0
        };
        if self.successes > 0.0 {
            self.seen_any = true;
        }
    }

    /// The retries a second the tenant's own lane pays for.
    pub fn set_lane(&mut self, lane: f64) {
        self.lane = if lane.is_finite() { lane.max(0.0) } else { 0.0 };
    }

    /// Where the allowance rests with no trouble and nothing deferred: the
    /// starting allowance less what the tenant's own lane pays, never below
    /// the floor; with no evidence yet (so no lane either), the starting
    /// allowance.
    pub fn rest(&self, limits: &Limits) -> f64 {
        if self.seen_any {
            (limits.initial - self.lane).max(limits.floor)
        } else {
            limits.initial
        }
    }

    /// The allowance this tenant's evidence argues for.
    pub fn allowance(&self) -> f64 {
        self.allowance
    }

    /// The recent failure rate.
    pub fn baseline(&self) -> f64 {
        self.baseline
    }

    /// Where growth turns from multiplying to adding, while a recovery is
    /// under way (`growth`).
    pub fn threshold(&self) -> Option<f64> {
        self.threshold
    }

    /// Counts `what` in the second `now`, stepping the rule over the whole
    /// seconds before it first. A surge is cut as soon as the second's
    /// fresh failures make one, not at the second's end: the retries the
    /// rest of the second would grant add to the overload.
    pub fn count(&mut self, now: u64, what: &Second, limits: &Limits) {
        self.advance(now, limits);
        if what.failures > 0 || what.seen > 0 || what.granted > 0 || what.successes > 0 {
            self.seen_any = true;
        }
        self.slots[slot(now)].add(what);
        if what.failures > 0
            && self.cut_at != Some(now)
            && self.surge(&self.slots[slot(now)], limits)
        {
            self.cut(now, true, limits);
        }
    }

    /// Whether a second's fresh failures are a surge.
    fn surge(&self, second: &Second, limits: &Limits) -> bool {
        second.failures >= SURGE_MIN
            && f64::from(second.failures) > self.surge_above(second.successes, limits)
    }

    /// The fresh failures a second above which a second is a surge:
    /// [`SURGE_FACTOR`] times what the tenant's recent rate and its reported
    /// successes (its rate, or the second's own, `successes_now`, when more:
    /// a burst of calls is no surge) explain. With no successes told: at
    /// least [`SILENT_SURGE_FACTOR`] times the starting allowance (20 first
    /// failures with no evidence are all retried).
    fn surge_above(&self, successes_now: u32, limits: &Limits) -> f64 {
        let successes = self.successes.max(f64::from(successes_now));
        let explained = SURGE_FACTOR * self.baseline.max(SURGE_SHARE * successes);
        if successes > 0.0 {
            explained
        } else {
            explained.max(SILENT_SURGE_FACTOR * limits.initial)
        }
    }

    /// Cuts the allowance at `second`. Trouble out of calm (no cut in the
    /// [`CALM_SECONDS`] before, and no threshold learnt: not the swings of
    /// a recovery, however long each takes) cuts to the floor: what
    /// halving would leave in the next seconds (a half, a quarter, an
    /// eighth) all runs into the overload's queue, which the
    /// dependency drains at its spare capacity alone. A surge out of calm
    /// also pauses the tenant's own lane. Any other cut halves, down past
    /// the floor to [`PROBE_BACKOFF`] times under it.
    fn cut(&mut self, second: u64, surge: bool, limits: &Limits) {
        let calm = self.threshold.is_none() && self.no_cut_for_calm(second);
        if surge && calm {
            self.surge_began = Some(second);
        }
        if !calm && !self.held(second) {
            // The first cut after growth: the overload the retries made.
            let threshold = threshold_of(self.allowance, self.rest(limits));
            self.threshold = threshold.or(self.threshold);
        }
        self.allowance = if calm {
            limits.floor
        } else {
            limits.clamp_low(self.allowance * CUT)
        };
        self.cut_at = Some(second);
        self.surged = surge;
    }

    /// Whether the tenant's own lane pauses at `now`: for the window after
    /// a surge out of calm. The lane is earned by the successes of the last
    /// seconds, from before the surge, and the retries it would pay then
    /// feed an overload's first seconds. A surge in the swings of a
    /// recovery (a backlog draining at the edge of the dependency's
    /// capacity) pauses nothing: the lane has been earned since by the
    /// recovery's own successes, and pausing it at each surge would swing
    /// the tenant's rate, and so the turns its deferred workers are told,
    /// out of the order of their first deferral.
    pub fn lane_paused(&self, now: u64) -> bool {
        self.surge_began
            .is_some_and(|at| now.saturating_sub(at) <= WINDOW_SECONDS as u64)
    }

    /// Whether no cut came in the [`CALM_SECONDS`] before `second`.
    fn no_cut_for_calm(&self, second: u64) -> bool {
        self.cut_at
            .is_none_or(|at| second.saturating_sub(at) > CALM_SECONDS)
    }

    /// Whether the allowance was cut in the second `second`.
    pub fn cut_in(&self, second: u64) -> bool {
        self.cut_at == Some(second)
    }

    /// Whether the tenant's allowance was cut within [`HOLD_SECONDS`] of
    /// `second`.
    fn held(&self, second: u64) -> bool {
        self.cut_at
            .is_some_and(|at| second.saturating_sub(at) < HOLD_SECONDS)
    }

    /// Steps the rule over every whole second before `now` not stepped yet.
    pub fn advance(&mut self, now: u64, limits: &Limits) {
        // Past a window of empty seconds, each further step changes only
        // the baseline's and the allowance's drift: a bounded number of
        // them is as good as all.
        const MAX_STEPS: u64 = 120;
        if now <= self.newest {
            return;
        }
        let from = now.saturating_sub(MAX_STEPS);
        if from > self.newest {
            // All that was counted is long out of the window.
            self.slots = [Second::default(); WINDOW_SECONDS + 1];
            self.newest = from;
        }
        for second in self.newest..now {
            self.step(second, limits);
            // The slot of the next second held the oldest one: cleared.
            self.slots[slot(second + 1)] = Second::default();
            self.newest = second + 1;
        }
    }

    /// The rule, on the second `second` just ended (see the module doc).
    fn step(&mut self, second: u64, limits: &Limits) {
        let just = self.slots[slot(second)];
        let window = self.window_before(second + 1);
        let surge = self.surge(&just, limits);
        let recent = self.recent_before(second + 1);
        let fates = self.fates.unwrap_or(Fates {
            granted: window.granted,
            failed: window.retries_failed,
            failed_recently: recent.retries_failed,
        });
        // Failing: most retries granted in the window failed, and some did
        // lately; the trouble is over as soon as they stop failing, not
        // only once the window has forgotten them.
        let most_failed = 2 * u64::from(fates.failed) >= u64::from(fates.granted);
        let failing = fates.failed >= MIN_FATES && most_failed && fates.failed_recently > 0;
        let retries_ok = fates.granted == 0 || !most_failed || fates.failed_recently == 0;
        // Growth waits out a cut's hold, and as long a hold after a second
        // whose fresh failures were well above the tenant's recent rate and
        // above the share its reported successes explain (the starting allowance
        // aside): a tenant whose calls fail more than usual, even a few
        // times a second as a small tenant's part of an overload does, has
        // no capacity to spare for more retries yet.
        if just.failures >= ELEVATED_MIN
            && f64::from(just.failures)
                > (ELEVATED_FACTOR * self.baseline).max(ORDINARY_SHARE * self.successes)
        {
            self.elevated_at = Some(second);
        }
        let elevated = self
            .elevated_at
            .is_some_and(|at| second.saturating_sub(at) < HOLD_SECONDS);
        let may_grow = retries_ok && !self.held(second) && !elevated;
        if window.deferred == 0
            && self.no_cut_for_calm(second)
            && second >= self.counted_since + WINDOW_SECONDS as u64
        {
            // The recovery is over: its backlog released, calm since.
            self.threshold = None;
        }
        if surge || failing {
            // A surge seen as it came was cut then (`count`), once a second.
            if self.cut_at != Some(second) {
                self.cut(second, surge, limits);
            }
        } else if just.deferred > 0 && may_grow {
            self.allowance = limits.clamp(grow(self.allowance, self.threshold));
        } else if self.allowance < self.rest(limits) && may_grow {
            let grown = grow(self.allowance, self.threshold);
            self.allowance = limits.clamp(grown.min(self.rest(limits)));
        } else if window.deferred == 0
            && self.allowance > self.rest(limits)
            && f64::from(just.granted) < IN_USE_SHARE * self.allowance
        {
            self.allowance = limits.clamp((self.allowance * DECAY).max(self.rest(limits)));
        } else {
            self.allowance = limits.clamp_low(self.allowance);
        }
        self.baseline += (f64::from(just.failures) - self.baseline) / BASELINE_SECONDS;
    }
}

mod counts;
mod explain;
mod growth;

#[cfg(test)]
mod tests;
