//! The one conformance suite every [`Store`] must pass, run here against
//! each store the project has. A new store adds one `#[tokio::test]` that
//! calls [`conformance`] with a way to open it.

use crate::common::postgres;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use postgres::TestDb;
use retry_budget::budget::ErrorClass;
use retry_budget::budget::activity::{
    ActivityKey, ActivityRecord, Defaults, DraftOrReplay, Policy, Report, Status, draft_or_replay,
    record_success,
};
use retry_budget::budget::token::{HealthState, PaceRecord, TenantPaceRecord};
use retry_budget::store::{
    EmbeddedStore, EmbeddedStoreOptions, PgStore, PostgresOptions, Replaced, Store,
};

const NOW: i64 = 1_800_000_000_000;

fn key(tenant: &str, id: &str) -> ActivityKey {
    ActivityKey {
        tenant: tenant.into(),
        activity_id: id.into(),
    }
}

/// A record made by the real state machine: `attempts` transient failures.
fn record(k: &ActivityKey, class: ErrorClass, deadline_seconds: u64) -> ActivityRecord {
    let defaults = Defaults {
        policy: Policy {
            max_attempts: 5,
            deadline_seconds,
            base: None,
            cap: None,
        },
        max_hint_ms: 3_600_000,
    };
    let report = Report {
        attempt: 1,
        class,
        rule: None,
        hints: None,
        policy: None,
        occurred_at_ms: Some(NOW),
        workflow_id: "wf",
        dependency: "",
    };
    match draft_or_replay(None, k, &report, &defaults, NOW).expect("valid report") {
        DraftOrReplay::Fresh(draft) => draft.finish().0,
        DraftOrReplay::Replay(_) => unreachable!("a new activity has nothing to replay"),
    }
}

/// The version after `prev`: its next attempt failed transiently too.
fn next_failure(prev: &ActivityRecord) -> ActivityRecord {
    let defaults = Defaults {
        policy: prev.policy,
        max_hint_ms: 3_600_000,
    };
    let report = Report {
        attempt: prev.attempts + 1,
        class: ErrorClass::Transient,
        rule: None,
        hints: None,
        policy: None,
        occurred_at_ms: Some(NOW + 1),
        workflow_id: "wf",
        dependency: "",
    };
    match draft_or_replay(Some(prev.clone()), &prev.key(), &report, &defaults, NOW + 1)
        .expect("valid report")
    {
        DraftOrReplay::Fresh(draft) => draft.finish().0,
        DraftOrReplay::Replay(_) => unreachable!("a new attempt is not a replay"),
    }
}

/// Runs every check against a store; `open` opens the same storage again
/// (after the previous handle is dropped) to check durability.
/// `load`, unwrapped.
async fn loaded<S: Store>(store: &S, k: &ActivityKey) -> Option<ActivityRecord> {
    store.load(k).await.unwrap()
}

