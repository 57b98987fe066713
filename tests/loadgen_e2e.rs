//! The load generator of BENCHMARKS.md (`retry-budget-loadgen`) against the
//! real server on loopback: every scenario `benches/run.sh` runs completes
//! its requests without an error, and what it reports adds up. The figures
//! in BENCHMARKS.md come from this binary; a scenario that errored would
//! measure error paths instead.

mod common;

use common::TestServer;
use serde_json::Value;

/// Runs the generator for a short closed-loop window and returns its report.
async fn loadgen(server: &TestServer, args: &[&str]) -> Value {
    let url = server.url();
    let mut all = vec![
        "--target",
        url.as_str(),
        "--connections",
        "2",
        "--concurrency",
        "8",
        "--warmup",
        "200ms",
        "--duration",
        "500ms",
    ];
    all.extend_from_slice(args);
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_retry-budget-loadgen"))
        .args(&all)
        .output()
        .await
        .expect("run retry-budget-loadgen");
    assert!(
        output.status.success(),
        "retry-budget-loadgen {all:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object on stdout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_runs_without_errors() {
    let server = TestServer::start().await;
    for scenario in [
        "health",
        "retry-delay",
        "pure-next-action",
        "durable-next-action",
    ] {
        let report = loadgen(&server, &["--scenario", scenario]).await;
        assert_eq!(report["scenario"], scenario);
        assert_eq!(report["errors"], 0, "{scenario}: {report}");
        let requests = report["requests"].as_u64().expect("requests");
        assert!(requests > 0, "{scenario}: no request completed: {report}");
        let p50 = report["latency_us"]["p50"].as_u64().expect("p50");
        let p99 = report["latency_us"]["p99"].as_u64().expect("p99");
        assert!(0 < p50 && p50 <= p99, "{scenario}: {report}");
    }
    server.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_h2_client_runs_its_scenarios_without_errors() {
    let server = TestServer::start().await;
    for scenario in ["health", "retry-delay", "pure-next-action"] {
        let report = loadgen(&server, &["--scenario", scenario, "--client", "h2"]).await;
        assert_eq!(report["client"], "h2");
        assert_eq!(report["errors"], 0, "{scenario}: {report}");
        assert!(
            report["requests"].as_u64() > Some(0),
            "{scenario}: {report}"
        );
    }
    server.stop().await.expect("clean stop");
}

/// Both clients check the answer, not only the call's status: with a
/// retry-token bucket of one token, pure NextAction answers `DEFERRED`
/// after the first request, and each client counts those answers under the
/// same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_clients_count_a_wrong_answer_the_same_way() {
    let server = TestServer::start_with(|config| {
        config.bucket.rate = 1.0;
        config.bucket.burst = 1;
    })
    .await;
    for client in ["tonic", "h2"] {
        let report = loadgen(
            &server,
            &["--scenario", "pure-next-action", "--client", client],
        )
        .await;
        let deferred = report["error_codes"]["unexpected_action"]
            .as_u64()
            .unwrap_or(0);
        assert!(deferred > 0, "{client}: {report}");
        assert_eq!(
            report["errors"].as_u64(),
            Some(deferred),
            "{client}: {report}"
        );
    }
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_h2_client_refuses_a_durable_scenario() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_retry-budget-loadgen"))
        .args([
            "--target",
            "http://127.0.0.1:9",
            "--scenario",
            "durable-next-action",
            "--client",
            "h2",
        ])
        .output()
        .await
        .expect("run retry-budget-loadgen");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid arguments"), "{stderr}");
    assert!(stderr.contains("pure-next-action"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_loop_sends_at_its_rate() {
    let server = TestServer::start().await;
    for client in ["tonic", "h2"] {
        let report = loadgen(
            &server,
            &[
                "--scenario",
                "health",
                "--mode",
                "open",
                "--rate",
                "2000",
                "--client",
                client,
            ],
        )
        .await;
        assert_eq!(report["errors"], 0, "{client}: {report}");
        // 2,000 a second over the 0.5 s window.
        let due = report["requests_due"].as_u64().expect("requests_due");
        assert!((990..=1010).contains(&due), "{client}: {report}");
        assert!(report["pacer_lag_us"]["p99"].is_u64(), "{client}: {report}");
    }
    server.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_decisions_are_stored() {
    let server = TestServer::start().await;
    let report = loadgen(
        &server,
        &[
            "--scenario",
            "durable-next-action",
            "--tenant",
            "loadgen-test",
            "--attempts",
            "3",
            "--run-id",
            "e2e",
        ],
    )
    .await;
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["attempts_per_activity"], 3);
    // Virtual client 0 walked its first activity, `be2e-0-0`, through
    // attempts 1 to 3 before moving on: the store holds all three decisions.
    let mut client = server.client().await;
    let activity = client
        .get_activity(common::with_tenant(
            common::pb::GetActivityRequest {
                activity_id: "be2e-0-0".into(),
            },
            "loadgen-test",
        ))
        .await
        .expect("the generator's first activity is stored")
        .into_inner();
    assert_eq!(activity.attempts, 3, "{activity:?}");
    assert_eq!(activity.events.len(), 3, "{activity:?}");
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_unreachable_target_is_a_clear_error() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_retry-budget-loadgen"))
        .args([
            "--target",
            "http://127.0.0.1:9",
            "--scenario",
            "health",
            "--duration",
            "1s",
        ])
        .output()
        .await
        .expect("run retry-budget-loadgen");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot connect to http://127.0.0.1:9"),
        "{stderr}"
    );
}
