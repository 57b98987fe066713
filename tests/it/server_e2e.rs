//! The server as a mesh sees it, over loopback: reflection (v1 and v1alpha),
//! health, and a graceful drain in which calls in flight finish.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, pb, report};
use retry_budget::budget::activity::{ActivityKey, ActivityRecord};
use retry_budget::server;
use retry_budget::store::{EmbeddedStore, EmbeddedStoreOptions, Replaced, Store, StoreError};
use tokio::sync::{Notify, watch};
use tokio_stream::StreamExt;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// The services one reflection version lists; the two versions have the
/// same messages in different packages.
macro_rules! list_services {
    ($version:ident, $server:expr) => {{
        use tonic_reflection::pb::$version::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let mut client = ServerReflectionClient::new($server.channel().await);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut responses = client
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .expect(stringify!($version))
            .into_inner();
        let response = responses.next().await.expect("one response").expect("ok");
        match response.message_response {
            Some(MessageResponse::ListServicesResponse(list)) => list
                .service
                .into_iter()
                .map(|s| s.name)
                .collect::<Vec<String>>(),
            other => panic!("unexpected reflection answer {other:?}"),
        }
    }};
}

#[tokio::test]
async fn reflection_lists_the_service_in_both_versions() {
    let server = TestServer::start().await;
    for services in [list_services!(v1, server), list_services!(v1alpha, server)] {
        for expected in [
            "retrybudget.v1.RetryBudget",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ] {
            assert!(
                services.iter().any(|s| s == expected),
                "{expected} in {services:?}"
            );
        }
    }
    server.stop().await.unwrap();
}

async fn health(channel: tonic::transport::Channel, service: &str) -> Result<i32, tonic::Status> {
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
}

#[tokio::test]
async fn health_serves_both_names() {
    let server = TestServer::start().await;
    for name in ["", "retrybudget.v1.RetryBudget"] {
        assert_eq!(
            health(server.channel().await, name).await.unwrap(),
            ServingStatus::Serving as i32
        );
    }
    let unknown = health(server.channel().await, "nope").await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    server.stop().await.unwrap();
}

/// The real store, with every save held until the test lets it go: it
/// makes a call be in flight when the drain starts, whatever the machine's
/// speed.
#[derive(Clone)]
struct HeldSaves {
    inner: EmbeddedStore,
    /// Told when a save arrives.
    entered: Arc<Notify>,
    /// Saves wait until this is true.
    release: Arc<watch::Sender<bool>>,
}

