//! acemq beside its peers, lapin and amqprs, and beside the wire floor, on
//! one RabbitMQ in one run (the figures are in BENCHMARKS.md).
//!
//! ```sh
//! cd acemq-core/benches/peers && cargo run --release -- --rounds 3
//! ```
//!
//! RabbitMQ from `ACEMQ_RABBITMQ_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/`); `--messages N` (default 200000)
//! per throughput row, `--slices N` (default 1) to run each throughput row
//! as N slices of `--messages / N`, the clients of a group taking turns
//! slice by slice and each client's slices added up (so that the machine's
//! drift over a group falls on every client alike), `--samples N` (default
//! 10000, after a warm-up of a tenth as many) per latency row, `--tasks N`
//! (default 256) for `Publisher::send`, `--only
//! publish|consume|latency|large|queues|tasks|memory|setup` for one group,
//! `--runtime current|multi` (default `current`); for the groups at scale
//! (`scale.rs`), `--large-mib N` (default 256) MiB of bodies a large-body
//! row, `--queues N` (default 100), `--publishing-tasks N` (default 1000),
//! `--idle N` (default 500) idle connections and consumers, `--setups N`
//! (default 200) connections a set-up row.
//!
//! Every body but the large ones is 256 bytes. All clients run in this one process, one after
//! another, on one current-thread tokio runtime (lapin adds its own I/O
//! thread; its CPU is counted like any other thread's); `--runtime multi`
//! gives the runtime a worker thread per core instead, for every client.
//!
//! # The scenarios
//!
//! 1. **Confirmed publish, window 1000**: `--messages` publishes to a durable
//!    classic queue through the default exchange, in confirm mode, never more
//!    than 1000 unconfirmed; the row ends when the last is confirmed. Each
//!    row starts on an empty queue (purged after every row). Two groups,
//!    by the properties on the wire:
//!    - *minimal*: `delivery-mode` 1 only. Wire floor, the wire floor on
//!      tokio (its bytes, reads and writes through tokio's `TcpStream`, an
//!      `await` where it would block: what waiting on a reactor adds),
//!      acemq engine (`Channel::publish`), lapin, amqprs.
//!    - *envelope*: what `Publisher` writes: `content-type`,
//!      `delivery-mode` 1, `timestamp`, `message-id` (a UUID) and the
//!      headers `x-acemq-attempt` (`I`) and `x-acemq-first-seen` (`T`).
//!      Wire floor, engine, lapin and amqprs send one such set (engine.rs's
//!      `envelope_properties()`); `Publisher::begin_send` (one task, window
//!      1000) and `Publisher::send` (`--tasks` tasks, each awaiting its own
//!      confirm) send their own, a new id and timestamp each, a ~256-byte
//!      JSON body. After every row one message is taken back with
//!      `basic.get` and its property flags, property byte length and header
//!      names and types are checked against the group's: like for like is
//!      checked, not assumed.
//! 2. **Consume with ack, prefetch 1000**: the queue is filled (untimed)
//!    with exactly `--messages` messages from `Publisher::begin_send`
//!    (envelope properties, JSON body), the same for every row, and the row
//!    consumes them all, acking each: the engine, lapin and amqprs ack every
//!    delivery on its own (lapin's ack awaited, as its API has it), the wire
//!    floor (blocking, and on tokio) acks once per read with `multiple`, the acemq API `consume`
//!    decodes every body as JSON and accepts it.
//! 3. **Latency, publish → delivery, one in flight**: one connection per
//!    client, a publishing channel (no confirms) and a consuming channel
//!    (prefetch 1000, manual acks): publish one message (minimal
//!    properties), wait until the consumer has it, note the time, ack it,
//!    repeat. Wire floor, engine, lapin, amqprs.
//! 4. **At size and scale** (`scale.rs`): large bodies (64 KiB and 1 MiB,
//!    confirmed publish and consume with ack, 16 MiB in flight; the
//!    allocations of every row counted by this binary's global allocator,
//!    `counting.rs`), many queues (a consumer each on one connection), many
//!    publishing tasks (on a runtime of two workers), memory per idle
//!    connection, idle consumer and unacked delivery, and connection
//!    set-up. BENCHMARKS.md describes each.
//!
//! # Reading the table
//!
//! Every figure is a min–max range over the rounds (the order of the
//! clients in a group turns from round to round). `msg/s` is messages over
//! wall time; `CPU µs/msg` is this process's CPU time (every thread, from
//! `/proc/self/task/*/schedstat`, as in `benches/engine.rs`) over messages;
//! `runs/1k` is how many times a thread of this process was put on a CPU
//! per 1000 messages (each a wakeup and a context switch). `CPU ×floor`
//! divides a row's CPU per message by the wire floor's in the same group and
//! round; `msg/s ×engine` divides its rate by the acemq engine's in the same
//! group and round. The latency table gives p50, p99 and max of the
//! round trips and the CPU per round trip. The performance targets
//! follow, each as its per-round ratio (median and min–max) and in how many
//! rounds it was met. The machine is shared and its speed moves between
//! runs: compare rows of one run, never figures of different runs. Timing is
//! printed, never asserted.
//!
//! Every wait has a deadline (`DEADLINE` per row, the floor's socket read
//! timeout): a stalled run fails naming the row and what it waited for.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_codec::{BasicProperties, FieldValue, QueueDeclare, QueueDelete, QueuePurge};
use acemq_core::amqp::{AmqpUrl, Config, Confirmation, Connection};
use bytes::Bytes;

/// The wire floor, its CPU accounting and [`floor::Figures`], shared with
/// `benches/engine.rs`.
#[allow(dead_code)] // the engine bench's printing and knobs are not used here
#[path = "../../floor/mod.rs"]
mod floor;

mod counting;
mod peers;
mod scale;

use floor::{cpu_time, Figures};

/// Counts allocations while the large-body and memory groups run (see
/// `counting.rs`).
#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// How long one row may take before the run fails.
const DEADLINE: Duration = Duration::from_secs(300);
/// Unconfirmed publishes at most, and the consumers' prefetch.
const WINDOW: usize = 1000;
/// The body size of every message but the JSON ones (about the same).
const BODY: usize = 256;

