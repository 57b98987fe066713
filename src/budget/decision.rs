//! The one decision on a failed attempt, shared by both forms of
//! `NextAction`.
//!
//! The pure form decides on the budget the caller sends ([`pure_decision`]);
//! the durable form on the budget its record holds
//! ([`super::activity::draft_or_replay`]). Both draft the decision's event
//! with [`draft_event`] (the reference `next_action`, the server's
//! do-not-retry, the retry's delay) and apply the budget's answer to it
//! with [`settle`], so each rule and each sentence of a reason exists once.
//! The result is an [`Event`]: the durable form records it, the pure form
//! returns it.

use super::action::{Action, Budget, ErrorClass, explain, next_action};
use super::codes;
use super::delay::{DelayParams, retry_delay};
use super::error::{BudgetError, validate_activity_id};
use super::hint::{GRPC_PUSHBACK_DO_NOT_RETRY, Hint, RawHints, normalize};
use super::record::{Event, EventKind};
use super::token::{Admission, Answer, Ask, Observed, Payment, TokenGate};

/// A failed attempt with its class, as reported or as the service classified
/// it, whichever form of `NextAction` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassifiedFailure<'a> {
    /// The failure's class.
    pub class: ErrorClass,
    /// The classification rule that gave `class`, when the service
    /// classified a raw failure.
    pub rule: Option<&'a str>,
    /// The server's retry hints, raw as the worker received them.
    pub hints: Option<RawHints<'a>>,
    /// The logical time of the failure, unix milliseconds; `None` means now.
    pub occurred_at_ms: Option<i64>,
}

/// An activity's deadline: no retry may start after `seconds` past
/// `started_at_ms` (the logical time of its first failure).
///
/// One instant, judged against every lower bound on when the retry can
/// start: the planned start (`occurred_at + delay`, the caller's clock) and,
/// for an attempt asked again after a deferral, the moment it is asked (the
/// service's clock). A retry either puts past the deadline is
/// `deadline_exceeded`; a queue of turns never is: a deferral points the
/// worker at most at the deadline, and it gets its stop then if no token
/// came. The two clocks are taken to agree (NTP), as `[limits]
/// max_timestamp_past` and `max_timestamp_future` already assume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// The logical start, unix milliseconds.
    pub started_at_ms: i64,
    /// Seconds after the start.
    pub seconds: u64,
}

impl Deadline {
    /// The deadline as unix milliseconds, saturating.
    pub fn at_ms(&self) -> i64 {
        let ms = i64::try_from(self.seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
        self.started_at_ms.saturating_add(ms)
    }

    /// The reason of a retry that could only start at `start_ms`, past it.
    fn missed(&self, start_ms: i64, why: &str, note: &str) -> String {
        format!(
            "{why} {} after the start{note}, past the {} s deadline",
            seconds(start_ms.saturating_sub(self.started_at_ms)),
            self.seconds
        )
    }
}

/// Turns a retry that could only start at `start_ms` into
/// `deadline_exceeded`, saying why (`why` names what set `start_ms`).
pub(super) fn exceed(event: &mut Event, deadline: Deadline, start_ms: i64, why: &str) {
    event.action = Some(Action::DeadlineExceeded);
    event.code = codes::DEADLINE_EXCEEDED.to_owned();
    event.reason = deadline.missed(start_ms, why, "");
    event.not_before_ms = None;
    event.delay_seconds = 0;
    event.delay_ms = 0;
    event.payment = Payment::Nothing;
    event.defer_reason = None;
}

/// The terms a retry's delay is planned on: the activity whose jitter it
/// uses, its backoff parameters, and its deadline when it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryTerms<'a> {
    /// The activity id the jitter is derived from; without one (the pure
    /// form naming no activity) only a server's hint sets a delay.
    pub activity_id: Option<&'a str>,
    /// Backoff base and cap.
    pub params: DelayParams,
    /// A retry planned to start past it is `deadline_exceeded` instead.
    pub deadline: Option<Deadline>,
}

