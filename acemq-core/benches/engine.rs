//! Engine throughput against a local RabbitMQ: confirmed publishing with a
//! window of 1000 and consuming with acks at prefetch 1000, 256-byte bodies.
//! Reports messages per second and the client's CPU time per message (user +
//! system time of this process divided by messages). Beside the engine's two
//! scenarios, the "wire floor" drives the same traffic with the least client
//! there can be (see `mod floor`): what the kernel costs per message here.
//!
//! `cargo bench -p acemq-core --bench engine` (RabbitMQ from
//! `scripts/rabbitmq.sh start`, or `ACEMQ_RABBITMQ_URL`). Under `cargo test`
//! it runs a small smoke version so CI exercises it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_codec::{BasicProperties, QueueDeclare, QueueDelete};
use acemq_core::amqp::{AmqpUrl, Config, Confirmation, Connection};
use bytes::Bytes;

/// The wire floor, with the CPU accounting and figures this bench shares
/// with the peers comparison (`benches/peers`).
#[path = "floor/mod.rs"]
mod floor;
use floor::{cpu_time, Figures, Waiting};

async fn publish_confirmed(conn: &Connection, queue: &str, messages: u64, window: usize) -> Figures {
    let props = BasicProperties {
        delivery_mode: Some(1),
        ..Default::default()
    };
    publish_confirmed_with(conn, queue, messages, window, props, "confirmed publish (w=1000)").await
}

/// The same, with the properties given once as an `Arc` and shared by
/// every publish (the wire floor, too, encodes them once).
async fn publish_confirmed_shared(conn: &Connection, queue: &str, messages: u64, window: usize) -> Figures {
    let props = Arc::new(BasicProperties {
        delivery_mode: Some(1),
        ..Default::default()
    });
    // Borrowed: the publish neither clones nor drops the `Arc`.
    publish_confirmed_with(conn, queue, messages, window, &props, "  same, properties shared").await
}

/// The engine's confirmed publish with the properties `Publisher` writes
/// (content type, message id, timestamp, the envelope headers): the same
/// bytes on the wire, so the broker's share of the work is the same too.
async fn publish_confirmed_envelope(conn: &Connection, queue: &str, messages: u64, window: usize) -> Figures {
    let props = envelope_properties();
    publish_confirmed_with(conn, queue, messages, window, props, "  same, envelope properties").await
}

/// The properties `Publisher` writes: content type, message id, timestamp
/// and the envelope headers.
fn envelope_properties() -> BasicProperties {
    let mut props = BasicProperties {
        content_type: Some("application/json".into()),
        delivery_mode: Some(1),
        timestamp: Some(1_764_508_980),
        ..Default::default()
    };
    acemq_core::Envelope::new().write_to(&mut props);
    props
}

async fn publish_confirmed_with(
    conn: &Connection,
    queue: &str,
    messages: u64,
    window: usize,
    props: impl acemq_core::amqp::PublishProperties + Clone,
    name: &'static str,
) -> Figures {
    publish_confirmed_each(conn, queue, messages, window, |_| props.clone(), name).await
}

/// The engine's confirmed publish with properties by value that differ on
/// every message (a message id each): what the by-value path costs when
/// nothing can be shared.
async fn publish_confirmed_unique(conn: &Connection, queue: &str, messages: u64, window: usize) -> Figures {
    let props = |n: u64| BasicProperties {
        delivery_mode: Some(1),
        message_id: Some(n.to_string().as_str().into()),
        ..Default::default()
    };
    publish_confirmed_each(conn, queue, messages, window, props, "  same, a message id each").await
}

