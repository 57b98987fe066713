//! `[store]`: where activities are kept (the embedded store, or
//! PostgreSQL when a URL is given) and how writes are grouped and swept.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::{DEFAULT_MAX_BATCH, EmbeddedStoreOptions, PostgresOptions};

/// `[store]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// The directory of the embedded store (created if missing).
    pub data_dir: PathBuf,
    /// The most decisions one group commit (one fsync, or one PostgreSQL
    /// transaction) carries; 1 commits each alone. 1 to 65536.
    pub max_batch: usize,
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
}

/// The data directory of `cargo run` with no configuration.
pub const DEFAULT_DATA_DIR: &str = "retry-budget-data";

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            data_dir: DEFAULT_DATA_DIR.into(),
            max_batch: DEFAULT_MAX_BATCH,
            retention: Duration::from_secs(7 * 24 * 3600),
            sweep_interval: Duration::from_secs(60),
            postgres_url: None,
            db_ca_file: None,
            pool_size: 16,
            db_timeout: Duration::from_secs(2),
        }
    }
}

/// The store a configuration opens: the embedded one, or PostgreSQL when
/// `postgres_url` is set, with only the settings that store reads.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded store, in `data_dir`.
    Embedded(EmbeddedStoreOptions),
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
            None => Backend::Embedded(self.embedded_options()),
        }
    }

    /// The embedded store's settings (also what `migrate` reads from).
    pub fn embedded_options(&self) -> EmbeddedStoreOptions {
        EmbeddedStoreOptions::with_max_batch(&self.data_dir, self.max_batch)
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

/// `[store]` keys of the journal the embedded store kept before it moved
/// onto fjall's own, and what to do instead of each.
pub const REMOVED: [(&str, &str); 4] = [
    (
        "store.commit_window",
        "removed: a group commit now takes whatever waits as soon as the previous fsync \
         returns; delete the key (max_batch still bounds a group)",
    ),
    (
        "store.journal_segment_bytes",
        "removed: the embedded store keeps no journal of its own (fjall's is sized by \
         fjall); delete the key",
    ),
    (
        "store.journal_segment_age",
        "removed: the embedded store keeps no journal of its own, nothing waits for a \
         checkpoint; delete the key",
    ),
    (
        "store.backlog_bytes",
        "removed: saves are refused with store_backlogged once 16 groups of max_batch wait \
         for the disk; delete the key",
    ),
];

/// Refuses a configuration that sets a [`REMOVED`] key, naming what
/// replaced it.
///
/// # Errors
/// [`super::ConfigError::Value`] for the first removed key set.
pub fn refuse_removed(table: &toml::Table) -> Result<(), super::ConfigError> {
    let Some(store) = table.get("store").and_then(toml::Value::as_table) else {
        return Ok(());
    };
    for (key, message) in REMOVED {
        let name = key.trim_start_matches("store.");
        if store.contains_key(name) {
            return Err(super::ConfigError::Value {
                key,
                message: (*message).to_owned(),
            });
        }
    }
    Ok(())
}