/// The command line.
struct Args {
    rounds: usize,
    messages: u64,
    /// Each throughput row in this many slices, the clients of a group
    /// taking turns slice by slice (`--slices`).
    slices: u64,
    samples: usize,
    tasks: u64,
    only: Option<String>,
    /// Whether the tokio runtime has worker threads (`--runtime multi`).
    multi_thread: bool,
    /// MiB of bodies a large-body row moves (`--large-mib`).
    large_mib: u64,
    /// Queues of the many-queues group (`--queues`).
    queues: usize,
    /// Tasks of the many-publishing-tasks group (`--publishing-tasks`).
    publishing_tasks: u64,
    /// Idle connections and idle consumers the memory group opens (`--idle`).
    idle: usize,
    /// Connections the set-up group opens per row (`--setups`).
    setups: usize,
}

/// The groups `--only` can pick.
const GROUPS: [&str; 8] = [
    "publish", "consume", "latency", "large", "queues", "tasks", "memory", "setup",
];

impl Args {
    fn parse() -> Args {
        let mut args = Args {
            rounds: 3,
            messages: 200_000,
            slices: 1,
            samples: 10_000,
            tasks: 256,
            only: None,
            multi_thread: false,
            large_mib: 256,
            queues: 100,
            publishing_tasks: 1000,
            idle: 500,
            setups: 200,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
            match flag.as_str() {
                "--rounds" => args.rounds = number(&value()),
                "--messages" => args.messages = number(&value()),
                "--slices" => args.slices = number(&value()),
                "--samples" => args.samples = number(&value()),
                "--tasks" => args.tasks = number(&value()),
                "--large-mib" => args.large_mib = number(&value()),
                "--queues" => args.queues = number(&value()),
                "--publishing-tasks" => args.publishing_tasks = number(&value()),
                "--idle" => args.idle = number(&value()),
                "--setups" => args.setups = number(&value()),
                "--only" => {
                    let group = value();
                    if !GROUPS.contains(&group.as_str()) {
                        usage(&format!("--only {group}: one of {}", GROUPS.join(", ")));
                    }
                    args.only = Some(group);
                }
                "--runtime" => match value().as_str() {
                    "current" => args.multi_thread = false,
                    "multi" => args.multi_thread = true,
                    other => usage(&format!("--runtime {other}: current or multi")),
                },
                "-h" | "--help" => usage(""),
                other => usage(&format!("unknown argument {other}")),
            }
        }
        if args.rounds == 0 || args.messages == 0 || args.samples == 0 || args.tasks == 0 || args.slices == 0 {
            usage("--rounds, --messages, --slices, --samples and --tasks must be positive");
        }
        if args.large_mib == 0 || args.queues == 0 || args.publishing_tasks == 0 || args.idle == 0 || args.setups == 0 {
            usage("--large-mib, --queues, --publishing-tasks, --idle and --setups must be positive");
        }
        if args.messages < args.queues as u64 * args.slices {
            usage("--messages must give every queue of --queues a message in every slice");
        }
        if !args.messages.is_multiple_of(args.slices) {
            usage("--messages must be a multiple of --slices");
        }
        args
    }

    fn runs(&self, group: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == group)
    }
}

fn number<T: std::str::FromStr>(text: &str) -> T {
    text.parse().unwrap_or_else(|_| usage(&format!("not a number: {text}")))
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("acemq-peers: {problem}");
    }
    eprintln!(
        "usage: acemq-peers [--rounds N] [--messages N] [--samples N] [--tasks N] \
         [--slices N] [--only publish|consume|latency|large|queues|tasks|memory|setup] \
         [--runtime current|multi] [--large-mib N] [--queues N] [--publishing-tasks N] [--idle N] [--setups N]"
    );
    std::process::exit(2)
}

/// Runs `future`, or fails the run naming `what` it waited for.
async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(DEADLINE, future).await {
        Ok(value) => value,
        Err(_) => panic!("stalled: {what} did not finish within {DEADLINE:?}"),
    }
}

/// The properties the minimal rows send: `delivery-mode` 1.
fn minimal_properties() -> BasicProperties {
    BasicProperties {
        delivery_mode: Some(1),
        ..Default::default()
    }
}

/// The properties `Publisher` writes (content type, delivery mode,
/// timestamp, message id, the envelope headers), as engine.rs's
/// `envelope_properties()` builds them.
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

/// The JSON payload of the API rows, about 256 bytes (engine.rs's).
#[derive(serde::Serialize, serde::Deserialize)]
struct Payload {
    order_id: u64,
    customer: String,
    note: String,
}

impl Payload {
    fn new(order_id: u64) -> Self {
        Payload {
            order_id,
            customer: "customer-0000000000000000000000000000".into(),
            note: "n".repeat(180),
        }
    }
}

/// Which properties a group's rows send.
#[derive(Clone, Copy, PartialEq)]
enum Props {
    Minimal,
    Envelope,
}

impl Props {
    fn properties(self) -> BasicProperties {
        match self {
            Props::Minimal => minimal_properties(),
            Props::Envelope => envelope_properties(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Props::Minimal => "minimal",
            Props::Envelope => "envelope",
        }
    }
}

/// A row of the table: who sends or takes the messages.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Client {
    Floor,
    /// The wire floor's bytes, reads and writes through tokio's
    /// `TcpStream` (`floor::Waiting::OnTokio`): the least a tokio client
    /// spends.
    FloorOnTokio,
    Engine,
    /// The engine with the properties given once as an `Arc`.
    EngineShared,
    Lapin,
    Amqprs,
    BeginSend,
    Send,
    ApiConsume,
    /// The wire floor whose reads spin instead of sleeping (latency only).
    FloorSpinning,
    /// The engine with `Config::busy_poll` set (latency only).
    EngineBusyPoll,
    /// The engine with `Config::read_interval` set (minimal publish,
    /// consume, latency): what it saves beside what it costs.
    EngineReadInterval,
}

/// The engine's `Config::read_interval` in the rows that set it.
const READ_INTERVAL: Duration = Duration::from_millis(2);

/// The engine's `Config::busy_poll` in the latency row that sets it.
const BUSY_POLL: Duration = Duration::from_millis(1);

