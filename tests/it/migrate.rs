//! `retry-budget migrate`: an embedded store copied into PostgreSQL keeps
//! every activity and its history; a second run changes nothing; a copy
//! that stopped half-way resumes. Skipped without PostgreSQL, except under
//! `CI=true`.

use crate::common;
use crate::common::postgres;

use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, get, pb, report};
use postgres::TestDb;
use retry_budget::store::{
    EmbeddedStore, EmbeddedStoreOptions, PgStore, PostgresOptions, Store, copy,
};
use tokio::process::Command;

/// Records `n` activities with 1 to 3 attempts each through a real server
/// on the embedded store, stops it, and returns its data directory.
async fn embedded_store(n: u32) -> tempfile::TempDir {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for i in 0..n {
        for attempt in 1..=(i % 3 + 1) {
            client
                .next_action(report(
                    &format!("act-{i}"),
                    attempt,
                    pb::ErrorClass::Transient,
                ))
                .await
                .unwrap();
        }
    }
    let (_, dir) = server.stop_keep_dir().await;
    dir.expect("a temp dir")
}

#[tokio::test]
async fn the_migrate_command_copies_every_activity_once() {
    let Some(db) = TestDb::create("migrate_cli").await else {
        return;
    };
    let dir = embedded_store(30).await;
    let run = || async {
        let out = Command::new(env!("CARGO_BIN_EXE_retry-budget"))
            .args(["migrate", "--batch", "7", "--data-dir"])
            .arg(dir.path())
            .args(["--postgres-url", &db.url])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let first = run().await;
    assert!(
        first.contains("copied 30 of 30 activities into PostgreSQL (0 by an earlier run)"),
        "{first}"
    );
    let second = run().await;
    assert!(
        second.contains("copied 30 of 30 activities into PostgreSQL (30 by an earlier run)"),
        "{second}"
    );

    // Served from PostgreSQL, each activity is what the embedded store held,
    // and goes on from its attempt count.
    let url = db.url.clone();
    let pg = TestServer::start_with(|c| c.store.postgres_url = Some(url)).await;
    common::coordinated(pg.channel().await).await;
    let mut client = pg.client().await;
    for i in 0..30u32 {
        let activity = get(&mut client, &format!("act-{i}")).await;
        assert_eq!(activity.attempts, i % 3 + 1);
        assert_eq!(activity.events.len() as u32, i % 3 + 1);
    }
    let next = client
        .next_action(report("act-2", 4, pb::ErrorClass::Transient))
        .await
        .unwrap()
        .into_inner();
    assert!(!next.replayed);
    assert_eq!(next.attempt, 4);
}

#[tokio::test]
async fn a_copy_that_stopped_resumes_where_it_stopped() {
    let Some(db) = TestDb::create("migrate_resume").await else {
        return;
    };
    let dir = embedded_store(25).await;
    let from = Arc::new(EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap());
    let options = PostgresOptions {
        url: db.url.clone(),
        pool_size: 2,
        timeout: Duration::from_secs(10),
        max_batch: 10,
        ca_file: None,
    };
    let to = Arc::new(PgStore::open(&options).unwrap());
    // The first run dies after its second batch committed.
    let crashed = {
        let (from, to) = (Arc::clone(&from), Arc::clone(&to));
        tokio::spawn(async move {
            copy::embedded_to_postgres(&from, "src", &to, 10, false, |copied, _| {
                assert!(copied < 20, "the copy stops here");
            })
            .await
        })
        .await
    };
    assert!(crashed.is_err(), "the first run was stopped");
    assert_eq!(to.count().await.unwrap(), 20);
    let done = copy::embedded_to_postgres(&from, "src", &to, 10, false, |_, _| {})
        .await
        .unwrap();
    assert_eq!(
        done,
        copy::Copied {
            copied: 25,
            total: 25,
            resumed_from: 20
        }
    );
    assert_eq!(to.count().await.unwrap(), 25);
    let mut after = None;
    loop {
        let page = from.scan(after.as_ref(), 100).unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.key());
        for record in page {
            assert_eq!(to.load(&record.key()).await.unwrap(), Some(record));
        }
    }
}
