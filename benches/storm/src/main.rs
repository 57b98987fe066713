//! `retry-budget-storm`: the storm lab of docs/storm.md.
//!
//! One invocation is one run: a scenario (a dependency of capacity C whose
//! capacity drops to a third for a while, or that fails at random, with or
//! without a healthy second dependency beside it), seeded open-loop
//! activities from two tenants over many workers, and one retry policy: a
//! published per-client one, or the real retry-budget server in one of its
//! configurations. It prints one JSON object: the figures (the healthy
//! dependency's under `healthy`), the per-second series, and the lab's own
//! scheduler lag (a starved run says so). `benches/storm/run.sh` runs the whole lab and writes the table and
//! the plot.
//!
//! # Layout
//! - `setup`: the scenarios, the model's constants, the timeline.
//! - `dependency`: capacity, slots, FIFO queue, wasted work.
//! - `policy`: the per-client policies, pure state machines.
//! - `service`: the retry-budget process, the worker loop's two calls and
//!   the traffic report.
//! - `run`: arrivals, workers, activities, one run end to end.
//! - `record`: per-second counters and the figures; `lag`: the lab's lag.
#![forbid(unsafe_code)]

mod backlog;
mod dependency;
mod lag;
mod policy;
mod record;
mod run;
mod service;
mod setup;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use serde_json::json;

use crate::policy::Rule;
use crate::run::Reports;
use crate::service::{Config, Server};
use crate::setup::{Scenario, Setup, Timeline};

/// Runs one scenario under one retry policy and prints its figures as JSON.
#[derive(Debug, Parser)]
#[command(name = "retry-budget-storm", version)]
struct Args {
    /// Who decides retries.
    #[arg(long, value_enum)]
    policy: PolicyName,
    /// What happens to the dependency.
    #[arg(long, value_enum, default_value_t = Scenario::Drop)]
    scenario: Scenario,
    /// Seeds arrivals, tenants, workers, jitter, failures and restarts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The dependency's capacity C, requests a second.
    #[arg(long, default_value_t = 200.0)]
    capacity: f64,
    /// CI's short timeline (31 s) instead of the full one (70 s).
    #[arg(long)]
    short: bool,
    /// Override the trigger's capacity, as a fraction of C (the boundary
    /// sweep of docs/storm.md).
    #[arg(long)]
    trigger_capacity: Option<f64>,
    /// Override the trigger's length in seconds.
    #[arg(long)]
    trigger_seconds: Option<f64>,
    /// Override the caller's timeout T in seconds (the scenarios' is 2).
    #[arg(long)]
    timeout: Option<f64>,
    /// What the workers tell the service besides their failures (the
    /// service's policies; a run not `all` is named `POLICY/REPORTS`).
    #[arg(long, value_enum, default_value_t = Reports::All)]
    reports: Reports,
    /// The retry-budget binary (default: `retry-budget` beside this one).
    #[arg(long)]
    server_bin: Option<PathBuf>,
}

/// The policies of the lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PolicyName {
    None,
    Naive,
    Backoff,
    Aws,
    Grpc,
    Finagle,
    RbDefault,
    RbStatic100,
    RbLow,
    RbRatio,
    RbStatic2,
    RbStatic5,
    RbStatic20,
    RbStatic40,
}

impl PolicyName {
    /// The per-client rule, for the policies that are one.
    fn rule(self) -> Option<Rule> {
        match self {
            PolicyName::None => Some(Rule::None),
            PolicyName::Naive => Some(Rule::Naive),
            PolicyName::Backoff => Some(Rule::Backoff),
            PolicyName::Aws => Some(Rule::AwsQuota),
            PolicyName::Grpc => Some(Rule::GrpcThrottle),
            PolicyName::Finagle => Some(Rule::Finagle),
            _ => None,
        }
    }

