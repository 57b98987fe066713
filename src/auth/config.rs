//! `[auth]`: how the server decides who asks.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::identity::IdentityPattern;
use super::keys::KeySet;
use crate::budget::tenant::{self, DEFAULT_TENANT};
use crate::setting::ConfigError;

/// How a request proves its tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMode {
    /// `x-tenant-id` is believed: for development, or a network where
    /// every caller is trusted.
    #[default]
    None,
    /// `authorization: Bearer <key>`, the tenant being the key's.
    ApiKeys,
    /// The identity the service mesh proves (client certificate or the
    /// sidecar's header), mapped to a tenant.
    Mesh,
}

impl AuthMode {
    /// The mode as the configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::ApiKeys => "api-keys",
            Self::Mesh => "mesh",
        }
    }
}

/// `[auth]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// How a request proves its tenant.
    pub mode: AuthMode,
    /// In `none` mode, the tenant of a request without `x-tenant-id`; `""`
    /// makes the header required (`tenant_required`).
    pub default_tenant: String,
    /// Health and reflection ask for the same credential as the API. Off by
    /// default: probes and mesh health checks rarely carry one, and neither
    /// service tells anything about a tenant.
    pub protect_health_reflection: bool,
    /// In `api-keys` mode, the file of `tenant:sha256-hex-of-key` lines;
    /// read at start and again on SIGHUP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_keys_file: Option<PathBuf>,
    /// In `mesh` mode, how an identity (a SPIFFE ID, a Linkerd identity)
    /// names its tenant, e.g. `"spiffe://cluster.local/ns/{tenant}/sa/*"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_pattern: Option<String>,
    /// In `mesh` mode, the header the sidecar sets with the caller's proven
    /// identity (`x-forwarded-client-cert`, `l5d-client-id`). Believed only
    /// when set here: the port must then be reachable only through the
    /// sidecar.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mesh_header: Option<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            mode: AuthMode::None,
            default_tenant: DEFAULT_TENANT.to_owned(),
            protect_health_reflection: false,
            api_keys_file: None,
            identity_pattern: None,
            mesh_header: None,
        }
    }
}

impl AuthConfig {
    /// Checks the settings together, and reads the keys file in `api-keys`
    /// mode, so that a bad line stops the server at start (or refuses a
    /// reload) naming its line.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.checked().map(drop)
    }

    /// What the settings name, checked together: the keys (read now), the
    /// identity pattern and the sidecar's header, each where its mode
    /// uses it.
    pub(super) fn checked(
        &self,
    ) -> Result<(KeySet, Option<IdentityPattern>, Option<http::HeaderName>), ConfigError> {
        let value = |key, message: String| ConfigError::Value { key, message };
        let only_in = |key, mode: AuthMode| {
            value(
                key,
                format!(
                    "is read only with mode = \"{}\" (mode is \"{}\")",
                    mode.as_str(),
                    self.mode.as_str()
                ),
            )
        };
        if !self.default_tenant.is_empty() && tenant::validate(&self.default_tenant).is_err() {
            return Err(value(
                "auth.default_tenant",
                "must be a tenant id (1 to 128 printable ASCII characters) or \"\"".to_owned(),
            ));
        }
        if self.mode != AuthMode::ApiKeys && self.api_keys_file.is_some() {
            return Err(only_in("auth.api_keys_file", AuthMode::ApiKeys));
        }
        if self.mode != AuthMode::Mesh {
            if self.identity_pattern.is_some() {
                return Err(only_in("auth.identity_pattern", AuthMode::Mesh));
            }
            if self.mesh_header.is_some() {
                return Err(only_in("auth.mesh_header", AuthMode::Mesh));
            }
        }
        Ok((self.keys()?, self.pattern()?, self.mesh_header()?))
    }

    /// The keys of `api_keys_file`, read now; an empty set outside
    /// `api-keys` mode.
    ///
    /// # Errors
    /// [`ConfigError`] when the file is missing from the configuration,
    /// cannot be read, or has a bad line (named).
    pub fn keys(&self) -> Result<KeySet, ConfigError> {
        if self.mode != AuthMode::ApiKeys {
            return Ok(KeySet::default());
        }
        let Some(path) = &self.api_keys_file else {
            return Err(ConfigError::Value {
                key: "auth.api_keys_file",
                message: "mode = \"api-keys\" needs a keys file (--api-keys-file)".to_owned(),
            });
        };
        KeySet::load(path).map_err(|error| error.into_config_error(path))
    }

    /// The identity pattern, in `mesh` mode.
    ///
    /// # Errors
    /// [`ConfigError`] when it is missing in `mesh` mode or malformed.
    pub fn pattern(&self) -> Result<Option<IdentityPattern>, ConfigError> {
        if self.mode != AuthMode::Mesh {
            return Ok(None);
        }
        let Some(text) = &self.identity_pattern else {
            return Err(ConfigError::Value {
                key: "auth.identity_pattern",
                message: "mode = \"mesh\" needs a pattern mapping identities to tenants, \
                          e.g. \"spiffe://cluster.local/ns/{tenant}/sa/*\""
                    .to_owned(),
            });
        };
        IdentityPattern::parse(text)
            .map(Some)
            .map_err(|error| ConfigError::Value {
                key: "auth.identity_pattern",
                message: error.to_string(),
            })
    }

    /// The sidecar's identity header, when one is trusted.
    ///
    /// # Errors
    /// [`ConfigError`] for a name that is not a valid header name.
    pub fn mesh_header(&self) -> Result<Option<http::HeaderName>, ConfigError> {
        self.mesh_header
            .as_deref()
            .map(|name| {
                http::HeaderName::try_from(name.to_ascii_lowercase()).map_err(|_| {
                    ConfigError::Value {
                        key: "auth.mesh_header",
                        message: format!("{name:?} is not a header name"),
                    }
                })
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(config: &AuthConfig) -> String {
        config.validate().unwrap_err().to_string()
    }

    #[test]
    fn settings_of_another_mode_are_refused_so_a_file_never_looks_enforced() {
        let config = AuthConfig {
            api_keys_file: Some("keys".into()),
            ..AuthConfig::default()
        };
        let text = message(&config);
        assert!(
            text.starts_with("config_invalid: auth.api_keys_file: "),
            "{text}"
        );
        let config = AuthConfig {
            mesh_header: Some("l5d-client-id".into()),
            mode: AuthMode::ApiKeys,
            ..AuthConfig::default()
        };
        assert!(message(&config).contains("auth.mesh_header"));
    }

    #[test]
    fn each_mode_needs_its_settings() {
        let keys = AuthConfig {
            mode: AuthMode::ApiKeys,
            ..AuthConfig::default()
        };
        assert!(message(&keys).contains("auth.api_keys_file"));
        let mesh = AuthConfig {
            mode: AuthMode::Mesh,
            ..AuthConfig::default()
        };
        assert!(message(&mesh).contains("auth.identity_pattern"));
        let mesh = AuthConfig {
            mode: AuthMode::Mesh,
            identity_pattern: Some("spiffe://td/ns/{tenant}".into()),
            mesh_header: Some("bad header".into()),
            ..AuthConfig::default()
        };
        assert!(message(&mesh).contains("auth.mesh_header"));
        let bad_default = AuthConfig {
            default_tenant: "a b".into(),
            ..AuthConfig::default()
        };
        assert!(message(&bad_default).contains("auth.default_tenant"));
        AuthConfig {
            default_tenant: String::new(),
            ..AuthConfig::default()
        }
        .validate()
        .unwrap();
    }
}