pub async fn conformance<S: Store, F: Fn() -> S>(open: F) {
    let store = open();
    let a = key("t1", "a");
    assert_eq!(loaded(&store, &a).await, None, "missing is None");
    assert_eq!(store.count().await.unwrap(), 0);

    // Save, load, update.
    let first = record(&a, ErrorClass::Transient, 60);
    store.save(first.clone(), None).await.unwrap();
    assert_eq!(loaded(&store, &a).await.as_ref(), Some(&first));
    let closed = record_success(first.clone(), Some(NOW + 5), NOW + 10).expect("open");
    store
        .save(closed.clone(), Some(Replaced::of(&first)))
        .await
        .unwrap();
    assert_eq!(loaded(&store, &a).await.as_ref(), Some(&closed));
    assert_eq!(store.count().await.unwrap(), 1);

    // Tenants are part of the key; odd ids round-trip.
    for k in [key("t2", "a"), key("t1", "航班:1 🚀"), key("t1", "a:b")] {
        let r = record(&k, ErrorClass::Transient, 60);
        store.save(r.clone(), None).await.unwrap();
        assert_eq!(loaded(&store, &k).await, Some(r));
    }
    assert_eq!(store.count().await.unwrap(), 4);

    // Concurrent saves of distinct activities all land.
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let k = key("bulk", &format!("act-{i}"));
            store
                .save(record(&k, ErrorClass::Transient, 3600), None)
                .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(store.count().await.unwrap(), 204);

    // Durability: everything is there after reopening.
    drop(store);
    let store = open();
    assert_eq!(store.count().await.unwrap(), 204);
    assert_eq!(loaded(&store, &a).await, Some(closed.clone()));

    // Purge: by purgeable time, never a parked activity, and an update
    // moves the record's place in the purge order.
    let parked_key = key("t3", "parked");
    let parked = record(&parked_key, ErrorClass::Unknown, 0);
    assert_eq!(parked.status, Status::Parked);
    store.save(parked.clone(), None).await.unwrap();
    // `a` was closed at NOW + 10; the others expire at NOW + 60 s or 3600 s.
    assert_eq!(
        store.purge(NOW + 10, 1000).await.unwrap(),
        0,
        "cutoff is exclusive"
    );
    assert_eq!(store.purge(NOW + 11, 1000).await.unwrap(), 1);
    assert_eq!(loaded(&store, &a).await, None);
    // A purged activity leaves nothing behind: the same key starts afresh.
    let again = record(&a, ErrorClass::Transient, 0);
    store.save(again.clone(), None).await.unwrap();
    assert_eq!(loaded(&store, &a).await, Some(again.clone()));
    assert_eq!(
        store.purge(NOW + 11, 1000).await.unwrap(),
        1,
        "deadline 0: expired"
    );
    let b = key("t2", "a");
    let b_open = loaded(&store, &b).await.unwrap();
    let b_closed = record_success(b_open.clone(), None, NOW + 4_000_000).unwrap();
    store
        .save(b_closed.clone(), Some(Replaced::of(&b_open)))
        .await
        .unwrap();
    // Two expire at NOW + 60 s (b no longer does: it closed later).
    assert_eq!(store.purge(NOW + 60_001, 1000).await.unwrap(), 2);
    assert!(loaded(&store, &b).await.is_some());
    // A limit bounds one purge.
    assert_eq!(store.purge(NOW + 3_600_001, 150).await.unwrap(), 150);
    assert_eq!(store.purge(NOW + 3_600_001, 150).await.unwrap(), 50);
    assert_eq!(store.purge(i64::MAX, 1000).await.unwrap(), 1, "b, closed");
    assert_eq!(loaded(&store, &parked_key).await, Some(parked));
    assert_eq!(
        store.count().await.unwrap(),
        1,
        "only the parked one is left"
    );

    // Saved twice between two checkpoints (`count` makes one where a store
    // has them): the purge order is the newest version's, and the place of
    // the version stored before them is given up.
    let c = key("t4", "twice");
    let open_c = record(&c, ErrorClass::Transient, 60);
    store.save(open_c.clone(), None).await.unwrap();
    assert_eq!(store.count().await.unwrap(), 2);
    let closed_c = record_success(open_c.clone(), None, NOW + 4_000_000).expect("open");
    store
        .save(closed_c.clone(), Some(Replaced::of(&open_c)))
        .await
        .unwrap();
    let mut later_c = closed_c.clone();
    later_c.closed_at_ms = Some(NOW + 5_000_000);
    store
        .save(later_c.clone(), Some(Replaced::of(&closed_c)))
        .await
        .unwrap();
    assert_eq!(store.count().await.unwrap(), 2);
    assert_eq!(
        store.purge(NOW + 4_000_001, 1000).await.unwrap(),
        0,
        "neither the first version's deadline nor the second's close purges it"
    );
    assert_eq!(loaded(&store, &c).await, Some(later_c));
    assert_eq!(store.purge(NOW + 5_000_001, 1000).await.unwrap(), 1);
    assert_eq!(loaded(&store, &c).await, None);

    paces(store, open).await;
}

/// A dependency's pace, as the bucket persists it.
fn pace(name: &str, allowance: f64, state: HealthState) -> PaceRecord {
    PaceRecord {
        dependency: name.to_owned(),
        allowance,
        state,
        saved_at_ms: NOW,
        tenants: vec![TenantPaceRecord {
            tenant: "t1".into(),
            allowance,
            baseline: 12.5,
            state,
            success_rate: 2000.0,
            threshold: None,
        }],
    }
}

/// The paces: kept, replaced by name, and there after reopening, trouble
/// as well as health.
async fn paces<S: Store, F: Fn() -> S>(store: S, open: F) {
    assert_eq!(
        store.load_paces().await.unwrap(),
        Vec::new(),
        "none at first"
    );
    let down = pace("payments-api", 1.0, HealthState::Trouble);
    let busy = pace("ledger", 200.0, HealthState::Healthy);
    store
        .save_paces(vec![down.clone(), busy.clone()])
        .await
        .unwrap();
    // A recovery under way keeps where its growth turns to adding.
    let mut recovered = pace("payments-api", 8.0, HealthState::Recovering);
    recovered.tenants[0].threshold = Some(40.0);
    store.save_paces(vec![recovered.clone()]).await.unwrap();
    drop(store);
    let store = open();
    let mut kept = store.load_paces().await.unwrap();
    kept.sort_by(|a, b| a.dependency.cmp(&b.dependency));
    assert_eq!(kept, vec![busy, recovered]);
}

