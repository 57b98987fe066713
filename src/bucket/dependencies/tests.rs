//! The nesting, the evidence rule, the lines and the bounds, simulated on
//! exact times: a fresh dependency grants its starting allowance, trouble
//! cuts it, a failing dependency never spends a healthy one's capacity,
//! deferred retries go oldest first, and no tenant moves another's budget
//! by what it claims or invents.

use proptest::prelude::*;

use super::*;
use crate::bucket::{DEPENDENCY_BUDGET_EXHAUSTED, GLOBAL_CAPACITY_EXHAUSTED};
use crate::budget::token::{Admission, Answer, Ask, Evidence, HealthState};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

fn global(rate: f64) -> (FairShares, BucketConfig) {
    let config = BucketConfig {
        rate,
        burst: rate as u32,
        ..BucketConfig::default()
    };
    (FairShares::new(&config).unwrap(), config)
}

fn dependencies(template: &BucketConfig) -> Dependencies {
    Dependencies::new(DependenciesConfig::default(), template).unwrap()
}

fn pure(now: Duration) -> Ask<'static> {
    Ask {
        activity_id: None,
        waiting_since_ms: None,
        now_ms: now.as_millis() as i64,
        planned_ms: None,
        observed: None,
    }
}

fn durable<'a>(id: &'a str, since: Option<i64>, now: Duration) -> Ask<'a> {
    Ask {
        activity_id: Some(id),
        waiting_since_ms: since,
        now_ms: now.as_millis() as i64,
        planned_ms: None,
        observed: None,
    }
}

fn granted(answer: &Answer) -> bool {
    answer.admission == Admission::Granted
}

/// A failure asked about, and a retry asked for it: what a worker does.
fn fail_and_ask(
    deps: &mut Dependencies,
    global: &mut FairShares,
    tenant: &str,
    dependency: &str,
    retry_failed: bool,
    now: Duration,
) -> Answer {
    deps.observe(tenant, dependency, Observed { retry_failed }, now);
    deps.admit(global, tenant, dependency, &pure(now), now)
}

