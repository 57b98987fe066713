//! The layout of the redb file, and the transactions that write it:
//!
//! - `activities`: `(tenant, activity_id)` -> the record, encoded by
//!   [`codec`](crate::store::codec) (a format byte, then protobuf);
//! - `purge_index`: `(purgeable_from_ms, tenant, activity_id)` -> `()`, so
//!   the retention sweeper finds expired records without scanning them all.

use redb::{Database, ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition};

use super::overlay::Records;
use crate::store::journal;

pub(super) const ACTIVITIES: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("activities");
pub(super) const PURGE_INDEX: TableDefinition<(i64, &str, &str), ()> =
    TableDefinition::new("purge_index");
/// Each dependency's pace (`codec::encode_pace`), by name.
pub(super) const PACES: TableDefinition<&str, &[u8]> = TableDefinition::new("dependency_paces");

/// A read snapshot of the `activities` table.
pub(super) fn snapshot(
    db: &Database,
) -> Result<ReadOnlyTable<(&'static str, &'static str), &'static [u8]>, redb::Error> {
    Ok(db.begin_read()?.open_table(ACTIVITIES)?)
}

/// How many records the checkpoint thread writes into redb, or frees, before
/// it yields the core to whatever else is ready to run on it: a fraction of
/// a millisecond of work. Without the yields a checkpoint holds a core for
/// milliseconds at a time while requests wait behind it, which is what a
/// durable decision's tail latency shows. The price is memory: a checkpoint
/// takes longer from start to end, and the saves made meanwhile wait in
/// memory.
pub(super) const YIELD_EVERY: usize = 64;

/// Called by the checkpoint thread after its `n`th record (from 0) written
/// or freed: yields the core after every [`YIELD_EVERY`].
pub(super) fn pace(n: usize) {
    if n % YIELD_EVERY == YIELD_EVERY - 1 {
        std::thread::yield_now();
    }
}

/// Writes `records` into redb in one durable transaction, moving each in
/// the purge index from where the stored version was to where the new one
/// goes.
pub(super) fn checkpoint_into(db: &Database, records: &Records) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut activities = txn.open_table(ACTIVITIES)?;
        let mut index = txn.open_table(PURGE_INDEX)?;
        // In key order: consecutive inserts land in the same or the next
        // leaf, which is still in the CPU's cache.
        let mut sorted: Vec<_> = records.iter().collect();
        sorted.sort_unstable_by(|a, b| {
            (&a.record.tenant, &a.record.activity_id)
                .cmp(&(&b.record.tenant, &b.record.activity_id))
        });
        for (n, pending) in sorted.into_iter().enumerate() {
            pace(n);
            let (tenant, id) = (
                pending.record.tenant.as_str(),
                pending.record.activity_id.as_str(),
            );
            activities.insert((tenant, id), journal::payload(&pending.entry))?;
            let purge = pending.record.purgeable_from_ms();
            if pending.stored_purge != purge {
                if let Some(at) = pending.stored_purge {
                    index.remove((at, tenant, id))?;
                }
                if let Some(at) = purge {
                    index.insert((at, tenant, id), ())?;
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}

/// One write transaction that deletes up to `limit` expired activities.
pub(super) fn purge(db: &Database, cutoff_ms: i64, limit: usize) -> Result<usize, redb::Error> {
    let txn = db.begin_write()?;
    let mut purged = 0;
    {
        let mut activities = txn.open_table(ACTIVITIES)?;
        let mut index = txn.open_table(PURGE_INDEX)?;
        let expired: Vec<(i64, String, String)> = index
            .range((i64::MIN, "", "")..(cutoff_ms, "", ""))?
            .take(limit)
            .map(|entry| {
                entry.map(|(k, _)| {
                    let (at, tenant, id) = k.value();
                    (at, tenant.to_owned(), id.to_owned())
                })
            })
            .collect::<Result<_, _>>()?;
        for (at, tenant, id) in &expired {
            index.remove((*at, tenant.as_str(), id.as_str()))?;
            activities.remove((tenant.as_str(), id.as_str()))?;
            purged += 1;
        }
    }
    txn.commit()?;
    Ok(purged)
}

/// One write transaction that keeps `paces`, replacing those of the same
/// names. Outside the journal: a pace is advice, saved once a second, and
/// lost at worst for the second before a crash.
pub(super) fn save_paces(db: &Database, paces: &[(String, Vec<u8>)]) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(PACES)?;
        for (name, bytes) in paces {
            table.insert(name.as_str(), bytes.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
}

/// Every pace kept, as bytes.
pub(super) fn load_paces(db: &Database) -> Result<Vec<Vec<u8>>, redb::Error> {
    let txn = db.begin_read()?;
    let table = match txn.open_table(PACES) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    table
        .iter()?
        .map(|entry| entry.map(|(_, v)| v.value().to_vec()).map_err(Into::into))
        .collect()
}
