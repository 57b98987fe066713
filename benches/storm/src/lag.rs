//! The lab's own scheduler lag: a 10 ms ticker on the lab's one thread
//! measures how late it wakes. Every worker, the arrivals and the
//! dependency model wait on the same timers, so a lab that cannot keep up
//! with its load shows it here. The ticker also samples the queues.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::dependency::Dependency;
use crate::record::Recorder;

/// The ticker's period.
const TICK: Duration = Duration::from_millis(10);

/// A run is flagged starved when its p99 lateness is past this...
const STARVED_P99: Duration = Duration::from_millis(10);
/// ...or its worst past this: the model's service times are 20 ms and more,
/// callers give up after seconds.
const STARVED_MAX: Duration = Duration::from_millis(100);

/// Ticks until `end`, sampling every dependency's queue; returns every
/// tick's lateness.
pub async fn measure(
    origin: Instant,
    end: Instant,
    dependencies: Vec<Arc<Dependency>>,
    recorder: Arc<Recorder>,
) -> Vec<Duration> {
    let mut late = Vec::with_capacity(((end - origin).as_millis() / 10) as usize + 1);
    let mut next = origin + TICK;
    while next < end {
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        late.push(now - next);
        for dependency in &dependencies {
            recorder.queue(
                dependency.which(),
                (now - origin).as_secs_f64(),
                dependency.queue_len(now),
            );
        }
        next += TICK;
        if next < now {
            // Far behind: count the lateness once, not as a burst of ticks.
            next = now + TICK;
        }
    }
    late
}

/// The lateness figures of a run, and whether it was starved.
pub fn summarize(late: &mut [Duration]) -> Value {
    late.sort_unstable();
    let at = |q: f64| -> Duration {
        if late.is_empty() {
            return Duration::ZERO;
        }
        late[((late.len() - 1) as f64 * q).round() as usize]
    };
    let (p50, p99, max) = (at(0.5), at(0.99), at(1.0));
    json!({
        "lag_ticks": late.len(),
        "lag_p50_ms": p50.as_secs_f64() * 1e3,
        "lag_p99_ms": p99.as_secs_f64() * 1e3,
        "lag_max_ms": max.as_secs_f64() * 1e3,
        "starved": p99 > STARVED_P99 || max > STARVED_MAX,
    })
}
