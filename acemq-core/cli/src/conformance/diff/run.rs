//! Runs a sequence of [`Op`]s against one broker through the low-level
//! engine API and records everything the broker says into a transcript.
//!
//! Determinism: each operation is followed by `Run::quieten`, which makes
//! the broker quiet before the next one starts:
//!
//! - every open channel gets a synchronous round trip (a passive declare of
//!   `amq.direct`, which cannot fail): a broker answers a channel's methods
//!   in order, so every delivery, return, cancel and channel close the
//!   operation caused on that channel is in before its reply;
//! - publishes are confirmed (a channel in neither mode is put in confirm
//!   mode first) or part of a transaction, so a message has reached its
//!   queues before the next operation;
//! - then the queues are probed (passive declares on a connection of the
//!   harness's own) until no queue has ready messages that a consumer with
//!   credit could take, twice in a row, under a deadline. Streams report
//!   no length (see `normalise::declare_counts`), so a stream consumer with
//!   credit counts as caught up once nothing has reached it for
//!   `STREAM_GRACE`: the one wait that rests on time.
//!
//! Asynchronous observations are kept per channel and written out channel
//! by channel after each operation, so the order in which two channels
//! happened to receive things does not matter, while the order within one
//! channel does. A channel holds at most one consumer, so delivery tags
//! follow one queue's order.

use std::time::Duration;

use acemq_codec::*;
use acemq_core::amqp::{CloseReason, Confirmation, Connection, ConnectionEvent, Consumer, Error, Properties};
use bytes::Bytes;
use tokio::sync::broadcast;
use tokio::time::{timeout, Instant};

use super::normalise::{self, Normaliser};
use super::ops::*;
use super::{Broker, Line, Transcript};

/// How long one broker reply may take before it is recorded as missing.
const REPLY: Duration = Duration::from_secs(10);
/// How long `quieten` may wait for the queues to become quiet.
const QUIET: Duration = Duration::from_secs(5);
/// How long a stream consumer with credit must have received nothing to be
/// taken as caught up.
const STREAM_GRACE: Duration = Duration::from_millis(60);
/// The tag acked when a channel has nothing unacked: unknown to the broker.
const UNKNOWN_TAG: u64 = 1000;

/// The names of one sequence's queues and exchanges.
#[derive(Debug, Clone)]
pub struct Names {
    prefix: String,
}

impl Names {
    /// Names under `prefix`, which must be unique to the sequence.
    pub fn new(prefix: impl Into<String>) -> Names {
        Names { prefix: prefix.into() }
    }

    /// A queue's name.
    pub fn queue(&self, q: Q) -> String {
        format!("{}.{}", self.prefix, q.short())
    }

    /// An exchange's name.
    pub fn exchange(&self, x: X) -> String {
        format!("{}.{}", self.prefix, x.kind())
    }

    fn target(&self, t: Target) -> String {
        match t {
            Target::Default => String::new(),
            Target::Exchange(x) => self.exchange(x),
            Target::Missing => format!("{}.missing", self.prefix),
        }
    }

