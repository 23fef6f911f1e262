//! The databases the outbox scenarios run on: the private PostgreSQL cluster
//! that `scripts/postgres.sh` starts (found through `ACEMQ_POSTGRES_URL`),
//! and SQLite in a file of its own. Each scenario gets a database nobody else
//! sees (a fresh schema on PostgreSQL, a fresh file for SQLite), so the
//! relays of scenarios running side by side never take each other's rows.
//! Under `CI=true` a PostgreSQL that is not there is a failure; elsewhere its
//! runs are skipped with a loud message.

use std::future::Future;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use acemq_core::outbox::OutboxDatabase;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Pool, Postgres, Row, Sqlite};

use crate::{in_ci, root, unique};

/// What a scenario does to its database besides the outbox: the test's own
/// tables and checks. Implemented for both databases (each says its name
/// as `<DB as sqlx::Database>::NAME`).
pub trait TestDb: OutboxDatabase {
    /// Runs a statement on a connection (inside a transaction: `&mut *tx`).
    fn execute(conn: &mut Self::Connection, sql: &str) -> impl Future<Output = u64> + Send;

    /// Every row of a query, each column read as text (cast it in the SQL:
    /// `CAST(x AS TEXT)`); `None` for NULL.
    fn strings(pool: &Pool<Self>, sql: &str) -> impl Future<Output = Vec<Vec<Option<String>>>> + Send;
}

/// The same statements on both databases (sqlx's types differ, the code does not).
macro_rules! test_db {
    ($($db:ty),*) => {$(
        impl TestDb for $db {
            async fn execute(conn: &mut Self::Connection, sql: &str) -> u64 {
                sqlx::query(sql)
                    .execute(conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
                    .rows_affected()
            }

            async fn strings(pool: &Pool<Self>, sql: &str) -> Vec<Vec<Option<String>>> {
                let rows = sqlx::query(sql)
                    .fetch_all(pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                rows.iter()
                    .map(|row| (0..row.len()).map(|i| row.get::<Option<String>, _>(i)).collect())
                    .collect()
            }
        }
    )*};
}

test_db!(Postgres, Sqlite);

/// Where a scenario's database is, so that another process (a child the
/// test kills) can open the same one.
#[derive(Debug, Clone)]
pub enum Place {
    /// A schema of the private PostgreSQL database.
    Postgres {
        /// The server's URL.
        url: String,
        /// The scenario's schema.
        schema: String,
    },
    /// An SQLite file.
    Sqlite(PathBuf),
}

impl Place {
    /// A PostgreSQL pool on this place (panics for SQLite).
    pub async fn postgres(&self) -> Pool<Postgres> {
        let Place::Postgres { url, schema } = self else {
            panic!("{self:?} is not PostgreSQL");
        };
        let options = PgConnectOptions::from_str(url)
            .unwrap_or_else(|e| panic!("{url}: {e}"))
            .options([("search_path", schema.as_str())]);
        PgPoolOptions::new()
            .max_connections(20)
            .acquire_timeout(Duration::from_secs(20))
            .connect_with(options)
            .await
            .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
    }

    /// An SQLite pool on this place (panics for PostgreSQL): WAL, so that
    /// readers and the one writer do not wait on each other, and a busy
    /// timeout for writers that do.
    pub async fn sqlite(&self) -> Pool<Sqlite> {
        let Place::Sqlite(path) = self else {
            panic!("{self:?} is not SQLite");
        };
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(20));
        SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(20))
            .connect_with(options)
            .await
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
    }
}

/// A fresh PostgreSQL schema of its own, or `None` (loudly) when there is no
/// PostgreSQL outside CI. Panics under `CI=true` when it is missing.
pub async fn postgres() -> Option<(Place, Pool<Postgres>)> {
    let url = match std::env::var("ACEMQ_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => url,
        _ if in_ci() => panic!(
            "ACEMQ_POSTGRES_URL is not set under CI=true: scripts/test.sh must start PostgreSQL \
             (scripts/postgres.sh start)"
        ),
        _ => {
            eprintln!(
                "\n!!!! SKIPPING the PostgreSQL runs: ACEMQ_POSTGRES_URL is not set. Start it with \
                 `scripts/postgres.sh start` and export `scripts/postgres.sh env`, or run `scripts/test.sh`. !!!!\n"
            );
            return None;
        }
    };
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} does not answer: {e}"));
    let schema = unique("t").replace(['-', '.'], "_");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .unwrap_or_else(|e| panic!("CREATE SCHEMA {schema}: {e}"));
    admin.close().await;
    let place = Place::Postgres { url, schema };
    let pool = place.postgres().await;
    Some((place, pool))
}

/// A fresh SQLite file under `target/outbox-tests/`.
pub async fn sqlite() -> (Place, Pool<Sqlite>) {
    let dir = root().join("target").join("outbox-tests");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let place = Place::Sqlite(dir.join(format!("{}.db", unique("outbox"))));
    let pool = place.sqlite().await;
    (place, pool)
}
