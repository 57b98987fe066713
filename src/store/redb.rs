//! The embedded default store: a write-ahead journal in front of one redb
//! file under `--data-dir`, needing no server.
//!
//! # Why a journal in front of redb
//! redb is a pure-Rust, ACID, copy-on-write B-tree: a crash at any moment
//! leaves its last commit intact. But a commit rewrites every B-tree page it
//! touches, so a commit per group of decisions costs far more than the
//! fsync it waits for, and more as the tree grows. So a decision is made
//! durable the way databases do it: appended to a journal, one `fdatasync`
//! for the whole group, and acknowledged. The records it changed are kept
//! in memory and written to redb later in one large transaction (a
//! checkpoint), after which the journal segment is retired.
//!
//! # The write path
//! - `save` encodes the record and hands it to the **writer thread**
//!   ([`writer`]), which takes whatever is waiting (up to `max_batch`),
//!   appends it to the journal segment with one `write` and one `fdatasync`
//!   (group commit), puts the records in the in-memory *active* set
//!   ([`overlay`]), and acknowledges every save of the group. Under load it
//!   starts a group at most every `commit_window`, so that more saves share
//!   each fsync, or sooner once as many saves wait as recent groups
//!   carried, or once the runtime runs out of work ([`RuntimeIdle`],
//!   [`gate`]). `max_batch = 1` gives one fsync a decision, the reference
//!   group commit is measured against.
//! - When the segment reaches `segment_bytes`, or is older than
//!   `segment_age`, the writer starts a new segment and freezes the active
//!   set. The **checkpoint thread** ([`checkpoint`]) writes the frozen set to
//!   redb in one durable transaction, retires the segment, and drops the
//!   frozen set. A record saved many times within a segment is written to
//!   redb once. The checkpoint thread runs at a lower priority than the rest
//!   of the process (Linux): it takes the CPU that requests leave. It also
//!   yields the core every [`YIELD_EVERY`](tables::YIELD_EVERY) records it
//!   writes or frees: a lower priority gives it a smaller share, not shorter
//!   turns, and a thread on a core keeps it until its time slice ends (up to
//!   a scheduler tick, several milliseconds) unless it blocks or yields,
//!   while the requests that came in meanwhile wait.
//! - While a checkpoint runs, or fails and is retried, no segment is frozen
//!   and the one being written grows. Once the journal bytes waiting for a
//!   checkpoint reach `backlog_bytes`, saves are refused at once with
//!   [`StoreError::Backlogged`] ([`backlog`]): memory and disk stay bounded,
//!   nothing acknowledged is at risk, and saves are taken again once a
//!   checkpoint frees room.
//!
//! # Reads
//! `load` looks in the active set, then the frozen set, then redb (through a
//! read snapshot renewed after every commit): the newest version wins.
//! `purge` and `count` first checkpoint what is pending, so they see every
//! acknowledged save.
//!
//! # Recovery
//! On open, segments left by a crash are replayed into redb ([`recovery`]).
//!
//! The tables of the redb file are described in [`tables`].

mod backlog;
mod checkpoint;
mod gate;
mod overlay;
mod recovery;
mod tables;
mod writer;

use std::error::Error;
use std::future::ready;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::Either;
use redb::{Database, ReadOnlyTable, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use tokio::sync::oneshot;

use self::backlog::Backlog;
use self::overlay::{Overlay, Pending};
use self::tables::{ACTIVITIES, PURGE_INDEX, snapshot};
use self::writer::{Command, Write, WriteError, WriterHandle};
use super::{CommitStats, Replaced, Store, StoreError};
use super::{codec, journal};
use crate::budget::activity::{ActivityKey, ActivityRecord};
use crate::budget::token::PaceRecord;
pub use gate::RuntimeIdle;

/// The file name of the database inside the data directory.
pub const DB_FILE: &str = "retry-budget.redb";

/// How the journal groups saves into commits and when a segment is
/// checkpointed: the `[store]` keys the embedded store reads (the file's
/// names in serde's), each declared and given its default here once.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct JournalOptions {
    /// The most saves one journal `fdatasync` may carry; 1 commits each
    /// save alone. 1 to 65536.
    pub max_batch: usize,
    /// Under load (the last group carried more than one save), how long
    /// from the start of one group commit the next may wait for saves to
    /// share its fsync; it starts sooner once as many saves wait as recent
    /// groups carried. A save that arrives alone is committed at once. Zero
    /// commits as soon as the previous fsync returns.
    #[serde(with = "crate::setting::duration")]
    pub commit_window: Duration,
    /// A journal segment this large is checkpointed into redb. Records
    /// waiting for a checkpoint are held in memory: those of the segment
    /// being written and of the one being checkpointed. 1 KiB to 1 GiB.
    #[serde(rename = "journal_segment_bytes")]
    pub segment_bytes: u64,
    /// A segment older than this is checkpointed even when small, so that
    /// redb alone is never far behind and recovery replays little.
    #[serde(rename = "journal_segment_age", with = "crate::setting::duration")]
    pub segment_age: Duration,
    /// Journal bytes waiting for a checkpoint (the segment being written and
    /// the one being checkpointed) from which saves are refused with
    /// [`StoreError::Backlogged`], when checkpoints fall behind or fail. It
    /// bounds the memory the pending records take. At least twice
    /// `segment_bytes` is used, so that a segment can always be frozen
    /// before saves are refused.
    pub backlog_bytes: u64,
}

