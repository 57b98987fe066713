//! The fairness acceptance criteria of the retry-token bucket, as
//! deterministic simulations on a simulated clock.
//!
//! Demand is modelled as the service sees it: each tenant's failed
//! activities ask for a retry at Poisson arrival times (a seeded generator,
//! so every run is the same). Each request is granted (the token is used
//! now), deferred with a booked slot (used at `now + wait`, when the
//! activity comes back and is granted without asking the bucket again), or
//! refused with a time to ask again (it comes back then and asks anew).
//! Grants are counted by the time the token is used, and shares are
//! measured in steady state, after the start-up transient.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use retry_budget::bucket::{Booking, BucketConfig, FairShares};

/// One simulated tenant.
struct Tenant {
    name: &'static str,
    /// Requests a second.
    demand: f64,
    /// When its requests start.
    start: Duration,
}

/// What a simulation measured.
struct Run {
    /// Per tenant, every token use, in nanoseconds.
    uses: Vec<Vec<u64>>,
    /// Per tenant, its first request.
    first_request: Vec<u64>,
    /// Most tokens used by any time t beyond `rate * t + burst`.
    max_excess: f64,
}

impl Run {
    /// Grants a second of tenant `i` in `[from, to)` seconds.
    fn rate(&self, i: usize, from: f64, to: f64) -> f64 {
        let (from, to) = ((from * 1e9) as u64, (to * 1e9) as u64);
        let n = self.uses[i]
            .iter()
            .filter(|&&t| (from..to).contains(&t))
            .count();
        n as f64 / ((to - from) as f64 / 1e9)
    }

    /// How long tenant `i` waited from its first request to its first token.
    fn first_wait(&self, i: usize) -> Duration {
        let first = self.uses[i].iter().min().expect("the tenant got a token");
        Duration::from_nanos(first - self.first_request[i])
    }
}

/// A seeded xorshift64*: the same "random" arrivals on every run.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// An exponential inter-arrival time for `rate` a second, in ns.
    fn gap(&mut self, rate: f64) -> u64 {
        (-self.next_f64().ln() / rate * 1e9) as u64
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A new failed activity of tenant `i` asks for a retry.
    Arrival(usize),
    /// A refused request of tenant `i` asks again.
    Again(usize),
}

/// Runs `tenants` against a bucket with `config` until `end`, and checks on
/// the way that the tokens used never exceed the documented bound.
fn simulate(config: &BucketConfig, tenants: &[Tenant], end: Duration) -> Run {
    let mut shares = FairShares::new(config).expect("valid simulation configuration");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let end = end.as_nanos() as u64;
    let mut events = BinaryHeap::new();
    for (i, t) in tenants.iter().enumerate() {
        let first = t.start.as_nanos() as u64 + rng.gap(t.demand);
        events.push(Reverse((first, Event::Arrival(i))));
    }
    let mut run = Run {
        uses: vec![Vec::new(); tenants.len()],
        first_request: vec![u64::MAX; tenants.len()],
        max_excess: f64::MIN,
    };
    while let Some(Reverse((now, event))) = events.pop() {
        if now >= end {
            break;
        }
        let i = match event {
            Event::Arrival(i) => {
                run.first_request[i] = run.first_request[i].min(now);
                events.push(Reverse((
                    now + rng.gap(tenants[i].demand),
                    Event::Arrival(i),
                )));
                i
            }
            Event::Again(i) => i,
        };
        match shares.admit(tenants[i].name, Duration::from_nanos(now), Duration::MAX) {
            Booking::Granted => run.uses[i].push(now),
            Booking::Booked { wait, .. } => run.uses[i].push(now + wait.as_nanos() as u64),
            Booking::Refused { retry_after, .. } => {
                events.push(Reverse((
                    now + retry_after.as_nanos() as u64,
                    Event::Again(i),
                )));
            }
        }
    }
    check_global_bound(config, &mut run);
    run
}

/// Tokens used by any time `t` stay within `burst + rate * t` plus the
/// over-commit bound, `2 * rate * max_reservation` (no success deposits
/// here).
fn check_global_bound(config: &BucketConfig, run: &mut Run) {
    let mut all: Vec<u64> = run.uses.iter().flatten().copied().collect();
    all.sort_unstable();
    let horizon = config.max_reservation_ms as f64 / 1000.0;
    for (k, &t) in all.iter().enumerate() {
        let allowed = f64::from(config.burst) + config.rate * t as f64 / 1e9;
        let excess = (k + 1) as f64 - allowed;
        run.max_excess = run.max_excess.max(excess);
        assert!(
            excess <= 2.0 * config.rate * horizon + 1.0,
            "{} tokens used by {t} ns: {excess} beyond rate and burst",
            k + 1
        );
    }
}

fn config(rate: f64, weights: &[(&str, u32)]) -> BucketConfig {
    BucketConfig {
        rate,
        burst: rate as u32,
        weights: weights.iter().map(|&(t, w)| (t.to_owned(), w)).collect(),
        ..BucketConfig::default()
    }
}

fn tenant(name: &'static str, demand: f64) -> Tenant {
    Tenant {
        name,
        demand,
        start: Duration::ZERO,
    }
}

fn assert_near(what: &str, got: f64, want: f64) {
    assert!(
        (got - want).abs() <= want * 0.10,
        "{what}: {got:.1}/s, want {want}/s within 10%"
    );
}

