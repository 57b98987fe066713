//! The per-client retry policies the service is measured against, each a
//! small pure state machine with its published defaults (docs/storm.md,
//! "Policies", cites the source of every constant).
//!
//! A worker holds one [`ClientPolicy`] for all the activities it runs, as an
//! SDK client or a proxy holds one for all its requests. Time and randomness
//! are parameters: `now` in seconds since the run began, `u` a uniform draw
//! in `[0, 1)` for the jitter.

use std::collections::VecDeque;
use std::time::Duration;

/// Which per-client policy a worker follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// No retries at all: the physical limit of recovery.
    None,
    /// Three retries after a fixed 100 ms.
    Naive,
    /// Capped exponential backoff with full jitter, no budget: the AWS SDKs'
    /// standard-mode delays (base 1 s doubling, cap 20 s).
    Backoff,
    /// The AWS SDKs' standard retry quota per client (500 tokens, 5 a retry,
    /// 10 after a timeout, refunds on success), with the same delays.
    AwsQuota,
    /// gRPC's retry throttling per client (A6: maxTokens 10, tokenRatio 0.1,
    /// retry only above half), with A6's example backoff (0.1 s doubling,
    /// cap 1 s, full jitter).
    GrpcThrottle,
    /// Finagle's and Linkerd's retry budget per client (20% of requests
    /// over a 10 s window on top of 10 retries a second), retried at once as
    /// Finagle's default requeue backoff does.
    Finagle,
}

/// A failed attempt, as the worker saw it.
#[derive(Debug, Clone, Copy)]
pub struct Failure {
    /// The 1-based attempt that failed.
    pub attempt: u32,
    /// True when the caller gave up waiting (the AWS quota charges more).
    pub timed_out: bool,
    /// False when the activity has used its attempts: the policy still
    /// records the failure, but no retry is asked for.
    pub may_retry: bool,
}

/// A retry the policy allows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    /// How long to wait before the next attempt.
    pub delay: Duration,
    /// Quota withdrawn for it, refunded if the retry succeeds (AWS only).
    pub cost: u32,
}

/// AWS SDKs, standard mode: the retry quota's capacity (botocore
/// `retries/quota.py` INITIAL_CAPACITY, aws-sdk-java-v2 and the SDKs
/// reference guide).
const AWS_INITIAL_CAPACITY: u32 = 500;
/// Quota a retry costs (RETRY_COST).
const AWS_RETRY_COST: u32 = 5;
/// Quota a retry after a timeout costs (TIMEOUT_RETRY_COST).
const AWS_TIMEOUT_RETRY_COST: u32 = 10;
/// Quota a success that needed no retry gives back (NO_RETRY_INCREMENT).
const AWS_NO_RETRY_INCREMENT: u32 = 1;
/// Standard-mode backoff: `u * min(base * 2^(i-1), max)`, base 1 s.
const AWS_BACKOFF_BASE: f64 = 1.0;
/// Standard-mode backoff cap (MAX_BACKOFF, 20 s).
const AWS_BACKOFF_MAX: f64 = 20.0;

/// gRPC A6 retryThrottling: maxTokens of the proposal's example.
const GRPC_MAX_TOKENS: f64 = 10.0;
/// gRPC A6 retryThrottling: tokenRatio of the proposal's example.
const GRPC_TOKEN_RATIO: f64 = 0.1;
/// gRPC A6 example retryPolicy: initialBackoff 0.1 s.
const GRPC_INITIAL_BACKOFF: f64 = 0.1;
/// gRPC A6 example retryPolicy: maxBackoff 1 s.
const GRPC_MAX_BACKOFF: f64 = 1.0;

/// Finagle `RetryBudget()` defaults: deposits expire after 10 s (ttl)...
const FINAGLE_TTL_SECONDS: i64 = 10;
/// ...10 retries a second are always allowed (minRetriesPerSec)...
const FINAGLE_MIN_RETRIES_PER_SEC: i64 = 10;
/// ...and 20% of requests may be retried on top (percentCanRetry): a
/// request deposits 1 unit, a retry withdraws 1 / 0.2 = 5.
const FINAGLE_WITHDRAWAL: i64 = 5;

/// Naive: the fixed delay between retries.
const NAIVE_DELAY: Duration = Duration::from_millis(100);

/// One worker's retry state under one rule.
#[derive(Debug, Clone)]
pub struct ClientPolicy {
    /// The rule followed.
    rule: Rule,
    /// AWS: quota capacity left.
    aws_capacity: u32,
    /// gRPC: the throttle's token count.
    grpc_tokens: f64,
    /// Finagle: net units deposited (+1 a request, -5 a retry) per whole
    /// second, the last `ttl` seconds kept: a leaky bucket whose deposits
    /// expire.
    finagle_window: VecDeque<(i64, i64)>,
}

