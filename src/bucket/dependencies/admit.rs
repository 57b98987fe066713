//! A retry's admission: the tenant's line of the dependency first, then a
//! token from the dependency's lanes and the global bucket, or a deferral
//! told when to ask again (see the module doc of `dependencies`).

use std::hash::BuildHasher;
use std::time::Duration;

use super::entry::{DependencyEntry, Lane, Taken};
use super::{Dependencies, nanos, observed_failure};
use crate::bucket::fair::FairShares;
use crate::bucket::health::{Limits, Second};
use crate::bucket::line::{MAX_PLACES, Place, Standing};
use crate::bucket::{DEPENDENCY_BUDGET_EXHAUSTED, TENANT_BACKLOG_FULL, TENANT_SHARE_EXHAUSTED};
use crate::budget::token::{Admission, Answer, Ask};

/// A turn estimated longer than this many seconds is told half (at
/// least this much): see [`Dependencies::admit`].
const HALVED_FROM: f64 = 2.0;

impl Dependencies {
    /// Asks `dependency`'s budget, then `global`, for `tenant`'s retry (see
    /// the module doc).
    pub fn admit(
        &mut self,
        global: &mut FairShares,
        tenant: &str,
        dependency: &str,
        ask: &Ask<'_>,
        now: Duration,
    ) -> Answer {
        let second = now.as_secs();
        let n = nanos(now);
        let horizon = self.horizon;
        let i = self.entry(dependency, tenant, now);
        let config = self.config.pace_of(&self.entries[i].name).clone();
        let limits = config.limits(self.global_rate);
        let t = self.entries[i].tenant(tenant, second, &config, &limits);
        if let Some(observed) = ask.observed {
            self.count_in(i, t, &observed_failure(observed), now, &config, &limits);
        }
        let e = &mut self.entries[i];
        let mut unclaimed = Vec::new();
        e.tenants[t].line.expire(n, |token| unclaimed.push(token));
        for token in unclaimed {
            give_back(global, e, t, token, now);
        }
        let id = ask.activity_id.map(place_id);
        // A worker with a place is here: its place is due now.
        let mut mine = None;
        let mut full = false;
        if let (Some(since_ms), Some(id)) = (ask.waiting_since_ms, id) {
            let place = Place { since_ms, id };
            match e.tenants[t].line.ask(place, n) {
                Standing::Served => return granted(e, t, second, &limits),
                Standing::Waiting => mine = Some(place),
                Standing::Full => full = true,
            }
        }
        let mut refusal = None;
        // A tenant a balancer spreads over several replicas leaves places
        // here whose workers now ask another replica: its worker here goes
        // first, before places due now whose workers may be elsewhere.
        let spread = global.capacity().spread_of(tenant) > 1.0;
        if let (true, Some(place)) = (spread, mine) {
            match take_token(global, e, t, tenant, now) {
                Ok(_) => {
                    e.tenants[t].line.leave(place);
                    return granted(e, t, second, &limits);
                }
                Err(reason) => refusal = Some(reason),
            }
        }
        // The tokens to the places due, oldest first (this one among them).
        while refusal.is_none() && e.tenants[t].line.has_ready(n) {
            match take_token(global, e, t, tenant, now) {
                Ok(token) => {
                    if let Err(token) = e.tenants[t].line.serve(n, token) {
                        give_back(global, e, t, token, now);
                        break;
                    }
                }
                Err(reason) => {
                    refusal = Some(reason);
                    break;
                }
            }
        }
        let place = match (mine, id) {
            (Some(place), _) => {
                if e.tenants[t].line.claim(place) {
                    return granted(e, t, second, &limits);
                }
                Some(place)
            }
            _ if full => None,
            (None, id) => {
                // A fresh failure waits behind any live place.
                if refusal.is_none() && !e.tenants[t].line.has_waiting(n) {
                    match take_token(global, e, t, tenant, now) {
                        Ok(_) => return granted(e, t, second, &limits),
                        Err(reason) => refusal = Some(reason),
                    }
                }
                match id {
                    Some(id) => {
                        let place = Place {
                            since_ms: ask.now_ms,
                            id,
                        };
                        match e.tenants[t].line.ask(place, n) {
                            Standing::Served => return granted(e, t, second, &limits),
                            Standing::Waiting => Some(place),
                            Standing::Full => {
                                full = true;
                                None
                            }
                        }
                    }
                    None => None,
                }
            }
        };
        // Waiting behind a line without having asked for a token itself:
        // the line is there for the reason its last refusal gave, and this
        // retry is demand held back by it as much as one refused.
        let refusal = match refusal {
            Some(refusal) => refusal,
            None => {
                let refusal = e.tenants[t]
                    .waiting_for
                    .unwrap_or(NoToken::Dependency { share: false });
                match refusal {
                    NoToken::Global(_) => global.hold_back(tenant),
                    NoToken::Dependency { .. } => e.shares.hold_back(tenant),
                }
                refusal
            }
        };
        let reason = if full {
            TENANT_BACKLOG_FULL
        } else {
            refusal.reason()
        };
        let by_dependency = matches!(refusal, NoToken::Dependency { .. });
        // When its turn comes: the places ahead and itself, at the rate the
        // tenant can count on now.
        let rate = if by_dependency {
            e.shares.share_rate(tenant, now) + e.tenants[t].earned.rate()
        } else {
            global.share_rate(tenant, now)
        };
        // The places ahead, counted only as far as they can change the
        // answer: a turn past twice the horizon is told the horizon (below),
        // and the count walks the line.
        let reach = (2.0 * horizon as f64 / 1e9 * rate)
            .ceil()
            .min(MAX_PLACES as f64) as usize
            + 1;
        let ahead = match place {
            _ if full => reach,
            Some(place) => e.tenants[t].line.ahead(place, n, reach),
            None => e.tenants[t].line.waiting(n, reach),
        };
        let turn = if rate > 0.0 {
            (ahead as f64 + 1.0) / rate
        } else {
            f64::INFINITY
        };
        // Told half of a long turn, it asks again halfway: the rate it was
        // estimated at can grow meanwhile (a replica given more of the
        // global rate, a dependency recovering), and a worker told too late
        // leaves its tokens idle. Halving costs a few asks, no writes.
        let turn = if turn > HALVED_FROM {
            (turn / 2.0).max(HALVED_FROM)
        } else {
            turn
        };
        let jittered = horizon as f64 * (0.5 + 0.5 * unit(id.unwrap_or(n as u64), second));
        let wait = Duration::from_nanos((turn * 1e9).min(jittered).max(1e6) as u64);
        if let Some(place) = place {
            // Due back at its wait's end, or at the retry's planned start
            // if that is later.
            let planned = ask.planned_ms.map_or(0, |ms| {
                ms.saturating_sub(ask.now_ms).saturating_mul(1_000_000)
            });
            let due = n.saturating_add(nanos(wait).max(planned));
            e.tenants[t].line.promise(place, due, n);
        }
        let tenant_entry = &mut e.tenants[t];
        tenant_entry.counters.deferred += 1;
        e.counters.deferred += 1;
        if by_dependency {
            tenant_entry.health.count(
                second,
                &Second {
                    deferred: 1,
                    ..Second::default()
                },
                &limits,
            );
        }
        let pace = e.pace(Some(&e.tenants[t]), &config, now);
        Answer {
            admission: Admission::Deferred {
                wait,
                reason,
                waiting_since_ms: place.map(|p| p.since_ms),
            },
            pace: (by_dependency || !e.tracked).then_some(pace),
            untracked: !e.tracked,
        }
    }
}

