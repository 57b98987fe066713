//! The embedded default store: one [fjall](https://docs.rs/fjall) database
//! under `--data-dir`, needing no server.
//!
//! fjall is a log-structured merge tree made for write throughput: a batch
//! is appended to its journal and its memtable, and the journal's
//! `fdatasync` makes it durable; its own threads flush memtables to sorted
//! files and compact them. So a decision costs an append and a share of one
//! fsync, and the store keeps no journal, overlay or checkpoint of its own.
//!
//! # Writes
//! Every change goes through one writer thread ([`writer`]): the saves
//! waiting are one batch and one fsync (group commit), acknowledged only
//! once durable. At most [`EmbeddedStoreOptions::max_pending`] saves wait
//! for it; past that a save is refused at once with
//! [`StoreError::Backlogged`] (the disk is slower than the requests), so
//! memory stays bounded and nothing acknowledged is at risk.
//!
//! # Reads
//! `load` reads fjall directly: a batch is in the memtable before its save
//! is acknowledged, and the ledger serialises the work on each activity, so
//! a load sees every save acknowledged before it.
//!
//! # An earlier version's data directory
//! A directory that holds the redb file the store kept before it moved onto
//! fjall is imported on first open ([`import`]), and the file is then
//! renamed aside.

mod import;
mod keys;
mod writer;

use std::error::Error;
use std::future::ready;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fjall::{Database, KeyspaceCreateOptions};
use futures_util::FutureExt;
use futures_util::future::Either;
use tokio::sync::oneshot;

use self::writer::{Change, Keyspaces, Save, Writer};
use super::{CommitStats, Replaced, Store, StoreError, codec};
use crate::budget::activity::{ActivityKey, ActivityRecord};
use crate::budget::token::PaceRecord;

/// The directory of the fjall database inside the data directory.
pub const DB_DIR: &str = "store";

/// How long a save refused because too many wait is asked to wait: about
/// the time the writer takes to commit a few full groups.
pub const BACKLOGGED_RETRY_AFTER: Duration = Duration::from_millis(50);

/// How the embedded store is opened.
#[derive(Debug, Clone)]
pub struct EmbeddedStoreOptions {
    /// The directory that holds the database; created if missing.
    pub data_dir: PathBuf,
    /// The most saves one group commit (one fsync) carries; 1 commits each
    /// save alone.
    pub max_batch: usize,
    /// The most saves that may wait for the writer; a save past them is
    /// refused with [`StoreError::Backlogged`].
    pub max_pending: usize,
    /// fjall's block cache, in bytes.
    pub cache_bytes: u64,
}

/// Each keyspace's memtable: full, it is sealed and flushed to a sorted
/// table while the next fills, so the two together bound its memory.
const MEMTABLE_BYTES: u64 = 16 << 20;

/// The default most saves a group commit carries (`[store] max_batch`).
pub const DEFAULT_MAX_BATCH: usize = 1024;

/// How many full groups may wait for the writer: enough to ride out an
/// fsync many times slower than usual, few enough that a disk that cannot
/// keep up is told at once rather than after seconds of queue.
const PENDING_GROUPS: usize = 16;

impl EmbeddedStoreOptions {
    /// Defaults for a data directory: groups of up to [`DEFAULT_MAX_BATCH`]
    /// saves, sixteen groups' worth waiting at most, and 32 MiB
    /// of cache.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self::with_max_batch(data_dir, DEFAULT_MAX_BATCH)
    }

    /// As [`new`](Self::new), with groups of up to `max_batch` saves (and
    /// sixteen groups' worth waiting at most).
    pub fn with_max_batch(data_dir: impl Into<PathBuf>, max_batch: usize) -> Self {
        Self {
            data_dir: data_dir.into(),
            max_batch,
            max_pending: PENDING_GROUPS * max_batch,
            cache_bytes: 32 << 20,
        }
    }
}

/// The embedded store. Cheap to clone: clones share the database and its
/// writer, which stops when the last clone drops.
#[derive(Clone)]
pub struct EmbeddedStore {
    keyspaces: Keyspaces,
    dir: PathBuf,
    /// The writer's queue; `None` once closed.
    changes: Arc<Mutex<Option<SyncSender<Change>>>>,
    count: Arc<AtomicU64>,
    stats: Arc<CommitStats>,
    _writer: Arc<WriterThread>,
}

