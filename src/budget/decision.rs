//! The one decision on a failed attempt, shared by both forms of
//! `NextAction`.
//!
//! The pure form decides on the budget the caller sends ([`decide_pure`]);
//! the durable form on the budget its record holds
//! ([`super::activity::plan`]). Both go through [`decide`] (the reference
//! `next_action`, the server's do-not-retry, the retry's delay) and
//! [`settle`] (what the global token's answer makes of a retry), so each
//! rule and each sentence of a reason exists once. The result is an
//! [`Event`]: the durable form records it, the pure form returns it.

use std::time::Duration;

use super::action::{Action, Budget, ErrorClass, explain, next_action};
use super::codes;
use super::delay::{DelayParams, retry_delay};
use super::error::{BudgetError, validate_activity_id};
use super::hint::{GRPC_PUSHBACK_DO_NOT_RETRY, Hint, RawHints, normalize};
use super::record::{Event, EventKind};
use super::token::{Admission, Answer, TokenGate};

/// A failed attempt as reported, whichever form of `NextAction` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure<'a> {
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
/// start: the planned start (`occurred_at + delay`, the caller's clock), a
/// booked slot or turn (`now + wait`, the service's clock) and, for an
/// attempt asked again after a deferral, the moment it is asked (the
/// service's clock). A retry any of them puts past the deadline is
/// `deadline_exceeded`; the two clocks are taken to agree (NTP), as
/// `[limits] max_timestamp_past` and `max_timestamp_future` already assume.
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

    /// The latest `not_before` a deferral may give: [`REASK_MARGIN_MS`]
    /// before the deadline, so that the worker asking again at `not_before`
    /// still arrives before it.
    pub fn latest_deferral_ms(&self) -> i64 {
        self.at_ms().saturating_sub(REASK_MARGIN_MS)
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

/// The least time a deferral leaves between its `not_before` and the
/// activity's deadline. A deferred worker must come back and ask again
/// before its retry can start; pointed at a moment closer to the deadline
/// than one round trip and a scheduler's delay, the only answer it could
/// get is `deadline_exceeded`, so it gets that answer at once instead.
pub const REASK_MARGIN_MS: i64 = 1_000;

/// Turns a retry that could only start at `start_ms` into
/// `deadline_exceeded`, saying why (`why` names what set `start_ms`).
pub(super) fn exceed(event: &mut Event, deadline: Deadline, start_ms: i64, why: &str) {
    event.action = Some(Action::DeadlineExceeded);
    event.code = codes::DEADLINE_EXCEEDED.to_owned();
    event.reason = deadline.missed(start_ms, why, "");
    event.not_before_ms = None;
    event.delay_seconds = 0;
    event.delay_ms = 0;
    event.token_taken = false;
}

/// What a retry needs to be planned: the activity whose jitter it uses, its
/// backoff parameters, and its deadline when the caller keeps one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPlan<'a> {
    /// The activity id the jitter is derived from.
    pub activity_id: &'a str,
    /// Backoff base and cap.
    pub params: DelayParams,
    /// A retry planned to start past it is `deadline_exceeded` instead.
    pub deadline: Option<Deadline>,
}

