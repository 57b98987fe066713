//! The booking and the token: which call took it, and what a deferral
//! says of its `not_before`.

use std::time::Duration;

use super::super::decision;
use super::super::token::{Admission, Payment};
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

fn fresh(found: DraftOrReplay) -> Draft {
    match found {
        DraftOrReplay::Fresh(draft) => draft,
        DraftOrReplay::Replay(replay) => panic!("a replay: {replay:?}"),
    }
}

/// A gate that gives one answer, and remembers what it was asked.
#[derive(Default)]
struct Answering {
    admission: Option<Admission>,
    asked: Vec<Option<i64>>,
    observed: usize,
    left: Vec<i64>,
}

impl Answering {
    fn with(admission: Admission) -> Self {
        Self {
            admission: Some(admission),
            ..Self::default()
        }
    }
}

impl TokenGate for &mut Answering {
    fn take(&mut self, ask: &super::super::token::Ask<'_>) -> super::super::token::Answer {
        self.asked.push(ask.waiting_since_ms);
        self.observed += usize::from(ask.observed.is_some());
        self.admission.unwrap_or(Admission::Granted).into()
    }

    fn observe(&mut self, _observed: super::super::token::Observed) {
        self.observed += 1;
    }

    fn leave(&mut self, _activity_id: &str, since_ms: i64) {
        self.left.push(since_ms);
    }
}

fn in_line(wait_ms: u64, since_ms: i64) -> Admission {
    Admission::Deferred {
        wait: Duration::from_millis(wait_ms),
        reason: codes::DEPENDENCY_BUDGET_EXHAUSTED,
        waiting_since_ms: Some(since_ms),
    }
}

