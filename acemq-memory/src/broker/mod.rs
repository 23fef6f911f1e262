//! The broker machine: virtual hosts with their exchanges and queues, the
//! server side of every open connection's channels, publishing, routing,
//! delivery, dead-lettering, timers and faults.
//!
//! It is sans-IO: every input takes `now`, output is bytes appended to each
//! connection's outbox by acemq-codec's encoders, and the driver asks
//! [`BrokerMachine::poll_timeout`] when to call
//! [`BrokerMachine::handle_timeout`]. It never sleeps, spawns or touches a
//! socket, never lays out a frame by hand, and nothing a client sends may
//! make it panic.

mod args;
mod consumers;
mod dead_letter;
mod delivery;
mod exchange;
mod fast_hash;
mod feature_args;
mod ids;
mod message;
mod methods;
mod queue;
mod reply_to;
mod stream;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use acemq_codec::track::ContentAssembler;
use acemq_codec::{
    encode_content_raw, encode_delivery, encode_method, BasicCancel, DeliverRef, FieldValue, Method, ReplyCode,
    ShortString,
};
use bytes::BytesMut;

pub(crate) use args::QueueKind;
use exchange::{Destination, Exchange, ExchangeKind};
pub(crate) use fast_hash::{FastMap, NameMap};
pub(crate) use message::Header;

use message::{Message, Outgoing};
use queue::{DeathReason, Queue, Queued};

use crate::config::BrokerConfig;
use crate::error::AmqpError;

pub use ids::ConnId;

/// What the client said it can handle, from `client_properties.capabilities`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Capabilities {
    pub consumer_cancel_notify: bool,
    pub connection_blocked: bool,
    pub authentication_failure_close: bool,
}

/// Something done to a connection from outside its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The socket just dies.
    Sever,
    /// `connection.close` with this error, then wait for `close-ok`.
    Close(AmqpError),
    /// The close frame is already in the outbox: flush it and drop the socket.
    FlushAndDrop,
}

/// A message delivered on a channel and not yet settled.
#[derive(Debug)]
pub(crate) struct Unacked {
    pub tag: u64,
    pub queue: ShortString,
    pub consumer: Option<ShortString>,
    /// `None` for a stream delivery: an ack only gives credit back.
    pub queued: Option<Queued>,
}

#[derive(Debug)]
pub(crate) struct Consumer {
    pub tag: ShortString,
    pub queue: ShortString,
    pub no_ack: bool,
    pub prefetch: u16,
    pub in_flight: u32,
    /// Streams: the next offset to deliver.
    pub stream_next: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Confirms {
    pub next_seq: u64,
    /// Sequence numbers up to this one are acked but the ack is not written yet.
    pub pending_ack: Option<u64>,
    /// The highest sequence number whose outcome has been written.
    pub written: u64,
}

/// A publish or settlement held back by a transaction.
#[derive(Debug)]
pub(crate) enum TxOp {
    Publish(Box<Publication>),
    /// Deliveries already taken off the unacked list (RabbitMQ checks the
    /// tag at once); a rollback puts them back.
    Settle(Vec<Unacked>, delivery::Settle),
}

/// A whole `basic.publish`: the method, the header, the body.
#[derive(Debug)]
pub(crate) struct Publication {
    pub publish: acemq_codec::BasicPublish,
    pub header: Header,
    pub body: bytes::Bytes,
}

#[derive(Debug)]
pub(crate) struct Channel {
    /// The broker sent `channel.close` and ignores everything until `close-ok`.
    pub closing: bool,
    /// The publish being assembled from its method, header and body frames.
    pub assembler: ContentAssembler,
    pub next_tag: u64,
    pub unacked: VecDeque<Unacked>,
    pub consumers: Vec<Consumer>,
    pub prefetch: u16,
    pub global_prefetch: u16,
    pub confirm: Option<Confirms>,
    pub tx: Option<Vec<TxOp>>,
    /// The queue `""` stands for in later methods (RabbitMQ's shortcut).
    pub last_queue: Option<ShortString>,
    /// Its consumer of `amq.rabbitmq.reply-to` (`reply_to.rs`).
    pub reply_consumer: Option<reply_to::ReplyConsumer>,
}

impl Channel {
    fn new(max_body: u64) -> Self {
        Channel {
            closing: false,
            assembler: ContentAssembler::with_max_body(max_body),
            next_tag: 1,
            unacked: VecDeque::new(),
            consumers: Vec::new(),
            prefetch: 0,
            global_prefetch: 0,
            confirm: None,
            tx: None,
            last_queue: None,
            reply_consumer: None,
        }
    }
}

/// The broker's side of one connection.
#[derive(Debug)]
pub(crate) struct Conn {
    pub out: BytesMut,
    pub open: bool,
    pub vhost: Arc<str>,
    pub user: String,
    pub frame_max: u32,
    pub channel_max: u16,
    pub caps: Capabilities,
    pub channels: Vec<Option<Channel>>,
    pub open_channels: usize,
    pub fault: Option<Fault>,
    /// Torn down by a restart: input is no longer processed.
    pub dead: bool,
    /// Whether the peer connected from a loopback address (or in process).
    pub loopback: bool,
    /// Bytes taken by the driver with [`BrokerMachine::take_output`] and not
    /// yet reported written.
    pub writing: usize,
    /// A delivery waited for room in the output: the connection's queues
    /// are dispatched again once it has some.
    pub starved: bool,
    wake_pending: bool,
}

impl Conn {
    pub fn channel(&self, ch: u16) -> Option<&Channel> {
        self.channels.get(usize::from(ch)).and_then(Option::as_ref)
    }

