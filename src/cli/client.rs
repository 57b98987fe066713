//! The client subcommands, for people without grpcurl: `delay` and
//! `next-action` answer from the core as the server would; `explain` asks a
//! running server for an activity and prints its budget and every decision.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{Command, ENV_API_KEY, ENV_SERVER};
use crate::budget::tenant::{DEFAULT_TENANT, TENANT_HEADER};
use crate::budget::{Budget, DelayParams, ErrorClass, next_action, retry_delay};
use crate::grpc::pb;

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
    /// The API key to send as `authorization: Bearer` (a server with
    /// `--auth api-keys`); the tenant is then the key's.
    #[arg(long, env = ENV_API_KEY, hide_env_values = true)]
    pub api_key: Option<String>,
    /// How to reach it over TLS.
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

/// The client commands' TLS: used when the server's URL is `https://` or
/// any of these is given (an `http://` URL is then read as `https://`).
#[derive(Debug, Clone, Default, Args)]
pub struct ClientTlsArgs {
    /// Verify the server's certificate with this CA (PEM) instead of the
    /// system's roots.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Present this client certificate (PEM) to a server that requires one
    /// (mutual TLS); with `--tls-key`.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The name the server's certificate must carry, when it is not the
    /// host of `--server` (an address, or a name behind a tunnel).
    #[arg(long)]
    pub tls_server_name: Option<String>,
}

impl ClientTlsArgs {
    fn wanted(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some() || self.tls_server_name.is_some()
    }

    /// A channel to `server`, over TLS as these options say.
    ///
    /// # Errors
    /// Why a file cannot be read or the server cannot be reached, for
    /// people.
    pub async fn connect(&self, server: &str) -> Result<tonic::transport::Channel, String> {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        let https = server.starts_with("https://");
        let url = match server.strip_prefix("http://") {
            Some(rest) if self.wanted() => format!("https://{rest}"),
            _ => server.to_owned(),
        };
        let mut endpoint =
            Endpoint::from_shared(url).map_err(|e| format!("invalid server {server:?}: {e}"))?;
        if https || self.wanted() {
            let mut tls = ClientTlsConfig::new();
            tls = match &self.tls_ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca)?)),
                None => tls.with_native_roots(),
            };
            if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            if let Some(name) = &self.tls_server_name {
                tls = tls.domain_name(name.clone());
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| format!("TLS to {server}: {e}"))?;
        }
        endpoint
            .connect()
            .await
            .map_err(|e| format!("cannot reach {server}: {}", with_sources(&e)))
    }
}

/// An error and its causes, for people: tonic's transport error alone says
/// only "transport error".
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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
        Command::Migrate(args) => super::migrate(&args).await,
        Command::Keys(args) => super::keys::keys(&args),
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
    let mut client = RetryBudgetClient::new(args.tls.connect(&args.server).await?);
    let mut request = tonic::Request::new(pb::GetActivityRequest {
        activity_id: args.activity_id.clone(),
    });
    let tenant = args
        .tenant
        .parse()
        .map_err(|_| format!("invalid tenant {:?}", args.tenant))?;
    request.metadata_mut().insert(TENANT_HEADER, tenant);
    if let Some(key) = &args.api_key {
        let bearer = format!("Bearer {key}")
            .parse()
            .map_err(|_| "the API key has characters a header cannot carry".to_owned())?;
        request.metadata_mut().insert("authorization", bearer);
    }
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
        if !e.dependency.is_empty() {
            let _ = write!(out, " to {}", e.dependency);
        }
        if e.not_before.is_some() {
            let _ = write!(
                out,
                " retry at {} (delay {} ms, backoff {} ms{})",
                rfc3339(e.not_before.as_ref()),
                e.delay_ms,
                e.backoff_ms,
                if e.token_taken {
                    ", token taken"
                } else if e.slot_booked {
                    ", slot booked"
                } else {
                    ""
                }
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
}
