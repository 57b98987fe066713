//! The real binary with a configuration file it cannot use: a missing
//! file, malformed TOML, an unknown key. It must refuse to start with exit
//! code 2 and a message that names the file (and, for malformed TOML, the
//! line), and write nothing to its data directory.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

/// Runs `serve` with `--config config`, on a data directory inside `dir`
/// that does not exist yet, and returns what the process did.
async fn serve_with(config: &Path, dir: &Path) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_retry-budget"))
        .args(["serve", "--listen", "127.0.0.1:0", "--drain-delay", "0s"])
        .arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env_remove("RETRY_BUDGET_CONFIG")
        .env_remove("RETRY_BUDGET_DATA_DIR")
        .env("RUST_LOG", "info")
        .kill_on_drop(true)
        .output();
    // A server that started would never exit by itself: a generous bound
    // says so instead of hanging.
    tokio::time::timeout(Duration::from_secs(60), child)
        .await
        .expect("the binary exits instead of serving")
        .expect("the binary runs")
}

/// Checks the refusal: exit code 2, every piece of `says` on stderr,
/// nothing in `dir` but the configuration file.
fn refused(output: &Output, dir: &Path, says: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    for what in says {
        assert!(stderr.contains(what), "{what:?} not in: {stderr}");
    }
    assert!(!stderr.contains("serving"), "it served: {stderr}");
    assert!(
        !dir.join("data").exists(),
        "the data directory was created: {:?}",
        std::fs::read_dir(dir.join("data")).map(|d| d.count())
    );
}

#[tokio::test]
async fn a_missing_configuration_file_is_exit_code_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nonexistent.toml");
    let output = serve_with(&missing, dir.path()).await;
    refused(
        &output,
        dir.path(),
        &["config_unreadable", &missing.display().to_string()],
    );
}

#[tokio::test]
async fn malformed_toml_is_exit_code_2_naming_the_file_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("retry-budget.toml");
    // Line 4 is not TOML.
    std::fs::write(
        &config,
        "[bucket]\nrate = 200.0\nburst = 400\nsuccess_deposit = = 0.1\n",
    )
    .unwrap();
    let output = serve_with(&config, dir.path()).await;
    refused(
        &output,
        dir.path(),
        &["config_invalid", &config.display().to_string(), "line 4"],
    );
}

#[tokio::test]
async fn an_unknown_key_is_exit_code_2_naming_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("retry-budget.toml");
    // A typo of `rate` must not silently keep the default.
    std::fs::write(&config, "[bucket]\nrat = 5.0\n").unwrap();
    let output = serve_with(&config, dir.path()).await;
    refused(
        &output,
        dir.path(),
        &[
            "config_invalid",
            &config.display().to_string(),
            "rat",
            "line 2",
        ],
    );
}

/// The same file with the typo fixed starts: the refusals above are about
/// the file, not about something else in the command line.
#[tokio::test]
async fn the_same_command_with_a_valid_file_serves() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("retry-budget.toml");
    std::fs::write(&config, "[bucket]\nrate = 5.0\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_retry-budget"))
        .args(["serve", "--listen", "127.0.0.1:0", "--drain-delay", "0s"])
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env_remove("RETRY_BUDGET_CONFIG")
        .env_remove("RETRY_BUDGET_DATA_DIR")
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let serving = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("serving") {
                return line;
            }
        }
        panic!("the binary exited: {:?}", child.try_wait());
    })
    .await
    .expect("the binary serves");
    assert!(serving.contains("retry_rate=5"), "{serving}");
    child.kill().await.unwrap();
}