    pub fn channel_mut(&mut self, ch: u16) -> Option<&mut Channel> {
        self.channels.get_mut(usize::from(ch)).and_then(Option::as_mut)
    }

    /// The bytes waiting to be written to the client, and being written.
    pub fn buffered(&self) -> usize {
        self.out.len() + self.writing
    }

    /// Whether a delivery may be written now (the output is under `limit`);
    /// if not, the connection is marked starved.
    pub fn room_for_delivery(&mut self, limit: usize) -> bool {
        let room = self.buffered() < limit;
        if !room {
            self.starved = true;
        }
        room
    }
}

#[derive(Debug, Default)]
pub(crate) struct VHost {
    pub exchanges: NameMap<ShortString, Exchange>,
    pub queues: NameMap<ShortString, Queue>,
}

impl VHost {
    fn with_builtin_exchanges() -> Self {
        let mut vhost = VHost::default();
        for (name, kind) in [
            ("", ExchangeKind::Direct),
            ("amq.direct", ExchangeKind::Direct),
            ("amq.fanout", ExchangeKind::Fanout),
            ("amq.topic", ExchangeKind::Topic),
            ("amq.headers", ExchangeKind::Headers),
            ("amq.match", ExchangeKind::Headers),
        ] {
            vhost.exchanges.insert(name.into(), Exchange::new(name, kind, true));
        }
        vhost
    }
}

/// A message on its way to a dead-letter exchange.
#[derive(Debug)]
pub(crate) struct DeadLetter {
    pub vhost: Arc<str>,
    pub queue: ShortString,
    pub queued: Queued,
    pub reason: DeathReason,
    pub exchange: ShortString,
    pub routing_key: Option<ShortString>,
}

/// What a queue looks like from outside, for tests and tools.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueInfo {
    /// Messages ready for delivery (for a stream: messages in the log).
    pub messages: usize,
    /// Messages delivered and not yet acknowledged.
    pub unacked: u64,
    /// Consumers attached.
    pub consumers: usize,
    /// Whether it survives a restart.
    pub durable: bool,
    /// The arguments it was declared with, as received.
    pub arguments: acemq_codec::FieldTable,
}

/// The broker state machine. One per broker, shared by every connection's
/// session (the tokio layer keeps it behind one lock).
///
/// Polling order for a driver: feed a session's input with
/// [`crate::Session::handle_input`], then call [`BrokerMachine::handle_timeout`]
/// when [`BrokerMachine::poll_timeout`] is due, then drain each connection's
/// bytes with [`BrokerMachine::take_output`] and wake the connections listed
/// by [`BrokerMachine::take_woken`].
#[derive(Debug)]
pub struct BrokerMachine {
    pub(crate) config: Arc<BrokerConfig>,
    pub(crate) vhosts: NameMap<String, VHost>,
    pub(crate) conns: FastMap<ConnId, Conn>,
    next_conn: ConnId,
    pub(crate) alarm: bool,
    epoch: Instant,
    epoch_wall_ms: u64,
    woken: Vec<ConnId>,
    pub(crate) dead_letters: VecDeque<DeadLetter>,
    /// Queue deadlines, earliest first; a queue's own `scheduled` tells
    /// which of its timers is current.
    timers: BinaryHeap<Reverse<Timer>>,
}

