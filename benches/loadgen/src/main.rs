//! `retry-budget-loadgen`: the load generator of `BENCHMARKS.md` (its method says what it
//! measures; the scripts in `benches/` run it). One JSON object a run on stdout.
//!
//! - `--mode closed`: each of `--concurrency` virtual clients, over `--connections` HTTP/2
//!   connections, sends its next request when the last returns (throughput).
//! - `--mode open --rate R`: requests fall due R a second whatever the server does, and each
//!   latency runs from its due time (no coordinated omission); `pacer_lag_us` is how late the
//!   generator itself came to its due times, waits for an idle client left out.
//! - Only requests sent after `--warmup` and done within `--duration` after it count.
//! - `--client h2` sends each request prepared once over the `h2` crate, for the scenarios
//!   whose every request is the same: it costs the generator about 40% less a request than
//!   tonic's clients, and the open loop of `run.sh` keeps its schedule with it.
#![forbid(unsafe_code)]

mod conn;
mod drive;
mod engines;
mod mixed;
mod preload;
mod probe;
mod scenario;
mod stored;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use retry_budget::grpc::pb::retry_budget_client::RetryBudgetClient;
use serde_json::{Value, json};
use tonic::metadata::MetadataValue;
use tonic_health::pb::health_client::HealthClient;

use crate::conn::{Conn, Prepared, RawClient, RawConn};
use crate::mixed::Mixed;
use crate::scenario::{VirtualClient, Walk};
use crate::stored::{Rng, Stored};

/// As in the server: with the system allocator the generator spent about 7% of its time in
/// it in the open loop.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Drives a retry-budget server and prints one JSON object a run.
#[derive(Debug, Parser)]
#[command(name = "retry-budget-loadgen", version)]
struct Args {
    /// What to send.
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// The server.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    target: String,
    /// HTTP/2 connections; virtual clients are spread over them.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Virtual clients: the most requests in flight at once.
    #[arg(long, default_value_t = 128)]
    concurrency: usize,
    /// How long to measure, after the warm-up.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// How long to send before measuring.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Closed loop (throughput) or open loop at `--rate` (latency).
    #[arg(long, value_enum, default_value_t = Mode::Closed)]
    mode: Mode,
    /// Requests a second in all, for the open loop.
    #[arg(long)]
    rate: Option<f64>,
    /// tonic's generated clients, or each request prepared once and sent over h2 (health,
    /// retry-delay and pure-next-action).
    #[arg(long, value_enum, default_value_t = Client::Tonic)]
    client: Client,
    /// Durable and mixed: the failures reported an activity.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    attempts: u32,
    /// Mixed: tenants `t0000` to `t{N-1}`, one drawn for each activity.
    #[arg(long, default_value_t = 1000)]
    tenants: u64,
    /// The tenant of durable reports.
    #[arg(long, default_value = "bench")]
    tenant: String,
    /// Preload and new-activities: how many to write; stored-next-action: how many are stored.
    #[arg(long, default_value_t = 1000)]
    activities: u64,
    /// Stored-next-action: where each activity's next attempt is kept from run to run.
    #[arg(long)]
    attempts_file: Option<PathBuf>,
    /// Preload: the PostgreSQL database to import the activities into.
    #[arg(long)]
    postgres_url: Option<String>,
    /// Preload: the data directory of a stopped server; fsync: the directory to measure.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The server's process id, to report the CPU it used in the window.
    #[arg(long)]
    server_pid: Option<u32>,
    /// The dependency durable reports name (empty: the default one).
    #[arg(long, default_value = "")]
    dependency: String,
    /// A label copied into the output, to group runs.
    #[arg(long, default_value = "")]
    label: String,
    /// Runtime threads; 1 is a current-thread runtime.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Engine-writes: the engine, fjall or redb.
    #[arg(long, default_value = "fjall")]
    engine: String,
    /// Engine-writes: records a committed and fsynced batch.
    #[arg(long, default_value_t = 256)]
    batch_size: u64,
    /// Prefix of durable activity ids, unique a run (default: the time).
    #[arg(long)]
    run_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// `grpc.health.v1.Health/Check`: the no-op baseline through the same stack.
    Health,
    /// `RetryDelay("flight-1", 4)`.
    RetryDelay,
    /// `NextAction` with a budget: nothing stored.
    PureNextAction,
    /// Each client walks its own activities through attempts 1 to `--attempts`.
    DurableNextAction,
    /// The next attempt of one of `--activities` preloaded activities, drawn uniformly.
    StoredNextAction,
    /// Failures, deferrals waited out and successes over `--tenants` tenants (soak.sh).
    Mixed,
    /// One first failure for each of `--activities` new activities, then stop (rss.sh).
    NewActivities,
    /// First failures of `--activities` activities straight into the store of a stopped
    /// server (`--data-dir`) or imported into PostgreSQL (`--postgres-url`).
    Preload,
    /// 4 KiB appended and fsynced, then written over with fdatasync, in `--data-dir`.
    Fsync,
    /// `--activities` records into `--engine` (fjall or redb) in fsynced batches of
    /// `--batch-size`, in `--data-dir`: the engines' bound on this disk (engines.rs).
    EngineWrites,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Closed,
    Open,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Client {
    Tonic,
    H2,
}

fn main() -> ExitCode {
    let args = Args::parse();
    scenario::DEPENDENCY
        .set(args.dependency.clone())
        .expect("set once");
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(args.threads).enable_all().build()
    };
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run(&args)),
        Err(error) => Err(format!("cannot start the runtime: {error}")),
    };
    match result {
        Ok(mut report) => {
            report["label"] = json!(args.label);
            report["unix_time"] = json!(unix_millis() / 1000);
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("retry-budget-loadgen: {error}");
            ExitCode::FAILURE
        }
    }
}

