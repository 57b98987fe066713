//! The times a client sends: a `google.protobuf.Timestamp`'s seconds and
//! nanos, checked before anything is decided with them.
//!
//! Two checks, two codes. A value `google.protobuf.Timestamp` itself cannot
//! hold (before 0001-01-01, after 9999-12-31, nanos outside 0 to 999,999,999)
//! is [`invalid_timestamp`](super::codes::INVALID_TIMESTAMP): milliseconds put in
//! the seconds field land in the year 58,893. A valid one further from the
//! server's clock than [`TimeBounds`] allows is
//! [`timestamp_implausible`](super::codes::TIMESTAMP_IMPLAUSIBLE): an all-zero
//! Timestamp (1970, what protobufjs sends for a JavaScript `Date`) would
//! otherwise start an activity whose deadline passed decades ago, and a time
//! far ahead would park its retry until then.
//!
//! # Why these bounds
//! The logical time of a failure comes from the caller's own history, and a
//! durable-execution worker replaying that history reports times as old as
//! the history: the past bound must let a long-running workflow's replay
//! through, so it is a year by default, longer than any deadline a policy
//! of this service is expected to hold, and still fifty times shorter than
//! the distance to 1970, where every unit mistake (zero, seconds read as
//! milliseconds) lands. The future bound only has clock skew to allow for:
//! an hour is far more than a host without NTP drifts, and a report from
//! further ahead would park its activity's retry for that long.

use std::time::Duration;

use super::error::BudgetError;

/// The smallest `Timestamp.seconds`: 0001-01-01T00:00:00Z.
pub const MIN_SECONDS: i64 = -62_135_596_800;
/// The largest `Timestamp.seconds`: 9999-12-31T23:59:59Z.
pub const MAX_SECONDS: i64 = 253_402_300_799;

/// How far from the server's clock a client's time may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeBounds {
    /// The oldest time accepted, before the server's clock.
    pub max_past: Duration,
    /// The latest time accepted, after the server's clock.
    pub max_future: Duration,
}

impl Default for TimeBounds {
    /// A year back, an hour ahead (see the module's "Why these bounds").
    fn default() -> Self {
        Self {
            // humantime's year: 365.25 days, printed as "1year".
            max_past: Duration::from_secs(31_557_600),
            max_future: Duration::from_secs(3600),
        }
    }
}

/// Which side of the server's clock a time fell too far on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Older than [`TimeBounds::max_past`].
    Past,
    /// Later than [`TimeBounds::max_future`].
    Future,
}

impl Side {
    /// The configuration key of the bound, as the refusal names it.
    pub fn bound(self) -> &'static str {
        match self {
            Self::Past => "max_timestamp_past",
            Self::Future => "max_timestamp_future",
        }
    }
}

/// The unix milliseconds of a client's timestamp in `field`, checked
/// against `google.protobuf.Timestamp`'s range and against `bounds` around
/// the server's clock `now_ms`.
///
/// # Errors
/// [`BudgetError::InvalidTimestamp`] out of the Timestamp's range,
/// [`BudgetError::TimestampImplausible`] past a bound.
pub fn check(
    seconds: i64,
    nanos: i32,
    field: &'static str,
    now_ms: i64,
    bounds: &TimeBounds,
) -> Result<i64, BudgetError> {
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&seconds) || !(0..1_000_000_000).contains(&nanos) {
        return Err(BudgetError::InvalidTimestamp {
            field,
            seconds,
            nanos,
        });
    }
    // In range, so this cannot overflow: |seconds| < 2^38.
    let ms = seconds * 1000 + i64::from(nanos / 1_000_000);
    let limit = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let side = if ms < now_ms.saturating_sub(limit(bounds.max_past)) {
        Side::Past
    } else if ms > now_ms.saturating_add(limit(bounds.max_future)) {
        Side::Future
    } else {
        return Ok(ms);
    };
    let limit = match side {
        Side::Past => bounds.max_past,
        Side::Future => bounds.max_future,
    };
    Err(BudgetError::TimestampImplausible {
        field,
        at_ms: ms,
        now_ms,
        side,
        limit,
    })
}

