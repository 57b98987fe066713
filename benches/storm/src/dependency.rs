//! The dependency: capacity C served by `slots` concurrent slots, each
//! request taking `slots / C(start)`, in FIFO order from an unbounded queue.
//!
//! Overload makes latency grow; a caller gives up after T, but its request
//! stays queued and is served anyway (wasted work, counted when it is
//! served). Where the setup caps the queue, a call past the cap fails at
//! once, as does every call while the capacity is 0 (down). Because the queue is FIFO and every slot is taken by the
//! earliest request waiting, a request's start and end are known when it
//! arrives: the model keeps each slot's next free time and needs no task.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::record::Recorder;
use crate::setup::Setup;

/// What an attempt got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Served and succeeded within T.
    Ok,
    /// Served within T, and failed (the flaky dependency).
    Failed,
    /// Not served within T: the caller gave up.
    TimedOut,
    /// Refused at once: the queue was full, or the dependency down.
    Refused,
}

/// The shared dependency model.
#[derive(Debug)]
pub struct Dependency {
    /// The model's constants and capacity schedule.
    setup: Setup,
    /// Which of the run's dependencies this is (`setup::A` or `setup::B`):
    /// its capacity schedule and its counters.
    which: usize,
    /// The run's origin, for the capacity schedule.
    origin: Instant,
    /// Where calls, wasted work and queue lengths are counted.
    recorder: Arc<Recorder>,
    /// Slots and queue.
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// When each slot is next free.
    free: Vec<Instant>,
    /// Start times of the requests still waiting, oldest first (starts are
    /// nondecreasing in arrival order: FIFO onto the earliest free slot).
    waiting: VecDeque<Instant>,
}

impl Dependency {
    /// Dependency `which` of `setup`, idle at `origin`.
    pub fn new(setup: Setup, which: usize, origin: Instant, recorder: Arc<Recorder>) -> Self {
        Self {
            which,
            state: Mutex::new(State {
                free: vec![origin; setup.slots],
                waiting: VecDeque::new(),
            }),
            setup,
            origin,
            recorder,
        }
    }

    /// Sends one attempt and waits for its answer or for T; `fails` says
    /// whether it fails once served (drawn by the caller, so that every
    /// policy sees the same failures).
    pub async fn call(&self, fails: bool) -> Outcome {
        let now = Instant::now();
        self.recorder.call(self.which, self.seconds(now));
        let Some(done) = self.enqueue(now) else {
            return Outcome::Refused;
        };
        let give_up = now + self.setup.timeout;
        if done <= give_up {
            tokio::time::sleep_until(done).await;
            if fails { Outcome::Failed } else { Outcome::Ok }
        } else {
            self.recorder.wasted(self.which, self.seconds(done));
            tokio::time::sleep_until(give_up).await;
            Outcome::TimedOut
        }
    }

    /// Requests waiting for a slot at `now`.
    pub fn queue_len(&self, now: Instant) -> usize {
        let mut state = self
            .state
            .lock()
            .expect("the dependency's lock is never poisoned");
        while state.waiting.front().is_some_and(|&start| start <= now) {
            state.waiting.pop_front();
        }
        state.waiting.len()
    }

    /// Puts a request on the earliest free slot; returns when it is served,
    /// or `None` when it is refused (the dependency down, or its queue at
    /// the cap).
    fn enqueue(&self, now: Instant) -> Option<Instant> {
        if self.setup.capacity_at(self.which, self.seconds(now)) <= 0.0 {
            return None;
        }
        let mut state = self
            .state
            .lock()
            .expect("the dependency's lock is never poisoned");
        if let Some(cap) = self.setup.queue_cap {
            while state.waiting.front().is_some_and(|&start| start <= now) {
                state.waiting.pop_front();
            }
            if state.waiting.len() >= cap {
                return None;
            }
        }
        let (slot, &free) = state
            .free
            .iter()
            .enumerate()
            .min_by_key(|&(_, t)| *t)
            .expect("a dependency has at least one slot");
        let start = free.max(now);
        let capacity = self.setup.capacity_at(self.which, self.seconds(start));
        if capacity <= 0.0 {
            // Down when its turn would come: refused as well.
            return None;
        }
        let service = self.setup.slots as f64 / capacity;
        let done = start + Duration::from_secs_f64(service);
        state.free[slot] = done;
        if start > now {
            state.waiting.push_back(start);
        }
        Some(done)
    }

    /// Which of the run's dependencies this is.
    pub fn which(&self) -> usize {
        self.which
    }

    fn seconds(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64()
    }
}
