//! The command line: `serve` (the default) runs the service; `delay`,
//! `next-action` and `explain` answer people without grpcurl (in `client`).
//!
//! Every `serve` flag is optional and overrides one key of the
//! configuration file (see [`crate::config`]): what no flag, variable or
//! file sets keeps its one declared default.

mod client;
mod keys;
mod migrate;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub use self::client::{ClientTlsArgs, DelayArgs, ExplainArgs, NextActionArgs, run_client};
pub use self::keys::{KeysArgs, KeysCommand, KeysFile};
pub use self::migrate::{MigrateArgs, migrate};
use crate::config::{Config, ConfigError};

/// Environment variable naming the data directory.
pub const ENV_DATA_DIR: &str = "RETRY_BUDGET_DATA_DIR";
/// Environment variable naming the listen address.
pub const ENV_LISTEN: &str = "RETRY_BUDGET_LISTEN";
/// Environment variable naming the configuration file.
pub const ENV_CONFIG: &str = "RETRY_BUDGET_CONFIG";
/// Environment variable naming the PostgreSQL database.
pub const ENV_POSTGRES_URL: &str = "RETRY_BUDGET_POSTGRES_URL";
/// Environment variable naming this replica among those on one database.
pub const ENV_REPLICA_ID: &str = "RETRY_BUDGET_REPLICA_ID";
/// Environment variable setting the replicas' coordination interval.
pub const ENV_COORDINATION_INTERVAL: &str = "RETRY_BUDGET_COORDINATION_INTERVAL";
/// Environment variable naming the metrics' address.
pub const ENV_METRICS_LISTEN: &str = "RETRY_BUDGET_METRICS_LISTEN";
/// Environment variable choosing the log format.
pub const ENV_LOG_FORMAT: &str = "RETRY_BUDGET_LOG_FORMAT";
/// Environment variable naming the server the client commands talk to.
pub const ENV_SERVER: &str = "RETRY_BUDGET_SERVER";
/// Environment variable choosing how requests prove their tenant.
pub const ENV_AUTH: &str = "RETRY_BUDGET_AUTH";
/// Environment variable naming the API keys file (the server's and
/// `keys add`'s).
pub const ENV_API_KEYS_FILE: &str = "RETRY_BUDGET_API_KEYS_FILE";
/// Environment variable holding the API key the client commands send.
pub const ENV_API_KEY: &str = "RETRY_BUDGET_API_KEY";
/// Environment variable naming the server's TLS certificate chain.
pub const ENV_TLS_CERT: &str = "RETRY_BUDGET_TLS_CERT";
/// Environment variable naming the server's TLS private key.
pub const ENV_TLS_KEY: &str = "RETRY_BUDGET_TLS_KEY";
/// Environment variable naming the CA of the clients' certificates.
pub const ENV_TLS_CLIENT_CA: &str = "RETRY_BUDGET_TLS_CLIENT_CA";

