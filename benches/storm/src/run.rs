//! One run: seeded open-loop arrivals, each activity a task on its worker's
//! policy, the dependency model, the trigger, and the ticker that measures
//! the lab's own lag; the figures at the end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::time::Instant;

use crate::dependency::{Dependency, Outcome};
use crate::policy::{ClientPolicy, Failure, Rule};
use crate::record::{Activity, End, Recorder, TENANTS, Tenant};
use crate::service::{Decision, Server, Traffic};
use crate::setup::{A, B, Setup};

/// Mixed into an activity's seed for the backoff of its calls to the
/// service when they fail (`service-restart`), so that drawing it leaves
/// the activity's own draws as they are.
const SERVICE_RETRY_STREAM: u64 = 0x5e7_1ce;
/// Mixed into the seed for the restart times, so that drawing them leaves
/// the arrivals as they are in the scenarios without restarts.
const RESTART_STREAM: u64 = 0x7265_7374_6172_7473;
/// Mixed into the seed for the healthy dependency's arrivals, so that the
/// failing one's are those of the one-dependency scenarios.
const HEALTHY_STREAM: u64 = 0x6865_616c_7468_7979;
/// The stop the lab counts when its own deadline (from the activity's
/// arrival, earlier than the service's, which counts from the first
/// failure) ends an activity the service would have let wait.
const LAB_DEADLINE: &str = "lab_deadline";
/// How often each worker reports its traffic to the service, as the
/// Python and Node clients do.
const TRAFFIC_INTERVAL: Duration = Duration::from_secs(1);

/// What the workers tell the service besides the failures they ask
/// about (the service's policies only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Reports {
    /// `RecordSuccess` for each activity that succeeds after a failure,
    /// and a `ReportTraffic` a second: the Python and Node clients.
    All,
    /// `RecordSuccess` only, no traffic reports: a worker with plain stubs
    /// that closes what it opened.
    Records,
    /// Failures only (`NextAction`): the article's API, grpcurl.
    None,
}

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
    /// The dependency it calls (`A` or `B`).
    dependency: usize,
    /// Seeds its failures and jitter.
    seed: u64,
}

/// What every activity task shares.
struct Lab {
    setup: Setup,
    origin: Instant,
    /// The run's dependencies, `A` first.
    dependencies: Vec<Arc<Dependency>>,
    recorder: Arc<Recorder>,
    /// Per worker and dependency (`worker * dependencies + dependency`): the
    /// client policy state, unused with the service. A worker holds one
    /// client per dependency, as an SDK client (a boto3 client per service,
    /// a gRPC channel per target, a Finagle client per destination) is
    /// built for one destination: its quota, tokens or budget are that
    /// worker's for that dependency alone.
    clients: Vec<Mutex<ClientPolicy>>,
    /// Per worker and dependency, as `clients`: its calls since its last
    /// traffic report (the service only).
    traffic: Vec<Mutex<Traffic>>,
    policy: Policy,
    reports: Reports,
}

impl Lab {
    fn seconds(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64()
    }

    fn client(&self, worker: usize, dependency: usize) -> std::sync::MutexGuard<'_, ClientPolicy> {
        self.clients[worker * self.dependencies.len() + dependency]
            .lock()
            .expect("a client's lock is never poisoned")
    }

    fn traffic(
        &self,
        worker: usize,
        tenant: Tenant,
        dependency: usize,
    ) -> std::sync::MutexGuard<'_, Traffic> {
        self.traffic
            [(worker * TENANTS.len() + tenant as usize) * self.dependencies.len() + dependency]
            .lock()
            .expect("a traffic count's lock is never poisoned")
    }

    /// The dependency a pace the service answered is for.
    fn which(&self, name: &str) -> Option<usize> {
        (0..self.dependencies.len()).find(|&d| {
            let ours = self.setup.dependency_name(d);
            name == ours || (ours.is_empty() && name == "default")
        })
    }
}

