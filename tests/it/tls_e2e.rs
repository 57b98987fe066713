//! TLS and mutual TLS on the gRPC port, with certificates made here: a
//! plaintext client or one trusting another CA gets nowhere; under mutual
//! TLS a client needs a certificate from the configured CA; a new
//! certificate (files changed, or SIGHUP) is served to new connections
//! while open ones keep working, and a bad one keeps the running one.

use crate::common;
use crate::common::binary;
use crate::common::tls;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use binary::{free_port, scrape};
use common::{TestServer, pb, report, with_tenant};
use pb::retry_budget_client::RetryBudgetClient;
use tls::{Ca, OneConnection, Pair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn ask(id: &str) -> tonic::Request<pb::NextActionRequest> {
    with_tenant(report(id, 1, pb::ErrorClass::Transient), "acme")
}

/// A NextAction on `client` that must succeed.
macro_rules! decide {
    ($client:expr, $id:expr) => {{
        let answer = $client.next_action(ask($id)).await.expect("a decision");
        assert_eq!(answer.into_inner().action, pb::Action::ScheduleRetry as i32);
    }};
}

/// A gRPC client on exactly one connection (see `tls::OneConnection`).
async fn one_connection(
    addr: SocketAddr,
    ca: &Ca,
    client: Option<&Pair>,
) -> RetryBudgetClient<OneConnection> {
    RetryBudgetClient::with_origin(
        OneConnection::open(addr, &ca.pem(), client).await,
        "https://localhost".parse().unwrap(),
    )
}

/// What the server answers on a connection that completed its handshake:
/// the first read after the HTTP/2 preface.
async fn first_read(addr: SocketAddr, ca: &Ca, client: Option<&Pair>) -> std::io::Result<usize> {
    let mut stream = tls::connect(addr, &ca.pem(), client).await?;
    stream.write_all(PREFACE).await?;
    stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await?;
    let mut buf = [0u8; 64];
    stream.read(&mut buf).await
}

/// A server on `ca`'s certificate "server-1" (serial 1), written into
/// `dir` as `server.crt` and `server.key`. With `mutual`, `ca` is also the
/// client CA, written as `ca.crt`, so a client needs a certificate it
/// signed. `more` sets the rest of the configuration.
async fn tls_server(
    dir: &Path,
    ca: &Ca,
    mutual: bool,
    more: impl FnOnce(&mut retry_budget::config::Config),
) -> TestServer {
    let (cert, key) = ca.server("server-1", 1).write(dir, "server");
    let client_ca = mutual.then(|| {
        let path = dir.join("ca.crt");
        std::fs::write(&path, ca.pem()).unwrap();
        path
    });
    TestServer::start_with(|c| {
        c.tls.cert = Some(cert);
        c.tls.key = Some(key);
        c.tls.client_ca = client_ca;
        more(c);
    })
    .await
}

/// Waits (at most 10 s) until new connections are served `serial`.
async fn until_served(addr: SocketAddr, ca: &Ca, serial: &str) -> tls::Served {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let served = tls::served(addr, &ca.pem()).await;
        if served.serial == serial {
            return served;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still serving {served:?}, not serial {serial}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn tls_serves_grpc_and_a_plaintext_client_or_another_ca_gets_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let server = tls_server(dir.path(), &ca, false, |_| {}).await;

    let channel = tls::channel(server.addr, &ca.pem(), None).await.unwrap();
    decide!(RetryBudgetClient::new(channel), "over-tls");
    let served = tls::served(server.addr, &ca.pem()).await;
    assert_eq!(served.serial, "01");
    assert!(served.subject.contains("CN=server-1"), "{served:?}");

    // Plaintext HTTP/2 to a TLS port: no call gets through.
    let plaintext = async {
        let channel = tonic::transport::Endpoint::from_shared(server.url())
            .unwrap()
            .connect()
            .await?;
        RetryBudgetClient::new(channel)
            .next_action(ask("plaintext"))
            .await
            .map_err(Into::into)
    };
    let plaintext: Result<_, Box<dyn std::error::Error>> = plaintext.await;
    assert!(plaintext.is_err(), "{plaintext:?}");
    let other = Ca::new("another CA");
    assert!(tls::connect(server.addr, &other.pem(), None).await.is_err());

    // Nothing of the refused calls was stored.
    let mut client =
        RetryBudgetClient::new(tls::channel(server.addr, &ca.pem(), None).await.unwrap());
    let missing = client
        .get_activity(with_tenant(
            pb::GetActivityRequest {
                activity_id: "plaintext".into(),
            },
            "acme",
        ))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn mutual_tls_takes_only_clients_certified_by_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let server = tls_server(dir.path(), &ca, true, |_| {}).await;
    let worker = ca.client("spiffe://example.org/ns/payments/sa/worker");

    let channel = tls::channel(server.addr, &ca.pem(), Some(&worker))
        .await
        .unwrap();
    decide!(RetryBudgetClient::new(channel), "with-certificate");
    assert!(first_read(server.addr, &ca, Some(&worker)).await.unwrap() > 0);

    // Without a certificate, or with one another CA signed: the server
    // ends the handshake with an alert (TLS 1.3 lets the client finish its
    // side first, so the alert is what its first read gets).
    let stranger = Ca::new("another CA").client("spiffe://example.org/ns/payments/sa/worker");
    for (client, alert) in [
        (None, "CertificateRequired"),
        (Some(&stranger), "UnknownCA"),
    ] {
        let refused = first_read(server.addr, &ca, client).await;
        let error = refused.expect_err("the handshake is refused");
        assert!(error.to_string().contains(alert), "{alert}: {error}");
        let call = match tls::channel(server.addr, &ca.pem(), client).await {
            Ok(channel) => RetryBudgetClient::new(channel)
                .next_action(ask("without"))
                .await
                .map(|_| ()),
            Err(_) => Err(tonic::Status::unavailable("no connection")),
        };
        assert!(call.is_err(), "{alert}: {call:?}");
    }
}

#[tokio::test]
async fn a_stalled_handshake_delays_nobody_and_is_closed_at_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let server = tls_server(dir.path(), &ca, false, |c| {
        c.tls.handshake_timeout = Duration::from_millis(500);
    })
    .await;
    // A client that opens its handshake and says no more.
    let mut stalled = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let channel = tls::channel(server.addr, &ca.pem(), None).await.unwrap();
    decide!(RetryBudgetClient::new(channel), "not-delayed");
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(10), stalled.read(&mut buf))
        .await
        .expect("the server closes a handshake past its timeout");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
}

