//! Measurements beside the load: fsync latency of the data directory's
//! disk, and CPU time from `/proc`.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// The size of each fsynced write: one page, as a small commit writes.
const BLOCK: usize = 4096;

/// Appends 4 KiB and fsyncs it, `count` times, in a scratch file in `dir`
/// (removed after), and reports the latency of each write + fsync; then
/// writes 4 KiB over each of those blocks in turn with an `fdatasync`
/// after each, as the journal does in a recycled segment, and reports that
/// latency too (`overwrite_latency_us`): the file's size and blocks do not
/// change, so the file system has no metadata to commit.
///
/// # Errors
/// When the file cannot be created, written or synced.
pub fn fsync_latency(dir: &Path, count: u32) -> std::io::Result<Value> {
    use std::os::unix::fs::FileExt;
    let path = dir.join(format!(".fsync-probe-{}", std::process::id()));
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)?;
    let block = [0xa5_u8; BLOCK];
    let mut append_us = histogram();
    let mut overwrite_us = histogram();
    let measured = (|| {
        for _ in 0..count {
            let start = Instant::now();
            file.write_all(&block)?;
            file.sync_all()?;
            record(&mut append_us, start);
        }
        for i in 0..u64::from(count) {
            let start = Instant::now();
            file.write_all_at(&block, i * BLOCK as u64)?;
            file.sync_data()?;
            record(&mut overwrite_us, start);
        }
        Ok::<(), std::io::Error>(())
    })();
    let removed = std::fs::remove_file(&path);
    measured?;
    removed?;
    Ok(json!({
        "scenario": "fsync",
        "dir": dir.display().to_string(),
        "fsyncs": count,
        "bytes": BLOCK,
        "latency_us": summary(&append_us),
        "overwrite_latency_us": summary(&overwrite_us),
    }))
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new(3).expect("3 significant digits is valid")
}

fn record(histogram: &mut Histogram<u64>, start: Instant) {
    let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    // Auto-resizing: recording fails only past u64 range.
    let _ = histogram.record(us.max(1));
}

fn summary(histogram: &Histogram<u64>) -> Value {
    json!({
        "min": histogram.min(),
        "p50": histogram.value_at_quantile(0.5),
        "p90": histogram.value_at_quantile(0.9),
        "p99": histogram.value_at_quantile(0.99),
        "max": histogram.max(),
        "mean": histogram.mean(),
    })
}

/// A process's scheduler account at one instant: from
/// `/proc/PID/task/*/schedstat`, nanoseconds on CPU (in all and by thread
/// name) and nanoseconds spent runnable but waiting for a CPU (run-queue
/// wait), which need no clock-tick conversion; from `/proc/PID/stat`, user
/// and kernel time (in `USER_HZ` ticks) and minor page faults.
pub struct CpuClock {
    pid: String,
    at: Option<Account>,
}

/// The counters of one reading.
#[derive(Debug, Clone, Default)]
struct Account {
    on_cpu: u64,
    waiting: u64,
    /// On-CPU nanoseconds by thread name (threads of one name summed).
    by_thread: BTreeMap<String, u64>,
    /// `utime`, `stime` and `minflt` of the whole process (exited threads
    /// included), when `/proc/PID/stat` could be read.
    stat: Option<ProcStat>,
}

#[derive(Debug, Clone, Copy)]
struct ProcStat {
    user_ticks: u64,
    kernel_ticks: u64,
    minor_faults: u64,
}

/// What a process used over a window.
#[derive(Debug, Clone)]
pub struct CpuUsed {
    /// CPU cores used on average (1.0 = one core throughout).
    pub cores: f64,
    /// Milliseconds its threads were runnable but not running, summed
    /// over threads: time another task held the CPU it needed.
    pub runqueue_wait_ms: f64,
    /// Cores used by thread name (for the server: the runtime's workers,
    /// the journal writer, the checkpoint thread).
    pub by_thread_cores: BTreeMap<String, f64>,
    /// The share of its CPU time spent in the kernel (system calls, page
    /// faults), from clock ticks: coarse over short windows.
    pub kernel_share: Option<f64>,
    /// Minor page faults over the window.
    pub minor_faults: Option<u64>,
}

impl CpuClock {
    /// This process.
    pub fn of_self() -> Self {
        Self::read("self".to_owned())
    }

    /// Another process, by id.
    pub fn of_pid(pid: u32) -> Self {
        Self::read(pid.to_string())
    }

    fn read(pid: String) -> Self {
        let at = account(&pid);
        Self { pid, at }
    }

