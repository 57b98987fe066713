//! The split's properties: targets within the rate, weighted max-min, the
//! same share wherever a tenant's traffic lands, and grants within what the
//! others leave.

use proptest::prelude::*;

use super::*;

fn config(rate: f64, burst: u32) -> BucketConfig {
    BucketConfig {
        rate,
        burst,
        weights: [("gold".to_owned(), 3)].into(),
        ..BucketConfig::default()
    }
}

fn view(demand: &[(&str, f64)], granted_rate: f64) -> ReplicaView {
    ReplicaView {
        demand: Demand {
            tenants: demand.iter().map(|(t, d)| ((*t).to_owned(), *d)).collect(),
            ..Demand::default()
        },
        granted_rate,
    }
}

/// Each claim's share, by name (named tenants only).
fn shares(config: &BucketConfig, replicas: &[ReplicaView]) -> BTreeMap<String, f64> {
    let s = split(config, replicas);
    s.named
        .iter()
        .map(|(t, &i)| ((*t).to_owned(), s.claims[i].share))
        .collect()
}

#[test]
fn a_pinned_tenant_and_a_spread_one_get_the_same_share() {
    let c = config(90.0, 90);
    let replicas = [
        view(&[("pinned", 300.0), ("spread", 100.0)], 30.0),
        view(&[("spread", 100.0)], 30.0),
        view(&[("spread", 100.0)], 30.0),
    ];
    let s = shares(&c, &replicas);
    assert_eq!((s["pinned"], s["spread"]), (45.0, 45.0));
    let t = split(&c, &replicas).targets;
    assert_eq!(t, [45.0 + 15.0, 15.0, 15.0], "no spare: the needs alone");
    let g = allocate(&c, &replicas, 0);
    assert_eq!(
        (g.rate, g.target, g.burst),
        (30.0, 60.0, 30),
        "the others hold 60"
    );
    assert!(g.weights["pinned"] > 2 * g.weights["spread"]);
}

#[test]
fn small_demands_are_met_and_the_rest_shared_by_weight() {
    let c = config(100.0, 100);
    let replicas = [
        view(&[("small", 10.0), ("gold", 500.0)], 0.0),
        view(&[("lead", 500.0)], 0.0),
    ];
    let s = shares(&c, &replicas);
    assert_eq!(s["small"], 10.0);
    assert!((s["gold"] - 67.5).abs() < 1e-9, "{s:?}");
    assert!((s["lead"] - 22.5).abs() < 1e-9, "{s:?}");
}

#[test]
fn capacity_nobody_asks_for_is_split_evenly_with_a_part_left_and_a_newcomer_weighs_like_a_saturated_tenant()
 {
    let c = config(100.0, 100);
    let replicas = [view(&[("a", 10.0)], 0.0), view(&[], 0.0)];
    assert_eq!(split(&c, &replicas).targets, [10.0 + 30.0, 30.0]);
    let g = allocate(&c, &replicas, 1);
    assert_eq!((g.rate, g.burst), (30.0, 30));
    assert!(g.default_weight > 0);
    let gold = i64::from(g.weights["gold"]);
    assert!((gold - 3 * i64::from(g.default_weight)).abs() <= 3, "{g:?}");
}

#[test]
fn a_lone_replica_holds_its_need_and_half_the_spare() {
    let c = config(100.0, 100);
    let g = allocate(&c, &[view(&[], 0.0)], 0);
    assert_eq!((g.rate, g.burst, g.target), (50.0, 50, 50.0));
    // Demand grows to 60: its need and half the spare left, at once.
    let g = allocate(&c, &[view(&[("a", 60.0)], 50.0)], 0);
    assert_eq!((g.rate, g.burst, g.target), (80.0, 80, 80.0));
    let g = allocate(&c, &[view(&[("a", 600.0)], 100.0)], 0);
    assert_eq!((g.rate, g.burst, g.target), (100.0, 100, 100.0));
}

/// The issue this rule exists for: the first replica to start must not
/// hold the budget the next ones need. Three replicas started one after
/// the other, nothing asked yet: each is granted its whole target at its
/// first interval, and something is still left.
#[test]
fn replicas_that_start_one_after_the_other_are_each_granted_at_once() {
    let c = config(100_000.0, 100_000);
    let mut replicas: Vec<ReplicaView> = Vec::new();
    for n in 1..=4 {
        replicas.push(view(&[], 0.0));
        let me = replicas.len() - 1;
        let g = allocate(&c, &replicas, me);
        assert!(g.rate > 0.0, "replica {n} granted nothing");
        replicas[me].granted_rate = g.rate;
        let held: f64 = replicas.iter().map(|r| r.granted_rate).sum();
        assert!(held < c.rate, "replica {n}: {held} held of {}", c.rate);
    }
    // Started together (none has lowered yet), each took half of what was
    // left: all positive.
    let rates: Vec<f64> = replicas.iter().map(|r| r.granted_rate).collect();
    assert_eq!(rates, [50_000.0, 25_000.0, 12_500.0, 6_250.0]);
    // At their next intervals they settle on even parts, a fifth left.
    for _ in 0..4 {
        for me in 0..replicas.len() {
            let g = allocate(&c, &replicas, me);
            replicas[me].granted_rate = g.rate;
        }
    }
    let rates: Vec<f64> = replicas.iter().map(|r| r.granted_rate).collect();
    assert!(
        rates.iter().all(|&r| (r - 20_000.0).abs() < 1.0),
        "{rates:?}"
    );
}

