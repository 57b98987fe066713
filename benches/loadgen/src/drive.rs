//! The closed and open loops, the measurement window, and what they count.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::probe::{CpuClock, CpuUsed, SystemClock, SystemUsed};
use crate::scenario::VirtualClient;

/// How long requests still in flight at the end may take before the run
/// gives up on them (and counts them as `timeout`).
const GRACE: Duration = Duration::from_secs(5);
/// The open loop sleeps until this close to a request's due time, then
/// yields in a loop: tokio's timer has millisecond resolution, and a
/// millisecond of timer slack would be counted as latency.
const SPIN: Duration = Duration::from_micros(1500);

/// When to measure, and whose CPU.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Sending before the window.
    pub warmup: Duration,
    /// The window.
    pub duration: Duration,
    /// The server, whose CPU time in the window is reported.
    pub server_pid: Option<u32>,
}

/// The measurement window, in the generator's clock.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

impl Window {
    fn after(timing: Timing) -> Self {
        let start = Instant::now() + timing.warmup;
        Self {
            start,
            end: start + timing.duration,
        }
    }
}

/// What a run counted.
pub struct Tally {
    /// Latencies of successful requests, in microseconds.
    latency_us: Histogram<u64>,
    /// Open loop: how late each request was sent after its due time, in
    /// microseconds: the pacer's lag plus any wait for an idle client.
    lag_us: Histogram<u64>,
    /// Open loop: how late the pacer itself came to each due time, in
    /// microseconds, less the lateness it inherited from waits for an idle
    /// client (see [`OwnLag`]): the generator's own lag, which a slow
    /// server cannot cause.
    pacer_lag_us: Histogram<u64>,
    /// Open loop: latencies of successful requests from the moment they
    /// were sent rather than due: the server's and the connection's part,
    /// without the generator's lateness in sending.
    from_send_us: Histogram<u64>,
    /// Successful requests.
    ok: u64,
    /// Failed requests by gRPC code or `unexpected_*` key.
    errors: BTreeMap<String, u64>,
    /// The window length, for rates.
    window: Duration,
    /// CPU the server and the generator used in the window.
    cpu: Option<CpuUse>,
}

fn histogram() -> Histogram<u64> {
    // Three significant digits, resized as values come: cheap per task.
    Histogram::new(3).expect("3 significant digits is a valid precision")
}

/// Records `d` in microseconds (at least 1). The histograms auto-resize
/// (clamping would not: `saturating_record` pins values to the current
/// range), so recording fails only past the u64 range.
fn record(histogram: &mut Histogram<u64>, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
    let _ = histogram.record(us);
}

impl Tally {
    fn new(window: Duration) -> Self {
        Self {
            latency_us: histogram(),
            lag_us: histogram(),
            pacer_lag_us: histogram(),
            from_send_us: histogram(),
            ok: 0,
            errors: BTreeMap::new(),
            window,
            cpu: None,
        }
    }

