//! `retry-budget-loadgen`: the load generator of `BENCHMARKS.md`.
//!
//! A tonic client that drives a running `retry-budget` server with many
//! concurrent streams over a few HTTP/2 connections and prints one JSON
//! object a run on stdout, so `benches/run.sh` can collect runs as JSON
//! lines.
//!
//! # Modes
//! - `--mode closed`: each of `--concurrency` virtual clients sends its next
//!   request as soon as the previous one returns. What it measures is
//!   throughput: how many requests the server completes a second when it is
//!   never idle.
//! - `--mode open --rate R`: requests fall due at fixed intervals, `R` a
//!   second in all, whatever the server does. Each latency runs from the
//!   time the request was *due*, not from when it was sent, so a stall
//!   counts against every request that waited behind it (no coordinated
//!   omission). `pacer_lag_us` says how late the generator itself came to
//!   each due time, leaving out what it inherited from waits for an idle
//!   client; `send_lag_us` is all of the lateness at release, those waits
//!   (every client busy: the server is slow to answer) included.
//!
//! Only requests that start after `--warmup` and finish within
//! `--duration` after it are counted.
//!
//! # Clients
//! - `--client tonic` (the default): tonic's generated clients on hyper, as a
//!   worker would call the service.
//! - `--client h2`: each scenario's one request encoded once and sent over
//!   the `h2` crate, the answer decoded and checked as the tonic client
//!   does; the server receives the same request. It costs the generator
//!   about 40% less a request, and the open loop of `benches/run.sh` uses
//!   it so that the generator keeps its schedule. Not for the durable
//!   scenario, whose requests differ each time.
//!
//! # Scenarios
//! - `health`: `grpc.health.v1.Health/Check`, the no-op baseline through the
//!   same stack.
//! - `retry-delay`: `RetryDelay("flight-1", 4)`.
//! - `pure-next-action`: `NextAction` with a budget (nothing stored) and an
//!   activity id, so a retry delay is planned.
//! - `durable-next-action`: `NextAction` in its durable form: each virtual
//!   client walks its own activities through attempts `1..=--attempts`,
//!   reporting each failure at the previous answer's `not_before`, under a
//!   policy generous enough that every answer is a scheduled retry.
//! - `new-activities`: `NextAction` in its durable form for `--activities`
//!   activities the server has never seen (ids `n{run}-00000000` on), one
//!   first failure each, `--concurrency` in flight, each sent as soon as one
//!   returns, until all are written; each answer must be a scheduled retry,
//!   not a replay. The write path at full speed with nothing preloaded
//!   (`benches/rss.sh`). Counts the whole run; no warm-up or window.
//! - `stored-next-action`: `NextAction` in its durable form over the
//!   `--activities` preloaded activities: each request reports the next
//!   attempt of one drawn uniformly among them, so reads hit old rows
//!   (`--attempts-file` carries the attempts from one run to the next).
//! - `mixed`: durable reports, deferrals and successes over `--tenants`
//!   tenants: each virtual client reports `--attempts` failures of an
//!   activity, then its success, and waits out a deferral's `not_before`
//!   (by the wall clock) while it goes on with other activities; every
//!   answer must be a fresh scheduled retry or a deferral (`benches/soak.sh`,
//!   with a retry rate below the retries sent).
//! - `preload`: reports first failures for `--activities` distinct
//!   activities as fast as it can: over gRPC, or, with `--data-dir`, straight
//!   into the store of a stopped server (much faster), or, with
//!   `--postgres-url`, the same records imported into PostgreSQL in large
//!   batches.
//! - `fsync`: writes and fsyncs 4 KiB `--fsyncs` times in `--data-dir` and
//!   reports the latency, to set decisions against the disk they wait on;
//!   then the same writes over the blocks the file has (as in a recycled
//!   journal segment), each with an `fdatasync`.
//!
//! # Layout
//! - `scenario`: what one request of each scenario is, and its check.
//! - `conn`: the tonic clients' HTTP/2 connection; `raw`: the h2 client.
//! - `drive`: the closed and open loops and what they count.
//! - `writes`: many distinct activities written over gRPC (`new-activities`,
//!   the online preload).
//! - `preload`: activities stored before a run; `stored`: the attempts of
//!   the stored-activities scenario.
//! - `probe`: fsync latency and CPU time from `/proc`.
#![forbid(unsafe_code)]

mod conn;
mod drive;
mod mixed;
mod preload;
mod probe;
mod raw;
mod scenario;
mod stored;
mod writes;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use conn::Conn;
use serde_json::{Value, json};

use crate::raw::{Prepared, RawClient, RawConn};
use crate::scenario::{Kind, TonicClients, Transport, VirtualClient};
use crate::stored::Stored;