fn replicas_strategy() -> impl Strategy<Value = Vec<ReplicaView>> {
    let tenant = prop::sample::select(vec!["a", "b", "c", "d", "gold"]);
    let demand = prop::collection::vec((tenant, 0.0..400.0f64), 0..5);
    let replica = (demand, 0.0..100.0f64, 0.0..50.0f64, 0u32..5).prop_map(
        |(demand, granted_rate, rest_rate, rest_tenants)| {
            let mut tenants: BTreeMap<String, f64> = BTreeMap::new();
            for (t, d) in demand {
                tenants.insert(t.to_owned(), d);
            }
            ReplicaView {
                demand: Demand {
                    tenants: tenants.into_iter().collect(),
                    rest_rate: if rest_tenants > 0 { rest_rate } else { 0.0 },
                    rest_tenants,
                    saturated: Vec::new(),
                    dependencies: Vec::new(),
                },
                granted_rate,
            }
        },
    );
    prop::collection::vec(replica, 1..6)
}

proptest! {
    #[test]
    fn targets_leave_one_part_of_the_spare_and_shares_are_weighted_max_min(
        replicas in replicas_strategy(),
        rate in 1.0..500.0f64,
    ) {
        let c = config(rate, 50);
        let s = split(&c, &replicas);
        let targets: f64 = s.targets.iter().sum();
        let demand: f64 = s.claims.iter().map(Claim::total).sum();
        let given: f64 = s.claims.iter().map(|c| c.share).sum();
        prop_assert!((given - demand.min(rate)).abs() <= 1e-6 * rate);
        let left = (rate - given) / (replicas.len() + 1) as f64;
        prop_assert!(
            (rate - targets - left).abs() <= 1e-6 * rate,
            "targets {targets} of {rate}: {left} should be left"
        );
        // No claim gets more than it asks; one held back gets at least as
        // much per weight as any other.
        for a in &s.claims {
            prop_assert!(a.share <= a.total() + 1e-9);
            if a.share < a.total() - 1e-9 {
                for b in &s.claims {
                    prop_assert!(b.share / b.weight <= a.share / a.weight + 1e-9);
                }
            }
        }
    }

    #[test]
    fn a_grant_never_exceeds_what_the_others_leave_nor_the_target(
        replicas in replicas_strategy(),
        rate in 1.0..500.0f64,
    ) {
        let c = config(rate, 50);
        for me in 0..replicas.len() {
            let g = allocate(&c, &replicas, me);
            let others: f64 = replicas
                .iter()
                .enumerate()
                .filter(|&(r, _)| r != me)
                .map(|(_, v)| v.granted_rate)
                .sum();
            prop_assert!(g.rate >= 0.0 && g.rate <= g.target + 1e-9);
            prop_assert!(g.rate <= (rate - others).max(0.0) + 1e-9);
            prop_assert!(f64::from(g.burst) <= 50.0 * g.rate / rate + 1e-9);
        }
    }

    /// A replica that joins replicas holding their targets is granted its
    /// whole target at its first interval, whatever they ask: the spare's
    /// last part is never held. And one whose demand grows while the
    /// others hold their targets gets at once as much as was left.
    #[test]
    fn a_newcomer_or_a_growing_replica_takes_what_is_left_without_waiting(
        replicas in replicas_strategy(),
        rate in 1.0..500.0f64,
        grown in 0.0..1000.0f64,
    ) {
        let c = config(rate, 50);
        let targets = split(&c, &replicas).targets;
        let mut settled = replicas.clone();
        for (replica, target) in settled.iter_mut().zip(targets) {
            replica.granted_rate = target;
        }
        let held: f64 = settled.iter().map(|r| r.granted_rate).sum();
        let left = rate - held;
        let mut joined = settled.clone();
        joined.push(view(&[], 0.0));
        let newcomer = allocate(&c, &joined, joined.len() - 1);
        prop_assert!(
            newcomer.rate >= newcomer.target.min(left / 2.0) - 1e-6 * rate,
            "granted {} of its target {}, {left} left", newcomer.rate, newcomer.target
        );
        prop_assert!(left <= 1e-9 * rate || newcomer.rate > 0.0, "{left} left, none granted");
        let mut growing = settled.clone();
        growing[0].demand.tenants.push(("z".into(), grown));
        let g = allocate(&c, &growing, 0);
        let want = if settled[0].granted_rate > 0.0 {
            g.target.min(settled[0].granted_rate + left)
        } else {
            g.target.min(left / 2.0)
        };
        prop_assert!(g.rate >= want - 1e-6 * rate, "{} < {want}", g.rate);
    }

    /// The same tenant's demand, all on one replica or spread evenly over
    /// all, gets the same share.
    #[test]
    fn where_the_traffic_lands_does_not_change_the_share(
        n in 1usize..6,
        pinned in 1.0..300.0f64,
        spread in 1.0..300.0f64,
        other in 0.0..300.0f64,
        rate in 1.0..300.0f64,
    ) {
        let c = config(rate, 50);
        let mut replicas: Vec<ReplicaView> = (0..n)
            .map(|_| view(&[("s", spread / n as f64)], 0.0))
            .collect();
        replicas[0].demand.tenants.push(("p".into(), pinned));
        replicas[n - 1].demand.tenants.push(("o".into(), other));
        let s = shares(&c, &replicas);
        let fair = |d: f64| d.min(s["p"].max(s["s"]));
        prop_assert!((s["p"] - fair(pinned)).abs() < 1e-6);
        prop_assert!((s["s"] - fair(spread)).abs() < 1e-6);
    }
}

