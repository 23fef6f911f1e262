//! The SQL of the outbox and inbox, once per database. Everything above this
//! module is the same for PostgreSQL and SQLite; only how a batch is claimed
//! differs:
//!
//! - PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED` in a transaction that
//!   stays open while the batch is published and is committed with the
//!   marks. Another relay skips the locked rows; a relay that dies (its
//!   connection closes) rolls back, so its rows are free again at once.
//! - SQLite: there are no row locks, so a claim is a lease: one `UPDATE …
//!   RETURNING` writes the relay's name and a deadline into the rows it
//!   takes. SQLite runs one writer at a time, so two relays never take the
//!   same row; a relay that dies leaves rows that are free once the lease
//!   has run out. Marks only touch rows whose lease is still the relay's.

use std::future::Future;

use sqlx::{Pool, Postgres, Row as _, Sqlite, Transaction};

/// A row to insert.
pub struct NewRow<'a> {
    pub message_id: &'a str,
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub properties: &'a [u8],
    pub body: &'a [u8],
    pub now_ms: i64,
}

/// A claimed row, to publish.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: i64,
    pub message_id: String,
    pub exchange: String,
    pub routing_key: String,
    pub properties: Vec<u8>,
    pub body: Vec<u8>,
    pub created_at_ms: i64,
    pub attempts: i32,
}

/// What became of a claimed row.
#[derive(Debug, Clone)]
pub enum Mark {
    /// Confirmed by the broker: dispatched at this time.
    Dispatched,
    /// Refused: keep it with this error, try again from this time on.
    Refused { error: String, next_attempt_ms: i64 },
}

/// A claimed batch: its rows, and on PostgreSQL the transaction that holds
/// their locks until the marks are committed.
pub struct Claim<DB: sqlx::Database> {
    pub rows: Vec<Row>,
    pub tx: Option<Transaction<'static, DB>>,
    /// Until when the rows are the relay's (SQLite's lease; `i64::MAX` for
    /// PostgreSQL, whose locks last as long as the transaction).
    pub until_ms: i64,
}

/// What is waiting: rows not yet dispatched, and the creation time of the
/// oldest of them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Backlog {
    pub waiting: i64,
    pub oldest_created_ms: Option<i64>,
}