/// A queue's deadline in the timer heap (ordered by `at` alone).
#[derive(Debug)]
struct Timer {
    at: Instant,
    vhost: Arc<str>,
    queue: ShortString,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Timer {}

impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Timer {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at.cmp(&other.at)
    }
}

impl BrokerMachine {
    /// A broker with the virtual hosts of `config`, each with RabbitMQ's
    /// pre-declared exchanges.
    pub fn new(config: BrokerConfig, now: Instant) -> Self {
        let vhosts = config
            .vhosts
            .iter()
            .map(|v| (v.clone(), VHost::with_builtin_exchanges()))
            .collect();
        let epoch_wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        BrokerMachine {
            config: Arc::new(config),
            vhosts,
            conns: FastMap::default(),
            next_conn: 1,
            alarm: false,
            epoch: now,
            epoch_wall_ms,
            woken: Vec::new(),
            dead_letters: VecDeque::new(),
            timers: BinaryHeap::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    /// Wall-clock milliseconds at `now`, derived from the monotonic clock so
    /// that a paused test clock moves it too.
    pub(crate) fn wall_ms(&self, now: Instant) -> u64 {
        self.epoch_wall_ms + now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    // ---- connections ----------------------------------------------------

    /// Registers a new connection and returns its id.
    pub(crate) fn add_conn(&mut self) -> ConnId {
        let id = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(
            id,
            Conn {
                out: BytesMut::with_capacity(4096),
                open: false,
                vhost: Arc::from(""),
                user: String::new(),
                frame_max: self.config.frame_max,
                channel_max: self.config.channel_max,
                caps: Capabilities::default(),
                channels: Vec::new(),
                open_channels: 0,
                fault: None,
                dead: false,
                loopback: true,
                writing: 0,
                starved: false,
                wake_pending: false,
            },
        );
        id
    }

    /// Takes the bytes waiting to be written to connection `id`. They count
    /// against its output limit until [`BrokerMachine::output_written`].
    pub fn take_output(&mut self, id: ConnId) -> BytesMut {
        match self.conns.get_mut(&id) {
            Some(conn) => {
                conn.wake_pending = false;
                let out = conn.out.split();
                conn.writing += out.len();
                out
            }
            None => BytesMut::new(),
        }
    }

    /// The driver wrote `bytes` of what it took for connection `id`: if a
    /// delivery waited for room, its queues are dispatched again.
    pub fn output_written(&mut self, id: ConnId, bytes: usize, now: Instant) {
        let limit = self.output_limit();
        let Some(conn) = self.conns.get_mut(&id) else { return };
        conn.writing = conn.writing.saturating_sub(bytes);
        if !conn.starved || conn.buffered() >= limit {
            return;
        }
        conn.starved = false;
        let vhost = conn.vhost.clone();
        let mut queues: Vec<ShortString> = Vec::new();
        for channel in conn.channels.iter().flatten() {
            for consumer in &channel.consumers {
                if !queues.contains(&consumer.queue) {
                    queues.push(consumer.queue.clone());
                }
            }
        }
        for q in queues {
            self.dispatch(&vhost, &q, now);
        }
        self.process_dead_letters(now);
    }

    /// Whether connection `id` has room in its output, so that its input
    /// may be read (a client that does not read what it is sent is not
    /// read either).
    pub fn output_has_room(&self, id: ConnId) -> bool {
        self.conns.get(&id).is_none_or(|c| c.buffered() < self.output_limit())
    }

    /// The bytes waiting to be written to every connection, and being written.
    pub fn buffered_output(&self) -> usize {
        self.conns.values().map(Conn::buffered).sum()
    }

    pub(crate) fn output_limit(&self) -> usize {
        self.config.output_limit.max(4096)
    }

    /// Connections that got output or a fault from someone else's input
    /// since the last call, so their drivers should run.
    pub fn take_woken(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.woken)
    }

    pub(crate) fn wake(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&id) {
            wake_conn(id, conn, &mut self.woken);
        }
    }

    pub(crate) fn send(&mut self, id: ConnId, channel: u16, method: impl Into<Method>) {
        if let Some(conn) = self.conns.get_mut(&id) {
            write_method(&mut conn.out, channel, &method.into());
            wake_conn(id, conn, &mut self.woken);
        }
    }

    /// Tears down everything connection `id` owned: its channels (unacked
    /// messages go back to their queues), consumers, exclusive queues.
    pub(crate) fn release_conn(&mut self, id: ConnId, now: Instant) {
        let Some(conn) = self.conns.get(&id) else { return };
        let channels: Vec<u16> = conn
            .channels
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_some())
            .map(|(n, _)| n as u16)
            .collect();
        let vhost = conn.vhost.clone();
        for ch in channels {
            self.release_channel(id, ch, now);
            if let Some(conn) = self.conns.get_mut(&id) {
                if let Some(slot) = conn.channels.get_mut(usize::from(ch)) {
                    *slot = None;
                }
            }
        }
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.open_channels = 0;
        }
        let exclusive: Vec<ShortString> = self
            .vhosts
            .get(&*vhost)
            .map(|v| {
                v.queues
                    .values()
                    .filter(|q| q.exclusive_owner == Some(id))
                    .map(|q| q.name.clone())
                    .collect()
            })
            .unwrap_or_default();
        for q in exclusive {
            self.delete_queue_internal(&vhost, &q);
        }
        self.process_dead_letters(now);
    }

    /// The connection is gone: release it and forget it.
    pub fn remove_conn(&mut self, id: ConnId, now: Instant) {
        self.release_conn(id, now);
        self.conns.remove(&id);
    }

    /// Cancels a channel's consumers and returns its unacked messages; the
    /// channel itself stays (as `closing`) until the caller drops it.
    pub(crate) fn release_channel(&mut self, id: ConnId, ch: u16, now: Instant) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        let vhost = conn.vhost.clone();
        let Some(channel) = conn.channel_mut(ch) else { return };
        channel.closing = true;
        channel.assembler.reset();
        // Settlements of an uncommitted transaction never happened.
        for op in channel.tx.take().unwrap_or_default() {
            if let TxOp::Settle(taken, _) = op {
                channel.unacked.extend(taken);
            }
        }
        channel.unacked.make_contiguous().sort_by_key(|u| u.tag);
        let consumers = std::mem::take(&mut channel.consumers);
        let unacked = std::mem::take(&mut channel.unacked);
        let mut touched = Vec::new();
        for consumer in consumers {
            if self.detach_consumer(&vhost, id, ch, &consumer.tag, &consumer.queue, now) {
                touched.push(consumer.queue);
            }
        }
        self.settled_by_cancelled(&vhost, id, ch, unacked.iter());
        // In delivery order: a quorum queue serves returns in the order they came back.
        for entry in unacked {
            self.return_to_queue(&vhost, entry, &mut touched);
        }
        for q in touched {
            self.dispatch(&vhost, &q, now);
        }
    }

    /// Removes a consumer from its queue; an auto-delete queue that loses its
    /// last consumer goes. Returns whether another consumer became the
    /// queue's single active consumer (the queue then needs a dispatch).
    fn detach_consumer(
        &mut self,
        vhost: &str,
        id: ConnId,
        ch: u16,
        tag: &ShortString,
        queue: &ShortString,
        now: Instant,
    ) -> bool {
        let Some(q) = self.vhosts.get_mut(vhost).and_then(|v| v.queues.get_mut(queue)) else {
            return false;
        };
        let handed_over = q.remove_consumer(id, ch, tag);
        q.last_used = now;
        if q.auto_delete && q.had_consumers && q.consumers.is_empty() {
            self.delete_queue_internal(vhost, queue);
            return false;
        }
        self.schedule(vhost, queue);
        handed_over
    }

    /// Puts an unacked message back (redelivered), counting a quorum
    /// delivery and dead-lettering past `x-delivery-limit`.
    pub(crate) fn return_to_queue(&mut self, vhost: &Arc<str>, entry: Unacked, touched: &mut Vec<ShortString>) {
        let Some(q) = self
            .vhosts
            .get_mut(&**vhost)
            .and_then(|v| v.queues.get_mut(&entry.queue))
        else {
            return;
        };
        q.unacked = q.unacked.saturating_sub(1);
        let Some(mut queued) = entry.queued else {
            if !touched.contains(&entry.queue) {
                touched.push(entry.queue);
            }
            return;
        };
        queued.redelivered = true;
        if q.settings.kind == QueueKind::Quorum {
            queued.delivery_count += 1;
            if let Some(limit) = q.settings.delivery_limit {
                if queued.delivery_count > limit {
                    let dead = vec![(queued, DeathReason::DeliveryLimit)];
                    self.queue_dead_letters(vhost, &entry.queue, dead);
                    return;
                }
            }
        }
        q.requeue(queued);
        if !touched.contains(&entry.queue) {
            touched.push(entry.queue);
        }
    }

    // ---- queries --------------------------------------------------------

    /// A queue's counts, if it exists.
    pub fn queue_info(&self, vhost: &str, queue: &str) -> Option<QueueInfo> {
        let q = self.vhosts.get(vhost)?.queues.get(&ShortString::from(queue))?;
        Some(QueueInfo {
            messages: q.message_count(),
            unacked: q.unacked,
            consumers: q.consumers.len(),
            durable: q.durable,
            arguments: q.arguments.clone(),
        })
    }

    /// Whether an exchange exists.
    pub fn exchange_exists(&self, vhost: &str, exchange: &str) -> bool {
        self.vhosts
            .get(vhost)
            .is_some_and(|v| v.exchanges.contains_key(&ShortString::from(exchange)))
    }

    /// How many connections are open.
    pub fn connection_count(&self) -> usize {
        self.conns.values().filter(|c| !c.dead).count()
    }

    // ---- timers ---------------------------------------------------------

    /// The earliest instant at which [`BrokerMachine::handle_timeout`] may
    /// have work: a queue head expiring, or a queue's `x-expires` (from the
    /// timer heap: a timer that went stale only wakes the driver early).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse(timer)| timer.at)
    }

    /// Expires messages and unused queues that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut due = Vec::new();
        while let Some(Reverse(timer)) = self.timers.peek() {
            if timer.at > now {
                break;
            }
            if let Some(Reverse(timer)) = self.timers.pop() {
                due.push(timer);
            }
        }
        for Timer {
            at,
            vhost,
            queue: qname,
        } in due
        {
            let Some(q) = self.vhosts.get_mut(&*vhost).and_then(|v| v.queues.get_mut(&qname)) else {
                continue;
            };
            // A later timer of a queue whose deadline came earlier since.
            if q.scheduled != Some(at) {
                continue;
            }
            q.scheduled = None;
            if q.unused_expired(now) {
                self.delete_queue_internal(&vhost, &qname);
                continue;
            }
            let mut expired = Vec::new();
            q.expire_head(now, false, &mut expired);
            self.queue_dead_letters(&vhost, &qname, expired);
            self.dispatch(&vhost, &qname, now);
        }
        self.process_dead_letters(now);
    }

    /// Puts a queue's deadline in the timer heap if it is earlier than the
    /// one there. Called wherever a queue's deadline may come earlier: a
    /// message enqueued or requeued, the head taken, the last consumer
    /// gone, the queue declared.
    pub(crate) fn schedule(&mut self, vhost: &str, qname: &ShortString) {
        let Some(q) = self.vhosts.get_mut(vhost).and_then(|v| v.queues.get_mut(qname)) else {
            return;
        };
        let Some(at) = q.deadline() else { return };
        if q.scheduled.is_some_and(|s| s <= at) {
            return;
        }
        q.scheduled = Some(at);
        self.timers.push(Reverse(Timer {
            at,
            vhost: Arc::from(vhost),
            queue: qname.clone(),
        }));
    }

    // ---- faults ---------------------------------------------------------

    /// Every connection's socket dies, without a close frame.
    pub fn sever_all(&mut self) {
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            if let Some(conn) = self.conns.get_mut(&id) {
                conn.fault = Some(Fault::Sever);
            }
            self.wake(id);
        }
    }

    /// Every connection gets `connection.close` 320 CONNECTION_FORCED with
    /// `reason`, as `rabbitmqctl close_connection` does.
    pub fn close_all(&mut self, reason: &str) {
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            if let Some(conn) = self.conns.get_mut(&id) {
                if conn.fault.is_none() {
                    conn.fault = Some(Fault::Close(AmqpError::new(ReplyCode::ConnectionForced, reason)));
                }
            }
            self.wake(id);
        }
    }

    /// A broker restart: connections are closed with 320, then non-durable
    /// exchanges and queues and non-persistent messages are gone; durable
    /// ones and persistent messages (and everything in quorum queues and
    /// streams) remain, unacked ones requeued as redelivered.
    pub fn restart(&mut self, now: Instant) {
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in &ids {
            let Some(conn) = self.conns.get_mut(id) else { continue };
            if conn.dead {
                continue;
            }
            if conn.open {
                let shutdown = AmqpError::new(
                    ReplyCode::ConnectionForced,
                    "broker forced connection closure with reason 'shutdown'",
                );
                write_method(&mut conn.out, 0, &shutdown.close_method(0));
            }
            conn.fault = Some(Fault::FlushAndDrop);
            conn.dead = true;
            self.release_conn(*id, now);
            self.wake(*id);
        }
        self.dead_letters.clear();
        self.timers.clear();
        for vhost in self.vhosts.values_mut() {
            vhost.exchanges.retain(|_, x| x.durable);
            vhost.queues.retain(|_, q| q.durable && q.exclusive_owner.is_none());
            for q in vhost.queues.values_mut() {
                q.clear_consumers();
                q.unacked = 0;
                q.last_used = now;
                q.scheduled = None;
                if q.settings.kind == QueueKind::Classic {
                    let kept: VecDeque<Queued> = q.ready.drain(..).filter(|m| m.msg.persistent()).collect();
                    q.ready_bytes = kept.iter().map(|m| m.msg.body.len() as u64).sum();
                    q.ready = kept;
                }
            }
            let queues: Vec<ShortString> = vhost.queues.keys().cloned().collect();
            let exchanges: Vec<ShortString> = vhost.exchanges.keys().cloned().collect();
            let queues: std::collections::HashSet<ShortString> = queues.into_iter().collect();
            let exchanges: std::collections::HashSet<ShortString> = exchanges.into_iter().collect();
            for x in vhost.exchanges.values_mut() {
                x.bindings.retain_destinations(|d| match d {
                    Destination::Queue(q) => queues.contains(q),
                    Destination::Exchange(e) => exchanges.contains(e),
                });
            }
        }
        let all: Vec<(String, ShortString)> = self
            .vhosts
            .iter()
            .flat_map(|(v, vh)| vh.queues.keys().map(move |q| (v.clone(), q.clone())))
            .collect();
        for (vhost, queue) in all {
            self.schedule(&vhost, &queue);
        }
    }

    /// Raises or clears a memory alarm. While it is raised, a connection that
    /// publishes is blocked (and told so if it advertised
    /// `connection.blocked`), and its input is no longer read.
    pub fn set_memory_alarm(&mut self, on: bool) {
        if self.alarm == on {
            return;
        }
        self.alarm = on;
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            self.wake(id);
        }
    }

    /// Deletes a queue behind its consumers' backs: each consumer that
    /// advertised `consumer_cancel_notify` gets `basic.cancel`. Returns
    /// whether the queue existed.
    pub fn delete_queue(&mut self, vhost: &str, queue: &str, now: Instant) -> bool {
        let existed = self.delete_queue_internal(vhost, &ShortString::from(queue)).is_some();
        self.process_dead_letters(now);
        existed
    }

    /// Removes a queue, its bindings and its consumers. Returns how many
    /// ready messages it held.
    pub(crate) fn delete_queue_internal(&mut self, vhost: &str, queue: &ShortString) -> Option<usize> {
        let vh = self.vhosts.get_mut(vhost)?;
        let q = vh.queues.remove(queue)?;
        let mut emptied = Vec::new();
        let destination = Destination::Queue(queue.clone());
        for x in vh.exchanges.values_mut() {
            if x.bindings.remove_destination(&destination) > 0 && x.bindings.is_empty() && x.auto_delete {
                emptied.push(x.name.clone());
            }
        }
        for x in emptied {
            self.delete_exchange_internal(vhost, &x);
        }
        // Deliveries of the deleted queue still unacked belong to no queue
        // now: settling them must not reach a new queue of the same name.
        for conn in self.conns.values_mut().filter(|c| &*c.vhost == vhost) {
            for channel in conn.channels.iter_mut().flatten() {
                for u in channel.unacked.iter_mut().filter(|u| &u.queue == queue) {
                    u.queue = ShortString::new();
                }
            }
        }
        for consumer in &q.consumers {
            let Some(conn) = self.conns.get_mut(&consumer.conn) else {
                continue;
            };
            let notify = conn.caps.consumer_cancel_notify;
            let Some(channel) = conn.channel_mut(consumer.channel) else {
                continue;
            };
            channel.consumers.retain(|c| c.tag != consumer.tag);
            if notify && !channel.closing {
                let cancel = BasicCancel {
                    consumer_tag: consumer.tag.clone(),
                    no_wait: true,
                };
                write_method(&mut conn.out, consumer.channel, &cancel.into());
                wake_conn(consumer.conn, conn, &mut self.woken);
            }
        }
        Some(q.message_count())
    }

    /// Removes an exchange and every binding to or from it.
    pub(crate) fn delete_exchange_internal(&mut self, vhost: &str, exchange: &ShortString) {
        let Some(vh) = self.vhosts.get_mut(vhost) else { return };
        if vh.exchanges.remove(exchange).is_none() {
            return;
        }
        let mut emptied = Vec::new();
        let destination = Destination::Exchange(exchange.clone());
        for x in vh.exchanges.values_mut() {
            if x.bindings.remove_destination(&destination) > 0 && x.bindings.is_empty() && x.auto_delete {
                emptied.push(x.name.clone());
            }
        }
        for x in emptied {
            self.delete_exchange_internal(vhost, &x);
        }
    }
}

