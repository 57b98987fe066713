//! Copying an embedded store's activities into PostgreSQL
//! (`retry-budget migrate`), in batches that each commit with how far the
//! copy got, so that a copy stopped half-way resumes where it stopped and a
//! copy run twice changes nothing.

use super::{BackendFailure, PgStore, version};
use crate::budget::activity::{ActivityKey, ActivityRecord};
use crate::store::{StoreError, codec};

/// Writes each record unless the database holds the same activity at a
/// later version (a replica already moved it on): a copy never rolls an
/// activity back.
const IMPORT: &str = "
INSERT INTO retry_budget_activities (tenant, activity_id, version, purgeable_from_ms, record)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BIGINT[], $5::BYTEA[])
ON CONFLICT (tenant, activity_id) DO UPDATE
SET version = excluded.version, purgeable_from_ms = excluded.purgeable_from_ms, record = excluded.record
WHERE retry_budget_activities.version < excluded.version";

const PROGRESS: &str = "
INSERT INTO retry_budget_imports (source, last_tenant, last_activity_id, copied)
VALUES ($1, $2, $3, $4)
ON CONFLICT (source) DO UPDATE
SET last_tenant = excluded.last_tenant, last_activity_id = excluded.last_activity_id,
    copied = excluded.copied";

impl PgStore {
    /// Where the copy of `source` stopped: the last activity committed and
    /// how many were copied by then; `None` when it never started.
    ///
    /// # Errors
    /// `store_unavailable` when the database fails.
    pub async fn import_progress(
        &self,
        source: &str,
    ) -> Result<Option<(ActivityKey, u64)>, StoreError> {
        self.bounded("read the copy's progress", async {
            let client = self.client("read the copy's progress").await?;
            let row = client
                .query_opt(
                    "SELECT last_tenant, last_activity_id, copied FROM retry_budget_imports
                     WHERE source = $1",
                    &[&source],
                )
                .await
                .map_err(|e| BackendFailure::new("read the copy's progress", e).to_store_error())?;
            Ok(row.map(|row| {
                let key = ActivityKey {
                    tenant: row.get(0),
                    activity_id: row.get(1),
                };
                (key, u64::try_from(row.get::<_, i64>(2)).unwrap_or(0))
            }))
        })
        .await
    }

    /// Writes `records` (in key order, after the last one committed) and
    /// the copy's progress, `copied` in all, in one transaction.
    ///
    /// # Errors
    /// `store_unavailable` when the database fails; nothing of the batch
    /// is then written.
    pub async fn import(
        &self,
        source: &str,
        records: &[ActivityRecord],
        copied: u64,
    ) -> Result<(), StoreError> {
        let Some(last) = records.last() else {
            return Ok(());
        };
        let op = "copy activities";
        self.bounded(op, async {
            let mut client = self.client(op).await?;
            let tenants: Vec<&str> = records.iter().map(|r| r.tenant.as_str()).collect();
            let ids: Vec<&str> = records.iter().map(|r| r.activity_id.as_str()).collect();
            let versions: Vec<i64> = records.iter().map(|r| version(r.events.len())).collect();
            let purgeable: Vec<Option<i64>> = records
                .iter()
                .map(ActivityRecord::purgeable_from_ms)
                .collect();
            let encoded: Vec<Vec<u8>> = records
                .iter()
                .map(|r| {
                    let mut bytes = Vec::new();
                    codec::encode_into(r.clone(), &mut bytes);
                    bytes
                })
                .collect();
            let copied = i64::try_from(copied).unwrap_or(i64::MAX);
            let fail = |e| BackendFailure::new(op, e).to_store_error();
            let tx = client.transaction().await.map_err(fail)?;
            tx.execute(IMPORT, &[&tenants, &ids, &versions, &purgeable, &encoded])
                .await
                .map_err(fail)?;
            tx.execute(
                PROGRESS,
                &[&source, &last.tenant, &last.activity_id, &copied],
            )
            .await
            .map_err(fail)?;
            tx.commit().await.map_err(fail)
        })
        .await
    }
}
