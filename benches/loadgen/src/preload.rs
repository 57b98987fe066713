//! Activities written as fast as can be, each one first failure (attempt 1, transient, under
//! the durable scenario's generous policy, so none is purged during a run):
//! - `new-activities`: over gRPC, each answer checked (rss.sh);
//! - `preload --data-dir`: straight into the embedded store of a *stopped* server through
//!   the library's [`Ledger`], enough at once to fill the store's group commits;
//! - `preload --postgres-url`: each record decided by the library's [`draft_or_replay`] as the
//!   ledger decides it, and written with [`PgStore::import`] (what `retry-budget migrate`
//!   copies with), 5,000 a transaction, two at once: ten million through gRPC would take hours.
//!
//! Preloaded ids are `pre-00000000` on, tenant `--tenant`.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use retry_budget::budget::ErrorClass;
use retry_budget::budget::activity::{
    ActivityKey, ActivityRecord, Defaults, DraftOrReplay, Policy, Report, draft_or_replay,
};
use retry_budget::grpc::pb::retry_budget_client::RetryBudgetClient;
use retry_budget::ledger::{Ledger, LedgerError, Unlimited};
use retry_budget::store::{
    EmbeddedStore, EmbeddedStoreOptions, PgStore, PostgresOptions, StoreError,
};
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::metadata::MetadataValue;

use crate::conn::Conn;
use crate::drive::{Tally, quantiles};
use crate::scenario::{
    GENEROUS_DEADLINE_SECONDS, GENEROUS_MAX_ATTEMPTS, check_durable, code, durable_report, now,
    with_tenant,
};

pub const PREFIX: &str = "pre-";
/// Reports in flight on the offline path: enough to fill the writer's batches (1024).
const OFFLINE_CONCURRENCY: usize = 4096;
/// PostgreSQL imports in flight, each a transaction on its own connection, and their size.
const IMPORTS: usize = 2;
const IMPORT_BATCH: u64 = 5000;
/// Pushbacks one gRPC write may meet before it counts as failed.
const MAX_PUSHBACKS: u32 = 1000;

/// The `i`th id under `prefix`, zero-padded so that the ids of a run have one length.
pub fn activity_id(prefix: &str, i: u64) -> String {
    format!("{prefix}{i:08}")
}

fn key(tenant: &str, i: u64) -> ActivityKey {
    ActivityKey {
        tenant: tenant.to_owned(),
        activity_id: activity_id(PREFIX, i),
    }
}

fn first_failure(now_ms: i64) -> Report<'static> {
    let policy = Policy {
        max_attempts: GENEROUS_MAX_ATTEMPTS,
        deadline_seconds: GENEROUS_DEADLINE_SECONDS,
        base: None,
        cap: None,
    };
    Report {
        attempt: 1,
        class: ErrorClass::Transient,
        rule: None,
        hints: None,
        policy: Some(policy),
        occurred_at_ms: Some(now_ms),
        workflow_id: "",
        dependency: "",
    }
}

/// The generous policy, and the server's default cap on hinted delays (1 h; no report
/// here carries a hint).
fn defaults() -> Defaults {
    Defaults {
        policy: first_failure(0).policy.expect("set"),
        max_hint_ms: 3_600_000,
    }
}

fn summary(path: &str, activities: u64, started: Instant) -> Value {
    let seconds = started.elapsed().as_secs_f64();
    json!({"scenario": "preload", "path": path, "activities": activities, "failed": 0, "seconds": seconds,
           "activities_per_s": activities as f64 / seconds})
}

