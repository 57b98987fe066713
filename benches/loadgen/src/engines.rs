//! `--scenario engine-writes`: the bound an embedded engine puts on durable writes on this
//! disk, without the service. One thread writes `--activities` records of a record's size
//! (160 bytes) under scattered keys, in batches of `--batch-size`, each batch committed and
//! fsynced, into fjall (the embedded store's engine) or redb (its engine before, whose
//! commits rewrite the B-tree pages they touch), in a scratch directory under `--data-dir`.

use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};

const VALUE: [u8; 160] = [7; 160];

/// A key that scatters `i` over the key space, as activity ids do.
fn key(i: u64) -> [u8; 16] {
    let mut k = [0; 16];
    k[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

/// Writes into `engine` ("fjall" or "redb") and reports records a second.
pub fn writes(dir: &Path, engine: &str, records: u64, batch: u64) -> Result<Value, String> {
    let scratch = dir.join(format!(".engine-writes-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let batch = batch.max(1);
    let started = Instant::now();
    let written = match engine {
        "fjall" => fjall_writes(&scratch, records, batch),
        "redb" => redb_writes(&scratch, records, batch),
        other => Err(format!("--engine {other}: fjall or redb")),
    };
    let seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&scratch);
    written?;
    Ok(json!({
        "scenario": "engine-writes", "engine": engine, "records": records, "batch": batch,
        "seconds": seconds, "records_per_s": records as f64 / seconds,
    }))
}

fn fjall_writes(dir: &Path, records: u64, batch: u64) -> Result<(), String> {
    let e = |e: fjall::Error| e.to_string();
    let db = fjall::Database::builder(dir)
        .manual_journal_persist(true)
        .open()
        .map_err(e)?;
    let ks = db
        .keyspace("records", fjall::KeyspaceCreateOptions::default)
        .map_err(e)?;
    for start in (0..records).step_by(batch as usize) {
        let mut b = db.batch();
        for i in start..(start + batch).min(records) {
            b.insert(&ks, key(i), VALUE);
        }
        b.commit().map_err(e)?;
        db.persist(fjall::PersistMode::SyncData).map_err(e)?;
    }
    Ok(())
}

fn redb_writes(dir: &Path, records: u64, batch: u64) -> Result<(), String> {
    const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("records");
    let e = |e: redb::Error| e.to_string();
    let db = redb::Database::create(dir.join("records.redb")).map_err(|x| e(x.into()))?;
    for start in (0..records).step_by(batch as usize) {
        let txn = db.begin_write().map_err(|x| e(x.into()))?;
        {
            let mut table = txn.open_table(TABLE).map_err(|x| e(x.into()))?;
            for i in start..(start + batch).min(records) {
                table
                    .insert(&key(i)[..], &VALUE[..])
                    .map_err(|x| e(x.into()))?;
            }
        }
        // `Durability::Immediate`, redb's default: durable when the commit returns.
        txn.commit().map_err(|x| e(x.into()))?;
    }
    Ok(())
}
