//! The hops acemq publishes for you: a three-stage pipeline, a
//! routing slip, and a message scheduled through the broker's delay ladder.
//!
//! `cargo run --example pipeline` runs against an in-process acemq-memory
//! broker; with `AMQP_URL=amqp://guest:guest@localhost:5672/` against RabbitMQ.

use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_core::pipeline::{Pipeline, RoutingSlip, SlipAllowList};
use acemq_core::schedule::Scheduler;
use acemq_core::{consume, Ack, Config, Conn, Envelope, Error, Message, Topology};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u32,
    items: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Priced {
    id: u32,
    cents: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "memory://pipeline-example".to_string());
    println!("pipeline: connecting to {}", url.split('@').next_back().unwrap_or(&url));
    let conn = Conn::open(&url, Config::default()).await?;
    let (done_tx, mut done) = mpsc::unbounded_channel::<String>();

    // 1. A pipeline: parse -> price -> ship, a queue per stage, each with
    //    its dead letters; every output is a confirmed hop.
    let shipped = done_tx.clone();
    let pipeline = Pipeline::new(&conn)
        .stage("example.parse", |m: Message<String>| async move {
            let items = m.payload.split(',').count() as u32;
            Ack::then(&Order { id: 1, items })
        })
        .stage("example.price", |m: Message<Order>| async move {
            Ack::then(&Priced {
                id: m.payload.id,
                cents: u64::from(m.payload.items) * 499,
            })
        })
        .stage("example.ship", move |m: Message<Priced>| {
            let _ = shipped.send(format!(
                "pipeline: order {} shipped for {} cents (caused by {})",
                m.payload.id,
                m.payload.cents,
                m.envelope.causation_id.as_deref().unwrap_or("-")
            ));
            std::future::ready(Ack::accept())
        })
        .start()
        .await?;
    conn.publisher::<String>("", pipeline.input())
        .send(&"book,pen,lamp".to_string())
        .await?;

    // 2. A routing slip: two steps, then a completion queue. Its consumers
    //    follow slips only to the steps they are told to allow.
    let slip = RoutingSlip::new()
        .to_queue("example.slip.check")
        .to_queue("example.slip.reserve")
        .completion("", "example.slip.done");
    let mut slip_consumers = Vec::new();
    for step in ["example.slip.check", "example.slip.reserve", "example.slip.done"] {
        Topology::new().queue(step).dead_letters(step).declare(&conn).await?;
        let tx = done_tx.clone();
        let name = step.to_string();
        slip_consumers.push(
            consume(&conn, step, move |m: Message<Order>| {
                if name.ends_with(".done") {
                    let _ = tx.send(format!("slip: order {} completed every step", m.payload.id));
                } else {
                    println!("slip: {name} ran for order {}", m.payload.id);
                }
                std::future::ready(Ack::accept())
            })
            .routing_slips(SlipAllowList::new().slip(&slip))
            .await?,
        );
    }
    slip.send(&conn, Envelope::new(), &Order { id: 2, items: 1 }).await?;

    // 3. A scheduled message: two seconds in the broker's delay ladder,
    //    then the scheduler delivers it.
    let scheduler = Scheduler::start(&conn).await?;
    Topology::new()
        .queue("example.reminders")
        .dead_letters("example.reminders")
        .declare(&conn)
        .await?;
    let sent_at = Arc::new(Instant::now());
    let tx = done_tx.clone();
    let reminders = consume(&conn, "example.reminders", move |m: Message<String>| {
        let _ = tx.send(format!(
            "scheduler: {:?} arrived after {:.1} s",
            m.payload,
            sent_at.elapsed().as_secs_f64()
        ));
        std::future::ready(Ack::accept())
    })
    .await?;
    conn.publisher::<String>("", "example.reminders")
        .send_after(&"call the customer".to_string(), Duration::from_secs(2))
        .await?;

    for _ in 0..3 {
        match tokio::time::timeout(Duration::from_secs(30), done.recv()).await {
            Ok(Some(line)) => println!("{line}"),
            _ => return Err(Error::Config("the example did not finish within 30 s".into())),
        }
    }
    pipeline.close().await?;
    for consumer in slip_consumers {
        consumer.close().await?;
    }
    reminders.close().await?;
    scheduler.close().await?;
    conn.close().await?;
    Ok(())
}
