//! Configuration at run time: SIGHUP (the binary) hands the server a newly
//! read configuration, and the settings that can change while serving do.
//!
//! Reloadable: the bucket's rate, burst, weights, success deposit and mode;
//! each dependency's pace (`[dependencies]`, from its next second on);
//! the classification rules; the hint bound; the API keys (the keys file is
//! read again, so keys rotate without a restart); the TLS certificate, key
//! and client CA (read again even when the configuration did not change;
//! see `tls`). Tokens already granted and
//! slots already booked survive (`FairBucket::set_capacity`). On
//! PostgreSQL the new rate, burst and weights are the global budget the
//! replicas split, from the coordination's next interval. Everything else
//! (addresses, the store, default policies, the coordination, metrics, the
//! request limits, the bucket's horizon and tenant bound) needs a restart,
//! and the log says which changed.
//!
//! A configuration that does not load or validate changes nothing: the
//! running one stays, the log names the key at fault, and the metric
//! `config_reloads_total{result="failed"}` counts it.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::auth::Authenticator;
use crate::bucket::{Capacity, FairBucket};
use crate::budget::activity::Defaults;
use crate::budget::classify::RuleSet;
use crate::config::{Config, ConfigError};
use crate::coord::Coordinator;
use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::store::Store;

/// A configuration read again, or why it could not be.
pub type Reload = Result<Config, ConfigError>;

/// What a reload reaches.
pub(super) struct Reloadable<'a, S> {
    /// The configuration in force.
    pub running: Config,
    pub ledger: &'a Ledger<S>,
    pub bucket: &'a FairBucket,
    pub coordinator: Option<&'a Coordinator>,
    pub rules: &'a ArcSwap<RuleSet>,
    pub metrics: Option<&'a Metrics>,
    pub auth: &'a Authenticator,
    /// The TLS config in force, when the server serves TLS.
    pub tls: Option<&'a super::tls::Certs>,
}

impl<S: Store> Reloadable<'_, S> {
    /// Applies `reload`, or keeps the running configuration and says why.
    pub fn apply(&mut self, reload: Reload) {
        let outcome = reload.and_then(|new| {
            // Validated when read; built here again to hand it over.
            let rules =
                RuleSet::new(new.classification.rules.clone()).map_err(|e| ConfigError::Value {
                    key: "classification.rules",
                    message: e.to_string(),
                })?;
            // Read here, before anything changes: a bad keys file keeps
            // the running keys as it keeps every other setting.
            let keys = new.auth.keys()?;
            Ok((new, rules, keys))
        });
        let (new, rules, keys) = match outcome {
            Ok(parts) => parts,
            Err(error) => {
                tracing::error!(%error, "reload refused: the running configuration stays");
                if let Some(metrics) = self.metrics {
                    metrics.reload(false);
                }
                return;
            }
        };
        match self.coordinator {
            Some(coordinator) => coordinator.set_budget(new.bucket.clone()),
            None => self
                .bucket
                .set_capacity(&Capacity::from_config(&new.bucket)),
        }
        self.bucket
            .set_dependencies(new.dependencies.clone(), &new.bucket);
        self.bucket.set_success_deposit(new.bucket.success_deposit);
        self.bucket.set_mode(new.bucket.mode);
        self.rules.store(Arc::new(rules));
        if new.auth.mode == self.auth.mode() {
            self.auth.set_keys(keys);
        }
        self.ledger.set_defaults(Defaults {
            max_hint_ms: new.hints.max_hint_ms(),
            ..self.ledger.defaults()
        });
        if let Some(tls) = self.tls {
            tls.reload(&new.tls);
        }
        let restart = needs_restart(&self.running, &new);
        if !restart.is_empty() {
            tracing::warn!(
                keys = restart.join(", "),
                "reloaded; these changes take effect only after a restart"
            );
        }
        tracing::info!(
            rate = new.bucket.rate,
            burst = new.bucket.burst,
            mode = ?new.bucket.mode,
            rules = new.classification.rules.len(),
            max_hint_seconds = new.hints.max_hint_seconds,
            "configuration reloaded"
        );
        if let Some(metrics) = self.metrics {
            metrics.reload(true);
            metrics.set_config_hash(&config_sha256(&new));
        }
        self.running = new;
    }
}

/// The sections and keys that changed but are read only at start.
fn needs_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let toml = |value: &dyn erased::Toml| value.text();
    let mut keys = Vec::new();
    let sections: [(&'static str, &dyn erased::Toml, &dyn erased::Toml); 6] = [
        ("server", &old.server, &new.server),
        ("limits", &old.limits, &new.limits),
        ("store", &old.store, &new.store),
        ("policy", &old.policy, &new.policy),
        ("coordination", &old.coordination, &new.coordination),
        ("metrics", &old.metrics, &new.metrics),
    ];
    for (name, a, b) in sections {
        if toml(a) != toml(b) {
            keys.push(name);
        }
    }
    if old.bucket.max_tenants != new.bucket.max_tenants {
        keys.push("bucket.max_tenants");
    }
    if old.tls.cert.is_some() != new.tls.cert.is_some() {
        keys.push("tls.cert");
    }
    if old.tls.handshake_timeout != new.tls.handshake_timeout {
        keys.push("tls.handshake_timeout");
    }
    if old.tls.watch_interval != new.tls.watch_interval {
        keys.push("tls.watch_interval");
    }
    if old.bucket.max_reservation_ms != new.bucket.max_reservation_ms {
        keys.push("bucket.max_reservation_ms");
    }
    // The keys file is read again on every reload; the rest of [auth] is
    // read at start.
    let auth = |config: &Config| crate::auth::AuthConfig {
        api_keys_file: None,
        ..config.auth.clone()
    };
    if toml(&auth(old)) != toml(&auth(new)) {
        keys.push("auth");
    }
    keys
}

/// The SHA-256 of the configuration as `--print-config` prints it.
pub(super) fn config_sha256(config: &Config) -> String {
    use sha2::Digest;
    let toml = config.to_toml().unwrap_or_default();
    sha2::Sha256::digest(toml.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Sections compared by their TOML: equal text, equal settings.
mod erased {
    pub(super) trait Toml {
        fn text(&self) -> String;
    }

    impl<T: serde::Serialize> Toml for T {
        fn text(&self) -> String {
            toml::to_string(self).unwrap_or_default()
        }
    }
}
