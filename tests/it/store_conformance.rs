//! The one conformance suite every [`Store`] must pass, run here against
//! each store the project has. A new store adds one `#[tokio::test]` that
//! calls [`conformance`] with a way to open it.

use crate::common::postgres;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use postgres::TestDb;
use retry_budget::budget::ErrorClass;
use retry_budget::budget::activity::{
    ActivityKey, ActivityRecord, Defaults, Plan, Policy, Report, Status, plan, record_success,
};
use retry_budget::budget::token::{HealthState, PaceRecord, TenantPaceRecord};
use retry_budget::store::{
    CheckpointFault, PgStore, PostgresOptions, RedbStore, RedbStoreOptions, Replaced, Store,
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
    match plan(None, k, &report, &defaults, NOW).expect("valid report") {
        Plan::Fresh(draft) => draft.finish().0,
        Plan::Replay(_) => unreachable!("a new activity has nothing to replay"),
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
    match plan(Some(prev.clone()), &prev.key(), &report, &defaults, NOW + 1).expect("valid report")
    {
        Plan::Fresh(draft) => draft.finish().0,
        Plan::Replay(_) => unreachable!("a new attempt is not a replay"),
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
    let recovered = pace("payments-api", 8.0, HealthState::Recovering);
    store.save_paces(vec![recovered.clone()]).await.unwrap();
    drop(store);
    let store = open();
    let mut kept = store.load_paces().await.unwrap();
    kept.sort_by(|a, b| a.dependency.cmp(&b.dependency));
    assert_eq!(kept, vec![busy, recovered]);
}

#[tokio::test]
async fn redb_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    conformance(move || RedbStore::open(&RedbStoreOptions::new(&path)).expect("open redb")).await;
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
async fn redb_saves_that_arrive_together_share_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap());
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
}

#[tokio::test]
async fn redb_batch_of_one_commits_each_save_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = RedbStoreOptions::new(dir.path());
    options.journal.max_batch = 1;
    let store = Arc::new(RedbStore::open(&options).unwrap());
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
async fn a_second_process_cannot_open_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let _first = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap();
    let second = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap_err();
    assert!(
        second.to_string().starts_with("store_unavailable"),
        "{second}"
    );
}

#[tokio::test]
async fn redb_store_conforms_with_a_checkpoint_after_every_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    conformance(move || {
        let mut options = RedbStoreOptions::new(&path);
        // Every group fills a segment: checkpoints run all the time, so
        // loads meet records in the active set, the frozen set and redb.
        options.journal.segment_bytes = 1;
        options.journal.commit_window = Duration::ZERO;
        RedbStore::open(&options).expect("open redb")
    })
    .await;
}

fn journal_segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("journal-"))
        })
        .collect();
    found.sort();
    found
}

/// A store that, when dropped, leaves its journal as a crash would: without
/// the final checkpoint.
fn open_to_crash(dir: &std::path::Path) -> RedbStore {
    let mut options = RedbStoreOptions::new(dir);
    options.checkpoint_on_close = false;
    RedbStore::open(&options).unwrap()
}

/// The store is dropped without its final checkpoint, as a crash would
/// leave it (the SIGKILL test in `tests/it/crash.rs` does the same to the real
/// binary): what was acknowledged is only in the journal, whose last group
/// is torn. Reopening replays it into redb, purge index included.
#[tokio::test]
async fn redb_journal_is_replayed_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_to_crash(dir.path());
    let mut expected = Vec::new();
    for i in 0..50 {
        let k = key("crash", &format!("act-{i}"));
        let first = record(&k, ErrorClass::Transient, 3600);
        store.save(first.clone(), None).await.unwrap();
        if i % 5 == 0 {
            let closed = record_success(first.clone(), Some(NOW + 1), NOW + 2).expect("open");
            store
                .save(closed.clone(), Some(Replaced::of(&first)))
                .await
                .unwrap();
            expected.push(closed);
        } else {
            expected.push(first);
        }
    }
    drop(store);

    let segments = journal_segments(dir.path());
    assert_eq!(segments.len(), 1, "nothing was checkpointed: {segments:?}");
    // A group whose fdatasync never returned: a frame announcing 32 bytes,
    // a wrong checksum, and only 3 bytes of payload.
    let mut torn = std::fs::OpenOptions::new()
        .append(true)
        .open(&segments[0])
        .unwrap();
    std::io::Write::write_all(&mut torn, &[32, 0, 0, 0, 9, 9, 9, 9, 1, 2, 3]).unwrap();
    drop(torn);

    let store = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap();
    let replayed = journal_segments(dir.path());
    assert_eq!(replayed.len(), 1, "only the new segment is left");
    assert_ne!(replayed[0], segments[0]);
    for r in &expected {
        assert_eq!(store.load(&r.key()).await.unwrap().as_ref(), Some(r));
    }
    assert_eq!(store.count().await.unwrap(), 50);
    // The ten closed ones were put in the purge index by the replay.
    assert_eq!(store.purge(NOW + 3, 1000).await.unwrap(), 10);
    assert_eq!(store.count().await.unwrap(), 40);
}

