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
use std::time::{Duration, Instant};

use acemq_core::amqp::{AmqpUrl, Config, Confirmation, Connection};
use amqp_codec::{BasicProperties, QueueDeclare, QueueDelete};
use bytes::Bytes;

/// CPU time of this process so far: the total from the scheduler (exact,
/// nanoseconds, every thread) and the user/system split from the tick-based
/// accounting (an estimate, in 10 ms ticks), and how many times a thread
/// was put on a CPU (each one a wakeup and a context switch).
#[derive(Clone, Copy)]
struct Cpu {
    total: Duration,
    user_ticks: u64,
    system_ticks: u64,
    runs: u64,
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, earlier: Cpu) -> Cpu {
        Cpu {
            total: self.total.saturating_sub(earlier.total),
            user_ticks: self.user_ticks.saturating_sub(earlier.user_ticks),
            system_ticks: self.system_ticks.saturating_sub(earlier.system_ticks),
            runs: self.runs.saturating_sub(earlier.runs),
        }
    }
}

fn cpu_time() -> Cpu {
    // Time on the CPU of every thread and how many times each ran, from
    // /proc/self/task/*/schedstat (run time in ns, wait time, run count).
    let (mut total_ns, mut runs) = (0u64, 0u64);
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            let fields: Vec<u64> = stat.split_whitespace().map(|n| n.parse().unwrap_or(0)).collect();
            total_ns += fields.first().copied().unwrap_or(0);
            runs += fields.get(2).copied().unwrap_or(0);
        }
    }
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Cpu {
        total: Duration::from_nanos(total_ns),
        user_ticks: ticks(11),
        system_ticks: ticks(12),
        runs,
    }
}

struct Figures {
    name: &'static str,
    messages: u64,
    wall: Duration,
    cpu: Cpu,
}

impl Figures {
    /// What was measured from `t0` and `c0` until now.
    fn since(name: &'static str, messages: u64, t0: Instant, c0: Cpu) -> Self {
        Figures {
            name,
            messages,
            wall: t0.elapsed(),
            cpu: cpu_time() - c0,
        }
    }

    fn print(&self) {
        let rate = self.messages as f64 / self.wall.as_secs_f64();
        let total = self.cpu.total.as_secs_f64() * 1e6 / self.messages as f64;
        let ticks = (self.cpu.user_ticks + self.cpu.system_ticks).max(1) as f64;
        let system_share = self.cpu.system_ticks as f64 / ticks;
        let runs = self.cpu.runs as f64 * 1000.0 / self.messages as f64;
        println!(
            "{:<31} {:>7} msgs {:>7.0} msg/s {:>6.2} µs CPU/msg (~{:.0}% system) {:>5.0} runs/1k msgs  wall {:.2?}",
            self.name,
            self.messages,
            rate,
            total,
            system_share * 100.0,
            runs,
            self.wall
        );
    }
}

async fn publish_confirmed(conn: &Connection, queue: &str, messages: u64, window: usize) -> Figures {
    let props = BasicProperties {
        delivery_mode: Some(1),
        ..Default::default()
    };
    publish_confirmed_with(conn, queue, messages, window, props, "confirmed publish (w=1000)").await
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
    props: BasicProperties,
    name: &'static str,
) -> Figures {
    let ch = conn.channel().await.unwrap();
    ch.confirm_select().await.unwrap();
    let body = Bytes::from(vec![b'x'; 256]);
    let mut in_flight = VecDeque::with_capacity(window);
    let (t0, c0) = (Instant::now(), cpu_time());
    for _ in 0..messages {
        if in_flight.len() == window {
            let confirm: acemq_core::amqp::PublishConfirm = in_flight.pop_front().unwrap();
            assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
        }
        in_flight.push_back(ch.publish("", queue, false, props.clone(), body.clone()).await.unwrap());
    }
    for confirm in in_flight {
        assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
    }
    let figures = Figures::since(name, messages, t0, c0);
    ch.close().await.unwrap();
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
    let purge = amqp_codec::QueuePurge {
        queue: queue.into(),
        ..Default::default()
    };
    channel.queue_purge(purge).await.unwrap();
}

/// The wire floor's publish then consume (blocking; nothing else runs on
/// the runtime meanwhile).
fn wire_floor(addr: &AmqpUrl, queue: &str, messages: u64) -> (Figures, Figures) {
    let props = BasicProperties {
        delivery_mode: Some(1),
        ..Default::default()
    };
    let publish =
        floor::publish(addr, queue, messages, 1000, props, "  wire floor: publish").expect("wire floor publish");
    let consume = floor::consume(addr, queue, messages, 1000).expect("wire floor consume");
    (publish, consume)
}

