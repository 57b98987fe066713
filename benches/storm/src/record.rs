//! What a run counts, per whole second and per activity, and the figures
//! computed from it (docs/storm.md, "Measures").

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::setup::{A, B, Setup, Timeline};

/// The two tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenant {
    /// 80% of the load.
    Noisy = 0,
    /// 20% of the load.
    Quiet = 1,
}

impl Tenant {
    /// The tenant's id, as `x-tenant-id` names it.
    pub fn id(self) -> &'static str {
        match self {
            Tenant::Noisy => "noisy",
            Tenant::Quiet => "quiet",
        }
    }
}

/// Both tenants.
pub const TENANTS: [Tenant; 2] = [Tenant::Noisy, Tenant::Quiet];

/// How an activity ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum End {
    /// Still running when the run ended.
    Pending,
    /// An attempt succeeded at this second of the run.
    Succeeded(f64),
    /// Given up: attempts, deadline, budget, or the service said stop.
    Failed,
}

/// One activity's arrival and fate.
#[derive(Debug, Clone, Copy)]
pub struct Activity {
    /// When it arrived, seconds into the run.
    pub arrived: f64,
    /// Whose it is.
    pub tenant: Tenant,
    /// The dependency it calls (`setup::A` or `setup::B`).
    pub dependency: usize,
    /// How it ended.
    pub end: End,
    /// When it ended (succeeded or given up), seconds into the run.
    pub ended: Option<f64>,
    /// Its first deferral by the service, of any attempt.
    pub first_deferred: Option<f64>,
    /// When the attempt now waiting for the service's token was first
    /// deferred; cleared when it is granted or stopped.
    pub waiting: Option<f64>,
    /// The attempt that was waiting at the trigger's end: when it was first
    /// deferred, and when it was granted (`None`: not within the run).
    pub waiting_at_return: Option<(f64, Option<f64>)>,
    /// The longest wait of any of its deferred attempts counted from the
    /// trigger's end (or from its deferral, if later) until its grant.
    pub longest_wait: f64,
}

impl Activity {
    /// One arrived at `arrived`, not ended.
    pub fn new(arrived: f64, tenant: Tenant, dependency: usize) -> Self {
        Self {
            arrived,
            tenant,
            dependency,
            end: End::Pending,
            ended: None,
            first_deferred: None,
            waiting: None,
            waiting_at_return: None,
            longest_wait: 0.0,
        }
    }
}

/// One dependency's counters per whole second, and what the service said
/// about its retries.
#[derive(Debug, Default, Clone)]
pub struct Series {
    /// Dependency calls sent in each second.
    pub calls: Vec<u32>,
    /// Requests served in each second whose caller had already given up.
    pub wasted: Vec<u32>,
    /// Activities that succeeded in each second.
    pub goodput: Vec<u32>,
    /// The longest queue seen in each second (sampled every 10 ms).
    pub queue: Vec<u32>,
    /// The retries a second the retry-budget server allowed this dependency
    /// in each second, as the noisy tenant's last traffic report that
    /// second was answered (its share of the dependency's allowance and its
    /// own lane), and the quiet tenant's.
    pub allowed_rate: Vec<Option<f64>>,
    pub allowed_rate_quiet: Vec<Option<f64>>,
    /// The retry-budget server's deferrals of this dependency's retries, by
    /// `defer_reason`: whose budget ran out.
    pub deferrals: BTreeMap<String, u32>,
    /// The retry-budget server's stops of this dependency's activities, by
    /// stop code.
    pub stops: BTreeMap<String, u32>,
}

impl Series {
    fn new(seconds: usize) -> Self {
        Self {
            calls: vec![0; seconds],
            wasted: vec![0; seconds],
            goodput: vec![0; seconds],
            queue: vec![0; seconds],
            allowed_rate: vec![None; seconds],
            allowed_rate_quiet: vec![None; seconds],
            ..Self::default()
        }
    }
}

/// Counters per dependency and per whole second, and every activity's
/// fate.
#[derive(Debug, Default, Clone)]
pub struct Tallies {
    /// Per dependency, `setup::A` first.
    pub dependencies: Vec<Series>,
    /// Every activity, by arrival order.
    pub activities: Vec<Activity>,
    /// Calls to the retry-budget server that failed (should be none).
    pub service_errors: u32,
    /// Deferrals the retry-budget server answered, all dependencies.
    pub deferrals: u32,
}

