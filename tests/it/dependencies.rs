//! Each dependency's budget, paced by what the service sees of it, through
//! the real binary at its defaults (no flag, no traffic report unless a
//! test sends one): a burst of first failures of a fresh dependency is
//! retried, a failing dependency is cut within a second or two and never
//! defers a healthy one, it grows again when its retries stop failing,
//! the pace survives a restart (embedded store and PostgreSQL), and three
//! replicas on PostgreSQL read a retry's fate wherever its next attempt
//! lands.

use crate::common;
use crate::common::binary;
use crate::common::postgres;

use std::time::Duration;

use binary::AT_DEFAULTS;
use common::{pb, report};
use pb::retry_budget_client::RetryBudgetClient;
use postgres::TestDb;
use tokio::time::Instant;
use tonic::transport::Channel;

/// The binary at its defaults (`extra` aside), with a data directory of
/// its own.
async fn spawn(extra: &[&str], dir: &tempfile::TempDir) -> (tokio::process::Child, String) {
    let mut args = vec![
        AT_DEFAULTS,
        "--data-dir",
        dir.path().to_str().expect("UTF-8"),
    ];
    args.extend_from_slice(extra);
    binary::spawn(&args, None).await
}

async fn client(addr: &str) -> RetryBudgetClient<Channel> {
    RetryBudgetClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// `successes` of `dependency` reported; its pace after.
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

/// The pace of `dependency` as the caller's tenant sees it, without
/// counting anything.
async fn pace_of(client: &mut RetryBudgetClient<Channel>, dependency: &str) -> pb::DependencyPace {
    tell(client, dependency, 0, 0).await
}

/// Attempt `attempt` of `id` failed, its call sent to `dependency`.
async fn fail_at(
    client: &mut RetryBudgetClient<Channel>,
    id: &str,
    attempt: u32,
    dependency: &str,
) -> pb::NextActionResponse {
    let mut request = report(id, attempt, pb::ErrorClass::Transient);
    request.dependency = dependency.into();
    client
        .next_action(request)
        .await
        .expect("answered")
        .into_inner()
}

/// A first failure of a new activity, sent to `dependency`.
async fn fail(
    client: &mut RetryBudgetClient<Channel>,
    id: &str,
    dependency: &str,
) -> pb::NextActionResponse {
    fail_at(client, id, 1, dependency).await
}

async fn coordinated(addr: &str) {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    common::coordinated(channel).await;
}

async fn succeed(client: &mut RetryBudgetClient<Channel>, id: &str, dependency: &str) {
    client
        .record_success(pb::RecordSuccessRequest {
            activity_id: id.into(),
            dependency: dependency.into(),
            ..Default::default()
        })
        .await
        .expect("recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_server_retries_a_burst_of_first_failures_with_no_report() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = spawn(&[], &dir).await;
    let mut c = client(&addr).await;
    // 20 activities failing within one second, no success ever reported.
    let started = Instant::now();
    let mut retried = 0;
    for i in 0..20 {
        let r = fail(&mut c, &format!("burst-{i}"), "payments").await;
        retried += u32::from(r.code == "schedule_retry");
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(retried >= 19, "{retried} of 20 retried");
    // A dozen classification questions in a row (the pure form, a raw
    // failure the rules classify), on a dependency of their own.
    let mut answered = 0;
    for _ in 0..12 {
        let request = pb::NextActionRequest {
            budget: Some(pb::Budget {
                attempts: 1,
                max_attempts: 5,
                elapsed: 0,
                deadline: 60,
            }),
            error: Some(pb::ErrorDetail {
                http_status: 503,
                ..Default::default()
            }),
            dependency: "questions".into(),
            ..Default::default()
        };
        let r = c.next_action(request).await.unwrap().into_inner();
        answered += u32::from(r.code == "schedule_retry");
    }
    assert_eq!(answered, 12, "a dozen questions, a dozen answers");
}

/// An activity of the tests' workers, which follow the README's loop: on
/// a retry its next attempt runs (and fails, or succeeds), on a deferral
/// the same attempt is asked again at `not_before`, a stop ends it.
struct Activity {
    id: String,
    attempt: u32,
    dependency: &'static str,
    due_ms: i64,
}

/// What one step of the workers got, per dependency.
#[derive(Debug, Default, Clone, Copy)]
struct Got {
    paid: u32,
    deferred: u32,
}

/// Asks for every activity due by now (on the replica `route` picks for
/// its attempt); a granted retry of a dependency `failing` says fails at
/// once (its next attempt is asked at once), else it succeeds.
async fn work(
    clients: &mut [RetryBudgetClient<Channel>],
    pending: &mut Vec<Activity>,
    failing: impl Fn(&str) -> bool,
    got: &mut std::collections::HashMap<&'static str, Got>,
    last_reason: &mut String,
) {
    let mut i = 0;
    while i < pending.len() {
        if pending[i].due_ms > retry_budget::clock::now_ms() {
            i += 1;
            continue;
        }
        let a = &mut pending[i];
        let spread: usize = a.id.bytes().map(usize::from).sum();
        let replica = (spread + a.attempt as usize) % clients.len();
        let r = fail_at(&mut clients[replica], &a.id, a.attempt, a.dependency).await;
        let g = got.entry(a.dependency).or_default();
        match r.code.as_str() {
            "schedule_retry" => {
                g.paid += 1;
                if failing(a.dependency) {
                    a.attempt += 1;
                    continue;
                }
                let next = (replica + 1) % clients.len();
                succeed(&mut clients[next], &a.id, a.dependency).await;
            }
            "deferred" => {
                g.deferred += 1;
                *last_reason = r.reason.clone();
                a.due_ms = common::ms(r.not_before.as_ref().expect("a deferral has a time"));
                i += 1;
                continue;
            }
            _ => {}
        }
        pending.swap_remove(i);
    }
}

/// Per second of the test: retries paid and deferred per dependency, and
/// A's allowed rate at its end.
#[derive(Debug, Default, Clone, Copy)]
struct Second {
    a: Got,
    b: Got,
    a_allowed: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_dependency_is_cut_grows_back_and_never_defers_a_healthy_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = spawn(&[], &dir).await;
    let mut clients = [client(&addr).await];
    // 100 ms steps, no traffic report ever. A: down for 6 s (10 new
    // failures a step, every retry failing), then back (2 a step, every
    // retry succeeding). B: 20 calls a step, 2 of them failing, every
    // retry succeeding, each success recorded as the README's worker loop
    // does (a dependency failing every call before its retry succeeds is
    // failing half its calls: a surge, not a healthy neighbour).
    const BACK: u32 = 60;
    const END: u32 = 260;
    let started = Instant::now();
    let mut seconds = vec![Second::default(); (END / 10) as usize];
    let mut pending = Vec::new();
    let mut last_reason = String::new();
    let mut reason_while_down = String::new();
    for step in 0..END {
        let a_down = step < BACK;
        for i in 0..2 {
            pending.push(Activity {
                id: format!("b-{step}-{i}"),
                attempt: 1,
                dependency: "b",
                due_ms: 0,
            });
        }
        for i in 0..18 {
            succeed(&mut clients[0], &format!("b-ok-{step}-{i}"), "b").await;
        }
        for i in 0..if a_down { 10 } else { 2 } {
            pending.push(Activity {
                id: format!("a-{step}-{i}"),
                attempt: 1,
                dependency: "a",
                due_ms: 0,
            });
        }
        let mut got = std::collections::HashMap::new();
        work(
            &mut clients,
            &mut pending,
            |d| d == "a" && a_down,
            &mut got,
            &mut last_reason,
        )
        .await;
        if a_down && last_reason.contains("a:") {
            reason_while_down = last_reason.clone();
        }
        let s = &mut seconds[(step / 10) as usize];
        for (d, g) in got {
            let into = if d == "a" { &mut s.a } else { &mut s.b };
            into.paid += g.paid;
            into.deferred += g.deferred;
        }
        if step % 10 == 9 {
            s.a_allowed = pace_of(&mut clients[0], "a").await.allowed_rate;
        }
        tokio::time::sleep_until(started + Duration::from_millis(100 * u64::from(step + 1))).await;
    }
    eprintln!("per second: {seconds:#?}\nwhile A was down: {reason_while_down}");
    let b_deferred: u32 = seconds.iter().map(|s| s.b.deferred).sum();
    assert_eq!(
        b_deferred, 0,
        "B's retries are never deferred by A's trouble"
    );
    assert!(
        seconds[0].a.paid >= 19,
        "the starting allowance: {:?}",
        seconds[0]
    );
    // Down: cut from its starting 20 a second to the floor (1) at its first
    // surge, out of calm, then halved each second the trouble lasts, its
    // probes spaced out to one every 8 s (0.125 a second).
    for s in &seconds[4..(BACK / 10) as usize] {
        assert!(s.a_allowed <= 2.0, "cut: {s:?}");
        assert!(s.a.paid <= 4, "a few probes: {s:?}");
    }
    assert!(
        reason_while_down.contains("a: 0.125 retries/s allowed:"),
        "{reason_while_down}"
    );
    // Back: its probes stop failing and, once the hold after its last cut
    // is over (`HOLD_SECONDS`), it grows again; the retries deferred while
    // it was down are paid, oldest first.
    let back = seconds[(END / 10 - 1) as usize];
    assert!(back.a_allowed >= 15.0, "{seconds:#?}");
    let paid_back: u32 = seconds[(BACK / 10) as usize..]
        .iter()
        .map(|s| s.a.paid)
        .sum();
    assert!(paid_back >= 250, "{paid_back} paid after A came back");
    assert!(pending.iter().all(|a| a.dependency == "a"), "B's all done");
    // The caller's listing: its own dependencies, with their evidence.
    let mine = clients[0]
        .report_traffic(pb::ReportTrafficRequest::default())
        .await
        .unwrap()
        .into_inner()
        .dependencies;
    let mut names: Vec<_> = mine.iter().map(|d| d.dependency.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["a", "b"]);
    let a = mine.iter().find(|d| d.dependency == "a").unwrap();
    assert!(a.retries_deferred > 0);
    assert!(
        ["healthy", "recovering"].contains(&a.state.as_str()),
        "{a:?}"
    );
}

/// Pace `dependency` at 200 retries a second by its successes (2,000 a
/// second, reported), or hold it near its floor by failing retries; then
/// kill the server and start it again on the same data.
/// Returns how many of 50 first failures were retried, and what the first
/// refused was told.
async fn pace_then_restart(
    flags: &[&str],
    dir: &tempfile::TempDir,
    healthy: bool,
) -> (u32, String) {
    let on_postgres = flags.contains(&"--postgres-url");
    let (child, addr) = spawn(flags, dir).await;
    let mut c = client(&addr).await;
    if on_postgres {
        coordinated(&addr).await;
    }
    let started = Instant::now();
    for step in 0..60u32 {
        if healthy {
            tell(&mut c, "ledger", 200, 0).await;
        } else {
            for i in 0..10 {
                let id = format!("down-{step}-{i}");
                if fail(&mut c, &id, "ledger").await.code == "schedule_retry" {
                    fail_at(&mut c, &id, 2, "ledger").await;
                }
            }
        }
        tokio::time::sleep_until(started + Duration::from_millis(100 * u64::from(step + 1))).await;
    }
    let pace = pace_of(&mut c, "ledger").await;
    if healthy {
        // 10% of 2,000 successes a second is 200, capped at what the
        // global bucket can pay (its default rate, 100 a second).
        assert!(pace.allowed_rate + pace.earned_rate >= 100.0, "{pace:?}");
    } else {
        assert!(
            pace.allowed_rate <= 2.0 && pace.state == "trouble",
            "{pace:?}"
        );
    }
    // A save is made each second: wait for one, then kill without a drain.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut child = child;
    child.kill().await.expect("SIGKILL");
    let (_child, addr) = spawn(flags, dir).await;
    let mut c = client(&addr).await;
    if on_postgres {
        // A replica admits nothing before its first grant; the killed
        // one's lease holds its part until it lapses (three intervals).
        // Idle, the replica takes half of the global rate (the rest stays
        // free for demand elsewhere): once it holds it, and its bucket has
        // filled for a second, what is measured is the pace.
        coordinated(&addr).await;
        let url = flags[flags.iter().position(|f| *f == "--postgres-url").unwrap() + 1];
        postgres::holds(url, 50.0).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let mut retried = 0;
    let mut first_refusal = None;
    for i in 0..50 {
        let answer = fail(&mut c, &format!("after-{i}"), "ledger").await;
        if answer.code == "schedule_retry" {
            retried += 1;
        } else if first_refusal.is_none() {
            first_refusal = Some(format!("answer {i}: {}: {}", answer.code, answer.reason));
        }
    }
    (retried, first_refusal.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pace_survives_a_restart_on_the_same_data() {
    let dir = tempfile::tempdir().unwrap();
    let (retried, refusal) = pace_then_restart(&[], &dir, true).await;
    assert!(
        retried >= 45,
        "{retried} of 50 retried where 200 a second was allowed ({refusal})"
    );
    let dir = tempfile::tempdir().unwrap();
    let (retried, _) = pace_then_restart(&[], &dir, false).await;
    assert!(
        retried <= 4,
        "{retried} of 50 retried where it was held near its floor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pace_survives_a_replicas_restart_on_postgresql() {
    let Some(db) = TestDb::create("dependencies_restart").await else {
        return;
    };
    let flags = ["--postgres-url", db.url.as_str(), "--pool-size", "6"];
    let dir = tempfile::tempdir().unwrap();
    let (retried, refusal) = pace_then_restart(&flags, &dir, true).await;
    assert!(
        retried >= 45,
        "{retried} of 50 retried where 200 a second was allowed ({refusal})"
    );
    let Some(db) = TestDb::create("dependencies_restart_down").await else {
        return;
    };
    let flags = ["--postgres-url", db.url.as_str(), "--pool-size", "6"];
    let (retried, _) = pace_then_restart(&flags, &dir, false).await;
    assert!(
        retried <= 4,
        "{retried} of 50 retried where it was held near its floor"
    );
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

/// Three replicas on PostgreSQL, at the defaults. An activity's attempts
/// land on the replicas in turn, so a retry granted by one fails on
/// another: each replica reads the fate from the shared ledger, and the
/// fleet's allowance of A falls on every replica; B, whose retries
/// succeed, is never deferred.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_read_a_retrys_fate_wherever_it_lands() {
    let Some(db) = TestDb::create("dependencies_fleet").await else {
        return;
    };
    // The dependencies' budgets at their defaults; the global one wider
    // than its default 100 a second: a replica's part of it starts empty
    // at its first grant, and A's first second would spend it before B's.
    let flags = [
        AT_DEFAULTS,
        "--postgres-url",
        db.url.as_str(),
        "--pool-size",
        "8",
        "--retry-rate",
        "1000",
        "--retry-burst",
        "1000",
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
    let mut clients = [
        client(&addrs[0]).await,
        client(&addrs[1]).await,
        client(&addrs[2]).await,
    ];
    // A: 6 new failures a step, every retry failing; B: 1 a step, every
    // retry succeeding. An activity's attempts go to the replicas in turn.
    const END: u32 = 100;
    let started = Instant::now();
    let mut pending = Vec::new();
    let mut last_reason = String::new();
    let (mut a_paid_late, mut b_deferred) = (0u32, 0u32);
    for step in 0..END {
        for i in 0..6 {
            pending.push(Activity {
                id: format!("a-{step}-{i}"),
                attempt: 1,
                dependency: "a",
                due_ms: 0,
            });
        }
        pending.push(Activity {
            id: format!("b-{step}"),
            attempt: 1,
            dependency: "b",
            due_ms: 0,
        });
        let mut got = std::collections::HashMap::new();
        work(
            &mut clients,
            &mut pending,
            |d| d == "a",
            &mut got,
            &mut last_reason,
        )
        .await;
        b_deferred += got.get("b").map_or(0, |g| g.deferred);
        if step >= 50 {
            a_paid_late += got.get("a").map_or(0, |g| g.paid);
        }
        tokio::time::sleep_until(started + Duration::from_millis(100 * u64::from(step + 1))).await;
    }
    let mut paces = Vec::new();
    for c in &mut clients {
        paces.push(pace_of(c, "a").await);
    }
    eprintln!("A paid {a_paid_late} in the last 5 s, B deferred {b_deferred}; {paces:#?}");
    for pace in &paces {
        assert!(pace.allowed_rate <= 3.0, "every replica cut A: {pace:?}");
        assert_eq!(pace.state, "trouble", "{pace:?}");
    }
    assert_eq!(b_deferred, 0, "B's retries never wait");
    assert!(a_paid_late <= 25, "{a_paid_late} granted in the last 5 s");
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
    assert_eq!((pace.allowed_rate, pace.state.as_str()), (2.0, "static"));
    assert_eq!(pace.explanation, "2 retries/s allowed: a static rate");

    std::fs::write(
        &config,
        "[dependencies.named.pay]\ninitial = 3.0\nfloor = 3.0\n",
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
    assert_eq!(
        (pace.allowed_rate, pace.state.as_str()),
        (3.0, "no_evidence")
    );

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
    assert_eq!(
        (pace.allowed_rate, pace.state.as_str()),
        (3.0, "no_evidence")
    );

    let text = binary::scrape(metrics).await;
    assert!(
        text.contains("retry_budget_dependency_allowed_rate{dependency=\"pay\"} 3"),
        "{text}"
    );
}
