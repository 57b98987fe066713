//! retry-budget under test: the real binary, started for one run on a free
//! port with a temporary data directory and the flags of the configuration
//! measured, and the two calls of the README's worker loop.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use retry_budget::grpc::pb;
use retry_budget::grpc::pb::retry_budget_client::RetryBudgetClient;
use tonic::transport::Channel;

/// Pins every dependency's budget at a rate the global bucket always binds
/// first: only `--retry-rate` limits retries, as before the per-dependency
/// budgets (issue #52) existed.
const GLOBAL_ONLY: [&str; 2] = ["--dependency-rate", "1000000"];

/// The configurations a user could choose (docs/storm.md, "Policies").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Config {
    /// The defaults, no flags: an adaptive budget per dependency, paced by
    /// what the service sees of it (fresh failures against its recent
    /// rate, the fate of the retries it granted) with a lane earned by
    /// reported successes (docs/fairness.md), nested in the global 100
    /// tokens a second, burst 100.
    Default,
    /// The default before issue #52: the global 100 tokens a second, burst
    /// 100, and nothing per dependency.
    Static100,
    /// A low static global rate: 10 tokens a second (5% of the full lab's
    /// C), burst 10, nothing per dependency. Also the sweep's 10.
    Low,
    /// The success-deposit ratio budget: each success earns 0.1 token, on
    /// a floor of 1 token a second, burst 20, nothing per dependency.
    Ratio,
    /// The sweep of static global rates, burst = rate, nothing per
    /// dependency: the best of them chosen in hindsight is what the
    /// adaptive default is measured against.
    Static2,
    /// The sweep: 5 a second.
    Static5,
    /// The sweep: 20 a second.
    Static20,
    /// The sweep: 40 a second, the full lab's spare capacity (1 - rho) C.
    Static40,
}

impl Config {
    /// The server flags of this configuration.
    pub fn flags(self) -> Vec<&'static str> {
        let global = |rate: &'static str| {
            let mut flags = vec!["--retry-rate", rate, "--retry-burst", rate];
            flags.extend(GLOBAL_ONLY);
            flags
        };
        match self {
            Config::Default => vec![],
            Config::Static100 => GLOBAL_ONLY.to_vec(),
            Config::Low => global("10"),
            Config::Ratio => {
                let mut flags = vec![
                    "--retry-rate",
                    "1",
                    "--retry-burst",
                    "20",
                    "--success-deposit",
                    "0.1",
                ];
                flags.extend(GLOBAL_ONLY);
                flags
            }
            Config::Static2 => global("2"),
            Config::Static5 => global("5"),
            Config::Static20 => global("20"),
            Config::Static40 => global("40"),
        }
    }
}

/// A retry-budget server process; killed when dropped.
#[derive(Debug)]
pub struct Server {
    /// The process (`kill_on_drop`), replaced by [`Server::restart`].
    /// Declared before `data`, so it is killed before its directory goes.
    child: tokio::sync::Mutex<tokio::process::Child>,
    /// Its data directory, removed when dropped, after the process.
    data: tempfile::TempDir,
    binary: PathBuf,
    config: Config,
    listen: String,
    /// A client on one HTTP/2 connection, cloned for each call; it connects
    /// again by itself after a restart.
    client: RetryBudgetClient<Channel>,
}

/// What the service said about a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run the next attempt at this time.
    Retry(SystemTime),
    /// Report the same attempt again at this time; the `defer_reason`
    /// (whose budget ran out).
    Deferred(SystemTime, String),
    /// Stop: attempts, deadline, or another stop code (the `code`).
    Stop(String),
}

/// A worker's calls to one dependency since its last traffic report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Calls made, first attempts and retries.
    pub calls: u64,
    /// Successes not already counted by `RecordSuccess` with the
    /// dependency (the clients' `success_recorded`): none in the lab, where
    /// every success ends its activity and is recorded.
    pub successes: u64,
    /// Calls that failed or timed out.
    pub failures: u64,
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

/// The server process: `binary serve` on `listen` and `data`, with
/// `config`'s flags.
fn spawn(
    binary: &Path,
    config: Config,
    listen: &str,
    data: &Path,
) -> Result<tokio::process::Child, String> {
    tokio::process::Command::new(binary)
        .arg("serve")
        .args(["--listen", listen])
        .arg("--data-dir")
        .arg(data)
        .args(config.flags())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: {e}", binary.display()))
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
        let child = spawn(binary, config, &listen, data.path())?;
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
                        child: tokio::sync::Mutex::new(child),
                        data,
                        binary: binary.to_owned(),
                        config,
                        listen,
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

    /// Kills the server (SIGKILL: nothing drained, nothing saved at exit),
    /// and after `down` starts it again on the same port and data.
    ///
    /// # Errors
    /// When the process cannot be killed or started.
    pub async fn restart(&self, down: Duration) -> Result<(), String> {
        let mut child = self.child.lock().await;
        child.kill().await.map_err(|e| format!("kill: {e}"))?;
        tokio::time::sleep(down).await;
        *child = spawn(&self.binary, self.config, &self.listen, self.data.path())?;
        Ok(())
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
        dependency: &str,
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
            dependency: dependency.to_owned(),
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
            pb::Action::Deferred => Decision::Deferred(not_before(), answer.defer_reason),
            _ => Decision::Stop(answer.code),
        })
    }

    /// Step 3 of the worker loop: `RecordSuccess` with the dependency: it
    /// closes the activity, counts one success of the dependency (which
    /// paces its adaptive budget), and makes the ratio budget's deposit.
    ///
    /// # Errors
    /// The call's status, when it fails.
    pub async fn record_success(
        &self,
        tenant: &str,
        dependency: &str,
        activity_id: &str,
    ) -> Result<(), tonic::Status> {
        let mut request = tonic::Request::new(pb::RecordSuccessRequest {
            activity_id: activity_id.to_owned(),
            occurred_at: Some(SystemTime::now().into()),
            dependency: dependency.to_owned(),
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

    /// A worker's traffic report for `tenant`, as the Python and Node
    /// clients send one about once a second: its calls to each dependency
    /// since the last.
    /// Returns each dependency's name and the retries a second it may take
    /// now (the service's `DependencyPace`).
    ///
    /// # Errors
    /// The call's status, when it fails.
    pub async fn report_traffic(
        &self,
        tenant: &str,
        traffic: impl IntoIterator<Item = (&str, Traffic)>,
    ) -> Result<Vec<(String, f64)>, tonic::Status> {
        let mut request = tonic::Request::new(pb::ReportTrafficRequest {
            dependencies: traffic
                .into_iter()
                .map(|(dependency, t)| pb::DependencyTraffic {
                    dependency: dependency.to_owned(),
                    calls: t.calls,
                    successes: t.successes,
                    failures: t.failures,
                })
                .collect(),
        });
        request.metadata_mut().insert(
            retry_budget::grpc::TENANT_HEADER,
            tenant
                .parse()
                .map_err(|_| tonic::Status::internal("tenant"))?,
        );
        let answer = self.client.clone().report_traffic(request).await?;
        Ok(answer
            .into_inner()
            .dependencies
            .into_iter()
            .map(|pace| (pace.dependency, pace.allowed_rate))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn only_the_default_runs_the_adaptive_budget_per_dependency() {
        for config in Config::value_variants() {
            let flags = config.flags();
            let pinned = flags.windows(2).any(|w| w == GLOBAL_ONLY);
            assert_eq!(pinned, *config != Config::Default, "{config:?}: {flags:?}");
        }
        assert!(Config::Default.flags().is_empty());
    }
}
