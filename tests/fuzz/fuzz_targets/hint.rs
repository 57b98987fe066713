//! The hint parser (`budget::hint::normalize`): any Retry-After and Date
//! header values, any pushback and RetryInfo, any reference time and cap.
//! It must never panic, and its answer must keep the invariants the planner
//! relies on:
//! - the delay is never above the cap, and `capped` only when it is the cap;
//! - the same input gives the same hint (no clock is read);
//! - a delay with no source is zero; a negative pushback, and only that, is
//!   `do_not_retry`; an ignored Retry-After is not the source;
//! - a larger cap never gives a shorter delay;
//! - valid values round trip: delay-seconds and an HTTP-date written by
//!   `httpdate` against a written `Date`, padded with whitespace, give
//!   their delay (capped); a valid RetryInfo gives its milliseconds rounded
//!   up.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use retry_budget::budget::hint::{Hint, HintSource, RawHints, RetryInfoDelay, normalize};

/// HTTP-dates cover years 1970 to 9999.
const LAST_HTTP_DATE_SECONDS: u64 = 253_402_300_799;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    retry_after: &'a str,
    date: &'a str,
    pushback_ms: Option<i64>,
    retry_info: Option<(i64, i32)>,
    occurred_at_ms: i64,
    max_hint_ms: u64,
    /// A second cap, for monotonicity.
    other_max_hint_ms: u64,
    /// Valid values, written as a server would.
    valid: Valid,
}

#[derive(Arbitrary, Debug)]
struct Valid {
    seconds: u64,
    date_seconds: u64,
    retry_after_seconds: u64,
    padding: (u8, u8),
    retry_info: (u32, u32),
}

fn invariants(raw: &RawHints<'_>, occurred_at_ms: i64, max_hint_ms: u64) -> Hint {
    let hint = normalize(raw, occurred_at_ms, max_hint_ms);
    assert_eq!(hint, normalize(raw, occurred_at_ms, max_hint_ms));
    assert!(hint.delay_ms <= max_hint_ms);
    assert!(!hint.capped || hint.delay_ms == max_hint_ms);
    assert!(hint.source.is_some() || hint.delay_ms == 0);
    assert_eq!(
        hint.do_not_retry,
        raw.grpc_retry_pushback_ms.is_some_and(|ms| ms < 0)
    );
    if hint.ignored.retry_after {
        assert!(!matches!(
            hint.source,
            Some(HintSource::RetryAfterSeconds | HintSource::RetryAfterDate)
        ));
    }
    hint
}

/// Whitespace a header value may carry around it.
fn pad(value: &str, (before, after): (u8, u8)) -> String {
    let ws = |n: u8| [" ", "\t", ""][usize::from(n % 3)].repeat(usize::from(n % 4));
    format!("{}{value}{}", ws(before), ws(after))
}

/// A Retry-After and a Date, no other hint.
fn alone<'a>(retry_after: &'a str, date: &'a str) -> RawHints<'a> {
    RawHints {
        retry_after,
        date,
        ..RawHints::default()
    }
}

fn http_date(seconds: u64) -> String {
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(seconds))
}

fuzz_target!(|input: Input<'_>| {
    let raw = RawHints {
        retry_after: input.retry_after,
        date: input.date,
        grpc_retry_pushback_ms: input.pushback_ms,
        retry_info_delay: input
            .retry_info
            .map(|(seconds, nanos)| RetryInfoDelay { seconds, nanos }),
    };
    let hint = invariants(&raw, input.occurred_at_ms, input.max_hint_ms);
    let other = invariants(&raw, input.occurred_at_ms, input.other_max_hint_ms);
    if input.other_max_hint_ms >= input.max_hint_ms {
        assert!(other.delay_ms >= hint.delay_ms, "{hint:?} {other:?}");
    }

    let valid = &input.valid;
    let cap = input.max_hint_ms;
    // delay-seconds.
    let text = pad(&valid.seconds.to_string(), valid.padding);
    let hint = invariants(&alone(&text, input.date), input.occurred_at_ms, cap);
    let ms = valid.seconds.saturating_mul(1000);
    assert_eq!(
        (hint.delay_ms, hint.source, hint.capped),
        (ms.min(cap), Some(HintSource::RetryAfterSeconds), ms > cap),
        "{text:?}"
    );
    // An HTTP-date, against a valid Date: their difference, or zero.
    let at = valid.retry_after_seconds % (LAST_HTTP_DATE_SECONDS + 1);
    let reference = valid.date_seconds % (LAST_HTTP_DATE_SECONDS + 1);
    let (text, date) = (pad(&http_date(at), valid.padding), http_date(reference));
    let hint = invariants(&alone(&text, &date), input.occurred_at_ms, cap);
    let ms = at.saturating_sub(reference) * 1000;
    assert_eq!(
        (hint.delay_ms, hint.source, hint.ignored.is_empty()),
        (ms.min(cap), Some(HintSource::RetryAfterDate), true),
        "{text:?} against {date:?}"
    );
    // A valid RetryInfo: its milliseconds, rounded up.
    let (seconds, nanos) = (valid.retry_info.0, valid.retry_info.1 % 1_000_000_000);
    let raw = RawHints {
        retry_info_delay: Some(RetryInfoDelay {
            seconds: i64::from(seconds),
            nanos: i32::try_from(nanos).expect("below a second"),
        }),
        ..RawHints::default()
    };
    let hint = invariants(&raw, input.occurred_at_ms, cap);
    let ms = u64::from(seconds) * 1000 + u64::from(nanos).div_ceil(1_000_000);
    assert_eq!(
        (hint.delay_ms, hint.source, hint.ignored.is_empty()),
        (ms.min(cap), Some(HintSource::RetryInfo), true)
    );
});
