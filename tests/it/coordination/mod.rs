//! Replicas sharing one global budget through a real PostgreSQL: three
//! coordinators in one process, each with its own bucket, under steady
//! simulated demand, with real time and short intervals.
//!
//! Each test works in a schema of its own. The database comes from
//! `RETRY_BUDGET_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); when it is unreachable
//! the tests say so and pass, unless `CI=true`, where they fail.
//!
//! `cargo test --test it coordination:: -- --nocapture` prints the figures.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use deadpool_postgres::Pool;
use retry_budget::bucket::{Booking, BucketConfig, FairBucket, GLOBAL_CAPACITY_EXHAUSTED};
use retry_budget::coord::{CoordinationConfig, CoordinationStatus, Coordinator, LEASE_INTERVALS};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

mod postgres;

use postgres::{Proxy, Schema};

const INTERVAL: Duration = Duration::from_millis(200);
const RATE: f64 = 150.0;
const BURST: u32 = 30;
/// The buckets' reservation horizon: short, to keep the bucket's own
/// over-commit term (`2 * rate * horizon`) small.
const HORIZON: Duration = Duration::from_millis(100);

fn budget() -> BucketConfig {
    BucketConfig {
        rate: RATE,
        burst: BURST,
        max_reservation_ms: HORIZON.as_millis() as u64,
        ..BucketConfig::default()
    }
}

/// A replica: its bucket and its coordinator.
struct Replica {
    bucket: FairBucket,
    coordinator: Coordinator,
}

fn replica(pool: Pool, id: &str) -> Replica {
    let bucket = FairBucket::new(&budget()).expect("valid");
    let coordinator = Coordinator::start(
        pool,
        bucket.clone(),
        budget(),
        CoordinationConfig {
            interval: INTERVAL,
            replica_id: Some(id.to_owned()),
        },
    )
    .expect("valid");
    Replica {
        bucket,
        coordinator,
    }
}

/// Asks `bucket` for `per_second` tokens for `tenant`, evenly, as a retry
/// with a deadline one horizon away would (the gate's `max_wait`),
/// counting the tokens granted or booked, until aborted. A booked token is
/// counted when booked, up to a horizon before it is used: the bound below
/// allows for it.
fn drive(
    bucket: FairBucket,
    tenant: &'static str,
    per_second: f64,
) -> (Arc<AtomicU64>, JoinHandle<()>) {
    let granted = Arc::new(AtomicU64::new(0));
    let counter = granted.clone();
    let task = tokio::spawn(async move {
        let start = Instant::now();
        let mut asked = 0u64;
        loop {
            let due = (start.elapsed().as_secs_f64() * per_second) as u64;
            while asked < due {
                asked += 1;
                if let Booking::Granted | Booking::Booked { .. } =
                    bucket.admit_within(tenant, HORIZON)
                {
                    counter.fetch_add(1, Relaxed);
                }
            }
            sleep(Duration::from_millis(4)).await;
        }
    });
    (granted, task)
}

/// For each replica, whether it has ever fallen back: a task watches its
/// state. A replica whose transaction outlasts its lease (on a machine too
/// busy to run it in time) falls back to its documented share, beyond the
/// promise (docs/fairness.md, "The database away"), until it commits again.
fn watch_fallbacks(replicas: &[Replica]) -> Vec<Arc<AtomicBool>> {
    replicas
        .iter()
        .map(|r| {
            let seen = Arc::new(AtomicBool::new(false));
            let flag = seen.clone();
            let mut state = r.coordinator.state();
            tokio::spawn(async move {
                loop {
                    if state.borrow_and_update().status == CoordinationStatus::Fallback {
                        flag.store(true, Relaxed);
                    }
                    if state.changed().await.is_err() {
                        break;
                    }
                }
            });
            seen
        })
        .collect()
}

/// Samples, every 20 ms for `length`, the buckets' summed rate and the
/// counters' total; asserts the rates never sum past the global rate, the
/// rates of replicas that fell back aside (`fell_back`, one a bucket).
async fn observe(
    buckets: &[FairBucket],
    fell_back: &[Arc<AtomicBool>],
    counters: &[Arc<AtomicU64>],
    length: Duration,
) -> Vec<(Instant, u64)> {
    let end = Instant::now() + length;
    let mut samples = Vec::new();
    while Instant::now() < end {
        let rates: Vec<f64> = buckets.iter().map(FairBucket::rate).collect();
        if rates.iter().sum::<f64>() > RATE * (1.0 + 1e-9) {
            // Past the rate: allowed only beside a fallback, which the
            // watchers may see a moment after the bucket changed.
            sleep(Duration::from_millis(50)).await;
            let granted: f64 = rates
                .iter()
                .zip(fell_back)
                .filter(|(_, f)| !f.load(Relaxed))
                .map(|(r, _)| r)
                .sum();
            assert!(
                granted <= RATE * (1.0 + 1e-9),
                "rates sum to {granted} > {RATE}: {rates:?}, fell back: {fell_back:?}"
            );
            eprintln!("rates {rates:?} past {RATE} beside a fallback: {fell_back:?}");
        }
        let total = counters.iter().map(|c| c.load(Relaxed)).sum();
        samples.push((Instant::now(), total));
        sleep(Duration::from_millis(20)).await;
    }
    samples
}

