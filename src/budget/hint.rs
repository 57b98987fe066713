//! Server hints: what the failed response said about when to come back,
//! normalised to one delay the planner can take as `max(backoff, hint)`.
//!
//! Three hints are read:
//! - `Retry-After` (RFC 9110 section 10.2.3): delay-seconds, or an
//!   HTTP-date in any of its three forms (IMF-fixdate, obsolete RFC 850,
//!   asctime), parsed by the `httpdate` crate;
//! - `grpc-retry-pushback-ms` (gRPC proposal A6): milliseconds, where a
//!   negative value asks the client not to retry at all;
//! - `google.rpc.RetryInfo.retry_delay`: a protobuf `Duration`.
//!
//! # Reference time
//! An HTTP-date is an instant, not a delay. It is measured against the
//! response's own `Date` header when that is valid (both dates come from the
//! server's clock, so its skew cancels out), else against the failure's
//! `occurred_at`. Never against the service's clock: a replay of the same
//! report plans the same delay. A date in the past is a delay of zero.
//!
//! # Values the service cannot use
//! An invalid value never fails the request: it is ignored and reported
//! with a stable reason code ([`IgnoredHints::codes`]), and the decision
//! goes on with the other hints. A delay-seconds too large for the service
//! is not invalid: like the `delta-seconds` of RFC 9111 section 1.2.2 it
//! saturates, the server meant "a long time", and the cap applies.
//!
//! # The cap
//! The largest valid hint wins and is capped by the configured maximum,
//! with a flag saying so: a server cannot park an activity for a year, and
//! an activity whose hinted time falls past its deadline stops with
//! `deadline_exceeded` (the planner's decision, not this module's).

use std::time::UNIX_EPOCH;

pub use super::codes::{
    DATE_INVALID, GRPC_PUSHBACK_DO_NOT_RETRY, RETRY_AFTER_INVALID, RETRY_INFO_INVALID,
    SOURCE_GRPC_RETRY_PUSHBACK, SOURCE_RETRY_AFTER_DATE, SOURCE_RETRY_AFTER_SECONDS,
    SOURCE_RETRY_INFO,
};

/// The largest `Duration.seconds` protobuf allows (10 000 years).
const MAX_DURATION_SECONDS: i64 = 315_576_000_000;
/// Nanoseconds in a second.
const NANOS_PER_SECOND: i32 = 1_000_000_000;
/// Nanoseconds in a millisecond.
const NANOS_PER_MILLI: u64 = 1_000_000;

/// The hints of one failed response, raw as the worker received them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RawHints<'a> {
    /// The `Retry-After` header value; empty (or only whitespace) means
    /// absent.
    pub retry_after: &'a str,
    /// The response's `Date` header value; empty means absent.
    pub date: &'a str,
    /// `grpc-retry-pushback-ms`, when the trailer was present.
    pub grpc_retry_pushback_ms: Option<i64>,
    /// `google.rpc.RetryInfo.retry_delay`, when the status carried one.
    pub retry_info_delay: Option<RetryInfoDelay>,
}

/// A protobuf `Duration` as the core sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RetryInfoDelay {
    /// Whole seconds.
    pub seconds: i64,
    /// Nanoseconds, same sign as `seconds`, below one second.
    pub nanos: i32,
}

/// Which hint gave the delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HintSource {
    /// `Retry-After: 120`.
    RetryAfterSeconds,
    /// `Retry-After: Sun, 06 Nov 1994 08:51:37 GMT`.
    RetryAfterDate,
    /// `grpc-retry-pushback-ms`.
    GrpcRetryPushback,
    /// `google.rpc.RetryInfo`.
    RetryInfo,
}

impl HintSource {
    /// The stable name recorded with the decision.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RetryAfterSeconds => SOURCE_RETRY_AFTER_SECONDS,
            Self::RetryAfterDate => SOURCE_RETRY_AFTER_DATE,
            Self::GrpcRetryPushback => SOURCE_GRPC_RETRY_PUSHBACK,
            Self::RetryInfo => SOURCE_RETRY_INFO,
        }
    }
}

/// Which raw values were ignored (or, for `date`, replaced by
/// `occurred_at`). A set of flags, so building it allocates nothing.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct IgnoredHints {
    /// `Retry-After` was invalid ([`RETRY_AFTER_INVALID`]).
    pub retry_after: bool,
    /// `Date` was needed and invalid ([`DATE_INVALID`]).
    pub date: bool,
    /// The `RetryInfo` delay was invalid ([`RETRY_INFO_INVALID`]).
    pub retry_info: bool,
}

