//! The groups at size and scale: large bodies, many queues on one
//! connection, many publishing tasks on a multi-thread runtime, memory per
//! idle connection, consumer and in-flight message, and connection set-up.
//! Each runs in the same rounds as the groups of `main.rs`, the order of
//! its clients turned from round to round, and prints its table and its
//! targets as per-round ratios.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_codec::{QueueDeclare, QueueDelete, QueuePurge};
use acemq_core::amqp::{Config, Confirmation, Connection};
use bytes::Bytes;

use super::floor::{self, cpu_time, Figures};
use super::{counting, peers};
use super::{
    engine_consume, engine_publish, envelope_properties, minimal_properties, range, rotated, slices, within, Args,
    Clients, Payload, Props, Sums, WINDOW,
};

/// The large bodies' sizes.
pub const LARGE: [usize; 2] = [64 << 10, 1 << 20];
/// Bytes unconfirmed (publish) or unacked (consume) at most in the large
/// groups: the window in messages is this over the body size.
pub const LARGE_WINDOW_BYTES: usize = 16 << 20;
/// Each consumer's prefetch in the many-queues group.
pub const QUEUE_PREFETCH: u16 = 100;
/// Messages held unacked in the in-flight memory row.
pub const IN_FLIGHT: usize = 1000;
/// What the memory rows open and close once before measuring.
const MEMORY_WARMUP: usize = 20;

/// A client of the groups at scale.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Who {
    /// The wire floor (large bodies only).
    Floor,
    /// `acemq_core::amqp`.
    Engine,
    /// The acemq API: `Publisher`, `consume`, `Conn`.
    Api,
    Lapin,
    Amqprs,
}

/// A throughput group at scale.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Group {
    /// Confirmed publish of bodies of this size.
    Publish(usize),
    /// Consume with ack of bodies of this size.
    Consume(usize),
    /// Many queues, a consumer each, on one connection.
    Queues,
    /// Many tasks publishing on a two-worker runtime.
    Tasks,
}

fn size_name(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

impl Group {
    pub fn name(self, args: &Args) -> String {
        match self {
            Group::Publish(size) => format!(
                "large bodies, {}: confirmed publish, at most {} unconfirmed",
                size_name(size),
                LARGE_WINDOW_BYTES / size
            ),
            Group::Consume(size) => format!(
                "large bodies, {}: consume with ack, prefetch {}",
                size_name(size),
                LARGE_WINDOW_BYTES / size
            ),
            Group::Queues => format!(
                "many queues: {} queues, a consumer each (prefetch {QUEUE_PREFETCH}) on one connection, envelope + JSON",
                args.queues
            ),
            Group::Tasks => format!(
                "many publishing tasks: {} tasks on a 2-worker multi-thread runtime, each awaiting its confirm",
                args.publishing_tasks
            ),
        }
    }

    fn rows(self) -> &'static [Who] {
        match self {
            Group::Publish(_) | Group::Consume(_) => &[Who::Floor, Who::Engine, Who::Api, Who::Lapin, Who::Amqprs],
            Group::Queues | Group::Tasks => &[Who::Engine, Who::Api, Who::Lapin, Who::Amqprs],
        }
    }

    /// The body size, in the large groups.
    fn body(self) -> Option<usize> {
        match self {
            Group::Publish(size) | Group::Consume(size) => Some(size),
            _ => None,
        }
    }

    fn window(self) -> usize {
        self.body().map_or(WINDOW, |size| LARGE_WINDOW_BYTES / size)
    }
}

impl Who {
    fn name(self, group: Option<Group>, args: &Args) -> String {
        match (self, group) {
            (Who::Floor, _) => "wire floor".into(),
            (Who::Engine, Some(Group::Queues)) => format!("acemq engine ({} consumers)", args.queues),
            (Who::Engine, Some(Group::Tasks)) => format!("acemq engine ({} tasks)", args.publishing_tasks),
            (Who::Engine, None) => "acemq engine (Connection)".into(),
            (Who::Engine, _) => "acemq engine".into(),
            (Who::Api, Some(Group::Publish(_))) => "acemq Publisher::begin_send".into(),
            (Who::Api, Some(Group::Consume(_))) => "acemq consume (accept)".into(),
            (Who::Api, Some(Group::Queues)) => format!("acemq consume × {}", args.queues),
            (Who::Api, Some(Group::Tasks)) => format!("acemq Publisher::send ({} tasks)", args.publishing_tasks),
            (Who::Api, None) => "acemq Conn (two connections)".into(),
            (Who::Lapin, Some(Group::Queues)) => format!("lapin ({} channels)", args.queues),
            (Who::Lapin, Some(Group::Tasks)) => format!("lapin ({} tasks)", args.publishing_tasks),
            (Who::Lapin, _) => "lapin".into(),
            (Who::Amqprs, Some(Group::Queues)) => format!("amqprs ({} channels)", args.queues),
            (Who::Amqprs, Some(Group::Tasks)) => format!("amqprs ({} tasks)", args.publishing_tasks),
            (Who::Amqprs, _) => "amqprs".into(),
        }
    }
}

/// Memory a thing takes: resident (the process's RSS) and on the heap
/// (bytes allocated and not freed, from the counting allocator), bytes per
/// thing.
#[derive(Clone, Copy, Default)]
pub struct PerItem {
    rss: f64,
    heap: f64,
}

/// One client's memory figures in one round.
#[derive(Default)]
pub struct Memory {
    connection: PerItem,
    consumer: PerItem,
    in_flight: Option<PerItem>,
}

/// One round's figures of the groups at scale.
#[derive(Default)]
pub struct Round {
    rows: Vec<(Group, Who, Figures)>,
    memory: Vec<(Who, Memory)>,
    setup: Vec<(Who, Vec<Duration>)>,
}

impl Round {
    fn get(&self, group: Group, who: Who) -> Option<&Figures> {
        self.rows
            .iter()
            .find(|(g, w, _)| *g == group && *w == who)
            .map(|(_, _, f)| f)
    }

    fn memory(&self, who: Who) -> Option<&Memory> {
        self.memory.iter().find(|(w, _)| *w == who).map(|(_, m)| m)
    }

