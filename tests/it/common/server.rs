//! Shared by the end-to-end tests: a real server on `127.0.0.1:0` with a
//! temporary data directory and a shutdown handle, and gRPC clients for it.
#![allow(dead_code)]

// The load generator's tests share this file (as their `common`), and have
// neither the database client nor the service binary: the helpers that need
// them are declared beside it, in `mod.rs`.

pub mod skip;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use retry_budget::config::Config;
use retry_budget::grpc::pb::retry_budget_client::RetryBudgetClient;
use retry_budget::server::{self, ServerError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

pub use retry_budget::grpc::pb;

/// A server running in this process.
pub struct TestServer {
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), ServerError>>>,
    _dir: Option<tempfile::TempDir>,
}

/// The configuration tests start from: a temp dir, no drain delay, and a
/// retry-token bucket too large to defer anything (tests of the bucket set
/// their own).
pub fn config(data_dir: impl Into<PathBuf>) -> Config {
    let mut config = Config::with_data_dir(data_dir);
    config.bucket.rate = 1_000_000.0;
    config.bucket.burst = 1_000_000;
    // Every dependency at a static rate far above any global one, so the
    // global bucket alone limits retries; the tests of the dependencies'
    // adaptive budgets (tests/it/dependencies.rs) set their own.
    config.dependencies = retry_budget::bucket::DependenciesConfig::static_rate(1_000_000.0);
    config.server.drain_delay = Duration::ZERO;
    config.server.grace_period = Duration::from_secs(5);
    config
}

impl TestServer {
    /// Starts a server with the test configuration in a fresh temp dir.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts a server after `tweak` adjusts the test configuration.
    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Self::start_in(dir.path().to_path_buf(), tweak).await;
        server._dir = Some(dir);
        server
    }

    /// Starts a server on an existing data directory (to test restarts).
    pub async fn start_in(data_dir: PathBuf, tweak: impl FnOnce(&mut Config)) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let mut cfg = config(&data_dir);
        tweak(&mut cfg);
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(server::run(listener, cfg, async {
            let _ = rx.await;
        }));
        Self {
            addr,
            data_dir,
            shutdown: Some(tx),
            handle: Some(handle),
            _dir: None,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        match Endpoint::from_shared(self.url())
            .expect("url")
            .connect()
            .await
        {
            Ok(channel) => channel,
            Err(error) => {
                // Say why the server is gone when it failed to start.
                if let Some(handle) = self.handle.as_ref().filter(|h| h.is_finished()) {
                    panic!("the test server stopped: {handle:?}");
                }
                panic!("connect to the test server: {error}")
            }
        }
    }

    pub async fn client(&self) -> RetryBudgetClient<Channel> {
        RetryBudgetClient::new(self.channel().await)
    }

    /// Signals shutdown without waiting.
    pub fn signal_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Signals shutdown and waits for the server to return.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        self.signal_shutdown();
        let handle = self.handle.take().expect("running");
        tokio::time::timeout(Duration::from_secs(30), handle)
            .await
            .expect("server stops in time")
            .expect("server task")
    }

    /// Stops the server and keeps its data directory for a restart.
    pub async fn stop_keep_dir(mut self) -> (PathBuf, Option<tempfile::TempDir>) {
        let dir = self._dir.take();
        let data_dir = self.data_dir.clone();
        self.stop().await.expect("clean stop");
        (data_dir, dir)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.signal_shutdown();
    }
}

/// A request carrying the tenant metadata.
pub fn with_tenant<T>(message: T, tenant: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("x-tenant-id", tenant.parse().expect("ascii tenant"));
    request
}

/// The parity vectors generated from the article's reference functions, read
/// from the package's root as cargo names it at run time (the build's root
/// otherwise): CI runs this binary in a clone with nothing beside it, to see
/// that the clone holds every vector.
pub fn parity(name: &str) -> Vec<serde_json::Value> {
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    let path = root.join("tests/data/parity").join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("parity line is JSON"))
        .collect()
}

/// A durable failure report.
pub fn report(activity_id: &str, attempt: u32, class: pb::ErrorClass) -> pb::NextActionRequest {
    pb::NextActionRequest {
        activity_id: activity_id.into(),
        attempt,
        error_class: class as i32,
        ..Default::default()
    }
}

/// The activity `id` of the default tenant, which must exist.
pub async fn get(client: &mut RetryBudgetClient<Channel>, id: &str) -> pb::Activity {
    client
        .get_activity(pb::GetActivityRequest {
            activity_id: id.into(),
        })
        .await
        .expect("activity exists")
        .into_inner()
}

/// A timestamp of unix milliseconds.
pub fn ts(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// Unix milliseconds of a timestamp.
pub fn ms(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds * 1000 + i64::from(ts.nanos / 1_000_000)
}

/// Waits (at most 10 s) until the replica behind `channel` holds a part of
/// the global budget from its database: before that it admits no retry.
pub async fn coordinated(channel: Channel) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let mut health = HealthClient::new(channel);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = health
            .check(HealthCheckRequest {
                service: server::COORDINATION_HEALTH.into(),
            })
            .await
            .map(|r| r.into_inner().status);
        if status.as_ref().ok() == Some(&(ServingStatus::Serving as i32)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no grant from the database: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
