//! `[store]`: where activities are kept (the embedded store, or
//! PostgreSQL when a URL is given) and how writes are grouped and swept.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::{PostgresOptions, RedbStoreOptions, RuntimeIdle};

/// `[store]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// The directory of the embedded store (created if missing).
    pub data_dir: PathBuf,
    /// The most decisions one group commit (one fsync) carries; 1 commits
    /// each decision alone. 1 to 65536.
    pub max_batch: usize,
    /// Under load, how long from the start of one group commit the next may
    /// wait for decisions to share its fsync (see `RedbStoreOptions`).
    #[serde(with = "super::duration")]
    pub commit_window: Duration,
    /// A journal segment this large (bytes) is checkpointed into the
    /// database; decisions waiting for a checkpoint are held in memory.
    /// 1 KiB to 1 GiB.
    pub journal_segment_bytes: u64,
    /// A journal segment older than this is checkpointed even when small.
    #[serde(with = "super::duration")]
    pub journal_segment_age: Duration,
    /// Journal bytes waiting for a checkpoint past which saves are refused
    /// (`UNAVAILABLE`, `store_backlogged`) until checkpoints catch up: the
    /// bound on memory and disk when checkpoints fail or fall behind. At
    /// least two segments are always allowed.
    pub backlog_bytes: u64,
    /// How long closed (or expired) activities are kept.
    #[serde(with = "super::duration")]
    pub retention: Duration,
    /// How often expired activities are purged.
    #[serde(with = "super::duration")]
    pub sweep_interval: Duration,
    /// The PostgreSQL database to keep activities in, instead of the
    /// embedded store: what lets several replicas be one service
    /// (`docs/deploy.md`). A libpq URL or key=value string; printed with
    /// its password hidden.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "redacted_url"
    )]
    pub postgres_url: Option<String>,
    /// A CA certificate (PEM) to verify PostgreSQL's TLS certificate with,
    /// besides the system's roots. Setting it requires TLS, as
    /// `sslmode=require` in the URL does; without either, the connection
    /// is plain TCP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub db_ca_file: Option<PathBuf>,
    /// Connections to PostgreSQL each replica keeps at most for its
    /// decisions (at least 5: four group commits in flight and a read), and
    /// one more, apart, for the replicas' coordination.
    pub pool_size: usize,
    /// The longest a PostgreSQL operation may take, waiting for a
    /// connection included, before the call gets `store_unavailable`.
    #[serde(with = "super::duration")]
    pub db_timeout: Duration,
    /// Set by the binary, not configurable: its runtime tells the store
    /// when a worker parks, ending a group commit's window early.
    #[serde(skip)]
    pub runtime_idle: Option<RuntimeIdle>,
}

/// The data directory of `cargo run` with no configuration.
pub const DEFAULT_DATA_DIR: &str = "retry-budget-data";

impl Default for StoreConfig {
    fn default() -> Self {
        let store = RedbStoreOptions::new(DEFAULT_DATA_DIR);
        Self {
            journal_segment_bytes: store.segment_bytes,
            journal_segment_age: store.segment_age,
            backlog_bytes: store.backlog_bytes,
            max_batch: store.max_batch,
            commit_window: store.commit_window,
            data_dir: store.data_dir,
            retention: Duration::from_secs(7 * 24 * 3600),
            sweep_interval: Duration::from_secs(60),
            postgres_url: None,
            db_ca_file: None,
            pool_size: 16,
            db_timeout: Duration::from_secs(2),
            runtime_idle: None,
        }
    }
}

/// The store a configuration opens: the embedded one, or PostgreSQL when
/// `postgres_url` is set, with only the settings that store reads.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded journal and redb, in `data_dir`.
    Embedded(RedbStoreOptions),
    /// PostgreSQL, shared by several replicas.
    Postgres(PostgresOptions),
}

impl StoreConfig {
    /// Which store to open, and its settings.
    pub fn backend(&self) -> Backend {
        match &self.postgres_url {
            Some(url) => Backend::Postgres(PostgresOptions {
                url: url.clone(),
                pool_size: self.pool_size,
                timeout: self.db_timeout,
                max_batch: self.max_batch,
                ca_file: self.db_ca_file.clone(),
            }),
            None => Backend::Embedded(self.redb_options()),
        }
    }

    /// The embedded store's settings (also what `migrate` reads from).
    pub fn redb_options(&self) -> RedbStoreOptions {
        let mut options = RedbStoreOptions::new(&self.data_dir);
        options.max_batch = self.max_batch;
        options.commit_window = self.commit_window;
        options.segment_bytes = self.journal_segment_bytes;
        options.segment_age = self.journal_segment_age;
        options.backlog_bytes = self.backlog_bytes;
        options.runtime_idle.clone_from(&self.runtime_idle);
        options
    }
}

/// A database URL as `--print-config` shows it: the password replaced by
/// `***`, in URL (`user:secret@host`) and key=value (`password=secret`)
/// forms alike.
fn redacted_url<S: serde::Serializer>(url: &Option<String>, out: S) -> Result<S::Ok, S::Error> {
    let Some(url) = url else {
        return out.serialize_none();
    };
    let hidden = if let Some((scheme, rest)) = url.split_once("://") {
        match rest.split_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
                None => url.clone(),
            },
            None => url.clone(),
        }
    } else {
        url.split_whitespace()
            .map(|pair| match pair.split_once('=') {
                Some(("password", _)) => "password=***".to_owned(),
                _ => pair.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    out.serialize_some(&hidden)
}
