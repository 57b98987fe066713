//! The database side of the coordination tests: a schema of each test's
//! own, and a proxy that can cut a replica off.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use retry_budget::coord::MIGRATION;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;

/// Where the test database is.
pub const URL_ENV: &str = "RETRY_BUDGET_TEST_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A schema of the test's own, dropped at the end.
pub struct Schema {
    /// How to reach the database.
    pub config: tokio_postgres::Config,
    /// The schema's name.
    name: String,
}

impl Schema {
    /// A fresh schema with the lease table, or `None` (said) when the
    /// database is unreachable outside CI.
    pub async fn create() -> Option<Self> {
        let url = std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned());
        let config: tokio_postgres::Config = url.parse().expect("a valid postgres url");
        let connected = tokio::time::timeout(Duration::from_secs(3), config.connect(NoTls)).await;
        let (client, connection) = match connected {
            Ok(Ok(pair)) => pair,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "PostgreSQL at {url} is unreachable under CI: {why}"
                );
                crate::common::skip::skipped(&format!(
                    "PostgreSQL at {url} is unreachable ({why}); set {URL_ENV}"
                ));
                return None;
            }
        };
        tokio::spawn(connection);
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "coord_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Relaxed)
        );
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
            ))
            .await
            .expect("create the schema");
        let schema = Self { config, name };
        let pool = schema.pool(None);
        let client = pool.get().await.expect("a connection");
        // Twice: the migration is idempotent.
        client.batch_execute(MIGRATION).await.expect("migration");
        client
            .batch_execute(MIGRATION)
            .await
            .expect("migration again");
        Some(schema)
    }

    /// A pool on the schema, through `port` instead of the server's own
    /// when given (a proxy that can be cut).
    pub fn pool(&self, port: Option<u16>) -> Pool {
        // `host` and `port` add to a config's lists: a proxied one is
        // built afresh.
        let mut config = match port {
            None => self.config.clone(),
            Some(port) => {
                let mut c = tokio_postgres::Config::new();
                c.host("127.0.0.1").port(port);
                c.user(self.config.get_user().unwrap_or("postgres"));
                c.dbname(self.config.get_dbname().unwrap_or("postgres"));
                if let Some(password) = self.config.get_password() {
                    c.password(password);
                }
                c
            }
        };
        config.options(format!("-c search_path={}", self.name));
        config.connect_timeout(Duration::from_secs(1));
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(2)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(1)))
            .create_timeout(Some(Duration::from_secs(1)))
            .build()
            .expect("a pool")
    }

    pub async fn drop_it(self) {
        let (client, connection) = self.config.connect(NoTls).await.expect("connect");
        tokio::spawn(connection);
        let _ = client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name))
            .await;
    }
}

/// A TCP proxy to the database that can be cut (open connections end, new
/// ones are closed at once) and restored.
pub struct Proxy {
    /// Where it listens.
    pub port: u16,
    /// Whether new connections are piped through.
    open: Arc<AtomicBool>,
    /// The accept loop.
    accept: JoinHandle<()>,
    /// The pipes of the connections open now.
    pipes: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let pipes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (accepting, all) = (open.clone(), pipes.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accepting.load(Relaxed) {
                    continue;
                }
                let piped = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                all.lock().unwrap().push(piped);
            }
        });
        Self {
            port,
            open,
            accept,
            pipes,
        }
    }

    pub fn cut(&self) {
        self.open.store(false, Relaxed);
        for pipe in self.pipes.lock().unwrap().drain(..) {
            pipe.abort();
        }
    }

    pub fn restore(&self) {
        self.open.store(true, Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