/// The event of a failed attempt decided on `budget`, before the budget's
/// answer is settled on it: the reference `next_action`, a server's
/// do-not-retry turning a retry into `fail_permanent`, and for a retry
/// (`retry`) the delay, `max(backoff, hint)` from `occurred_at`, which must
/// start before the deadline.
///
/// `now_ms` stamps a failure without `occurred_at` and dates the event;
/// `elapsed_ms` is what the event records of the budget's elapsed time.
///
/// # Errors
/// [`BudgetError::AttemptMustBePositive`] for a retry of attempt 0.
pub fn draft_event(
    budget: &Budget,
    failure: &ClassifiedFailure<'_>,
    elapsed_ms: u64,
    retry: Option<RetryTerms<'_>>,
    max_hint_ms: u64,
    now_ms: i64,
) -> Result<Event, BudgetError> {
    let occurred_at_ms = failure.occurred_at_ms.unwrap_or(now_ms);
    let hint = failure
        .hints
        .map(|raw| normalize(&raw, occurred_at_ms, max_hint_ms));
    let mut event = Event {
        kind: EventKind::Decision,
        attempt: budget.attempts,
        class: Some(failure.class),
        occurred_at_ms,
        occurred_at_stamped: failure.occurred_at_ms.is_none(),
        elapsed_ms,
        backoff_ms: 0,
        delay_seconds: 0,
        delay_ms: 0,
        not_before_ms: None,
        action: None,
        code: String::new(),
        reason: String::new(),
        payment: Payment::Nothing,
        defer_reason: None,
        rule: failure.rule.map(str::to_owned),
        hint,
        dependency: None,
        dependency_untracked: false,
        recorded_at_ms: now_ms,
    };
    let mut action = next_action(budget, failure.class);
    let planned = match (action, retry) {
        (Action::ScheduleRetry, Some(retry)) => match retry.activity_id {
            Some(id) => Some(planned_delay(
                id,
                budget.attempts,
                retry.params,
                hint.as_ref(),
            )?),
            None => hint
                .filter(|h| h.delay_ms > 0)
                .map(|h| PlannedDelay::hinted(h.delay_ms)),
        },
        _ => None,
    };
    if action == Action::ScheduleRetry && hint.is_some_and(|h| h.do_not_retry) {
        action = Action::FailPermanent;
        event.reason = [
            "the server asked not to retry (",
            GRPC_PUSHBACK_DO_NOT_RETRY,
            ")",
        ]
        .concat();
    } else if let (Some(planned), Some(retry)) = (planned, retry) {
        let not_before = occurred_at_ms.saturating_add_unsigned(planned.millis);
        event.backoff_ms = planned.backoff_ms;
        match retry.deadline {
            Some(deadline) if not_before > deadline.at_ms() => {
                action = Action::DeadlineExceeded;
                let note = if planned.from_hint {
                    " (as the server asked)"
                } else {
                    ""
                };
                event.reason = deadline.missed(not_before, "the next attempt could start", note);
            }
            _ => {
                event.delay_seconds = planned.seconds;
                event.delay_ms = planned.millis;
                event.not_before_ms = Some(not_before);
                event.reason = planned.describe(budget);
            }
        }
    } else {
        event.reason = explain(action, budget);
    }
    event.action = Some(action);
    event.code = action.code().to_owned();
    Ok(event)
}

/// Applies the budget's answer to a decided retry: a granted token is
/// taken; otherwise the retry is deferred (the attempt is not consumed) to
/// when the budget says to ask again, or to the retry's planned start if
/// later, and never past the deadline (when the caller keeps one): a
/// worker pointed at its deadline gets its stop then if no token came by
/// then. The budget never ends an activity by itself.
pub fn settle(
    event: &mut Event,
    answer: impl Into<Answer>,
    now_ms: i64,
    deadline: Option<Deadline>,
) {
    let Answer {
        admission,
        pace,
        untracked,
    } = answer.into();
    event.dependency_untracked = untracked;
    let (wait, reason, waiting_since_ms) = match admission {
        Admission::Granted => {
            event.payment = Payment::Token;
            return;
        }
        // Shadow mode: the retry goes ahead; the record says why it would
        // not have.
        Admission::WouldDefer { reason } => {
            event.defer_reason = Some(reason.to_owned());
            event.reason = format!(
                "{}; shadow mode: the budget would have deferred it ({})",
                event.reason,
                whose(event, reason, pace)
            );
            return;
        }
        Admission::Deferred {
            wait,
            reason,
            waiting_since_ms,
        } => (wait, reason, waiting_since_ms),
    };
    // Rounded up: a turn a fraction of a millisecond after a moment is not
    // at that moment.
    let wait_ms = i64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
    let turn_ms = now_ms.saturating_add(wait_ms);
    let mut not_before = event
        .not_before_ms
        .map_or(turn_ms, |planned| planned.max(turn_ms));
    let mut until_deadline = false;
    if let Some(deadline) = deadline
        && not_before > deadline.at_ms()
    {
        if now_ms >= deadline.at_ms() {
            // Asked at or after the deadline with no token: the deadline
            // has passed, whatever the logical time of the failure.
            exceed(
                event,
                deadline,
                now_ms,
                "no retry token came before the deadline; asked",
            );
            return;
        }
        not_before = deadline.at_ms();
        until_deadline = true;
    }
    event.action = Some(Action::Deferred);
    event.code = codes::DEFERRED.to_owned();
    event.payment =
        waiting_since_ms.map_or(Payment::Nothing, |since_ms| Payment::Turn { since_ms });
    event.defer_reason = Some(reason.to_owned());
    let what = match waiting_since_ms {
        Some(since) if since < now_ms => format!(
            "its place in line, taken {} ago, has not come yet",
            seconds(now_ms - since)
        ),
        Some(_) => "it took a place in line".to_owned(),
        None => "no place in line is held".to_owned(),
    };
    // `not_before` is whichever comes later: the turn, on the service's
    // clock (`now_ms + wait`), or the retry's planned start, in the
    // caller's logical time (`occurred_at + delay`); at most the deadline.
    let when = if until_deadline {
        format!(
            "ask again at the deadline, {} from now",
            seconds(not_before - now_ms)
        )
    } else {
        match event.not_before_ms {
            Some(planned) if planned > turn_ms => format!(
                "the retry's planned start, {} after occurred_at, is later",
                seconds(planned.saturating_sub(event.occurred_at_ms))
            ),
            _ => format!("ask again in {}", seconds(wait_ms)),
        }
    };
    event.reason = format!(
        "retry capacity is exhausted ({}); {what}; {when}: report attempt {} again then",
        whose(event, reason, pace),
        event.attempt
    );
    event.not_before_ms = Some(not_before);
}

