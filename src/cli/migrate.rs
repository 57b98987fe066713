//! `retry-budget migrate`: copies an embedded store into PostgreSQL, with a
//! progress bar (see `store::copy`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::{ENV_DATA_DIR, ENV_POSTGRES_URL};
use crate::config::DEFAULT_DATA_DIR;
use crate::store::{EmbeddedStore, EmbeddedStoreOptions, PgStore, PostgresOptions, copy};

/// Options of `migrate`.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// The embedded store's directory (the server using it must be stopped).
    #[arg(long, env = ENV_DATA_DIR, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// The PostgreSQL database to copy into; its schema is created if need be.
    #[arg(long, env = ENV_POSTGRES_URL, hide_env_values = true)]
    pub postgres_url: String,
    /// A CA certificate (PEM) to verify the database's TLS certificate
    /// with, besides the system's roots; requires TLS.
    #[arg(long)]
    pub db_ca_file: Option<PathBuf>,
    /// Activities a transaction carries.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Copy every activity again instead of resuming after the last one an
    /// earlier run committed (records already there at the same or a later
    /// version are kept).
    #[arg(long)]
    pub from_start: bool,
}

/// Runs the copy and says what it did.
pub async fn migrate(args: &MigrateArgs) -> ExitCode {
    match run(args).await {
        Ok(copied) => {
            eprintln!(
                "copied {} of {} activities into PostgreSQL ({} by an earlier run)",
                copied.copied, copied.total, copied.resumed_from
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("retry-budget migrate: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &MigrateArgs) -> Result<copy::Copied, String> {
    if !args.data_dir.is_dir() {
        return Err(format!(
            "{}: no such data directory",
            args.data_dir.display()
        ));
    }
    let source = std::fs::canonicalize(&args.data_dir)
        .map_err(|e| format!("{}: {e}", args.data_dir.display()))?
        .display()
        .to_string();
    let from = EmbeddedStore::open(&EmbeddedStoreOptions::new(&args.data_dir))
        .map_err(|e| e.to_string())?;
    let to = PgStore::open(&PostgresOptions {
        url: args.postgres_url.clone(),
        pool_size: 2,
        timeout: Duration::from_secs(30),
        max_batch: args.batch,
        ca_file: args.db_ca_file.clone(),
    })
    .map_err(|e| e.to_string())?;
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} activities  {per_sec}  eta {eta}")
            .map_err(|e| e.to_string())?,
    );
    let copied = copy::embedded_to_postgres(
        &from,
        &source,
        &to,
        args.batch,
        args.from_start,
        |n, total| {
            bar.set_length(total);
            bar.set_position(n);
        },
    )
    .await
    .map_err(|e| e.to_string());
    bar.finish_and_clear();
    copied
}