impl Client {
    fn name(self, tasks: u64) -> String {
        match self {
            Client::Floor => "wire floor".into(),
            Client::FloorOnTokio => "wire floor on tokio".into(),
            Client::Engine => "acemq engine".into(),
            Client::EngineShared => "acemq engine, properties shared".into(),
            Client::Lapin => "lapin".into(),
            Client::Amqprs => "amqprs".into(),
            Client::BeginSend => "acemq Publisher::begin_send".into(),
            Client::Send => format!("acemq Publisher::send ({tasks} tasks)"),
            Client::ApiConsume => "acemq consume (JSON, accept)".into(),
            Client::FloorSpinning => "wire floor, reads spinning".into(),
            Client::EngineBusyPoll => format!("acemq engine, busy_poll {} ms", BUSY_POLL.as_millis()),
            Client::EngineReadInterval => format!("acemq engine, read_interval {} ms", READ_INTERVAL.as_millis()),
        }
    }
}

impl Client {
    /// How a wire floor row waits for its socket.
    fn waiting(self) -> floor::Waiting {
        if self == Client::FloorOnTokio {
            floor::Waiting::OnTokio
        } else {
            floor::Waiting::Blocking
        }
    }
}

/// Every client's connection, opened once.
struct Clients {
    url: String,
    addr: AmqpUrl,
    engine: Connection,
    /// The engine with [`BUSY_POLL`].
    engine_busy_poll: Connection,
    /// The engine with [`READ_INTERVAL`].
    engine_read_interval: Connection,
    api: acemq_core::Conn,
    lapin: lapin::Connection,
    amqprs: amqprs::connection::Connection,
    /// The engine channel that declares, purges, checks and deletes.
    setup: acemq_core::amqp::Channel,
    queue: String,
}

impl Clients {
    async fn open(url: &str) -> Clients {
        let addr: AmqpUrl = url.parse().expect("ACEMQ_RABBITMQ_URL parses");
        assert!(
            !addr.tls,
            "the wire floor speaks plain TCP: ACEMQ_RABBITMQ_URL must be amqp://"
        );
        let engine = match within("the engine's connection", Connection::open(url, Config::default())).await {
            Ok(conn) => conn,
            Err(err) => {
                eprintln!("acemq-peers: no RabbitMQ at {url}: {err} (start one with scripts/rabbitmq.sh start)");
                std::process::exit(1);
            }
        };
        let busy_poll = Config::default().with_busy_poll(BUSY_POLL);
        let engine_busy_poll = within("the busy-polling engine's connection", Connection::open(url, busy_poll))
            .await
            .expect("the engine connects");
        let read_interval = Config::default().with_read_interval(READ_INTERVAL);
        let engine_read_interval = within(
            "the read-interval engine's connection",
            Connection::open(url, read_interval),
        )
        .await
        .expect("the engine connects");
        let api = within(
            "the API's connection",
            acemq_core::Conn::open(url, acemq_core::Config::default()),
        )
        .await
        .expect("acemq Conn opens");
        let lapin = within("lapin's connection", peers::lapin_connect(&addr)).await;
        let amqprs = within("amqprs's connection", peers::amqprs_connect(&addr)).await;
        let setup = engine.channel().await.expect("setup channel");
        let queue = format!("acemq-peers-{}", std::process::id());
        within(
            "queue.declare",
            setup.queue_declare(QueueDeclare {
                queue: queue.as_str().into(),
                durable: true,
                ..Default::default()
            }),
        )
        .await
        .expect("queue.declare");
        Clients {
            url: url.into(),
            addr,
            engine,
            engine_busy_poll,
            engine_read_interval,
            api,
            lapin,
            amqprs,
            setup,
            queue,
        }
    }

    /// The connection of an engine row: the engine's, or the one opened
    /// with its setting.
    fn engine(&self, client: Client) -> &Connection {
        match client {
            Client::EngineBusyPoll => &self.engine_busy_poll,
            Client::EngineReadInterval => &self.engine_read_interval,
            _ => &self.engine,
        }
    }

    async fn purge(&self) {
        let purge = QueuePurge {
            queue: self.queue.as_str().into(),
            ..Default::default()
        };
        within("queue.purge", self.setup.queue_purge(purge))
            .await
            .expect("queue.purge");
    }

    /// Takes one message back and checks that it carries the properties
    /// `props` stands for: the same flag word, the same number of property
    /// bytes, the same header names and types (ids and timestamps differ).
    async fn check_properties(&self, client: Client, props: Props) {
        let got = within("basic.get", self.setup.basic_get(&self.queue, true))
            .await
            .expect("basic.get")
            .unwrap_or_else(|| panic!("{client:?} ({}): the queue is empty after publishing", props.name()));
        let got = got.properties.expect("the properties decode");
        let mut expected = bytes::BytesMut::new();
        props.properties().encode(&mut expected).expect("encode");
        let wire = got.wire_bytes().map_or(0, |b| b.len());
        let headers = |p: &BasicProperties| {
            let mut names: Vec<(String, u8)> = p
                .headers
                .iter()
                .flat_map(|h| h.iter())
                .map(|(k, v)| (k.as_str().unwrap_or("?").to_string(), v.type_code()))
                .collect();
            names.sort();
            names
        };
        let flags = got.flags();
        let got_headers = headers(&got.into_basic());
        let want_headers = headers(&props.properties());
        let want_flags = props.properties().flags();
        assert!(
            flags == want_flags && wire == expected.len() && got_headers == want_headers,
            "{client:?} sent other properties than the {} group's: flags {flags:#06x} vs {want_flags:#06x}, \
             {wire} vs {} bytes, headers {got_headers:?} vs {want_headers:?}",
            props.name(),
            expected.len(),
        );
    }

    /// Fills the queue with `messages` JSON messages from
    /// `Publisher::begin_send` (untimed).
    async fn preload(&self, messages: u64) {
        within(
            "the preload's confirms",
            publisher_window(&self.api, &self.queue, messages),
        )
        .await;
    }

    async fn close(self) {
        within(
            "queue.delete",
            self.setup.queue_delete(QueueDelete {
                queue: self.queue.as_str().into(),
                ..Default::default()
            }),
        )
        .await
        .expect("queue.delete");
        within("lapin's close", peers::lapin_close(&self.lapin)).await;
        within("amqprs's close", self.amqprs.close())
            .await
            .expect("amqprs closes");
        within("the API's close", self.api.close())
            .await
            .expect("acemq Conn closes");
        within("the engine's close", self.engine.close())
            .await
            .expect("engine closes");
    }
}

