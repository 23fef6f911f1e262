//! Recovery at work: a publisher and a consumer keep going while the
//! broker's connections are cut three times (sockets severed, a forced
//! close, a broker restart). Every recovery event is printed, and at the end
//! the counts show that no confirmed send was lost.
//!
//! `cargo run --example recovery` runs against an in-process acemq-memory
//! broker, whose fault handle does the cutting.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_core::{consume, Ack, Config, Conn, Error, Message, Topology};

const MESSAGES: u64 = 3_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let broker = acemq_memory::Broker::named("recovery-example");
    let started = Instant::now();
    let config = Config::default()
        .with_on_recovery(move |event| {
            println!("recovery: +{:.3}s {event}", started.elapsed().as_secs_f64());
        })
        .with_recovery_delay(Duration::from_millis(100))
        .with_recovery_delay_max(Duration::from_secs(1));
    let conn = Conn::open("memory://recovery-example", config).await?;
    Topology::new().queue("payments").declare(&conn).await?;

    let consumed = Arc::new(Mutex::new((BTreeSet::new(), 0u64)));
    let seen = consumed.clone();
    let consumer = consume(&conn, "payments", move |m: Message<u64>| {
        let mut seen = seen.lock().unwrap();
        seen.0.insert(m.payload);
        seen.1 += 1;
        std::future::ready(Ack::accept())
    })
    .prefetch(100)
    .await?;

    let publisher = conn.publisher::<u64>("", "payments").mandatory();
    let sending = tokio::spawn(async move {
        let mut confirmed = BTreeSet::new();
        let mut window = std::collections::VecDeque::new();
        for n in 0..MESSAGES {
            if window.len() == 100 {
                let (id, pending): (u64, acemq_core::PendingSend) = window.pop_front().unwrap();
                pending.await?;
                confirmed.insert(id);
            }
            window.push_back((n, publisher.begin_send(&n).await?));
            if n % 50 == 0 {
                // A steady stream rather than one burst, so the faults land mid-way.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        for (id, pending) in window {
            pending.await?;
            confirmed.insert(id);
        }
        Ok::<_, Error>(confirmed)
    });

    let faults = broker.faults();
    for (name, fault) in [
        (
            "severing every socket",
            Box::new(|| faults.sever_all()) as Box<dyn Fn()>,
        ),
        (
            "closing every connection (320)",
            Box::new(|| faults.close_all("the recovery example")),
        ),
        ("restarting the broker", Box::new(|| faults.restart())),
    ] {
        tokio::time::sleep(Duration::from_millis(150)).await;
        println!("example:  +{:.3}s {name}", started.elapsed().as_secs_f64());
        fault();
    }

    let confirmed = sending.await.expect("the sending task runs")?;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let missing = confirmed.difference(&consumed.lock().unwrap().0).count();
        if missing == 0 || Instant::now() > until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    consumer.close().await?;
    conn.close().await?;
    let (unique, deliveries) = &*consumed.lock().unwrap();
    let lost = confirmed.difference(unique).count();
    println!(
        "example: sent {MESSAGES}, confirmed {}, consumed {} ({} deliveries, {} duplicates), lost {lost}",
        confirmed.len(),
        unique.len(),
        deliveries,
        deliveries - unique.len() as u64
    );
    assert_eq!(lost, 0, "a confirmed send was lost");
    Ok(())
}