/// Why a retry got no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoToken {
    /// The dependency's lanes had none: `share` when the tenant is past
    /// its share of the shared lane while other tenants want theirs.
    Dependency {
        /// Past its share, others waiting.
        share: bool,
    },
    /// The global bucket had none, for this reason.
    Global(&'static str),
}

impl NoToken {
    fn reason(self) -> &'static str {
        match self {
            Self::Dependency { share: true } => TENANT_SHARE_EXHAUSTED,
            Self::Dependency { share: false } => DEPENDENCY_BUDGET_EXHAUSTED,
            Self::Global(reason) => reason,
        }
    }
}

/// A token for the tenant's entry `t` of `e`: from the shared lane or its
/// own, then from the global bucket; the reason when there is none.
fn take_token(
    global: &mut FairShares,
    e: &mut DependencyEntry,
    t: usize,
    tenant: &str,
    now: Duration,
) -> Result<Taken, NoToken> {
    let n = nanos(now);
    let lane = if let Some(grant) = e.shares.take(tenant, now) {
        Lane::Shared(grant)
    } else if e.tenants[t].earned.take(n) {
        Lane::Earned
    } else {
        let share = e.shares.refuse(tenant, now) == TENANT_SHARE_EXHAUSTED;
        let refusal = NoToken::Dependency { share };
        e.tenants[t].waiting_for = Some(refusal);
        return Err(refusal);
    };
    let Some(grant) = global.take(tenant, now) else {
        release_lane(e, t, lane, now);
        let refusal = NoToken::Global(global.refuse(tenant, now));
        e.tenants[t].waiting_for = Some(refusal);
        return Err(refusal);
    };
    Ok(Taken {
        lane,
        global: grant,
    })
}

/// Gives a token taken and not used back to its lane.
fn release_lane(e: &mut DependencyEntry, t: usize, lane: Lane, now: Duration) {
    match lane {
        Lane::Shared(grant) => e.shares.release(grant, now),
        Lane::Earned => e.tenants[t].earned.give_back(),
    }
}

/// Gives a token taken and not used back to its lane and the global bucket
/// (a served place whose worker never claimed it).
pub(super) fn give_back(
    global: &mut FairShares,
    e: &mut DependencyEntry,
    t: usize,
    token: Taken,
    now: Duration,
) {
    release_lane(e, t, token.lane, now);
    global.release(token.global, now);
}

/// A retry granted now (a token taken, or its place's turn claimed): it
/// runs from now on, so its fate is the evidence of the seconds to come.
fn granted(e: &mut DependencyEntry, t: usize, second: u64, limits: &Limits) -> Answer {
    e.counters.admitted += 1;
    e.tenants[t].counters.admitted += 1;
    e.tenants[t].health.count(
        second,
        &Second {
            granted: 1,
            ..Second::default()
        },
        limits,
    );
    Answer {
        untracked: !e.tracked,
        ..Admission::Granted.into()
    }
}

/// An activity's id in a line: a hash, the same for the same id within a
/// process (a line lives in one process).
pub(super) fn place_id(activity_id: &str) -> u64 {
    foldhash::fast::FixedState::with_seed(0x5eed).hash_one(activity_id)
}

/// A number in [0, 1) from `id` and `second`: a deferral's jitter.
fn unit(id: u64, second: u64) -> f64 {
    let h = foldhash::fast::FixedState::with_seed(second).hash_one(id);
    (h >> 11) as f64 / (1u64 << 53) as f64
}