#[tokio::test]
async fn redb_a_closed_store_leaves_no_journal_behind() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap();
    let k = key("clean", "a");
    let r = record(&k, ErrorClass::Transient, 60);
    store.save(r.clone(), None).await.unwrap();
    drop(store);
    assert_eq!(
        journal_segments(dir.path()),
        Vec::<std::path::PathBuf>::new()
    );
    let store = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap();
    assert_eq!(loaded(&store, &k).await, Some(r));
}

/// A checkpointed segment is recycled: the next segment writes over it, and
/// past its new entries it still holds its old ones, intact. A crash then
/// must replay only the new ones: replaying an old one would put back a
/// version older than the one redb holds.
#[tokio::test]
async fn redb_a_recycled_segment_replays_only_its_new_entries() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_to_crash(dir.path());
    let keys: Vec<_> = (0..10).map(|i| key("recycle", &format!("k{i}"))).collect();
    let firsts: Vec<_> = keys
        .iter()
        .map(|k| record(k, ErrorClass::Transient, 3600))
        .collect();
    for first in &firsts {
        store.save(first.clone(), None).await.unwrap();
    }
    // The segment holding the ten first versions is checkpointed and kept
    // as the spare.
    store.checkpoint().await.unwrap();
    assert!(dir.path().join("journal.spare").exists());
    let mut newest = Vec::new();
    for first in &firsts {
        let closed = record_success(first.clone(), Some(NOW + 1), NOW + 2).expect("open");
        store
            .save(closed.clone(), Some(Replaced::of(first)))
            .await
            .unwrap();
        newest.push(closed);
    }
    // The next segment is the spare, written over; the closed versions are
    // checkpointed into redb.
    store.checkpoint().await.unwrap();
    // One new entry, as long as the old first one ("x0" and "k0" are the
    // same length): the old second entry is now where a next entry would be.
    let x0 = record(&key("recycle", "x0"), ErrorClass::Transient, 3600);
    store.save(x0.clone(), None).await.unwrap();
    drop(store);

    let segments = journal_segments(dir.path());
    assert_eq!(segments.len(), 1, "{segments:?}");
    let len = std::fs::metadata(&segments[0]).unwrap().len();
    assert!(len > 1000, "the segment is the recycled one ({len} bytes)");

    let store = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap();
    for r in newest.iter().chain([&x0]) {
        assert_eq!(store.load(&r.key()).await.unwrap().as_ref(), Some(r));
    }
    assert_eq!(store.count().await.unwrap(), 11);
}

/// Where a spare cannot be recycled (here it is replaced by a directory, as
/// a file system that refuses the rename would fail it), the store creates
/// new segments, deletes checkpointed ones, and loses nothing.
#[tokio::test]
async fn redb_a_spare_that_cannot_be_recycled_changes_nothing_stored() {
    let dir = tempfile::tempdir().unwrap();
    let spare = dir.path().join("journal.spare");
    let store = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap();
    let mut saved = Vec::new();
    for i in 0..4 {
        let r = record(&key("spare", &format!("a{i}")), ErrorClass::Transient, 3600);
        store.save(r.clone(), None).await.unwrap();
        saved.push(r);
        store.checkpoint().await.unwrap();
        if i == 0 {
            assert!(spare.is_file(), "the first checkpoint kept its segment");
            std::fs::remove_file(&spare).unwrap();
            std::fs::create_dir(&spare).unwrap();
            std::fs::write(spare.join("in the way"), b"").unwrap();
        }
        assert_eq!(journal_segments(dir.path()).len(), 1, "after save {i}");
    }
    for r in &saved {
        assert_eq!(store.load(&r.key()).await.unwrap().as_ref(), Some(r));
    }
    drop(store);
    assert!(spare.join("in the way").exists(), "left alone");
    std::fs::remove_dir_all(&spare).unwrap();
    let store = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap();
    for r in &saved {
        assert_eq!(store.load(&r.key()).await.unwrap().as_ref(), Some(r));
    }
    assert_eq!(store.count().await.unwrap(), 4);
}

