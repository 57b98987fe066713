//! The PostgreSQL store: what lets several replicas be one service.
//!
//! # The contract across replicas
//! Work on one activity is no longer serialised by one process: two
//! replicas may decide the same attempt at the same instant. Each row
//! carries a version (the record's number of events; every change appends
//! one), and a save writes only if the row is still at the version its
//! writer loaded, or, for a new activity, only if no row exists. The loser
//! of a race gets [`StoreError::Conflict`] and the ledger decides again on
//! what is stored now, which for the same attempt is the winner's decision,
//! replayed. A decision is acknowledged only after that conditional write
//! committed, so it would have failed had another replica moved the
//! activity on. No lock is held between the read and the write, and none
//! lives in a process.
//!
//! # Group commit
//! Saves go through one dispatcher (`writer`) that writes those waiting at
//! one moment as one statement: one round trip and one commit for many
//! decisions, as the embedded store shares one fsync.
//!
//! # A database that is slow or gone
//! Every operation is bounded by `timeout` (the pool's waits and each
//! statement): past it the caller gets `store_unavailable` with a time to
//! come back, never a hang. [`PgStore::ping`] tells health whether the
//! database answers; the pool reconnects by itself when it returns.
//!
//! # Schema
//! Versioned migrations (`migrate`) run before the first operation, and
//! again on later operations until they succeed, so a replica that starts
//! before its database still starts (not serving until then).

mod import;
mod migrate;
mod tls;
mod writer;

use std::error::Error;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::{OnceCell, mpsc, oneshot};
use tokio_postgres::NoTls;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;

pub use self::migrate::{MIGRATIONS, MigrateError, migrate};
use super::{CommitStats, Replaced, Store, StoreError, codec};
use crate::budget::activity::{ActivityKey, ActivityRecord};
use crate::budget::token::PaceRecord;

/// How the PostgreSQL store connects and commits.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// The database, as a libpq URL or key=value string.
    pub url: String,
    /// Connections the pool keeps at most.
    pub pool_size: usize,
    /// The longest any one operation may take (waiting for a connection
    /// included) before it fails with `store_unavailable`.
    pub timeout: Duration,
    /// The most saves one commit carries.
    pub max_batch: usize,
    /// A CA certificate (PEM) to trust for the database's TLS certificate,
    /// besides the system's roots. Setting it requires TLS.
    pub ca_file: Option<std::path::PathBuf>,
}

/// Group commits in flight at once, each on its own connection: while one
/// commits, the saves arriving meanwhile gather for the next.
const COMMITS_IN_FLIGHT: usize = 4;

/// The name of the retention sweep's lease.
const SWEEP_TASK: &str = "retention_sweep";

/// The database's clock, unix milliseconds: leases are judged by one clock
/// whichever replica reads them.
const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::BIGINT";

/// Activities in PostgreSQL. Clones share one pool and one writer.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Connections for reads and the writer's commits.
    pool: Pool,
    /// The one connection of the replicas' coordination, apart so that its
    /// transaction never waits behind a busy store for a connection.
    coordination: Pool,
    /// The bound on each operation.
    timeout: Duration,
    /// To the group-commit dispatcher.
    writes: mpsc::UnboundedSender<writer::RowToWrite>,
    /// Set once the schema is up to date.
    schema: OnceCell<()>,
    /// Commits and the saves they carried.
    stats: Arc<CommitStats>,
}

impl PgStore {
    /// A store over the database at `options.url`. Connects lazily: a
    /// database that is down makes operations fail (and health say
    /// `NOT_SERVING`) until it answers, not this call.
    ///
    /// # Errors
    /// `store_unavailable` when the URL cannot be parsed.
    pub fn open(options: &PostgresOptions) -> Result<Self, StoreError> {
        let mut config = tokio_postgres::Config::from_str(&options.url)
            .map_err(|e| BackendFailure::new("parse the PostgreSQL URL", e).to_store_error())?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("retry-budget");
        }
        if options.ca_file.is_some() {
            config.ssl_mode(SslMode::Require);
        }
        let pool = connection_pool(
            &config,
            options,
            options.pool_size.max(COMMITS_IN_FLIGHT + 1),
        )?;
        let coordination = connection_pool(&config, options, 1)?;
        let stats = Arc::new(CommitStats::default());
        let writes = writer::spawn(
            pool.clone(),
            options.timeout,
            options.max_batch,
            COMMITS_IN_FLIGHT,
            Arc::clone(&stats),
        );
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                coordination,
                timeout: options.timeout,
                writes,
                schema: OnceCell::new(),
                stats,
            }),
        })
    }

    /// The replicas' coordination's own pool, of one connection.
    pub fn coordination_pool(&self) -> &Pool {
        &self.inner.coordination
    }

    /// Group commits made and the saves they carried.
    pub fn commit_stats(&self) -> &CommitStats {
        &self.inner.stats
    }

    /// Brings the schema up to date now, if it is not yet.
    ///
    /// # Errors
    /// `store_unavailable` when the database cannot be reached or migrated.
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.inner
            .schema
            .get_or_try_init(|| async {
                let mut client = self.client("migrate").await?;
                migrate(&mut client)
                    .await
                    .map_err(|e| BackendFailure::new("migrate", e).to_store_error())?;
                Ok(())
            })
            .await
            .map(|_| ())
    }

    async fn client(&self, op: &'static str) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner
            .pool
            .get()
            .await
            .map_err(|e| BackendFailure::new(op, e).to_store_error())
    }

    /// `op` bounded by the store's timeout, after the schema is ready.
    async fn bounded<T>(
        &self,
        op: &'static str,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let timeout = self.inner.timeout;
        let run = async {
            self.ready().await?;
            work.await
        };
        tokio::time::timeout(timeout, run)
            .await
            .unwrap_or_else(|_| {
                Err(BackendFailure::new(
                    op,
                    format!("no answer from PostgreSQL within {timeout:?}"),
                )
                .to_store_error())
            })
    }
}

