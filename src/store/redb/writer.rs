//! The writer thread: group commit into the journal, and the hand-over of
//! full segments to the checkpoint thread ([`super::checkpoint`]).

use std::error::Error;
use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::gate::Gate;
use super::overlay::{Frozen, Pending, Spare};
use super::{RedbStoreOptions, Shared, backend, checkpoint};
use crate::store::StoreError;
use crate::store::journal::{self, Segment};

/// How soon to look again when a segment is due but a checkpoint still runs.
const RETRY: Duration = Duration::from_millis(50);

/// What the store asks of its writer.
pub(super) enum Command {
    /// Make one record durable.
    Save(Write),
    /// Checkpoint everything acknowledged so far, then answer.
    Flush(oneshot::Sender<Result<(), WriteError>>),
}

/// A save waiting for the writer.
pub(super) struct Write {
    pub pending: Pending,
    pub done: oneshot::Sender<Result<(), WriteError>>,
}

/// Why the writer did not make saves durable, or could not checkpoint:
/// cheap to clone, since every save of a group gets the same answer.
#[derive(Debug, Clone)]
pub(super) enum WriteError {
    /// An operation failed (see [`StoreError::Backend`]).
    Failed {
        /// What the writer was doing.
        op: &'static str,
        /// Why it failed.
        source: Arc<dyn Error + Send + Sync>,
    },
    /// Too much waits for a checkpoint (see [`StoreError::Backlogged`]).
    Backlogged {
        /// When to ask again.
        retry_after: Duration,
    },
}

impl WriteError {
    fn failed(op: &'static str, source: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self::Failed {
            op,
            source: Arc::from(source.into()),
        }
    }
}

impl From<WriteError> for StoreError {
    fn from(error: WriteError) -> Self {
        match error {
            WriteError::Failed { op, source } => StoreError::Backend {
                op,
                source: Box::new(source),
            },
            WriteError::Backlogged { retry_after } => StoreError::Backlogged { retry_after },
        }
    }
}

/// The writer thread and its queue. Dropping the last handle closes the
/// queue; the writer then checkpoints what it holds (unless told not to),
/// stops the checkpoint thread, and ends, so the files are released when the
/// last clone of the store is gone.
pub(super) struct WriterHandle {
    commands: Option<mpsc::Sender<Command>>,
    gate: Arc<Gate>,
    thread: Option<thread::JoinHandle<()>>,
}

impl WriterHandle {
    pub(super) fn start(
        shared: Arc<Shared>,
        options: &RedbStoreOptions,
        generation: u64,
    ) -> Result<Self, StoreError> {
        let segment = Segment::create(&shared.dir, generation)
            .map_err(backend("create a journal segment"))?;
        shared.backlog.set_active(segment.bytes());
        let (frozen_tx, frozen_rx) = mpsc::channel();
        let gate = Gate::new();
        if let Some(idle) = &options.runtime_idle {
            idle.watch(&gate);
        }
        let closing = Arc::new(AtomicBool::new(false));
        let checkpointer = {
            let shared = Arc::clone(&shared);
            let closing = Arc::clone(&closing);
            let fault = options.checkpoint_fault.clone();
            thread::Builder::new()
                .name("redb-checkpoint".into())
                .spawn(move || checkpoint::run(&shared, &frozen_rx, &closing, fault.as_ref()))
                .map_err(backend("start the checkpoint thread"))?
        };
        let writer = Writer {
            shared,
            segment,
            due: Instant::now() + options.journal.segment_age,
            max_batch: options.journal.max_batch.max(1),
            segment_bytes: options.journal.segment_bytes.max(1),
            segment_age: options.journal.segment_age,
            checkpoint_on_close: options.checkpoint_on_close,
            frozen_tx: Some(frozen_tx),
            checkpointer: Some(checkpointer),
            closing,
            failed: None,
            window: options.journal.commit_window,
            acks: Vec::new(),
            replaced: Vec::new(),
            window_from: None,
            group: 0,
            gate: Arc::clone(&gate),
        };
        let (commands, queue) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("redb-writer".into())
            .spawn(move || writer.run(&queue))
            .map_err(backend("start the journal writer thread"))?;
        gate.set_writer(thread.thread().clone());
        Ok(Self {
            commands: Some(commands),
            gate,
            thread: Some(thread),
        })
    }

