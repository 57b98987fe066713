//! Who asks, over the real binary: each `--auth` mode, each refusal with
//! its gRPC code and `ErrorInfo` reason, `keys add` then its key in use,
//! keys rotated by SIGHUP (a bad file keeping the running keys), the
//! sidecar's header in `mesh` mode, and tenants kept apart: one tenant
//! cannot read, report on, resolve or record success for another's
//! activity, nor spend its share of the bucket.

use crate::common;
use crate::common::binary;

use std::path::Path;

use binary::{free_port, scrape};
use common::{pb, report};
use pb::retry_budget_client::RetryBudgetClient;
use retry_budget::budget::codes;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

const BINARY: &str = env!("CARGO_BIN_EXE_retry-budget");

/// The binary in `api-keys` mode on the keys file `keys`, with its data
/// under `dir` and its metrics on `127.0.0.1:metrics`.
async fn spawn_with_keys(
    dir: &Path,
    keys: &Path,
    metrics: u16,
) -> (Child, String, mpsc::UnboundedReceiver<String>) {
    let metrics = format!("127.0.0.1:{metrics}");
    let keys = keys.to_str().unwrap();
    let flags = [
        "--auth",
        "api-keys",
        "--api-keys-file",
        keys,
        "--metrics-listen",
        &metrics,
    ];
    spawn(&dir.join("data"), &flags).await
}

/// The binary serving on an ephemeral port with `extra` flags: the child,
/// its URL and its log lines.
async fn spawn(data: &Path, extra: &[&str]) -> (Child, String, mpsc::UnboundedReceiver<String>) {
    let mut args = vec!["--data-dir", data.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (child, addr, log) = binary::spawn_logged(&args).await;
    (child, format!("http://{addr}"), log)
}

async fn client(url: &str) -> RetryBudgetClient<Channel> {
    RetryBudgetClient::connect(url.to_owned()).await.unwrap()
}

/// `message` with the given credentials: a bearer key, an `x-tenant-id`,
/// any other header.
fn ask<T>(message: T, key: Option<&str>, headers: &[(&'static str, &str)]) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    for (name, value) in headers {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    request
}

/// The gRPC code and the `ErrorInfo` reason of a refusal, checking that
/// the message starts with the reason.
fn refusal<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
) -> (Code, String) {
    let status = result.expect_err("refused");
    let info = status
        .get_error_details()
        .error_info()
        .cloned()
        .expect("an ErrorInfo");
    assert_eq!(info.domain, "retrybudget.v1");
    assert!(
        status.message().starts_with(&format!("{}: ", info.reason)),
        "{status:?}"
    );
    (status.code(), info.reason)
}

/// Requests carrying one API key.
#[derive(Clone, Copy)]
struct Key<'a>(&'a str);

impl Key<'_> {
    fn ask<T>(self, message: T) -> tonic::Request<T> {
        ask(message, Some(self.0), &[])
    }
}