    fn key(&self, k: Key) -> String {
        match k {
            Key::A => "a".into(),
            Key::B => "b".into(),
            Key::AB => "a.b".into(),
            Key::AStar => "a.*".into(),
            Key::Hash => "#".into(),
            Key::Queue(q) => self.queue(q),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Confirm,
    Tx,
}

struct Unacked {
    tag: u64,
    consumer: Option<String>,
    /// The queue of a `basic.get` message, while that queue lives.
    got_from: Option<Q>,
}

struct ConsumerState {
    consumer: Consumer,
    tag: String,
    q: Q,
    no_ack: bool,
    prefetch: u16,
    /// When it last received a delivery (or started).
    last_delivery: Instant,
}

struct Chan {
    ch: acemq_core::amqp::Channel,
    mode: Mode,
    prefetch: u16,
    consumer: Option<ConsumerState>,
    unacked: Vec<Unacked>,
    /// Acks made inside the open transaction (a rollback gives them back).
    tx_settled: Vec<Unacked>,
}

struct Conn {
    conn: Connection,
    events: broadcast::Receiver<ConnectionEvent>,
    channels: Vec<Option<Chan>>,
}

/// One run of a sequence against one broker.
pub struct Run {
    broker: Broker,
    names: Names,
    conns: Vec<Option<Conn>>,
    probe: Option<(Connection, acemq_core::amqp::Channel)>,
    norm: Normaliser,
    lines: Transcript,
    /// Asynchronous observations of the current operation, per channel.
    buckets: Vec<Vec<String>>,
    published: u32,
    consumers: u32,
    step: usize,
    last_counts: String,
    /// Quiet rounds in a row that make the broker quiet.
    rounds: usize,
    /// The type each queue slot was declared with, while it exists.
    kinds: [Option<Q>; 3],
}

/// Runs `ops` against `broker`, with queue and exchange names under
/// `prefix`, and returns the transcript, in which `prefix` is written `P`
/// (see [`normalise::prefix`]). Everything is deleted again at the end.
pub async fn run(broker: &Broker, prefix: &str, ops: &[Op]) -> Transcript {
    let mut run = Run {
        broker: broker.clone(),
        names: Names::new(prefix),
        conns: (0..CONNECTIONS).map(|_| None).collect(),
        probe: None,
        norm: Normaliser::default(),
        lines: Vec::new(),
        buckets: (0..CONNECTIONS * CHANNELS).map(|_| Vec::new()).collect(),
        published: 0,
        consumers: 0,
        step: 0,
        last_counts: String::new(),
        rounds: if broker.url().memory { 1 } else { 2 },
        kinds: [None; 3],
    };
    for (i, op) in ops.iter().enumerate() {
        run.step = i;
        run.apply(op).await;
        run.quieten(op.channel()).await;
    }
    run.step = ops.len();
    run.cleanup().await;
    for line in &mut run.lines {
        line.text = normalise::prefix(&line.text, prefix);
    }
    run.lines
}

fn refusal(e: &Error, norm: &mut Normaliser) -> String {
    match e {
        Error::ChannelClosed(r) => format!(
            "channel closed {} {:?} ({}.{})",
            r.code,
            norm.text(&r.text),
            r.class_id,
            r.method_id
        ),
        Error::ConnectionClosed(CloseReason::ByServer(r)) => format!(
            "connection closed {} {:?} ({}.{})",
            r.code,
            norm.text(&r.text),
            r.class_id,
            r.method_id
        ),
        other => format!("error {other}"),
    }
}

fn fmt_table(t: &FieldTable) -> String {
    let entries: Vec<String> = t.iter().map(|(k, v)| format!("{k}={}", fmt_value(v))).collect();
    format!("{{{}}}", entries.join(", "))
}

fn fmt_value(v: &FieldValue) -> String {
    match v {
        FieldValue::Table(t) => format!("F{}", fmt_table(t)),
        FieldValue::Array(a) => format!("A[{}]", a.iter().map(fmt_value).collect::<Vec<_>>().join(", ")),
        FieldValue::LongString(s) => format!("S{:?}", s.to_string_lossy()),
        other => format!("{other:?}"),
    }
}

fn fmt_props(p: &Properties) -> String {
    let Ok(p) = p else {
        return "undecodable properties".into();
    };
    let p = normalise::properties(p);
    let mut out = Vec::new();
    macro_rules! field {
        ($name:ident) => {
            if let Some(v) = &p.$name {
                out.push(format!("{}={:?}", stringify!($name), v));
            }
        };
    }
    field!(content_type);
    field!(content_encoding);
    if let Some(h) = &p.headers {
        out.push(format!("headers={}", fmt_table(h)));
    }
    field!(delivery_mode);
    field!(priority);
    field!(correlation_id);
    field!(reply_to);
    field!(expiration);
    field!(message_id);
    field!(timestamp);
    field!(kind);
    field!(user_id);
    field!(app_id);
    field!(cluster_id);
    out.join(" ")
}

fn slot(q: Q) -> usize {
    Q::ALL.iter().position(|x| *x == q).unwrap_or(0)
}

/// The type a slot is declared with when `other_type` is set.
fn next_type(q: Q) -> Q {
    Q::ALL[(slot(q) + 1) % Q::ALL.len()]
}

/// A method every broker answers at once and that cannot fail: a passive
/// declare of `amq.direct`.
async fn round_trip(ch: &acemq_core::amqp::Channel) -> Result<(), Error> {
    let flush = ExchangeDeclare {
        exchange: "amq.direct".into(),
        kind: "direct".into(),
        passive: true,
        ..Default::default()
    };
    ch.exchange_declare(flush).await.map(|_| ())
}

fn int(i: Int) -> FieldValue {
    match i {
        Int::I(v) => FieldValue::I32(v),
        Int::L(v) => FieldValue::I64(i64::from(v)),
    }
}

impl Run {
    fn record(&mut self, line: impl AsRef<str>) {
        self.lines.push(Line {
            step: self.step,
            text: line.as_ref().to_string(),
        });
    }

    fn queue_arguments(&self, q: Q, args: &QueueArgs, other_type: bool) -> FieldTable {
        let mut t = FieldTable::default();
        let kind = if other_type { next_type(q) } else { q };
        t.insert("x-queue-type", FieldValue::LongString(kind.queue_type().into()));
        if let Some(v) = args.message_ttl {
            t.insert("x-message-ttl", int(v));
        }
        if let Some(v) = args.max_length {
            t.insert("x-max-length", int(v));
        }
        if let Some(v) = args.overflow {
            let s = match v {
                Overflow::DropHead => "drop-head",
                Overflow::RejectPublish => "reject-publish",
                Overflow::RejectPublishDlx => "reject-publish-dlx",
            };
            t.insert("x-overflow", FieldValue::LongString(s.into()));
        }
        if let Some(v) = args.dead_letter_exchange {
            let s = match v {
                Dlx::Default => String::new(),
                Dlx::Exchange(x) => self.names.exchange(x),
            };
            t.insert("x-dead-letter-exchange", FieldValue::LongString(s.as_str().into()));
        }
        if let Some(k) = args.dead_letter_routing_key {
            t.insert(
                "x-dead-letter-routing-key",
                FieldValue::LongString(self.names.key(k).as_str().into()),
            );
        }
        if let Some(v) = args.expires {
            t.insert("x-expires", int(v));
        }
        if let Some(v) = args.delivery_limit {
            t.insert("x-delivery-limit", int(v));
        }
        t
    }

    fn binding_arguments(m: Match) -> FieldTable {
        let mut t = FieldTable::default();
        match m {
            Match::None => {}
            Match::AllH1 => {
                t.insert("x-match", FieldValue::LongString("all".into()));
                t.insert("h1", FieldValue::LongString("a".into()));
            }
            Match::AnyH1H2 | Match::AllH1H2 => {
                let how = if m == Match::AnyH1H2 { "any" } else { "all" };
                t.insert("x-match", FieldValue::LongString(how.into()));
                t.insert("h1", FieldValue::LongString("a".into()));
                t.insert("h2", FieldValue::I32(1));
            }
        }
        t
    }

    /// The channel `c`, opened (and its connection) if it is not open.
    async fn chan(&mut self, c: Ch) -> Option<&mut Chan> {
        if self.conns[c.conn()].as_ref().is_some_and(|k| k.conn.is_closed()) {
            self.connection_lost(c.conn());
        }
        if self.conns[c.conn()].is_none() {
            match timeout(REPLY, self.broker.open()).await {
                Ok(Ok(conn)) => {
                    let events = conn.events();
                    self.conns[c.conn()] = Some(Conn {
                        conn,
                        events,
                        channels: (0..CHANNELS).map(|_| None).collect(),
                    });
                }
                other => {
                    self.record(format!("connection {} could not open: {other:?}", c.conn()));
                    return None;
                }
            }
        }
        let conn = self.conns[c.conn()].as_mut()?;
        if conn.channels[c.index()].as_ref().is_some_and(|ch| !ch.ch.is_open()) {
            conn.channels[c.index()] = None;
        }
        if conn.channels[c.index()].is_none() {
            let opened = timeout(REPLY, conn.conn.channel()).await;
            match opened {
                Ok(Ok(ch)) => {
                    conn.channels[c.index()] = Some(Chan {
                        ch,
                        mode: Mode::Plain,
                        prefetch: 0,
                        consumer: None,
                        unacked: Vec::new(),
                        tx_settled: Vec::new(),
                    })
                }
                other => {
                    let line = format!("channel {} could not open: {other:?}", c.0);
                    self.record(line);
                    return None;
                }
            }
        }
        self.conns[c.conn()].as_mut()?.channels[c.index()].as_mut()
    }

    /// Forgets a connection that the broker closed (recorded by whoever saw it).
    fn connection_lost(&mut self, conn: usize) {
        self.conns[conn] = None;
    }

    /// Records the outcome of a call on `c` and forgets the channel (or the
    /// connection) if the broker closed it.
    fn outcome<T>(
        &mut self,
        c: Ch,
        what: &str,
        result: Result<Result<T, Error>, tokio::time::error::Elapsed>,
        ok: impl FnOnce(&mut Self, T) -> String,
    ) {
        match result {
            Ok(Ok(v)) => {
                let line = ok(self, v);
                self.record(format!("ch{} {what} -> {line}", c.0));
            }
            Ok(Err(e)) => {
                let line = refusal(&e, &mut self.norm);
                self.record(format!("ch{} {what} -> {line}", c.0));
                self.closed(c, &e);
            }
            Err(_) => self.record(format!("ch{} {what} -> no reply within {REPLY:?}", c.0)),
        }
    }

    fn closed(&mut self, c: Ch, e: &Error) {
        match e {
            Error::ConnectionClosed(_) => self.connection_lost(c.conn()),
            _ => {
                if let Some(conn) = self.conns[c.conn()].as_mut() {
                    conn.channels[c.index()] = None;
                }
            }
        }
    }

    async fn apply(&mut self, op: &Op) {
        match op.clone() {
            Op::DeclareQueue {
                ch,
                q,
                args,
                durable,
                passive,
                other_type,
            } => {
                let method = QueueDeclare {
                    queue: self.names.queue(q).as_str().into(),
                    passive,
                    durable,
                    arguments: self.queue_arguments(q, &args, other_type),
                    ..Default::default()
                };
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.queue_declare(method)).await;
                if matches!(r, Ok(Ok(_))) && !passive && self.kinds[slot(q)].is_none() {
                    self.kinds[slot(q)] = Some(if other_type { next_type(q) } else { q });
                }
                let kind = self.kinds[slot(q)];
                self.outcome(ch, &format!("queue.declare {q:?}"), r, |_, ok| match ok {
                    Some(ok) => format!(
                        "declare-ok {:?} {}",
                        ok.queue,
                        normalise::declare_counts(kind, ok.message_count, ok.consumer_count)
                    ),
                    None => "no reply".into(),
                });
            }
            Op::DeleteQueue {
                ch,
                q,
                if_unused,
                if_empty,
            } => {
                let method = QueueDelete {
                    queue: self.names.queue(q).as_str().into(),
                    if_unused,
                    if_empty,
                    ..Default::default()
                };
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.queue_delete(method)).await;
                if matches!(r, Ok(Ok(_))) {
                    self.kinds[slot(q)] = None;
                    // Its unacked gets no longer count as its consumers.
                    for chan in self
                        .conns
                        .iter_mut()
                        .flatten()
                        .flat_map(|c| c.channels.iter_mut().flatten())
                    {
                        for u in chan.unacked.iter_mut().chain(chan.tx_settled.iter_mut()) {
                            if u.got_from == Some(q) {
                                u.got_from = None;
                            }
                        }
                    }
                }
                self.outcome(ch, &format!("queue.delete {q:?}"), r, |_, ok| format!("{ok:?}"));
            }
            Op::PurgeQueue { ch, q } => {
                let method = QueuePurge {
                    queue: self.names.queue(q).as_str().into(),
                    ..Default::default()
                };
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.queue_purge(method)).await;
                self.outcome(ch, &format!("queue.purge {q:?}"), r, |_, ok| format!("{ok:?}"));
            }
            Op::DeclareExchange {
                ch,
                x,
                durable,
                passive,
                other_type,
            } => {
                let kind = if other_type {
                    X::ALL[(X::ALL.iter().position(|k| *k == x).unwrap_or(0) + 1) % X::ALL.len()]
                } else {
                    x
                };
                let method = ExchangeDeclare {
                    exchange: self.names.exchange(x).as_str().into(),
                    kind: kind.kind().into(),
                    passive,
                    durable,
                    ..Default::default()
                };
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.exchange_declare(method)).await;
                self.outcome(ch, &format!("exchange.declare {x:?}"), r, |_, ok| format!("{ok:?}"));
            }
            Op::DeleteExchange { ch, x, if_unused } => {
                let method = ExchangeDelete {
                    exchange: self.names.exchange(x).as_str().into(),
                    if_unused,
                    ..Default::default()
                };
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.exchange_delete(method)).await;
                self.outcome(ch, &format!("exchange.delete {x:?}"), r, |_, ok| format!("{ok:?}"));
            }
            Op::BindQueue { ch, q, x, key, args } | Op::UnbindQueue { ch, q, x, key, args } => {
                let bind = matches!(op, Op::BindQueue { .. });
                let (queue, exchange, routing_key) = (self.names.queue(q), self.names.exchange(x), self.names.key(key));
                let arguments = Self::binding_arguments(args);
                let Some(c) = self.chan(ch).await else { return };
                let what = format!(
                    "queue.{} {q:?} {x:?} {routing_key:?} {args:?}",
                    if bind { "bind" } else { "unbind" }
                );
                if bind {
                    let method = QueueBind {
                        queue: queue.as_str().into(),
                        exchange: exchange.as_str().into(),
                        routing_key: routing_key.as_str().into(),
                        arguments,
                        ..Default::default()
                    };
                    let r = timeout(REPLY, c.ch.queue_bind(method)).await;
                    self.outcome(ch, &what, r, |_, ok| format!("{ok:?}"));
                } else {
                    let method = QueueUnbind {
                        queue: queue.as_str().into(),
                        exchange: exchange.as_str().into(),
                        routing_key: routing_key.as_str().into(),
                        arguments,
                        ..Default::default()
                    };
                    let r = timeout(REPLY, c.ch.queue_unbind(method)).await;
                    self.outcome(ch, &what, r, |_, ok| format!("{ok:?}"));
                }
            }
            Op::BindExchange {
                ch,
                destination,
                source,
                key,
            }
            | Op::UnbindExchange {
                ch,
                destination,
                source,
                key,
            } => {
                let bind = matches!(op, Op::BindExchange { .. });
                let (destination_name, source_name, routing_key) = (
                    self.names.exchange(destination),
                    self.names.exchange(source),
                    self.names.key(key),
                );
                let Some(c) = self.chan(ch).await else { return };
                let what = format!(
                    "exchange.{} {destination:?} <- {source:?} {routing_key:?}",
                    if bind { "bind" } else { "unbind" }
                );
                if bind {
                    let method = ExchangeBind {
                        destination: destination_name.as_str().into(),
                        source: source_name.as_str().into(),
                        routing_key: routing_key.as_str().into(),
                        ..Default::default()
                    };
                    let r = timeout(REPLY, c.ch.exchange_bind(method)).await;
                    self.outcome(ch, &what, r, |_, ok| format!("{ok:?}"));
                } else {
                    let method = ExchangeUnbind {
                        destination: destination_name.as_str().into(),
                        source: source_name.as_str().into(),
                        routing_key: routing_key.as_str().into(),
                        ..Default::default()
                    };
                    let r = timeout(REPLY, c.ch.exchange_unbind(method)).await;
                    self.outcome(ch, &what, r, |_, ok| format!("{ok:?}"));
                }
            }
            Op::Publish {
                ch,
                to,
                key,
                mandatory,
                props,
            } => self.publish(ch, to, key, mandatory, props).await,
            Op::Get { ch, q, no_ack } => {
                let queue = self.names.queue(q);
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.basic_get(&queue, no_ack)).await;
                self.outcome(
                    ch,
                    &format!("basic.get {q:?} no_ack={no_ack}"),
                    r,
                    |run, got| match got {
                        None => "get-empty".into(),
                        Some(m) => {
                            if !no_ack {
                                if let Some(c) = run.chan_now(ch) {
                                    c.unacked.push(Unacked {
                                        tag: m.delivery_tag,
                                        consumer: None,
                                        got_from: Some(q),
                                    });
                                }
                            }
                            format!(
                                "get-ok dtag={} redelivered={} ex={:?} rk={:?} left={} {} body={:?}",
                                m.delivery_tag,
                                m.redelivered,
                                m.exchange,
                                m.routing_key,
                                m.message_count,
                                fmt_props(&m.properties),
                                m.body
                            )
                        }
                    },
                );
            }
            Op::Consume {
                ch,
                q,
                no_ack,
                exclusive,
                server_tag,
                prefetch,
                offset,
            } => {
                self.consume(ch, q, no_ack, exclusive, server_tag, prefetch, offset)
                    .await
            }
            Op::Cancel { ch } => {
                let Some(c) = self.chan(ch).await else { return };
                let Some(consumer) = c.consumer.take() else {
                    self.record(format!("ch{} basic.cancel: no consumer here", ch.0));
                    return;
                };
                let cancel = BasicCancel {
                    consumer_tag: consumer.tag.as_str().into(),
                    no_wait: false,
                };
                let r = timeout(REPLY, c.ch.basic_cancel(cancel)).await;
                // What was delivered before the cancel-ok is still its.
                let mut consumer = consumer;
                self.take_deliveries(ch, &mut consumer);
                self.outcome(ch, "basic.cancel", r, |run, ok| {
                    format!(
                        "{:?}",
                        ok.map(|ok| run.norm.consumer_tag(&ok.consumer_tag.to_string_lossy()))
                    )
                });
            }
            Op::Ack { ch, pick, multiple } => {
                self.settle_op(
                    ch,
                    pick,
                    "ack",
                    move |c, tag| c.ch.basic_ack(tag, multiple),
                    multiple,
                    false,
                )
                .await
            }
            Op::Nack {
                ch,
                pick,
                multiple,
                requeue,
            } => {
                self.settle_op(
                    ch,
                    pick,
                    &format!("nack requeue={requeue}"),
                    move |c, tag| c.ch.basic_nack(tag, multiple, requeue),
                    multiple,
                    requeue,
                )
                .await
            }
            Op::Reject { ch, pick, requeue } => {
                self.settle_op(
                    ch,
                    pick,
                    &format!("reject requeue={requeue}"),
                    move |c, tag| c.ch.basic_reject(tag, requeue),
                    false,
                    requeue,
                )
                .await
            }
            Op::Recover { ch } => {
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.basic_recover(BasicRecover { requeue: true })).await;
                if let Some(c) = self.chan_now(ch) {
                    c.unacked.clear();
                }
                self.outcome(ch, "basic.recover", r, |_, ok| format!("{ok:?}"));
            }
            Op::Qos { ch, prefetch } => {
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.qos(prefetch)).await;
                if let Some(c) = self.chan_now(ch) {
                    c.prefetch = prefetch;
                }
                self.outcome(ch, &format!("basic.qos {prefetch}"), r, |_, ok| format!("{ok:?}"));
            }
            Op::ConfirmSelect { ch } => {
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.confirm_select()).await;
                if matches!(r, Ok(Ok(()))) {
                    if let Some(c) = self.chan_now(ch) {
                        c.mode = Mode::Confirm;
                    }
                }
                self.outcome(ch, "confirm.select", r, |_, ok| format!("{ok:?}"));
            }
            Op::TxSelect { ch } => {
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.tx_select()).await;
                if matches!(r, Ok(Ok(()))) {
                    if let Some(c) = self.chan_now(ch) {
                        c.mode = Mode::Tx;
                    }
                }
                self.outcome(ch, "tx.select", r, |_, ok| format!("{ok:?}"));
            }
            Op::TxCommit { ch } => {
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.tx_commit()).await;
                if let Some(c) = self.chan_now(ch) {
                    c.tx_settled.clear();
                }
                self.outcome(ch, "tx.commit", r, |_, ok| format!("{ok:?}"));
            }
            Op::TxRollback { ch } => {
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.tx_rollback()).await;
                if let Some(c) = self.chan_now(ch) {
                    let back = std::mem::take(&mut c.tx_settled);
                    c.unacked.extend(back);
                    c.unacked.sort_by_key(|u| u.tag);
                }
                self.outcome(ch, "tx.rollback", r, |_, ok| format!("{ok:?}"));
            }
            Op::Flow { ch, active } => {
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.flow(ChannelFlow { active })).await;
                self.outcome(ch, &format!("channel.flow active={active}"), r, |_, ok| {
                    format!("{ok:?}")
                });
            }
            Op::BodyFrame { over } => {
                let payload = (i64::from(super::raw::RAW_FRAME_MAX) + i64::from(over)) as usize;
                let queue = self.names.queue(Q::Classic);
                let answer = super::raw::publish_one_body_frame(&self.broker, &queue, payload).await;
                self.record(format!(
                    "a body frame of frame_max{over:+} bytes to {:?} -> {answer}",
                    queue
                ));
            }
            Op::CloseChannel { ch } => {
                let Some(c) = self.chan(ch).await else { return };
                let r = timeout(REPLY, c.ch.close()).await;
                if let Some(conn) = self.conns[ch.conn()].as_mut() {
                    conn.channels[ch.index()] = None;
                }
                self.outcome(ch, "channel.close", r, |_, ok| format!("{ok:?}"));
            }
        }
    }

    /// The channel `c` if it is open now (no reopening).
    fn chan_now(&mut self, c: Ch) -> Option<&mut Chan> {
        self.conns[c.conn()].as_mut()?.channels[c.index()].as_mut()
    }

    async fn publish(&mut self, ch: Ch, to: Target, key: Key, mandatory: bool, props: Props) {
        self.published += 1;
        let n = self.published;
        let (exchange, routing_key) = (self.names.target(to), self.names.key(key));
        let mut properties = BasicProperties {
            message_id: Some(format!("m{n}").as_str().into()),
            delivery_mode: props.delivery_mode,
            expiration: props.expiration.map(Into::into),
            ..Default::default()
        };
        if props.labelled {
            properties.content_type = Some("text/plain".into());
            properties.correlation_id = Some(format!("corr{n}").as_str().into());
        }
        if props.h1.is_some() || props.h2.is_some() {
            let mut headers = FieldTable::default();
            if let Some(h1) = props.h1 {
                headers.insert("h1", FieldValue::LongString(h1.into()));
            }
            if let Some(h2) = props.h2 {
                headers.insert("h2", FieldValue::I32(h2));
            }
            properties.headers = Some(headers);
        }
        let Some(c) = self.chan(ch).await else { return };
        if c.mode == Mode::Plain {
            let r = timeout(REPLY, c.ch.confirm_select()).await;
            let ok = matches!(r, Ok(Ok(())));
            self.outcome(ch, "(confirm.select before a publish)", r, |_, ok| format!("{ok:?}"));
            if !ok {
                return;
            }
            let Some(c) = self.chan_now(ch) else { return };
            c.mode = Mode::Confirm;
        }
        let Some(c) = self.chan_now(ch) else { return };
        let what = format!("basic.publish m{n} to {to:?} {routing_key:?} mandatory={mandatory}");
        let confirm =
            c.ch.publish(
                &exchange,
                &routing_key,
                mandatory,
                properties,
                Bytes::from(format!("m{n}")),
            )
            .await;
        let confirm = match confirm {
            Ok(confirm) => confirm,
            Err(e) => {
                let line = refusal(&e, &mut self.norm);
                self.record(format!("ch{} {what} -> {line}", ch.0));
                self.closed(ch, &e);
                return;
            }
        };
        // The round trip is queued with the publish, before the broker can
        // refuse it (in a transaction nothing else would see the refusal).
        let Some(c) = self.chan_now(ch) else { return };
        let channel = c.ch.clone();
        let (r, flushed) = tokio::join!(timeout(REPLY, confirm), timeout(REPLY, round_trip(&channel)));
        if let Ok(Err(e)) = &flushed {
            if !matches!(r, Ok(Err(_))) {
                let line = refusal(e, &mut self.norm);
                self.buckets[usize::from(ch.0)].push(line);
                self.closed(ch, e);
            }
        }
        self.outcome(ch, &what, r, |run, c| match c {
            Confirmation::Ack => "ack".into(),
            Confirmation::Nack => "nack".into(),
            Confirmation::NotRequested => "(in the transaction)".into(),
            Confirmation::Returned(m) => format!(
                "returned {} {:?} ex={:?} rk={:?} {} body={:?}, then ack",
                m.reply_code,
                run.norm.text(&m.reply_text.to_string_lossy()),
                m.exchange,
                m.routing_key,
                fmt_props(&m.properties),
                m.body
            ),
        });
    }

    #[allow(clippy::too_many_arguments)]
    async fn consume(
        &mut self,
        ch: Ch,
        q: Q,
        no_ack: bool,
        exclusive: bool,
        server_tag: bool,
        prefetch: Option<u16>,
        offset: Offset,
    ) {
        self.consumers += 1;
        let tag = if server_tag {
            String::new()
        } else {
            format!("c{}", self.consumers)
        };
        let queue = self.names.queue(q);
        let Some(c) = self.chan(ch).await else { return };
        if c.consumer.is_some() {
            self.record(format!("ch{} basic.consume: skipped, the channel has a consumer", ch.0));
            return;
        }
        if let Some(p) = prefetch {
            let r = timeout(REPLY, c.ch.qos(p)).await;
            let ok = matches!(r, Ok(Ok(())));
            self.outcome(ch, &format!("basic.qos {p}"), r, |_, ok| format!("{ok:?}"));
            if !ok {
                return;
            }
        }
        let Some(c) = self.chan_now(ch) else { return };
        if let Some(p) = prefetch {
            c.prefetch = p;
        }
        let mut arguments = FieldTable::default();
        if q == Q::Stream {
            let v = match offset {
                Offset::Unset => None,
                Offset::First => Some(FieldValue::LongString("first".into())),
                Offset::Last => Some(FieldValue::LongString("last".into())),
                Offset::Next => Some(FieldValue::LongString("next".into())),
                Offset::At(n) => Some(FieldValue::I64(n)),
            };
            if let Some(v) = v {
                arguments.insert("x-stream-offset", v);
            }
        }
        let method = BasicConsume {
            queue: queue.as_str().into(),
            consumer_tag: tag.as_str().into(),
            no_ack,
            exclusive,
            arguments,
            ..Default::default()
        };
        let prefetch = c.prefetch;
        let r = timeout(REPLY, c.ch.basic_consume(method)).await;
        let what = format!("basic.consume {q:?} no_ack={no_ack} exclusive={exclusive} {offset:?}");
        self.outcome(ch, &what, r, |run, consumer| {
            let tag = consumer.tag().to_string_lossy().into_owned();
            let shown = run.norm.consumer_tag(&tag);
            if let Some(c) = run.chan_now(ch) {
                c.consumer = Some(ConsumerState {
                    consumer,
                    tag,
                    q,
                    no_ack,
                    prefetch,
                    last_delivery: Instant::now(),
                });
            }
            format!("consume-ok {shown}")
        });
    }

    async fn settle_op(
        &mut self,
        ch: Ch,
        pick: u8,
        what: &str,
        send: impl FnOnce(&Chan, u64) -> Result<(), Error>,
        multiple: bool,
        _requeue: bool,
    ) {
        let Some(c) = self.chan(ch).await else { return };
        let tag = if c.unacked.is_empty() {
            // An unknown tag now and then (a 406), mostly nothing: the
            // sequence goes on with the channel open.
            if !pick.is_multiple_of(4) {
                self.record(format!("ch{} basic.{what}: nothing unacked here", ch.0));
                return;
            }
            UNKNOWN_TAG
        } else {
            c.unacked[usize::from(pick) % c.unacked.len()].tag
        };
        let sent = send(c, tag);
        let mut settled: Vec<Unacked> = Vec::new();
        let mut kept = Vec::new();
        for u in c.unacked.drain(..) {
            if u.tag == tag || (multiple && u.tag <= tag) {
                settled.push(u);
            } else {
                kept.push(u);
            }
        }
        c.unacked = kept;
        if c.mode == Mode::Tx {
            c.tx_settled.extend(settled);
        }
        let line = format!("ch{} basic.{what} tag={tag} multiple={multiple}", ch.0);
        let line = match sent {
            Ok(()) => line,
            Err(e) => format!("{line} -> {}", refusal(&e, &mut self.norm)),
        };
        self.record(line);
    }

    /// Moves what a consumer has received into its channel's bucket.
    fn take_deliveries(&mut self, ch: Ch, consumer: &mut ConsumerState) {
        while let Some(d) = consumer.consumer.try_next() {
            let tag = self.norm.consumer_tag(&d.consumer_tag.to_string_lossy());
            consumer.last_delivery = Instant::now();
            let line = format!(
                "deliver {tag} dtag={} redelivered={} ex={:?} rk={:?} {} body={:?}",
                d.delivery_tag,
                d.redelivered,
                d.exchange,
                d.routing_key,
                fmt_props(&d.properties),
                d.body
            );
            self.buckets[usize::from(ch.0)].push(line);
            if !consumer.no_ack {
                if let Some(c) = self.chan_now(ch) {
                    c.unacked.push(Unacked {
                        tag: d.delivery_tag,
                        consumer: Some(consumer.tag.clone()),
                        got_from: None,
                    });
                }
            }
        }
    }

    /// Brings every channel up to date and waits for the queues to be quiet;
    /// then writes out what arrived, channel by channel, and the queue counts
    /// if they changed.
    async fn quieten(&mut self, first: Ch) {
        let started = Instant::now();
        let mut quiet_rounds = 0;
        let mut counts = String::new();
        loop {
            self.round_trip_all(first).await;
            self.collect().await;
            let (quiet, now_counts) = self.quiet().await;
            if quiet && now_counts == counts {
                quiet_rounds += 1;
            } else {
                quiet_rounds = 0;
            }
            counts = now_counts;
            // acemq-memory answers a round trip only once it has done
            // everything before it: one quiet round is quiet. RabbitMQ's
            // quorum queues apply settlements after their log is written,
            // so its counts must hold still for two rounds.
            if quiet_rounds >= self.rounds {
                break;
            }
            if started.elapsed() > QUIET {
                self.record(format!("not quiet after {QUIET:?}: {counts}"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for i in 0..self.buckets.len() {
            let lines = std::mem::take(&mut self.buckets[i]);
            for line in lines {
                self.record(format!("ch{i} {line}"));
            }
        }
        if counts != self.last_counts {
            self.record(format!("counts {counts}"));
            self.last_counts = counts;
        }
    }

    /// A round trip on every open channel, `first` first: an operation's
    /// own channel is the one an asynchronous refusal (of an ack, of a
    /// publish in a transaction) closes, and its round trip must be queued
    /// before the broker's close can arrive, to see the refusal.
    async fn round_trip_all(&mut self, first: Ch) {
        let all = (0..CONNECTIONS * CHANNELS).map(|c| Ch(c as u8));
        for c in std::iter::once(first).chain(all.filter(|c| *c != first)) {
            {
                let Some(chan) = self.chan_now(c) else { continue };
                let r = timeout(REPLY, round_trip(&chan.ch)).await;
                match r {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        let line = refusal(&e, &mut self.norm);
                        self.buckets[usize::from(c.0)].push(line);
                        // Deliveries that came before the close are still recorded.
                        self.collect_channel(c);
                        self.closed(c, &e);
                    }
                    Err(_) => self.buckets[usize::from(c.0)].push(format!("no reply within {REPLY:?}")),
                }
            }
        }
    }

    fn collect_channel(&mut self, c: Ch) {
        let Some(chan) = self.chan_now(c) else { return };
        if let Some(mut consumer) = chan.consumer.take() {
            self.take_deliveries(c, &mut consumer);
            if let Some(chan) = self.chan_now(c) {
                chan.consumer = Some(consumer);
            }
        }
    }

    async fn collect(&mut self) {
        for k in 0..CONNECTIONS {
            for i in 0..CHANNELS {
                self.collect_channel(Ch((k * CHANNELS + i) as u8));
            }
            // Connection events: returns outside confirms, cancels, closes.
            while let Some(conn) = self.conns[k].as_mut() {
                let event = match conn.events.try_recv() {
                    Ok(e) => e,
                    Err(broadcast::error::TryRecvError::Lagged(n)) => {
                        self.record(format!("connection {k}: {n} events lost"));
                        continue;
                    }
                    Err(_) => break,
                };
                let bucket = |channel: u16| {
                    conn.channels
                        .iter()
                        .position(|c| c.as_ref().is_some_and(|c| c.ch.id() == channel))
                        .map_or(k * CHANNELS, |i| k * CHANNELS + i)
                };
                match event {
                    ConnectionEvent::ConsumerCancelled { channel, consumer_tag } => {
                        let b = bucket(channel);
                        let tag = self.norm.consumer_tag(&consumer_tag.to_string_lossy());
                        if let Some(conn) = self.conns[k].as_mut() {
                            if let Some(c) = conn.channels[b - k * CHANNELS].as_mut() {
                                if c.consumer
                                    .as_ref()
                                    .is_some_and(|c| c.tag == consumer_tag.to_string_lossy())
                                {
                                    let mut consumer = c.consumer.take();
                                    if let Some(consumer) = consumer.as_mut() {
                                        self.take_deliveries(Ch(b as u8), consumer);
                                    }
                                }
                            }
                        }
                        self.buckets[b].push(format!("cancelled by the broker: {tag}"));
                    }
                    ConnectionEvent::Returned { channel, message } => {
                        let b = bucket(channel);
                        let line = format!(
                            "returned {} {:?} ex={:?} rk={:?} {} body={:?}",
                            message.reply_code,
                            self.norm.text(&message.reply_text.to_string_lossy()),
                            message.exchange,
                            message.routing_key,
                            fmt_props(&message.properties),
                            message.body
                        );
                        self.buckets[b].push(line);
                    }
                    ConnectionEvent::Closed(reason) => {
                        let line = match &reason {
                            CloseReason::ByServer(r) => format!(
                                "connection {k} closed {} {:?} ({}.{})",
                                r.code,
                                self.norm.text(&r.text),
                                r.class_id,
                                r.method_id
                            ),
                            other => format!("connection {k} closed: {other:?}"),
                        };
                        self.buckets[k * CHANNELS].push(line);
                        for i in 0..CHANNELS {
                            self.collect_channel(Ch((k * CHANNELS + i) as u8));
                        }
                        self.connection_lost(k);
                        break;
                    }
                    ConnectionEvent::Blocked { .. } | ConnectionEvent::Unblocked => {}
                }
            }
        }
    }

    /// The harness's own connection for probes and cleanup.
    async fn probe(&mut self) -> Option<acemq_core::amqp::Channel> {
        if let Some((conn, ch)) = &self.probe {
            if ch.is_open() {
                return Some(ch.clone());
            }
            if !conn.is_closed() {
                if let Ok(Ok(ch)) = timeout(REPLY, conn.channel()).await {
                    let conn = conn.clone();
                    self.probe = Some((conn, ch.clone()));
                    return Some(ch);
                }
            }
        }
        let conn = timeout(REPLY, self.broker.open()).await.ok()?.ok()?;
        let ch = timeout(REPLY, conn.channel()).await.ok()?.ok()?;
        self.probe = Some((conn, ch.clone()));
        Some(ch)
    }

    /// Whether no queue has ready messages a consumer with credit could
    /// take; and the counts of every queue, as recorded.
    async fn quiet(&mut self) -> (bool, String) {
        let mut quiet = true;
        let mut counts = Vec::new();
        for q in Q::ALL {
            let Some(probe) = self.probe().await else {
                return (false, "no probe connection".into());
            };
            let passive = QueueDeclare {
                queue: self.names.queue(q).as_str().into(),
                passive: true,
                ..Default::default()
            };
            let (ready, consumers) = match timeout(REPLY, probe.queue_declare(passive)).await {
                Ok(Ok(Some(ok))) => (ok.message_count, ok.consumer_count),
                _ => {
                    counts.push(format!("{q:?}=absent"));
                    continue;
                }
            };
            let kind = self.kinds[slot(q)];
            counts.push(format!("{q:?}={}", normalise::declare_counts(kind, ready, consumers)));
            // Consumers go away asynchronously on RabbitMQ (a quorum queue
            // hears of a closed channel later): wait for the count the
            // runner expects. A stream always says 0.
            if kind != Some(Q::Stream) {
                let chans = || self.conns.iter().flatten().flat_map(|c| c.channels.iter().flatten());
                let consuming = chans()
                    .filter(|c| c.consumer.as_ref().is_some_and(|c| c.q == q))
                    .count();
                let getting = if kind == Some(Q::Quorum) {
                    chans()
                        .flat_map(|c| c.unacked.iter().chain(c.tx_settled.iter()))
                        .filter(|u| u.got_from == Some(q))
                        .count()
                } else {
                    0
                };
                if consumers as usize != consuming + getting {
                    quiet = false;
                }
            }
            for chan in self.conns.iter().flatten().flat_map(|c| c.channels.iter().flatten()) {
                let Some(consumer) = &chan.consumer else { continue };
                if consumer.q != q {
                    continue;
                }
                let in_flight = chan
                    .unacked
                    .iter()
                    .chain(chan.tx_settled.iter())
                    .filter(|u| u.consumer.as_deref() == Some(consumer.tag.as_str()))
                    .count();
                let credit = consumer.no_ack || consumer.prefetch == 0 || in_flight < usize::from(consumer.prefetch);
                // Judged by the queue's type, not by its name: the quorum
                // queue's name may hold a stream (`other_type`).
                if kind.unwrap_or(q) == Q::Stream {
                    // RabbitMQ gives no length for a stream (see
                    // `normalise::declare_counts`): a stream consumer with
                    // credit is taken as caught up once nothing has come
                    // for STREAM_GRACE. The one wait on time alone.
                    // (acemq-memory delivers before it answers the round trip.)
                    let grace = if self.rounds > 1 { STREAM_GRACE } else { Duration::ZERO };
                    if credit && consumer.last_delivery.elapsed() < grace {
                        quiet = false;
                    }
                } else if credit && ready > 0 {
                    quiet = false;
                }
            }
        }
        (quiet, counts.join(" "))
    }

    async fn cleanup(&mut self) {
        for k in 0..CONNECTIONS {
            if let Some(conn) = self.conns[k].take() {
                let _ = timeout(REPLY, conn.conn.close()).await;
            }
        }
        for q in Q::ALL {
            let Some(probe) = self.probe().await else { return };
            let delete = QueueDelete {
                queue: self.names.queue(q).as_str().into(),
                ..Default::default()
            };
            let _ = timeout(REPLY, probe.queue_delete(delete)).await;
        }
        for x in X::ALL {
            let Some(probe) = self.probe().await else { return };
            let delete = ExchangeDelete {
                exchange: self.names.exchange(x).as_str().into(),
                ..Default::default()
            };
            let _ = timeout(REPLY, probe.exchange_delete(delete)).await;
        }
        if let Some((conn, _)) = self.probe.take() {
            let _ = timeout(REPLY, conn.close()).await;
        }
    }
}