    fn setup(&self, who: Who, p: usize) -> Option<Duration> {
        self.setup
            .iter()
            .find(|(w, _)| *w == who)
            .map(|(_, samples)| percentile(samples, p))
    }
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let i = (sorted.len() * p / 100).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or_default()
}

// ------------------------------------------------------------ rounds

pub async fn run_round(clients: &Clients, args: &Args, round: usize) -> Round {
    let mut figures = Round::default();
    if args.runs("large") {
        // Allocations are counted in these groups only (a few atomic adds
        // an allocation, which the other groups are spared).
        counting::enable(true);
        for size in LARGE {
            for group in [Group::Publish(size), Group::Consume(size)] {
                large_group(clients, args, round, group, &mut figures).await;
            }
        }
        counting::enable(false);
    }
    if args.runs("queues") {
        queues_group(clients, args, round, &mut figures).await;
    }
    if args.runs("tasks") {
        tasks_group(clients, args, round, &mut figures).await;
    }
    if args.runs("memory") {
        counting::enable(true);
        memory_group(clients, args, round, &mut figures).await;
        counting::enable(false);
    }
    if args.runs("setup") {
        setup_group(clients, args, round, &mut figures).await;
    }
    figures
}

fn progress(round: usize, group: &str, name: &str, f: &Figures) {
    eprintln!(
        "round {} | {group} | {name:<36} {:>8.0} msg/s {:>8.2} µs CPU/msg {:>7.2} allocs/msg  wall {:.2?}",
        round + 1,
        f.messages as f64 / f.wall.as_secs_f64(),
        f.cpu.total.as_secs_f64() * 1e6 / f.messages as f64,
        f.cpu.allocations as f64 / f.messages as f64,
        f.wall
    );
}

/// Messages a large row moves: `--large-mib` MiB of bodies.
fn large_messages(args: &Args, size: usize) -> u64 {
    ((args.large_mib << 20) / size as u64).max(1)
}

async fn large_group(clients: &Clients, args: &Args, round: usize, group: Group, figures: &mut Round) {
    let size = group.body().expect("a large group");
    let window = group.window();
    let queue = clients.queue.as_str();
    let messages = (large_messages(args, size) / args.slices).max(1);
    let mut sums = Sums::default();
    // `ACEMQ_PEERS_ROW=Engine` (a client as `Who` spells it) runs that
    // client's rows alone, for profiling.
    let only = std::env::var("ACEMQ_PEERS_ROW").ok();
    for (_, who) in slices(group.rows(), round, args.slices) {
        if only.as_ref().is_some_and(|only| *only != format!("{who:?}")) {
            continue;
        }
        let what = format!("{} ({})", who.name(Some(group), args), group.name(args));
        if let Group::Consume(_) = group {
            // The queue filled with the row's messages (not timed).
            within(
                "the preload",
                preload_large(&clients.engine, queue, messages, size, window),
            )
            .await;
        }
        let f = match (group, who) {
            (Group::Publish(_), Who::Floor) => {
                let publish = floor::publish_body(
                    &clients.addr,
                    queue,
                    messages,
                    window as u64,
                    minimal_properties(),
                    size,
                    "floor",
                    floor::Waiting::Blocking,
                );
                within(&what, publish)
                    .await
                    .unwrap_or_else(|err| panic!("{what}: {err}"))
            }
            (Group::Consume(_), Who::Floor) => {
                let consume = floor::consume(
                    &clients.addr,
                    queue,
                    messages,
                    window as u16,
                    "floor",
                    floor::Waiting::Blocking,
                );
                within(&what, consume)
                    .await
                    .unwrap_or_else(|err| panic!("{what}: {err}"))
            }
            (Group::Publish(_), Who::Engine) => {
                within(
                    &what,
                    engine_publish(&clients.engine, queue, messages, minimal_properties(), size, window),
                )
                .await
            }
            (Group::Consume(_), Who::Engine) => {
                within(&what, engine_consume(&clients.engine, queue, messages, window as u16)).await
            }
            (Group::Publish(_), Who::Api) => {
                within(&what, api_publish_raw(&clients.api, queue, messages, size, window)).await
            }
            (Group::Consume(_), Who::Api) => {
                within(&what, api_consume_raw(&clients.api, queue, messages, window)).await
            }
            (Group::Publish(_), Who::Lapin) => {
                within(
                    &what,
                    peers::lapin_publish(&clients.lapin, queue, messages, Props::Minimal, size, window),
                )
                .await
            }
            (Group::Consume(_), Who::Lapin) => {
                within(
                    &what,
                    peers::lapin_consume(&clients.lapin, queue, messages, window as u16),
                )
                .await
            }
            (Group::Publish(_), Who::Amqprs) => {
                within(
                    &what,
                    peers::amqprs_publish(&clients.amqprs, queue, messages, Props::Minimal, size, window),
                )
                .await
            }
            (Group::Consume(_), Who::Amqprs) => {
                within(
                    &what,
                    peers::amqprs_consume(&clients.amqprs, queue, messages, window as u16),
                )
                .await
            }
            _ => unreachable!(),
        };
        clients.purge().await;
        sums.add(who, f);
    }
    for (who, f) in sums.0 {
        progress(round, &group.name(args), &who.name(Some(group), args), &f);
        figures.rows.push((group, who, f));
    }
}

/// Fills `queue` with `messages` bodies of `size` bytes from the engine,
/// each with a `message-id` of its own (as a `Publisher` writes one): a
/// message without one would have the acemq API's `consume` derive its
/// id from a hash of the whole body (see BENCHMARKS.md), which the peers
/// do not do.
async fn preload_large(conn: &Connection, queue: &str, messages: u64, size: usize, window: usize) {
    let ch = conn.channel().await.expect("engine channel");
    ch.confirm_select().await.expect("confirm.select");
    let body = Bytes::from(vec![b'x'; size]);
    let mut in_flight = std::collections::VecDeque::with_capacity(window);
    for n in 0..messages {
        if in_flight.len() == window {
            let confirm: acemq_core::amqp::PublishConfirm = in_flight.pop_front().unwrap();
            assert_eq!(confirm.await.expect("engine confirm"), Confirmation::Ack);
        }
        let props = acemq_codec::BasicProperties {
            message_id: Some(format!("large-{n}").as_str().into()),
            ..minimal_properties()
        };
        in_flight.push_back(ch.publish("", queue, false, props, &body).await.expect("publish"));
    }
    for confirm in in_flight {
        assert_eq!(confirm.await.expect("engine confirm"), Confirmation::Ack);
    }
    ch.close().await.expect("channel.close");
}

