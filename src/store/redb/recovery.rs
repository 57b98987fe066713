//! Recovery at open: the journal segments a crash left are replayed into
//! redb, oldest first, then deleted. A torn last entry (a group whose
//! `fdatasync` never returned, so never acknowledged) is ignored with a
//! warning.

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase};

use super::overlay::{Pending, Records};
use super::tables::{ACTIVITIES, checkpoint_into};
use super::{backend, corrupt};
use crate::store::{StoreError, codec, journal};

/// Replays the journal segments a crash left into redb, oldest first, and
/// deletes them. Returns the generation for the next segment.
pub(super) fn recover(db: &Database, dir: &Path) -> Result<u64, StoreError> {
    let segments = journal::segments(dir).map_err(backend("list the journal segments"))?;
    let next = segments.last().map_or(1, |(generation, _)| generation + 1);
    for (generation, path) in segments {
        let contents =
            journal::read(&path, generation).map_err(backend("read a journal segment"))?;
        if contents.torn {
            tracing::warn!(
                segment = %path.display(),
                ignored_bytes = contents.ignored_bytes,
                "journal: ignored a torn tail (a group commit that never completed, so never acknowledged)"
            );
        }
        let mut records = Records::default();
        for payload in contents.payloads {
            let record = codec::decode(&payload).map_err(|source| StoreError::Corrupt {
                key: format!("journal segment {generation}"),
                source,
            })?;
            let mut entry = journal::open_frame(payload.len());
            entry.extend_from_slice(&payload);
            records.upsert(Pending {
                record: Arc::new(record),
                entry,
                stored_purge: None,
            });
        }
        let replayed = records.len();
        stored_purges(db, &mut records)?;
        checkpoint_into(db, &records).map_err(backend("replay the journal into the database"))?;
        std::fs::remove_file(&path).map_err(backend("delete a replayed journal segment"))?;
        tracing::info!(segment = %path.display(), records = replayed, "journal: replayed into the database");
    }
    journal::sync_dir(dir).map_err(backend("sync the data directory"))?;
    Ok(next)
}

/// Fills in where the versions redb holds sit in the purge index.
fn stored_purges(db: &Database, records: &mut Records) -> Result<(), StoreError> {
    const READ: &str = "read the database";
    let txn = db.begin_read().map_err(backend(READ))?;
    let table = txn.open_table(ACTIVITIES).map_err(backend(READ))?;
    for pending in records.iter_mut() {
        let (tenant, id) = (
            pending.record.tenant.as_str(),
            pending.record.activity_id.as_str(),
        );
        if let Some(value) = table.get((tenant, id)).map_err(backend(READ))? {
            let stored = codec::decode(value.value())
                .map_err(|source| corrupt(&pending.record.key(), source))?;
            pending.stored_purge = stored.purgeable_from_ms();
        }
    }
    Ok(())
}
