//! The nesting and the pace rule, simulated on exact times: the bound
//! holds, a failing dependency runs at its floor without touching the
//! global capacity a healthy one needs, and tenants keep max-min fair
//! shares within a dependency.

use proptest::prelude::*;

use super::*;
use crate::bucket::pace::PaceConfig;
use crate::bucket::{TENANT_BACKLOG_FULL, TENANT_SHARE_EXHAUSTED};

const MS: Duration = Duration::from_millis(1);

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

/// Tokens a retry holds once admitted: granted now, or booked.
fn paid(answer: &Answer) -> bool {
    matches!(
        answer.admission,
        Admission::Granted | Admission::Deferred { .. }
    )
}

/// Over `seconds`, `asks` retries a second per (tenant, dependency), every
/// dependency in `successes` told of that many successes a second; the
/// retries paid per (tenant, dependency), and the answers' reasons.
fn simulate(
    deps: &mut Dependencies,
    global: &mut FairShares,
    from: u64,
    seconds: u64,
    asks: &[(&str, &str, u64)],
    successes: &[(&str, u64)],
) -> (HashMap<(String, String), u64>, Vec<&'static str>) {
    let mut paid_by = HashMap::new();
    let mut reasons = Vec::new();
    let step = 10 * MS;
    let steps = seconds * 100;
    for i in 0..steps {
        let now = Duration::from_secs(from) + step * u32::try_from(i).unwrap();
        for &(dependency, per_second) in successes {
            let n = (i + 1) * per_second / 100 - i * per_second / 100;
            if n > 0 {
                deps.count(dependency, now, n, n, 0);
            }
        }
        for &(tenant, dependency, per_second) in asks {
            // `per_second` asks spread over the second's 100 steps.
            let due = (i + 1) * per_second / 100 - i * per_second / 100;
            for _ in 0..due {
                let answer = deps.admit(global, tenant, dependency, now, Duration::from_secs(30));
                if paid(&answer) {
                    *paid_by
                        .entry((tenant.to_owned(), dependency.to_owned()))
                        .or_insert(0) += 1;
                }
                if let Admission::Deferred { reason, .. } | Admission::Refused { reason, .. } =
                    answer.admission
                {
                    reasons.push(reason);
                }
            }
        }
    }
    (paid_by, reasons)
}

fn get(map: &HashMap<(String, String), u64>, tenant: &str, dependency: &str) -> u64 {
    map.get(&(tenant.to_owned(), dependency.to_owned()))
        .copied()
        .unwrap_or(0)
}

#[test]
fn a_dependency_without_successes_runs_at_its_floor() {
    let (mut g, template) = global(1000.0);
    let mut deps = dependencies(&template);
    let (paid, reasons) = simulate(&mut deps, &mut g, 0, 20, &[("t", "down-api", 500)], &[]);
    let paid = get(&paid, "t", "down-api");
    // Floor 1/s over 20 s, its burst of one, and at most the horizon's
    // worth of bookings (2 s at 1/s) beyond: never more.
    assert!((19..=23).contains(&paid), "{paid}");
    assert!(
        reasons.contains(&DEPENDENCY_BUDGET_EXHAUSTED),
        "{reasons:?}"
    );
    let stats = deps.stats(Duration::from_secs(20));
    assert_eq!(stats[0].pace.rule, crate::budget::token::PaceRule::Floor);
}

#[test]
fn a_failing_dependency_never_defers_a_healthy_ones_retries() {
    let (mut g, template) = global(100.0);
    let mut deps = dependencies(&template);
    // B answers 1,000 successes a second: 100 retries a second allowed
    // once its window (5 s) has seen them. A answers none, and its workers
    // flood it with retries.
    simulate(&mut deps, &mut g, 0, 5, &[], &[("b", 1000)]);
    let (paid, reasons) = simulate(
        &mut deps,
        &mut g,
        5,
        30,
        &[("t", "a", 2000), ("t", "b", 50)],
        &[("b", 1000)],
    );
    assert_eq!(get(&paid, "t", "b"), 1500, "every retry to B, at once");
    assert!(get(&paid, "t", "a") <= 34, "A at its floor: {paid:?}");
    assert!(!reasons.contains(&GLOBAL_CAPACITY_EXHAUSTED), "{reasons:?}");
}

#[test]
fn a_dependency_that_comes_back_gets_retries_back_with_its_successes() {
    let (mut g, template) = global(1000.0);
    let mut deps = dependencies(&template);
    let ask = [("t", "api", 200)];
    let (down, _) = simulate(&mut deps, &mut g, 0, 10, &ask, &[]);
    // Back: 500 successes a second, so 50 retries a second once the
    // window (5 s) is full of them.
    let (up, _) = simulate(&mut deps, &mut g, 10, 10, &ask, &[("api", 500)]);
    let now = Duration::from_secs(20);
    let pace = deps.stats(now)[0].pace;
    // The second just begun counts whole, so the rate errs low.
    assert!((40.0..=50.0).contains(&pace.allowed), "{pace:?}");
    assert!(get(&down, "t", "api") <= 13, "{down:?}");
    assert!(get(&up, "t", "api") > 300, "{up:?}");
}

