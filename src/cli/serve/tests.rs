//! The flags of `serve` against the keys they set.

use std::time::Duration;

use clap::{CommandFactory, Parser};

use crate::cli::Cli;
use crate::config::{Config, ConfigError};

fn parsed(args: &[&str]) -> Result<Config, ConfigError> {
    let mut argv = vec!["retry-budget"];
    argv.extend_from_slice(args);
    Cli::try_parse_from(argv).unwrap().serve.config()
}

#[test]
fn no_flag_keeps_the_one_default_and_flags_reach_their_keys() {
    let defaults = Config::default();
    let config = parsed(&[]).unwrap();
    assert_eq!(config.to_toml(), defaults.to_toml());
    let store = crate::store::EmbeddedStoreOptions::new("x");
    assert_eq!(config.store.embedded_options().max_batch, store.max_batch);

    let config = parsed(&["--max-batch", "64", "--default-deadline", "10m"]).unwrap();
    assert_eq!(config.store.embedded_options().max_batch, 64);
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
        (["--max-batch", "0"], "store.max_batch"),
        (["--max-batch", "65537"], "store.max_batch"),
        (["--max-timestamp-past", "0s"], "limits.max_timestamp_past"),
    ] {
        let message = parsed(&bad).unwrap_err().to_string();
        assert!(message.starts_with("config_invalid: "), "{message}");
        assert!(message.contains(key), "{bad:?}: {message}");
    }
    let unparsable = Cli::try_parse_from(["retry-budget", "--default-deadline", "soon"]);
    assert_eq!(
        unparsable.unwrap_err().kind(),
        clap::error::ErrorKind::ValueValidation
    );
}

#[test]
fn the_journals_removed_flags_are_refused_naming_what_replaced_them() {
    for (flag, value, key) in [
        ("--commit-window", "2ms", "store.commit_window"),
        ("--journal-segment-mib", "8", "store.journal_segment_bytes"),
        ("--journal-segment-age", "5s", "store.journal_segment_age"),
    ] {
        let message = parsed(&[flag, value]).unwrap_err().to_string();
        assert!(message.starts_with("config_invalid: "), "{message}");
        assert!(message.contains(key), "{flag}: {message}");
        assert!(message.contains("removed"), "{flag}: {message}");
    }
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

/// Each flag given alone sets exactly one key of the file, the one its help
/// names in brackets: nothing copies a flag to a key by hand, so this is
/// where a wrong serde name would show.
#[test]
fn every_flag_sets_the_one_key_its_help_names() {
    let mut command = Cli::command();
    // Built, so that each argument says whether it takes a value.
    command.build();
    let serve = command.find_subcommand("serve").expect("serve");
    // A value of each kind some flag takes; the first one clap accepts is
    // given.
    let samples = ["7", "1s", "127.0.0.1:1", "a=2", "shadow", "api-keys", "x"];
    let mut checked = 0;
    for arg in serve.get_arguments() {
        let (Some(long), Some(help)) = (arg.get_long(), arg.get_help()) else {
            continue;
        };
        let key = super::key_in_help(&help.to_string());
        if key.is_empty() {
            continue;
        }
        let flag = format!("--{long}");
        let cli = if arg.get_num_args().is_some_and(|n| n.takes_values()) {
            samples
                .iter()
                .find_map(|v| Cli::try_parse_from(["retry-budget", flag.as_str(), v]).ok())
        } else {
            Cli::try_parse_from(["retry-budget", flag.as_str()]).ok()
        }
        .unwrap_or_else(|| panic!("{flag}: no sample value parses"));
        let table = toml::Table::try_from(&cli.serve.settings).unwrap();
        let leaves = leaves(&table, "");
        let (section, name) = key.split_once('.').unwrap();
        assert!(
            leaves.len() == 1 && leaves[0].starts_with(&format!("{section}.{name}")),
            "{flag} sets {leaves:?}, its help says [{key}]"
        );
        checked += 1;
    }
    assert!(checked >= 49, "{checked} flags checked");
}

fn leaves(table: &toml::Table, prefix: &str) -> Vec<String> {
    table
        .iter()
        .flat_map(|(key, value)| match value {
            toml::Value::Table(inner) => leaves(inner, &format!("{prefix}{key}.")),
            _ => vec![format!("{prefix}{key}")],
        })
        .collect()
}