// ---------------------------------------------------- the raw codec

/// A body as it is, for the acemq API's rows of large bodies: the API
/// takes a payload type and a [`acemq_core::Codec`], so the bench gives it
/// bytes and a codec that writes them as they are.
#[derive(Clone)]
pub struct Blob(pub Bytes);

impl serde::Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Blob, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Blob;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(Bytes::copy_from_slice(v)))
            }
        }
        deserializer.deserialize_bytes(Visit)
    }
}

/// The codec of [`Blob`]: `application/octet-stream`, the bytes as they
/// are. `Codec::encode` returns a `Vec<u8>` and `Codec::decode` reads a
/// `&[u8]` into an owned value, so each copies the body once: what the
/// API's codec interface costs a large body.
#[derive(Clone, Copy)]
pub struct Raw;

#[derive(Debug)]
pub struct RawError(String);

impl std::fmt::Display for RawError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RawError {}

impl serde::ser::Error for RawError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        RawError(msg.to_string())
    }
}

/// A serializer that takes bytes and nothing else.
struct TakeBytes;

macro_rules! refuse {
    ($($name:ident($($arg:ty),*);)*) => {
        $(fn $name(self, $(_: $arg),*) -> Result<Vec<u8>, RawError> {
            Err(RawError("the raw codec writes bytes only".into()))
        })*
    };
}

impl serde::Serializer for TakeBytes {
    type Ok = Vec<u8>;
    type Error = RawError;
    type SerializeSeq = serde::ser::Impossible<Vec<u8>, RawError>;
    type SerializeTuple = serde::ser::Impossible<Vec<u8>, RawError>;
    type SerializeTupleStruct = serde::ser::Impossible<Vec<u8>, RawError>;
    type SerializeTupleVariant = serde::ser::Impossible<Vec<u8>, RawError>;
    type SerializeMap = serde::ser::Impossible<Vec<u8>, RawError>;
    type SerializeStruct = serde::ser::Impossible<Vec<u8>, RawError>;
    type SerializeStructVariant = serde::ser::Impossible<Vec<u8>, RawError>;

    fn serialize_bytes(self, v: &[u8]) -> Result<Vec<u8>, RawError> {
        Ok(v.to_vec())
    }

    refuse! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_f32(f32);
        serialize_f64(f64);
        serialize_char(char);
        serialize_str(&str);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(&'static str);
        serialize_unit_variant(&'static str, u32, &'static str);
    }

    fn serialize_some<T: ?Sized + serde::Serialize>(self, _: &T) -> Result<Vec<u8>, RawError> {
        Err(RawError("the raw codec writes bytes only".into()))
    }

