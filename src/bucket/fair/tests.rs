//! The algorithm's unit tests: exact slots on exact times, and a property
//! test of the over-commit bound.

use super::*;
use crate::bucket::{
    Capacity, GLOBAL_CAPACITY_EXHAUSTED, RESERVATION_PAST_MAX_WAIT, TENANT_BACKLOG_FULL,
    TENANT_SHARE_EXHAUSTED,
};

const MS: Duration = Duration::from_millis(1);

fn shares(rate: f64, burst: u32) -> FairShares {
    FairShares::new(&BucketConfig {
        rate,
        burst,
        ..BucketConfig::default()
    })
    .unwrap()
}

fn wait(a: Booking) -> Duration {
    match a {
        Booking::Booked { wait, .. } => wait,
        other => panic!("expected a deferral, got {other:?}"),
    }
}

#[test]
fn a_lone_tenant_gets_the_burst_then_the_rate() {
    let mut b = shares(10.0, 3);
    for _ in 0..3 {
        assert_eq!(
            b.admit("a", Duration::ZERO, Duration::MAX),
            Booking::Granted
        );
    }
    let a = b.admit("a", Duration::ZERO, Duration::MAX);
    assert_eq!(
        a,
        Booking::Booked {
            wait: 100 * MS,
            reason: GLOBAL_CAPACITY_EXHAUSTED
        }
    );
    assert_eq!(wait(b.admit("a", Duration::ZERO, Duration::MAX)), 200 * MS);
    assert!(b.take("a", 150 * MS).is_none(), "both refills are booked");
}

#[test]
fn consecutive_deferrals_are_spaced_by_the_share_interval() {
    let mut b = shares(100.0, 1);
    // Two tenants backlogged: each gets one token every 20 ms.
    assert!(b.take("a", Duration::ZERO).is_some());
    assert!(b.take("b", Duration::ZERO).is_some());
    let waits: Vec<_> = (0..5)
        .map(|_| wait(b.admit("a", Duration::ZERO, Duration::MAX)))
        .collect();
    assert_eq!(waits, [10, 30, 50, 70, 90].map(|m| m * MS));
    let a = b.admit("b", Duration::ZERO, Duration::MAX);
    assert_eq!(
        a,
        Booking::Booked {
            wait: 20 * MS,
            reason: TENANT_SHARE_EXHAUSTED
        }
    );
}

#[test]
fn a_newcomer_is_granted_at_once_through_a_flood() {
    let mut b = shares(100.0, 10);
    let now = Duration::from_secs(1);
    let mut booked = 0;
    while let Booking::Booked { .. } | Booking::Granted = b.admit("flood", now, Duration::MAX) {
        booked += 1;
    }
    assert!(booked > 150, "the flood booked its horizon: {booked}");
    assert!(b.level(now) < -100.0);
    assert_eq!(b.admit("new", now, Duration::MAX), Booking::Granted);
}

#[test]
fn refusals_past_the_horizon_take_turns_one_share_interval_apart() {
    let mut b = FairShares::new(&BucketConfig {
        rate: 100.0,
        burst: 1,
        max_reservation_ms: 100,
        ..BucketConfig::default()
    })
    .unwrap();
    let mut retry = Vec::new();
    for _ in 0..40 {
        if let Booking::Refused {
            retry_after,
            reason,
        } = b.admit("a", Duration::ZERO, Duration::MAX)
        {
            assert_eq!(reason, TENANT_BACKLOG_FULL);
            retry.push(retry_after);
        }
    }
    assert_eq!(retry.len(), 40 - 1 - 10, "one grant, ten slots booked");
    let want: Vec<_> = (1..=29).map(|k| k * 10 * MS).collect();
    assert_eq!(retry, want, "each refused request gets its own turn");
    // The first comes back at its turn and finds a slot.
    assert_eq!(wait(b.admit("a", 10 * MS, Duration::MAX)), 100 * MS);
    // A caller that cannot wait for its turn takes none.
    let a = b.admit("a", 10 * MS, 50 * MS);
    assert_eq!(
        a,
        Booking::Refused {
            retry_after: 290 * MS,
            reason: RESERVATION_PAST_MAX_WAIT
        }
    );
    let a = b.admit("a", 10 * MS, Duration::MAX);
    assert!(matches!(a, Booking::Refused { retry_after, .. } if retry_after == 290 * MS));
}

#[test]
fn max_wait_refuses_without_booking() {
    let mut b = shares(10.0, 1);
    assert_eq!(
        b.admit("a", Duration::ZERO, Duration::MAX),
        Booking::Granted
    );
    let a = b.admit("a", Duration::ZERO, 50 * MS);
    assert_eq!(
        a,
        Booking::Refused {
            retry_after: 100 * MS,
            reason: RESERVATION_PAST_MAX_WAIT
        }
    );
    assert_eq!(wait(b.admit("a", Duration::ZERO, Duration::MAX)), 100 * MS);
}

