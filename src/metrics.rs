//! Prometheus metrics, served as text on `/metrics` (`[metrics] listen`).
//!
//! # Cheap on the request path
//! What a request touches is counted as it happens, without allocating:
//! the RPC layer (`rpc`) finds its method's row by the request's path and
//! its status's histogram by index; a decision's counters are keyed by
//! static strings. What the bucket, the store's group commits and the
//! coordination already count is read when Prometheus scrapes
//! (`collect`), not pushed on every request.
//!
//! # Names
//! Every name starts with `retry_budget_`; counters end in `_total`,
//! durations are `_seconds`; see `docs/operations.md` for each metric and
//! what to alert on.

mod collect;
mod http;
mod rpc;

use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

pub use self::collect::Sources;
pub use self::http::serve;
pub use self::rpc::{ResponseFuture, RpcMetrics, RpcMetricsLayer, RpcMetricsService};
use crate::budget::codes;

/// The actions a decision can have, as their proto names, the most
/// frequent first; the last stands for any other.
const ACTIONS: [&str; 8] = [
    "ACTION_SCHEDULE_RETRY",
    "ACTION_DEFERRED",
    "ACTION_ATTEMPTS_EXHAUSTED",
    "ACTION_DEADLINE_EXCEEDED",
    "ACTION_FAIL_PERMANENT",
    "ACTION_MANUAL_REVIEW",
    "ACTION_UNSPECIFIED",
    "other",
];

/// The decisions a `NextAction` answers, by action and stable code:
/// exported at 0 from the start, so that the rate of the first retry or
/// deferral is seen (`RetryBudgetRetryStorm`, `RetryBudgetDeferralRatioHigh`
/// in deploy/prometheus/retry-budget.rules.yaml).
const DECISIONS: [(&str, &str); 6] = [
    ("ACTION_SCHEDULE_RETRY", codes::SCHEDULE_RETRY),
    ("ACTION_DEFERRED", codes::DEFERRED),
    ("ACTION_ATTEMPTS_EXHAUSTED", codes::ATTEMPTS_EXHAUSTED),
    ("ACTION_DEADLINE_EXCEEDED", codes::DEADLINE_EXCEEDED),
    ("ACTION_FAIL_PERMANENT", codes::FAIL_PERMANENT),
    ("ACTION_MANUAL_REVIEW", codes::MANUAL_REVIEW),
];

/// Why a retry is deferred, or in shadow mode would have been: exported at
/// 0 from the start. Shadow mode has one more, `reservation_past_max_wait`.
const DEFER_REASONS: [&str; 4] = [
    codes::DEPENDENCY_BUDGET_EXHAUSTED,
    codes::TENANT_SHARE_EXHAUSTED,
    codes::GLOBAL_CAPACITY_EXHAUSTED,
    codes::TENANT_BACKLOG_FULL,
];

/// The results of a reload, of the configuration or of the TLS files: both
/// exported at 0 from the start, so that `increase(...{result="failed"})`
/// sees a process's first failed reload.
const RELOAD_RESULTS: [&str; 2] = ["ok", "failed"];

/// Labels of a counter keyed by static strings.
type Labels1 = [(&'static str, &'static str); 1];
type Labels2 = [(&'static str, &'static str); 2];

