//! [`CommitStats`]: what every store counts of its group commits, read by
//! metrics at each scrape and by benchmarks at exit, and the observer that
//! metrics set to hear of each commit as it happens.

use std::sync::atomic::{AtomicU64, Ordering};

/// Group-commit counters of a store, for metrics and benchmarks.
#[derive(Default)]
pub struct CommitStats {
    /// Group commits (fsyncs, or PostgreSQL transactions) made.
    pub commits: AtomicU64,
    /// Saves those commits carried.
    pub saves: AtomicU64,
    /// Told of each group commit (its saves, how long it took), once
    /// metrics are on.
    observer: std::sync::OnceLock<CommitObserver>,
}

/// What hears of each group commit: its number of saves and its duration.
pub type CommitObserver = Box<dyn Fn(usize, std::time::Duration) + Send + Sync>;

impl std::fmt::Debug for CommitStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitStats")
            .field("snapshot", &self.snapshot())
            .finish_non_exhaustive()
    }
}

impl CommitStats {
    /// Counts a group commit of `saves` that took `took`.
    pub(crate) fn committed(&self, saves: usize, took: std::time::Duration) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.saves.fetch_add(saves as u64, Ordering::Relaxed);
        if let Some(observer) = self.observer.get() {
            observer(saves, took);
        }
    }

    /// Sets what hears of each group commit; only the first call counts.
    pub fn observe(&self, observer: CommitObserver) {
        let _ = self.observer.set(observer);
    }

    /// The counters as plain numbers: commits, saves.
    pub fn snapshot(&self) -> [u64; 2] {
        [
            self.commits.load(Ordering::Relaxed),
            self.saves.load(Ordering::Relaxed),
        ]
    }
}
