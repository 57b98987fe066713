//! Each dependency's budget, paced by its health, through the real binary:
//! a failing dependency's retries fall to its floor and rise again with its
//! successes, a healthy one's are never deferred meanwhile, and on
//! PostgreSQL three replicas pace each dependency by the fleet's successes,
//! wherever they land. The adaptive rule is the default: these servers set
//! no static rate.

#[path = "common/binary.rs"]
mod binary;
mod common;
#[path = "common/postgres.rs"]
mod postgres;

use std::time::Duration;

use common::{pb, report};
use pb::retry_budget_client::RetryBudgetClient;
use postgres::TestDb;
use tokio::time::Instant;
use tonic::transport::Channel;

/// The binary with `extra` flags and a data directory of its own.
async fn spawn(extra: &[&str], dir: &tempfile::TempDir) -> (tokio::process::Child, String) {
    let mut args = vec!["--data-dir", dir.path().to_str().expect("UTF-8")];
    args.extend_from_slice(extra);
    binary::spawn(&args, None).await
}

/// Whether an answer pays for a retry: a token now, or a slot booked (the
/// worker asks again then and is granted without asking the bucket).
fn paid(r: &pb::NextActionResponse) -> bool {
    r.code == "schedule_retry" || r.slot_booked
}

async fn client(addr: &str) -> RetryBudgetClient<Channel> {
    RetryBudgetClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// `successes` of `dependency` told to the server; its pace after.
async fn tell(
    client: &mut RetryBudgetClient<Channel>,
    dependency: &str,
    successes: u64,
    failures: u64,
) -> pb::DependencyPace {
    let mut paces = client
        .report_traffic(pb::ReportTrafficRequest {
            dependencies: vec![pb::DependencyTraffic {
                dependency: dependency.into(),
                calls: successes + failures,
                successes,
                failures,
            }],
        })
        .await
        .expect("traffic reported")
        .into_inner()
        .dependencies;
    assert_eq!(paces.len(), 1);
    paces.remove(0)
}

/// A first failure of a new activity, sent to `dependency`.
async fn fail(
    client: &mut RetryBudgetClient<Channel>,
    id: &str,
    dependency: &str,
) -> pb::NextActionResponse {
    let mut request = report(id, 1, pb::ErrorClass::Transient);
    request.dependency = dependency.into();
    client
        .next_action(request)
        .await
        .expect("answered")
        .into_inner()
}

/// One second of the test: retries paid and deferred per dependency, and
/// A's allowed rate at its end.
#[derive(Debug, Default, Clone, Copy)]
struct Second {
    a_paid: u32,
    a_deferred: u32,
    b_paid: u32,
    b_deferred: u32,
    a_allowed: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_dependency_falls_to_its_floor_and_never_defers_a_healthy_one() {
    // The global rate is far above what the two dependencies may take:
    // whatever is deferred here, a dependency's own budget deferred it.
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = spawn(&["--dependency-ratio", "0.1", "--retry-rate", "500"], &dir).await;
    let mut c = client(&addr).await;
    // Phases of 100 ms steps: A healthy (300 successes/s, so 30 retries/s
    // allowed), down (no success), back; B healthy all along (400/s), its
    // failures sent once its first two seconds of successes are counted (a
    // server that starts paces each dependency from its floor until it has
    // seen its successes).
    const DOWN: u32 = 60;
    const BACK: u32 = 140;
    const END: u32 = 220;
    let started = Instant::now();
    let mut seconds = vec![Second::default(); (END / 10) as usize];
    // The last deferral while A was down.
    let mut last_deferral = String::new();
    for step in 0..END {
        let s = &mut seconds[(step / 10) as usize];
        let a_ok = !(DOWN..BACK).contains(&step);
        tell(&mut c, "b", 40, 2).await;
        let pace = tell(&mut c, "a", if a_ok { 30 } else { 0 }, 10).await;
        s.a_allowed = pace.allowed_rate;
        // B: two failures a step (20/s), well within its 40/s.
        for i in 0..2 {
            if step < 20 {
                break;
            }
            let r = fail(&mut c, &format!("b-{step}-{i}"), "b").await;
            assert_eq!(r.dependency, "b");
            if r.code == "schedule_retry" {
                s.b_paid += 1;
            } else {
                s.b_deferred += 1;
            }
        }
        // A: ten failures a step (100/s): more than it may ever retry.
        for i in 0..10 {
            let r = fail(&mut c, &format!("a-{step}-{i}"), "a").await;
            if paid(&r) {
                s.a_paid += 1;
            }
            match r.code.as_str() {
                "schedule_retry" => {}
                "deferred" => {
                    assert_eq!(r.defer_reason, "dependency_budget_exhausted", "{r:?}");
                    s.a_deferred += 1;
                    if !a_ok {
                        last_deferral = r.reason;
                    }
                }
                other => panic!("unexpected {other}: {r:?}"),
            }
        }
        let next = started + Duration::from_millis(100 * u64::from(step + 1));
        tokio::time::sleep_until(next).await;
    }
    eprintln!("per second: {seconds:#?}\nlast deferral: {last_deferral}");
    let b_deferred: u32 = seconds.iter().map(|s| s.b_deferred).sum();
    assert_eq!(
        b_deferred, 0,
        "B's retries are never deferred by A's failures"
    );
    // Healthy A: 10% of 300 successes/s (less while the workers' reports
    // and the server's seconds fall apart). Retries paid over its
    // seconds 3 to 5 are about that rate; a second's may be more, when
    // slots are booked up to the 2 s horizon ahead.
    let healthy = seconds[5];
    assert!((23.0..=31.0).contains(&healthy.a_allowed), "{healthy:?}");
    let paid: u32 = seconds[3..6].iter().map(|s| s.a_paid).sum();
    assert!((45..=150).contains(&paid), "{seconds:?}");
    // Down: at its floor within the window (5 s) and a second.
    let floored = (DOWN / 10 + 6) as usize;
    for s in &seconds[floored..(BACK / 10) as usize] {
        assert_eq!(s.a_allowed, 1.0, "{s:?}");
        assert!(s.a_paid <= 3, "at the floor, a few probes: {s:?}");
    }
    assert!(
        last_deferral.contains("a: 1 retries/s allowed (its floor: 10% of 0 successes/s"),
        "{last_deferral}"
    );
    // Back: its retries grow with its successes.
    let back = seconds[(END / 10 - 1) as usize];
    assert!(back.a_allowed >= 20.0, "{back:?}");
    assert!(back.a_paid >= 15, "{back:?}");
    // The pace and the counters, as an operator reads them.
    let all = c
        .report_traffic(pb::ReportTrafficRequest::default())
        .await
        .unwrap()
        .into_inner()
        .dependencies;
    let names: Vec<_> = all.iter().map(|d| d.dependency.as_str()).collect();
    assert_eq!(names, ["b", "a"]);
    assert!(all[1].retries_deferred > 0 && all[0].retries_deferred == 0);
    assert_eq!(all[0].successes, 40 * u64::from(END));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_dependency_name_is_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = spawn(&[], &dir).await;
    let mut c = client(&addr).await;
    for bad in ["has space", &"x".repeat(65), "é"] {
        let mut request = report("bad-dep", 1, pb::ErrorClass::Transient);
        request.dependency = bad.into();
        let status = c.next_action(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().starts_with("invalid_dependency"),
            "{status:?}"
        );
        let status = c
            .report_traffic(pb::ReportTrafficRequest {
                dependencies: vec![pb::DependencyTraffic {
                    dependency: bad.into(),
                    ..Default::default()
                }],
            })
            .await
            .unwrap_err();
        assert!(
            status.message().starts_with("invalid_dependency"),
            "{status:?}"
        );
    }
    let missing = c
        .get_activity(pb::GetActivityRequest {
            activity_id: "bad-dep".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    // The decision records its dependency.
    let r = fail(&mut c, "named", "payments-api").await;
    assert_eq!(r.dependency, "payments-api");
    let activity = common::get(&mut c, "named").await;
    assert_eq!(activity.events[0].dependency, "payments-api");
    let r = fail(&mut c, "unnamed", "").await;
    assert_eq!(r.dependency, "default");
}

/// Three replicas on PostgreSQL. A's and B's successes all land on the
/// first replica; their failures on the two others. Paced by what each
/// replica sees alone, the two would hold A and B at their floors (1/s
/// each); paced by the fleet, A may take 10% of its 100 successes/s and B
/// never waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_pace_each_dependency_by_the_fleets_successes() {
    let Some(db) = TestDb::create("dependencies_fleet").await else {
        return;
    };
    let flags = [
        "--postgres-url",
        db.url.as_str(),
        "--pool-size",
        "8",
        "--dependency-ratio",
        "0.1",
        "--retry-rate",
        "1000",
        "--retry-burst",
        "100",
    ];
    let mut replicas = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..3 {
        let (child, addr) = binary::spawn(&flags, Some("replica")).await;
        replicas.push(child);
        addrs.push(addr);
    }
    for addr in &addrs {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        common::coordinated(channel).await;
    }
    let mut first = client(&addrs[0]).await;
    let mut others = [client(&addrs[1]).await, client(&addrs[2]).await];
    // 7 s of successes only, on the first replica (the pace window is 5 s),
    // then 10 s of failures on the two others as well.
    const WARM: u32 = 70;
    const END: u32 = 170;
    let started = Instant::now();
    let (mut a_paid, mut b_paid, mut b_deferred) = (0u32, 0u32, 0u32);
    for step in 0..END {
        tell(&mut first, "a", 10, 0).await;
        tell(&mut first, "b", 50, 0).await;
        if step >= WARM {
            for (i, c) in others.iter_mut().enumerate() {
                // A: 100 failures a second in all; B: 20, within its 50.
                for j in 0..5 {
                    let r = fail(c, &format!("a-{step}-{i}-{j}"), "a").await;
                    if paid(&r) {
                        a_paid += 1;
                    }
                }
                let r = fail(c, &format!("b-{step}-{i}"), "b").await;
                if r.code == "schedule_retry" {
                    b_paid += 1;
                } else {
                    b_deferred += 1;
                }
            }
        }
        let next = started + Duration::from_millis(100 * u64::from(step + 1));
        tokio::time::sleep_until(next).await;
    }
    let pace = tell(&mut others[0], "a", 0, 0).await;
    eprintln!("A paid {a_paid}, B paid {b_paid}, B deferred {b_deferred}; {pace:?}");
    assert!(
        (8.0..=10.5).contains(&pace.allowed_rate),
        "the fleet's pace: {pace:?}"
    );
    assert!(
        pace.replica_rate < pace.allowed_rate,
        "a part of it: {pace:?}"
    );
    assert_eq!(b_deferred, 0, "B's retries never wait");
    // 10 s at 10/s fleet-wide, with the bursts and the horizon's bookings
    // above; the floors alone would have allowed at most about 26.
    assert!((50..=150).contains(&a_paid), "{a_paid}");
    drop(replicas);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependencys_pace_is_configured_in_the_file_and_reloaded_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("retry-budget.toml");
    std::fs::write(&config, "[dependencies.named.pay]\nrate = 2.0\n").unwrap();
    let metrics = binary::free_port();
    let (child, addr, mut log) =
        binary::spawn_configured(&config, &dir.path().join("data"), metrics).await;
    let mut c = client(&addr).await;
    let pace = tell(&mut c, "pay", 0, 0).await;
    assert_eq!((pace.allowed_rate, pace.rule.as_str()), (2.0, "static"));
    assert_eq!(pace.explanation, "2 retries/s allowed (a static rate)");

    std::fs::write(
        &config,
        "[dependencies.named.pay]\nratio = 0.5\nfloor = 3.0\n",
    )
    .unwrap();
    let said = binary::hangup(
        &child,
        &mut log,
        &["configuration reloaded", "reload refused"],
    )
    .await;
    assert!(said.contains("configuration reloaded"), "{said}");
    // Paced by the new rule from its next second on.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let pace = tell(&mut c, "pay", 0, 0).await;
    assert_eq!((pace.allowed_rate, pace.rule.as_str()), (3.0, "floor"));

    // A bad value changes nothing.
    std::fs::write(&config, "[dependencies]\nratio = -1.0\n").unwrap();
    let said = binary::hangup(
        &child,
        &mut log,
        &["configuration reloaded", "reload refused"],
    )
    .await;
    assert!(
        said.contains("reload refused") && said.contains("ratio"),
        "{said}"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let pace = tell(&mut c, "pay", 0, 0).await;
    assert_eq!((pace.allowed_rate, pace.rule.as_str()), (3.0, "floor"));

    let text = binary::scrape(metrics).await;
    assert!(
        text.contains("retry_budget_dependency_allowed_rate{dependency=\"pay\"} 3"),
        "{text}"
    );
}
