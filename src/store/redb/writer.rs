//! The writer thread (group commit into the journal) and the checkpoint
//! thread (journal segments into redb) of the embedded store.

use std::collections::hash_map::Entry;
use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{Frozen, Pending, RedbStoreOptions, Shared, checkpoint_into};
use crate::budget::activity::ActivityKey;
use crate::store::StoreError;
use crate::store::journal::Segment;

/// How soon to look again when a segment is due but a checkpoint still runs.
const RETRY: Duration = Duration::from_millis(50);

/// What the store asks of its writer.
pub(super) enum Command {
    /// Make one record durable.
    Save(Write),
    /// Checkpoint everything acknowledged so far, then answer.
    Flush(oneshot::Sender<Result<(), String>>),
}

/// A save waiting for the writer.
pub(super) struct Write {
    pub key: ActivityKey,
    pub pending: Pending,
    pub done: oneshot::Sender<Result<(), String>>,
}

/// The writer thread and its queue. Dropping the last handle closes the
/// queue; the writer then checkpoints what it holds (unless told not to),
/// stops the checkpoint thread, and ends, so the files are released when the
/// last clone of the store is gone.
pub(super) struct WriterHandle {
    commands: Option<mpsc::Sender<Command>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl WriterHandle {
    pub(super) fn start(
        shared: Arc<Shared>,
        options: &RedbStoreOptions,
        generation: u64,
    ) -> Result<Self, StoreError> {
        let segment = Segment::create(&shared.dir, generation)
            .map_err(|e| StoreError::Backend(format!("cannot create a journal segment: {e}")))?;
        let (frozen_tx, frozen_rx) = mpsc::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let checkpointer = {
            let shared = Arc::clone(&shared);
            let closing = Arc::clone(&closing);
            thread::Builder::new()
                .name("redb-checkpoint".into())
                .spawn(move || checkpoint_loop(&shared, &frozen_rx, &closing))
                .map_err(super::backend)?
        };
        let writer = Writer {
            shared,
            segment,
            due: Instant::now() + options.segment_age,
            max_batch: options.max_batch.max(1),
            segment_bytes: options.segment_bytes.max(1),
            segment_age: options.segment_age,
            checkpoint_on_close: options.checkpoint_on_close,
            frozen_tx: Some(frozen_tx),
            checkpointer: Some(checkpointer),
            closing,
            failed: None,
            window: options.commit_window,
            acks: Vec::new(),
            replaced: Vec::new(),
            window_from: None,
        };
        let (commands, queue) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("redb-writer".into())
            .spawn(move || writer.run(&queue))
            .map_err(super::backend)?;
        Ok(Self {
            commands: Some(commands),
            thread: Some(thread),
        })
    }

    pub(super) fn send(&self, command: Command) -> Result<(), StoreError> {
        self.commands
            .as_ref()
            .ok_or(StoreError::Closed)?
            .send(command)
            .map_err(|_| StoreError::Closed)
    }
}

impl Drop for WriterHandle {
    fn drop(&mut self) {
        drop(self.commands.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the journal writer thread panicked");
        }
    }
}

struct Writer {
    shared: Arc<Shared>,
    segment: Segment,
    /// When the current segment is old enough to checkpoint (or, while a
    /// checkpoint runs, when to look again).
    due: Instant,
    max_batch: usize,
    segment_bytes: u64,
    segment_age: Duration,
    checkpoint_on_close: bool,
    frozen_tx: Option<mpsc::Sender<Arc<Frozen>>>,
    checkpointer: Option<thread::JoinHandle<()>>,
    closing: Arc<AtomicBool>,
    /// Set when a journal write failed: the segment's state is then unknown
    /// (a failed `fdatasync` may have dropped pages), so no later save may be
    /// acknowledged on top of it. A restart replays what is intact.
    failed: Option<String>,
    /// See [`RedbStoreOptions::commit_window`].
    window: Duration,
    /// When the last group commit started, if it carried more than one save.
    window_from: Option<Instant>,
    /// Buffers every group commit reuses: its acknowledgements, and the
    /// versions it replaced in the active set.
    acks: Vec<oneshot::Sender<Result<(), String>>>,
    replaced: Vec<Pending>,
}

impl Writer {
    fn run(mut self, queue: &mpsc::Receiver<Command>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        let mut flushes = Vec::new();
        let mut framed = Vec::new();
        loop {
            // Under load, let the next group fill before looking at the
            // queue: senders do not wake a writer that sleeps (it is not
            // waiting on the queue), so neither the wait nor the saves that
            // arrive during it cost a wake-up.
            if let Some(started) = self.window_from.take() {
                let wait = (started + self.window).saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    thread::sleep(wait);
                }
            }
            let first = if self.segment.is_empty() {
                queue.recv().ok()
            } else {
                match queue.recv_timeout(self.due.saturating_duration_since(Instant::now())) {
                    Ok(command) => Some(command),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        self.rotate_when_free();
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => None,
                }
            };
            let Some(first) = first else { break };
            let mut next = Some(first);
            while let Some(command) = next {
                match command {
                    Command::Save(write) => batch.push(write),
                    Command::Flush(done) => flushes.push(done),
                }
                next = if batch.len() < self.max_batch {
                    queue.try_recv().ok()
                } else {
                    None
                };
            }
            if !batch.is_empty() {
                let started = Instant::now();
                let saves = batch.len();
                self.commit(&mut batch, &mut framed);
                if saves > 1 && !self.window.is_zero() {
                    self.window_from = Some(started);
                }
            }
            if !flushes.is_empty() {
                let result = self.flush();
                for done in flushes.drain(..) {
                    let _ = done.send(result.clone());
                }
            } else if self.segment.bytes() >= 4 * self.segment_bytes {
                // Past four segments' worth, wait for the running checkpoint
                // rather than hold ever more records in memory.
                if let Err(error) = self.rotate(true) {
                    tracing::error!(%error, "cannot start a journal segment");
                }
            } else if self.segment.bytes() >= self.segment_bytes || Instant::now() >= self.due {
                self.rotate_when_free();
            }
        }
        if self.checkpoint_on_close
            && self.failed.is_none()
            && let Err(error) = self.flush()
        {
            tracing::error!(%error, "final checkpoint failed; the journal will be replayed at the next start");
        }
        if self.checkpoint_on_close && self.failed.is_none() && self.segment.is_empty() {
            // Everything is in redb: the empty segment is not needed.
            let _ = std::fs::remove_file(self.segment.path())
                .and_then(|()| crate::store::journal::sync_dir(&self.shared.dir));
        }
        self.closing.store(true, Ordering::Relaxed);
        drop(self.frozen_tx.take());
        if let Some(checkpointer) = self.checkpointer.take()
            && checkpointer.join().is_err()
        {
            tracing::error!("the checkpoint thread panicked");
        }
    }