/// A place in line is not a token: the deferral holds a place, the call
/// whose turn came takes the token, a deferral again writes nothing, and a
/// replay of either took nothing.
#[test]
fn a_deferral_holds_a_place_and_the_call_whose_turn_came_takes_the_token() {
    // The failure was 10 s ago, so the planned start (1 s after it) is
    // past and the turn, 500 ms from now, sets not_before.
    let mut draft =
        fresh(draft_or_replay(None, &key(), &report(NOW - 10_000), &defaults(), NOW).unwrap());
    let mut gate = Answering::with(in_line(500, NOW));
    draft.take_token(&mut gate, NOW);
    assert_eq!((gate.observed, gate.asked.clone()), (1, vec![None]));
    assert!(draft.needs_write());
    let (record, deferral) = draft.finish();
    assert_eq!(deferral.action, Some(Action::Deferred));
    assert_eq!(deferral.payment, Payment::Turn { since_ms: NOW });
    assert_eq!(deferral.not_before_ms, Some(NOW + 500));
    assert!(
        deferral
            .reason
            .contains("it took a place in line; ask again in 0.500 s"),
        "{}",
        deferral.reason
    );
    assert_eq!(record.deferral.and_then(|d| d.waiting_since_ms), Some(NOW));

    // Early: the same deferral, replayed; still in line, no token.
    let DraftOrReplay::Replay(early) = draft_or_replay(
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
    assert!(early.event.place_held_for_caller(false));

    // At its time, its turn not come yet: deferred again, keeping its
    // place; nothing to write, and its failure is not counted again.
    let at = NOW + 500;
    let mut again = fresh(
        draft_or_replay(
            Some(record.clone()),
            &key(),
            &report(NOW - 10_000),
            &defaults(),
            at,
        )
        .unwrap(),
    );
    let mut gate = Answering::with(in_line(2_000, NOW));
    again.take_token(&mut gate, at);
    assert_eq!((gate.observed, gate.asked.clone()), (0, vec![Some(NOW)]));
    assert!(!again.needs_write(), "a deferral again is not recorded");

    // Its turn came: this call takes the token; the retry starts now.
    let mut draft = fresh(
        draft_or_replay(Some(record), &key(), &report(NOW - 10_000), &defaults(), at).unwrap(),
    );
    let mut gate = Answering::with(Admission::Granted);
    draft.take_token(&mut gate, at);
    let (record, retry) = draft.finish();
    assert_eq!(retry.action, Some(Action::ScheduleRetry));
    assert_eq!(retry.payment, Payment::Token);
    assert_eq!(retry.not_before_ms, Some(at));
    assert!(
        retry
            .reason
            .ends_with("its turn in line came after it was deferred"),
        "{}",
        retry.reason
    );
    assert!(retry.taken_by_this_call(false, false));
    assert!(
        !retry.taken_by_this_call(false, true),
        "a dry run takes nothing"
    );
    assert_eq!(record.deferral, None);
    let DraftOrReplay::Replay(replayed) = draft_or_replay(
        Some(record),
        &key(),
        &report(NOW - 10_000),
        &defaults(),
        at + 1,
    )
    .unwrap() else {
        panic!("a decided attempt is replayed");
    };
    assert!(
        replayed.event.payment.is_token(),
        "the record keeps its history"
    );
    assert!(!replayed.event.taken_by_this_call(true, false));
}

/// A deferred attempt that stops (its deadline passed) gives up its place.
#[test]
fn a_deferred_attempt_that_stops_leaves_the_line() {
    let mut draft = fresh(draft_or_replay(None, &key(), &report(NOW), &defaults(), NOW).unwrap());
    draft.take_token(&mut Answering::with(in_line(9_000, NOW)), NOW);
    let (record, _) = draft.finish();
    let late = NOW + 3_600_001;
    let mut draft =
        fresh(draft_or_replay(Some(record), &key(), &report(NOW), &defaults(), late).unwrap());
    let mut gate = Answering::default();
    draft.take_token(&mut gate, late);
    assert_eq!(draft.action(), Action::DeadlineExceeded);
    assert!(gate.asked.is_empty(), "a stop asks for no token");
    assert_eq!(gate.left, vec![NOW]);
}

/// When the retry's planned start, in the caller's time, is later than
/// the turn, not_before is the planned start, and the reason says so
/// rather than a wait "from now" on the service's clock; a turn past the
/// deadline points at the deadline, and never stops the activity.
#[test]
fn a_deferral_names_what_set_its_not_before_and_never_passes_the_deadline() {
    let occurred = NOW + 30_000;
    let mut draft =
        fresh(draft_or_replay(None, &key(), &report(occurred), &defaults(), NOW).unwrap());
    draft.take_token(&mut Answering::with(in_line(500, NOW)), NOW);
    let (_, deferral) = draft.finish();
    assert_eq!(deferral.not_before_ms, Some(occurred + 1000));
    assert!(
        deferral
            .reason
            .contains("the retry's planned start, 1.000 s after occurred_at, is later"),
        "{}",
        deferral.reason
    );
    assert!(
        !deferral.reason.contains("ask again in"),
        "{}",
        deferral.reason
    );

    let mut draft = fresh(draft_or_replay(None, &key(), &report(NOW), &defaults(), NOW).unwrap());
    draft.take_token(&mut Answering::with(in_line(7_200_000, NOW)), NOW);
    let (_, deferral) = draft.finish();
    assert_eq!(
        deferral.action,
        Some(Action::Deferred),
        "the budget ends nothing early"
    );
    assert_eq!(deferral.not_before_ms, Some(NOW + 3_600_000));
    assert!(
        deferral.reason.contains("ask again at the deadline"),
        "{}",
        deferral.reason
    );
}

/// What the budget answers in the property test below.
#[derive(Debug, Clone, Copy)]
enum Script {
    Granted,
    /// Ask again this many nanoseconds from now, holding a place in line
    /// (true) or not.
    Deferred(u64, bool),
}

/// A gate answering as scripted, a place in line dated when first taken.
struct Scripted(Script);

impl TokenGate for Scripted {
    fn take(&mut self, ask: &super::super::token::Ask<'_>) -> super::super::token::Answer {
        match self.0 {
            Script::Granted => Admission::Granted,
            Script::Deferred(n, place) => Admission::Deferred {
                wait: Duration::from_nanos(n),
                reason: codes::DEPENDENCY_BUDGET_EXHAUSTED,
                waiting_since_ms: ask.waiting_since_ms.or(place.then_some(ask.now_ms)),
            },
        }
        .into()
    }

    fn observe(&mut self, _observed: super::super::token::Observed) {}
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
    answer: Script,
}

fn answer() -> impl proptest::strategy::Strategy<Value = Script> {
    use proptest::prelude::*;
    // Waits around the deadline, some a fraction of a millisecond past a
    // whole one (how the flood found the boundary).
    let wait = prop_oneof![
        0u64..40_000_000_000,
        (0u64..40_000).prop_map(|ms| ms * 1_000_000 + 500)
    ];
    prop_oneof![
        Just(Script::Granted),
        (wait, any::<bool>()).prop_map(|(n, place)| Script::Deferred(n, place)),
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
    /// deadline, a deferral past the deadline, or `deadline_exceeded` while
    /// the deadline still allows the next attempt; a stop is replayed
    /// unchanged, and a deferral again writes nothing.
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
            let draft = match draft_or_replay(record.clone(), &key(), &report, &defaults(), now).unwrap() {
                DraftOrReplay::Replay(replay) => {
                    proptest::prop_assert_eq!(replay.event.action, Some(Action::Deferred));
                    proptest::prop_assert!(now < deferred_until.unwrap());
                    continue;
                }
                DraftOrReplay::Fresh(draft) => draft,
            };
            let mut draft = draft;
            draft.take_token(Scripted(s.answer), now);
            let write = draft.needs_write();
            let (next, event) = draft.finish();
            if write {
                record = Some(next);
            } else {
                proptest::prop_assert_eq!(event.action, Some(Action::Deferred));
            }
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
                    proptest::prop_assert!(not_before <= deadline, "a deferral past the deadline: {event:?}");
                    proptest::prop_assert!(now < deadline, "deferred at {now}, past {deadline}: {event:?}");
                    deferred_until = Some(not_before);
                }
                Action::DeadlineExceeded => {
                    // Only when the deadline passed, or the attempt's own
                    // backoff would start after it.
                    let delay = decision::planned_delay("a", attempt, policy.delay_params(), None).unwrap();
                    let start = report.occurred_at_ms.unwrap() + delay.millis as i64;
                    proptest::prop_assert!(now >= deadline || start > deadline, "stopped early: {event:?}");
                    break;
                }
                stop => {
                    // Stable: asked again later, with another occurred_at,
                    // the stop is replayed.
                    let mut again = report;
                    again.occurred_at_ms = Some(now);
                    let DraftOrReplay::Replay(replay) =
                        draft_or_replay(record.clone(), &key(), &again, &defaults(), now + 60_000).unwrap()
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