/// The service's metrics. Clones share them.
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    rpc: RpcMetrics,
    decisions: Family<Labels2, Counter>,
    /// The decision counters by action and code index, found without
    /// hashing labels: `[action * codes + code]`.
    decision_cells: Vec<OnceLock<Counter>>,
    deferrals: Family<Labels1, Counter>,
    would_defer: Family<Labels1, Counter>,
    replays: Counter,
    conflicts: Family<Labels1, Counter>,
    reloads: Family<Labels1, Counter>,
    config: Family<Vec<(&'static str, String)>, Gauge>,
    tls_reloads: Family<Labels1, Counter>,
    connections_refused: Counter,
    tls_expiry: Family<Vec<(&'static str, String)>, Gauge>,
    commit_size: Histogram,
    commit_seconds: Histogram,
}

/// How many tenants and dependencies the labelled metrics name; the rest
/// are summed as `other`.
#[derive(Debug, Clone, Copy)]
pub struct Top {
    /// `[metrics] top_tenants`.
    pub tenants: usize,
    /// `[metrics] top_dependencies`.
    pub dependencies: usize,
}

impl Metrics {
    /// The metrics of a server with `config_sha256` loaded, reading the
    /// bucket, store and coordination figures from `sources` at each
    /// scrape; `top` bounds the tenant and dependency labels.
    pub fn new(config_sha256: &str, sources: Sources, top: Top) -> Self {
        let mut registry = Registry::with_prefix("retry_budget");
        registry.register(
            "build",
            "The running build",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let config = Family::<Vec<(&'static str, String)>, Gauge>::default();
        config
            .get_or_create(&vec![("sha256", config_sha256.to_owned())])
            .set(1);
        registry.register(
            "config_info",
            "1 for the configuration in force (SHA-256 of its TOML as --print-config prints it)",
            config.clone(),
        );
        let rpc = RpcMetrics::new();
        rpc.register(&mut registry);
        let decisions = Family::<Labels2, Counter>::default();
        registry.register(
            "decisions",
            "NextAction decisions, replays included, by action and stable code",
            decisions.clone(),
        );
        let deferrals = Family::<Labels1, Counter>::default();
        registry.register(
            "deferrals",
            "Retries deferred by the global bucket, by reason",
            deferrals.clone(),
        );
        let would_defer = Family::<Labels1, Counter>::default();
        registry.register(
            "shadow_would_defer",
            "In shadow mode, retries the bucket would have deferred, by reason",
            would_defer.clone(),
        );
        let replays = Counter::default();
        registry.register(
            "replays",
            "NextAction answers that replayed a recorded decision",
            replays.clone(),
        );
        let conflicts = Family::<Labels1, Counter>::default();
        registry.register(
            "conflicts",
            "Replays whose request disagreed with the record (policy or error class)",
            conflicts.clone(),
        );
        let reloads = Family::<Labels1, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration reloads (SIGHUP), by result",
            reloads.clone(),
        );
        let tls_reloads = Family::<Labels1, Counter>::default();
        registry.register(
            "tls_reloads",
            "Reloads of the TLS certificate, key and client CA (SIGHUP or a change of the files), by result",
            tls_reloads.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "connections_refused",
            "Connections past server.max_connections, whose calls were answered too_many_connections",
            connections_refused.clone(),
        );
        let tls_expiry = Family::<Vec<(&'static str, String)>, Gauge>::default();
        registry.register_with_unit(
            "tls_certificate_expiry_timestamp",
            "When the serving TLS certificate expires (Unix time), by its serial number; absent without TLS",
            Unit::Seconds,
            tls_expiry.clone(),
        );
        let commit_size = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register(
            "store_commit_size",
            "Decisions one group commit carried",
            commit_size.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.000_125, 2.0, 14));
        registry.register_with_unit(
            "store_commit",
            "Time one group commit took, the fsync or the database's commit included",
            Unit::Seconds,
            commit_seconds.clone(),
        );
        registry.register_collector(Box::new(collect::Scraped::new(sources, top)));
        // A counter appears at its first increment unless it is created
        // here: every one an alert reads starts at 0 for its known labels.
        for (action, code) in DECISIONS {
            decisions.get_or_create_owned(&[("action", action), ("code", code)]);
        }
        for reason in DEFER_REASONS {
            deferrals.get_or_create_owned(&[("reason", reason)]);
            would_defer.get_or_create_owned(&[("reason", reason)]);
        }
        would_defer.get_or_create_owned(&[("reason", codes::RESERVATION_PAST_MAX_WAIT)]);
        for kind in ["policy", "class"] {
            conflicts.get_or_create_owned(&[("kind", kind)]);
        }
        for result in RELOAD_RESULTS {
            reloads.get_or_create_owned(&[("result", result)]);
            tls_reloads.get_or_create_owned(&[("result", result)]);
        }
        Self {
            inner: Arc::new(Inner {
                registry,
                rpc,
                decisions,
                decision_cells: (0..ACTIONS.len() * (codes::ALL.len() + 1))
                    .map(|_| OnceLock::new())
                    .collect(),
                deferrals,
                would_defer,
                replays,
                conflicts,
                reloads,
                config,
                tls_reloads,
                connections_refused,
                tls_expiry,
                commit_size,
                commit_seconds,
            }),
        }
    }

    /// The layer that times every RPC of the server.
    pub fn rpc_layer(&self) -> RpcMetricsLayer {
        RpcMetricsLayer::new(self.inner.rpc.clone())
    }

    /// Counts one `NextAction` answer.
    pub fn decision(&self, answer: &DecisionLabels<'_>) {
        let inner = &self.inner;
        let action = ACTIONS
            .iter()
            .position(|a| *a == answer.action)
            .unwrap_or(ACTIONS.len() - 1);
        let code = codes::ALL
            .iter()
            .position(|c| *c == answer.code)
            .unwrap_or(codes::ALL.len());
        inner.decision_cells[action * (codes::ALL.len() + 1) + code]
            .get_or_init(|| {
                let code = codes::ALL.get(code).copied().unwrap_or("other");
                inner
                    .decisions
                    .get_or_create(&[("action", ACTIONS[action]), ("code", code)])
                    .clone()
            })
            .inc();
        if answer.policy_conflict {
            inner.conflicts.get_or_create(&[("kind", "policy")]).inc();
        }
        if answer.class_conflict {
            inner.conflicts.get_or_create(&[("kind", "class")]).inc();
        }
        if answer.replayed {
            // A replay answers again what was counted when it was decided.
            inner.replays.inc();
            return;
        }
        if let Some(reason) = answer.defer_reason {
            inner
                .deferrals
                .get_or_create(&[("reason", codes::intern(reason))])
                .inc();
        }
        if let Some(reason) = answer.would_defer {
            inner
                .would_defer
                .get_or_create(&[("reason", codes::intern(reason))])
                .inc();
        }
    }

    /// Counts a configuration reload.
    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.inner
            .reloads
            .get_or_create(&[("result", result)])
            .inc();
    }

    /// The configuration in force is now the one hashed `sha256`.
    pub fn set_config_hash(&self, sha256: &str) {
        self.inner.config.clear();
        self.inner
            .config
            .get_or_create(&vec![("sha256", sha256.to_owned())])
            .set(1);
    }

    /// Counts a connection past `max_connections`.
    pub fn connection_refused(&self) {
        self.inner.connections_refused.inc();
    }

    /// Counts a reload of the TLS files.
    pub fn tls_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.inner
            .tls_reloads
            .get_or_create(&[("result", result)])
            .inc();
    }

    /// The serving TLS certificate is now the one numbered `serial`,
    /// expiring at `not_after` (Unix seconds).
    pub fn set_tls_certificate(&self, serial: &str, not_after: u64) {
        self.inner.tls_expiry.clear();
        self.inner
            .tls_expiry
            .get_or_create(&vec![("serial", serial.to_owned())])
            .set(i64::try_from(not_after).unwrap_or(i64::MAX));
    }

    /// Records one group commit of `size` decisions that took `seconds`.
    pub fn commit(&self, size: usize, seconds: f64) {
        self.inner.commit_size.observe(size as f64);
        self.inner.commit_seconds.observe(seconds);
    }

    /// The metrics in Prometheus' text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String does not fail.
        let _ = encode(&mut text, &self.inner.registry);
        text
    }

    /// Requests being served now (for tests).
    pub fn in_flight(&self) -> &Gauge {
        self.inner.rpc.in_flight()
    }
}

/// What a `NextAction` answer says, for [`Metrics::decision`].
#[derive(Debug, Clone, Copy)]
pub struct DecisionLabels<'a> {
    /// The action, as its proto name.
    pub action: &'static str,
    /// The stable code.
    pub code: &'a str,
    /// Why it was deferred, if it was.
    pub defer_reason: Option<&'a str>,
    /// Why it would have been deferred, in shadow mode.
    pub would_defer: Option<&'a str>,
    /// A replay of a recorded decision.
    pub replayed: bool,
    /// The request's policy differed from the record's.
    pub policy_conflict: bool,
    /// The request's error class differed from the record's.
    pub class_conflict: bool,
}