/// The run's shared counters.
#[derive(Debug)]
pub struct Recorder {
    /// Behind one lock: the lab runs on one thread, so it is never contended.
    tallies: Mutex<Tallies>,
    /// The trigger's end, seconds into the run: the waits after it.
    trigger_end: f64,
}

impl Recorder {
    /// Counters for a run of `seconds` whole seconds, `dependencies`
    /// dependencies and these activities.
    pub fn new(
        seconds: usize,
        dependencies: usize,
        activities: Vec<Activity>,
        trigger_end: f64,
    ) -> Self {
        Self {
            tallies: Mutex::new(Tallies {
                dependencies: (0..dependencies).map(|_| Series::new(seconds)).collect(),
                activities,
                ..Tallies::default()
            }),
            trigger_end,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Tallies) -> R) -> R {
        f(&mut self
            .tallies
            .lock()
            .expect("the recorder's lock is never poisoned"))
    }

    /// A call to dependency `which` sent at `t`.
    pub fn call(&self, which: usize, t: f64) {
        self.with(|x| bump(&mut x.dependencies[which].calls, t));
    }

    /// A request to dependency `which` served at `t` whose caller had given
    /// up.
    pub fn wasted(&self, which: usize, t: f64) {
        self.with(|x| bump(&mut x.dependencies[which].wasted, t));
    }

    /// Dependency `which`'s queue length sampled at `t`.
    pub fn queue(&self, which: usize, t: f64, len: usize) {
        self.with(|x| {
            if let Some(q) = x.dependencies[which].queue.get_mut(t as usize) {
                *q = (*q).max(len as u32);
            }
        });
    }

    /// The service told `tenant` at `t` that it may take `rate` retries a
    /// second of dependency `which`.
    pub fn pace(&self, which: usize, tenant: Tenant, t: f64, rate: f64) {
        self.with(|x| {
            let series = &mut x.dependencies[which];
            let series = match tenant {
                Tenant::Noisy => &mut series.allowed_rate,
                Tenant::Quiet => &mut series.allowed_rate_quiet,
            };
            if t >= 0.0
                && let Some(slot) = series.get_mut(t as usize)
            {
                *slot = Some(rate);
            }
        });
    }

    /// Activity `index` ended at `t`.
    pub fn end(&self, index: usize, end: End, t: f64) {
        self.with(|x| {
            let which = x.activities[index].dependency;
            if let End::Succeeded(t) = end {
                bump(&mut x.dependencies[which].goodput, t);
            }
            let activity = &mut x.activities[index];
            activity.end = end;
            activity.ended = Some(t);
            activity.waiting = None;
        });
    }

    /// The service granted activity `index` a retry at `t`: if the attempt
    /// had been deferred, its wait ends.
    pub fn granted(&self, index: usize, t: f64) {
        let back = self.trigger_end;
        self.with(|x| {
            let activity = &mut x.activities[index];
            if let Some(since) = activity.waiting.take() {
                if since < back && t >= back {
                    activity.waiting_at_return = Some((since, Some(t)));
                }
                if t >= back {
                    activity.longest_wait = activity.longest_wait.max(t - since.max(back));
                }
            }
        });
    }

    /// A call to the retry-budget server failed.
    pub fn service_error(&self) {
        self.with(|x| x.service_errors += 1);
    }

    /// The retry-budget server deferred a retry of activity `index`, of
    /// dependency `which`, at `t`, for `reason`.
    pub fn deferral(&self, index: usize, which: usize, t: f64, reason: &str) {
        self.with(|x| {
            let activity = &mut x.activities[index];
            activity.first_deferred.get_or_insert(t);
            activity.waiting.get_or_insert(t);
            x.deferrals += 1;
            *x.dependencies[which]
                .deferrals
                .entry(reason.to_owned())
                .or_default() += 1;
        });
    }

    /// The retry-budget server stopped an activity of dependency `which`,
    /// with `code`.
    pub fn stop(&self, which: usize, code: &str) {
        self.with(|x| {
            *x.dependencies[which]
                .stops
                .entry(code.to_owned())
                .or_default() += 1;
        });
    }