/// Workers wait out their deferrals, so a tenant held back asks only about
/// what it gets: the pinned tenant, deferred on its one replica, asks less
/// than the spread one, which finds spare tokens elsewhere. Both held
/// back, both get half.
#[test]
fn a_tenant_held_back_claims_its_fair_share_whatever_it_asked() {
    let config = BucketConfig {
        rate: 30.0,
        burst: 10,
        ..BucketConfig::default()
    };
    let held_back = |mut v: ReplicaView, tenants: &[&str]| {
        v.demand.saturated = tenants.iter().map(|t| (*t).to_owned()).collect();
        v
    };
    let replicas = [
        held_back(
            view(&[("pinned", 6.0), ("spread", 3.0)], 10.0),
            &["pinned", "spread"],
        ),
        view(&[("spread", 10.0)], 10.0),
        view(&[("spread", 10.0)], 10.0),
    ];
    let grants: Vec<_> = (0..3).map(|me| allocate(&config, &replicas, me)).collect();
    let targets: f64 = grants.iter().map(|g| g.target).sum();
    assert!((targets - 30.0).abs() < 1e-9, "no spare: {targets}");
    // The pinned tenant's half is all on the first replica; the spread
    // tenant's half is split evenly, not by what it managed to ask.
    assert!(
        (grants[0].target - 20.0).abs() < 1e-9,
        "{}",
        grants[0].target
    );
    assert!(
        (grants[1].target - 5.0).abs() < 1e-9,
        "{}",
        grants[1].target
    );
}

/// Demand that jumps tenfold on one replica, above what is left: it takes
/// what is unclaimed at its next interval, the others lower to their new
/// targets at theirs, and it holds its fair share by its second interval,
/// whichever order the replicas' intervals run in.
#[test]
fn demand_that_jumps_gets_its_fair_share_within_two_intervals() {
    let c = BucketConfig {
        rate: 100.0,
        burst: 100,
        ..BucketConfig::default()
    };
    for order in [[0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]] {
        let mut replicas = vec![
            view(&[("a", 10.0)], 0.0),
            view(&[("b", 10.0)], 0.0),
            view(&[("c", 10.0)], 0.0),
        ];
        // Settled: each holds its need and a quarter of the spare.
        for _ in 0..4 {
            for me in 0..3 {
                replicas[me].granted_rate = allocate(&c, &replicas, me).rate;
            }
        }
        assert!((replicas[0].granted_rate - 27.5).abs() < 1e-9);
        replicas[0].demand.tenants = vec![("a".into(), 100.0)];
        let mut held = Vec::new();
        for _ in 0..2 {
            for &me in &order {
                replicas[me].granted_rate = allocate(&c, &replicas, me).rate;
            }
            held.push(replicas[0].granted_rate);
            let total: f64 = replicas.iter().map(|r| r.granted_rate).sum();
            assert!(total <= c.rate + 1e-9, "{total}");
        }
        // Max-min: b and c keep their 10, a gets the 80 left.
        assert!((held[1] - 80.0).abs() < 1e-9, "order {order:?}: {held:?}");
    }
}