impl ClientPolicy {
    /// A worker's state when it starts (or restarts): every bucket full.
    pub fn new(rule: Rule) -> Self {
        Self {
            rule,
            aws_capacity: AWS_INITIAL_CAPACITY,
            grpc_tokens: GRPC_MAX_TOKENS,
            finagle_window: VecDeque::new(),
        }
    }

    /// An activity's first attempt is about to be sent (Finagle deposits).
    pub fn on_request(&mut self, now: f64) {
        if self.rule == Rule::Finagle {
            self.finagle_add(now, 1);
        }
    }

    /// An attempt failed: `Some` retry, or `None` to give up.
    pub fn on_failure(&mut self, now: f64, failure: Failure, u: f64) -> Option<Retry> {
        match self.rule {
            Rule::None => None,
            Rule::Naive => failure.may_retry.then_some(Retry {
                delay: NAIVE_DELAY,
                cost: 0,
            }),
            Rule::Backoff => failure.may_retry.then(|| Retry {
                delay: full_jitter(AWS_BACKOFF_BASE, AWS_BACKOFF_MAX, failure.attempt, u),
                cost: 0,
            }),
            Rule::AwsQuota => {
                if !failure.may_retry {
                    return None;
                }
                let cost = if failure.timed_out {
                    AWS_TIMEOUT_RETRY_COST
                } else {
                    AWS_RETRY_COST
                };
                if self.aws_capacity < cost {
                    return None;
                }
                self.aws_capacity -= cost;
                Some(Retry {
                    delay: full_jitter(AWS_BACKOFF_BASE, AWS_BACKOFF_MAX, failure.attempt, u),
                    cost,
                })
            }
            Rule::GrpcThrottle => {
                // A6: every failure takes a token; a retry is allowed only
                // while the count stays above half of maxTokens.
                self.grpc_tokens = (self.grpc_tokens - 1.0).max(0.0);
                let allowed = self.grpc_tokens > GRPC_MAX_TOKENS / 2.0;
                (failure.may_retry && allowed).then(|| Retry {
                    delay: full_jitter(GRPC_INITIAL_BACKOFF, GRPC_MAX_BACKOFF, failure.attempt, u),
                    cost: 0,
                })
            }
            Rule::Finagle => {
                if !failure.may_retry || self.finagle_balance(now) < FINAGLE_WITHDRAWAL {
                    return None;
                }
                self.finagle_add(now, -FINAGLE_WITHDRAWAL);
                Some(Retry {
                    delay: Duration::ZERO,
                    cost: 0,
                })
            }
        }
    }

    /// An attempt succeeded; `last_cost` is the quota its retry withdrew
    /// (0 for a first attempt).
    pub fn on_success(&mut self, last_cost: u32) {
        match self.rule {
            Rule::AwsQuota => {
                let refund = if last_cost > 0 {
                    last_cost
                } else {
                    AWS_NO_RETRY_INCREMENT
                };
                self.aws_capacity = (self.aws_capacity + refund).min(AWS_INITIAL_CAPACITY);
            }
            Rule::GrpcThrottle => {
                self.grpc_tokens = (self.grpc_tokens + GRPC_TOKEN_RATIO).min(GRPC_MAX_TOKENS);
            }
            Rule::None | Rule::Naive | Rule::Backoff | Rule::Finagle => {}
        }
    }

    /// Finagle: the reserve (`minRetriesPerSec * ttl` retries' worth, which
    /// never expires) plus what the last `ttl` seconds deposited and withdrew.
    fn finagle_balance(&mut self, now: f64) -> i64 {
        let second = now.floor() as i64;
        while let Some(&(s, _)) = self.finagle_window.front() {
            if s > second - FINAGLE_TTL_SECONDS {
                break;
            }
            self.finagle_window.pop_front();
        }
        let reserve = FINAGLE_MIN_RETRIES_PER_SEC * FINAGLE_TTL_SECONDS * FINAGLE_WITHDRAWAL;
        reserve + self.finagle_window.iter().map(|&(_, n)| n).sum::<i64>()
    }

    fn finagle_add(&mut self, now: f64, units: i64) {
        let second = now.floor() as i64;
        match self.finagle_window.back_mut() {
            Some((s, n)) if *s == second => *n += units,
            _ => self.finagle_window.push_back((second, units)),
        }
    }
}

