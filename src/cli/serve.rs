//! The flags of `serve`. Each one names the configuration key it sets (in
//! brackets in its help), and the flags given are serialized into a table
//! of those keys that [`Config::layered`] writes over the file: a flag is
//! declared here once, with its key, and nothing copies it field by field.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::{Serialize, Serializer};

use super::{
    ENV_API_KEYS_FILE, ENV_AUTH, ENV_CONFIG, ENV_COORDINATION_INTERVAL, ENV_DATA_DIR, ENV_LISTEN,
    ENV_LOG_FORMAT, ENV_METRICS_LISTEN, ENV_POSTGRES_URL, ENV_REPLICA_ID, ENV_TLS_CERT,
    ENV_TLS_CLIENT_CA, ENV_TLS_KEY, LogFormat,
};
use crate::config::{Config, ConfigError};

/// Options of `serve`. Each overrides the configuration key in brackets;
/// `--print-config` shows every value in force, defaults included.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// A TOML configuration file (see docs/configuration.md); flags override it.
    #[arg(long, env = ENV_CONFIG)]
    pub config: Option<PathBuf>,
    /// Print the configuration in force as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// How log lines are written to stderr: `text` for people, `json` (one
    /// object a line, the request's fields flattened) for a log pipeline.
    /// Not a file key: logging starts before the file is read.
    #[arg(long, env = ENV_LOG_FORMAT, default_value = "text")]
    pub log_format: LogFormat,
    /// The flags that set configuration keys, by section.
    #[command(flatten)]
    pub settings: Settings,
}

impl ServeArgs {
    /// The configuration in force: the defaults, under the file's keys when
    /// a file is named, under these flags (and their variables), checked.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read or parsed, or a setting
    /// is out of range (naming it).
    pub fn config(&self) -> Result<Config, ConfigError> {
        Config::layered(self.config.as_deref(), &self.settings)
    }
}

/// Every flag that sets a key of the configuration file, in the file's
/// shape: a section a field, a key a flag (serde's name where the flag's
/// differs). A flag not given is `None` and serializes to nothing.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub struct Settings {
    #[command(flatten)]
    server: ServerFlags,
    #[command(flatten)]
    tls: TlsFlags,
    #[command(flatten)]
    store: StoreFlags,
    #[command(flatten)]
    policy: PolicyFlags,
    #[command(flatten)]
    bucket: BucketFlags,
    #[command(flatten)]
    dependencies: DependencyFlags,
    #[command(flatten)]
    coordination: CoordinationFlags,
    #[command(flatten)]
    metrics: MetricsFlags,
    #[command(flatten)]
    hints: HintsFlags,
    #[command(flatten)]
    limits: LimitsFlags,
    #[command(flatten)]
    auth: AuthFlags,
}

impl Settings {
    /// The address `--listen` names, if given.
    pub fn listen(&self) -> Option<SocketAddr> {
        self.server.listen
    }
}

/// `[server]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Server [server]")]
struct ServerFlags {
    /// Address to listen on [server.listen].
    #[arg(long, env = ENV_LISTEN)]
    listen: Option<SocketAddr>,
    /// How long health reports NOT_SERVING before the listener closes on
    /// SIGTERM or Ctrl-C [server.drain_delay].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    drain_delay: Option<Duration>,
    /// How long calls in flight may take to finish after that
    /// [server.grace_period].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    grace_period: Option<Duration>,
    /// The most connections served at once; past it, calls get
    /// UNAVAILABLE `too_many_connections` [server.max_connections].
    #[arg(long)]
    max_connections: Option<usize>,
    /// The most calls in flight on one connection; clients queue past it
    /// [server.max_concurrent_streams].
    #[arg(long)]
    max_concurrent_streams: Option<u32>,
    /// The largest header list a call may send, in bytes
    /// [server.max_header_list_size].
    #[arg(long)]
    max_header_list_size: Option<u32>,
    /// A call running longer ends with DEADLINE_EXCEEDED `request_timeout`
    /// [server.request_timeout].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    request_timeout: Option<Duration>,
    /// A quiet connection is pinged this often [server.keepalive_interval].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    keepalive_interval: Option<Duration>,
    /// A ping unanswered this long closes its connection
    /// [server.keepalive_timeout].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    keepalive_timeout: Option<Duration>,
}

/// `[tls]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "TLS [tls]")]
struct TlsFlags {
    /// Serve TLS with this certificate chain (PEM, leaf first); read again
    /// on SIGHUP and when it changes [tls.cert].
    #[arg(long, env = ENV_TLS_CERT)]
    #[serde(rename = "cert")]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM) [tls.key].
    #[arg(long, env = ENV_TLS_KEY)]
    #[serde(rename = "key")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by these CAs (PEM): mutual TLS
    /// [tls.client_ca].
    #[arg(long, env = ENV_TLS_CLIENT_CA)]
    #[serde(rename = "client_ca")]
    tls_client_ca: Option<PathBuf>,
    /// A TLS handshake not done in this long is abandoned
    /// [tls.handshake_timeout].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(rename = "handshake_timeout", serialize_with = "duration")]
    tls_handshake_timeout: Option<Duration>,
    /// How often the TLS files are checked for a change
    /// [tls.watch_interval].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(rename = "watch_interval", serialize_with = "duration")]
    tls_watch_interval: Option<Duration>,
}

