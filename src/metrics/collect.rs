//! What is read when Prometheus scrapes, not pushed by every request: the
//! bucket's counters, level and tenants; the store's group-commit
//! counters; the replica's part of the global budget.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::watch;

use crate::bucket::FairBucket;
use crate::coord::{CoordinationState, CoordinationStatus};

/// Reads the store's commit counters (commits, saves), if the store is
/// still there.
pub type CommitCounters = Box<dyn Fn() -> Option<[u64; 2]> + Send + Sync>;

/// Where the scraped figures come from.
pub struct Sources {
    /// The global bucket.
    pub bucket: Option<FairBucket>,
    /// The store's group-commit counters.
    pub commits: CommitCounters,
    /// The replica's coordination, on PostgreSQL.
    pub coordination: Option<watch::Receiver<CoordinationState>>,
}

impl fmt::Debug for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sources").finish_non_exhaustive()
    }
}

/// The collector over [`Sources`].
#[derive(Debug)]
pub(super) struct Scraped {
    sources: Sources,
    top: super::Top,
}

impl Scraped {
    pub(super) fn new(sources: Sources, top: super::Top) -> Self {
        Self { sources, top }
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), fmt::Error> {
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), fmt::Error> {
    ConstCounter::new(value).encode(encoder.encode_descriptor(
        name,
        help,
        None,
        MetricType::Counter,
    )?)
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        if let Some(bucket) = &self.sources.bucket {
            let stats = bucket.stats();
            let e = &mut encoder;
            gauge(
                e,
                "bucket_rate",
                "Retry tokens a second this replica's bucket refills at",
                bucket.rate(),
            )?;
            gauge(
                e,
                "bucket_burst",
                "Retry tokens this replica's bucket holds when full",
                f64::from(bucket.burst()),
            )?;
            gauge(
                e,
                "bucket_tokens",
                "Retry tokens in the bucket now; negative when promised ahead",
                stats.level,
            )?;
            counter(
                e,
                "bucket_tokens_granted",
                "Tokens spent on retries",
                stats.granted,
            )?;
            counter(e, "bucket_deposits", "Success deposits", stats.deposits)?;
            gauge(
                e,
                "bucket_tracked_tenants",
                "Tenants the bucket tracks one by one",
                stats.tracked_tenants as f64,
            )?;
            let mut admissions = e.encode_descriptor(
                "bucket_admissions_refused",
                "Token requests deferred (outcome deferred), by reason; counted as enforced in shadow mode",
                None,
                MetricType::Counter,
            )?;
            for (reason, n) in crate::bucket::DEFER_REASONS.iter().zip(stats.deferred) {
                let labels = [("outcome", "deferred"), ("reason", *reason)];
                ConstCounter::new(n).encode(admissions.encode_family(&labels)?)?;
            }
            // The busiest tenants by name, the rest as `other`: the label's
            // values stay bounded however many tenants there are.
            let mut tenants = stats.tenants;
            tenants.sort_unstable_by(|a, b| b.tokens.cmp(&a.tokens).then(a.tenant.cmp(&b.tenant)));
            let rest = tenants.split_off(self.top.tenants.min(tenants.len()));
            let mut tokens = e.encode_descriptor(
                "tenant_tokens",
                "Tokens a tenant was granted or booked, less those returned, since the bucket tracked it; the busiest tenants by name, the rest as other",
                None,
                MetricType::Gauge,
            )?;
            for t in &tenants {
                let labels = [("tenant", t.tenant.as_str())];
                ConstGauge::new(t.tokens as f64).encode(tokens.encode_family(&labels)?)?;
            }
            let other: u64 = rest.iter().map(|t| t.tokens).sum();
            ConstGauge::new(other as f64).encode(tokens.encode_family(&[("tenant", "other")])?)?;
            let mut weights = e.encode_descriptor(
                "tenant_weight",
                "A tenant's weight in this replica's bucket (the busiest tenants)",
                None,
                MetricType::Gauge,
            )?;
            for t in &tenants {
                let labels = [("tenant", t.tenant.as_str())];
                ConstGauge::new(f64::from(t.weight)).encode(weights.encode_family(&labels)?)?;
            }
            dependencies(e, bucket, self.top.dependencies)?;
        }
        if let Some([commits, saves]) = (self.sources.commits)() {
            let e = &mut encoder;
            counter(e, "store_commits", "Group commits made", commits)?;
            counter(e, "store_saves", "Decisions those commits carried", saves)?;
        }
        if let Some(state) = &self.sources.coordination {
            let state = state.borrow().clone();
            let e = &mut encoder;
            gauge(
                e,
                "coordination_rate",
                "This replica's part of the global retry rate",
                state.rate,
            )?;
            gauge(
                e,
                "coordination_target",
                "What the split gives this replica",
                state.target,
            )?;
            gauge(
                e,
                "coordination_replicas",
                "Live replicas at the last transaction",
                state.replicas as f64,
            )?;
            let mut status = e.encode_descriptor(
                "coordination_status",
                "1 for where this replica's part of the budget comes from now",
                None,
                MetricType::Gauge,
            )?;
            for (name, s) in [
                ("granted", CoordinationStatus::Granted),
                ("fallback", CoordinationStatus::Fallback),
                ("no_grant", CoordinationStatus::NoGrant),
            ] {
                let value = if state.status == s { 1.0 } else { 0.0 };
                ConstGauge::new(value).encode(status.encode_family(&[("status", name)])?)?;
            }
        }
        Ok(())
    }
}