impl IgnoredHints {
    /// Whether every value given was usable.
    pub fn is_empty(self) -> bool {
        self == Self::default()
    }

    /// The stable reason codes, in a fixed order.
    pub fn codes(self) -> impl Iterator<Item = &'static str> {
        [
            (self.retry_after, RETRY_AFTER_INVALID),
            (self.date, DATE_INVALID),
            (self.retry_info, RETRY_INFO_INVALID),
        ]
        .into_iter()
        .filter_map(|(set, code)| set.then_some(code))
    }
}

/// The server's hints normalised to one delay.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Hint {
    /// The delay the server asked for, in milliseconds: the largest valid
    /// hint, capped. Zero when there is none.
    pub delay_ms: u64,
    /// The hint that gave `delay_ms` (the first of Retry-After, pushback,
    /// RetryInfo among equals); `None` when no valid hint was given.
    pub source: Option<HintSource>,
    /// True when the hint was above the maximum and `delay_ms` is the
    /// maximum.
    pub capped: bool,
    /// True when `grpc-retry-pushback-ms` was negative: the server asks not
    /// to retry ([`GRPC_PUSHBACK_DO_NOT_RETRY`]). The other hints are still
    /// normalised, for the record.
    pub do_not_retry: bool,
    /// The values that could not be used.
    pub ignored: IgnoredHints,
}

/// Normalises a response's hints to one delay, never failing.
///
/// `occurred_at_ms` (unix milliseconds) is the reference for an HTTP-date
/// when the response's `Date` is absent or invalid; `max_hint_ms` caps the
/// result (0 disables hints: every delay is capped to zero).
pub fn normalize(raw: &RawHints<'_>, occurred_at_ms: i64, max_hint_ms: u64) -> Hint {
    let mut ignored = IgnoredHints::default();
    let retry_after = match retry_after(raw.retry_after, raw.date, occurred_at_ms) {
        RetryAfter::Absent => None,
        RetryAfter::Invalid => {
            ignored.retry_after = true;
            None
        }
        RetryAfter::Seconds(ms) => Some((ms, HintSource::RetryAfterSeconds)),
        RetryAfter::Date { ms, date_invalid } => {
            ignored.date = date_invalid;
            Some((ms, HintSource::RetryAfterDate))
        }
    };
    let pushback = raw
        .grpc_retry_pushback_ms
        .and_then(|ms| u64::try_from(ms).ok())
        .map(|ms| (ms, HintSource::GrpcRetryPushback));
    let retry_info = raw.retry_info_delay.and_then(|delay| {
        let ms = duration_ms(delay);
        ignored.retry_info = ms.is_none();
        ms.map(|ms| (ms, HintSource::RetryInfo))
    });
    let largest = [retry_after, pushback, retry_info]
        .into_iter()
        .flatten()
        // `max_by_key` keeps the last of equals; the first is wanted.
        .reduce(|best, next| if next.0 > best.0 { next } else { best });
    let (delay_ms, source, capped) = match largest {
        Some((ms, source)) => (ms.min(max_hint_ms), Some(source), ms > max_hint_ms),
        None => (0, None, false),
    };
    Hint {
        delay_ms,
        source,
        capped,
        do_not_retry: raw.grpc_retry_pushback_ms.is_some_and(|ms| ms < 0),
        ignored,
    }
}

/// What a `Retry-After` value said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RetryAfter {
    /// Empty or only whitespace.
    Absent,
    /// Neither form.
    Invalid,
    /// delay-seconds, in milliseconds (saturating).
    Seconds(u64),
    /// An HTTP-date, as milliseconds after the reference (0 if past).
    Date {
        ms: u64,
        /// `Date` was given but invalid, so `occurred_at` was the reference.
        date_invalid: bool,
    },
}

/// Parses `Retry-After` against the response's `Date` or `occurred_at`.
fn retry_after(value: &str, date: &str, occurred_at_ms: i64) -> RetryAfter {
    let value = value.trim_ascii();
    if value.is_empty() {
        return RetryAfter::Absent;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // delay-seconds = 1*DIGIT, unbounded: saturate (RFC 9111 1.2.2).
        let seconds = value.bytes().fold(0u64, |n, digit| {
            n.saturating_mul(10).saturating_add(u64::from(digit - b'0'))
        });
        return RetryAfter::Seconds(seconds.saturating_mul(1000));
    }
    let Some(at_ms) = http_date_ms(value) else {
        return RetryAfter::Invalid;
    };
    let date = date.trim_ascii();
    let (reference_ms, date_invalid) = match http_date_ms(date) {
        Some(ms) => (ms, false),
        None => (occurred_at_ms, !date.is_empty()),
    };
    // The difference of two i64 fits in i128 and, when not negative, in
    // u64; a past date is zero.
    let ms = (i128::from(at_ms) - i128::from(reference_ms)).max(0);
    RetryAfter::Date {
        ms: u64::try_from(ms).unwrap_or(u64::MAX),
        date_invalid,
    }
}

