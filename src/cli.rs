//! The command line: `serve` (the default) runs the service; `delay`,
//! `next-action` and `explain` answer people without grpcurl.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::budget::activity::{DEFAULT_TENANT, Policy};
use crate::budget::{Budget, DelayParams, ErrorClass, next_action, retry_delay};
use crate::config::{ConfigError, FileConfig};
use crate::grpc::{TENANT_HEADER, pb};
use crate::server::ServerConfig;

/// Environment variable naming the data directory.
pub const ENV_DATA_DIR: &str = "RETRY_BUDGET_DATA_DIR";
/// Environment variable naming the listen address.
pub const ENV_LISTEN: &str = "RETRY_BUDGET_LISTEN";
/// Environment variable naming the configuration file.
pub const ENV_CONFIG: &str = "RETRY_BUDGET_CONFIG";
/// Environment variable naming the server the client commands talk to.
pub const ENV_SERVER: &str = "RETRY_BUDGET_SERVER";

/// retry-budget: tells workers whether and when to retry a failed activity.
#[derive(Debug, Parser)]
#[command(name = "retry-budget", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The server's options, when no subcommand is given.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC service (the default).
    Serve(Box<ServeArgs>),
    /// Print an activity's backoff plan, as the article's retry_delay does.
    Delay(DelayArgs),
    /// Evaluate a budget with the article's next_action.
    NextAction(NextActionArgs),
    /// Show an activity's budget and every decision, from a running server.
    Explain(ExplainArgs),
}

/// Options of `serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = ENV_LISTEN, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Directory of the embedded store (created if missing).
    #[arg(long, env = ENV_DATA_DIR, default_value = "retry-budget-data")]
    pub data_dir: PathBuf,
    /// The most decisions one group commit (one fsync) carries; 1 commits
    /// each decision alone.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_batch: u32,
    /// Under load (the last group commit carried more than one decision),
    /// how long from the start of one group commit the next may wait for
    /// decisions to share its fsync; it starts sooner once as many wait as
    /// recent groups carried, or once 32 wait and the server has nothing
    /// else to do. A decision that arrives alone is committed at once. 0s
    /// commits as soon as the previous fsync returns.
    #[arg(long, default_value = "2ms", value_parser = humantime::parse_duration)]
    pub commit_window: Duration,
    /// A journal segment this large (MiB) is checkpointed into the database.
    /// Decisions waiting for a checkpoint are held in memory: about two
    /// segments' worth, and up to five while a checkpoint is slow. Larger
    /// segments mean fewer, larger checkpoints and more memory.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub journal_segment_mib: u32,
    /// A journal segment older than this is checkpointed even when small, so
    /// that the database is never far behind and a restart after a crash
    /// replays little.
    #[arg(long, default_value = "5s", value_parser = parse_positive_duration)]
    pub journal_segment_age: Duration,
    /// Attempts allowed to activities whose first report has no policy.
    #[arg(long, default_value_t = 5)]
    pub default_max_attempts: u32,
    /// Deadline of activities whose first report has no policy.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub default_deadline: Duration,
    /// How long closed (or expired) activities are kept.
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub retention: Duration,
    /// How often expired activities are purged.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,
    /// How long health reports NOT_SERVING before the listener closes on
    /// SIGTERM or Ctrl-C.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub drain_delay: Duration,
    /// How long calls in flight may take to finish after that.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace_period: Duration,
    /// A TOML configuration file (see the README); flags override it.
    #[arg(long, env = ENV_CONFIG)]
    pub config: Option<PathBuf>,
    /// Retry tokens a second for the whole service [default: 100].
    #[arg(long)]
    pub retry_rate: Option<f64>,
    /// Retry tokens the bucket holds when full [default: 100].
    #[arg(long)]
    pub retry_burst: Option<u32>,
    /// Tokens each RecordSuccess adds back [default: 0].
    #[arg(long)]
    pub success_deposit: Option<f64>,
    /// The longest delay a server's hint (Retry-After, pushback, RetryInfo)
    /// may ask for [default: 1h].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_hint: Option<Duration>,
    /// A tenant's fair-share weight, as NAME=WEIGHT (repeatable; default 1).
    #[arg(long = "tenant-weight", value_parser = parse_weight)]
    pub tenant_weights: Vec<(String, u32)>,
}