#[test]
fn a_fresh_dependency_grants_its_starting_allowance_at_once() {
    let (mut g, config) = global(100.0);
    let mut deps = dependencies(&config);
    let now = Duration::from_secs(10);
    let paid = (0..25)
        .filter(|i| {
            granted(&fail_and_ask(
                &mut deps,
                &mut g,
                "t",
                "api",
                false,
                now + *i * MS,
            ))
        })
        .count();
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
    let mut paid = 0;
    for i in 0..90 {
        let at = Duration::from_secs(16) + i * 10 * MS;
        paid += u32::from(granted(&fail_and_ask(
            &mut deps, &mut g, "t", "api", true, at,
        )));
    }
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
fn deferred_retries_are_granted_oldest_first_before_fresh_failures() {
    let (mut g, config) = global(100.0);
    let mut deps = Dependencies::new(
        DependenciesConfig {
            default: crate::bucket::PaceConfig {
                rate: Some(2.0),
                ..crate::bucket::PaceConfig::default()
            },
            ..DependenciesConfig::default()
        },
        &config,
    )
    .unwrap();
    let t0 = Duration::from_secs(100);
    // Two tokens of burst, then ten activities deferred, in order.
    let ids: Vec<String> = (0..12).map(|i| format!("act-{i:02}")).collect();
    let mut places = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let now = t0 + i as u32 * MS;
        let answer = deps.admit(&mut g, "t", "api", &durable(id, None, now), now);
        match answer.admission {
            Admission::Granted => {}
            Admission::Deferred {
                waiting_since_ms,
                wait,
                ..
            } => {
                assert!(wait <= config.max_deferral);
                places.push((id.clone(), waiting_since_ms.expect("a place")));
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(places.len(), 10);
    // They come back in reverse order, with a fresh failure among them:
    // the tokens go to the oldest places, and the fresh one waits.
    let mut order = Vec::new();
    for second in 1..=10u32 {
        let now = t0 + second * S;
        let fresh = deps.admit(&mut g, "t", "api", &durable("fresh", None, now), now);
        assert!(
            !granted(&fresh) || places.is_empty(),
            "a fresh failure waits behind the line"
        );
        for (id, since) in places.iter().rev() {
            let answer = deps.admit(&mut g, "t", "api", &durable(id, Some(*since), now), now);
            if granted(&answer) {
                order.push(id.clone());
            }
        }
        places.retain(|(id, _)| !order.contains(id));
        deps.leave(&mut g, "t", "api", "fresh", now.as_millis() as i64, now);
        // Whoever asks first, the ones granted so far are the oldest.
        let mut so_far = order.clone();
        so_far.sort();
        assert_eq!(so_far, ids[2..2 + order.len()].to_vec(), "oldest first");
    }
    assert_eq!(order.len(), 10);
}

#[test]
fn after_the_pace_rises_a_re_ask_is_told_a_sooner_turn() {
    let (mut g, config) = global(100.0);
    let slow = DependenciesConfig {
        default: crate::bucket::PaceConfig {
            rate: Some(0.1),
            ..crate::bucket::PaceConfig::default()
        },
        ..DependenciesConfig::default()
    };
    let mut deps = Dependencies::new(slow.clone(), &config).unwrap();
    let t0 = Duration::from_secs(100);
    for i in 0..50 {
        let id = format!("a{i}");
        deps.admit(&mut g, "t", "api", &durable(&id, None, t0), t0);
    }
    let last = durable("a49", Some(t0.as_millis() as i64), t0 + S);
    let Admission::Deferred { wait: before, .. } =
        deps.admit(&mut g, "t", "api", &last, t0 + S).admission
    else {
        panic!("deferred");
    };
    assert!(
        before >= config.max_deferral / 2,
        "far back in line: the horizon ({before:?})"
    );
    let fast = DependenciesConfig {
        default: crate::bucket::PaceConfig {
            rate: Some(1000.0),
            ..crate::bucket::PaceConfig::default()
        },
        ..slow
    };
    deps.reconfigure(fast, &config);
    let now = t0 + 2 * S;
    let answer = deps.admit(
        &mut g,
        "t",
        "api",
        &durable("a49", Some(t0.as_millis() as i64), now),
        now,
    );
    match answer.admission {
        Admission::Granted => {}
        Admission::Deferred { wait, .. } => assert!(wait < Duration::from_millis(100), "{wait:?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn reported_successes_raise_only_the_reporters_own_retries() {
    let (mut g, config) = global(1000.0);
    let mut deps = dependencies(&config);
    let t0 = Duration::from_secs(50);
    // The dependency is down: both tenants' retries fail, it is cut.
    for second in 0..10u32 {
        for i in 0..40u32 {
            let at = t0 + second * S + i * 20 * MS;
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
            for i in 0..40u32 {
                let at = t0 + second * S + i * 20 * MS;
                for tenant in ["victim", "attacker"] {
                    fail_and_ask(&mut d2, &mut g2, tenant, "payments", true, at);
                }
            }
        }
        (0..30)
            .filter(|i| {
                granted(&fail_and_ask(
                    &mut d2,
                    &mut g2,
                    "victim",
                    "payments",
                    true,
                    now + *i * MS,
                ))
            })
            .count()
    };
    // The attacker claims a billion successes.
    deps.report("attacker", "payments", now, 1_000_000, 1_000_000, 0);
    let victim = (0..30)
        .filter(|i| {
            granted(&fail_and_ask(
                &mut deps,
                &mut g,
                "victim",
                "payments",
                true,
                now + *i * MS,
            ))
        })
        .count();
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
fn names_cannot_be_squatted_and_untracked_ones_are_told_so() {
    let (mut g, config) = global(100.0);
    let mut named = DependenciesConfig::default();
    named.named.insert(
        "payments-api".into(),
        crate::bucket::PaceConfig {
            rate: Some(50.0),
            ..crate::bucket::PaceConfig::default()
        },
    );
    let mut deps = Dependencies::new(named, &config).unwrap();
    let t0 = Duration::from_secs(10);
    for i in 0..200 {
        deps.report("squatter", &format!("junk-{i}"), t0, 1, 1, 0);
    }
    let mine = deps.stats_of_tenant("squatter", t0);
    assert_eq!(
        mine.iter().filter(|d| d.pace.tracked).count(),
        DEFAULT_MAX_PER_TENANT,
        "a tenant introduces at most its bound"
    );
    // Another tenant's new dependency is still tracked, and the named one
    // keeps its configured rate.
    let answer = deps.admit(&mut g, "honest", "orders", &pure(t0), t0);
    assert!(!answer.untracked);
    let paid = (0..50)
        .filter(|i| {
            granted(&deps.admit(
                &mut g,
                "honest",
                "payments-api",
                &pure(t0 + *i * MS),
                t0 + *i * MS,
            ))
        })
        .count();
    assert_eq!(paid, 50, "its static 50 a second, burst 50");
    // The squatter's 17th name shares the untracked entry, and is told.
    let answer = deps.admit(&mut g, "squatter", "junk-199", &pure(t0), t0);
    assert!(answer.untracked);
}

const DEFAULT_MAX_PER_TENANT: usize = crate::bucket::pace::DEFAULT_MAX_DEPENDENCIES_PER_TENANT;

#[test]
fn idle_entries_are_evicted_for_new_names_but_never_while_in_trouble() {
    let (mut g, config) = global(100.0);
    let mut deps = Dependencies::new(
        DependenciesConfig {
            max_dependencies: 2,
            max_dependencies_per_tenant: 2,
            ..DependenciesConfig::default()
        },
        &config,
    )
    .unwrap();
    let t0 = Duration::from_secs(10);
    // `down` in trouble, `idle` quiet.
    for i in 0..40 {
        fail_and_ask(&mut deps, &mut g, "t", "down", true, t0 + i * 20 * MS);
    }
    deps.report("t", "idle", t0, 1, 1, 0);
    let later = t0 + Duration::from_secs(IDLE_EVICTION_SECONDS + 1);
    // Keep `down` in trouble until then.
    for s in 1..=IDLE_EVICTION_SECONDS {
        fail_and_ask(
            &mut deps,
            &mut g,
            "t",
            "down",
            true,
            t0 + Duration::from_secs(s),
        );
    }
    let answer = deps.admit(&mut g, "u", "new", &pure(later), later);
    assert!(!answer.untracked, "the idle entry made room");
    let names: Vec<String> = deps.stats(later).into_iter().map(|d| d.name).collect();
    assert!(names.contains(&"down".to_owned()), "{names:?}");
    assert!(!names.contains(&"idle".to_owned()), "{names:?}");
    let evidence: Evidence = deps
        .stats(later)
        .into_iter()
        .find(|d| d.name == "down")
        .unwrap()
        .pace
        .evidence;
    assert_eq!(evidence.state, HealthState::Trouble, "its evidence kept");
}

#[test]
fn a_global_refusal_defers_with_its_own_reason_and_the_line_keeps_its_place() {
    let (mut g, config) = global(1.0);
    let mut deps = Dependencies::new(DependenciesConfig::static_rate(1000.0), &config).unwrap();
    let t0 = Duration::from_secs(10);
    assert!(granted(&deps.admit(&mut g, "t", "api", &pure(t0), t0)));
    let answer = deps.admit(&mut g, "t", "api", &durable("x", None, t0), t0);
    let Admission::Deferred {
        reason,
        waiting_since_ms,
        ..
    } = answer.admission
    else {
        panic!("{answer:?}");
    };
    assert_eq!(reason, GLOBAL_CAPACITY_EXHAUSTED);
    assert!(waiting_since_ms.is_some());
    assert!(answer.pace.is_none(), "not the dependency's budget");
}

#[test]
fn the_pace_survives_a_snapshot_and_restore() {
    let (mut g, config) = global(100.0);
    let mut deps = dependencies(&config);
    let t0 = Duration::from_secs(10);
    for s in 0..10u32 {
        for i in 0..50u32 {
            fail_and_ask(
                &mut deps,
                &mut g,
                "t",
                "down",
                true,
                t0 + s * S + i * 20 * MS,
            );
        }
        deps.report("t", "busy", t0 + s * S, 2000, 2000, 0);
    }
    let records = deps.snapshot(t0 + 10 * S, 1_000);
    let (mut g2, _) = global(100.0);
    let mut restarted = dependencies(&config);
    let t1 = Duration::from_secs(3);
    restarted.restore(&records, t1);
    let down = (0..50)
        .filter(|i| {
            granted(&fail_and_ask(
                &mut restarted,
                &mut g2,
                "t",
                "down",
                true,
                t1 + *i * MS,
            ))
        })
        .count();
    assert!(down <= 4, "{down} of 50 retried where it was in trouble");
    let (mut g3, _) = global(1000.0);
    let mut restarted = dependencies(&BucketConfig {
        rate: 1000.0,
        burst: 1000,
        ..config.clone()
    });
    restarted.restore(&records, t1);
    // Asked 20 s after the start, no report since: a replica waits for its
    // first grant, and its workers' reports may come later still.
    let busy = (0..50)
        .filter(|i| {
            granted(&fail_and_ask(
                &mut restarted,
                &mut g3,
                "t",
                "busy",
                false,
                t1 + 20 * S + *i * MS,
            ))
        })
        .count();
    assert!(
        busy >= 45,
        "{busy} of 50 retried where it was paced at 200 a second"
    );
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