#[test]
fn a_returned_token_goes_back_to_the_bucket_and_the_share() {
    let mut b = shares(10.0, 1);
    let grant = b.take("a", Duration::ZERO).unwrap();
    assert!(b.take("a", Duration::ZERO).is_none());
    b.release(grant, Duration::ZERO);
    assert_eq!(b.level(Duration::ZERO), 1.0);
    assert!(
        b.take("a", Duration::ZERO).is_some(),
        "idle again, and a token"
    );
    assert_eq!(b.tenants().find(|t| t.0 == "a").map(|t| t.2), Some(1));
}

#[test]
fn a_token_returned_after_eviction_touches_only_the_bucket() {
    let mut b = FairShares::new(&BucketConfig {
        max_tenants: 1,
        ..BucketConfig::default()
    })
    .unwrap();
    let grant = b.take("a", Duration::ZERO).unwrap();
    let later = Duration::from_secs(1);
    assert!(b.take("b", later).is_some(), "a is idle and evicted");
    b.release(grant, later);
    assert_eq!(b.tenants().find(|t| t.0 == "b").map(|t| t.2), Some(1));
}

#[test]
fn success_deposits_refill_up_to_the_burst() {
    let mut b = FairShares::new(&BucketConfig {
        rate: 1.0,
        burst: 2,
        success_deposit: 0.5,
        max_reservation_ms: 2000,
        ..BucketConfig::default()
    })
    .unwrap();
    b.admit("a", Duration::ZERO, Duration::MAX);
    b.admit("a", Duration::ZERO, Duration::MAX);
    assert_eq!(b.level(Duration::ZERO), 0.0);
    b.deposit_success(Duration::ZERO);
    b.deposit_success(Duration::ZERO);
    assert_eq!(b.level(Duration::ZERO), 1.0);
    for _ in 0..10 {
        b.deposit_success(Duration::ZERO);
    }
    assert_eq!(b.level(Duration::ZERO), 2.0);
}

#[test]
fn weights_set_the_spacing() {
    let mut b = FairShares::new(&BucketConfig {
        rate: 100.0,
        burst: 1,
        weights: [("gold".to_owned(), 3)].into(),
        ..BucketConfig::default()
    })
    .unwrap();
    b.take("gold", Duration::ZERO);
    b.take("lead", Duration::ZERO);
    // W = 4: gold one token every 4/3 * 10 ms, lead every 40 ms.
    let g1 = wait(b.admit("gold", Duration::ZERO, Duration::MAX));
    let g2 = wait(b.admit("gold", Duration::ZERO, Duration::MAX));
    let l1 = wait(b.admit("lead", Duration::ZERO, Duration::MAX));
    let l2 = wait(b.admit("lead", Duration::ZERO, Duration::MAX));
    assert_eq!(g2 - g1, Duration::from_nanos(13_333_333));
    assert_eq!(l2 - l1, 40 * MS);
}

#[test]
fn tenants_past_the_bound_share_one_entry() {
    let mut b = FairShares::new(&BucketConfig {
        rate: 100.0,
        burst: 1,
        max_tenants: 1,
        ..BucketConfig::default()
    })
    .unwrap();
    assert!(b.take("a", Duration::ZERO).is_some());
    assert!(
        b.take("b", Duration::ZERO).is_some(),
        "b gets the overflow's share"
    );
    assert_eq!(
        b.admit("c", Duration::ZERO, Duration::MAX),
        Booking::Booked {
            wait: 20 * MS,
            reason: TENANT_SHARE_EXHAUSTED
        },
        "c shares it with b"
    );
    assert_eq!(b.tracked_tenants(), 1);
    let overflow: Vec<_> = b.tenants().take(1).collect();
    assert_eq!(overflow, [(super::super::OVERFLOW_TENANT, 1, 2)]);
    assert_eq!(
        b.take_named("c", Duration::ZERO).1,
        None,
        "c is not tracked"
    );
    assert_eq!(b.take_named("a", Duration::ZERO).1.as_deref(), Some("a"));
}