pub(crate) fn wake_conn(id: ConnId, conn: &mut Conn, woken: &mut Vec<ConnId>) {
    if !conn.wake_pending {
        conn.wake_pending = true;
        woken.push(id);
    }
}

/// Appends a method frame. The broker only builds methods that encode.
pub(crate) fn write_method(out: &mut BytesMut, channel: u16, method: &Method) {
    if let Err(err) = encode_method(channel, method, out) {
        tracing::error!(%err, method = method.name(), "broker built a method it cannot encode");
    }
}

/// Appends a content-bearing method (`basic.return`, `basic.get-ok`), the
/// message's header (with `extra` set in its headers table, as RabbitMQ's
/// `add_header` does) and its body split to `frame_max`.
pub(crate) fn write_content(
    out: &mut BytesMut,
    channel: u16,
    method: &Method,
    msg: &Message,
    frame_max: u32,
    extra: Option<(&str, FieldValue)>,
) {
    let mut scratch = BytesMut::new();
    let Some(properties) = msg.outgoing_properties(extra.into(), &mut scratch) else {
        return;
    };
    if let Err(err) = encode_content_raw(channel, method, properties, &msg.body, frame_max, out) {
        tracing::error!(%err, method = method.name(), "broker holds a message it cannot encode");
    }
}

/// Appends a `basic.deliver` of the message, as [`write_content`] does for
/// other methods, from the names it borrows.
pub(crate) fn write_delivery(
    out: &mut BytesMut,
    channel: u16,
    deliver: &DeliverRef<'_>,
    msg: &Message,
    frame_max: u32,
    outgoing: Outgoing<'_>,
) {
    let mut scratch = BytesMut::new();
    let Some(properties) = msg.outgoing_properties(outgoing, &mut scratch) else {
        return;
    };
    if let Err(err) = encode_delivery(channel, deliver, properties, &msg.body, frame_max, out) {
        tracing::error!(%err, "broker holds a message it cannot deliver");
    }
}
