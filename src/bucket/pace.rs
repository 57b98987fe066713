//! A dependency's pace: how many retries a second it is allowed. Pure:
//! the configuration, the window of a tenant's reported successes, and the
//! sentence a decision quotes.
//!
//! # Two parts
//! - **What the service sees** sets the dependency's allowance, shared by
//!   its tenants: the failures it is asked about and the fate of the
//!   retries it grants (`super::health`). It starts at `initial` with no
//!   evidence, is cut by trouble to `floor` (and below, as probes space
//!   out while it lasts), and grows while granted
//!   retries do not fail, up to `ceiling` or the global rate. A
//!   configuration may instead pin a static `rate`.
//! - **What a tenant reports** adds to that tenant alone: `ratio` of the
//!   successes it reported (`ReportTraffic`) or recorded (`RecordSuccess`)
//!   over the last `window`, a lane of its own that no other tenant's
//!   claims can raise (the SRE book's rule of a tenth). The reports stay
//!   the fast signal: they fall the moment calls stop succeeding.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::budget::error::validate_dependency;
use crate::budget::token::{Evidence, Pace};

/// Default share of a tenant's reported successes it may retry on top of
/// the dependency's allowance.
pub const DEFAULT_RATIO: f64 = 0.1;
/// Default floor, retries a second: where trouble cuts a dependency to, one
/// probe a second fleet-wide (spaced out to one every 8 s while it lasts).
pub const DEFAULT_FLOOR: f64 = 1.0;
/// Default starting allowance, retries a second, of a dependency nothing
/// is known of: enough for a burst of first failures to be retried at
/// once (20 activities failing within a second), not a retry storm.
pub const DEFAULT_INITIAL: f64 = 20.0;
/// Default window over which successes are counted.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5);
/// Default seconds of the allowed rate a dependency's bucket holds.
pub const DEFAULT_BURST_SECONDS: f64 = 1.0;
/// Default bound on dependencies tracked one by one.
pub const DEFAULT_MAX_DEPENDENCIES: usize = 64;
/// Default bound on the dependencies one tenant may have introduced among
/// those tracked: no tenant fills every slot.
pub const DEFAULT_MAX_DEPENDENCIES_PER_TENANT: usize = 16;
/// Default traffic reports a second a tenant may send to one replica: its
/// workers report about once a second each, so a thousand workers.
pub const DEFAULT_MAX_REPORTS_PER_SECOND: f64 = 1000.0;
pub use crate::budget::token::DEFAULT_DEPENDENCY;
/// The shared entry of the dependencies past `max_dependencies`.
pub const OVERFLOW_DEPENDENCY: &str = "untracked dependencies";
/// Longest window accepted: the ring holds one slot a second.
pub const MAX_WINDOW: Duration = Duration::from_secs(300);

/// How one dependency is paced (`[dependencies]`, or one entry of
/// `[dependencies.named]`). Every field has a default.
///
/// ```toml
/// [dependencies]
/// initial = 20.0    # retries a second with no evidence yet
/// floor = 1.0       # retries a second trouble cuts to (probes)
/// # ceiling = 50.0  # never more than this (default: only the global rate)
/// # rate = 20.0     # pins a static rate instead of the adaptive rule
/// ratio = 0.1       # a tenant's own extra: retries per reported success
/// window = "5s"     # reported successes are counted over this
/// burst_seconds = 1.0
/// max_dependencies = 64
/// max_dependencies_per_tenant = 16
/// [dependencies.named.payments-api]
/// ceiling = 30.0
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PaceConfig {
    /// Retries a second a dependency is allowed before the service has
    /// seen anything of it, and where its allowance settles once the
    /// evidence has aged out. Default [`DEFAULT_INITIAL`].
    pub initial: f64,
    /// Retries a second allowed however much trouble is seen. Default
    /// [`DEFAULT_FLOOR`].
    pub floor: f64,
    /// Retries a second never exceeded. Default: none (the global rate
    /// bounds every dependency anyway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<f64>,
    /// A static rate, retries a second, instead of the adaptive rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// Retries a second a tenant may add for itself per success a second
    /// it reported. Default [`DEFAULT_RATIO`].
    pub ratio: f64,
    /// How long reported successes count. Default [`DEFAULT_WINDOW`].
    #[serde(with = "crate::setting::duration")]
    pub window: Duration,
    /// A dependency's bucket holds this many seconds of its allowed rate
    /// (at least one token). Default [`DEFAULT_BURST_SECONDS`].
    pub burst_seconds: f64,
}

