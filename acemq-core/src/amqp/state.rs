//! What the driver task and the API handles share, so that neither
//! imports the other: the commands the handles queue for the driver (and
//! the publishes' frames beside them), the connection's state the handles
//! read without asking the driver ([`ConnectionState`]: its tuning, whether
//! it is blocked or closed, the room in its publish buffer, the settle
//! queue), the deliveries and the acknowledgements they send back, a
//! consumer's delivery queue, and a channel's pending confirms with the
//! connection they went on.
//!
//! It is a leaf among the engine's modules: it holds state and the small
//! operations on it that both sides call, and it must never import the
//! driver, a handle (`connection`, `channel`) or anything above them; it
//! makes no protocol decision and does no I/O.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use acemq_codec::track::ReturnKey;
use acemq_codec::{BasicConsume, FieldTable, Method, PublishEncoder, ShortString};
use bytes::{Bytes, BytesMut};
use tokio::sync::{broadcast, oneshot, watch, Notify, Semaphore};

use super::batch_queue;
use super::error::Error;
use super::message::{ConnectionEvent, Properties};
use super::pending_confirms::PendingConfirms;
use super::transcript::TranscriptLog;
use crate::proto::{CloseReason, Reply, Secret, Tuned};

/// What the driver takes from the [`super::Config`]: the bounds of a
/// connection's queues ([`super::Config::publish_buffer`],
/// [`super::Config::delivery_buffer`]) and [`super::Config::busy_poll`] and
/// [`super::Config::read_interval`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) publish: usize,
    pub(crate) deliveries: usize,
    pub(crate) busy_poll: Duration,
    pub(crate) read_interval: Duration,
    /// How many frames the connection's transcript keeps, when it records
    /// one ([`super::Config::transcript`]).
    pub(crate) transcript: Option<usize>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            publish: 2 << 20,
            deliveries: 1024,
            busy_poll: Duration::ZERO,
            read_interval: Duration::ZERO,
            transcript: None,
        }
    }
}

/// Where a command's result goes.
pub(crate) type Reply1<T> = oneshot::Sender<Result<T, Error>>;

/// What the API handles ask the driver to do.
pub(crate) enum Command {
    OpenChannel {
        reply: Reply1<(u16, u64, Arc<AtomicBool>, Arc<ChannelConfirms>)>,
    },
    /// A method; the reply (if the method has one) is sent back.
    Call {
        channel: u16,
        generation: u64,
        method: Method,
        reply: Reply1<Option<Reply>>,
    },
    /// A method without a reply (acks), fire and forget.
    Send {
        channel: u16,
        generation: u64,
        method: Method,
    },
    /// The next `n` publishes of the command queue's [`Outgoing`] side, in order: a
    /// run of publishes is one command, however long.
    Publishes(usize),
    /// `basic.consume`: the driver makes the consumer's delivery queue (its
    /// bound depends on the channel's prefetch) and hands back its end.
    Consume {
        channel: u16,
        generation: u64,
        method: BasicConsume,
        reply: Reply1<(ShortString, DeliveryQueue)>,
    },
    Close {
        reply: Reply1<()>,
    },
    /// `connection.update-secret`; the reply is its `update-secret-ok`.
    UpdateSecret {
        secret: Secret,
        reason: String,
        reply: Reply1<Option<Reply>>,
    },
    /// Settlements wait in the connection's settle queue: sent by the first
    /// one into an empty one, to wake the driver.
    Settled,
    /// The connection leaves the machine: the driver hands its socket to a
    /// [`super::RawConnection`] (see `raw.rs`).
    #[cfg(feature = "conformance")]
    Raw {
        reply: Reply1<super::raw::RawParts>,
    },
}

/// The command queue's side state: the publishes queued since the driver
/// last took the queue, encoded by the tasks that published them. A publish
/// encodes its frames into `frames` and adds its record under the queue's
/// lock, so records, frames and the [`Command::Publishes`] that counts them
/// are in one order with every other command.
#[derive(Debug, Default)]
pub(crate) struct Outgoing {
    /// One per publish, oldest first.
    pub(crate) records: Vec<Published>,
    /// Their frames, one after the other.
    pub(crate) frames: BytesMut,
    /// Keeps the last message's method and header frames to copy (it stays
    /// in the queue: the driver takes only the records and the frames).
    pub(crate) encoder: PublishEncoder,
    /// Room of the publish buffer taken from its semaphore and not yet
    /// given to a publish: publishes take their room from here under the
    /// queue's lock, and go to the semaphore (one atomic operation more, as
    /// costly here as the lock) only when it runs short, for a chunk at a
    /// time. A publish that must wait for room gives it back first.
    pub(crate) credit: u32,
}

