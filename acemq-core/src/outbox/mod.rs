//! The transactional outbox and inbox (feature `outbox`; statement 27 of
//! `docs/statements.md`), on PostgreSQL or SQLite through `sqlx`.
//!
//! A service that writes to its database and then publishes loses the
//! message if it dies between the two, and publishes for nothing if its
//! transaction rolls back afterwards. With the outbox the message is a row
//! written in the business transaction: it exists if and only if the
//! business change committed. An [`OutboxRelay`] publishes the rows: it
//! claims a batch, publishes each row with its message-id (mandatory,
//! confirmed, on the library channel, riding through a recovery like any
//! send), and marks a row dispatched only after its confirm. A relay that
//! dies between a confirm and its mark leaves the row to be published again:
//! delivery is at least once, and the copy has the same message-id. The
//! [`Inbox`] is where a handler dedupes on that id, in its own transaction.
//!
//! ```
//! use acemq_core::outbox::{Begin, Inbox, Outbox};
//! use acemq_core::{Conn, Config, Envelope, Topology};
//! use sqlx::sqlite::SqlitePoolOptions;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // One connection: each connection to `sqlite::memory:` is a database of its own.
//! let db = SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
//! let outbox = Outbox::new(db.clone());
//! outbox.migrate().await?;
//!
//! let conn = Conn::open("memory://outbox-doc", Config::default()).await?;
//! Topology::new().queue("orders.placed").declare(&conn).await?;
//! let publisher = conn.publisher::<u32>("", "orders.placed");
//!
//! // The business change and the message, in one transaction.
//! let mut tx = db.begin().await?;
//! sqlx::query("CREATE TABLE orders (id INTEGER)").execute(&mut *tx).await?;
//! sqlx::query("INSERT INTO orders VALUES (1041)").execute(&mut *tx).await?;
//! let id = outbox.enqueue(&mut tx, &publisher, Envelope::new(), &1041).await?;
//! tx.commit().await?;
//!
//! // A relay publishes what was committed (here one batch; `start` runs it).
//! let batch = outbox.relay(&conn).run_once().await?;
//! assert_eq!(batch.dispatched, 1);
//!
//! // The handler's side: the work and the inbox row commit together.
//! let mut tx = db.begin().await?;
//! assert_eq!(Inbox::try_begin(&mut tx, &id, "billing").await?, Begin::New);
//! tx.commit().await?;
//! let mut tx = db.begin().await?;
//! assert_eq!(Inbox::try_begin(&mut tx, &id, "billing").await?, Begin::Duplicate);
//! # Ok(()) }
//! ```
//!
//! # The tables
//!
//! [`Outbox::migrate`] creates them when they are missing (the SQL is in
//! `acemq-core/migrations/outbox_postgres.sql` and `outbox_sqlite.sql`, for
//! a service that runs its own migrations). Times are Unix milliseconds
//! (`BIGINT` on PostgreSQL, `INTEGER` on SQLite), read from the
//! database's clock in the statements that write and compare them (never
//! the relay's), so both databases read alike and relays on hosts whose
//! clocks differ agree on leases, due rows and retention.
//!
//! `acemq_outbox`, one row per message:
//!
//! | column | type | meaning |
//! |---|---|---|
//! | `id` | `BIGSERIAL` / `INTEGER` autoincrement | order of insertion; relays publish in this order |
//! | `message_id` | `TEXT` | the message's `message-id` (the envelope's id) |
//! | `exchange`, `routing_key` | `TEXT` | where it goes (the publisher's) |
//! | `properties` | `BYTEA` / `BLOB` | the AMQP basic properties as they go on the wire: flag word, then the present fields (content-type, delivery mode, timestamp, message-id, correlation-id, the `x-acemq-*` headers with their types) |
//! | `body` | `BYTEA` / `BLOB` | the encoded payload |
//! | `created_at` | ms | when it was enqueued |
//! | `next_attempt_at` | ms | not published before this (a refused row backs off) |
//! | `attempts` | `INTEGER` | how often it was refused |
//! | `last_error` | `TEXT`, null | why it was last refused (e.g. "… was returned: 312 NO_ROUTE") |
//! | `claimed_by`, `claimed_until` | `TEXT`, ms, null | SQLite's lease: which relay holds the row, until when |
//! | `dispatched_at` | ms, null | when its confirm came; null while waiting |
//!
//! `acemq_inbox`, one row per message handled by a consumer:
//!
//! | column | type | meaning |
//! |---|---|---|
//! | `message_id`, `consumer` | `TEXT`, `TEXT` | the primary key |
//! | `received_at` | ms | when it was first handled |
//!
//! Dispatched rows and inbox rows are removed by the relays after
//! [`OutboxRelay::retention`] and [`OutboxRelay::inbox_retention`].
//!
//! # Claims
//!
//! On PostgreSQL a relay claims with `SELECT … FOR UPDATE SKIP LOCKED` in a
//! transaction held open while it publishes the batch, and commits the
//! marks in it: relays never wait on each other, never publish a row at the
//! same time, and the rows of a relay that dies are free at once. SQLite
//! has no row locks: a claim is a lease ([`OutboxRelay::lease`]) written
//! into the rows by one `UPDATE … RETURNING` (SQLite has one writer at a
//! time); a relay publishes a row only while its lease has at least
//! `publish_timeout` to run, awaits confirms only while the lease lasts (a
//! row whose confirm has not come by then stays unmarked, for a later
//! claim), and marks a row only under the same lease, not run out; a dead
//! relay's rows are free when the lease ends.
//!
//! # Order
//!
//! A relay publishes a batch in the order the rows were inserted, and
//! batches one after another. With several relays, or a refused row that
//! waits out its back-off, later rows can go before earlier ones: consumers
//! that need an order must not rely on the outbox for it.
//!
//! # Metrics
//!
//! `acemq_outbox_total{outcome=dispatched|refused}`, the gauges
//! `acemq_outbox_waiting` (rows not yet dispatched) and
//! `acemq_outbox_lag_seconds` (age of the oldest of them), and
//! `acemq_outbox_removed_total{table=outbox|inbox}`.