/// mimalloc, as in the server: the generator allocates for every request;
/// the system allocator took about 7% of its time in the open loop (perf),
/// and with mimalloc a request costs it an eighth fewer instructions
/// (callgrind, closed-loop health).
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
    /// How requests are sent: tonic's generated clients, or each
    /// scenario's one request prepared once and sent over the h2 crate
    /// (health, retry-delay and pure-next-action only), which costs the
    /// generator less a request.
    #[arg(long, value_enum, default_value_t = Client::Tonic)]
    client: Client,
    /// Durable scenario: the attempts each activity is walked through.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    attempts: u32,
    /// Mixed: tenants `t0000` to `t{N-1}`, one drawn for each activity.
    #[arg(long, default_value_t = 1000)]
    tenants: u64,
    /// The tenant of durable reports (`x-tenant-id`).
    #[arg(long, default_value = "bench")]
    tenant: String,
    /// Preload and new-activities: how many distinct activities to write;
    /// stored-next-action: how many are stored.
    #[arg(long, default_value_t = 1000)]
    activities: u64,
    /// Stored-next-action: where each activity's next attempt is kept from
    /// one run to the next (created at the end of the first run).
    #[arg(long)]
    attempts_file: Option<PathBuf>,
    /// Preload: the PostgreSQL database to import the activities into.
    #[arg(long)]
    postgres_url: Option<String>,
    /// Preload into PostgreSQL: imports in flight at once, each a
    /// transaction on its own connection.
    #[arg(long, default_value_t = 2)]
    import_connections: usize,
    /// Preload into PostgreSQL: activities an import carries.
    #[arg(long, default_value_t = 5000)]
    import_batch: usize,
    /// Preload: the data directory of a stopped server, to write its store
    /// directly; fsync: the directory whose disk to measure.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// fsync: how many 4 KiB writes to fsync.
    #[arg(long, default_value_t = 200)]
    fsyncs: u32,
    /// The server's process id, to report the CPU it used in the window.
    #[arg(long)]
    server_pid: Option<u32>,
    /// The dependency durable reports name (empty: the default one).
    #[arg(long, default_value = "")]
    dependency: String,
    /// A free-form label copied into the output, to group runs.
    #[arg(long, default_value = "")]
    label: String,
    /// Runtime threads of the generator; 1 is a current-thread runtime.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Prefix of durable activity ids, unique a run (default: the time), so
    /// runs against the same store never replay each other's activities.
    #[arg(long)]
    run_id: Option<String>,
}

/// What to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Health,
    RetryDelay,
    PureNextAction,
    DurableNextAction,
    StoredNextAction,
    Mixed,
    NewActivities,
    Preload,
    Fsync,
}

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Closed,
    Open,
}

/// How requests are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Client {
    Tonic,
    H2,
}

