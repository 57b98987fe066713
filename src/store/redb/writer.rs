//! The writer thread (group commit into the journal) and the checkpoint
//! thread (journal segments into redb) of the embedded store.

use std::mem;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{Frozen, Pending, RedbStoreOptions, Shared, Spare, checkpoint_into};
use crate::store::StoreError;
use crate::store::journal::{self, Segment};

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
    pub pending: Pending,
    pub done: oneshot::Sender<Result<(), String>>,
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

/// How the writer waits out its commit window: until the window ends, or
/// until as many commands wait as recent groups carried, whichever comes
/// first. Under a steady load the clients of one group come back together
/// (each sends its next request once acknowledged); waiting longer for
/// them would leave the CPU idle and add latency, committing before they
/// are all back would spend more fsyncs for the same decisions.
struct Gate {
    /// Commands sent and not yet taken by the writer.
    queued: AtomicUsize,
    /// How many queued commands wake the writer; `usize::MAX` when it is
    /// not waiting out a window.
    wake_at: AtomicUsize,
    /// The writer thread, set once it runs.
    writer: std::sync::OnceLock<Thread>,
    /// Set when the runtime ran out of work while saves waited out the
    /// window: they need not wait longer, since no more are coming until
    /// they are acknowledged (or the network brings new requests).
    idle: AtomicBool,
}

/// The fewest queued saves that a runtime going idle commits at once. A
/// group this large spreads an fsync's fixed cost (about 50 us of CPU on the
/// AMD machine) to under 2 us a decision; a smaller one is worth waiting
/// for: its clients' next requests are still on their way, and the window
/// or a complete group ends the wait. Committing at every park halved the
/// groups at 16 streams, cost 4% of throughput there and raised the p99
/// from 0.7 to 1.1-1.4 ms (docs/benchmarks-log.md, "Runs AA to AE: a
/// machine where a decision is cheap and the fsync is not").
const IDLE_COMMIT_MIN: usize = 32;

/// Lets a store's journal writer end its commit window when a runtime
/// worker that serves the store's requests runs out of work: waiting on
/// would leave the CPU idle while saves wait for their fsync (once enough
/// wait: 32 or more). Give one
/// handle to [`tokio::runtime::Builder::on_thread_park`] (calling
/// [`RuntimeIdle::parking`]) and a clone to
/// [`RedbStoreOptions::runtime_idle`](super::RedbStoreOptions::runtime_idle).
///
/// At 128 streams on the AMD machine this made the server 0.92 to 0.94 busy
/// instead of 0.78 and durable decisions 10 to 15% faster, in groups of 63
/// saves instead of 124; at 16 and 32 streams nothing changed (BENCHMARKS.md).
#[derive(Clone, Default)]
pub struct RuntimeIdle {
    gate: Arc<std::sync::Mutex<Weak<Gate>>>,
}

impl RuntimeIdle {
    /// A handle that no store watches yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A runtime worker is about to park: ends the writer's commit window
    /// if saves wait in it. Cheap when none do.
    pub fn parking(&self) {
        let gate = self
            .gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .upgrade();
        if let Some(gate) = gate {
            gate.runtime_parks();
        }
    }

    /// Makes `gate` the one this handle signals (the last store opened).
    fn watch(&self, gate: &Arc<Gate>) {
        *self
            .gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::downgrade(gate);
    }
}

impl std::fmt::Debug for RuntimeIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeIdle").finish_non_exhaustive()
    }
}