mod store;

use std::time::Duration;

use acemq_codec::{BasicProperties, BasicPublish};
use bytes::{Bytes, BytesMut};
use serde::Serialize;
use sqlx::{Pool, Transaction};
use tokio::sync::watch;

use crate::codec::Codec;
use crate::conn::Conn;
use crate::envelope::Envelope;
use crate::error::Error;
use crate::publish::Publisher;
use store::{Mark, NewRow, Store};

/// `acemq_outbox_total{outcome=dispatched|refused}`: rows a relay published
/// and marked, and rows the broker (or the connection) refused.
pub const OUTBOX_TOTAL: &str = "acemq_outbox_total";
/// `acemq_outbox_waiting`: rows not yet dispatched, as a relay last counted.
pub const OUTBOX_WAITING: &str = "acemq_outbox_waiting";
/// `acemq_outbox_lag_seconds`: how long the oldest waiting row has waited.
pub const OUTBOX_LAG_SECONDS: &str = "acemq_outbox_lag_seconds";
/// `acemq_outbox_removed_total{table=outbox|inbox}`: rows removed after
/// their retention.
pub const OUTBOX_REMOVED_TOTAL: &str = "acemq_outbox_removed_total";

/// A database the outbox runs on: [`sqlx::Postgres`] or [`sqlx::Sqlite`].
pub trait OutboxDatabase: Store {}
impl OutboxDatabase for sqlx::Postgres {}
impl OutboxDatabase for sqlx::Sqlite {}

