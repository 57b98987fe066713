//! The backoff plan: capped exponential backoff with a jitter derived from
//! the activity id and the attempt number, so the same input always gives
//! the same delay (a replay can recompute it) while different activities
//! spread out.
//!
//! [`retry_delay`] reproduces the article's reference function exactly,
//! including its float rounding:
//!
//! ```text
//! ceiling  = min(cap, base * 2**(attempt-1))
//! fraction = int.from_bytes(sha256(f"{activity_id}:{attempt}")[:4], "big") / (2**32 - 1)
//! seconds  = max(1, int(ceiling * (0.5 + fraction * 0.5)))
//! ```
//!
//! # Why milliseconds too
//! The reference rounds down to whole seconds, so at attempts 1-3 (ceilings
//! of 1, 2 and 4 seconds) every activity that failed in the same instant
//! wakes in the same second: both flights the article prints start
//! `[1, 2, 4`. [`Delay::millis`] applies the same fraction to the ceiling in
//! milliseconds, which keeps the determinism and spreads the wake-ups. It is
//! kept inside the reference's second (`millis / 1000 == seconds`), so the
//! two answers never disagree.

use sha2::{Digest, Sha256};

use super::codes;

/// The reference's default base, in seconds.
pub const DEFAULT_BASE: u32 = 2;
/// The reference's default cap, in seconds.
pub const DEFAULT_CAP: u32 = 60;

/// The shape of the backoff: `base * 2^(attempt-1)`, capped at `cap`, in
/// seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DelayParams {
    /// Delay ceiling of the first attempt, in seconds.
    pub base: u32,
    /// Largest ceiling, in seconds.
    pub cap: u32,
}

impl Default for DelayParams {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            cap: DEFAULT_CAP,
        }
    }
}

/// A planned delay, in the reference's whole seconds and in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Delay {
    /// The reference result, exactly.
    pub seconds: u32,
    /// The same jitter at millisecond resolution, within `seconds`' second.
    pub millis: u64,
}

/// The reference rejects attempts below 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}: attempt must be at least 1", codes::ATTEMPT_MUST_BE_POSITIVE)]
pub struct AttemptMustBePositiveError;

/// The article's `retry_delay(activity_id, attempt, base, cap)`, with its
/// millisecond refinement.
///
/// # Errors
/// [`AttemptMustBePositiveError`] when `attempt` is 0, as the reference
/// raises `attempt_must_be_positive`.
pub fn retry_delay(
    activity_id: &str,
    attempt: u32,
    params: DelayParams,
) -> Result<Delay, AttemptMustBePositiveError> {
    if attempt < 1 {
        return Err(AttemptMustBePositiveError);
    }
    let ceiling = ceiling_seconds(attempt, params);
    let multiplier = 0.5 + jitter_fraction(activity_id, attempt) * 0.5;
    // `ceiling` is at most u32::MAX, so it converts to f64 exactly, and the
    // product is at most `ceiling` (multiplier <= 1): the casts cannot
    // saturate. Python's int(float) truncates, as `as` does.
    let seconds = ((ceiling as f64 * multiplier) as u32).max(1);
    let raw_millis = ((ceiling * 1000) as f64 * multiplier) as u64;
    // Float rounding of the two products can differ at a whole-second edge;
    // the reference's second wins, so the millisecond value stays inside it.
    let low = u64::from(seconds) * 1000;
    let millis = raw_millis.clamp(low, low + 999);
    Ok(Delay { seconds, millis })
}

/// `min(cap, base * 2^(attempt-1))` without overflow, for `attempt >= 1`.
fn ceiling_seconds(attempt: u32, params: DelayParams) -> u64 {
    let exponent = attempt - 1;
    let cap = u64::from(params.cap);
    if params.base == 0 {
        return 0;
    }
    // With base >= 1 and exponent >= 32 the product exceeds every u32 cap.
    if exponent >= 32 {
        return cap;
    }
    (u64::from(params.base) << exponent).min(cap)
}

/// The first four bytes of `sha256("{activity_id}:{attempt}")`, big-endian,
/// over `2^32 - 1`: a fraction in `[0, 1]`.
fn jitter_fraction(activity_id: &str, attempt: u32) -> f64 {
    let mut digits = [0u8; 10];
    let mut hasher = Sha256::new();
    hasher.update(activity_id.as_bytes());
    hasher.update(b":");
    hasher.update(decimal(attempt, &mut digits));
    let digest = hasher.finalize();
    let prefix = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    f64::from(prefix) / f64::from(u32::MAX)
}

/// Writes `n` in decimal into `buf` (no allocation on the request path) and
/// returns the digits.
fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[start..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seconds(id: &str, attempts: std::ops::RangeInclusive<u32>) -> Vec<u32> {
        attempts
            .map(|a| retry_delay(id, a, DelayParams::default()).map(|d| d.seconds))
            .collect::<Result<_, _>>()
            .expect("attempts start at 1")
    }

    #[test]
    fn reproduces_the_articles_printed_lines() {
        assert_eq!(seconds("flight-1", 1..=6), [1, 2, 4, 11, 16, 35]);
        assert_eq!(seconds("flight-2", 1..=6), [1, 2, 4, 15, 19, 54]);
    }

    #[test]
    fn attempt_zero_is_rejected_with_the_reference_code() {
        let err = retry_delay("x", 0, DelayParams::default()).unwrap_err();
        assert!(err.to_string().starts_with("attempt_must_be_positive"));
    }

    #[test]
    fn decimal_writes_every_width() {
        let mut buf = [0u8; 10];
        for n in [0, 7, 10, 99, 12345, u32::MAX] {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
    }

    #[test]
    fn zero_base_or_cap_gives_the_one_second_floor() {
        for params in [
            DelayParams { base: 0, cap: 60 },
            DelayParams { base: 2, cap: 0 },
        ] {
            let d = retry_delay("flight-1", 5, params).unwrap();
            assert_eq!((d.seconds, d.millis), (1, 1000));
        }
    }

    #[test]
    fn milliseconds_spread_what_seconds_stack() {
        let params = DelayParams::default();
        let ms: std::collections::HashSet<u64> = (0..100)
            .map(|i| retry_delay(&format!("a-{i}"), 1, params).unwrap().millis)
            .collect();
        assert!(ms.len() > 50, "only {} distinct delays", ms.len());
    }

    proptest! {
        #[test]
        fn any_input_is_deterministic_bounded_and_consistent(
            id in any::<String>(),
            attempt in 1u32..,
            base in any::<u32>(),
            cap in any::<u32>(),
        ) {
            let params = DelayParams { base, cap };
            let d = retry_delay(&id, attempt, params).unwrap();
            prop_assert_eq!(d, retry_delay(&id, attempt, params).unwrap());
            prop_assert!(d.seconds >= 1 && d.seconds <= cap.max(1));
            prop_assert_eq!(d.millis / 1000, u64::from(d.seconds));
            prop_assert!(d.millis >= 1000);
        }

        #[test]
        fn small_attempts_follow_the_exponential_ceiling(
            id in "[a-z0-9:-]{1,20}",
            attempt in 1u32..8,
        ) {
            let d = retry_delay(&id, attempt, DelayParams::default()).unwrap();
            let ceiling = (2u64 << (attempt - 1)).min(60);
            prop_assert!(u64::from(d.seconds) <= ceiling.max(1));
            prop_assert!(d.millis <= (ceiling * 1000).max(1999));
        }
    }
}
