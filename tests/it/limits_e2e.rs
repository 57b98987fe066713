//! The bounds on what a client controls, over loopback: connections past
//! `max_connections` are answered `too_many_connections` (health still
//! answers) and room comes back; the streams past `max_concurrent_streams`
//! are refused by HTTP/2 itself; headers past `max_header_list_size` are
//! refused; a call past `request_timeout` ends `request_timeout`. No
//! refusal stores anything.

use crate::common;
use crate::common::postgres;

use std::net::SocketAddr;
use std::time::Duration;

use common::{TestServer, pb, report, with_tenant};
use pb::retry_budget_client::RetryBudgetClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;
use tonic_types::StatusExt;

fn ask(id: &str) -> tonic::Request<pb::NextActionRequest> {
    with_tenant(report(id, 1, pb::ErrorClass::Transient), "acme")
}

/// The activity `id` of tenant acme is not stored.
async fn not_stored(client: &mut RetryBudgetClient<tonic::transport::Channel>, id: &str) {
    let status = client
        .get_activity(with_tenant(
            pb::GetActivityRequest {
                activity_id: id.into(),
            },
            "acme",
        ))
        .await
        .expect_err("nothing stored");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

/// The stable code and metadata of a refusal.
fn reason(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

#[tokio::test]
async fn past_max_connections_calls_get_too_many_connections_and_room_comes_back() {
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let server = TestServer::start_with(|c| {
        c.server.max_connections = 1;
        c.metrics.listen = Some(metrics);
    })
    .await;
    let first = server.channel().await;
    let mut served = RetryBudgetClient::new(first.clone());
    served.next_action(ask("first")).await.unwrap();

    let mut excess = RetryBudgetClient::new(server.channel().await);
    let refused = excess.next_action(ask("excess")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().starts_with("too_many_connections: "),
        "{refused:?}"
    );
    assert_eq!(reason(&refused), "too_many_connections");
    let wait = refused.get_details_retry_info().expect("RetryInfo");
    assert_eq!(wait.retry_delay, Some(Duration::from_secs(1)));
    assert_eq!(
        refused
            .metadata()
            .get("grpc-retry-pushback-ms")
            .map(|v| v.to_str().unwrap()),
        Some("1000")
    );
    not_stored(&mut served, "excess").await;
    let text = scrape(metrics).await;
    assert!(
        text.contains("retry_budget_connections_refused_total 1"),
        "{text}"
    );

    // Health is answered on such a connection: a full replica is alive.
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers past max_connections")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    // The first connection closed, a new one is served. (Until the server
    // has seen it close, a new connection is refused, or closed at once
    // while the health check's still holds the one place for refusals.)
    drop((served, first, health));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = match tonic::transport::Endpoint::from_shared(server.url())
            .unwrap()
            .connect()
            .await
        {
            Ok(channel) => {
                RetryBudgetClient::new(channel)
                    .next_action(ask("later"))
                    .await
            }
            Err(error) => Err(tonic::Status::unavailable(error.to_string())),
        };
        match answer {
            Ok(_) => break,
            Err(status) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no room came back: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A frame as HTTP/2 writes it.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// A request's headers, HPACK literals without indexing.
fn request_headers(path: &str) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("x-tenant-id", "acme"),
    ] {
        block.push(0);
        block.push(name.len() as u8);
        block.extend(name.as_bytes());
        block.push(value.len() as u8);
        block.extend(value.as_bytes());
    }
    block
}

/// Reads one frame: its type, flags, stream and payload.
async fn read_frame(stream: &mut TcpStream) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).await.expect("a frame");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.expect("its payload");
    (head[3], head[4], id, payload)
}

/// Opens an HTTP/2 connection by hand and returns the server's settings.
async fn h2_open(addr: SocketAddr) -> (TcpStream, Vec<(u16, u32)>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    stream.write_all(&frame(4, 0, 0, &[])).await.unwrap();
    let settings = loop {
        let (kind, flags, _, payload) = read_frame(&mut stream).await;
        if kind == 4 && flags & 1 == 0 {
            break payload
                .chunks(6)
                .map(|s| {
                    (
                        u16::from_be_bytes([s[0], s[1]]),
                        u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
                    )
                })
                .collect();
        }
    };
    // Acknowledged: the server's settings are in force from here.
    stream.write_all(&frame(4, 1, 0, &[])).await.unwrap();
    (stream, settings)
}

