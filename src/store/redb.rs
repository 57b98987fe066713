//! The embedded default store: a write-ahead journal in front of one redb
//! file under `--data-dir`, needing no server.
//!
//! # Why a journal in front of redb
//! redb is a pure-Rust, ACID, copy-on-write B-tree: a crash at any moment
//! leaves its last commit intact. But a commit rewrites every B-tree page it
//! touches, so a commit per group of decisions costs far more than the fsync
//! it waits for (see BENCHMARKS.md). So a decision is made durable the way
//! databases do it: appended to a journal, one `fdatasync` for the whole
//! group, and acknowledged. The records it changed are kept in memory and
//! written to redb later in one large transaction (a checkpoint), after
//! which the journal segment is deleted.
//!
//! # The write path
//! - `save` encodes the record and hands it to the **writer thread**, which
//!   takes whatever is waiting (up to `max_batch`), appends it to the journal
//!   segment with one `write` and one `fdatasync` (group commit), puts the
//!   records in the in-memory *active* set, and acknowledges every save of the
//!   group. Under load it starts a group at most every `commit_window`, so
//!   that more saves share each fsync, or sooner once as many saves wait
//!   as recent groups carried, or once the runtime runs out of work
//!   ([`RuntimeIdle`]). `max_batch = 1` gives one fsync a
//!   decision, kept as a benchmark baseline.
//! - When the segment reaches `segment_bytes`, or is older than
//!   `segment_age`, the writer starts a new segment and freezes the active
//!   set. The **checkpoint thread** writes the frozen set to redb in one
//!   durable transaction, deletes the segment, and drops the frozen set. A
//!   record saved many times within a segment is written to redb once. The
//!   checkpoint thread runs at a lower priority than the rest of the process
//!   (Linux): it takes the CPU that requests leave. It also yields the core
//!   every [`YIELD_EVERY`] records it writes or frees: a lower priority
//!   gives it a smaller share, not shorter turns, and a thread on a core
//!   keeps it until its time slice ends (up to a scheduler tick, several
//!   milliseconds) unless it blocks or yields, while the requests that came
//!   in meanwhile wait.
//! - If the active set outgrows four segments while a checkpoint is still
//!   running, the writer waits for it: memory stays bounded.
//!
//! # Reads
//! `load` looks in the active set, then the frozen set, then redb (through a
//! read snapshot renewed after every commit): the newest version wins.
//! `purge` and `count` first checkpoint what is pending, so they see every
//! acknowledged save.
//!
//! # Recovery
//! On open, segments left by a crash are replayed into redb, oldest first,
//! then deleted. A torn last entry (a group whose `fdatasync` never
//! returned, so never acknowledged) is ignored with a warning.
//!
//! # Layout of the redb file
//! - `activities`: `(tenant, activity_id)` -> the record, encoded by
//!   [`super::codec`] (MessagePack behind a format byte; JSON records of the
//!   first versions are still read);
//! - `purge_index`: `(purgeable_from_ms, tenant, activity_id)` -> `()`, so the
//!   retention sweeper finds expired records without scanning them all.

mod writer;

use std::future::ready;
use std::hash::BuildHasher;
use std::mem;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::Either;
use hashbrown::{HashTable, hash_table};
use redb::{
    Database, ReadOnlyTable, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition,
};
use tokio::sync::oneshot;

use super::{Replaced, Store, StoreError};
use super::{codec, journal};
use crate::budget::activity::{ActivityKey, ActivityRecord};
pub use writer::RuntimeIdle;
use writer::{Command, Write, WriterHandle};

const ACTIVITIES: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("activities");
const PURGE_INDEX: TableDefinition<(i64, &str, &str), ()> = TableDefinition::new("purge_index");

/// The file name of the database inside the data directory.
pub const DB_FILE: &str = "retry-budget.redb";

/// How the redb store is opened.
#[derive(Debug, Clone)]
pub struct RedbStoreOptions {
    /// The directory that holds the database file and the journal; created
    /// if missing.
    pub data_dir: PathBuf,
    /// The most saves one journal `fdatasync` may carry.
    pub max_batch: usize,
    /// Under load (the last group carried more than one save), how long
    /// from the start of one group commit the next may wait for saves to
    /// share its fsync; it starts sooner once as many saves wait as recent
    /// groups carried. A save that arrives alone is committed at once. Zero
    /// commits as soon as the previous fsync returns.
    pub commit_window: Duration,
    /// redb's page cache, in bytes.
    pub cache_bytes: usize,
    /// A journal segment this large is checkpointed into redb. Records
    /// waiting for a checkpoint are held in memory: those of the segment
    /// being written and of the one being checkpointed; while a checkpoint
    /// is slow the segment being written may grow to four times this before
    /// the writer waits, so about five segments' worth at most.
    pub segment_bytes: u64,
    /// A segment older than this is checkpointed even when small, so that
    /// redb alone is never far behind and recovery replays little.
    pub segment_age: Duration,
    /// Checkpoint everything when the store closes, leaving no journal. Only
    /// tests turn it off, to leave a journal behind as a crash would.
    pub checkpoint_on_close: bool,
    /// Ends the commit window early when the runtime that serves requests
    /// runs out of work (see [`RuntimeIdle`]). Without it, only a complete
    /// group or the window's end does.
    pub runtime_idle: Option<RuntimeIdle>,
}

