//! The client subcommands, for people without grpcurl: `delay` and
//! `next-action` answer from the core as the server would; `explain` asks a
//! running server for an activity and prints its budget and every decision.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{Command, ENV_SERVER};
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
}