impl Default for PaceConfig {
    fn default() -> Self {
        Self {
            initial: DEFAULT_INITIAL,
            floor: DEFAULT_FLOOR,
            ceiling: None,
            rate: None,
            ratio: DEFAULT_RATIO,
            window: DEFAULT_WINDOW,
            burst_seconds: DEFAULT_BURST_SECONDS,
        }
    }
}

/// `[dependencies]`: the pace of unnamed dependencies, the ones named, and
/// the bounds on how many are tracked.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DependenciesConfig {
    /// The pace of every dependency not named below.
    #[serde(flatten)]
    pub default: PaceConfig,
    /// Dependencies with a pace of their own: always tracked.
    pub named: BTreeMap<String, PaceConfig>,
    /// How many dependencies are tracked one by one; past it, new ones
    /// share one entry ([`OVERFLOW_DEPENDENCY`]), paced by the default, and
    /// are told so. Default [`DEFAULT_MAX_DEPENDENCIES`].
    pub max_dependencies: usize,
    /// How many of the tracked dependencies one tenant may have introduced
    /// (named first); its further names share the untracked entry.
    /// Default [`DEFAULT_MAX_DEPENDENCIES_PER_TENANT`].
    pub max_dependencies_per_tenant: usize,
    /// Traffic reports a second each tenant may send to this replica
    /// (`ReportTraffic`); past it, a report is refused with when to send
    /// the next. Default [`DEFAULT_MAX_REPORTS_PER_SECOND`].
    pub max_reports_per_second: f64,
}

impl Default for DependenciesConfig {
    fn default() -> Self {
        Self {
            default: PaceConfig::default(),
            named: BTreeMap::new(),
            max_dependencies: DEFAULT_MAX_DEPENDENCIES,
            max_dependencies_per_tenant: DEFAULT_MAX_DEPENDENCIES_PER_TENANT,
            max_reports_per_second: DEFAULT_MAX_REPORTS_PER_SECOND,
        }
    }
}

/// A pace configuration that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PaceConfigError {
    /// A field is not a finite number in its range.
    #[error("dependency {dependency:?}: {field} must be {range}, got {got}")]
    OutOfRange {
        /// Which dependency (`default` for the unnamed ones).
        dependency: String,
        /// The field.
        field: &'static str,
        /// What it must be.
        range: &'static str,
        /// What it is.
        got: f64,
    },
    /// The window is under a second or over [`MAX_WINDOW`].
    #[error("dependency {0:?}: window must be 1s to 300s")]
    Window(String),
    /// A named dependency is not a valid dependency name.
    #[error("dependencies.named has {0:?}, which is not 1 to 64 printable ASCII characters")]
    InvalidName(String),
    /// No dependency could be tracked.
    #[error("max_dependencies must be 1 to 4096, got {0}")]
    MaxDependencies(usize),
    /// No tenant could introduce a dependency, or one could fill them all.
    #[error("max_dependencies_per_tenant must be 1 to max_dependencies, got {0}")]
    MaxDependenciesPerTenant(usize),
}