#[test]
fn tenants_share_a_dependency_max_min_fairly() {
    let (mut g, template) = global(1000.0);
    let mut deps = Dependencies::new(
        DependenciesConfig {
            default: PaceConfig {
                rate: Some(20.0),
                ..PaceConfig::default()
            },
            ..DependenciesConfig::default()
        },
        &template,
    )
    .unwrap();
    // Two tenants flood the one dependency, a third asks for little.
    let (paid, reasons) = simulate(
        &mut deps,
        &mut g,
        0,
        20,
        &[
            ("big", "api", 300),
            ("other", "api", 300),
            ("small", "api", 2),
        ],
        &[],
    );
    let (big, other, small) = (
        get(&paid, "big", "api"),
        get(&paid, "other", "api"),
        get(&paid, "small", "api"),
    );
    assert_eq!(small, 40, "the small tenant gets all it asks");
    assert!(big.abs_diff(other) <= 10, "{big} vs {other}");
    assert!(big + other + small <= 20 * 20 + 20 + 40 + 2, "{paid:?}");
    assert!(reasons.contains(&TENANT_SHARE_EXHAUSTED) || reasons.contains(&TENANT_BACKLOG_FULL));
}

#[test]
fn a_global_refusal_gives_the_dependencys_token_back() {
    let (mut g, template) = global(10.0);
    let mut deps = Dependencies::new(
        DependenciesConfig {
            default: PaceConfig {
                rate: Some(1000.0),
                ..PaceConfig::default()
            },
            ..DependenciesConfig::default()
        },
        &template,
    )
    .unwrap();
    // Past the global horizon every retry is refused there; the
    // dependency's level must not move for them.
    let mut refused = 0;
    for _ in 0..200 {
        let a = deps.admit(&mut g, "t", "api", Duration::ZERO, Duration::ZERO);
        if matches!(a.admission, Admission::Refused { .. }) {
            refused += 1;
            assert!(
                a.pace.is_none(),
                "the global bucket refused, not the dependency"
            );
        }
    }
    assert!(refused > 150);
    let e = &deps.entries[0];
    assert_eq!(e.counters.deferred, 0);
    assert!(e.shares.level(Duration::ZERO) > 900.0, "tokens given back");
}

#[test]
fn past_the_bound_new_dependencies_share_one_entry() {
    let (mut g, template) = global(1000.0);
    let mut deps = Dependencies::new(
        DependenciesConfig {
            max_dependencies: 2,
            ..DependenciesConfig::default()
        },
        &template,
    )
    .unwrap();
    for name in ["a", "b", "c", "d"] {
        deps.admit(&mut g, "t", name, Duration::ZERO, Duration::ZERO);
    }
    deps.admit(&mut g, "t", "", Duration::ZERO, Duration::ZERO);
    let names: Vec<_> = deps
        .stats(Duration::ZERO)
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["a", "b", OVERFLOW_DEPENDENCY]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the traffic, each dependency's retries paid by any time
    /// stay within its own bound (allowed rate over time, its burst, and
    /// the over-commit of two horizons), and all of them within the
    /// global one.
    #[test]
    fn the_nested_bounds_hold(
        rate in 5.0f64..200.0,
        asks in proptest::collection::vec((0usize..3, 0usize..3, 1u64..400), 1..6),
        successes in proptest::collection::vec(0u64..300, 3),
        seconds in 3u64..12,
    ) {
        let (mut g, template) = global(rate);
        let mut deps = dependencies(&template);
        let tenants = ["t0", "t1", "t2"];
        let names = ["d0", "d1", "d2"];
        let asks: Vec<_> = asks.iter().map(|&(t, d, n)| (tenants[t], names[d], n)).collect();
        let successes: Vec<_> = names.iter().zip(&successes).map(|(d, &s)| (*d, s)).collect();
        let (paid, _) = simulate(&mut deps, &mut g, 0, seconds, &asks, &successes);
        let horizon = template.max_reservation_ms as f64 / 1000.0;
        let t = seconds as f64;
        let mut total = 0;
        for (dependency, per_second) in &successes {
            // The allowed rate never exceeds 10% of the successes (or the
            // floor), as the window fills from zero.
            let allowed = (0.1 * *per_second as f64).max(1.0);
            let bound = allowed * (t + 2.0 * horizon) + allowed.floor().max(1.0) + 1.0;
            let got: u64 = tenants.iter().map(|tenant| get(&paid, tenant, dependency)).sum();
            prop_assert!(got as f64 <= bound, "{dependency}: {got} > {bound}");
            total += got;
        }
        let global_bound = rate * (t + 2.0 * horizon) + rate.floor() + 1.0;
        prop_assert!(total as f64 <= global_bound, "{total} > {global_bound}");
    }
}
