//! Rollouts at the default coordination interval (1 s), with the real
//! binary on PostgreSQL: replicas that start admit at once, a rolling
//! restart behind HAProxy defers nothing and fails nothing. Each test runs
//! a load of `NextAction` retries (1,000 a second, one in ten a durable
//! report) against a budget far above it, so that any deferral is one a
//! user could not explain, and replays every durable decision acknowledged
//! at the end.
//!
//! `#[ignore]`d: they count every answer over several seconds and need the
//! machine to themselves; `.ci/run` runs them alone (`cargo test --test
//! rollout -- --ignored --test-threads=1`). Skipped without PostgreSQL or
//! HAProxy, except under `CI=true`.

use crate::common;
use crate::common::binary;
use crate::common::cluster;
use crate::common::postgres;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster::{Balancer, Replica, serving};
use common::pb;
use pb::retry_budget_client::RetryBudgetClient;
use postgres::TestDb;
use tonic::transport::Channel;

/// Far above the load: nothing should ever be deferred.
const IDLE_BUDGET: &[&str] = &["--retry-rate", "100000", "--retry-burst", "100000"];

/// Retries a second the load sends.
const LOAD: u32 = 1_000;

/// What the load saw, by the replica that answered (or `haproxy`).
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    granted: u64,
    deferred: u64,
    errors: u64,
}

type Tally = Arc<Mutex<BTreeMap<String, Seen>>>;

/// Every tenth retry is a durable report of a fresh activity: the
/// decisions acknowledged, by activity id, to replay at the end.
type Acked = Arc<Mutex<BTreeMap<String, pb::NextActionResponse>>>;

/// A durable first failure of activity `id`, retried at once if allowed.
fn durable(id: &str, tenant: &str) -> tonic::Request<pb::NextActionRequest> {
    let mut report = common::report(id, 1, pb::ErrorClass::Transient);
    report.policy = Some(pb::Policy {
        max_attempts: 5,
        deadline_seconds: 3600,
        base: Some(0),
        cap: Some(0),
    });
    report.occurred_at = Some(common::ts(retry_budget::clock::now_ms()));
    let mut request = tonic::Request::new(report);
    request
        .metadata_mut()
        .insert("x-tenant-id", tenant.parse().expect("ascii"));
    request
}

/// Asks every acknowledged decision again through `client`: each replays
/// exactly, whichever replica recorded it and whatever restarted since.
async fn check_replays(mut client: RetryBudgetClient<Channel>, acked: &Acked) {
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 100,
        "{} durable decisions acknowledged",
        acked.len()
    );
    for (id, first) in &acked {
        let tenant = if id.ends_with('0') { "quiet" } else { "noisy" };
        let again = client
            .next_action(durable(id, tenant))
            .await
            .expect("answered")
            .into_inner();
        assert!(again.replayed, "{id}: {again:?}");
        assert_eq!(
            (&again.code, again.not_before, again.delay_ms),
            (&first.code, first.not_before, first.delay_ms),
            "{id} replays exactly"
        );
    }
    eprintln!("{} acknowledged decisions replayed exactly", acked.len());
}

/// The targets the load goes to, by name, round robin.
type Rotation = Arc<Mutex<Vec<(String, RetryBudgetClient<Channel>)>>>;