/// Decides a failed attempt on `budget`: the reference `next_action`, a
/// server's do-not-retry turning a retry into `fail_permanent`, and for a
/// retry of a named activity (`retry`) the delay, `max(backoff, hint)` from
/// `occurred_at`, which must start before the deadline.
///
/// `now_ms` stamps a failure without `occurred_at` and dates the event;
/// `elapsed_ms` is what the event records of the budget's elapsed time.
///
/// # Errors
/// [`BudgetError::AttemptMustBePositive`] for a retry of attempt 0.
pub fn decide(
    budget: &Budget,
    failure: &Failure<'_>,
    elapsed_ms: u64,
    retry: Option<RetryPlan<'_>>,
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
        token_taken: false,
        slot_booked: false,
        defer_reason: None,
        rule: failure.rule.map(str::to_owned),
        hint,
        dependency: None,
        recorded_at_ms: now_ms,
    };
    let mut action = next_action(budget, failure.class);
    if action == Action::ScheduleRetry && hint.is_some_and(|h| h.do_not_retry) {
        action = Action::FailPermanent;
        event.reason = [
            "the server asked not to retry (",
            GRPC_PUSHBACK_DO_NOT_RETRY,
            ")",
        ]
        .concat();
    } else if let (Action::ScheduleRetry, Some(retry)) = (action, retry) {
        let planned = plan_delay(
            retry.activity_id,
            budget.attempts,
            retry.params,
            hint.as_ref(),
        )?;
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

/// Applies the global token's answer to a decided retry: a granted token is
/// taken; otherwise the retry is deferred to the booked slot (or to when to
/// ask again), and the attempt is not consumed. When that time, or the
/// planned start if later, leaves less than [`REASK_MARGIN_MS`] before the
/// deadline (when the caller keeps one), or the bucket found the slot past
/// the caller's wait ([`codes::RESERVATION_PAST_MAX_WAIT`]), the decision
/// becomes `deadline_exceeded` instead: no deferral points a worker at a
/// moment where the only answer left is a stop.
///
/// Returns whether a slot is booked for the activity.
pub fn settle(
    event: &mut Event,
    answer: impl Into<Answer>,
    now_ms: i64,
    deadline: Option<Deadline>,
) -> bool {
    let Answer { admission, pace } = answer.into();
    let (wait, reason, booked) = match admission {
        Admission::Granted => {
            event.token_taken = true;
            return false;
        }
        // Shadow mode: the retry goes ahead; the record says why it would
        // not have.
        Admission::WouldDefer { reason } => {
            event.defer_reason = Some(reason.to_owned());
            event.reason = format!(
                "{}; shadow mode: the bucket would have deferred it ({})",
                event.reason,
                whose(event, reason, pace)
            );
            return false;
        }
        Admission::Deferred { wait, reason } => (wait, reason, true),
        Admission::Refused {
            retry_after,
            reason,
        } => (retry_after, reason, false),
    };
    // Rounded up: a slot a fraction of a millisecond after a moment is not
    // at that moment.
    let wait_ms = i64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
    let slot_ms = now_ms.saturating_add(wait_ms);
    let not_before = event
        .not_before_ms
        .map_or(slot_ms, |planned| planned.max(slot_ms));
    if let Some(deadline) = deadline
        && (reason == codes::RESERVATION_PAST_MAX_WAIT
            || not_before > deadline.latest_deferral_ms())
    {
        let why = format!(
            "retry capacity is exhausted ({}) until",
            whose(event, reason, pace)
        );
        exceed(event, deadline, not_before, &why);
        return false;
    }
    event.action = Some(Action::Deferred);
    event.code = codes::DEFERRED.to_owned();
    // A booked slot is a promise, not a token in hand: the token is taken
    // when the activity reports the attempt again at `not_before`.
    event.token_taken = false;
    event.slot_booked = booked;
    event.defer_reason = Some(reason.to_owned());
    let what = if booked {
        "a slot is booked for this activity"
    } else {
        "no slot could be booked yet; the next turn comes"
    };
    // `not_before` is whichever comes later: the slot, on the service's
    // clock (`now_ms + wait`), or the retry's planned start, in the
    // caller's logical time (`occurred_at + delay`). The reason measures it
    // from the one that set it.
    let when = match event.not_before_ms {
        Some(planned) if planned > slot_ms => format!(
            "{what}; the retry's planned start, {} after occurred_at, is later",
            seconds(planned.saturating_sub(event.occurred_at_ms))
        ),
        _ => format!("{what} {} from now", seconds(wait_ms)),
    };
    event.reason = format!(
        "retry capacity is exhausted ({}); {when}: report attempt {} again then",
        whose(event, reason, pace),
        event.attempt
    );
    event.not_before_ms = Some(not_before);
    booked
}

/// Whose budget ran out, for people: the stable reason, and, when the
/// dependency's budget decided, the dependency and its pace in numbers
/// ("dependency_budget_exhausted: payments-api: 3.2 retries/s allowed (10%
/// of 32 successes/s), none free").
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
    pub failure: Failure<'a>,
    /// The activity, when named: a retry then gets its delay. May be empty.
    pub activity_id: &'a str,
    /// Backoff base and cap for that delay.
    pub params: DelayParams,
    /// The dependency the failed call went to; empty for the default one.
    pub dependency: &'a str,
}

/// Decides the pure form: the reference `next_action` on the budget as
/// given, with the delay of a retry when an activity is named. A retry
/// takes a global token through `gate` (none for a dry run). The pure form
/// keeps no record to hold a booked slot, so it books none: without a token
/// now it is deferred to when the next one comes, and asks again then.
///
/// # Errors
/// [`BudgetError`] for an invalid activity id.
pub fn decide_pure(
    report: &PureReport<'_>,
    gate: Option<impl TokenGate>,
    max_hint_ms: u64,
    now_ms: i64,
) -> Result<Event, BudgetError> {
    let retry = if report.activity_id.is_empty() {
        None
    } else {
        validate_activity_id(report.activity_id)?;
        Some(RetryPlan {
            activity_id: report.activity_id,
            params: report.params,
            deadline: None,
        })
    };
    let budget = &report.budget;
    let elapsed_ms = budget.elapsed.saturating_mul(1000);
    let mut event = decide(
        budget,
        &report.failure,
        elapsed_ms,
        retry,
        max_hint_ms,
        now_ms,
    )?;
    event.dependency = (!report.dependency.is_empty()).then(|| report.dependency.to_owned());
    if event.action == Some(Action::ScheduleRetry)
        && let Some(gate) = gate
    {
        settle(&mut event, gate.take(Duration::ZERO), now_ms, None);
    }
    // A retry's start is the caller's own occurred_at plus delay_ms: the
    // pure form keeps no time of the activity to answer it with. Only a
    // deferral's time (when the next token comes) is the server's to give.
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

/// Plans a retry's delay: the reference backoff of `attempt`, or the
/// server's normalised hint when it is longer (`max(backoff, hint)`).
///
/// # Errors
/// [`BudgetError::AttemptMustBePositive`] for attempt 0.
pub fn plan_delay(
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
