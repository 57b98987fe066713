//! Raw failures classified by the service's rules, and server hints
//! (Retry-After, pushback, RetryInfo) planned with, over the real server.

use crate::common;

use common::{TestServer, ms, pb, report, ts, with_tenant};
use retry_budget::budget::classify::RuleSpec;
use retry_budget::clock::now_ms;

fn failed(
    id: &str,
    attempt: u32,
    error: pb::ErrorDetail,
    deadline_seconds: u64,
) -> pb::NextActionRequest {
    let mut r = report(id, attempt, pb::ErrorClass::Unspecified);
    r.error = Some(error);
    r.policy = Some(pb::Policy {
        max_attempts: 5,
        deadline_seconds,
        base: None,
        cap: None,
    });
    r
}

fn http(status: u32, safety: pb::Safety) -> pb::ErrorDetail {
    pb::ErrorDetail {
        http_status: status,
        safety: safety as i32,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_429_whose_retry_after_passes_the_deadline_is_deadline_exceeded() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let t0 = now_ms();
    let mut error = http(429, pb::Safety::NonIdempotent);
    error.retry_after = "120".into();
    let mut request = failed("quota", 1, error, 60);
    request.occurred_at = Some(ts(t0));
    let r = client.next_action(request).await.unwrap().into_inner();
    assert_eq!(r.code, "deadline_exceeded");
    assert_eq!(r.error_class, pb::ErrorClass::Transient as i32);
    assert_eq!(r.rule, "http_429_transient");
    let hint = r.hint.expect("the hint is reported");
    assert_eq!(
        (hint.delay_ms, hint.source.as_str()),
        (120_000, "retry_after_seconds")
    );
    assert!(r.reason.contains("the server asked"), "{}", r.reason);
}

#[tokio::test]
async fn an_http_date_hint_is_measured_against_the_responses_date() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    // The response's Date and its Retry-After two minutes later, in the
    // three forms RFC 9110 allows; occurred_at is unrelated to both.
    let occurred = now_ms() / 1000 * 1000;
    let forms = [
        (
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:51:37 GMT",
        ),
        (
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:51:37 GMT",
        ),
        ("Sun Nov  6 08:49:37 1994", "  Sun Nov  6 08:51:37 1994 "),
    ];
    for (i, (date, retry_after)) in forms.into_iter().enumerate() {
        let mut error = http(503, pb::Safety::Idempotent);
        error.date = date.into();
        error.retry_after = retry_after.into();
        let mut request = failed(&format!("date-{i}"), 1, error, 3600);
        request.occurred_at = Some(ts(occurred));
        let r = client.next_action(request).await.unwrap().into_inner();
        assert_eq!(r.code, "schedule_retry", "{date}");
        assert_eq!(
            ms(r.not_before.as_ref().unwrap()),
            occurred + 120_000,
            "{date}"
        );
        assert_eq!((r.delay_ms, r.delay_seconds), (120_000, 120));
        assert_eq!(r.hint.unwrap().source, "retry_after_date");
    }
}

#[tokio::test]
async fn the_default_policy_classifies_by_status_code_kind_and_safety() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let net = |kind: pb::NetworkFailure, safety: pb::Safety| pb::ErrorDetail {
        network_failure: kind as i32,
        safety: safety as i32,
        ..Default::default()
    };
    let grpc = |code: i32, safety: pb::Safety| pb::ErrorDetail {
        grpc_code: Some(code),
        safety: safety as i32,
        ..Default::default()
    };
    let cases = [
        (
            http(400, pb::Safety::ReadOnly),
            "fail_permanent",
            "http_4xx_permanent",
        ),
        (
            http(503, pb::Safety::Idempotent),
            "schedule_retry",
            "http_503_transient",
        ),
        (
            http(500, pb::Safety::NonIdempotent),
            "manual_review",
            "http_5xx_non_idempotent_unknown",
        ),
        (
            http(502, pb::Safety::ReadOnly),
            "schedule_retry",
            "http_5xx_idempotent_transient",
        ),
        (
            grpc(14, pb::Safety::Idempotent),
            "schedule_retry",
            "grpc_unavailable_transient",
        ),
        (
            grpc(3, pb::Safety::Idempotent),
            "fail_permanent",
            "grpc_invalid_argument_permanent",
        ),
        (
            net(
                pb::NetworkFailure::ConnectionRefused,
                pb::Safety::NonIdempotent,
            ),
            "schedule_retry",
            "network_not_sent_transient",
        ),
        (
            net(
                pb::NetworkFailure::ConnectionReset,
                pb::Safety::NonIdempotent,
            ),
            "manual_review",
            "network_non_idempotent_unknown",
        ),
        (
            pb::ErrorDetail::default(),
            "manual_review",
            "no_signal_unknown",
        ),
    ];
    for (i, (error, code, rule)) in cases.into_iter().enumerate() {
        let r = client
            .next_action(failed(&format!("c-{i}"), 1, error, 3600))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((r.code.as_str(), r.rule.as_str()), (code, rule), "case {i}");
    }
    // The rule is recorded with the decision.
    let a = client
        .get_activity(pb::GetActivityRequest {
            activity_id: "c-0".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.events[0].rule, "http_4xx_permanent");
}