proptest::proptest! {
    /// Whatever the requests, returns and deposits, the tokens taken
    /// stay within `burst + rate * (t + 2 * horizon)` plus deposits.
    #[test]
    fn the_over_commit_bound_holds(
        ops in proptest::collection::vec((0u8..6, 0u8..4, 0u64..30), 1..400),
    ) {
        let config = BucketConfig {
            rate: 50.0,
            burst: 5,
            success_deposit: 0.5,
            max_reservation_ms: 200,
            max_tenants: 3,
            ..BucketConfig::default()
        };
        let mut b = FairShares::new(&config).unwrap();
        let names = ["a", "b", "c", "d", "e", "f"];
        let (mut now, mut taken, mut deposits) = (Duration::ZERO, 0.0, 0.0);
        let mut held = Vec::new();
        for (tenant, op, dt) in ops {
            now += Duration::from_millis(dt);
            let tenant = names[usize::from(tenant)];
            match op {
                0 => {
                    if let Some(g) = b.take(tenant, now) {
                        taken += 1.0;
                        held.push(g);
                    }
                }
                1 => {
                    if let Booking::Granted | Booking::Booked { .. } =
                        b.admit(tenant, now, Duration::MAX)
                    {
                        taken += 1.0;
                    }
                }
                2 => {
                    if let Some(g) = held.pop() {
                        b.release(g, now);
                        taken -= 1.0;
                    }
                }
                _ => {
                    b.deposit_success(now);
                    deposits += config.success_deposit;
                }
            }
            let bound = f64::from(config.burst)
                + config.rate * (now.as_secs_f64() + 2.0 * 0.2)
                + deposits;
            proptest::prop_assert!(taken <= bound + 1e-6, "{taken} > {bound}");
            proptest::prop_assert!(b.level(now) >= -config.rate * 0.4 - 1e-6);
        }
    }
}

fn capacity(rate: f64, burst: u32) -> Capacity {
    Capacity {
        rate,
        burst,
        ..Capacity::from_config(&BucketConfig::default())
    }
}

#[test]
fn a_lower_capacity_drops_tokens_past_its_burst_and_refills_at_its_rate_at_once() {
    let mut b = shares(10.0, 10);
    b.set_capacity(&capacity(1.0, 2), Duration::ZERO);
    assert_eq!(b.level(Duration::ZERO), 2.0);
    assert!(b.take("a", Duration::ZERO).is_some());
    assert_eq!(b.level(Duration::ZERO), 1.0);
    assert_eq!(b.level(500 * MS), 1.5, "one token a second now");
    assert_eq!(
        b.level(Duration::from_secs(9)),
        2.0,
        "at most the new burst"
    );
}

#[test]
fn tokens_promised_stay_promised_and_are_paid_at_the_new_rate() {
    let mut b = shares(100.0, 1);
    while let Booking::Granted | Booking::Booked { .. } =
        b.admit("flood", Duration::ZERO, Duration::MAX)
    {}
    let owed = b.level(Duration::ZERO);
    assert!(owed < -100.0, "{owed}");
    b.set_capacity(&capacity(50.0, 1), Duration::ZERO);
    assert_eq!(b.level(Duration::ZERO), owed);
    // At half the rate the debt takes twice as long to pay.
    let paid_at = Duration::from_secs_f64(-owed / 50.0);
    assert!(b.level(paid_at - 20 * MS) < 0.0);
    assert!(b.level(paid_at + 20 * MS) > 0.0);
    // The flood's next slot was stretched with the rate: twice as far.
    let Booking::Refused { retry_after, .. } = b.admit("flood", Duration::ZERO, Duration::MAX)
    else {
        panic!("the flood is past its horizon");
    };
    assert!(retry_after > Duration::from_secs(1), "{retry_after:?}");
}

#[test]
fn a_closed_bucket_refuses_everything_until_it_is_given_a_rate() {
    let mut b = shares(10.0, 5);
    b.set_capacity(&Capacity::closed(Duration::from_secs(1)), Duration::ZERO);
    assert!(b.is_closed());
    assert!(b.take("a", Duration::ZERO).is_none());
    let refused = Booking::Refused {
        retry_after: Duration::from_secs(1),
        reason: GLOBAL_CAPACITY_EXHAUSTED,
    };
    assert_eq!(b.admit("a", Duration::from_secs(5), Duration::MAX), refused);
    assert_eq!(
        b.admit("b", Duration::from_secs(5), Duration::ZERO),
        refused
    );
    assert_eq!(
        b.admit("a", Duration::from_secs(5), 10 * MS),
        Booking::Refused {
            retry_after: Duration::from_secs(1),
            reason: RESERVATION_PAST_MAX_WAIT,
        }
    );
    assert_eq!(b.level(Duration::from_secs(60)), 0.0, "nothing refills");
    b.set_capacity(&capacity(10.0, 5), Duration::from_secs(60));
    assert!(!b.is_closed());
    assert_eq!(b.level(Duration::from_secs(60)), 0.0, "it opens empty");
    assert_eq!(b.level(Duration::from_secs(61)), 5.0);
    assert_eq!(
        b.admit("a", Duration::from_secs(61), Duration::MAX),
        Booking::Granted
    );
}