/// An outbox or inbox failure.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The database refused or could not be reached.
    #[error("outbox database: {0}")]
    Database(#[from] sqlx::Error),
    /// The payload could not be encoded.
    #[error("cannot enqueue: {0}")]
    Message(#[source] Error),
    /// The properties could not be encoded (a header table too deep, a
    /// string too long for AMQP).
    #[error("cannot enqueue: {0}")]
    Properties(#[from] acemq_codec::EncodeError),
}

/// The outbox of one database: enqueues messages in the caller's
/// transaction, and makes the relays that publish them.
#[derive(Debug)]
pub struct Outbox<DB: OutboxDatabase> {
    pool: Pool<DB>,
}

impl<DB: OutboxDatabase> Clone for Outbox<DB> {
    fn clone(&self) -> Self {
        Outbox {
            pool: self.pool.clone(),
        }
    }
}

impl<DB: OutboxDatabase> Outbox<DB> {
    /// The outbox in the database of `pool`.
    pub fn new(pool: Pool<DB>) -> Self {
        Outbox { pool }
    }

    /// Creates `acemq_outbox` and `acemq_inbox` (and their indexes) when
    /// they are missing. Run it once at start-up, not from several
    /// processes at the same instant (PostgreSQL's `CREATE … IF NOT EXISTS`
    /// is not safe against itself).
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        DB::migrate(&self.pool).await.map_err(OutboxError::from)
    }

    /// Stores the message `publisher` would send for `envelope` and
    /// `payload` (same exchange, routing key, properties and body) in the
    /// transaction `tx`, to be published by a relay once `tx` commits.
    /// Returns its message-id. Nothing is published if `tx` rolls back.
    /// The relay's publish is always mandatory, whatever the publisher's
    /// setting: a row that reaches no queue stays in the table, refused.
    pub async fn enqueue<T: Serialize, C: Codec>(
        &self,
        tx: &mut Transaction<'_, DB>,
        publisher: &Publisher<T, C>,
        envelope: Envelope,
        payload: &T,
    ) -> Result<String, OutboxError> {
        let (publish, properties, body) = publisher.message(&envelope, payload).map_err(OutboxError::Message)?;
        let mut wire = BytesMut::with_capacity(128);
        properties.encode(&mut wire)?;
        let (exchange, routing_key) = (publish.exchange.to_string(), publish.routing_key.to_string());
        let row = NewRow {
            message_id: &envelope.id,
            exchange: &exchange,
            routing_key: &routing_key,
            properties: &wire,
            body: &body,
        };
        DB::insert(&mut **tx, row).await?;
        Ok(envelope.id)
    }

    /// A relay that publishes this outbox's rows through `conn`, with the
    /// default settings (see its methods); [`OutboxRelay::start`] runs it.
    pub fn relay(&self, conn: &Conn) -> OutboxRelay<DB> {
        OutboxRelay {
            outbox: self.clone(),
            conn: conn.clone(),
            name: format!("relay-{}", uuid::Uuid::new_v4()),
            batch: 100,
            poll: Duration::from_millis(100),
            lease: Duration::from_secs(120),
            retry_delay: Duration::from_secs(1),
            retry_delay_max: Duration::from_secs(300),
            retention: Duration::from_secs(7 * 24 * 3600),
            inbox_retention: Duration::from_secs(7 * 24 * 3600),
            cleanup_every: Duration::from_secs(60),
        }
    }

    /// How many rows wait to be dispatched (refused ones included).
    pub async fn waiting(&self) -> Result<u64, OutboxError> {
        let backlog = DB::backlog(&self.pool).await?;
        Ok(u64::try_from(backlog.waiting).unwrap_or(0))
    }
}

/// What [`Inbox::try_begin`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// The first time this consumer handles this message: do the work in
    /// the same transaction.
    New,
    /// Handled (and committed) before: skip the work, ack the message.
    Duplicate,
}

/// The inbox: which messages each consumer has handled, recorded in the
/// handler's own transaction, so that the work and the record commit or
/// roll back together: deduplication on message-id, as an API.
#[derive(Debug, Clone, Copy)]
pub struct Inbox;

impl Inbox {
    /// Records that `consumer` handles `message_id` in `tx`: [`Begin::New`]
    /// the first time, [`Begin::Duplicate`] when a committed transaction
    /// recorded it before. On PostgreSQL a concurrent transaction that
    /// recorded the same message makes this wait for its outcome.
    pub async fn try_begin<DB: OutboxDatabase>(
        tx: &mut Transaction<'_, DB>,
        message_id: &str,
        consumer: &str,
    ) -> Result<Begin, OutboxError> {
        let new = DB::inbox_insert(&mut **tx, message_id, consumer).await?;
        Ok(if new { Begin::New } else { Begin::Duplicate })
    }
}

/// Publishes an outbox's rows: claims a batch, publishes each row
/// (mandatory, confirmed, on the library channel), marks each dispatched
/// after its confirm or refused with its error, and backs a refused row
/// off. From [`Outbox::relay`]; several relays may run on one table.
#[derive(Debug, Clone)]
pub struct OutboxRelay<DB: OutboxDatabase> {
    outbox: Outbox<DB>,
    conn: Conn,
    name: String,
    batch: u32,
    poll: Duration,
    lease: Duration,
    retry_delay: Duration,
    retry_delay_max: Duration,
    retention: Duration,
    inbox_retention: Duration,
    cleanup_every: Duration,
}

/// What one batch of a relay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayBatch {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows published, confirmed and marked dispatched.
    pub dispatched: usize,
    /// Rows refused (kept with their error, backed off).
    pub refused: usize,
    /// Rows left unmarked for a later claim: their SQLite lease would have
    /// run out under their publish, or ran out while their confirm was
    /// awaited (they may have arrived: a later claim publishes them again,
    /// with the same message-id).
    pub unmarked: usize,
}

impl<DB: OutboxDatabase> OutboxRelay<DB> {
    /// Its name in SQLite's leases and in logs (default `relay-<uuid>`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Rows claimed at once (default 100), published in one window.
    pub fn batch(mut self, rows: u32) -> Self {
        self.batch = rows.max(1);
        self
    }