impl ServeArgs {
    /// The server configuration these options describe, over the
    /// configuration file's when one is named.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read or parsed.
    pub fn config(&self) -> Result<ServerConfig, ConfigError> {
        let file = match &self.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let mut config = ServerConfig::new(&self.data_dir);
        config.bucket = file.bucket;
        config.classification_rules = file.classification.rules;
        if let Some(seconds) = file.hints.max_hint_seconds {
            config.max_hint = Duration::from_secs(seconds);
        }
        if let Some(max_hint) = self.max_hint {
            config.max_hint = max_hint;
        }
        if let Some(rate) = self.retry_rate {
            config.bucket.rate = rate;
        }
        if let Some(burst) = self.retry_burst {
            config.bucket.burst = burst;
        }
        if let Some(deposit) = self.success_deposit {
            config.bucket.success_deposit = deposit;
        }
        for (tenant, weight) in &self.tenant_weights {
            config.bucket.weights.insert(tenant.clone(), *weight);
        }
        config.max_batch = self.max_batch as usize;
        config.commit_window = self.commit_window;
        config.journal_segment_bytes = u64::from(self.journal_segment_mib) << 20;
        config.journal_segment_age = self.journal_segment_age;
        config.default_policy = Policy {
            max_attempts: self.default_max_attempts,
            deadline_seconds: self.default_deadline.as_secs(),
            base: None,
            cap: None,
        };
        config.retention = self.retention;
        config.sweep_interval = self.sweep_interval;
        config.drain_delay = self.drain_delay;
        config.grace_period = self.grace_period;
        Ok(config)
    }
}

/// Options of `delay`.
#[derive(Debug, Args)]
pub struct DelayArgs {
    /// The activity whose jitter is derived.
    pub activity_id: String,
    /// Attempts: one number, or an inclusive range such as `1..6`.
    #[arg(long, default_value = "1..6", value_parser = parse_attempts)]
    pub attempts: (u32, u32),
    /// Backoff base in seconds.
    #[arg(long, default_value_t = 2)]
    pub base: u32,
    /// Backoff cap in seconds.
    #[arg(long, default_value_t = 60)]
    pub cap: u32,
    /// Print milliseconds instead of the reference's whole seconds.
    #[arg(long)]
    pub ms: bool,
}

/// Options of `next-action`.
#[derive(Debug, Args)]
pub struct NextActionArgs {
    /// Attempts made, the failed one included.
    #[arg(long)]
    pub attempts: u32,
    /// Attempts allowed.
    #[arg(long)]
    pub max_attempts: u32,
    /// Logical seconds elapsed since the activity started.
    #[arg(long)]
    pub elapsed: u64,
    /// Deadline in seconds since the activity started.
    #[arg(long)]
    pub deadline: u64,
    /// The failure's class: transient, permanent or unknown.
    #[arg(long)]
    pub class: String,
    /// With an activity id, a retry also prints its delay.
    #[arg(long)]
    pub activity_id: Option<String>,
}

/// Options of `explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The activity to show.
    pub activity_id: String,
    /// Its tenant.
    #[arg(long, default_value = DEFAULT_TENANT)]
    pub tenant: String,
    /// The server to ask.
    #[arg(long, env = ENV_SERVER, default_value = "http://127.0.0.1:50051")]
    pub server: String,
}

fn parse_weight(s: &str) -> Result<(String, u32), String> {
    let (name, weight) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=WEIGHT"))?;
    let weight = weight
        .parse::<u32>()
        .map_err(|e| format!("weight of {name:?}: {e}"))?;
    Ok((name.to_owned(), weight))
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if duration.is_zero() {
        return Err("must be longer than zero".to_owned());
    }
    Ok(duration)
}