impl RedbStoreOptions {
    /// Defaults for a data directory: groups of up to 1024 saves, a 2 ms
    /// commit window, 64 MiB of redb cache, 16 MiB or 5 s segments.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            max_batch: 1024,
            commit_window: Duration::from_millis(2),
            cache_bytes: 64 << 20,
            segment_bytes: 16 << 20,
            segment_age: Duration::from_secs(5),
            checkpoint_on_close: true,
            runtime_idle: None,
        }
    }
}

/// Journal and checkpoint counters, for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct CommitStats {
    /// Group commits (journal `fdatasync`s) made.
    pub commits: AtomicU64,
    /// Saves those commits carried.
    pub saves: AtomicU64,
    /// Checkpoints (redb transactions) made.
    pub checkpoints: AtomicU64,
    /// Records those checkpoints wrote: fewer than `saves` when an activity
    /// was saved more than once within a segment.
    pub checkpointed: AtomicU64,
}

impl CommitStats {
    /// The counters as plain numbers: commits, saves, checkpoints, records
    /// checkpointed.
    pub fn snapshot(&self) -> [u64; 4] {
        [
            self.commits.load(Ordering::Relaxed),
            self.saves.load(Ordering::Relaxed),
            self.checkpoints.load(Ordering::Relaxed),
            self.checkpointed.load(Ordering::Relaxed),
        ]
    }
}

/// A record saved since the last checkpoint.
#[derive(Debug)]
struct Pending {
    /// The newest version, for `load`.
    record: Arc<ActivityRecord>,
    /// Its sealed journal entry, whose payload is what redb stores.
    entry: Vec<u8>,
    /// When the version redb holds (or will hold after the checkpoint
    /// before this one) becomes purgeable: its place in the purge index.
    stored_purge: Option<i64>,
}

/// Records by key, the key read from the record itself: a save sends no
/// separate copy of its tenant and activity id. Keys come from clients, so
/// the hasher is randomly seeded; it is foldhash rather than the standard
/// SipHash because every load and every save looks a key up here.
#[derive(Debug, Default)]
struct Records {
    table: HashTable<Pending>,
    hasher: foldhash::fast::RandomState,
}

impl Records {
    /// The hash of a key, given as its two strings.
    fn hash(&self, tenant: &str, activity_id: &str) -> u64 {
        key_hash(&self.hasher, tenant, activity_id)
    }

    fn get(&self, key: &ActivityKey) -> Option<&Pending> {
        let (tenant, id) = (key.tenant.as_str(), key.activity_id.as_str());
        self.table.find(self.hash(tenant, id), |p| {
            p.record.tenant == tenant && p.record.activity_id == id
        })
    }