/// The label of the dependencies past the busiest, summed: it has a
/// space, which no dependency name has, so it never collides with one.
pub const OTHER_DEPENDENCIES: &str = "other dependencies";

/// Each dependency's pace, evidence and counters: the busiest by name (by
/// retries asked, then successes), the counters of the rest summed under
/// [`OTHER_DEPENDENCIES`]. At most `top` + 1 series a metric (5 a
/// dependency for the evidence state), whatever names clients send.
fn dependencies(
    e: &mut DescriptorEncoder,
    bucket: &FairBucket,
    top: usize,
) -> Result<(), fmt::Error> {
    let mut all = bucket.dependencies();
    let untracked = all
        .iter()
        .find(|d| d.name == crate::bucket::OVERFLOW_DEPENDENCY)
        .map_or(0, |d| d.counters.admitted + d.counters.deferred);
    counter(
        e,
        "dependency_untracked_retries",
        "Retries asked for dependencies not tracked on their own (past max_dependencies or a tenant's max_dependencies_per_tenant): they share one entry and its pace",
        untracked,
    )?;
    let busy = |d: &crate::bucket::DependencyStats| {
        (
            d.counters.admitted + d.counters.deferred,
            d.counters.successes,
        )
    };
    all.sort_unstable_by(|a, b| busy(b).cmp(&busy(a)).then(a.name.cmp(&b.name)));
    let rest = all.split_off(top.min(all.len()));
    for (name, help, value) in [
        (
            "dependency_allowed_rate",
            "Retries a second a dependency may take, fleet-wide, shared by its tenants: set by what the service sees of it (failures asked about, fates of granted retries), or a static rate",
            (|d: &crate::bucket::DependencyStats| d.pace.allowed) as fn(&_) -> f64,
        ),
        (
            "dependency_replica_rate",
            "The part of a dependency's allowed rate this replica hands out",
            |d| d.local_rate,
        ),
        (
            "dependency_success_rate",
            "A dependency's successes a second reported to this replica over its pace window",
            |d| d.success_rate,
        ),
        (
            "dependency_window_retries_granted",
            "Retries to a dependency granted in the last 10 s (its evidence window)",
            |d| f64::from(d.pace.evidence.granted),
        ),
        (
            "dependency_window_retries_failed",
            "Granted retries to a dependency whose next attempt failed, in the last 10 s",
            |d| f64::from(d.pace.evidence.retries_failed),
        ),
    ] {
        let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for d in &all {
            let labels = [("dependency", d.name.as_str())];
            ConstGauge::new(value(d)).encode(family.encode_family(&labels)?)?;
        }
    }
    let mut states = e.encode_descriptor(
        "dependency_evidence_state",
        "1 for the state a dependency's evidence is in (no_evidence, healthy, trouble, recovering, static), 0 for the others",
        None,
        MetricType::Gauge,
    )?;
    for d in &all {
        for state in crate::budget::token::HealthState::ALL {
            let labels = [("dependency", d.name.as_str()), ("state", state.as_str())];
            let on = f64::from(u8::from(d.pace.evidence.state == state));
            ConstGauge::new(on).encode(states.encode_family(&labels)?)?;
        }
    }
    for (name, help, value) in [
        (
            "dependency_successes",
            "Successes of a dependency told to this replica (traffic reports and RecordSuccess)",
            (|c: &crate::bucket::DependencyCounters| c.successes) as fn(&_) -> u64,
        ),
        (
            "dependency_failures",
            "Failures of a dependency workers reported to this replica",
            |c| c.failures,
        ),
        (
            "dependency_retries_admitted",
            "Retries to a dependency granted a token on this replica",
            |c| c.admitted,
        ),
        (
            "dependency_retries_deferred",
            "Retries to a dependency deferred on this replica",
            |c| c.deferred,
        ),
    ] {
        let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
        for d in &all {
            let labels = [("dependency", d.name.as_str())];
            ConstCounter::new(value(&d.counters)).encode(family.encode_family(&labels)?)?;
        }
        let other: u64 = rest.iter().map(|d| value(&d.counters)).sum();
        ConstCounter::new(other)
            .encode(family.encode_family(&[("dependency", OTHER_DEPENDENCIES)])?)?;
    }
    Ok(())
}
