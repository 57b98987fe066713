//! [`Gate`]: what the token layer hands every request: the way to the
//! bucket, asked at most once, by the decision, at the moment it needs a
//! token.
//!
//! Nothing is taken up front and nothing is given back: a replay, a stop,
//! a dry run or a refused request never touches the bucket, and a retry
//! takes its token (or books its slot) in one step, under one lock, as
//! tower's `retry::budget` and linkerd's budgets withdraw at the moment a
//! retry is decided.

use std::time::Duration;

use super::handle::FairBucket;
use crate::budget::token::{Answer, TokenGate};

/// The bucket a request's decision asks, put in its extensions by the
/// token layer. Cloning shares the bucket.
#[derive(Debug, Clone)]
pub struct Gate {
    bucket: FairBucket,
}

impl Gate {
    /// A gate to `bucket`.
    pub fn new(bucket: FairBucket) -> Self {
        Self { bucket }
    }

    /// The gate a decision of `tenant` about a failed call to
    /// `dependency` (empty: the default one) asks.
    pub fn tenant<'a>(&'a self, tenant: &'a str, dependency: &'a str) -> TenantGate<'a> {
        TenantGate {
            bucket: &self.bucket,
            tenant,
            dependency,
        }
    }

    /// The bucket behind the gate.
    pub fn bucket(&self) -> &FairBucket {
        &self.bucket
    }
}

/// A [`Gate`] for one tenant's decision: the core's [`TokenGate`].
#[derive(Debug, Clone, Copy)]
pub struct TenantGate<'a> {
    bucket: &'a FairBucket,
    tenant: &'a str,
    dependency: &'a str,
}

impl TokenGate for TenantGate<'_> {
    /// A token now from the dependency's budget and the global one, or the
    /// later of their slots booked if it comes within `max_wait`
    /// ([`FairBucket::admit_to`]).
    fn take(self, max_wait: Duration) -> Answer {
        self.bucket.admit_to(self.tenant, self.dependency, max_wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{Admission, BucketConfig, DependenciesConfig, PaceConfig};

    #[tokio::test(start_paused = true)]
    async fn a_gate_takes_only_when_asked_and_then_once() {
        let pinned = DependenciesConfig {
            default: PaceConfig {
                rate: Some(1000.0),
                ..PaceConfig::default()
            },
            ..DependenciesConfig::default()
        };
        let bucket = FairBucket::with_dependencies(
            &BucketConfig {
                rate: 10.0,
                burst: 1,
                ..BucketConfig::default()
            },
            pinned,
        )
        .unwrap();
        let gate = Gate::new(bucket.clone());
        let _unused = gate.clone();
        assert_eq!(bucket.stats().granted, 0, "nothing taken up front");
        assert_eq!(
            gate.tenant("a", "").take(Duration::MAX).admission,
            Admission::Granted
        );
        let stats = bucket.stats();
        assert_eq!((stats.granted, stats.level), (1, 0.0));
        // The bucket is empty: the next retry is deferred to a booked slot.
        assert!(matches!(
            gate.tenant("a", "").take(Duration::MAX).admission,
            Admission::Deferred { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn shadow_mode_lets_a_retry_past_its_dependencys_budget_go_and_says_why() {
        let bucket = FairBucket::new(&BucketConfig {
            mode: crate::bucket::BucketMode::Shadow,
            ..BucketConfig::default()
        })
        .unwrap();
        let gate = Gate::new(bucket.clone());
        // The default pace of a dependency with no successes: its floor,
        // one retry a second, a bucket of one.
        assert_eq!(
            gate.tenant("a", "api").take(Duration::ZERO).admission,
            Admission::Granted
        );
        let answer = gate.tenant("a", "api").take(Duration::ZERO);
        assert_eq!(
            answer.admission,
            Admission::WouldDefer {
                reason: crate::bucket::DEPENDENCY_BUDGET_EXHAUSTED
            }
        );
        assert_eq!(answer.pace.map(|p| p.allowed), Some(1.0));
        assert_eq!(bucket.stats().refused_dependency, 1, "counted as enforced");
    }
}