/// Joins the writer when the last clone of the store drops, so that a
/// store reopened in the same process finds the directory free.
struct WriterThread {
    changes: Arc<Mutex<Option<SyncSender<Change>>>>,
    handle: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for WriterThread {
    fn drop(&mut self) {
        lock(&self.changes).take();
        if let Some(handle) = lock(&self.handle).take() {
            let _ = handle.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every write under these locks is one assignment: a panic elsewhere
    // cannot leave one half-made.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Maps a failure of `op` to [`StoreError::Backend`], keeping it as the
/// source.
fn backend<E: Into<Box<dyn Error + Send + Sync>>>(
    op: &'static str,
) -> impl FnOnce(E) -> StoreError {
    move |source| StoreError::Backend {
        op,
        source: source.into(),
    }
}

fn corrupt(key: &ActivityKey, source: codec::DecodeError) -> StoreError {
    StoreError::Corrupt {
        key: format!("{}/{}", key.tenant, key.activity_id),
        source,
    }
}

/// An error that names the path it is about.
fn at_path(path: &Path, error: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{}: {error}", path.display()))
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `options.data_dir`, importing an
    /// earlier version's redb file if that is what the directory holds, and
    /// starts the writer thread.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the directory cannot be opened (for
    /// example because another process holds it) or an earlier version's
    /// data cannot be imported.
    pub fn open(options: &EmbeddedStoreOptions) -> Result<Self, StoreError> {
        let dir = &options.data_dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| at_path(dir, e))
            .map_err(backend("create the data directory"))?;
        import::refuse_unreplayed(dir)?;
        let path = dir.join(DB_DIR);
        let db = Database::builder(&path)
            .cache_size(options.cache_bytes)
            // The writer persists every batch itself, once per group.
            .manual_journal_persist(true)
            .open()
            .map_err(|e| at_path(&path, e))
            .map_err(backend("open the database"))?;
        const KEYSPACES: &str = "open the keyspaces";
        let open = |name: &str| {
            db.keyspace(name, || {
                KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_BYTES)
            })
            .map_err(backend(KEYSPACES))
        };
        let keyspaces = Keyspaces {
            activities: open("activities")?,
            purge_index: open("purge_index")?,
            paces: open("paces")?,
            meta: open("meta")?,
        };
        import::from_redb(dir, &db, &keyspaces)?;
        let count = keyspaces
            .meta
            .get(keys::COUNT)
            .map_err(backend("read the count"))?
            .map_or(0, |v| keys::parse_count(&v));
        let count = Arc::new(AtomicU64::new(count));
        let stats = Arc::new(CommitStats::default());
        let max_batch = options.max_batch.max(1);
        let (sender, receiver) = std::sync::mpsc::sync_channel(options.max_pending.max(1));
        let writer = Writer {
            db: db.clone(),
            keyspaces: keyspaces.clone(),
            max_batch,
            count: Arc::clone(&count),
            stats: Arc::clone(&stats),
        };
        let handle = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(receiver))
            .map_err(backend("start the writer"))?;
        let changes = Arc::new(Mutex::new(Some(sender)));
        Ok(Self {
            keyspaces,
            dir: dir.clone(),
            changes: Arc::clone(&changes),
            count,
            stats,
            _writer: Arc::new(WriterThread {
                changes,
                handle: Mutex::new(Some(handle)),
            }),
        })
    }

    /// Up to `limit` records in key order, after `after` (from the first
    /// when `None`): what `retry-budget migrate` copies.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when fjall fails, [`StoreError::Corrupt`] for
    /// a record that does not decode.
    pub fn scan(
        &self,
        after: Option<&ActivityKey>,
        limit: usize,
    ) -> Result<Vec<ActivityRecord>, StoreError> {
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, |k| {
            Bound::Excluded(keys::activity(&k.tenant, &k.activity_id))
        });
        let mut records = Vec::with_capacity(limit.min(4096));
        for row in self
            .keyspaces
            .activities
            .range::<Vec<u8>, _>((start, Bound::Unbounded))
            .take(limit)
        {
            let (key, value) = row.into_inner().map_err(backend("scan"))?;
            let record = codec::decode(&value).map_err(|source| {
                let key = keys::parse_activity(&key).unwrap_or(ActivityKey {
                    tenant: String::new(),
                    activity_id: String::from_utf8_lossy(&key).into_owned(),
                });
                corrupt(&key, source)
            })?;
            records.push(record);
        }
        Ok(records)
    }

