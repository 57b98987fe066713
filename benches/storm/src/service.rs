//! retry-budget under test: the real binary, started for one run on a free
//! port with a temporary data directory and the flags of the configuration
//! measured, and the two calls of the README's worker loop.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use retry_budget::grpc::pb;
use retry_budget::grpc::pb::retry_budget_client::RetryBudgetClient;
use tonic::transport::Channel;

/// The configurations a user could choose (docs/storm.md, "Policies").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Config {
    /// The defaults: a static 100 tokens a second, burst 100.
    Default,
    /// A low static rate: 10 tokens a second (5% of the full lab's C),
    /// burst 10.
    Low,
    /// The success-deposit ratio budget: each success earns 0.1 token, on
    /// a floor of 1 token a second, burst 20.
    Ratio,
}

impl Config {
    /// The server flags of this configuration.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Config::Default => &[],
            Config::Low => &["--retry-rate", "10", "--retry-burst", "10"],
            Config::Ratio => &[
                "--retry-rate",
                "1",
                "--retry-burst",
                "20",
                "--success-deposit",
                "0.1",
            ],
        }
    }
}

/// A retry-budget server process; killed when dropped.
#[derive(Debug)]
pub struct Server {
    /// The process, held only to be killed when the run's state is dropped
    /// (`kill_on_drop`).
    _child: tokio::process::Child,
    /// Its data directory, removed when dropped, after the process.
    _data: tempfile::TempDir,
    /// A client on one HTTP/2 connection, cloned for each call.
    client: RetryBudgetClient<Channel>,
}

/// What the service said about a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Run the next attempt at this time.
    Retry(SystemTime),
    /// Report the same attempt again at this time.
    Deferred(SystemTime),
    /// Stop: attempts, deadline, or another stop code.
    Stop,
}

/// The activity policy the workers report on the first failure: the lab's
/// 4 attempts and 30 s deadline, the service's own backoff.
fn policy(max_attempts: u32, deadline: Duration) -> pb::Policy {
    pb::Policy {
        max_attempts,
        deadline_seconds: deadline.as_secs(),
        base: None,
        cap: None,
    }
}

impl Server {
    /// Starts `binary` with `config`'s flags and waits until it answers.
    ///
    /// # Errors
    /// When the process cannot start or does not answer within 20 s.
    pub async fn start(binary: &Path, config: Config) -> Result<Self, String> {
        let data = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("free port: {e}"))?
            .port();
        let listen = format!("127.0.0.1:{port}");
        let child = tokio::process::Command::new(binary)
            .arg("serve")
            .args(["--listen", &listen])
            .arg("--data-dir")
            .arg(data.path())
            .args(config.flags())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let endpoint = Channel::from_shared(format!("http://{listen}"))
            .map_err(|e| format!("endpoint: {e}"))?;
        let started = tokio::time::Instant::now();
        loop {
            if let Ok(channel) = endpoint.connect().await {
                let mut client = RetryBudgetClient::new(channel);
                let probe = pb::RetryDelayRequest {
                    activity_id: "probe".into(),
                    attempt: 1,
                    ..Default::default()
                };
                if client.retry_delay(probe).await.is_ok() {
                    return Ok(Self {
                        _child: child,
                        _data: data,
                        client,
                    });
                }
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err(format!("{} did not answer on {listen}", binary.display()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Step 1 of the worker loop: `NextAction` in its durable form, the
    /// failure classified transient (a timeout is), with the failure's time.
    ///
    /// # Errors
    /// The call's status, when it fails.
    #[allow(clippy::too_many_arguments)]
    pub async fn next_action(
        &self,
        tenant: &str,
        activity_id: &str,
        attempt: u32,
        occurred_at: SystemTime,
        max_attempts: u32,
        deadline: Duration,
    ) -> Result<Decision, tonic::Status> {
        let mut request = tonic::Request::new(pb::NextActionRequest {
            activity_id: activity_id.to_owned(),
            attempt,
            error_class: pb::ErrorClass::Transient as i32,
            policy: Some(policy(max_attempts, deadline)),
            occurred_at: Some(occurred_at.into()),
            ..Default::default()
        });
        request.metadata_mut().insert(
            retry_budget::grpc::TENANT_HEADER,
            tenant
                .parse()
                .map_err(|_| tonic::Status::internal("tenant"))?,
        );
        let answer = self.client.clone().next_action(request).await?.into_inner();
        let not_before = || {
            answer
                .not_before
                .and_then(|t| SystemTime::try_from(t).ok())
                .unwrap_or_else(SystemTime::now)
        };
        Ok(match answer.action() {
            pb::Action::ScheduleRetry => Decision::Retry(not_before()),
            pb::Action::Deferred => Decision::Deferred(not_before()),
            _ => Decision::Stop,
        })
    }

    /// Step 3 of the worker loop: `RecordSuccess` (the ratio budget's
    /// deposits come from it).
    ///
    /// # Errors
    /// The call's status, when it fails.
    pub async fn record_success(
        &self,
        tenant: &str,
        activity_id: &str,
    ) -> Result<(), tonic::Status> {
        let mut request = tonic::Request::new(pb::RecordSuccessRequest {
            activity_id: activity_id.to_owned(),
            occurred_at: Some(SystemTime::now().into()),
            ..Default::default()
        });
        request.metadata_mut().insert(
            retry_budget::grpc::TENANT_HEADER,
            tenant
                .parse()
                .map_err(|_| tonic::Status::internal("tenant"))?,
        );
        self.client.clone().record_success(request).await?;
        Ok(())
    }
}
