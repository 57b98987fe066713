//! The load generator against the real server on loopback: every scenario the bench scripts
//! run completes its requests without an error and what it reports adds up (a scenario that
//! errored would measure error paths), and its two clients send the same requests.

// The service's own end-to-end helper (a real server on 127.0.0.1:0, a temp data dir).
#[path = "../../../tests/it/common/server.rs"]
mod common;

use common::TestServer;
use serde_json::Value;

/// Runs the generator with the words of `args`, then `more` (paths and urls, kept whole), and
/// returns its report or, if it failed, its stderr.
async fn run(args: &str, more: &[&str]) -> Result<Value, String> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_retry-budget-loadgen"))
        .args(args.split_whitespace().chain(more.iter().copied()))
        .output()
        .await
        .expect("run retry-budget-loadgen");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("one JSON object on stdout"))
}

/// A short window against `url` (2 connections, 8 clients), which must succeed.
async fn window(url: &str, args: &str, more: &[&str]) -> Value {
    let short = format!("--connections 2 --concurrency 8 --warmup 200ms --duration 500ms {args}");
    let more = [&["--target", url], more].concat();
    let report = run(&short, &more).await;
    report.unwrap_or_else(|e| panic!("{args} failed: {e}"))
}

async fn activity(server: &TestServer, id: &str) -> common::pb::Activity {
    let request = common::pb::GetActivityRequest {
        activity_id: id.into(),
    };
    let mut client = server.client().await;
    let found = client
        .get_activity(common::with_tenant(request, "loadgen-test"))
        .await;
    found
        .unwrap_or_else(|e| panic!("{id} is stored: {e}"))
        .into_inner()
}

/// Each scenario on the tonic client, the stateless ones on the h2 client too, closed and open
/// loop: no error, latencies that add up, and what the scenario adds to its report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_runs_without_errors_on_either_client() {
    let server = TestServer::start().await;
    let open = "--mode open --rate 2000";
    let durable = "--tenant loadgen-test --attempts 3 --run-id e2e";
    let mut cases = vec![
        ("durable-next-action", "tonic", durable),
        ("mixed", "tonic", ""),
    ];
    for client in ["tonic", "h2"] {
        for scenario in ["health", "retry-delay", "pure-next-action"] {
            cases.push((scenario, client, ""));
        }
        cases.push(("health", client, open));
    }
    for (scenario, client, extra) in cases {
        let args = format!("--scenario {scenario} --client {client} {extra}");
        let report = window(&server.url(), &args, &[]).await;
        let what = format!("{args}: {report}");
        let echoed = (report["scenario"].as_str(), report["client"].as_str());
        assert_eq!(echoed, (Some(scenario), Some(client)), "{what}");
        assert_eq!(report["errors"], 0, "{what}");
        assert!(report["requests"].as_u64() > Some(0), "{what}");
        let latency = &report["latency_us"];
        let (p50, p99) = (latency["p50"].as_u64(), latency["p99"].as_u64());
        assert!(Some(0) < p50 && p50 <= p99, "{what}");
        if extra == open {
            // 2,000 a second over the 0.5 s window.
            let due = report["requests_due"].as_u64().expect("requests_due");
            assert!((990..=1010).contains(&due), "{what}");
            assert!(report["pacer_lag_us"]["p99"].is_u64(), "{what}");
        }
        if scenario == "durable-next-action" {
            assert_eq!(report["attempts_per_activity"], 3, "{what}");
        }
    }
    // Durable: client 0 walked its first activity through attempts 1 to 3 before moving on.
    let first = activity(&server, "be2e-0-0").await;
    assert_eq!((first.attempts, first.events.len()), (3, 3), "{first:?}");
    server.stop().await.expect("clean stop");
}

/// Both clients check the answer, not only the call's status: with a bucket of one token,
/// pure NextAction answers `DEFERRED` after the first request, counted under the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_clients_count_a_wrong_answer_the_same_way() {
    let server =
        TestServer::start_with(|config| (config.bucket.rate, config.bucket.burst) = (1.0, 1)).await;
    for client in ["tonic", "h2"] {
        let args = format!("--scenario pure-next-action --client {client}");
        let report = window(&server.url(), &args, &[]).await;
        let deferred = report["error_codes"]["unexpected_action"].as_u64();
        let all = report["errors"].as_u64();
        assert!(deferred > Some(0) && all == deferred, "{client}: {report}");
    }
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn what_cannot_run_is_a_clear_error() {
    let nowhere = ["--target", "http://127.0.0.1:9"];
    let h2 = run("--scenario durable-next-action --client h2", &nowhere).await;
    let error = h2.expect_err("no h2 client for a durable scenario");
    let clear = error.contains("invalid arguments") && error.contains("pure-next-action");
    assert!(clear, "{error}");
    let error = run("--scenario health", &nowhere)
        .await
        .expect_err("nothing there");
    assert!(
        error.contains("cannot connect to http://127.0.0.1:9"),
        "{error}"
    );
}

