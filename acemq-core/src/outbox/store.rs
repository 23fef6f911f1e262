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
//!   has run out. Marks only touch rows whose lease is still the relay's:
//!   the same lease (relay and deadline), not yet run out.
//!
//! Every time the tables hold (creation, next attempt, lease, dispatch,
//! inbox receipt) and every comparison with "now" (due rows, leases,
//! retention, lag) is the database's clock, read in the statement, never
//! the relay's: relays on hosts whose clocks differ agree on who holds a
//! lease and on what is due.

use std::future::Future;

use sqlx::{Pool, Postgres, Row as _, Sqlite, Transaction};

/// A row to insert.
pub struct NewRow<'a> {
    pub message_id: &'a str,
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub properties: &'a [u8],
    pub body: &'a [u8],
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
    /// Refused: keep it with this error, try again this long from now
    /// (the database's now).
    Refused { error: String, retry_in_ms: i64 },
}

/// A claimed batch: its rows, and on PostgreSQL the transaction that holds
/// their locks until the marks are committed.
pub struct Claim<DB: sqlx::Database> {
    pub rows: Vec<Row>,
    pub tx: Option<Transaction<'static, DB>>,
    /// Until when the rows are the relay's, on the database's clock
    /// (SQLite's lease; `i64::MAX` for PostgreSQL, whose locks last as long
    /// as the transaction).
    pub until_ms: i64,
    /// How long the lease had to run when it was taken (`None` for
    /// PostgreSQL): the relay counts it down on its own monotonic clock.
    pub lease_left_ms: Option<i64>,
}

/// What is waiting: rows not yet dispatched, and how long the oldest of
/// them has waited (on the database's clock).
#[derive(Debug, Clone, Copy, Default)]
pub struct Backlog {
    pub waiting: i64,
    pub oldest_age_ms: Option<i64>,
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
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Removes rows dispatched more than `keep_ms` ago.
    #[doc(hidden)]
    fn remove_dispatched(pool: &Pool<Self>, keep_ms: i64) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Removes inbox rows received more than `keep_ms` ago.
    #[doc(hidden)]
    fn remove_inbox(pool: &Pool<Self>, keep_ms: i64) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    #[doc(hidden)]
    fn backlog(pool: &Pool<Self>) -> impl Future<Output = Result<Backlog, sqlx::Error>> + Send;

