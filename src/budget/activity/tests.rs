//! The booking and the token: which call took it, and what a deferral
//! says of its `not_before`.

use std::time::Duration;

use super::super::token::Unlimited;
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