/// `ms` (unix milliseconds, years 0001 to 9999) as RFC 3339 in UTC with
/// milliseconds, for refusals people and programs read.
pub fn rfc3339(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    // Howard Hinnant's civil_from_days: the proleptic Gregorian date of a
    // day count from 1970-01-01, exact for every year in range.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

/// The description of a refusal's bound, as its message says it.
pub(super) fn describe(side: Side, limit: Duration) -> String {
    let words = match side {
        Side::Past => "before",
        Side::Future => "after",
    };
    format!(
        "more than {} {words} the server's clock ({})",
        humantime::format_duration(limit),
        side.bound()
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::codes;
    use super::*;

    const NOW: i64 = 1_796_000_000_000; // 2026-11-30

    #[test]
    fn the_range_is_google_protobuf_timestamps() {
        assert_eq!(rfc3339(MIN_SECONDS * 1000), "0001-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(MAX_SECONDS * 1000 + 999),
            "9999-12-31T23:59:59.999Z"
        );
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(1_709_210_096_789), "2024-02-29T12:34:56.789Z");
        let loose = TimeBounds {
            max_past: Duration::MAX,
            max_future: Duration::MAX,
        };
        for (seconds, nanos) in [(MIN_SECONDS, 0), (MAX_SECONDS, 999_999_999)] {
            assert!(check(seconds, nanos, "t", NOW, &loose).is_ok());
        }
        for (seconds, nanos) in [
            (MIN_SECONDS - 1, 0),
            (MAX_SECONDS + 1, 0),
            // Milliseconds in the seconds field: the year 58,893.
            (NOW, 0),
            (0, -1),
            (0, 1_000_000_000),
            (i64::MIN, 0),
        ] {
            let err = check(seconds, nanos, "occurred_at", NOW, &loose).unwrap_err();
            assert_eq!(err.code(), codes::INVALID_TIMESTAMP, "{seconds} {nanos}");
        }
    }

    #[test]
    fn the_default_bounds_refuse_1970_and_pass_a_replay_of_last_month() {
        let bounds = TimeBounds::default();
        let err = check(0, 0, "occurred_at", NOW, &bounds).unwrap_err();
        assert_eq!(err.code(), codes::TIMESTAMP_IMPLAUSIBLE);
        assert!(
            err.to_string()
                .starts_with("timestamp_implausible: occurred_at 1970-01-01T00:00:00.000Z is more than 1year before"),
            "{err}"
        );
        let month_ago = NOW / 1000 - 30 * 86_400;
        assert_eq!(
            check(month_ago, 0, "occurred_at", NOW, &bounds),
            Ok(month_ago * 1000)
        );
        let err = check(NOW / 1000 + 2 * 3600, 0, "occurred_at", NOW, &bounds).unwrap_err();
        assert!(matches!(
            err,
            BudgetError::TimestampImplausible {
                side: Side::Future,
                ..
            }
        ));
    }

    proptest! {
        /// Inside the Timestamp's range, a time is accepted exactly when it
        /// is within the bounds of the clock, and then read to the
        /// millisecond.
        #[test]
        fn a_time_is_accepted_exactly_within_its_bounds(
            seconds in MIN_SECONDS..=MAX_SECONDS,
            nanos in 0..1_000_000_000i32,
            now in -10_000_000_000_000i64..10_000_000_000_000,
            past in 0..100_000_000_000u64,
            future in 0..100_000_000_000u64,
        ) {
            let bounds = TimeBounds {
                max_past: Duration::from_millis(past),
                max_future: Duration::from_millis(future),
            };
            let ms = seconds * 1000 + i64::from(nanos / 1_000_000);
            let within = ms >= now - past as i64 && ms <= now + future as i64;
            match check(seconds, nanos, "t", now, &bounds) {
                Ok(read) => prop_assert!(within && read == ms),
                Err(BudgetError::TimestampImplausible { side, at_ms, .. }) => {
                    prop_assert!(!within);
                    prop_assert_eq!(at_ms, ms);
                    prop_assert_eq!(side == Side::Past, ms < now);
                }
                Err(other) => prop_assert!(false, "{other}"),
            }
        }

        /// Every valid time prints as the date it is, and back.
        #[test]
        fn rfc3339_reads_back_as_the_same_time(
            ms in MIN_SECONDS * 1000..=MAX_SECONDS * 1000 + 999,
        ) {
            let text = rfc3339(ms);
            let (date, time) = text.split_once('T').unwrap();
            let parts: Vec<i64> = date.split('-').map(|p| p.parse().unwrap()).collect();
            let (y, m, d) = (parts[0], parts[1], parts[2]);
            // days_from_civil, the inverse.
            let y2 = if m <= 2 { y - 1 } else { y };
            let era = y2.div_euclid(400);
            let yoe = y2 - era * 400;
            let mp = (m + 9) % 12;
            let doy = (153 * mp + 2) / 5 + d - 1;
            let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
            let days = era * 146_097 + doe - 719_468;
            let t: Vec<f64> = time.trim_end_matches('Z').split(':').map(|p| p.parse().unwrap()).collect();
            let back = days * 86_400_000
                + (t[0] as i64) * 3_600_000
                + (t[1] as i64) * 60_000
                + (t[2] * 1000.0).round() as i64;
            prop_assert_eq!(back, ms);
        }
    }
}