#[tokio::test]
async fn streams_past_the_bound_are_refused_by_http2_and_the_bounds_are_announced() {
    let server = TestServer::start_with(|c| {
        c.server.max_concurrent_streams = 1;
        c.server.max_header_list_size = 4096;
    })
    .await;
    let (mut raw, settings) = h2_open(server.addr).await;
    assert!(
        settings.contains(&(3, 1)),
        "MAX_CONCURRENT_STREAMS: {settings:?}"
    );
    assert!(
        settings.contains(&(6, 4096)),
        "MAX_HEADER_LIST_SIZE: {settings:?}"
    );

    // Stream 1 stays open (no body yet); stream 3 is one too many.
    let path = "/retrybudget.v1.RetryBudget/NextAction";
    raw.write_all(&frame(1, 4, 1, &request_headers(path)))
        .await
        .unwrap();
    raw.write_all(&frame(1, 4, 3, &request_headers(path)))
        .await
        .unwrap();
    let reset = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let (kind, _, id, payload) = read_frame(&mut raw).await;
            assert!(
                !(kind == 1 && id == 3),
                "stream 3 got an answer, not a reset"
            );
            if kind == 3 && id == 3 {
                return u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
            }
        }
    })
    .await
    .expect("stream 3 is reset");
    assert_eq!(reset, 7, "REFUSED_STREAM");

    // A client that has the server's settings queues its calls instead:
    // all of them are answered. (Calls sent before the settings arrive can
    // meet the reset, which hyper's client reports as UNAVAILABLE: safe to
    // send again, the server never saw them.)
    let mut client = server.client().await;
    client.next_action(ask("settings-known")).await.unwrap();
    let calls = (0..8).map(|i| {
        let mut client = client.clone();
        async move { client.next_action(ask(&format!("queued-{i}"))).await }
    });
    for answer in futures_util::future::join_all(calls).await {
        answer.expect("queued, then answered");
    }
}

#[tokio::test]
async fn headers_past_the_bound_are_refused_and_store_nothing() {
    let server = TestServer::start_with(|c| c.server.max_header_list_size = 4096).await;
    let mut client = server.client().await;
    let mut request = ask("big-headers");
    request
        .metadata_mut()
        .insert("x-padding", "x".repeat(8192).parse().unwrap());
    let refused = client.next_action(request).await.unwrap_err();
    // HTTP/2 answers 431 before any service sees the call: no grpc-status,
    // which gRPC clients map to UNKNOWN.
    assert_eq!(refused.code(), Code::Unknown, "{refused:?}");
    assert!(refused.message().contains("431"), "{refused:?}");
    let mut client = server.client().await;
    not_stored(&mut client, "big-headers").await;
    let mut fits = ask("small-headers");
    fits.metadata_mut()
        .insert("x-padding", "x".repeat(1024).parse().unwrap());
    client.next_action(fits).await.expect("under the bound");
}

#[tokio::test]
async fn a_call_past_request_timeout_ends_with_its_code_and_the_same_report_is_decided_after() {
    let Some(db) = postgres::TestDb::create("request_timeout").await else {
        return;
    };
    let url = db.url.clone();
    let server = TestServer::start_with(|c| {
        c.store.postgres_url = Some(url);
        c.store.db_timeout = Duration::from_secs(30);
        c.server.request_timeout = Duration::from_millis(300);
        c.coordination.interval = Duration::from_millis(200);
        c.coordination.replica_id = Some("timeout".into());
    })
    .await;
    common::coordinated(server.channel().await).await;
    let mut client = server.client().await;

    // The activities' table locked: a decision waits for it.
    let (locker, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    locker
        .batch_execute("BEGIN; LOCK TABLE retry_budget_activities IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let refused = client.next_action(ask("slow")).await.unwrap_err();
    assert_eq!(refused.code(), Code::DeadlineExceeded, "{refused:?}");
    assert!(
        refused.message().starts_with("request_timeout: "),
        "{refused:?}"
    );
    assert_eq!(reason(&refused), "request_timeout");
    let info = refused.get_details_error_info().unwrap();
    assert_eq!(
        info.metadata.get("request_timeout_ms").map(String::as_str),
        Some("300")
    );
    locker.batch_execute("ROLLBACK").await.unwrap();

    // Nothing was stored, and the same report is decided now.
    not_stored(&mut client, "slow").await;
    let decided = client.next_action(ask("slow")).await.unwrap().into_inner();
    assert_eq!(
        decided.action,
        pb::Action::ScheduleRetry as i32,
        "{decided:?}"
    );
    assert!(!decided.replayed);
}

async fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}
