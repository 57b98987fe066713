//! The `retry-budget` binary: parse, set up logging, hand over to the
//! library.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use retry_budget::cli::{Cli, Command};
use tracing_subscriber::EnvFilter;

/// mimalloc instead of the system allocator: a request allocates and frees
/// many small buffers, often on different threads (a record built on a
/// runtime worker is dropped by the checkpoint thread). See BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let serve = match cli.command {
        None => cli.serve,
        Some(Command::Serve(args)) => args,
        Some(other) => return retry_budget::cli::run_client(other).await,
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // mimalloc asks for transparent huge pages for its arenas; a 2 MiB page
    // is then zeroed whole when it faults in again after a purge. Without
    // them, in the durable benchmark, the peak RSS was 134 MiB instead of 150
    // to 155 and the server CPU a decision 17.2 to 17.9 us instead of 18.5
    // to 18.9 (three pairs of 4 s windows; BENCHMARKS.md).
    #[cfg(target_os = "linux")]
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(%error, "cannot turn transparent huge pages off");
    }
    let config = match serve.config() {
        Ok(config) => config,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(serve.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, addr = %serve.listen, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    match retry_budget::server::run(listener, config, shutdown_signal()).await {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::error!(%error, "server failed");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM (how orchestrators stop a process) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}
