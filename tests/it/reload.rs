//! SIGHUP reloads the configuration file into the running binary: the
//! bucket's rate, burst and mode, classification rules; tokens granted and
//! slots booked before it survive; a bad file keeps the running
//! configuration, says which key is at fault, and is counted.

use crate::common;
use crate::common::binary;

use std::path::Path;
use std::time::Duration;

use binary::{free_port, scrape};
use common::{pb, report, with_tenant};
use pb::retry_budget_client::RetryBudgetClient;
use tokio::process::Child;
use tokio::sync::mpsc;

const NARROW: &str = "[bucket]\nrate = 1.0\nburst = 1\nmax_reservation_ms = 60000\n";

/// The binary on `config`, its URL, and its log lines.
async fn spawn(
    config: &Path,
    data: &Path,
    metrics: u16,
) -> (Child, String, mpsc::UnboundedReceiver<String>) {
    let (child, addr, log) = binary::spawn_configured(config, data, metrics).await;
    (child, format!("http://{addr}"), log)
}

/// Sends SIGHUP and waits for the log line that says how it went.
async fn hangup(child: &Child, log: &mut mpsc::UnboundedReceiver<String>) -> String {
    binary::hangup(child, log, &["configuration reloaded", "reload refused"]).await
}

fn ask(id: &str) -> tonic::Request<pb::NextActionRequest> {
    with_tenant(report(id, 1, pb::ErrorClass::Transient), "acme")
}

#[tokio::test]
async fn sighup_reloads_the_bucket_and_rules_and_a_bad_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, NARROW).unwrap();
    let port = free_port();
    let (child, url, mut log) = spawn(&config, &dir.path().join("data"), port).await;
    let mut client = RetryBudgetClient::connect(url).await.unwrap();

    // One token: the second retry is deferred, a slot booked for it.
    let a = client.next_action(ask("a")).await.unwrap().into_inner();
    assert_eq!(a.action, pb::Action::ScheduleRetry as i32);
    let b = client.next_action(ask("b")).await.unwrap().into_inner();
    assert_eq!(b.action, pb::Action::Deferred as i32, "{b:?}");
    assert!(b.slot_booked && !b.token_taken, "a slot is booked: {b:?}");

    // A wide bucket and a rule that makes a 409 permanent.
    std::fs::write(
        &config,
        "[bucket]\nrate = 1000.0\nburst = 1000\nmax_reservation_ms = 60000\n\n\
         [[classification.rules]]\nname = \"conflict_is_permanent\"\nhttp_status = 409\nclass = \"permanent\"\n",
    )
    .unwrap();
    let said = hangup(&child, &mut log).await;
    assert!(said.contains("configuration reloaded"), "{said}");
    // The bucket does not fill to its new burst at once: it refills at the
    // new rate. "b" holds the oldest place in line: asked again at its
    // not_before, its turn comes at the new rate; then a fresh failure
    // finds no line ahead of it.
    let at = common::ms(b.not_before.as_ref().expect("a deferral says when"));
    let wait = (at - retry_budget::clock::now_ms()).max(0) as u64 + 20;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let b = client.next_action(ask("b")).await.unwrap().into_inner();
    assert_eq!(
        b.action,
        pb::Action::ScheduleRetry as i32,
        "b's turn at the new rate: {b:?}"
    );
    let c = client.next_action(ask("c")).await.unwrap().into_inner();
    assert_eq!(
        c.action,
        pb::Action::ScheduleRetry as i32,
        "the new rate: {c:?}"
    );
    let mut conflict = report("d", 1, pb::ErrorClass::Unspecified);
    conflict.error = Some(pb::ErrorDetail {
        http_status: 409,
        ..Default::default()
    });
    let d = client
        .next_action(with_tenant(conflict, "acme"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (d.code.as_str(), d.rule.as_str()),
        ("fail_permanent", "conflict_is_permanent")
    );
    // Asked again, b's grant replays as it was: one token, taken once.
    let b_again = client.next_action(ask("b")).await.unwrap().into_inner();
    assert_eq!(
        b_again.action,
        pb::Action::ScheduleRetry as i32,
        "{b_again:?}"
    );
    assert!(b_again.replayed && !b_again.token_taken, "{b_again:?}");

    // A file that does not validate: refused, naming the key; nothing changes.
    std::fs::write(&config, "[bucket]\nrate = -5.0\n").unwrap();
    let said = hangup(&child, &mut log).await;
    assert!(
        said.contains("reload refused") && said.contains("bucket"),
        "{said}"
    );
    let e = client.next_action(ask("e")).await.unwrap().into_inner();
    assert_eq!(
        e.action,
        pb::Action::ScheduleRetry as i32,
        "still the wide bucket: {e:?}"
    );

    let text = scrape(port).await;
    assert!(
        text.contains("retry_budget_config_reloads_total{result=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("retry_budget_config_reloads_total{result=\"failed\"} 1"),
        "{text}"
    );
    assert!(text.contains("retry_budget_bucket_rate 1000"), "{text}");
}