    fn record(&mut self, latency: Duration, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                self.ok += 1;
                record(&mut self.latency_us, latency);
            }
            Err(key) => *self.errors.entry(key).or_default() += 1,
        }
    }

    /// Adds the counts, rates and percentiles to a run's JSON object.
    pub fn write_into(&self, report: &mut Value) {
        let seconds = self.window.as_secs_f64();
        let h = &self.latency_us;
        let errors: u64 = self.errors.values().sum();
        report["requests"] = json!(self.ok);
        report["errors"] = json!(errors);
        report["error_codes"] = json!(self.errors);
        report["throughput_rps"] = json!(self.ok as f64 / seconds);
        report["latency_us"] = json!({
            "min": h.min(),
            "p50": h.value_at_quantile(0.50),
            "p90": h.value_at_quantile(0.90),
            "p99": h.value_at_quantile(0.99),
            "p999": h.value_at_quantile(0.999),
            "max": h.max(),
            "mean": h.mean(),
        });
        if !self.lag_us.is_empty() {
            report["send_lag_us"] = json!({
                "p50": self.lag_us.value_at_quantile(0.50),
                "p99": self.lag_us.value_at_quantile(0.99),
                "max": self.lag_us.max(),
            });
            report["pacer_lag_us"] = json!({
                "p50": self.pacer_lag_us.value_at_quantile(0.50),
                "p99": self.pacer_lag_us.value_at_quantile(0.99),
                "max": self.pacer_lag_us.max(),
            });
            report["latency_from_send_us"] = json!({
                "p50": self.from_send_us.value_at_quantile(0.50),
                "p99": self.from_send_us.value_at_quantile(0.99),
                "max": self.from_send_us.max(),
            });
        }
        if let Some(cpu) = &self.cpu {
            // Cores over the window, as microseconds a request.
            let per_request = |cores: f64| cores * seconds * 1e6 / self.ok.max(1) as f64;
            let server = cpu.server.as_ref().map(|s| s.cores);
            report["client_cpu_cores"] = json!(cpu.client.cores);
            report["client_runqueue_wait_ms"] = json!(cpu.client.runqueue_wait_ms);
            report["server_cpu_cores"] = json!(server);
            report["server_runqueue_wait_ms"] =
                json!(cpu.server.as_ref().map(|s| s.runqueue_wait_ms));
            // The server's CPU time per request: its cost, whichever side
            // was saturated.
            report["server_cpu_us_per_request"] = json!(server.map(per_request));
            // Where the server's time went: by thread, kernel against
            // user, and page faults, each a request.
            if let Some(server) = &cpu.server {
                let by_thread: serde_json::Map<String, Value> = server
                    .by_thread_cores
                    .iter()
                    .filter(|(_, cores)| **cores > 0.0)
                    .map(|(name, cores)| (name.clone(), json!(per_request(*cores))))
                    .collect();
                report["server_thread_cpu_us_per_request"] = Value::Object(by_thread);
                report["server_kernel_share"] = json!(server.kernel_share);
                report["server_minor_faults_per_request"] = json!(
                    server
                        .minor_faults
                        .map(|faults| faults as f64 / self.ok.max(1) as f64)
                );
            }
            report["system_busy_cores"] = json!(cpu.system.map(|s| s.busy));
            // What neither process used: other work on the machine, kernel
            // time (softirq) not charged to either, and the time the
            // hypervisor gave the guest's cores to someone else (steal),
            // which is also reported alone.
            let other = cpu
                .system
                .map(|s| s.busy - cpu.client.cores - server.unwrap_or(0.0));
            report["other_busy_cores"] = json!(other);
            report["steal_cores"] = json!(cpu.system.map(|s| s.steal));
        }
    }
}

/// CPU used during the window, in cores (1.0 = one core busy throughout).
#[derive(Debug, Clone)]
struct CpuUse {
    client: CpuUsed,
    server: Option<CpuUsed>,
    system: Option<SystemUsed>,
}

/// Reads the processes' and the machine's CPU time at the window's start
/// and end.
fn measure_cpu(window: Window, server_pid: Option<u32>) -> tokio::task::JoinHandle<Option<CpuUse>> {
    tokio::spawn(async move {
        tokio::time::sleep_until(window.start).await;
        let client = CpuClock::of_self();
        let server = server_pid.map(CpuClock::of_pid);
        let system = SystemClock::now();
        tokio::time::sleep_until(window.end).await;
        let seconds = (window.end - window.start).as_secs_f64();
        Some(CpuUse {
            client: client.used_since(seconds)?,
            server: server.and_then(|s| s.used_since(seconds)),
            system: system.used_since(seconds),
        })
    })
}