#[test]
fn new_weights_apply_to_tenants_already_backlogged() {
    let mut b = shares(100.0, 1);
    b.take("gold", Duration::ZERO);
    b.take("lead", Duration::ZERO);
    let mut c = capacity(100.0, 1);
    c.weights.insert("gold".to_owned(), 3);
    b.set_capacity(&c, Duration::ZERO);
    // W = 4, as if configured so from the start (`weights_set_the_spacing`).
    let g1 = wait(b.admit("gold", Duration::ZERO, Duration::MAX));
    let g2 = wait(b.admit("gold", Duration::ZERO, Duration::MAX));
    let l1 = wait(b.admit("lead", Duration::ZERO, Duration::MAX));
    let l2 = wait(b.admit("lead", Duration::ZERO, Duration::MAX));
    assert_eq!(g2 - g1, Duration::from_nanos(13_333_333));
    assert_eq!(l2 - l1, 40 * MS);
}

#[test]
fn demand_counts_every_token_asked_for_once_and_is_reset_when_read() {
    let mut b = shares(10.0, 1);
    let g = b.take("a", Duration::ZERO).unwrap(); // granted: 1
    assert!(b.take("a", Duration::ZERO).is_none()); // not taken: not asked yet
    b.admit("a", Duration::ZERO, Duration::MAX); // deferred: 2
    b.admit("a", Duration::ZERO, Duration::ZERO); // refused: 3
    b.release(g, Duration::ZERO);
    b.set_capacity(&Capacity::closed(Duration::from_secs(1)), Duration::ZERO);
    b.admit("b", Duration::ZERO, Duration::MAX); // closed, still demand
    let mut demand = Vec::new();
    b.take_demand(|t, n, _| demand.push((t.to_owned(), n)));
    assert_eq!(demand, [("a".to_owned(), 3), ("b".to_owned(), 1)]);
    demand.clear();
    b.take_demand(|t, n, _| demand.push((t.to_owned(), n)));
    assert!(demand.is_empty());
}

proptest::proptest! {
    /// With the capacity changed at any time (closed included), the tokens
    /// taken stay within the refill paid at the rates in force, plus the
    /// largest burst and the over-commit bound at the largest rate.
    #[test]
    fn the_bound_holds_across_capacity_changes(
        ops in proptest::collection::vec((0u8..4, 0u8..5, 0u64..30), 1..400),
    ) {
        let rates = [0.0, 10.0, 50.0, 100.0];
        let config = BucketConfig {
            rate: 50.0,
            burst: 5,
            max_reservation_ms: 200,
            max_tenants: 3,
            ..BucketConfig::default()
        };
        let mut b = FairShares::new(&config).unwrap();
        let (mut now, mut taken, mut paid, mut rate) = (Duration::ZERO, 0.0, 0.0, 50.0);
        let mut held = Vec::new();
        for (tenant, op, dt) in ops {
            let step = Duration::from_millis(dt);
            paid += rate * step.as_secs_f64();
            now += step;
            match op {
                0 => {
                    if let Some(g) = b.take(["a", "b", "c", "d"][usize::from(tenant)], now) {
                        taken += 1.0;
                        held.push(g);
                    }
                }
                1 | 2 => {
                    if let Booking::Granted | Booking::Booked { .. } =
                        b.admit(["a", "b", "c", "d"][usize::from(tenant)], now, Duration::MAX)
                    {
                        taken += 1.0;
                    }
                }
                3 => {
                    if let Some(g) = held.pop() {
                        b.release(g, now);
                        taken -= 1.0;
                    }
                }
                _ => {
                    rate = rates[usize::from(tenant)];
                    b.set_capacity(&capacity(rate, u32::from(tenant) * 2), now);
                }
            }
            let bound = 6.0 + paid + 100.0 * 2.0 * 0.2;
            proptest::prop_assert!(taken <= bound + 1e-6, "{taken} > {bound}");
        }
    }
}

/// A reload that widens the bucket: a slot booked before stays booked, and
/// the next request is granted at the new rate at once.
#[test]
fn a_wider_capacity_grants_at_once_and_keeps_what_was_booked() {
    let config = BucketConfig {
        rate: 1.0,
        burst: 1,
        max_reservation_ms: 60_000,
        ..BucketConfig::default()
    };
    let mut b = FairShares::new(&config).unwrap();
    let t = Duration::from_secs(10);
    assert_eq!(b.admit("acme", t, Duration::MAX), Booking::Granted);
    assert!(matches!(
        b.admit("acme", t, Duration::MAX),
        Booking::Booked { .. }
    ));
    let wide = BucketConfig {
        rate: 1000.0,
        burst: 1000,
        ..config
    };
    b.set_capacity(&Capacity::from_config(&wide), t);
    let after = b.admit("acme", t + Duration::from_millis(5), Duration::MAX);
    assert_eq!(after, Booking::Granted, "{after:?}");
}