    /// Inserts the inbox row; false when it was there already.
    #[doc(hidden)]
    fn inbox_insert(
        conn: &mut Self::Connection,
        message_id: &str,
        consumer: &str,
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

/// The database's clock in Unix milliseconds, as an SQL expression.
macro_rules! postgres_now {
    () => {
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    };
}
macro_rules! sqlite_now {
    () => {
        "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    };
}

/// The methods whose SQL is the same on both databases (both take `$N`
/// placeholders) but for the expression of the clock, `$now`, written
/// once; only the result types differ.
macro_rules! statements_alike {
    ($now:expr) => {
        async fn insert(conn: &mut Self::Connection, row: NewRow<'_>) -> Result<(), sqlx::Error> {
            const INSERT: &str = concat!(
                "INSERT INTO acemq_outbox \
                 (message_id, exchange, routing_key, properties, body, created_at, next_attempt_at) \
                 SELECT $1, $2, $3, $4, $5, now, now FROM (SELECT ",
                $now,
                " AS now) AS clock"
            );
            sqlx::query(INSERT)
                .bind(row.message_id)
                .bind(row.exchange)
                .bind(row.routing_key)
                .bind(row.properties)
                .bind(row.body)
                .execute(conn)
                .await
                .map(|_| ())
        }

        async fn remove_dispatched(pool: &Pool<Self>, keep_ms: i64) -> Result<u64, sqlx::Error> {
            const REMOVE_DISPATCHED: &str = concat!(
                "DELETE FROM acemq_outbox WHERE dispatched_at IS NOT NULL AND dispatched_at < ",
                $now,
                " - $1"
            );
            let done = sqlx::query(REMOVE_DISPATCHED).bind(keep_ms).execute(pool).await?;
            Ok(done.rows_affected())
        }

        async fn remove_inbox(pool: &Pool<Self>, keep_ms: i64) -> Result<u64, sqlx::Error> {
            const REMOVE_INBOX: &str = concat!("DELETE FROM acemq_inbox WHERE received_at < ", $now, " - $1");
            let done = sqlx::query(REMOVE_INBOX).bind(keep_ms).execute(pool).await?;
            Ok(done.rows_affected())
        }

        async fn backlog(pool: &Pool<Self>) -> Result<Backlog, sqlx::Error> {
            const BACKLOG: &str = concat!(
                "SELECT COUNT(*) AS waiting, ",
                $now,
                " - MIN(created_at) AS oldest_age FROM acemq_outbox WHERE dispatched_at IS NULL"
            );
            let row = sqlx::query(BACKLOG).fetch_one(pool).await?;
            Ok(Backlog {
                waiting: row.try_get("waiting")?,
                oldest_age_ms: row.try_get("oldest_age")?,
            })
        }

        async fn inbox_insert(
            conn: &mut Self::Connection,
            message_id: &str,
            consumer: &str,
        ) -> Result<bool, sqlx::Error> {
            const INBOX_INSERT: &str = concat!(
                "INSERT INTO acemq_inbox (message_id, consumer, received_at) VALUES ($1, $2, ",
                $now,
                ") ON CONFLICT (message_id, consumer) DO NOTHING"
            );
            let done = sqlx::query(INBOX_INSERT)
                .bind(message_id)
                .bind(consumer)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }
    };
}

impl Store for Postgres {
    statements_alike!(postgres_now!());

    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(include_str!("../../migrations/outbox_postgres.sql"))
            .execute(pool)
            .await
            .map(|_| ())
    }

    async fn claim(pool: &Pool<Self>, _relay: &str, batch: i64, _lease_ms: i64) -> Result<Claim<Self>, sqlx::Error> {
        let mut tx = pool.begin().await?;
        let sql = format!(
            "SELECT {COLUMNS} FROM acemq_outbox WHERE dispatched_at IS NULL AND next_attempt_at <= {} \
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
            postgres_now!()
        );
        let found = sqlx::query(&sql).bind(batch).fetch_all(&mut *tx).await?;
        let rows = found.iter().map(read_row).collect::<Result<Vec<_>, _>>()?;
        Ok(Claim {
            rows,
            tx: Some(tx),
            until_ms: i64::MAX,
            lease_left_ms: None,
        })
    }

    async fn finish(
        _pool: &Pool<Self>,
        claim: Claim<Self>,
        _relay: &str,
        marks: &[(i64, Mark)],
    ) -> Result<u64, sqlx::Error> {
        // The rows are locked by the claim's transaction: while it is open
        // they are this relay's, and if its connection died the commit fails.
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
            let sql = format!(
                "UPDATE acemq_outbox SET dispatched_at = {}, last_error = NULL WHERE id = ANY($1)",
                postgres_now!()
            );
            marked += sqlx::query(&sql)
                .bind(&dispatched)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        for (id, mark) in marks {
            if let Mark::Refused { error, retry_in_ms } = mark {
                let sql = format!(
                    "UPDATE acemq_outbox SET attempts = attempts + 1, last_error = $1, \
                     next_attempt_at = {} + $2 WHERE id = $3",
                    postgres_now!()
                );
                marked += sqlx::query(&sql)
                    .bind(error)
                    .bind(retry_in_ms)
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
    statements_alike!(sqlite_now!());

    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(include_str!("../../migrations/outbox_sqlite.sql"))
            .execute(pool)
            .await
            .map(|_| ())
    }

    async fn claim(pool: &Pool<Self>, relay: &str, batch: i64, lease_ms: i64) -> Result<Claim<Self>, sqlx::Error> {
        // One reading of the database's clock for the whole claim: the
        // lease's deadline is the same in every row, and marks match it.
        let mut conn = pool.acquire().await?;
        let now_ms: i64 = sqlx::query_scalar(concat!("SELECT ", sqlite_now!()))
            .fetch_one(&mut *conn)
            .await?;
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
            .fetch_all(&mut *conn)
            .await?;
        let mut rows = found.iter().map(read_row).collect::<Result<Vec<_>, _>>()?;
        // RETURNING gives no order; publish in the order of insertion.
        rows.sort_by_key(|row| row.id);
        Ok(Claim {
            rows,
            tx: None,
            until_ms,
            lease_left_ms: Some(lease_ms),
        })
    }

    async fn finish(
        pool: &Pool<Self>,
        claim: Claim<Self>,
        relay: &str,
        marks: &[(i64, Mark)],
    ) -> Result<u64, sqlx::Error> {
        const DISPATCHED: &str = concat!(
            "UPDATE acemq_outbox SET dispatched_at = ",
            sqlite_now!(),
            ", last_error = NULL, claimed_by = NULL, claimed_until = NULL \
             WHERE id = $1 AND claimed_by = $2 AND claimed_until = $3 AND claimed_until > ",
            sqlite_now!()
        );
        const REFUSED: &str = concat!(
            "UPDATE acemq_outbox SET attempts = attempts + 1, last_error = $1, next_attempt_at = ",
            sqlite_now!(),
            " + $2, claimed_by = NULL, claimed_until = NULL \
             WHERE id = $3 AND claimed_by = $4 AND claimed_until = $5 AND claimed_until > ",
            sqlite_now!()
        );
        let mut tx = pool.begin().await?;
        let mut marked = 0;
        // A mark holds only under the lease this claim took (this relay,
        // this deadline) while it has not run out on the database's clock:
        // a row whose lease ended may be another relay's (or this relay's
        // next claim's) by now. SQLite numbers `$N` parameters in the order
        // they first appear: here that is the order of N.
        for (id, mark) in marks {
            let query = match mark {
                Mark::Dispatched => sqlx::query(DISPATCHED),
                Mark::Refused { error, retry_in_ms } => sqlx::query(REFUSED).bind(error.as_str()).bind(retry_in_ms),
            };
            marked += query
                .bind(id)
                .bind(relay)
                .bind(claim.until_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(marked)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::sqlite::SqlitePoolOptions;

    use super::*;

    async fn sqlite_with_one_row() -> Pool<Sqlite> {
        // One connection: each connection to `sqlite::memory:` is a database of its own.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        Sqlite::migrate(&pool).await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let row = NewRow {
            message_id: "m-1",
            exchange: "",
            routing_key: "q",
            properties: &[0, 0],
            body: b"1",
        };
        Sqlite::insert(&mut conn, row).await.unwrap();
        pool
    }

    async fn dispatched(pool: &Pool<Sqlite>) -> bool {
        let at: Option<i64> = sqlx::query_scalar("SELECT dispatched_at FROM acemq_outbox")
            .fetch_one(pool)
            .await
            .unwrap();
        at.is_some()
    }

    #[tokio::test]
    async fn a_mark_is_written_only_under_the_same_lease_before_it_runs_out() {
        let pool = sqlite_with_one_row().await;
        // Marked in time: written.
        let claim = Sqlite::claim(&pool, "a", 10, 60_000).await.unwrap();
        assert_eq!(claim.rows.len(), 1);
        let id = claim.rows[0].id;
        let refused = Mark::Refused {
            error: "nope".into(),
            retry_in_ms: 0,
        };
        assert_eq!(Sqlite::finish(&pool, claim, "a", &[(id, refused)]).await.unwrap(), 1);

        // A lease that ran out on the database's clock: the mark is not written.
        let claim = Sqlite::claim(&pool, "a", 10, 30).await.unwrap();
        assert_eq!(claim.rows.len(), 1);
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(
            Sqlite::finish(&pool, claim, "a", &[(id, Mark::Dispatched)])
                .await
                .unwrap(),
            0
        );
        assert!(!dispatched(&pool).await);

        // Another relay took the row after the lease ran out: the first
        // relay's late mark touches nothing, the second's goes through.
        let first = Sqlite::claim(&pool, "a", 10, 30).await.unwrap();
        tokio::time::sleep(Duration::from_millis(80)).await;
        let second = Sqlite::claim(&pool, "b", 10, 60_000).await.unwrap();
        assert_eq!(second.rows.len(), 1);
        assert_eq!(
            Sqlite::finish(&pool, first, "a", &[(id, Mark::Dispatched)])
                .await
                .unwrap(),
            0
        );
        assert!(!dispatched(&pool).await);

        // The same relay's own later lease is another lease: a mark of the
        // earlier claim does not count under it.
        assert_eq!(Sqlite::finish(&pool, second, "b", &[]).await.unwrap(), 0);
        sqlx::query("UPDATE acemq_outbox SET claimed_by = NULL, claimed_until = NULL")
            .execute(&pool)
            .await
            .unwrap();
        let earlier = Sqlite::claim(&pool, "c", 10, 30).await.unwrap();
        tokio::time::sleep(Duration::from_millis(80)).await;
        let later = Sqlite::claim(&pool, "c", 10, 60_000).await.unwrap();
        assert_eq!(
            Sqlite::finish(&pool, earlier, "c", &[(id, Mark::Dispatched)])
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            Sqlite::finish(&pool, later, "c", &[(id, Mark::Dispatched)])
                .await
                .unwrap(),
            1
        );
        assert!(dispatched(&pool).await);
    }

    #[tokio::test]
    async fn leases_due_rows_and_retention_follow_the_database_clock() {
        let pool = sqlite_with_one_row().await;
        let db_now: i64 = sqlx::query_scalar(concat!("SELECT ", sqlite_now!()))
            .fetch_one(&pool)
            .await
            .unwrap();
        let (created, due): (i64, i64) = sqlx::query_as("SELECT created_at, next_attempt_at FROM acemq_outbox")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(
            (db_now - created).abs() < 5_000,
            "created_at {created} is the database's now {db_now}"
        );
        assert_eq!(created, due);
        // The lease is the database's now plus the lease.
        let claim = Sqlite::claim(&pool, "a", 10, 60_000).await.unwrap();
        assert!((claim.until_ms - (db_now + 60_000)).abs() < 5_000);
        let id = claim.rows[0].id;
        Sqlite::finish(&pool, claim, "a", &[(id, Mark::Dispatched)])
            .await
            .unwrap();
        // Dispatched now on the database's clock: kept for a retention of a
        // minute, removed once the database's clock says it is older.
        assert_eq!(Sqlite::remove_dispatched(&pool, 60_000).await.unwrap(), 0);
        sqlx::query("UPDATE acemq_outbox SET dispatched_at = dispatched_at - 120000")
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(Sqlite::remove_dispatched(&pool, 60_000).await.unwrap(), 1);
    }
}
