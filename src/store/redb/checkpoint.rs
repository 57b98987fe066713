//! The checkpoint thread: writes each frozen segment's records into redb in
//! one transaction, then retires the segment (kept as the spare for the
//! next one, or deleted) and frees the records.
//!
//! A failed checkpoint is retried with a growing pause: the journal still
//! holds everything, and the frozen records stay readable in memory. While
//! it fails, no segment can be frozen, so the writer's segment grows until
//! the backlog's bound refuses saves ([`super::backlog`]); the failure and
//! the recovery are logged once each.

use std::error::Error;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use super::backlog::BEHIND_RETRY_AFTER;
use super::overlay::{Frozen, Spare};
use super::tables::{checkpoint_into, pace};
use super::{CheckpointFault, Shared};
use crate::store::journal;

/// How many nice levels the checkpoint thread sits below the rest of the
/// process: about a tenth of a busy request worker's CPU share, enough to
/// keep up with a saturated core (a checkpoint costs about a tenth of what
/// the decisions it writes cost), and all of the idle time.
const CHECKPOINT_NICENESS: i32 = 10;

/// The first pause after a failed checkpoint; it doubles with every failure
/// up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between attempts: a database that comes back is
/// written to within this.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Lowers the calling thread's priority by [`CHECKPOINT_NICENESS`]:
/// checkpoints are background work, and on a busy core they should take the
/// time requests leave. If they fall behind, the backlog's bound refuses
/// saves until they catch up.
fn yield_to_requests() {
    #[cfg(target_os = "linux")]
    {
        let tid = rustix::thread::gettid();
        let nice = rustix::process::getpriority_process(Some(tid))
            .map_or(CHECKPOINT_NICENESS, |now| {
                (now + CHECKPOINT_NICENESS).min(19)
            });
        if let Err(error) = rustix::process::setpriority_process(Some(tid), nice) {
            tracing::debug!(%error, "checkpoint thread keeps its priority");
        }
    }
}

/// A checkpoint refused by a test's fault hook.
#[derive(Debug, thiserror::Error)]
#[error("checkpoint fault injected by a test")]
struct InjectedFault;

/// Runs on the checkpoint thread until the writer closes `frozen`: each
/// segment is retried until it is written (or the store closes), and its
/// outcome told to anyone waiting on a checkpoint.
pub(super) fn run(
    shared: &Shared,
    frozen: &mpsc::Receiver<Arc<Frozen>>,
    closing: &AtomicBool,
    fault: Option<&CheckpointFault>,
) {
    yield_to_requests();
    for segment in frozen {
        let mut pause = FIRST_PAUSE;
        loop {
            let result = checkpoint(shared, &segment, fault);
            let mut overlay = shared.overlay();
            match result {
                Ok(kept) => {
                    if kept {
                        overlay.spare = Spare::Ready;
                    }
                    shared.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                    shared
                        .stats
                        .checkpointed
                        .fetch_add(segment.records.len() as u64, Ordering::Relaxed);
                    overlay.frozen = None;
                    shared.backlog.set_frozen(0);
                    shared.backlog.set_retry_after(BEHIND_RETRY_AFTER);
                    if overlay.checkpoint_error.take().is_some() {
                        tracing::info!(segment = %segment.segment.display(), "checkpoint recovered");
                    }
                    shared.checkpointed.notify_all();
                    drop(overlay);
                    free_yielding(segment);
                    break;
                }
                Err(error) => {
                    if overlay.checkpoint_error.is_none() {
                        tracing::error!(%error, segment = %segment.segment.display(), "checkpoint failed; retrying until it succeeds");
                    } else {
                        tracing::debug!(%error, "checkpoint failed again");
                    }
                    overlay.checkpoint_error = Some(Arc::from(error));
                    shared.backlog.set_retry_after(pause);
                    shared.checkpointed.notify_all();
                    drop(overlay);
                    if closing.load(Ordering::Relaxed) {
                        return;
                    }
                    thread::sleep(pause);
                    pause = (pause * 2).min(MAX_PAUSE);
                }
            }
        }
    }
}

/// One attempt at checkpointing `segment`. Returns whether its file was
/// kept as the spare.
fn checkpoint(
    shared: &Shared,
    segment: &Frozen,
    fault: Option<&CheckpointFault>,
) -> Result<bool, Box<dyn Error + Send + Sync>> {
    if fault.is_some_and(|fault| (fault.0)()) {
        return Err(InjectedFault.into());
    }
    // The writer takes the spare only while no checkpoint runs.
    let keep = shared.overlay().spare == Spare::Wanted;
    checkpoint_into(&shared.db, &segment.records)?;
    shared.refresh_snapshot()?;
    Ok(retire(&shared.dir, &segment.segment, keep)?)
}