    fn serialize_newtype_struct<T: ?Sized + serde::Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Vec<u8>, RawError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + serde::Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Vec<u8>, RawError> {
        Err(RawError("the raw codec writes bytes only".into()))
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, RawError> {
        Err(RawError("the raw codec writes bytes only".into()))
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, RawError> {
        Err(RawError("the raw codec writes bytes only".into()))
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, RawError> {
        Err(RawError("the raw codec writes bytes only".into()))
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, RawError> {
        Err(RawError("the raw codec writes bytes only".into()))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, RawError> {
        Err(RawError("the raw codec writes bytes only".into()))
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, RawError> {
        Err(RawError("the raw codec writes bytes only".into()))
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, RawError> {
        Err(RawError("the raw codec writes bytes only".into()))
    }
}

impl acemq_core::Codec for Raw {
    fn content_type(&self) -> &str {
        "application/octet-stream"
    }

    fn encode<T: serde::Serialize>(&self, value: &T) -> Result<Vec<u8>, acemq_core::CodecError> {
        value.serialize(TakeBytes).map_err(acemq_core::CodecError::new)
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, acemq_core::CodecError> {
        let bytes = serde::de::value::BytesDeserializer::<serde::de::value::Error>::new(bytes);
        T::deserialize(bytes).map_err(acemq_core::CodecError::new)
    }
}

/// `Publisher::begin_send` of `size`-byte bodies (the raw codec), at
/// most `window` in flight.
async fn api_publish_raw(conn: &acemq_core::Conn, queue: &str, messages: u64, size: usize, window: usize) -> Figures {
    let publisher = conn.publisher::<Blob>("", queue).transient().with_codec(Raw);
    let blob = Blob(Bytes::from(vec![b'x'; size]));
    let mut in_flight = std::collections::VecDeque::with_capacity(window);
    let (t0, c0) = (Instant::now(), cpu_time());
    for _ in 0..messages {
        if in_flight.len() == window {
            let oldest: acemq_core::PendingSend = in_flight.pop_front().unwrap();
            oldest.await.expect("begin_send confirm");
        }
        in_flight.push_back(publisher.begin_send(&blob).await.expect("begin_send"));
    }
    for pending in in_flight {
        pending.await.expect("begin_send confirm");
    }
    Figures::since("Publisher::begin_send", messages, t0, c0)
}

/// `consume` of large bodies (the raw codec), each accepted.
async fn api_consume_raw(conn: &acemq_core::Conn, queue: &str, messages: u64, prefetch: usize) -> Figures {
    use acemq_core::{consume, Ack, Message};
    let accepted = Arc::new(AtomicU64::new(0));
    let (t0, c0) = (Instant::now(), cpu_time());
    let counter = accepted.clone();
    let consumer = consume(conn, queue, move |_: Message<Blob>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::Relaxed);
            Ack::accept()
        }
    })
    .with_codec(Raw)
    .prefetch(prefetch as u16)
    .await
    .expect("consume");
    wait_for(&accepted, messages).await;
    let figures = Figures::since("acemq consume", messages, t0, c0);
    consumer.close().await.expect("consumer closes");
    figures
}

/// Waits until `counter` reaches `messages` (polled every millisecond, as
/// `main.rs`'s `api_consume`).
async fn wait_for(counter: &AtomicU64, messages: u64) {
    while counter.load(Ordering::Relaxed) < messages {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

// ------------------------------------------------------- many queues

/// The many-queues group's queues, declared (transient, not exclusive).
async fn declare_queues(clients: &Clients, n: usize) -> Vec<String> {
    let mut queues = Vec::with_capacity(n);
    for i in 0..n {
        let queue = format!("{}-q{i}", clients.queue);
        within(
            "queue.declare",
            clients.setup.queue_declare(QueueDeclare {
                queue: queue.as_str().into(),
                ..Default::default()
            }),
        )
        .await
        .expect("queue.declare");
        queues.push(queue);
    }
    queues
}

/// Fills `queues[i]` with `counts[i]` messages (envelope properties, JSON
/// body), spread one queue after the other, from the engine in confirm
/// mode, at most [`WINDOW`] unconfirmed (not timed).
async fn spread(conn: &Connection, queues: &[String], counts: &[u64]) {
    let ch = conn.channel().await.expect("engine channel");
    ch.confirm_select().await.expect("confirm.select");
    let props = Arc::new(envelope_properties());
    let mut in_flight = std::collections::VecDeque::with_capacity(WINDOW);
    let mut left = counts.to_vec();
    let mut n = 0u64;
    while left.iter().any(|&l| l > 0) {
        for (queue, left) in queues.iter().zip(left.iter_mut()) {
            if *left == 0 {
                continue;
            }
            *left -= 1;
            if in_flight.len() == WINDOW {
                let confirm: acemq_core::amqp::PublishConfirm = in_flight.pop_front().unwrap();
                assert_eq!(confirm.await.expect("engine confirm"), Confirmation::Ack);
            }
            let body = serde_json::to_vec(&Payload::new(n)).expect("JSON");
            n += 1;
            in_flight.push_back(ch.publish("", queue, false, &props, body).await.expect("publish"));
        }
    }
    for confirm in in_flight {
        assert_eq!(confirm.await.expect("engine confirm"), Confirmation::Ack);
    }
    ch.close().await.expect("channel.close");
}

async fn purge_all(clients: &Clients, queues: &[String]) {
    for queue in queues {
        let purge = QueuePurge {
            queue: queue.as_str().into(),
            ..Default::default()
        };
        within("queue.purge", clients.setup.queue_purge(purge))
            .await
            .expect("queue.purge");
    }
}

async fn queues_group(clients: &Clients, args: &Args, round: usize, figures: &mut Round) {
    let group = Group::Queues;
    let queues = declare_queues(clients, args.queues).await;
    let messages = args.messages / args.slices;
    let q = queues.len() as u64;
    let counts: Vec<u64> = (0..q).map(|i| messages / q + u64::from(i < messages % q)).collect();
    let mut sums = Sums::default();
    for (_, who) in slices(group.rows(), round, args.slices) {
        within("the spread preload", spread(&clients.engine, &queues, &counts)).await;
        let what = format!("{} ({})", who.name(Some(group), args), group.name(args));
        let f = match who {
            Who::Engine => within(&what, engine_many_queues(&clients.engine, &queues, &counts)).await,
            Who::Api => within(&what, api_many_queues(&clients.api, &queues, &counts)).await,
            Who::Lapin => {
                within(
                    &what,
                    peers::lapin_many_queues(&clients.lapin, &queues, &counts, QUEUE_PREFETCH),
                )
                .await
            }
            Who::Amqprs => {
                within(
                    &what,
                    peers::amqprs_many_queues(&clients.amqprs, &queues, &counts, QUEUE_PREFETCH),
                )
                .await
            }
            Who::Floor => unreachable!(),
        };
        purge_all(clients, &queues).await;
        sums.add(who, f);
    }
    for (who, f) in sums.0 {
        progress(round, "many queues", &who.name(Some(group), args), &f);
        figures.rows.push((group, who, f));
    }
    for queue in &queues {
        let delete = QueueDelete {
            queue: queue.as_str().into(),
            ..Default::default()
        };
        within("queue.delete", clients.setup.queue_delete(delete))
            .await
            .expect("queue.delete");
    }
}

/// The engine's consumers of many queues on one connection, a channel
/// each at prefetch [`QUEUE_PREFETCH`], each in a task of its own acking
/// every delivery.
async fn engine_many_queues(conn: &Connection, queues: &[String], counts: &[u64]) -> Figures {
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut channels = Vec::with_capacity(queues.len());
    for _ in queues {
        let ch = conn.channel().await.expect("engine channel");
        ch.qos(QUEUE_PREFETCH).await.expect("basic.qos");
        channels.push(ch);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (ch, queue)) in channels.iter().zip(queues).enumerate() {
        let mut consumer = ch.consume(queue).await.expect("basic.consume");
        let count = counts[i];
        tasks.spawn(async move {
            for _ in 0..count {
                let delivery = consumer.next().await.expect("a delivery");
                delivery.ack().expect("ack");
            }
            consumer
        });
    }
    let mut consumers = Vec::with_capacity(queues.len());
    while let Some(done) = tasks.join_next().await {
        consumers.push(done.expect("an engine consumer task"));
    }
    let figures = Figures::since("engine many queues", counts.iter().sum(), t0, c0);
    for consumer in consumers {
        consumer.cancel().await.expect("basic.cancel");
    }
    for ch in channels {
        ch.close().await.expect("channel.close");
    }
    figures
}

/// `consume` on each queue, on one `Conn`, each body decoded as JSON and
/// accepted.
async fn api_many_queues(conn: &acemq_core::Conn, queues: &[String], counts: &[u64]) -> Figures {
    use acemq_core::{consume, Ack, Message};
    let accepted = Arc::new(AtomicU64::new(0));
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut consumers = Vec::with_capacity(queues.len());
    for queue in queues {
        let counter = accepted.clone();
        let consumer = consume(conn, queue, move |_: Message<Payload>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                Ack::accept()
            }
        })
        .prefetch(QUEUE_PREFETCH)
        .await
        .expect("consume");
        consumers.push(consumer);
    }
    let messages = counts.iter().sum();
    wait_for(&accepted, messages).await;
    let figures = Figures::since("acemq consume × n", messages, t0, c0);
    for consumer in consumers {
        consumer.close().await.expect("consumer closes");
    }
    figures
}

// ------------------------------------------------ many publishing tasks

/// Runs `row` on a runtime of its own with two worker threads (from a
/// blocking thread of the bench's runtime, which waits meanwhile).
async fn on_two_workers<F, Fut>(row: F) -> Figures
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Figures> + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a two-worker runtime");
        let figures = runtime.block_on(async move { tokio::spawn(row()).await.expect("the row's task") });
        runtime.shutdown_timeout(Duration::from_secs(5));
        figures
    })
    .await
    .expect("the two-worker runtime's thread")
}

/// The engine from `tasks` tasks sharing one channel in confirm mode,
/// each publishing (envelope properties shared, a 256-byte body) and
/// awaiting its confirm in a loop.
async fn engine_tasks(conn: &Connection, queue: &str, messages: u64, tasks: u64) -> Figures {
    let ch = conn.channel().await.expect("engine channel");
    ch.confirm_select().await.expect("confirm.select");
    let props = Arc::new(envelope_properties());
    let body = Bytes::from(vec![b'x'; super::BODY]);
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (ch, props, body, queue) = (ch.clone(), props.clone(), body.clone(), queue.to_string());
        let share = messages / tasks + u64::from(task < messages % tasks);
        set.spawn(async move {
            for _ in 0..share {
                let confirm = ch.publish("", &queue, false, &props, &body).await.expect("publish");
                assert_eq!(confirm.await.expect("engine confirm"), Confirmation::Ack);
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("an engine publishing task");
    }
    let figures = Figures::since("engine tasks", messages, t0, c0);
    ch.close().await.expect("channel.close");
    figures
}

async fn tasks_group(clients: &Clients, args: &Args, round: usize, figures: &mut Round) {
    let group = Group::Tasks;
    let messages = args.messages / args.slices;
    let tasks = args.publishing_tasks;
    let mut sums = Sums::default();
    for (_, who) in slices(group.rows(), round, args.slices) {
        let what = format!("{} ({})", who.name(Some(group), args), group.name(args));
        let (url, addr, queue) = (clients.url.clone(), clients.addr.clone(), clients.queue.clone());
        // Each client connects on the two-worker runtime (not timed), so
        // that its tasks run there.
        let row = async move {
            match who {
                Who::Engine => {
                    let conn = Connection::open(&url, Config::default())
                        .await
                        .expect("the engine connects");
                    let f = engine_tasks(&conn, &queue, messages, tasks).await;
                    conn.close().await.expect("engine closes");
                    f
                }
                Who::Api => {
                    let conn = acemq_core::Conn::open(&url, acemq_core::Config::default())
                        .await
                        .expect("acemq Conn opens");
                    let f = super::publisher_send(&conn, &queue, messages, tasks).await;
                    conn.close().await.expect("acemq Conn closes");
                    f
                }
                Who::Lapin => {
                    let conn = peers::lapin_connect(&addr).await;
                    let f = peers::lapin_tasks(&conn, &queue, messages, tasks).await;
                    peers::lapin_close(&conn).await;
                    f
                }
                Who::Amqprs => {
                    let conn = peers::amqprs_connect(&addr).await;
                    let f = peers::amqprs_tasks(&conn, &queue, messages, tasks).await;
                    conn.close().await.expect("amqprs closes");
                    f
                }
                Who::Floor => unreachable!(),
            }
        };
        let f = within(&what, on_two_workers(move || row)).await;
        clients.purge().await;
        sums.add(who, f);
    }
    for (who, f) in sums.0 {
        progress(round, "many tasks", &who.name(Some(group), args), &f);
        figures.rows.push((group, who, f));
    }
}

// ------------------------------------------------------------ memory

/// The process's resident memory, bytes (`VmRSS` of /proc/self/status).
fn rss() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map_or(0, |kb| kb * 1024)
}

extern "C" {
    /// glibc's: returns the free memory of every arena to the system.
    fn malloc_trim(pad: usize) -> std::ffi::c_int;
}

/// Lets what was just closed finish closing, then gives the allocator's
/// free memory back to the system, so that what the next measurement
/// opens is not taken from memory that was resident already.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        malloc_trim(0);
    }
}

/// (resident, heap) now.
fn snapshot() -> (i64, i64) {
    (rss(), counting::live())
}

/// Memory per thing: opens and closes `MEMORY_WARMUP` of them (the first
/// ones pay for what a client sets up once), settles, opens `n` and holds
/// them while the process's resident and heap bytes are read, then closes
/// them.
async fn per_item<H, O, C>(n: usize, open: impl Fn(usize) -> O, close: impl Fn(H) -> C) -> PerItem
where
    O: Future<Output = H>,
    C: Future<Output = ()>,
{
    close(open(MEMORY_WARMUP).await).await;
    settle().await;
    let (rss0, heap0) = snapshot();
    let held = open(n).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (rss1, heap1) = snapshot();
    close(held).await;
    settle().await;
    PerItem {
        rss: (rss1 - rss0) as f64 / n as f64,
        heap: (heap1 - heap0) as f64 / n as f64,
    }
}

async fn engine_connections(url: &str, n: usize) -> Vec<Connection> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(
            Connection::open(url, Config::default())
                .await
                .expect("the engine connects"),
        );
    }
    all
}

