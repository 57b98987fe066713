//! Prometheus metrics from the real server: what a scrape shows after
//! decisions, replays, deferrals, refusals and group commits.

use crate::common;

use std::time::Duration;

use common::{TestServer, pb, report, with_tenant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port free now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// `GET path` over HTTP/1.1: the status line and the body.
async fn get(port: u16, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the metrics port");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The value of the sample named exactly `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_scrape_shows_what_the_server_did() {
    let port = free_port();
    let server = TestServer::start_with(|c| {
        c.metrics.listen = Some(([127, 0, 0, 1], port).into());
        c.bucket.rate = 1.0;
        c.bucket.burst = 1;
    })
    .await;
    let mut client = server.client().await;
    let ask =
        |id: &str, attempt| with_tenant(report(id, attempt, pb::ErrorClass::Transient), "acme");
    // A retry (the one token), its replay, a deferral, a refusal.
    let first = client.next_action(ask("a", 1)).await.unwrap().into_inner();
    assert_eq!(first.action, pb::Action::ScheduleRetry as i32);
    client.next_action(ask("a", 1)).await.unwrap();
    let deferred = client.next_action(ask("b", 1)).await.unwrap().into_inner();
    assert_eq!(deferred.action, pb::Action::Deferred as i32, "{deferred:?}");
    let refused = client.next_action(ask("a", 5)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);

    let (status, text) = get(port, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    let expect = |series: &str, value: f64| {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    };
    expect(
        r#"retry_budget_decisions_total{action="ACTION_SCHEDULE_RETRY",code="schedule_retry"}"#,
        2.0,
    );
    expect(
        r#"retry_budget_decisions_total{action="ACTION_DEFERRED",code="deferred"}"#,
        1.0,
    );
    expect("retry_budget_replays_total", 1.0);
    expect(
        r#"retry_budget_deferrals_total{reason="global_capacity_exhausted"}"#,
        1.0,
    );
    expect(
        r#"retry_budget_rpc_calls_total{service="retrybudget.v1.RetryBudget",method="NextAction",code="OK"}"#,
        3.0,
    );
    expect(
        r#"retry_budget_rpc_calls_total{service="retrybudget.v1.RetryBudget",method="NextAction",code="FAILED_PRECONDITION"}"#,
        1.0,
    );
    expect(
        r#"retry_budget_rpc_refusals_total{method="NextAction",code="attempt_out_of_order"}"#,
        1.0,
    );
    expect("retry_budget_rpc_in_flight", 0.0);
    expect("retry_budget_bucket_rate", 1.0);
    expect("retry_budget_bucket_burst", 1.0);
    expect(
        &format!(
            r#"retry_budget_build_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        ),
        1.0,
    );
    assert!(
        text.contains("retry_budget_config_info{sha256=\""),
        "{text}"
    );
    // Two fresh decisions saved (the replay and the refusal save nothing),
    // in at least one group commit, each observed.
    expect("retry_budget_store_saves_total", 2.0);
    let commits = sample(&text, "retry_budget_store_commits_total").unwrap();
    assert!(commits >= 1.0);
    expect("retry_budget_store_commit_size_count", commits);
    assert!(sample(&text, "retry_budget_store_commit_seconds_count") == Some(commits));
    // The one token granted; a deferral holds a place, not a token.
    expect(r#"retry_budget_tenant_tokens{tenant="acme"}"#, 1.0);
    expect(r#"retry_budget_tenant_tokens{tenant="other"}"#, 0.0);
    // Every metric is named as Prometheus wants: the text ends with # EOF.
    assert!(text.trim_end().ends_with("# EOF"), "{text}");

    let (status, _) = get(port, "/nope").await;
    assert!(status.contains("404"), "{status}");
    server.stop().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err(),
        "the metrics listener closes with the server"
    );
}

/// A server that has done nothing yet exports, at 0, every counter an alert
/// of deploy/prometheus/retry-budget.rules.yaml reads, for each of its known
/// labels: `increase()` and `rate()` see an event only as a rise from a
/// sample before it, so a counter that appears at 1 never fires its alert
/// the first time. (deploy/validate.sh feeds the rules' own tests this
/// scrape.)
#[tokio::test]
async fn a_fresh_server_exports_every_counter_an_alert_reads_at_zero() {
    let port = free_port();
    let server = TestServer::start_with(|c| {
        c.metrics.listen = Some(([127, 0, 0, 1], port).into());
    })
    .await;
    // The metrics listener is bound beside the gRPC one, not before it.
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, text) = get(port, "/metrics").await;
    let mut series = vec![
        r#"retry_budget_config_reloads_total{result="ok"}"#.to_owned(),
        r#"retry_budget_config_reloads_total{result="failed"}"#.to_owned(),
        r#"retry_budget_tls_reloads_total{result="failed"}"#.to_owned(),
        r#"retry_budget_decisions_total{action="ACTION_SCHEDULE_RETRY",code="schedule_retry"}"#
            .to_owned(),
        r#"retry_budget_decisions_total{action="ACTION_DEFERRED",code="deferred"}"#.to_owned(),
        r#"retry_budget_shadow_would_defer_total{reason="reservation_past_max_wait"}"#.to_owned(),
        "retry_budget_connections_refused_total".to_owned(),
        "retry_budget_bucket_tokens_granted_total".to_owned(),
    ];
    for reason in [
        "dependency_budget_exhausted",
        "tenant_share_exhausted",
        "global_capacity_exhausted",
        "tenant_backlog_full",
    ] {
        series.push(format!(
            r#"retry_budget_deferrals_total{{reason="{reason}"}}"#
        ));
        series.push(format!(
            r#"retry_budget_shadow_would_defer_total{{reason="{reason}"}}"#
        ));
    }
    for method in [
        "NextAction",
        "RecordSuccess",
        "GetActivity",
        "ResolveActivity",
        "ReportTraffic",
    ] {
        for code in [
            "store_backlogged",
            "store_unavailable",
            "store_closed",
            "shutting_down",
        ] {
            series.push(format!(
                r#"retry_budget_rpc_refusals_total{{method="{method}",code="{code}"}}"#
            ));
        }
    }
    for s in &series {
        assert_eq!(sample(&text, s), Some(0.0), "{s} in\n{text}");
    }
    server.stop().await.unwrap();
}

/// Shadow mode: the bucket computes every admission but never defers; a
/// retry it would have deferred goes ahead, says so, is replayed as it was
/// answered, and is counted.
#[tokio::test]
async fn shadow_mode_lets_retries_go_and_counts_what_it_would_defer() {
    let port = free_port();
    let server = TestServer::start_with(|c| {
        c.metrics.listen = Some(([127, 0, 0, 1], port).into());
        c.bucket.rate = 1.0;
        c.bucket.burst = 1;
        c.bucket.mode = retry_budget::bucket::BucketMode::Shadow;
    })
    .await;
    let mut client = server.client().await;
    let ask = |id: &str| with_tenant(report(id, 1, pb::ErrorClass::Transient), "acme");
    let first = client.next_action(ask("a")).await.unwrap().into_inner();
    assert_eq!(first.action, pb::Action::ScheduleRetry as i32);
    assert!(!first.would_defer && first.token_taken, "{first:?}");
    let shadowed = client.next_action(ask("b")).await.unwrap().into_inner();
    assert_eq!(
        shadowed.action,
        pb::Action::ScheduleRetry as i32,
        "{shadowed:?}"
    );
    assert!(shadowed.would_defer, "{shadowed:?}");
    assert!(!shadowed.token_taken);
    assert_eq!(shadowed.defer_reason, "global_capacity_exhausted");
    assert!(
        shadowed.reason.contains("shadow mode"),
        "{}",
        shadowed.reason
    );
    let replay = client.next_action(ask("b")).await.unwrap().into_inner();
    assert!(replay.replayed && replay.would_defer, "{replay:?}");

    let (_, text) = get(port, "/metrics").await;
    assert_eq!(
        sample(
            &text,
            r#"retry_budget_shadow_would_defer_total{reason="global_capacity_exhausted"}"#
        ),
        Some(1.0),
        "the decision, not its replay\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"retry_budget_bucket_admissions_refused_total{outcome="deferred",reason="global_capacity_exhausted"}"#
        ),
        Some(1.0),
        "the bucket counted the deferral it computed\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"retry_budget_deferrals_total{reason="global_capacity_exhausted"}"#
        ),
        Some(0.0),
        "nothing was deferred"
    );
}
