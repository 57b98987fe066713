//! The durable form of NextAction over the real server: the service owns
//! every activity's attempt count, decides on the recorded budget, and
//! records each decision before it replies.

use crate::common;

use std::time::Duration;

use common::{TestServer, get, ms, pb, report, ts, with_tenant};
use pb::ErrorClass::{Permanent, Transient, Unknown};
use retry_budget::budget::{DelayParams, retry_delay};

/// The logical origin of the tests: now, rounded down to the second, so that
/// the retention sweeper sees recent activities (a date in the past would be
/// purged as expired, correctly).
static T0: std::sync::LazyLock<i64> =
    std::sync::LazyLock::new(|| retry_budget::clock::now_ms() / 1000 * 1000);

fn policy(max_attempts: u32, deadline_seconds: u64) -> pb::Policy {
    pb::Policy {
        max_attempts,
        deadline_seconds,
        base: None,
        cap: None,
    }
}

fn at(mut request: pb::NextActionRequest, occurred_ms: i64) -> pb::NextActionRequest {
    request.occurred_at = Some(ts(occurred_ms));
    request
}

fn with_policy(mut request: pb::NextActionRequest, p: pb::Policy) -> pb::NextActionRequest {
    request.policy = Some(p);
    request
}

#[tokio::test]
async fn first_report_creates_the_activity_and_plans_from_logical_time() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut first = with_policy(at(report("pay-1", 1, Transient), *T0), policy(3, 600));
    first.workflow_id = "wf-9".into();
    let r = client.next_action(first).await.unwrap().into_inner();
    let expected = retry_delay("pay-1", 1, DelayParams::default()).unwrap();
    assert_eq!(r.code, "schedule_retry");
    assert_eq!(
        (r.delay_seconds, r.delay_ms),
        (expected.seconds, expected.millis)
    );
    assert_eq!(
        ms(r.not_before.as_ref().unwrap()),
        *T0 + expected.millis as i64
    );
    assert!(!r.replayed);

    let a = get(&mut client, "pay-1").await;
    assert_eq!(ms(a.started_at.as_ref().unwrap()), *T0);
    assert_eq!(a.policy, Some(policy(3, 600)));
    assert_eq!((a.attempts, a.workflow_id.as_str()), (1, "wf-9"));
    assert_eq!(a.status, pb::ActivityStatus::Open as i32);

    // Attempt 2 fails 30 logical seconds later: elapsed comes from the
    // caller's times, not from the service's clock.
    let r = client
        .next_action(at(report("pay-1", 2, Transient), *T0 + 30_000))
        .await
        .unwrap()
        .into_inner();
    let expected = retry_delay("pay-1", 2, DelayParams::default()).unwrap();
    assert_eq!(
        ms(r.not_before.as_ref().unwrap()),
        *T0 + 30_000 + expected.millis as i64
    );
    let a = get(&mut client, "pay-1").await;
    assert_eq!(a.events[1].elapsed_seconds, 30);

    // Attempt 3 of 3: exhausted, and the activity closes.
    let r = client
        .next_action(at(report("pay-1", 3, Transient), *T0 + 60_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "attempts_exhausted");
    assert!(r.not_before.is_none());
    let a = get(&mut client, "pay-1").await;
    assert_eq!(a.status, pb::ActivityStatus::Closed as i32);
    assert_eq!(a.closed_code, "attempts_exhausted");
}

#[tokio::test]
async fn a_missing_time_is_stamped_once_and_recorded() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let before = retry_budget::clock::now_ms();
    let r = client
        .next_action(report("stamped", 1, Transient))
        .await
        .unwrap()
        .into_inner();
    let after = retry_budget::clock::now_ms();
    let a = get(&mut client, "stamped").await;
    let started = ms(a.started_at.as_ref().unwrap());
    assert!((before..=after).contains(&started));
    assert!(a.events[0].occurred_at_stamped);
    assert_eq!(
        ms(r.not_before.as_ref().unwrap()),
        started + r.delay_ms as i64
    );
    // The replay plans from the recorded stamp, not from a new clock
    // reading: once the clock has moved past the stamp (the server's clock
    // is this process's), a new stamp would plan another time.
    while retry_budget::clock::now_ms() <= started {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let again = client
        .next_action(report("stamped", 1, Transient))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    assert_eq!(again.not_before, r.not_before);
}