impl Gate {
    /// Sends `command` through `send`, counting it first (so that the
    /// writer never takes more than was counted), then wakes the writer when
    /// it completes the group the writer waits for.
    fn send<E>(&self, send: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        // SeqCst here and in `wait`: either this sender sees the writer's
        // `wake_at`, or the writer sees this command in `queued`.
        let queued = self.queued.fetch_add(1, Ordering::SeqCst) + 1;
        if let Err(error) = send() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(error);
        }
        if queued >= self.wake_at.load(Ordering::SeqCst)
            && let Some(writer) = self.writer.get()
        {
            writer.unpark();
        }
        Ok(())
    }

    /// Counts commands the writer took off the queue.
    fn taken(&self, commands: usize) {
        self.queued.fetch_sub(commands, Ordering::SeqCst);
    }

    /// Sleeps until `until`, until `group` commands are queued, or until
    /// the runtime parks while some are.
    fn wait(&self, until: Instant, group: usize) {
        // Cleared before `wake_at` says the writer waits: a park signalled
        // for an earlier window does not end this one.
        self.idle.store(false, Ordering::SeqCst);
        self.wake_at.store(group.max(1), Ordering::SeqCst);
        loop {
            let queued = self.queued.load(Ordering::SeqCst);
            if queued >= group || (queued > 0 && self.idle.load(Ordering::SeqCst)) {
                break;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            // A stale wake-up (from a sender after the last wait ended)
            // returns early; the loop looks again.
            thread::park_timeout(left);
        }
        self.wake_at.store(usize::MAX, Ordering::SeqCst);
    }

    /// A runtime worker is about to park: if the writer waits out a window
    /// and at least [`IDLE_COMMIT_MIN`] saves are queued, it commits them
    /// now.
    fn runtime_parks(&self) {
        let waiting = self.wake_at.load(Ordering::SeqCst) != usize::MAX;
        if waiting && self.queued.load(Ordering::SeqCst) >= IDLE_COMMIT_MIN {
            self.idle.store(true, Ordering::SeqCst);
            if let Some(writer) = self.writer.get() {
                writer.unpark();
            }
        }
    }
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
        let gate = Arc::new(Gate {
            queued: AtomicUsize::new(0),
            wake_at: AtomicUsize::new(usize::MAX),
            writer: std::sync::OnceLock::new(),
            idle: AtomicBool::new(false),
        });
        if let Some(idle) = &options.runtime_idle {
            idle.watch(&gate);
        }
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
            group: 0,
            gate: Arc::clone(&gate),
        };
        let (commands, queue) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("redb-writer".into())
            .spawn(move || writer.run(&queue))
            .map_err(super::backend)?;
        let _ = gate.writer.set(thread.thread().clone());
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
    failed: Option<String>,
    /// See [`RedbStoreOptions::commit_window`].
    window: Duration,
    /// When the last group commit started, if it carried more than one save.
    window_from: Option<Instant>,
    /// How many queued commands end the commit window early: about as many
    /// as recent groups carried (see `run`).
    group: usize,
    gate: Arc<Gate>,
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
    /// visible to `load`, and acknowledges it.
    fn commit(&mut self, batch: &mut Vec<Write>, framed: &mut Vec<u8>) {
        let result = match &self.failed {
            Some(failed) => Err(failed.clone()),
            None => {
                let entries = batch.iter().map(|w| w.pending.entry.as_slice());
                self.segment.append(entries, framed).map_err(|e| {
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
        let next = self.next_segment()?;
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

    /// The segment after the current one: the spare, recycled, when the
    /// last checkpoint left one; else a new file.
    fn next_segment(&mut self) -> Result<Segment, String> {
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
            .map_err(|e| format!("cannot create a journal segment: {e}"))
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
            // The writer takes the spare only while no checkpoint runs.
            let keep = shared.overlay().spare == Spare::Wanted;
            let result = checkpoint_into(&shared.db, &segment.records)
                .and_then(|()| shared.refresh_snapshot())
                .map_err(|e| e.to_string())
                .and_then(|()| retire(&shared.dir, &segment.segment, keep));
            let mut overlay = shared.overlay();
            match result {
                Ok(kept) => {
                    if kept {
                        overlay.spare = Spare::Ready;
                    }
                    shared.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                    shared
                        .stats
                        .checkpointed
                        .fetch_add(segment.records.len() as u64, Ordering::Relaxed);
                    overlay.frozen = None;
                    overlay.checkpoint_error = None;
                    shared.checkpointed.notify_all();
                    drop(overlay);
                    free_yielding(segment);
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

/// Frees a checkpointed segment's records (a few tens of allocations each,
/// a quarter of the checkpoint thread's CPU in the durable benchmark),
/// yielding the core every [`YIELD_EVERY`](super::YIELD_EVERY) records. A
/// segment something else still holds is left for it to free.
fn free_yielding(segment: Arc<Frozen>) {
    if let Ok(mut frozen) = Arc::try_unwrap(segment) {
        for (n, pending) in frozen.records.table.drain().enumerate() {
            drop(pending);
            super::pace(n);
        }
    }
}

/// Retires a checkpointed segment: keeps it as the spare for the next
/// segment to write over (if `keep`, and the rename works), or deletes it,
/// durably either way. Returns whether it was kept.
fn retire(dir: &Path, segment: &Path, keep: bool) -> Result<bool, String> {
    let kept = keep
        && std::fs::rename(segment, dir.join(journal::SPARE))
            .inspect_err(|error| tracing::debug!(%error, "cannot keep a spare journal segment"))
            .is_ok();
    if !kept {
        match std::fs::remove_file(segment) {
            // Retired by an earlier attempt whose directory sync failed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            removed => removed.map_err(|e| format!("cannot delete {}: {e}", segment.display()))?,
        }
    }
    journal::sync_dir(dir).map_err(|e| format!("cannot sync {}: {e}", dir.display()))?;
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::activity::{ActivityRecord, Policy, Status};
    use std::path::PathBuf;

    /// A frozen segment of `n` records, and a clone of each record.
    fn frozen(n: usize) -> (Arc<Frozen>, Vec<Arc<ActivityRecord>>) {
        let mut records = super::super::Records::default();
        let mut clones = Vec::new();
        for i in 0..n {
            let record = Arc::new(ActivityRecord {
                tenant: "t".into(),
                activity_id: format!("a-{i}"),
                workflow_id: String::new(),
                policy: Policy {
                    max_attempts: 3,
                    deadline_seconds: 60,
                    base: None,
                    cap: None,
                },
                started_at_ms: 0,
                attempts: 1,
                status: Status::Open,
                closed_code: None,
                closed_at_ms: None,
                reservation: None,
                events: Vec::new(),
            });
            clones.push(Arc::clone(&record));
            records.upsert(Pending {
                record,
                entry: vec![0; 16],
                stored_purge: None,
            });
        }
        let segment = PathBuf::from("journal-00000000000000000001.log");
        (Arc::new(Frozen { segment, records }), clones)
    }

    #[test]
    fn a_checkpointed_segment_frees_every_record() {
        // Not a whole number of yields' worth, so the last stretch counts.
        let (segment, clones) = frozen(3 * super::super::YIELD_EVERY + 5);
        free_yielding(segment);
        assert!(clones.iter().all(|c| Arc::strong_count(c) == 1));
    }

    #[test]
    fn a_segment_still_held_is_left_to_its_holder() {
        let (segment, clones) = frozen(10);
        let held = Arc::clone(&segment);
        free_yielding(segment);
        assert!(clones.iter().all(|c| Arc::strong_count(c) == 2));
        drop(held);
        assert!(clones.iter().all(|c| Arc::strong_count(c) == 1));
    }

    /// A gate whose writer is the calling thread.
    fn gate() -> Arc<Gate> {
        let gate = Arc::new(Gate {
            queued: AtomicUsize::new(0),
            wake_at: AtomicUsize::new(usize::MAX),
            writer: std::sync::OnceLock::new(),
            idle: AtomicBool::new(false),
        });
        gate.writer.set(thread::current()).expect("unset");
        gate
    }

    /// Sends `n` commands from another thread, `gap` apart.
    fn send_later(gate: &Arc<Gate>, n: usize, gap: Duration) -> thread::JoinHandle<()> {
        let gate = Arc::clone(gate);
        thread::spawn(move || {
            for _ in 0..n {
                thread::sleep(gap);
                gate.send(|| Ok::<(), ()>(())).expect("sent");
            }
        })
    }

    #[test]
    fn a_complete_group_ends_the_window() {
        let gate = gate();
        let senders = send_later(&gate, 3, Duration::from_millis(20));
        let started = Instant::now();
        gate.wait(started + Duration::from_secs(30), 3);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "waited {:?} for a group that was complete",
            started.elapsed()
        );
        assert_eq!(gate.queued.load(Ordering::SeqCst), 3);
        assert_eq!(gate.wake_at.load(Ordering::SeqCst), usize::MAX);
        senders.join().unwrap();
    }

    #[test]
    fn an_incomplete_group_waits_out_the_window() {
        let gate = gate();
        let senders = send_later(&gate, 2, Duration::from_millis(5));
        let started = Instant::now();
        let window = Duration::from_millis(300);
        gate.wait(started + window, 3);
        assert!(started.elapsed() >= window, "{:?}", started.elapsed());
        senders.join().unwrap();
        gate.taken(2);
        assert_eq!(gate.queued.load(Ordering::SeqCst), 0);
    }

    /// Calls `runtime_parks` from another thread after `after`.
    fn park_later(gate: &Arc<Gate>, after: Duration) -> thread::JoinHandle<()> {
        let gate = Arc::clone(gate);
        thread::spawn(move || {
            thread::sleep(after);
            gate.runtime_parks();
        })
    }

    #[test]
    fn a_parked_runtime_ends_the_window() {
        let gate = gate();
        for _ in 0..IDLE_COMMIT_MIN {
            gate.send(|| Ok::<(), ()>(())).expect("sent");
        }
        let idle = RuntimeIdle::new();
        idle.watch(&gate);
        let parks = {
            let idle = idle.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(20));
                idle.parking();
            })
        };
        let started = Instant::now();
        gate.wait(started + Duration::from_secs(30), 2 * IDLE_COMMIT_MIN);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "waited {:?} with enough saves queued and the runtime idle",
            started.elapsed()
        );
        parks.join().unwrap();
    }

    #[test]
    fn a_parked_runtime_with_few_saves_queued_leaves_the_window() {
        for queued in [0, IDLE_COMMIT_MIN - 1] {
            let gate = gate();
            for _ in 0..queued {
                gate.send(|| Ok::<(), ()>(())).expect("sent");
            }
            let parks = park_later(&gate, Duration::from_millis(20));
            let started = Instant::now();
            let window = Duration::from_millis(300);
            gate.wait(started + window, 2 * IDLE_COMMIT_MIN);
            assert!(
                started.elapsed() >= window,
                "{queued}: {:?}",
                started.elapsed()
            );
            parks.join().unwrap();
        }
    }

    #[test]
    fn a_park_before_the_window_does_not_end_it() {
        let gate = gate();
        for _ in 0..IDLE_COMMIT_MIN {
            gate.send(|| Ok::<(), ()>(())).expect("sent");
        }
        // Not waiting yet: ignored. And a signal left over from an earlier
        // window is cleared when the next one starts.
        gate.runtime_parks();
        gate.idle.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let window = Duration::from_millis(300);
        gate.wait(started + window, 2 * IDLE_COMMIT_MIN);
        assert!(started.elapsed() >= window, "{:?}", started.elapsed());
    }

    #[test]
    fn a_retired_segment_is_kept_as_the_spare_or_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let (dir, spare) = (dir.path(), dir.path().join(journal::SPARE));
        let segment = |n: u64| {
            let path = dir.join(journal::segment_name(n));
            std::fs::write(&path, b"checkpointed").unwrap();
            path
        };
        let first = segment(1);
        assert_eq!(retire(dir, &first, true), Ok(true));
        assert!(!first.exists());
        assert_eq!(std::fs::read(&spare).unwrap(), b"checkpointed");

        let second = segment(2);
        assert_eq!(retire(dir, &second, false), Ok(false));
        assert!(!second.exists());

        // Retired already by an attempt whose directory sync failed.
        assert_eq!(retire(dir, &second, true), Ok(false));

        // A spare that cannot be made: the segment is deleted instead.
        std::fs::remove_file(&spare).unwrap();
        std::fs::create_dir(&spare).unwrap();
        std::fs::write(spare.join("in the way"), b"").unwrap();
        let third = segment(3);
        assert_eq!(retire(dir, &third, true), Ok(false));
        assert!(!third.exists());
    }

    #[test]
    fn a_failed_send_is_not_counted() {
        let gate = gate();
        assert_eq!(gate.send(|| Err::<(), _>("closed")), Err("closed"));
        assert_eq!(gate.queued.load(Ordering::SeqCst), 0);
    }
}
