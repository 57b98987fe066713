//! The retention sweep against a decision on the same activity, with the
//! interleaving forced: the sweep takes no activity lock, so it can delete
//! the very version a report or a success has just loaded and is deciding
//! on. The decision saved after that must stay: readable at once, after
//! the next checkpoint and sweep, and after the store is reopened.
//!
//! Over the real server this order happens only by chance
//! (`tests/it/races.rs`); here the library's `Ledger` runs over the real
//! store behind a wrapper that holds one load until the sweep is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use retry_budget::budget::ErrorClass;
use retry_budget::budget::activity::{
    ActivityKey, ActivityRecord, Defaults, Policy, Report, Status,
};
use retry_budget::clock::now_ms;
use retry_budget::ledger::{Ledger, SuccessOutcome, Unlimited};
use retry_budget::store::{EmbeddedStore, EmbeddedStoreOptions, Replaced, Store, StoreError};
use tokio::sync::Notify;

/// Ten minutes, in milliseconds.
const RETENTION_MS: i64 = 600_000;

/// The real store; once armed, the next load, having read its record,
/// says so and waits to be let go.
#[derive(Clone)]
struct HeldLoad {
    inner: EmbeddedStore,
    armed: Arc<AtomicBool>,
    loaded: Arc<Notify>,
    release: Arc<Notify>,
}

impl Store for HeldLoad {
    async fn load(&self, key: &ActivityKey) -> Result<Option<ActivityRecord>, StoreError> {
        let found = self.inner.load(key).await;
        if self.armed.swap(false, Ordering::SeqCst) {
            self.loaded.notify_one();
            self.release.notified().await;
        }
        found
    }
    async fn save(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> Result<(), StoreError> {
        self.inner.save(record, replaces).await
    }
    async fn purge(&self, cutoff_ms: i64, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge(cutoff_ms, limit).await
    }
    async fn count(&self) -> Result<u64, StoreError> {
        self.inner.count().await
    }
    async fn save_paces(
        &self,
        paces: Vec<retry_budget::budget::token::PaceRecord>,
    ) -> Result<(), StoreError> {
        self.inner.save_paces(paces).await
    }
    async fn load_paces(&self) -> Result<Vec<retry_budget::budget::token::PaceRecord>, StoreError> {
        self.inner.load_paces().await
    }
}

fn key() -> ActivityKey {
    ActivityKey {
        tenant: "t".into(),
        activity_id: "expired".into(),
    }
}

fn failure(attempt: u32, occurred_at_ms: Option<i64>) -> Report<'static> {
    Report {
        attempt,
        class: ErrorClass::Transient,
        rule: None,
        hints: None,
        policy: None,
        occurred_at_ms,
        workflow_id: "wf",
        dependency: "",
    }
}

/// A ledger over the held store in `dir`, whose default policy gives an
/// activity one second.
fn ledger(dir: &std::path::Path) -> (Arc<Ledger<HeldLoad>>, HeldLoad) {
    let store = HeldLoad {
        inner: EmbeddedStore::open(&EmbeddedStoreOptions::new(dir)).unwrap(),
        armed: Arc::default(),
        loaded: Arc::default(),
        release: Arc::default(),
    };
    let defaults = Defaults {
        policy: Policy {
            max_attempts: 10,
            deadline_seconds: 1,
            base: Some(0),
            cap: Some(0),
        },
        max_hint_ms: 0,
    };
    (Arc::new(Ledger::new(store.clone(), defaults)), store)
}

/// Records attempt 1 of an activity that started an hour ago: its deadline
/// passed long before the retention period, so the next sweep deletes it.
async fn expired_activity(ledger: &Ledger<HeldLoad>) {
    let hour_ago = now_ms() - 3_600_000;
    let first = ledger
        .report(
            &key(),
            &failure(1, Some(hour_ago)),
            Unlimited,
            now_ms(),
            false,
        )
        .await
        .unwrap();
    assert_eq!(first.event.code, "schedule_retry");
}

/// Runs `op` with its load held, sweeps while it holds the loaded version
/// (the sweep must delete it, or the interleaving did not happen), then
/// lets it go and returns what it returned.
async fn with_sweep_after_load<T: Send + 'static>(
    ledger: &Arc<Ledger<HeldLoad>>,
    store: &HeldLoad,
    op: impl Future<Output = T> + Send + 'static,
) -> T {
    store.armed.store(true, Ordering::SeqCst);
    let running = tokio::spawn(op);
    tokio::time::timeout(Duration::from_secs(30), store.loaded.notified())
        .await
        .expect("the operation loads its record");
    let purged = tokio::time::timeout(
        Duration::from_secs(30),
        ledger.sweep(now_ms(), RETENTION_MS),
    )
    .await
    .expect(
        "the sweep waits for the held operation: if it now takes the activity's lock, \
         this interleaving can no longer happen and this test is obsolete",
    )
    .unwrap();
    assert_eq!(purged, 1, "the sweep deleted the version being decided on");
    assert_eq!(store.count().await.unwrap(), 0);
    store.release.notify_one();
    running.await.unwrap()
}

/// The record is readable now, after a checkpoint and another sweep, and
/// after the store is reopened; returns it.
async fn survives(dir: &std::path::Path, ledger: Arc<Ledger<HeldLoad>>) -> ActivityRecord {
    let now = ledger.get(&key()).await.expect("readable at once");
    assert_eq!(ledger.store().count().await.unwrap(), 1, "checkpointed");
    assert_eq!(ledger.sweep(now_ms(), RETENTION_MS).await.unwrap(), 0);
    assert_eq!(ledger.get(&key()).await.unwrap(), now);
    drop(ledger);
    let reopened = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir)).unwrap();
    let stored = reopened.load(&key()).await.unwrap();
    assert_eq!(
        stored.as_ref(),
        Some(&now),
        "the same record after reopening"
    );
    now
}

#[tokio::test]
async fn a_report_whose_loaded_version_is_swept_keeps_its_decision() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, store) = ledger(dir.path());
    expired_activity(&ledger).await;
    let decided = {
        let ledger = Arc::clone(&ledger);
        with_sweep_after_load(&Arc::clone(&ledger), &store, async move {
            // Stamped now: past the deadline, so the activity closes, and
            // becomes purgeable only a retention period from now.
            ledger
                .report(&key(), &failure(2, None), Unlimited, now_ms(), false)
                .await
        })
        .await
        .expect("decided on the version it loaded")
    };
    assert_eq!(decided.event.code, "deadline_exceeded");
    assert!(!decided.replayed);
    drop(store);
    let record = survives(dir.path(), ledger).await;
    assert_eq!((record.attempts, record.status), (2, Status::Closed));
    assert_eq!(record.events.last(), Some(&decided.event));
}

#[tokio::test]
async fn a_success_whose_loaded_version_is_swept_keeps_its_close() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, store) = ledger(dir.path());
    expired_activity(&ledger).await;
    let outcome = {
        let ledger = Arc::clone(&ledger);
        with_sweep_after_load(&Arc::clone(&ledger), &store, async move {
            ledger.record_success(&key(), None, now_ms()).await
        })
        .await
        .expect("recorded on the version it loaded")
    };
    assert_eq!(outcome, SuccessOutcome::Closed { left_line: None });
    drop(store);
    let record = survives(dir.path(), ledger).await;
    assert_eq!(record.status, Status::Closed);
    assert_eq!(record.closed_code.as_deref(), Some("succeeded"));
    assert_eq!(record.events.len(), 2);
}