    /// Holds `pending` as its record's newest version, and returns the
    /// version it replaced. The newest version keeps the replaced one's
    /// `stored_purge`: redb still holds the version that the first save of
    /// the segment replaced, and that is where its purge time is indexed.
    fn upsert(&mut self, mut pending: Pending) -> Option<Pending> {
        let (tenant, id) = (&pending.record.tenant, &pending.record.activity_id);
        let hash = self.hash(tenant, id);
        let hasher = &self.hasher;
        match self.table.entry(
            hash,
            |p| p.record.tenant == *tenant && p.record.activity_id == *id,
            |p| key_hash(hasher, &p.record.tenant, &p.record.activity_id),
        ) {
            hash_table::Entry::Occupied(mut held) => {
                pending.stored_purge = held.get().stored_purge;
                Some(mem::replace(held.get_mut(), pending))
            }
            hash_table::Entry::Vacant(slot) => {
                slot.insert(pending);
                None
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.table.iter()
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Pending> {
        self.table.iter_mut()
    }

    fn len(&self) -> usize {
        self.table.len()
    }
}

/// The one way a key is hashed, for lookups and when the table grows alike.
fn key_hash(hasher: &foldhash::fast::RandomState, tenant: &str, activity_id: &str) -> u64 {
    hasher.hash_one((tenant, activity_id))
}

/// The records of one journal segment, being checkpointed.
#[derive(Debug)]
struct Frozen {
    segment: PathBuf,
    records: Records,
}

/// What saves changed and redb does not hold yet.
#[derive(Debug, Default)]
struct Overlay {
    active: Records,
    frozen: Option<Arc<Frozen>>,
    /// Why the running checkpoint is failing, while it retries.
    checkpoint_error: Option<String>,
    /// The checkpointed segment kept for reuse: set by the checkpoint
    /// thread, taken by the writer when it starts a segment.
    spare: Spare,
}

/// Whether the data directory holds a checkpointed segment to recycle
/// ([`journal::SPARE`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Spare {
    /// None is kept: the next checkpoint keeps its segment.
    #[default]
    Wanted,
    /// One is kept, for the writer's next segment.
    Ready,
    /// Recycling failed on this file system (one without
    /// `RENAME_NOREPLACE`, say): checkpointed segments are deleted.
    Off,
}

impl Overlay {
    fn get(&self, key: &ActivityKey) -> Option<&Pending> {
        self.active
            .get(key)
            .or_else(|| self.frozen.as_ref().and_then(|f| f.records.get(key)))
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
    stats: CommitStats,
}

impl Shared {
    /// Takes a new read snapshot, after a commit.
    fn refresh_snapshot(&self) -> Result<(), redb::Error> {
        let fresh = Arc::new(snapshot(&self.db)?);
        let old = std::mem::replace(
            &mut *self
                .snapshot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            fresh,
        );
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

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn corrupt(key: &ActivityKey, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        key: format!("{}/{}", key.tenant, key.activity_id),
        detail: detail.to_string(),
    }
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
            .map_err(|e| StoreError::Backend(format!("cannot create {}: {e}", dir.display())))?;
        let path = dir.join(DB_FILE);
        let db = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create(&path)
            .map_err(|e| StoreError::Backend(format!("cannot open {}: {e}", path.display())))?;
        let txn = db.begin_write().map_err(backend)?;
        txn.open_table(ACTIVITIES).map_err(backend)?;
        txn.open_table(PURGE_INDEX).map_err(backend)?;
        txn.commit().map_err(backend)?;
        let next_generation = recover(&db, dir)?;
        journal::discard_spare(dir).map_err(backend)?;
        let shared = Arc::new(Shared {
            snapshot: Mutex::new(Arc::new(snapshot(&db).map_err(backend)?)),
            db,
            dir: dir.clone(),
            overlay: Mutex::new(Overlay::default()),
            checkpointed: Condvar::new(),
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
        flushed
            .await
            .map_err(|_| StoreError::Closed)?
            .map_err(StoreError::Backend)
    }
}

impl RedbStore {
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
        let Some(value) = self
            .shared
            .snapshot()
            .get((key.tenant.as_str(), key.activity_id.as_str()))
            .map_err(backend)?
        else {
            return Ok(None);
        };
        codec::decode(value.value())
            .map(Some)
            .map_err(|e| corrupt(key, e))
    }

    /// Hands a save to the journal writer; the receiver answers once it is
    /// durable.
    fn submit(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> Result<oneshot::Receiver<Result<(), String>>, StoreError> {
        let entry =
            journal::entry(|buf| codec::encode_into(&record, buf)).map_err(StoreError::Backend)?;
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
    async fn load(&self, key: &ActivityKey) -> Result<Option<ActivityRecord>, StoreError> {
        self.read(key)
    }

    fn load_now(&self, key: &ActivityKey) -> Option<Result<Option<ActivityRecord>, StoreError>> {
        Some(self.read(key))
    }

    /// Encodes the record and hands it to the journal writer in the call;
    /// the future only waits for the writer's answer.
    fn save(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        match self.submit(record, replaces) {
            Ok(acked) => Either::Left(acked.map(|answer| {
                answer
                    .map_err(|_| StoreError::Closed)?
                    .map_err(StoreError::Backend)
            })),
            Err(e) => Either::Right(ready(Err(e))),
        }
    }

    async fn purge(&self, cutoff_ms: i64, limit: usize) -> Result<usize, StoreError> {
        self.checkpoint().await?;
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || {
            let purged = purge_blocking(&shared.db, cutoff_ms, limit)?;
            shared.refresh_snapshot()?;
            Ok::<_, redb::Error>(purged)
        })
        .await
        .map_err(backend)?
        .map_err(backend)
    }

    async fn count(&self) -> Result<u64, StoreError> {
        self.checkpoint().await?;
        let txn = self.shared.db.begin_read().map_err(backend)?;
        let table = txn.open_table(ACTIVITIES).map_err(backend)?;
        table.len().map_err(backend)
    }
}

/// A read snapshot of the `activities` table.
fn snapshot(
    db: &Database,
) -> Result<ReadOnlyTable<(&'static str, &'static str), &'static [u8]>, redb::Error> {
    Ok(db.begin_read()?.open_table(ACTIVITIES)?)
}

/// How many records the checkpoint thread writes into redb, or frees, before
/// it yields the core to whatever else is ready to run on it: about 0.2 ms
/// of work on the 2-core VM of BENCHMARKS.md. Without the yields it held
/// the core for up to 4.6 ms at a time while requests waited; with them,
/// at 128 streams, the p99 of a durable decision went from 5.4-5.5 ms to
/// 3.8-4.2 ms and the server's idle time from 5.0% to 2.1%. The price is
/// memory: a checkpoint takes longer from start to end, and the saves made
/// meanwhile wait in memory (docs/benchmarks-log.md, "Runs AK to AO").
pub(super) const YIELD_EVERY: usize = 64;

/// Called by the checkpoint thread after its `n`th record (from 0) written
/// or freed: yields the core after every [`YIELD_EVERY`].
pub(super) fn pace(n: usize) {
    if n % YIELD_EVERY == YIELD_EVERY - 1 {
        std::thread::yield_now();
    }
}

/// Writes `records` into redb in one durable transaction, moving each in
/// the purge index from where the stored version was to where the new one
/// goes.
fn checkpoint_into(db: &Database, records: &Records) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut activities = txn.open_table(ACTIVITIES)?;
        let mut index = txn.open_table(PURGE_INDEX)?;
        // In key order: consecutive inserts land in the same or the next
        // leaf, which is still in the CPU's cache.
        let mut sorted: Vec<_> = records.iter().collect();
        sorted.sort_unstable_by(|a, b| {
            (&a.record.tenant, &a.record.activity_id)
                .cmp(&(&b.record.tenant, &b.record.activity_id))
        });
        for (n, pending) in sorted.into_iter().enumerate() {
            pace(n);
            let (tenant, id) = (
                pending.record.tenant.as_str(),
                pending.record.activity_id.as_str(),
            );
            activities.insert((tenant, id), journal::payload(&pending.entry))?;
            let purge = pending.record.purgeable_from_ms();
            if pending.stored_purge != purge {
                if let Some(at) = pending.stored_purge {
                    index.remove((at, tenant, id))?;
                }
                if let Some(at) = purge {
                    index.insert((at, tenant, id), ())?;
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}

/// Replays the journal segments a crash left into redb, oldest first, and
/// deletes them. Returns the generation for the next segment.
fn recover(db: &Database, dir: &Path) -> Result<u64, StoreError> {
    let segments = journal::segments(dir).map_err(backend)?;
    let next = segments.last().map_or(1, |(generation, _)| generation + 1);
    for (generation, path) in segments {
        let contents = journal::read(&path, generation).map_err(backend)?;
        if contents.torn {
            tracing::warn!(
                segment = %path.display(),
                ignored_bytes = contents.ignored_bytes,
                "journal: ignored a torn tail (a group commit that never completed, so never acknowledged)"
            );
        }
        let mut records = Records::default();
        for payload in contents.payloads {
            let record = codec::decode(&payload).map_err(|detail| StoreError::Corrupt {
                key: format!("journal segment {generation}"),
                detail,
            })?;
            let mut entry = journal::open_frame(payload.len());
            entry.extend_from_slice(&payload);
            records.upsert(Pending {
                record: Arc::new(record),
                entry,
                stored_purge: None,
            });
        }
        let replayed = records.len();
        stored_purges(db, &mut records)?;
        checkpoint_into(db, &records).map_err(backend)?;
        std::fs::remove_file(&path).map_err(backend)?;
        tracing::info!(segment = %path.display(), records = replayed, "journal: replayed into the database");
    }
    journal::sync_dir(dir).map_err(backend)?;
    Ok(next)
}

/// Fills in where the versions redb holds sit in the purge index.
fn stored_purges(db: &Database, records: &mut Records) -> Result<(), StoreError> {
    let txn = db.begin_read().map_err(backend)?;
    let table = txn.open_table(ACTIVITIES).map_err(backend)?;
    for pending in records.iter_mut() {
        let (tenant, id) = (
            pending.record.tenant.as_str(),
            pending.record.activity_id.as_str(),
        );
        if let Some(value) = table.get((tenant, id)).map_err(backend)? {
            let stored =
                codec::decode(value.value()).map_err(|e| corrupt(&pending.record.key(), e))?;
            pending.stored_purge = stored.purgeable_from_ms();
        }
    }
    Ok(())
}

/// One write transaction that deletes up to `limit` expired activities.
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
