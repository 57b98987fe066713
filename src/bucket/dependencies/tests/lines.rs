//! The lines: deferred retries go oldest first, before fresh failures, a
//! re-ask is told a sooner turn once the pace rises, and a global refusal
//! keeps the place in line.

use super::*;
use crate::bucket::GLOBAL_CAPACITY_EXHAUSTED;

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