/// One publish in [`Outgoing`]: whose it is and what its frames take.
#[derive(Debug)]
pub(crate) struct Published {
    pub(crate) channel: u16,
    pub(crate) generation: u64,
    /// How many bytes of `Outgoing::frames` are its frames.
    pub(crate) len: usize,
    /// The room it took in the connection's publish buffer (see
    /// [`super::Config::publish_buffer`]), given back once
    /// its frames are written to the socket.
    pub(crate) room: u32,
    /// What a `basic.return` of it is matched by, when it is mandatory
    /// (boxed: rare, and the records stay small).
    pub(crate) returned: Option<Box<ReturnKey>>,
}

/// The state of one connection that the handles read without asking the
/// driver, and the queues they reach it by without a command of their own.
#[derive(Debug)]
pub(crate) struct ConnectionState {
    pub(crate) tuned: OnceLock<Tuned>,
    pub(crate) server_properties: OnceLock<FieldTable>,
    /// The broker's reason while it blocks this connection.
    pub(crate) blocked: watch::Sender<Option<String>>,
    pub(crate) close_reason: Mutex<Option<CloseReason>>,
    pub(crate) closed: watch::Sender<bool>,
    pub(crate) events: broadcast::Sender<ConnectionEvent>,
    /// Room in the publish buffer, in bytes: a publish takes its share
    /// before its command is queued, and the driver gives it back once the
    /// frames are written. Closed when the driver ends.
    pub(crate) room: Semaphore,
    /// The whole publish buffer (what `room` holds when nothing waits).
    pub(crate) publish_buffer: u32,
    /// The least bound of a consumer's delivery queue.
    pub(crate) delivery_buffer: usize,
    /// Some consumer's queue is full and the driver waits for room: a
    /// consumer that takes a delivery then says so on `consumer_took`.
    pub(crate) stalled: AtomicBool,
    pub(crate) consumer_took: Notify,
    /// Acks, nacks and rejects from the deliveries' handles, in order. They
    /// skip the command queue (a settlement is 24 bytes, a command ten
    /// times that), and the driver takes them all before any command, so a
    /// settlement always goes out before whatever its task sends next (it
    /// may overtake a command sent before it that the driver has not taken
    /// yet, which no caller waiting for its confirm or reply can see).
    settles: Mutex<SettleQueue>,
    /// The settle queue holds something (set under its lock, read without it).
    pub(crate) settles_waiting: AtomicBool,
    /// To wake the driver for the settle queue; weak, so that deliveries do not
    /// keep the connection open.
    commands: batch_queue::WeakSender<Command, Outgoing>,
    /// How long the driver polls before it sleeps ([`super::Config::busy_poll`]).
    pub(crate) busy_poll: Duration,
    /// The least time between two reads ([`super::Config::read_interval`]).
    pub(crate) read_interval: Duration,
    /// The connection has left the machine for raw frames (set once, by
    /// the driver, before it fails what was waiting): every later error of
    /// a handle is [`Error::Raw`].
    pub(crate) raw: AtomicBool,
    /// A `Conn` manages the connection: `Connection::raw` is refused.
    pub(crate) raw_refused: AtomicBool,
    /// What the transcript recorder keeps, when there is one.
    pub(crate) transcript: Option<Arc<TranscriptLog>>,
}

#[derive(Debug, Default)]
struct SettleQueue {
    ops: Vec<SettleOp>,
    /// The driver is gone: settlements are refused.
    ended: bool,
}

/// The most room the command queue's credit takes from the publish buffer at once
/// (see [`Outgoing::credit`]): some hundreds of small publishes.
const CREDIT_CHUNK: u32 = 64 * 1024;

/// Nor more than this part of the whole buffer.
const CREDIT_PARTS: u32 = 16;

/// What a publish costs in the publish buffer besides its body: roughly the
/// frames' headers, the method and common properties.
const PUBLISH_OVERHEAD: usize = 128;

impl ConnectionState {
    pub(crate) fn new(settings: Settings, commands: batch_queue::WeakSender<Command, Outgoing>) -> Self {
        let publish_buffer = u32::try_from(settings.publish.clamp(1, Semaphore::MAX_PERMITS)).unwrap_or(u32::MAX);
        ConnectionState {
            tuned: OnceLock::new(),
            server_properties: OnceLock::new(),
            blocked: watch::channel(None).0,
            close_reason: Mutex::new(None),
            closed: watch::channel(false).0,
            events: broadcast::channel(256).0,
            room: Semaphore::new(publish_buffer as usize),
            publish_buffer,
            delivery_buffer: settings.deliveries.max(1),
            busy_poll: settings.busy_poll,
            read_interval: settings.read_interval,
            raw: AtomicBool::new(false),
            raw_refused: AtomicBool::new(false),
            transcript: settings
                .transcript
                .map(|capacity| Arc::new(TranscriptLog::new(capacity))),
            stalled: AtomicBool::new(false),
            consumer_took: Notify::new(),
            settles: Mutex::new(SettleQueue::default()),
            settles_waiting: AtomicBool::new(false),
            commands,
        }
    }