#[tokio::test]
async fn no_retry_is_scheduled_when_the_deadline_comes_before_the_next_planned_time() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    // Deadline 10 s; attempt 4 fails 5 s in; its backoff (base 2, so a
    // ceiling of 16 s, at least 8 s) would start after the deadline.
    let p = policy(10, 10);
    for attempt in 1..=3 {
        let r = client
            .next_action(with_policy(at(report("late", attempt, Transient), *T0), p))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.code, "schedule_retry", "attempt {attempt}");
    }
    let r = client
        .next_action(at(report("late", 4, Transient), *T0 + 5_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "deadline_exceeded");
    assert_eq!(r.action, pb::Action::DeadlineExceeded as i32);
    assert!(r.reason.contains("deadline"), "{}", r.reason);
    // Past the deadline itself: the reference check.
    let r = client
        .next_action(with_policy(at(report("past", 1, Transient), *T0), p))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "schedule_retry");
    let r = client
        .next_action(at(report("past", 2, Transient), *T0 + 10_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "deadline_exceeded");
}

#[tokio::test]
async fn replay_returns_the_recorded_decision_and_writes_nothing_even_across_a_restart() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let first = client
        .next_action(with_policy(
            at(report("replay", 1, Transient), *T0),
            policy(5, 3600),
        ))
        .await
        .unwrap()
        .into_inner();
    let (data_dir, _keep) = server.stop_keep_dir().await;

    // Restart with another default policy: the recorded decision stands.
    let server = TestServer::start_in(data_dir, |c| c.policy.max_attempts = 1).await;
    let mut client = server.client().await;
    let again = client
        .next_action(at(report("replay", 1, Transient), *T0 + 999_000))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    assert_eq!(
        (
            again.code.as_str(),
            again.delay_ms,
            again.not_before,
            again.reason.as_str()
        ),
        (
            first.code.as_str(),
            first.delay_ms,
            first.not_before,
            first.reason.as_str()
        )
    );
    let a = get(&mut client, "replay").await;
    assert_eq!(a.events.len(), 1, "a replay writes nothing");
    assert_eq!(a.attempts, 1);
}

#[tokio::test]
async fn out_of_order_attempts_and_closed_activities_are_refused_without_change() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let status = client
        .next_action(at(report("ooo", 2, Transient), *T0))
        .await
        .expect_err("attempt 2 before attempt 1");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().starts_with("attempt_out_of_order"),
        "{status:?}"
    );
    assert!(
        status.message().contains("expected attempt 1"),
        "{status:?}"
    );

    client
        .next_action(at(report("ooo", 1, Transient), *T0))
        .await
        .unwrap();
    let status = client
        .next_action(at(report("ooo", 3, Transient), *T0))
        .await
        .expect_err("skips attempt 2");
    assert!(
        status.message().contains("expected attempt 2"),
        "{status:?}"
    );

    let r = client
        .next_action(at(report("ooo", 2, Permanent), *T0 + 1000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "fail_permanent");
    let status = client
        .next_action(at(report("ooo", 3, Transient), *T0 + 2000))
        .await
        .expect_err("closed");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().starts_with("activity_closed"),
        "{status:?}"
    );
    assert!(status.message().contains("fail_permanent"), "{status:?}");
    // The terminal decision itself still replays.
    let r = client
        .next_action(at(report("ooo", 2, Transient), *T0))
        .await
        .unwrap()
        .into_inner();
    assert!(r.replayed);
    assert_eq!(r.code, "fail_permanent");
    assert_eq!(get(&mut client, "ooo").await.events.len(), 2);
}