/// Generations start again at 1 when a store opens on a directory with no
/// segment. A spare left by an earlier run may hold entries of the very
/// generation it would be recycled as: reopening must not recycle it, or a
/// crash would replay one of those old entries over a newer version.
#[tokio::test]
async fn redb_a_spare_left_by_an_earlier_run_is_not_recycled() {
    let dir = tempfile::tempdir().unwrap();
    let k = key("earlier", "k");
    let v1 = record(&k, ErrorClass::Transient, 3600);
    let v2 = next_failure(&v1);
    let v3 = record_success(v2.clone(), Some(NOW + 2), NOW + 3).expect("open");
    {
        // Generation 1 holds v1, generation 2 v2; after the second
        // checkpoint the spare is generation 2's file, holding v2.
        let store = open_to_crash(dir.path());
        store.save(v1.clone(), None).await.unwrap();
        store.checkpoint().await.unwrap();
        store
            .save(v2.clone(), Some(Replaced::of(&v1)))
            .await
            .unwrap();
        store.checkpoint().await.unwrap();
    }
    // No segment left (the one being written held nothing): the next run
    // starts at generation 1 again.
    for segment in journal_segments(dir.path()) {
        std::fs::remove_file(segment).unwrap();
    }
    assert!(dir.path().join("journal.spare").exists());
    {
        // v3 is saved in generation 1 and checkpointed into redb; the
        // writer moves on to generation 2, and the run ends before it
        // writes anything there.
        let store = open_to_crash(dir.path());
        assert_eq!(loaded(&store, &k).await.as_ref(), Some(&v2));
        store
            .save(v3.clone(), Some(Replaced::of(&v2)))
            .await
            .unwrap();
        store.checkpoint().await.unwrap();
    }
    let store = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap();
    assert_eq!(loaded(&store, &k).await.as_ref(), Some(&v3));
}

/// A checkpoint that keeps failing (as when the database refuses its
/// writes) does not make the store hold saves without bound: once the
/// journal waiting for a checkpoint reaches `backlog_bytes`, saves are
/// refused at once with `store_backlogged` and a time to come back
/// (`UNAVAILABLE` at the gRPC edge). What was acknowledged stays readable,
/// and once checkpoints succeed again saves are taken and everything
/// acknowledged reaches the database.
#[tokio::test]
async fn redb_a_failing_checkpoint_refuses_saves_instead_of_holding_them() {
    const BACKLOG: u64 = 16 << 10;
    let dir = tempfile::tempdir().unwrap();
    let failing = Arc::new(AtomicBool::new(true));
    let mut options = RedbStoreOptions::new(dir.path());
    options.journal.segment_bytes = 2 << 10;
    options.journal.backlog_bytes = BACKLOG;
    options.journal.commit_window = Duration::ZERO;
    options.checkpoint_fault = Some(CheckpointFault(Arc::new({
        let failing = Arc::clone(&failing);
        move || failing.load(Ordering::SeqCst)
    })));
    let store = RedbStore::open(&options).unwrap();
    let next = |n: usize| {
        record(
            &key("backlog", &format!("act-{n}")),
            ErrorClass::Transient,
            3600,
        )
    };

    let mut acknowledged = Vec::new();
    let refused = loop {
        let r = next(acknowledged.len());
        match store.save(r.clone(), None).await {
            Ok(()) => acknowledged.push(r),
            Err(e) => break e,
        }
        assert!(acknowledged.len() < 1000, "saves were never refused");
    };
    assert!(
        acknowledged.len() > 10,
        "refused too soon: {}",
        acknowledged.len()
    );
    assert_eq!(refused.code(), "store_backlogged", "{refused}");
    assert!(
        refused.to_string().starts_with("store_backlogged: "),
        "{refused}"
    );
    let retry_after = refused.retry_after().expect("a time to come back");
    assert!(retry_after > Duration::ZERO);
    assert_eq!(
        tonic::Status::from(refused).code(),
        tonic::Code::Unavailable
    );

    // Refused again, not taken: the journal stays within the bound (plus
    // the one save that reached it), and so do the records in memory.
    let again = store
        .save(next(acknowledged.len()), None)
        .await
        .unwrap_err();
    assert_eq!(again.code(), "store_backlogged");
    let journal: u64 = journal_segments(dir.path())
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(journal <= BACKLOG + 1024, "{journal} bytes of journal");
    for r in &acknowledged {
        assert_eq!(loaded(&store, &r.key()).await.as_ref(), Some(r));
    }
    let checkpoint = store.checkpoint().await.unwrap_err();
    assert!(
        checkpoint.to_string().starts_with("store_unavailable: "),
        "{checkpoint}"
    );

    // The database comes back: saves are taken again once checkpoints
    // free room (while they catch up, some are still told to come back).
    failing.store(false, Ordering::SeqCst);
    for _ in 0..40 {
        let r = next(acknowledged.len());
        save_when_taken(&store, r.clone()).await;
        acknowledged.push(r);
    }
    store.checkpoint().await.unwrap();
    drop(store);

    let store = RedbStore::open(&RedbStoreOptions::new(dir.path())).unwrap();
    for r in &acknowledged {
        assert_eq!(loaded(&store, &r.key()).await.as_ref(), Some(r));
    }
    assert_eq!(store.count().await.unwrap(), acknowledged.len() as u64);
}

/// Saves `r`, coming back as told while the store is backlogged.
async fn save_when_taken(store: &RedbStore, r: ActivityRecord) {
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