    /// How long an idle relay waits before looking again (default 100 ms).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// SQLite's lease on claimed rows (default 2 min), on the database's
    /// clock. A row is published only while its lease has more than the
    /// connection's `publish_timeout` left; confirms are awaited only while
    /// it lasts (a row whose confirm has not come when it ends stays
    /// unmarked, for a later claim); a mark is written only under the same
    /// lease, not run out. A dead relay's rows wait this long.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The back-off of a refused row: `first` after the first refusal,
    /// doubling up to `max` (defaults 1 s and 5 min).
    pub fn retry_delay(mut self, first: Duration, max: Duration) -> Self {
        self.retry_delay = first;
        self.retry_delay_max = max.max(first);
        self
    }

    /// How long dispatched rows are kept (default 7 days).
    pub fn retention(mut self, keep: Duration) -> Self {
        self.retention = keep;
        self
    }

    /// How long inbox rows are kept (default 7 days): a redelivery older
    /// than that is no longer recognised as a duplicate.
    pub fn inbox_retention(mut self, keep: Duration) -> Self {
        self.inbox_retention = keep;
        self
    }

    /// How often the relay removes rows past their retention (default 1 min).
    pub fn cleanup_every(mut self, every: Duration) -> Self {
        self.cleanup_every = every;
        self
    }

    /// Runs the relay in a task until [`RelayHandle::stop`] (or until the
    /// handle is dropped, which aborts it).
    pub fn start(self) -> RelayHandle {
        let (stop, stopping) = watch::channel(false);
        let task = tokio::spawn(self.run(stopping));
        RelayHandle { stop, task: Some(task) }
    }

    async fn run(self, mut stopping: watch::Receiver<bool>) {
        let mut last_cleanup = tokio::time::Instant::now();
        let mut failing = Duration::ZERO;
        while !*stopping.borrow() {
            let idle = match self.run_once().await {
                Ok(batch) => {
                    failing = Duration::ZERO;
                    batch.claimed == 0
                }
                Err(err) => {
                    failing = (failing * 2).clamp(self.poll, self.retry_delay_max);
                    tracing::warn!(relay = %self.name, %err, retry_in = ?failing, "outbox relay: batch failed");
                    tokio::select! {
                        _ = tokio::time::sleep(failing) => {}
                        _ = stopping.changed() => {}
                    }
                    continue;
                }
            };
            if last_cleanup.elapsed() >= self.cleanup_every {
                last_cleanup = tokio::time::Instant::now();
                if let Err(err) = self.clean_up().await {
                    tracing::warn!(relay = %self.name, %err, "outbox relay: removing old rows failed");
                }
            }
            if idle {
                tokio::select! {
                    _ = tokio::time::sleep(self.poll) => {}
                    _ = stopping.changed() => {}
                }
            }
        }
    }

    /// One batch: claims up to [`OutboxRelay::batch`] rows that are due,
    /// publishes them, waits for every confirm and marks each row. Updates
    /// the waiting and lag gauges.
    pub async fn run_once(&self) -> Result<RelayBatch, OutboxError> {
        let pool = &self.outbox.pool;
        let claimed_at = tokio::time::Instant::now();
        let claim = DB::claim(pool, &self.name, i64::from(self.batch), millis(self.lease)).await?;
        let mut batch = RelayBatch {
            claimed: claim.rows.len(),
            ..RelayBatch::default()
        };
        if claim.rows.is_empty() {
            drop(claim);
            self.measure().await?;
            return Ok(batch);
        }
        // The lease, counted down on this relay's monotonic clock from
        // before the claim (so never later than on the database's), less
        // a tenth kept for writing the marks.
        let lease_ends = claim.lease_left_ms.map(|left| {
            let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
            claimed_at + left - left / 10
        });
        let marks = self.publish(&claim.rows, lease_ends).await;
        for (_, mark) in &marks {
            match mark {
                Mark::Dispatched => batch.dispatched += 1,
                Mark::Refused { .. } => batch.refused += 1,
            }
        }
        batch.unmarked = batch.claimed - batch.dispatched - batch.refused;
        DB::finish(pool, claim, &self.name, &marks).await?;
        metrics::counter!(OUTBOX_TOTAL, "outcome" => "dispatched").increment(batch.dispatched as u64);
        metrics::counter!(OUTBOX_TOTAL, "outcome" => "refused").increment(batch.refused as u64);
        self.measure().await?;
        Ok(batch)
    }

