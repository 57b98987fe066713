//! `retry-budget keys`: make an API key (`add`), or see which tenants have
//! keys (`list`), without ever showing a stored key (the file holds only
//! digests).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::{ENV_API_KEYS_FILE, ENV_CONFIG};
use crate::auth::{KeySet, append_key, new_api_key};
use crate::config::Config;

/// Options of `keys`.
#[derive(Debug, Args)]
pub struct KeysArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: KeysCommand,
}

/// Which keys file: named, or the one a configuration file names.
#[derive(Debug, Args)]
pub struct KeysFile {
    /// The keys file [auth.api_keys_file].
    #[arg(long, env = ENV_API_KEYS_FILE)]
    pub api_keys_file: Option<PathBuf>,
    /// A configuration file whose `[auth] api_keys_file` names it, when
    /// `--api-keys-file` does not.
    #[arg(long, env = ENV_CONFIG)]
    pub config: Option<PathBuf>,
}

impl KeysFile {
    /// The path, or why there is none.
    fn path(&self) -> Result<PathBuf, String> {
        if let Some(path) = &self.api_keys_file {
            return Ok(path.clone());
        }
        let Some(config) = &self.config else {
            return Err(
                "name the keys file: --api-keys-file FILE (or --config FILE with \
                        [auth] api_keys_file)"
                    .to_owned(),
            );
        };
        Config::load(config)
            .map_err(|error| error.to_string())?
            .auth
            .api_keys_file
            .ok_or_else(|| format!("{}: [auth] names no api_keys_file", config.display()))
    }
}

/// The `keys` subcommands.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print a new key for TENANT (once: only its digest is kept) and
    /// append `TENANT:sha256` to the keys file, created readable by its
    /// owner only. A running server takes it on SIGHUP.
    Add {
        /// The tenant the key proves.
        tenant: String,
        /// The keys file.
        #[command(flatten)]
        file: KeysFile,
    },
    /// List the keys file: line, tenant and the start of each digest.
    List {
        /// The keys file.
        #[command(flatten)]
        file: KeysFile,
    },
}

/// Runs `keys`: 0, or 2 with the reason on stderr.
pub(super) fn keys(args: &KeysArgs) -> ExitCode {
    let (KeysCommand::Add { file, .. } | KeysCommand::List { file }) = &args.command;
    let api_keys_file = match file.path() {
        Ok(path) => path,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let api_keys_file = &api_keys_file;
    match &args.command {
        KeysCommand::Add { tenant, .. } => {
            let key = match new_api_key() {
                Ok(key) => key,
                Err(error) => {
                    eprintln!("cannot make a key: no random source: {error}");
                    return ExitCode::FAILURE;
                }
            };
            if let Err(error) = append_key(api_keys_file, tenant, &key) {
                eprintln!("{}: {error}", api_keys_file.display());
                return ExitCode::from(2);
            }
            println!("{key}");
            eprintln!(
                "the key above is tenant {tenant:?}'s and is shown only now; its digest is in {} \
                 (send SIGHUP to a running server to take it)",
                api_keys_file.display()
            );
            ExitCode::SUCCESS
        }
        KeysCommand::List { .. } => match KeySet::load(api_keys_file) {
            Ok(keys) => {
                for (line, tenant, digest) in keys.listing() {
                    println!("{line}\t{tenant}\tsha256:{digest}...");
                }
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{}: {error}", api_keys_file.display());
                ExitCode::from(2)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_keys_file_is_named_or_read_from_the_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("c.toml");
        std::fs::write(
            &config,
            "[auth]\nmode = \"api-keys\"\napi_keys_file = \"/k\"\n",
        )
        .unwrap();
        let file = |api_keys_file: Option<&str>, config: Option<&Path>| KeysFile {
            api_keys_file: api_keys_file.map(PathBuf::from),
            config: config.map(Path::to_owned),
        };
        assert_eq!(
            file(Some("/n"), Some(&config)).path(),
            Ok(PathBuf::from("/n"))
        );
        assert_eq!(file(None, Some(&config)).path(), Ok(PathBuf::from("/k")));
        assert!(
            file(None, None)
                .path()
                .unwrap_err()
                .contains("--api-keys-file")
        );
        std::fs::write(&config, "[auth]\n").unwrap();
        assert!(
            file(None, Some(&config))
                .path()
                .unwrap_err()
                .contains("api_keys_file")
        );
    }
}