impl PaceConfig {
    fn validate(&self, dependency: &str) -> Result<(), PaceConfigError> {
        let out = |field, range, got| PaceConfigError::OutOfRange {
            dependency: dependency.to_owned(),
            field,
            range,
            got,
        };
        let rate = crate::bucket::config::MIN_RATE..=crate::bucket::config::MAX_RATE;
        if !(0.0..=1000.0).contains(&self.ratio) {
            return Err(out("ratio", "between 0 and 1000", self.ratio));
        }
        if !rate.contains(&self.floor) {
            return Err(out("floor", "between 0.001 and 1000000", self.floor));
        }
        if !(self.floor..=*rate.end()).contains(&self.initial) {
            return Err(out(
                "initial",
                "between the floor and 1000000",
                self.initial,
            ));
        }
        if let Some(ceiling) = self.ceiling
            && !(self.floor..=*rate.end()).contains(&ceiling)
        {
            return Err(out("ceiling", "between the floor and 1000000", ceiling));
        }
        if let Some(pinned) = self.rate
            && !rate.contains(&pinned)
        {
            return Err(out("rate", "between 0.001 and 1000000", pinned));
        }
        if !(0.001..=3600.0).contains(&self.burst_seconds) {
            return Err(out(
                "burst_seconds",
                "between 0.001 and 3600",
                self.burst_seconds,
            ));
        }
        if !(Duration::from_secs(1)..=MAX_WINDOW).contains(&self.window) {
            return Err(PaceConfigError::Window(dependency.to_owned()));
        }
        Ok(())
    }

    /// The limits the adaptive rule works within, under the global rate
    /// `global` (the ceiling, if lower, caps it).
    pub fn limits(&self, global: f64) -> super::health::Limits {
        let cap = self
            .ceiling
            .map_or(global, |c| c.min(global))
            .max(self.floor);
        super::health::Limits {
            floor: self.floor,
            initial: self.initial.min(cap),
            cap,
        }
    }

    /// What a tenant's reported `successes` a second add for it alone.
    pub fn earned(&self, successes: f64) -> f64 {
        let earned = self.ratio * successes.max(0.0);
        self.ceiling.map_or(earned, |c| earned.min(c))
    }

    /// Tokens the dependency's bucket holds at `allowed` a second.
    pub fn burst(&self, allowed: f64) -> u32 {
        (allowed * self.burst_seconds)
            .floor()
            .clamp(1.0, f64::from(u32::MAX)) as u32
    }
}

impl DependenciesConfig {
    /// Every dependency at the static `rate`, retries a second: with a rate
    /// at or above the global one, the global bucket alone limits retries.
    pub fn static_rate(rate: f64) -> Self {
        Self {
            default: PaceConfig {
                rate: Some(rate),
                ..PaceConfig::default()
            },
            ..Self::default()
        }
    }

    /// Checks every field.
    ///
    /// # Errors
    /// The first [`PaceConfigError`] found.
    pub fn validate(&self) -> Result<(), PaceConfigError> {
        self.default.validate(DEFAULT_DEPENDENCY)?;
        for (name, pace) in &self.named {
            if !is_valid_name(name) {
                return Err(PaceConfigError::InvalidName(name.clone()));
            }
            pace.validate(name)?;
        }
        if !(1..=4096).contains(&self.max_dependencies) {
            return Err(PaceConfigError::MaxDependencies(self.max_dependencies));
        }
        if !(1.0..=1e6).contains(&self.max_reports_per_second) {
            return Err(PaceConfigError::OutOfRange {
                dependency: DEFAULT_DEPENDENCY.to_owned(),
                field: "max_reports_per_second",
                range: "between 1 and 1000000",
                got: self.max_reports_per_second,
            });
        }
        if !(1..=self.max_dependencies).contains(&self.max_dependencies_per_tenant) {
            return Err(PaceConfigError::MaxDependenciesPerTenant(
                self.max_dependencies_per_tenant,
            ));
        }
        Ok(())
    }

    /// The pace configuration of `dependency`.
    pub fn pace_of(&self, dependency: &str) -> &PaceConfig {
        self.named.get(dependency).unwrap_or(&self.default)
    }
}

/// Whether `name` is a dependency name a configuration may give a pace:
/// the core's rule ([`validate_dependency`]), and not empty.
fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && validate_dependency(name).is_ok()
}

/// Successes counted over the last `window` whole seconds, in one-second
/// slots, plus the second under way. Pure: `now` is a parameter, in whole
/// seconds of the bucket's clock.
#[derive(Debug, Clone)]
pub struct SuccessWindow {
    /// Count of each of the last `slots.len()` seconds (the window's whole
    /// seconds and the one under way), by second modulo.
    slots: Vec<u64>,
    /// The second the newest slot counts.
    newest: u64,
    /// The second of the first success counted: before the window has run
    /// that long, the seconds since are the divisor.
    first: Option<u64>,
}