    /// Publishes the rows as one window: every row written, then every
    /// confirm awaited, all before `lease_ends` (SQLite's lease; none on
    /// PostgreSQL). A row whose lease would run out under its publish is
    /// left out, and one whose confirm has not come when the lease ends is
    /// left unmarked: either is claimed again later.
    async fn publish(&self, rows: &[store::Row], lease_ends: Option<tokio::time::Instant>) -> Vec<(i64, Mark)> {
        let publish_timeout = self.conn.config().publish_timeout;
        let mut written = Vec::with_capacity(rows.len());
        let mut marks = Vec::with_capacity(rows.len());
        for row in rows {
            if lease_ends.is_some_and(|end| tokio::time::Instant::now() + publish_timeout >= end) {
                tracing::debug!(relay = %self.name, message_id = %row.message_id, "lease too short to publish; left for later");
                continue;
            }
            let outcome = match row_message(row) {
                Ok((publish, properties, body)) => self
                    .conn
                    .write_library(publish, properties, body, row.message_id.clone())
                    .await
                    .map_err(|err| err.to_string()),
                Err(err) => Err(err),
            };
            match outcome {
                Ok(write) => written.push((row, write)),
                Err(error) => marks.push((row.id, self.refused(row, error))),
            }
        }
        for (row, write) in written {
            let confirmed = write.confirmed(&self.conn);
            let confirmed = match lease_ends {
                Some(end) => match tokio::time::timeout_at(end, confirmed).await {
                    Ok(confirmed) => confirmed,
                    Err(_) => {
                        tracing::warn!(relay = %self.name, message_id = %row.message_id, "lease ran out before the confirm; the row is left for a later claim");
                        continue;
                    }
                },
                None => confirmed.await,
            };
            let mark = match confirmed {
                Ok(_) => Mark::Dispatched,
                Err(err) => self.refused(row, err.to_string()),
            };
            marks.push((row.id, mark));
        }
        marks
    }

    fn refused(&self, row: &store::Row, error: String) -> Mark {
        let refusals = u32::try_from(row.attempts).unwrap_or(0);
        let delay = self
            .retry_delay
            .saturating_mul(2u32.saturating_pow(refusals.min(20)))
            .min(self.retry_delay_max);
        tracing::warn!(relay = %self.name, message_id = %row.message_id, attempts = refusals + 1, %error, retry_in = ?delay, "outbox row refused");
        Mark::Refused {
            error,
            retry_in_ms: millis(delay),
        }
    }

    /// Updates the waiting and lag gauges.
    async fn measure(&self) -> Result<(), OutboxError> {
        let backlog = DB::backlog(&self.outbox.pool).await?;
        metrics::gauge!(OUTBOX_WAITING).set(backlog.waiting as f64);
        let lag = backlog
            .oldest_age_ms
            .map(|age| age.max(0) as f64 / 1000.0)
            .unwrap_or(0.0);
        metrics::gauge!(OUTBOX_LAG_SECONDS).set(lag);
        Ok(())
    }

    /// Removes dispatched rows and inbox rows past their retention; how
    /// many of each.
    pub async fn clean_up(&self) -> Result<(u64, u64), OutboxError> {
        let pool = &self.outbox.pool;
        let outbox = DB::remove_dispatched(pool, millis(self.retention)).await?;
        let inbox = DB::remove_inbox(pool, millis(self.inbox_retention)).await?;
        metrics::counter!(OUTBOX_REMOVED_TOTAL, "table" => "outbox").increment(outbox);
        metrics::counter!(OUTBOX_REMOVED_TOTAL, "table" => "inbox").increment(inbox);
        Ok((outbox, inbox))
    }
}

/// A running relay (from [`OutboxRelay::start`]). Dropping it aborts the
/// relay where it is, as a crash would: rows it had claimed are published
/// again by another relay (at once on PostgreSQL, after the lease on SQLite).
#[derive(Debug)]
pub struct RelayHandle {
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RelayHandle {
    /// Stops the relay after the batch it is on (its rows are marked) and
    /// waits for it.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The publish method, properties and body of a stored row; the message-id
/// is the row's.
fn row_message(row: &store::Row) -> Result<(BasicPublish, BasicProperties, Bytes), String> {
    let salvaged = BasicProperties::salvage(&row.properties);
    if !salvaged.lost.is_empty() {
        return Err(format!(
            "the stored properties do not decode (lost: {})",
            salvaged.lost.join(", ")
        ));
    }
    let mut properties = salvaged.properties;
    properties.message_id = Some(row.message_id.as_str().into());
    let publish = BasicPublish {
        exchange: row.exchange.as_str().into(),
        routing_key: row.routing_key.as_str().into(),
        mandatory: true,
        ..Default::default()
    };
    Ok((publish, properties, Bytes::from(row.body.clone())))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
