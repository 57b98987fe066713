//! `--log-format json`: one JSON object a line, and with decision logging
//! on, a decision found by the trace id of the worker's `traceparent`.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::{pb, report, with_tenant};
use pb::retry_budget_client::RetryBudgetClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test]
async fn json_lines_carry_the_decision_and_the_trace_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_retry-budget"))
        .args(["serve", "--listen", "127.0.0.1:0", "--drain-delay", "0s"])
        .args(["--log-format", "json"])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("RETRY_BUDGET_CONFIG")
        .env("RUST_LOG", "info,retry_budget::decision=debug")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut next = async || -> serde_json::Value {
        let line = lines.next_line().await.unwrap().expect("a log line");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    };
    let addr = loop {
        let line = next().await;
        if line["message"] == "serving" {
            break line["addr"].as_str().unwrap().to_owned();
        }
    };
    let mut client = RetryBudgetClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut request = with_tenant(report("charge-1", 1, pb::ErrorClass::Transient), "acme");
    request.metadata_mut().insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap(),
    );
    client.next_action(request).await.unwrap();
    let decision = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let line = next().await;
            if line["message"] == "decision" {
                return line;
            }
        }
    })
    .await
    .expect("the decision is logged");
    assert_eq!(decision["level"], "DEBUG");
    assert_eq!(decision["target"], "retry_budget::decision");
    assert_eq!(decision["method"], "NextAction");
    assert_eq!(decision["tenant"], "acme");
    assert_eq!(decision["activity"], "charge-1");
    assert_eq!(decision["attempt"], 1);
    assert_eq!(decision["code"], "schedule_retry");
    assert_eq!(decision["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
}