/// The wire floor's publish with the envelope's properties: the most any
/// client gets from the broker for the bytes `Publisher` must send.
fn wire_floor_envelope(addr: &AmqpUrl, queue: &str, messages: u64) -> Figures {
    let name = "  wire floor: envelope publish";
    floor::publish(addr, queue, messages, 1000, envelope_properties(), name).expect("wire floor publish")
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let messages = if benching { 100_000 } else { 2_000 };
    let url = std::env::var("ACEMQ_RABBITMQ_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/".into());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let conn = match Connection::open(&url, Config::default()).await {
            Ok(conn) => conn,
            Err(err) => {
                let msg =
                    format!("engine bench: no RabbitMQ at {url}: {err} (start one with scripts/rabbitmq.sh start)");
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
        setup
            .queue_declare(QueueDeclare {
                queue: queue.as_str().into(),
                durable: true,
                ..Default::default()
            })
            .await
            .unwrap();
        let api = acemq_core::Conn::open(&url, acemq_core::Config::default())
            .await
            .unwrap();
        // `ACEMQ_BENCH_ONLY=engine` runs the two engine scenarios alone (for
        // profiling); `=publish` the engine's publish and the publisher's;
        // `=consume` the acemq consumer alone.
        let only = std::env::var("ACEMQ_BENCH_ONLY").unwrap_or_default();
        let engine_only = only == "engine";
        for round in 0..if benching { 3 } else { 1 } {
            if engine_only {
                publish_confirmed(&conn, &queue, messages, 1000).await.print();
                consume_with_ack(&conn, &queue, messages, 1000).await.print();
                let (publish, consume) = wire_floor(&addr, &queue, messages);
                publish.print();
                consume.print();
                continue;
            }
            // `=hops`: a consume -> publish hop by hand on the engine, then
            // the same with `Ack::then`, each over the same preloaded input.
            if only == "hops" {
                let output = format!("{queue}.out");
                setup
                    .queue_declare(QueueDeclare {
                        queue: output.as_str().into(),
                        durable: true,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
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
            if only == "publish" {
                publish_confirmed(&conn, &queue, messages, 1000).await.print();
                purge(&setup, &queue).await;
                wire_floor(&addr, &queue, messages).0.print();
                publish_confirmed_envelope(&conn, &queue, messages, 1000).await.print();
                purge(&setup, &queue).await;
                wire_floor_envelope(&addr, &queue, messages).print();
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
            let consume = consume_with_ack(&conn, &queue, messages, 1000).await;
            let (floor_publish, floor_consume) = wire_floor(&addr, &queue, messages);
            let publish_envelope = publish_confirmed_envelope(&conn, &queue, messages, 1000).await;
            purge(&setup, &queue).await;
            let floor_envelope = wire_floor_envelope(&addr, &queue, messages);
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
            floor_publish.print();
            publish_envelope.print();
            floor_envelope.print();
            consume.print();
            floor_consume.print();
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
    });
}

/// The wire floor: the engine's two scenarios (confirmed publish with a
/// window of 1000, consume with acks at prefetch 1000, 256-byte bodies)
/// driven by the least client there can be. One thread, a blocking socket,
/// the publish frames encoded once and copied, frames found by their
/// envelope and only the few bytes that matter read (the ack's tag, the
/// delivery's tag), and every read answered by at most one write. What it
/// spends per message is what the kernel's loopback TCP and this process's
/// system calls cost on this machine: the part of "client CPU" no client can
/// go below, reported beside the engine's figures.
mod floor {
    use std::io::{self, Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    use amqp_codec::{
        decode_frame, encode_content, encode_method, BasicConsume, BasicProperties, BasicPublish, BasicQos,
        ChannelOpen, ConfirmSelect, ConnectionClose, ConnectionOpen, ConnectionStartOk, ConnectionTuneOk, FieldTable,
        Frame, Method, DEFAULT_FRAME_MAX, FRAME_BODY, FRAME_METHOD, PROTOCOL_HEADER,
    };
    use bytes::{Bytes, BytesMut};

    use super::{cpu_time, AmqpUrl, Figures};

    /// The class and method ids of basic.ack (60, 80), basic.nack (60, 120)
    /// and basic.deliver (60, 60) as they start a method payload.
    const BASIC_ACK: [u8; 4] = [0, 60, 0, 80];
    const BASIC_NACK: [u8; 4] = [0, 60, 0, 120];
    const BASIC_DELIVER: [u8; 4] = [0, 60, 0, 60];

    /// A plain blocking AMQP connection with one channel open.
    pub struct Wire {
        sock: TcpStream,
        /// Bytes read and not yet taken: `buf[start..end]`.
        buf: Vec<u8>,
        start: usize,
        end: usize,
        out: BytesMut,
    }

    impl Wire {
        /// Connects to the first host of `url` as its user, on its vhost, and
        /// opens channel 1.
        pub fn open(url: &AmqpUrl) -> io::Result<Wire> {
            let (host, port) = url.hosts.first().ok_or_else(|| io::Error::other("no host"))?;
            let sock = TcpStream::connect((host.as_str(), *port))?;
            sock.set_nodelay(true)?;
            let mut wire = Wire {
                sock,
                buf: vec![0; 1 << 20],
                start: 0,
                end: 0,
                out: BytesMut::with_capacity(1 << 20),
            };
            wire.sock.write_all(&PROTOCOL_HEADER)?;
            wire.expect(|m| matches!(m, Method::ConnectionStart(_)))?;
            wire.send(
                0,
                ConnectionStartOk {
                    client_properties: FieldTable::new(),
                    mechanism: "PLAIN".into(),
                    response: format!("\0{}\0{}", url.username, url.password.expose()).into(),
                    locale: "en_US".into(),
                },
            )?;
            let tune = match wire.expect(|m| matches!(m, Method::ConnectionTune(_)))? {
                Method::ConnectionTune(tune) => tune,
                _ => unreachable!(),
            };
            wire.send(
                0,
                ConnectionTuneOk {
                    channel_max: tune.channel_max,
                    frame_max: DEFAULT_FRAME_MAX,
                    heartbeat: 0,
                },
            )?;
            wire.send(
                0,
                ConnectionOpen {
                    virtual_host: url.vhost.as_str().into(),
                    ..Default::default()
                },
            )?;
            wire.expect(|m| matches!(m, Method::ConnectionOpenOk(_)))?;
            wire.send(1, ChannelOpen::default())?;
            wire.expect(|m| matches!(m, Method::ChannelOpenOk(_)))?;
            Ok(wire)
        }

        fn send(&mut self, channel: u16, method: impl Into<Method>) -> io::Result<()> {
            encode_method(channel, &method.into(), &mut self.out).map_err(io::Error::other)?;
            self.flush()
        }

        fn flush(&mut self) -> io::Result<()> {
            self.sock.write_all(&self.out)?;
            self.out.clear();
            Ok(())
        }

        /// One read into the free end of the buffer (moving what is left to
        /// the front first when the end is near).
        fn read_some(&mut self) -> io::Result<()> {
            if self.buf.len() - self.end < 256 * 1024 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let n = self.sock.read(&mut self.buf[self.end..])?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.end += n;
            Ok(())
        }

        /// The next whole frame as (type, payload range), if buffered.
        fn next_frame(&mut self) -> Option<(u8, usize, usize)> {
            let head = self
                .buf
                .get(self.start..self.start + 7)
                .filter(|_| self.start + 7 <= self.end)?;
            let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
            if self.start + size + 8 > self.end {
                return None;
            }
            let frame = (head[0], self.start + 7, self.start + 7 + size);
            self.start += size + 8;
            Some(frame)
        }

        /// Reads frames until a method `wanted` accepts, decoded in full
        /// (the handshake and replies; not timed).
        fn expect(&mut self, wanted: impl Fn(&Method) -> bool) -> io::Result<Method> {
            loop {
                while let Some((_, from, to)) = self.next_frame() {
                    let frame = Bytes::copy_from_slice(&self.buf[from - 7..to + 1]);
                    let (frame, _) = decode_frame(&frame, 0).map_err(io::Error::other)?;
                    if let Frame::Method(_, method) = frame {
                        if wanted(&method) {
                            return Ok(method);
                        }
                        if matches!(method, Method::ConnectionClose(_) | Method::ChannelClose(_)) {
                            return Err(io::Error::other(format!("closed by the broker: {method:?}")));
                        }
                    }
                }
                self.read_some()?;
            }
        }

        fn close(mut self) -> io::Result<()> {
            self.send(
                0,
                ConnectionClose {
                    reply_code: 200,
                    reply_text: "bye".into(),
                    ..Default::default()
                },
            )?;
            self.expect(|m| matches!(m, Method::ConnectionCloseOk(_)))?;
            Ok(())
        }
    }

    /// `ACEMQ_FLOOR_PAUSE_US=N` waits N µs before every read, so that each
    /// read finds more: how far the floor falls when a client trades that
    /// much latency for fewer, larger system calls.
    fn pause() {
        static PAUSE: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
        let pause = PAUSE.get_or_init(|| {
            std::env::var("ACEMQ_FLOOR_PAUSE_US")
                .ok()
                .and_then(|us| us.parse().ok())
                .map(std::time::Duration::from_micros)
        });
        if let Some(pause) = pause {
            std::thread::sleep(*pause);
        }
    }

    /// `ACEMQ_FLOOR_ACK_EVERY=N` holds the consume's ack back until it covers
    /// more than N deliveries (0, the default: one ack per read): fewer writes,
    /// with the prefetch credit returned later but no delivery delayed.
    fn ack_every() -> u64 {
        static EVERY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        *EVERY.get_or_init(|| {
            std::env::var("ACEMQ_FLOOR_ACK_EVERY")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        })
    }

    fn tag_at(payload: &[u8], at: usize) -> u64 {
        let mut tag = [0; 8];
        tag.copy_from_slice(&payload[at..at + 8]);
        u64::from_be_bytes(tag)
    }

    /// `messages` confirmed publishes of 256-byte bodies with `props` to
    /// `queue`, at most `window` unconfirmed.
    pub fn publish(
        addr: &AmqpUrl,
        queue: &str,
        messages: u64,
        window: u64,
        props: BasicProperties,
        name: &'static str,
    ) -> io::Result<Figures> {
        let mut wire = Wire::open(addr)?;
        wire.send(1, ConfirmSelect::default())?;
        wire.expect(|m| matches!(m, Method::ConfirmSelectOk(_)))?;
        let publish = BasicPublish {
            routing_key: queue.into(),
            ..Default::default()
        };
        let mut one = BytesMut::new();
        encode_content(1, &publish.into(), &props, &[b'x'; 256], DEFAULT_FRAME_MAX, &mut one)
            .map_err(io::Error::other)?;
        let (mut published, mut confirmed) = (0u64, 0u64);
        let (t0, c0) = (Instant::now(), cpu_time());
        while confirmed < messages {
            let room = (window - (published - confirmed)).min(messages - published);
            for _ in 0..room {
                wire.out.extend_from_slice(&one);
            }
            published += room;
            wire.flush()?;
            pause();
            wire.read_some()?;
            while let Some((kind, from, to)) = wire.next_frame() {
                let payload = &wire.buf[from..to];
                if kind == FRAME_METHOD && payload.starts_with(&BASIC_ACK) {
                    // Confirms on one queue come in order: the highest tag
                    // acked, alone or with `multiple`, covers all before it.
                    confirmed = confirmed.max(tag_at(payload, 4));
                } else if kind == FRAME_METHOD && payload.starts_with(&BASIC_NACK) {
                    return Err(io::Error::other("nacked"));
                }
            }
        }
        let figures = Figures::since(name, messages, t0, c0);
        wire.close()?;
        Ok(figures)
    }

    /// Consumes `messages` from `queue` at prefetch `prefetch`, answering
    /// each read with one `basic.ack` with `multiple` for all it brought
    /// (or for more; see [`ack_every`]).
    pub fn consume(addr: &AmqpUrl, queue: &str, messages: u64, prefetch: u16) -> io::Result<Figures> {
        let mut wire = Wire::open(addr)?;
        let (t0, c0) = (Instant::now(), cpu_time());
        wire.send(
            1,
            BasicQos {
                prefetch_count: prefetch,
                ..Default::default()
            },
        )?;
        wire.expect(|m| matches!(m, Method::BasicQosOk(_)))?;
        wire.send(
            1,
            BasicConsume {
                queue: queue.into(),
                ..Default::default()
            },
        )?;
        wire.expect(|m| matches!(m, Method::BasicConsumeOk(_)))?;
        let (mut received, mut last_tag, mut acked_tag) = (0u64, 0u64, 0u64);
        while received < messages {
            while let Some((kind, from, to)) = wire.next_frame() {
                let payload = &wire.buf[from..to];
                if kind == FRAME_METHOD && payload.starts_with(&BASIC_DELIVER) {
                    // class, method, then the consumer tag as a shortstr.
                    let tag_len = usize::from(payload[4]);
                    last_tag = tag_at(payload, 5 + tag_len);
                } else if kind == FRAME_BODY {
                    received += 1;
                }
            }
            let due = last_tag > acked_tag + ack_every() || (received >= messages && last_tag > acked_tag);
            if due {
                encode_method(
                    1,
                    &amqp_codec::BasicAck {
                        delivery_tag: last_tag,
                        multiple: true,
                    }
                    .into(),
                    &mut wire.out,
                )
                .map_err(io::Error::other)?;
                wire.flush()?;
                acked_tag = last_tag;
            }
            if received < messages {
                pause();
                wire.read_some()?;
            }
        }
        let figures = Figures::since("  wire floor: consume", messages, t0, c0);
        wire.close()?;
        Ok(figures)
    }
}
