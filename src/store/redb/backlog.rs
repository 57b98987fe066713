//! The bound on what waits for a checkpoint. Every save waits in memory
//! (and in the journal) until its segment is checkpointed into redb; when
//! checkpoints fall behind or fail, saves are refused with
//! [`StoreError::Backlogged`](crate::store::StoreError::Backlogged) instead
//! of being held without limit, and taken again once a checkpoint frees
//! room.
//!
//! What is counted is journal bytes: those of the segment being written and
//! of the one being checkpointed. They bound the memory held (every pending
//! record's entry is in one of them) and the disk alike, where a count of
//! records would let repeated saves of the same activities grow the journal
//! without end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The wait suggested to a refused save while checkpoints are only behind:
/// a checkpoint writes about 64 records in 0.2 ms (see
/// [`YIELD_EVERY`](super::tables::YIELD_EVERY)), so an 8 MiB segment of
/// 0.6 KiB entries takes about 45 ms, a slow one twice that.
pub(super) const BEHIND_RETRY_AFTER: Duration = Duration::from_millis(100);

/// Journal bytes waiting for a checkpoint, against their limit. Shared by
/// the store's callers (who are refused at once), the writer (which counts
/// the segment it writes) and the checkpoint thread (which counts the
/// segment it writes into redb).
#[derive(Debug)]
pub(super) struct Backlog {
    /// The bytes past which saves are refused.
    limit: u64,
    /// Bytes of the segment being written.
    active: AtomicU64,
    /// Bytes of the segment being checkpointed, 0 when none is.
    frozen: AtomicU64,
    /// The wait suggested to a refused save, in milliseconds: until the
    /// failing checkpoint's next attempt, or [`BEHIND_RETRY_AFTER`].
    retry_after_ms: AtomicU64,
    /// Whether saves were refused at the last look, so that a change is
    /// logged once rather than once a save.
    refusing: AtomicBool,
}

impl Backlog {
    /// Nothing pending yet; saves are refused from `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            active: AtomicU64::new(0),
            frozen: AtomicU64::new(0),
            retry_after_ms: AtomicU64::new(millis(BEHIND_RETRY_AFTER)),
            refusing: AtomicBool::new(false),
        }
    }

    /// The segment being written holds `bytes`.
    pub fn set_active(&self, bytes: u64) {
        self.active.store(bytes, Ordering::Relaxed);
    }

    /// The segment being checkpointed holds `bytes` (0: none is).
    pub fn set_frozen(&self, bytes: u64) {
        self.frozen.store(bytes, Ordering::Relaxed);
    }

    /// Suggests `wait` to the saves refused from now on.
    pub fn set_retry_after(&self, wait: Duration) {
        self.retry_after_ms.store(millis(wait), Ordering::Relaxed);
    }

    /// Whether a save may be taken now.
    ///
    /// # Errors
    /// The wait to suggest when the bound is reached.
    pub fn admit(&self) -> Result<(), Duration> {
        let pending = self.active.load(Ordering::Relaxed) + self.frozen.load(Ordering::Relaxed);
        let over = pending >= self.limit;
        if self.refusing.load(Ordering::Relaxed) != over
            && self
                .refusing
                .compare_exchange(!over, over, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            if over {
                tracing::warn!(
                    pending_bytes = pending,
                    limit_bytes = self.limit,
                    "store backlogged: refusing saves until a checkpoint frees room"
                );
            } else {
                tracing::info!(
                    pending_bytes = pending,
                    "store caught up: taking saves again"
                );
            }
        }
        if over {
            Err(Duration::from_millis(
                self.retry_after_ms.load(Ordering::Relaxed),
            ))
        } else {
            Ok(())
        }
    }
}

/// A wait in whole milliseconds, at least 1 (a refused caller should not
/// come back at once).
fn millis(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_are_refused_from_the_limit_until_a_checkpoint_frees_room() {
        let backlog = Backlog::new(100);
        backlog.set_active(60);
        assert_eq!(backlog.admit(), Ok(()));
        backlog.set_frozen(40);
        assert_eq!(backlog.admit(), Err(BEHIND_RETRY_AFTER));
        backlog.set_retry_after(Duration::from_secs(2));
        assert_eq!(backlog.admit(), Err(Duration::from_secs(2)));
        backlog.set_frozen(0);
        assert_eq!(backlog.admit(), Ok(()));
        assert!(!backlog.refusing.load(Ordering::Relaxed));
    }
}
