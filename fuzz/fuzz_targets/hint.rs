//! The hint parser: any header values, any pushback and RetryInfo, any
//! reference time and cap. It must never panic, and its answer must keep
//! the invariants the planner relies on.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use retry_budget::budget::hint::{HintSource, RawHints, RetryInfoDelay, normalize};

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    retry_after: &'a str,
    date: &'a str,
    pushback_ms: Option<i64>,
    retry_info: Option<(i64, i32)>,
    occurred_at_ms: i64,
    max_hint_ms: u64,
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
    let hint = normalize(&raw, input.occurred_at_ms, input.max_hint_ms);
    assert_eq!(
        hint,
        normalize(&raw, input.occurred_at_ms, input.max_hint_ms)
    );
    assert!(hint.delay_ms <= input.max_hint_ms);
    assert!(!hint.capped || hint.delay_ms == input.max_hint_ms);
    assert!(hint.source.is_some() || hint.delay_ms == 0);
    assert_eq!(
        hint.do_not_retry,
        input.pushback_ms.is_some_and(|ms| ms < 0)
    );
    if hint.ignored.retry_after {
        assert!(!matches!(
            hint.source,
            Some(HintSource::RetryAfterSeconds | HintSource::RetryAfterDate)
        ));
    }
});