/// Whose budget ran out, for people: the stable reason, and, when the
/// dependency's budget decided, the dependency and its pace in numbers
/// ("dependency_budget_exhausted: payments-api: 4.1 retries/s allowed: 38
/// of the 40 retries granted in the last 10 s failed, none free").
fn whose(event: &Event, reason: &str, pace: Option<super::token::Pace>) -> String {
    match pace {
        Some(pace) => format!(
            "{reason}: {}: {pace}, none free",
            event
                .dependency
                .as_deref()
                .unwrap_or(super::token::DEFAULT_DEPENDENCY)
        ),
        None => reason.to_owned(),
    }
}

/// The pure form of `NextAction`: a failed attempt decided on the budget as
/// the caller gives it, nothing stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PureReport<'a> {
    /// The reference budget, the failed attempt included.
    pub budget: Budget,
    /// The failure.
    pub failure: ClassifiedFailure<'a>,
    /// The activity, when named: a retry then gets its delay. May be empty.
    pub activity_id: &'a str,
    /// Backoff base and cap for that delay.
    pub params: DelayParams,
    /// The dependency the failed call went to; empty for the default one.
    pub dependency: &'a str,
}

/// The pure form's decision: the reference `next_action` on the budget as
/// given, with the delay of a retry (the backoff when an activity is named,
/// a server's hint either way), which must start before the budget's
/// deadline (`occurred_at - elapsed + deadline`). A retry takes a token
/// through `gate` (none for a dry run); the pure form keeps no record to
/// hold a place in line, so without a token it is deferred to when its
/// turn would come, behind the durable retries in line.
///
/// # Errors
/// [`BudgetError`] for an invalid activity id.
pub fn pure_decision(
    report: &PureReport<'_>,
    gate: Option<impl TokenGate>,
    max_hint_ms: u64,
    now_ms: i64,
) -> Result<Event, BudgetError> {
    if !report.activity_id.is_empty() {
        validate_activity_id(report.activity_id)?;
    }
    let budget = &report.budget;
    let occurred_at_ms = report.failure.occurred_at_ms.unwrap_or(now_ms);
    let deadline = Deadline {
        started_at_ms: occurred_at_ms
            .saturating_sub(i64::try_from(budget.elapsed.saturating_mul(1000)).unwrap_or(i64::MAX)),
        seconds: budget.deadline,
    };
    let retry = RetryTerms {
        activity_id: (!report.activity_id.is_empty()).then_some(report.activity_id),
        params: report.params,
        deadline: Some(deadline),
    };
    let elapsed_ms = budget.elapsed.saturating_mul(1000);
    let mut event = draft_event(
        budget,
        &report.failure,
        elapsed_ms,
        Some(retry),
        max_hint_ms,
        now_ms,
    )?;
    event.dependency = (!report.dependency.is_empty()).then(|| report.dependency.to_owned());
    if let Some(mut gate) = gate {
        let observed = Observed {
            retry_failed: budget.attempts >= 2,
        };
        if event.action == Some(Action::ScheduleRetry) {
            let ask = Ask {
                activity_id: None,
                waiting_since_ms: None,
                now_ms,
                planned_ms: None,
                observed: Some(observed),
            };
            let answer = gate.take(&ask);
            settle(&mut event, answer, now_ms, Some(deadline));
        } else {
            gate.observe(observed);
        }
    }
    // A retry's start is the caller's own occurred_at plus delay_ms: the
    // pure form keeps no time of the activity to answer it with. Only a
    // deferral's time (when to ask again) is the server's to give.
    if event.action == Some(Action::ScheduleRetry) {
        event.not_before_ms = None;
    }
    Ok(event)
}