    /// A copy of the counters so far, at `t`: the attempts still waiting
    /// then that were waiting at the trigger's end are marked so.
    pub fn snapshot(&self, t: f64) -> Tallies {
        let back = self.trigger_end;
        let mut tallies = self.with(|x| x.clone());
        for activity in &mut tallies.activities {
            if let Some(since) = activity.waiting {
                if since < back {
                    activity.waiting_at_return = Some((since, None));
                }
                activity.longest_wait = activity.longest_wait.max(t - since.max(back));
            }
        }
        tallies
    }
}

fn bump(series: &mut [u32], t: f64) {
    if t >= 0.0
        && let Some(n) = series.get_mut(t as usize)
    {
        *n += 1;
    }
}

/// The mean of `series` over whole seconds `[from, to)`.
fn mean(series: &[u32], from: f64, to: f64) -> f64 {
    let (from, to) = (from as usize, (to as usize).min(series.len()));
    if to <= from {
        return 0.0;
    }
    series[from..to].iter().map(|&n| f64::from(n)).sum::<f64>() / (to - from) as f64
}

/// The least of `series` over whole seconds `[from, to)`.
fn least(series: &[u32], from: f64, to: f64) -> u32 {
    let (from, to) = (from as usize, (to as usize).min(series.len()));
    series
        .get(from..to)
        .and_then(|s| s.iter().min().copied())
        .unwrap_or(0)
}

/// Seconds after the trigger's end until goodput is back for good: the
/// first second `s` from which the mean goodput of the 5 s ending at each
/// second stays at or above 95% of `baseline` for 10 s. `None` when no such
/// second comes within the run (never: metastable, or slower than the run
/// can tell).
pub fn recovery(goodput: &[u32], baseline: f64, timeline: &Timeline) -> Option<f64> {
    const WINDOW: usize = 5;
    const HOLD: usize = 10;
    let threshold = 0.95 * baseline;
    let end = (timeline.end() as usize).min(goodput.len());
    let trailing = |s: usize| -> f64 {
        let from = (s + 1).saturating_sub(WINDOW);
        goodput[from..=s].iter().map(|&n| f64::from(n)).sum::<f64>() / (s + 1 - from) as f64
    };
    let first = timeline.trigger_end() as usize;
    (first..end.saturating_sub(HOLD - 1))
        .find(|&s| (s..s + HOLD).all(|t| trailing(t) >= threshold))
        .map(|s| (s - first) as f64)
}

/// The share of the activities arrived in `[from, to)` that succeeded, of
/// `tenant` (or all) among `activities`.
fn success_share<'a>(
    activities: impl IntoIterator<Item = &'a Activity>,
    tenant: Option<Tenant>,
    from: f64,
    to: f64,
) -> Value {
    let mut arrived = 0u32;
    let mut succeeded = 0u32;
    for a in activities {
        if a.arrived >= from && a.arrived < to && tenant.is_none_or(|t| a.tenant == t) {
            arrived += 1;
            if matches!(a.end, End::Succeeded(_)) {
                succeeded += 1;
            }
        }
    }
    if arrived == 0 {
        Value::Null
    } else {
        json!(f64::from(succeeded) / f64::from(arrived))
    }
}

/// The figures of one run, as JSON: those of dependency A (the only one,
/// or the one the trigger hits) at the top, and with a healthy dependency
/// B beside it, B's under `healthy`.
pub fn summarize(tallies: &Tallies, setup: &Setup) -> Value {
    let mut out = figures(tallies, setup, A);
    if let Value::Object(out) = &mut out {
        out.insert("service_errors".into(), json!(tallies.service_errors));
        out.insert("deferrals".into(), json!(tallies.deferrals));
        if setup.healthy.is_some() {
            out.insert("healthy".into(), figures(tallies, setup, B));
        }
        if setup.backlog {
            out.insert("backlog".into(), crate::backlog::figures(tallies, setup));
        }
    }
    out
}

