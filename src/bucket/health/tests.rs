//! The rule of `health.rs`, second by second.

use super::*;

const LIMITS: Limits = Limits {
    floor: 1.0,
    initial: 20.0,
    cap: 100.0,
};

fn failures(n: u32) -> Second {
    Second {
        failures: n,
        seen: n,
        ..Second::default()
    }
}

#[test]
fn no_evidence_starts_at_the_initial_allowance_and_stays() {
    let mut h = TenantHealth::new(0, 20.0);
    h.advance(30, &LIMITS);
    assert_eq!(h.allowance(), 20.0);
    assert_eq!(h.evidence(30, &LIMITS).state, HealthState::NoEvidence);
}

#[test]
fn a_surge_cuts_within_a_second_and_keeps_cutting_while_it_lasts() {
    let mut h = TenantHealth::new(0, 20.0);
    for s in 0..10 {
        h.count(s, &failures(1), &LIMITS);
    }
    assert_eq!(h.allowance(), 20.0, "one failure a second is no surge");
    h.count(10, &failures(90), &LIMITS);
    h.advance(11, &LIMITS);
    assert_eq!(h.allowance(), 1.0, "out of calm: to the floor at once");
    let e = h.evidence(11, &LIMITS);
    assert_eq!(e.state, HealthState::Trouble);
    assert!(
        e.to_string().starts_with("failures surged to 90/s from"),
        "{e}"
    );
    for s in 11..15 {
        h.count(s, &failures(90), &LIMITS);
    }
    h.advance(15, &LIMITS);
    assert_eq!(
        h.allowance(),
        LIMITS.floor / PROBE_BACKOFF,
        "while it lasts, halved past the floor: 0.5, 0.25, 0.125, no lower"
    );
}

#[test]
fn a_tenant_that_reports_its_successes_is_cut_by_a_surge_its_traffic_does_not_explain() {
    // 50 successes a second reported: 11 failures in a second are over
    // twice the tenth of them its traffic explains, a surge, cut at once.
    // A tenant reporting nothing has no traffic to measure against: its
    // first failures are a surge past one and a half times the starting
    // allowance, at the 31st.
    let mut reports = TenantHealth::new(0, 20.0);
    reports.set_successes(50.0);
    let mut silent = TenantHealth::new(0, 20.0);
    reports.count(10, &failures(11), &LIMITS);
    assert_eq!(reports.allowance(), 1.0, "cut within the second");
    silent.count(10, &failures(11), &LIMITS);
    silent.count(10, &failures(19), &LIMITS);
    assert_eq!(silent.allowance(), 20.0, "30 first failures are no surge");
    silent.count(10, &failures(1), &LIMITS);
    assert_eq!(silent.allowance(), 1.0, "the 31st is");
}

#[test]
fn a_flaky_dependency_reported_healthy_is_never_a_surge() {
    // A tenth of the calls failing from the first second (90 successes,
    // 10 failures, now and then 18): the share its traffic explains.
    let mut h = TenantHealth::new(0, 20.0);
    h.set_successes(90.0);
    for s in 0..60 {
        let n = if s % 7 == 0 { 18 } else { 10 };
        h.count(s, &failures(n), &LIMITS);
    }
    h.advance(60, &LIMITS);
    assert_eq!(h.evidence(60, &LIMITS).state, HealthState::Healthy);
    assert!(h.allowance() >= h.rest(&LIMITS), "{}", h.allowance());
}

#[test]
fn failing_retries_cut_and_retries_that_succeed_let_it_grow_back() {
    let mut h = TenantHealth::new(0, 20.0);
    // A steady failure rate (no surge), every granted retry failing.
    for s in 0..20 {
        h.count(
            s,
            &Second {
                failures: 5,
                seen: 5,
                granted: 2,
                retries_failed: 2,
                deferred: 3,
                successes: 0,
            },
            &LIMITS,
        );
    }
    h.advance(20, &LIMITS);
    assert_eq!(h.allowance(), LIMITS.floor / PROBE_BACKOFF);
    let e = h.evidence(20, &LIMITS);
    assert_eq!(e.state, HealthState::Trouble);
    assert_eq!(
        e.to_string(),
        "20 of the 20 retries granted in the last 10 s failed"
    );
    // The dependency comes back: the probes succeed, and the retries
    // wanted are deferred, so it grows.
    for s in 20..60 {
        h.count(
            s,
            &Second {
                failures: 5,
                seen: 5,
                granted: 1,
                retries_failed: 0,
                deferred: 5,
                successes: 0,
            },
            &LIMITS,
        );
    }
    h.advance(60, &LIMITS);
    assert!(h.allowance() > 50.0, "{}", h.allowance());
    assert_eq!(h.evidence(60, &LIMITS).state, HealthState::Healthy);
}

