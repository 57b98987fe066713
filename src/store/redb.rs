//! The embedded default store: one redb file under `--data-dir`, needing no
//! server.
//!
//! # Why redb
//! A pure-Rust, ACID, copy-on-write B-tree with one writer and lock-free
//! readers: a commit with `Durability::Immediate` is durable when it returns
//! (it fsyncs), a crash at any moment leaves the last commit intact, and it
//! needs no C toolchain or background compaction.
//!
//! # Group commit
//! Saves are not committed one by one. They go to a single writer thread
//! that takes whatever is waiting (up to `max_batch`), writes it all in one
//! transaction, commits once (one fsync), and then acknowledges every save in
//! the batch. Under load many decisions share each fsync; alone, a save costs
//! one fsync and no added wait. `max_batch = 1` gives the naive design (one
//! fsync a decision), kept as a benchmark baseline.
//!
//! # Layout
//! - `activities`: `(tenant, activity_id)` -> the record as JSON (readable
//!   with any redb tool, and tolerant of fields added later);
//! - `purge_index`: `(purgeable_from_ms, tenant, activity_id)` -> `()`, so the
//!   retention sweeper finds expired records without scanning them all.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use super::{Store, StoreError};
use crate::budget::activity::{ActivityKey, ActivityRecord};

const ACTIVITIES: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("activities");
const PURGE_INDEX: TableDefinition<(i64, &str, &str), ()> = TableDefinition::new("purge_index");

/// The file name of the database inside the data directory.
pub const DB_FILE: &str = "retry-budget.redb";

/// How the redb store is opened.
#[derive(Debug, Clone)]
pub struct RedbStoreOptions {
    /// The directory that holds the database file; created if missing.
    pub data_dir: PathBuf,
    /// The most saves one commit (one fsync) may carry.
    pub max_batch: usize,
    /// redb's page cache, in bytes: bounds the memory the store uses
    /// whatever the number of activities.
    pub cache_bytes: usize,
}

impl RedbStoreOptions {
    /// Defaults for a data directory: batches of up to 1024, 64 MiB cache.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            max_batch: 1024,
            cache_bytes: 64 << 20,
        }
    }
}

/// A save waiting for the writer.
struct Write {
    key: ActivityKey,
    value: Vec<u8>,
    old_purge: Option<i64>,
    new_purge: Option<i64>,
    done: oneshot::Sender<Result<(), String>>,
}

/// Group-commit counters, for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct CommitStats {
    /// Commits (fsyncs) made.
    pub commits: AtomicU64,
    /// Saves those commits carried.
    pub saves: AtomicU64,
}

/// The embedded store. Cheap to clone: clones share the database and writer.
#[derive(Clone)]
pub struct RedbStore {
    db: Arc<Database>,
    writer: Arc<WriterHandle>,
    stats: Arc<CommitStats>,
}

/// The writer thread and its queue. Dropping the last handle closes the
/// queue and waits for the thread to commit what it holds, so the database
/// file is released when the last clone of the store is gone.
struct WriterHandle {
    writes: Option<mpsc::Sender<Write>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Drop for WriterHandle {
    fn drop(&mut self) {
        drop(self.writes.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the redb writer thread panicked");
        }
    }
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore").finish_non_exhaustive()
    }
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl RedbStore {
    /// Opens (or creates) the database in `options.data_dir` and starts its
    /// writer thread, which stops when the last clone of the store drops.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the directory or file cannot be opened,
    /// for example because another process holds it.
    pub fn open(options: &RedbStoreOptions) -> Result<Self, StoreError> {
        std::fs::create_dir_all(&options.data_dir).map_err(|e| {
            StoreError::Backend(format!("cannot create {}: {e}", options.data_dir.display()))
        })?;
        let path = options.data_dir.join(DB_FILE);
        let db = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create(&path)
            .map_err(|e| StoreError::Backend(format!("cannot open {}: {e}", path.display())))?;
        let txn = db.begin_write().map_err(backend)?;
        txn.open_table(ACTIVITIES).map_err(backend)?;
        txn.open_table(PURGE_INDEX).map_err(backend)?;
        txn.commit().map_err(backend)?;
        let db = Arc::new(db);
        let stats = Arc::new(CommitStats::default());
        let (writes, queue) = mpsc::channel(options.max_batch.max(1) * 4);
        let writer = Writer {
            db: Arc::clone(&db),
            stats: Arc::clone(&stats),
            max_batch: options.max_batch.max(1),
        };
        let thread = thread::Builder::new()
            .name("redb-writer".into())
            .spawn(move || writer.run(queue))
            .map_err(backend)?;
        let writer = Arc::new(WriterHandle {
            writes: Some(writes),
            thread: Some(thread),
        });
        Ok(Self { db, writer, stats })
    }

    /// The database file of a data directory.
    pub fn file_in(data_dir: &Path) -> PathBuf {
        data_dir.join(DB_FILE)
    }

    /// Group-commit counters.
    pub fn commit_stats(&self) -> &CommitStats {
        &self.stats
    }
}

struct Writer {
    db: Arc<Database>,
    stats: Arc<CommitStats>,
    max_batch: usize,
}

impl Writer {
    fn run(self, mut queue: mpsc::Receiver<Write>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while let Some(first) = queue.blocking_recv() {
            batch.push(first);
            while batch.len() < self.max_batch {
                match queue.try_recv() {
                    Ok(write) => batch.push(write),
                    Err(_) => break,
                }
            }
            let result = self.commit(&batch).map_err(|e| e.to_string());
            if result.is_ok() {
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .saves
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            } else {
                tracing::error!(error = ?result, saves = batch.len(), "group commit failed");
            }
            for write in batch.drain(..) {
                // A caller that gave up (its request was cancelled) no longer
                // listens; its write is durable all the same.
                let _ = write.done.send(result.clone());
            }
        }
    }

