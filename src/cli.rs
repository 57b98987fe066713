//! The command line: `serve` (the default) runs the service; `delay`,
//! `next-action` and `explain` answer people without grpcurl (in `client`).
//!
//! Every `serve` flag is optional and overrides one key of the
//! configuration file (see [`crate::config`]): what no flag, variable or
//! file sets keeps its one declared default.

mod client;
mod keys;
mod migrate;
mod serve;

use clap::{Parser, Subcommand};

pub use self::client::{ClientTlsArgs, DelayArgs, ExplainArgs, NextActionArgs, run_client};
pub use self::keys::{KeysArgs, KeysCommand, KeysFile};
pub use self::migrate::{MigrateArgs, migrate};
pub use self::serve::{ServeArgs, Settings};

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

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Lines for people.
    #[default]
    Text,
    /// One JSON object a line.
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/configuration.md's flag table names every flag of `serve`, and
    /// only those, each with its environment variable and the key its help
    /// names: the reference a user reads is `--help`'s (and
    /// `serve::tests` checks each flag sets that key).
    #[test]
    fn the_configuration_doc_lists_every_serve_flag_with_its_variable_and_key() {
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
            let unquoted = |cell: &str| cell.trim_matches('`').to_owned();
            documented.insert(flag, (unquoted(cells[2]), unquoted(cells[3])));
        }
        let command = Cli::command();
        let serve = command
            .find_subcommand("serve")
            .expect("a serve subcommand");
        let helped: std::collections::BTreeMap<String, (String, String)> = serve
            .get_arguments()
            // Hidden flags are removed ones, refused when given.
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| {
                let long = a.get_long()?;
                let env = a
                    .get_env()
                    .map(|e| e.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let help = a.get_help().map(ToString::to_string).unwrap_or_default();
                Some((format!("--{long}"), (env, serve::key_in_help(&help))))
            })
            .filter(|(flag, _)| flag != "--help")
            .collect();
        assert_eq!(
            documented, helped,
            "docs/configuration.md's flag table against `retry-budget serve --help`"
        );
    }

    #[test]
    fn serve_is_the_default_subcommand() {
        let cli = Cli::try_parse_from(["retry-budget", "--listen", "127.0.0.1:0"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.settings.listen().map(|a| a.port()), Some(0));
        let cli = Cli::try_parse_from(["retry-budget", "delay", "flight-1"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Delay(_))));
    }
}