#[test]
fn a_flaky_dependency_is_not_trouble() {
    // 13 failures a second, a tenth of the granted retries failing.
    let mut h = TenantHealth::new(0, 20.0);
    for s in 0..60 {
        h.count(
            s,
            &Second {
                failures: 13,
                seen: 130,
                granted: 13,
                retries_failed: u32::from(s % 10 == 0) * 13,
                deferred: u32::from(s % 3 == 0),
                successes: 0,
            },
            &LIMITS,
        );
    }
    h.advance(60, &LIMITS);
    assert!(h.allowance() >= 20.0, "{}", h.allowance());
    assert_ne!(h.evidence(60, &LIMITS).state, HealthState::Trouble);
}

#[test]
fn an_unused_allowance_decays_to_the_initial_one() {
    let mut h = TenantHealth::new(0, 100.0);
    h.count(0, &failures(1), &LIMITS);
    h.advance(40, &LIMITS);
    assert_eq!(h.allowance(), 20.0);
}

#[test]
fn a_tenants_own_lane_pays_for_part_of_its_resting_allowance() {
    // A tenant whose reported successes earn it 12 retries a second rests
    // at the 8 the lane leaves of the starting 20: both together are the
    // starting allowance, not 32 ready for an overload's first second.
    let mut h = TenantHealth::new(0, 20.0);
    h.set_lane(12.0);
    h.advance(10, &LIMITS);
    assert_eq!(
        h.allowance(),
        20.0,
        "no evidence yet: the starting allowance"
    );
    h.count(10, &failures(1), &LIMITS);
    h.advance(40, &LIMITS);
    assert!((h.allowance() - 8.0).abs() < 1e-9, "{}", h.allowance());
    assert_eq!(h.evidence(40, &LIMITS).state, HealthState::Healthy);
    // A lane past the starting allowance leaves the floor.
    h.set_lane(50.0);
    h.advance(80, &LIMITS);
    assert_eq!(h.allowance(), LIMITS.floor);
    assert_eq!(h.evidence(80, &LIMITS).state, HealthState::Healthy);
    // The lane gone (its successes stopped), the allowance grows back to
    // the starting one: no evidence of trouble holds it.
    h.set_lane(0.0);
    h.advance(120, &LIMITS);
    assert_eq!(h.allowance(), 20.0);
    // Deferred retries that do not fail still grow it past the rest.
    h.set_lane(12.0);
    for s in 120..135 {
        h.count(
            s,
            &Second {
                deferred: 5,
                granted: 5,
                ..Second::default()
            },
            &LIMITS,
        );
    }
    h.advance(135, &LIMITS);
    assert!(h.allowance() > 50.0, "{}", h.allowance());
}

#[test]
fn an_allowance_its_tenants_retries_fill_does_not_decay_under_them() {
    // Grown to 40 by retries deferred and not failing, then filled by 30
    // granted a second with none deferred: it stays; at 10 a second (under
    // half of it) it decays to the starting allowance.
    let mut h = TenantHealth::new(0, 40.0);
    let granted = |n| Second {
        granted: n,
        ..Second::default()
    };
    h.count(0, &failures(1), &LIMITS);
    for s in 0..20 {
        h.count(s, &granted(30), &LIMITS);
    }
    h.advance(20, &LIMITS);
    assert_eq!(h.allowance(), 40.0);
    for s in 20..60 {
        h.count(s, &granted(10), &LIMITS);
    }
    h.advance(60, &LIMITS);
    assert_eq!(h.allowance(), 20.0);
}

#[test]
fn long_gaps_are_stepped_in_bounded_time() {
    let mut h = TenantHealth::new(0, 1.0);
    h.count(0, &failures(1), &LIMITS);
    h.advance(u64::MAX / 2, &LIMITS);
    assert_eq!(h.allowance(), 20.0, "evidence ages out");
}

#[test]
fn the_blend_weighs_tenants_by_requests_seen() {
    assert_eq!(blend([(1.0, 90), (100.0, 10)], 20.0), 10.9);
    assert_eq!(blend([(1.0, 0), (9.0, 0)], 20.0), 5.0);
    assert_eq!(blend([], 20.0), 20.0);
}

#[test]
fn a_surge_is_cut_within_its_own_second() {
    let mut h = TenantHealth::new(0, 20.0);
    // A quiet history, then 31 fresh failures in one second (no successes
    // reported): cut at the 31st, before the second ends.
    h.count(5, &failures(1), &LIMITS);
    for _ in 0..30 {
        h.count(10, &failures(1), &LIMITS);
    }
    assert_eq!(h.allowance(), 20.0);
    h.count(10, &failures(1), &LIMITS);
    assert_eq!(h.allowance(), 1.0);
    // Once a second: the rest of it does not cut again, nor does its end.
    h.count(10, &failures(30), &LIMITS);
    h.advance(11, &LIMITS);
    assert_eq!(h.allowance(), 1.0);
}

