//! A crash while checkpoints run: the real binary with small, short-lived
//! journal segments, so that the journal is rotated and written into the
//! database over and over under load, is SIGKILLed, restarted on the same
//! data directory, and every acknowledged decision must still be there,
//! each attempt recorded once.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use retry_budget::grpc::pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Notify;

/// Starts the binary with 1 MiB segments checkpointed every 20 ms, and
/// returns it with its address, read from its "serving" log line.
async fn spawn_server(data_dir: &Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_retry-budget"))
        .args(["serve", "--listen", "127.0.0.1:0", "--drain-delay", "0s"])
        .args(["--retry-rate", "1000000", "--retry-burst", "1000000"])
        .args([
            "--journal-segment-mib",
            "1",
            "--journal-segment-age",
            "20ms",
        ])
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("RETRY_BUDGET_CONFIG")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the binary");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if line.contains("serving")
                && let Some(rest) = line.split("addr=").nth(1)
            {
                return rest.split_whitespace().next().expect("address").to_owned();
            }
        }
        panic!("the server exited before serving");
    })
    .await
    .expect("the server starts");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("http://{addr}"))
}

/// The newest journal segment's generation in `dir` (0 when none).
fn newest_segment(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let name = e.ok()?.file_name().into_string().ok()?;
                    name.strip_prefix("journal-")?
                        .strip_suffix(".log")?
                        .parse()
                        .ok()
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

fn durable_report(id: &str, attempt: u32) -> pb::NextActionRequest {
    pb::NextActionRequest {
        activity_id: id.into(),
        attempt,
        error_class: pb::ErrorClass::Transient as i32,
        policy: Some(pb::Policy {
            max_attempts: u32::MAX,
            deadline_seconds: 10 * 24 * 3600,
            base: Some(0),
            cap: Some(0),
        }),
        occurred_at: Some(prost_types::Timestamp {
            seconds: retry_budget::clock::now_ms() / 1000,
            nanos: 0,
        }),
        ..Default::default()
    }
}

const WORKERS: usize = 16;
const ACTIVITIES_PER_WORKER: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_checkpoints_run_loses_no_acknowledged_decision() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, url) = spawn_server(dir.path()).await;
    let acked: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let count = Arc::new(AtomicU64::new(0));
    let progress = Arc::new(Notify::new());

    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (acked, count, progress) = (
            Arc::clone(&acked),
            Arc::clone(&count),
            Arc::clone(&progress),
        );
        let mut client = pb::retry_budget_client::RetryBudgetClient::connect(url.clone())
            .await
            .expect("connect");
        workers.push(tokio::spawn(async move {
            let ids: Vec<String> = (0..ACTIVITIES_PER_WORKER)
                .map(|i| format!("ckpt-{w}-{i}"))
                .collect();
            for attempt in 1.. {
                for id in &ids {
                    match client.next_action(durable_report(id, attempt)).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            assert_eq!(r.code, "schedule_retry", "{}", r.reason);
                            assert!(!r.replayed);
                            acked.lock().unwrap().insert(id.clone(), attempt);
                            count.fetch_add(1, Ordering::Relaxed);
                            progress.notify_one();
                        }
                        // The server died: stop here.
                        Err(_) => return,
                    }
                }
            }
        }));
    }

    // Kill it once the load has gone through several checkpoints (each
    // segment rotated was handed to the checkpoint thread) and enough
    // decisions were acknowledged to mean something; a generous bound
    // says so if the machine is too slow for either.
    let first_segment = newest_segment(dir.path());
    tokio::time::timeout(Duration::from_secs(120), async {
        while count.load(Ordering::Relaxed) < 2_000
            || newest_segment(dir.path()) < first_segment + 10
        {
            progress.notified().await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "too slow: {} decisions, segments {first_segment} to {}",
            count.load(Ordering::Relaxed),
            newest_segment(dir.path())
        )
    });
    let rotations = newest_segment(dir.path()) - first_segment;
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
    for w in workers {
        w.await.expect("worker");
    }
    let acked = acked.lock().unwrap().clone();
    let total: u32 = acked.values().sum();

    let (_child, url) = spawn_server(dir.path()).await;
    let mut client = pb::retry_budget_client::RetryBudgetClient::connect(url)
        .await
        .expect("connect");
    for (id, &last_acked) in &acked {
        let activity = client
            .get_activity(pb::GetActivityRequest {
                activity_id: id.clone(),
            })
            .await
            .unwrap_or_else(|s| panic!("{id} lost: {s}"))
            .into_inner();
        // The decision in flight at the kill may or may not have been
        // durable; every acknowledged one is.
        assert!(
            activity.attempts == last_acked || activity.attempts == last_acked + 1,
            "{id}: acknowledged {last_acked}, recorded {}",
            activity.attempts
        );
        let attempts: Vec<u32> = activity.events.iter().map(|e| e.attempt).collect();
        assert_eq!(
            attempts,
            (1..=activity.attempts).collect::<Vec<_>>(),
            "{id}: each attempt recorded exactly once"
        );
        let next = client
            .next_action(durable_report(id, activity.attempts + 1))
            .await
            .unwrap()
            .into_inner();
        assert!(!next.replayed, "{id}: the count goes on");
    }
    eprintln!(
        "{} activities, {total} acknowledged decisions over {rotations} segment rotations survived SIGKILL",
        acked.len()
    );
}
