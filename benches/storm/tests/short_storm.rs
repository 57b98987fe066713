//! CI's short storm: the lab's main scenario on a 31 s timeline at C = 100,
//! asserting only what holds with a wide margin on a noisy 2-core machine:
//! naive retries keep the dependency down after the trigger is gone, and
//! retry-budget at its defaults (no flags: the adaptive budget per
//! dependency, docs/fairness.md) recovers, at under 1.3 dependency calls an
//! activity. The full lab is a benchmark (`benches/storm/run.sh`), never a
//! timed test.
//!
//! It runs the server built beside this test (`target/debug/retry-budget`),
//! which `cargo test --workspace` builds for the service's own tests.

use std::path::PathBuf;
use std::process::Command;
use std::thread;

use serde_json::Value;

/// The service binary of this build: `target/<profile>/retry-budget`,
/// beside `target/<profile>/deps/` where this test runs.
fn server_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary lives in target/<profile>/deps");
    let binary = profile.join(format!("retry-budget{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} is missing: run `cargo test --workspace`, or `cargo build --bin retry-budget` first",
        binary.display()
    );
    binary
}

fn storm(policy: &str, server: &PathBuf) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_retry-budget-storm"))
        .args([
            "--short",
            "--capacity",
            "100",
            "--seed",
            "7",
            "--policy",
            policy,
        ])
        .arg("--server-bin")
        .arg(server)
        .output()
        .expect("the storm binary runs");
    assert!(
        output.status.success(),
        "{policy}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let run: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    eprintln!(
        "{policy}: goodput before {} during {} last 10 s {}, recovery {}, calls/activity {:.2}, \
         lag p99 {:.1} ms max {:.1} ms starved {}",
        run["goodput_before"],
        run["goodput_during"],
        run["goodput_last10"],
        run["recovery_s"],
        run["amplification"].as_f64().unwrap_or(f64::NAN),
        run["lag_p99_ms"].as_f64().unwrap_or(f64::NAN),
        run["lag_max_ms"].as_f64().unwrap_or(f64::NAN),
        run["starved"],
    );
    run
}

#[test]
fn naive_retries_stay_down_and_the_default_budget_recovers() {
    let server = server_binary();
    // Both runs at once: CI waits for one run's 31 s, not two.
    let naive = {
        let server = server.clone();
        thread::spawn(move || storm("naive", &server))
    };
    let budget = storm("rb-default", &server);
    let naive = naive.join().expect("the naive run finishes");

    let before = naive["goodput_before"].as_f64().expect("a baseline");
    assert!(before > 60.0, "the baseline is about 80 a second: {before}");
    assert!(
        naive["recovery_s"].is_null(),
        "naive retries recovered: {}",
        naive["recovery_s"]
    );
    let last = naive["goodput_last10"].as_f64().expect("a tail");
    assert!(
        last < 0.5 * before,
        "naive retries keep goodput down after the trigger: {last} of {before}"
    );

    // Back: the last 10 s at 90% of the baseline or more (the 10 s hold of
    // `recovery_s` may not fit in the short run's 20 s after the trigger).
    let budget_last = budget["goodput_last10"].as_f64().expect("a tail");
    assert!(
        budget_last >= 0.9 * before,
        "retry-budget at its defaults did not recover: last 10 s {budget_last} of {before}"
    );
    let amplification = budget["amplification"]
        .as_f64()
        .expect("calls per activity");
    assert!(
        amplification < 1.3,
        "retry-budget at its defaults amplified load {amplification}x"
    );
    assert_eq!(
        budget["service_errors"], 0,
        "every call to the server answered"
    );
}
