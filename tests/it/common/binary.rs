//! The service's binary as a real process: started on an ephemeral port,
//! its address read from its "serving" log line. Declared with
//! `#[path = "common/binary.rs"]` by the tests that run the binary (the
//! load generator's tests share `common` and have no such binary).

#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// Among a test's flags, asks for the dependencies' budgets at their
/// defaults (no flag is passed for it): the server a user runs with no
/// flags.
pub const AT_DEFAULTS: &str = "(dependency budgets at their defaults)";

/// `retry-budget serve --listen 127.0.0.1:0 --drain-delay 0s` with `extra`
/// flags (which may set either of those two), and nothing taken from the
/// environment that a test did not ask for (a configuration file, an auth
/// mode, keys, certificates).
///
/// Unless `extra` sets a `--dependency-*` flag or holds [`AT_DEFAULTS`],
/// every dependency gets a static rate far above any global one
/// (`--dependency-rate 1000000`), so that the global bucket alone limits
/// retries: the tests of the dependencies' adaptive budgets
/// (`tests/it/dependencies.rs`, `tests/it/hostile.rs`) run at the defaults.
pub fn command(extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_retry-budget"));
    command.arg("serve");
    for (flag, default) in [("--listen", "127.0.0.1:0"), ("--drain-delay", "0s")] {
        if !extra.contains(&flag) {
            command.args([flag, default]);
        }
    }
    let at_defaults = extra.contains(&AT_DEFAULTS);
    if !at_defaults && !extra.iter().any(|a| a.starts_with("--dependency-")) {
        command.args(["--dependency-rate", "1000000"]);
    }
    command
        .args(extra.iter().filter(|a| **a != AT_DEFAULTS))
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for variable in [
        "RETRY_BUDGET_CONFIG",
        "RETRY_BUDGET_AUTH",
        "RETRY_BUDGET_API_KEYS_FILE",
        "RETRY_BUDGET_TLS_CERT",
        "RETRY_BUDGET_TLS_KEY",
        "RETRY_BUDGET_TLS_CLIENT_CA",
    ] {
        command.env_remove(variable);
    }
    command
}

/// Starts the binary with `extra` flags (see [`command`]), waits for it to
/// serve, and returns it with its `127.0.0.1:port` and its log lines, each
/// sent on the channel as it is written (and the pipe kept drained).
pub async fn spawn_logged(extra: &[&str]) -> (Child, String, mpsc::UnboundedReceiver<String>) {
    let mut child = command(extra).spawn().expect("start the binary");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = tx.send(line);
        }
    });
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let line = rx.recv().await.expect("the server exited before serving");
            if line.contains("serving")
                && let Some(rest) = line.split("addr=").nth(1)
            {
                return rest.split_whitespace().next().expect("address").to_owned();
            }
        }
    })
    .await
    .expect("the server starts");
    (child, addr, rx)
}

/// [`spawn_logged`] on the configuration file `config`, with its data in
/// `data` and its metrics on `127.0.0.1:metrics`: a server a test reloads
/// (SIGHUP) and scrapes.
pub async fn spawn_configured(
    config: &Path,
    data: &Path,
    metrics: u16,
) -> (Child, String, mpsc::UnboundedReceiver<String>) {
    let metrics = format!("127.0.0.1:{metrics}");
    spawn_logged(&[
        "--config",
        config.to_str().expect("a UTF-8 path"),
        "--data-dir",
        data.to_str().expect("a UTF-8 path"),
        "--metrics-listen",
        &metrics,
    ])
    .await
}

/// [`spawn_logged`] without the log: with `echo` set, each line is
/// printed with that tag, for a failing test's output.
pub async fn spawn(extra: &[&str], echo: Option<&str>) -> (Child, String) {
    let (child, addr, mut log) = spawn_logged(extra).await;
    let tag = echo.map(|t| format!("[{t} {addr}]"));
    tokio::spawn(async move {
        while let Some(line) = log.recv().await {
            if let Some(tag) = &tag {
                eprintln!("{tag} {line}");
            }
        }
    });
    (child, addr)
}

/// The binary at its defaults ([`AT_DEFAULTS`]: no budget pinned), on a
/// data directory of its own, kept as long as the returned one lives.
pub async fn spawn_at_defaults() -> (Child, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().to_str().expect("UTF-8").to_owned();
    let (child, addr) = spawn(&[AT_DEFAULTS, "--data-dir", &data], None).await;
    (child, addr, dir)
}

/// Sends SIGHUP to `child` and returns the first log line (within 10 s)
/// that holds one of `outcomes`: how the reload went.
pub async fn hangup(
    child: &Child,
    log: &mut mpsc::UnboundedReceiver<String>,
    outcomes: &[&str],
) -> String {
    signal(child, "HUP").await;
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let line = log.recv().await.expect("the server is running");
            if outcomes.iter().any(|o| line.contains(o)) {
                return line;
            }
        }
    })
    .await
    .expect("the reload is logged")
}

/// Sends signal `name` (`HUP`, `TERM`) to `child`.
pub async fn signal(child: &Child, name: &str) {
    let pid = child.id().expect("running").to_string();
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .await
        .expect("kill");
    assert!(sent.success(), "kill -{name} {pid}");
}

/// A port free now, for a listener the binary opens itself (metrics).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The raw HTTP response of `/metrics` on `127.0.0.1:port`.
pub async fn scrape(port: u16) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the metrics");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("ask");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    text
}
