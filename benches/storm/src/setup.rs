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
    /// `long-outage`'s: 60 s of outage, and 240 s after it, enough for the
    /// backlog to drain at the spare capacity with room to see it late.
    pub const LONG: Self = Self {
        warmup: 5.0,
        before: 10.0,
        trigger: 60.0,
        after: 240.0,
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
    /// The drop, the retry-budget service killed 3 s into the trigger and
    /// started again 3 s later on the same data; its workers retry their
    /// calls to it with backoff meanwhile. The policies without the service
    /// run the drop.
    ServiceRestart,
    /// Issue #60's: the dependency at C/3 for 60 s, its queue capped at
    /// C x T (a call past it fails at once, as a full accept queue does),
    /// rho 0.7 and deadlines of 10 minutes; the backlog the outage leaves
    /// and how it drains (`backlog` in a run's figures).
    LongOutage,
    /// `long-outage` with the dependency fully down: every call during the
    /// outage fails at once (UNAVAILABLE).
    LongOutageDown,
    /// `long-outage` with the retry-budget service killed 60 s into the
    /// drain and started again 3 s later on the same data (a deploy in the
    /// middle of a recovery): the pace, and the point where the recovery
    /// last overloaded the dependency, must survive it.
    LongOutageRestart,
    /// Two dependencies (issue #52): A is the drop's, B a healthy one of its
    /// own capacity beside it, called by the same workers. B fails a few
    /// calls at random, so that it needs a few retries that a budget could
    /// refuse; without them no retry policy could touch B at all.
    TwoDeps,
}

/// The healthy dependency B of the `two-deps` scenario: the trigger does
/// not touch it.
#[derive(Debug, Clone, Copy)]
pub struct Healthy {
    /// B's capacity, requests a second.
    pub capacity: f64,
    /// B's activities arrive at `rho * capacity` a second (Poisson), on top
    /// of A's.
    pub rho: f64,
    /// Probability that a served call to B fails anyway: a healthy
    /// dependency's usual transient errors, which its retries repair.
    pub fail_probability: f64,
}

/// The service down for a while: killed (SIGKILL, nothing drained) and
/// started again on the same data directory and port.
#[derive(Debug, Clone, Copy)]
pub struct Outage {
    /// When it is killed, in seconds after the trigger starts.
    pub into_trigger: f64,
    /// How long it stays down, in seconds.
    pub down: f64,
}

/// The dependency the trigger hits: the only one, or A in `two-deps`.
pub const A: usize = 0;
/// The healthy dependency B of `two-deps`.
pub const B: usize = 1;

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
    /// The service's outage (`service-restart`).
    pub service_outage: Option<Outage>,
    /// Requests the dependency queues at most; a call past them fails at
    /// once. `None`: unbounded, the callers' timeouts the only limit.
    pub queue_cap: Option<usize>,
    /// Measure the backlog the outage leaves and how it drains (the long
    /// outages).
    pub backlog: bool,
    /// A second dependency beside the one the trigger hits (`two-deps`).
    pub healthy: Option<Healthy>,
    /// The phases.
    pub timeline: Timeline,
    /// Seeds arrivals, tenants, workers, jitter, failures and restarts.
    pub seed: u64,
}

impl Scenario {
    /// Whether this is one of the long outages (their own timeline).
    pub fn long(self) -> bool {
        matches!(
            self,
            Scenario::LongOutage | Scenario::LongOutageDown | Scenario::LongOutageRestart
        )
    }
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
            service_outage: None,
            queue_cap: None,
            backlog: false,
            healthy: None,
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
            // rho 0.7: C - load = 0.3 C of spare capacity drains the backlog
            // of the outage within the run (its physical limit, about 80 s
            // at C/3 and 140 s fully down, is well inside the 240 s after).
            Scenario::LongOutage | Scenario::LongOutageDown | Scenario::LongOutageRestart => Self {
                rho: 0.7,
                deadline: Duration::from_secs(600),
                queue_cap: Some((capacity * main.timeout.as_secs_f64()).round() as usize),
                backlog: true,
                trigger_capacity: if scenario == Scenario::LongOutageDown {
                    0.0
                } else {
                    1.0 / 3.0
                },
                service_outage: (scenario == Scenario::LongOutageRestart).then_some(Outage {
                    into_trigger: timeline.trigger + 60.0,
                    down: 3.0,
                }),
                ..main
            },
            Scenario::ServiceRestart => Self {
                service_outage: Some(Outage {
                    into_trigger: 3.0,
                    down: 3.0,
                }),
                ..main
            },
            // B: the same C as A, the flaky scenario's load (rho 0.6), 5% of
            // its calls failing at random: about 6 retries a second wanted,
            // half of what the adaptive default allows it (a tenth of its
            // 120 successes a second), so a budget that defers them does so
            // for want of tokens elsewhere, not of B's own.
            Scenario::TwoDeps => Self {
                healthy: Some(Healthy {
                    capacity,
                    rho: 0.6,
                    fail_probability: 0.05,
                }),
                ..main
            },
        }
    }

    /// How many dependencies the run has.
    pub fn dependencies(&self) -> usize {
        if self.healthy.is_some() { 2 } else { 1 }
    }

    /// The name a worker gives dependency `which` when it asks the service:
    /// empty (the service's default dependency) when there is only one, as
    /// a worker that never names one sends.
    pub fn dependency_name(&self, which: usize) -> &'static str {
        match (self.healthy, which) {
            (None, _) => "",
            (Some(_), A) => "a",
            (Some(_), _) => "b",
        }
    }

    /// Dependency `which`'s capacity at `t` seconds into the run.
    pub fn capacity_at(&self, which: usize, t: f64) -> f64 {
        if which != A {
            return self.healthy.map_or(self.capacity, |h| h.capacity);
        }
        let tl = &self.timeline;
        if t >= tl.trigger_start() && t < tl.trigger_end() {
            self.capacity * self.trigger_capacity
        } else {
            self.capacity
        }
    }

    /// Probability that a served call to dependency `which` fails anyway.
    pub fn fail_probability_of(&self, which: usize) -> f64 {
        match self.healthy {
            Some(h) if which != A => h.fail_probability,
            _ => self.fail_probability,
        }
    }

    /// The mean arrival rate of dependency A's (or the only one's)
    /// activities, a second.
    pub fn arrival_rate(&self) -> f64 {
        self.rho * self.capacity
    }

    /// The mean arrival rate of dependency `which`'s activities, a second.
    pub fn arrival_rate_of(&self, which: usize) -> f64 {
        match self.healthy {
            Some(h) if which != A => h.rho * h.capacity,
            _ => self.arrival_rate(),
        }
    }
}