#[tokio::test]
async fn embedded_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    conformance(move || {
        EmbeddedStore::open(&EmbeddedStoreOptions::new(&path)).expect("open the embedded store")
    })
    .await;
}

fn postgres(db: &TestDb) -> PostgresOptions {
    PostgresOptions {
        url: db.url.clone(),
        pool_size: 8,
        timeout: Duration::from_secs(10),
        max_batch: 1024,
        ca_file: None,
    }
}

#[tokio::test]
async fn postgres_store_conforms() {
    let Some(db) = TestDb::create("conformance").await else {
        return;
    };
    let options = postgres(&db);
    conformance(move || PgStore::open(&options).expect("open PostgreSQL")).await;
}

#[tokio::test]
async fn postgres_saves_that_arrive_together_share_a_commit() {
    let Some(db) = TestDb::create("group_commit").await else {
        return;
    };
    let store = Arc::new(PgStore::open(&postgres(&db)).unwrap());
    store.ready().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..500 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let k = key("gc", &format!("act-{i}"));
            store
                .save(record(&k, ErrorClass::Transient, 60), None)
                .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let [commits, saves, ..] = store.commit_stats().snapshot();
    assert_eq!(saves, 500);
    assert!(commits < 250, "{commits} commits for {saves} saves");
    assert_eq!(store.count().await.unwrap(), 500);
}

#[tokio::test]
async fn embedded_saves_that_arrive_together_share_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap());
    let mut tasks = Vec::new();
    for i in 0..500 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let k = key("gc", &format!("act-{i}"));
            store
                .save(record(&k, ErrorClass::Transient, 60), None)
                .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let stats = store.commit_stats();
    let commits = stats.commits.load(Ordering::Relaxed);
    let saves = stats.saves.load(Ordering::Relaxed);
    assert_eq!(saves, 500);
    assert!(commits < 250, "{commits} commits for {saves} saves");
    assert_eq!(store.count().await.unwrap(), 500);
}

#[tokio::test]
async fn embedded_batch_of_one_commits_each_save_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = EmbeddedStoreOptions::new(dir.path());
    options.max_batch = 1;
    let store = Arc::new(EmbeddedStore::open(&options).unwrap());
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let k = key("one", &format!("act-{i}"));
            store
                .save(record(&k, ErrorClass::Transient, 60), None)
                .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let commits = store.commit_stats().commits.load(Ordering::Relaxed);
    assert_eq!(commits, 20);
}

#[tokio::test]
async fn a_second_process_cannot_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _first = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap();
    let second = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap_err();
    assert!(
        second.to_string().starts_with("store_unavailable"),
        "{second}"
    );
}

/// With room for one save waiting, saves sent together from many threads
/// find the writer busy with an fsync: those past the room are refused at
/// once with `store_backlogged` and a time to come back, nothing of them
/// is written, and each is taken when sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn saves_past_the_writers_room_are_refused_and_taken_when_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = EmbeddedStoreOptions::new(dir.path());
    options.max_pending = 1;
    let store = Arc::new(EmbeddedStore::open(&options).unwrap());
    let mut tasks = Vec::new();
    for i in 0..400 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let r = record(
                &key("room", &format!("act-{i}")),
                ErrorClass::Transient,
                3600,
            );
            let first = store.save(r.clone(), None).await;
            (r, first)
        }));
    }
    let mut refused = Vec::new();
    let mut taken = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (r, Ok(())) => taken.push(r),
            (r, Err(e)) => {
                assert_eq!(e.code(), "store_backlogged", "{e}");
                assert!(e.to_string().starts_with("store_backlogged: "), "{e}");
                assert!(e.retry_after().is_some_and(|d| d > Duration::ZERO));
                assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unavailable);
                assert_eq!(
                    loaded(&*store, &r.key()).await,
                    None,
                    "a refused save wrote nothing"
                );
                refused.push(r);
            }
        }
    }
    assert!(!refused.is_empty(), "none of 400 saves was refused");
    assert_eq!(store.count().await.unwrap(), taken.len() as u64);
    for r in &refused {
        save_when_taken(&store, r.clone()).await;
    }
    for r in taken.iter().chain(&refused) {
        assert_eq!(loaded(&*store, &r.key()).await.as_ref(), Some(r));
    }
    assert_eq!(store.count().await.unwrap(), 400);
}