fn parse_attempts(s: &str) -> Result<(u32, u32), String> {
    let number = |t: &str| {
        t.trim()
            .parse::<u32>()
            .map_err(|e| format!("{t:?} is not an attempt number: {e}"))
    };
    let (low, high) = match s.split_once("..") {
        Some((a, b)) => (number(a)?, number(b.strip_prefix('=').unwrap_or(b))?),
        None => (number(s)?, number(s)?),
    };
    if low > high {
        return Err(format!("empty range {s}"));
    }
    Ok((low, high))
}

/// Runs a client subcommand (everything but `serve`) and returns the exit
/// code: 0, 2 for a refused input (its stable code on stderr), 1 otherwise.
pub async fn run_client(command: Command) -> ExitCode {
    match command {
        Command::Serve(_) => ExitCode::from(2),
        Command::Delay(args) => delay(&args),
        Command::NextAction(args) => next_action_command(&args),
        Command::Explain(args) => match explain(&args).await {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("{message}");
                ExitCode::FAILURE
            }
        },
    }
}

fn delay(args: &DelayArgs) -> ExitCode {
    let params = DelayParams {
        base: args.base,
        cap: args.cap,
    };
    let mut values = Vec::new();
    for attempt in args.attempts.0..=args.attempts.1 {
        match retry_delay(&args.activity_id, attempt, params) {
            Ok(d) if args.ms => values.push(d.millis.to_string()),
            Ok(d) => values.push(d.seconds.to_string()),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        }
    }
    println!("{} [{}]", args.activity_id, values.join(", "));
    ExitCode::SUCCESS
}

