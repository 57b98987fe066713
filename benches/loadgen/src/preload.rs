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
//!   goes ([`crate::writes`]); works against any store.
//! - offline (`--data-dir`): the library's own [`Ledger`] over a
//!   [`RedbStore`] opened in the directory of a *stopped* server (redb
//!   allows one process a file). Same code path minus gRPC, with group
//!   commit doing the batching: much faster for a million.
//! - PostgreSQL (`--postgres-url`): each record decided by the library's
//!   [`plan`] as the ledger decides a first failure, and written with
//!   [`PgStore::import`] (what `retry-budget migrate` copies with: one
//!   multi-row upsert a transaction), `--import-batch` records an import,
//!   `--import-connections` imports at once. Ten million through gRPC
//!   would take hours on a 2-core machine.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::conn::Conn;
use retry_budget::budget::ErrorClass;
use retry_budget::budget::activity::{
    ActivityKey, ActivityRecord, Defaults, Plan, Policy, Report, plan,
};
use retry_budget::ledger::{Ledger, LedgerError, Unlimited};
use retry_budget::store::{PgStore, PostgresOptions, RedbStore, RedbStoreOptions, StoreError};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::scenario::{GENEROUS_DEADLINE_SECONDS, GENEROUS_MAX_ATTEMPTS};
use crate::{Args, LoadgenError};

/// The server's default cap on hinted delays (1 h); preloaded reports carry
/// no hint, so it only fills the field.
const MAX_HINT_MS: u64 = 3_600_000;

/// Reports in flight at once on the offline path: enough to fill the
/// writer's batches (1024 by default).
const OFFLINE_CONCURRENCY: usize = 4096;

/// The prefix of preloaded activity ids.
const PREFIX: &str = "pre-";

/// The id of the `i`th preloaded activity.
pub fn activity_id(i: u64) -> String {
    crate::writes::activity_id(PREFIX, i)
}

fn generous_policy() -> Policy {
    Policy {
        max_attempts: GENEROUS_MAX_ATTEMPTS,
        deadline_seconds: GENEROUS_DEADLINE_SECONDS,
        base: None,
        cap: None,
    }
}

fn summary(activities: u64, started: Instant) -> Value {
    let seconds = started.elapsed().as_secs_f64();
    json!({
        "scenario": "preload",
        "path": "offline",
        "activities": activities,
        "failed": 0,
        "seconds": seconds,
        "activities_per_s": activities as f64 / seconds,
    })
}

/// The record a first failure of activity `i` leaves, decided by the
/// library as the ledger decides it (no token bucket: `Unlimited`).
fn first_failure(
    i: u64,
    tenant: &str,
    defaults: &Defaults,
    now_ms: i64,
) -> Result<ActivityRecord, String> {
    let key = ActivityKey {
        tenant: tenant.to_owned(),
        activity_id: activity_id(i),
    };
    let report = Report {
        attempt: 1,
        class: ErrorClass::Transient,
        rule: None,
        hints: None,
        policy: Some(generous_policy()),
        occurred_at_ms: Some(now_ms),
        workflow_id: "",
        dependency: "",
    };
    match plan(None, &key, &report, defaults, now_ms) {
        Ok(Plan::Fresh(mut draft)) => {
            draft.take_token(Unlimited, now_ms);
            Ok(draft.finish().0)
        }
        Ok(Plan::Replay(_)) => Err(format!("{}: replayed with nothing stored", key.activity_id)),
        Err(e) => Err(format!("{}: {e}", key.activity_id)),
    }
}

/// Imports `--activities` first failures into the PostgreSQL database at
/// `url` (its schema migrated first), in batches of `--import-batch` on
/// `--import-connections` connections. An activity already there at a
/// later version is left as it is ([`PgStore::import`]).
///
/// # Errors
/// When the database cannot be reached or an import fails.
pub async fn postgres(url: &str, args: &Args) -> Result<Value, LoadgenError> {
    let started = Instant::now();
    let connections = args.import_connections.max(1);
    let batch = args.import_batch.max(1) as u64;
    let store = PgStore::open(&PostgresOptions {
        url: url.to_owned(),
        pool_size: connections + 1,
        timeout: std::time::Duration::from_secs(600),
        max_batch: 1,
        ca_file: None,
    })
    .map_err(|e| LoadgenError::Preload(e.to_string()))?;
    store
        .ready()
        .await
        .map_err(|e| LoadgenError::Preload(e.to_string()))?;
    let defaults = Arc::new(Defaults {
        policy: generous_policy(),
        max_hint_ms: MAX_HINT_MS,
    });
    let activities = args.activities;
    let next = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for task in 0..connections {
        let (store, defaults, next, bytes) = (
            store.clone(),
            Arc::clone(&defaults),
            Arc::clone(&next),
            Arc::clone(&bytes),
        );
        let tenant = args.tenant.clone();
        // Each task its own progress row: imports of one source would wait
        // on each other's lock of it.
        let source = format!("loadgen-preload-{task}");
        tasks.spawn(async move {
            let mut copied = 0;
            let mut encoded = Vec::new();
            loop {
                let from = next.fetch_add(batch, Ordering::Relaxed);
                if from >= activities {
                    return Ok::<(), String>(());
                }
                let to = (from + batch).min(activities);
                let now_ms = retry_budget::clock::now_ms();
                let records = (from..to)
                    .map(|i| first_failure(i, &tenant, &defaults, now_ms))
                    .collect::<Result<Vec<_>, _>>()?;
                if from == 0 {
                    // The size of a stored record, for what to compare with.
                    retry_budget::store::codec::encode_into(&records[0], &mut encoded);
                    bytes.store(encoded.len() as u64, Ordering::Relaxed);
                }
                copied += to - from;
                store
                    .import(&source, &records, copied)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined
            .map_err(|e| LoadgenError::Preload(e.to_string()))?
            .map_err(LoadgenError::Preload)?;
    }
    let mut report = summary(activities, started);
    report["path"] = json!("postgres");
    report["import_connections"] = json!(connections);
    report["import_batch"] = json!(batch);
    report["record_bytes"] = json!(bytes.load(Ordering::Relaxed));
    Ok(report)
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
                    dependency: "",
                };
                // A store whose checkpoints fall behind refuses saves for a
                // moment (on a machine busy with other work): wait as asked.
                loop {
                    match ledger.report(&key, &report, Unlimited, now_ms, false).await {
                        Ok(_) => break,
                        Err(LedgerError::Store(StoreError::Backlogged { retry_after })) => {
                            tokio::time::sleep(retry_after).await;
                        }
                        Err(e) => return Err(format!("{}: {e}", key.activity_id)),
                    }
                }
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
    Ok(summary(activities, started))
}

/// Reports `--activities` first failures over gRPC, `--concurrency` at a
/// time, each answer checked.
pub async fn online(conns: &[Conn], args: &Args) -> Value {
    let mut report = crate::writes::first_failures(
        conns,
        args.concurrency,
        &args.tenant,
        PREFIX,
        args.activities,
    )
    .await;
    report["scenario"] = json!("preload");
    report["path"] = json!("grpc");
    report
}