/// Saves `r`, coming back as told while the store is backlogged.
async fn save_when_taken(store: &EmbeddedStore, r: ActivityRecord) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match store.save(r.clone(), None).await {
            Ok(()) => return,
            Err(e) => {
                assert_eq!(e.code(), "store_backlogged", "{e}");
                assert!(std::time::Instant::now() < deadline, "still refused: {e}");
                tokio::time::sleep(e.retry_after().expect("a time to come back")).await;
            }
        }
    }
}

/// Writes `records` and `paces` into `dir` as versions before fjall did:
/// one redb file, tables `activities` and `dependency_paces`.
fn earlier_version_dir(dir: &std::path::Path, records: &[ActivityRecord], paces: &[PaceRecord]) {
    use retry_budget::store::codec;
    const ACTIVITIES: redb::TableDefinition<(&str, &str), &[u8]> =
        redb::TableDefinition::new("activities");
    const PACES: redb::TableDefinition<&str, &[u8]> =
        redb::TableDefinition::new("dependency_paces");
    let db = redb::Database::create(dir.join("retry-budget.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(ACTIVITIES).unwrap();
        for r in records {
            let mut bytes = Vec::new();
            codec::encode_into(r.clone(), &mut bytes);
            table
                .insert(
                    (r.tenant.as_str(), r.activity_id.as_str()),
                    bytes.as_slice(),
                )
                .unwrap();
        }
        let mut table = txn.open_table(PACES).unwrap();
        for p in paces {
            table
                .insert(p.dependency.as_str(), codec::encode_pace(p).as_slice())
                .unwrap();
        }
    }
    txn.commit().unwrap();
}

/// A data directory an earlier version left after a clean stop is
/// imported on the first open: every record (its purge order included), the
/// count and the paces, and the old file is kept aside.
#[tokio::test]
async fn an_earlier_versions_data_directory_is_imported_on_first_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut records = Vec::new();
    for i in 0..30 {
        let first = record(
            &key("old", &format!("act-{i}")),
            ErrorClass::Transient,
            3600,
        );
        records.push(if i % 3 == 0 {
            record_success(first, Some(NOW + 1), NOW + 2).expect("open")
        } else {
            next_failure(&first)
        });
    }
    let paces = [pace("payments-api", 40.0, HealthState::Healthy)];
    earlier_version_dir(dir.path(), &records, &paces);

    let store = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap();
    assert!(!dir.path().join("retry-budget.redb").exists());
    assert!(dir.path().join("retry-budget.redb.imported").exists());
    for r in &records {
        assert_eq!(loaded(&store, &r.key()).await.as_ref(), Some(r));
    }
    assert_eq!(store.count().await.unwrap(), 30);
    assert_eq!(store.load_paces().await.unwrap(), paces.to_vec());
    // The ten closed ones are in the purge order.
    assert_eq!(store.purge(NOW + 3, 1000).await.unwrap(), 10);
    assert_eq!(store.count().await.unwrap(), 20);
    drop(store);
    // Opened again: nothing imported twice.
    let store = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap();
    assert_eq!(store.count().await.unwrap(), 20);
}

/// An earlier version that crashed may have left decisions in its journal
/// that only it can replay: the directory is refused, saying what to do,
/// and nothing in it changes.
#[tokio::test]
async fn an_earlier_versions_directory_with_a_journal_left_by_a_crash_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let r = record(&key("old", "a"), ErrorClass::Transient, 3600);
    earlier_version_dir(dir.path(), std::slice::from_ref(&r), &[]);
    let segment = dir.path().join("journal-00000000000000000003.log");
    std::fs::write(&segment, [1u8; 64]).unwrap();
    let before = std::fs::read(dir.path().join("retry-budget.redb")).unwrap();

    let refused = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap_err();
    let message = refused.to_string();
    assert!(message.starts_with("store_unavailable: "), "{message}");
    assert!(
        message.contains("journal-00000000000000000003.log") && message.contains("stop it"),
        "{message}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("retry-budget.redb")).unwrap(),
        before
    );
    assert_eq!(std::fs::read(&segment).unwrap(), [1u8; 64]);
    assert!(!dir.path().join("store").exists(), "nothing created");
}