/// `new-activities` writes each activity once, and counts an answer replayed from the store
/// as a failure: run again with the same ids, every write is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_activities_are_each_written_once() {
    let server = TestServer::start().await;
    let url = server.url();
    let args = "--scenario new-activities --activities 300 --concurrency 16 --tenant loadgen-test";
    let (args, target) = (format!("{args} --run-id e2e"), ["--target", &url]);
    let first = run(&args, &target).await.expect("written");
    let counts = (first["written"].as_u64(), first["failed"].as_u64());
    assert_eq!(counts, (Some(300), Some(0)), "{first}");
    for id in ["ne2e-00000000", "ne2e-00000299"] {
        assert_eq!(activity(&server, id).await.attempts, 1);
    }
    let again = run(&args, &target).await.expect("run");
    assert_eq!(again["written"], 0, "{again}");
    assert_eq!(again["error_codes"]["unexpected_replay"], 300, "{again}");
    server.stop().await.expect("clean stop");
}

/// The offline preload, then reports over the stored activities: each run goes on from the
/// attempts the last one reached, so that no report is a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_activities_are_preloaded_and_reported_on_from_run_to_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (data, file) = (dir.path().join("data"), dir.path().join("attempts"));
    let (data_arg, file_arg) = (data.to_str().unwrap(), file.to_str().unwrap());
    let preload = "--scenario preload --activities 50 --tenant loadgen-test";
    let preloaded = run(preload, &["--data-dir", data_arg]).await;
    let preloaded = preloaded.expect("preloaded");
    assert_eq!(preloaded["activities"], 50, "{preloaded}");
    let server = TestServer::start_in(data.clone(), |_| {}).await;
    assert_eq!(activity(&server, "pre-00000049").await.attempts, 1);
    let stored = "--scenario stored-next-action --activities 50 --tenant loadgen-test";
    let mut mean = 0.0;
    for _ in 0..2 {
        let report = window(&server.url(), stored, &["--attempts-file", file_arg]).await;
        let stored = report["stored_activities"].as_u64();
        assert_eq!(
            (report["errors"].as_u64(), stored),
            (Some(0), Some(50)),
            "{report}"
        );
        assert!(report["mean_attempt"].as_f64() > Some(mean), "{report}");
        mean = report["mean_attempt"].as_f64().expect("mean_attempt");
    }
    server.stop().await.expect("clean stop");
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

/// An HTTP/2 server that records every request and answers it with `RetryDelay`'s 11 s.
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
                // Each request on its own task: the connection must be polled for a body to arrive.
                while let Some(Ok((request, respond))) = connection.accept().await {
                    tokio::spawn(answer(request, respond, tx.clone()));
                }
            });
        }
    });
    (url, rx)
}

async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
    tx: tokio::sync::mpsc::UnboundedSender<Seen>,
) {
    use prost::Message;
    let (parts, mut body) = request.into_parts();
    let headers = parts
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()));
    let mut seen = Seen {
        method: parts.method,
        uri: parts.uri.to_string(),
        headers: headers.collect(),
        body: vec![],
        frames: vec![],
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
    };
    let mut framed = vec![0];
    framed.extend_from_slice(&u32::try_from(answer.encoded_len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&answer.encode_to_vec());
    let response = http::Response::builder().header("content-type", "application/grpc");
    let mut send = respond
        .send_response(response.body(()).unwrap(), false)
        .expect("respond");
    let _ = send.send_data(framed.into(), false);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = send.send_trailers(trailers);
}

/// The h2 client's request is the tonic client's, byte for byte: the same pseudo-headers and
/// headers, the same message, in the same DATA frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_h2_client_sends_what_the_tonic_client_sends() {
    let (url, mut seen) = recording_server().await;
    let mut requests = Vec::new();
    for client in ["tonic", "h2"] {
        let args = format!("--scenario retry-delay --client {client} --connections 1");
        let args = format!("{args} --concurrency 1 --warmup 0s --duration 50ms");
        let report = run(&args, &["--target", &url]).await.expect("run");
        assert_eq!(report["errors"], 0, "{client}: {report}");
        requests.push(seen.recv().await.expect("a request"));
        while seen.try_recv().is_ok() {}
    }
    let first = (&requests[0].method, requests[0].frames.len());
    assert_eq!(first, (&http::Method::POST, 2), "{:?}", requests[0]);
    assert_eq!(requests[0], requests[1]);
}
