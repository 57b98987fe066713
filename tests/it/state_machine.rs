//! Property tests of the activity state machine (`budget::activity`): random
//! histories of one activity (reports in order, replays of earlier
//! attempts, skipped attempts, every class, server hints, logical times and
//! service clock readings that jump about, tokens granted or deferred with
//! or without a place in line, successes and resolutions), each step checked
//! against an oracle written from the module's documentation:
//!
//! - attempts never go back, and history is only ever appended to;
//! - every decided attempt, asked again at any later point (any class, any
//!   clock), replays exactly the recorded event;
//! - a closed activity stays closed: every new report is refused with
//!   `activity_closed`, a success changes nothing, a resolution is refused;
//! - no retry is planned past the deadline;
//! - a report is refused exactly when, and for the reason, the
//!   documentation says (a refusal has no record to save: `draft_or_replay`
//!   returns none; that nothing is written is checked over the server, in
//!   `tests/it/races.rs`);
//! - the record round-trips through the store's encoding after every step,
//!   and the history goes on from the decoded copy, as after a restart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use retry_budget::budget::activity::{
    self, ActivityKey, ActivityRecord, BudgetError, Defaults, DraftOrReplay, Event, EventKind,
    Policy, Report, Resolution, Status,
};
use retry_budget::budget::hint::RawHints;
use retry_budget::budget::token::{Answer, Ask, Observed};
use retry_budget::budget::{Action, Admission, ErrorClass, TokenGate};
use retry_budget::store::codec::{decode, encode_into};

/// The service clock at the start of every history, unix milliseconds.
const T0: i64 = 1_800_000_000_000;

fn defaults() -> Defaults {
    Defaults {
        policy: Policy {
            max_attempts: 5,
            deadline_seconds: 60,
            base: None,
            cap: None,
        },
        // Small enough to matter, large enough that hints push retries past
        // short deadlines.
        max_hint_ms: 90_000,
    }
}

fn key() -> ActivityKey {
    ActivityKey {
        tenant: "acme".into(),
        activity_id: "charge-card:7".into(),
    }
}

/// Which attempt a report names, relative to the record.
#[derive(Debug, Clone, Copy)]
enum Which {
    /// The next one (or the deferred one again).
    Next,
    /// An earlier one, by an index taken modulo the attempts decided.
    Earlier(u32),
    /// Past the next one by this many.
    Skip(u32),
    /// Attempt 0.
    Zero,
}

/// How the bucket answers a fresh retry.
#[derive(Debug, Clone, Copy)]
enum Token {
    Grant,
    /// Deferred, holding a place in line, to ask again this many
    /// thousandths of the time left before the deadline (plus 10 s) from
    /// now: past 1000, a turn later than the deadline.
    Booked(i64),
    /// The same, without a place.
    Unbooked(i64),
}

