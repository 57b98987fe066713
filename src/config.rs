//! The one configuration model. Built-in defaults, the TOML file
//! (`--config FILE`), environment variables and flags all fill the one typed
//! [`Config`], in that order of precedence, lowest first: a flag beats its
//! environment variable, which beats the file, which beats the default.
//! Each default is declared once, in the `Default` of its section (the
//! embedded store's in `store::EmbeddedStoreOptions`, the bucket's in
//! `bucket::config`); `retry-budget --print-config` shows the result.
//!
//! ```toml
//! [server]
//! listen = "127.0.0.1:50051"
//! drain_delay = "2s"       # health NOT_SERVING before the listener closes
//! grace_period = "10s"     # calls in flight may finish in this long
//! max_connections = 4096   # past it: UNAVAILABLE too_many_connections
//! max_concurrent_streams = 1024  # calls in flight per connection
//! max_header_list_size = 16384   # bytes of headers a call may send
//! request_timeout = "30s"  # then DEADLINE_EXCEEDED request_timeout
//! keepalive_interval = "1m"  # PING a quiet connection...
//! keepalive_timeout = "20s"  # ...and close it if unanswered
//!
//! [tls]                    # plaintext unless cert is set
//! cert = "/etc/retry-budget-tls/tls.crt"
//! key = "/etc/retry-budget-tls/tls.key"
//! # client_ca = "/etc/retry-budget-tls/ca.crt"  # mutual TLS: client certificates required
//! handshake_timeout = "10s"
//! watch_interval = "5s"    # the files are read again when they change
//!
//! [store]
//! data_dir = "retry-budget-data"
//! max_batch = 1024         # decisions one group commit (one fsync) carries
//! retention = "7days"      # closed or expired activities are kept this long
//! sweep_interval = "1m"
//! # postgres_url = "postgres://retry_budget@db:5432/retry_budget"  # several replicas
//! pool_size = 16           # connections to PostgreSQL per replica, plus one for coordination
//! db_timeout = "2s"        # a PostgreSQL operation past this is store_unavailable
//!
//! [policy]                 # of activities whose first report names none
//! max_attempts = 5
//! deadline = "1h"
//!
//! [bucket]
//! rate = 200.0             # retry tokens a second, for the whole service
//! burst = 400              # tokens when full
//! success_deposit = 0.1    # tokens each RecordSuccess adds back
//! [bucket.weights]         # fair-share weights (default 1)
//! checkout = 3
//! batch = 1
//!
//! [dependencies]          # each dependency's budget, inside [bucket]
//! ratio = 0.1              # retries a second per success a second
//! floor = 1.0              # retries a second always allowed (probes)
//! # ceiling = 50.0         # never more (default: only [bucket] rate)
//! # rate = 20.0            # a static rate instead of the adaptive rule
//! window = "5s"            # successes are counted over this
//! [dependencies.named.payments-api]
//! ratio = 0.2
//!
//! [hints]
//! max_hint_seconds = 600   # a server's Retry-After is capped at this
//!
//! [metrics]
//! listen = "127.0.0.1:9464" # Prometheus text on /metrics (default: off)
//! top_tenants = 20         # the busiest tenants by name, the rest as "other"
//! top_dependencies = 20    # the busiest dependencies by name, likewise
//!
//! [limits]                 # what one request may carry (docs/errors.md)
//! max_message_bytes = 65536     # a larger request message: message_too_large
//! max_timestamp_past = "1year"  # an older occurred_at: timestamp_implausible
//! max_timestamp_future = "1h"   # so is a later one
//!
//! [coordination]           # replicas on PostgreSQL share [bucket] through leases
//! interval = "1s"          # one short transaction per replica per interval
//! # replica_id = "retry-budget-0"  # default: the host's name and the process id
//!
//! [auth]                   # who asks (docs/security.md)
//! mode = "none"            # none | api-keys | mesh
//! default_tenant = "default" # none mode: the tenant without x-tenant-id; "" = required
//!
//! [[classification.rules]] # tried before the defaults; first match wins
//! name = "payments_409_transient"
//! http_status = 409
//! tenant = "payments"
//! class = "transient"
//! ```
//!
//! Every key is optional. Unknown keys are errors, so a typo never silently
//! keeps a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::auth::AuthConfig;
use crate::bucket::{BucketConfig, DependenciesConfig};
use crate::budget::activity::Policy;
use crate::budget::classify::{RuleSet, RuleSpec};
use crate::coord::CoordinationConfig;

mod server;
mod store;

pub use crate::setting::ConfigError;
pub(crate) use crate::setting::duration;