    /// The server's configuration, for the retry-budget policies.
    fn config(self) -> Option<Config> {
        match self {
            PolicyName::RbDefault => Some(Config::Default),
            PolicyName::RbStatic100 => Some(Config::Static100),
            PolicyName::RbLow => Some(Config::Low),
            PolicyName::RbRatio => Some(Config::Ratio),
            PolicyName::RbStatic2 => Some(Config::Static2),
            PolicyName::RbStatic5 => Some(Config::Static5),
            PolicyName::RbStatic20 => Some(Config::Static20),
            PolicyName::RbStatic40 => Some(Config::Static40),
            _ => None,
        }
    }

    fn name(self) -> String {
        self.to_possible_value()
            .expect("every policy has a name")
            .get_name()
            .to_owned()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let mut timeline = if args.short {
        Timeline::SHORT
    } else if args.scenario.long() {
        Timeline::LONG
    } else {
        Timeline::FULL
    };
    if let Some(seconds) = args.trigger_seconds {
        timeline.trigger = seconds;
    }
    let mut setup = Setup::new(args.scenario, args.capacity, timeline, args.seed);
    if let Some(seconds) = args.timeout {
        setup.timeout = std::time::Duration::from_secs_f64(seconds);
    }
    if let Some(fraction) = args.trigger_capacity {
        setup.trigger_capacity = fraction;
    }
    let config = args.policy.config();
    let policy = match (args.policy.rule(), config) {
        (Some(rule), _) => run::Policy::Client(rule),
        (None, config) => {
            let binary = args.server_bin.clone().unwrap_or_else(|| {
                std::env::current_exe()
                    .ok()
                    .and_then(|exe| exe.parent().map(|dir| dir.join("retry-budget")))
                    .unwrap_or_else(|| PathBuf::from("retry-budget"))
            });
            match Server::start(&binary, config.unwrap_or(Config::Default)).await {
                Ok(server) => run::Policy::Service(Box::new(server)),
                Err(error) => {
                    eprintln!("retry-budget-storm: {error}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let reports = match (config, args.reports) {
        (None, _) | (_, Reports::All) => Reports::All,
        (Some(_), reports) => reports,
    };
    let name = match reports {
        Reports::All => args.policy.name(),
        Reports::Records => format!("{}/records-only", args.policy.name()),
        Reports::None => format!("{}/no-reports", args.policy.name()),
    };
    let mut out = json!({
        "policy": name,
        "scenario": args.scenario.to_possible_value().map(|v| v.get_name().to_owned()),
        "seed": args.seed,
        "capacity": setup.capacity,
        "rho": setup.rho,
        "trigger_capacity": setup.trigger_capacity,
        "workers": setup.workers,
        "healthy_setup": setup.healthy.map(|h| json!({
            "capacity": h.capacity,
            "rho": h.rho,
            "fail_probability": h.fail_probability,
        })),
        "timeout_s": setup.timeout.as_secs_f64(),
        "short": args.short,
        "trigger_start": timeline.trigger_start(),
        "trigger_end": timeline.trigger_end(),
        "server_flags": config.map(|c| c.flags().join(" ")),
        "server_commit": config.map(|_| commit()),
        "service_outage": setup.service_outage.map(|o| json!({
            "start": timeline.trigger_start() + o.into_trigger,
            "down_s": o.down,
        })),
    });
    let figures = run::run(setup, policy, reports).await;
    if let (Some(out), serde_json::Value::Object(figures)) = (out.as_object_mut(), figures) {
        out.extend(figures);
    }
    println!("{out}");
    ExitCode::SUCCESS
}

/// The commit of the checkout the lab runs in (the server it starts is
/// built from it by run.sh), with `-dirty` when its sources differ from it.
fn commit() -> String {
    // run.sh names the commit the server was built from, before the build:
    // the checkout may move on while a long lab runs.
    if let Ok(commit) = std::env::var("STORM_SERVER_COMMIT") {
        return commit;
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".into();
    };
    match git(&[
        "status",
        "--porcelain",
        "--",
        "src",
        "proto",
        "migrations",
        "Cargo.lock",
    ]) {
        Some(changes) if changes.is_empty() => head,
        _ => format!("{head}-dirty"),
    }
}