    /// The room a publish of `body_len` bytes takes: never more than the
    /// whole buffer, so that a large message waits for it to be empty
    /// rather than for ever.
    pub(crate) fn room_for(&self, body_len: usize) -> u32 {
        u32::try_from(body_len.saturating_add(PUBLISH_OVERHEAD))
            .unwrap_or(u32::MAX)
            .min(self.publish_buffer)
    }

    /// Takes `room` bytes of the publish buffer, waiting until the driver
    /// has written enough; an error once the connection has ended.
    pub(crate) async fn take_room(&self, room: u32) -> Result<(), Error> {
        // The credit the command queue holds goes back first: a message that needs
        // the whole buffer must not wait on room that no one is using.
        if let Some(credit @ 1..) = self.commands.side(|outgoing| std::mem::take(&mut outgoing.credit)) {
            self.room.add_permits(credit as usize);
        }
        if !self.try_take_room(room)? {
            // Boxed: the wait for room is the rare path, and a future that
            // holds it inline is as large as the semaphore's, which a
            // publish would then move about on every call.
            Box::pin(self.room.acquire_many(room))
                .await
                .map_err(|_| self.closed_error())?
                .forget();
        }
        Ok(())
    }

    /// [`ConnectionState::take_room`] without waiting: `false` if the room is not
    /// there now. (The driver gives it back with `add_permits` once written.)
    pub(crate) fn try_take_room(&self, room: u32) -> Result<bool, Error> {
        match self.room.try_acquire_many(room) {
            Ok(permit) => {
                permit.forget();
                Ok(true)
            }
            Err(tokio::sync::TryAcquireError::Closed) => Err(self.closed_error()),
            Err(tokio::sync::TryAcquireError::NoPermits) => Ok(false),
        }
    }

    /// [`ConnectionState::try_take_room`] for `room` and, when the buffer has it, a
    /// chunk of credit for the command queue besides: `Some(spare)`, the room taken
    /// beyond `room`, if `room` was taken; `None` if it is not there now.
    pub(crate) fn try_take_room_and_credit(&self, room: u32) -> Result<Option<u32>, Error> {
        let chunk = (self.publish_buffer / CREDIT_PARTS).min(CREDIT_CHUNK);
        if chunk > room && self.try_take_room(chunk)? {
            return Ok(Some(chunk - room));
        }
        Ok(self.try_take_room(room)?.then_some(0))
    }

    /// A consumer took a delivery from its queue: wakes the driver if it
    /// waits for room.
    pub(crate) fn took_delivery(&self) {
        if self.stalled.load(Ordering::SeqCst) {
            self.consumer_took.notify_one();
        }
    }

    /// Queues a settlement for the driver, and wakes it if the settle queue was
    /// empty; an error once the driver or the handles are gone.
    pub(crate) fn settle(&self, op: SettleOp) -> Result<(), ()> {
        let first = {
            let mut queue = self.settles.lock().unwrap_or_else(|p| p.into_inner());
            if queue.ended {
                return Err(());
            }
            queue.ops.push(op);
            let first = queue.ops.len() == 1;
            if first {
                self.settles_waiting.store(true, Ordering::SeqCst);
            }
            first
        };
        if first {
            let commands = self.commands.upgrade().ok_or(())?;
            commands.send(Command::Settled).map_err(|_| ())?;
        }
        Ok(())
    }

    /// Whether the connection has ended (its driver, or every handle).
    pub(crate) fn connection_gone(&self) -> bool {
        self.settles.lock().unwrap_or_else(|p| p.into_inner()).ended
            || self.commands.upgrade().is_none_or(|c| c.is_closed())
    }

