//! Several replicas on one PostgreSQL database, in one process: each
//! replica is its own store handle (its own pool and writer), ledger or
//! server, so nothing but the database connects them. Skipped without
//! PostgreSQL, except under `CI=true` (see `common::postgres`).

use crate::common;
use crate::common::binary;
use crate::common::postgres;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestServer, pb, report, with_tenant};
use postgres::TestDb;
use retry_budget::budget::ErrorClass;
use retry_budget::budget::activity::{
    ActivityKey, Defaults, DraftOrReplay, Policy, Report, draft_or_replay,
};
use retry_budget::ledger::{Ledger, Unlimited};
use retry_budget::store::{MIGRATIONS, PgStore, PostgresOptions, Replaced, Store, StoreError};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const NOW: i64 = 1_800_000_000_000;

fn options(url: &str) -> PostgresOptions {
    PostgresOptions {
        url: url.to_owned(),
        pool_size: 8,
        timeout: Duration::from_secs(10),
        max_batch: 1024,
        ca_file: None,
    }
}

fn defaults() -> Defaults {
    Defaults {
        policy: Policy {
            max_attempts: 10,
            deadline_seconds: 3600,
            base: None,
            cap: None,
        },
        max_hint_ms: 600_000,
    }
}

fn failure(attempt: u32) -> Report<'static> {
    Report {
        attempt,
        class: ErrorClass::Transient,
        rule: None,
        hints: None,
        policy: None,
        occurred_at_ms: Some(NOW + i64::from(attempt)),
        workflow_id: "wf",
        dependency: "",
    }
}

fn key(id: &str) -> ActivityKey {
    ActivityKey {
        tenant: "t".into(),
        activity_id: id.into(),
    }
}

/// Replicas starting together on an empty database: every one gets a
/// schema, and each migration ran once.
#[tokio::test]
async fn replicas_starting_together_migrate_once() {
    let Some(db) = TestDb::create("migrate_race").await else {
        return;
    };
    let stores: Vec<_> = (0..6)
        .map(|_| PgStore::open(&options(&db.url)).unwrap())
        .collect();
    let readies = stores.iter().map(|s| s.ready());
    for ready in futures_util::future::join_all(readies).await {
        ready.expect("every replica finds the schema ready");
    }
    let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT version FROM retry_budget_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    let known: Vec<i32> = MIGRATIONS.iter().map(|m| m.0).collect();
    assert_eq!(versions, known);
}

/// The store's half of the contract: a write names the version it
/// replaces, and loses to whoever wrote first.
/// A replica started on a new database brings the schema up to date before
/// its first coordination interval: granted by its first transaction, none
/// failing on a leases' table not yet created.
#[tokio::test]
async fn a_replica_on_a_new_database_is_granted_by_its_first_interval() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let Some(db) = TestDb::create("first_interval").await else {
        return;
    };
    let mut child = binary::command(&[
        "--postgres-url",
        &db.url,
        "--coordination-interval",
        "200ms",
        "--pool-size",
        "4",
    ])
    .spawn()
    .expect("start the binary");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut log = Vec::new();
    let granted = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            let granted = line.contains("coordination=granted");
            log.push(line);
            if granted {
                return true;
            }
        }
        false
    })
    .await;
    let log = log.join("\n");
    assert_eq!(granted, Ok(true), "{log}");
    assert!(log.contains("schema migration applied"), "{log}");
    assert!(!log.contains("coordination: transaction failed"), "{log}");
}

#[tokio::test]
async fn a_write_over_a_version_another_replica_replaced_is_a_conflict() {
    let Some(db) = TestDb::create("conflict").await else {
        return;
    };
    let a = PgStore::open(&options(&db.url)).unwrap();
    let b = PgStore::open(&options(&db.url)).unwrap();
    let k = key("x");
    let first =
        |attempt| match draft_or_replay(None, &k, &failure(attempt), &defaults(), NOW).unwrap() {
            DraftOrReplay::Fresh(draft) => draft.finish().0,
            DraftOrReplay::Replay(_) => unreachable!(),
        };
    // Both replicas found it absent: one creates it.
    let (ra, rb) = tokio::join!(a.save(first(1), None), b.save(first(1), None));
    assert!(
        matches!(
            (&ra, &rb),
            (Ok(()), Err(StoreError::Conflict { .. })) | (Err(StoreError::Conflict { .. }), Ok(()))
        ),
        "{ra:?} {rb:?}"
    );
    let stored = a.load(&k).await.unwrap().unwrap();
    // Both read version 1; a moves it on; b's write over version 1 fails
    // and leaves a's in place.
    let next = |base: &retry_budget::budget::activity::ActivityRecord| match draft_or_replay(
        Some(base.clone()),
        &k,
        &failure(2),
        &defaults(),
        NOW,
    )
    .unwrap()
    {
        DraftOrReplay::Fresh(draft) => draft.finish().0,
        DraftOrReplay::Replay(_) => unreachable!(),
    };
    let by_a = next(&stored);
    a.save(by_a.clone(), Some(Replaced::of(&stored)))
        .await
        .unwrap();
    let err = b
        .save(next(&stored), Some(Replaced::of(&stored)))
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("store_conflict: "), "{err}");
    assert_eq!(b.load(&k).await.unwrap(), Some(by_a));
}