/// Full jitter (Brooker, "Exponential Backoff And Jitter"): a uniform draw
/// below the capped exponential ceiling of the retry that follows `attempt`.
fn full_jitter(base: f64, cap: f64, attempt: u32, u: f64) -> Duration {
    let exponent = attempt.saturating_sub(1).min(30) as i32;
    let ceiling = (base * 2f64.powi(exponent)).min(cap);
    Duration::from_secs_f64(u * ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(attempt: u32) -> Failure {
        Failure {
            attempt,
            timed_out: true,
            may_retry: true,
        }
    }

    fn error(attempt: u32) -> Failure {
        Failure {
            attempt,
            timed_out: false,
            may_retry: true,
        }
    }

    #[test]
    fn none_never_retries() {
        let mut p = ClientPolicy::new(Rule::None);
        assert_eq!(p.on_failure(0.0, error(1), 0.5), None);
    }

    #[test]
    fn naive_retries_after_100_ms_until_the_attempts_are_used() {
        let mut p = ClientPolicy::new(Rule::Naive);
        let retry = p.on_failure(0.0, timeout(3), 0.9).expect("attempts left");
        assert_eq!(retry.delay, Duration::from_millis(100));
        let last = Failure {
            may_retry: false,
            ..timeout(4)
        };
        assert_eq!(p.on_failure(0.0, last, 0.9), None);
    }

    #[test]
    fn full_jitter_doubles_its_ceiling_up_to_the_cap() {
        let mut p = ClientPolicy::new(Rule::Backoff);
        let delay = |p: &mut ClientPolicy, attempt| {
            p.on_failure(0.0, error(attempt), 0.5)
                .expect("no budget")
                .delay
        };
        assert_eq!(delay(&mut p, 1), Duration::from_millis(500));
        assert_eq!(delay(&mut p, 2), Duration::from_millis(1000));
        assert_eq!(delay(&mut p, 3), Duration::from_millis(2000));
        assert_eq!(delay(&mut p, 10), Duration::from_secs(10)); // 0.5 * cap 20 s
        assert_eq!(
            p.on_failure(0.0, error(1), 0.0).expect("no budget").delay,
            Duration::ZERO
        );
    }

    #[test]
    fn aws_quota_charges_5_or_10_and_refunds_on_success() {
        let mut p = ClientPolicy::new(Rule::AwsQuota);
        // 50 retries after timeouts empty the 500 tokens.
        for _ in 0..50 {
            assert_eq!(p.on_failure(0.0, timeout(1), 0.5).map(|r| r.cost), Some(10));
        }
        assert_eq!(p.aws_capacity, 0);
        assert_eq!(p.on_failure(0.0, timeout(1), 0.5), None);
        assert_eq!(p.on_failure(0.0, error(1), 0.5), None);
        // A success without a retry gives 1 back; a retry's success refunds it.
        for _ in 0..5 {
            p.on_success(0);
        }
        assert_eq!(p.on_failure(0.0, error(1), 0.5).map(|r| r.cost), Some(5));
        assert_eq!(p.aws_capacity, 0);
        p.on_success(5);
        assert_eq!(p.aws_capacity, 5);
        // Never above the initial capacity.
        let mut full = ClientPolicy::new(Rule::AwsQuota);
        full.on_success(10);
        assert_eq!(full.aws_capacity, 500);
    }

    #[test]
    fn grpc_throttle_stops_at_half_of_max_tokens() {
        let mut p = ClientPolicy::new(Rule::GrpcThrottle);
        // 10 -> 9, 8, 7, 6: retries; 5 is not above half: throttled.
        for _ in 0..4 {
            assert!(p.on_failure(0.0, timeout(1), 0.5).is_some());
        }
        assert!(p.on_failure(0.0, timeout(1), 0.5).is_none());
        // Each success adds 0.1 (capped at 10): 11 successes take 5 to 6.1,
        // so one failure (to 5.1) may retry again and the next (4.1) not.
        for _ in 0..11 {
            p.on_success(0);
        }
        assert!(p.on_failure(0.0, timeout(1), 0.5).is_some());
        assert!(p.on_failure(0.0, timeout(1), 0.5).is_none());
        let mut full = ClientPolicy::new(Rule::GrpcThrottle);
        full.on_success(0);
        assert_eq!(full.grpc_tokens, 10.0);
    }

    #[test]
    fn finagle_allows_10_retries_a_second_plus_a_fifth_of_requests() {
        let mut p = ClientPolicy::new(Rule::Finagle);
        // With no requests: the reserve, 100 retries in a 10 s window.
        let mut granted = 0;
        for _ in 0..1000 {
            if p.on_failure(0.5, timeout(1), 0.5).is_some() {
                granted += 1;
            }
        }
        assert_eq!(granted, 100);
        // Withdrawals expire with the window: 10 s later the reserve is back.
        assert!(p.on_failure(10.5, timeout(1), 0.5).is_some());
        // 50 requests deposit 50 units: 10 more retries on top.
        let mut q = ClientPolicy::new(Rule::Finagle);
        for _ in 0..50 {
            q.on_request(0.0);
        }
        let granted = (0..1000)
            .filter(|_| q.on_failure(0.0, timeout(1), 0.5).is_some())
            .count();
        assert_eq!(granted, 110);
        // Retried at once (Finagle's default requeue backoff).
        let mut r = ClientPolicy::new(Rule::Finagle);
        assert_eq!(
            r.on_failure(0.0, timeout(1), 0.5).map(|r| r.delay),
            Some(Duration::ZERO)
        );
    }
}