async fn engine_close_all(all: Vec<Connection>) {
    for conn in all {
        conn.close().await.expect("engine closes");
    }
}

async fn api_conns(url: &str, n: usize) -> Vec<acemq_core::Conn> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(
            acemq_core::Conn::open(url, acemq_core::Config::default())
                .await
                .expect("acemq Conn opens"),
        );
    }
    all
}

async fn api_close_all(all: Vec<acemq_core::Conn>) {
    for conn in all {
        conn.close().await.expect("acemq Conn closes");
    }
}

async fn engine_consumers(
    conn: &Connection,
    queue: &str,
    n: usize,
) -> Vec<(acemq_core::amqp::Channel, acemq_core::amqp::Consumer)> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let ch = conn.channel().await.expect("engine channel");
        let consumer = ch.consume(queue).await.expect("basic.consume");
        all.push((ch, consumer));
    }
    all
}

async fn engine_close_consumers(all: Vec<(acemq_core::amqp::Channel, acemq_core::amqp::Consumer)>) {
    for (ch, consumer) in all {
        consumer.cancel().await.expect("basic.cancel");
        ch.close().await.expect("channel.close");
    }
}

async fn api_consumers(conn: &acemq_core::Conn, queue: &str, n: usize) -> Vec<acemq_core::Consumer> {
    use acemq_core::{consume, Ack, Message};
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let consumer = consume(conn, queue, |_: Message<Payload>| async { Ack::accept() })
            .prefetch(WINDOW as u16)
            .await
            .expect("consume");
        all.push(consumer);
    }
    all
}