#[tokio::test]
async fn a_changed_certificate_goes_to_new_connections_and_open_ones_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let metrics = free_port();
    let server = tls_server(dir.path(), &ca, false, |c| {
        c.tls.watch_interval = Duration::from_millis(100);
        c.metrics.listen = Some(SocketAddr::from(([127, 0, 0, 1], metrics)));
    })
    .await;
    let mut open = one_connection(server.addr, &ca, None).await;
    decide!(open, "before");
    // A call in flight across the swap: health's Watch stream.
    let mut health =
        tonic_health::pb::health_client::HealthClient::new(open_channel(&server, &ca).await);
    let mut watch = health
        .watch(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(watch.message().await.unwrap().is_some());

    let renewed = ca.server("server-2", 2);
    renewed.write(dir.path(), "server");
    let served = until_served(server.addr, &ca, "02").await;
    assert!(served.subject.contains("CN=server-2"), "{served:?}");
    decide!(open, "after");
    let text = scrape(metrics).await;
    assert!(
        text.contains(
            "retry_budget_tls_certificate_expiry_timestamp_seconds{serial=\"02\"} 3786912000"
        ),
        "{text}"
    );

    // A certificate whose key is not its own, then one that is not PEM:
    // each refused, the running certificate kept.
    // (The rotation above wrote the certificate, then the key: a look in
    // between may have counted a failure already.)
    let stray = ca.server("server-3", 3);
    for bad in [stray.cert.as_str(), "not a certificate"] {
        let failed = reloads(metrics, "failed").await;
        std::fs::write(dir.path().join("server.crt"), bad).unwrap();
        until_counted(metrics, "failed", failed + 1).await;
    }
    assert_eq!(tls::served(server.addr, &ca.pem()).await.serial, "02");
    decide!(open, "still");
    // The stream opened before both swaps is still there: the drain's
    // NOT_SERVING reaches it.
    let mut server = server;
    server.signal_shutdown();
    let end = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("the drain is told");
    let status = end.expect("the stream is open").expect("a message").status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::NotServing as i32
    );
}