impl Store for HeldSaves {
    async fn load(&self, key: &ActivityKey) -> Result<Option<ActivityRecord>, StoreError> {
        self.inner.load(key).await
    }
    async fn save(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> Result<(), StoreError> {
        self.entered.notify_one();
        let mut released = self.release.subscribe();
        released
            .wait_for(|open| *open)
            .await
            .expect("the test holds the sender");
        self.inner.save(record, replaces).await
    }
    async fn purge(&self, cutoff_ms: i64, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge(cutoff_ms, limit).await
    }
    async fn count(&self) -> Result<u64, StoreError> {
        self.inner.count().await
    }
    async fn save_paces(
        &self,
        paces: Vec<retry_budget::budget::token::PaceRecord>,
    ) -> Result<(), StoreError> {
        self.inner.save_paces(paces).await
    }
    async fn load_paces(&self) -> Result<Vec<retry_budget::budget::token::PaceRecord>, StoreError> {
        self.inner.load_paces().await
    }
}

/// Polls `check` until it holds, for at most 30 s.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(tokio::time::Instant::now() < give_up, "never {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn draining_says_not_serving_answers_for_the_drain_delay_then_refuses_and_finishes_calls_in_flight()
 {
    let dir = tempfile::tempdir().unwrap();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(watch::Sender::new(false));
    let store = HeldSaves {
        inner: EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap(),
        entered: Arc::clone(&entered),
        release: Arc::clone(&release),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The drain window is real time (the server's sockets use hyper's
    // timers): long enough for the checks below on a loaded machine.
    let mut config = common::config(dir.path());
    config.server.drain_delay = Duration::from_secs(3);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server::serve(listener, store, config, async {
        let _ = stopped.await;
    }));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = pb::retry_budget_client::RetryBudgetClient::new(channel.clone());
    assert_eq!(
        health(channel.clone(), "").await.unwrap(),
        ServingStatus::Serving as i32
    );

    // A call that is in flight (its save held) when the drain starts.
    let in_flight = {
        let mut client = client.clone();
        tokio::spawn(async move {
            client
                .next_action(report("in-flight", 1, pb::ErrorClass::Transient))
                .await
        })
    };
    tokio::time::timeout(Duration::from_secs(30), entered.notified())
        .await
        .expect("the call reaches its save");
    let signalled = tokio::time::Instant::now();
    stop.send(()).unwrap();
    until("NOT_SERVING", async || {
        health(channel.clone(), "").await.unwrap() == ServingStatus::NotServing as i32
    })
    .await;

    for name in ["", "retrybudget.v1.RetryBudget"] {
        assert_eq!(
            health(channel.clone(), name).await.unwrap(),
            ServingStatus::NotServing as i32,
            "{name:?} while draining"
        );
    }
    // For the drain delay, new calls are answered as before (a call that
    // saves nothing: every save is held), so that a balancer still
    // sending here while it notices NOT_SERVING sees no error.
    let delay = |client: &mut pb::retry_budget_client::RetryBudgetClient<_>| {
        let mut client = client.clone();
        async move {
            client
                .retry_delay(pb::RetryDelayRequest {
                    activity_id: "during-drain".into(),
                    attempt: 1,
                    ..Default::default()
                })
                .await
        }
    };
    let answered = delay(&mut client).await;
    let within_delay = signalled.elapsed() < Duration::from_secs(3);
    if within_delay {
        answered.expect("answered during the drain delay");
    }
    // After it, the listener closes and new calls are refused.
    until("new calls refused after the drain delay", async || {
        delay(&mut client)
            .await
            .is_err_and(|e| e.code() == tonic::Code::Unavailable)
    })
    .await;
    assert!(
        signalled.elapsed() >= Duration::from_secs(3),
        "refused only after the drain delay: {:?}",
        signalled.elapsed()
    );

    assert!(!in_flight.is_finished(), "its save is still held");
    release.send_replace(true);
    let finished = in_flight
        .await
        .unwrap()
        .expect("the call in flight completes");
    assert_eq!(finished.into_inner().code, "schedule_retry");
    running.await.unwrap().expect("exits cleanly");
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "bounded drain"
    );

    // What the call in flight was told is durable.
    let store = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap();
    let key = ActivityKey {
        tenant: "default".into(),
        activity_id: "in-flight".into(),
    };
    let record = store.load(&key).await.unwrap().expect("recorded");
    assert_eq!(record.attempts, 1);
}

#[tokio::test]
async fn a_stream_that_never_ends_does_not_hold_the_server_past_its_grace_period() {
    let server =
        TestServer::start_with(|c| c.server.grace_period = Duration::from_millis(500)).await;
    let mut watch = HealthClient::new(server.channel().await)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    let started = tokio::time::Instant::now();
    server.stop().await.expect("clean exit");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_connection_that_never_spoke_does_not_hold_the_drain() {
    use tokio::io::AsyncReadExt;

    // A grace period far longer than the drain may take: before the fix, a
    // connection waiting for its HTTP/2 preface (a TCP health check, a port
    // scan) held the server for all of it (hyperium/hyper#4170).
    let server = TestServer::start_with(|c| c.server.grace_period = Duration::from_secs(20)).await;
    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    // And a client that spoke and then sat idle, which hyper drains itself.
    let mut idle = HealthClient::new(server.channel().await);
    let serving = idle
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(serving.status, ServingStatus::Serving as i32);

    let started = tokio::time::Instant::now();
    server.stop().await.expect("clean exit");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "the drain took {took:?}");
    // The server's side of the connection is closed: after its SETTINGS
    // frame (sent without waiting for the client), the end of the stream.
    let mut sent = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut sent))
        .await
        .expect("the silent connection is closed")
        .ok();
    assert!(sent.len() < 100, "no more than a SETTINGS frame: {sent:?}");
}

/// Once `run` returns, the store's file is free: a restart on the same data
/// directory succeeds at once, even with a client's connection still open
/// when the server stopped (a connection's task may hold the service, hence
/// the store, for a moment after the server stops serving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_is_released_when_the_server_returns() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..30 {
        let server = TestServer::start_in(dir.path().to_path_buf(), |_| {}).await;
        let mut client = server.client().await;
        client
            .next_action(report(&format!("r{round}"), 1, pb::ErrorClass::Transient))
            .await
            .expect("served");
        server.stop().await.expect("clean stop");
        let reopened = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path()));
        assert!(reopened.is_ok(), "round {round}: {:?}", reopened.err());
        drop(client);
    }
}