impl Store for PgStore {
    async fn load(&self, key: &ActivityKey) -> Result<Option<ActivityRecord>, StoreError> {
        self.bounded("load", async {
            let client = self.client("load").await?;
            let statement = client
                .prepare_cached(
                    "SELECT record FROM retry_budget_activities WHERE tenant = $1 AND activity_id = $2",
                )
                .await
                .map_err(|e| BackendFailure::new("load", e).to_store_error())?;
            let row = client
                .query_opt(&statement, &[&key.tenant, &key.activity_id])
                .await
                .map_err(|e| BackendFailure::new("load", e).to_store_error())?;
            row.map(|row| {
                codec::decode(row.get::<_, &[u8]>(0)).map_err(|source| StoreError::Corrupt {
                    key: format!("{}/{}", key.tenant, key.activity_id),
                    source,
                })
            })
            .transpose()
        })
        .await
    }

    fn save(
        &self,
        record: ActivityRecord,
        replaces: Option<Replaced>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (done, answer) = oneshot::channel();
        let new_version = version(record.events.len());
        let purgeable_from_ms = record.purgeable_from_ms();
        let mut bytes = Vec::with_capacity(codec::RECORD_CAPACITY);
        let key = codec::encode_into(record, &mut bytes);
        let pending = writer::RowToWrite {
            expected: replaces.map_or(-1, |r| version(r.events)),
            version: new_version,
            purgeable_from_ms,
            tenant: key.tenant,
            activity_id: key.activity_id,
            record: bytes,
            done,
        };
        // Handed over in this call once the schema is known to be ready
        // (always, after the first load): the future only waits.
        let handed = if self.inner.schema.initialized() {
            Ok(self.inner.writes.send(pending).is_ok())
        } else {
            Err(pending)
        };
        let store = self.clone();
        async move {
            let sent = match handed {
                Ok(sent) => sent,
                Err(pending) => {
                    store.ready().await?;
                    store.inner.writes.send(pending).is_ok()
                }
            };
            if !sent {
                return Err(StoreError::Closed);
            }
            answer.await.unwrap_or(Err(StoreError::Closed))
        }
    }

    async fn purge(&self, cutoff_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.bounded("purge", async {
            let client = self.client("purge").await?;
            // The outer condition is checked again on a row another replica
            // changed meanwhile: a record that became purgeable later stays.
            let purged = client
                .execute(
                    "DELETE FROM retry_budget_activities
                     WHERE purgeable_from_ms < $1 AND (tenant, activity_id) IN (
                         SELECT tenant, activity_id FROM retry_budget_activities
                         WHERE purgeable_from_ms < $1 ORDER BY purgeable_from_ms LIMIT $2)",
                    &[&cutoff_ms, &limit],
                )
                .await
                .map_err(|e| BackendFailure::new("purge", e).to_store_error())?;
            Ok(usize::try_from(purged).unwrap_or(usize::MAX))
        })
        .await
    }

    async fn save_paces(&self, paces: Vec<PaceRecord>) -> Result<(), StoreError> {
        self.bounded("save paces", async {
            let client = self.client("save paces").await?;
            for pace in &paces {
                client
                    .execute(
                        "INSERT INTO retry_budget_dependency_paces (dependency, pace, saved_at) \
                         VALUES ($1, $2, $3) ON CONFLICT (dependency) \
                         DO UPDATE SET pace = EXCLUDED.pace, saved_at = EXCLUDED.saved_at",
                        &[
                            &pace.dependency,
                            &codec::encode_pace(pace),
                            &pace.saved_at_ms,
                        ],
                    )
                    .await
                    .map_err(|e| BackendFailure::new("save paces", e).to_store_error())?;
            }
            Ok(())
        })
        .await
    }

