//! The `retry-budget` binary: parse, set up logging, hand over to the
//! library.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use retry_budget::cli::{Cli, Command, LogFormat};
use tracing_subscriber::EnvFilter;

/// mimalloc instead of the system allocator: a request allocates and frees
/// many small buffers, often on different threads (a record encoded on a
/// runtime worker is freed by the store's writer), which the system
/// allocator serves through contended arenas.
/// The `system-allocator` feature leaves it out, for tools that see only
/// `malloc` (valgrind's DHAT).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("retry-budget: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run())
}

/// tokio's multi-thread runtime, without its LIFO slot where the build
/// allows it (`--cfg tokio_unstable`, set in `.cargo/config.toml`): a
/// connection's task woken by an HTTP/2 stream that completes then runs
/// after the other streams that are ready, and writes their responses in
/// one `writev` instead of one each.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder.build()
}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    let serve = match cli.command {
        None => cli.serve,
        Some(Command::Serve(args)) => *args,
        Some(other) => return retry_budget::cli::run_client(other).await,
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match serve.log_format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // The event's fields at the top level of each object, so that a log
        // pipeline finds `tenant`, `activity`, `trace_id` by name.
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
    if !cfg!(tokio_unstable) {
        tracing::warn!(
            "built without --cfg tokio_unstable (RUSTFLAGS replaces .cargo/config.toml): \
             the runtime keeps its LIFO slot and writes responses one by one, \
             at more server CPU a request (docs/design.md, \"The runtime\")"
        );
    }
    // mimalloc asks for transparent huge pages for its arenas; a 2 MiB page
    // is then zeroed whole when it faults in again after a purge, which
    // costs more memory and CPU than 4 KiB pages do.
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
    if serve.print_config {
        return match config.to_toml() {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                tracing::error!(%error, "cannot print the configuration");
                ExitCode::FAILURE
            }
        };
    }
    let shutdown = shutdown_signal();
    let addr = config.server.listen;
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, %addr, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    let reloads = reload_on_sighup(serve);
    match retry_budget::server::run_reloading(listener, config, shutdown, reloads).await {
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

/// On every SIGHUP, the configuration read again (file, environment and
/// flags, as at start) for the server to apply; `None` where there is no
/// SIGHUP.
fn reload_on_sighup(
    serve: retry_budget::cli::ServeArgs,
) -> Option<tokio::sync::mpsc::UnboundedReceiver<retry_budget::server::Reload>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGHUP: no reloads");
                return None;
            }
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                tracing::info!("SIGHUP received: reading the configuration again");
                if tx.send(serve.config()).is_err() {
                    return;
                }
            }
        });
        Some(rx)
    }
    #[cfg(not(unix))]
    {
        let _ = serve;
        None
    }
}

/// Resolves on SIGTERM (how orchestrators stop a process) or Ctrl-C.
///
/// The handlers are installed here, before the listener is bound, and not
/// when the future is first polled: a connection task may answer a health
/// check SERVING before the serve loop polls its shutdown, and a SIGTERM in
/// that window would kill the process undrained.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        let listen = |kind: SignalKind, name: &'static str| -> Option<Signal> {
            signal(kind)
                .inspect_err(|error| tracing::error!(%error, "cannot listen for {name}"))
                .ok()
        };
        let mut term = listen(SignalKind::terminate(), "SIGTERM");
        let mut interrupt = listen(SignalKind::interrupt(), "Ctrl-C");
        async move {
            tokio::select! {
                () = received(interrupt.as_mut()) => tracing::info!("Ctrl-C received"),
                () = received(term.as_mut()) => tracing::info!("SIGTERM received"),
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
        tracing::info!("Ctrl-C received");
    }
}

/// The next `signal`, or never when it could not be listened for.
#[cfg(unix)]
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => drop(signal.recv().await),
        None => std::future::pending().await,
    }
}
