//! Versioned schema migrations, applied at start by every replica.
//!
//! Each migration is a file of `migrations/`, applied once, in order, in
//! its own transaction that first claims its version in
//! `retry_budget_schema_migrations`. Replicas starting together race for
//! the claim: the unique key makes the second wait for the first's
//! transaction and then find the version taken, so each migration runs
//! exactly once and nobody starts on a half-made schema. No advisory lock
//! (CockroachDB has none that locks); a serialization failure (40001) is
//! retried.

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

/// Every migration this build knows, in order: its version, a name, the SQL.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "activities",
        include_str!("../../../migrations/0001_activities.sql"),
    ),
    (
        2,
        "replica_leases",
        include_str!("../../../migrations/0002_replica_leases.sql"),
    ),
    (
        3,
        "dependency_paces",
        include_str!("../../../migrations/0003_dependency_paces.sql"),
    ),
];

/// The table that records which migrations ran.
const LEDGER: &str = "CREATE TABLE IF NOT EXISTS retry_budget_schema_migrations (
    version    INT         PRIMARY KEY,
    name       TEXT        NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)";

/// How often a migration's transaction is tried when it keeps meeting a
/// concurrent one (a serialization failure, or two `CREATE TABLE IF NOT
/// EXISTS` racing on PostgreSQL's catalog).
const ATTEMPTS: u32 = 10;

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database failed.
    #[error("migration {version} ({name}): {source}")]
    Database {
        /// The migration being applied (0: the migrations' own table).
        version: i32,
        /// Its name.
        name: &'static str,
        /// Why.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The database was migrated by a later release.
    #[error(
        "the schema is at version {found}, newer than this release's {known}: run the newer release or restore"
    )]
    Newer {
        /// The version found.
        found: i32,
        /// The latest this release knows.
        known: i32,
    },
}

/// Applies every migration not applied yet and returns how many it applied.
///
/// # Errors
/// [`MigrateError`] when the database fails or is newer than this release.
pub async fn migrate(client: &mut Client) -> Result<usize, MigrateError> {
    // `CREATE ... IF NOT EXISTS` of what exists is the normal case at every
    // start after the first (and for replicas started together): its
    // NOTICE ("already exists, skipping") would reach the log at INFO.
    // Warnings and errors still come through.
    quiet(client, true).await?;
    let migrated = migrate_quietly(client).await;
    quiet(client, false).await?;
    migrated
}

/// Turns the session's notices off (`on`) or back to the default.
async fn quiet(client: &Client, on: bool) -> Result<(), MigrateError> {
    let sql = if on {
        "SET client_min_messages = warning"
    } else {
        "RESET client_min_messages"
    };
    client
        .batch_execute(sql)
        .await
        .map_err(|source| MigrateError::Database {
            version: 0,
            name: "schema_migrations",
            source,
        })
}

async fn migrate_quietly(client: &mut Client) -> Result<usize, MigrateError> {
    retried(|| client.batch_execute(LEDGER))
        .await
        .map_err(|source| MigrateError::Database {
            version: 0,
            name: "schema_migrations",
            source,
        })?;
    let mut applied = 0;
    for &(version, name, sql) in MIGRATIONS {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match apply(client, version, name, sql).await {
                Ok(ran) => {
                    applied += usize::from(ran);
                    if ran {
                        tracing::info!(version, name, "schema migration applied");
                    }
                    break;
                }
                Err(source) if attempt < ATTEMPTS && is_race(&source) => {}
                Err(source) => {
                    return Err(MigrateError::Database {
                        version,
                        name,
                        source,
                    });
                }
            }
        }
    }
    let found: Option<i32> = client
        .query_one(
            "SELECT max(version) FROM retry_budget_schema_migrations",
            &[],
        )
        .await
        .map_err(|source| MigrateError::Database {
            version: 0,
            name: "schema_migrations",
            source,
        })?
        .get(0);
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    match found {
        Some(found) if found > known => Err(MigrateError::Newer { found, known }),
        _ => Ok(applied),
    }
}

/// One migration in one transaction; false when it was applied before.
async fn apply(
    client: &mut Client,
    version: i32,
    name: &str,
    sql: &str,
) -> Result<bool, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let claimed = tx
        .execute(
            "INSERT INTO retry_budget_schema_migrations (version, name) VALUES ($1, $2)
             ON CONFLICT (version) DO NOTHING",
            &[&version, &name],
        )
        .await?;
    if claimed == 0 {
        tx.rollback().await?;
        return Ok(false);
    }
    tx.batch_execute(sql).await?;
    tx.commit().await?;
    Ok(true)
}

/// `op` again while it fails by racing a concurrent transaction.
async fn retried<F, Fut>(mut op: F) -> Result<(), tokio_postgres::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), tokio_postgres::Error>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match op().await {
            Err(e) if attempt < ATTEMPTS && is_race(&e) => {}
            other => return other,
        }
    }
}

/// A failure caused by a concurrent transaction, gone if tried again: a
/// serialization failure, or PostgreSQL's catalog refusing a second
/// concurrent `CREATE ... IF NOT EXISTS` of one name.
pub(super) fn is_race(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::UNIQUE_VIOLATION,
            SqlState::DUPLICATE_TABLE,
            SqlState::DUPLICATE_OBJECT,
        ]
        .contains(code)
    })
}