    fn commit(&self, batch: &[Write]) -> Result<(), redb::Error> {
        let txn = self.db.begin_write()?;
        {
            let mut activities = txn.open_table(ACTIVITIES)?;
            let mut index = txn.open_table(PURGE_INDEX)?;
            for w in batch {
                let (tenant, id) = (w.key.tenant.as_str(), w.key.activity_id.as_str());
                activities.insert((tenant, id), w.value.as_slice())?;
                if w.old_purge != w.new_purge {
                    if let Some(at) = w.old_purge {
                        index.remove((at, tenant, id))?;
                    }
                    if let Some(at) = w.new_purge {
                        index.insert((at, tenant, id), ())?;
                    }
                }
            }
        }
        txn.commit()?;
        Ok(())
    }
}

impl Store for RedbStore {
    async fn load(&self, key: &ActivityKey) -> Result<Option<ActivityRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(backend)?;
        let table = txn.open_table(ACTIVITIES).map_err(backend)?;
        let Some(value) = table
            .get((key.tenant.as_str(), key.activity_id.as_str()))
            .map_err(backend)?
        else {
            return Ok(None);
        };
        serde_json::from_slice(value.value())
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                key: format!("{}/{}", key.tenant, key.activity_id),
                detail: e.to_string(),
            })
    }

    async fn save(
        &self,
        record: &ActivityRecord,
        previous: Option<&ActivityRecord>,
    ) -> Result<(), StoreError> {
        let value = serde_json::to_vec(record).map_err(backend)?;
        let (done, acked) = oneshot::channel();
        let write = Write {
            key: record.key(),
            value,
            old_purge: previous.and_then(ActivityRecord::purgeable_from_ms),
            new_purge: record.purgeable_from_ms(),
            done,
        };
        let writes = self.writer.writes.as_ref().ok_or(StoreError::Closed)?;
        writes.send(write).await.map_err(|_| StoreError::Closed)?;
        acked
            .await
            .map_err(|_| StoreError::Closed)?
            .map_err(StoreError::Backend)
    }

    async fn purge(&self, cutoff_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || purge_blocking(&db, cutoff_ms, limit))
            .await
            .map_err(backend)?
            .map_err(backend)
    }

    async fn count(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(backend)?;
        let table = txn.open_table(ACTIVITIES).map_err(backend)?;
        table.len().map_err(backend)
    }
}

/// One write transaction that deletes up to `limit` expired activities. It
/// runs beside the group-commit writer: redb serialises write transactions,
/// so a sweep only delays the next batch by its own short commit.
fn purge_blocking(db: &Database, cutoff_ms: i64, limit: usize) -> Result<usize, redb::Error> {
    let txn = db.begin_write()?;
    let mut purged = 0;
    {
        let mut activities = txn.open_table(ACTIVITIES)?;
        let mut index = txn.open_table(PURGE_INDEX)?;
        let expired: Vec<(i64, String, String)> = index
            .range((i64::MIN, "", "")..(cutoff_ms, "", ""))?
            .take(limit)
            .map(|entry| {
                entry.map(|(k, _)| {
                    let (at, tenant, id) = k.value();
                    (at, tenant.to_owned(), id.to_owned())
                })
            })
            .collect::<Result<_, _>>()?;
        for (at, tenant, id) in &expired {
            index.remove((*at, tenant.as_str(), id.as_str()))?;
            activities.remove((tenant.as_str(), id.as_str()))?;
            purged += 1;
        }
    }
    txn.commit()?;
    Ok(purged)
}
