//! `retry-budget migrate`: every activity of an embedded store, its whole
//! history included, copied into PostgreSQL, so that a user who outgrows
//! one replica keeps them. Resumable (each batch commits with how far the
//! copy got) and idempotent (a record already there at the same or a later
//! version is left as it is).

use super::{EmbeddedStore, PgStore, Store, StoreError};

/// What a copy did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Activities copied by the end, earlier runs' included.
    pub copied: u64,
    /// Activities the embedded store holds.
    pub total: u64,
    /// How many an earlier run had copied when this one started.
    pub resumed_from: u64,
}

/// Copies `from` into `to` in batches of `batch`, resuming after the last
/// activity an earlier copy of `source` committed unless `from_start`;
/// `progress` hears (copied, total) after every batch.
///
/// # Errors
/// A failure of either store; what was committed before it stays, and the
/// next run resumes from there.
pub async fn embedded_to_postgres(
    from: &EmbeddedStore,
    source: &str,
    to: &PgStore,
    batch: usize,
    from_start: bool,
    mut progress: impl FnMut(u64, u64),
) -> Result<Copied, StoreError> {
    let total = from.count().await?;
    to.ready().await?;
    let resumed = if from_start {
        None
    } else {
        to.import_progress(source).await?
    };
    let (mut after, mut copied) = resumed.map_or((None, 0), |(key, n)| (Some(key), n));
    let resumed_from = copied;
    progress(copied, total);
    loop {
        let records = from.scan(after.as_ref(), batch.max(1))?;
        let Some(last) = records.last() else {
            break;
        };
        let next = last.key();
        copied += records.len() as u64;
        to.import(source, &records, copied).await?;
        after = Some(next);
        progress(copied, total);
    }
    Ok(Copied {
        copied,
        total,
        resumed_from,
    })
}
