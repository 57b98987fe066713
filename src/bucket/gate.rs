//! [`TenantGate`]: a tenant's handle on the retry budget. The layer puts
//! one in every call that spends budget (`NextAction`, `RecordSuccess`,
//! `ReportTraffic`), scoped to the tenant the call acts for; the handler
//! and the core see only it, never the bucket, so nothing a tenant sends
//! can reach another tenant's lanes, lines or listing.

use std::sync::Arc;

use super::dependencies::DependencyStats;
use super::handle::FairBucket;
use crate::budget::token::{Answer, Ask, Observed, TokenGate};
use crate::budget::traffic::TrafficError;

/// The retry budget as one tenant sees it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TenantGate {
    bucket: FairBucket,
    tenant: Arc<str>,
}

impl TenantGate {
    /// `tenant`'s handle on `bucket`.
    pub fn new(bucket: FairBucket, tenant: Arc<str>) -> Self {
        Self { bucket, tenant }
    }

    /// The tenant it acts for.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The gate a decision asks for a retry to `dependency` (empty: the
    /// default one).
    pub fn dependency<'a>(&'a self, dependency: &'a str) -> DependencyGate<'a> {
        DependencyGate {
            gate: self,
            dependency,
        }
    }

    /// Counts a success the tenant recorded for `dependency`: one success
    /// of its own lane, a request seen when the service holds the activity
    /// (`known`), and the configured success deposit into the global bucket
    /// when it closed an activity (`deposit`).
    pub fn record_success(&self, dependency: &str, known: bool, deposit: bool) {
        self.bucket.record_success(&self.tenant, dependency, known);
        if deposit {
            self.bucket.deposit_success();
        }
    }

    /// Counts the tenant's calls to `dependency` since its last report;
    /// the pace as it sees it.
    pub fn report_traffic(
        &self,
        dependency: &str,
        calls: u64,
        successes: u64,
        failures: u64,
    ) -> DependencyStats {
        self.bucket
            .report_traffic(&self.tenant, dependency, calls, successes, failures)
    }

    /// Takes one traffic report of the tenant's.
    ///
    /// # Errors
    /// [`TrafficError::TooFrequent`] past `[dependencies]
    /// max_reports_per_second`.
    pub fn admit_report(&self) -> Result<(), TrafficError> {
        self.bucket
            .admit_report(&self.tenant)
            .map_err(|(rate, retry_after)| TrafficError::TooFrequent {
                per_second: rate as u32,
                retry_after,
            })
    }

    /// The dependencies the tenant used, as it sees them.
    pub fn dependencies(&self) -> Vec<DependencyStats> {
        self.bucket.dependencies_of(&self.tenant)
    }

    /// Gives up an activity's place in `dependency`'s line.
    pub fn leave_line(&self, dependency: &str, activity_id: &str, since_ms: i64) {
        self.bucket
            .leave_line(&self.tenant, dependency, activity_id, since_ms);
    }
}

/// A [`TenantGate`] for one dependency: what a decision asks.
#[derive(Debug, Clone, Copy)]
pub struct DependencyGate<'a> {
    gate: &'a TenantGate,
    dependency: &'a str,
}

impl TokenGate for DependencyGate<'_> {
    fn take(&mut self, ask: &Ask<'_>) -> Answer {
        self.gate
            .bucket
            .take(&self.gate.tenant, self.dependency, ask)
    }

    fn observe(&mut self, observed: Observed) {
        self.gate
            .bucket
            .observe(&self.gate.tenant, self.dependency, observed);
    }

    fn leave(&mut self, activity_id: &str, waiting_since_ms: i64) {
        self.gate
            .leave_line(self.dependency, activity_id, waiting_since_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{BucketConfig, BucketMode, DEPENDENCY_BUDGET_EXHAUSTED};
    use crate::budget::token::Admission;

    fn ask(now_ms: i64) -> Ask<'static> {
        Ask {
            activity_id: None,
            waiting_since_ms: None,
            now_ms,
            planned_ms: None,
            observed: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_takes_only_when_asked() {
        let bucket = FairBucket::new(&BucketConfig::default()).unwrap();
        let gate = TenantGate::new(bucket.clone(), Arc::from("a"));
        assert_eq!(bucket.stats().granted, 0, "nothing taken up front");
        let answer = gate.dependency("api").take(&ask(0));
        assert_eq!(answer.admission, Admission::Granted);
        assert_eq!(bucket.stats().granted, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shadow_mode_lets_a_retry_past_its_dependencys_budget_go_and_says_why() {
        let bucket = FairBucket::new(&BucketConfig {
            mode: BucketMode::Shadow,
            ..BucketConfig::default()
        })
        .unwrap();
        let gate = TenantGate::new(bucket.clone(), Arc::from("a"));
        // The starting allowance: 20 at once, then none in that second.
        for _ in 0..20 {
            assert_eq!(
                gate.dependency("api").take(&ask(0)).admission,
                Admission::Granted
            );
        }
        let answer = gate.dependency("api").take(&ask(0));
        assert_eq!(
            answer.admission,
            Admission::WouldDefer {
                reason: DEPENDENCY_BUDGET_EXHAUSTED
            }
        );
        assert_eq!(answer.pace.map(|p| p.allowed), Some(20.0));
        assert_eq!(bucket.stats().deferred[0], 1, "counted as enforced");
    }
}
