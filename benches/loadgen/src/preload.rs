//! Activities stored before a run, to measure the durable path against a
//! store that already holds 1k or 1M of them.
//!
//! Each preloaded activity is what a first failure report leaves behind:
//! attempt 1, transient, under the generous policy of the durable scenario
//! (so none is ever purged during a run), tenant `--tenant`, ids
//! `pre-00000000`, `pre-00000001`...
//!
//! Two paths give the same records:
//! - online (`--target`): `NextAction` over gRPC, as fast as the server
//!   goes; works against any store.
//! - offline (`--data-dir`): the library's own [`Ledger`] over a
//!   [`RedbStore`] opened in the directory of a *stopped* server (redb
//!   allows one process a file). Same code path minus gRPC, with group
//!   commit doing the batching: much faster for a million.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::conn::Conn;
use retry_budget::budget::ErrorClass;
use retry_budget::budget::activity::{ActivityKey, Defaults, Policy, Report};
use retry_budget::grpc::TENANT_HEADER;
use retry_budget::grpc::pb::retry_budget_client::RetryBudgetClient;
use retry_budget::ledger::{Ledger, Unlimited};
use retry_budget::store::{RedbStore, RedbStoreOptions};
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tonic::Request;
use tonic::metadata::MetadataValue;

use crate::scenario::{GENEROUS_DEADLINE_SECONDS, GENEROUS_MAX_ATTEMPTS, durable_report, now};
use crate::{Args, LoadgenError};

/// The server's default cap on hinted delays (1 h); preloaded reports carry
/// no hint, so it only fills the field.
const MAX_HINT_MS: u64 = 3_600_000;

/// Reports in flight at once on the offline path: enough to fill the
/// writer's batches (1024 by default).
const OFFLINE_CONCURRENCY: usize = 4096;

fn activity_id(i: u64) -> String {
    format!("pre-{i:08}")
}

fn generous_policy() -> Policy {
    Policy {
        max_attempts: GENEROUS_MAX_ATTEMPTS,
        deadline_seconds: GENEROUS_DEADLINE_SECONDS,
        base: None,
        cap: None,
    }
}

fn summary(path: &str, activities: u64, failed: u64, started: Instant) -> Value {
    let seconds = started.elapsed().as_secs_f64();
    json!({
        "scenario": "preload",
        "path": path,
        "activities": activities,
        "failed": failed,
        "seconds": seconds,
        "activities_per_s": activities as f64 / seconds,
    })
}

/// Stores `activities` first failures straight into the redb store in
/// `data_dir`, through the library's ledger.
///
/// # Errors
/// When the store cannot be opened (for example a server holds it) or a
/// save fails.
pub async fn offline(
    data_dir: &Path,
    activities: u64,
    tenant: &str,
) -> Result<Value, LoadgenError> {
    let started = Instant::now();
    let store = RedbStore::open(&RedbStoreOptions::new(data_dir))
        .map_err(|e| LoadgenError::Preload(e.to_string()))?;
    let defaults = Defaults {
        policy: generous_policy(),
        max_hint_ms: MAX_HINT_MS,
    };
    let ledger = Arc::new(Ledger::new(store, defaults));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..OFFLINE_CONCURRENCY {
        let ledger = Arc::clone(&ledger);
        let next = Arc::clone(&next);
        let tenant = tenant.to_owned();
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= activities {
                    return Ok::<(), String>(());
                }
                let key = ActivityKey {
                    tenant: tenant.clone(),
                    activity_id: activity_id(i),
                };
                let now_ms = retry_budget::clock::now_ms();
                let report = Report {
                    attempt: 1,
                    class: ErrorClass::Transient,
                    rule: None,
                    hints: None,
                    policy: Some(generous_policy()),
                    occurred_at_ms: Some(now_ms),
                    workflow_id: "",
                };
                ledger
                    .report(&key, &report, Unlimited, now_ms, false)
                    .await
                    .map_err(|e| format!("{}: {e}", key.activity_id))?;
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined
            .map_err(|e| LoadgenError::Preload(e.to_string()))?
            .map_err(LoadgenError::Preload)?;
    }
    // The last handle of the store joins its writer thread: off the runtime.
    tokio::task::spawn_blocking(move || drop(ledger))
        .await
        .map_err(|e| LoadgenError::Preload(e.to_string()))?;
    Ok(summary("offline", activities, 0, started))
}

/// Reports `--activities` first failures over gRPC, `--concurrency` at a
/// time.
pub async fn online(channels: &[Conn], args: &Args) -> Value {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let tenant = MetadataValue::try_from(args.tenant.as_str())
        .unwrap_or_else(|_| MetadataValue::from_static("bench"));
    let activities = args.activities;
    let mut tasks = JoinSet::new();
    for i in 0..args.concurrency.max(1) {
        let mut client = RetryBudgetClient::new(channels[i % channels.len()].clone());
        let (next, failed, tenant) = (Arc::clone(&next), Arc::clone(&failed), tenant.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= activities {
                    return;
                }
                let mut request = Request::new(durable_report(activity_id(i), 1, now()));
                request.metadata_mut().insert(TENANT_HEADER, tenant.clone());
                if client.next_action(request).await.is_err() {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    summary("grpc", activities, failed.load(Ordering::Relaxed), started)
}