    /// Appends a group to the journal with one `fdatasync`, makes its records
    /// visible to `load`, and acknowledges it.
    fn commit(&mut self, batch: &mut Vec<Write>, framed: &mut Vec<u8>) {
        let result = match &self.failed {
            Some(failed) => Err(failed.clone()),
            None => {
                framed.clear();
                for write in batch.iter() {
                    framed.extend_from_slice(&write.pending.entry);
                }
                self.segment.append(framed).map_err(|e| {
                    let failed = format!(
                        "journal write failed: {e}; this replica takes no more writes until restarted"
                    );
                    tracing::error!(error = %failed, saves = batch.len(), "group commit failed");
                    self.failed = Some(failed.clone());
                    failed
                })
            }
        };
        if result.is_ok() {
            let stats = &self.shared.stats;
            stats.commits.fetch_add(1, Ordering::Relaxed);
            stats.saves.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        // Publish the group under the lock; acknowledge it, and free the
        // versions it replaced, after releasing it.
        let mut acks = mem::take(&mut self.acks);
        let mut replaced = mem::take(&mut self.replaced);
        {
            let mut overlay = result.is_ok().then(|| self.shared.overlay());
            for write in batch.drain(..) {
                if let Some(overlay) = overlay.as_mut() {
                    match overlay.active.entry(write.key) {
                        Entry::Occupied(mut held) => {
                            // redb still holds the version that the first save
                            // of this segment replaced: keep its purge time.
                            let held = held.get_mut();
                            let pending = Pending {
                                stored_purge: held.stored_purge,
                                ..write.pending
                            };
                            replaced.push(mem::replace(held, pending));
                        }
                        Entry::Vacant(slot) => {
                            slot.insert(write.pending);
                        }
                    }
                }
                acks.push(write.done);
            }
        }
        for done in acks.drain(..) {
            // A caller that gave up (its request was cancelled) no longer
            // listens; its save is durable all the same.
            let _ = done.send(result.clone());
        }
        replaced.clear();
        self.acks = acks;
        self.replaced = replaced;
    }

    /// Rotates unless a checkpoint is running; then looks again shortly.
    fn rotate_when_free(&mut self) {
        match self.rotate(false) {
            Ok(true) => {}
            Ok(false) => self.due = Instant::now() + RETRY,
            Err(error) => {
                tracing::error!(%error, "cannot start a journal segment");
                self.due = Instant::now() + RETRY;
            }
        }
    }

    /// Starts a new segment and hands the records of the current one to the
    /// checkpoint thread. With `wait`, first waits for a running checkpoint;
    /// without, does nothing while one runs. Returns whether the segment was
    /// handed over (or was empty).
    fn rotate(&mut self, wait: bool) -> Result<bool, String> {
        {
            let overlay = self.shared.overlay();
            let overlay = if wait {
                self.shared
                    .checkpointed
                    .wait_while(overlay, |o| {
                        o.frozen.is_some() && o.checkpoint_error.is_none()
                    })
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            } else {
                overlay
            };
            if let Some(error) = &overlay.checkpoint_error {
                return Err(format!("checkpoint failing: {error}"));
            }
            if overlay.frozen.is_some() {
                return Ok(false);
            }
        }
        if self.segment.is_empty() {
            self.due = Instant::now() + self.segment_age;
            return Ok(true);
        }
        let next = Segment::create(&self.shared.dir, self.segment.generation() + 1)
            .map_err(|e| format!("cannot create a journal segment: {e}"))?;
        let full = mem::replace(&mut self.segment, next);
        self.due = Instant::now() + self.segment_age;
        let frozen = {
            let mut overlay = self.shared.overlay();
            let frozen = Arc::new(Frozen {
                segment: full.path().to_owned(),
                records: mem::take(&mut overlay.active),
            });
            overlay.frozen = Some(Arc::clone(&frozen));
            frozen
        };
        if let Some(tx) = &self.frozen_tx {
            tx.send(frozen)
                .map_err(|_| "the checkpoint thread has stopped".to_owned())?;
        }
        Ok(true)
    }

    /// Checkpoints everything acknowledged so far.
    fn flush(&mut self) -> Result<(), String> {
        if let Some(failed) = &self.failed {
            return Err(failed.clone());
        }
        self.rotate(true)?;
        let overlay = self
            .shared
            .checkpointed
            .wait_while(self.shared.overlay(), |o| {
                o.frozen.is_some() && o.checkpoint_error.is_none()
            })
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &overlay.checkpoint_error {
            Some(error) => Err(format!("checkpoint failing: {error}")),
            None => Ok(()),
        }
    }
}

/// How many nice levels the checkpoint thread sits below the rest of the
/// process: about a tenth of a busy request worker's CPU share, enough to
/// keep up with a saturated core (a checkpoint costs about a tenth of what
/// the decisions it writes cost), and all of the idle time.
const CHECKPOINT_NICENESS: i32 = 10;

/// Lowers the calling thread's priority by [`CHECKPOINT_NICENESS`]:
/// checkpoints are background work, and on a busy core they should take the
/// time requests leave. If they fall behind, the writer's bound on pending
/// records (four segments) slows requests until they catch up.
fn yield_to_requests() {
    #[cfg(target_os = "linux")]
    {
        let tid = rustix::thread::gettid();
        let nice = rustix::process::getpriority_process(Some(tid))
            .map_or(CHECKPOINT_NICENESS, |now| {
                (now + CHECKPOINT_NICENESS).min(19)
            });
        if let Err(error) = rustix::process::setpriority_process(Some(tid), nice) {
            tracing::debug!(%error, "checkpoint thread keeps its priority");
        }
    }
}

/// Writes each frozen segment's records into redb, then deletes the segment.
/// A failure is retried (the journal still holds everything) and reported to
/// anyone waiting on a checkpoint.
fn checkpoint_loop(shared: &Shared, frozen: &mpsc::Receiver<Arc<Frozen>>, closing: &AtomicBool) {
    yield_to_requests();
    for segment in frozen {
        let mut backoff = Duration::from_millis(10);
        loop {
            let result = checkpoint_into(&shared.db, &segment.records)
                .and_then(|()| shared.refresh_snapshot())
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    std::fs::remove_file(&segment.segment)
                        .and_then(|()| crate::store::journal::sync_dir(&shared.dir))
                        .map_err(|e| format!("cannot delete {}: {e}", segment.segment.display()))
                });
            let mut overlay = shared.overlay();
            match result {
                Ok(()) => {
                    shared.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                    shared
                        .stats
                        .checkpointed
                        .fetch_add(segment.records.len() as u64, Ordering::Relaxed);
                    overlay.frozen = None;
                    overlay.checkpoint_error = None;
                    shared.checkpointed.notify_all();
                    break;
                }
                Err(error) => {
                    tracing::error!(%error, segment = %segment.segment.display(), "checkpoint failed; retrying");
                    overlay.checkpoint_error = Some(error);
                    shared.checkpointed.notify_all();
                    drop(overlay);
                    if closing.load(Ordering::Relaxed) {
                        return;
                    }
                    thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}