#[test]
fn a_cut_holds_growth_and_so_does_a_second_failing_more_than_usual() {
    let deferred = Second {
        deferred: 5,
        ..Second::default()
    };
    let mut h = TenantHealth::new(0, 20.0);
    h.count(10, &failures(50), &LIMITS);
    assert_eq!(h.allowance(), 1.0);
    // Deferred and no retry failing: no growth within the hold.
    for s in 11..10 + HOLD_SECONDS {
        h.count(s, &deferred, &LIMITS);
    }
    h.advance(10 + HOLD_SECONDS, &LIMITS);
    assert_eq!(h.allowance(), 1.0);
    // Then it grows (by a quarter, at least one a second)...
    h.count(10 + HOLD_SECONDS, &deferred, &LIMITS);
    h.advance(11 + HOLD_SECONDS, &LIMITS);
    assert_eq!(h.allowance(), 2.0);
    // ...until a second with a few failures, well above the tenant's
    // usual rate though no surge, holds it again.
    let at = 11 + HOLD_SECONDS;
    h.count(at, &failures(6), &LIMITS);
    h.count(at, &deferred, &LIMITS);
    for s in at + 1..at + HOLD_SECONDS {
        h.count(s, &deferred, &LIMITS);
    }
    h.advance(at + HOLD_SECONDS, &LIMITS);
    assert_eq!(h.allowance(), 2.0);
}

#[test]
fn a_surge_out_of_calm_pauses_the_lane_and_one_in_a_recovery_does_not() {
    let mut h = TenantHealth::new(0, 20.0);
    h.set_successes(200.0);
    h.count(40, &failures(50), &LIMITS);
    assert!(h.lane_paused(40), "the first surge, out of calm");
    assert!(h.lane_paused(40 + WINDOW_SECONDS as u64));
    assert!(!h.lane_paused(41 + WINDOW_SECONDS as u64), "for a window");
    // A surge 20 s after that cut, in the swings of a recovery: the lane
    // keeps paying (the tenant's rate, and its workers' turns, steady).
    h.count(60, &failures(50), &LIMITS);
    assert!(h.cut_in(60));
    assert!(!h.lane_paused(60));
    // Past the calm, a surge pauses it again.
    h.count(61 + CALM_SECONDS, &failures(50), &LIMITS);
    assert!(h.lane_paused(61 + CALM_SECONDS));
}

#[test]
fn trouble_out_of_calm_cuts_to_the_floor_and_in_a_recovery_by_half() {
    // Grown to 40, then a surge out of calm: to the floor at once. Grown
    // back to 16 within 30 s of that cut, failing retries (the swings of
    // a recovery) halve it; past the calm, failing retries alone cut to
    // the floor again.
    let mut h = TenantHealth::new(0, 40.0);
    h.count(1, &failures(1), &LIMITS);
    h.count(10, &failures(50), &LIMITS);
    assert_eq!(h.allowance(), LIMITS.floor);
    let retries = |granted, retries_failed| Second {
        granted,
        retries_failed,
        deferred: 5,
        ..Second::default()
    };
    for s in 11..24 {
        h.count(s, &retries(2, 0), &LIMITS);
    }
    h.advance(24, &LIMITS);
    let grown = h.allowance();
    assert!(grown > 10.0, "{grown}");
    h.count(24, &retries(20, 20), &LIMITS);
    h.advance(25, &LIMITS);
    assert_eq!(h.allowance(), grown * CUT, "in a recovery: by half");
    for s in 25..70 {
        h.count(s, &retries(2, 0), &LIMITS);
    }
    h.advance(70, &LIMITS);
    assert!(h.allowance() > 10.0, "{}", h.allowance());
    h.count(70, &retries(20, 20), &LIMITS);
    h.advance(71, &LIMITS);
    assert_eq!(h.allowance(), LIMITS.floor, "out of calm again");
}

#[test]
fn a_burst_of_calls_is_no_surge_when_their_successes_come_with_it() {
    // 50 successes a second told: 30 failures in a second are a surge,
    // unless the same second also brought 300 successes (a burst of the
    // tenant's calls, three times its rate, failing as usual).
    let successes = |n| Second {
        successes: n,
        ..Second::default()
    };
    let mut burst = TenantHealth::new(0, 20.0);
    burst.set_successes(50.0);
    burst.count(10, &successes(300), &LIMITS);
    burst.count(10, &failures(30), &LIMITS);
    burst.advance(11, &LIMITS);
    assert_eq!(burst.allowance(), 20.0, "no cut");
    let mut overload = TenantHealth::new(0, 20.0);
    overload.set_successes(50.0);
    overload.count(10, &successes(20), &LIMITS);
    overload.count(10, &failures(30), &LIMITS);
    assert_eq!(overload.allowance(), LIMITS.floor, "cut");
}

