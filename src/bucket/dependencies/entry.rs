//! One dependency's budget: its shared lane (a [`FairShares`] at the
//! allowance its health sets), and for each of its tenants their evidence,
//! their line of deferred retries and their own lane (earned by their
//! reported successes).

use std::sync::Arc;
use std::time::Duration;

use super::super::capacity::Capacity;
use super::super::config::BucketConfig;
use super::super::fair::{FairShares, Grant};
use super::super::health::{self, Fates, Limits, Second, TenantHealth};
use super::super::line::Line;
use super::super::pace::{PaceConfig, SuccessWindow};
use super::super::tenants::OVERFLOW_TENANT;
use super::DependencyCounters;
use crate::budget::token::{Evidence, HealthState, Pace};

/// Nanoseconds of the bucket's clock.
pub(super) type Nanos = i64;

/// Most tenants a dependency keeps evidence, a line and a lane for; the
/// others share one entry.
pub const MAX_TENANTS_PER_DEPENDENCY: usize = 64;

/// A tenant's own lane: a token meter at `ratio` of its reported
/// successes, holding `burst_seconds` of that rate.
#[derive(Debug, Clone, Default)]
pub(super) struct Earned {
    /// Tokens a second.
    rate: f64,
    /// Tokens held at most.
    burst: f64,
    /// When the refill will have paid for every token taken (as in
    /// `fair`): the lane holds `(now - meter) * rate` tokens, at most
    /// `burst`.
    meter: Nanos,
}

impl Earned {
    /// A new rate from `now` on, keeping the tokens held; a lane that had
    /// none starts full (a tenant's first reported successes, or its rate
    /// restored after a restart).
    pub fn set_rate(&mut self, rate: f64, burst_seconds: f64, now: Nanos) {
        let held = if self.rate > 0.0 {
            self.held(now)
        } else {
            f64::MAX
        };
        self.rate = rate;
        self.burst = (rate * burst_seconds).max(if rate > 0.0 { 1.0 } else { 0.0 });
        self.meter = if rate > 0.0 {
            now - (held.min(self.burst) * 1e9 / rate) as Nanos
        } else {
            now
        };
    }

    fn held(&self, now: Nanos) -> f64 {
        if self.rate <= 0.0 {
            return 0.0;
        }
        ((now - self.meter) as f64 * self.rate / 1e9).clamp(0.0, self.burst)
    }

    /// Takes a token if the lane holds one.
    pub fn take(&mut self, now: Nanos) -> bool {
        if self.held(now) < 1.0 {
            return false;
        }
        let floor = now - (self.burst * 1e9 / self.rate) as Nanos;
        self.meter = self.meter.max(floor) + (1e9 / self.rate) as Nanos;
        true
    }

    /// Gives back a token taken and not used.
    pub fn give_back(&mut self) {
        if self.rate > 0.0 {
            self.meter -= (1e9 / self.rate) as Nanos;
        }
    }

    /// Tokens a second.
    pub fn rate(&self) -> f64 {
        self.rate
    }
}

/// One tenant of one dependency.
#[derive(Debug)]
pub(super) struct TenantEntry {
    pub name: Arc<str>,
    pub health: TenantHealth,
    pub line: Line<Taken>,
    /// Its reported and recorded successes.
    pub successes: SuccessWindow,
    pub earned: Earned,
    /// The second it was last asked or told about.
    pub last_used: u64,
    /// What it reported and was granted, for its own listing.
    pub counters: DependencyCounters,
    /// A reported success rate restored after a restart, held until the
    /// second given: the window has not counted it, and its own lane must
    /// not start empty for that (see [`TenantEntry::add_successes`]).
    pub restored: Option<(f64, u64)>,
    /// Why its last ask for a token was refused: the reason the retries
    /// waiting behind its line are told.
    pub waiting_for: Option<super::admit::NoToken>,
}

impl TenantEntry {
    pub fn new(name: Arc<str>, second: u64, allowance: f64, window: Duration) -> Self {
        Self {
            name,
            health: TenantHealth::new(second, allowance),
            line: Line::default(),
            successes: SuccessWindow::new(window),
            earned: Earned::default(),
            last_used: second,
            counters: DependencyCounters::default(),
            restored: None,
            waiting_for: None,
        }
    }

    /// Counts `n` reported or recorded successes at `now`. A rate restored
    /// after a restart is held from then on only until the window, of
    /// `window`, has counted the tenant's own reports for as long as it
    /// spans.
    pub fn add_successes(&mut self, now: Duration, n: u64, window: Duration) {
        self.successes.add(now, n);
        if let Some((_, until)) = &mut self.restored {
            *until = (*until).min(now.as_secs().saturating_add(window.as_secs()));
        }
    }

