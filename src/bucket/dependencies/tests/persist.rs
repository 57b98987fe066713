//! The pace persisted: it survives a snapshot and a restore.

use super::*;

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
    let down = granted_at(
        &mut restarted,
        &mut g2,
        "t",
        "down",
        true,
        (0..50u32).map(|i| t1 + i * MS),
    );
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
    let busy = granted_at(
        &mut restarted,
        &mut g3,
        "t",
        "busy",
        false,
        (0..50u32).map(|i| t1 + 20 * S + i * MS),
    );
    assert!(
        busy >= 45,
        "{busy} of 50 retried where it was paced at 200 a second"
    );
}

#[test]
fn a_recoverys_threshold_survives_and_a_bad_one_is_dropped() {
    use crate::budget::token::{HealthState, PaceRecord, TenantPaceRecord};
    let (_, config) = global(100.0);
    let tenant = |name: &str, threshold| TenantPaceRecord {
        tenant: name.into(),
        allowance: 30.0,
        baseline: 1.0,
        state: HealthState::Recovering,
        success_rate: 0.0,
        threshold,
    };
    let records = [PaceRecord {
        dependency: "payments".into(),
        allowance: 30.0,
        state: HealthState::Recovering,
        saved_at_ms: 1_000,
        tenants: vec![
            tenant("a", Some(40.0)),
            tenant("b", Some(f64::NAN)),
            tenant("c", Some(0.5)),
            tenant("d", Some(1e12)),
        ],
    }];
    let mut restarted = dependencies(&config);
    let t1 = Duration::from_secs(3);
    restarted.restore(&records, t1);
    let saved = restarted.snapshot(t1, 2_000);
    let thresholds: Vec<_> = saved[0]
        .tenants
        .iter()
        .map(|t| (t.tenant.as_str(), t.threshold))
        .collect();
    assert_eq!(
        thresholds,
        [
            ("a", Some(40.0)),
            ("b", None),
            ("c", None),
            ("d", Some(100.0))
        ],
        "kept, then not a number and under the floor dropped, over the cap capped"
    );
}
