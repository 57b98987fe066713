//! The writer thread: every change to the embedded store goes through it,
//! so that a group of saves is one fjall batch and one `fdatasync` (group
//! commit), and the count of activities changes with the batch that
//! changes them.
//!
//! It takes the first save that waits and whatever else waits behind it,
//! up to `max_batch`, writes them in one batch, persists the journal once
//! and answers every save of the group. No timer: while one fsync runs,
//! the next group gathers by itself, so a save that arrives alone is
//! committed at once and a busy server's saves share their fsyncs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use fjall::{Database, Keyspace, PersistMode};
use tokio::sync::oneshot;

use super::keys;
use crate::store::{CommitStats, StoreError};

/// The keyspaces of the store (see [`keys`]).
#[derive(Clone)]
pub(super) struct Keyspaces {
    pub activities: Keyspace,
    pub purge_index: Keyspace,
    pub paces: Keyspace,
    pub meta: Keyspace,
}

/// A change for the writer, and where its answer goes.
pub(super) enum Change {
    /// Keep one activity's record.
    Save(Save),
    /// Delete up to `limit` activities purgeable before `cutoff_ms`.
    Purge {
        cutoff_ms: i64,
        limit: usize,
        done: oneshot::Sender<Result<usize, StoreError>>,
    },
    /// Keep these paces (name, encoded), replacing those of the same names.
    Paces {
        paces: Vec<(String, Vec<u8>)>,
        done: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// One activity's record to keep.
pub(super) struct Save {
    pub tenant: String,
    pub activity_id: String,
    /// The encoded record.
    pub value: Vec<u8>,
    /// Where the replaced version sits in the purge index, and where the
    /// new one goes.
    pub purge_was: Option<i64>,
    pub purge_now: Option<i64>,
    pub done: oneshot::Sender<Result<(), StoreError>>,
}

/// What the writer keeps between groups.
pub(super) struct Writer {
    pub db: Database,
    pub keyspaces: Keyspaces,
    pub max_batch: usize,
    /// Activities kept, as of the last commit.
    pub count: Arc<AtomicU64>,
    pub stats: Arc<CommitStats>,
}

impl Writer {
    /// Serves `changes` until every sender is gone, then persists once
    /// more (a clean close leaves nothing to replay).
    pub fn run(self, changes: Receiver<Change>) {
        // Wakes now and then with nothing to do, so that fjall's own
        // background work is never the only thing between a quiet store
        // and a durable journal: nothing is acknowledged unpersisted
        // anyway, this only keeps recovery short.
        const IDLE: Duration = Duration::from_secs(1);
        let mut saves = Vec::with_capacity(self.max_batch);
        let mut others = Vec::new();
        loop {
            let first = match changes.recv_timeout(IDLE) {
                Ok(change) => change,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut next = Some(first);
            while let Some(change) = next.take() {
                match change {
                    Change::Save(save) => saves.push(save),
                    other => others.push(other),
                }
                if saves.len() < self.max_batch {
                    next = changes.try_recv().ok();
                }
            }
            if !saves.is_empty() {
                self.commit_saves(&mut saves);
            }
            // After the saves they came with: a purge reads what is
            // committed, and never shares a batch with a save of the same
            // activity.
            for change in others.drain(..) {
                self.run_other(change);
            }
        }
        let _ = self.db.persist(PersistMode::SyncData);
    }

    /// One batch and one fsync for `saves`, then their answers.
    fn commit_saves(&self, saves: &mut Vec<Save>) {
        let started = Instant::now();
        let ks = &self.keyspaces;
        let mut batch = self.db.batch();
        let mut count = self.count.load(Ordering::Relaxed);
        for save in saves.iter_mut() {
            let key = keys::activity(&save.tenant, &save.activity_id);
            // Read, not taken from the save: the version a save replaces
            // may have been purged since it was loaded (the sweep does not
            // wait for decisions), and then the save brings it back.
            match ks.activities.contains_key(&key) {
                Ok(true) => {}
                Ok(false) => count += 1,
                Err(error) => {
                    let message = error.to_string();
                    for save in saves.drain(..) {
                        let _ = save.done.send(Err(failed("read a record", &message)));
                    }
                    return;
                }
            }
            batch.insert(&ks.activities, key, std::mem::take(&mut save.value));
            if save.purge_was != save.purge_now {
                if let Some(at) = save.purge_was {
                    batch.remove(
                        &ks.purge_index,
                        keys::purge(at, &save.tenant, &save.activity_id),
                    );
                }
                if let Some(at) = save.purge_now {
                    batch.insert(
                        &ks.purge_index,
                        keys::purge(at, &save.tenant, &save.activity_id),
                        [],
                    );
                }
            }
        }
        batch.insert(&ks.meta, keys::COUNT, keys::count_bytes(count));
        match self.durable(batch) {
            Ok(()) => {
                self.count.store(count, Ordering::Relaxed);
                self.stats.committed(saves.len(), started.elapsed());
                for save in saves.drain(..) {
                    let _ = save.done.send(Ok(()));
                }
            }
            Err(error) => {
                let message = error.to_string();
                for save in saves.drain(..) {
                    let _ = save
                        .done
                        .send(Err(failed("commit a group of saves", &message)));
                }
            }
        }
    }

    fn run_other(&self, change: Change) {
        match change {
            Change::Save(_) => unreachable!("saves are committed in groups"),
            Change::Purge {
                cutoff_ms,
                limit,
                done,
            } => {
                let _ = done.send(self.purge(cutoff_ms, limit));
            }
            Change::Paces { paces, done } => {
                let mut batch = self.db.batch();
                for (name, bytes) in paces {
                    batch.insert(&self.keyspaces.paces, name, bytes);
                }
                let _ = done.send(
                    self.durable(batch)
                        .map_err(|e| failed("save the paces", &e.to_string())),
                );
            }
        }
    }

    /// Deletes up to `limit` activities purgeable before `cutoff_ms`, with
    /// their index entries, in one batch.
    fn purge(&self, cutoff_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let ks = &self.keyspaces;
        let expired = ks
            .purge_index
            .range(..keys::purge_from(cutoff_ms))
            .take(limit)
            .map(fjall::Guard::key)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed("find expired activities", &e.to_string()))?;
        if expired.is_empty() {
            return Ok(0);
        }
        let mut batch = self.db.batch();
        for entry in &expired {
            if let Some(activity) = keys::activity_of_purge(entry) {
                batch.remove(&ks.activities, activity.to_vec());
            }
            batch.remove(&ks.purge_index, entry.clone());
        }
        let count = self
            .count
            .load(Ordering::Relaxed)
            .saturating_sub(expired.len() as u64);
        batch.insert(&ks.meta, keys::COUNT, keys::count_bytes(count));
        self.durable(batch)
            .map_err(|e| failed("purge", &e.to_string()))?;
        self.count.store(count, Ordering::Relaxed);
        Ok(expired.len())
    }

    /// Commits `batch` and persists the journal: durable when it returns.
    fn durable(&self, batch: fjall::OwnedWriteBatch) -> fjall::Result<()> {
        batch.commit()?;
        self.db.persist(PersistMode::SyncData)
    }
}

fn failed(op: &'static str, message: &str) -> StoreError {
    StoreError::Backend {
        op,
        source: message.to_owned().into(),
    }
}