/// Each virtual client sends its next request when the previous one
/// returns, until the window ends.
pub async fn closed(clients: Vec<VirtualClient>, timing: Timing) -> (Tally, Value) {
    let window = Window::after(timing);
    let cpu = measure_cpu(window, timing.server_pid);
    // One tally for all clients: one histogram stays in cache where one a
    // client would not; the lock is uncontended on a current-thread runtime.
    let tally = Arc::new(Mutex::new(Tally::new(timing.duration)));
    let mut tasks = JoinSet::new();
    for mut client in clients {
        let tally = Arc::clone(&tally);
        tasks.spawn(async move {
            loop {
                let sent = Instant::now();
                if sent >= window.end {
                    break;
                }
                let outcome = tokio::time::timeout_at(window.end + GRACE, client.call()).await;
                let done = Instant::now();
                let mut tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
                let Ok(outcome) = outcome else {
                    tally.record(done - sent, Err("timeout".into()));
                    break;
                };
                if sent >= window.start && done <= window.end {
                    tally.record(done - sent, outcome);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let mut tally = std::mem::replace(
        &mut *tally.lock().unwrap_or_else(PoisonError::into_inner),
        Tally::new(timing.duration),
    );
    tally.cpu = cpu.await.ok().flatten();
    (tally, json!({}))
}

/// Requests fall due `rate` a second, from the start of the warm-up to the
/// end of the window; each is sent by an idle virtual client as soon as it
/// is due, and its latency runs from when it was due.
pub async fn open(clients: Vec<VirtualClient>, timing: Timing, rate: f64) -> (Tally, Value) {
    let concurrency = clients.len();
    let (idle_tx, mut idle_rx) = mpsc::channel(concurrency);
    for client in clients {
        // The channel holds exactly `concurrency` clients.
        let _ = idle_tx.try_send(client);
    }
    let begin = Instant::now();
    let window = Window {
        start: begin + timing.warmup,
        end: begin + timing.warmup + timing.duration,
    };
    let cpu = measure_cpu(window, timing.server_pid);
    let tally = Arc::new(Mutex::new(Tally::new(timing.duration)));
    let total = ((timing.warmup + timing.duration).as_secs_f64() * rate).floor() as u64;
    let mut due_count = 0u64;
    let mut late_to_end = 0u64;
    let mut own_lag = OwnLag::default();
    for i in 0..total {
        let due = begin + Duration::from_secs_f64(i as f64 / rate);
        pace_until(due).await;
        let paced = Instant::now();
        let Some(mut client) = idle_rx.recv().await else {
            break;
        };
        let sent = Instant::now();
        let pacer_lag = own_lag.of(due, paced, sent);
        if due >= window.start {
            due_count += 1;
        }
        if sent > window.end + GRACE {
            // Every client has been busy for longer than the grace period:
            // stop rather than queue without end.
            late_to_end = total - i;
            let _ = idle_tx.try_send(client);
            break;
        }
        let tally = Arc::clone(&tally);
        let idle_tx = idle_tx.clone();
        tokio::spawn(async move {
            let outcome = client.call().await;
            let done = Instant::now();
            if due >= window.start {
                let mut tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
                record(&mut tally.lag_us, sent - due);
                record(&mut tally.pacer_lag_us, pacer_lag);
                if outcome.is_ok() {
                    record(&mut tally.from_send_us, done - sent);
                }
                tally.record(done - due, outcome);
            }
            let _ = idle_tx.send(client).await;
        });
    }
    // Wait for the requests in flight: every client back in the idle queue.
    drop(idle_tx);
    let mut back = 0;
    let deadline = Instant::now() + GRACE;
    while back < concurrency {
        match tokio::time::timeout_at(deadline, idle_rx.recv()).await {
            Ok(Some(_)) => back += 1,
            Ok(None) | Err(_) => break,
        }
    }
    // Requests that outlived the grace period still hold the tally; take
    // what it counted so far.
    let mut tally = std::mem::replace(
        &mut *tally.lock().unwrap_or_else(PoisonError::into_inner),
        Tally::new(timing.duration),
    );
    let unfinished = (concurrency - back) as u64 + late_to_end;
    if unfinished > 0 {
        *tally.errors.entry("timeout".into()).or_default() += unfinished;
    }
    tally.cpu = cpu.await.ok().flatten();
    let report = json!({
        "rate_target_rps": rate,
        "requests_due": due_count,
    });
    (tally, report)
}

/// The open loop's own lateness, apart from what the server causes.
///
/// A request released late because every client was busy (the server slow
/// to answer) leaves the requests due after it late as well, though the
/// pacer then releases them as fast as it can: that lateness is the
/// server's, and their latencies, measured from their due times, charge it
/// to the server. What this keeps is the rest: of the time between a due
/// time and the pacer coming to it, the part during which the pacer was
/// not waiting for a client. Without it, a server stall long enough to
/// occupy every client showed as the generator's lag, and the summary set
/// aside the very windows that should count against the server.
#[derive(Debug, Default)]
struct OwnLag {
    /// The waits for an idle client that may still overlap a due time to
    /// come, oldest first, each with the total of the waits before it.
    waits: VecDeque<Wait>,
    /// The total of every wait so far.
    total: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Wait {
    from: Instant,
    until: Instant,
    /// `OwnLag::total` when this wait began.
    before: Duration,
}

impl OwnLag {
    /// The pacer's own lag for a request due at `due`, come to by the pacer
    /// at `paced` and given a client at `sent`. Constant time (amortized):
    /// in a backlog of thousands of requests, a scan of the waits each time
    /// slowed the generator until it could not catch up.
    fn of(&mut self, due: Instant, paced: Instant, sent: Instant) -> Duration {
        // Due times only grow: a wait over before this one is over for all.
        while self.waits.front().is_some_and(|w| w.until <= due) {
            self.waits.pop_front();
        }
        // Every wait recorded ended before `paced`; those still held end
        // after `due`, so they overlap [due, paced] but for the part of
        // the first one before `due`.
        let waited = self.waits.front().map_or(Duration::ZERO, |first| {
            (self.total - first.before).saturating_sub(due.saturating_duration_since(first.from))
        });
        if sent > paced {
            self.waits.push_back(Wait {
                from: paced,
                until: sent,
                before: self.total,
            });
            self.total += sent - paced;
        }
        paced.saturating_duration_since(due).saturating_sub(waited)
    }
}

/// Waits until `due`: tokio's timer for the bulk, then yielding (so other
/// tasks run) for the last stretch, to send within microseconds of it.
async fn pace_until(due: Instant) {
    loop {
        let now = Instant::now();
        if now >= due {
            return;
        }
        if due - now > SPIN {
            tokio::time::sleep_until(due - SPIN).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The own lags, in microseconds, of requests given as (due, paced,
    /// sent) in microseconds from one origin; and the waits still held.
    fn own_lags(steps: &[(u64, u64, u64)]) -> (Vec<u64>, usize) {
        let t0 = Instant::now();
        let at = |n: u64| t0 + Duration::from_micros(n);
        let mut lag = OwnLag::default();
        let lags = steps
            .iter()
            .map(|&(due, paced, sent)| {
                let own = lag.of(at(due), at(paced), at(sent));
                u64::try_from(own.as_micros()).unwrap()
            })
            .collect();
        (lags, lag.waits.len())
    }

    #[test]
    fn lateness_after_a_wait_for_a_client_is_not_the_pacers() {
        let steps = [
            // On time, a client at once.
            (0, 0, 0),
            // Every client busy: 900 us until one comes back (the server's).
            (30, 30, 930),
            // The requests due meanwhile go out as fast as the pacer can:
            // late, but only by the microseconds the pacer took since.
            (60, 932, 932),
            (90, 934, 934),
            // Caught up: on time again; the old wait is forgotten.
            (2000, 2000, 2000),
            // The pacer itself 500 us late: that is its own, and so is what
            // the next due time inherits from it.
            (2030, 2530, 2530),
            (2060, 2540, 2540),
        ];
        assert_eq!(own_lags(&steps), (vec![0, 0, 2, 4, 0, 500, 480], 0));
    }

    #[test]
    fn the_pacers_own_lag_during_a_backlog_still_counts() {
        // A 1 ms wait for a client, then the pacer stalls 2 ms on its own:
        // of the 2,970 us the next request is late, 970 were the wait.
        let steps = [(0, 0, 1000), (30, 3000, 3000)];
        assert_eq!(own_lags(&steps).0, [0, 2000]);
    }

    #[test]
    fn several_waits_in_one_backlog_are_all_excused() {
        let steps = [
            (0, 0, 100),
            (10, 101, 300),
            (20, 302, 500),
            // Due at 30, come to at 505: 475 us late, of which the waits
            // [30, 100], [101, 300] and [302, 500] were 467.
            (30, 505, 505),
            // Due at 150: the first wait is over; [150, 300] and [302, 500]
            // explain 348 of the 357.
            (150, 507, 507),
        ];
        assert_eq!(own_lags(&steps), (vec![0, 1, 3, 8, 9], 2));
    }
}
