//! The nesting and the evidence rule: a fresh dependency grants its
//! starting allowance, trouble cuts it, a failing dependency never spends a
//! healthy one's capacity, reported successes raise only the reporter's own
//! retries, and no tenant moves another's pace by the failures it invents.

use proptest::prelude::*;

use super::*;
use crate::bucket::DEPENDENCY_BUDGET_EXHAUSTED;
use crate::budget::token::HealthState;

#[test]
fn a_fresh_dependency_grants_its_starting_allowance_at_once() {
    let (mut g, config) = global(100.0);
    let mut deps = dependencies(&config);
    let now = Duration::from_secs(10);
    let paid = granted_at(
        &mut deps,
        &mut g,
        "t",
        "api",
        false,
        (0..25u32).map(|i| now + i * MS),
    );
    assert_eq!(paid, 20, "the starting allowance: 20 at once, not one");
    let answer = fail_and_ask(&mut deps, &mut g, "t", "api", false, now + 30 * MS);
    let Admission::Deferred { reason, wait, .. } = answer.admission else {
        panic!("{answer:?}");
    };
    assert_eq!(reason, DEPENDENCY_BUDGET_EXHAUSTED);
    assert!(wait <= config.max_deferral, "{wait:?}");
    let pace = answer.pace.expect("the dependency decided");
    assert_eq!(pace.allowed, 20.0);
    assert_eq!(pace.evidence.state, HealthState::NoEvidence);
}

#[test]
fn a_surge_of_failures_cuts_within_a_second_and_failing_retries_keep_it_down() {
    let (mut g, config) = global(100.0);
    let mut deps = dependencies(&config);
    // A healthy second: one failure in it, its retry granted.
    let t0 = Duration::from_secs(10);
    fail_and_ask(&mut deps, &mut g, "t", "api", false, t0);
    // Then 90 failures a second, every retry failing.
    for second in 11..16 {
        let at = Duration::from_secs(second);
        for i in 0..90 {
            fail_and_ask(&mut deps, &mut g, "t", "api", i % 3 == 0, at + i * 10 * MS);
        }
    }
    let stats = deps.stats(Duration::from_secs(16));
    let api = stats.iter().find(|d| d.name == "api").unwrap();
    assert_eq!(api.pace.evidence.state, HealthState::Trouble);
    assert!(api.pace.allowed <= 1.25, "{}", api.pace.allowed);
    assert!(
        api.pace.to_string().contains("failures surged to 90/s"),
        "{}",
        api.pace
    );
    // Granted at once in the second after the surge: a cut allowance.
    let times = (0..90u32).map(|i| Duration::from_secs(16) + i * 10 * MS);
    let paid = granted_at(&mut deps, &mut g, "t", "api", true, times);
    assert!(paid <= 3, "{paid} granted");
}

#[test]
fn a_failing_dependency_never_takes_the_capacity_a_healthy_one_needs() {
    let (mut g, config) = global(20.0);
    let mut deps = dependencies(&config);
    let (mut healthy_paid, mut healthy_asked) = (0, 0);
    for second in 0..60u64 {
        for i in 0..100u32 {
            let at = Duration::from_secs(second) + i * 10 * MS;
            // A floods with failing retries; B asks 5 retries a second.
            fail_and_ask(&mut deps, &mut g, "t", "a", true, at);
            if i % 20 == 0 {
                healthy_asked += 1;
                let b = fail_and_ask(&mut deps, &mut g, "u", "b", false, at);
                healthy_paid += u32::from(granted(&b));
            }
        }
    }
    assert_eq!(healthy_paid, healthy_asked, "every retry of B paid");
}

#[test]
fn reported_successes_raise_only_the_reporters_own_retries() {
    let (mut g, config) = global(1000.0);
    let mut deps = dependencies(&config);
    let t0 = Duration::from_secs(50);
    // The dependency is down: both tenants' retries fail, it is cut (by
    // the failing retries: 15 failures a second are no surge, which would
    // also stop the attacker's own lane).
    for second in 0..10u32 {
        for i in 0..15u32 {
            let at = t0 + second * S + i * 60 * MS;
            for tenant in ["victim", "attacker"] {
                fail_and_ask(&mut deps, &mut g, tenant, "payments", true, at);
            }
        }
    }
    let now = t0 + 10 * S;
    let victim_alone = {
        let (mut g2, _) = global(1000.0);
        let mut d2 = dependencies(&config);
        for second in 0..10u32 {
            for i in 0..15u32 {
                let at = t0 + second * S + i * 60 * MS;
                for tenant in ["victim", "attacker"] {
                    fail_and_ask(&mut d2, &mut g2, tenant, "payments", true, at);
                }
            }
        }
        granted_at(
            &mut d2,
            &mut g2,
            "victim",
            "payments",
            true,
            (0..30u32).map(|i| now + i * MS),
        )
    };
    // The attacker claims a billion successes.
    deps.report("attacker", "payments", now, 1_000_000, 1_000_000, 0);
    let victim = granted_at(
        &mut deps,
        &mut g,
        "victim",
        "payments",
        true,
        (0..30u32).map(|i| now + i * MS),
    );
    assert_eq!(victim, victim_alone, "the victim's answers are its own");
    assert!(victim <= 3);
    let attacker = deps.stats_of_tenant("attacker", now);
    assert!(attacker[0].pace.earned > 0.0, "its own lane grew");
    let victims = deps.stats_of_tenant("victim", now);
    assert_eq!(victims[0].pace.earned, 0.0);
    assert_eq!(
        victims[0].counters.successes, 0,
        "nothing of the attacker's counts"
    );
}