/// What a step does, with times still relative.
#[derive(Debug, Clone)]
enum Op {
    Report {
        which: Which,
        class: ErrorClass,
        hints: Option<(&'static str, Option<i64>)>,
        /// `occurred_at` as thousandths of the deadline after the start;
        /// `None` lets the service stamp it.
        occurred: Option<i64>,
        policy: Option<Policy>,
        token: Token,
    },
    Success {
        occurred: Option<i64>,
    },
    Resolve(Resolution),
}

#[derive(Debug, Clone)]
struct Step {
    /// How far the service clock moves first (it may go back a little).
    tick: i64,
    op: Op,
}

/// A step with every time and attempt made absolute, so that it can be
/// applied again to another history.
#[derive(Debug, Clone)]
enum Abs {
    Report {
        attempt: u32,
        class: ErrorClass,
        hints: Option<(&'static str, Option<i64>)>,
        occurred_at_ms: Option<i64>,
        policy: Option<Policy>,
        token: AbsToken,
        now: i64,
    },
    Success {
        occurred_at_ms: Option<i64>,
        now: i64,
    },
    Resolve {
        resolution: Resolution,
        now: i64,
    },
}

#[derive(Debug, Clone, Copy)]
enum AbsToken {
    Grant,
    Defer { slot_ms: i64, booked: bool },
}

/// What a step did.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Refused(BudgetError),
    Replayed(Arc<Event>),
    /// A fresh decision: the new record and the event.
    Decided(ActivityRecord, Arc<Event>),
    /// A deferred attempt asked again and deferred again: the event, and
    /// nothing to write.
    Redeferred(Arc<Event>),
    /// A success or resolution: the new record.
    Changed(ActivityRecord),
    /// A success on a closed or unknown activity, or a resolution of an
    /// unknown one: nothing to do.
    Nothing,
}

fn raw(hints: Option<(&'static str, Option<i64>)>) -> Option<RawHints<'static>> {
    hints.map(|(retry_after, pushback)| RawHints {
        retry_after,
        date: "",
        grpc_retry_pushback_ms: pushback,
        retry_info_delay: None,
    })
}

fn deadline_ms(policy: &Policy) -> i64 {
    i64::try_from(policy.deadline_seconds * 1000).unwrap()
}

/// Applies one absolute step to `record` (which it does not change).
fn apply(record: Option<&ActivityRecord>, step: &Abs) -> Outcome {
    match step {
        Abs::Report {
            attempt,
            class,
            hints,
            occurred_at_ms,
            policy,
            token,
            now,
        } => {
            let report = Report {
                attempt: *attempt,
                class: *class,
                rule: None,
                hints: raw(*hints),
                policy: *policy,
                occurred_at_ms: *occurred_at_ms,
                workflow_id: "wf-1",
                dependency: "",
            };
            match activity::draft_or_replay(record.cloned(), &key(), &report, &defaults(), *now) {
                Err(e) => Outcome::Refused(e),
                Ok(DraftOrReplay::Replay(replay)) => Outcome::Replayed(replay.event),
                Ok(DraftOrReplay::Fresh(mut draft)) => {
                    draft.take_token(Scripted(*token), *now);
                    if !draft.needs_write() {
                        return Outcome::Redeferred(draft.finish().1);
                    }
                    let (record, event) = draft.finish();
                    Outcome::Decided(record, event)
                }
            }
        }
        Abs::Success {
            occurred_at_ms,
            now,
        } => match record {
            None => Outcome::Nothing,
            Some(r) => match activity::record_success(r.clone(), *occurred_at_ms, *now) {
                None => Outcome::Nothing,
                Some(r) => Outcome::Changed(r),
            },
        },
        Abs::Resolve { resolution, now } => match record {
            None => Outcome::Nothing,
            Some(r) => match activity::resolve(r.clone(), *resolution, "looked at it", *now) {
                Err(e) => Outcome::Refused(e),
                Ok(r) => Outcome::Changed(r),
            },
        },
    }
}

/// A budget answering as a step says: a token, or a deferral to a time,
/// holding a place in line (dated at its first deferral) or not.
struct Scripted(AbsToken);

impl TokenGate for Scripted {
    fn take(&mut self, ask: &Ask<'_>) -> Answer {
        match self.0 {
            AbsToken::Grant => Admission::Granted,
            AbsToken::Defer { slot_ms, booked } => Admission::Deferred {
                wait: Duration::from_millis((slot_ms - ask.now_ms).max(0) as u64),
                reason: "global_capacity_exhausted",
                // A place, once taken, is kept.
                waiting_since_ms: ask.waiting_since_ms.or(booked.then_some(ask.now_ms)),
            },
        }
        .into()
    }

    fn observe(&mut self, _observed: Observed) {}
}

/// What the documentation says a report must get, before it is planned.
enum Expected {
    Refused(BudgetError),
    Replay(Arc<Event>),
    Fresh,
}

/// The model kept beside the record: every acknowledged decision by
/// attempt, and the pending deferral.
#[derive(Default)]
struct Model {
    decided: BTreeMap<u32, Arc<Event>>,
    deferral: Option<Arc<Event>>,
}

impl Model {
    fn expect_report(&self, record: Option<&ActivityRecord>, step: &Abs) -> Expected {
        let Abs::Report {
            attempt,
            occurred_at_ms,
            now,
            ..
        } = step
        else {
            unreachable!()
        };
        let attempt = *attempt;
        if attempt == 0 {
            return Expected::Refused(BudgetError::AttemptMustBePositive);
        }
        let Some(record) = record else {
            if attempt != 1 {
                return Expected::Refused(BudgetError::AttemptOutOfOrder {
                    expected: 1,
                    got: attempt,
                });
            }
            return Expected::Fresh;
        };
        if attempt <= record.attempts {
            return Expected::Replay(Arc::clone(&self.decided[&attempt]));
        }
        // Past the last decision, a closed or parked activity says so
        // whatever the attempt.
        match record.status {
            Status::Closed => {
                return Expected::Refused(BudgetError::ActivityClosed {
                    code: record
                        .closed_code
                        .clone()
                        .expect("a closed record has a code"),
                    attempts: record.attempts,
                });
            }
            Status::Parked => {
                return Expected::Refused(BudgetError::ActivityParked {
                    attempts: record.attempts,
                });
            }
            Status::Open => {}
        }
        if attempt != record.attempts + 1 {
            return Expected::Refused(BudgetError::AttemptOutOfOrder {
                expected: record.attempts + 1,
                got: attempt,
            });
        }
        if let Some(r) = record.deferral
            && r.attempt == attempt
            && *now < r.not_before_ms
        {
            return Expected::Replay(Arc::clone(
                self.deferral
                    .as_ref()
                    .expect("a pending deferral has its event"),
            ));
        }
        let occurred = occurred_at_ms.unwrap_or(*now);
        if occurred < record.started_at_ms {
            return Expected::Refused(BudgetError::OccurredBeforeStart {
                occurred_at_ms: occurred,
                started_at_ms: record.started_at_ms,
            });
        }
        Expected::Fresh
    }
}

/// Makes a step absolute against the current record and clock.
fn absolute(record: Option<&ActivityRecord>, step: &Step, now: i64) -> Abs {
    let attempts = record.map_or(0, |r| r.attempts);
    let started = record.map_or(now, |r| r.started_at_ms);
    let relative = |permille: i64, policy: &Policy| started + permille * deadline_ms(policy) / 1000;
    match &step.op {
        Op::Report {
            which,
            class,
            hints,
            occurred,
            policy,
            token,
        } => {
            let attempt = match which {
                Which::Next => attempts + 1,
                Which::Earlier(i) => 1 + i % attempts.max(1),
                Which::Skip(k) => attempts + 1 + k,
                Which::Zero => 0,
            };
            let effective = record.map_or_else(
                || policy.map_or(defaults().policy, |p| p.or_defaults(defaults().policy)),
                |r| r.policy,
            );
            let left = started + deadline_ms(&effective) - now;
            let slot = |permille: i64| now + permille * (left.max(0) + 10_000) / 1000;
            Abs::Report {
                attempt,
                class: *class,
                hints: *hints,
                occurred_at_ms: occurred.map(|p| relative(p, &effective)),
                policy: *policy,
                token: match token {
                    Token::Grant => AbsToken::Grant,
                    Token::Booked(p) => AbsToken::Defer {
                        slot_ms: slot(*p),
                        booked: true,
                    },
                    Token::Unbooked(p) => AbsToken::Defer {
                        slot_ms: slot(*p),
                        booked: false,
                    },
                },
                now,
            }
        }
        Op::Success { occurred } => Abs::Success {
            occurred_at_ms: occurred
                .map(|p| relative(p, &record.map_or(defaults().policy, |r| r.policy))),
            now,
        },
        Op::Resolve(resolution) => Abs::Resolve {
            resolution: *resolution,
            now,
        },
    }
}

/// The record as the store would read it back.
fn round_trip(record: &ActivityRecord) -> ActivityRecord {
    let mut bytes = Vec::new();
    encode_into(record.clone(), &mut bytes);
    let decoded = decode(&bytes).expect("what was encoded decodes");
    assert_eq!(&decoded, record, "the record round-trips through the codec");
    decoded
}

/// Every decided attempt, asked again now with any class, replays its
/// recorded event; the next attempt never does.
fn check_replays(record: &ActivityRecord, model: &Model, now: i64) {
    assert_eq!(
        model.decided.keys().copied().collect::<Vec<_>>(),
        (1..=record.attempts).collect::<Vec<_>>(),
        "attempts 1 to {} are decided, each once",
        record.attempts
    );
    for (&attempt, event) in &model.decided {
        for (class, at) in [
            (ErrorClass::Transient, now),
            (ErrorClass::Permanent, now + 3_600_000),
            (ErrorClass::Unknown, record.started_at_ms - 1),
        ] {
            let report = Report {
                attempt,
                class,
                rule: None,
                hints: raw(Some(("9999", Some(-1)))),
                policy: Some(Policy {
                    max_attempts: 1,
                    deadline_seconds: 1,
                    base: Some(9),
                    cap: Some(9),
                }),
                occurred_at_ms: Some(at),
                workflow_id: "another",
                dependency: "",
            };
            match activity::draft_or_replay(Some(record.clone()), &key(), &report, &defaults(), at)
            {
                Ok(DraftOrReplay::Replay(replay)) => {
                    assert_eq!(
                        &replay.event, event,
                        "attempt {attempt} replays its decision"
                    );
                    assert_eq!(replay.policy, record.policy);
                }
                other => panic!("attempt {attempt} of {record:?} did not replay: {other:?}"),
            }
        }
    }
}

/// Runs a history, checking every step; returns what each step did, by its
/// code (`replayed`, `nothing`, `turn_came` for a retry whose turn in line
/// came, `deferred_again` for a deferral asked again and deferred again).
fn run(steps: &[Step]) -> Vec<String> {
    let mut record: Option<ActivityRecord> = None;
    let mut model = Model::default();
    let mut now = T0;
    let mut closed: Option<(Option<String>, Option<i64>, u32)> = None;
    let mut seen = Vec::new();
    for step in steps {
        now += step.tick;
        let abs = absolute(record.as_ref(), step, now);
        let expected = match &abs {
            Abs::Report { .. } => Some(model.expect_report(record.as_ref(), &abs)),
            _ => None,
        };
        let outcome = apply(record.as_ref(), &abs);
        seen.push(label(&outcome));
        let before = record.clone();
        match (&abs, expected, outcome) {
            (_, Some(Expected::Refused(want)), Outcome::Refused(got)) => {
                assert_eq!(got, want, "refused for the documented reason");
            }
            (_, Some(Expected::Replay(want)), Outcome::Replayed(got)) => {
                assert_eq!(got, want, "a replay returns exactly the recorded event");
            }
            (
                Abs::Report {
                    attempt,
                    hints,
                    now,
                    ..
                },
                Some(Expected::Fresh),
                Outcome::Decided(new, event),
            ) => {
                check_decision(before.as_ref(), &new, &event, *attempt, *now);
                if hints.is_some_and(|(_, pushback)| pushback.is_some_and(|p| p < 0)) {
                    assert!(
                        !matches!(event.action, Some(Action::ScheduleRetry | Action::Deferred)),
                        "the server asked not to retry: {event:?}"
                    );
                }
                if event.action == Some(Action::Deferred) {
                    model.deferral = Some(Arc::clone(&event));
                } else {
                    model.decided.insert(*attempt, Arc::clone(&event));
                    model.deferral = None;
                }
                record = Some(new);
            }
            (
                Abs::Report { attempt, now, .. },
                Some(Expected::Fresh),
                Outcome::Redeferred(event),
            ) => {
                let pending = before
                    .as_ref()
                    .and_then(|r| r.deferral)
                    .expect("only a deferred attempt asked again is deferred again");
                assert_eq!(pending.attempt, *attempt);
                assert!(*now >= pending.not_before_ms);
                assert_eq!(event.action, Some(Action::Deferred));
                assert_eq!(
                    event.payment.place(),
                    pending.waiting_since_ms,
                    "its place kept"
                );
                let deadline = before
                    .as_ref()
                    .map_or(0, |r| r.started_at_ms + deadline_ms(&r.policy));
                assert!(event.not_before_ms.unwrap() <= deadline);
            }
            (Abs::Success { .. }, None, outcome) => {
                let was = before.as_ref().map(|r| r.status);
                match outcome {
                    Outcome::Nothing => assert!(
                        was.is_none() || was == Some(Status::Closed),
                        "a success changes only an activity not yet closed"
                    ),
                    Outcome::Changed(new) => {
                        assert_ne!(was, Some(Status::Closed));
                        assert_eq!(new.status, Status::Closed);
                        assert_eq!(new.closed_code.as_deref(), Some("succeeded"));
                        assert_eq!(new.deferral, None);
                        assert_eq!(new.events.last().unwrap().kind, EventKind::Success);
                        record = Some(new);
                    }
                    other => panic!("a success gave {other:?}"),
                }
            }
            (Abs::Resolve { resolution, .. }, None, outcome) => {
                let was = before.as_ref().map(|r| r.status);
                match outcome {
                    Outcome::Nothing => assert!(was.is_none()),
                    Outcome::Refused(e) => {
                        assert_ne!(was, Some(Status::Parked));
                        assert_eq!(e.code(), "activity_not_parked");
                    }
                    Outcome::Changed(new) => {
                        assert_eq!(was, Some(Status::Parked));
                        let (status, code) = match resolution {
                            Resolution::Fail => (Status::Closed, Some("resolved_failed")),
                            Resolution::Retry => (Status::Open, None),
                        };
                        assert_eq!(new.status, status);
                        assert_eq!(new.closed_code.as_deref(), code);
                        assert_eq!(new.events.last().unwrap().kind, EventKind::Resolution);
                        record = Some(new);
                    }
                    other => panic!("a resolution gave {other:?}"),
                }
            }
            (abs, _, outcome) => panic!("{abs:?} on {before:?} gave {outcome:?}"),
        }

        if let Some(new) = &record {
            if let Some(old) = &before {
                assert!(new.attempts >= old.attempts, "attempts went back");
                assert!(
                    new.events.len() >= old.events.len()
                        && new.events[..old.events.len()] == old.events[..],
                    "history is only appended to"
                );
                assert_eq!(
                    (new.started_at_ms, new.policy),
                    (old.started_at_ms, old.policy),
                    "the start and the policy are fixed by the first report"
                );
            }
            // Closed stays closed, as it was closed.
            let sealed = (new.closed_code.clone(), new.closed_at_ms, new.attempts);
            match &closed {
                Some(then) => {
                    assert_eq!(new.status, Status::Closed, "a closed activity reopened");
                    assert_eq!(&sealed, then, "a closed activity changed");
                }
                None if new.status == Status::Closed => closed = Some(sealed),
                None => {}
            }
            if new.status == Status::Closed {
                assert!(
                    activity::record_success(new.clone(), None, now).is_none(),
                    "success is idempotent"
                );
                let refused = activity::resolve(new.clone(), Resolution::Retry, "", now);
                assert_eq!(refused.unwrap_err().code(), "activity_not_parked");
            }
            let decoded = round_trip(new);
            check_replays(&decoded, &model, now);
            // The history goes on from what the store would read back.
            record = Some(decoded);
        }
    }
    seen
}

fn label(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Refused(e) => e.code().to_owned(),
        Outcome::Replayed(_) => "replayed".to_owned(),
        Outcome::Decided(_, e) if e.reason.contains("its turn in line came") => {
            "turn_came".to_owned()
        }
        Outcome::Redeferred(_) => "deferred_again".to_owned(),
        Outcome::Decided(_, e) => e.code.clone(),
        Outcome::Changed(r) => r.events.last().expect("a transition").code.clone(),
        Outcome::Nothing => "nothing".to_owned(),
    }
}

/// The checks on a fresh decision `event` that turned `before` into `new`.
fn check_decision(
    before: Option<&ActivityRecord>,
    new: &ActivityRecord,
    event: &Arc<Event>,
    attempt: u32,
    now: i64,
) {
    assert!(Arc::ptr_eq(new.events.last().unwrap(), event));
    assert_eq!(new.events.len(), before.map_or(0, |r| r.events.len()) + 1);
    assert_eq!((event.kind, event.attempt), (EventKind::Decision, attempt));
    assert_eq!(event.recorded_at_ms, now);
    let deadline = new.started_at_ms + deadline_ms(&new.policy);
    let action = event.action.expect("a decision has an action");
    assert_eq!(event.code, action.code());
    let attempts_before = before.map_or(0, |r| r.attempts);
    match action {
        Action::ScheduleRetry => {
            let not_before = event.not_before_ms.expect("a retry has a time");
            assert!(
                not_before <= deadline,
                "a retry planned at {not_before}, past the deadline {deadline}: {event:?}"
            );
            assert!(not_before >= event.occurred_at_ms);
            assert!(event.payment.is_token(), "a retry holds a token");
            assert_eq!((new.attempts, new.status), (attempt, Status::Open));
            assert_eq!(new.deferral, None);
        }
        Action::Deferred => {
            let not_before = event.not_before_ms.expect("a deferral has a time");
            assert!(
                not_before <= deadline,
                "deferred to {not_before}, past the deadline {deadline}"
            );
            assert_eq!(
                new.attempts, attempts_before,
                "a deferral consumes no attempt"
            );
            assert_eq!(new.status, Status::Open);
            let deferral = new.deferral.expect("a deferral is pending");
            assert_eq!(
                (deferral.attempt, deferral.not_before_ms),
                (attempt, not_before)
            );
            assert_eq!(deferral.waiting_since_ms, event.payment.place());
            assert!(!event.payment.is_token(), "a deferral holds no token yet");
        }
        Action::ManualReview => {
            assert_eq!((new.attempts, new.status), (attempt, Status::Parked));
            assert!(event.not_before_ms.is_none());
        }
        Action::AttemptsExhausted | Action::DeadlineExceeded | Action::FailPermanent => {
            assert_eq!((new.attempts, new.status), (attempt, Status::Closed));
            assert_eq!(new.closed_code.as_deref(), Some(action.code()));
            assert_eq!(new.closed_at_ms, Some(now));
            assert!(event.not_before_ms.is_none());
            assert_eq!(new.deferral, None);
        }
    }
    if action != Action::ScheduleRetry && action != Action::Deferred {
        assert!(
            !event.payment.is_token(),
            "only a retry takes a token: {event:?}"
        );
    }
    if action != Action::Deferred {
        assert!(
            event.payment.place().is_none(),
            "only a deferral holds a place: {event:?}"
        );
    }
}

fn class() -> impl Strategy<Value = ErrorClass> {
    prop_oneof![
        6 => Just(ErrorClass::Transient),
        1 => Just(ErrorClass::Permanent),
        1 => Just(ErrorClass::Unknown),
    ]
}

fn policy() -> impl Strategy<Value = Option<Policy>> {
    prop::option::weighted(
        0.5,
        (
            0u32..=8,
            prop_oneof![Just(0u64), 1u64..=30, 31u64..=900],
            prop::option::of(0u32..=3),
            prop::option::of(0u32..=90),
        )
            .prop_map(|(max_attempts, deadline_seconds, base, cap)| Policy {
                max_attempts,
                deadline_seconds,
                base,
                cap,
            }),
    )
}

fn hints() -> impl Strategy<Value = Option<(&'static str, Option<i64>)>> {
    prop::option::weighted(
        0.3,
        (
            prop::sample::select(vec![
                "",
                "0",
                "3",
                "45",
                "120",
                "garbage",
                "Wed, 21 Oct 2015 07:28:00 GMT",
            ]),
            prop::option::of(prop::sample::select(vec![-1i64, 0, 1_500, 20_000, 100_000])),
        ),
    )
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        4 => Just(Token::Grant),
        // Often a slot soon, so that a later step comes back to it before
        // the deadline (the only time a booked slot can be redeemed);
        // otherwise anywhere up to past the deadline.
        2 => prop_oneof![0i64..=50, 0i64..=1200].prop_map(Token::Booked),
        1 => prop_oneof![0i64..=50, 0i64..=1200].prop_map(Token::Unbooked),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let which = prop_oneof![
        10 => Just(Which::Next),
        3 => any::<u32>().prop_map(Which::Earlier),
        1 => (1u32..=3).prop_map(Which::Skip),
        1 => Just(Which::Zero),
    ];
    // Mostly within the deadline, sometimes before the start or past it.
    let occurred = prop::option::weighted(
        0.8,
        prop_oneof![8 => 0i64..=1000, 1 => -100i64..0, 1 => 1000i64..=1500],
    );
    let report = (which, class(), hints(), occurred.clone(), policy(), token()).prop_map(
        |(which, class, hints, occurred, policy, token)| Op::Report {
            which,
            class,
            hints,
            occurred,
            policy,
            token,
        },
    );
    prop_oneof![
        12 => report,
        1 => occurred.prop_map(|occurred| Op::Success { occurred }),
        2 => prop_oneof![Just(Resolution::Fail), Just(Resolution::Retry)].prop_map(Op::Resolve),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    // The service clock: mostly small steps, sometimes a pause within a
    // deadline's reach or a long one past it, and sometimes a step back (a
    // clock being corrected).
    let tick = prop_oneof![
        8 => 0i64..=3_000,
        1 => 3_000i64..=60_000,
        1 => 60_000i64..=400_000,
        1 => -2_000i64..0,
    ];
    (tick, op()).prop_map(|(tick, op)| Step { tick, op })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn every_history_keeps_the_state_machines_promises(steps in prop::collection::vec(step(), 1..48)) {
        run(&steps);
    }
}

/// The generator reaches the states the properties are about: histories
/// that never closed, parked, deferred or redeemed a booked slot would
/// pass without checking much.
#[test]
fn the_histories_reach_every_state() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = prop::collection::vec(step(), 1..48);
    let mut seen = BTreeMap::<String, usize>::new();
    for _ in 0..200 {
        let steps = strategy.new_tree(&mut runner).unwrap().current();
        for what in run(&steps) {
            *seen.entry(what).or_default() += 1;
        }
    }
    for wanted in [
        "schedule_retry",
        "deferred",
        "turn_came",
        "deferred_again",
        "deadline_exceeded",
        "attempts_exhausted",
        "fail_permanent",
        "manual_review",
        "succeeded",
        "resolved_failed",
        "resolved_retry",
        "replayed",
        "attempt_out_of_order",
        "attempt_must_be_positive",
        "activity_closed",
        "activity_parked",
        "activity_not_parked",
        "occurred_before_start",
    ] {
        let n = seen.get(wanted).copied().unwrap_or(0);
        assert!(n >= 3, "{wanted} seen {n} times: {seen:?}");
    }
}
