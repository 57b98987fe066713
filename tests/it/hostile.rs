//! Dependency budgets a tenant cannot game, through the real binary at its
//! defaults (issue #61; docs/security.md): one tenant reporting a flood of
//! successes earns retries of its own and never raises the allowance the
//! others share; counts that cannot be true are refused with the field
//! named and nothing changed; one tenant cannot squat more than its
//! `max_dependencies_per_tenant` names, and the names past it are told
//! `dependency_untracked`; a tenant's listing shows its own dependencies
//! only; and the same across three replicas on PostgreSQL.

use crate::common;
use crate::common::binary;

use common::{pb, report, with_tenant};
use pb::retry_budget_client::RetryBudgetClient;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

async fn client(addr: &str) -> RetryBudgetClient<Channel> {
    RetryBudgetClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// `tenant` reports `traffic`; the paces it is told, or the refusal.
async fn report_as(
    c: &mut RetryBudgetClient<Channel>,
    tenant: &str,
    traffic: Vec<pb::DependencyTraffic>,
) -> Result<Vec<pb::DependencyPace>, Status> {
    c.report_traffic(with_tenant(
        pb::ReportTrafficRequest {
            dependencies: traffic,
        },
        tenant,
    ))
    .await
    .map(|r| r.into_inner().dependencies)
}

fn traffic(dependency: &str, calls: u64, successes: u64, failures: u64) -> pb::DependencyTraffic {
    pb::DependencyTraffic {
        dependency: dependency.into(),
        calls,
        successes,
        failures,
    }
}

/// `tenant`'s view of `dependency`, counting nothing.
async fn pace_as(
    c: &mut RetryBudgetClient<Channel>,
    tenant: &str,
    dependency: &str,
) -> pb::DependencyPace {
    report_as(c, tenant, vec![traffic(dependency, 0, 0, 0)])
        .await
        .expect("a pace")
        .remove(0)
}

async fn fail_as(
    c: &mut RetryBudgetClient<Channel>,
    tenant: &str,
    id: &str,
    dependency: &str,
) -> pb::NextActionResponse {
    let mut request = report(id, 1, pb::ErrorClass::Transient);
    request.dependency = dependency.into();
    c.next_action(with_tenant(request, tenant))
        .await
        .expect("answered")
        .into_inner()
}

fn reason(status: &Status) -> (Code, String, Vec<(String, String)>) {
    let details = status.get_error_details();
    let info = details
        .error_info()
        .unwrap_or_else(|| panic!("an ErrorInfo in {status:?}"));
    let mut meta: Vec<_> = info
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    meta.sort();
    (status.code(), info.reason.clone(), meta)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_reported_successes_pays_only_the_reporters_own_retries() {
    let (_child, addr, _dir) = binary::spawn_at_defaults().await;
    let mut c = client(&addr).await;
    fail_as(&mut c, "alice", "a-1", "payments").await;
    let before = pace_as(&mut c, "alice", "payments").await;
    // Mallory claims a million successes a report, ten reports.
    for _ in 0..10 {
        report_as(
            &mut c,
            "mallory",
            vec![traffic("payments", 1_000_000, 1_000_000, 0)],
        )
        .await
        .expect("counts that can be true are taken");
    }
    let mallory = pace_as(&mut c, "mallory", "payments").await;
    let alice = pace_as(&mut c, "alice", "payments").await;
    eprintln!("alice before {before:?}\nalice after {alice:?}\nmallory {mallory:?}");
    assert!(mallory.earned_rate > 0.0, "{mallory:?}");
    assert!(
        mallory.earned_rate <= 100.0,
        "never more than the global bucket pays: {mallory:?}"
    );
    assert_eq!(alice.earned_rate, 0.0, "{alice:?}");
    assert!(
        alice.allowed_rate <= before.allowed_rate + 1e-9,
        "mallory's claims raised the shared allowance: {before:?} -> {alice:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_that_cannot_be_true_are_refused_with_the_field_and_nothing_changes() {
    let (_child, addr, _dir) = binary::spawn_at_defaults().await;
    let mut c = client(&addr).await;
    report_as(&mut c, "mallory", vec![traffic("payments", 10, 10, 0)])
        .await
        .unwrap();
    let before = pace_as(&mut c, "mallory", "payments").await;
    let status = report_as(
        &mut c,
        "mallory",
        vec![traffic("payments", 10, 10, 0), traffic("payments", 5, 9, 0)],
    )
    .await
    .expect_err("more successes than calls");
    let (code, why, meta) = reason(&status);
    assert_eq!(
        (code, why.as_str()),
        (Code::InvalidArgument, "invalid_traffic")
    );
    assert!(
        meta.iter().any(|(_, v)| v.contains("dependencies[1]")),
        "the field is named: {meta:?}"
    );
    let status = report_as(
        &mut c,
        "mallory",
        vec![traffic("payments", 2_000_000, 2_000_000, 0)],
    )
    .await
    .expect_err("past the most calls a report may carry");
    assert_eq!(reason(&status).1, "invalid_traffic");
    let many: Vec<_> = (0..65)
        .map(|i| traffic(&format!("d{i}"), 1, 1, 0))
        .collect();
    let status = report_as(&mut c, "mallory", many)
        .await
        .expect_err("65 dependencies in one report");
    assert_eq!(reason(&status).1, "too_many_dependencies");
    let after = pace_as(&mut c, "mallory", "payments").await;
    assert_eq!(
        (before.calls, before.successes),
        (after.calls, after.successes),
        "a refused report changed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_squat_the_dependency_table() {
    let (_child, addr, _dir) = binary::spawn_at_defaults().await;
    let mut c = client(&addr).await;
    let mut untracked = 0;
    for i in 0..40 {
        let answer = fail_as(&mut c, "mallory", &format!("m-{i}"), &format!("squat-{i}")).await;
        untracked += usize::from(answer.dependency_untracked);
    }
    assert_eq!(untracked, 40 - 16, "16 names a tenant, the rest shared");
    // Another tenant's new dependency is still tracked on its own.
    let answer = fail_as(&mut c, "alice", "a-1", "payments").await;
    assert!(!answer.dependency_untracked, "{answer:?}");
    assert_eq!(answer.code, "schedule_retry", "{answer:?}");
    // Each sees its own dependencies only.
    let alice = report_as(&mut c, "alice", Vec::new()).await.unwrap();
    let names: Vec<_> = alice.iter().map(|d| d.dependency.as_str()).collect();
    assert_eq!(names, ["payments"], "alice's listing: {names:?}");
    let mallory = report_as(&mut c, "mallory", Vec::new()).await.unwrap();
    assert!(
        mallory.iter().all(|d| d.dependency != "payments"),
        "mallory's listing shows alice's dependency"
    );
}

/// The same attacks on three replicas sharing one PostgreSQL: Mallory
/// floods successes on one and squats names on another, Alice asks on the
/// third. The fleet shares dependency names and paces, never a tenant's
/// claims or its quota of names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_three_replicas_no_tenant_moves_another_ones_budget() {
    use crate::common::cluster::Replica;
    use crate::common::postgres::TestDb;
    use std::time::Duration;

    let Some(db) = TestDb::create("hostile_replicas").await else {
        return;
    };
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let replica = Replica::spawn(&db.url, &[binary::AT_DEFAULTS]).await;
        let channel = Channel::from_shared(replica.url())
            .unwrap()
            .connect()
            .await
            .unwrap();
        common::coordinated(channel).await;
        replicas.push(replica);
    }
    let mut flooded = client(&replicas[0].addr).await;
    let mut squatted = client(&replicas[1].addr).await;
    let mut alice = client(&replicas[2].addr).await;
    // A few coordination intervals: what one replica learns, the others do.
    let settle = || tokio::time::sleep(Duration::from_secs(3));
    fail_as(&mut alice, "alice", "a-1", "payments").await;
    settle().await;
    let before = pace_as(&mut alice, "alice", "payments").await;
    for _ in 0..10 {
        report_as(
            &mut flooded,
            "mallory",
            vec![traffic("payments", 1_000_000, 1_000_000, 0)],
        )
        .await
        .expect("counts that can be true are taken");
    }
    let mut untracked = 0;
    for i in 0..40 {
        let answer = fail_as(
            &mut squatted,
            "mallory",
            &format!("m-{i}"),
            &format!("squat-{i}"),
        )
        .await;
        untracked += usize::from(answer.dependency_untracked);
    }
    assert_eq!(untracked, 40 - 16, "16 names a tenant, the rest shared");
    settle().await;
    let after = pace_as(&mut alice, "alice", "payments").await;
    eprintln!("alice before {before:?}\nalice after {after:?}");
    assert_eq!(after.earned_rate, 0.0, "{after:?}");
    assert!(
        after.allowed_rate <= before.allowed_rate + 1e-9,
        "mallory's claims raised the shared allowance: {before:?} -> {after:?}"
    );
    // Alice's new dependency is tracked on its own, on her replica.
    let answer = fail_as(&mut alice, "alice", "a-2", "ledger").await;
    assert!(!answer.dependency_untracked, "{answer:?}");
    assert_eq!(answer.code, "schedule_retry", "{answer:?}");
    let mine = report_as(&mut alice, "alice", Vec::new()).await.unwrap();
    let mut names: Vec<_> = mine.iter().map(|d| d.dependency.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["ledger", "payments"], "alice's listing");
    let theirs = report_as(&mut alice, "mallory", Vec::new()).await.unwrap();
    assert!(
        theirs.iter().all(|d| d.dependency != "ledger"),
        "mallory's listing shows alice's dependency"
    );
}