    pub(super) fn send(&self, command: Command) -> Result<(), StoreError> {
        let commands = self.commands.as_ref().ok_or(StoreError::Closed)?;
        self.gate
            .send(|| commands.send(command))
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
    failed: Option<WriteError>,
    /// See [`JournalOptions::commit_window`](super::JournalOptions::commit_window).
    window: Duration,
    /// When the last group commit started, if it carried more than one save.
    window_from: Option<Instant>,
    /// How many queued commands end the commit window early: about as many
    /// as recent groups carried (see `run`).
    group: usize,
    gate: Arc<Gate>,
    /// Buffers every group commit reuses: its acknowledgements, and the
    /// versions it replaced in the active set.
    acks: Vec<oneshot::Sender<Result<(), WriteError>>>,
    replaced: Vec<Pending>,
}

impl Writer {
    fn run(mut self, queue: &mpsc::Receiver<Command>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        let mut flushes = Vec::new();
        let mut framed = Vec::new();
        loop {
            // Under load, let the next group fill before looking at the
            // queue, until the window ends or as many saves wait as recent
            // groups carried: senders do not wake a writer that waits (it is
            // not waiting on the queue), except the one that completes the
            // group.
            if let Some(started) = self.window_from.take() {
                self.gate.wait(started + self.window, self.group);
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
            let mut taken = 0;
            while let Some(command) = next {
                taken += 1;
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
            self.gate.taken(taken);
            // The group to wait for next: the largest of late, forgetting an
            // eighth a group, so that one group cut short (a stalled client,
            // a window that ended first) does not make every later group
            // small; when fewer clients come back, the window ends the wait.
            self.group = taken.max(self.group - self.group / 8);
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
            } else if self.segment.bytes() >= self.segment_bytes || Instant::now() >= self.due {
                // While a checkpoint runs (or fails) the segment keeps
                // growing, until the backlog's bound refuses saves.
                self.rotate_when_free();
            }
        }
        if self.checkpoint_on_close
            && self.failed.is_none()
            && let Err(error) = self.flush()
        {
            tracing::error!(error = %StoreError::from(error), "final checkpoint failed; the journal will be replayed at the next start");
        }
        if self.checkpoint_on_close && self.failed.is_none() && self.segment.is_empty() {
            // Everything is in redb: the empty segment is not needed.
            let _ = std::fs::remove_file(self.segment.path())
                .and_then(|()| journal::sync_dir(&self.shared.dir));
        }
        self.closing.store(true, Ordering::Relaxed);
        drop(self.frozen_tx.take());
        if let Some(checkpointer) = self.checkpointer.take()
            && checkpointer.join().is_err()
        {
            tracing::error!("the checkpoint thread panicked");
        }
        if self.checkpoint_on_close && self.shared.overlay().spare == Spare::Ready {
            // A closed data directory holds the database alone.
            let _ = std::fs::remove_file(self.shared.dir.join(journal::SPARE))
                .and_then(|()| journal::sync_dir(&self.shared.dir));
        }
    }

    /// Appends a group to the journal with one `fdatasync`, makes its records
    /// visible to `load`, and acknowledges it. A group that finds the
    /// backlog's bound reached is refused whole: its saves were admitted
    /// before the bound was, and are told to come back.
    fn commit(&mut self, batch: &mut Vec<Write>, framed: &mut Vec<u8>) {
        let started = std::time::Instant::now();
        let result = match &self.failed {
            Some(failed) => Err(failed.clone()),
            None => match self.shared.backlog.admit() {
                Err(retry_after) => Err(WriteError::Backlogged { retry_after }),
                Ok(()) => {
                    let entries = batch.iter().map(|w| w.pending.entry.as_slice());
                    self.segment.append(entries, framed).map_err(|e| {
                        let failed = WriteError::failed(
                            "journal write failed; this replica takes no more writes until restarted",
                            e,
                        );
                        tracing::error!(error = %StoreError::from(failed.clone()), saves = batch.len(), "group commit failed");
                        self.failed = Some(failed.clone());
                        failed
                    })
                }
            },
        };
        if result.is_ok() {
            self.shared.stats.committed(batch.len(), started.elapsed());
            self.shared.backlog.set_active(self.segment.bytes());
        }
        // Publish the group under the lock; acknowledge it, and free the
        // versions it replaced, after releasing it.
        let mut acks = mem::take(&mut self.acks);
        let mut replaced = mem::take(&mut self.replaced);
        {
            let mut overlay = result.is_ok().then(|| self.shared.overlay());
            for write in batch.drain(..) {
                if let Some(overlay) = overlay.as_mut()
                    && let Some(held) = overlay.active.upsert(write.pending)
                {
                    replaced.push(held);
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
                tracing::error!(error = %StoreError::from(error), "cannot start a journal segment");
                self.due = Instant::now() + RETRY;
            }
        }
    }

    /// Starts a new segment and hands the records of the current one to the
    /// checkpoint thread. With `wait`, first waits for a running checkpoint,
    /// and fails if it is failing; without, does nothing while one runs or
    /// retries. Returns whether the segment was handed over (or was empty).
    fn rotate(&mut self, wait: bool) -> Result<bool, WriteError> {
        {
            let overlay = self.shared.overlay();
            if wait {
                let overlay = self
                    .shared
                    .checkpointed
                    .wait_while(overlay, |o| {
                        o.frozen.is_some() && o.checkpoint_error.is_none()
                    })
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(error) = &overlay.checkpoint_error {
                    return Err(WriteError::Failed {
                        op: "checkpoint failing",
                        source: Arc::clone(error),
                    });
                }
            } else if overlay.frozen.is_some() {
                return Ok(false);
            }
        }
        if self.segment.is_empty() {
            self.due = Instant::now() + self.segment_age;
            return Ok(true);
        }
        let next = self.next_segment()?;
        let full = mem::replace(&mut self.segment, next);
        self.due = Instant::now() + self.segment_age;
        let frozen = {
            let mut overlay = self.shared.overlay();
            let frozen = Arc::new(Frozen {
                segment: full.path().to_owned(),
                bytes: full.bytes(),
                records: mem::take(&mut overlay.active),
            });
            overlay.frozen = Some(Arc::clone(&frozen));
            self.shared.backlog.set_frozen(frozen.bytes);
            self.shared.backlog.set_active(self.segment.bytes());
            frozen
        };
        if let Some(tx) = &self.frozen_tx {
            tx.send(frozen).map_err(|_| {
                WriteError::failed("hand a segment over", "the checkpoint thread has stopped")
            })?;
        }
        Ok(true)
    }

    /// The segment after the current one: the spare, recycled, when the
    /// last checkpoint left one; else a new file.
    fn next_segment(&mut self) -> Result<Segment, WriteError> {
        let (dir, generation) = (&self.shared.dir, self.segment.generation() + 1);
        // No checkpoint runs (the caller made sure), so none changes the
        // spare meanwhile; the lock, which every load takes, is not held
        // across the file operations.
        let spare = self.shared.overlay().spare;
        if spare == Spare::Ready {
            let (recycled, now) = match Segment::recycle(dir, generation) {
                Ok(segment) => (Some(segment), Spare::Wanted),
                Err(error) => {
                    // Said once: checkpointed segments are deleted from now on.
                    tracing::warn!(%error, "cannot recycle journal segments here; deleting them instead");
                    let _ = std::fs::remove_file(dir.join(journal::SPARE));
                    (None, Spare::Off)
                }
            };
            self.shared.overlay().spare = now;
            if let Some(segment) = recycled {
                return Ok(segment);
            }
        }
        Segment::create(dir, generation)
            .map_err(|e| WriteError::failed("create a journal segment", e))
    }

    /// Checkpoints everything acknowledged so far.
    fn flush(&mut self) -> Result<(), WriteError> {
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
            Some(error) => Err(WriteError::Failed {
                op: "checkpoint failing",
                source: Arc::clone(error),
            }),
            None => Ok(()),
        }
    }
}