/// `messages` confirmed publishes, message `n` with `props(n)`, at most
/// `window` unconfirmed.
async fn publish_confirmed_each<P: acemq_core::amqp::PublishProperties>(
    conn: &Connection,
    queue: &str,
    messages: u64,
    window: usize,
    mut props: impl FnMut(u64) -> P,
    name: &'static str,
) -> Figures {
    let ch = conn.channel().await.unwrap();
    ch.confirm_select().await.unwrap();
    let body = Bytes::from(vec![b'x'; 256]);
    let mut in_flight = VecDeque::with_capacity(window);
    let (t0, c0) = (Instant::now(), cpu_time());
    for n in 0..messages {
        if in_flight.len() == window {
            let confirm: acemq_core::amqp::PublishConfirm = in_flight.pop_front().unwrap();
            assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
        }
        in_flight.push_back(ch.publish("", queue, false, props(n), &body).await.unwrap());
    }
    for confirm in in_flight {
        assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
    }
    let figures = Figures::since(name, messages, t0, c0);
    ch.close().await.unwrap();
    figures
}

/// The least an async engine with a confirm future per publish costs in
/// user space, with no I/O at all: each message is a command the size of
/// the engine's, sent through an unbounded channel to a driver task that
/// answers it on a oneshot of its own, at most `window` unanswered, as the
/// engine's confirmed publish is driven. The wire floor plus this is what a
/// client of that shape can reach here, before it encodes a single frame.
async fn handoff_floor(messages: u64, window: usize) -> Figures {
    use tokio::sync::{mpsc, oneshot};
    type Handoff = ([u8; 160], oneshot::Sender<u64>);
    let (tx, mut rx) = mpsc::unbounded_channel::<Handoff>();
    let driver = tokio::spawn(async move {
        let mut sum = 0u64;
        while let Some((command, reply)) = rx.recv().await {
            sum = sum.wrapping_add(u64::from(std::hint::black_box(command)[0]));
            let _ = reply.send(sum);
        }
    });
    let mut in_flight = VecDeque::with_capacity(window);
    let (t0, c0) = (Instant::now(), cpu_time());
    for i in 0..messages {
        if in_flight.len() == window {
            let oldest: oneshot::Receiver<u64> = in_flight.pop_front().unwrap();
            oldest.await.unwrap();
        }
        let (reply, answer) = oneshot::channel();
        tx.send(([i as u8; 160], reply)).unwrap();
        in_flight.push_back(answer);
    }
    for answer in in_flight {
        answer.await.unwrap();
    }
    let figures = Figures::since("  handoff floor (no I/O)", messages, t0, c0);
    drop(tx);
    driver.await.unwrap();
    figures
}

async fn consume_with_ack(conn: &Connection, queue: &str, messages: u64, prefetch: u16) -> Figures {
    let ch = conn.channel().await.unwrap();
    ch.qos(prefetch).await.unwrap();
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut consumer = ch.consume(queue).await.unwrap();
    for _ in 0..messages {
        let delivery = consumer.next().await.expect("a delivery");
        delivery.ack().unwrap();
    }
    let figures = Figures::since("consume with ack (p=1000)", messages, t0, c0);
    consumer.cancel().await.unwrap();
    ch.close().await.unwrap();
    figures
}

