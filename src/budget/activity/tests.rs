//! The booking and the token: which call took it, and what a deferral
//! says of its `not_before`.

use std::time::Duration;

use super::super::decision;
use super::super::token::{Admission, Unlimited};
use super::*;

const NOW: i64 = 1_800_000_000_000;

fn report(occurred_at_ms: i64) -> Report<'static> {
    Report {
        attempt: 1,
        class: ErrorClass::Transient,
        rule: None,
        hints: None,
        policy: None,
        occurred_at_ms: Some(occurred_at_ms),
        workflow_id: "",
        dependency: "",
    }
}

fn defaults() -> Defaults {
    Defaults {
        policy: Policy {
            max_attempts: 5,
            deadline_seconds: 3600,
            base: Some(0),
            cap: Some(0),
        },
        max_hint_ms: 0,
    }
}

fn key() -> ActivityKey {
    ActivityKey {
        tenant: "t".into(),
        activity_id: "a".into(),
    }
}

fn fresh(plan: Plan) -> Draft {
    match plan {
        Plan::Fresh(draft) => draft,
        Plan::Replay(replay) => panic!("a replay: {replay:?}"),
    }
}

/// A booking is not a token: the deferral says `slot_booked`, the call
/// at its slot takes the token, and a replay of either took nothing.
#[test]
fn token_taken_marks_the_call_that_took_the_token_and_slot_booked_the_booking() {
    // The failure was 10 s ago, so the planned start (1 s after it) is
    // past and the slot, 500 ms from now, sets not_before.
    let mut draft = fresh(plan(None, &key(), &report(NOW - 10_000), &defaults(), NOW).unwrap());
    draft.settle(
        Admission::Deferred {
            wait: Duration::from_millis(500),
            reason: codes::GLOBAL_CAPACITY_EXHAUSTED,
        },
        NOW,
    );
    let (record, deferral) = draft.finish();
    assert_eq!(deferral.action, Some(Action::Deferred));
    assert!(deferral.slot_booked && !deferral.token_taken);
    assert_eq!(deferral.not_before_ms, Some(NOW + 500));
    assert!(
        deferral
            .reason
            .contains("booked for this activity 0.500 s from now"),
        "{}",
        deferral.reason
    );
    assert!(record.reservation.is_some_and(|r| r.booked));

    // Early: the same deferral, replayed; still booked, no token.
    let Plan::Replay(early) = plan(
        Some(record.clone()),
        &key(),
        &report(NOW - 10_000),
        &defaults(),
        NOW + 100,
    )
    .unwrap() else {
        panic!("asked early, the deferral is replayed");
    };
    assert!(!early.event.taken_by_this_call(true, false));
    assert!(early.event.slot_booked_for_caller(false));

    // At the slot: this call redeems the booking.
    let at = NOW + 500;
    let mut draft =
        fresh(plan(Some(record), &key(), &report(NOW - 10_000), &defaults(), at).unwrap());
    assert!(!draft.wants_token(), "the booking pays");
    draft.take_token(Unlimited, at);
    let (record, retry) = draft.finish();
    assert_eq!(retry.action, Some(Action::ScheduleRetry));
    assert!(retry.token_taken && !retry.slot_booked);
    assert!(retry.taken_by_this_call(false, false));
    assert!(
        !retry.taken_by_this_call(false, true),
        "a dry run takes nothing"
    );
    let Plan::Replay(again) = plan(
        Some(record),
        &key(),
        &report(NOW - 10_000),
        &defaults(),
        at + 1,
    )
    .unwrap() else {
        panic!("a decided attempt is replayed");
    };
    assert!(again.event.token_taken, "the record keeps its history");
    assert!(!again.event.taken_by_this_call(true, false));
}

/// When the retry's planned start, in the caller's time, is later than
/// the slot, not_before is the planned start, and the reason says so
/// rather than a wait "from now" on the service's clock.
#[test]
fn a_deferral_names_what_set_its_not_before() {
    let occurred = NOW + 30_000;
    let mut draft = fresh(plan(None, &key(), &report(occurred), &defaults(), NOW).unwrap());
    draft.settle(
        Admission::Deferred {
            wait: Duration::from_millis(500),
            reason: codes::GLOBAL_CAPACITY_EXHAUSTED,
        },
        NOW,
    );
    let (_, deferral) = draft.finish();
    assert_eq!(deferral.not_before_ms, Some(occurred + 1000));
    assert!(
        deferral
            .reason
            .contains("the retry's planned start, 1.000 s after occurred_at, is later"),
        "{}",
        deferral.reason
    );
    assert!(!deferral.reason.contains("from now"), "{}", deferral.reason);
}

/// What the bucket answers in the property test below, before the gate
/// applies the caller's `max_wait` as the real bucket does.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Granted,
    /// A slot this many nanoseconds from now.
    Deferred(u64),
    /// No slot; a turn this many nanoseconds from now.
    Refused(u64),
}

/// A gate that answers as `fair::Shares::book` does: a slot or turn past
/// `max_wait` is refused with `reservation_past_max_wait`, or with the
/// plain reason when the caller cannot wait at all.
struct Scripted(Answer);

