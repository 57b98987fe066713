//! Real processes for the multi-replica tests: replicas of the binary on
//! PostgreSQL, each on an ephemeral port, and HAProxy in front of them with
//! `deploy/haproxy.cfg` (HTTP/2, round robin per request).

#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A replica process.
pub struct Replica {
    /// The process; killed when dropped.
    pub child: Child,
    /// `127.0.0.1:port`.
    pub addr: String,
}

impl Replica {
    /// Starts the binary on `postgres_url` with `extra` flags and waits for
    /// its "serving" log line.
    ///
    /// Eight connections for decisions (and one for coordination) each:
    /// the tests run two at a time, three replicas or four each, within
    /// PostgreSQL's default 100 connections, which the default pool of 16
    /// would pass under load ("sorry, too many clients already").
    pub async fn spawn(postgres_url: &str, extra: &[&str]) -> Self {
        let mut args = vec!["--postgres-url", postgres_url, "--pool-size", "8"];
        args.extend_from_slice(extra);
        let (child, addr) = super::binary::spawn(&args, Some("replica")).await;
        Self { child, addr }
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILL, and wait until it is gone.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("kill the replica");
    }

    /// SIGTERM, as Kubernetes stops a pod, and wait until it has drained
    /// and exited (at most 30 s); returns whether it exited cleanly.
    pub async fn terminate(&mut self) -> bool {
        super::binary::signal(&self.child, "TERM").await;
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("drained and exited within 30 s")
            .expect("wait")
            .success()
    }
}

/// Whether the replica at `url` says `SERVING` for the `RetryBudget`
/// service, as a balancer's check asks; `None` when it does not answer.
pub async fn serving(url: String) -> Option<bool> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let channel = tonic::transport::Channel::from_shared(url)
        .ok()?
        .connect()
        .await
        .ok()?;
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "retrybudget.v1.RetryBudget".into(),
        })
        .await
        .ok()?
        .into_inner()
        .status;
    Some(status == ServingStatus::Serving as i32)
}

/// HAProxy in front of the replicas, or `None` (said on stderr) when it is
/// not installed, except under `CI=true`, where that fails the test.
pub struct Balancer {
    child: Child,
    /// `127.0.0.1:port` of its frontend.
    pub addr: String,
}

impl Balancer {
    /// Starts HAProxy with `deploy/haproxy.cfg` over exactly three replicas.
    pub async fn spawn(replicas: [&str; 3]) -> Option<Self> {
        if Command::new("haproxy").arg("-v").output().await.is_err() {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and haproxy is not installed");
            }
            crate::common::skip::skipped("haproxy is not installed (apt-get install haproxy)");
            return None;
        }
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let config = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/haproxy.cfg");
        let child = Command::new("haproxy")
            .args(["-db", "-f", config])
            .env("LB_LISTEN", &addr)
            .env("LB_SERVER_1", replicas[0])
            .env("LB_SERVER_2", replicas[1])
            .env("LB_SERVER_3", replicas[2])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start haproxy");
        // Up once its frontend accepts connections.
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(&addr).await.is_ok() {
                return Some(Self { child, addr });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("haproxy did not listen on {addr}");
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A port free now (HAProxy needs a fixed one).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
