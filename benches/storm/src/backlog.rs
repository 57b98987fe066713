//! The long outages' figures (issue #60): the backlog the outage leaves at
//! the trigger's end (the *return* of capacity) and how it drains.
//!
//! - `backlog`: activities of the failing dependency that arrived before
//!   the return and had not ended by it;
//! - `limit_s`: the physical limit of its drain, (the dependency's queue at
//!   the return + the backlog) / (C - load): no policy can complete it
//!   sooner with the spare capacity alone;
//! - `drain_s`: from the return until the last backlog activity ended
//!   (`null`: some had not within the run);
//! - `done_60` and `done_180`: the share of the backlog that succeeded
//!   within 60 s and 180 s of the return;
//! - `longest_wait_s`: the longest a deferred attempt waited for its token
//!   after the return;
//! - `order`: within each tenant, the attempts waiting at the return taken
//!   in the order of their first deferral: pairs out of order by more than
//!   the line's lateness (1 s), of the adjacent pairs;
//! - `queue_peak_outage` and `queue_max_after`: the dependency's queue,
//!   no second storm after the return.

use serde_json::{Value, json};

use crate::record::{End, Tallies, Tenant};
use crate::setup::{A, Setup};

/// A grant later than this after one deferred after it is out of order:
/// the line serves places due within its lateness together.
const LATENESS_S: f64 = 1.0;

/// The figures of the backlog of dependency A.
pub fn figures(tallies: &Tallies, setup: &Setup) -> Value {
    let tl = &setup.timeline;
    let back = tl.trigger_end();
    let backlog: Vec<_> = tallies
        .activities
        .iter()
        .filter(|a| a.dependency == A && a.arrived < back)
        .filter(|a| a.ended.is_none_or(|t| t >= back))
        .collect();
    let series = &tallies.dependencies[A];
    let queue_at = |t: f64| series.queue.get(t as usize).copied().unwrap_or(0);
    let spare = setup.capacity - setup.arrival_rate();
    let limit = (f64::from(queue_at(back)) + backlog.len() as f64) / spare;
    let drain = backlog
        .iter()
        .map(|a| a.ended)
        .try_fold(0.0f64, |last, ended| ended.map(|t| last.max(t - back)));
    let done_within = |seconds: f64| {
        let done = backlog
            .iter()
            .filter(|a| matches!(a.end, End::Succeeded(t) if t < back + seconds))
            .count();
        if backlog.is_empty() {
            Value::Null
        } else {
            json!(done as f64 / backlog.len() as f64)
        }
    };
    let given_up = backlog.iter().filter(|a| a.end == End::Failed).count();
    let longest_wait = tallies
        .activities
        .iter()
        .filter(|a| a.dependency == A)
        .map(|a| a.longest_wait)
        .fold(0.0, f64::max);
    let (mut pairs, mut out_of_order, mut still_waiting) = (0usize, 0usize, 0usize);
    for tenant in [Tenant::Noisy, Tenant::Quiet] {
        let mut waiting: Vec<(f64, f64)> = tallies
            .activities
            .iter()
            .filter(|a| a.dependency == A && a.tenant == tenant)
            .filter_map(|a| a.waiting_at_return)
            .map(|(since, granted)| (since, granted.unwrap_or(f64::INFINITY)))
            .collect();
        still_waiting += waiting.iter().filter(|w| w.1.is_infinite()).count();
        waiting.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in waiting.windows(2) {
            pairs += 1;
            if pair[1].1 + LATENESS_S < pair[0].1 {
                out_of_order += 1;
            }
        }
    }
    let peak = |from: f64, to: f64| {
        series
            .queue
            .iter()
            .skip(from as usize)
            .take((to - from).max(0.0) as usize)
            .max()
            .copied()
            .unwrap_or(0)
    };
    json!({
        "backlog": backlog.len(),
        "queue_at_return": queue_at(back),
        "limit_s": limit,
        "drain_s": drain,
        "drain_over_limit": drain.map(|d| d / limit),
        "done_60": done_within(60.0),
        "done_180": done_within(180.0),
        "given_up": given_up,
        "longest_wait_s": longest_wait,
        "order_pairs": pairs,
        "order_out_of_order": out_of_order,
        "still_waiting_at_end": still_waiting,
        "queue_peak_outage": peak(tl.trigger_start(), back),
        "queue_max_after": peak(back, tl.end()),
    })
}