/// Round trips with one message in flight: publish (no confirms), wait
/// for its delivery, ack it, repeat (the peers comparison's latency
/// scenario, here to profile the engine's share of it).
async fn round_trips(conn: &Connection, queue: &str, messages: u64) -> Figures {
    let publisher = conn.channel().await.unwrap();
    let ch = conn.channel().await.unwrap();
    ch.qos(1000).await.unwrap();
    let mut consumer = ch.consume(queue).await.unwrap();
    let props = Arc::new(BasicProperties {
        delivery_mode: Some(1),
        ..Default::default()
    });
    let body = Bytes::from(vec![b'x'; 256]);
    let (t0, c0) = (Instant::now(), cpu_time());
    for _ in 0..messages {
        drop(publisher.publish("", queue, false, &props, &body).await.unwrap());
        let delivery = consumer.next().await.expect("a delivery");
        delivery.ack().unwrap();
    }
    let figures = Figures::since("round trips (one in flight)", messages, t0, c0);
    consumer.cancel().await.unwrap();
    ch.close().await.unwrap();
    publisher.close().await.unwrap();
    figures
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Payload {
    order_id: u64,
    customer: String,
    note: String,
}

impl Payload {
    /// An order whose JSON body is about 256 bytes.
    fn new(order_id: u64) -> Self {
        Payload {
            order_id,
            customer: "customer-0000000000000000000000000000".into(),
            note: "n".repeat(180),
        }
    }
}

/// `Publisher::send` with confirms from 64 tasks at once: each send waits for
/// its own confirm, 64 are in flight.
async fn publisher_send(conn: &acemq_core::Conn, queue: &str, messages: u64, tasks: u64) -> Figures {
    let publisher = conn.publisher::<Payload>("", queue).transient();
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let publisher = publisher.clone();
        let share = messages / tasks + u64::from(task < messages % tasks);
        set.spawn(async move {
            for i in 0..share {
                publisher.send(&Payload::new(task * 1_000_000 + i)).await.unwrap();
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.unwrap();
    }
    Figures::since("Publisher::send (N tasks)", messages, t0, c0)
}

/// `Publisher::begin_send` with confirms from one task, a window of 1000
/// sends in flight: the same shape as the engine's confirmed publish, with
/// everything the API adds (envelope, JSON, headers, blocked handling).
async fn publisher_window(conn: &acemq_core::Conn, queue: &str, messages: u64, window: usize) -> Figures {
    let publisher = conn.publisher::<Payload>("", queue).transient();
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut in_flight = VecDeque::with_capacity(window);
    // One payload, changed in place: what is measured is the publisher.
    let mut payload = Payload::new(0);
    for i in 0..messages {
        if in_flight.len() == window {
            let oldest: acemq_core::PendingSend = in_flight.pop_front().unwrap();
            oldest.await.unwrap();
        }
        payload.order_id = i;
        in_flight.push_back(publisher.begin_send(&payload).await.unwrap());
    }
    for pending in in_flight {
        pending.await.unwrap();
    }
    Figures::since("Publisher::begin_send (w=1000)", messages, t0, c0)
}

/// The acemq consumer, accepting every message (prefetch 1000); with
/// `retry_once`, every message is retried once in the process (no wait) first.
async fn acemq_consume(conn: &acemq_core::Conn, queue: &str, messages: u64, retry_once: bool) -> Figures {
    use acemq_core::{consume, Ack, Message, RetryPolicy};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let accepted = Arc::new(AtomicU64::new(0));
    let (t0, c0) = (Instant::now(), cpu_time());
    let counter = accepted.clone();
    let consumer = consume(conn, queue, move |m: Message<Payload>| {
        let counter = counter.clone();
        async move {
            if retry_once && m.envelope.attempt == 1 {
                return Ack::retry("once more");
            }
            counter.fetch_add(1, Ordering::Relaxed);
            Ack::accept()
        }
    })
    .prefetch(1000)
    .retry_with(RetryPolicy::fixed(3, Duration::ZERO))
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while accepted.load(Ordering::Relaxed) < messages {
        assert!(Instant::now() < deadline, "the consumer stalled");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let name = if retry_once {
        "consume (acemq, retry once)"
    } else {
        "consume (acemq, accept)"
    };
    let figures = Figures::since(name, messages, t0, c0);
    consumer.close().await.unwrap();
    figures
}

/// Waits until `queue` holds `messages` (a passive declare every 5 ms).
async fn until_depth(channel: &acemq_core::amqp::Channel, queue: &str, messages: u64) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let passive = QueueDeclare {
            queue: queue.into(),
            passive: true,
            ..Default::default()
        };
        let depth = channel.queue_declare(passive).await.unwrap().unwrap().message_count;
        if u64::from(depth) >= messages {
            return;
        }
        assert!(Instant::now() < deadline, "{queue} stalled at {depth}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The hop by hand on the engine: consume `input` (prefetch 1000), publish
/// each body to `output` on a confirmed channel, ack the input after the
/// output's confirm (a window of 1000 in flight).
async fn hand_hop(conn: &Connection, input: &str, output: &str, messages: u64) -> Figures {
    let watch = conn.channel().await.unwrap();
    let (t0, c0) = (Instant::now(), cpu_time());
    let consume_ch = conn.channel().await.unwrap();
    consume_ch.qos(1000).await.unwrap();
    let publish_ch = conn.channel().await.unwrap();
    publish_ch.confirm_select().await.unwrap();
    let mut consumer = consume_ch.consume(input).await.unwrap();
    let mut window = std::collections::VecDeque::new();
    for _ in 0..messages {
        let delivery = consumer.next().await.unwrap();
        let props = BasicProperties {
            delivery_mode: Some(2),
            ..Default::default()
        };
        let confirm = publish_ch
            .publish("", output, true, props, delivery.body.clone())
            .await
            .unwrap();
        window.push_back((delivery, confirm));
        if window.len() >= 1000 {
            let (delivery, confirm) = window.pop_front().unwrap();
            confirm.await.unwrap();
            delivery.ack().unwrap();
        }
    }
    for (delivery, confirm) in window {
        confirm.await.unwrap();
        delivery.ack().unwrap();
    }
    until_depth(&watch, output, messages).await;
    let figures = Figures::since("hop by hand (engine)", messages, t0, c0);
    consumer.cancel().await.unwrap();
    figures
}

/// The same hop with the acemq API: `Ack::then` to a `.then(publisher)`.
async fn then_hop(conn: &acemq_core::Conn, watch: &Connection, input: &str, output: &str, messages: u64) -> Figures {
    use acemq_core::{consume, Ack, Message};
    let watch = watch.channel().await.unwrap();
    let (t0, c0) = (Instant::now(), cpu_time());
    let consumer = consume(conn, input, |m: Message<Payload>| async move { Ack::then(&m.payload) })
        .prefetch(1000)
        .then(&conn.publisher::<Payload>("", output))
        .await
        .unwrap();
    until_depth(&watch, output, messages).await;
    let figures = Figures::since("Ack::then (acemq)", messages, t0, c0);
    consumer.close().await.unwrap();
    figures
}

async fn purge(channel: &acemq_core::amqp::Channel, queue: &str) {
    let purge = acemq_codec::QueuePurge {
        queue: queue.into(),
        ..Default::default()
    };
    channel.queue_purge(purge).await.unwrap();
}

/// The wire floor's publish then consume, `delivery-mode` 1 only. Blocking
/// (nothing else runs on the runtime meanwhile), or on tokio: every wait an
/// `await` on the runtime's I/O driver, what a tokio client pays for its
/// reactor before any work of its own (see `floor::Waiting`).
async fn wire_floor(addr: &AmqpUrl, queue: &str, messages: u64, waiting: Waiting) -> (Figures, Figures) {
    let names = match waiting {
        Waiting::Blocking => ["  wire floor: publish", "  wire floor: consume"],
        Waiting::OnTokio => ["  wire floor on tokio: publish", "  wire floor on tokio: consume"],
    };
    let publish = floor::publish(addr, queue, messages, 1000, minimal_properties(), names[0], waiting)
        .await
        .expect(names[0]);
    let consume = floor::consume(addr, queue, messages, 1000, names[1], waiting)
        .await
        .expect(names[1]);
    (publish, consume)
}

/// The wire floor's publish alone, `delivery-mode` 1 only.
async fn wire_floor_minimal(addr: &AmqpUrl, queue: &str, messages: u64) -> Figures {
    wire_floor_publish(addr, queue, messages, minimal_properties(), "  wire floor: publish").await
}

/// The wire floor's publish with the envelope's properties: the most any
/// client gets from the broker for the bytes `Publisher` must send.
async fn wire_floor_envelope(addr: &AmqpUrl, queue: &str, messages: u64) -> Figures {
    let name = "  wire floor: envelope publish";
    wire_floor_publish(addr, queue, messages, envelope_properties(), name).await
}

/// The wire floor's publish alone, blocking, with `props`.
async fn wire_floor_publish(
    addr: &AmqpUrl,
    queue: &str,
    messages: u64,
    props: BasicProperties,
    name: &'static str,
) -> Figures {
    floor::publish(addr, queue, messages, 1000, props, name, Waiting::Blocking)
        .await
        .expect(name)
}

/// `delivery-mode` 1 only.
fn minimal_properties() -> BasicProperties {
    BasicProperties {
        delivery_mode: Some(1),
        ..Default::default()
    }
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    // `ACEMQ_BENCH_MESSAGES=N` sets the count (two counts under callgrind
    // give the cost of one message in a steady state, without the warm-up).
    let messages = match std::env::var("ACEMQ_BENCH_MESSAGES") {
        Ok(n) => n.parse().expect("ACEMQ_BENCH_MESSAGES is a number"),
        Err(_) if benching => 100_000,
        Err(_) => 2_000,
    };
    let url = std::env::var("ACEMQ_RABBITMQ_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/".into());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Every scenario runs in a task of its own, as a service's work does,
    // not in `block_on`'s future: tokio polls its I/O driver once more
    // (an `epoll_wait` that does not sleep) each time that future is woken
    // from within the runtime, which a spawned task does not cost.
    runtime.block_on(async move {
        tokio::spawn(scenarios(url, messages, benching))
            .await
            .expect("the bench's task")
    });
}

/// Declares the durable queue `name` (the bench's queues).
async fn declare_durable(ch: &acemq_core::amqp::Channel, name: &str) {
    ch.queue_declare(QueueDeclare {
        queue: name.into(),
        durable: true,
        ..Default::default()
    })
    .await
    .unwrap();
}

/// Every scenario of the bench (see `main`).
async fn scenarios(url: String, messages: u64, benching: bool) {
    // `ACEMQ_BENCH_READ_INTERVAL_US=N`: the engine's connection reads at
    // most every N µs (`Config::read_interval`).
    let read_interval = std::env::var("ACEMQ_BENCH_READ_INTERVAL_US")
        .map(|us| std::time::Duration::from_micros(us.parse().expect("ACEMQ_BENCH_READ_INTERVAL_US is a number")))
        .unwrap_or_default();
    let config = Config::default().with_read_interval(read_interval);
    let conn = match Connection::open(&url, config).await {
        Ok(conn) => conn,
        Err(err) => {
            let msg = format!("engine bench: no RabbitMQ at {url}: {err} (start one with scripts/rabbitmq.sh start)");
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            eprintln!("!!!! SKIPPING {msg}");
            return;
        }
    };
    // The wire floor speaks plain AMQP to the same broker, as the same user.
    let addr: AmqpUrl = url.parse().expect("ACEMQ_RABBITMQ_URL parses");
    assert!(
        !addr.tls,
        "the wire floor speaks plain TCP: ACEMQ_RABBITMQ_URL must be amqp://"
    );
    let setup = conn.channel().await.unwrap();
    let queue = format!("acemq-bench-{}", std::process::id());
    declare_durable(&setup, &queue).await;
    let api = acemq_core::Conn::open(&url, acemq_core::Config::default())
        .await
        .unwrap();
    // `ACEMQ_BENCH_ONLY=engine` runs the two engine scenarios alone (for
    // profiling), `=engine-publish` and `=engine-consume` each of them,
    // `=floor-publish` the wire floor's publish, `=tokio-floor` the wire
    // floor blocking and on tokio, `=handoff` the handoff floor, `=round-trips` one message in flight (at most 20000);
    // `=publish` the engine's publish and the publisher's;
    // `=consume` the acemq consumer alone (accepting, then retrying once),
    // `=api-consume` accepting only.
    let only = std::env::var("ACEMQ_BENCH_ONLY").unwrap_or_default();
    let engine_only = only == "engine";
    for round in 0..if benching { 3 } else { 1 } {
        // `=engine-consume`: the floor publishes, the engine consumes
        // (to profile the engine's consume alone).
        if only == "engine-consume" {
            wire_floor_minimal(&addr, &queue, messages).await.print();
            consume_with_ack(&conn, &queue, messages, 1000).await.print();
            continue;
        }
        // `=floor-publish`: the wire floor's publish alone (to profile it
        // beside the engine's).
        if only == "floor-publish" {
            wire_floor_minimal(&addr, &queue, messages).await.print();
            purge(&setup, &queue).await;
            continue;
        }
        // `=round-trips`: one message in flight, publish to delivery.
        if only == "round-trips" {
            let figures = round_trips(&conn, &queue, messages.min(20_000)).await;
            figures.print();
            println!(
                "  {:.1} µs a round trip",
                figures.wall.as_secs_f64() * 1e6 / figures.messages as f64
            );
            continue;
        }
        // `=tokio-floor`: the wire floor, blocking then on tokio (its
        // publish, then its consume of what it published).
        if only == "tokio-floor" {
            let (publish, consume) = wire_floor(&addr, &queue, messages, Waiting::Blocking).await;
            let (tokio_publish, tokio_consume) = wire_floor(&addr, &queue, messages, Waiting::OnTokio).await;
            publish.print();
            tokio_publish.print();
            consume.print();
            tokio_consume.print();
            continue;
        }
        // `=handoff`: the handoff floor alone (no broker traffic).
        if only == "handoff" {
            handoff_floor(messages, 1000).await.print();
            continue;
        }
        // `=engine-publish`: the engine's confirmed publish alone.
        // `=engine-publish-shared`: the same with the properties shared.
        // `=engine-publish-unique`: the same with a message id each.
        if only == "engine-publish" || only == "engine-publish-shared" || only == "engine-publish-unique" {
            let figures = match only.as_str() {
                "engine-publish" => publish_confirmed(&conn, &queue, messages, 1000).await,
                "engine-publish-shared" => publish_confirmed_shared(&conn, &queue, messages, 1000).await,
                _ => publish_confirmed_unique(&conn, &queue, messages, 1000).await,
            };
            figures.print();
            purge(&setup, &queue).await;
            continue;
        }
        if engine_only {
            publish_confirmed(&conn, &queue, messages, 1000).await.print();
            purge(&setup, &queue).await;
            publish_confirmed_unique(&conn, &queue, messages, 1000).await.print();
            purge(&setup, &queue).await;
            publish_confirmed_shared(&conn, &queue, messages, 1000).await.print();
            consume_with_ack(&conn, &queue, messages, 1000).await.print();
            let (publish, consume) = wire_floor(&addr, &queue, messages, Waiting::Blocking).await;
            let (tokio_publish, tokio_consume) = wire_floor(&addr, &queue, messages, Waiting::OnTokio).await;
            publish.print();
            tokio_publish.print();
            handoff_floor(messages, 1000).await.print();
            consume.print();
            tokio_consume.print();
            continue;
        }
        // `=hops`: a consume -> publish hop by hand on the engine, then
        // the same with `Ack::then`, each over the same preloaded input.
        if only == "hops" {
            let output = format!("{queue}.out");
            declare_durable(&setup, &output).await;
            publisher_window(&api, &queue, messages, 1000).await;
            let hand = hand_hop(&conn, &queue, &output, messages).await;
            purge(&setup, &output).await;
            publisher_window(&api, &queue, messages, 1000).await;
            let then = then_hop(&api, &conn, &queue, &output, messages).await;
            purge(&setup, &output).await;
            hand.print();
            then.print();
            continue;
        }
        if only == "consume" {
            publisher_window(&api, &queue, messages, 1000).await;
            acemq_consume(&api, &queue, messages, false).await.print();
            publisher_window(&api, &queue, messages, 1000).await;
            acemq_consume(&api, &queue, messages, true).await.print();
            continue;
        }
        // `=api-consume`: the acemq consumer accepting, over a preload by
        // `Publisher::begin_send` (`=begin-send` is the preload alone, to
        // take away under callgrind).
        if only == "api-consume" {
            publisher_window(&api, &queue, messages, 1000).await;
            acemq_consume(&api, &queue, messages, false).await.print();
            continue;
        }
        // `=begin-send`: `Publisher::begin_send` alone.
        if only == "begin-send" {
            publisher_window(&api, &queue, messages, 1000).await.print();
            purge(&setup, &queue).await;
            continue;
        }
        if only == "publish" {
            publish_confirmed(&conn, &queue, messages, 1000).await.print();
            purge(&setup, &queue).await;
            wire_floor(&addr, &queue, messages, Waiting::Blocking).await.0.print();
            publish_confirmed_envelope(&conn, &queue, messages, 1000).await.print();
            purge(&setup, &queue).await;
            wire_floor_envelope(&addr, &queue, messages).await.print();
            purge(&setup, &queue).await;
            publisher_window(&api, &queue, messages, 1000).await.print();
            purge(&setup, &queue).await;
            continue;
        }
        // `ACEMQ_BENCH_SEND_TASKS=N` runs `Publisher::send` alone from N tasks.
        if let Ok(tasks) = std::env::var("ACEMQ_BENCH_SEND_TASKS") {
            let tasks: u64 = tasks.parse().unwrap();
            publisher_send(&api, &queue, messages, tasks).await.print();
            purge(&setup, &queue).await;
            continue;
        }
        // Every publish starts on an empty queue and every consume finds
        // exactly the messages it is to take: a deeper queue costs the
        // broker more, and would bias whichever scenario runs later.
        let publish = publish_confirmed(&conn, &queue, messages, 1000).await;
        purge(&setup, &queue).await;
        let publish_shared = publish_confirmed_shared(&conn, &queue, messages, 1000).await;
        let consume = consume_with_ack(&conn, &queue, messages, 1000).await;
        let (floor_publish, floor_consume) = wire_floor(&addr, &queue, messages, Waiting::Blocking).await;
        let (tokio_floor_publish, tokio_floor_consume) = wire_floor(&addr, &queue, messages, Waiting::OnTokio).await;
        let handoff = handoff_floor(messages, 1000).await;
        let publish_envelope = publish_confirmed_envelope(&conn, &queue, messages, 1000).await;
        purge(&setup, &queue).await;
        let floor_envelope = wire_floor_envelope(&addr, &queue, messages).await;
        purge(&setup, &queue).await;
        let send = publisher_send(&api, &queue, messages, 64).await;
        purge(&setup, &queue).await;
        let window = publisher_window(&api, &queue, messages, 1000).await;
        let accept = acemq_consume(&api, &queue, messages, false).await;
        // JSON payloads again (the raw publishes above are not JSON).
        publisher_send(&api, &queue, messages, 64).await;
        let retried = acemq_consume(&api, &queue, messages, true).await;
        purge(&setup, &queue).await;
        if benching {
            println!("round {round}");
        }
        publish.print();
        publish_shared.print();
        floor_publish.print();
        tokio_floor_publish.print();
        handoff.print();
        publish_envelope.print();
        floor_envelope.print();
        consume.print();
        floor_consume.print();
        tokio_floor_consume.print();
        send.print();
        window.print();
        accept.print();
        retried.print();
    }
    api.close().await.unwrap();
    setup
        .queue_delete(QueueDelete {
            queue: queue.as_str().into(),
            ..Default::default()
        })
        .await
        .unwrap();
    conn.close().await.unwrap();
}
