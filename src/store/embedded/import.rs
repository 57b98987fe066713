//! A data directory of an earlier version: its activities and paces, kept in
//! one redb file behind a journal of our own, are copied into fjall on the
//! first open, and the file is renamed aside (kept, never deleted).
//!
//! A version that stopped cleanly left everything in the redb file. One
//! that crashed may have left decisions in its journal segments
//! (`journal-*.log`) that only it can replay: such a directory is refused
//! with what to do, and nothing in it is changed.

use std::path::Path;

use fjall::Database;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::keys;
use super::writer::Keyspaces;
use crate::store::{StoreError, codec};

/// The earlier version's database file.
pub const REDB_FILE: &str = "retry-budget.redb";
/// What it is renamed to once imported.
pub const IMPORTED: &str = "retry-budget.redb.imported";

const ACTIVITIES: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("activities");
const PACES: TableDefinition<&str, &[u8]> = TableDefinition::new("dependency_paces");

/// Records copied a batch (and a durable commit).
const BATCH: usize = 4096;

fn failed(op: &'static str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        op,
        source: error.to_string().into(),
    }
}

/// Refuses `dir` if it holds an earlier version's redb file beside a
/// journal that version did not replay: called before anything is created
/// in it.
///
/// # Errors
/// Such a journal, or a directory that cannot be listed.
pub fn refuse_unreplayed(dir: &Path) -> Result<(), StoreError> {
    if !dir.join(REDB_FILE).exists() {
        return Ok(());
    }
    if let Some(segment) = unreplayed_journal(dir)? {
        return Err(failed(
            "import an earlier version's data directory",
            format!(
                "{} holds decisions an earlier version journaled but did not write into {REDB_FILE} \
                 (it did not stop cleanly): start that version once on this directory and stop it \
                 with SIGTERM, then start this one",
                segment.display()
            ),
        ));
    }
    Ok(())
}

/// Copies `dir`'s redb file, if there is one, into `db` and renames it to
/// [`IMPORTED`].
///
/// # Errors
/// A file that cannot be read, or a record in it that does not decode.
pub fn from_redb(dir: &Path, db: &Database, ks: &Keyspaces) -> Result<(), StoreError> {
    let file = dir.join(REDB_FILE);
    if !file.exists() {
        return Ok(());
    }
    let old =
        redb::Database::open(&file).map_err(|e| failed("open the earlier version's file", e))?;
    let read = old
        .begin_read()
        .map_err(|e| failed("read the earlier version's file", e))?;
    let mut count = 0u64;
    match read.open_table(ACTIVITIES) {
        Ok(table) => {
            let mut batch = db.batch();
            let mut in_batch = 0;
            for row in table
                .iter()
                .map_err(|e| failed("read the earlier version's file", e))?
            {
                let (key, value) = row.map_err(|e| failed("read the earlier version's file", e))?;
                let (tenant, id) = key.value();
                let record =
                    codec::decode(value.value()).map_err(|source| StoreError::Corrupt {
                        key: format!("{tenant}/{id}"),
                        source,
                    })?;
                batch.insert(&ks.activities, keys::activity(tenant, id), value.value());
                if let Some(at) = record.purgeable_from_ms() {
                    batch.insert(&ks.purge_index, keys::purge(at, tenant, id), b"");
                }
                count += 1;
                in_batch += 1;
                if in_batch == BATCH {
                    commit(db, std::mem::replace(&mut batch, db.batch()))?;
                    in_batch = 0;
                }
            }
            batch.insert(&ks.meta, keys::COUNT, keys::count_bytes(count));
            commit(db, batch)?;
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(failed("read the earlier version's file", e)),
    }
    match read.open_table(PACES) {
        Ok(table) => {
            let mut batch = db.batch();
            for row in table
                .iter()
                .map_err(|e| failed("read the earlier version's paces", e))?
            {
                let (name, value) =
                    row.map_err(|e| failed("read the earlier version's paces", e))?;
                batch.insert(&ks.paces, name.value(), value.value());
            }
            commit(db, batch)?;
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(failed("read the earlier version's paces", e)),
    }
    drop(read);
    drop(old);
    std::fs::rename(&file, dir.join(IMPORTED))
        .map_err(|e| failed("rename the imported file", e))?;
    tracing::info!(
        activities = count,
        from = %file.display(),
        kept_as = IMPORTED,
        "imported an earlier version's data directory"
    );
    Ok(())
}

fn commit(db: &Database, batch: fjall::OwnedWriteBatch) -> Result<(), StoreError> {
    batch
        .commit()
        .and_then(|()| db.persist(fjall::PersistMode::SyncData))
        .map_err(|e| failed("write the imported records", e))
}

/// A journal segment of the earlier version that holds anything.
fn unreplayed_journal(dir: &Path) -> Result<Option<std::path::PathBuf>, StoreError> {
    let entries = std::fs::read_dir(dir).map_err(|e| failed("list the data directory", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| failed("list the data directory", e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let segment = name.starts_with("journal-") && name.ends_with(".log");
        if segment && entry.metadata().is_ok_and(|m| m.len() > 0) {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}
