//! One run: seeded open-loop arrivals, each activity a task on its worker's
//! policy, the dependency model, the trigger, and the ticker that measures
//! the lab's own lag; the figures at the end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::dependency::{Dependency, Outcome};
use crate::policy::{ClientPolicy, Failure, Rule};
use crate::record::{Activity, End, Recorder, Tenant};
use crate::service::{Decision, Server};
use crate::setup::Setup;

/// Mixed into the seed for the restart times, so that drawing them leaves
/// the arrivals as they are in the scenarios without restarts.
const RESTART_STREAM: u64 = 0x7265_7374_6172_7473;

/// Who decides retries.
#[derive(Debug)]
pub enum Policy {
    /// Each worker its own state under a published per-client rule.
    Client(Rule),
    /// The retry-budget server, asked as the README's worker loop says.
    Service(Box<Server>),
}

/// One activity's arrival, drawn before the run so that every policy sees
/// the same activities at the same times.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    /// Seconds into the run.
    at: f64,
    /// Whose it is.
    tenant: Tenant,
    /// The worker that runs it.
    worker: usize,
    /// Seeds its failures and jitter.
    seed: u64,
}

/// What every activity task shares.
struct Lab {
    setup: Setup,
    origin: Instant,
    dependency: Arc<Dependency>,
    recorder: Arc<Recorder>,
    /// Per worker: its client policy state (unused with the service).
    workers: Vec<Mutex<ClientPolicy>>,
    policy: Policy,
}

impl Lab {
    fn seconds(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64()
    }

    fn worker(&self, index: usize) -> std::sync::MutexGuard<'_, ClientPolicy> {
        self.workers[index]
            .lock()
            .expect("a worker's lock is never poisoned")
    }
}

/// Draws the run's arrivals: Poisson at `rho * C`, 80% noisy, each on a
/// worker drawn uniformly.
fn arrivals(setup: &Setup) -> Vec<Arrival> {
    let mut rng = StdRng::seed_from_u64(setup.seed);
    let rate = setup.arrival_rate();
    let end = setup.timeline.end();
    let mut out = Vec::with_capacity((rate * end * 1.1) as usize);
    let mut at = 0.0;
    loop {
        at += -(1.0 - rng.random::<f64>()).ln() / rate;
        if at >= end {
            return out;
        }
        let tenant = if rng.random::<f64>() < setup.noisy_share {
            Tenant::Noisy
        } else {
            Tenant::Quiet
        };
        out.push(Arrival {
            at,
            tenant,
            worker: rng.random_range(0..setup.workers),
            seed: rng.random(),
        });
    }
}

/// Runs `setup` under `policy`; returns the run's figures and series.
pub async fn run(setup: Setup, policy: Policy) -> Value {
    let arrivals = arrivals(&setup);
    let tl = setup.timeline;
    let seconds = tl.end().ceil() as usize + 1;
    let recorder = Arc::new(Recorder::new(
        seconds,
        arrivals
            .iter()
            .map(|a| Activity {
                arrived: a.at,
                tenant: a.tenant,
                end: End::Pending,
            })
            .collect(),
    ));
    let rule = match &policy {
        Policy::Client(rule) => *rule,
        Policy::Service(_) => Rule::None,
    };
    // A short margin so the first arrivals are not late on the clock.
    let origin = Instant::now() + Duration::from_millis(100);
    let dependency = Arc::new(Dependency::new(setup, origin, recorder.clone()));
    let lab = Arc::new(Lab {
        setup,
        origin,
        dependency: dependency.clone(),
        recorder: recorder.clone(),
        workers: (0..setup.workers)
            .map(|_| Mutex::new(ClientPolicy::new(rule)))
            .collect(),
        policy,
    });

    if setup.restart {
        // Each worker restarts once, at a random moment of the trigger: its
        // per-client state starts full again.
        let mut rng = StdRng::seed_from_u64(setup.seed ^ RESTART_STREAM);
        for worker in 0..setup.workers {
            let at = tl.trigger_start() + rng.random::<f64>() * tl.trigger;
            let lab = lab.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(lab.origin + Duration::from_secs_f64(at)).await;
                *lab.worker(worker) = ClientPolicy::new(rule);
            });
        }
    }

    let driver = {
        let lab = lab.clone();
        tokio::spawn(async move {
            for (index, arrival) in arrivals.into_iter().enumerate() {
                tokio::time::sleep_until(lab.origin + Duration::from_secs_f64(arrival.at)).await;
                let lab = lab.clone();
                tokio::spawn(async move { activity(lab, index, arrival).await });
            }
        })
    };

    let end = origin + Duration::from_secs_f64(tl.end());
    let mut late = crate::lag::measure(origin, end, dependency, recorder.clone()).await;
    driver.abort();
    let tallies = recorder.snapshot();
    let mut out = crate::record::summarize(&tallies, &setup);
    let lag = crate::lag::summarize(&mut late);
    merge(&mut out, lag);
    merge(
        &mut out,
        json!({
            "arrived": tallies.activities.len(),
            "series": {
                "goodput": tallies.goodput,
                "calls": tallies.calls,
                "queue": tallies.queue,
                "wasted": tallies.wasted,
            },
        }),
    );
    out
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

