//! Herds: 10,000 activities fail in the same millisecond. Their wake-up
//! times must not be concentrated, neither from the backoff plan nor from
//! the bucket's deferrals.
//!
//! The measure: wake times in 100 ms windows; the busiest window may hold at
//! most twice the mean of the windows the wakes span.
//!
//! # Seconds stack, milliseconds spread
//! The reference plan, `delay_seconds`, rounds down to whole seconds, so all
//! the activities that land in one second wake at the same instant: at
//! attempt 1 (ceiling 2 s) every one of the 10,000 wakes exactly 1 s after
//! the failure. `delay_ms` applies the same jitter in milliseconds and
//! spreads them over the whole second. The test prints both.

use std::collections::BTreeMap;
use std::time::Duration;

use retry_budget::bucket::{Booking, BucketConfig, FairShares};
use retry_budget::budget::delay::{DelayParams, retry_delay};

const ACTIVITIES: usize = 10_000;
const WINDOW_MS: u64 = 100;

/// The busiest 100 ms window of `wakes_ms`, and the mean over the windows
/// from the first wake's to the last's.
fn busiest_and_mean(wakes_ms: &[u64]) -> (usize, f64) {
    let mut windows: BTreeMap<u64, usize> = BTreeMap::new();
    for &w in wakes_ms {
        *windows.entry(w / WINDOW_MS).or_default() += 1;
    }
    let (first, last) = match (windows.keys().next(), windows.keys().next_back()) {
        (Some(&f), Some(&l)) => (f, l),
        _ => return (0, 0.0),
    };
    let busiest = windows.values().copied().max().unwrap_or(0);
    (busiest, wakes_ms.len() as f64 / (last - first + 1) as f64)
}

#[test]
fn backoff_wakes_are_spread_at_every_attempt() {
    let params = DelayParams::default();
    println!(
        "attempt | delay_ms: windows busiest mean ratio | delay_seconds: busiest ratio | seconds histogram"
    );
    for attempt in 1..=6 {
        let delays: Vec<_> = (0..ACTIVITIES)
            .map(|i| retry_delay(&format!("act-{i}"), attempt, params).expect("attempt >= 1"))
            .collect();
        let ms: Vec<u64> = delays.iter().map(|d| d.millis).collect();
        let (busiest, mean) = busiest_and_mean(&ms);
        let ratio = busiest as f64 / mean;

        // The same wakes planned in whole seconds, against the same windows.
        let secs: Vec<u64> = delays.iter().map(|d| u64::from(d.seconds) * 1000).collect();
        let (sec_busiest, _) = busiest_and_mean(&secs);
        let sec_ratio = sec_busiest as f64 / mean;
        let mut histogram: BTreeMap<u32, usize> = BTreeMap::new();
        for d in &delays {
            *histogram.entry(d.seconds).or_default() += 1;
        }
        let windows = (ACTIVITIES as f64 / mean).round();
        let histogram: Vec<String> = histogram.iter().map(|(s, n)| format!("{s}s:{n}")).collect();
        println!(
            "{attempt} | {windows:>4} {busiest:>5} {mean:>7.1} {ratio:>5.2} | {sec_busiest:>5} {sec_ratio:>6.1} | {}",
            histogram.join(" ")
        );
        assert!(
            ratio <= 2.0,
            "attempt {attempt}: the busiest 100 ms holds {busiest}, {ratio:.2}x the mean {mean:.1}"
        );
        assert!(
            sec_ratio > 2.0,
            "attempt {attempt}: whole seconds should stack the wakes ({sec_ratio:.2}x)"
        );
    }
}

#[test]
fn a_burst_of_deferrals_wakes_spread() {
    let config = BucketConfig {
        rate: 100.0,
        burst: 100,
        ..BucketConfig::default()
    };
    let mut shares = FairShares::new(&config).expect("valid configuration");
    let tenants = ["t0", "t1", "t2", "t3"];
    let now = Duration::from_secs(1);

    // Every activity asks in the same instant.
    let mut granted = 0;
    let mut booked: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    let mut refused = Vec::new();
    for i in 0..ACTIVITIES {
        let tenant = tenants[i % tenants.len()];
        match shares.admit(tenant, now, Duration::MAX) {
            Booking::Granted => granted += 1,
            Booking::Booked { wait, .. } => booked.entry(tenant).or_default().push(wait),
            Booking::Refused { retry_after, .. } => refused.push((retry_after, tenant)),
        }
    }
    // Booked slots (when the retries run) and refusals' turns (when the
    // refused ask again) are each spread.
    let booked_ms: Vec<u64> = booked
        .values()
        .flatten()
        .map(|w| w.as_millis() as u64)
        .collect();
    let refused_ms: Vec<u64> = refused.iter().map(|(r, _)| r.as_millis() as u64).collect();
    let (b_busiest, b_mean) = busiest_and_mean(&booked_ms);
    let (r_busiest, r_mean) = busiest_and_mean(&refused_ms);
    println!(
        "bucket burst: {granted} granted at once; {} booked, busiest 100 ms {b_busiest}, mean {b_mean:.1}; {} refused, busiest 100 ms {r_busiest}, mean {r_mean:.1}",
        booked_ms.len(),
        refused_ms.len()
    );
    assert!(
        b_busiest as f64 <= 2.0 * b_mean,
        "{b_busiest} vs mean {b_mean:.1}"
    );
    assert!(
        r_busiest as f64 <= 2.0 * r_mean,
        "{r_busiest} vs mean {r_mean:.1}"
    );
    for (tenant, waits) in &booked {
        assert!(
            waits.windows(2).all(|w| w[1] > w[0]),
            "{tenant}'s booked slots are never stacked"
        );
    }

    // The refused come back when told and ask again, until each is booked:
    // the tokens are then used at the bucket's rate, not in a herd.
    let mut uses = booked_ms;
    let mut asks = ACTIVITIES;
    let mut pending: Vec<(Duration, &str)> = refused.iter().map(|&(r, t)| (now + r, t)).collect();
    while !pending.is_empty() {
        pending.sort_unstable();
        let mut next = Vec::new();
        for (at, tenant) in pending {
            asks += 1;
            match shares.admit(tenant, at, Duration::MAX) {
                Booking::Granted => uses.push((at - now).as_millis() as u64),
                Booking::Booked { wait, .. } => {
                    uses.push((at + wait - now).as_millis() as u64);
                }
                Booking::Refused { retry_after, .. } => next.push((at + retry_after, tenant)),
            }
        }
        pending = next;
    }
    let (busiest, mean) = busiest_and_mean(&uses);
    let last = uses.iter().max().copied().unwrap_or(0);
    println!(
        "bucket burst, all served: last token at {last} ms, {asks} asks in all, busiest 100 ms {busiest} tokens, mean {mean:.1}"
    );
    assert_eq!(uses.len() + granted, ACTIVITIES);
    assert!(
        asks <= 3 * ACTIVITIES,
        "a refused request asks again about once, not in a loop: {asks} asks"
    );
    assert!(busiest as f64 <= 2.0 * mean, "{busiest} vs mean {mean:.1}");
}
