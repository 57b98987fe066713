//! The rules of the benchmark scripts that the figures in BENCHMARKS.md rest
//! on: the verdicts of the summary (`benches/summarize.py`), the reading of
//! callgrind's dumps with their simulated cache misses
//! (`benches/callgrind_summary.py`), the table of every target across runs
//! (`benches/across.py`), the PostgreSQL targets' ratios and CPU a decision
//! (`benches/pg_summary.py`) and the soak's quantiles from the server's
//! histograms (`benches/soak_summary.py`). Their Python tests run here so that
//! `cargo test --workspace` runs every test of the project.
//! Without `python3` each test says it was skipped, and fails under
//! `CI=true`.

use std::io::ErrorKind;
use std::process::Command;

/// Runs one of the Python test files under `benches/`.
fn python_tests(file: &str) {
    // This crate is benches/loadgen; the scripts sit beside it in benches/.
    let script = format!("{}/../{file}", env!("CARGO_MANIFEST_DIR"));
    match Command::new("python3").arg(&script).output() {
        Ok(out) => assert!(
            out.status.success(),
            "{script} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none_or(|ci| ci != "true"),
                "python3 is needed for {script} in CI"
            );
            eprintln!("skipped: python3 not found, {script} not run");
        }
        Err(e) => panic!("cannot run python3 {script}: {e}"),
    }
}

#[test]
fn benchmark_summary_verdicts() {
    python_tests("test_summarize.py");
}

#[test]
fn callgrind_dumps_and_cache_misses() {
    python_tests("test_callgrind_summary.py");
}

#[test]
fn targets_across_runs() {
    python_tests("test_across.py");
}

#[test]
fn postgres_ratios_and_cpu_split() {
    python_tests("test_pg_summary.py");
}

#[test]
fn soak_quantiles_from_scrapes() {
    python_tests("test_soak_summary.py");
}
