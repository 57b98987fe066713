//! The configuration file (`--config FILE`, TOML). Flags override what it
//! says; what neither says takes the documented defaults.
//!
//! ```toml
//! [bucket]
//! rate = 200.0             # retry tokens a second, for the whole service
//! burst = 400              # tokens when full
//! success_deposit = 0.1    # tokens each RecordSuccess adds back
//! [bucket.weights]         # fair-share weights (default 1)
//! checkout = 3
//! batch = 1
//!
//! [hints]
//! max_hint_seconds = 600   # a server's Retry-After is capped at this
//!
//! [[classification.rules]] # tried before the defaults; first match wins
//! name = "payments_409_transient"
//! http_status = 409
//! tenant = "payments"
//! class = "transient"
//! ```
//!
//! Unknown keys are errors, so a typo never silently keeps a default.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::bucket::BucketConfig;
use crate::budget::classify::RuleSpec;

/// The configuration file's contents.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// The global retry-token bucket.
    pub bucket: BucketConfig,
    /// Classification overrides.
    pub classification: ClassificationConfig,
    /// Server hints.
    pub hints: HintsConfig,
}

/// `[classification]`: rules tried in order before the default policy
/// (docs/classification.md); first match wins.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassificationConfig {
    /// The operator's rules.
    pub rules: Vec<RuleSpec>,
}

/// `[hints]`: how server hints are planned with.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HintsConfig {
    /// The longest delay a hint may ask for, in seconds (default 3600).
    pub max_hint_seconds: Option<u64>,
}

/// The configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// It cannot be read.
    #[error("config_unreadable: {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not valid TOML of the expected shape.
    #[error("config_invalid: {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line and column.
        message: String,
    },
}

impl FileConfig {
    /// Reads and parses a configuration file.
    ///
    /// # Errors
    /// [`ConfigError`] when it cannot be read or parsed.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let example: String = include_str!("config.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! "))
            .skip_while(|l| !l.starts_with("[bucket]"))
            .take_while(|l| !l.starts_with("```"))
            .collect::<Vec<_>>()
            .join("\n");
        let config: FileConfig = toml::from_str(&example).unwrap();
        assert_eq!(config.bucket.rate, 200.0);
        assert_eq!(config.bucket.weights.get("checkout"), Some(&3));
        config.bucket.validate().unwrap();
        assert_eq!(config.hints.max_hint_seconds, Some(600));
        crate::budget::classify::RuleSet::new(config.classification.rules).unwrap();
    }

    #[test]
    fn the_readme_example_parses_and_is_valid() {
        let readme = include_str!("../README.md");
        let start = readme.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let end = start + readme[start..].find("```").expect("closed");
        let config: FileConfig = toml::from_str(&readme[start..end]).unwrap();
        config.bucket.validate().unwrap();
        assert_eq!(config.bucket.weights.get("checkout"), Some(&3));
        crate::budget::classify::RuleSet::new(config.classification.rules).unwrap();
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = toml::from_str::<FileConfig>("[bucket]\nrat = 5.0\n").unwrap_err();
        assert!(err.to_string().contains("rat"), "{err}");
        assert!(toml::from_str::<FileConfig>("[buckt]\n").is_err());
    }
}