/// The ledger's half: the same attempts reported to two replicas at the
/// same instant record one decision each, and both replicas answer with
/// it (the loser replays the winner's).
#[tokio::test]
async fn the_same_attempt_on_two_replicas_records_one_decision() {
    let Some(db) = TestDb::create("ledger_race").await else {
        return;
    };
    let a = Arc::new(Ledger::new(
        PgStore::open(&options(&db.url)).unwrap(),
        defaults(),
    ));
    let b = Arc::new(Ledger::new(
        PgStore::open(&options(&db.url)).unwrap(),
        defaults(),
    ));
    a.store().ready().await.unwrap();
    for attempt in 1..=4 {
        let mut races = Vec::new();
        for i in 0..40 {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            races.push(tokio::spawn(async move {
                let k = key(&format!("act-{i}"));
                let r = failure(attempt);
                let (x, y) = tokio::join!(
                    a.report(&k, &r, Unlimited, NOW, false),
                    b.report(&k, &r, Unlimited, NOW, false)
                );
                (x.unwrap(), y.unwrap())
            }));
        }
        for race in races {
            let (x, y) = race.await.unwrap();
            assert_eq!(x.event, y.event, "both replicas answer the one decision");
            assert_eq!(x.event.attempt, attempt);
            assert!(
                !(x.replayed && y.replayed),
                "one of them decided attempt {attempt}"
            );
        }
    }
    for i in 0..40 {
        let record = a.get(&key(&format!("act-{i}"))).await.unwrap();
        assert_eq!(record.attempts, 4);
        let decided: Vec<u32> = record.events.iter().map(|e| e.attempt).collect();
        assert_eq!(decided, [1, 2, 3, 4], "one decision an attempt");
    }
}

/// Two servers on one database: attempt counts continue whichever answers,
/// and a replay works on either.
#[tokio::test]
async fn two_servers_are_one_service() {
    let Some(db) = TestDb::create("two_servers").await else {
        return;
    };
    let url = db.url.clone();
    // Two replicas in one process: each needs an id of its own (the
    // default is the host's name and the process id).
    let replica = |id: &'static str| {
        let url = url.clone();
        move |c: &mut retry_budget::config::Config| {
            c.store.postgres_url = Some(url);
            c.coordination.interval = Duration::from_millis(200);
            c.coordination.replica_id = Some(id.into());
        }
    };
    let one = TestServer::start_with(replica("one")).await;
    let two = TestServer::start_with(replica("two")).await;
    postgres::converged(&db.url, 2).await;
    let mut clients = [one.client().await, two.client().await];
    for attempt in 1..=4u32 {
        let on = &mut clients[(attempt % 2) as usize];
        let decided = on
            .next_action(with_tenant(
                report("flight-1", attempt, pb::ErrorClass::Transient),
                "acme",
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            decided.action,
            pb::Action::ScheduleRetry as i32,
            "{decided:?}"
        );
        assert!(!decided.replayed);
        let other = &mut clients[((attempt + 1) % 2) as usize];
        let replay = other
            .next_action(with_tenant(
                report("flight-1", attempt, pb::ErrorClass::Transient),
                "acme",
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(
            replay.replayed,
            "the other replica replays attempt {attempt}"
        );
        assert_eq!(replay.delay_ms, decided.delay_ms);
    }
    let skipped = clients[0]
        .next_action(with_tenant(
            report("flight-1", 6, pb::ErrorClass::Transient),
            "acme",
        ))
        .await
        .unwrap_err();
    assert_eq!(skipped.code(), tonic::Code::FailedPrecondition, "{skipped}");
}

/// A replica whose database does not answer: health says NOT_SERVING, and
/// a call gets UNAVAILABLE with `store_unavailable` and a pushback within
/// the configured bound, not a hang.
#[tokio::test]
async fn without_its_database_a_replica_refuses_promptly_and_is_not_serving() {
    // A port nothing listens on: connections are refused at once. A
    // database that is slow is bounded by the same timeout.
    let server = TestServer::start_with(|c| {
        c.store.postgres_url = Some("postgres://postgres@127.0.0.1:9/none".into());
        c.store.db_timeout = Duration::from_millis(500);
    })
    .await;
    let mut health = HealthClient::new(server.channel().await);
    // The service is not serving; the process (`""`, what a liveness probe
    // asks) is alive and must not be restarted for its database.
    for (service, expected) in [
        ("retrybudget.v1.RetryBudget", ServingStatus::NotServing),
        ("", ServingStatus::Serving),
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, expected as i32, "{service:?}");
    }
    let mut client = server.client().await;
    let started = Instant::now();
    let refused = client
        .next_action(with_tenant(
            report("flight-1", 1, pb::ErrorClass::Transient),
            "acme",
        ))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().starts_with("store_unavailable: "),
        "{}",
        refused.message()
    );
    assert_eq!(
        refused
            .metadata()
            .get("grpc-retry-pushback-ms")
            .map(|v| v.to_str().unwrap()),
        Some("1000")
    );
}

