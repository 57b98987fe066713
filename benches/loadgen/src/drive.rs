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

/// How long requests in flight at the end may take before they count as `timeout`.
const GRACE: Duration = Duration::from_secs(5);
/// The open loop sleeps until this close to a due time, then yields in a loop: tokio's timer
/// has millisecond resolution, and its slack would count as latency.
const SPIN: Duration = Duration::from_micros(1500);

#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub duration: Duration,
    /// The server, whose CPU time in the window is reported.
    pub server_pid: Option<u32>,
}

/// Latencies in microseconds, three significant digits, resized as values come.
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("a valid precision")
}

/// Records `d` in microseconds, at least 1 (auto-resized: fails only past the u64 range).
pub fn record(histogram: &mut Histogram<u64>, d: Duration) {
    let _ = histogram.record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1));
}

/// A histogram's summary in the reports.
pub fn quantiles(h: &Histogram<u64>) -> Value {
    let q = |q| h.value_at_quantile(q);
    json!({"min": h.min(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999), "max": h.max(), "mean": h.mean()})
}

/// What a run counted.
pub struct Tally {
    /// Successful requests: from the send (closed loop) or the due time (open loop).
    pub latency_us: Histogram<u64>,
    /// Open loop: the generator's own lateness to each due time ([`OwnLag`]).
    pacer_lag_us: Histogram<u64>,
    /// Open loop: successful requests from when they were sent rather than due.
    from_send_us: Histogram<u64>,
    pub ok: u64,
    /// Failed requests by gRPC code or `unexpected_*` key.
    pub errors: BTreeMap<String, u64>,
}

impl Tally {
    pub fn new() -> Self {
        let (latency_us, pacer_lag_us, from_send_us) = (histogram(), histogram(), histogram());
        let (ok, errors) = (0, BTreeMap::new());
        Self {
            latency_us,
            pacer_lag_us,
            from_send_us,
            ok,
            errors,
        }
    }

    pub fn record(&mut self, latency: Duration, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                self.ok += 1;
                record(&mut self.latency_us, latency);
            }
            Err(key) => *self.errors.entry(key).or_default() += 1,
        }
    }

    /// The counts, rates, percentiles and CPU of a window of `seconds` as a JSON object.
    fn report(&self, seconds: f64, cpu: Option<CpuUse>) -> Value {
        let mut report = json!({
            "requests": self.ok,
            "errors": self.errors.values().sum::<u64>(),
            "error_codes": self.errors,
            "throughput_rps": self.ok as f64 / seconds,
            "latency_us": quantiles(&self.latency_us),
        });
        if !self.pacer_lag_us.is_empty() {
            report["pacer_lag_us"] = quantiles(&self.pacer_lag_us);
            report["latency_from_send_us"] = quantiles(&self.from_send_us);
        }
        let Some(cpu) = cpu else { return report };
        // Cores over the window as microseconds a request.
        let per_request = |cores: f64| cores * seconds * 1e6 / self.ok.max(1) as f64;
        let server = cpu.server.as_ref().map(|s| s.cores);
        report["client_cpu_cores"] = json!(cpu.client.cores);
        report["client_runqueue_wait_ms"] = json!(cpu.client.runqueue_wait_ms);
        report["server_cpu_cores"] = json!(server);
        report["server_runqueue_wait_ms"] = json!(cpu.server.as_ref().map(|s| s.runqueue_wait_ms));
        // The server's cost, whichever side was saturated; by thread, where it went.
        report["server_cpu_us_per_request"] = json!(server.map(per_request));
        if let Some(server) = &cpu.server {
            let by_thread = server
                .by_thread_cores
                .iter()
                .filter(|(_, cores)| **cores > 0.0);
            report["server_thread_cpu_us_per_request"] = by_thread
                .map(|(name, cores)| (name.clone(), json!(per_request(*cores))))
                .collect();
        }
        // What neither used: other work on the machine, kernel time charged to neither, and
        // the hypervisor's steal, also reported alone.
        report["system_busy_cores"] = json!(cpu.system.map(|s| s.busy));
        report["other_busy_cores"] = json!(
            cpu.system
                .map(|s| s.busy - cpu.client.cores - server.unwrap_or(0.0))
        );
        report["steal_cores"] = json!(cpu.system.map(|s| s.steal));
        report
    }
}