async fn health(url: &str) -> HealthClient<Channel> {
    let channel = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

fn get(id: &str) -> pb::GetActivityRequest {
    pb::GetActivityRequest {
        activity_id: id.into(),
    }
}

/// `retry-budget keys add TENANT --api-keys-file FILE`: the key it prints.
async fn keys_add(file: &Path, tenant: &str) -> String {
    let output = Command::new(BINARY)
        .args(["keys", "add", tenant, "--api-keys-file"])
        .arg(file)
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let key = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    assert!(key.starts_with("rb_"), "{key}");
    key
}

async fn hangup(child: &Child, log: &mut mpsc::UnboundedReceiver<String>) -> String {
    binary::hangup(child, log, &["configuration reloaded", "reload refused"]).await
}

/// The value of the sample `name` in a scrape, 0 when absent.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn none_trusts_the_header_refuses_an_empty_one_and_may_require_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, url, _log) = spawn(dir.path(), &[]).await;
    let mut rb = client(&url).await;
    let first = report("n-1", 1, pb::ErrorClass::Transient);
    let answer = rb.next_action(ask(first.clone(), None, &[])).await.unwrap();
    assert_eq!(answer.into_inner().code, codes::SCHEDULE_RETRY);
    // An absent header is the default tenant, named.
    let found = rb
        .get_activity(ask(get("n-1"), None, &[("x-tenant-id", "default")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.tenant, "default");
    // An empty one names nobody: refused, nothing stored.
    assert_eq!(
        refusal(
            rb.next_action(ask(
                report("n-2", 1, pb::ErrorClass::Transient),
                None,
                &[("x-tenant-id", "")]
            ))
            .await
        ),
        (Code::InvalidArgument, codes::INVALID_TENANT.to_owned())
    );
    assert_eq!(
        refusal(rb.get_activity(ask(get("n-2"), None, &[])).await),
        (Code::NotFound, codes::ACTIVITY_NOT_FOUND.to_owned())
    );

    let required_dir = tempfile::tempdir().unwrap();
    let (_child, url, _log) = spawn(required_dir.path(), &["--default-tenant", ""]).await;
    let mut rb = client(&url).await;
    assert_eq!(
        refusal(rb.next_action(ask(first.clone(), None, &[])).await),
        (Code::InvalidArgument, codes::TENANT_REQUIRED.to_owned())
    );
    rb.next_action(ask(first, None, &[("x-tenant-id", "acme")]))
        .await
        .unwrap();
    let mut health = health(&url).await;
    health.check(HealthCheckRequest::default()).await.unwrap();
}

#[tokio::test]
async fn api_keys_prove_the_tenant_and_each_refusal_has_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let acme = keys_add(&keys, "acme").await;
    let globex = keys_add(&keys, "globex").await;
    let listed = Command::new(BINARY)
        .args(["keys", "list", "--api-keys-file"])
        .arg(&keys)
        .output()
        .await
        .unwrap();
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(
        listed.contains("acme") && listed.contains("globex"),
        "{listed}"
    );
    assert!(
        !listed.contains(&acme[3..]) && !listed.contains(&globex[3..]),
        "{listed}"
    );

    let data = dir.path().join("data");
    let keys_flag = keys.to_str().unwrap();
    let (_child, url, _log) =
        spawn(&data, &["--auth", "api-keys", "--api-keys-file", keys_flag]).await;
    let mut rb = client(&url).await;
    let unauthenticated = (Code::Unauthenticated, codes::UNAUTHENTICATED.to_owned());
    let wrong = format!("rb_{}", "A".repeat(43));
    for (key, headers) in [
        (None, vec![]),
        (None, vec![("x-tenant-id", "acme")]),
        (Some(wrong.as_str()), vec![]),
        (Some(&acme[..acme.len() - 1]), vec![]),
    ] {
        assert_eq!(
            refusal(rb.get_activity(ask(get("a-1"), key, &headers)).await),
            unauthenticated,
            "{key:?} {headers:?}"
        );
    }
    let answer = rb
        .next_action(ask(
            report("a-1", 1, pb::ErrorClass::Transient),
            Some(&acme),
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(answer.into_inner().code, codes::SCHEDULE_RETRY);
    let record = rb
        .get_activity(ask(get("a-1"), Some(&acme), &[("x-tenant-id", "acme")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.tenant, "acme");
    assert_eq!(
        refusal(
            rb.get_activity(ask(get("a-1"), Some(&acme), &[("x-tenant-id", "globex")]))
                .await
        ),
        (Code::PermissionDenied, codes::TENANT_MISMATCH.to_owned())
    );
    assert_eq!(
        refusal(
            rb.get_activity(ask(get("a-1"), Some(&acme), &[("x-tenant-id", "")]))
                .await
        ),
        (Code::InvalidArgument, codes::INVALID_TENANT.to_owned())
    );
    // Health (and reflection) stay open.
    let mut health = health(&url).await;
    health.check(HealthCheckRequest::default()).await.unwrap();

    // The CLI sends its key as the bearer.
    let explain = |key: Option<&str>| {
        let mut command = Command::new(BINARY);
        command
            .args(["explain", "a-1", "--tenant", "acme", "--server", &url])
            .env_remove("RETRY_BUDGET_API_KEY");
        if let Some(key) = key {
            command.env("RETRY_BUDGET_API_KEY", key);
        }
        command.output()
    };
    let shown = explain(Some(&acme)).await.unwrap();
    assert!(shown.status.success(), "{shown:?}");
    assert!(String::from_utf8_lossy(&shown.stdout).contains("activity  a-1 (tenant acme)"));
    let refused = explain(None).await.unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unauthenticated"));
}

#[tokio::test]
async fn a_tenant_cannot_read_report_on_resolve_succeed_or_spend_for_another() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let acme = keys_add(&keys, "acme").await;
    let globex = keys_add(&keys, "globex").await;
    let metrics = free_port();
    let (_child, url, _log) = spawn_with_keys(dir.path(), &keys, metrics).await;
    let mut rb = client(&url).await;
    let a = Key(&acme);
    let b = Key(&globex);

    // acme: an activity waiting for its retry, and one parked for review.
    rb.next_action(a.ask(report("pay-1", 1, pb::ErrorClass::Transient)))
        .await
        .unwrap();
    let parked = rb
        .next_action(a.ask(report("pay-2", 1, pb::ErrorClass::Unknown)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(parked.code, codes::MANUAL_REVIEW);
    let before = [
        rb.get_activity(a.ask(get("pay-1")))
            .await
            .unwrap()
            .into_inner(),
        rb.get_activity(a.ask(get("pay-2")))
            .await
            .unwrap()
            .into_inner(),
    ];
    let tokens = |text: &str, tenant: &str| {
        sample(
            text,
            &format!("retry_budget_tenant_tokens{{tenant=\"{tenant}\"}}"),
        )
    };
    let acme_tokens = tokens(&scrape(metrics).await, "acme");
    assert!(acme_tokens > 0.0, "acme's retry took a token");

    // globex, asking about acme's ids, is answered exactly as for ids that
    // do not exist.
    let missing = refusal(rb.get_activity(b.ask(get("nobody"))).await);
    assert_eq!(
        missing,
        (Code::NotFound, codes::ACTIVITY_NOT_FOUND.to_owned())
    );
    for id in ["pay-1", "pay-2"] {
        assert_eq!(
            refusal(rb.get_activity(b.ask(get(id))).await),
            missing,
            "{id}"
        );
    }
    let resolve = |id: &str| pb::ResolveActivityRequest {
        activity_id: id.into(),
        resolution: pb::Resolution::Retry as i32,
        note: "not mine".into(),
    };
    let resolve_missing = refusal(rb.resolve_activity(b.ask(resolve("nobody"))).await);
    assert_eq!(
        refusal(rb.resolve_activity(b.ask(resolve("pay-2"))).await),
        resolve_missing
    );
    let success = |id: &str| pb::RecordSuccessRequest {
        activity_id: id.into(),
        ..Default::default()
    };
    let success_missing = rb
        .record_success(b.ask(success("nobody")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        success_missing.status,
        pb::ActivityStatus::Unspecified as i32
    );
    for id in ["pay-1", "pay-2"] {
        let answer = rb
            .record_success(b.ask(success(id)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer, success_missing, "{id}");
    }
    // A report on acme's id starts globex's own activity: not a replay of
    // acme's attempt, and its retry is charged to globex.
    let own = rb
        .next_action(b.ask(report("pay-1", 1, pb::ErrorClass::Transient)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (own.code.as_str(), own.replayed),
        (codes::SCHEDULE_RETRY, false)
    );
    let theirs = rb
        .get_activity(b.ask(get("pay-1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((theirs.tenant.as_str(), theirs.events.len()), ("globex", 1));
    // Naming acme does not make globex acme: refused before the bucket.
    assert_eq!(
        refusal(
            rb.next_action(ask(
                report("pay-3", 1, pb::ErrorClass::Transient),
                Some(&globex),
                &[("x-tenant-id", "acme")]
            ))
            .await
        ),
        (Code::PermissionDenied, codes::TENANT_MISMATCH.to_owned())
    );

    let after = [
        rb.get_activity(a.ask(get("pay-1")))
            .await
            .unwrap()
            .into_inner(),
        rb.get_activity(a.ask(get("pay-2")))
            .await
            .unwrap()
            .into_inner(),
    ];
    assert_eq!(after, before, "acme's activities are untouched");
    let text = scrape(metrics).await;
    assert_eq!(
        tokens(&text, "acme"),
        acme_tokens,
        "acme's share was not spent"
    );
    assert!(
        tokens(&text, "globex") > 0.0,
        "globex paid for its own retry"
    );
}

#[tokio::test]
async fn sighup_rotates_keys_and_a_bad_file_keeps_the_running_ones() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let old = keys_add(&keys, "acme").await;
    let metrics = free_port();
    let (child, url, mut log) = spawn_with_keys(dir.path(), &keys, metrics).await;
    let mut rb = client(&url).await;
    let works = |key: &str| ask(report("r-1", 1, pb::ErrorClass::Transient), Some(key), &[]);
    rb.next_action(works(&old)).await.unwrap();

    // A second key of the same tenant: unknown until the reload, then both
    // work (the overlap that lets clients move without a restart).
    let new = keys_add(&keys, "acme").await;
    assert_eq!(
        refusal(rb.next_action(works(&new)).await).0,
        Code::Unauthenticated
    );
    assert!(
        hangup(&child, &mut log)
            .await
            .contains("configuration reloaded")
    );
    rb.next_action(works(&new)).await.unwrap();
    rb.next_action(works(&old)).await.unwrap();

    // The old key removed.
    let text = std::fs::read_to_string(&keys).unwrap();
    let kept: String = text.lines().skip(1).map(|l| format!("{l}\n")).collect();
    std::fs::write(&keys, kept).unwrap();
    assert!(
        hangup(&child, &mut log)
            .await
            .contains("configuration reloaded")
    );
    assert_eq!(
        refusal(rb.next_action(works(&old)).await).0,
        Code::Unauthenticated
    );
    rb.next_action(works(&new)).await.unwrap();

    // A bad file: refused with its line, counted, and the keys stay.
    std::fs::write(
        &keys,
        format!("{}\nacme:not-a-digest\n", text.lines().nth(1).unwrap()),
    )
    .unwrap();
    let refused = hangup(&child, &mut log).await;
    assert!(
        refused.contains("reload refused") && refused.contains("line 2"),
        "{refused}"
    );
    rb.next_action(works(&new)).await.unwrap();
    let scraped = scrape(metrics).await;
    assert_eq!(
        sample(
            &scraped,
            "retry_budget_config_reloads_total{result=\"failed\"}"
        ),
        1.0,
        "{scraped}"
    );
}

#[tokio::test]
async fn a_bad_keys_file_stops_the_server_at_start_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "# tenants\nacme:0123\n").unwrap();
    let output = Command::new(BINARY)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--auth",
            "api-keys",
            "--api-keys-file",
        ])
        .arg(&keys)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env_remove("RETRY_BUDGET_CONFIG")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("config_invalid") && stderr.contains("line 2"),
        "{stderr}"
    );
}

#[tokio::test]
async fn mesh_believes_the_sidecars_header_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, url, _log) = spawn(
        dir.path(),
        &[
            "--auth",
            "mesh",
            "--identity-pattern",
            "spiffe://cluster.local/ns/{tenant}/sa/*",
            "--mesh-header",
            "x-forwarded-client-cert",
        ],
    )
    .await;
    let mut rb = client(&url).await;
    let xfcc = |namespace: &str| {
        format!(
            "By=spiffe://cluster.local/ns/rb/sa/retry-budget;Hash=00;\
             URI=spiffe://cluster.local/ns/{namespace}/sa/worker"
        )
    };
    let acme = xfcc("acme");
    let from = |header: &str| {
        ask(
            report("m-1", 1, pb::ErrorClass::Transient),
            None,
            &[("x-forwarded-client-cert", header)],
        )
    };
    rb.next_action(from(&acme)).await.unwrap();
    let record = rb
        .get_activity(ask(get("m-1"), None, &[("x-forwarded-client-cert", &acme)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.tenant, "acme");
    assert_eq!(
        refusal(
            rb.get_activity(ask(get("m-1"), None, &[("x-tenant-id", "acme")]))
                .await
        ),
        (Code::Unauthenticated, codes::UNAUTHENTICATED.to_owned())
    );
    assert_eq!(
        refusal(
            rb.next_action(from("URI=spiffe://elsewhere/ns/acme/sa/w"))
                .await
        ),
        (
            Code::PermissionDenied,
            codes::IDENTITY_NOT_MAPPED.to_owned()
        )
    );
    assert_eq!(
        refusal(
            rb.get_activity(ask(
                get("m-1"),
                None,
                &[
                    ("x-forwarded-client-cert", &acme),
                    ("x-tenant-id", "globex")
                ]
            ))
            .await
        ),
        (Code::PermissionDenied, codes::TENANT_MISMATCH.to_owned())
    );
    // Another namespace is another tenant.
    assert_eq!(
        refusal(
            rb.get_activity(ask(
                get("m-1"),
                None,
                &[("x-forwarded-client-cert", &xfcc("globex"))]
            ))
            .await
        )
        .0,
        Code::NotFound
    );
}