/// A tonic channel over TLS to `server`.
async fn open_channel(server: &TestServer, ca: &Ca) -> tonic::transport::Channel {
    tls::channel(server.addr, &ca.pem(), None).await.unwrap()
}

#[tokio::test]
async fn sighup_reloads_the_certificate_and_a_bad_one_keeps_the_running_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.server("server-1", 1).write(dir.path(), "server");
    let config = dir.path().join("config.toml");
    // The watch is slow here: only SIGHUP reloads within the test.
    std::fs::write(
        &config,
        format!(
            "[tls]\ncert = {cert:?}\nkey = {key:?}\nwatch_interval = \"1h\"\n",
            cert = cert.display().to_string(),
            key = key.display().to_string()
        ),
    )
    .unwrap();
    let metrics = free_port();
    let (child, addr, mut log) =
        binary::spawn_configured(&config, &dir.path().join("data"), metrics).await;
    let addr: SocketAddr = addr.parse().unwrap();
    let mut open = one_connection(addr, &ca, None).await;
    decide!(open, "before");

    ca.server("server-2", 2).write(dir.path(), "server");
    assert_eq!(
        tls::served(addr, &ca.pem()).await.serial,
        "01",
        "not before SIGHUP"
    );
    let said = hangup(&child, &mut log).await;
    assert!(said.contains("TLS certificate reloaded"), "{said}");
    assert!(said.contains("CN=server-2"), "{said}");
    let served = tls::served(addr, &ca.pem()).await;
    assert_eq!(served.serial, "02");
    decide!(open, "after");

    std::fs::write(&cert, ca.server("server-3", 3).cert).unwrap();
    let said = hangup(&child, &mut log).await;
    assert!(said.contains("TLS reload refused"), "{said}");
    assert_eq!(tls::served(addr, &ca.pem()).await.serial, "02");
    decide!(open, "still");

    let text = scrape(metrics).await;
    for line in [
        "retry_budget_tls_reloads_total{result=\"ok\"} 1",
        "retry_budget_tls_reloads_total{result=\"failed\"} 1",
        "retry_budget_tls_certificate_expiry_timestamp_seconds{serial=\"02\"} 3786912000",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// `retry_budget_tls_reloads_total{result}` on the metrics at `port`.
async fn reloads(port: u16, result: &str) -> u64 {
    let prefix = format!("retry_budget_tls_reloads_total{{result=\"{result}\"}} ");
    scrape(port)
        .await
        .lines()
        .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0)
}

/// Waits (at most 10 s) until `reloads(port, result)` reaches `count`.
async fn until_counted(port: u16, result: &str, count: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = reloads(port, result).await;
        if now >= count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{result} reloads: {now}, not {count}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends SIGHUP and waits for the log line that says how the TLS reload
/// went.
async fn hangup(child: &Child, log: &mut mpsc::UnboundedReceiver<String>) -> String {
    binary::hangup(
        child,
        log,
        &["TLS certificate reloaded", "TLS reload refused"],
    )
    .await
}

#[tokio::test]
async fn the_cli_reaches_a_mutual_tls_server_with_the_same_options() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let server = tls_server(dir.path(), &ca, true, |_| {}).await;
    let ca_file = dir.path().join("ca.crt");
    let worker = ca.client("spiffe://example.org/ns/payments/sa/worker");
    let (worker_cert, worker_key) = worker.write(dir.path(), "worker");
    let channel = tls::channel(server.addr, &ca.pem(), Some(&worker))
        .await
        .unwrap();
    decide!(RetryBudgetClient::new(channel), "explained");

    // The server runs on this test's runtime: the command is awaited, not
    // waited for.
    let explain = |extra: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_retry-budget"));
        command
            .args(["explain", "explained", "--tenant", "acme", "--server"])
            .arg(server.url())
            .arg("--tls-ca")
            .arg(&ca_file)
            .args(extra)
            .env_remove("RETRY_BUDGET_SERVER")
            .kill_on_drop(true);
        async move { command.output().await.unwrap() }
    };
    let cert_args = [
        "--tls-cert",
        worker_cert.to_str().unwrap(),
        "--tls-key",
        worker_key.to_str().unwrap(),
    ];
    let shown = explain(&cert_args).await;
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{shown:?}");
    assert!(text.contains("activity  explained (tenant acme)"), "{text}");
    let named = explain(&[&cert_args[..], &["--tls-server-name", "localhost"]].concat()).await;
    assert!(named.status.success(), "{named:?}");
    let refused = explain(&[]).await;
    assert!(
        !refused.status.success(),
        "no client certificate: {refused:?}"
    );
    let wrong_name = explain(&[&cert_args[..], &["--tls-server-name", "elsewhere"]].concat()).await;
    let said = String::from_utf8_lossy(&wrong_name.stderr);
    assert!(!wrong_name.status.success(), "{wrong_name:?}");
    assert!(
        said.contains("cannot reach") || said.contains("Unavailable"),
        "{said}"
    );
}

