//! The lease table's SQL: one row per replica, read whole and written once
//! in each replica's transaction of an interval.
//!
//! # Portable
//! Plain statements that PostgreSQL, CockroachDB and YugabyteDB all run:
//! no advisory locks (CockroachDB accepts and ignores them), no PL/pgSQL,
//! `INSERT .. ON CONFLICT`, and times from the database's `now()` (the
//! transaction's start), so that replicas with skewed clocks agree on
//! which leases have lapsed. The schema is `migrations/0002_replica_leases.sql`.
//!
//! # Why the grant sum holds
//! Each transaction, SERIALIZABLE, reads every row and writes its own. Two
//! that overlap each read the row the other writes, a cycle the database
//! breaks by failing one with SQLSTATE 40001, retried by the caller. So the
//! transactions take effect one after the other, each seeing the grants of
//! those before it, and the published grants never sum past the global
//! rate.

use std::time::Duration;

use deadpool_postgres::Transaction;
use tokio_postgres::IsolationLevel;
use tokio_postgres::error::SqlState;

/// The table, created by the migration.
pub const MIGRATION: &str = include_str!("../../migrations/0002_replica_leases.sql");

/// A row as read, with whether its lease is live by the database's clock.
#[derive(Debug, Clone)]
pub(super) struct LeaseRow {
    /// The replica holding it.
    pub replica_id: String,
    /// The rate it holds, tokens a second.
    pub granted_rate: f64,
    /// Its demand, encoded (`super::demand`).
    pub demand: Vec<u8>,
    /// Whether `expires_at` is still ahead.
    pub live: bool,
    /// Whether it lapsed so long ago that it can be deleted.
    pub stale: bool,
}

/// What a replica writes in its row.
#[derive(Debug, Clone)]
pub(super) struct LeaseWrite<'a> {
    pub replica_id: &'a str,
    /// The epoch held, or `None` to take the row (a new epoch).
    pub epoch: Option<i64>,
    /// How long the lease lasts from the database's now.
    pub ttl: Duration,
    pub granted_rate: f64,
    pub granted_burst: u32,
    pub demand: &'a [u8],
}

/// Starts the interval's transaction.
pub(super) async fn begin(
    client: &mut deadpool_postgres::Client,
) -> Result<Transaction<'_>, tokio_postgres::Error> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::Serializable)
        .start()
        .await
}

/// Every row. Rows lapsed for `stale_after` are marked stale.
pub(super) async fn read(
    tx: &Transaction<'_>,
    stale_after: Duration,
) -> Result<Vec<LeaseRow>, tokio_postgres::Error> {
    let rows = tx
        .query(
            "SELECT replica_id, granted_rate, demand, expires_at > now(), \
                    expires_at < now() - $1::BIGINT * INTERVAL '1 millisecond' \
             FROM retry_budget_replica_leases",
            &[&millis(stale_after)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| LeaseRow {
            replica_id: row.get(0),
            granted_rate: row.get(1),
            demand: row.get(2),
            live: row.get(3),
            stale: row.get(4),
        })
        .collect())
}

/// Writes the replica's row: renews its epoch, or takes the row with the
/// next one. `Ok(None)`: the row is held under another epoch (another
/// process with this replica id took it).
pub(super) async fn write(
    tx: &Transaction<'_>,
    w: &LeaseWrite<'_>,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let ttl = millis(w.ttl);
    let burst = i64::from(w.granted_burst);
    let renewed = match w.epoch {
        Some(epoch) => tx
            .query_opt(
                "UPDATE retry_budget_replica_leases SET \
                    expires_at = now() + $2::BIGINT * INTERVAL '1 millisecond', \
                    granted_rate = $3, granted_burst = $4, demand = $5 \
                 WHERE replica_id = $1 AND epoch = $6 \
                 RETURNING epoch",
                &[
                    &w.replica_id,
                    &ttl,
                    &w.granted_rate,
                    &burst,
                    &w.demand,
                    &epoch,
                ],
            )
            .await?
            .map(|row| Ok(Some(row)))
            .unwrap_or(Err(epoch)),
        None => tx
            .query_opt(
                "INSERT INTO retry_budget_replica_leases AS l \
                    (replica_id, epoch, expires_at, granted_rate, granted_burst, demand) \
                 VALUES ($1, 1, now() + $2::BIGINT * INTERVAL '1 millisecond', $3, $4, $5) \
                 ON CONFLICT (replica_id) DO UPDATE SET \
                    epoch = l.epoch + 1, expires_at = excluded.expires_at, \
                    granted_rate = excluded.granted_rate, \
                    granted_burst = excluded.granted_burst, demand = excluded.demand \
                 RETURNING epoch",
                &[&w.replica_id, &ttl, &w.granted_rate, &burst, &w.demand],
            )
            .await
            .map(Ok)?,
    };
    let row = match renewed {
        Ok(row) => row,
        // Not renewed: if the row is gone (deleted as stale after a long
        // partition), it is taken again with the next epoch; if another
        // epoch holds it, nothing is written.
        Err(epoch) => {
            tx.query_opt(
                "INSERT INTO retry_budget_replica_leases \
                    (replica_id, epoch, expires_at, granted_rate, granted_burst, demand) \
                 VALUES ($1, $6::BIGINT + 1, now() + $2::BIGINT * INTERVAL '1 millisecond', $3, $4, $5) \
                 ON CONFLICT (replica_id) DO NOTHING \
                 RETURNING epoch",
                &[
                    &w.replica_id,
                    &ttl,
                    &w.granted_rate,
                    &burst,
                    &w.demand,
                    &epoch,
                ],
            )
            .await?
        }
    };
    Ok(row.map(|row| row.get(0)))
}

/// Deletes rows that lapsed long ago (replicas gone without leaving), so
/// the table holds about the live replicas. Rare: only when one is seen.
pub(super) async fn delete_stale(
    tx: &Transaction<'_>,
    stale_after: Duration,
) -> Result<u64, tokio_postgres::Error> {
    tx.execute(
        "DELETE FROM retry_budget_replica_leases \
         WHERE expires_at < now() - $1::BIGINT * INTERVAL '1 millisecond'",
        &[&millis(stale_after)],
    )
    .await
}

/// Deletes the replica's own row when it leaves, so the others take its
/// share at their next interval instead of after its lease lapses.
pub(super) async fn leave(
    client: &deadpool_postgres::Client,
    replica_id: &str,
    epoch: i64,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute(
            "DELETE FROM retry_budget_replica_leases WHERE replica_id = $1 AND epoch = $2",
            &[&replica_id, &epoch],
        )
        .await
}

/// Whether `error` is a serialization failure, to be retried.
pub(super) fn is_serialization_failure(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