/// The figures of dependency `which`.
fn figures(tallies: &Tallies, setup: &Setup, which: usize) -> Value {
    let tl = &setup.timeline;
    let series = &tallies.dependencies[which];
    let goodput = &series.goodput;
    let before = mean(goodput, tl.before_start(), tl.trigger_start());
    let during = mean(goodput, tl.trigger_start(), tl.trigger_end());
    let after = mean(goodput, tl.trigger_end(), tl.end());
    let recovery = if setup.trigger_capacity < 1.0 {
        recovery(goodput, before, tl)
    } else {
        None
    };
    let calls: u32 = series.calls.iter().sum();
    let served_late: u32 = series.wasted.iter().sum();
    let mine = || tallies.activities.iter().filter(|a| a.dependency == which);
    let arrived = mine().count() as f64;
    let rate = setup.arrival_rate_of(which);
    let worst_second = series
        .calls
        .iter()
        .skip(tl.before_start() as usize)
        .max()
        .map_or(0.0, |&n| f64::from(n) / rate);
    // Activities late in the run may still be running when it ends: shares
    // are taken over arrivals that had at least 10 s before the end.
    let settled = tl.end() - 10.0;
    let share = |tenant, from, to| success_share(mine(), tenant, from, to);
    json!({
        "dependency": setup.dependency_name(which),
        "arrived": arrived,
        "goodput_before": before,
        "goodput_during": during,
        "goodput_during_min": least(goodput, tl.trigger_start(), tl.trigger_end()),
        "goodput_after": after,
        "goodput_last10": mean(goodput, tl.end() - 10.0, tl.end()),
        "recovery_s": recovery,
        "amplification": if arrived > 0.0 { f64::from(calls) / arrived } else { 0.0 },
        "amplification_worst_second": worst_second,
        "calls": calls,
        "wasted": served_late,
        "wasted_share": if calls > 0 { f64::from(served_late) / f64::from(calls) } else { 0.0 },
        "queue_end": series.queue.get(tl.end() as usize - 1).copied().unwrap_or(0),
        "queue_max": series.queue.iter().max().copied().unwrap_or(0),
        "succeeded_share": share(None, tl.before_start(), settled),
        "succeeded_share_during": share(None, tl.trigger_start(), tl.trigger_end()),
        "noisy_during": share(Some(Tenant::Noisy), tl.trigger_start(), tl.trigger_end()),
        "quiet_during": share(Some(Tenant::Quiet), tl.trigger_start(), tl.trigger_end()),
        "noisy_after": share(Some(Tenant::Noisy), tl.trigger_end(), settled),
        "quiet_after": share(Some(Tenant::Quiet), tl.trigger_end(), settled),
        "pending_at_end": mine().filter(|a| a.end == End::Pending).count(),
        "deferral_reasons": series.deferrals,
        "stops": series.stops,
        "series": {
            "goodput": series.goodput,
            "calls": series.calls,
            "queue": series.queue,
            "wasted": series.wasted,
            "allowed_rate": series.allowed_rate,
            "allowed_rate_quiet": series.allowed_rate_quiet,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(parts: &[(u32, usize)]) -> Vec<u32> {
        parts
            .iter()
            .flat_map(|&(v, n)| std::iter::repeat_n(v, n))
            .collect()
    }

    #[test]
    fn recovery_counts_from_the_trigger_end_with_a_trailing_5_s_mean() {
        let tl = Timeline::FULL; // trigger 15..25, end 55
        // Back to 100 at second 30: the 5 s mean reaches 95 at second 34.
        let g = series(&[(100, 15), (0, 15), (100, 25)]);
        assert_eq!(recovery(&g, 100.0, &tl), Some(9.0));
        // Never back: none.
        let g = series(&[(100, 15), (0, 40)]);
        assert_eq!(recovery(&g, 100.0, &tl), None);
        // Back only for 9 s before the end: too late to tell.
        let g = series(&[(100, 15), (0, 27), (100, 13)]);
        assert_eq!(recovery(&g, 100.0, &tl), None);
        // A dip after a first recovery pushes it past the dip.
        let g = series(&[(100, 25), (100, 5), (0, 1), (100, 24)]);
        assert_eq!(recovery(&g, 100.0, &tl), Some(10.0));
    }

    #[test]
    fn shares_count_only_the_window_and_tenant() {
        let a = |arrived, tenant, end| Activity {
            end,
            ..Activity::new(arrived, tenant, A)
        };
        let acts = [
            a(1.0, Tenant::Noisy, End::Succeeded(1.5)),
            a(1.5, Tenant::Noisy, End::Failed),
            a(1.7, Tenant::Quiet, End::Pending),
            a(5.0, Tenant::Noisy, End::Failed),
        ];
        assert_eq!(
            success_share(&acts, Some(Tenant::Noisy), 0.0, 2.0),
            json!(0.5)
        );
        assert_eq!(
            success_share(&acts, Some(Tenant::Quiet), 0.0, 2.0),
            json!(0.0)
        );
        assert_eq!(success_share(&acts, None, 6.0, 9.0), Value::Null);
    }
}