/// A retry's delay: the reference backoff, or the server's hint when it
/// asks for longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedDelay {
    /// The delay in whole seconds (`millis / 1000`).
    pub seconds: u32,
    /// The delay in milliseconds: `max(backoff, hint)`.
    pub millis: u64,
    /// The reference backoff in milliseconds, before any hint.
    pub backoff_ms: u64,
    /// True when the hint was longer than the backoff and decided.
    pub from_hint: bool,
}

impl PlannedDelay {
    /// A delay set by a server's hint alone (no activity to derive a
    /// backoff from).
    fn hinted(millis: u64) -> Self {
        Self {
            seconds: u32::try_from(millis / 1000).unwrap_or(u32::MAX),
            millis,
            backoff_ms: 0,
            from_hint: true,
        }
    }

    /// The reason of a planned retry. Every durable retry writes one, so the
    /// numbers go through `itoa` and the pieces are joined once.
    fn describe(&self, budget: &Budget) -> String {
        // The delay's clause: its words, and the second number in it.
        let (opening, between, closing, second) = if self.from_hint {
            (
                "the server's hint of ",
                " ms, longer than the backoff of ",
                " ms from occurred_at",
                self.backoff_ms,
            )
        } else {
            (
                "backoff ",
                " ms (",
                " s) from occurred_at",
                u64::from(self.seconds),
            )
        };
        let (mut attempts, mut max_attempts) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (mut millis, mut other) = (itoa::Buffer::new(), itoa::Buffer::new());
        [
            "attempt ",
            attempts.format(budget.attempts),
            " of ",
            max_attempts.format(budget.max_attempts),
            " failed transiently; ",
            opening,
            millis.format(self.millis),
            between,
            other.format(second),
            closing,
        ]
        .concat()
    }
}

/// A retry's planned delay: the reference backoff of `attempt`, or the
/// server's normalised hint when it is longer (`max(backoff, hint)`).
///
/// # Errors
/// [`BudgetError::AttemptMustBePositive`] for attempt 0.
pub fn planned_delay(
    activity_id: &str,
    attempt: u32,
    params: DelayParams,
    hint: Option<&Hint>,
) -> Result<PlannedDelay, BudgetError> {
    let backoff = retry_delay(activity_id, attempt, params)
        .map_err(|_| BudgetError::AttemptMustBePositive)?;
    let hinted = hint.map_or(0, |h| h.delay_ms);
    Ok(if hinted > backoff.millis {
        PlannedDelay {
            seconds: u32::try_from(hinted / 1000).unwrap_or(u32::MAX),
            millis: hinted,
            backoff_ms: backoff.millis,
            from_hint: true,
        }
    } else {
        PlannedDelay {
            seconds: backoff.seconds,
            millis: backoff.millis,
            backoff_ms: backoff.millis,
            from_hint: false,
        }
    })
}

