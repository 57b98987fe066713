//! What every section of the configuration shares, below all of them: how a
//! duration is written in the file, and the error a setting gives. The
//! sections (`auth`, `bucket`, `coord`, the store's) use these without
//! importing the configuration that gathers them.

use std::path::PathBuf;

use crate::budget::codes;

/// The configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{}: {path}: {source}", codes::CONFIG_UNREADABLE)]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("{}: {path}: {message}", codes::CONFIG_INVALID)]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line and column.
        message: String,
    },
    /// A setting, from whichever source, is out of its range.
    #[error("{}: {key}: {message}", codes::CONFIG_INVALID)]
    Value {
        /// The setting, as `section.key`.
        key: &'static str,
        /// What is wrong with it.
        message: String,
    },
}

/// Durations as people write them (`"2ms"`, `"1h 30m"`, `"7days"`).
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(*value).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}
