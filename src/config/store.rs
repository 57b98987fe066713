//! `[store]`: where activities are kept (the embedded store, or
//! PostgreSQL when a URL is given) and how writes are grouped and swept.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::{JournalOptions, PostgresOptions, RedbStoreOptions, RuntimeIdle};

/// `[store]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// The directory of the embedded store (created if missing).
    pub data_dir: PathBuf,
    /// How decisions are grouped into commits and when the journal is
    /// checkpointed: `max_batch`, `commit_window`, `journal_segment_bytes`,
    /// `journal_segment_age`, `backlog_bytes`, declared in
    /// [`JournalOptions`]. PostgreSQL reads `max_batch` too.
    #[serde(flatten)]
    pub journal: JournalOptions,
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
        Self {
            data_dir: DEFAULT_DATA_DIR.into(),
            journal: JournalOptions::default(),
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
                max_batch: self.journal.max_batch,
                ca_file: self.db_ca_file.clone(),
            }),
            None => Backend::Embedded(self.redb_options()),
        }
    }

    /// The embedded store's settings (also what `migrate` reads from).
    pub fn redb_options(&self) -> RedbStoreOptions {
        RedbStoreOptions {
            journal: self.journal.clone(),
            runtime_idle: self.runtime_idle.clone(),
            ..RedbStoreOptions::new(&self.data_dir)
        }
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
