//! How a test that cannot run here (no PostgreSQL, no HAProxy) says so.

use std::io::Write;

/// Says that the running test was skipped, and why, where a person
/// running `cargo test` sees it: straight to the process's stderr, which
/// the test harness's capture (of `eprintln!` alone) lets through, so that
/// a skipped test is never only an `ok`. The test's name is its thread's.
pub fn skipped(why: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}
