//! What one run is: the dependency, the load, the trigger and the timeline,
//! each constant with its reason (docs/storm.md, "The model").

use std::time::Duration;

/// The phases of a run, in seconds from its start.
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    /// Load runs but is not measured: queues and buckets settle.
    pub warmup: f64,
    /// The baseline: goodput "before" is the mean over these seconds.
    pub before: f64,
    /// How long the trigger lasts (capacity at a third).
    pub trigger: f64,
    /// How long the run is observed after the trigger ends.
    pub after: f64,
}

impl Timeline {
    /// The full lab's: 5 s warm-up, 10 s before, a 10 s trigger, 45 s
    /// after. With no retries at all the dependency needs about 19 s after
    /// the trigger to drain its queue; recovery must then hold for 10 s, so
    /// 30 s after could not tell a policy slower than that from one that
    /// never recovers: 45 s can, up to 35 s.
    pub const FULL: Self = Self {
        warmup: 5.0,
        before: 10.0,
        trigger: 10.0,
        after: 45.0,
    };
    /// CI's short run: the same story in 31 s.
    pub const SHORT: Self = Self {
        warmup: 2.0,
        before: 5.0,
        trigger: 4.0,
        after: 20.0,
    };

    /// When the baseline starts.
    pub fn before_start(&self) -> f64 {
        self.warmup
    }

    /// When the trigger starts.
    pub fn trigger_start(&self) -> f64 {
        self.warmup + self.before
    }

    /// When the trigger ends and capacity comes back.
    pub fn trigger_end(&self) -> f64 {
        self.trigger_start() + self.trigger
    }

    /// When the run ends.
    pub fn end(&self) -> f64 {
        self.trigger_end() + self.after
    }
}

/// The scenarios of the lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// The main case: rho 0.8, capacity drops to a third for the trigger.
    Drop,
    /// Not overloaded (rho 0.6), 10% of calls fail at random, no trigger:
    /// where retries are worth having.
    Flaky,
    /// The drop with the same load spread over 10 workers.
    Drop10,
    /// The drop with the same load spread over 1,000 workers.
    Drop1000,
    /// The drop, every worker restarting once during it (per-client state
    /// starts full again).
    Restart,
    // Two dependencies, one failing, comes with per-dependency budgets
    // (issue #52): a `Setup` with a second `Dependency` and a worker loop
    // that names the dependency it called.
}

/// Everything a run's model needs.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// The dependency's capacity C, requests a second.
    pub capacity: f64,
    /// Concurrent slots serving the queue; each request takes `slots / C`.
    pub slots: usize,
    /// A caller gives up waiting after this (T): the attempt is a timeout.
    pub timeout: Duration,
    /// Activities arrive at `rho * C` a second (Poisson).
    pub rho: f64,
    /// Workers the activities are spread over, each with its own state.
    pub workers: usize,
    /// The noisy tenant's share of the arrivals; the quiet one has the rest.
    pub noisy_share: f64,
    /// Attempts per activity, the first included.
    pub max_attempts: u32,
    /// An activity is abandoned this long after it arrived.
    pub deadline: Duration,
    /// Capacity during the trigger, as a fraction of C (1: no trigger).
    pub trigger_capacity: f64,
    /// Probability that a served call fails anyway (a flaky dependency).
    pub fail_probability: f64,
    /// Every worker restarts once at a random time during the trigger.
    pub restart: bool,
    /// The phases.
    pub timeline: Timeline,
    /// Seeds arrivals, tenants, workers, jitter, failures and restarts.
    pub seed: u64,
}

impl Setup {
    /// A scenario at capacity `capacity` on `timeline`.
    pub fn new(scenario: Scenario, capacity: f64, timeline: Timeline, seed: u64) -> Self {
        let main = Self {
            capacity,
            slots: 4,
            timeout: Duration::from_secs(2),
            rho: 0.8,
            workers: 100,
            noisy_share: 0.8,
            max_attempts: 4,
            deadline: Duration::from_secs(30),
            trigger_capacity: 1.0 / 3.0,
            fail_probability: 0.0,
            restart: false,
            timeline,
            seed,
        };
        match scenario {
            Scenario::Drop => main,
            Scenario::Flaky => Self {
                rho: 0.6,
                trigger_capacity: 1.0,
                fail_probability: 0.1,
                ..main
            },
            Scenario::Drop10 => Self {
                workers: 10,
                ..main
            },
            Scenario::Drop1000 => Self {
                workers: 1000,
                ..main
            },
            Scenario::Restart => Self {
                restart: true,
                ..main
            },
        }
    }

    /// The capacity at `t` seconds into the run.
    pub fn capacity_at(&self, t: f64) -> f64 {
        let tl = &self.timeline;
        if t >= tl.trigger_start() && t < tl.trigger_end() {
            self.capacity * self.trigger_capacity
        } else {
            self.capacity
        }
    }

    /// The mean arrival rate, activities a second.
    pub fn arrival_rate(&self) -> f64 {
        self.rho * self.capacity
    }
}