    /// Takes what the settle queue holds into `into` (emptied first).
    pub(crate) fn take_settles(&self, into: &mut Vec<SettleOp>) {
        into.clear();
        if !self.settles_waiting.load(Ordering::SeqCst) {
            return;
        }
        let mut queue = self.settles.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut queue.ops, into);
        self.settles_waiting.store(false, Ordering::SeqCst);
    }

    /// The driver is done: later settlements fail.
    pub(crate) fn end_settles(&self) {
        let mut queue = self.settles.lock().unwrap_or_else(|p| p.into_inner());
        queue.ended = true;
        queue.ops.clear();
        self.settles_waiting.store(false, Ordering::SeqCst);
    }

    /// Bytes of publishes taken from the buffer and not yet written.
    pub(crate) fn publish_backlog(&self) -> usize {
        let credit = self.commands.side(|outgoing| outgoing.credit).unwrap_or(0);
        (self.publish_buffer as usize).saturating_sub(self.room.available_permits() + credit as usize)
    }

    pub(crate) fn closed_error(&self) -> Error {
        if self.raw.load(Ordering::SeqCst) {
            return Error::Raw;
        }
        let reason = self.close_reason.lock().ok().and_then(|r| r.clone());
        Error::ConnectionClosed(reason.unwrap_or(CloseReason::ConnectionLost))
    }
}

/// One consumer's delivery queue, as its [`super::Consumer`] holds it:
/// unbounded underneath, bounded by the driver, which counts what it puts
/// in while the consumer counts what it takes out.
///
/// A batch queue (see `super::batch_queue`): the consumer takes everything the driver
/// has queued under one lock, then hands it out from `taken` one by one,
/// lowering the count for each as it goes, so a delivery still in `taken`
/// is still queued as far as the driver's bound is concerned.
#[derive(Debug)]
pub(crate) struct DeliveryQueue {
    rx: batch_queue::Receiver<Delivery>,
    taken: VecDeque<Delivery>,
    queued: Arc<AtomicUsize>,
}

impl DeliveryQueue {
    /// The consumer's end of a batch queue whose sender counts in `queued`
    /// what it puts in.
    pub(crate) fn new(rx: batch_queue::Receiver<Delivery>, queued: Arc<AtomicUsize>) -> Self {
        DeliveryQueue {
            rx,
            taken: VecDeque::new(),
            queued,
        }
    }

    /// The next delivery; `None` once the consumer is over.
    pub(crate) fn poll_recv(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Delivery>> {
        use std::task::Poll;
        if self.taken.is_empty() {
            match self.refill(|rx, batch| rx.poll_recv(cx, batch)) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(false) => return Poll::Ready(None),
                Poll::Ready(true) => {}
            }
        }
        Poll::Ready(self.take_one())
    }

    /// A delivery already here, without waiting.
    pub(crate) fn try_recv(&mut self) -> Option<Delivery> {
        if self.taken.is_empty() {
            self.refill(|rx, batch| rx.try_recv(batch));
        }
        self.take_one()
    }

    /// Lets `take` swap what the batch queue holds into the (empty) `taken`. The
    /// buffers change hands whole: an empty deque becomes a vector and back
    /// without moving or allocating anything.
    fn refill<R>(&mut self, take: impl FnOnce(&mut batch_queue::Receiver<Delivery>, &mut Vec<Delivery>) -> R) -> R {
        let mut batch = Vec::from(std::mem::take(&mut self.taken));
        let result = take(&mut self.rx, &mut batch);
        self.taken = VecDeque::from(batch);
        result
    }

    fn take_one(&mut self) -> Option<Delivery> {
        let delivery = self.taken.pop_front();
        if delivery.is_some() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        delivery
    }

    /// How many deliveries wait in it.
    pub(crate) fn len(&self) -> usize {
        self.taken.len() + self.rx.len()
    }
}

/// A message delivered to a consumer.
#[derive(Debug)]
pub struct Delivery {
    /// The consumer it is for.
    pub consumer_tag: ShortString,
    /// The channel-wide delivery tag, for ack/nack/reject.
    pub delivery_tag: u64,
    /// Whether the broker delivered it before.
    pub redelivered: bool,
    /// The exchange it was published to.
    pub exchange: ShortString,
    /// The routing key it was published with.
    pub routing_key: ShortString,
    /// Its properties.
    pub properties: Properties,
    /// Its body (zero-copy when it arrived in one frame).
    pub body: Bytes,
    pub(crate) acker: Acker,
}

/// A message fetched with `basic.get`.
#[derive(Debug)]
pub struct GetMessage {
    /// The delivery tag, for ack/nack/reject.
    pub delivery_tag: u64,
    /// Whether the broker delivered it before.
    pub redelivered: bool,
    /// The exchange it was published to.
    pub exchange: ShortString,
    /// The routing key it was published with.
    pub routing_key: ShortString,
    /// How many messages are left in the queue.
    pub message_count: u32,
    /// Its properties.
    pub properties: Properties,
    /// Its body.
    pub body: Bytes,
    pub(crate) acker: Acker,
}

