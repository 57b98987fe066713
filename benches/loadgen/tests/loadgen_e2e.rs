//! The load generator of BENCHMARKS.md (`retry-budget-loadgen`) against the
//! real server on loopback: every scenario `benches/run.sh` runs completes
//! its requests without an error, and what it reports adds up. The figures
//! in BENCHMARKS.md come from this binary; a scenario that errored would
//! measure error paths instead.

// The service's own end-to-end helper (a real server on 127.0.0.1:0 with a
// temp data dir), shared rather than copied.
#[path = "../../../tests/common/mod.rs"]
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
    report(&all).await
}

/// Runs the generator with `args`, which must succeed, and returns its
/// report.
async fn report(args: &[&str]) -> Value {
    let output = run(args).await;
    assert!(
        output.status.success(),
        "retry-budget-loadgen {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object on stdout")
}

/// Runs the generator with `args`, which must fail, and returns what it
/// said on stderr.
async fn refusal(args: &[&str]) -> String {
    let output = run(args).await;
    assert!(!output.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn run(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_retry-budget-loadgen"))
        .args(args)
        .output()
        .await
        .expect("run retry-budget-loadgen")
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
    let stderr = refusal(&[
        "--target",
        "http://127.0.0.1:9",
        "--scenario",
        "durable-next-action",
        "--client",
        "h2",
    ])
    .await;
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

/// `new-activities` writes each activity once through the server, and
/// counts an answer replayed from the store as a failure: run again with the
/// same ids, every write is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_activities_are_each_written_once() {
    let server = TestServer::start().await;
    let url = server.url();
    let args = [
        "--target",
        url.as_str(),
        "--scenario",
        "new-activities",
        "--activities",
        "300",
        "--concurrency",
        "16",
        "--connections",
        "2",
        "--tenant",
        "loadgen-test",
        "--run-id",
        "e2e",
    ];
    let first = report(&args).await;
    assert_eq!(first["scenario"], "new-activities", "{first}");
    assert_eq!(first["written"], 300, "{first}");
    assert_eq!(first["failed"], 0, "{first}");
    let mut client = server.client().await;
    for id in ["ne2e-00000000", "ne2e-00000299"] {
        let activity = client
            .get_activity(common::with_tenant(
                common::pb::GetActivityRequest {
                    activity_id: id.into(),
                },
                "loadgen-test",
            ))
            .await
            .unwrap_or_else(|e| panic!("{id} is stored: {e}"))
            .into_inner();
        assert_eq!(activity.attempts, 1, "{activity:?}");
    }
    let again = report(&args).await;
    assert_eq!(again["written"], 0, "{again}");
    assert_eq!(again["error_codes"]["unexpected_replay"], 300, "{again}");
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_unreachable_target_is_a_clear_error() {
    let stderr = refusal(&[
        "--target",
        "http://127.0.0.1:9",
        "--scenario",
        "health",
        "--duration",
        "1s",
    ])
    .await;
    assert!(
        stderr.contains("cannot connect to http://127.0.0.1:9"),
        "{stderr}"
    );
}

/// What a server saw of one request: everything but the stream id.
#[derive(Debug, PartialEq)]
struct Seen {
    method: http::Method,
    uri: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The DATA frames' sizes, the last one ending the stream.
    frames: Vec<usize>,
}

/// An HTTP/2 server on loopback that records every request it is sent and
/// answers each with `RetryDelay`'s 11 seconds.
async fn recording_server() -> (String, tokio::sync::mpsc::UnboundedReceiver<Seen>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut connection = h2::server::handshake(socket).await.expect("handshake");
                // Each request on its own task: the connection must be
                // polled (accept) for a request's body to arrive.
                while let Some(Ok((request, respond))) = connection.accept().await {
                    tokio::spawn(answer(request, respond, tx.clone()));
                }
            });
        }
    });
    (url, rx)
}

/// Records one request and answers it with `RetryDelay`'s 11 seconds.
async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
    tx: tokio::sync::mpsc::UnboundedSender<Seen>,
) {
    use prost::Message;
    let (parts, mut body) = request.into_parts();
    let mut seen = Seen {
        method: parts.method,
        uri: parts.uri.to_string(),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_owned()))
            .collect(),
        body: Vec::new(),
        frames: Vec::new(),
    };
    seen.headers.sort();
    while let Some(Ok(data)) = body.data().await {
        let _ = body.flow_control().release_capacity(data.len());
        seen.frames.push(data.len());
        seen.body.extend_from_slice(&data);
    }
    let _ = tx.send(seen);
    let answer = common::pb::RetryDelayResponse {
        delay_seconds: 11,
        ..Default::default()
    }
    .encode_to_vec();
    let mut framed = vec![0];
    framed.extend_from_slice(&u32::try_from(answer.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&answer);
    let response = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let mut send = respond.send_response(response, false).expect("respond");
    let _ = send.send_data(framed.into(), false);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = send.send_trailers(trailers);
}

/// The h2 client's request is the tonic client's, byte for byte: the same
/// pseudo-headers and headers, the same message, in the same DATA frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_h2_client_sends_what_the_tonic_client_sends() {
    let (url, mut seen) = recording_server().await;
    let mut requests = Vec::new();
    for client in ["tonic", "h2"] {
        let report = report(&[
            "--target",
            &url,
            "--scenario",
            "retry-delay",
            "--client",
            client,
            "--connections",
            "1",
            "--concurrency",
            "1",
            "--warmup",
            "0s",
            "--duration",
            "50ms",
        ])
        .await;
        assert_eq!(report["errors"], 0, "{client}: {report}");
        requests.push(seen.recv().await.expect("a request"));
        while seen.try_recv().is_ok() {}
    }
    assert_eq!(requests[0].method, http::Method::POST);
    assert_eq!(requests[0].frames.len(), 2, "{:?}", requests[0]);
    assert_eq!(requests[0], requests[1]);
}
