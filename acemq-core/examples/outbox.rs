//! The transactional outbox: an order is saved and its event enqueued in one
//! database transaction, a relay publishes what committed, and the billing
//! consumer dedupes on the message id in its own transaction (the inbox).
//! An order whose transaction rolls back never sends its event.
//!
//! `cargo run --example outbox --features outbox` runs it on an SQLite file
//! and an in-process acemq-memory broker; with
//! `AMQP_URL=amqp://guest:guest@localhost:5672/` it uses RabbitMQ instead.

use std::sync::Arc;
use std::time::Duration;

use acemq_core::outbox::{Begin, Inbox, Outbox};
use acemq_core::{consume, Ack, Config, Conn, Envelope, Message, Topology};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Row, SqlitePool};
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: i64,
    total_cents: i64,
}

/// Saves an order and enqueues its event in one transaction; commits only
/// when `commit` (a failed validation rolls both back).
async fn place_order(
    db: &SqlitePool,
    outbox: &Outbox<sqlx::Sqlite>,
    events: &acemq_core::Publisher<OrderPlaced>,
    order: OrderPlaced,
    commit: bool,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
        .bind(order.order_id)
        .bind(order.total_cents)
        .execute(&mut *tx)
        .await?;
    let id = outbox.enqueue(&mut tx, events, Envelope::new(), &order).await?;
    if commit {
        tx.commit().await?;
        println!("outbox: order {} saved, event {id} enqueued", order.order_id);
    } else {
        tx.rollback().await?;
        println!(
            "outbox: order {} rolled back: its event {id} is gone with it",
            order.order_id
        );
    }
    Ok(id)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("acemq-outbox-example-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let db = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, total_cents INTEGER NOT NULL)")
        .execute(&db)
        .await?;
    sqlx::query("CREATE TABLE invoices (order_id INTEGER NOT NULL, total_cents INTEGER NOT NULL)")
        .execute(&db)
        .await?;
    let outbox = Outbox::new(db.clone());
    outbox.migrate().await?;

    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "memory://outbox-example".to_string());
    println!("outbox: connecting to {}", url.split('@').next_back().unwrap_or(&url));
    let conn = Conn::open(&url, Config::default()).await?;
    Topology::new().queue("billing.orders").declare(&conn).await?;
    let events = conn.publisher::<OrderPlaced>("", "billing.orders");

    // Billing: the invoice and the inbox row commit together, so a
    // redelivered event is recognised and billed once.
    let invoiced = Arc::new(Notify::new());
    let billing = {
        let (db, invoiced) = (db.clone(), invoiced.clone());
        consume(&conn, "billing.orders", move |m: Message<OrderPlaced>| {
            let (db, invoiced) = (db.clone(), invoiced.clone());
            async move {
                let work = async {
                    let mut tx = db.begin().await?;
                    if Inbox::try_begin(&mut tx, &m.envelope.id, "billing").await? == Begin::Duplicate {
                        println!("billing: {} seen before, skipped", m.envelope.id);
                        return Ok::<_, Box<dyn std::error::Error + Send + Sync>>(());
                    }
                    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
                        .bind(m.payload.order_id)
                        .bind(m.payload.total_cents)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    println!("billing: invoiced order {} ({})", m.payload.order_id, m.envelope.id);
                    invoiced.notify_one();
                    Ok(())
                };
                match work.await {
                    Ok(()) => Ack::accept(),
                    Err(err) => Ack::retry(err),
                }
            }
        })
        .await?
    };

    let relay = outbox.relay(&conn).poll_interval(Duration::from_millis(20)).start();
    let placed = place_order(
        &db,
        &outbox,
        &events,
        OrderPlaced {
            order_id: 1041,
            total_cents: 2599,
        },
        true,
    )
    .await?;
    place_order(
        &db,
        &outbox,
        &events,
        OrderPlaced {
            order_id: 1042,
            total_cents: 0,
        },
        false,
    )
    .await?;
    tokio::time::timeout(Duration::from_secs(10), invoiced.notified())
        .await
        .map_err(|_| "the invoice did not come within 10 s")?;

    // The same event again (as after a relay died between confirm and mark):
    // the inbox makes it a no-op.
    events
        .send_envelope(
            Envelope {
                id: placed.clone(),
                ..Envelope::new()
            },
            &OrderPlaced {
                order_id: 1041,
                total_cents: 2599,
            },
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    relay.stop().await;
    billing.close().await?;
    conn.close().await?;
    let invoices = sqlx::query("SELECT COUNT(*) AS n FROM invoices").fetch_one(&db).await?;
    let n: i64 = invoices.try_get("n")?;
    println!(
        "outbox: {n} invoice for 1 committed order; {} rows waiting in the outbox",
        outbox.waiting().await?
    );
    db.close().await;
    let _ = std::fs::remove_file(&path);
    if n != 1 {
        return Err(format!("expected 1 invoice, found {n}").into());
    }
    Ok(())
}