    /// Group-commit counters.
    pub fn commit_stats(&self) -> &CommitStats {
        &self.stats
    }

    /// Hands `change` to the writer; refused at once while `max_pending`
    /// wait.
    fn send(&self, change: Change) -> Result<(), StoreError> {
        let changes = lock(&self.changes);
        let Some(sender) = changes.as_ref() else {
            return Err(StoreError::Closed);
        };
        match sender.try_send(change) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(StoreError::Backlogged {
                retry_after: BACKLOGGED_RETRY_AFTER,
            }),
            Err(TrySendError::Disconnected(_)) => Err(StoreError::Closed),
        }
    }

    /// Hands a change that is not a decision's to the writer, waiting
    /// for room rather than being refused: the sweep and the paces are not
    /// on the request path.
    async fn send_waiting(&self, mut change: Change) -> Result<(), StoreError> {
        loop {
            let full = {
                let changes = lock(&self.changes);
                let Some(sender) = changes.as_ref() else {
                    return Err(StoreError::Closed);
                };
                match sender.try_send(change) {
                    Ok(()) => return Ok(()),
                    Err(TrySendError::Full(back)) => back,
                    Err(TrySendError::Disconnected(_)) => return Err(StoreError::Closed),
                }
            };
            change = full;
            tokio::time::sleep(BACKLOGGED_RETRY_AFTER).await;
        }
    }

    fn submit(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> Result<oneshot::Receiver<Result<(), StoreError>>, StoreError> {
        let purge_now = record.purgeable_from_ms();
        let mut value = Vec::with_capacity(codec::RECORD_CAPACITY);
        let key = codec::encode_into(record, &mut value);
        let (done, acked) = oneshot::channel();
        self.send(Change::Save(Save {
            tenant: key.tenant,
            activity_id: key.activity_id,
            value,
            purge_was: replaces.and_then(|r| r.purgeable_from_ms),
            purge_now,
            done,
        }))?;
        Ok(acked)
    }
}

impl Store for EmbeddedStore {
    fn commit_stats(&self) -> Option<&CommitStats> {
        Some(&self.stats)
    }

    async fn load(&self, key: &ActivityKey) -> Result<Option<ActivityRecord>, StoreError> {
        let Some(value) = self
            .keyspaces
            .activities
            .get(keys::activity(&key.tenant, &key.activity_id))
            .map_err(backend("read a record"))?
        else {
            return Ok(None);
        };
        codec::decode(&value)
            .map(Some)
            .map_err(|source| corrupt(key, source))
    }

    /// Encodes the record and hands it to the writer in the call; the
    /// future only waits for the writer's answer.
    fn save(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        match self.submit(record, replaces) {
            Ok(acked) => {
                Either::Left(acked.map(|answer| answer.unwrap_or(Err(StoreError::Closed))))
            }
            Err(e) => Either::Right(ready(Err(e))),
        }
    }

    async fn purge(&self, cutoff_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let (done, purged) = oneshot::channel();
        self.send_waiting(Change::Purge {
            cutoff_ms,
            limit,
            done,
        })
        .await?;
        purged.await.unwrap_or(Err(StoreError::Closed))
    }

    async fn save_paces(&self, paces: Vec<PaceRecord>) -> Result<(), StoreError> {
        let paces = paces
            .iter()
            .map(|p| (p.dependency.clone(), codec::encode_pace(p)))
            .collect();
        let (done, saved) = oneshot::channel();
        self.send_waiting(Change::Paces { paces, done }).await?;
        saved.await.unwrap_or(Err(StoreError::Closed))
    }

    async fn load_paces(&self) -> Result<Vec<PaceRecord>, StoreError> {
        let mut paces = Vec::new();
        for row in self.keyspaces.paces.iter() {
            let value = row.value().map_err(backend("load the paces"))?;
            // A pace that does not decode is skipped: it is advice, and the
            // next save replaces it.
            if let Ok(pace) = codec::decode_pace(&value) {
                paces.push(pace);
            }
        }
        Ok(paces)
    }

    async fn count(&self) -> Result<u64, StoreError> {
        Ok(self.count.load(Ordering::Relaxed))
    }
}