impl SuccessWindow {
    /// An empty window of `window` (whole seconds, at least one).
    pub fn new(window: Duration) -> Self {
        Self {
            slots: vec![0; window.as_secs().max(1) as usize + 1],
            newest: 0,
            first: None,
        }
    }

    /// The window made `window` long (a reload); the counts of the seconds
    /// still inside it are kept.
    pub fn resize(&mut self, window: Duration) {
        let len = window.as_secs().max(1) as usize + 1;
        if len == self.slots.len() {
            return;
        }
        let old = self.slots.len() as u64;
        let mut slots = vec![0; len];
        for back in 0..(len as u64).min(old).min(self.newest + 1) {
            let second = self.newest - back;
            slots[(second % len as u64) as usize] = self.slots[(second % old) as usize];
        }
        self.slots = slots;
    }

    /// Counts `n` successes at `now`.
    pub fn add(&mut self, now: Duration, n: u64) {
        let second = self.advance(now);
        if n > 0 {
            self.first.get_or_insert(second);
        }
        let len = self.slots.len() as u64;
        let slot = &mut self.slots[(second % len) as usize];
        *slot = slot.saturating_add(n);
    }

    /// Successes a second over the window's whole seconds before `now`'s:
    /// the second under way is left out, as it has counted only part of its
    /// successes (a pace read early in a second would otherwise read low).
    /// Until the window has run since the first success counted (a
    /// dependency just seen, a server just started), the whole seconds
    /// since then are the divisor; in its first second, what that second
    /// has counted so far (which errs low, never high).
    pub fn rate(&mut self, now: Duration) -> f64 {
        let second = self.advance(now);
        let Some(first) = self.first else {
            return 0.0;
        };
        let len = self.slots.len() as u64;
        let current = self.slots[(second % len) as usize];
        if second == first {
            return current as f64;
        }
        let span = (second - first).min(len - 1);
        // Saturating: a count near u64::MAX must not wrap the sum (a
        // crafted report could otherwise pin the rate near zero).
        let total = self
            .slots
            .iter()
            .fold(0u64, |sum, n| sum.saturating_add(*n));
        total.saturating_sub(current) as f64 / span as f64
    }

    /// Moves the window to `now`, clearing the seconds it leaves behind;
    /// returns `now`'s second.
    fn advance(&mut self, now: Duration) -> u64 {
        let second = now.as_secs();
        let len = self.slots.len() as u64;
        if second > self.newest {
            for s in (self.newest + 1)..=second.min(self.newest + len) {
                self.slots[(s % len) as usize] = 0;
            }
            self.newest = second;
        }
        second
    }
}

impl fmt::Display for Pace {
    /// "4.1 retries/s allowed: 38 of the 40 retries granted in the last
    /// 10 s failed", and, when the asking tenant earned some by its
    /// reported successes, "; 3.2 more for this tenant (10% of its 32
    /// successes/s)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.tracked {
            write!(
                f,
                "not tracked on its own (it shares the entry \"{OVERFLOW_DEPENDENCY}\"): "
            )?;
        }
        write!(
            f,
            "{} retries/s allowed: {}",
            Rate(self.allowed),
            self.evidence
        )?;
        if self.earned > 0.0 {
            write!(
                f,
                "; {} more for this tenant ({}% of its {} successes/s)",
                Rate(self.earned),
                Rate(self.ratio * 100.0),
                Rate(self.successes)
            )?;
        }
        Ok(())
    }
}

/// The pace of a dependency with the static `rate` or the allowance
/// `allowed` (the evidence says which), without a tenant's own lane.
pub fn pace(allowed: f64, evidence: Evidence, tracked: bool) -> Pace {
    Pace {
        allowed,
        earned: 0.0,
        successes: 0.0,
        ratio: 0.0,
        evidence,
        tracked,
    }
}

