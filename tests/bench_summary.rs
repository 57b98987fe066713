//! The verdicts of the benchmark summary (`benches/summarize.py`), which the
//! figures in BENCHMARKS.md rest on: its Python tests, run here so that
//! `cargo test` runs every test of the project. Without `python3` the test
//! says it was skipped, and fails under `CI=true`.

use std::io::ErrorKind;
use std::process::Command;

#[test]
fn benchmark_summary_verdicts() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/test_summarize.py");
    match Command::new("python3").arg(script).output() {
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