async fn api_close_consumers(all: Vec<acemq_core::Consumer>) {
    for consumer in all {
        consumer.close().await.expect("consumer closes");
    }
}

/// The engine holding `n` deliveries of `queue` unacked (prefetch `n`).
async fn engine_hold(
    conn: &Connection,
    queue: &str,
    n: usize,
) -> (
    acemq_core::amqp::Channel,
    acemq_core::amqp::Consumer,
    Vec<acemq_core::amqp::Delivery>,
) {
    let ch = conn.channel().await.expect("engine channel");
    ch.qos(n as u16).await.expect("basic.qos");
    let mut consumer = ch.consume(queue).await.expect("basic.consume");
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        held.push(consumer.next().await.expect("a delivery"));
    }
    (ch, consumer, held)
}

async fn engine_release(
    (ch, consumer, held): (
        acemq_core::amqp::Channel,
        acemq_core::amqp::Consumer,
        Vec<acemq_core::amqp::Delivery>,
    ),
) {
    let last = held.last().expect("held deliveries").delivery_tag;
    ch.basic_ack(last, true).expect("ack");
    drop(held);
    consumer.cancel().await.expect("basic.cancel");
    ch.close().await.expect("channel.close");
}

/// Memory per message held unacked at a window of [`IN_FLIGHT`]: the
/// queue filled (not measured), then `hold` takes them all and holds them;
/// once before measuring, as a warm-up.
async fn per_in_flight<H, O, C>(clients: &Clients, hold: impl Fn() -> O, release: impl Fn(H) -> C) -> PerItem
where
    O: Future<Output = H>,
    C: Future<Output = ()>,
{
    let queue = clients.queue.as_str();
    let fill = || {
        engine_publish(
            &clients.engine,
            queue,
            IN_FLIGHT as u64,
            minimal_properties(),
            super::BODY,
            WINDOW,
        )
    };
    fill().await;
    release(hold().await).await;
    fill().await;
    settle().await;
    let (rss0, heap0) = snapshot();
    let held = hold().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (rss1, heap1) = snapshot();
    release(held).await;
    clients.purge().await;
    settle().await;
    PerItem {
        rss: (rss1 - rss0) as f64 / IN_FLIGHT as f64,
        heap: (heap1 - heap0) as f64 / IN_FLIGHT as f64,
    }
}

async fn memory_group(clients: &Clients, args: &Args, round: usize, figures: &mut Round) {
    let (n, url, addr, queue) = (args.idle, clients.url.as_str(), &clients.addr, clients.queue.as_str());
    for who in rotated(&[Who::Engine, Who::Api, Who::Lapin, Who::Amqprs], round) {
        let what = format!("{} (memory)", who.name(None, args));
        let memory = within(&what, async {
            match who {
                Who::Engine => Memory {
                    connection: per_item(n, |k| engine_connections(url, k), engine_close_all).await,
                    consumer: per_item(
                        n,
                        |k| engine_consumers(&clients.engine, queue, k),
                        engine_close_consumers,
                    )
                    .await,
                    in_flight: Some(
                        per_in_flight(
                            clients,
                            || engine_hold(&clients.engine, queue, IN_FLIGHT),
                            engine_release,
                        )
                        .await,
                    ),
                },
                Who::Api => Memory {
                    connection: per_item(n, |k| api_conns(url, k), api_close_all).await,
                    consumer: per_item(n, |k| api_consumers(&clients.api, queue, k), api_close_consumers).await,
                    in_flight: None,
                },
                Who::Lapin => Memory {
                    connection: per_item(n, |k| peers::lapin_connections(addr, k), peers::lapin_close_all).await,
                    consumer: per_item(
                        n,
                        |k| peers::lapin_consumers(&clients.lapin, queue, k),
                        peers::lapin_close_consumers,
                    )
                    .await,
                    in_flight: Some(
                        per_in_flight(
                            clients,
                            || peers::lapin_hold(&clients.lapin, queue, IN_FLIGHT),
                            peers::lapin_release,
                        )
                        .await,
                    ),
                },
                Who::Amqprs => Memory {
                    connection: per_item(n, |k| peers::amqprs_connections(addr, k), peers::amqprs_close_all).await,
                    consumer: per_item(
                        n,
                        |k| peers::amqprs_consumers(&clients.amqprs, queue, k),
                        peers::amqprs_close_consumers,
                    )
                    .await,
                    in_flight: Some(
                        per_in_flight(
                            clients,
                            || peers::amqprs_hold(&clients.amqprs, queue, IN_FLIGHT),
                            peers::amqprs_release,
                        )
                        .await,
                    ),
                },
                Who::Floor => unreachable!(),
            }
        })
        .await;
        eprintln!(
            "round {} | memory | {:<36} {:>7.1} KiB RSS/conn {:>7.1} KiB heap/conn {:>7.1} KiB RSS/consumer {:>7.1} KiB heap/consumer{}",
            round + 1,
            who.name(None, args),
            memory.connection.rss / 1024.0,
            memory.connection.heap / 1024.0,
            memory.consumer.rss / 1024.0,
            memory.consumer.heap / 1024.0,
            memory.in_flight.map_or(String::new(), |m| format!(
                " {:>7.0} B RSS/in-flight {:>7.0} B heap/in-flight",
                m.rss, m.heap
            )),
        );
        figures.memory.push((who, memory));
    }
}

// ------------------------------------------------- connection set-up