/// An HTTP-date in any of RFC 9110's three forms, as unix milliseconds.
fn http_date_ms(value: &str) -> Option<i64> {
    let time = httpdate::parse_http_date(value).ok()?;
    let seconds = time.duration_since(UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(seconds).ok()?.checked_mul(1000)
}

/// A valid, non-negative protobuf `Duration` in milliseconds, rounded up
/// (never earlier than the server asked).
fn duration_ms(delay: RetryInfoDelay) -> Option<u64> {
    let seconds = u64::try_from(delay.seconds).ok()?;
    let nanos = u64::try_from(delay.nanos).ok()?;
    if delay.seconds > MAX_DURATION_SECONDS || delay.nanos >= NANOS_PER_SECOND {
        return None;
    }
    // At most 315_576_000_001_000 ms: no overflow.
    Some(seconds * 1000 + nanos.div_ceil(NANOS_PER_MILLI))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `Sun, 06 Nov 1994 08:49:37 GMT`, the RFC's example, in unix ms.
    const RFC_DATE_MS: i64 = 784_111_777_000;
    const DATE: &str = "Sun, 06 Nov 1994 08:49:37 GMT";
    const MAX: u64 = 3_600_000;

    fn retry_after(value: &str, date: &str) -> Hint {
        let raw = RawHints {
            retry_after: value,
            date,
            ..RawHints::default()
        };
        // occurred_at is 30 s after the response's Date, so a result
        // measured against it differs from one measured against Date.
        normalize(&raw, RFC_DATE_MS + 30_000, MAX)
    }

    /// A delay, its source and the reason codes.
    type Outcome = (u64, Option<HintSource>, Vec<&'static str>);

    fn delay(value: &str, date: &str) -> Outcome {
        let hint = retry_after(value, date);
        (hint.delay_ms, hint.source, hint.ignored.codes().collect())
    }

    #[test]
    #[rustfmt::skip]
    fn retry_after_reads_seconds_and_the_three_date_forms() {
        use HintSource::{RetryAfterDate as D, RetryAfterSeconds as S};
        let cases: [(&str, &str, Outcome); 16] = [
            ("120", "", (120_000, Some(S), vec![])),
            ("0", DATE, (0, Some(S), vec![])),
            ("007", "", (7_000, Some(S), vec![])),
            (" \t120\t ", "", (120_000, Some(S), vec![])),
            // Two minutes after the response's Date, in each form.
            ("Sun, 06 Nov 1994 08:51:37 GMT", DATE, (120_000, Some(D), vec![])),
            ("Sunday, 06-Nov-94 08:51:37 GMT", DATE, (120_000, Some(D), vec![])),
            ("Sun Nov  6 08:51:37 1994", DATE, (120_000, Some(D), vec![])),
            ("  Sun Nov  6 08:51:37 1994 ", " Sunday, 06-Nov-94 08:49:37 GMT\t", (120_000, Some(D), vec![])),
            // No Date: measured against occurred_at, 30 s later.
            ("Sun, 06 Nov 1994 08:51:37 GMT", "", (90_000, Some(D), vec![])),
            ("Sun, 06 Nov 1994 08:51:37 GMT", "   ", (90_000, Some(D), vec![])),
            // An invalid Date: occurred_at, and the decision says so.
            ("Sun, 06 Nov 1994 08:51:37 GMT", "yesterday", (90_000, Some(D), vec![DATE_INVALID])),
            ("Sun, 06 Nov 1994 08:51:37 GMT", "Mon, 06 Nov 1994 08:49:37 GMT", (90_000, Some(D), vec![DATE_INVALID])),
            // In the past: zero.
            ("Sun, 06 Nov 1994 08:48:37 GMT", DATE, (0, Some(D), vec![])),
            ("Thu, 01 Jan 1970 00:00:00 GMT", "", (0, Some(D), vec![])),
            // A Date that is not needed is not judged.
            ("5", "garbage", (5_000, Some(S), vec![])),
            ("", "garbage", (0, None, vec![])),
        ];
        for (value, date, want) in cases {
            assert_eq!(delay(value, date), want, "{value:?} / {date:?}");
        }
    }

    #[test]
    fn invalid_retry_after_values_are_ignored_with_a_reason() {
        for value in [
            "soon",
            "-5",
            "+5",
            "1.5",
            "5s",
            "1e3",
            "0x10",
            "1 2",
            "١٢٣",
            "１２",
            "Sun, 06 Nov 1994 08:51:37 PST",
            "Mon, 06 Nov 1994 08:51:37 GMT",
            "sun, 06 nov 1994 08:51:37 GMT",
            "Sun, 31 Feb 1994 08:51:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 10000 08:51:37 GMT",
            "Sun, 06 Nov 1994 08:51:37 GMT garbage",
        ] {
            let hint = retry_after(value, DATE);
            assert_eq!(hint.delay_ms, 0, "{value:?}");
            assert_eq!(hint.source, None, "{value:?}");
            assert!(!hint.do_not_retry);
            assert_eq!(
                hint.ignored.codes().collect::<Vec<_>>(),
                [RETRY_AFTER_INVALID],
                "{value:?}"
            );
        }
    }

    #[test]
    fn huge_retry_after_values_saturate_and_are_capped() {
        for value in [
            "3601",
            "18446744073709551",
            "18446744073709552",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999999999999999999999",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            let hint = retry_after(value, DATE);
            assert_eq!((hint.delay_ms, hint.capped), (MAX, true), "{value:?}");
            assert!(hint.ignored.is_empty(), "{value:?}");
        }
        assert!(!retry_after("3600", DATE).capped);
    }

    #[test]
    fn pushback_is_a_delay_and_negative_means_do_not_retry() {
        let pushback = |ms: i64| {
            let raw = RawHints {
                grpc_retry_pushback_ms: Some(ms),
                ..RawHints::default()
            };
            normalize(&raw, 0, MAX)
        };
        let hint = pushback(250);
        assert_eq!(hint.delay_ms, 250);
        assert_eq!(hint.source, Some(HintSource::GrpcRetryPushback));
        assert!(!hint.do_not_retry);
        assert_eq!(pushback(0).delay_ms, 0);
        assert_eq!(
            (pushback(i64::MAX).delay_ms, pushback(i64::MAX).capped),
            (MAX, true)
        );
        for negative in [-1, i64::MIN] {
            let hint = pushback(negative);
            assert!(hint.do_not_retry);
            assert_eq!((hint.delay_ms, hint.source), (0, None));
        }
    }

    #[test]
    fn retry_info_is_read_rounded_up_and_invalid_durations_are_ignored() {
        let info = |seconds: i64, nanos: i32| {
            let raw = RawHints {
                retry_info_delay: Some(RetryInfoDelay { seconds, nanos }),
                ..RawHints::default()
            };
            normalize(&raw, 0, u64::MAX)
        };
        assert_eq!(info(1, 500_000_000).delay_ms, 1_500);
        assert_eq!(info(0, 1).delay_ms, 1);
        assert_eq!(info(0, 0).source, Some(HintSource::RetryInfo));
        assert_eq!(
            info(MAX_DURATION_SECONDS, 999_999_999).delay_ms,
            315_576_000_001_000
        );
        for (seconds, nanos) in [
            (-1, 0),
            (0, -1),
            (-1, -500),
            (1, 1_000_000_000),
            (MAX_DURATION_SECONDS + 1, 0),
            (i64::MIN, i32::MIN),
        ] {
            let hint = info(seconds, nanos);
            assert_eq!((hint.delay_ms, hint.source), (0, None), "{seconds} {nanos}");
            assert_eq!(
                hint.ignored.codes().collect::<Vec<_>>(),
                [RETRY_INFO_INVALID]
            );
        }
    }

    #[test]
    fn the_largest_hint_wins_first_among_equals_and_invalid_ones_are_all_reported() {
        let raw = RawHints {
            retry_after: "2",
            date: "",
            grpc_retry_pushback_ms: Some(5_000),
            retry_info_delay: Some(RetryInfoDelay {
                seconds: 3,
                nanos: 0,
            }),
        };
        let hint = normalize(&raw, 0, MAX);
        assert_eq!(
            (hint.delay_ms, hint.source),
            (5_000, Some(HintSource::GrpcRetryPushback))
        );
        let two_seconds = Some(RetryInfoDelay {
            seconds: 2,
            nanos: 0,
        });
        let tie = RawHints {
            grpc_retry_pushback_ms: Some(2_000),
            retry_info_delay: two_seconds,
            ..raw
        };
        assert_eq!(
            normalize(&tie, 0, MAX).source,
            Some(HintSource::RetryAfterSeconds)
        );
        let tie = RawHints {
            retry_after: "",
            ..tie
        };
        assert_eq!(
            normalize(&tie, 0, MAX).source,
            Some(HintSource::GrpcRetryPushback)
        );

        let bad = RawHints {
            retry_after: "later",
            date: "",
            grpc_retry_pushback_ms: Some(-1),
            retry_info_delay: Some(RetryInfoDelay {
                seconds: -3,
                nanos: 0,
            }),
        };
        let hint = normalize(&bad, 0, MAX);
        assert!(hint.do_not_retry);
        assert_eq!(
            hint.ignored.codes().collect::<Vec<_>>(),
            [RETRY_AFTER_INVALID, RETRY_INFO_INVALID]
        );
        assert_eq!(hint.source, None);
    }

    #[test]
    fn a_do_not_retry_still_records_the_other_hints() {
        let raw = RawHints {
            retry_after: "Sun, 06 Nov 1994 08:51:37 GMT",
            date: "junk",
            grpc_retry_pushback_ms: Some(-1),
            retry_info_delay: None,
        };
        let hint = normalize(&raw, RFC_DATE_MS, MAX);
        assert!(hint.do_not_retry);
        assert_eq!(
            (hint.delay_ms, hint.source),
            (120_000, Some(HintSource::RetryAfterDate))
        );
        assert_eq!(hint.ignored.codes().collect::<Vec<_>>(), [DATE_INVALID]);
    }

    #[test]
    fn a_zero_maximum_disables_hints() {
        let hint = retry_after("10", "");
        assert_eq!(hint.delay_ms, 10_000);
        let raw = RawHints {
            retry_after: "10",
            ..RawHints::default()
        };
        let hint = normalize(&raw, 0, 0);
        assert_eq!((hint.delay_ms, hint.capped), (0, true));
    }

    #[test]
    fn no_hint_is_all_zero() {
        assert_eq!(normalize(&RawHints::default(), 0, MAX), Hint::default());
    }

    proptest! {
        #[test]
        fn no_input_panics_and_the_result_is_consistent(
            retry_after in any::<String>(),
            date in any::<String>(),
            pushback in any::<Option<i64>>(),
            info in any::<Option<(i64, i32)>>(),
            occurred_at_ms in any::<i64>(),
            max_hint_ms in any::<u64>(),
        ) {
            let raw = RawHints {
                retry_after: &retry_after,
                date: &date,
                grpc_retry_pushback_ms: pushback,
                retry_info_delay: info.map(|(seconds, nanos)| RetryInfoDelay { seconds, nanos }),
            };
            let hint = normalize(&raw, occurred_at_ms, max_hint_ms);
            prop_assert_eq!(hint, normalize(&raw, occurred_at_ms, max_hint_ms));
            prop_assert!(hint.delay_ms <= max_hint_ms);
            if hint.capped {
                prop_assert_eq!(hint.delay_ms, max_hint_ms);
            }
            if hint.source.is_none() {
                prop_assert_eq!(hint.delay_ms, 0);
            }
            prop_assert_eq!(hint.do_not_retry, pushback.is_some_and(|ms| ms < 0));
            if hint.ignored.retry_after {
                prop_assert!(!matches!(
                    hint.source,
                    Some(HintSource::RetryAfterSeconds | HintSource::RetryAfterDate)
                ));
            }
        }

        #[test]
        fn delay_seconds_round_trip(seconds in any::<u32>(), pad in "[ \t]{0,3}") {
            let value = format!("{pad}{seconds}{pad}");
            let hint = retry_after(&value, "");
            prop_assert_eq!(hint.delay_ms, (u64::from(seconds) * 1000).min(MAX));
            prop_assert_eq!(hint.source, Some(HintSource::RetryAfterSeconds));
        }

        #[test]
        fn an_http_date_is_measured_from_the_date_header(
            date_s in 0u64..253_402_300_000 - 100_000,
            ahead_s in 0u64..100_000,
        ) {
            let at = |s: u64| httpdate::fmt_http_date(UNIX_EPOCH + std::time::Duration::from_secs(s));
            let (value, date) = (at(date_s + ahead_s), at(date_s));
            let raw = RawHints { retry_after: &value, date: &date, ..RawHints::default() };
            let hint = normalize(&raw, 0, u64::MAX);
            prop_assert_eq!(hint.delay_ms, ahead_s * 1000);
            prop_assert_eq!(hint.source, Some(HintSource::RetryAfterDate));
        }
    }
}
