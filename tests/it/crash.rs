//! The real binary: SIGKILL it under concurrent load (also while its
//! checkpoints run), restart it on the same data directory, and check that
//! every acknowledged decision survived and that attempt counts continued:
//! none reset, none counted twice. Also the process settings it makes at
//! start.

use crate::common;
use crate::common::binary;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{pb, report, ts};
use pb::retry_budget_client::RetryBudgetClient;
use tokio::process::Child;
use tokio::sync::Notify;
use tonic::transport::Channel;

/// Starts the binary on an ephemeral port, with `extra` flags, and returns
/// it with its URL.
async fn spawn_server(data_dir: &Path, extra: &[&str]) -> (Child, String) {
    let data_dir = data_dir.to_str().expect("a UTF-8 path");
    let mut args = vec![
        // A bucket too large to defer: these tests are about durability.
        "--retry-rate",
        "1000000",
        "--retry-burst",
        "1000000",
        "--data-dir",
        data_dir,
    ];
    args.extend_from_slice(extra);
    let (child, addr) = binary::spawn(&args, None).await;
    (child, format!("http://{addr}"))
}

async fn connect(url: &str) -> RetryBudgetClient<Channel> {
    RetryBudgetClient::connect(url.to_owned())
        .await
        .expect("connect")
}

const WORKERS: usize = 16;

fn durable_report(id: &str, attempt: u32) -> pb::NextActionRequest {
    let mut r = report(id, attempt, pb::ErrorClass::Transient);
    r.policy = Some(pb::Policy {
        max_attempts: u32::MAX,
        deadline_seconds: 10 * 24 * 3600,
        base: Some(0),
        cap: Some(0),
    });
    r.occurred_at = Some(ts(retry_budget::clock::now_ms()));
    r
}

/// Walks `per_worker` activities of each of [`WORKERS`] workers through
/// their attempts against `url` until `enough` says so of the number of
/// acknowledged decisions (a generous bound fails the test on a machine too
/// slow for it), then SIGKILLs the server. Returns the last acknowledged
/// attempt of each activity.
async fn kill_under_load(
    mut child: Child,
    url: &str,
    per_worker: usize,
    enough: impl Fn(u64) -> bool,
) -> HashMap<String, u32> {
    let acked: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let count = Arc::new(AtomicU64::new(0));
    let progress = Arc::new(Notify::new());
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let acked = Arc::clone(&acked);
        let (count, progress) = (Arc::clone(&count), Arc::clone(&progress));
        let mut client = connect(url).await;
        workers.push(tokio::spawn(async move {
            let ids: Vec<String> = (0..per_worker).map(|i| format!("crash-{w}-{i}")).collect();
            for attempt in 1.. {
                for id in &ids {
                    match client.next_action(durable_report(id, attempt)).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            assert_eq!(r.code, "schedule_retry", "{} {}", r.defer_reason, r.reason);
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
    tokio::time::timeout(Duration::from_secs(120), async {
        while !enough(count.load(Ordering::Relaxed)) {
            progress.notified().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("too slow: {} decisions", count.load(Ordering::Relaxed)));
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
    for w in workers {
        w.await.expect("worker");
    }
    std::mem::take(&mut *acked.lock().unwrap())
}

/// Restarts the server on `dir` and checks that every acknowledged decision
/// survived, each attempt recorded once, and that attempt counts continue:
/// an old attempt replays, the next is new, none may be skipped.
async fn check_survivors(dir: &Path, acked: &HashMap<String, u32>) {
    let (_child, url) = spawn_server(dir, &[]).await;
    let mut client = connect(&url).await;
    for (id, &last_acked) in acked {
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
        let expected: Vec<u32> = (1..=activity.attempts).collect();
        assert_eq!(
            attempts, expected,
            "{id}: each attempt recorded exactly once"
        );
        let replay = client
            .next_action(durable_report(id, 1))
            .await
            .unwrap()
            .into_inner();
        assert!(replay.replayed, "{id}");
        let next = client
            .next_action(durable_report(id, activity.attempts + 1))
            .await
            .unwrap()
            .into_inner();
        assert!(!next.replayed);
        assert_eq!(next.attempt, activity.attempts + 1);
        let reset = client
            .next_action(durable_report(id, activity.attempts + 3))
            .await
            .expect_err("no skipping after a restart");
        assert!(reset.message().starts_with("attempt_out_of_order"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_load_loses_no_acknowledged_decision() {
    let dir = tempfile::tempdir().unwrap();
    let (child, url) = spawn_server(dir.path(), &[]).await;
    let acked = kill_under_load(child, &url, 4, |acked| acked >= 500).await;
    check_survivors(dir.path(), &acked).await;
    eprintln!(
        "{} activities, {} acknowledged decisions survived SIGKILL",
        acked.len(),
        acked.values().sum::<u32>()
    );
}

/// The server turns transparent huge pages off for itself (see main.rs):
/// the kernel reports it in `/proc/PID/status`.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_server_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _url) = spawn_server(dir.path(), &[]).await;
    let pid = child.id().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    child.kill().await.unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("THP_enabled:"))
        .expect("THP_enabled in /proc/PID/status (Linux 6.0 and later)");
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}