/// The load generator failed.
#[derive(Debug, thiserror::Error)]
enum LoadgenError {
    /// The flags do not describe a run.
    #[error("invalid arguments: {0}")]
    Invalid(String),
    /// A connection to the server failed.
    #[error("cannot connect to {target}: {reason}")]
    Connect { target: String, reason: String },
    /// Preloading the store failed.
    #[error("preload: {0}")]
    Preload(String),
    /// A file operation failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

fn main() -> ExitCode {
    let args = Args::parse();
    scenario::DEPENDENCY
        .set(args.dependency.clone())
        .expect("set once, first");
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("retry-budget-loadgen: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(mut report) => {
            report["label"] = json!(args.label);
            report["unix_time"] = json!(unix_seconds());
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("retry-budget-loadgen: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<Value, LoadgenError> {
    let run_id = args
        .run_id
        .clone()
        .unwrap_or_else(|| format!("{:x}", unix_millis()));
    let kind = match args.scenario {
        Scenario::Fsync => {
            let dir = args
                .data_dir
                .as_deref()
                .ok_or_else(|| LoadgenError::Invalid("--scenario fsync needs --data-dir".into()))?;
            return Ok(probe::fsync_latency(dir, args.fsyncs)?);
        }
        Scenario::Preload => {
            if let Some(dir) = &args.data_dir {
                return preload::offline(dir, args.activities, &args.tenant).await;
            }
            if let Some(url) = &args.postgres_url {
                return preload::postgres(url, args).await;
            }
            let channels = connect(args).await?;
            return Ok(preload::online(&channels, args).await);
        }
        Scenario::NewActivities => return new_activities(args, &run_id).await,
        Scenario::Health => Kind::Health,
        Scenario::RetryDelay => Kind::RetryDelay,
        Scenario::PureNextAction => Kind::PureNextAction,
        Scenario::DurableNextAction => Kind::Durable {
            attempts: args.attempts,
        },
        Scenario::StoredNextAction => Kind::Stored,
        Scenario::Mixed => Kind::Mixed {
            attempts: args.attempts,
            tenants: args.tenants,
        },
    };
    if args.concurrency == 0 || args.connections == 0 {
        return Err(LoadgenError::Invalid(
            "--concurrency and --connections must be at least 1".into(),
        ));
    }
    let stored = if kind == Kind::Stored {
        Some(Arc::new(Stored::load(
            args.activities,
            args.attempts_file.as_deref(),
        )?))
    } else {
        None
    };
    let transports = transports(args, kind).await?;
    let seed = u64::try_from(unix_millis()).unwrap_or(0);
    let clients: Vec<VirtualClient> = transports
        .into_iter()
        .enumerate()
        .map(|(i, transport)| {
            let client =
                VirtualClient::new(kind, transport, &args.tenant, &format!("b{run_id}-{i}-"));
            match &stored {
                Some(stored) => client.with_stored(Arc::clone(stored), seed.wrapping_add(i as u64)),
                None => client,
            }
        })
        .collect();
    let timing = drive::Timing {
        warmup: args.warmup,
        duration: args.duration,
        server_pid: args.server_pid,
    };
    let (tally, mut report) = match args.mode {
        Mode::Closed => drive::closed(clients, timing).await,
        Mode::Open => {
            let rate = args
                .rate
                .filter(|r| r.is_finite() && *r > 0.0)
                .ok_or_else(|| LoadgenError::Invalid("--mode open needs --rate > 0".into()))?;
            drive::open(clients, timing, rate).await
        }
    };
    let scenario = args
        .scenario
        .to_possible_value()
        .map(|v| v.get_name().to_owned());
    report["scenario"] = json!(scenario);
    report["mode"] = json!(if args.mode == Mode::Open {
        "open"
    } else {
        "closed"
    });
    report["target"] = json!(args.target);
    report["client"] = json!(if args.client == Client::H2 {
        "h2"
    } else {
        "tonic"
    });
    report["connections"] = json!(args.connections);
    report["concurrency"] = json!(args.concurrency);
    report["warmup_s"] = json!(args.warmup.as_secs_f64());
    report["duration_s"] = json!(args.duration.as_secs_f64());
    if let Kind::Durable { attempts } = kind {
        report["attempts_per_activity"] = json!(attempts);
    }
    if let Kind::Mixed { attempts, tenants } = kind {
        report["attempts_per_activity"] = json!(attempts);
        report["tenants"] = json!(tenants);
    }
    if let Some(stored) = &stored {
        stored.save()?;
        stored.write_into(&mut report);
    }
    tally.write_into(&mut report);
    Ok(report)
}

/// Writes `--activities` new activities as fast as the server answers.
async fn new_activities(args: &Args, run_id: &str) -> Result<Value, LoadgenError> {
    if args.concurrency == 0 || args.activities == 0 {
        return Err(LoadgenError::Invalid(
            "--concurrency and --activities must be at least 1".into(),
        ));
    }
    let conns = connect(args).await?;
    let prefix = format!("n{run_id}-");
    let mut report = writes::first_failures(
        &conns,
        args.concurrency,
        &args.tenant,
        &prefix,
        args.activities,
    )
    .await;
    report["scenario"] = json!("new-activities");
    report["mode"] = json!("closed");
    report["target"] = json!(args.target);
    report["client"] = json!("tonic");
    report["connections"] = json!(args.connections);
    report["concurrency"] = json!(args.concurrency);
    report["tenant"] = json!(args.tenant);
    report["first_id"] = json!(writes::activity_id(&prefix, 0));
    Ok(report)
}

/// A transport for each of `--concurrency` virtual clients, spread over
/// `--connections` connections.
async fn transports(args: &Args, kind: Kind) -> Result<Vec<Transport>, LoadgenError> {
    let n = args.concurrency;
    Ok(match args.client {
        Client::Tonic => {
            let conns = connect(args).await?;
            (0..n)
                .map(|i| Transport::Tonic(TonicClients::new(conns[i % conns.len()].clone())))
                .collect()
        }
        Client::H2 => {
            let prepared = Prepared::of(kind).map_err(LoadgenError::Invalid)?;
            let mut conns = Vec::with_capacity(args.connections);
            for _ in 0..args.connections {
                conns.push(RawConn::connect(&args.target).await.map_err(|reason| {
                    LoadgenError::Connect {
                        target: args.target.clone(),
                        reason,
                    }
                })?);
            }
            (0..n)
                .map(|i| Transport::Raw(RawClient::new(&conns[i % conns.len()], &prepared)))
                .collect()
        }
    })
}

/// Opens `--connections` HTTP/2 connections, eagerly, so connecting is not
/// part of the measurement.
async fn connect(args: &Args) -> Result<Vec<Conn>, LoadgenError> {
    let mut conns = Vec::with_capacity(args.connections);
    for _ in 0..args.connections.max(1) {
        let conn = Conn::connect(&args.target)
            .await
            .map_err(|reason| LoadgenError::Connect {
                target: args.target.clone(),
                reason,
            })?;
        conns.push(conn);
    }
    Ok(conns)
}

fn unix_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