fn invalid(what: &str) -> String {
    format!("invalid arguments: {what}")
}

async fn run(args: &Args) -> Result<Value, String> {
    let run_id = args
        .run_id
        .clone()
        .unwrap_or_else(|| format!("{:x}", unix_millis()));
    if args.concurrency == 0 || args.connections == 0 {
        return Err(invalid(
            "--concurrency and --connections must be at least 1",
        ));
    }
    let dir = args.data_dir.as_deref();
    match args.scenario {
        Scenario::Fsync => {
            let dir = dir.ok_or_else(|| invalid("fsync needs --data-dir"))?;
            return probe::fsync_latency(dir).map_err(|e| format!("i/o: {e}"));
        }
        Scenario::EngineWrites => {
            let dir = dir.ok_or_else(|| invalid("engine-writes needs --data-dir"))?;
            return engines::writes(dir, &args.engine, args.activities, args.batch_size);
        }
        Scenario::Preload => {
            return match (dir, &args.postgres_url) {
                (Some(dir), _) => preload::offline(dir, args.activities, &args.tenant).await,
                (None, Some(url)) => preload::postgres(url, args.activities, &args.tenant).await,
                _ => Err(invalid("preload needs --data-dir or --postgres-url")),
            };
        }
        Scenario::NewActivities => {
            let prefix = format!("n{run_id}-");
            let conns = connect(args, Conn::connect).await?;
            let (concurrency, activities) = (args.concurrency, args.activities);
            let report =
                preload::first_failures(&conns, concurrency, &args.tenant, &prefix, activities)
                    .await;
            return Ok(with_settings(report, args));
        }
        _ => {}
    }
    let stored = match args.scenario {
        Scenario::StoredNextAction => {
            let stored = Stored::load(args.activities, args.attempts_file.as_deref());
            Some(Arc::new(stored.map_err(|e| format!("i/o: {e}"))?))
        }
        _ => None,
    };
    let clients = clients(args, &run_id, stored.as_ref()).await?;
    let timing = drive::Timing {
        warmup: args.warmup,
        duration: args.duration,
        server_pid: args.server_pid,
    };
    let mut report = match (args.mode, args.rate) {
        (Mode::Closed, _) => drive::closed(clients, timing).await,
        (Mode::Open, Some(rate)) if rate.is_finite() && rate > 0.0 => {
            drive::open(clients, timing, rate).await
        }
        (Mode::Open, _) => return Err(invalid("--mode open needs --rate > 0")),
    };
    report["mode"] = name(args.mode);
    report["warmup_s"] = json!(args.warmup.as_secs_f64());
    report["duration_s"] = json!(args.duration.as_secs_f64());
    if matches!(args.scenario, Scenario::DurableNextAction | Scenario::Mixed) {
        report["attempts_per_activity"] = json!(args.attempts);
    }
    if args.scenario == Scenario::Mixed {
        report["tenants"] = json!(args.tenants);
    }
    if let Some(stored) = &stored {
        stored.save().map_err(|e| format!("i/o: {e}"))?;
        stored.write_into(&mut report);
    }
    Ok(with_settings(report, args))
}