/// retry-budget: tells workers whether and when to retry a failed activity.
#[derive(Debug, Parser)]
#[command(name = "retry-budget", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The server's options, when no subcommand is given.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC service (the default).
    Serve(Box<ServeArgs>),
    /// Print an activity's backoff plan, as the article's retry_delay does.
    Delay(DelayArgs),
    /// Evaluate a budget with the article's next_action.
    NextAction(NextActionArgs),
    /// Show an activity's budget and every decision, from a running server.
    Explain(ExplainArgs),
    /// Copy an embedded store into PostgreSQL (resumable, idempotent), to
    /// move from one replica to several.
    Migrate(MigrateArgs),
    /// Make and list API keys (`--auth api-keys`).
    Keys(KeysArgs),
}

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
    /// Address to listen on [server.listen].
    #[arg(long, env = ENV_LISTEN)]
    pub listen: Option<SocketAddr>,
    /// Directory of the embedded store, created if missing [store.data_dir].
    #[arg(long, env = ENV_DATA_DIR)]
    pub data_dir: Option<PathBuf>,
    /// Keep activities in this PostgreSQL database instead of the embedded
    /// store, so several replicas can serve as one [store.postgres_url].
    #[arg(long, env = ENV_POSTGRES_URL, hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// A CA certificate (PEM) to verify PostgreSQL's TLS certificate with,
    /// besides the system's roots; requires TLS [store.db_ca_file].
    #[arg(long)]
    pub db_ca_file: Option<PathBuf>,
    /// Connections to PostgreSQL this replica keeps at most for decisions,
    /// plus one for coordination [store.pool_size].
    #[arg(long)]
    pub pool_size: Option<usize>,
    /// The longest a PostgreSQL operation may take before the call gets
    /// `store_unavailable` [store.db_timeout].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub db_timeout: Option<Duration>,
    /// The most decisions one group commit (one fsync) carries; 1 commits
    /// each decision alone [store.max_batch].
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Under load (the last group commit carried more than one decision),
    /// how long from the start of one group commit the next may wait for
    /// decisions to share its fsync; it starts sooner once as many wait as
    /// recent groups carried, or once the server has nothing else to do. A
    /// decision that arrives alone is committed at once. 0s commits as soon
    /// as the previous fsync returns [store.commit_window].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub commit_window: Option<Duration>,
    /// A journal segment this large (MiB) is checkpointed into the database.
    /// Decisions waiting for a checkpoint are held in memory: about two
    /// segments' worth, and up to three while a checkpoint is slow
    /// [store.journal_segment_bytes, in MiB here].
    #[arg(long)]
    pub journal_segment_mib: Option<u32>,
    /// A journal segment older than this is checkpointed even when small, so
    /// that the database is never far behind and a restart after a crash
    /// replays little [store.journal_segment_age].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub journal_segment_age: Option<Duration>,
    /// How long closed (or expired) activities are kept [store.retention].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub retention: Option<Duration>,
    /// How often expired activities are purged [store.sweep_interval].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub sweep_interval: Option<Duration>,
    /// Attempts allowed to activities whose first report has no policy
    /// [policy.max_attempts].
    #[arg(long)]
    pub default_max_attempts: Option<u32>,
    /// Deadline of activities whose first report has no policy
    /// [policy.deadline].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub default_deadline: Option<Duration>,
    /// How long health reports NOT_SERVING before the listener closes on
    /// SIGTERM or Ctrl-C [server.drain_delay].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub drain_delay: Option<Duration>,
    /// How long calls in flight may take to finish after that
    /// [server.grace_period].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub grace_period: Option<Duration>,
    /// The most connections served at once; past it, calls get
    /// UNAVAILABLE `too_many_connections` [server.max_connections].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// The most calls in flight on one connection; clients queue past it
    /// [server.max_concurrent_streams].
    #[arg(long)]
    pub max_concurrent_streams: Option<u32>,
    /// The largest header list a call may send, in bytes
    /// [server.max_header_list_size].
    #[arg(long)]
    pub max_header_list_size: Option<u32>,
    /// A call running longer ends with DEADLINE_EXCEEDED `request_timeout`
    /// [server.request_timeout].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub request_timeout: Option<Duration>,
    /// A quiet connection is pinged this often [server.keepalive_interval].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub keepalive_interval: Option<Duration>,
    /// A ping unanswered this long closes its connection
    /// [server.keepalive_timeout].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub keepalive_timeout: Option<Duration>,
    /// Serve TLS with this certificate chain (PEM, leaf first); read again
    /// on SIGHUP and when it changes [tls.cert].
    #[arg(long, env = ENV_TLS_CERT)]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM) [tls.key].
    #[arg(long, env = ENV_TLS_KEY)]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by these CAs (PEM): mutual TLS
    /// [tls.client_ca].
    #[arg(long, env = ENV_TLS_CLIENT_CA)]
    pub tls_client_ca: Option<PathBuf>,
    /// A TLS handshake not done in this long is abandoned
    /// [tls.handshake_timeout].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub tls_handshake_timeout: Option<Duration>,
    /// How often the TLS files are checked for a change
    /// [tls.watch_interval].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub tls_watch_interval: Option<Duration>,
    /// Retry tokens a second for the whole service [bucket.rate].
    #[arg(long)]
    pub retry_rate: Option<f64>,
    /// Retry tokens the bucket holds when full [bucket.burst].
    #[arg(long)]
    pub retry_burst: Option<u32>,
    /// `enforce` defers retries past the budget; `shadow` only computes and
    /// counts what it would defer, letting every retry go [bucket.mode].
    #[arg(long)]
    pub bucket_mode: Option<crate::bucket::BucketMode>,
    /// Tokens each RecordSuccess adds back [bucket.success_deposit].
    #[arg(long)]
    pub success_deposit: Option<f64>,
    /// Retries a second each dependency may take per success a second
    /// [dependencies.ratio].
    #[arg(long)]
    pub dependency_ratio: Option<f64>,
    /// Retries a second each dependency may take whatever its successes
    /// [dependencies.floor].
    #[arg(long)]
    pub dependency_floor: Option<f64>,
    /// Retries a second no dependency exceeds [dependencies.ceiling].
    #[arg(long)]
    pub dependency_ceiling: Option<f64>,
    /// A static rate, retries a second, for every dependency not named in
    /// the file, instead of the adaptive rule [dependencies.rate].
    #[arg(long)]
    pub dependency_rate: Option<f64>,
    /// A tenant's fair-share weight, as NAME=WEIGHT (repeatable)
    /// [bucket.weights].
    #[arg(long = "tenant-weight", value_parser = parse_weight)]
    pub tenant_weights: Vec<(String, u32)>,
    /// How often each replica on PostgreSQL renews its lease and takes its
    /// part of the global rate and burst [coordination.interval].
    #[arg(long, env = ENV_COORDINATION_INTERVAL, value_parser = humantime::parse_duration)]
    pub coordination_interval: Option<Duration>,
    /// This replica's id among those on one database; unique per process
    /// (default: the host's name and the process id)
    /// [coordination.replica_id].
    #[arg(long, env = ENV_REPLICA_ID)]
    pub replica_id: Option<String>,
    /// Serve Prometheus metrics on `/metrics` at this address
    /// [metrics.listen].
    #[arg(long, env = ENV_METRICS_LISTEN)]
    pub metrics_listen: Option<SocketAddr>,
    /// How many of the busiest tenants per-tenant metrics name
    /// [metrics.top_tenants].
    #[arg(long)]
    pub metrics_top_tenants: Option<usize>,
    /// The longest delay a server's hint (Retry-After, pushback, RetryInfo)
    /// may ask for, whole seconds [hints.max_hint_seconds].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_hint: Option<Duration>,
    /// The largest request message, in bytes; larger is refused with
    /// RESOURCE_EXHAUSTED, message_too_large [limits.max_message_bytes].
    #[arg(long)]
    pub max_message_bytes: Option<usize>,
    /// How far before the server's clock an occurred_at may be; older is
    /// refused with timestamp_implausible [limits.max_timestamp_past].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_timestamp_past: Option<Duration>,
    /// How far after the server's clock an occurred_at may be
    /// [limits.max_timestamp_future].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_timestamp_future: Option<Duration>,
    /// How a request proves its tenant: `none` believes x-tenant-id,
    /// `api-keys` a bearer key, `mesh` the mesh's identity [auth.mode].
    #[arg(long, env = ENV_AUTH)]
    pub auth: Option<crate::auth::AuthMode>,
    /// The file of `tenant:sha256-hex-of-key` lines, read at start and on
    /// SIGHUP [auth.api_keys_file].
    #[arg(long, env = ENV_API_KEYS_FILE)]
    pub api_keys_file: Option<PathBuf>,
    /// In `none` mode, the tenant of a request without x-tenant-id; "" makes
    /// the header required [auth.default_tenant].
    #[arg(long)]
    pub default_tenant: Option<String>,
    /// In `mesh` mode, how an identity names its tenant, e.g.
    /// `spiffe://cluster.local/ns/{tenant}/sa/*` [auth.identity_pattern].
    #[arg(long)]
    pub identity_pattern: Option<String>,
    /// In `mesh` mode, the header the sidecar sets with the caller's
    /// identity; believed only when named here [auth.mesh_header].
    #[arg(long)]
    pub mesh_header: Option<String>,
    /// Health and reflection ask for the same credential as the API
    /// [auth.protect_health_reflection].
    #[arg(long)]
    pub protect_health_reflection: bool,
}