impl TokenGate for Scripted {
    fn take(self, max_wait: Duration) -> super::super::token::Answer {
        let past = |n: u64| {
            if max_wait.is_zero() {
                codes::GLOBAL_CAPACITY_EXHAUSTED
            } else if Duration::from_nanos(n) > max_wait {
                codes::RESERVATION_PAST_MAX_WAIT
            } else {
                codes::GLOBAL_CAPACITY_EXHAUSTED
            }
        };
        let admission = match self.0 {
            Answer::Granted => Admission::Granted,
            Answer::Deferred(n) if Duration::from_nanos(n) <= max_wait => Admission::Deferred {
                wait: Duration::from_nanos(n),
                reason: codes::TENANT_SHARE_EXHAUSTED,
            },
            Answer::Deferred(n) | Answer::Refused(n) => Admission::Refused {
                retry_after: Duration::from_nanos(n),
                reason: past(n),
            },
        };
        admission.into()
    }
}

/// One call of the worker loop: when it comes, and what the bucket says.
#[derive(Debug, Clone, Copy)]
struct Step {
    /// After a deferral: ask again at `not_before` plus this latency
    /// (true), or at an arbitrary time `gap_ms` after the last call.
    follow: bool,
    gap_ms: u64,
    latency_ms: u64,
    /// After a deferral, the `occurred_at` of the re-ask: the first one's
    /// (0) or one this many milliseconds later.
    occurred_shift_ms: u64,
    /// How long an attempt runs before it fails.
    run_ms: u64,
    answer: Answer,
}

fn answer() -> impl proptest::strategy::Strategy<Value = Answer> {
    use proptest::prelude::*;
    // Waits around the deadline, some a fraction of a millisecond past a
    // whole one (how the flood found the boundary).
    let wait = prop_oneof![
        0u64..40_000_000_000,
        (0u64..40_000).prop_map(|ms| ms * 1_000_000 + 500)
    ];
    prop_oneof![
        Just(Answer::Granted),
        wait.clone().prop_map(Answer::Deferred),
        wait.prop_map(Answer::Refused),
    ]
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    (
        any::<bool>(),
        0u64..40_000,
        0u64..50,
        prop_oneof![Just(0u64), 0u64..40_000],
        0u64..5_000,
        answer(),
    )
        .prop_map(
            |(follow, gap_ms, latency_ms, occurred_shift_ms, run_ms, answer)| Step {
                follow,
                gap_ms,
                latency_ms,
                occurred_shift_ms,
                run_ms,
                answer,
            },
        )
}

proptest::proptest! {
    /// No sequence of deferrals and re-asks, at any times and with any
    /// `occurred_at`, yields a retry that starts or is granted past the
    /// deadline, or a deferral that leaves no time to ask again; a stop is
    /// replayed unchanged.
    #[test]
    fn no_retry_is_granted_past_the_deadline(
        deadline_seconds in 1u64..40,
        base in 0u32..4,
        steps in proptest::collection::vec(step(), 1..24),
    ) {
        let policy = Policy { max_attempts: 6, deadline_seconds, base: Some(base), cap: Some(8) };
        let deadline = NOW + i64::try_from(deadline_seconds * 1000).unwrap();
        let mut record: Option<ActivityRecord> = None;
        let mut now = NOW;
        let mut attempt = 1;
        let mut occurred = NOW;
        let mut deferred_until: Option<i64> = None;
        for s in steps {
            let mut report = report(occurred);
            report.attempt = attempt;
            report.policy = Some(policy);
            if let Some(not_before) = deferred_until {
                now = if s.follow { now.max(not_before) + s.latency_ms as i64 } else { now + s.gap_ms as i64 };
                report.occurred_at_ms = Some((occurred + s.occurred_shift_ms as i64).min(now));
            }
            let draft = match plan(record.clone(), &key(), &report, &defaults(), now).unwrap() {
                Plan::Replay(replay) => {
                    proptest::prop_assert_eq!(replay.event.action, Some(Action::Deferred));
                    proptest::prop_assert!(now < deferred_until.unwrap());
                    continue;
                }
                Plan::Fresh(draft) => draft,
            };
            let mut draft = draft;
            draft.take_token(Scripted(s.answer), now);
            let (next, event) = draft.finish();
            record = Some(next);
            match event.action.unwrap() {
                Action::ScheduleRetry => {
                    let start = event.not_before_ms.unwrap();
                    proptest::prop_assert!(start <= deadline, "starts past the deadline: {event:?}");
                    proptest::prop_assert!(now < deadline, "granted at {now}, past {deadline}: {event:?}");
                    deferred_until = None;
                    attempt += 1;
                    // The retry runs at its start and fails a while later.
                    now = now.max(start) + s.run_ms as i64;
                    occurred = now;
                }
                Action::Deferred => {
                    let not_before = event.not_before_ms.unwrap();
                    proptest::prop_assert!(
                        not_before <= deadline - decision::REASK_MARGIN_MS,
                        "a deferral to {} ms before the deadline: {event:?}",
                        deadline - not_before
                    );
                    proptest::prop_assert!(event.defer_reason.as_deref() != Some(codes::RESERVATION_PAST_MAX_WAIT));
                    deferred_until = Some(not_before);
                }
                stop => {
                    // Stable: asked again later, with another occurred_at,
                    // the stop is replayed.
                    let mut again = report;
                    again.occurred_at_ms = Some(now);
                    let Plan::Replay(replay) =
                        plan(record.clone(), &key(), &again, &defaults(), now + 60_000).unwrap()
                    else {
                        return Err(proptest::test_runner::TestCaseError::fail("a stop decided again"));
                    };
                    proptest::prop_assert_eq!(replay.event.action, Some(stop));
                    proptest::prop_assert_eq!(&replay.event, &event);
                    break;
                }
            }
        }
    }
}