/// The run's settings, added to its report.
fn with_settings(mut report: Value, args: &Args) -> Value {
    report["scenario"] = name(args.scenario);
    report["target"] = json!(args.target);
    report["client"] = name(args.client);
    report["connections"] = json!(args.connections);
    report["concurrency"] = json!(args.concurrency);
    report["tenant"] = json!(args.tenant);
    report
}

/// A flag's value as the command line spells it.
fn name(value: impl ValueEnum) -> Value {
    json!(value.to_possible_value().map(|v| v.get_name().to_owned()))
}

/// The virtual clients, spread over `--connections` connections.
async fn clients(
    args: &Args,
    run_id: &str,
    stored: Option<&Arc<Stored>>,
) -> Result<Vec<VirtualClient>, String> {
    if args.client == Client::H2 {
        let prepared = Prepared::of(args.scenario).map_err(|e| invalid(&e))?;
        let conns = connect(args, RawConn::connect).await?;
        let raw = |i: usize| VirtualClient::Raw(RawClient::new(&conns[i % conns.len()], &prepared));
        return Ok((0..args.concurrency).map(raw).collect());
    }
    let conns = connect(args, Conn::connect).await?;
    let tenant = MetadataValue::try_from(&args.tenant);
    let tenant = tenant.unwrap_or_else(|_| MetadataValue::from_static("bench"));
    let seed = u64::try_from(unix_millis()).unwrap_or(0);
    let client = |i: usize| {
        let (conn, prefix) = (conns[i % conns.len()].clone(), format!("b{run_id}-{i}-"));
        let budget = RetryBudgetClient::new(conn.clone());
        match (args.scenario, stored) {
            (Scenario::Health, _) => VirtualClient::Health(HealthClient::new(conn)),
            (Scenario::RetryDelay, _) => VirtualClient::RetryDelay(budget),
            (Scenario::PureNextAction, _) => VirtualClient::PureNextAction(budget),
            (Scenario::StoredNextAction, Some(stored)) => {
                let rng = Rng::new(seed.wrapping_add(i as u64));
                VirtualClient::Stored(budget, tenant.clone(), Arc::clone(stored), rng)
            }
            (Scenario::Mixed, _) => {
                VirtualClient::Mixed(budget, Mixed::new(&prefix, args.attempts, args.tenants))
            }
            // Durable: the other scenarios ran in `run`.
            _ => VirtualClient::Durable(budget, Walk::new(tenant.clone(), prefix, args.attempts)),
        }
    };
    Ok((0..args.concurrency).map(client).collect())
}

/// Opens `--connections` connections before the run, so connecting is not measured.
async fn connect<C, F>(args: &Args, open: fn(String) -> F) -> Result<Vec<C>, String>
where
    F: Future<Output = Result<C, String>>,
{
    let mut conns = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let conn = open(args.target.clone()).await;
        conns.push(conn.map_err(|e| format!("cannot connect to {}: {e}", args.target))?);
    }
    Ok(conns)
}

fn unix_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}
