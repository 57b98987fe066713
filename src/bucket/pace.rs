//! A dependency's pace: how many retries a second it is allowed, from how
//! its calls go. Pure: the rule, the configuration, and the window of
//! recent successes it reads.
//!
//! # The rule
//! A dependency that answers `S` successful calls a second may take
//! `ratio * S` retries a second (the SRE book's rule of a tenth: retries at
//! most a tenth of requests), never below `floor` (a few probes keep going,
//! so a dependency that comes back is noticed) and never above `ceiling`.
//! When it fails, its successes fall and its retries shrink to the floor on
//! their own; when it comes back, they grow with its successes. A
//! configuration may instead pin a static `rate`.
//!
//! `S` is counted over the last `window` (a ring of one-second slots), from
//! what workers tell: each success recorded with the dependency, and the
//! traffic counts workers report in batches. On PostgreSQL the replicas add
//! up their counts, so `S` is the fleet's and the allowed rate is the
//! fleet's (`crate::coord`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::budget::error::validate_dependency;
use crate::budget::token::{Pace, PaceRule};

/// Default share of successes that may be retried.
pub const DEFAULT_RATIO: f64 = 0.1;
/// Default floor, retries a second: one probe a second, fleet-wide.
pub const DEFAULT_FLOOR: f64 = 1.0;
/// Default window over which successes are counted.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5);
/// Default seconds of the allowed rate a dependency's bucket holds.
pub const DEFAULT_BURST_SECONDS: f64 = 1.0;
/// Default bound on dependencies tracked one by one.
pub const DEFAULT_MAX_DEPENDENCIES: usize = 64;
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
/// ratio = 0.1       # retries a second per success a second
/// floor = 1.0       # retries a second always allowed (probes)
/// # ceiling = 50.0  # never more than this (default: only the global rate)
/// # rate = 20.0     # pins a static rate instead of the adaptive rule
/// window = "5s"     # successes are counted over this
/// burst_seconds = 1.0
/// max_dependencies = 64
/// [dependencies.named.payments-api]
/// ratio = 0.2
/// ceiling = 30.0
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PaceConfig {
    /// Retries allowed a second per success a second. Default
    /// [`DEFAULT_RATIO`].
    pub ratio: f64,
    /// Retries a second allowed whatever the successes. Default
    /// [`DEFAULT_FLOOR`].
    pub floor: f64,
    /// Retries a second never exceeded. Default: none (the global rate
    /// bounds every dependency anyway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<f64>,
    /// A static rate, retries a second, instead of the adaptive rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// How long successes count. Default [`DEFAULT_WINDOW`].
    #[serde(with = "crate::setting::duration")]
    pub window: Duration,
    /// The dependency's bucket holds this many seconds of its allowed rate
    /// (at least one token). Default [`DEFAULT_BURST_SECONDS`].
    pub burst_seconds: f64,
}

impl Default for PaceConfig {
    fn default() -> Self {
        Self {
            ratio: DEFAULT_RATIO,
            floor: DEFAULT_FLOOR,
            ceiling: None,
            rate: None,
            window: DEFAULT_WINDOW,
            burst_seconds: DEFAULT_BURST_SECONDS,
        }
    }
}

/// `[dependencies]`: the pace of unnamed dependencies, the ones named, and
/// the bound on how many are tracked.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DependenciesConfig {
    /// The pace of every dependency not named below.
    #[serde(flatten)]
    pub default: PaceConfig,
    /// Dependencies with a pace of their own.
    pub named: BTreeMap<String, PaceConfig>,
    /// How many dependencies are tracked one by one; past it, new ones
    /// share one entry ([`OVERFLOW_DEPENDENCY`]), paced by the default.
    /// Default [`DEFAULT_MAX_DEPENDENCIES`].
    pub max_dependencies: usize,
}

impl Default for DependenciesConfig {
    fn default() -> Self {
        Self {
            default: PaceConfig::default(),
            named: BTreeMap::new(),
            max_dependencies: DEFAULT_MAX_DEPENDENCIES,
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

    /// The retries a second allowed to a dependency with `successes` a
    /// second, and the part of the rule that set it.
    pub fn allowed(&self, successes: f64) -> (f64, PaceRule) {
        if let Some(pinned) = self.rate {
            return (pinned, PaceRule::Static);
        }
        let share = self.ratio * successes.max(0.0);
        if share <= self.floor {
            (self.floor, PaceRule::Floor)
        } else if let Some(ceiling) = self.ceiling.filter(|&c| share >= c) {
            (ceiling, PaceRule::Ceiling)
        } else {
            (share, PaceRule::Ratio)
        }
    }

    /// The pace of a dependency with `successes` a second.
    pub fn pace(&self, successes: f64) -> Pace {
        let (allowed, rule) = self.allowed(successes);
        Pace {
            allowed,
            successes,
            ratio: self.ratio,
            rule,
        }
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
        (self.slots.iter().sum::<u64>() - current) as f64 / span as f64
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
    /// "3.2 retries/s allowed (10% of 32 successes/s)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let allowed = Rate(self.allowed);
        let successes = Rate(self.successes);
        let percent = Rate(self.ratio * 100.0);
        match self.rule {
            PaceRule::Ratio => write!(
                f,
                "{allowed} retries/s allowed ({percent}% of {successes} successes/s)"
            ),
            PaceRule::Floor => write!(
                f,
                "{allowed} retries/s allowed (its floor: {percent}% of {successes} successes/s is less)"
            ),
            PaceRule::Ceiling => write!(
                f,
                "{allowed} retries/s allowed (its ceiling: {percent}% of {successes} successes/s is more)"
            ),
            PaceRule::Static => write!(f, "{allowed} retries/s allowed (a static rate)"),
        }
    }
}

/// A rate printed with up to three significant decimals, no trailing zeros.
struct Rate(f64);

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

    #[test]
    fn the_rule_is_a_share_of_successes_between_floor_and_ceiling() {
        let mut c = PaceConfig::default();
        assert_eq!(c.allowed(0.0), (DEFAULT_FLOOR, PaceRule::Floor));
        assert_eq!(c.allowed(5.0), (DEFAULT_FLOOR, PaceRule::Floor));
        assert_eq!(c.allowed(320.0), (32.0, PaceRule::Ratio));
        c.ceiling = Some(20.0);
        assert_eq!(c.allowed(320.0), (20.0, PaceRule::Ceiling));
        c.rate = Some(7.0);
        assert_eq!(c.allowed(320.0), (7.0, PaceRule::Static));
        assert_eq!(c.burst(0.2), 1, "at least one token");
        assert_eq!(c.burst(32.7), 32);
    }

    #[test]
    fn a_pace_reads_as_a_sentence_with_its_numbers() {
        let c = PaceConfig::default();
        assert_eq!(
            c.pace(32.0).to_string(),
            "3.2 retries/s allowed (10% of 32 successes/s)"
        );
        assert_eq!(
            c.pace(0.0).to_string(),
            "1 retries/s allowed (its floor: 10% of 0 successes/s is less)"
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