#[test]
fn a_surge_stops_the_tenants_own_lane_until_its_trouble_is_over() {
    let (_, config) = global(1000.0);
    let mut deps = dependencies(&config);
    let t0 = Duration::from_secs(50);
    for second in 0..5u32 {
        deps.report("acme", "api", t0 + second * S, 200, 200, 0);
    }
    let earned = |deps: &mut Dependencies, at| deps.stats_of_tenant("acme", at)[0].pace.earned;
    assert!(
        earned(&mut deps, t0 + 5 * S) > 0.0,
        "its reported successes earn it a lane"
    );
    // Its calls start failing: 60 in a second, far over what its traffic
    // explains, while the successes of the last seconds still count.
    for i in 0..60u32 {
        deps.observe(
            "acme",
            "api",
            Observed {
                retry_failed: false,
            },
            t0 + 5 * S + i * 10 * MS,
        );
    }
    assert_eq!(
        earned(&mut deps, t0 + 6 * S),
        0.0,
        "no retry paid by the lane in the surge"
    );
    // Its trouble over (no failure for a window), its successes earn again.
    for second in 6..20u32 {
        deps.report("acme", "api", t0 + second * S, 200, 200, 0);
    }
    assert!(earned(&mut deps, t0 + 20 * S) > 0.0);
}

proptest! {
    /// The evidence rule: a tenant inventing failures lowers the others'
    /// allowance by no more than its share of the requests seen, because
    /// each tenant's evidence moves only its own part of the blend. (The
    /// honest tenant's retries are paid by its own lane here, so that they
    /// are granted alike with and without the attacker: only the evidence
    /// differs between the two runs.)
    #[test]
    fn an_inventor_of_failures_lowers_the_pace_by_its_share_at_most(
        honest in proptest::collection::vec((0u32..30, 0u32..30, any::<bool>()), 20..40),
        invented in 1u32..200,
    ) {
        let (_, config) = global(100_000.0);
        let run = |with_attacker: bool| {
            let (mut g, _) = global(100_000.0);
            let mut deps = dependencies(&config);
            for (second, (failures, retries, failing)) in honest.iter().enumerate() {
                let at = Duration::from_secs(10 + second as u64);
                deps.report("honest", "api", at, 10_000, 10_000, 0);
                for i in 0..*failures {
                    deps.observe("honest", "api", Observed { retry_failed: false }, at + i * MS);
                }
                // Its retries, and the fate of each one granted.
                for i in 0..*retries {
                    let now = at + (i + 100) * MS;
                    if granted(&deps.admit(&mut g, "honest", "api", &pure(now), now)) && *failing {
                        deps.observe("honest", "api", Observed { retry_failed: true }, now + 300 * MS);
                    }
                }
                if with_attacker {
                    for i in 0..invented {
                        deps.observe("attacker", "api", Observed { retry_failed: true }, at + i * MS / 2);
                    }
                }
            }
            let end = Duration::from_secs(10 + honest.len() as u64);
            let allowed = deps.stats(end).into_iter().find(|d| d.name == "api").unwrap().pace.allowed;
            let i = deps.index["api"];
            let second = end.as_secs();
            let seen = |name: &str| deps.entries[i].tenants.iter().find(|t| &*t.name == name).map_or(0, |t| t.health.seen(second));
            (allowed, seen("honest"), seen("attacker"))
        };
        let (alone, _, _) = run(false);
        let (with, honest_seen, attacker_seen) = run(true);
        let total = (honest_seen + attacker_seen).max(1) as f64;
        let share = attacker_seen as f64 / total;
        if honest_seen > 0 {
            prop_assert!(with >= (1.0 - share) * alone - 1e-9, "{with} < (1 - {share}) * {alone}");
        }
    }
}

#[test]
fn a_surge_is_paid_at_the_cut_allowance_for_the_rest_of_its_second() {
    let (mut g, config) = global(100.0);
    let mut deps = dependencies(&config);
    let t0 = Duration::from_secs(10);
    // 31 first failures in 100 ms, no evidence before: a surge (over 30),
    // cut to 10 a second at the 31st. The starting allowance's 20 tokens
    // are spent on the first 20.
    let first = granted_at(
        &mut deps,
        &mut g,
        "t",
        "api",
        false,
        (0..31u32).map(|i| t0 + i * 3 * MS),
    );
    assert!((20..=22).contains(&first), "{first}");
    // The rest of the second, a failure every 50 ms: paid at the cut
    // allowance (10 a second, the tokens it no longer holds gone), not at
    // the 20 a second the surge has just disproved.
    let times = (1..=18u32).map(|i| t0 + 100 * MS + i * 50 * MS);
    let rest = granted_at(&mut deps, &mut g, "t", "api", false, times);
    assert!(rest <= 10, "{rest} granted after the cut");
}