/// Milliseconds as seconds with three decimals, for reasons people read.
fn seconds(ms: i64) -> String {
    format!("{}.{:03} s", ms / 1000, (ms % 1000).abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planned_retry_reads_as_the_sentence_it_always_was() {
        let budget = Budget {
            attempts: 2,
            max_attempts: 5,
            elapsed: 7,
            deadline: 30,
        };
        let backoff = PlannedDelay {
            seconds: 4,
            millis: 4_250,
            backoff_ms: 4_250,
            from_hint: false,
        };
        assert_eq!(
            backoff.describe(&budget),
            "attempt 2 of 5 failed transiently; backoff 4250 ms (4 s) from occurred_at"
        );
        let hinted = PlannedDelay {
            seconds: 120,
            millis: 120_000,
            backoff_ms: 4_250,
            from_hint: true,
        };
        assert_eq!(
            hinted.describe(&budget),
            "attempt 2 of 5 failed transiently; the server's hint of 120000 ms, \
             longer than the backoff of 4250 ms from occurred_at"
        );
    }
}

#[cfg(test)]
mod pure_tests {
    //! The pure form against its budget's deadline: it never grants a retry
    //! that would start past it, never stops one the deadline still allows,
    //! and defers to the time the budget gives, never past the deadline.

    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::budget::hint::RawHints;
    use crate::budget::token::{Ask, Observed};

    const NOW: i64 = 1_800_000_000_000;

    /// A budget answering with a token, or a wait.
    struct Answering(Option<u64>);

    impl TokenGate for Answering {
        fn take(&mut self, _ask: &Ask<'_>) -> Answer {
            match self.0 {
                None => Admission::Granted,
                Some(ms) => Admission::Deferred {
                    wait: Duration::from_millis(ms),
                    reason: codes::DEPENDENCY_BUDGET_EXHAUSTED,
                    waiting_since_ms: None,
                },
            }
            .into()
        }

        fn observe(&mut self, _observed: Observed) {}
    }

    fn report<'a>(budget: Budget, id: &'a str, retry_after: &'a str) -> PureReport<'a> {
        PureReport {
            budget,
            failure: ClassifiedFailure {
                class: ErrorClass::Transient,
                rule: None,
                hints: (!retry_after.is_empty()).then_some(RawHints {
                    retry_after,
                    date: "",
                    grpc_retry_pushback_ms: None,
                    retry_info_delay: None,
                }),
                occurred_at_ms: Some(NOW),
            },
            activity_id: id,
            params: DelayParams::default(),
            dependency: "",
        }
    }

    #[test]
    fn the_pure_form_stops_a_retry_its_deadline_cannot_hold() {
        let late = Budget {
            attempts: 1,
            max_attempts: 5,
            elapsed: 59,
            deadline: 60,
        };
        let e = pure_decision(&report(late, "a", ""), Some(Answering(None)), 600_000, NOW).unwrap();
        assert_eq!(e.action, Some(Action::DeadlineExceeded), "{e:?}");
        assert!(!e.payment.is_token(), "no token taken for it");
        let early = Budget {
            elapsed: 10,
            ..late
        };
        let e = pure_decision(
            &report(early, "a", "120"),
            Some(Answering(None)),
            600_000,
            NOW,
        )
        .unwrap();
        assert_eq!(
            e.action,
            Some(Action::DeadlineExceeded),
            "as the server asked: {e:?}"
        );
        assert!(e.reason.contains("as the server asked"), "{}", e.reason);
        let e = pure_decision(
            &report(early, "", "120"),
            Some(Answering(None)),
            600_000,
            NOW,
        )
        .unwrap();
        assert_eq!(
            e.action,
            Some(Action::DeadlineExceeded),
            "without an activity: {e:?}"
        );
    }

    proptest! {
        #[test]
        fn the_pure_form_keeps_its_deadline(
            attempts in 1u32..6,
            elapsed in 0u64..120,
            deadline in 1u64..120,
            named in any::<bool>(),
            retry_after in prop_oneof![Just(0u64), 0u64..200],
            wait_ms in prop_oneof![Just(None), (0u64..200_000).prop_map(Some)],
        ) {
            let budget = Budget { attempts, max_attempts: 6, elapsed, deadline };
            let hint = if retry_after == 0 { String::new() } else { retry_after.to_string() };
            let id = if named { "act-1" } else { "" };
            let e = pure_decision(&report(budget, id, &hint), Some(Answering(wait_ms)), 600_000, NOW)
                .unwrap();
            let deadline_at = NOW - (elapsed * 1000) as i64 + (deadline * 1000) as i64;
            let planned = if named {
                planned_delay(id, attempts, DelayParams::default(), None).unwrap().millis.max(retry_after * 1000)
            } else {
                retry_after * 1000
            };
            let start = NOW + planned as i64;
            match e.action.unwrap() {
                Action::ScheduleRetry => {
                    prop_assert!(start <= deadline_at, "granted past the deadline: {e:?}");
                    prop_assert!(e.payment.is_token());
                }
                Action::Deferred => {
                    let at = e.not_before_ms.unwrap();
                    prop_assert!(at <= deadline_at, "deferred past the deadline: {e:?}");
                    prop_assert!(at <= NOW + wait_ms.unwrap() as i64 + 1 || at == NOW + planned as i64,
                        "no later than the budget's turn or the planned start: {e:?}");
                }
                Action::DeadlineExceeded => {
                    prop_assert!(elapsed >= deadline || start > deadline_at,
                        "stopped while the deadline allowed the attempt: {e:?}");
                }
                other => prop_assert!(attempts >= 6 && other == Action::AttemptsExhausted, "{e:?}"),
            }
        }
    }
}