/// Checks admitted tokens over every window between samples against
/// `rate * T + burst + 2 * rate * horizon` (the bucket's own over-commit
/// term), plus one sampling period of rate; returns the admitted rate.
fn check_bound(samples: &[(Instant, u64)]) -> f64 {
    let slack = f64::from(BURST) + 2.0 * RATE * HORIZON.as_secs_f64() + RATE * 0.02;
    let mut worst = f64::MIN;
    for (i, &(t0, n0)) in samples.iter().enumerate() {
        for &(t1, n1) in &samples[i + 1..] {
            let over = (n1 - n0) as f64 - RATE * (t1 - t0).as_secs_f64();
            worst = worst.max(over);
            assert!(
                over <= slack,
                "{over} tokens past rate x T over {:?}",
                t1 - t0
            );
        }
    }
    let (&(t0, n0), &(t1, n1)) = (samples.first().unwrap(), samples.last().unwrap());
    let rate = (n1 - n0) as f64 / (t1 - t0).as_secs_f64();
    eprintln!(
        "admitted {rate:.1}/s of {RATE}; worst window {worst:.1} tokens past rate x T (slack {slack:.1})"
    );
    rate
}

async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_the_rate_fairly_and_fully_and_take_over_a_dead_ones_share() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let replicas: Vec<Replica> = (0..3)
        .map(|r| replica(schema.pool(None), &format!("r{r}")))
        .collect();
    let buckets: Vec<FairBucket> = replicas.iter().map(|r| r.bucket.clone()).collect();
    let fell_back = watch_fallbacks(&replicas);
    // "pinned" asks 300/s of replica 0 alone; "spread" 100/s of each.
    let mut drivers = vec![drive(buckets[0].clone(), "pinned", 300.0)];
    for b in &buckets {
        drivers.push(drive(b.clone(), "spread", 100.0));
    }
    let counters: Vec<Arc<AtomicU64>> = drivers.iter().map(|(c, _)| c.clone()).collect();
    // Settling: the first interval grants, the next ones follow the demand.
    observe(&buckets, &fell_back, &counters, INTERVAL * 8).await;
    let states: Vec<_> = replicas.iter().map(|r| r.coordinator.state()).collect();
    wait_for(
        "the three granted, each counting three",
        INTERVAL * 25,
        || {
            states.iter().all(|s| {
                let s = s.borrow();
                s.status == CoordinationStatus::Granted && s.replicas == 3
            })
        },
    )
    .await;
    let pinned0 = counters[0].load(Relaxed);
    let spread0: u64 = counters[1..].iter().map(|c| c.load(Relaxed)).sum();
    let samples = observe(&buckets, &fell_back, &counters, Duration::from_secs(4)).await;
    let pinned = (counters[0].load(Relaxed) - pinned0) as f64;
    let spread = (counters[1..].iter().map(|c| c.load(Relaxed)).sum::<u64>() - spread0) as f64;
    eprintln!("pinned {pinned}, spread {spread} tokens over 4 s");
    assert!(
        (pinned / spread - 1.0).abs() <= 0.15,
        "pinned {pinned} vs spread {spread}"
    );
    let admitted = check_bound(&samples);
    assert!(
        admitted >= 0.97 * RATE,
        "admitted {admitted}/s < 97% of {RATE}"
    );
    for r in &replicas {
        let state = r.coordinator.state().borrow().clone();
        assert_eq!(state.status, CoordinationStatus::Granted, "{state}");
        assert_eq!(state.replicas, 3, "{state}");
    }

    // Replica 2 dies without leaving: its row lapses and the others take
    // its share within the lease and one interval more.
    let mut replicas = replicas;
    let dead = replicas.pop().expect("three");
    let (_, driver) = drivers.pop().expect("four");
    driver.abort();
    drop(dead.coordinator);
    let died = Instant::now();
    let within = INTERVAL * (LEASE_INTERVALS + 1) + Duration::from_millis(100);
    let took = wait_for(
        "the survivors take the dead replica's share",
        within,
        || {
            // The dead replica's bucket is not counted: its process is gone.
            let rates: f64 = buckets[..2].iter().map(FairBucket::rate).sum();
            assert!(rates <= RATE * (1.0 + 1e-9));
            rates >= RATE * 0.97
        },
    )
    .await;
    eprintln!(
        "took over in {took:?} (lease {:?})",
        INTERVAL * LEASE_INTERVALS
    );
    assert!(
        died.elapsed() >= INTERVAL,
        "not before its lease could lapse"
    );
    let samples = observe(
        &buckets[..2],
        &fell_back[..2],
        &counters[..3],
        Duration::from_secs(2),
    )
    .await;
    assert!(check_bound(&samples) >= 0.97 * RATE);

    for (_, task) in drivers {
        task.abort();
    }
    for r in replicas {
        r.coordinator.leave().await;
    }
    schema.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_leaves_deletes_its_row_and_closes() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let a = replica(schema.pool(None), "a");
    let b = replica(schema.pool(None), "b");
    let (ba, bb) = (a.bucket.clone(), b.bucket.clone());
    wait_for("both granted", INTERVAL * 10, || {
        ba.rate() > 0.0 && bb.rate() > 0.0
    })
    .await;
    a.coordinator.leave().await;
    assert!(a.bucket.is_closed());
    let client = schema.pool(None).get().await.expect("a connection");
    let rows: Vec<String> = client
        .query("SELECT replica_id FROM retry_budget_replica_leases", &[])
        .await
        .expect("read")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["b"]);
    // With the row gone, b takes a lone replica's part (its need, none,
    // and half the rate nobody asks for, up from a third) at its next
    // interval, not after a lease.
    wait_for("b takes a lone replica's part", INTERVAL * 3, || {
        bb.rate() >= RATE / 2.0 * 0.999
    })
    .await;
    b.coordinator.leave().await;
    schema.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_budget_applies_from_the_next_interval() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let r = replica(schema.pool(None), "reloaded");
    let bucket = r.bucket.clone();
    // Alone and asked for nothing, it holds half the rate and half the
    // burst: the other half stays for a replica that starts.
    wait_for("granted", INTERVAL * 10, || {
        bucket.rate() >= RATE / 2.0 * 0.999
    })
    .await;
    r.coordinator.set_budget(BucketConfig {
        rate: 40.0,
        ..budget()
    });
    wait_for("the new rate", INTERVAL * 3, || {
        (bucket.rate() - 20.0).abs() < 1e-3
    })
    .await;
    assert_eq!(r.coordinator.state().borrow().burst, BURST / 2);
    r.coordinator.leave().await;
    schema.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_deleted_is_taken_again_and_a_row_taken_by_another_epoch_closes_the_bucket() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let r = replica(schema.pool(None), "dup");
    let bucket = r.bucket.clone();
    let state = r.coordinator.state();
    wait_for("granted", INTERVAL * 10, || bucket.rate() > 0.0).await;
    let client = schema.pool(None).get().await.expect("a connection");
    let epoch = || async {
        client
            .query_opt(
                "SELECT epoch FROM retry_budget_replica_leases WHERE replica_id = 'dup'",
                &[],
            )
            .await
            .expect("read")
            .map(|row| row.get::<_, i64>(0))
    };
    assert_eq!(epoch().await, Some(1));
    // Deleted (as a stale row would be): taken again, the grant kept.
    client
        .execute("DELETE FROM retry_budget_replica_leases", &[])
        .await
        .expect("delete");
    // Taken again at its next interval; on a busy machine that may be late.
    let start = Instant::now();
    while epoch().await != Some(2) {
        assert!(start.elapsed() < INTERVAL * 25, "the row not taken again");
        sleep(Duration::from_millis(10)).await;
    }
    assert!(bucket.rate() > 0.0);
    assert_eq!(state.borrow().status, CoordinationStatus::Granted);
    // Taken by another process with the same id: the bucket closes, then
    // takes the row back at its next interval.
    client
        .execute("UPDATE retry_budget_replica_leases SET epoch = 99", &[])
        .await
        .expect("update");
    let mut watch = state.clone();
    let closed = tokio::time::timeout(
        INTERVAL * 3,
        watch.wait_for(|s| s.status == CoordinationStatus::NoGrant),
    )
    .await
    .expect("closed within an interval")
    .expect("the task runs")
    .clone();
    assert!(
        closed
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("used twice")),
        "{closed}"
    );
    wait_for("granted again", INTERVAL * 3, || {
        state.borrow().status == CoordinationStatus::Granted
    })
    .await;
    // Taken with the next epoch, 100; or later, when a transaction that
    // committed outlasted its time: the replica, not knowing it holds 100,
    // takes the row again with 101.
    let taken = epoch().await.expect("the row taken back");
    assert!(taken >= 100, "epoch {taken}");
    r.coordinator.leave().await;
    assert_eq!(epoch().await, None, "left: the row is deleted");
    schema.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_the_database_admits_nothing() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    // Nothing listens on a port just released.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = replica(schema.pool(Some(port)), "lonely");
    let state = r.coordinator.state();
    wait_for("a failed interval", INTERVAL * 25, || {
        state.borrow().last_error.is_some()
    })
    .await;
    assert_eq!(
        r.bucket.admit("t"),
        Booking::Refused {
            retry_after: INTERVAL,
            reason: GLOBAL_CAPACITY_EXHAUSTED
        }
    );
    assert_ne!(r.bucket.admit_within("t", Duration::ZERO), Booking::Granted);
    let state = state.borrow().clone();
    assert_eq!(state.status, CoordinationStatus::NoGrant);
    assert!(state.last_error.is_some(), "{state}");
    eprintln!("{state}");
    drop(r);
    schema.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_loses_the_database_keeps_its_grant_until_its_lease_lapses_then_falls_back()
{
    let Some(schema) = Schema::create().await else {
        return;
    };
    let upstream = schema.config.get_ports().first().copied().unwrap_or(5432);
    let proxy = Proxy::start(upstream).await;
    let cut_off = replica(schema.pool(Some(proxy.port)), "cut-off");
    let other = replica(schema.pool(None), "other");
    let (bc, bo) = (cut_off.bucket.clone(), other.bucket.clone());
    let state = cut_off.coordinator.state();
    let other_state = other.coordinator.state();
    // Both granted a part, each counting the other (the first to start
    // held everything, and gives the other its part at its next interval).
    let sharing = |s: &retry_budget::coord::CoordinationState| {
        s.status == CoordinationStatus::Granted && s.replicas == 2 && s.rate > 0.0
    };
    wait_for("both granted, seeing each other", INTERVAL * 25, || {
        sharing(&state.borrow()) && sharing(&other_state.borrow())
    })
    .await;
    let granted = bc.rate();
    proxy.cut();
    let cut = Instant::now();
    // Granted until the fallback: never closed in between.
    let checked = bc.clone();
    let never_closed = tokio::spawn(async move {
        loop {
            assert!(checked.rate() > 0.0, "closed before the fallback");
            sleep(Duration::from_millis(5)).await;
        }
    });
    let mut watched = state.clone();
    let fallback = tokio::time::timeout(
        INTERVAL * (LEASE_INTERVALS + 2),
        watched.wait_for(|s| s.status == CoordinationStatus::Fallback),
    )
    .await
    .expect("the fallback within the lease and an interval")
    .expect("the task runs")
    .clone();
    let fell_at = Instant::now();
    never_closed.abort();
    assert!(
        never_closed.await.unwrap_err().is_cancelled(),
        "closed before the fallback"
    );
    let fell = fell_at - cut;
    eprintln!("fell back {fell:?} after the cut: {fallback}");
    // Not before the lease would lapse (a transaction in flight at the cut
    // fails too, so the last renewal may be two intervals before it), and
    // at the lapse, not at the next interval after it: within half an
    // interval, which leaves the test's own wake-up room on a busy machine.
    let renewed = fallback.renewed_at.expect("it was granted");
    let ttl = INTERVAL * LEASE_INTERVALS;
    assert!(fell_at >= renewed + ttl, "fell back early: {fell:?}");
    assert!(
        fell_at <= renewed + ttl + INTERVAL / 2,
        "late: {:?} past the lapse",
        fell_at - (renewed + ttl)
    );
    let rate = bc.rate();
    assert!(
        (rate - RATE / 2.0).abs() < 1e-3,
        "{rate}/s, not the rate over the 2 replicas last seen (had {granted})"
    );
    assert!(state.borrow().last_error.is_some());
    // The other takes a lone replica's part (half the spare, up from a
    // third) once the lease lapsed in the database.
    wait_for(
        "the other takes a lone replica's part",
        INTERVAL * 3,
        || bo.rate() >= RATE / 2.0 * 0.999,
    )
    .await;
    // The database back: the cut-off replica takes its lease again (the
    // same epoch: its row lapsed but was kept) and the two share again,
    // with an interval that committed cleanly (two replicas catching up
    // at once may spend one interval's retries on serialization failures
    // on a loaded machine: that interval reports its error, the next
    // commits).
    proxy.restore();
    let back = wait_for("granted again", INTERVAL * 25, || {
        let mine = state.borrow();
        sharing(&mine) && mine.last_error.is_none() && sharing(&other_state.borrow())
    })
    .await;
    let again = state.borrow().clone();
    eprintln!("granted again {back:?} after the restore: {again}");
    assert_eq!(again.epoch, fallback.epoch, "{again}");
    wait_for("the rates within the global rate", INTERVAL * 10, || {
        bc.rate() + bo.rate() <= RATE * 1.001 && bc.rate() > 0.0
    })
    .await;
    other.coordinator.leave().await;
    drop(cut_off);
    schema.drop_it().await;
}
