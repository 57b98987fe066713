//! The article's `next_action`: what to do after a failed attempt, given the
//! budget and the failure's class.
//!
//! The order of the checks is the reference's and it matters: a permanent
//! failure stops even when the budget is spent, an unknown one goes to a
//! person even past the deadline, and a deadline beats exhausted attempts.

use std::str::FromStr;

use super::codes;

/// The class of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ErrorClass {
    /// May succeed when tried again: consumes the budget.
    Transient,
    /// Will fail again: stop at once.
    Permanent,
    /// Nobody knows whether a retry is safe: a person decides.
    Unknown,
}

impl ErrorClass {
    /// The reference's name of the class.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::Unknown => "unknown",
        }
    }
}

/// A class name that is not transient, permanent or unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}: the error class must be transient, permanent or unknown",
    codes::UNKNOWN_ERROR_CLASS
)]
pub struct UnknownErrorClassError;

impl FromStr for ErrorClass {
    type Err = UnknownErrorClassError;

    /// Parses the reference's class names, exactly (no case folding: the
    /// reference compares strings with `==`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "transient" => Ok(Self::Transient),
            "permanent" => Ok(Self::Permanent),
            "unknown" => Ok(Self::Unknown),
            _ => Err(UnknownErrorClassError),
        }
    }
}

/// What the worker should do next. Every action has a stable code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Action {
    /// Retry after the planned delay.
    ScheduleRetry,
    /// The attempts are spent.
    AttemptsExhausted,
    /// The deadline has passed, or would before the next retry starts.
    DeadlineExceeded,
    /// A permanent failure.
    FailPermanent,
    /// A person must decide.
    ManualReview,
    /// No retry capacity now: ask again at the time given.
    Deferred,
}

impl Action {
    /// The stable code clients match on.
    pub fn code(self) -> &'static str {
        match self {
            Self::ScheduleRetry => codes::SCHEDULE_RETRY,
            Self::AttemptsExhausted => codes::ATTEMPTS_EXHAUSTED,
            Self::DeadlineExceeded => codes::DEADLINE_EXCEEDED,
            Self::FailPermanent => codes::FAIL_PERMANENT,
            Self::ManualReview => codes::MANUAL_REVIEW,
            Self::Deferred => codes::DEFERRED,
        }
    }

    /// Whether the action closes the activity for good.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::AttemptsExhausted | Self::DeadlineExceeded | Self::FailPermanent
        )
    }
}

/// The reference `Budget`: attempts made and allowed, logical seconds elapsed
/// and allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Attempts made so far, the one that just failed included.
    pub attempts: u32,
    /// Attempts allowed in all.
    pub max_attempts: u32,
    /// Logical seconds since the activity started.
    pub elapsed: u64,
    /// Seconds after the start when nothing may be retried any more.
    pub deadline: u64,
}

/// The reference `next_action(budget, error_class)`.
pub fn next_action(budget: &Budget, class: ErrorClass) -> Action {
    match class {
        ErrorClass::Permanent => Action::FailPermanent,
        ErrorClass::Unknown => Action::ManualReview,
        ErrorClass::Transient if budget.elapsed >= budget.deadline => Action::DeadlineExceeded,
        ErrorClass::Transient if budget.attempts >= budget.max_attempts => {
            Action::AttemptsExhausted
        }
        ErrorClass::Transient => Action::ScheduleRetry,
    }
}

/// Why `action` follows from `budget`: a sentence for people, recorded with
/// the decision and returned with it.
///
/// Every decision writes one, so the numbers go through `itoa` and the
/// pieces are joined once into one buffer, without `format!`'s machinery.
pub fn explain(action: Action, budget: &Budget) -> String {
    let mut a = itoa::Buffer::new();
    let mut b = itoa::Buffer::new();
    match action {
        Action::FailPermanent => "a permanent failure is never retried".to_owned(),
        Action::ManualReview => {
            "nobody can tell whether a retry is safe: parked for manual review".to_owned()
        }
        Action::DeadlineExceeded => [
            a.format(budget.elapsed),
            " s elapsed of a ",
            b.format(budget.deadline),
            " s deadline",
        ]
        .concat(),
        Action::AttemptsExhausted => [
            "attempt ",
            a.format(budget.attempts),
            " failed and ",
            b.format(budget.max_attempts),
            " attempts are allowed",
        ]
        .concat(),
        Action::ScheduleRetry => {
            let mut left = itoa::Buffer::new();
            let mut deadline = itoa::Buffer::new();
            [
                "attempt ",
                a.format(budget.attempts),
                " of ",
                b.format(budget.max_attempts),
                " failed transiently with ",
                left.format(budget.deadline.saturating_sub(budget.elapsed)),
                " s of the ",
                deadline.format(budget.deadline),
                " s deadline left",
            ]
            .concat()
        }
        Action::Deferred => "retry capacity is exhausted for now".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(attempts: u32, max_attempts: u32, elapsed: u64, deadline: u64) -> Budget {
        Budget {
            attempts,
            max_attempts,
            elapsed,
            deadline,
        }
    }

    #[test]
    fn reproduces_the_articles_printed_outputs() {
        let cases = [
            (budget(1, 3, 5, 30), "transient", "schedule_retry"),
            (budget(3, 3, 5, 30), "transient", "attempts_exhausted"),
            (budget(1, 3, 31, 30), "transient", "deadline_exceeded"),
            (budget(1, 3, 5, 30), "permanent", "fail_permanent"),
            (budget(1, 3, 5, 30), "unknown", "manual_review"),
        ];
        for (b, class, code) in cases {
            assert_eq!(next_action(&b, class.parse().unwrap()).code(), code);
        }
    }

    #[test]
    fn explanations_read_as_the_sentences_they_always_were() {
        let b = budget(2, 5, 7, 30);
        let cases = [
            (
                Action::FailPermanent,
                "a permanent failure is never retried",
            ),
            (
                Action::ManualReview,
                "nobody can tell whether a retry is safe: parked for manual review",
            ),
            (Action::DeadlineExceeded, "7 s elapsed of a 30 s deadline"),
            (
                Action::AttemptsExhausted,
                "attempt 2 failed and 5 attempts are allowed",
            ),
            (
                Action::ScheduleRetry,
                "attempt 2 of 5 failed transiently with 23 s of the 30 s deadline left",
            ),
            (Action::Deferred, "retry capacity is exhausted for now"),
        ];
        for (action, sentence) in cases {
            assert_eq!(explain(action, &b), sentence);
        }
        // The widest numbers, and a deadline already passed (nothing left).
        let wide = budget(u32::MAX, u32::MAX, u64::MAX, 30);
        assert_eq!(
            explain(Action::ScheduleRetry, &wide),
            format!(
                "attempt {0} of {0} failed transiently with 0 s of the 30 s deadline left",
                u32::MAX
            )
        );
        assert_eq!(
            explain(Action::DeadlineExceeded, &wide),
            format!("{} s elapsed of a 30 s deadline", u64::MAX)
        );
    }

    #[test]
    fn class_names_are_exact() {
        for bad in ["", "bogus", "Transient", " transient"] {
            assert_eq!(bad.parse::<ErrorClass>(), Err(UnknownErrorClassError));
        }
    }

    #[test]
    fn only_stops_are_terminal() {
        assert!(!Action::ScheduleRetry.is_terminal());
        assert!(!Action::ManualReview.is_terminal());
        assert!(!Action::Deferred.is_terminal());
        assert!(Action::FailPermanent.is_terminal());
    }
}
