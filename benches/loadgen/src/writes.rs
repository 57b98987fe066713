//! Many distinct activities written over gRPC as fast as the server
//! answers: one first failure report each, `--concurrency` in flight, each
//! answer checked. What the online preload and the `new-activities`
//! scenario send. A write refused with a pushback (`store_backlogged` while
//! checkpoints catch up) is sent again after it, as a worker would: the
//! refusal stored nothing, so the same report is still the first.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use retry_budget::grpc::TENANT_HEADER;
use retry_budget::grpc::pb::retry_budget_client::RetryBudgetClient;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::Request;
use tonic::metadata::MetadataValue;

use crate::conn::Conn;
use crate::scenario::{check_durable, durable_report, now};

/// The id of the `i`th activity written under `prefix`: zero-padded, so
/// that ids of one run have one length.
pub fn activity_id(prefix: &str, i: u64) -> String {
    format!("{prefix}{i:08}")
}

/// What the writes counted.
struct Counts {
    /// Latencies of the answers that were right, in microseconds.
    latency_us: Histogram<u64>,
    /// Activities written: the answer a scheduled retry, not a replay.
    written: u64,
    /// Failed writes by gRPC code or `unexpected_*` key.
    errors: BTreeMap<String, u64>,
    /// Refusals with a pushback, each followed by the same write again.
    pushed_back: u64,
}

/// Pushbacks one write may meet before it counts as failed.
const MAX_PUSHBACKS: u32 = 1000;

/// The wait a refusal asks for (gRPC's `grpc-retry-pushback-ms`), if any.
fn pushback(status: &tonic::Status) -> Option<Duration> {
    let ms = status.metadata().get("grpc-retry-pushback-ms")?;
    ms.to_str().ok()?.parse().ok().map(Duration::from_millis)
}

/// Reports a first failure for each of `activities` activities, ids
/// `{prefix}00000000` on, `concurrency` at a time over `conns` (at least
/// one), tenant `tenant`; returns the counts, the rate and the latencies as
/// a JSON object.
pub async fn first_failures(
    conns: &[Conn],
    concurrency: usize,
    tenant: &str,
    prefix: &str,
    activities: u64,
) -> Value {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    // One set of counts for all tasks, as in the closed loop: the lock is
    // uncontended on a current-thread runtime.
    let counts = Arc::new(Mutex::new(Counts {
        latency_us: Histogram::new(3).expect("3 significant digits is a valid precision"),
        written: 0,
        errors: BTreeMap::new(),
        pushed_back: 0,
    }));
    let tenant =
        MetadataValue::try_from(tenant).unwrap_or_else(|_| MetadataValue::from_static("bench"));
    let mut tasks = JoinSet::new();
    for i in 0..concurrency.max(1) {
        let mut client = RetryBudgetClient::new(conns[i % conns.len()].clone());
        let (next, counts, tenant) = (Arc::clone(&next), Arc::clone(&counts), tenant.clone());
        let prefix = prefix.to_owned();
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= activities {
                    return;
                }
                let mut pushbacks = 0;
                let (outcome, sent) = loop {
                    let mut request =
                        Request::new(durable_report(activity_id(&prefix, i), 1, now()));
                    request.metadata_mut().insert(TENANT_HEADER, tenant.clone());
                    let sent = Instant::now();
                    match client.next_action(request).await {
                        Ok(response) => break (check_durable(response.get_ref()), sent),
                        Err(status) => match pushback(&status) {
                            Some(wait) if pushbacks < MAX_PUSHBACKS => {
                                pushbacks += 1;
                                tokio::time::sleep(wait).await;
                            }
                            _ => break (Err(format!("{:?}", status.code())), sent),
                        },
                    }
                };
                // From the send that was answered: a pushback's wait is the
                // server's request, not its latency.
                let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
                counts.pushed_back += u64::from(pushbacks);
                match outcome {
                    Ok(()) => {
                        counts.written += 1;
                        let _ = counts.latency_us.record(us.max(1));
                    }
                    Err(key) => *counts.errors.entry(key).or_default() += 1,
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let seconds = started.elapsed().as_secs_f64();
    let counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
    let h = &counts.latency_us;
    let failed: u64 = counts.errors.values().sum();
    json!({
        "activities": activities,
        "written": counts.written,
        "failed": failed,
        "error_codes": counts.errors,
        "pushed_back": counts.pushed_back,
        "seconds": seconds,
        "activities_per_s": counts.written as f64 / seconds,
        "latency_us": {
            "p50": h.value_at_quantile(0.50),
            "p99": h.value_at_quantile(0.99),
            "p999": h.value_at_quantile(0.999),
            "max": h.max(),
        },
    })
}