impl Default for JournalOptions {
    /// Groups of up to 1024 saves, a 2 ms commit window, 8 MiB or 5 s
    /// segments, saves refused from 24 MiB waiting for a checkpoint (three
    /// segments). The records waiting take several times their journal
    /// bytes in memory (decoded in the overlay, and again as the
    /// checkpoint's redb pages), so the bound is kept small enough for a
    /// server writing at full speed to stay under 256 MiB; checkpoints keep
    /// up with smaller segments as well.
    fn default() -> Self {
        Self {
            max_batch: 1024,
            commit_window: Duration::from_millis(2),
            segment_bytes: 8 << 20,
            segment_age: Duration::from_secs(5),
            backlog_bytes: 24 << 20,
        }
    }
}

/// How the redb store is opened.
#[derive(Debug, Clone)]
pub struct RedbStoreOptions {
    /// The directory that holds the database file and the journal; created
    /// if missing.
    pub data_dir: PathBuf,
    /// How saves are grouped and checkpointed.
    pub journal: JournalOptions,
    /// redb's page cache, in bytes.
    pub cache_bytes: usize,
    /// Checkpoint everything when the store closes, leaving no journal. Only
    /// tests turn it off, to leave a journal behind as a crash would.
    pub checkpoint_on_close: bool,
    /// Ends the commit window early when the runtime that serves requests
    /// runs out of work (see [`RuntimeIdle`]). Without it, only a complete
    /// group or the window's end does.
    pub runtime_idle: Option<RuntimeIdle>,
    /// Tests only: asked before every checkpoint; `true` makes it fail, as a
    /// failing database would.
    #[doc(hidden)]
    pub checkpoint_fault: Option<CheckpointFault>,
}

impl RedbStoreOptions {
    /// Defaults for a data directory: the journal's ([`JournalOptions`]) and
    /// 64 MiB of redb cache.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            journal: JournalOptions::default(),
            cache_bytes: 64 << 20,
            checkpoint_on_close: true,
            runtime_idle: None,
            checkpoint_fault: None,
        }
    }
}

/// Tests only: a fault hook for the checkpoint thread (see
/// [`RedbStoreOptions::checkpoint_fault`]).
#[doc(hidden)]
#[derive(Clone)]
pub struct CheckpointFault(pub Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for CheckpointFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointFault").finish_non_exhaustive()
    }
}

/// The `activities` table as of the last commit: one read snapshot shared by
/// every `load` that misses the overlay, so a load does not open a read
/// transaction and look the table up each time. It is replaced after every
/// commit (checkpoint, purge), before the records it now holds leave the
/// overlay.
type Snapshot = Arc<ReadOnlyTable<(&'static str, &'static str), &'static [u8]>>;

/// What the store's clones, its writer and its checkpointer share.
struct Shared {
    db: Database,
    snapshot: Mutex<Snapshot>,
    dir: PathBuf,
    overlay: Mutex<Overlay>,
    /// Signalled when a checkpoint ends or fails.
    checkpointed: Condvar,
    /// What waits for a checkpoint, against its bound.
    backlog: Backlog,
    stats: CommitStats,
}