pub use self::server::{LimitsConfig, ServeConfig, TlsConfig};
pub use self::store::{Backend, DEFAULT_DATA_DIR, StoreConfig};

/// The service's whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[server]`: where it listens and how it stops.
    pub server: ServeConfig,
    /// `[store]`: the embedded store and its retention.
    pub store: StoreConfig,
    /// `[policy]`: the policy of activities whose first report has none.
    pub policy: PolicyConfig,
    /// `[bucket]`: the global retry-token bucket.
    pub bucket: BucketConfig,
    /// `[dependencies]`: each dependency's budget inside the global one,
    /// paced by its successes.
    pub dependencies: DependenciesConfig,
    /// `[hints]`: how server hints are planned with.
    pub hints: HintsConfig,
    /// `[coordination]`: how replicas on one PostgreSQL database share the
    /// bucket's rate and burst (unused on the embedded store).
    pub coordination: CoordinationConfig,
    /// `[metrics]`: Prometheus metrics, off unless `listen` is set.
    pub metrics: MetricsConfig,
    /// `[limits]`: what one request may carry.
    pub limits: LimitsConfig,
    /// `[auth]`: how a request proves the tenant it acts for.
    pub auth: AuthConfig,
    /// `[tls]`: TLS and mutual TLS on the gRPC port (plaintext unless set).
    pub tls: TlsConfig,
    /// `[classification]`: the operator's rules, tried before the defaults.
    #[serde(skip_serializing)]
    pub classification: ClassificationConfig,
}

/// `[metrics]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where `/metrics` is served over HTTP; unset (the default): no
    /// metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// How many of the busiest tenants are named in per-tenant metrics;
    /// the others are summed as `other`.
    pub top_tenants: usize,
    /// How many of the busiest dependencies are named in per-dependency
    /// metrics; the others are summed as `other`.
    pub top_dependencies: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: None,
            top_tenants: 20,
            top_dependencies: 20,
        }
    }
}

/// `[policy]`: what an activity gets when its first report names no policy
/// (or leaves a field at 0).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Attempts allowed in all, the first one included.
    pub max_attempts: u32,
    /// Logical time after the first failure when nothing is retried any
    /// more (whole seconds).
    #[serde(with = "duration")]
    pub deadline: Duration,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            deadline: Duration::from_secs(3600),
        }
    }
}

impl PolicyConfig {
    /// The core's policy for these settings (the reference backoff).
    pub fn policy(&self) -> Policy {
        Policy {
            max_attempts: self.max_attempts,
            deadline_seconds: self.deadline.as_secs(),
            base: None,
            cap: None,
        }
    }
}

/// `[hints]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HintsConfig {
    /// The longest delay a server's hint (Retry-After, pushback, RetryInfo)
    /// may ask for, in seconds; longer hints are capped and say so.
    pub max_hint_seconds: u64,
}

impl Default for HintsConfig {
    fn default() -> Self {
        Self {
            max_hint_seconds: 3600,
        }
    }
}

impl HintsConfig {
    /// The cap in milliseconds, as the core takes it.
    pub fn max_hint_ms(&self) -> u64 {
        self.max_hint_seconds.saturating_mul(1000)
    }
}

/// `[classification]`: rules tried in order before the default policy
/// (docs/classification.md); first match wins.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassificationConfig {
    /// The operator's rules.
    pub rules: Vec<RuleSpec>,
}

