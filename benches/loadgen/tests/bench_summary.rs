//! The rules of the bench scripts that the figures in BENCHMARKS.md rest on
//! (`benches/test_summary.py`: the verdicts, the PostgreSQL ratios, the soak's
//! counters, callgrind's dumps), run here so that `cargo test --workspace`
//! runs every test of the project. Without `python3` the test says it was
//! skipped, and fails under `CI=true`.

use std::process::Command;

#[test]
fn bench_summary_rules() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../test_summary.py");
    match Command::new("python3").arg(script).output() {
        Ok(out) => assert!(
            out.status.success(),
            "{script} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none_or(|ci| ci != "true"),
                "python3 is needed for {script} in CI"
            );
            eprintln!("skipped: python3 not found, {script} not run");
        }
        Err(e) => panic!("cannot run python3 {script}: {e}"),
    }
}