/// A retry whose budget always allows one: only the global bucket can
/// defer it.
fn retry(tenant: &str) -> tonic::Request<pb::NextActionRequest> {
    let mut request = tonic::Request::new(pb::NextActionRequest {
        budget: Some(pb::Budget {
            attempts: 1,
            max_attempts: 1000,
            elapsed: 0,
            deadline: 3600,
        }),
        error_class: pb::ErrorClass::Transient as i32,
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-tenant-id", tenant.parse().expect("ascii"));
    request
}

/// Sends [`LOAD`] retries a second, open loop, round robin over the
/// clients in `rotation` (as a balancer would), until `until`; counts each
/// answer in `tally` under its target's name.
async fn load(rotation: Rotation, tally: Tally, acked: Acked, until: Instant) {
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0u64;
    let mut calls = tokio::task::JoinSet::new();
    while Instant::now() < until {
        ticks.tick().await;
        for _ in 0..LOAD / 100 {
            let target = {
                let rotation = rotation.lock().unwrap();
                (!rotation.is_empty()).then(|| rotation[sent as usize % rotation.len()].clone())
            };
            let Some(target) = target else {
                if sent > 0 {
                    // Emptied by the test: the load is over.
                    while calls.join_next().await.is_some() {}
                    return;
                }
                break;
            };
            sent += 1;
            let tenant = if sent % 5 == 0 { "quiet" } else { "noisy" };
            let tally = Arc::clone(&tally);
            let acked = Arc::clone(&acked);
            calls.spawn(async move {
                let (name, mut client) = target;
                let id = format!("ack-{sent}");
                let answer = if sent % 10 == 0 {
                    client.next_action(durable(&id, tenant)).await
                } else {
                    client.next_action(retry(tenant)).await
                };
                if let Ok(a) = &answer
                    && sent % 10 == 0
                    && a.get_ref().code == "schedule_retry"
                {
                    acked.lock().unwrap().insert(id, a.get_ref().clone());
                }
                let mut tally = tally.lock().unwrap();
                let seen = tally.entry(name).or_default();
                match answer {
                    Ok(a) if a.get_ref().code == "schedule_retry" => seen.granted += 1,
                    Ok(a) => {
                        seen.deferred += 1;
                        if seen.deferred <= 3 {
                            eprintln!("deferred: {:?}", a.into_inner());
                        }
                    }
                    Err(status) => {
                        seen.errors += 1;
                        if seen.errors <= 3 {
                            eprintln!("error: {status}");
                        }
                    }
                }
            });
        }
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
}

/// [`load`] in a task of its own; the decisions it acknowledged fill the
/// map returned.
fn spawn_load(
    rotation: &Rotation,
    tally: &Tally,
    until: Instant,
) -> (Acked, tokio::task::JoinHandle<()>) {
    let acked: Acked = Arc::default();
    let task = tokio::spawn(load(
        Arc::clone(rotation),
        Arc::clone(tally),
        Arc::clone(&acked),
        until,
    ));
    (acked, task)
}

/// Puts the replica into `rotation` once it reports `SERVING`, as a
/// balancer's check would (polled every 50 ms: faster than any balancer,
/// so that a replica sent traffic before it admits would show).
async fn add_when_serving(rotation: &Rotation, name: &str, replica: &Replica) -> Duration {
    let started = Instant::now();
    while serving(replica.url()).await != Some(true) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{name} not SERVING within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    let client = RetryBudgetClient::connect(replica.url()).await.unwrap();
    rotation.lock().unwrap().push((name.to_owned(), client));
    took
}

fn report(tally: &Tally) -> BTreeMap<String, Seen> {
    let tally = tally.lock().unwrap().clone();
    for (name, seen) in &tally {
        eprintln!("{name}: {seen:?}");
    }
    tally
}

/// Three replicas from a standing start, then a fourth, each sent traffic
/// from the moment it reports SERVING: none defers anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "counts every answer for 12 s: needs the machine to itself; .ci/run runs it alone"]
async fn replicas_that_start_admit_from_the_moment_they_say_serving() {
    let Some(db) = TestDb::create("rollout_start").await else {
        return;
    };
    let rotation = Arc::new(Mutex::new(Vec::new()));
    let tally: Tally = Arc::default();
    let until = Instant::now() + Duration::from_secs(12);
    let started = Instant::now();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::spawn(&db.url, IDLE_BUDGET).await);
    }
    let (acked, sending) = spawn_load(&rotation, &tally, until);
    for (i, replica) in replicas.iter().enumerate() {
        let took = add_when_serving(&rotation, &format!("replica-{}", i + 1), replica).await;
        eprintln!("replica-{} SERVING {took:?} after the check began", i + 1);
    }
    // Under load, a fourth joins.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(started.elapsed())).await;
    let fourth = Replica::spawn(&db.url, IDLE_BUDGET).await;
    let took = add_when_serving(&rotation, "replica-4", &fourth).await;
    eprintln!("replica-4 SERVING {took:?} after it logged serving");
    sending.await.unwrap();
    let tally = report(&tally);
    assert_eq!(tally.len(), 4, "every replica answered: {tally:?}");
    for (name, seen) in &tally {
        assert!(seen.granted > 100, "{name}: {seen:?}");
        assert_eq!((seen.deferred, seen.errors), (0, 0), "{name}: {seen:?}");
    }
    check_replays(
        RetryBudgetClient::connect(fourth.url()).await.unwrap(),
        &acked,
    )
    .await;
}

/// A rolling restart of all three replicas behind HAProxy (its health
/// check, `deploy/haproxy.cfg`), one at a time as Kubernetes does it:
/// SIGTERM, the drain, a new process on the same address, on to the next
/// once it is SERVING and HAProxy has seen it. The client sees no error
/// and no deferral.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "counts every answer through three restarts: needs the machine to itself; .ci/run runs it alone"]
async fn a_rolling_restart_behind_haproxy_defers_nothing_and_fails_nothing() {
    let Some(db) = TestDb::create("rollout_restart").await else {
        return;
    };
    let ports: Vec<u16> = (0..3).map(|_| binary::free_port()).collect();
    let flags = |port: u16| {
        let listen = format!("127.0.0.1:{port}");
        let mut flags: Vec<String> = IDLE_BUDGET.iter().map(|s| (*s).to_owned()).collect();
        flags.extend([
            "--listen".into(),
            listen,
            "--drain-delay".into(),
            "2s".into(),
        ]);
        flags
    };
    let spawn = async |port: u16| {
        let flags = flags(port);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Replica::spawn(&db.url, &flags).await
    };
    let mut replicas = Vec::new();
    for &port in &ports {
        replicas.push(spawn(port).await);
    }
    for replica in &replicas {
        while serving(replica.url()).await != Some(true) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let addrs: Vec<String> = replicas.iter().map(|r| r.addr.clone()).collect();
    let Some(lb) = Balancer::spawn([&addrs[0], &addrs[1], &addrs[2]]).await else {
        return;
    };
    // HAProxy's checks (every 1 s, two to rise) have seen all three.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let client = RetryBudgetClient::connect(lb.url()).await.unwrap();
    let rotation = Arc::new(Mutex::new(vec![("haproxy".to_owned(), client)]));
    let tally: Tally = Arc::default();
    let until = Instant::now() + Duration::from_secs(60);
    let (acked, sending) = spawn_load(&rotation, &tally, until);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (i, &port) in ports.iter().enumerate() {
        let began = Instant::now();
        assert!(
            replicas[i].terminate().await,
            "replica {} exited cleanly",
            i + 1
        );
        let stopped = began.elapsed();
        replicas[i] = spawn(port).await;
        while serving(replicas[i].url()).await != Some(true) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "replica {} restarted: drained and exited in {stopped:?}, SERVING again {:?} after SIGTERM",
            i + 1,
            began.elapsed()
        );
        // Two of HAProxy's checks, a second apart, before the next.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The load stops here rather than at `until`.
    rotation.lock().unwrap().clear();
    sending.await.unwrap();
    let tally = report(&tally);
    let seen = tally["haproxy"];
    assert!(seen.granted > 5_000, "{seen:?}");
    assert_eq!((seen.deferred, seen.errors), (0, 0), "{seen:?}");
    check_replays(RetryBudgetClient::connect(lb.url()).await.unwrap(), &acked).await;
}