impl Config {
    /// The built-in defaults under the configuration file at `path`.
    ///
    /// # Errors
    /// [`ConfigError`] when it cannot be read or parsed.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(path, &Self::read(path)?)
    }

    /// The defaults, under the file at `path` when one is named, under
    /// `flags`: anything that serializes to a table of the file's keys (the
    /// flags given, as `cli` declares them), written over the file key by
    /// key. Then checked.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read or parsed, or a setting
    /// is out of range (naming it).
    pub fn layered(path: Option<&Path>, flags: &impl Serialize) -> Result<Self, ConfigError> {
        let mut table = match path {
            Some(path) => {
                let text = Self::read(path)?;
                // Read whole first, so that a mistake in the file is told
                // with its line and column.
                Self::parse(path, &text)?;
                text.parse::<toml::Table>()
                    .map_err(|e| Self::invalid(path, &e))?
            }
            None => toml::Table::new(),
        };
        let flags = toml::Table::try_from(flags).map_err(|e| ConfigError::Value {
            key: "command line",
            message: e.to_string(),
        })?;
        overlay(&mut table, flags);
        store::refuse_removed(&table)?;
        let config: Self = table.try_into().map_err(|e| ConfigError::Value {
            key: "command line",
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    fn read(path: &Path) -> Result<String, ConfigError> {
        std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
            path: path.to_owned(),
            source,
        })
    }

    fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        // Before the typed parse, which would call a removed key unknown
        // without naming what replaced it.
        if let Ok(table) = text.parse::<toml::Table>() {
            store::refuse_removed(&table)?;
        }
        toml::from_str(text).map_err(|e| Self::invalid(path, &e))
    }

    fn invalid(path: &Path, error: &impl std::fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            path: path.to_owned(),
            message: error.to_string(),
        }
    }

    /// The defaults with the store under `data_dir`: what tests and
    /// embedders start from.
    pub fn with_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        let mut config = Self::default();
        config.store.data_dir = data_dir.into();
        config
    }

    /// Checks every setting's range, whichever source set it.
    ///
    /// # Errors
    /// [`ConfigError::Value`] naming the first setting at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let value = |key, message: &str| ConfigError::Value {
            key,
            message: message.to_owned(),
        };
        if !(1..=65_536).contains(&self.store.max_batch) {
            return Err(value("store.max_batch", "must be 1 to 65536"));
        }
        if !(1..=1024).contains(&self.store.pool_size) {
            return Err(value("store.pool_size", "must be 1 to 1024"));
        }
        if self.store.db_timeout.is_zero() {
            return Err(value("store.db_timeout", "must be longer than zero"));
        }
        if self.store.sweep_interval.is_zero() {
            return Err(value("store.sweep_interval", "must be longer than zero"));
        }
        self.bucket.validate().map_err(|e| ConfigError::Value {
            key: "bucket",
            message: e.to_string(),
        })?;
        self.dependencies
            .validate()
            .map_err(|e| ConfigError::Value {
                key: "dependencies",
                message: e.to_string(),
            })?;
        // A KiB holds every bounded field of the largest request (two
        // 256-byte ids); past 16 MiB one call could hold what a replica's
        // whole journal backlog does.
        if !(1 << 10..=16 << 20).contains(&self.limits.max_message_bytes) {
            return Err(value(
                "limits.max_message_bytes",
                "must be 1 KiB to 16 MiB (1024 to 16777216)",
            ));
        }
        if self.limits.max_timestamp_past.is_zero() {
            return Err(value(
                "limits.max_timestamp_past",
                "must be longer than zero",
            ));
        }
        if self.limits.max_timestamp_future.is_zero() {
            return Err(value(
                "limits.max_timestamp_future",
                "must be longer than zero",
            ));
        }
        if self.metrics.top_tenants > 1000 {
            return Err(value("metrics.top_tenants", "must be at most 1000"));
        }
        if self.metrics.top_dependencies > 1000 {
            return Err(value("metrics.top_dependencies", "must be at most 1000"));
        }
        self.coordination
            .validate()
            .map_err(|e| ConfigError::Value {
                key: "coordination",
                message: e.to_string(),
            })?;
        self.validate_transport()?;
        RuleSet::new(self.classification.rules.clone()).map_err(|e| ConfigError::Value {
            key: "classification.rules",
            message: e.to_string(),
        })?;
        self.auth.validate()?;
        Ok(())
    }

    /// The `[server]` bounds and `[tls]`.
    fn validate_transport(&self) -> Result<(), ConfigError> {
        let value = |key, message: &str| ConfigError::Value {
            key,
            message: message.to_owned(),
        };
        let server = &self.server;
        if !(1..=1_000_000).contains(&server.max_connections) {
            return Err(value("server.max_connections", "must be 1 to 1000000"));
        }
        if server.max_concurrent_streams == 0 {
            return Err(value("server.max_concurrent_streams", "must be 1 or more"));
        }
        if !(1 << 10..=16 << 20).contains(&server.max_header_list_size) {
            return Err(value(
                "server.max_header_list_size",
                "must be 1 KiB to 16 MiB (1024 to 16777216)",
            ));
        }
        for (key, duration) in [
            ("server.request_timeout", server.request_timeout),
            ("server.keepalive_interval", server.keepalive_interval),
            ("server.keepalive_timeout", server.keepalive_timeout),
            ("tls.handshake_timeout", self.tls.handshake_timeout),
            ("tls.watch_interval", self.tls.watch_interval),
        ] {
            if duration.is_zero() {
                return Err(value(key, "must be longer than zero"));
            }
        }
        let tls = &self.tls;
        if tls.cert.is_some() != tls.key.is_some() {
            return Err(value("tls.key", "tls.cert and tls.key go together"));
        }
        if tls.client_ca.is_some() && tls.cert.is_none() {
            return Err(value(
                "tls.client_ca",
                "mutual TLS needs the server's own tls.cert and tls.key",
            ));
        }
        Ok(())
    }

    /// The configuration as TOML, defaults included (the classification
    /// rules are left out: they have none).
    ///
    /// # Errors
    /// The encoder's message; it does not fail for a configuration that
    /// was read.
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string(self).map_err(|e| e.to_string())
    }
}