#[tokio::test]
async fn past_max_connections_a_tls_client_reads_too_many_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let server = tls_server(dir.path(), &ca, false, |c| {
        c.server.max_connections = 1;
    })
    .await;
    let mut first = RetryBudgetClient::new(open_channel(&server, &ca).await);
    decide!(first, "first");
    let mut excess = RetryBudgetClient::new(open_channel(&server, &ca).await);
    let refused = excess.next_action(ask("excess")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().starts_with("too_many_connections: "),
        "{refused:?}"
    );
    decide!(first, "still-served");
}

/// `mesh` mode over mutual TLS: the tenant is the one the client
/// certificate's SPIFFE ID names through `auth.identity_pattern`; another
/// workload's activities do not exist for it, an `x-tenant-id` cannot
/// claim another tenant, and an identity the pattern does not map is
/// refused.
#[tokio::test]
async fn mesh_mode_takes_the_tenant_from_the_client_certificates_spiffe_id() {
    use tonic_types::StatusExt;

    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("mesh CA");
    let server = tls_server(dir.path(), &ca, true, |c| {
        c.auth.mode = retry_budget::auth::AuthMode::Mesh;
        c.auth.identity_pattern = Some("spiffe://example.org/ns/{tenant}/sa/*".to_owned());
    })
    .await;
    let client = |spiffe: &str| {
        let pair = ca.client(spiffe);
        let addr = server.addr;
        let pem = ca.pem();
        async move { RetryBudgetClient::new(tls::channel(addr, &pem, Some(&pair)).await.unwrap()) }
    };
    let get = |id: &str| pb::GetActivityRequest {
        activity_id: id.to_owned(),
    };
    let reason = |status: &tonic::Status| {
        status
            .get_error_details()
            .error_info()
            .map(|i| i.reason.clone())
            .unwrap_or_default()
    };

    let mut payments = client("spiffe://example.org/ns/payments/sa/worker").await;
    let decided = payments
        .next_action(report("charge-1", 1, pb::ErrorClass::Transient))
        .await
        .expect("the certificate's tenant decides")
        .into_inner();
    assert_eq!(decided.action, pb::Action::ScheduleRetry as i32);
    let seen = payments.get_activity(get("charge-1")).await.unwrap();
    assert_eq!(seen.into_inner().attempts, 1);

    // Another workload's certificate: the activity does not exist for it.
    let mut shipping = client("spiffe://example.org/ns/shipping/sa/worker").await;
    let hidden = shipping.get_activity(get("charge-1")).await.unwrap_err();
    let missing = shipping.get_activity(get("never-was")).await.unwrap_err();
    assert_eq!(hidden.code(), tonic::Code::NotFound);
    assert_eq!(reason(&hidden), reason(&missing));

    // A header cannot claim the other tenant over the certificate.
    let claimed = shipping
        .get_activity(with_tenant(get("charge-1"), "payments"))
        .await
        .unwrap_err();
    assert_eq!(claimed.code(), tonic::Code::PermissionDenied);
    assert_eq!(reason(&claimed), "tenant_mismatch");

    // A certificate the pattern does not map proves no tenant here.
    let mut stranger = client("spiffe://other.org/ns/payments/sa/worker").await;
    let refused = stranger
        .next_action(report("charge-1", 2, pb::ErrorClass::Transient))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert_eq!(reason(&refused), "identity_not_mapped");
    let after = payments.get_activity(get("charge-1")).await.unwrap();
    assert_eq!(after.into_inner().attempts, 1, "nothing stored changed");
}
