//! A small orders service: declares its queue, publishes orders with
//! confirms (mandatory, so a missing binding is an error, not a silent drop),
//! and reads them back.
//!
//! `cargo run --example orders` runs it against an in-process acemq-memory
//! broker; with `AMQP_URL=amqp://guest:guest@localhost:5672/` it runs against
//! RabbitMQ. (Consuming with retries and dead letters arrives with the
//! consuming side of the API; until then the example reads back with the
//! engine's `basic.get`.)

use acemq_core::{Config, Conn, Envelope, Error};
use amqp_codec::QueueDeclare;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u32,
    customer: String,
    total_cents: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "memory://orders-example".to_string());
    println!("orders: connecting to {}", url.split('@').next_back().unwrap_or(&url));
    let conn = Conn::open(&url, Config::default()).await?;

    // The topology: one durable queue.
    let admin = conn.consuming_connection().channel().await?;
    admin
        .queue_declare(QueueDeclare {
            queue: "orders".into(),
            durable: true,
            ..Default::default()
        })
        .await?;

    // Publish three orders; each send returns once the broker has it.
    let orders = conn.publisher::<OrderPlaced>("", "orders").mandatory();
    for order_id in 1..=3 {
        let order = OrderPlaced {
            order_id,
            customer: format!("customer-{order_id}"),
            total_cents: 1250 * u64::from(order_id),
        };
        let envelope = Envelope::new().with_correlation_id(format!("checkout-{order_id}"));
        let id = envelope.id.clone();
        orders.send_envelope(envelope, &order).await?;
        println!("orders: published order {order_id} as message {id} (confirmed)");
    }

    // A publish nobody can receive is an error at the point of publishing.
    let lost = conn.publisher::<OrderPlaced>("", "no-such-queue").mandatory();
    let order = OrderPlaced {
        order_id: 99,
        customer: "nobody".into(),
        total_cents: 0,
    };
    match lost.send(&order).await {
        Err(err @ Error::Unroutable { .. }) => println!("orders: as expected: {err}"),
        other => println!("orders: unexpected: {other:?}"),
    }

    // Read them back.
    while let Some(message) = admin.basic_get("orders", false).await? {
        let order: OrderPlaced = serde_json::from_slice(&message.body).map_err(|e| Error::Decode(e.to_string()))?;
        let envelope = Envelope::read_from(message.properties.as_ref().expect("our own properties decode"));
        println!(
            "orders: received order {} for {} ({} cents), attempt {}, correlation {:?}",
            order.order_id, order.customer, order.total_cents, envelope.attempt, envelope.correlation_id
        );
        message.ack()?;
    }
    conn.close().await?;
    Ok(())
}
