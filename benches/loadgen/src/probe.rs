//! Measurements beside the load: the data directory's fsync latency, and CPU time from /proc.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};

use crate::drive::{histogram, quantiles, record};

/// Appends 4 KiB and fsyncs it 200 times in a scratch file in `dir` (removed after), then
/// writes over each of those blocks with an `fdatasync` after each (`overwrite_latency_us`: no
/// size or extent for the file system to commit, the disk's flush alone). A group commit of
/// the embedded store is one `fdatasync` of fjall's journal after a write to it.
pub fn fsync_latency(dir: &Path) -> std::io::Result<Value> {
    const BLOCK: usize = 4096;
    const COUNT: u64 = 200;
    let path = dir.join(format!(".fsync-probe-{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)?;
    let (block, mut append_us, mut overwrite_us) = ([0xa5_u8; BLOCK], histogram(), histogram());
    let measured = (|| {
        for _ in 0..COUNT {
            let start = Instant::now();
            file.write_all(&block)?;
            file.sync_all()?;
            record(&mut append_us, start.elapsed());
        }
        for i in 0..COUNT {
            let start = Instant::now();
            file.write_all_at(&block, i * BLOCK as u64)?;
            file.sync_data()?;
            record(&mut overwrite_us, start.elapsed());
        }
        Ok::<(), std::io::Error>(())
    })();
    let removed = std::fs::remove_file(&path);
    measured?;
    removed?;
    Ok(json!({
        "scenario": "fsync", "dir": dir.display().to_string(), "fsyncs": COUNT, "bytes": BLOCK,
        "latency_us": quantiles(&append_us), "overwrite_latency_us": quantiles(&overwrite_us),
    }))
}

/// A process's scheduler account at one instant, from `/proc/PID/task/*/schedstat`:
/// nanoseconds on CPU, in all and by thread name, and runnable but waiting for a CPU.
pub struct CpuClock {
    pid: String,
    at: Option<Account>,
}

#[derive(Default)]
struct Account {
    on_cpu: u64,
    waiting: u64,
    by_thread: BTreeMap<String, u64>,
}

/// What a process used over a window.
pub struct CpuUsed {
    /// Cores on average (1.0 = one core throughout).
    pub cores: f64,
    /// Milliseconds its threads were runnable but not running, summed over threads.
    pub runqueue_wait_ms: f64,
    /// Cores by thread name (for the server: runtime workers, `store-writer`, `fjall:worker`).
    pub by_thread_cores: BTreeMap<String, f64>,
}

impl CpuClock {
    /// `self` or a process id.
    pub fn of(pid: &str) -> Self {
        Self {
            pid: pid.to_owned(),
            at: account(pid),
        }
    }

    /// What the process used since this reading, over `seconds`.
    pub fn used_since(&self, seconds: f64) -> Option<CpuUsed> {
        let (before, after) = (self.at.as_ref()?, account(&self.pid)?);
        let cores = |ns: u64| ns as f64 / 1e9 / seconds;
        let by_thread_cores = after.by_thread.iter().map(|(name, ns)| {
            (
                name.clone(),
                cores(ns.saturating_sub(before.by_thread.get(name).copied().unwrap_or(0))),
            )
        });
        Some(CpuUsed {
            cores: cores(after.on_cpu.saturating_sub(before.on_cpu)),
            runqueue_wait_ms: after.waiting.saturating_sub(before.waiting) as f64 / 1e6,
            by_thread_cores: by_thread_cores.collect(),
        })
    }
}

/// Every live thread of `pid` (the server's and the generator's live for the whole run).
fn account(pid: &str) -> Option<Account> {
    let mut total = Account::default();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
        if let (Some(Some(on_cpu)), Some(Some(waiting))) = (fields.next(), fields.next()) {
            total.on_cpu += on_cpu;
            total.waiting += waiting;
            let name = std::fs::read_to_string(task.path().join("comm"));
            *total
                .by_thread
                .entry(name.map_or_else(|_| "?".into(), |n| n.trim_end().to_owned()))
                .or_default() += on_cpu;
        }
    }
    Some(total)
}

/// The machine's busy and stolen CPU time at one instant, from the `cpu` line of
/// `/proc/stat` in `USER_HZ` ticks (100 a second): everything but idle and iowait, steal
/// included, and the steal alone, which no process in the guest can see.
pub struct SystemClock {
    at: Option<Ticks>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ticks {
    busy: u64,
    steal: u64,
}

/// Cores on average over a window.
#[derive(Clone, Copy)]
pub struct SystemUsed {
    pub busy: f64,
    pub steal: f64,
}

impl SystemClock {
    pub fn now() -> Self {
        Self { at: ticks() }
    }

    pub fn used_since(&self, seconds: f64) -> Option<SystemUsed> {
        let (before, after) = (self.at?, ticks()?);
        let cores = |ticks: u64| ticks as f64 / 100.0 / seconds;
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

/// user nice system idle iowait irq softirq steal [guest guest_nice], guest in user (steal
/// since Linux 2.6.11).
fn parse_cpu_line(line: &str) -> Option<Ticks> {
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let idle = fields.get(3)? + fields.get(4)?;
    Some(Ticks {
        busy: fields.iter().take(8).sum::<u64>() - idle,
        steal: *fields.get(7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_counts_the_steal_and_the_steal_is_read_apart() {
        let busy = 274_050 + 1_863 + 36_475 + 11_971 + 13_045;
        let line = "cpu  274050 1863 36475 128641 3741 0 11971 13045 0 0";
        assert_eq!(
            parse_cpu_line(line),
            Some(Ticks {
                busy,
                steal: 13_045
            })
        );
        assert_eq!(parse_cpu_line("cpu  100 x 50 1000 10 0 5 0"), None);
        assert_eq!(parse_cpu_line("cpu  100 0 50 1000 10 0 5"), None);
    }
}
