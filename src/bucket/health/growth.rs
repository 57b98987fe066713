//! How an allowance grows back while its retries do not fail: by a
//! quarter a second, as TCP's slow start doubles its window each round
//! trip, until it reaches the *threshold*, half the allowance at which
//! granted retries last overloaded the dependency; past it, by
//! [`ADDITIVE_SHARE`] of the threshold a second, as congestion avoidance
//! adds a segment a round trip.
//!
//! A dependency says it is overloaded only once its queue is past its
//! callers' timeout: the retries granted while it filled succeed, only
//! slower, and a growth of a quarter a second has doubled the allowance
//! twice by the time their fates say so. A recovery's swings (a backlog
//! released at the edge of the dependency's capacity) would then hit that
//! edge every few seconds, each time with a queue of calls served after
//! their callers gave up; near where the last one did, growth slows to a
//! step whose excess the queue absorbs for longer.
//!
//! Only a cut in the swings of a recovery, after growth, sets the
//! threshold, and only above the resting allowance: the floor's probes
//! failing through an outage say nothing of the capacity the drain will
//! find. While it is known, trouble is one of those swings however long
//! the last one took (a cut by half, not to the floor). It is persisted
//! with the pace, and forgotten once the recovery is over (nothing
//! deferred in a whole window, no cut for [`super::CALM_SECONDS`]): the
//! next outage's dependency may not be the one that overloaded last time.

/// The allowance's growth a second below the threshold.
pub const GROWTH: f64 = 1.25;
/// Past the threshold, the allowance grows by this share of it a second
/// (at least one retry a second).
pub const ADDITIVE_SHARE: f64 = 0.05;

/// The allowance one second of growth leads to from `allowance`.
pub(super) fn grow(allowance: f64, threshold: Option<f64>) -> f64 {
    let multiplied = (allowance * GROWTH).max(allowance + 1.0);
    match threshold {
        Some(threshold) if allowance >= threshold => {
            allowance + (threshold * ADDITIVE_SHARE).max(1.0)
        }
        Some(threshold) => multiplied.min(threshold),
        None => multiplied,
    }
}

/// The threshold a cut of `before` sets in a recovery's swings: half of
/// it, when that is above `rest` (see the module doc).
pub(super) fn threshold_of(before: f64, rest: f64) -> Option<f64> {
    let threshold = before * super::CUT;
    (threshold > rest).then_some(threshold)
}