/// The engine's confirmed publish: `Channel::publish`, futures of the
/// confirms kept in a queue of at most [`WINDOW`]. The properties are
/// cloned for every publish, or shared when given as a `&Arc`; the body
/// (`body` bytes, made once) is lent as a `&Bytes`. At most `window`
/// unconfirmed.
async fn engine_publish(
    conn: &Connection,
    queue: &str,
    messages: u64,
    props: impl acemq_core::amqp::PublishProperties + Clone,
    body: usize,
    window: usize,
) -> Figures {
    let ch = conn.channel().await.expect("engine channel");
    ch.confirm_select().await.expect("confirm.select");
    let body = Bytes::from(vec![b'x'; body]);
    let mut in_flight = VecDeque::with_capacity(window);
    let (t0, c0) = (Instant::now(), cpu_time());
    for _ in 0..messages {
        if in_flight.len() == window {
            let confirm: acemq_core::amqp::PublishConfirm = in_flight.pop_front().unwrap();
            assert_eq!(confirm.await.expect("engine confirm"), Confirmation::Ack);
        }
        in_flight.push_back(
            ch.publish("", queue, false, props.clone(), &body)
                .await
                .expect("publish"),
        );
    }
    for confirm in in_flight {
        assert_eq!(confirm.await.expect("engine confirm"), Confirmation::Ack);
    }
    let figures = Figures::since("engine publish", messages, t0, c0);
    ch.close().await.expect("channel.close");
    figures
}

/// `Publisher::begin_send` from one task, at most [`WINDOW`] in flight.
async fn publisher_window(conn: &acemq_core::Conn, queue: &str, messages: u64) -> Figures {
    let publisher = conn.publisher::<Payload>("", queue).transient();
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut in_flight = VecDeque::with_capacity(WINDOW);
    let mut payload = Payload::new(0);
    for i in 0..messages {
        if in_flight.len() == WINDOW {
            let oldest: acemq_core::PendingSend = in_flight.pop_front().unwrap();
            oldest.await.expect("begin_send confirm");
        }
        payload.order_id = i;
        in_flight.push_back(publisher.begin_send(&payload).await.expect("begin_send"));
    }
    for pending in in_flight {
        pending.await.expect("begin_send confirm");
    }
    Figures::since("Publisher::begin_send", messages, t0, c0)
}

/// `Publisher::send` from `tasks` tasks, each awaiting its own confirm.
async fn publisher_send(conn: &acemq_core::Conn, queue: &str, messages: u64, tasks: u64) -> Figures {
    let publisher = conn.publisher::<Payload>("", queue).transient();
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let publisher = publisher.clone();
        let share = messages / tasks + u64::from(task < messages % tasks);
        set.spawn(async move {
            for i in 0..share {
                publisher.send(&Payload::new(task * 1_000_000 + i)).await.expect("send");
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("a send task");
    }
    Figures::since("Publisher::send", messages, t0, c0)
}

/// The engine's consumer at prefetch `prefetch`, acking every delivery
/// on its own.
async fn engine_consume(conn: &Connection, queue: &str, messages: u64, prefetch: u16) -> Figures {
    let ch = conn.channel().await.expect("engine channel");
    ch.qos(prefetch).await.expect("basic.qos");
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut consumer = ch.consume(queue).await.expect("basic.consume");
    for _ in 0..messages {
        let delivery = consumer.next().await.expect("a delivery");
        delivery.ack().expect("ack");
    }
    let figures = Figures::since("engine consume", messages, t0, c0);
    consumer.cancel().await.expect("basic.cancel");
    ch.close().await.expect("channel.close");
    figures
}

/// The acemq consumer: every body decoded as a JSON [`Payload`], accepted.
async fn api_consume(conn: &acemq_core::Conn, queue: &str, messages: u64) -> Figures {
    use acemq_core::{consume, Ack, Message};
    let accepted = Arc::new(AtomicU64::new(0));
    let (t0, c0) = (Instant::now(), cpu_time());
    let counter = accepted.clone();
    let consumer = consume(conn, queue, move |_: Message<Payload>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::Relaxed);
            Ack::accept()
        }
    })
    .prefetch(WINDOW as u16)
    .await
    .expect("consume");
    while accepted.load(Ordering::Relaxed) < messages {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let figures = Figures::since("acemq consume", messages, t0, c0);
    consumer.close().await.expect("consumer closes");
    figures
}

/// Latency samples of one row, and the CPU they took.
pub struct Latency {
    samples: Vec<Duration>,
    cpu_per_message: Duration,
}

impl Latency {
    fn percentile(&self, p: usize) -> Duration {
        let i = (self.samples.len() * p / 100).min(self.samples.len() - 1);
        self.samples[i]
    }
}

/// Collects round trips: the first `warmup` are dropped, the CPU time of
/// the rest is counted.
pub struct Sampler {
    warmup: usize,
    taken: Vec<Duration>,
    seen: usize,
    total: usize,
    c0: floor::Cpu,
}

impl Sampler {
    pub fn new(warmup: usize, samples: usize) -> Sampler {
        Sampler {
            warmup,
            taken: Vec::with_capacity(samples),
            seen: 0,
            total: warmup + samples,
            c0: cpu_time(),
        }
    }

    /// Whether another round trip is wanted.
    pub fn more(&self) -> bool {
        self.seen < self.total
    }

    pub fn push(&mut self, elapsed: Duration) {
        self.seen += 1;
        if self.seen > self.warmup {
            self.taken.push(elapsed);
        }
        if self.seen == self.warmup {
            self.c0 = cpu_time();
        }
    }

    pub fn finish(mut self) -> Latency {
        let cpu = (cpu_time() - self.c0).total;
        self.taken.sort();
        let n = self.taken.len().max(1) as u32;
        Latency {
            samples: self.taken,
            cpu_per_message: cpu / n,
        }
    }
}