fn next_action_command(args: &NextActionArgs) -> ExitCode {
    let class: ErrorClass = match args.class.parse() {
        Ok(class) => class,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let budget = Budget {
        attempts: args.attempts,
        max_attempts: args.max_attempts,
        elapsed: args.elapsed,
        deadline: args.deadline,
    };
    let action = next_action(&budget, class);
    match &args.activity_id {
        Some(id) if action == crate::budget::Action::ScheduleRetry => {
            match retry_delay(id, args.attempts, DelayParams::default()) {
                Ok(d) => println!(
                    "{} delay_seconds={} delay_ms={}",
                    action.code(),
                    d.seconds,
                    d.millis
                ),
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            }
        }
        _ => println!("{}", action.code()),
    }
    ExitCode::SUCCESS
}

async fn explain(args: &ExplainArgs) -> Result<String, String> {
    use pb::retry_budget_client::RetryBudgetClient;
    let mut client = RetryBudgetClient::connect(args.server.clone())
        .await
        .map_err(|e| format!("cannot reach {}: {e}", args.server))?;
    let mut request = tonic::Request::new(pb::GetActivityRequest {
        activity_id: args.activity_id.clone(),
    });
    let tenant = args
        .tenant
        .parse()
        .map_err(|_| format!("invalid tenant {:?}", args.tenant))?;
    request.metadata_mut().insert(TENANT_HEADER, tenant);
    let activity = client
        .get_activity(request)
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    Ok(render_activity(&activity))
}

fn rfc3339(ts: Option<&prost_types::Timestamp>) -> String {
    let Some(ts) = ts else {
        return "-".to_owned();
    };
    let Ok(secs) = u64::try_from(ts.seconds) else {
        return format!("{}s", ts.seconds);
    };
    let time = std::time::UNIX_EPOCH
        + Duration::from_secs(secs)
        + Duration::from_nanos(u64::try_from(ts.nanos).unwrap_or(0));
    humantime::format_rfc3339_millis(time).to_string()
}

/// The text `explain` prints: the budget, then one line a decision.
fn render_activity(a: &pb::Activity) -> String {
    use std::fmt::Write;
    let status = pb::ActivityStatus::try_from(a.status)
        .map_or("?", |s| s.as_str_name())
        .trim_start_matches("ACTIVITY_STATUS_")
        .to_lowercase();
    let policy = a.policy.unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(out, "activity  {} (tenant {})", a.activity_id, a.tenant);
    if !a.workflow_id.is_empty() {
        let _ = writeln!(out, "workflow  {}", a.workflow_id);
    }
    let _ = writeln!(
        out,
        "policy    max_attempts={} deadline={}s base={}s cap={}s",
        policy.max_attempts,
        policy.deadline_seconds,
        policy.base.unwrap_or(2),
        policy.cap.unwrap_or(60)
    );
    let _ = writeln!(out, "started   {}", rfc3339(a.started_at.as_ref()));
    let _ = write!(out, "status    {status} after attempt {}", a.attempts);
    if !a.closed_code.is_empty() {
        let _ = write!(
            out,
            " ({} at {})",
            a.closed_code,
            rfc3339(a.closed_at.as_ref())
        );
    }
    out.push('\n');
    let _ = writeln!(out, "events");
    for e in &a.events {
        let _ = write!(
            out,
            "  #{} {:<8} {:<18} occurred {} (+{}s)",
            e.attempt,
            e.kind,
            e.code,
            rfc3339(e.occurred_at.as_ref()),
            e.elapsed_seconds
        );
        if e.not_before.is_some() {
            let _ = write!(
                out,
                " retry at {} (delay {} ms, backoff {} ms{})",
                rfc3339(e.not_before.as_ref()),
                e.delay_ms,
                e.backoff_ms,
                if e.token_taken { ", token taken" } else { "" }
            );
        }
        let _ = writeln!(out, "\n      {}", e.reason);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_parse_as_ranges_or_numbers() {
        assert_eq!(parse_attempts("1..6"), Ok((1, 6)));
        assert_eq!(parse_attempts("1..=6"), Ok((1, 6)));
        assert_eq!(parse_attempts("4"), Ok((4, 4)));
        assert!(parse_attempts("6..1").is_err());
        assert!(parse_attempts("x").is_err());
    }

    #[test]
    fn serve_is_the_default_subcommand() {
        let cli = Cli::try_parse_from(["retry-budget", "--listen", "127.0.0.1:0"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.listen.port(), 0);
        let cli = Cli::try_parse_from(["retry-budget", "delay", "flight-1"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Delay(_))));
    }

    #[test]
    fn journal_flags_reach_the_store_and_bad_values_are_refused() {
        let config = Cli::try_parse_from(["retry-budget"])
            .unwrap()
            .serve
            .config()
            .unwrap();
        let defaults = crate::store::RedbStoreOptions::new("x");
        assert_eq!(config.journal_segment_bytes, defaults.segment_bytes);
        assert_eq!(config.journal_segment_age, defaults.segment_age);

        let cli = Cli::try_parse_from([
            "retry-budget",
            "--journal-segment-mib",
            "64",
            "--journal-segment-age",
            "30s",
        ])
        .unwrap();
        let config = cli.serve.config().unwrap();
        assert_eq!(config.journal_segment_bytes, 64 << 20);
        assert_eq!(config.journal_segment_age, Duration::from_secs(30));

        for bad in [
            ["--journal-segment-mib", "0"],
            ["--journal-segment-mib", "1025"],
            ["--journal-segment-age", "0s"],
            ["--journal-segment-age", "soon"],
        ] {
            let error = Cli::try_parse_from(["retry-budget", bad[0], bad[1]]).unwrap_err();
            assert_eq!(
                error.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bucket_flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[bucket]\nrate = 7.0\nburst = 9\n[bucket.weights]\na = 2\n",
        )
        .unwrap();
        let cli = Cli::try_parse_from([
            "retry-budget",
            "--config",
            path.to_str().unwrap(),
            "--retry-burst",
            "50",
            "--tenant-weight",
            "b=3",
        ])
        .unwrap();
        let config = cli.serve.config().unwrap();
        assert_eq!((config.bucket.rate, config.bucket.burst), (7.0, 50));
        assert_eq!(config.bucket.weights.get("a"), Some(&2));
        assert_eq!(config.bucket.weights.get("b"), Some(&3));
        assert!(Cli::try_parse_from(["retry-budget", "--tenant-weight", "b"]).is_err());
    }
}
