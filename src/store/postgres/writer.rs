//! Group commit on PostgreSQL: the saves waiting at one moment go to the
//! database together, as one multi-row statement (one implicit
//! transaction, one round trip, one commit), so throughput is not one
//! round trip and one WAL flush a decision.
//!
//! A dispatcher task takes saves from a channel. It starts a commit as soon
//! as one of `in_flight` commit slots is free, with every save waiting by
//! then (at most `max_batch`): a save that arrives alone is committed at
//! once, and under load the saves that arrive while the slots are busy go
//! together in the next commit.
//!
//! Each row is written only if the activity is still at the version its
//! writer read (see `migrations/0001_activities.sql`); a row that another
//! replica moved on first is answered [`StoreError::Conflict`], and its
//! writer decides again on what is stored now.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{BackendFailure, is_serialization_failure};
use crate::store::{CommitStats, StoreError};

/// One row to write, and who waits for it.
pub(super) struct RowToWrite {
    /// The activity's tenant.
    pub tenant: String,
    /// The activity's id.
    pub activity_id: String,
    /// The version the writer read; -1 for an activity it found absent.
    pub expected: i64,
    /// The version written (the record's number of events).
    pub version: i64,
    /// From when the record may be purged; `None` while parked.
    pub purgeable_from_ms: Option<i64>,
    /// The encoded record.
    pub record: Vec<u8>,
    /// Told once the row is durable, or why not.
    pub done: oneshot::Sender<Result<(), StoreError>>,
}

/// Inserts the new activities and updates those still at the expected
/// version, in one statement, and returns the (1-based) positions of the
/// rows written. Plain SQL that CockroachDB and YugabyteDB run too:
/// `unnest` of several arrays `WITH ORDINALITY`, data-modifying CTEs and
/// `ON CONFLICT DO NOTHING`.
const WRITE: &str = "
WITH input AS (
    SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BIGINT[], $5::BIGINT[], $6::BYTEA[])
        WITH ORDINALITY AS i (tenant, activity_id, expected, version, purgeable_from_ms, record, n)
), inserted AS (
    INSERT INTO retry_budget_activities (tenant, activity_id, version, purgeable_from_ms, record)
    SELECT tenant, activity_id, version, purgeable_from_ms, record FROM input WHERE expected < 0
    ON CONFLICT (tenant, activity_id) DO NOTHING
    RETURNING tenant, activity_id
), updated AS (
    UPDATE retry_budget_activities AS a
    SET version = i.version, purgeable_from_ms = i.purgeable_from_ms, record = i.record
    FROM input AS i
    WHERE i.expected >= 0 AND a.tenant = i.tenant AND a.activity_id = i.activity_id
      AND a.version = i.expected
    RETURNING a.tenant, a.activity_id
)
SELECT i.n FROM input AS i JOIN inserted AS w ON w.tenant = i.tenant AND w.activity_id = i.activity_id
UNION ALL
SELECT i.n FROM input AS i JOIN updated AS w ON w.tenant = i.tenant AND w.activity_id = i.activity_id";

/// How often a commit is tried again after losing a race (a serialization
/// failure on CockroachDB, a deadlock with another replica's commit on
/// PostgreSQL) before its saves are refused.
const SERIALIZATION_RETRIES: u32 = 8;

/// Starts the dispatcher and returns the channel to it. The dispatcher ends
/// when every sender is dropped, after the commits in flight.
pub(super) fn spawn(
    pool: Pool,
    timeout: Duration,
    max_batch: usize,
    in_flight: usize,
    stats: Arc<CommitStats>,
) -> mpsc::UnboundedSender<RowToWrite> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(dispatch(
        rx,
        pool,
        timeout,
        max_batch.max(1),
        in_flight.max(1),
        stats,
    ));
    tx
}

async fn dispatch(
    mut rx: mpsc::UnboundedReceiver<RowToWrite>,
    pool: Pool,
    timeout: Duration,
    max_batch: usize,
    in_flight: usize,
    stats: Arc<CommitStats>,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    loop {
        // A free slot first, then the saves: those that arrive while every
        // slot is busy wait here together for the next commit.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        // In key order, so that two replicas' commits over the same
        // activities lock their rows in one order and seldom deadlock.
        batch
            .sort_unstable_by(|x, y| (&x.tenant, &x.activity_id).cmp(&(&y.tenant, &y.activity_id)));
        let pool = pool.clone();
        let stats = Arc::clone(&stats);
        tokio::spawn(async move {
            commit(&pool, timeout, batch, &stats).await;
            drop(slot);
        });
    }
}

/// Writes one batch and answers each of its saves.
async fn commit(pool: &Pool, timeout: Duration, batch: Vec<RowToWrite>, stats: &CommitStats) {
    let started = std::time::Instant::now();
    let outcome = match tokio::time::timeout(timeout, write(pool, &batch)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(BackendFailure::new(
            "commit",
            format!("no answer from PostgreSQL within {timeout:?}"),
        )),
    };
    match outcome {
        Ok(written) => {
            stats.committed(batch.len(), started.elapsed());
            for (pending, written) in batch.into_iter().zip(written) {
                let answer = if written {
                    Ok(())
                } else {
                    Err(StoreError::Conflict {
                        key: format!("{}/{}", pending.tenant, pending.activity_id),
                    })
                };
                let _ = pending.done.send(answer);
            }
        }
        Err(failure) => {
            // The commit may have landed before the failure was seen: its
            // writers are not told it did, and asking again replays it.
            for pending in batch {
                let _ = pending.done.send(Err(failure.to_store_error()));
            }
        }
    }
}

/// Which rows of `batch` were written.
async fn write(pool: &Pool, batch: &[RowToWrite]) -> Result<Vec<bool>, BackendFailure> {
    let client = pool
        .get()
        .await
        .map_err(|e| BackendFailure::new("connect", e))?;
    let statement = client
        .prepare_cached(WRITE)
        .await
        .map_err(|e| BackendFailure::new("prepare", e))?;
    let tenants: Vec<&str> = batch.iter().map(|p| p.tenant.as_str()).collect();
    let ids: Vec<&str> = batch.iter().map(|p| p.activity_id.as_str()).collect();
    let expected: Vec<i64> = batch.iter().map(|p| p.expected).collect();
    let versions: Vec<i64> = batch.iter().map(|p| p.version).collect();
    let purgeable: Vec<Option<i64>> = batch.iter().map(|p| p.purgeable_from_ms).collect();
    let records: Vec<&[u8]> = batch.iter().map(|p| p.record.as_slice()).collect();
    let mut attempt = 0;
    let rows = loop {
        attempt += 1;
        match client
            .query(
                &statement,
                &[&tenants, &ids, &expected, &versions, &purgeable, &records],
            )
            .await
        {
            Ok(rows) => break rows,
            Err(e) if attempt < SERIALIZATION_RETRIES && is_serialization_failure(&e) => {}
            Err(e) => return Err(BackendFailure::new("commit", e)),
        }
    };
    let mut written = vec![false; batch.len()];
    for row in rows {
        let n: i64 = row.get(0);
        if let Some(slot) = usize::try_from(n - 1).ok().and_then(|i| written.get_mut(i)) {
            *slot = true;
        }
    }
    Ok(written)
}
