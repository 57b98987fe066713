//! The bounds on tracking: names cannot be squatted, untracked ones are
//! told so, and idle entries are evicted for new names but never while in
//! trouble.

use super::*;
use crate::budget::token::{Evidence, HealthState};

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