/// Draws the run's arrivals: for each dependency, Poisson at its rate, 80%
/// noisy, each on a worker drawn uniformly; merged in time order.
fn arrivals(setup: &Setup) -> Vec<Arrival> {
    let mut out = arrivals_of(setup, A, setup.seed);
    if setup.healthy.is_some() {
        out.extend(arrivals_of(setup, B, setup.seed ^ HEALTHY_STREAM));
        out.sort_by(|a, b| a.at.total_cmp(&b.at));
    }
    out
}

/// Dependency `which`'s arrivals, drawn from `seed`.
fn arrivals_of(setup: &Setup, which: usize, seed: u64) -> Vec<Arrival> {
    let mut rng = StdRng::seed_from_u64(seed);
    let rate = setup.arrival_rate_of(which);
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
            dependency: which,
            seed: rng.random(),
        });
    }
}

/// Runs `setup` under `policy`; returns the run's figures and series.
pub async fn run(setup: Setup, policy: Policy, reports: Reports) -> Value {
    let arrivals = arrivals(&setup);
    let tl = setup.timeline;
    let seconds = tl.end().ceil() as usize + 1;
    let recorder = Arc::new(Recorder::new(
        seconds,
        setup.dependencies(),
        arrivals
            .iter()
            .map(|a| Activity::new(a.at, a.tenant, a.dependency))
            .collect(),
        tl.trigger_end(),
    ));
    let rule = match &policy {
        Policy::Client(rule) => *rule,
        Policy::Service(_) => Rule::None,
    };
    // A short margin so the first arrivals are not late on the clock.
    let origin = Instant::now() + Duration::from_millis(100);
    let dependencies: Vec<_> = (0..setup.dependencies())
        .map(|which| Arc::new(Dependency::new(setup, which, origin, recorder.clone())))
        .collect();
    let clients = setup.workers * dependencies.len();
    let lab = Arc::new(Lab {
        setup,
        origin,
        dependencies: dependencies.clone(),
        recorder: recorder.clone(),
        clients: (0..clients)
            .map(|_| Mutex::new(ClientPolicy::new(rule)))
            .collect(),
        traffic: (0..clients * TENANTS.len())
            .map(|_| Mutex::default())
            .collect(),
        policy,
        reports,
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
                for dependency in 0..lab.dependencies.len() {
                    *lab.client(worker, dependency) = ClientPolicy::new(rule);
                }
            });
        }
    }

    if let (Policy::Service(_), Some(outage)) = (&lab.policy, setup.service_outage) {
        let lab = lab.clone();
        tokio::spawn(async move {
            let at = tl.trigger_start() + outage.into_trigger;
            tokio::time::sleep_until(lab.origin + Duration::from_secs_f64(at)).await;
            if let Policy::Service(server) = &lab.policy
                && let Err(error) = server.restart(Duration::from_secs_f64(outage.down)).await
            {
                eprintln!("retry-budget-storm: the service's restart: {error}");
            }
        });
    }

    if let (Policy::Service(_), Reports::All) = (&lab.policy, reports) {
        // Each worker reports its traffic once a second, the workers'
        // reports spread evenly over the second.
        for worker in 0..setup.workers {
            let lab = lab.clone();
            let phase = TRAFFIC_INTERVAL.mul_f64(worker as f64 / setup.workers as f64);
            tokio::spawn(async move { report_traffic(lab, worker, phase).await });
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
    let mut late = crate::lag::measure(origin, end, dependencies, recorder.clone()).await;
    driver.abort();
    let tallies = recorder.snapshot(tl.end());
    let mut out = crate::record::summarize(&tallies, &setup);
    let lag = crate::lag::summarize(&mut late);
    merge(&mut out, lag);
    out
}

/// A worker's traffic reports: every `TRAFFIC_INTERVAL` from `phase`, its
/// calls to each dependency since the last report, when it made any (the
/// clients send nothing for an idle interval). The answer's pace of each
/// dependency is recorded.
async fn report_traffic(lab: Arc<Lab>, worker: usize, phase: Duration) {
    let Policy::Service(server) = &lab.policy else {
        return;
    };
    let end = lab.origin + Duration::from_secs_f64(lab.setup.timeline.end());
    let mut next = lab.origin + phase + TRAFFIC_INTERVAL;
    while next < end {
        tokio::time::sleep_until(next).await;
        next += TRAFFIC_INTERVAL;
        for tenant in TENANTS {
            report_of(&lab, server, worker, tenant).await;
        }
    }
}

/// One report of `worker`'s calls for `tenant` (a worker runs activities
/// of both tenants, as a client per tenant would, each reporting its own).
async fn report_of(lab: &Lab, server: &Server, worker: usize, tenant: Tenant) {
    let counts: Vec<_> = (0..lab.dependencies.len())
        .map(|d| (d, std::mem::take(&mut *lab.traffic(worker, tenant, d))))
        .filter(|(_, t)| t.calls > 0)
        .collect();
    if counts.is_empty() {
        return;
    }
    let report = counts
        .iter()
        .map(|&(d, t)| (lab.setup.dependency_name(d), t));
    match server.report_traffic(tenant.id(), report).await {
        Ok(paces) => {
            let t = lab.seconds(Instant::now());
            for (name, rate) in paces {
                if let Some(which) = lab.which(&name) {
                    lab.recorder.pace(which, tenant, t, rate);
                }
            }
        }
        Err(_) => {
            // The clients keep the counts for the next report.
            for (d, t) in counts {
                let mut kept = lab.traffic(worker, tenant, d);
                kept.calls += t.calls;
                kept.successes += t.successes;
                kept.failures += t.failures;
            }
            lab.recorder.service_error();
        }
    }
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
    let which = arrival.dependency;
    let dependency = setup.dependency_name(which);
    let mut rng = StdRng::seed_from_u64(arrival.seed);
    let deadline = lab.origin + Duration::from_secs_f64(arrival.at) + setup.deadline;
    let activity_id = format!("s{}-a{index}", setup.seed);
    let mut attempt = 1;
    let mut last_cost = 0;
    if let Policy::Client(_) = lab.policy {
        lab.client(arrival.worker, which)
            .on_request(lab.seconds(Instant::now()));
    }
    let end = loop {
        // Drawn for every attempt under every policy, so the n-th attempt of
        // an activity fails (flaky) or not alike everywhere.
        let fails = rng.random::<f64>() < setup.fail_probability_of(which);
        let u = rng.random::<f64>();
        let outcome = lab.dependencies[which].call(fails).await;
        let now = Instant::now();
        if let Policy::Service(_) = lab.policy {
            // Counted as the clients count a call: a success is sent with
            // RecordSuccess below, which counts it, so here only the call.
            let mut traffic = lab.traffic(arrival.worker, arrival.tenant, which);
            traffic.calls += 1;
            if outcome != Outcome::Ok {
                traffic.failures += 1;
            }
        }
        if outcome == Outcome::Ok {
            match &lab.policy {
                Policy::Client(_) => lab.client(arrival.worker, which).on_success(last_cost),
                Policy::Service(server) => {
                    lab.recorder
                        .end(index, End::Succeeded(lab.seconds(now)), lab.seconds(now));
                    if lab.reports != Reports::None {
                        // Recorded before the activity's deadline, or not at all.
                        let mut jitter = StdRng::seed_from_u64(arrival.seed ^ SERVICE_RETRY_STREAM);
                        let _ = persist(&lab, &mut jitter, deadline, || {
                            server.record_success(arrival.tenant.id(), dependency, &activity_id)
                        })
                        .await;
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
                let retry =
                    lab.client(arrival.worker, which)
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
                match ask(
                    &lab,
                    server,
                    index,
                    &arrival,
                    &activity_id,
                    attempt,
                    deadline,
                )
                .await
                {
                    Some(wake) => wake,
                    None => break End::Failed,
                }
            }
        };
        // The execution system's schedule-to-close deadline, alike for all.
        if wake >= deadline {
            if let Policy::Service(_) = lab.policy {
                lab.recorder.stop(which, LAB_DEADLINE);
            }
            break End::Failed;
        }
        tokio::time::sleep_until(wake).await;
        attempt += 1;
    };
    lab.recorder.end(index, end, lab.seconds(Instant::now()));
}

/// Steps 1 and 2 of the README's worker loop for a failed attempt: report
/// it, wait out deferrals and report the same attempt again; `Some` time of
/// the next attempt, or `None` on a stop.
async fn ask(
    lab: &Lab,
    server: &Server,
    index: usize,
    arrival: &Arrival,
    activity_id: &str,
    attempt: u32,
    deadline: Instant,
) -> Option<Instant> {
    let failed_at = SystemTime::now();
    let mut jitter =
        StdRng::seed_from_u64(arrival.seed ^ SERVICE_RETRY_STREAM ^ u64::from(attempt));
    loop {
        let which = arrival.dependency;
        let decision = persist(lab, &mut jitter, deadline, || {
            server.next_action(
                arrival.tenant.id(),
                lab.setup.dependency_name(which),
                activity_id,
                attempt,
                failed_at,
                lab.setup.max_attempts,
                lab.setup.deadline,
            )
        })
        .await;
        match decision {
            Ok(Decision::Retry(at)) => {
                lab.recorder.granted(index, lab.seconds(Instant::now()));
                return Some(instant(at));
            }
            Ok(Decision::Deferred(at, reason)) => {
                let now = lab.seconds(Instant::now());
                lab.recorder.deferral(index, which, now, &reason);
                if instant(at) >= deadline {
                    lab.recorder.stop(which, LAB_DEADLINE);
                    return None;
                }
                tokio::time::sleep_until(instant(at)).await;
            }
            Ok(Decision::Stop(code)) => {
                lab.recorder.stop(which, &code);
                return None;
            }
            // Unreachable past the activity's deadline.
            Err(()) => {
                lab.recorder.stop(which, LAB_DEADLINE);
                return None;
            }
        }
    }
}

/// A call to the service, retried as a worker retries any call to a
/// service: on an error, again after a full-jitter backoff of 100 ms
/// doubling to 1 s, until `give_up`. Each error counts as a service error.
async fn persist<T, F, Fut>(
    lab: &Lab,
    jitter: &mut StdRng,
    give_up: Instant,
    mut call: F,
) -> Result<T, ()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut cap = Duration::from_millis(100);
    loop {
        match call().await {
            Ok(answer) => return Ok(answer),
            Err(_) => {
                lab.recorder.service_error();
                let pause = cap.mul_f64(jitter.random::<f64>());
                if Instant::now() + pause >= give_up {
                    return Err(());
                }
                tokio::time::sleep(pause).await;
                cap = (cap * 2).min(Duration::from_secs(1));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::{Scenario, Timeline};

    #[test]
    fn two_deps_gives_a_the_drop_arrivals_and_b_its_own_in_time_order() {
        let drop = Setup::new(Scenario::Drop, 200.0, Timeline::SHORT, 3);
        let two = Setup::new(Scenario::TwoDeps, 200.0, Timeline::SHORT, 3);
        let key = |a: &Arrival| (a.at, a.worker, a.seed);
        let of_a: Vec<_> = arrivals(&two)
            .iter()
            .filter(|a| a.dependency == A)
            .map(key)
            .collect();
        assert_eq!(of_a, arrivals(&drop).iter().map(key).collect::<Vec<_>>());
        let all = arrivals(&two);
        assert!(all.windows(2).all(|w| w[0].at <= w[1].at));
        // B at rho 0.6 of 200 a second over the short run's 31 s: about 3,720.
        let of_b = all.iter().filter(|a| a.dependency == B).count();
        assert!((3_300..4_100).contains(&of_b), "{of_b} arrivals of B");
    }
}