/// Writes `top` over `base` key by key, into tables at any depth: a key
/// `top` sets replaces only that key of `base`.
fn overlay(base: &mut toml::Table, top: toml::Table) {
    for (key, value) in top {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(under)), toml::Value::Table(over)) => overlay(under, over),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documented(source: &str, opening: &str) -> String {
        let start = source.find(opening).expect("a toml block") + opening.len();
        let end = start + source[start..].find("```").expect("closed");
        source[start..end].to_owned()
    }

    #[test]
    fn the_documented_example_parses_and_is_valid() {
        let example: String = include_str!("config.rs")
            .lines()
            .filter_map(|l| {
                l.strip_prefix("//!")
                    .map(|l| l.strip_prefix(' ').unwrap_or(l))
            })
            .collect::<Vec<_>>()
            .join("\n");
        let config: Config = toml::from_str(&documented(&example, "```toml\n")).unwrap();
        config.validate().unwrap();
        assert_eq!(config.bucket.rate, 200.0);
        assert_eq!(config.bucket.weights.get("checkout"), Some(&3));
        assert_eq!(config.hints.max_hint_seconds, 600);
        assert_eq!(config.store.retention, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(config.classification.rules.len(), 1);
    }

    #[test]
    fn the_configuration_doc_shows_the_defaults_and_a_valid_example() {
        let readme = include_str!("../docs/configuration.md");
        let defaults = documented(readme, "```toml\n");
        assert_eq!(
            defaults,
            Config::default().to_toml().unwrap(),
            "docs/configuration.md's defaults block: paste `retry-budget --print-config`"
        );
        let rest = &readme[readme.find(&defaults).expect("found") + defaults.len()..];
        let config: Config = toml::from_str(&documented(rest, "```toml\n")).unwrap();
        config.validate().unwrap();
        assert_eq!(config.bucket.weights.get("checkout"), Some(&3));
    }

    #[test]
    fn the_defaults_print_and_read_back_the_same() {
        let printed = Config::default().to_toml().unwrap();
        let read: Config = toml::from_str(&printed).unwrap();
        assert_eq!(read.to_toml().unwrap(), printed);
        assert!(printed.contains("max_batch = 1024"), "{printed}");
        read.validate().unwrap();
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors_naming_the_key() {
        let err = toml::from_str::<Config>("[bucket]\nrat = 5.0\n").unwrap_err();
        assert!(err.to_string().contains("rat"), "{err}");
        assert!(toml::from_str::<Config>("[buckt]\n").is_err());
        let err = toml::from_str::<Config>("[store]\nmax_bach = 1\n").unwrap_err();
        assert!(err.to_string().contains("max_bach"), "{err}");
        for (text, key) in [
            ("[store]\nmax_batch = 0\n", "store.max_batch"),
            ("[bucket]\nrate = 0.0\n", "bucket"),
            (
                "[limits]\nmax_message_bytes = 100\n",
                "limits.max_message_bytes",
            ),
            (
                "[limits]\nmax_timestamp_future = \"0s\"\n",
                "limits.max_timestamp_future",
            ),
        ] {
            let err = toml::from_str::<Config>(text)
                .unwrap()
                .validate()
                .unwrap_err();
            let message = err.to_string();
            assert!(message.starts_with("config_invalid: "), "{message}");
            assert!(message.contains(key), "{text}: {message}");
        }
    }

    #[test]
    fn a_file_setting_a_removed_journal_key_is_refused_naming_what_replaced_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        for (key, _) in store::REMOVED {
            let name = key.trim_start_matches("store.");
            std::fs::write(&path, format!("[store]\n{name} = 1\n")).unwrap();
            let message = Config::load(&path).unwrap_err().to_string();
            assert!(message.starts_with("config_invalid: "), "{message}");
            assert!(
                message.contains(key) && message.contains("delete the key"),
                "{message}"
            );
        }
        std::fs::write(&path, "[store]\nmax_batch = 8\n").unwrap();
        assert_eq!(Config::load(&path).unwrap().store.max_batch, 8);
    }
}