/// Steady state: after the start-up transient (a few horizons).
const FROM: f64 = 10.0;
const TO: f64 = 30.0;
const END: Duration = Duration::from_secs(30);

#[test]
fn a_unequal_demands_get_max_min_fair_shares() {
    let cfg = config(100.0, &[]);
    let tenants = [
        tenant("heavy", 1000.0),
        tenant("medium", 50.0),
        tenant("light", 10.0),
    ];
    let run = simulate(&cfg, &tenants, END);
    let rates: Vec<f64> = (0..3).map(|i| run.rate(i, FROM, TO)).collect();
    println!(
        "(a) demands 1000, 50, 10/s at 100/s: grants {:.1}, {:.1}, {:.1}/s; most beyond rate*t+burst: {:.0}",
        rates[0], rates[1], rates[2], run.max_excess
    );
    assert_near("heavy", rates[0], 45.0);
    assert_near("medium", rates[1], 45.0);
    assert_near("light", rates[2], 10.0);
    assert!(
        rates.iter().sum::<f64>() >= 95.0,
        "work-conserving: {rates:?}"
    );
}

#[test]
fn b_weights_two_one_one_split_the_rate_fifty_twenty_five_twenty_five() {
    let cfg = config(100.0, &[("gold", 2)]);
    let tenants = [
        tenant("gold", 500.0),
        tenant("silver", 500.0),
        tenant("bronze", 500.0),
    ];
    let run = simulate(&cfg, &tenants, END);
    let rates: Vec<f64> = (0..3).map(|i| run.rate(i, FROM, TO)).collect();
    println!(
        "(b) weights 2:1:1, all saturated: grants {:.1}, {:.1}, {:.1}/s; most beyond rate*t+burst: {:.0}",
        rates[0], rates[1], rates[2], run.max_excess
    );
    assert_near("gold", rates[0], 50.0);
    assert_near("silver", rates[1], 25.0);
    assert_near("bronze", rates[2], 25.0);
}

#[test]
fn c_a_tenant_arriving_in_a_flood_is_served_within_one_share_interval() {
    let cfg = config(100.0, &[]);
    let late = |name, demand| Tenant {
        name,
        demand,
        start: Duration::from_millis(15_003),
    };
    let tenants = [
        tenant("flood-1", 1000.0),
        tenant("flood-2", 1000.0),
        late("newcomer", 20.0),
        late("greedy-newcomer", 500.0),
    ];
    let run = simulate(&cfg, &tenants, END);
    // With four tenants backlogged, one share interval is 4 / 100 s.
    let share_interval = Duration::from_millis(40);
    for i in [2, 3] {
        let waited = run.first_wait(i);
        println!(
            "(c) {} waited {waited:?} for its first token",
            tenants[i].name
        );
        assert!(waited <= share_interval, "{}: {waited:?}", tenants[i].name);
    }
    let rates: Vec<f64> = (0..4).map(|i| run.rate(i, 20.0, 30.0)).collect();
    println!(
        "(c) after the arrival: grants {:.1}, {:.1}, {:.1}, {:.1}/s; most beyond rate*t+burst: {:.0}",
        rates[0], rates[1], rates[2], rates[3], run.max_excess
    );
    assert_near("newcomer", rates[2], 20.0);
    assert_near("greedy newcomer", rates[3], 80.0 / 3.0);
    assert_near("flood-1", rates[0], 80.0 / 3.0);
}

#[test]
fn d_saturated_equal_tenants_are_served_evenly() {
    let cfg = config(100.0, &[]);
    const NAMES: [&str; 8] = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"];
    let tenants: Vec<Tenant> = NAMES
        .iter()
        .enumerate()
        .map(|(k, &name)| tenant(name, 100.0 + 50.0 * k as f64))
        .collect();
    let run = simulate(&cfg, &tenants, END);
    let rates: Vec<f64> = (0..tenants.len()).map(|i| run.rate(i, FROM, TO)).collect();
    let sum: f64 = rates.iter().sum();
    let squares: f64 = rates.iter().map(|r| r * r).sum();
    let jain = sum * sum / (rates.len() as f64 * squares);
    println!(
        "(d) 8 saturated tenants, demands 100..450/s: grants {:.1?}/s, Jain's index {jain:.4}",
        rates
    );
    assert!(jain >= 0.95, "Jain's index {jain}");
    assert!(sum >= 95.0, "work-conserving: {sum}");
}

#[test]
fn a_lone_flood_gets_the_whole_rate_and_no_more() {
    let cfg = config(100.0, &[]);
    let run = simulate(&cfg, &[tenant("alone", 1000.0)], END);
    let rate = run.rate(0, FROM, TO);
    println!(
        "lone flood: {rate:.1}/s; most beyond rate*t+burst: {:.0}",
        run.max_excess
    );
    assert_near("alone", rate, 100.0);
    assert!(run.max_excess <= 1.0, "one tenant never over-commits");
}

#[test]
fn simulations_are_deterministic() {
    let cfg = config(100.0, &[]);
    let tenants = [tenant("x", 300.0), tenant("y", 30.0)];
    let a = simulate(&cfg, &tenants, Duration::from_secs(5));
    let b = simulate(&cfg, &tenants, Duration::from_secs(5));
    assert_eq!(a.uses, b.uses);
}