    /// What the process used since this reading, over `seconds` (the
    /// window), or `None` when `/proc` could not be read.
    pub fn used_since(&self, seconds: f64) -> Option<CpuUsed> {
        let before = self.at.as_ref()?;
        let after = account(&self.pid)?;
        let by_thread_cores = after
            .by_thread
            .iter()
            .map(|(name, ns)| {
                let was = before.by_thread.get(name).copied().unwrap_or(0);
                (name.clone(), ns.saturating_sub(was) as f64 / 1e9 / seconds)
            })
            .collect();
        let (kernel_share, minor_faults) = match (before.stat, after.stat) {
            (Some(b), Some(a)) => {
                let user = a.user_ticks.saturating_sub(b.user_ticks);
                let kernel = a.kernel_ticks.saturating_sub(b.kernel_ticks);
                let share = (user + kernel > 0).then(|| kernel as f64 / (user + kernel) as f64);
                (share, Some(a.minor_faults.saturating_sub(b.minor_faults)))
            }
            _ => (None, None),
        };
        Some(CpuUsed {
            cores: after.on_cpu.saturating_sub(before.on_cpu) as f64 / 1e9 / seconds,
            runqueue_wait_ms: after.waiting.saturating_sub(before.waiting) as f64 / 1e6,
            by_thread_cores,
            kernel_share,
            minor_faults,
        })
    }
}

/// The counters of every live thread of `pid`. Threads that exit in between
/// are missed; the server's and the generator's threads live for the whole
/// run.
fn account(pid: &str) -> Option<Account> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = Account {
        stat: proc_stat(pid),
        ..Account::default()
    };
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
        if let (Some(Some(on_cpu)), Some(Some(waiting))) = (fields.next(), fields.next()) {
            total.on_cpu += on_cpu;
            total.waiting += waiting;
            let name = std::fs::read_to_string(task.path().join("comm"))
                .map_or_else(|_| "?".to_owned(), |n| n.trim_end().to_owned());
            *total.by_thread.entry(name).or_default() += on_cpu;
        }
    }
    Some(total)
}

/// `minflt`, `utime` and `stime` (fields 10, 14 and 15 of `proc(5)`) of
/// `/proc/PID/stat`, read after the command name, which may hold spaces.
fn proc_stat(pid: &str) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &text[text.rfind(')')? + 1..];
    // The fields after the name start at field 3 (state).
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(ProcStat {
        minor_faults: field(10)?,
        user_ticks: field(14)?,
        kernel_ticks: field(15)?,
    })
}

/// The whole machine's busy CPU time at one instant, from the `cpu` line of
/// `/proc/stat` (in `USER_HZ` ticks, 100 a second on Linux): everything but
/// idle and iowait, the hypervisor's steal included. Set against the
/// server's and the generator's own time, it shows how much of the machine
/// something else used during a run; the steal alone says how much of it
/// the host took from the guest, which no process in the guest can see.
pub struct SystemClock {
    at: Option<Ticks>,
}

/// `USER_HZ`: the unit of `/proc/stat`, fixed at 100 by the kernel ABI.
const USER_HZ: f64 = 100.0;

/// The machine's busy and stolen CPU time, in `USER_HZ` ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ticks {
    busy: u64,
    steal: u64,
}

/// Cores on average over a window: everything busy, and of it the steal.
#[derive(Debug, Clone, Copy)]
pub struct SystemUsed {
    pub busy: f64,
    pub steal: f64,
}

impl SystemClock {
    /// Reads it now.
    pub fn now() -> Self {
        Self { at: ticks() }
    }

    /// Busy and stolen cores on average since this reading, over `seconds`.
    pub fn used_since(&self, seconds: f64) -> Option<SystemUsed> {
        let before = self.at?;
        let after = ticks()?;
        let cores = |ticks: u64| ticks as f64 / USER_HZ / seconds;
        Some(SystemUsed {
            busy: cores(after.busy.saturating_sub(before.busy)),
            steal: cores(after.steal.saturating_sub(before.steal)),
        })
    }
}

fn ticks() -> Option<Ticks> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(stat.lines().find(|l| l.starts_with("cpu "))?)
}

/// The aggregate `cpu` line: user nice system idle iowait irq softirq steal
/// [guest guest_nice], guest time being already counted in user.
fn parse_cpu_line(line: &str) -> Option<Ticks> {
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4)?;
    Some(Ticks {
        busy: total - idle,
        steal: fields.get(7).copied().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_counts_the_steal_and_the_steal_is_read_apart() {
        let line = "cpu  274050 1863 36475 128641 3741 0 11971 13045 0 0";
        assert_eq!(
            parse_cpu_line(line),
            Some(Ticks {
                busy: 274_050 + 1_863 + 36_475 + 11_971 + 13_045,
                steal: 13_045,
            })
        );
    }

    #[test]
    fn a_kernel_without_the_steal_field_reads_none_stolen() {
        // Before Linux 2.6.11 the line ended at softirq.
        assert_eq!(
            parse_cpu_line("cpu  100 0 50 1000 10 0 5"),
            Some(Ticks {
                busy: 155,
                steal: 0
            })
        );
    }

    #[test]
    fn a_line_that_is_not_numbers_is_not_read() {
        assert_eq!(parse_cpu_line("cpu  100 x 50 1000 10"), None);
        assert_eq!(parse_cpu_line("cpu  100 0 50"), None);
    }
}