#[test]
fn past_half_of_where_a_recovery_overloaded_growth_adds_until_the_recovery_is_over() {
    let retries = |granted, retries_failed| Second {
        granted,
        retries_failed,
        deferred: 5,
        ..Second::default()
    };
    let mut h = TenantHealth::new(0, 20.0);
    h.count(1, &failures(1), &LIMITS);
    h.count(10, &failures(50), &LIMITS);
    assert_eq!(h.allowance(), LIMITS.floor, "out of calm: to the floor");
    // The backlog's release multiplies the allowance up to the cap, where
    // its retries overload the dependency: three seconds of them failing.
    for s in 11..34 {
        h.count(s, &retries(2, 0), &LIMITS);
    }
    h.advance(34, &LIMITS);
    assert_eq!(h.allowance(), LIMITS.cap, "no threshold yet: multiplied");
    for s in 34..37 {
        h.count(s, &retries(20, 20), &LIMITS);
    }
    h.advance(37, &LIMITS);
    assert_eq!(h.allowance(), LIMITS.cap * CUT * CUT * CUT);
    // (two more halvings while those failures are recent, then growth:)
    // by a quarter a second up to half the cap (the first cut of the
    // episode set it), then by a twentieth of that a second.
    let mut path = vec![];
    for s in 37..75 {
        h.count(s, &retries(2, 0), &LIMITS);
        h.advance(s + 1, &LIMITS);
        path.push(h.allowance());
    }
    let threshold = LIMITS.cap * CUT;
    let at = path
        .iter()
        .position(|&a| a == threshold)
        .expect("stops at it");
    let multiplied = |a: f64| (a * GROWTH).max(a + 1.0).min(threshold);
    assert!(
        path[2..=at]
            .windows(2)
            .all(|w| w[1] == multiplied(w[0]) || w[1] == w[0]),
        "{path:?}"
    );
    for w in path[at..].windows(2).filter(|w| w[1] < LIMITS.cap) {
        assert!(
            (w[1] - w[0] - threshold * ADDITIVE_SHARE).abs() < 1e-9,
            "{path:?}"
        );
    }
    // A swing more than 30 s after the last cut, the backlog still being
    // released: by half, not to the floor.
    let before = h.allowance();
    h.count(75, &retries(20, 20), &LIMITS);
    h.advance(76, &LIMITS);
    assert_eq!(h.allowance(), before * CUT, "a swing");
    // The recovery over (nothing deferred for the calm), a new outage is
    // out of calm: to the floor, and growth multiplies past the old
    // threshold again.
    for s in 76..110 {
        h.count(s, &Second::default(), &LIMITS);
    }
    h.count(110, &failures(60), &LIMITS);
    assert_eq!(h.allowance(), LIMITS.floor);
    for s in 111..140 {
        h.count(s, &retries(2, 0), &LIMITS);
    }
    h.advance(140, &LIMITS);
    assert_eq!(h.allowance(), LIMITS.cap, "{}", h.allowance());
}

#[test]
fn a_restored_threshold_keeps_growth_adding_until_a_window_says_the_recovery_is_over() {
    let saved = Saved {
        allowance: 30.0,
        baseline: 2.0,
        state: HealthState::Recovering,
        threshold: Some(40.0),
    };
    let released = Second {
        granted: 2,
        deferred: 5,
        ..Second::default()
    };
    // A restart in a recovery's swing: the window starts empty, which is
    // no news; the backlog's deferrals come back within it.
    let mut h = TenantHealth::restored(100, saved);
    assert_eq!(h.threshold(), Some(40.0));
    for s in 100..110 {
        h.count(s, &released, &LIMITS);
    }
    h.advance(110, &LIMITS);
    assert_eq!(
        h.threshold(),
        Some(40.0),
        "kept while the backlog is released"
    );
    let path: Vec<f64> = (110..113)
        .map(|s| {
            h.count(s, &released, &LIMITS);
            h.advance(s + 1, &LIMITS);
            h.allowance()
        })
        .collect();
    assert!(path[0] > 40.0, "multiplied up to it, then added: {path:?}");
    assert!(
        path.windows(2)
            .all(|w| (w[1] - w[0] - 40.0 * ADDITIVE_SHARE).abs() < 1e-9),
        "{path:?}"
    );
    // Restored where the backlog was gone: forgotten once a whole window
    // has passed with nothing deferred (and no cut for the calm's span),
    // not at the restart's first second.
    let mut h = TenantHealth::restored(100, saved);
    h.advance(101, &LIMITS);
    assert_eq!(
        h.threshold(),
        Some(40.0),
        "an empty first second is no news"
    );
    h.advance(100 + CALM_SECONDS, &LIMITS);
    assert_eq!(h.threshold(), None);
}
