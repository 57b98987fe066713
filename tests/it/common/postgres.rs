//! A fresh PostgreSQL database for one test, dropped when the test ends.
//!
//! The server is `RETRY_BUDGET_TEST_POSTGRES_URL` (default: the local one,
//! `postgres://postgres@127.0.0.1:5432/postgres`). Where none answers, a
//! test says it was skipped and passes, except under `CI=true`, where it
//! fails: CI runs PostgreSQL and must not silently test nothing.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio_postgres::NoTls;

/// The server tests use unless told otherwise.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database made for one test.
pub struct TestDb {
    /// Its URL.
    pub url: String,
    /// Its name.
    pub name: String,
    admin: String,
}

impl TestDb {
    /// A new empty database, or `None` (said on stderr) when no PostgreSQL
    /// answers outside CI.
    pub async fn create(label: &str) -> Option<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let admin =
            std::env::var("RETRY_BUDGET_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.into());
        let connected = tokio::time::timeout(
            Duration::from_secs(5),
            tokio_postgres::connect(&admin, NoTls),
        )
        .await;
        let (client, connection) = match connected {
            Ok(Ok(pair)) => pair,
            Ok(Err(error)) => return unreachable(&admin, &error.to_string()),
            Err(_) => return unreachable(&admin, "no answer within 5 s"),
        };
        tokio::spawn(connection);
        let name = format!(
            "rb_test_{}_{}_{}",
            label.to_lowercase(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        for sql in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            client
                .batch_execute(&sql)
                .await
                .expect("create the test database");
        }
        Some(Self {
            url: with_database(&admin, &name),
            name,
            admin,
        })
    }
}

fn unreachable(url: &str, why: &str) -> Option<TestDb> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and no PostgreSQL at {url}: {why}");
    }
    crate::common::skip::skipped(&format!(
        "no PostgreSQL at {url} ({why}); set RETRY_BUDGET_TEST_POSTGRES_URL"
    ));
    None
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let base = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Dropped outside the test's runtime, which may be ending: its own
        // thread and runtime, so the drop is done before the test returns.
        let admin = self.admin.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&admin, NoTls).await.ok()?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        });
        let _ = dropped.join();
    }
}

/// Waits (at most 20 s) until the live leases' granted rates satisfy
/// `done`; `what` says what was awaited when they never do.
async fn leases_until(url: &str, what: &str, done: impl Fn(&[f64]) -> bool) {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let rates: Vec<f64> = client
            .query(
                "SELECT granted_rate FROM retry_budget_replica_leases WHERE expires_at > now()",
                &[],
            )
            .await
            .map(|rows| rows.iter().map(|r| r.get(0)).collect())
            .unwrap_or_default();
        if done(&rates) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {rates:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most 20 s) until one live replica holds at least `rate` of
/// the global budget: a replica restarted holds all of it only once the
/// killed one's lease has lapsed.
pub async fn holds(url: &str, rate: f64) {
    leases_until(url, &format!("no sole replica holds {rate}/s"), |rates| {
        rates.len() == 1 && rates[0] >= rate
    })
    .await;
}

/// Waits (at most 20 s) until `replicas` replicas hold live leases of about
/// equal, non-zero rates: a replica takes only what the others leave, so
/// the first to start holds the whole budget until its next interval.
pub async fn converged(url: &str, replicas: usize) {
    leases_until(url, "grants did not converge", |rates| {
        let (least, most) = rates
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, m), &r| (l.min(r), m.max(r)));
        rates.len() == replicas && least > 0.0 && least >= 0.9 * most
    })
    .await;
}