async fn engine_setup(url: &str) -> Duration {
    let t0 = Instant::now();
    let conn = Connection::open(url, Config::default())
        .await
        .expect("the engine connects");
    let ch = conn.channel().await.expect("engine channel");
    ch.confirm_select().await.expect("confirm.select");
    let took = t0.elapsed();
    conn.close().await.expect("engine closes");
    took
}

/// `Conn::open`: its two connections, its publishing channel in confirm
/// mode and its library channel.
async fn api_setup(url: &str) -> Duration {
    let t0 = Instant::now();
    let conn = acemq_core::Conn::open(url, acemq_core::Config::default())
        .await
        .expect("acemq Conn opens");
    let took = t0.elapsed();
    conn.close().await.expect("acemq Conn closes");
    took
}

async fn setup_group(clients: &Clients, args: &Args, round: usize, figures: &mut Round) {
    for who in rotated(&[Who::Engine, Who::Api, Who::Lapin, Who::Amqprs], round) {
        let what = format!("{} (set-up)", who.name(None, args));
        let mut samples = Vec::with_capacity(args.setups);
        for _ in 0..args.setups {
            let took = match who {
                Who::Engine => within(&what, engine_setup(&clients.url)).await,
                Who::Api => within(&what, api_setup(&clients.url)).await,
                Who::Lapin => within(&what, peers::lapin_setup(&clients.addr)).await,
                Who::Amqprs => within(&what, peers::amqprs_setup(&clients.addr)).await,
                Who::Floor => unreachable!(),
            };
            samples.push(took);
        }
        samples.sort();
        eprintln!(
            "round {} | set-up | {:<36} p50 {:>7.2} ms  p99 {:>7.2} ms",
            round + 1,
            setup_name(who, args),
            ms(percentile(&samples, 50)),
            ms(percentile(&samples, 99)),
        );
        figures.setup.push((who, samples));
    }
}