async fn engine_latency(conn: &Connection, queue: &str, warmup: usize, samples: usize) -> Latency {
    let publisher = conn.channel().await.expect("engine channel");
    let ch = conn.channel().await.expect("engine channel");
    ch.qos(WINDOW as u16).await.expect("basic.qos");
    let mut consumer = ch.consume(queue).await.expect("basic.consume");
    let (props, body) = (minimal_properties(), Bytes::from(vec![b'x'; BODY]));
    let mut sampler = Sampler::new(warmup, samples);
    while sampler.more() {
        let t0 = Instant::now();
        // No confirm mode: the returned future is not needed.
        drop(
            publisher
                .publish("", queue, false, props.clone(), &body)
                .await
                .expect("publish"),
        );
        let delivery = consumer.next().await.expect("a delivery");
        sampler.push(t0.elapsed());
        delivery.ack().expect("ack");
    }
    let latency = sampler.finish();
    consumer.cancel().await.expect("basic.cancel");
    ch.close().await.expect("channel.close");
    publisher.close().await.expect("channel.close");
    latency
}

/// The latency scenario on the wire: channel 1 consumes, channel 2
/// publishes; each delivery's ack goes out in the same write as the next
/// publish. With `spin`, its reads spin on a non-blocking socket rather
/// than sleep in the kernel: the latency of a client that never lets its
/// thread sleep, whatever else it does.
fn floor_latency(addr: &AmqpUrl, queue: &str, warmup: usize, samples: usize, spin: bool) -> std::io::Result<Latency> {
    use acemq_codec::{encode_content, encode_method, BasicAck, BasicConsume, BasicPublish, BasicQos, ChannelOpen};
    use acemq_codec::{Method, DEFAULT_FRAME_MAX, FRAME_BODY, FRAME_METHOD};
    let mut wire = floor::Wire::open(addr)?;
    wire.spin(spin)?;
    wire.send(2, ChannelOpen::default())?;
    wire.expect(|m| matches!(m, Method::ChannelOpenOk(_)))?;
    wire.send(
        1,
        BasicQos {
            prefetch_count: WINDOW as u16,
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
    let publish = BasicPublish {
        routing_key: queue.into(),
        ..Default::default()
    };
    let mut one = bytes::BytesMut::new();
    encode_content(
        2,
        &publish.into(),
        &minimal_properties(),
        &[b'x'; BODY],
        DEFAULT_FRAME_MAX,
        &mut one,
    )
    .map_err(std::io::Error::other)?;
    let mut sampler = Sampler::new(warmup, samples);
    while sampler.more() {
        let t0 = Instant::now();
        wire.out.extend_from_slice(&one);
        wire.flush()?;
        let mut tag = None;
        'delivered: loop {
            wire.read_some()?;
            while let Some((kind, from, to)) = wire.next_frame() {
                let payload = &wire.buf[from..to];
                if kind == FRAME_METHOD && payload.starts_with(&floor::BASIC_DELIVER) {
                    let tag_len = usize::from(payload[4]);
                    tag = Some(floor::tag_at(payload, 5 + tag_len));
                } else if kind == FRAME_BODY {
                    break 'delivered;
                }
            }
        }
        sampler.push(t0.elapsed());
        let ack = BasicAck {
            delivery_tag: tag.expect("a basic.deliver before the body"),
            multiple: false,
        };
        encode_method(1, &ack.into(), &mut wire.out).map_err(std::io::Error::other)?;
    }
    wire.flush()?;
    let latency = sampler.finish();
    wire.close()?;
    Ok(latency)
}

/// One round's figures of every row that ran.
#[derive(Default)]
struct Round {
    /// (group, client, figures)
    rows: Vec<(&'static str, Client, Figures)>,
    latency: Vec<(Client, Latency)>,
    /// The groups at scale (`scale.rs`).
    scale: scale::Round,
}

impl Round {
    fn get(&self, group: &str, client: Client) -> Option<&Figures> {
        self.rows
            .iter()
            .find(|(g, c, _)| *g == group && *c == client)
            .map(|(_, _, f)| f)
    }

    /// `client`'s latency at percentile `p`, if it ran.
    fn latency(&self, client: Client, p: usize) -> Option<Duration> {
        self.latency
            .iter()
            .find(|(c, _)| *c == client)
            .map(|(_, l)| l.percentile(p))
    }
}

/// The throughput groups: (name, properties, rows).
const PUBLISH_GROUPS: [(&str, Props, &[Client]); 2] = [
    (
        "publish, minimal properties",
        Props::Minimal,
        &[
            Client::Floor,
            Client::FloorOnTokio,
            Client::Engine,
            Client::EngineShared,
            Client::EngineReadInterval,
            Client::Lapin,
            Client::Amqprs,
        ],
    ),
    (
        "publish, envelope properties",
        Props::Envelope,
        &[
            Client::Floor,
            Client::Engine,
            Client::EngineShared,
            Client::Lapin,
            Client::Amqprs,
            Client::BeginSend,
            Client::Send,
        ],
    ),
];
const CONSUME_GROUP: &str = "consume with ack, envelope + JSON";
const CONSUME_ROWS: [Client; 7] = [
    Client::Floor,
    Client::FloorOnTokio,
    Client::Engine,
    Client::EngineReadInterval,
    Client::Lapin,
    Client::Amqprs,
    Client::ApiConsume,
];
const LATENCY_ROWS: [Client; 7] = [
    Client::Floor,
    Client::Engine,
    Client::Lapin,
    Client::Amqprs,
    Client::FloorSpinning,
    Client::EngineBusyPoll,
    Client::EngineReadInterval,
];

/// `rows` turned by `by`: each round starts with another client, so that no
/// client always runs first (or last) in a group.
fn rotated<C: Copy>(rows: &[C], by: usize) -> Vec<C> {
    let mut rows = rows.to_vec();
    let n = rows.len();
    rows.rotate_left(by % n);
    rows
}

/// The order a group's rows run in: `slices` turns, each of every client
/// once, the order turned from round to round and from slice to slice (with
/// one slice, [`rotated`] by the round). Each item is (slice, client).
fn slices<C: Copy>(rows: &[C], round: usize, slices: u64) -> Vec<(u64, C)> {
    (0..slices)
        .flat_map(|slice| {
            rotated(rows, round + slice as usize)
                .into_iter()
                .map(move |client| (slice, client))
        })
        .collect()
}

/// Each client's slices of a group added up, in the order the clients
/// first ran.
struct Sums<C>(Vec<(C, Figures)>);

impl<C> Default for Sums<C> {
    fn default() -> Self {
        Sums(Vec::new())
    }
}

impl<C: PartialEq> Sums<C> {
    fn add(&mut self, client: C, f: Figures) {
        match self.0.iter_mut().find(|(c, _)| *c == client) {
            Some((_, sum)) => {
                sum.messages += f.messages;
                sum.wall += f.wall;
                sum.cpu = sum.cpu + f.cpu;
            }
            None => self.0.push((client, f)),
        }
    }
}

async fn run_round(clients: &Clients, args: &Args, round: usize) -> Round {
    let mut figures = Round::default();
    let queue = clients.queue.as_str();
    // Messages a slice of a throughput row (the whole row with one slice).
    let messages = args.messages / args.slices;
    if args.runs("publish") {
        for (group, props, rows) in PUBLISH_GROUPS {
            let mut sums = Sums::default();
            for (slice, client) in slices(rows, round, args.slices) {
                let what = format!("{} ({group})", client.name(args.tasks));
                let properties = props.properties();
                let f = match client {
                    Client::Floor | Client::FloorOnTokio => {
                        let waiting = client.waiting();
                        let addr = &clients.addr;
                        let publish =
                            floor::publish(addr, queue, messages, WINDOW as u64, properties, "floor", waiting);
                        within(&what, publish)
                            .await
                            .unwrap_or_else(|err| panic!("{what}: {err}"))
                    }
                    Client::Engine | Client::EngineReadInterval => {
                        within(
                            &what,
                            engine_publish(clients.engine(client), queue, messages, properties, BODY, WINDOW),
                        )
                        .await
                    }
                    Client::EngineShared => {
                        // Borrowed: the publish neither clones nor drops the `Arc`.
                        let shared = std::sync::Arc::new(properties);
                        within(
                            &what,
                            engine_publish(&clients.engine, queue, messages, &shared, BODY, WINDOW),
                        )
                        .await
                    }
                    Client::Lapin => {
                        let publish = peers::lapin_publish(&clients.lapin, queue, messages, props, BODY, WINDOW);
                        within(&what, publish).await
                    }
                    Client::Amqprs => {
                        let publish = peers::amqprs_publish(&clients.amqprs, queue, messages, props, BODY, WINDOW);
                        within(&what, publish).await
                    }
                    Client::BeginSend => within(&what, publisher_window(&clients.api, queue, messages)).await,
                    Client::Send => within(&what, publisher_send(&clients.api, queue, messages, args.tasks)).await,
                    Client::ApiConsume | Client::FloorSpinning | Client::EngineBusyPoll => unreachable!(),
                };
                if slice == 0 {
                    clients.check_properties(client, props).await;
                }
                clients.purge().await;
                sums.add(client, f);
            }
            for (client, f) in sums.0 {
                progress(round, group, &client.name(args.tasks), &f);
                figures.rows.push((group, client, f));
            }
        }
    }
    if args.runs("consume") {
        let mut sums = Sums::default();
        for (_, client) in slices(&CONSUME_ROWS, round, args.slices) {
            clients.preload(messages).await;
            let what = format!("{} ({CONSUME_GROUP})", client.name(args.tasks));
            let f = match client {
                Client::Floor | Client::FloorOnTokio => {
                    let waiting = client.waiting();
                    let consume = floor::consume(&clients.addr, queue, messages, WINDOW as u16, "floor", waiting);
                    within(&what, consume)
                        .await
                        .unwrap_or_else(|err| panic!("{what}: {err}"))
                }
                Client::Engine | Client::EngineReadInterval => {
                    let consume = engine_consume(clients.engine(client), queue, messages, WINDOW as u16);
                    within(&what, consume).await
                }
                Client::Lapin => {
                    within(
                        &what,
                        peers::lapin_consume(&clients.lapin, queue, messages, WINDOW as u16),
                    )
                    .await
                }
                Client::Amqprs => {
                    within(
                        &what,
                        peers::amqprs_consume(&clients.amqprs, queue, messages, WINDOW as u16),
                    )
                    .await
                }
                Client::ApiConsume => within(&what, api_consume(&clients.api, queue, messages)).await,
                _ => unreachable!(),
            };
            clients.purge().await;
            sums.add(client, f);
        }
        for (client, f) in sums.0 {
            progress(round, CONSUME_GROUP, &client.name(args.tasks), &f);
            figures.rows.push((CONSUME_GROUP, client, f));
        }
    }
    if args.runs("latency") {
        let (warmup, samples) = (args.samples.div_ceil(10), args.samples);
        // `ACEMQ_PEERS_LATENCY_ROW=Engine` (a row's name as `Client`
        // spells it) runs that row alone, for profiling.
        let only = std::env::var("ACEMQ_PEERS_LATENCY_ROW").ok();
        for client in rotated(&LATENCY_ROWS, round) {
            if only.as_ref().is_some_and(|only| *only != format!("{client:?}")) {
                continue;
            }
            let what = format!("{} (latency)", client.name(args.tasks));
            let latency = match client {
                Client::Floor | Client::FloorSpinning => {
                    let spin = client == Client::FloorSpinning;
                    floor_latency(&clients.addr, queue, warmup, samples, spin)
                        .unwrap_or_else(|err| panic!("{what}: {err}"))
                }
                Client::Engine | Client::EngineBusyPoll | Client::EngineReadInterval => {
                    within(&what, engine_latency(clients.engine(client), queue, warmup, samples)).await
                }
                Client::Lapin => within(&what, peers::lapin_latency(&clients.lapin, queue, warmup, samples)).await,
                Client::Amqprs => within(&what, peers::amqprs_latency(&clients.amqprs, queue, warmup, samples)).await,
                _ => unreachable!(),
            };
            clients.purge().await;
            eprintln!(
                "round {} | latency | {:<36} p50 {:>7.1} µs  p90 {:>7.1} µs  p99 {:>7.1} µs  p99.9 {:>7.1} µs  max {:>8.1} µs",
                round + 1,
                client.name(args.tasks),
                micros(latency.percentile(50)),
                micros(latency.percentile(90)),
                micros(latency.percentile(99)),
                micros(latency.samples[(latency.samples.len() * 999 / 1000).min(latency.samples.len() - 1)]),
                micros(*latency.samples.last().unwrap()),
            );
            figures.latency.push((client, latency));
        }
    }
    figures.scale = scale::run_round(clients, args, round).await;
    figures
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn rate(f: &Figures) -> f64 {
    f.messages as f64 / f.wall.as_secs_f64()
}

fn cpu_per_message(f: &Figures) -> f64 {
    f.cpu.total.as_secs_f64() * 1e6 / f.messages as f64
}

fn progress(round: usize, group: &str, name: &str, f: &Figures) {
    eprintln!(
        "round {} | {group} | {name:<36} {:>8.0} msg/s {:>6.2} µs CPU/msg  wall {:.2?}",
        round + 1,
        rate(f),
        cpu_per_message(f),
        f.wall
    );
}

/// The smallest and largest of `values`, as "a–b" (or "a" when equal at
/// the precision shown), or "–" when there are none.
fn range(values: &[f64], decimals: usize) -> String {
    if values.is_empty() {
        return "–".into();
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (a, b) = (format!("{min:.decimals$}"), format!("{max:.decimals$}"));
    if a == b {
        a
    } else {
        format!("{a}–{b}")
    }
}

fn print_table(rounds: &[Round], args: &Args) {
    let header = format!(
        "{:<36} {:>15} {:>12} {:>11} {:>13} {:>11}",
        "row", "msg/s", "CPU µs/msg", "CPU ×floor", "msg/s ×engine", "runs/1k"
    );
    println!();
    println!(
        "{} round(s), {} messages per row ({} slice(s), the clients taking turns), {}-byte bodies, \
         window/prefetch {WINDOW} (large bodies: {} MiB a row, 16 MiB in flight), {} tokio runtime; min–max over rounds",
        rounds.len(),
        args.messages,
        args.slices,
        BODY,
        args.large_mib,
        if args.multi_thread {
            "multi-thread"
        } else {
            "current-thread"
        },
    );
    let mut groups: Vec<(&str, Vec<Client>)> = Vec::new();
    if args.runs("publish") {
        groups.extend(PUBLISH_GROUPS.iter().map(|(g, _, rows)| (*g, rows.to_vec())));
    }
    if args.runs("consume") {
        groups.push((CONSUME_GROUP, CONSUME_ROWS.to_vec()));
    }
    for (group, rows) in groups {
        println!();
        println!("{group}");
        println!("{header}");
        for client in rows {
            let per_round: Vec<(&Figures, Option<&Figures>, Option<&Figures>)> = rounds
                .iter()
                .filter_map(|r| {
                    r.get(group, client)
                        .map(|f| (f, r.get(group, Client::Floor), r.get(group, Client::Engine)))
                })
                .collect();
            let rates: Vec<f64> = per_round.iter().map(|(f, _, _)| rate(f)).collect();
            let cpus: Vec<f64> = per_round.iter().map(|(f, _, _)| cpu_per_message(f)).collect();
            let vs_floor: Vec<f64> = per_round
                .iter()
                .filter_map(|(f, floor, _)| floor.map(|fl| cpu_per_message(f) / cpu_per_message(fl)))
                .collect();
            let vs_engine: Vec<f64> = per_round
                .iter()
                .filter_map(|(f, _, engine)| engine.map(|e| rate(f) / rate(e)))
                .collect();
            let runs: Vec<f64> = per_round
                .iter()
                .map(|(f, _, _)| f.cpu.runs as f64 * 1000.0 / f.messages as f64)
                .collect();
            println!(
                "{:<36} {:>15} {:>12} {:>11} {:>13} {:>11}",
                client.name(args.tasks),
                range(&rates, 0),
                range(&cpus, 2),
                range(&vs_floor, 2),
                range(&vs_engine, 2),
                range(&runs, 0),
            );
        }
    }
    if args.runs("latency") {
        println!();
        println!(
            "latency, publish → delivery, one in flight, {} samples after {} warm-up; µs, min–max over rounds",
            args.samples,
            args.samples.div_ceil(10)
        );
        println!(
            "{:<36} {:>17} {:>17} {:>19} {:>13}",
            "row", "p50", "p99", "max", "CPU µs/msg"
        );
        for client in LATENCY_ROWS {
            let of = |f: &dyn Fn(&Latency) -> f64| -> Vec<f64> {
                rounds
                    .iter()
                    .flat_map(|r| r.latency.iter().filter(|(c, _)| *c == client).map(|(_, l)| f(l)))
                    .collect()
            };
            println!(
                "{:<36} {:>17} {:>17} {:>19} {:>13}",
                client.name(args.tasks),
                range(&of(&|l| micros(l.percentile(50))), 1),
                range(&of(&|l| micros(l.percentile(99))), 1),
                range(&of(&|l| micros(*l.samples.last().unwrap())), 1),
                range(&of(&|l| micros(l.cpu_per_message)), 2),
            );
        }
    }
    let scale: Vec<&scale::Round> = rounds.iter().map(|r| &r.scale).collect();
    scale::print(&scale, args);
    print_targets(rounds, args);
}

/// The performance targets, each with its per-round values and the
/// rounds that met it.
fn print_targets(rounds: &[Round], args: &Args) {
    // (what, per-round values, rounds that met it)
    let mut lines: Vec<(String, Vec<f64>, usize)> = Vec::new();
    let mut target = |what: String, values: Vec<f64>, met: &dyn Fn(f64) -> bool| {
        if !values.is_empty() {
            let ok = values.iter().filter(|v| met(**v)).count();
            lines.push((what, values, ok));
        }
    };
    let ratio = |group: &str, a: Client, b: Client, of: fn(&Figures) -> f64| -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|r| Some(of(r.get(group, a)?) / of(r.get(group, b)?)))
            .collect()
    };
    let (minimal, envelope) = (PUBLISH_GROUPS[0].0, PUBLISH_GROUPS[1].0);
    for (group, label) in [(minimal, "publish"), (CONSUME_GROUP, "consume")] {
        target(
            format!("engine {label}: CPU/msg ≤ 1.15× floor"),
            ratio(group, Client::Engine, Client::Floor, cpu_per_message),
            &|v| v <= 1.15,
        );
        // Not a target: what the same bound gives the floor itself driven
        // through tokio, the share of the reactor.
        target(
            format!("(reference) floor on tokio {label}: CPU/msg ≤ 1.15× floor"),
            ratio(group, Client::FloorOnTokio, Client::Floor, cpu_per_message),
            &|v| v <= 1.15,
        );
        // Not a target either: the engine beside the floor on tokio, which
        // waits on the same reactor and does nothing else, so what is left
        // is the engine's own work.
        target(
            format!("(reference) engine {label}: CPU/msg ≤ 1.15× floor on tokio"),
            ratio(group, Client::Engine, Client::FloorOnTokio, cpu_per_message),
            &|v| v <= 1.15,
        );
        // `Config::read_interval`, opt-in: the same bound, and below what
        // it costs in latency.
        target(
            format!("engine, read_interval, {label}: CPU/msg ≤ 1.15× floor"),
            ratio(group, Client::EngineReadInterval, Client::Floor, cpu_per_message),
            &|v| v <= 1.15,
        );
        if label == "publish" {
            target(
                "engine publish, properties shared: CPU/msg ≤ 1.15× floor".to_string(),
                ratio(group, Client::EngineShared, Client::Floor, cpu_per_message),
                &|v| v <= 1.15,
            );
        }
        for (engine, who) in [
            (Client::Engine, "engine"),
            (Client::EngineReadInterval, "engine, read_interval,"),
        ] {
            for peer in [Client::Lapin, Client::Amqprs] {
                target(
                    format!(
                        "{who} {label}: msg/s ahead of {} (engine/peer > 1)",
                        peer.name(args.tasks)
                    ),
                    ratio(group, engine, peer, rate),
                    &|v| v > 1.0,
                );
            }
        }
    }
    for client in [Client::BeginSend, Client::Send] {
        target(
            format!("{}: msg/s ≥ 0.9× engine (envelope)", client.name(args.tasks)),
            ratio(envelope, client, Client::Engine, rate),
            &|v| v >= 0.9,
        );
    }
    target(
        "acemq consume (JSON): msg/s ≥ 0.9× engine".into(),
        ratio(CONSUME_GROUP, Client::ApiConsume, Client::Engine, rate),
        &|v| v >= 0.9,
    );
    target(
        "acemq consume (JSON): CPU/msg ≤ 1.6× floor".into(),
        ratio(CONSUME_GROUP, Client::ApiConsume, Client::Floor, cpu_per_message),
        &|v| v <= 1.6,
    );
    for (engine, who) in [
        (Client::Engine, "engine"),
        (Client::EngineBusyPoll, "engine, busy_poll,"),
    ] {
        for (p, label) in [(50, "p50"), (99, "p99")] {
            for peer in [Client::Lapin, Client::Amqprs] {
                let values: Vec<f64> = rounds
                    .iter()
                    .filter_map(|r| Some(micros(r.latency(engine, p)?) / micros(r.latency(peer, p)?)))
                    .collect();
                target(
                    format!(
                        "{who} latency {label} below {} (engine/peer < 1)",
                        peer.name(args.tasks)
                    ),
                    values,
                    &|v| v < 1.0,
                );
            }
        }
    }
    let scale: Vec<&scale::Round> = rounds.iter().map(|r| &r.scale).collect();
    lines.extend(scale::targets(&scale, args));
    println!();
    println!("targets (each a ratio against a reference measured in the same run): per-round ratios, median (min–max), rounds that met the target");
    for (what, values, ok) in lines {
        println!(
            "{what:<66} {:>5.2} {:>13}  met {ok}/{}",
            median(&values),
            format!("({})", range(&values, 2)),
            values.len()
        );
    }
    print_read_interval_cost(rounds);
}

/// What `Config::read_interval` costs in latency, beside the engine's
/// (its gain is in the targets above): per-round ratios, median (min–max).
fn print_read_interval_cost(rounds: &[Round]) {
    let mut printed_header = false;
    for (p, label) in [(50, "p50"), (99, "p99")] {
        let values: Vec<f64> = rounds
            .iter()
            .filter_map(|r| {
                Some(micros(r.latency(Client::EngineReadInterval, p)?) / micros(r.latency(Client::Engine, p)?))
            })
            .collect();
        if values.is_empty() {
            continue;
        }
        if !printed_header {
            println!();
            println!(
                "what read_interval {} ms costs (not a target): per-round ratios, median (min–max)",
                READ_INTERVAL.as_millis()
            );
            printed_header = true;
        }
        println!(
            "{:<66} {:>5.2} {:>13}",
            format!("engine, read_interval: latency {label} × the engine's"),
            median(&values),
            format!("({})", range(&values, 2)),
        );
    }
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn main() {
    let args = Args::parse();
    floor::ALLOCATIONS
        .set(counting::read)
        .expect("the allocation counter is set once");
    let url = std::env::var("ACEMQ_RABBITMQ_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/".into());
    let runtime = if args.multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    }
    .enable_all()
    .build()
    .expect("tokio runtime");
    // Every client runs in a task of its own, as a service's work does,
    // not in `block_on`'s future: tokio polls its I/O driver once more (an
    // `epoll_wait` that does not sleep) each time that future is woken
    // from within the runtime, which a spawned task does not cost. The same
    // for every client.
    runtime.block_on(async move { tokio::spawn(run(url, args)).await.expect("the comparison's task") });
}

/// Opens the clients, runs the rounds and prints the table.
async fn run(url: String, args: Args) {
    let clients = Clients::open(&url).await;
    let version = clients
        .engine
        .server_properties()
        .get("version")
        .and_then(|v| v.as_str())
        .unwrap_or("?")
        .to_string();
    eprintln!(
        "acemq-peers: RabbitMQ {version} at {}, queue {}",
        redacted(&clients.url),
        clients.queue
    );
    let mut rounds = Vec::new();
    for round in 0..args.rounds {
        rounds.push(run_round(&clients, &args, round).await);
    }
    clients.close().await;
    println!("{}", machine(&version));
    print_table(&rounds, &args);
}

/// The date, this machine and the broker, as the table's first line.
fn machine(version: &str) -> String {
    let date = std::process::Command::new("date")
        .arg("-u")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map_or_else(|| "?".into(), |d| d.trim().to_string());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    format!("{date}; {cpus} CPUs ({model}); RabbitMQ {version}")
}

/// `url` without its password.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// The header values the peers' property types are given, from ours.
fn header_values(props: &BasicProperties) -> Vec<(String, FieldValue)> {
    props
        .headers
        .iter()
        .flat_map(|h| h.iter())
        .map(|(k, v)| (k.as_str().expect("a UTF-8 header name").to_string(), v.clone()))
        .collect()
}