impl ServeArgs {
    /// The configuration in force: the defaults, under the file's keys when
    /// a file is named, under these flags (and their variables), checked.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read or parsed, or a setting
    /// is out of range (naming it).
    pub fn config(&self) -> Result<Config, ConfigError> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        self.apply(&mut config);
        config.validate()?;
        Ok(config)
    }

    /// Writes every flag that was given over `config`.
    fn apply(&self, config: &mut Config) {
        fn set<T: Clone>(target: &mut T, flag: &Option<T>) {
            if let Some(value) = flag {
                *target = value.clone();
            }
        }
        let Config {
            server,
            store,
            policy,
            bucket,
            dependencies,
            hints,
            coordination,
            metrics,
            limits,
            auth,
            tls,
            classification: _,
        } = config;
        set(&mut server.listen, &self.listen);
        set(&mut server.drain_delay, &self.drain_delay);
        set(&mut server.grace_period, &self.grace_period);
        set(&mut server.max_connections, &self.max_connections);
        set(
            &mut server.max_concurrent_streams,
            &self.max_concurrent_streams,
        );
        set(&mut server.max_header_list_size, &self.max_header_list_size);
        set(&mut server.request_timeout, &self.request_timeout);
        set(&mut server.keepalive_interval, &self.keepalive_interval);
        set(&mut server.keepalive_timeout, &self.keepalive_timeout);
        for (target, flag) in [
            (&mut tls.cert, &self.tls_cert),
            (&mut tls.key, &self.tls_key),
            (&mut tls.client_ca, &self.tls_client_ca),
        ] {
            if flag.is_some() {
                target.clone_from(flag);
            }
        }
        set(&mut tls.handshake_timeout, &self.tls_handshake_timeout);
        set(&mut tls.watch_interval, &self.tls_watch_interval);
        set(&mut store.data_dir, &self.data_dir);
        set(&mut store.max_batch, &self.max_batch);
        if self.postgres_url.is_some() {
            store.postgres_url.clone_from(&self.postgres_url);
        }
        if self.db_ca_file.is_some() {
            store.db_ca_file.clone_from(&self.db_ca_file);
        }
        set(&mut store.pool_size, &self.pool_size);
        set(&mut store.db_timeout, &self.db_timeout);
        set(&mut store.commit_window, &self.commit_window);
        set(
            &mut store.journal_segment_bytes,
            &self.journal_segment_mib.map(|mib| u64::from(mib) << 20),
        );
        set(&mut store.journal_segment_age, &self.journal_segment_age);
        set(&mut store.retention, &self.retention);
        set(&mut store.sweep_interval, &self.sweep_interval);
        set(&mut policy.max_attempts, &self.default_max_attempts);
        set(&mut policy.deadline, &self.default_deadline);
        set(&mut bucket.rate, &self.retry_rate);
        set(&mut bucket.burst, &self.retry_burst);
        set(&mut bucket.success_deposit, &self.success_deposit);
        set(&mut bucket.mode, &self.bucket_mode);
        let pace = &mut dependencies.default;
        set(&mut pace.ratio, &self.dependency_ratio);
        set(&mut pace.floor, &self.dependency_floor);
        if self.dependency_ceiling.is_some() {
            pace.ceiling = self.dependency_ceiling;
        }
        if self.dependency_rate.is_some() {
            pace.rate = self.dependency_rate;
        }
        set(
            &mut hints.max_hint_seconds,
            &self.max_hint.map(|d| d.as_secs()),
        );
        if self.metrics_listen.is_some() {
            metrics.listen = self.metrics_listen;
        }
        set(&mut metrics.top_tenants, &self.metrics_top_tenants);
        set(&mut limits.max_message_bytes, &self.max_message_bytes);
        set(&mut limits.max_timestamp_past, &self.max_timestamp_past);
        set(&mut limits.max_timestamp_future, &self.max_timestamp_future);
        set(&mut coordination.interval, &self.coordination_interval);
        if self.replica_id.is_some() {
            coordination.replica_id.clone_from(&self.replica_id);
        }
        for (tenant, weight) in &self.tenant_weights {
            bucket.weights.insert(tenant.clone(), *weight);
        }
        set(&mut auth.mode, &self.auth);
        set(&mut auth.default_tenant, &self.default_tenant);
        if self.api_keys_file.is_some() {
            auth.api_keys_file.clone_from(&self.api_keys_file);
        }
        if self.identity_pattern.is_some() {
            auth.identity_pattern.clone_from(&self.identity_pattern);
        }
        if self.mesh_header.is_some() {
            auth.mesh_header.clone_from(&self.mesh_header);
        }
        auth.protect_health_reflection |= self.protect_health_reflection;
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Lines for people.
    #[default]
    Text,
    /// One JSON object a line.
    Json,
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
mod tests {
    use super::*;

    /// docs/configuration.md's flag table names every flag of `serve`, and
    /// only those, each with its environment variable: the reference a
    /// user reads is `--help`'s.
    #[test]
    fn the_configuration_doc_lists_every_serve_flag_with_its_environment_variable() {
        use clap::CommandFactory;
        let doc = include_str!("../docs/configuration.md");
        let mut documented = std::collections::BTreeMap::new();
        for row in doc.lines().filter(|l| l.starts_with("| `--")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let flag = cells[1]
                .trim_matches('`')
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .trim_end_matches('`')
                .to_owned();
            documented.insert(flag, cells[2].trim_matches('`').to_owned());
        }
        let command = Cli::command();
        let serve = command
            .find_subcommand("serve")
            .expect("a serve subcommand");
        let helped: std::collections::BTreeMap<String, String> = serve
            .get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?;
                let env = a
                    .get_env()
                    .map(|e| e.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Some((format!("--{long}"), env))
            })
            .filter(|(flag, _)| flag != "--help")
            .collect();
        assert_eq!(
            documented, helped,
            "docs/configuration.md's flag table against `retry-budget serve --help`"
        );
    }

    fn parsed(args: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["retry-budget"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).unwrap().serve.config()
    }

    #[test]
    fn serve_is_the_default_subcommand() {
        let cli = Cli::try_parse_from(["retry-budget", "--listen", "127.0.0.1:0"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.listen.map(|a| a.port()), Some(0));
        let cli = Cli::try_parse_from(["retry-budget", "delay", "flight-1"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Delay(_))));
    }

    #[test]
    fn no_flag_keeps_the_one_default_and_flags_reach_their_keys() {
        let defaults = Config::default();
        let config = parsed(&[]).unwrap();
        assert_eq!(config.to_toml(), defaults.to_toml());
        let store = crate::store::RedbStoreOptions::new("x");
        assert_eq!(
            config.store.redb_options().segment_bytes,
            store.segment_bytes
        );

        let config = parsed(&[
            "--journal-segment-mib",
            "64",
            "--journal-segment-age",
            "30s",
            "--default-deadline",
            "10m",
        ])
        .unwrap();
        assert_eq!(config.store.redb_options().segment_bytes, 64 << 20);
        assert_eq!(config.store.journal_segment_age, Duration::from_secs(30));
        assert_eq!(config.policy.policy().deadline_seconds, 600);

        let config = parsed(&[
            "--max-message-bytes",
            "4096",
            "--max-timestamp-past",
            "30days",
            "--max-timestamp-future",
            "5m",
        ])
        .unwrap();
        assert_eq!(config.limits.max_message_bytes, 4096);
        assert_eq!(
            config.limits.time_bounds(),
            crate::budget::timestamp::TimeBounds {
                max_past: Duration::from_secs(30 * 86_400),
                max_future: Duration::from_secs(300),
            }
        );
    }

    #[test]
    fn bad_values_are_refused_naming_their_key() {
        for (bad, key) in [
            (
                ["--journal-segment-mib", "0"],
                "store.journal_segment_bytes",
            ),
            (
                ["--journal-segment-mib", "1025"],
                "store.journal_segment_bytes",
            ),
            (["--journal-segment-age", "0s"], "store.journal_segment_age"),
            (["--max-batch", "0"], "store.max_batch"),
            (["--max-timestamp-past", "0s"], "limits.max_timestamp_past"),
        ] {
            let message = parsed(&bad).unwrap_err().to_string();
            assert!(message.starts_with("config_invalid: "), "{message}");
            assert!(message.contains(key), "{bad:?}: {message}");
        }
        let unparsable = Cli::try_parse_from(["retry-budget", "--journal-segment-age", "soon"]);
        assert_eq!(
            unparsable.unwrap_err().kind(),
            clap::error::ErrorKind::ValueValidation
        );
    }

    #[test]
    fn flags_override_the_file_which_overrides_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[bucket]\nrate = 7.0\nburst = 9\n[bucket.weights]\na = 2\n[store]\nmax_batch = 8\n",
        )
        .unwrap();
        let config = parsed(&[
            "--config",
            path.to_str().unwrap(),
            "--retry-burst",
            "50",
            "--tenant-weight",
            "b=3",
        ])
        .unwrap();
        assert_eq!((config.bucket.rate, config.bucket.burst), (7.0, 50));
        assert_eq!(config.bucket.weights.get("a"), Some(&2));
        assert_eq!(config.bucket.weights.get("b"), Some(&3));
        assert_eq!(config.store.max_batch, 8);
        assert_eq!(
            config.server.drain_delay,
            Config::default().server.drain_delay
        );
        assert!(Cli::try_parse_from(["retry-budget", "--tenant-weight", "b"]).is_err());
    }
}