/// `[store]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Store [store]")]
struct StoreFlags {
    /// Directory of the embedded store, created if missing [store.data_dir].
    #[arg(long, env = ENV_DATA_DIR)]
    data_dir: Option<PathBuf>,
    /// Keep activities in this PostgreSQL database instead of the embedded
    /// store, so several replicas can serve as one [store.postgres_url].
    #[arg(long, env = ENV_POSTGRES_URL, hide_env_values = true)]
    postgres_url: Option<String>,
    /// A CA certificate (PEM) to verify PostgreSQL's TLS certificate with,
    /// besides the system's roots; requires TLS [store.db_ca_file].
    #[arg(long)]
    db_ca_file: Option<PathBuf>,
    /// Connections to PostgreSQL this replica keeps at most for decisions,
    /// plus one for coordination [store.pool_size].
    #[arg(long)]
    pool_size: Option<usize>,
    /// The longest a PostgreSQL operation may take before the call gets
    /// `store_unavailable` [store.db_timeout].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    db_timeout: Option<Duration>,
    /// The most decisions one group commit (one fsync) carries; 1 commits
    /// each decision alone [store.max_batch].
    #[arg(long)]
    max_batch: Option<usize>,
    /// Removed (the embedded store keeps no journal of its own): refused
    /// with what replaced it.
    #[arg(long, hide = true, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    commit_window: Option<Duration>,
    /// Removed, as `--commit-window` is.
    #[arg(long, hide = true)]
    #[serde(rename = "journal_segment_bytes", serialize_with = "mebibytes")]
    journal_segment_mib: Option<u32>,
    /// Removed, as `--commit-window` is.
    #[arg(long, hide = true, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    journal_segment_age: Option<Duration>,
    /// How long closed (or expired) activities are kept [store.retention].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    retention: Option<Duration>,
    /// How often expired activities are purged [store.sweep_interval].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    sweep_interval: Option<Duration>,
}

/// `[policy]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Default policy [policy]")]
struct PolicyFlags {
    /// Attempts allowed to activities whose first report has no policy
    /// [policy.max_attempts].
    #[arg(long)]
    #[serde(rename = "max_attempts")]
    default_max_attempts: Option<u32>,
    /// Deadline of activities whose first report has no policy
    /// [policy.deadline].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(rename = "deadline", serialize_with = "duration")]
    default_deadline: Option<Duration>,
}

/// `[bucket]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Global retry budget [bucket]")]
struct BucketFlags {
    /// Retry tokens a second for the whole service [bucket.rate].
    #[arg(long)]
    #[serde(rename = "rate")]
    retry_rate: Option<f64>,
    /// Retry tokens the bucket holds when full [bucket.burst].
    #[arg(long)]
    #[serde(rename = "burst")]
    retry_burst: Option<u32>,
    /// `enforce` defers retries past the budget; `shadow` only computes and
    /// counts what it would defer, letting every retry go [bucket.mode].
    #[arg(long)]
    #[serde(rename = "mode")]
    bucket_mode: Option<crate::bucket::BucketMode>,
    /// Tokens each RecordSuccess adds back [bucket.success_deposit].
    #[arg(long)]
    success_deposit: Option<f64>,
    /// The furthest a deferral points a worker ahead, jittered per activity
    /// between half of it and all of it [bucket.max_deferral].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    max_deferral: Option<Duration>,
    /// A tenant's fair-share weight, as NAME=WEIGHT (repeatable); the
    /// file's other weights stay [bucket.weights].
    #[arg(long = "tenant-weight", value_parser = parse_weight)]
    #[serde(rename = "weights", skip_serializing_if = "Vec::is_empty")]
    #[serde(serialize_with = "weights")]
    tenant_weights: Vec<(String, u32)>,
}

/// `[dependencies]`: the pace of every dependency the file does not name.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Each dependency's budget [dependencies]")]
struct DependencyFlags {
    /// Retries a second a dependency may take before anything is known of
    /// it [dependencies.initial].
    #[arg(long)]
    #[serde(rename = "initial")]
    dependency_initial: Option<f64>,
    /// Retries a second a tenant adds for itself per success a second it
    /// reported [dependencies.ratio].
    #[arg(long)]
    #[serde(rename = "ratio")]
    dependency_ratio: Option<f64>,
    /// Retries a second each dependency may take however much trouble is
    /// seen [dependencies.floor].
    #[arg(long)]
    #[serde(rename = "floor")]
    dependency_floor: Option<f64>,
    /// Retries a second no dependency exceeds [dependencies.ceiling].
    #[arg(long)]
    #[serde(rename = "ceiling")]
    dependency_ceiling: Option<f64>,
    /// A static rate, retries a second, for every dependency not named in
    /// the file, instead of the adaptive rule [dependencies.rate].
    #[arg(long)]
    #[serde(rename = "rate")]
    dependency_rate: Option<f64>,
}

