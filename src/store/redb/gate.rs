//! The commit gate: how the journal writer waits out its commit window, and
//! how a runtime running out of work ([`RuntimeIdle`]) ends it early.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::{self, Thread};
use std::time::Instant;

/// How the writer waits out its commit window: until the window ends, or
/// until as many commands wait as recent groups carried, whichever comes
/// first. Under a steady load the clients of one group come back together
/// (each sends its next request once acknowledged); waiting longer for
/// them would leave the CPU idle and add latency, committing before they
/// are all back would spend more fsyncs for the same decisions.
pub(super) struct Gate {
    /// Commands sent and not yet taken by the writer.
    queued: AtomicUsize,
    /// How many queued commands wake the writer; `usize::MAX` when it is
    /// not waiting out a window.
    wake_at: AtomicUsize,
    /// The writer thread, set once it runs.
    writer: OnceLock<Thread>,
    /// Set when the runtime ran out of work while saves waited out the
    /// window: they need not wait longer, since no more are coming until
    /// they are acknowledged (or the network brings new requests).
    idle: AtomicBool,
}

/// The fewest queued saves that a runtime going idle commits at once. A
/// group this large spreads an fsync's fixed cost thin; a smaller one is
/// worth waiting for, since its clients' next requests are still on their
/// way and the window or a complete group ends the wait.
const IDLE_COMMIT_MIN: usize = 32;

/// Lets a store's journal writer end its commit window when a runtime
/// worker that serves the store's requests runs out of work: waiting on
/// would leave the CPU idle while saves wait for their fsync (once enough
/// wait: 32 or more). Give one
/// handle to [`tokio::runtime::Builder::on_thread_park`] (calling
/// [`RuntimeIdle::parking`]) and a clone to
/// [`RedbStoreOptions::runtime_idle`](super::RedbStoreOptions::runtime_idle).
///
/// Where a decision is cheap and the fsync is not, many streams keep the
/// runtime busy: starting the next group as soon as the runtime idles keeps
/// the writer from waiting out a window the saves could have filled, and
/// with few streams the runtime idles often, so nothing changes.
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
    pub(super) fn watch(&self, gate: &Arc<Gate>) {
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
    /// A gate with nothing queued and no writer yet.
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            queued: AtomicUsize::new(0),
            wake_at: AtomicUsize::new(usize::MAX),
            writer: OnceLock::new(),
            idle: AtomicBool::new(false),
        })
    }

    /// Names the writer thread, which senders wake.
    pub(super) fn set_writer(&self, writer: Thread) {
        // Set once, by the store that starts the writer.
        let _ = self.writer.set(writer);
    }

    /// Sends `command` through `send`, counting it first (so that the
    /// writer never takes more than was counted), then wakes the writer when
    /// it completes the group the writer waits for.
    pub(super) fn send<E>(&self, send: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
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
    pub(super) fn taken(&self, commands: usize) {
        self.queued.fetch_sub(commands, Ordering::SeqCst);
    }

    /// Sleeps until `until`, until `group` commands are queued, or until
    /// the runtime parks while some are.
    pub(super) fn wait(&self, until: Instant, group: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A gate whose writer is the calling thread.
    fn gate() -> Arc<Gate> {
        let gate = Gate::new();
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
    fn a_failed_send_is_not_counted() {
        let gate = gate();
        assert_eq!(gate.send(|| Err::<(), _>("closed")), Err("closed"));
        assert_eq!(gate.queued.load(Ordering::SeqCst), 0);
    }
}