/// One activity: attempts against the dependency until one succeeds or the
/// policy, the attempts or the deadline stop it.
async fn activity(lab: Arc<Lab>, index: usize, arrival: Arrival) {
    let setup = &lab.setup;
    let mut rng = StdRng::seed_from_u64(arrival.seed);
    let deadline = lab.origin + Duration::from_secs_f64(arrival.at) + setup.deadline;
    let activity_id = format!("s{}-a{index}", setup.seed);
    let mut attempt = 1;
    let mut last_cost = 0;
    if let Policy::Client(_) = lab.policy {
        lab.worker(arrival.worker)
            .on_request(lab.seconds(Instant::now()));
    }
    let end = loop {
        // Drawn for every attempt under every policy, so the n-th attempt of
        // an activity fails (flaky) or not alike everywhere.
        let fails = rng.random::<f64>() < setup.fail_probability;
        let u = rng.random::<f64>();
        let outcome = lab.dependency.call(fails).await;
        let now = Instant::now();
        if outcome == Outcome::Ok {
            match &lab.policy {
                Policy::Client(_) => lab.worker(arrival.worker).on_success(last_cost),
                Policy::Service(server) => {
                    lab.recorder.end(index, End::Succeeded(lab.seconds(now)));
                    if server
                        .record_success(arrival.tenant.id(), &activity_id)
                        .await
                        .is_err()
                    {
                        lab.recorder.service_error();
                    }
                    return;
                }
            }
            break End::Succeeded(lab.seconds(now));
        }
        let wake = match &lab.policy {
            Policy::Client(_) => {
                let failure = Failure {
                    attempt,
                    timed_out: outcome == Outcome::TimedOut,
                    may_retry: attempt < setup.max_attempts && now < deadline,
                };
                let retry = lab
                    .worker(arrival.worker)
                    .on_failure(lab.seconds(now), failure, u);
                match retry {
                    Some(retry) => {
                        last_cost = retry.cost;
                        now + retry.delay
                    }
                    None => break End::Failed,
                }
            }
            Policy::Service(server) => {
                match ask(&lab, server, &arrival, &activity_id, attempt, deadline).await {
                    Some(wake) => wake,
                    None => break End::Failed,
                }
            }
        };
        // The execution system's schedule-to-close deadline, alike for all.
        if wake >= deadline {
            break End::Failed;
        }
        tokio::time::sleep_until(wake).await;
        attempt += 1;
    };
    lab.recorder.end(index, end);
}

/// Steps 1 and 2 of the README's worker loop for a failed attempt: report
/// it, wait out deferrals and report the same attempt again; `Some` time of
/// the next attempt, or `None` on a stop.
async fn ask(
    lab: &Lab,
    server: &Server,
    arrival: &Arrival,
    activity_id: &str,
    attempt: u32,
    deadline: Instant,
) -> Option<Instant> {
    let failed_at = SystemTime::now();
    loop {
        let decision = server
            .next_action(
                arrival.tenant.id(),
                activity_id,
                attempt,
                failed_at,
                lab.setup.max_attempts,
                lab.setup.deadline,
            )
            .await;
        match decision {
            Ok(Decision::Retry(at)) => return Some(instant(at)),
            Ok(Decision::Deferred(at)) => {
                lab.recorder.deferral();
                if instant(at) >= deadline {
                    return None;
                }
                tokio::time::sleep_until(instant(at)).await;
            }
            Ok(Decision::Stop) => return None,
            Err(_) => {
                lab.recorder.service_error();
                return None;
            }
        }
    }
}

/// The tokio instant of a wall-clock time the service named.
fn instant(at: SystemTime) -> Instant {
    let now = Instant::now();
    match at.duration_since(SystemTime::now()) {
        Ok(ahead) => now + ahead,
        Err(_) => now,
    }
}