/// Frees a checkpointed segment's records (a few tens of allocations each,
/// a quarter of the checkpoint thread's CPU under a durable load), yielding
/// the core every [`YIELD_EVERY`](super::tables::YIELD_EVERY) records. A
/// segment something else still holds is left for it to free.
fn free_yielding(segment: Arc<Frozen>) {
    if let Ok(mut frozen) = Arc::try_unwrap(segment) {
        for (n, pending) in frozen.records.table.drain().enumerate() {
            drop(pending);
            pace(n);
        }
    }
}

/// Retires a checkpointed segment: keeps it as the spare for the next
/// segment to write over (if `keep`, and the rename works), or deletes it,
/// durably either way. Returns whether it was kept.
fn retire(dir: &Path, segment: &Path, keep: bool) -> std::io::Result<bool> {
    let kept = keep
        && std::fs::rename(segment, dir.join(journal::SPARE))
            .inspect_err(|error| tracing::debug!(%error, "cannot keep a spare journal segment"))
            .is_ok();
    if !kept {
        match std::fs::remove_file(segment) {
            // Retired by an earlier attempt whose directory sync failed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            removed => removed?,
        }
    }
    journal::sync_dir(dir)?;
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::activity::{ActivityRecord, Policy, Status};
    use crate::store::redb::overlay::{Pending, Records};
    use crate::store::redb::tables::YIELD_EVERY;
    use std::path::PathBuf;

    /// A frozen segment of `n` records, and a clone of each record.
    fn frozen(n: usize) -> (Arc<Frozen>, Vec<Arc<ActivityRecord>>) {
        let mut records = Records::default();
        let mut clones = Vec::new();
        for i in 0..n {
            let record = Arc::new(ActivityRecord {
                tenant: "t".into(),
                activity_id: format!("a-{i}"),
                workflow_id: String::new(),
                policy: Policy {
                    max_attempts: 3,
                    deadline_seconds: 60,
                    base: None,
                    cap: None,
                },
                started_at_ms: 0,
                attempts: 1,
                status: Status::Open,
                closed_code: None,
                closed_at_ms: None,
                deferral: None,
                events: Vec::new(),
            });
            clones.push(Arc::clone(&record));
            records.upsert(Pending {
                record,
                entry: vec![0; 16],
                stored_purge: None,
            });
        }
        let segment = PathBuf::from("journal-00000000000000000001.log");
        (
            Arc::new(Frozen {
                segment,
                bytes: 0,
                records,
            }),
            clones,
        )
    }

    #[test]
    fn a_checkpointed_segment_frees_every_record() {
        // Not a whole number of yields' worth, so the last stretch counts.
        let (segment, clones) = frozen(3 * YIELD_EVERY + 5);
        free_yielding(segment);
        assert!(clones.iter().all(|c| Arc::strong_count(c) == 1));
    }

    #[test]
    fn a_segment_still_held_is_left_to_its_holder() {
        let (segment, clones) = frozen(10);
        let held = Arc::clone(&segment);
        free_yielding(segment);
        assert!(clones.iter().all(|c| Arc::strong_count(c) == 2));
        drop(held);
        assert!(clones.iter().all(|c| Arc::strong_count(c) == 1));
    }
    #[test]
    fn a_retired_segment_is_kept_as_the_spare_or_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let (dir, spare) = (dir.path(), dir.path().join(journal::SPARE));
        let segment = |n: u64| {
            let path = dir.join(journal::segment_name(n));
            std::fs::write(&path, b"checkpointed").unwrap();
            path
        };
        let first = segment(1);
        assert!(retire(dir, &first, true).unwrap());
        assert!(!first.exists());
        assert_eq!(std::fs::read(&spare).unwrap(), b"checkpointed");

        let second = segment(2);
        assert!(!retire(dir, &second, false).unwrap());
        assert!(!second.exists());

        // Retired already by an attempt whose directory sync failed.
        assert!(!retire(dir, &second, true).unwrap());

        // A spare that cannot be made: the segment is deleted instead.
        std::fs::remove_file(&spare).unwrap();
        std::fs::create_dir(&spare).unwrap();
        std::fs::write(spare.join("in the way"), b"").unwrap();
        let third = segment(3);
        assert!(!retire(dir, &third, true).unwrap());
        assert!(!third.exists());
    }
}