/// A rate printed with up to three significant decimals, no trailing zeros.
pub(crate) struct Rate(pub(crate) f64);

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        let text = if v >= 100.0 {
            format!("{v:.0}")
        } else if v >= 10.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.3}")
        };
        let text = if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.')
        } else {
            &text
        };
        f.write_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::token::HealthState;

    #[test]
    fn the_limits_and_the_earned_lane_respect_the_ceiling_and_the_global_rate() {
        let mut c = PaceConfig::default();
        let l = c.limits(100.0);
        assert_eq!((l.floor, l.initial, l.cap), (1.0, 20.0, 100.0));
        assert_eq!(c.limits(10.0).initial, 10.0, "never above the cap");
        assert_eq!(c.earned(320.0), 32.0);
        c.ceiling = Some(20.0);
        assert_eq!(c.limits(100.0).cap, 20.0);
        assert_eq!(c.earned(320.0), 20.0);
        assert_eq!(c.burst(0.2), 1, "at least one token");
        assert_eq!(c.burst(32.7), 32);
    }

    #[test]
    fn a_pace_reads_as_a_sentence_with_its_numbers() {
        let evidence = Evidence {
            state: HealthState::Trouble,
            granted: 40,
            retries_failed: 38,
            ..Evidence::default()
        };
        let mut p = pace(4.1, evidence, true);
        assert_eq!(
            p.to_string(),
            "4.1 retries/s allowed: 38 of the 40 retries granted in the last 10 s failed"
        );
        p.earned = 3.2;
        p.ratio = 0.1;
        p.successes = 32.0;
        assert!(
            p.to_string()
                .ends_with("; 3.2 more for this tenant (10% of its 32 successes/s)")
        );
        p.tracked = false;
        assert!(p.to_string().starts_with("not tracked on its own"));
        assert_eq!(
            pace(20.0, Evidence::default(), true).to_string(),
            "20 retries/s allowed: no evidence yet: its starting allowance"
        );
    }

    #[test]
    fn the_window_forgets_what_is_older_than_it() {
        let mut w = SuccessWindow::new(Duration::from_secs(5));
        let s = Duration::from_secs;
        w.add(s(0), 10);
        assert_eq!(
            w.rate(s(0)),
            10.0,
            "its first second: what it counted so far"
        );
        for second in 1..=5 {
            w.add(s(second), 10);
        }
        assert_eq!(w.rate(s(5)), 10.0, "seconds 0 to 4, whole; 5 is under way");
        w.add(s(5), 1000);
        assert_eq!(w.rate(s(5)), 10.0, "the second under way is left out");
        assert_eq!(w.rate(s(6)), 210.0, "seconds 1 to 5: 1,050 over 5 s");
        assert_eq!(w.rate(s(11)), 0.0, "all of it left the window");
        w.add(s(100), 5);
        assert_eq!(w.rate(s(101)), 1.0, "a long gap clears every slot");
        let mut late = SuccessWindow::new(Duration::from_secs(5));
        assert_eq!(late.rate(s(60)), 0.0);
        late.add(s(60), 30);
        assert_eq!(
            late.rate(s(60)),
            30.0,
            "first seen late: its own first second"
        );
        late.add(s(61), 5);
        assert_eq!(late.rate(s(61)), 30.0, "one whole second, not five");
    }

    #[test]
    fn bad_settings_name_their_dependency_and_field() {
        let mut c = DependenciesConfig::default();
        c.validate().unwrap();
        c.named.insert(
            "payments-api".into(),
            PaceConfig {
                ratio: -1.0,
                ..PaceConfig::default()
            },
        );
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("dependency \"payments-api\": ratio"),
            "{err}"
        );
        c.named.clear();
        c.named.insert("has space".into(), PaceConfig::default());
        assert!(c.validate().unwrap_err().to_string().contains("printable"));
        c.named.clear();
        c.default.ceiling = Some(0.5);
        assert!(c.validate().unwrap_err().to_string().contains("ceiling"));
        c.default.ceiling = None;
        c.default.window = Duration::from_millis(10);
        assert!(c.validate().unwrap_err().to_string().contains("window"));
    }
}