/// TLS to the database: with `sslmode=require` the certificate is verified
/// (a CA file trusts the server's own, here the self-signed certificate a
/// Debian PostgreSQL ships), and a certificate that does not name the host
/// connected to is refused, not silently accepted.
#[tokio::test]
async fn tls_to_the_database_verifies_its_certificate() {
    let Some(db) = TestDb::create("tls").await else {
        return;
    };
    let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let ssl: String = client.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    let cert: String = client
        .query_one("SHOW ssl_cert_file", &[])
        .await
        .unwrap()
        .get(0);
    if ssl != "on" || std::fs::read(&cert).is_err() {
        common::skip::skipped(&format!(
            "this PostgreSQL serves no TLS with a readable certificate ({ssl}, {cert})"
        ));
        return;
    }
    // The Debian certificate names `localhost`.
    let url = format!(
        "{}?sslmode=require",
        db.url.replacen("127.0.0.1", "localhost", 1)
    );
    let mut trusted = options(&url);
    trusted.ca_file = Some(cert.into());
    let store = PgStore::open(&trusted).unwrap();
    store
        .ping()
        .await
        .expect("TLS with the server's certificate trusted");
    let over_tls: bool = store
        .coordination_pool()
        .get()
        .await
        .unwrap()
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(over_tls, "the store's connection is encrypted");

    // The same certificate, reached by another name than the one it holds.
    let mut misnamed = options(&format!("{}?sslmode=require", db.url));
    misnamed.ca_file = trusted.ca_file.clone();
    misnamed.timeout = Duration::from_secs(2);
    let refused = PgStore::open(&misnamed).unwrap().ping().await.unwrap_err();
    assert!(
        refused.to_string().starts_with("store_unavailable: "),
        "{refused}"
    );
}

/// One replica sweeps at a time: the sweep's lease is held by whoever took
/// it until it lapses (by the database's clock), renewed by its holder, and
/// taken by another only after that.
#[tokio::test]
async fn only_one_replica_holds_the_sweep_at_a_time() {
    let Some(db) = TestDb::create("sweep_lease").await else {
        return;
    };
    let a = PgStore::open(&options(&db.url)).unwrap();
    let b = PgStore::open(&options(&db.url)).unwrap();
    let ttl = Duration::from_millis(400);
    assert!(a.claim_sweep("a", ttl).await.unwrap(), "free: a takes it");
    assert!(!b.claim_sweep("b", ttl).await.unwrap(), "held by a");
    assert!(
        a.claim_sweep("a", ttl).await.unwrap(),
        "its holder renews it"
    );
    assert!(!b.claim_sweep("b", ttl).await.unwrap(), "still a's");
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert!(b.claim_sweep("b", ttl).await.unwrap(), "lapsed: b takes it");
    assert!(!a.claim_sweep("a", ttl).await.unwrap(), "now b's");
}