    /// Its reported successes a second: the window's, or the rate restored
    /// after a restart while it holds.
    pub fn success_rate(&self, now: Duration) -> f64 {
        let counted = self.successes.clone().rate(now);
        match self.restored {
            Some((rate, until)) if now.as_secs() < until => counted.max(rate),
            _ => counted,
        }
    }

    /// Whether it may give its place to another tenant: idle for a window,
    /// nothing in line, and no trouble to forget.
    fn evictable(&self, second: u64, limits: &Limits) -> bool {
        second.saturating_sub(self.last_used) > health::WINDOW_SECONDS as u64
            && self.line.is_empty()
            && !self.health.holds_trouble(second, limits)
    }
}

/// One dependency's budget.
#[derive(Debug)]
pub(super) struct DependencyEntry {
    pub name: Arc<str>,
    /// Named by the operator: always tracked, never evicted.
    pub named: bool,
    /// False for the entry shared by untracked dependencies.
    pub tracked: bool,
    /// The tenant whose request first named it, while it counts against
    /// that tenant's bound.
    pub introduced_by: Option<Arc<str>>,
    /// The shared lane, at the allowance in force (this replica's part of
    /// it on PostgreSQL).
    pub shares: FairShares,
    pub tenants: Vec<TenantEntry>,
    /// The allowance this replica's evidence argues for (its tenants'
    /// blend), retries a second.
    pub local: f64,
    /// The fleet's allowance, when the coordination sets it.
    pub fleet: Option<f64>,
    /// The fleet's retries granted and failed in the window, by tenant,
    /// when the coordination sets them (a retry granted here may fail on
    /// another replica).
    pub fleet_fates: Option<std::collections::HashMap<String, Fates>>,
    /// The evidence, summed over the tenants.
    pub evidence: Evidence,
    /// The second the pace was last brought up to date.
    pub paced_at: Option<u64>,
    /// The second it was last asked or told about.
    pub last_used: u64,
    pub counters: DependencyCounters,
}

impl DependencyEntry {
    pub fn new(
        name: Arc<str>,
        config: &PaceConfig,
        template: &BucketConfig,
        global_rate: f64,
        second: u64,
    ) -> Self {
        let limits = config.limits(global_rate);
        let allowance = config.rate.unwrap_or(limits.initial);
        let burst = config.burst(allowance);
        let full = BucketConfig {
            burst,
            max_tenants: template.max_tenants.min(MAX_TENANTS_PER_DEPENDENCY),
            ..template.clone()
        };
        let mut shares = FairShares::new(&full).expect("the template was validated when built");
        shares.set_capacity(
            &Capacity {
                rate: allowance,
                burst,
                ..Capacity::from_config(template)
            },
            Duration::ZERO,
        );
        Self {
            name,
            named: false,
            tracked: true,
            introduced_by: None,
            shares,
            tenants: Vec::new(),
            local: allowance,
            fleet: None,
            fleet_fates: None,
            evidence: Evidence {
                state: if config.rate.is_some() {
                    HealthState::Static
                } else {
                    HealthState::NoEvidence
                },
                ..Evidence::default()
            },
            paced_at: None,
            last_used: second,
            counters: DependencyCounters::default(),
        }
    }

    /// The allowance in force: the fleet's, or this replica's evidence.
    pub fn allowed(&self) -> f64 {
        self.fleet.unwrap_or(self.local)
    }

    /// The index of `tenant`'s entry, made if it is new (evicting an idle
    /// one when full), or the shared entry of the tenants past the bound.
    pub fn tenant(
        &mut self,
        tenant: &str,
        second: u64,
        config: &PaceConfig,
        limits: &Limits,
    ) -> usize {
        if let Some(i) = self.tenants.iter().position(|t| &*t.name == tenant) {
            self.tenants[i].last_used = second;
            return i;
        }
        // A newcomer argues from its own evidence, from the starting
        // allowance: its weight in the blend is what it is seen doing, so
        // it moves the dependency's allowance only as far as that, and no
        // other tenant's evidence (invented or not) seeds its own.
        let allowance = limits.initial;
        let fresh = TenantEntry::new(Arc::from(tenant), second, allowance, config.window);
        if self.tenants.len() < MAX_TENANTS_PER_DEPENDENCY {
            self.tenants.push(fresh);
            return self.tenants.len() - 1;
        }
        if let Some(i) = self
            .tenants
            .iter()
            .position(|t| &*t.name != OVERFLOW_TENANT && t.evictable(second, limits))
        {
            self.tenants[i] = fresh;
            return i;
        }
        match self
            .tenants
            .iter()
            .position(|t| &*t.name == OVERFLOW_TENANT)
        {
            Some(i) => i,
            None => {
                // The last place becomes the shared one.
                let last = self.tenants.len() - 1;
                self.tenants[last] =
                    TenantEntry::new(Arc::from(OVERFLOW_TENANT), second, allowance, config.window);
                last
            }
        }
    }