#[tokio::test]
async fn the_first_policy_wins_and_the_response_says_so() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    client
        .next_action(with_policy(
            at(report("pol", 1, Transient), *T0),
            policy(2, 600),
        ))
        .await
        .unwrap();
    let r = client
        .next_action(with_policy(
            at(report("pol", 2, Transient), *T0 + 1000),
            policy(9, 600),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(r.policy_conflict);
    assert_eq!(r.policy, Some(policy(2, 600)));
    assert_eq!(
        r.code, "attempts_exhausted",
        "decided on the recorded 2 attempts"
    );
    let same = client
        .next_action(with_policy(
            at(report("pol", 2, Transient), *T0 + 1000),
            policy(2, 600),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(same.replayed && !same.policy_conflict);
}

#[tokio::test]
async fn manual_review_parks_until_resolved() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .next_action(at(report("review", 1, Unknown), *T0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "manual_review");
    assert_eq!(
        get(&mut client, "review").await.status,
        pb::ActivityStatus::Parked as i32
    );
    let status = client
        .next_action(at(report("review", 2, Transient), *T0 + 1000))
        .await
        .expect_err("parked");
    assert!(
        status.message().starts_with("activity_parked"),
        "{status:?}"
    );

    let resolved = client
        .resolve_activity(pb::ResolveActivityRequest {
            activity_id: "review".into(),
            resolution: pb::Resolution::Retry as i32,
            note: "checked with the payment provider: nothing was charged".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resolved.status, pb::ActivityStatus::Open as i32);
    let r = client
        .next_action(at(report("review", 2, Transient), *T0 + 1000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "schedule_retry");

    client
        .next_action(at(report("review", 3, Unknown), *T0 + 5000))
        .await
        .unwrap();
    let resolved = client
        .resolve_activity(pb::ResolveActivityRequest {
            activity_id: "review".into(),
            resolution: pb::Resolution::Fail as i32,
            note: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resolved.status, pb::ActivityStatus::Closed as i32);
    let a = get(&mut client, "review").await;
    assert_eq!(a.closed_code, "resolved_failed");
    let not_parked = client
        .resolve_activity(pb::ResolveActivityRequest {
            activity_id: "review".into(),
            resolution: pb::Resolution::Retry as i32,
            note: String::new(),
        })
        .await
        .expect_err("closed, not parked");
    assert!(not_parked.message().starts_with("activity_not_parked"));
    let bad = client
        .resolve_activity(pb::ResolveActivityRequest {
            activity_id: "review".into(),
            resolution: 0,
            note: String::new(),
        })
        .await
        .expect_err("no resolution");
    assert!(bad.message().starts_with("unknown_resolution"));
}

#[tokio::test]
async fn record_success_closes_and_is_idempotent() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    client
        .next_action(at(report("ok", 1, Transient), *T0))
        .await
        .unwrap();
    let success = pb::RecordSuccessRequest {
        activity_id: "ok".into(),
        occurred_at: Some(ts(*T0 + 3000)),
        ..Default::default()
    };
    let first = client
        .record_success(success.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (first.status, first.changed),
        (pb::ActivityStatus::Closed as i32, true)
    );
    let second = client.record_success(success).await.unwrap().into_inner();
    assert_eq!(
        (second.status, second.changed),
        (pb::ActivityStatus::Closed as i32, false)
    );
    let a = get(&mut client, "ok").await;
    assert_eq!(a.closed_code, "succeeded");
    assert_eq!(a.events.len(), 2);
    // Success of an activity that never failed: nothing to close.
    let never = client
        .record_success(pb::RecordSuccessRequest {
            activity_id: "never-failed".into(),
            occurred_at: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (never.status, never.changed),
        (pb::ActivityStatus::Unspecified as i32, false)
    );
    let missing = client
        .get_activity(pb::GetActivityRequest {
            activity_id: "never-failed".into(),
        })
        .await
        .expect_err("not stored");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    assert!(missing.message().starts_with("activity_not_found"));
}

#[tokio::test]
async fn get_activity_and_the_cli_explain_every_decision() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r1 = client
        .next_action(with_policy(
            at(report("why", 1, Transient), *T0),
            policy(2, 3600),
        ))
        .await
        .unwrap()
        .into_inner();
    client
        .next_action(at(report("why", 2, Transient), *T0 + 4000))
        .await
        .unwrap();
    let a = get(&mut client, "why").await;
    assert_eq!(a.events.len(), 2);
    let e = &a.events[0];
    assert_eq!(
        (e.kind.as_str(), e.attempt, e.code.as_str()),
        ("decision", 1, "schedule_retry")
    );
    assert_eq!(e.error_class, Transient as i32);
    assert_eq!(ms(e.occurred_at.as_ref().unwrap()), *T0);
    assert_eq!((e.backoff_ms, e.delay_ms), (r1.delay_ms, r1.delay_ms));
    assert_eq!(e.not_before, r1.not_before);
    assert!(e.reason.contains("attempt 1 of 2"), "{}", e.reason);
    assert_eq!(a.events[1].code, "attempts_exhausted");

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_retry-budget"))
        .args(["explain", "why", "--server", &server.url()])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("activity  why (tenant default)"), "{text}");
    assert!(
        text.contains("schedule_retry") && text.contains("attempts_exhausted"),
        "{text}"
    );
    assert!(text.contains("closed after attempt 2"), "{text}");
}

#[tokio::test]
async fn tenants_never_mix() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    client
        .next_action(with_tenant(
            at(report("shared-id", 1, Transient), *T0),
            "acme",
        ))
        .await
        .unwrap();
    client
        .next_action(with_tenant(
            at(report("shared-id", 2, Transient), *T0),
            "acme",
        ))
        .await
        .unwrap();
    // Another tenant's activity with the same id starts at attempt 1.
    let other = client
        .next_action(with_tenant(
            at(report("shared-id", 2, Transient), *T0),
            "globex",
        ))
        .await
        .expect_err("globex has no attempt 1");
    assert!(other.message().contains("expected attempt 1"));
    let bad = client
        .next_action(with_tenant(
            at(report("x", 1, Transient), *T0),
            "bad tenant",
        ))
        .await
        .expect_err("space in tenant");
    assert!(bad.message().starts_with("invalid_tenant"));
    let missing = client
        .get_activity(pb::GetActivityRequest {
            activity_id: "shared-id".into(),
        })
        .await
        .expect_err("the default tenant has none");
    assert_eq!(missing.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn closed_and_expired_activities_are_purged_after_retention() {
    let server = TestServer::start_with(|c| {
        c.store.retention = Duration::from_millis(200);
        c.store.sweep_interval = Duration::from_millis(50);
    })
    .await;
    let mut client = server.client().await;
    let now = retry_budget::clock::now_ms();
    client
        .next_action(at(report("closed", 1, Permanent), now))
        .await
        .unwrap();
    client
        .next_action(with_policy(
            at(report("open", 1, Transient), now),
            policy(5, 3600),
        ))
        .await
        .unwrap();
    client
        .next_action(at(report("parked", 1, Unknown), now))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let gone = client
            .get_activity(pb::GetActivityRequest {
                activity_id: "closed".into(),
            })
            .await
            .is_err_and(|s| s.code() == tonic::Code::NotFound);
        if gone {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "closed activity never purged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // An open activity within its deadline, and a parked one, stay.
    get(&mut client, "open").await;
    get(&mut client, "parked").await;
}

#[tokio::test]
async fn concurrent_reports_of_one_activity_count_each_attempt_once() {
    let server = TestServer::start().await;
    let client = server.client().await;
    // Ten workers report the same attempt at once: one decides, nine replay.
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            client
                .next_action(at(report("race", 1, Transient), *T0))
                .await
                .unwrap()
                .into_inner()
        }));
    }
    let mut fresh = 0;
    let mut plans = std::collections::HashSet::new();
    for t in tasks {
        let r = t.await.unwrap();
        fresh += usize::from(!r.replayed);
        plans.insert(r.not_before.map(|t| ms(&t)));
    }
    assert_eq!(fresh, 1);
    assert_eq!(plans.len(), 1, "every worker got the same plan");
    let mut client = client;
    assert_eq!(get(&mut client, "race").await.events.len(), 1);
}

#[tokio::test]
async fn unset_policy_fields_take_the_service_defaults() {
    let server = TestServer::start_with(|c| c.policy.deadline = Duration::from_secs(120)).await;
    let mut client = server.client().await;
    // Only max_attempts: proto3 sends deadline_seconds 0, which means "the
    // default", not "already past the deadline".
    let r = client
        .next_action(with_policy(
            at(report("partial", 1, Transient), *T0),
            policy(3, 0),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "schedule_retry");
    assert_eq!(r.policy, Some(policy(3, 120)));
    // The same partial policy again is no conflict.
    let again = client
        .next_action(with_policy(
            at(report("partial", 2, Transient), *T0 + 5000),
            policy(3, 0),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.policy_conflict);
}

#[tokio::test]
async fn a_replay_with_another_class_keeps_the_recorded_decision_and_says_so() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    client
        .next_action(at(report("flip", 1, Transient), *T0))
        .await
        .unwrap();
    let r = client
        .next_action(at(report("flip", 1, Permanent), *T0))
        .await
        .unwrap()
        .into_inner();
    assert!(r.replayed && r.class_conflict);
    assert_eq!(r.code, "schedule_retry");
    let same = client
        .next_action(at(report("flip", 1, Transient), *T0))
        .await
        .unwrap()
        .into_inner();
    assert!(same.replayed && !same.class_conflict);
}