/// `[coordination]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Replicas on PostgreSQL [coordination]")]
struct CoordinationFlags {
    /// How often each replica on PostgreSQL renews its lease and takes its
    /// part of the global rate and burst [coordination.interval].
    #[arg(long, env = ENV_COORDINATION_INTERVAL, value_parser = humantime::parse_duration)]
    #[serde(rename = "interval", serialize_with = "duration")]
    coordination_interval: Option<Duration>,
    /// This replica's id among those on one database; unique per process
    /// (default: the host's name and the process id)
    /// [coordination.replica_id].
    #[arg(long, env = ENV_REPLICA_ID)]
    replica_id: Option<String>,
}

/// `[metrics]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Metrics [metrics]")]
struct MetricsFlags {
    /// Serve Prometheus metrics on `/metrics` at this address
    /// [metrics.listen].
    #[arg(long, env = ENV_METRICS_LISTEN)]
    #[serde(rename = "listen")]
    metrics_listen: Option<SocketAddr>,
    /// How many of the busiest tenants per-tenant metrics name
    /// [metrics.top_tenants].
    #[arg(long)]
    #[serde(rename = "top_tenants")]
    metrics_top_tenants: Option<usize>,
}

/// `[hints]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Server hints [hints]")]
struct HintsFlags {
    /// The longest delay a server's hint (Retry-After, pushback, RetryInfo)
    /// may ask for, whole seconds [hints.max_hint_seconds].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(rename = "max_hint_seconds", serialize_with = "whole_seconds")]
    max_hint: Option<Duration>,
}

/// `[limits]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Request limits [limits]")]
struct LimitsFlags {
    /// The largest request message, in bytes; larger is refused with
    /// RESOURCE_EXHAUSTED, message_too_large [limits.max_message_bytes].
    #[arg(long)]
    max_message_bytes: Option<usize>,
    /// How far before the server's clock an occurred_at may be; older is
    /// refused with timestamp_implausible [limits.max_timestamp_past].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    max_timestamp_past: Option<Duration>,
    /// How far after the server's clock an occurred_at may be
    /// [limits.max_timestamp_future].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "duration")]
    max_timestamp_future: Option<Duration>,
}

/// `[auth]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Tenants and their credentials [auth]")]
struct AuthFlags {
    /// How a request proves its tenant: `none` believes x-tenant-id,
    /// `api-keys` a bearer key, `mesh` the mesh's identity [auth.mode].
    #[arg(long, env = ENV_AUTH)]
    #[serde(rename = "mode")]
    auth: Option<crate::auth::AuthMode>,
    /// The file of `tenant:sha256-hex-of-key` lines, read at start and on
    /// SIGHUP [auth.api_keys_file].
    #[arg(long, env = ENV_API_KEYS_FILE)]
    api_keys_file: Option<PathBuf>,
    /// In `none` mode, the tenant of a request without x-tenant-id; "" makes
    /// the header required [auth.default_tenant].
    #[arg(long)]
    default_tenant: Option<String>,
    /// In `mesh` mode, how an identity names its tenant, e.g.
    /// `spiffe://cluster.local/ns/{tenant}/sa/*` [auth.identity_pattern].
    #[arg(long)]
    identity_pattern: Option<String>,
    /// In `mesh` mode, the header the sidecar sets with the caller's
    /// identity; believed only when named here [auth.mesh_header].
    #[arg(long)]
    mesh_header: Option<String>,
    /// Health and reflection ask for the same credential as the API
    /// [auth.protect_health_reflection].
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    protect_health_reflection: bool,
}

/// A duration flag as the file writes it; nothing when not given.
fn duration<S: Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => crate::setting::duration::serialize(value, serializer),
        None => serializer.serialize_none(),
    }
}

/// `--max-hint` in the whole seconds its key counts.
fn whole_seconds<S: Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    value.map(|d| d.as_secs()).serialize(serializer)
}

/// `--journal-segment-mib` in the bytes its key counts.
fn mebibytes<S: Serializer>(value: &Option<u32>, serializer: S) -> Result<S::Ok, S::Error> {
    value.map(|mib| u64::from(mib) << 20).serialize(serializer)
}

/// The `--tenant-weight` pairs as the table the file writes.
fn weights<S: Serializer>(value: &[(String, u32)], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(value.iter().map(|(k, v)| (k, v)))
}

/// The key a flag's help names in brackets (`[server.listen]`), or
/// nothing for a flag that sets none.
#[cfg(test)]
pub(super) fn key_in_help(help: &str) -> String {
    help.rsplit_once('[')
        .and_then(|(_, k)| k.split([']', ',']).next())
        .filter(|k| k.contains('.'))
        .unwrap_or_default()
        .to_owned()
}

fn parse_weight(s: &str) -> Result<(String, u32), String> {
    let (name, weight) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=WEIGHT"))?;
    let weight = weight
        .parse::<u32>()
        .map_err(|e| format!("weight of {name:?}: {e}"))?;
    Ok((name.to_owned(), weight))
}

#[cfg(test)]
mod tests;