    /// Brings the pace up to `now`, at most once a second: every tenant's
    /// rule stepped, their own lanes set from their successes, the
    /// allowance blended and, unless the coordination sets it, given to
    /// the shared lane.
    pub fn repace(
        &mut self,
        now: Duration,
        config: &PaceConfig,
        global_rate: f64,
        template: &BucketConfig,
    ) {
        let second = now.as_secs();
        if self.paced_at == Some(second) {
            return;
        }
        self.paced_at = Some(second);
        let n = super::nanos(now);
        let limits = config.limits(global_rate);
        let mut totals = Second::default();
        let mut failures = 0;
        let mut baseline = 0.0;
        let (mut trouble, mut surged, mut seen_any, mut recovering) = (false, false, false, false);
        for t in &mut self.tenants {
            if let Some(fates) = &self.fleet_fates {
                t.health
                    .set_fates(Some(fates.get(&*t.name).copied().unwrap_or_default()));
            } else {
                t.health.set_fates(None);
            }
            let successes = t.success_rate(now);
            t.health.set_successes(successes);
            // Never more than the global rate: the rate a tenant is told it
            // earned is one the buckets can pay.
            let rate = config.earned(successes).min(limits.cap);
            t.health.set_lane(rate);
            t.health.advance(second, &limits);
            let e = t.health.evidence(second, &limits);
            // A tenant whose own failures surged out of calm pays no retry
            // from its lane for a window (`TenantHealth::lane_paused`): the
            // lane is earned by the successes of the last seconds, which
            // came before the surge. Its own evidence, not the
            // dependency's: no other tenant's failures stop it.
            let paid = if t.health.lane_paused(second) {
                0.0
            } else {
                rate
            };
            if paid != t.earned.rate() {
                t.earned.set_rate(paid, config.burst_seconds, n);
            }
            totals.granted = totals.granted.saturating_add(e.granted);
            totals.retries_failed = totals.retries_failed.saturating_add(e.retries_failed);
            failures += e.failures;
            baseline += e.baseline;
            trouble |= e.state == HealthState::Trouble;
            surged |= e.state == HealthState::Trouble && e.surged;
            seen_any |= e.state != HealthState::NoEvidence;
            recovering |= e.state == HealthState::Recovering;
        }
        self.local = match config.rate {
            Some(rate) => rate,
            None => health::blend(
                self.tenants
                    .iter()
                    .map(|t| (t.health.allowance(), t.health.seen(second))),
                limits.initial,
            ),
        };
        let state = if config.rate.is_some() {
            HealthState::Static
        } else if trouble {
            HealthState::Trouble
        } else if !seen_any {
            HealthState::NoEvidence
        } else if recovering {
            HealthState::Recovering
        } else {
            HealthState::Healthy
        };
        self.evidence = Evidence {
            state,
            failures,
            baseline,
            granted: totals.granted,
            retries_failed: totals.retries_failed,
            surged,
        };
        if self.fleet.is_none() {
            let allowed = self.local;
            if (allowed - self.shares.rate()).abs() > 1e-9 {
                let capacity = Capacity {
                    rate: allowed,
                    burst: config.burst(allowed),
                    ..Capacity::from_config(template)
                };
                self.shares.set_capacity(&capacity, now);
            }
        }
    }

    /// The pace as `tenant` (its entry `t`) sees it.
    pub fn pace(&self, t: Option<&TenantEntry>, config: &PaceConfig, now: Duration) -> Pace {
        let mut pace = super::super::pace::pace(self.allowed(), self.evidence, self.tracked);
        if let Some(t) = t {
            pace.earned = t.earned.rate();
            pace.ratio = config.ratio;
            pace.successes = t.success_rate(now);
        }
        pace
    }

    /// Whether it may be evicted for another dependency: not named, not
    /// shared, idle for `idle` seconds, nothing in line, no evidence of
    /// trouble (a churn of names must not reset a dependency in trouble
    /// to "no evidence").
    pub fn evictable(&self, second: u64, idle: u64) -> bool {
        !self.named
            && self.tracked
            && second.saturating_sub(self.last_used) >= idle
            && self.tenants.iter().all(|t| t.line.is_empty())
            && !matches!(
                self.evidence.state,
                HealthState::Trouble | HealthState::Recovering
            )
    }
}

/// A token from a dependency's lanes, until the global bucket agrees.
#[derive(Debug, Clone, Copy)]
pub(super) enum Lane {
    /// From the shared lane.
    Shared(Grant),
    /// From the tenant's own lane.
    Earned,
}

/// A retry's token, from a dependency's lane and the global bucket: what a
/// served place in line holds until its worker claims it, and gives back
/// if it never does.
#[derive(Debug, Clone, Copy)]
pub struct Taken {
    pub(super) lane: Lane,
    pub(super) global: Grant,
}