/// CPU used during the window, in cores (1.0 = one core busy throughout).
struct CpuUse {
    client: CpuUsed,
    server: Option<CpuUsed>,
    system: Option<SystemUsed>,
}

/// Reads the processes' and the machine's CPU time at the window's start and end.
fn measure_cpu(
    start: Instant,
    end: Instant,
    server_pid: Option<u32>,
) -> tokio::task::JoinHandle<Option<CpuUse>> {
    tokio::spawn(async move {
        tokio::time::sleep_until(start).await;
        let (client, server, system) = (
            CpuClock::of("self"),
            server_pid.map(|p| CpuClock::of(&p.to_string())),
            SystemClock::now(),
        );
        tokio::time::sleep_until(end).await;
        let seconds = (end - start).as_secs_f64();
        Some(CpuUse {
            client: client.used_since(seconds)?,
            server: server.and_then(|s| s.used_since(seconds)),
            system: system.used_since(seconds),
        })
    })
}

/// Takes the tally that requests still running (past the grace period) may hold.
fn take(tally: &Mutex<Tally>) -> Tally {
    std::mem::replace(
        &mut *tally.lock().unwrap_or_else(PoisonError::into_inner),
        Tally::new(),
    )
}

/// Each virtual client sends its next request when the previous one returns, until the
/// window ends.
pub async fn closed(clients: Vec<VirtualClient>, timing: Timing) -> Value {
    let start = Instant::now() + timing.warmup;
    let end = start + timing.duration;
    let cpu = measure_cpu(start, end, timing.server_pid);
    // One tally: one histogram stays in cache; the lock is uncontended on one thread.
    let tally = Arc::new(Mutex::new(Tally::new()));
    let mut tasks = JoinSet::new();
    for mut client in clients {
        let tally = Arc::clone(&tally);
        tasks.spawn(async move {
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let outcome = tokio::time::timeout_at(end + GRACE, client.call()).await;
                let done = Instant::now();
                let mut tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
                let Ok(outcome) = outcome else {
                    tally.record(done - sent, Err("timeout".into()));
                    break;
                };
                if sent >= start && done <= end {
                    tally.record(done - sent, outcome);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    take(&tally).report(timing.duration.as_secs_f64(), cpu.await.ok().flatten())
}

/// Requests fall due `rate` a second from the start of the warm-up to the end of the
/// window; an idle virtual client sends each as soon as it is due, and its latency runs
/// from when it was due.
pub async fn open(clients: Vec<VirtualClient>, timing: Timing, rate: f64) -> Value {
    let concurrency = clients.len();
    let (idle_tx, mut idle_rx) = mpsc::channel(concurrency);
    for client in clients {
        let _ = idle_tx.try_send(client); // the channel holds them all
    }
    let begin = Instant::now();
    let (start, end) = (
        begin + timing.warmup,
        begin + timing.warmup + timing.duration,
    );
    let cpu = measure_cpu(start, end, timing.server_pid);
    let tally = Arc::new(Mutex::new(Tally::new()));
    let total = ((timing.warmup + timing.duration).as_secs_f64() * rate).floor() as u64;
    let (mut due_count, mut late_to_end, mut own_lag) = (0u64, 0u64, OwnLag::default());
    for i in 0..total {
        let due = begin + Duration::from_secs_f64(i as f64 / rate);
        pace_until(due).await;
        let paced = Instant::now();
        let Some(mut client) = idle_rx.recv().await else {
            break;
        };
        let sent = Instant::now();
        let pacer_lag = own_lag.of(due, paced, sent);
        due_count += u64::from(due >= start);
        if sent > end + GRACE {
            // Every client busy for longer than the grace period: stop rather than queue.
            late_to_end = total - i;
            let _ = idle_tx.try_send(client);
            break;
        }
        let (tally, idle_tx) = (Arc::clone(&tally), idle_tx.clone());
        tokio::spawn(async move {
            let outcome = client.call().await;
            let done = Instant::now();
            if due >= start {
                let mut tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
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
    let (mut back, deadline) = (0, Instant::now() + GRACE);
    while back < concurrency
        && matches!(
            tokio::time::timeout_at(deadline, idle_rx.recv()).await,
            Ok(Some(_))
        )
    {
        back += 1;
    }
    let mut tally = take(&tally);
    let unfinished = (concurrency - back) as u64 + late_to_end;
    if unfinished > 0 {
        *tally.errors.entry("timeout".into()).or_default() += unfinished;
    }
    let mut report = tally.report(timing.duration.as_secs_f64(), cpu.await.ok().flatten());
    report["rate_target_rps"] = json!(rate);
    report["requests_due"] = json!(due_count);
    report
}

/// The open loop's own lateness, apart from what the server causes.
///
/// A request released late because every client was busy (the server slow to answer)
/// leaves the requests due after it late as well, though the pacer then releases them as
/// fast as it can: that lateness is the server's, and their latencies charge it to the
/// server. What this keeps is the rest: of the time between a due time and the pacer coming
/// to it, the part during which the pacer was not waiting for a client. Without it a stall
/// that occupied every client showed as the generator's lag, and the summary set aside the
/// very windows that should count against the server.
#[derive(Debug, Default)]
struct OwnLag {
    /// The waits for an idle client that may still overlap a due time to come, oldest first:
    /// (from, until, the total of the waits before it).
    waits: VecDeque<(Instant, Instant, Duration)>,
    /// The total of every wait so far.
    total: Duration,
}

impl OwnLag {
    /// The pacer's own lag for a request due at `due`, come to at `paced` and given a client
    /// at `sent`, in constant time (amortized): a scan of the waits each time slowed the
    /// generator, in a backlog of thousands, until it could not catch up.
    fn of(&mut self, due: Instant, paced: Instant, sent: Instant) -> Duration {
        // Due times only grow: a wait over before this one is over for all.
        while self.waits.front().is_some_and(|w| w.1 <= due) {
            self.waits.pop_front();
        }
        // The waits held end after `due` and before `paced`: they overlap [due, paced] but
        // for the part of the first one before `due`.
        let waited = self
            .waits
            .front()
            .map_or(Duration::ZERO, |&(from, _, before)| {
                (self.total - before).saturating_sub(due.saturating_duration_since(from))
            });
        if sent > paced {
            self.waits.push_back((paced, sent, self.total));
            self.total += sent - paced;
        }
        paced.saturating_duration_since(due).saturating_sub(waited)
    }
}

/// Waits until `due`: tokio's timer for the bulk, then yielding for the last stretch.
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

    /// The own lags in microseconds of requests given as (due, paced, sent) in microseconds,
    /// and the waits still held.
    fn own_lags(steps: &[(u64, u64, u64)]) -> (Vec<u64>, usize) {
        let (t0, mut lag) = (Instant::now(), OwnLag::default());
        let at = |n: u64| t0 + Duration::from_micros(n);
        let lags = steps
            .iter()
            .map(|&(d, p, s)| lag.of(at(d), at(p), at(s)).as_micros() as u64)
            .collect();
        (lags, lag.waits.len())
    }

    #[test]
    fn lateness_after_a_wait_for_a_client_is_not_the_pacers() {
        let steps = [
            (0, 0, 0),
            // Every client busy: 900 us until one comes back (the server's).
            (30, 30, 930),
            // The requests due meanwhile go out as fast as the pacer can: late by the
            // microseconds the pacer took since.
            (60, 932, 932),
            (90, 934, 934),
            // Caught up; the old wait is forgotten.
            (2000, 2000, 2000),
            // The pacer itself 500 us late: its own, and so what the next one inherits.
            (2030, 2530, 2530),
            (2060, 2540, 2540),
        ];
        assert_eq!(own_lags(&steps), (vec![0, 0, 2, 4, 0, 500, 480], 0));
        // A 1 ms wait, then the pacer stalls 2 ms on its own: of 2,970 us late, 970 the wait.
        assert_eq!(own_lags(&[(0, 0, 1000), (30, 3000, 3000)]).0, [0, 2000]);
    }

    #[test]
    fn several_waits_in_one_backlog_are_all_excused() {
        let steps = [
            (0, 0, 100),
            (10, 101, 300),
            (20, 302, 500),
            // Due at 30, come to at 505: of 475 us late, the waits [30, 100], [101, 300] and
            // [302, 500] were 467.
            (30, 505, 505),
            // Due at 150: the first wait is over; [150, 300] and [302, 500] are 348 of 357.
            (150, 507, 507),
        ];
        assert_eq!(own_lags(&steps), (vec![0, 1, 3, 8, 9], 2));
    }
}