/// The queries, implemented for each database.
pub trait Store: sqlx::Database + Sized {
    /// Creates the tables and indexes when they are missing.
    #[doc(hidden)]
    fn migrate(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    #[doc(hidden)]
    fn insert(conn: &mut Self::Connection, row: NewRow<'_>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    #[doc(hidden)]
    fn claim(
        pool: &Pool<Self>,
        relay: &str,
        batch: i64,
        now_ms: i64,
        lease_ms: i64,
    ) -> impl Future<Output = Result<Claim<Self>, sqlx::Error>> + Send;

    /// Writes the marks (and commits the claim's transaction); how many
    /// rows were still the relay's to mark.
    #[doc(hidden)]
    fn finish(
        pool: &Pool<Self>,
        claim: Claim<Self>,
        relay: &str,
        marks: &[(i64, Mark)],
        now_ms: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    #[doc(hidden)]
    fn remove_dispatched(pool: &Pool<Self>, before_ms: i64) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    #[doc(hidden)]
    fn remove_inbox(pool: &Pool<Self>, before_ms: i64) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    #[doc(hidden)]
    fn backlog(pool: &Pool<Self>) -> impl Future<Output = Result<Backlog, sqlx::Error>> + Send;

    /// Inserts the inbox row; false when it was there already.
    #[doc(hidden)]
    fn inbox_insert(
        conn: &mut Self::Connection,
        message_id: &str,
        consumer: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

const COLUMNS: &str = "id, message_id, exchange, routing_key, properties, body, created_at, attempts";

fn read_row<R>(row: &R) -> Result<Row, sqlx::Error>
where
    R: sqlx::Row,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(Row {
        id: row.try_get("id")?,
        message_id: row.try_get("message_id")?,
        exchange: row.try_get("exchange")?,
        routing_key: row.try_get("routing_key")?,
        properties: row.try_get("properties")?,
        body: row.try_get("body")?,
        created_at_ms: row.try_get("created_at")?,
        attempts: row.try_get("attempts")?,
    })
}

// Both databases take `$N` placeholders, so the statements that do not
// differ are written once (and run by `statements_alike!`).
const INSERT: &str = "INSERT INTO acemq_outbox \
     (message_id, exchange, routing_key, properties, body, created_at, next_attempt_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $6)";
const REMOVE_DISPATCHED: &str = "DELETE FROM acemq_outbox WHERE dispatched_at IS NOT NULL AND dispatched_at < $1";
const REMOVE_INBOX: &str = "DELETE FROM acemq_inbox WHERE received_at < $1";
const BACKLOG: &str =
    "SELECT COUNT(*) AS waiting, MIN(created_at) AS oldest FROM acemq_outbox WHERE dispatched_at IS NULL";
const INBOX_INSERT: &str = "INSERT INTO acemq_inbox (message_id, consumer, received_at) VALUES ($1, $2, $3) \
     ON CONFLICT (message_id, consumer) DO NOTHING";

/// The methods whose SQL is the same on both databases (both take `$N`
/// placeholders), written once; only the result types differ.
macro_rules! statements_alike {
    () => {
        async fn insert(conn: &mut Self::Connection, row: NewRow<'_>) -> Result<(), sqlx::Error> {
            sqlx::query(INSERT)
                .bind(row.message_id)
                .bind(row.exchange)
                .bind(row.routing_key)
                .bind(row.properties)
                .bind(row.body)
                .bind(row.now_ms)
                .execute(conn)
                .await
                .map(|_| ())
        }

        async fn remove_dispatched(pool: &Pool<Self>, before_ms: i64) -> Result<u64, sqlx::Error> {
            let done = sqlx::query(REMOVE_DISPATCHED)
                .bind(before_ms)
                .execute(pool)
                .await?;
            Ok(done.rows_affected())
        }

        async fn remove_inbox(pool: &Pool<Self>, before_ms: i64) -> Result<u64, sqlx::Error> {
            let done = sqlx::query(REMOVE_INBOX).bind(before_ms).execute(pool).await?;
            Ok(done.rows_affected())
        }

        async fn backlog(pool: &Pool<Self>) -> Result<Backlog, sqlx::Error> {
            let row = sqlx::query(BACKLOG).fetch_one(pool).await?;
            Ok(Backlog {
                waiting: row.try_get("waiting")?,
                oldest_created_ms: row.try_get("oldest")?,
            })
        }

        async fn inbox_insert(
            conn: &mut Self::Connection,
            message_id: &str,
            consumer: &str,
            now_ms: i64,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(INBOX_INSERT)
                .bind(message_id)
                .bind(consumer)
                .bind(now_ms)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }
    };
}

impl Store for Postgres {
    statements_alike!();

    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(include_str!("../../migrations/outbox_postgres.sql"))
            .execute(pool)
            .await
            .map(|_| ())
    }

    async fn claim(
        pool: &Pool<Self>,
        _relay: &str,
        batch: i64,
        now_ms: i64,
        _lease_ms: i64,
    ) -> Result<Claim<Self>, sqlx::Error> {
        let mut tx = pool.begin().await?;
        let sql = format!(
            "SELECT {COLUMNS} FROM acemq_outbox WHERE dispatched_at IS NULL AND next_attempt_at <= $1 \
             ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED"
        );
        let found = sqlx::query(&sql).bind(now_ms).bind(batch).fetch_all(&mut *tx).await?;
        let rows = found.iter().map(read_row).collect::<Result<Vec<_>, _>>()?;
        Ok(Claim {
            rows,
            tx: Some(tx),
            until_ms: i64::MAX,
        })
    }

    async fn finish(
        _pool: &Pool<Self>,
        claim: Claim<Self>,
        _relay: &str,
        marks: &[(i64, Mark)],
        now_ms: i64,
    ) -> Result<u64, sqlx::Error> {
        let Some(mut tx) = claim.tx else {
            return Ok(0);
        };
        let dispatched: Vec<i64> = marks
            .iter()
            .filter(|(_, mark)| matches!(mark, Mark::Dispatched))
            .map(|(id, _)| *id)
            .collect();
        let mut marked = 0;
        if !dispatched.is_empty() {
            marked += sqlx::query("UPDATE acemq_outbox SET dispatched_at = $1, last_error = NULL WHERE id = ANY($2)")
                .bind(now_ms)
                .bind(&dispatched)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        for (id, mark) in marks {
            if let Mark::Refused { error, next_attempt_ms } = mark {
                marked += sqlx::query(
                    "UPDATE acemq_outbox SET attempts = attempts + 1, last_error = $1, next_attempt_at = $2 \
                     WHERE id = $3",
                )
                .bind(error)
                .bind(next_attempt_ms)
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            }
        }
        tx.commit().await?;
        Ok(marked)
    }
}

impl Store for Sqlite {
    statements_alike!();

    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(include_str!("../../migrations/outbox_sqlite.sql"))
            .execute(pool)
            .await
            .map(|_| ())
    }

    async fn claim(
        pool: &Pool<Self>,
        relay: &str,
        batch: i64,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Claim<Self>, sqlx::Error> {
        let until_ms = now_ms.saturating_add(lease_ms);
        let sql = format!(
            "UPDATE acemq_outbox SET claimed_by = $1, claimed_until = $2 WHERE id IN \
             (SELECT id FROM acemq_outbox WHERE dispatched_at IS NULL AND next_attempt_at <= $3 \
              AND (claimed_until IS NULL OR claimed_until <= $3) ORDER BY id LIMIT $4) \
             RETURNING {COLUMNS}"
        );
        let found = sqlx::query(&sql)
            .bind(relay)
            .bind(until_ms)
            .bind(now_ms)
            .bind(batch)
            .fetch_all(pool)
            .await?;
        let mut rows = found.iter().map(read_row).collect::<Result<Vec<_>, _>>()?;
        // RETURNING gives no order; publish in the order of insertion.
        rows.sort_by_key(|row| row.id);
        Ok(Claim {
            rows,
            tx: None,
            until_ms,
        })
    }

    async fn finish(
        pool: &Pool<Self>,
        _claim: Claim<Self>,
        relay: &str,
        marks: &[(i64, Mark)],
        now_ms: i64,
    ) -> Result<u64, sqlx::Error> {
        let mut tx = pool.begin().await?;
        let mut marked = 0;
        // SQLite numbers `$N` parameters in the order they first appear:
        // here that is the order of N.
        for (id, mark) in marks {
            let query = match mark {
                Mark::Dispatched => sqlx::query(
                    "UPDATE acemq_outbox SET dispatched_at = $1, last_error = NULL, claimed_by = NULL, \
                     claimed_until = NULL WHERE id = $2 AND claimed_by = $3",
                )
                .bind(now_ms),
                Mark::Refused { error, next_attempt_ms } => sqlx::query(
                    "UPDATE acemq_outbox SET attempts = attempts + 1, last_error = $1, next_attempt_at = $2, \
                     claimed_by = NULL, claimed_until = NULL WHERE id = $3 AND claimed_by = $4",
                )
                .bind(error.as_str())
                .bind(next_attempt_ms),
            };
            marked += query.bind(id).bind(relay).execute(&mut *tx).await?.rows_affected();
        }
        tx.commit().await?;
        Ok(marked)
    }
}