    async fn load_paces(&self) -> Result<Vec<PaceRecord>, StoreError> {
        self.bounded("load paces", async {
            let client = self.client("load paces").await?;
            let rows = client
                .query("SELECT pace FROM retry_budget_dependency_paces", &[])
                .await
                .map_err(|e| BackendFailure::new("load paces", e).to_store_error())?;
            // A pace that does not decode is skipped: it is advice.
            Ok(rows
                .iter()
                .filter_map(|row| codec::decode_pace(row.get::<_, &[u8]>(0)).ok())
                .collect())
        })
        .await
    }

    async fn count(&self) -> Result<u64, StoreError> {
        self.bounded("count", async {
            let client = self.client("count").await?;
            let row = client
                .query_one("SELECT count(*) FROM retry_budget_activities", &[])
                .await
                .map_err(|e| BackendFailure::new("count", e).to_store_error())?;
            Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        })
        .await
    }

    fn commit_stats(&self) -> Option<&CommitStats> {
        Some(PgStore::commit_stats(self))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded("ping", async {
            let client = self.client("ping").await?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| BackendFailure::new("ping", e).to_store_error())?;
            Ok(())
        })
        .await
    }

    async fn claim_sweep(&self, holder: &str, ttl: Duration) -> Result<bool, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.bounded("claim the sweep", async {
            let client = self.client("claim the sweep").await?;
            let claimed = client
                .execute(
                    &format!(
                        "INSERT INTO retry_budget_task_leases AS l (task, holder, expires_at_ms)
                         VALUES ($1, $2, {DB_NOW_MS} + $3)
                         ON CONFLICT (task) DO UPDATE
                         SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms
                         WHERE l.holder = excluded.holder OR l.expires_at_ms < {DB_NOW_MS}"
                    ),
                    &[&SWEEP_TASK, &holder, &ttl_ms],
                )
                .await
                .map_err(|e| BackendFailure::new("claim the sweep", e).to_store_error())?;
            Ok(claimed == 1)
        })
        .await
    }
}

/// A count of events as the row's version.
fn version(events: usize) -> i64 {
    i64::try_from(events).unwrap_or(i64::MAX)
}

/// A transaction that lost a race and may be tried again as it was: a
/// serialization failure, or a deadlock between two replicas' group
/// commits that touch the same activities (each commit is one statement,
/// all or nothing, so trying it again is safe).
fn is_serialization_failure(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// A failed operation whose cause several waiting saves share.
#[derive(Debug, Clone)]
struct BackendFailure {
    op: &'static str,
    cause: SharedError,
}

impl BackendFailure {
    fn new(op: &'static str, cause: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self {
            op,
            cause: SharedError::new(cause.into()),
        }
    }

    fn to_store_error(&self) -> StoreError {
        StoreError::Backend {
            op: self.op,
            source: Box::new(self.cause.clone()),
        }
    }
}

/// A pool of at most `size` connections to `config`'s database.
fn connection_pool(
    config: &tokio_postgres::Config,
    options: &PostgresOptions,
    size: usize,
) -> Result<Pool, StoreError> {
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    // TLS when asked for (`sslmode=require`, or a CA file): always with
    // the certificate and the host name verified. Otherwise plain TCP,
    // even where the server offers TLS (`sslmode=prefer`), since a
    // certificate no root vouches for would fail every connection.
    let manager = if config.get_ssl_mode() == SslMode::Require {
        let tls = tls::connector(options.ca_file.as_deref())
            .map_err(|e| BackendFailure::new("set up TLS to PostgreSQL", e).to_store_error())?;
        Manager::from_config(config.clone(), tls, manager_config)
    } else {
        Manager::from_config(config.clone(), NoTls, manager_config)
    };
    Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(options.timeout))
        .create_timeout(Some(options.timeout))
        .recycle_timeout(Some(options.timeout))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| BackendFailure::new("build the connection pool", e).to_store_error())
}

/// `error`'s text followed by each of its causes' not already in it.
pub(crate) fn error_chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// An error shared by every save of a failed commit. Its text is the whole
/// chain of causes: tokio-postgres puts the useful part ("connection
/// refused", the server's message) in the sources.
#[derive(Debug, Clone)]
struct SharedError(Arc<str>);

impl SharedError {
    fn new(error: Box<dyn Error + Send + Sync>) -> Self {
        Self(error_chain(error.as_ref()).into())
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for SharedError {}