fn setup_name(who: Who, args: &Args) -> String {
    match who {
        Who::Api => "acemq Conn::open (two connections)".into(),
        Who::Engine => "acemq engine".into(),
        other => other.name(None, args),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------- printing

fn mib(bytes: f64) -> f64 {
    bytes / (1u64 << 20) as f64
}

fn rate(f: &Figures) -> f64 {
    f.messages as f64 / f.wall.as_secs_f64()
}

fn cpu_per_message(f: &Figures) -> f64 {
    f.cpu.total.as_secs_f64() * 1e6 / f.messages as f64
}

/// The throughput groups that ran, in order.
fn groups(args: &Args) -> Vec<Group> {
    let mut groups = Vec::new();
    if args.runs("large") {
        for size in LARGE {
            groups.push(Group::Publish(size));
            groups.push(Group::Consume(size));
        }
    }
    if args.runs("queues") {
        groups.push(Group::Queues);
    }
    if args.runs("tasks") {
        groups.push(Group::Tasks);
    }
    groups
}

#[allow(clippy::type_complexity)] // the closures over (row, floor, engine) of a round
pub fn print(rounds: &[&Round], args: &Args) {
    for group in groups(args) {
        println!();
        println!("{}", group.name(args));
        let per_round = |who: Who| -> Vec<(&Figures, Option<&Figures>, Option<&Figures>)> {
            rounds
                .iter()
                .filter_map(|r| {
                    r.get(group, who)
                        .map(|f| (f, r.get(group, Who::Floor), r.get(group, Who::Engine)))
                })
                .collect()
        };
        if let Some(size) = group.body() {
            println!(
                "{:<36} {:>13} {:>13} {:>11} {:>13} {:>12} {:>11}",
                "row", "MiB/s", "CPU µs/MiB", "CPU ×floor", "MiB/s ×engine", "allocs/msg", "alloc ×body"
            );
            let per_mib = mib(size as f64);
            for &who in group.rows() {
                let rows = per_round(who);
                let of = |f: &dyn Fn(&Figures, Option<&Figures>, Option<&Figures>) -> Option<f64>| -> Vec<f64> {
                    rows.iter().filter_map(|(a, b, c)| f(a, *b, *c)).collect()
                };
                println!(
                    "{:<36} {:>13} {:>13} {:>11} {:>13} {:>12} {:>11}",
                    who.name(Some(group), args),
                    range(&of(&|f, _, _| Some(rate(f) * per_mib)), 1),
                    range(&of(&|f, _, _| Some(cpu_per_message(f) / per_mib)), 0),
                    range(
                        &of(&|f, fl, _| fl.map(|fl| cpu_per_message(f) / cpu_per_message(fl))),
                        2
                    ),
                    range(&of(&|f, _, e| e.map(|e| rate(f) / rate(e))), 2),
                    range(&of(&|f, _, _| Some(f.cpu.allocations as f64 / f.messages as f64)), 1),
                    range(
                        &of(&|f, _, _| Some(f.cpu.allocated as f64 / f.messages as f64 / size as f64)),
                        2
                    ),
                );
            }
        } else {
            println!(
                "{:<36} {:>15} {:>12} {:>13} {:>11}",
                "row", "msg/s", "CPU µs/msg", "msg/s ×engine", "runs/1k"
            );
            for &who in group.rows() {
                let rows = per_round(who);
                let rates: Vec<f64> = rows.iter().map(|(f, _, _)| rate(f)).collect();
                let cpus: Vec<f64> = rows.iter().map(|(f, _, _)| cpu_per_message(f)).collect();
                let vs_engine: Vec<f64> = rows
                    .iter()
                    .filter_map(|(f, _, e)| e.map(|e| rate(f) / rate(e)))
                    .collect();
                let runs: Vec<f64> = rows
                    .iter()
                    .map(|(f, _, _)| f.cpu.runs as f64 * 1000.0 / f.messages as f64)
                    .collect();
                println!(
                    "{:<36} {:>15} {:>12} {:>13} {:>11}",
                    who.name(Some(group), args),
                    range(&rates, 0),
                    range(&cpus, 2),
                    range(&vs_engine, 2),
                    range(&runs, 0)
                );
            }
        }
    }
    if args.runs("memory") {
        println!();
        println!(
            "memory: {} idle connections, {} idle consumers (a channel each), {IN_FLIGHT} deliveries held unacked; \
             resident (RSS) and heap bytes per item, after a warm-up of {MEMORY_WARMUP} and malloc_trim",
            args.idle, args.idle
        );
        println!(
            "{:<36} {:>13} {:>13} {:>13} {:>13} {:>13} {:>13}",
            "row", "KiB RSS/conn", "KiB heap/conn", "KiB RSS/cons", "KiB heap/cons", "B RSS/msg", "B heap/msg"
        );
        for who in [Who::Engine, Who::Api, Who::Lapin, Who::Amqprs] {
            let of = |f: &dyn Fn(&Memory) -> Option<f64>| -> Vec<f64> {
                rounds.iter().filter_map(|r| r.memory(who).and_then(f)).collect()
            };
            println!(
                "{:<36} {:>13} {:>13} {:>13} {:>13} {:>13} {:>13}",
                who.name(None, args),
                range(&of(&|m| Some(m.connection.rss / 1024.0)), 1),
                range(&of(&|m| Some(m.connection.heap / 1024.0)), 1),
                range(&of(&|m| Some(m.consumer.rss / 1024.0)), 1),
                range(&of(&|m| Some(m.consumer.heap / 1024.0)), 1),
                range(&of(&|m| m.in_flight.map(|i| i.rss)), 0),
                range(&of(&|m| m.in_flight.map(|i| i.heap)), 0),
            );
        }
    }
    if args.runs("setup") {
        println!();
        println!(
            "connection set-up: connect + channel.open + confirm.select, {} connections per row; ms, min–max over rounds",
            args.setups
        );
        println!("{:<36} {:>15} {:>15} {:>15}", "row", "p50", "p99", "max");
        for who in [Who::Engine, Who::Api, Who::Lapin, Who::Amqprs] {
            let of = |p: usize| -> Vec<f64> { rounds.iter().filter_map(|r| r.setup(who, p)).map(ms).collect() };
            println!(
                "{:<36} {:>15} {:>15} {:>15}",
                setup_name(who, args),
                range(&of(50), 2),
                range(&of(99), 2),
                range(&of(100), 2)
            );
        }
    }
}

/// The targets of the groups at scale: (what, per-round values, rounds
/// that met it).
pub fn targets(rounds: &[&Round], args: &Args) -> Vec<(String, Vec<f64>, usize)> {
    let mut lines = Vec::new();
    let mut target = |what: String, values: Vec<f64>, met: &dyn Fn(f64) -> bool| {
        if !values.is_empty() {
            let ok = values.iter().filter(|v| met(**v)).count();
            lines.push((what, values, ok));
        }
    };
    let ratio = |group: Group, a: Who, b: Who, of: fn(&Figures) -> f64| -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|r| Some(of(r.get(group, a)?) / of(r.get(group, b)?)))
            .collect()
    };
    for group in groups(args) {
        let label = match group {
            Group::Publish(size) => format!("large {} publish", size_name(size)),
            Group::Consume(size) => format!("large {} consume", size_name(size)),
            Group::Queues => "many queues".into(),
            Group::Tasks => "many tasks".into(),
        };
        let (speed, cost) = if group.body().is_some() {
            ("MiB/s", "CPU/MiB")
        } else {
            ("msg/s", "CPU/msg")
        };
        for acemq in [Who::Engine, Who::Api] {
            let who = match acemq {
                Who::Engine => "engine",
                _ => "API",
            };
            for peer in [Who::Lapin, Who::Amqprs] {
                let peer_name = peer.name(None, args);
                target(
                    format!("{label}, {who}: {speed} ahead of {peer_name} (acemq/peer > 1)"),
                    ratio(group, acemq, peer, rate),
                    &|v| v > 1.0,
                );
                target(
                    format!("{label}, {who}: {cost} below {peer_name} (acemq/peer < 1)"),
                    ratio(group, acemq, peer, cpu_per_message),
                    &|v| v < 1.0,
                );
            }
            if group.body().is_some() {
                target(
                    format!("{label}, {who}: {cost} ≤ 1.15× floor"),
                    ratio(group, acemq, Who::Floor, cpu_per_message),
                    &|v| v <= 1.15,
                );
            }
        }
    }
    if args.runs("memory") {
        // Against the smaller of the two peers' in the same round.
        let vs_peers = |who: Who, of: fn(&Memory) -> f64| -> Vec<f64> {
            rounds
                .iter()
                .filter_map(|r| {
                    let mine = of(r.memory(who)?);
                    let least = of(r.memory(Who::Lapin)?).min(of(r.memory(Who::Amqprs)?));
                    Some(mine / least)
                })
                .collect()
        };
        for (who, label) in [
            (Who::Engine, "engine Connection"),
            (Who::Api, "API Conn (two connections)"),
        ] {
            target(
                format!("memory: {label} RSS per idle connection ≤ the smaller peer's"),
                vs_peers(who, |m| m.connection.rss),
                &|v| v <= 1.0,
            );
            target(
                format!("memory: {label} heap per idle connection ≤ the smaller peer's"),
                vs_peers(who, |m| m.connection.heap),
                &|v| v <= 1.0,
            );
        }
        for (who, label) in [(Who::Engine, "engine"), (Who::Api, "API consume")] {
            target(
                format!("memory: {label} RSS per idle consumer ≤ the smaller peer's"),
                vs_peers(who, |m| m.consumer.rss),
                &|v| v <= 1.0,
            );
            target(
                format!("memory: {label} heap per idle consumer ≤ the smaller peer's"),
                vs_peers(who, |m| m.consumer.heap),
                &|v| v <= 1.0,
            );
        }
    }
    if args.runs("setup") {
        for who in [Who::Engine, Who::Api] {
            for (p, label) in [(50, "p50"), (99, "p99")] {
                for peer in [Who::Lapin, Who::Amqprs] {
                    let values: Vec<f64> = rounds
                        .iter()
                        .filter_map(|r| Some(ms(r.setup(who, p)?) / ms(r.setup(peer, p)?)))
                        .collect();
                    target(
                        format!(
                            "set-up, {}: {label} below {} (acemq/peer < 1)",
                            setup_name(who, args),
                            peer.name(None, args)
                        ),
                        values,
                        &|v| v < 1.0,
                    );
                }
            }
        }
    }
    lines
}
