//! A small orders service: declares its topology, publishes orders with
//! confirms, and consumes them with retries, a broker-side wait on a rung
//! queue, and a dead letter for the order that never works.
//!
//! `cargo run --example orders` runs it against an in-process acemq-memory
//! broker; with `AMQP_URL=amqp://guest:guest@localhost:5672/` it runs against
//! RabbitMQ instead.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_core::envelope::ERROR_HEADER;
use acemq_core::{consume, fatal, Ack, Config, Conn, Envelope, Error, Message, RetryPolicy, Topology};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u32,
    customer: String,
    total_cents: u64,
}

#[derive(Debug)]
struct PaymentDeclined;

impl std::fmt::Display for PaymentDeclined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("payment service timed out")
    }
}

impl std::error::Error for PaymentDeclined {}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "memory://orders-example".to_string());
    println!("orders: connecting to {}", url.split('@').next_back().unwrap_or(&url));
    let conn = Conn::open(&url, Config::default()).await?;

    // Retries: 200 ms in the consumer, then 400 ms and 800 ms on rung queues
    // in the broker (the threshold is lowered from 30 s so the example is quick).
    let policy = RetryPolicy::exponential(4, Duration::from_millis(200), Duration::ZERO)
        .wait_in_broker_from(Duration::from_millis(400));
    println!("orders: retry schedule {:?}", policy.schedule());
    Topology::new()
        .queue("orders")
        .dead_letters("orders")
        .retries("orders", &policy)
        .declare(&conn)
        .await?;

    let handled = Arc::new(AtomicU32::new(0));
    let done = handled.clone();
    let consumer = consume(&conn, "orders", move |m: Message<OrderPlaced>| {
        let done = done.clone();
        async move {
            let order = &m.payload;
            let attempt = m.envelope.attempt;
            let verdict = match order.order_id {
                // Order 2 fails twice, then goes through.
                2 if attempt < 3 => {
                    let wait = if attempt == 1 {
                        "200 ms in the consumer"
                    } else {
                        "400 ms in the broker, on the rung orders.retry.400ms"
                    };
                    println!("orders: order 2 attempt {attempt}: payment timed out, retrying after {wait}");
                    Ack::retry(PaymentDeclined)
                }
                // Order 3 can never work.
                3 => {
                    println!("orders: order 3 attempt {attempt}: no such customer");
                    Ack::retry(fatal("no customer on this order"))
                }
                _ => {
                    println!(
                        "orders: order {} for {} ({} cents) done on attempt {attempt}",
                        order.order_id, order.customer, order.total_cents
                    );
                    Ack::accept()
                }
            };
            if matches!(verdict, Ack::Accept) || order.order_id == 3 {
                done.fetch_add(1, Ordering::SeqCst);
            }
            verdict
        }
    })
    .retry_with(policy)
    .await?;

    let orders = conn.publisher::<OrderPlaced>("", "orders").mandatory();
    for order_id in 1..=3 {
        let order = OrderPlaced {
            order_id,
            customer: format!("customer-{order_id}"),
            total_cents: 1250 * u64::from(order_id),
        };
        let envelope = Envelope::new().with_correlation_id(format!("checkout-{order_id}"));
        orders.send_envelope(envelope, &order).await?;
        println!("orders: published order {order_id} (confirmed)");
    }

    // A publish nobody can receive is an error at the point of publishing.
    let lost = conn.publisher::<OrderPlaced>("", "no-such-queue").mandatory();
    let nobody = OrderPlaced {
        order_id: 99,
        customer: "nobody".into(),
        total_cents: 0,
    };
    if let Err(err) = lost.send(&nobody).await {
        println!("orders: as expected: {err}");
    }

    // Wait for all three to be settled (order 2 takes about 1.4 s of retries).
    for _ in 0..200 {
        if handled.load(Ordering::SeqCst) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    consumer.close().await?;

    // The dead letter, with the reason, in orders.dlq.
    let admin = conn.consuming_connection().channel().await?;
    while let Some(dead) = admin.basic_get("orders.dlq", false).await? {
        let reason = dead
            .properties
            .as_ref()
            .ok()
            .and_then(|p| p.headers.as_ref())
            .and_then(|h| h.get(ERROR_HEADER))
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string();
        let order: OrderPlaced =
            serde_json::from_slice(&dead.body).map_err(|e| Error::Decode(acemq_core::CodecError::new(e)))?;
        println!("orders: dead letter: order {} ({reason})", order.order_id);
        dead.ack()?;
    }
    conn.close().await?;
    Ok(())
}