impl Shared {
    /// Takes a new read snapshot, after a commit.
    fn refresh_snapshot(&self) -> Result<(), redb::Error> {
        let mut current = self
            .snapshot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Opened under the lock: two refreshes (a checkpoint's and a
        // purge's) then install their snapshots in the order they were
        // taken, so an older one never replaces a newer one.
        let fresh = Arc::new(snapshot(&self.db)?);
        let old = std::mem::replace(&mut *current, fresh);
        drop(current);
        // Ending the old read transaction (when no load still holds it) is
        // redb's work: done after the lock that loads take is released.
        drop(old);
        Ok(())
    }

    fn snapshot(&self) -> Snapshot {
        Arc::clone(
            &self
                .snapshot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn overlay(&self) -> MutexGuard<'_, Overlay> {
        // A panic elsewhere cannot leave the overlay half-changed: every
        // change is one map operation or one field assignment.
        self.overlay
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The embedded store. Cheap to clone: clones share the database, the
/// journal and its threads.
#[derive(Clone)]
pub struct RedbStore {
    shared: Arc<Shared>,
    writer: Arc<WriterHandle>,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("dir", &self.shared.dir)
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

/// An I/O error that names the path it is about (the standard one does not).
fn at_path(path: &Path, error: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{}: {error}", path.display()))
}

impl RedbStore {
    /// Opens (or creates) the store in `options.data_dir`, replays any
    /// journal a crash left, and starts the writer and checkpoint threads,
    /// which stop when the last clone of the store drops.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the directory or a file cannot be opened
    /// (for example because another process holds the database);
    /// [`StoreError::Corrupt`] when an intact journal entry does not decode.
    pub fn open(options: &RedbStoreOptions) -> Result<Self, StoreError> {
        let dir = &options.data_dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| at_path(dir, e))
            .map_err(backend("create the data directory"))?;
        let path = dir.join(DB_FILE);
        let db = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create(&path)
            .map_err(|e| at_path(&path, e))
            .map_err(backend("open the database"))?;
        const CREATE: &str = "create the tables";
        let txn = db.begin_write().map_err(backend(CREATE))?;
        txn.open_table(ACTIVITIES).map_err(backend(CREATE))?;
        txn.open_table(PURGE_INDEX).map_err(backend(CREATE))?;
        txn.commit().map_err(backend(CREATE))?;
        let next_generation = recovery::recover(&db, dir)?;
        journal::discard_spare(dir).map_err(backend("delete an earlier run's spare segment"))?;
        let journal = &options.journal;
        let backlog = journal.backlog_bytes.max(2 * journal.segment_bytes.max(1));
        let shared = Arc::new(Shared {
            snapshot: Mutex::new(Arc::new(
                snapshot(&db).map_err(backend("read the database"))?,
            )),
            db,
            dir: dir.clone(),
            overlay: Mutex::new(Overlay::default()),
            checkpointed: Condvar::new(),
            backlog: Backlog::new(backlog),
            stats: CommitStats::default(),
        });
        let writer = WriterHandle::start(Arc::clone(&shared), options, next_generation)?;
        Ok(Self {
            shared,
            writer: Arc::new(writer),
        })
    }

    /// The database file of a data directory.
    pub fn file_in(data_dir: &Path) -> PathBuf {
        data_dir.join(DB_FILE)
    }

    /// Up to `limit` records in key order, after `after` (from the first
    /// when `None`), as checkpointed into redb: what `retry-budget migrate`
    /// copies. [`RedbStore::checkpoint`] first, for every acknowledged save
    /// to be there.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when redb fails, [`StoreError::Corrupt`] for
    /// a record that does not decode.
    pub fn scan(
        &self,
        after: Option<&ActivityKey>,
        limit: usize,
    ) -> Result<Vec<ActivityRecord>, StoreError> {
        use std::ops::Bound;
        let table = snapshot(&self.shared.db).map_err(backend("scan"))?;
        let start = after.map_or(Bound::Unbounded, |k| {
            Bound::Excluded((k.tenant.as_str(), k.activity_id.as_str()))
        });
        let rows = ReadableTable::range::<(&str, &str)>(&table, (start, Bound::Unbounded))
            .map_err(backend("scan"))?;
        let mut records = Vec::with_capacity(limit.min(4096));
        for row in rows.take(limit) {
            let (key, value) = row.map_err(backend("scan"))?;
            let (tenant, activity_id) = key.value();
            let record = codec::decode(value.value()).map_err(|source| {
                corrupt(
                    &ActivityKey {
                        tenant: tenant.to_owned(),
                        activity_id: activity_id.to_owned(),
                    },
                    source,
                )
            })?;
            records.push(record);
        }
        Ok(records)
    }

    /// Journal and checkpoint counters.
    pub fn commit_stats(&self) -> &CommitStats {
        &self.shared.stats
    }

    /// Writes every acknowledged save into redb and returns when it is
    /// there (the journal is then empty).
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the journal or the checkpoint fails.
    pub async fn checkpoint(&self) -> Result<(), StoreError> {
        let (done, flushed) = oneshot::channel();
        self.writer.send(Command::Flush(done))?;
        Ok(flushed.await.map_err(|_| StoreError::Closed)??)
    }

    /// The record of `key`: the overlay's version if a save of it is not yet
    /// checkpointed, else redb's. Never waits on the writer.
    fn read(&self, key: &ActivityKey) -> Result<Option<ActivityRecord>, StoreError> {
        let pending = self
            .shared
            .overlay()
            .get(key)
            .map(|p| Arc::clone(&p.record));
        if let Some(record) = pending {
            return Ok(Some(ActivityRecord::clone(&record)));
        }
        // The snapshot is held until the value is decoded. `ReadableTable::get`
        // borrows the table, so the compiler checks it: `ReadOnlyTable`'s own
        // `get` hands out a guard that outlives its read transaction, and a
        // commit may free (and a later one reuse) the page it points into
        // once the snapshot it came from is replaced.
        let snapshot = self.shared.snapshot();
        let Some(value) =
            ReadableTable::get(&*snapshot, (key.tenant.as_str(), key.activity_id.as_str()))
                .map_err(backend("read a record"))?
        else {
            return Ok(None);
        };
        codec::decode(value.value())
            .map(Some)
            .map_err(|source| corrupt(key, source))
    }

    /// Hands a save to the journal writer; the receiver answers once it is
    /// durable. Refused at once while the backlog's bound is reached.
    fn submit(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> Result<oneshot::Receiver<Result<(), WriteError>>, StoreError> {
        self.shared
            .backlog
            .admit()
            .map_err(|retry_after| StoreError::Backlogged { retry_after })?;
        let entry = journal::entry(|buf| codec::encode_into(&record, buf));
        let (done, acked) = oneshot::channel();
        self.writer.send(Command::Save(Write {
            pending: Pending {
                record: Arc::new(record),
                entry,
                stored_purge: replaces.and_then(|r| r.purgeable_from_ms),
            },
            done,
        }))?;
        Ok(acked)
    }
}

impl Store for RedbStore {
    fn commit_stats(&self) -> Option<&CommitStats> {
        Some(RedbStore::commit_stats(self))
    }

    async fn load(&self, key: &ActivityKey) -> Result<Option<ActivityRecord>, StoreError> {
        self.read(key)
    }

    /// Encodes the record and hands it to the journal writer in the call;
    /// the future only waits for the writer's answer.
    fn save(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        match self.submit(record, replaces) {
            Ok(acked) => {
                Either::Left(acked.map(|answer| Ok(answer.map_err(|_| StoreError::Closed)??)))
            }
            Err(e) => Either::Right(ready(Err(e))),
        }
    }

    async fn purge(&self, cutoff_ms: i64, limit: usize) -> Result<usize, StoreError> {
        self.checkpoint().await?;
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || {
            let purged = tables::purge(&shared.db, cutoff_ms, limit)?;
            shared.refresh_snapshot()?;
            Ok::<_, redb::Error>(purged)
        })
        .await
        .map_err(backend("run the purge"))?
        .map_err(backend("purge"))
    }

    async fn save_paces(&self, paces: Vec<PaceRecord>) -> Result<(), StoreError> {
        let shared = Arc::clone(&self.shared);
        let encoded: Vec<(String, Vec<u8>)> = paces
            .iter()
            .map(|p| (p.dependency.clone(), codec::encode_pace(p)))
            .collect();
        tokio::task::spawn_blocking(move || tables::save_paces(&shared.db, &encoded))
            .await
            .map_err(backend("run the pace save"))?
            .map_err(backend("save the paces"))
    }

    async fn load_paces(&self) -> Result<Vec<PaceRecord>, StoreError> {
        let bytes = tables::load_paces(&self.shared.db).map_err(backend("load the paces"))?;
        // A pace that does not decode is skipped: it is advice, and the
        // next save replaces it.
        Ok(bytes
            .iter()
            .filter_map(|b| codec::decode_pace(b).ok())
            .collect())
    }

    async fn count(&self) -> Result<u64, StoreError> {
        self.checkpoint().await?;
        let txn = self.shared.db.begin_read().map_err(backend("count"))?;
        let table = txn.open_table(ACTIVITIES).map_err(backend("count"))?;
        table.len().map_err(backend("count"))
    }
}