/// One channel's publishes waiting for their confirms, with the connection
/// they went on: what its [`super::PublishConfirm`]s hold (one reference
/// count, where a [`super::Connection`] handle would cost three), and what
/// the driver resolves them in.
#[derive(Debug)]
pub(crate) struct ChannelConfirms {
    /// The connection the channel is on (its errors, its block watch).
    pub(crate) connection: Arc<ConnectionState>,
    /// The confirms themselves.
    pub(crate) pending: PendingConfirms,
}

/// Sends acknowledgements for a delivery on the channel it came from; stale
/// ones (the channel has since closed) are dropped by the driver.
#[derive(Debug, Clone)]
pub(crate) struct Acker {
    /// Where settlements go (see [`ConnectionState::settle`]).
    pub(crate) connection: Arc<ConnectionState>,
    pub(crate) channel: u16,
    pub(crate) generation: u64,
}

impl Acker {
    /// An acker of no connection, whose settlements go nowhere: for a
    /// delivery made up outside the driver (the `delivery` fuzz harness's).
    #[cfg(any(fuzzing, test))]
    pub(crate) fn detached() -> Acker {
        let (commands, _) = batch_queue::with_side::<Command, Outgoing>();
        let connection = ConnectionState::new(Default::default(), commands.downgrade());
        Acker {
            connection: Arc::new(connection),
            channel: 1,
            generation: 0,
        }
    }

    /// Whether the connection the delivery came on has ended.
    pub(crate) fn connection_gone(&self) -> bool {
        self.connection.connection_gone()
    }

    /// Puts a settlement in the connection's settle queue (one lock, no
    /// command of its own).
    fn settle(&self, tag: u64, kind: SettleKind) -> Result<(), Error> {
        let op = SettleOp {
            channel: self.channel,
            generation: self.generation,
            tag,
            kind,
        };
        self.connection
            .settle(op)
            .map_err(|()| Error::ChannelNotOpen(self.channel))
    }

    pub(crate) fn ack(&self, tag: u64, multiple: bool) -> Result<(), Error> {
        self.settle(tag, SettleKind::Ack { multiple })
    }

    pub(crate) fn nack(&self, tag: u64, multiple: bool, requeue: bool) -> Result<(), Error> {
        self.settle(tag, SettleKind::Nack { multiple, requeue })
    }

    pub(crate) fn reject(&self, tag: u64, requeue: bool) -> Result<(), Error> {
        self.settle(tag, SettleKind::Reject { requeue })
    }
}

/// One settlement on its way to the driver.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SettleOp {
    pub(crate) channel: u16,
    pub(crate) generation: u64,
    pub(crate) tag: u64,
    pub(crate) kind: SettleKind,
}

/// Which settlement.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SettleKind {
    Ack { multiple: bool },
    Nack { multiple: bool, requeue: bool },
    Reject { requeue: bool },
}

impl SettleOp {
    /// The method that says it.
    pub(crate) fn method(&self) -> Method {
        let delivery_tag = self.tag;
        match self.kind {
            SettleKind::Ack { multiple } => acemq_codec::BasicAck { delivery_tag, multiple }.into(),
            SettleKind::Nack { multiple, requeue } => acemq_codec::BasicNack {
                delivery_tag,
                multiple,
                requeue,
            }
            .into(),
            SettleKind::Reject { requeue } => acemq_codec::BasicReject { delivery_tag, requeue }.into(),
        }
    }
}

macro_rules! settle_methods {
    ($ty:ty) => {
        impl $ty {
            /// Acknowledges this message.
            pub fn ack(&self) -> Result<(), Error> {
                self.acker.ack(self.delivery_tag, false)
            }

            /// Acknowledges this message and every earlier one on the channel.
            pub fn ack_multiple(&self) -> Result<(), Error> {
                self.acker.ack(self.delivery_tag, true)
            }

            /// Negatively acknowledges it; `requeue` puts it back in the queue,
            /// otherwise it is dead-lettered or dropped.
            pub fn nack(&self, requeue: bool) -> Result<(), Error> {
                self.acker.nack(self.delivery_tag, false, requeue)
            }

            /// Rejects it (like `nack` for one message).
            pub fn reject(&self, requeue: bool) -> Result<(), Error> {
                self.acker.reject(self.delivery_tag, requeue)
            }

            /// The channel it arrived on.
            pub fn channel_id(&self) -> u16 {
                self.acker.channel
            }
        }
    };
}

settle_methods!(Delivery);
settle_methods!(GetMessage);