#[tokio::test]
async fn hints_that_stop_or_cannot_be_read_are_defined_outcomes() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    // A negative pushback: the server asks not to retry.
    let mut error = pb::ErrorDetail {
        grpc_code: Some(14),
        safety: pb::Safety::Idempotent as i32,
        grpc_retry_pushback_ms: Some(-1),
        ..Default::default()
    };
    let r = client
        .next_action(failed("pushback", 1, error.clone(), 3600))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "fail_permanent");
    assert!(r.hint.unwrap().do_not_retry);

    // Garbage Retry-After: ignored and said so; the backoff decides.
    error.grpc_retry_pushback_ms = None;
    error.retry_after = "soon, probably".into();
    let r = client
        .next_action(failed("garbage", 1, error.clone(), 3600))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.code, "schedule_retry");
    let hint = r.hint.unwrap();
    assert_eq!(hint.ignored, ["retry_after_invalid"]);
    assert_eq!(hint.delay_ms, 0);
    assert!(
        r.delay_ms >= 1000 && r.delay_ms < 2000,
        "the backoff of attempt 1"
    );

    // A huge hint is capped at the service's maximum (1 h by default).
    error.retry_after = "99999999999999999999".into();
    let r = client
        .next_action(failed("huge", 1, error.clone(), 100_000))
        .await
        .unwrap()
        .into_inner();
    let hint = r.hint.unwrap();
    assert!(hint.capped);
    assert_eq!(r.delay_ms, 3_600_000);

    // The worker's own class wins over the rules; its hints still count.
    let mut own = failed("own-class", 1, error, 100_000);
    own.error_class = pb::ErrorClass::Transient as i32;
    own.error.as_mut().unwrap().retry_after = "30".into();
    own.error.as_mut().unwrap().http_status = 400;
    let r = client.next_action(own).await.unwrap().into_inner();
    assert_eq!((r.code.as_str(), r.rule.as_str()), ("schedule_retry", ""));
    assert_eq!(r.delay_ms, 30_000);
}

#[tokio::test]
async fn operator_rules_come_first_and_can_be_scoped_to_a_tenant() {
    let rule: RuleSpec = toml::from_str(
        r#"
        name = "payments_409_transient"
        http_status = 409
        tenant = "payments"
        class = "transient"
        "#,
    )
    .unwrap();
    let server = TestServer::start_with(|c| c.classification.rules = vec![rule]).await;
    let mut client = server.client().await;
    let conflict = || failed("order-1", 1, http(409, pb::Safety::Idempotent), 3600);
    let r = client
        .next_action(with_tenant(conflict(), "payments"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.code.as_str(), r.rule.as_str()),
        ("schedule_retry", "payments_409_transient")
    );
    let r = client
        .next_action(with_tenant(conflict(), "shipping"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.code.as_str(), r.rule.as_str()),
        ("fail_permanent", "http_4xx_permanent")
    );
}

#[tokio::test]
async fn the_pure_form_classifies_and_plans_hints_too() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut error = http(429, pb::Safety::ReadOnly);
    error.retry_after = "7".into();
    let r = client
        .next_action(pb::NextActionRequest {
            budget: Some(pb::Budget {
                attempts: 1,
                max_attempts: 3,
                elapsed: 5,
                deadline: 30,
            }),
            activity_id: "flight-1".into(),
            error: Some(error),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.code.as_str(), r.rule.as_str()),
        ("schedule_retry", "http_429_transient")
    );
    assert_eq!((r.delay_seconds, r.delay_ms), (7, 7000));
}

#[tokio::test]
async fn an_invalid_rule_stops_the_server_from_starting() {
    let bad: RuleSpec = toml::from_str("name = \"x\"\nclass = \"transient\"\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = common::config(dir.path());
    config.classification.rules = vec![bad];
    let err = retry_budget::server::run(listener, config, std::future::pending())
        .await
        .expect_err("a rule that matches nothing is refused");
    assert!(err.to_string().contains('x'), "{err}");
}