/// Runs `tasks` workers, each taking the next `step` indexes from a shared counter and
/// calling `task(worker, from, to)`, until `total` are done or one fails.
async fn spread<F, Fut>(tasks: usize, total: u64, step: u64, task: F) -> Result<(), String>
where
    F: Fn(usize, u64, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let mut set: JoinSet<Result<(), String>> = JoinSet::new();
    for worker in 0..tasks {
        let (next, task) = (Arc::clone(&next), task.clone());
        set.spawn(async move {
            loop {
                let from = next.fetch_add(step, Ordering::Relaxed);
                if from >= total {
                    return Ok(());
                }
                task(worker, from, (from + step).min(total)).await?;
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Stores `activities` first failures into the embedded store in `data_dir` through the ledger.
pub async fn offline(data_dir: &Path, activities: u64, tenant: &str) -> Result<Value, String> {
    let started = Instant::now();
    let store = EmbeddedStore::open(&EmbeddedStoreOptions::new(data_dir))
        .map_err(|e| format!("preload: {e}"))?;
    let ledger = Arc::new(Ledger::new(store, defaults()));
    let (in_task, tenant) = (Arc::clone(&ledger), tenant.to_owned());
    spread(OFFLINE_CONCURRENCY, activities, 1, move |_, i, _| {
        let (ledger, key) = (Arc::clone(&in_task), key(&tenant, i));
        async move {
            let now_ms = retry_budget::clock::now_ms();
            // A store whose writer falls behind the saves refuses them a moment: wait as asked.
            loop {
                match ledger
                    .report(&key, &first_failure(now_ms), Unlimited, now_ms, false)
                    .await
                {
                    Ok(_) => return Ok(()),
                    Err(LedgerError::Store(StoreError::Backlogged { retry_after })) => {
                        tokio::time::sleep(retry_after).await;
                    }
                    Err(e) => return Err(format!("preload: {}: {e}", key.activity_id)),
                }
            }
        }
    })
    .await?;
    // The last handle of the store joins its writer thread: off the runtime.
    tokio::task::spawn_blocking(move || drop(ledger))
        .await
        .map_err(|e| e.to_string())?;
    Ok(summary("offline", activities, started))
}

/// The record a first failure of activity `i` leaves, decided as the ledger decides it.
fn first_failure_record(
    tenant: &str,
    i: u64,
    defaults: &Defaults,
    now_ms: i64,
) -> Result<ActivityRecord, String> {
    let key = key(tenant, i);
    match draft_or_replay(None, &key, &first_failure(now_ms), defaults, now_ms) {
        Ok(DraftOrReplay::Fresh(mut draft)) => {
            draft.take_token(Unlimited, now_ms);
            Ok(draft.finish().0)
        }
        Ok(DraftOrReplay::Replay(_)) => Err(format!(
            "preload: {}: replayed with nothing stored",
            key.activity_id
        )),
        Err(e) => Err(format!("preload: {}: {e}", key.activity_id)),
    }
}

/// Imports `activities` first failures into the PostgreSQL database at `url` (its schema
/// migrated first); an activity already there at a later version is left as it is.
pub async fn postgres(url: &str, activities: u64, tenant: &str) -> Result<Value, String> {
    let started = Instant::now();
    let options = PostgresOptions {
        url: url.to_owned(),
        pool_size: IMPORTS + 1,
        timeout: Duration::from_secs(600),
        max_batch: 1,
        ca_file: None,
    };
    let store = PgStore::open(&options).map_err(|e| format!("preload: {e}"))?;
    store.ready().await.map_err(|e| format!("preload: {e}"))?;
    let (tenant, defaults) = (tenant.to_owned(), Arc::new(defaults()));
    // Each worker its own progress row (imports of one source wait on its lock), and count.
    let copied: Arc<[AtomicU64; IMPORTS]> = Arc::default();
    spread(
        IMPORTS,
        activities,
        IMPORT_BATCH,
        move |worker, from, to| {
            let (store, tenant, defaults) = (store.clone(), tenant.clone(), Arc::clone(&defaults));
            let copied = Arc::clone(&copied);
            async move {
                let now_ms = retry_budget::clock::now_ms();
                let records = (from..to)
                    .map(|i| first_failure_record(&tenant, i, &defaults, now_ms))
                    .collect::<Result<Vec<_>, _>>()?;
                let copied = copied[worker].fetch_add(to - from, Ordering::Relaxed) + to - from;
                let source = format!("loadgen-preload-{worker}");
                store
                    .import(&source, &records, copied)
                    .await
                    .map_err(|e| format!("preload: {e}"))
            }
        },
    )
    .await?;
    Ok(summary("postgres", activities, started))
}

/// The wait a refusal asks for (`grpc-retry-pushback-ms`), if any.
fn pushback(status: &tonic::Status) -> Option<Duration> {
    let ms = status.metadata().get("grpc-retry-pushback-ms")?;
    ms.to_str().ok()?.parse().ok().map(Duration::from_millis)
}

/// Reports a first failure for each of `activities` activities `{prefix}00000000` on,
/// `concurrency` at a time over `conns`; written: the answer a scheduled retry, not a replay.
/// A refusal with a pushback (`store_backlogged` while the store's writer catches up) is sent
/// again after its wait, as a worker would: it stored nothing.
pub async fn first_failures(
    conns: &[Conn],
    concurrency: usize,
    tenant: &str,
    prefix: &str,
    activities: u64,
) -> Value {
    let started = Instant::now();
    let (tally, pushed_back) = (
        Arc::new(Mutex::new(Tally::new())),
        Arc::new(AtomicU64::new(0)),
    );
    let tenant = MetadataValue::try_from(tenant);
    let tenant = tenant.unwrap_or_else(|_| MetadataValue::from_static("bench"));
    let (conns, prefix) = (conns.to_vec(), prefix.to_owned());
    let (in_task, pushed) = (Arc::clone(&tally), Arc::clone(&pushed_back));
    let _ = spread(concurrency, activities, 1, move |worker, i, _| {
        let mut client = RetryBudgetClient::new(conns[worker % conns.len()].clone());
        let (tally, pushed, tenant) = (Arc::clone(&in_task), Arc::clone(&pushed), tenant.clone());
        let id = activity_id(&prefix, i);
        async move {
            let mut pushbacks = 0;
            let (outcome, sent) = loop {
                let request = with_tenant(durable_report(id.clone(), 1, now()), &tenant);
                let sent = Instant::now();
                match client.next_action(request).await {
                    Ok(response) => break (check_durable(response.get_ref()), sent),
                    Err(status) => match pushback(&status) {
                        Some(wait) if pushbacks < MAX_PUSHBACKS => {
                            pushbacks += 1;
                            tokio::time::sleep(wait).await;
                        }
                        _ => break (Err(code(status)), sent),
                    },
                }
            };
            pushed.fetch_add(u64::from(pushbacks), Ordering::Relaxed);
            // From the send that was answered: a pushback's wait is not latency.
            let mut tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
            tally.record(sent.elapsed(), outcome);
            Ok(())
        }
    })
    .await;
    let seconds = started.elapsed().as_secs_f64();
    let tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
    json!({
        "activities": activities, "written": tally.ok, "failed": tally.errors.values().sum::<u64>(),
        "error_codes": tally.errors, "pushed_back": pushed_back.load(Ordering::Relaxed),
        "seconds": seconds, "activities_per_s": tally.ok as f64 / seconds,
        "latency_us": quantiles(&tally.latency_us),
    })
}
