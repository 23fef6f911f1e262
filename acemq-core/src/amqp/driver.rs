//! The tokio driver: one task per connection that owns the socket (any
//! transport from `io`) and the protocol machine. It reads into one buffer and lets the machine parse in
//! place; it writes everything queued while the previous write was in flight
//! in one go; it carries out commands from the API handles and routes the
//! machine's events to them. It makes no protocol decision.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use acemq_codec::{FieldTable, Method, ShortString};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{broadcast, oneshot, watch, Notify, Semaphore};

use super::connection::Settings;
use super::error::Error;
use super::line::{wake_all, Line};
use super::message::{
    Acker, Command, Confirmation, ConnectionEvent, Delivery, Outgoing, Published, Reply1, ReturnedMessage, SettleKind,
    SettleOp,
};
use crate::proto::{self, CloseReason, CommandError, Event, Reply, Token, Tuned};

/// State the handles read without asking the driver.
#[derive(Debug)]
pub(crate) struct Shared {
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
    /// Every channel's confirm line, to fail those still there when the
    /// driver ends however it ends.
    pub(crate) lines: Mutex<Vec<std::sync::Weak<Line>>>,
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
    settles: Mutex<SettleLane>,
    /// The lane holds something (set under its lock, read without it).
    settles_waiting: AtomicBool,
    /// To wake the driver for the lane; weak, so that deliveries do not
    /// keep the connection open.
    commands: super::lane::WeakSender<Command, Outgoing>,
    /// How long the driver polls before it sleeps ([`super::Config::busy_poll`]).
    busy_poll: Duration,
    /// The least time between two reads ([`super::Config::read_interval`]).
    read_interval: Duration,
}

#[derive(Debug, Default)]
struct SettleLane {
    ops: Vec<SettleOp>,
    /// The driver is gone: settlements are refused.
    ended: bool,
}

/// How many commands' room the driver's batch vector keeps between bursts.
const KEPT_BATCH: usize = 1024;

/// The most room the lane's credit takes from the publish buffer at once
/// (see [`Outgoing::credit`]): some hundreds of small publishes.
const CREDIT_CHUNK: u32 = 64 * 1024;

/// Nor more than this part of the whole buffer.
const CREDIT_PARTS: u32 = 16;

/// What a publish costs in the publish buffer besides its body: roughly the
/// frames' headers, the method and common properties.
const PUBLISH_OVERHEAD: usize = 128;

impl Shared {
    pub(crate) fn new(settings: Settings, commands: super::lane::WeakSender<Command, Outgoing>) -> Self {
        let publish_buffer = u32::try_from(settings.publish.clamp(1, Semaphore::MAX_PERMITS)).unwrap_or(u32::MAX);
        Shared {
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
            lines: Mutex::new(Vec::new()),
            stalled: AtomicBool::new(false),
            consumer_took: Notify::new(),
            settles: Mutex::new(SettleLane::default()),
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
        // The credit the lane holds goes back first: a message that needs
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

    /// [`Shared::take_room`] without waiting: `false` if the room is not
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

    /// [`Shared::try_take_room`] for `room` and, when the buffer has it, a
    /// chunk of credit for the lane besides: `Some(spare)`, the room taken
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

    /// Queues a settlement for the driver, and wakes it if the lane was
    /// empty; an error once the driver or the handles are gone.
    pub(crate) fn settle(&self, op: SettleOp) -> Result<(), ()> {
        let first = {
            let mut lane = self.settles.lock().unwrap_or_else(|p| p.into_inner());
            if lane.ended {
                return Err(());
            }
            lane.ops.push(op);
            let first = lane.ops.len() == 1;
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

    /// Takes what the lane holds into `into` (emptied first).
    fn take_settles(&self, into: &mut Vec<SettleOp>) {
        into.clear();
        if !self.settles_waiting.load(Ordering::SeqCst) {
            return;
        }
        let mut lane = self.settles.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut lane.ops, into);
        self.settles_waiting.store(false, Ordering::SeqCst);
    }

    /// The driver is done: later settlements fail.
    fn end_settles(&self) {
        let mut lane = self.settles.lock().unwrap_or_else(|p| p.into_inner());
        lane.ended = true;
        lane.ops.clear();
        self.settles_waiting.store(false, Ordering::SeqCst);
    }

    /// Bytes of publishes taken from the buffer and not yet written.
    pub(crate) fn publish_backlog(&self) -> usize {
        let credit = self.commands.side(|outgoing| outgoing.credit).unwrap_or(0);
        (self.publish_buffer as usize).saturating_sub(self.room.available_permits() + credit as usize)
    }

    pub(crate) fn closed_error(&self) -> Error {
        let reason = self.close_reason.lock().ok().and_then(|r| r.clone());
        Error::ConnectionClosed(reason.unwrap_or(CloseReason::ConnectionLost))
    }
}

enum Pending {
    Open(Reply1<(u16, u64, Arc<AtomicBool>, Arc<Line>)>),
    Call(Reply1<Option<Reply>>),
    Consume {
        route: ConsumerRoute,
        queue: DeliveryQueue,
        reply: Reply1<(ShortString, DeliveryQueue)>,
    },
}

struct ChannelRoutes {
    generation: u64,
    /// Shared with the channel's handles: false once the channel is gone.
    open: Arc<AtomicBool>,
    /// Where the channel's publishes wait for their confirms.
    line: Arc<Line>,
    /// How many of its publishes the driver has taken: the number of the
    /// next (see `line.rs`).
    taken: u64,
    /// The number of its first publish in confirm mode, whose sequence
    /// number is 1.
    first_confirmed: Option<u64>,
    /// A channel carries one consumer or a few: a scan comparing tags is
    /// cheaper than hashing one per delivery.
    consumers: Vec<ConsumerRoute>,
    /// The per-consumer prefetch last asked for with `basic.qos`: a new
    /// consumer's delivery queue holds at least that many.
    prefetch: u16,
}

/// One consumer's delivery queue, as its [`super::Consumer`] holds it:
/// unbounded underneath, bounded by the driver, which counts what it puts
/// in while the consumer counts what it takes out.
///
/// A lane (see `super::lane`): the consumer takes everything the driver
/// has queued under one lock, then hands it out from `taken` one by one,
/// lowering the count for each as it goes, so a delivery still in `taken`
/// is still queued as far as the driver's bound is concerned.
#[derive(Debug)]
pub(crate) struct DeliveryQueue {
    rx: super::lane::Receiver<Delivery>,
    taken: VecDeque<Delivery>,
    queued: Arc<AtomicUsize>,
}

impl DeliveryQueue {
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

    /// Lets `take` swap what the lane holds into the (empty) `taken`. The
    /// buffers change hands whole: an empty deque becomes a vector and back
    /// without moving or allocating anything.
    fn refill<R>(&mut self, take: impl FnOnce(&mut super::lane::Receiver<Delivery>, &mut Vec<Delivery>) -> R) -> R {
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

/// Why [`ConsumerRoute::offer`] did not queue a delivery.
enum Refused {
    /// The queue holds its bound.
    Full(Delivery),
    /// The consumer's stream was dropped.
    Closed(Delivery),
}

/// Where one consumer's deliveries go.
struct ConsumerRoute {
    tag: ShortString,
    tx: super::lane::Sender<Delivery>,
    /// Queued and not yet taken (the consumer takes its share off).
    queued: Arc<AtomicUsize>,
    bound: usize,
    /// Deliveries that found its queue full, oldest first. While a live
    /// consumer has any, the driver reads nothing more from the socket.
    overflow: VecDeque<Delivery>,
    /// We asked to cancel it (or to close its channel): what the broker
    /// still sends is finite, so its overflow no longer pauses reading, and
    /// the `cancel-ok` behind those deliveries can be read.
    cancelling: bool,
}

impl ConsumerRoute {
    /// A route whose queue holds at most `bound` deliveries, and the
    /// consumer's end of that queue. The tag is set once the broker gives it.
    fn new(bound: usize) -> (Self, DeliveryQueue) {
        let (tx, rx) = super::lane::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let route = ConsumerRoute {
            tag: ShortString::default(),
            tx,
            queued: queued.clone(),
            bound: bound.max(1),
            overflow: VecDeque::new(),
            cancelling: false,
        };
        let queue = DeliveryQueue {
            rx,
            taken: VecDeque::new(),
            queued,
        };
        (route, queue)
    }

    /// Queues `delivery` if there is room. The count is raised before the
    /// send and the consumer lowers it after taking one, then looks at
    /// `Shared::stalled`; the driver sets that flag before it looks at the
    /// count again, so one of them always sees the other.
    // The refused delivery comes back whole, as with `try_send`: boxing it
    // would allocate on the path that is already the slow one.
    #[allow(clippy::result_large_err)]
    fn offer(&self, delivery: Delivery) -> Result<(), Refused> {
        if self.queued.load(Ordering::SeqCst) >= self.bound {
            // A stream dropped while full is closed, not full.
            return Err(if self.tx.is_closed() {
                Refused::Closed(delivery)
            } else {
                Refused::Full(delivery)
            });
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        // The send itself says whether the stream was dropped.
        self.tx.send(delivery).map_err(|delivery| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            Refused::Closed(delivery)
        })
    }

    /// Hands over its overflow while there is room; whether any is left.
    fn unstall(&mut self) -> bool {
        while let Some(delivery) = self.overflow.pop_front() {
            match self.offer(delivery) {
                Ok(()) => {}
                Err(Refused::Full(delivery)) => {
                    self.overflow.push_front(delivery);
                    return true;
                }
                Err(Refused::Closed(delivery)) => {
                    lost_delivery(&delivery, self.overflow.len());
                    self.overflow.clear();
                }
            }
        }
        false
    }
}

impl ChannelRoutes {
    fn consumer_mut(&mut self, tag: &ShortString) -> Option<&mut ConsumerRoute> {
        self.consumers.iter_mut().find(|route| route.tag == *tag)
    }

    fn remove_consumer(&mut self, tag: &ShortString) -> Option<ConsumerRoute> {
        let at = self.consumers.iter().position(|route| route.tag == *tag)?;
        Some(self.consumers.swap_remove(at))
    }

    /// Adds the consumer the broker confirmed as `tag` (a tag in use
    /// replaces its route, as the broker never gives one twice).
    fn add_consumer(&mut self, tag: ShortString, mut route: ConsumerRoute) {
        route.tag = tag;
        match self.consumers.iter_mut().find(|r| r.tag == route.tag) {
            Some(slot) => *slot = route,
            None => self.consumers.push(route),
        }
    }
}

fn lost_delivery(delivery: &Delivery, more: usize) {
    tracing::warn!(
        channel = delivery.acker.channel,
        consumer = %delivery.consumer_tag,
        more,
        "delivery for a consumer whose stream was dropped; it stays unacknowledged"
    );
}

struct Driver {
    machine: proto::Connection,
    shared: Arc<Shared>,
    pending: HashMap<Token, Pending>,
    channels: Vec<Option<ChannelRoutes>>,
    next_generation: u64,
    opened: Option<oneshot::Sender<Result<(), Error>>>,
    closers: Vec<Reply1<()>>,
    /// The wakers of confirms settled together, woken once the line's
    /// lock is let go (kept for its capacity).
    wake: Vec<std::task::Waker>,
    /// The consumers (channel, generation, tag) with an overflow.
    stalled: Vec<(u16, u64, ShortString)>,
    /// Consumers gone from their channel (cancelled, channel closed) whose
    /// overflow is still to be handed over; they never pause reading.
    retired: Vec<ConsumerRoute>,
    /// Publish-buffer room of the publishes applied since the last
    /// transmit; their frames are the next bytes to enter the write buffer.
    room_applied: u32,
    /// Room to give back once the write position passes each offset
    /// (offsets count every byte ever put in the write buffer).
    room_written: VecDeque<(u64, u32)>,
    /// Bytes ever put in the write buffer, and ever written from it.
    buffered: u64,
    written: u64,
    /// Settlements taken from the lane (kept for its allocation).
    settling: Vec<SettleOp>,
}

/// Runs a connection over `stream` until it ends. `opened` hears when the
/// handshake is done (or failed).
pub(crate) async fn run<S>(
    stream: S,
    machine: proto::Connection,
    shared: Arc<Shared>,
    mut commands: super::lane::Receiver<Command, Outgoing>,
    opened: oneshot::Sender<Result<(), Error>>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    // However the task ends (a bug that panics, or a runtime shut down under
    // it), everyone waiting on the connection hears that it is over.
    let _over = Over(shared.clone());
    // One stream, read and written from this one task: no `split`, whose
    // halves take a lock on every read and write.
    let mut stream = std::pin::pin!(stream);
    let mut driver = Driver {
        machine,
        shared,
        pending: HashMap::new(),
        channels: Vec::new(),
        next_generation: 0,
        opened: Some(opened),
        closers: Vec::new(),
        wake: Vec::new(),
        stalled: Vec::new(),
        retired: Vec::new(),
        room_applied: 0,
        room_written: VecDeque::new(),
        buffered: 0,
        written: 0,
        settling: Vec::new(),
    };
    let mut read_buf = BytesMut::with_capacity(128 * 1024);
    let mut write_buf = BytesMut::with_capacity(128 * 1024);
    let mut commands_open = true;
    // What the lane held when last taken (its allocation is kept: the lane
    // and the driver swap two vectors back and forth).
    let mut batch: Vec<Command> = Vec::new();
    // The publishes' records and frames that came with it (swapped with
    // the lane's side the same way).
    let mut records: Vec<Published> = Vec::new();
    let mut frames = BytesMut::new();
    let mut reading = true;
    let shared = driver.shared.clone();
    // With busy polling, when the driver last did something (it polls
    // until `busy_poll` after that, then sleeps).
    let busy_poll = shared.busy_poll;
    let mut active_at = Instant::now();
    // The machine's next deadline, on one timer kept for the whole
    // connection (a timer made for each turn of the loop was put into
    // tokio's timer wheel and taken out again on every turn).
    let mut timer = std::pin::pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    // The time a read was handled at, which the loop's next turn takes as
    // its own rather than read the clock again (nothing slept between).
    let mut read_at: Option<Instant> = None;
    // With a read interval, the socket rests after each read until this
    // timer goes off (`resting`): its input gathers meanwhile.
    let read_interval = shared.read_interval;
    let mut rest = std::pin::pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    let mut resting = false;
    loop {
        driver.settle();
        driver.drain_events();
        let before = write_buf.len();
        let turn_at = read_at.take().unwrap_or_else(now);
        driver.machine.poll_transmit(&mut write_buf, turn_at);
        driver.transmitted(write_buf.len() - before);
        // A full consumer queue pauses reading until that consumer takes one.
        let stalled = driver.unstall();
        let read = !stalled.pausing || !driver.machine.is_open();
        if read != reading {
            reading = read;
            driver.machine.pause_input(!reading, turn_at);
        }
        if driver.machine.is_closed() {
            // Say close-ok (or close) before hanging up, briefly.
            if !write_buf.is_empty() {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), stream.write_all(&write_buf)).await;
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), stream.shutdown()).await;
            break;
        }
        let deadline = driver.machine.poll_timeout().map(tokio::time::Instant::from_std);
        if let Some(at) = deadline {
            // Moved only when the deadline comes sooner (or the timer went
            // off): a heartbeat's deadline moves later on every send and
            // receive, and a timer left earlier only wakes the loop once,
            // to find nothing due and set the later one.
            if at < timer.deadline() || timer.is_elapsed() {
                timer.as_mut().reset(at);
            }
        }
        if read_buf.capacity() - read_buf.len() < 16 * 1024 {
            read_buf.reserve(64 * 1024);
        }
        // What this turn waits for, polled in this order (the first ready
        // wins): the socket's input (unless it rests after the last read),
        // room to write, a consumer taking a delivery, new commands, the
        // machine's deadline, and, when busy polling, a yield to the runtime.
        let mut took = std::pin::pin!(shared.consumer_took.notified());
        let mut yielding = std::pin::pin!(tokio::task::yield_now());
        let busy = !busy_poll.is_zero() && active_at.elapsed() < busy_poll;
        let turn = std::future::poll_fn(|cx| {
            if resting && rest.as_mut().poll(cx).is_ready() {
                resting = false;
            }
            if reading && !resting {
                let mut stream = stream.as_mut();
                if let Poll::Ready(read) = std::pin::pin!(stream.read_buf(&mut read_buf)).poll(cx) {
                    return Poll::Ready(Turn::Read(read));
                }
            }
            // What the socket takes is written here, within this turn: a
            // write makes no event and nothing new to transmit, so it needs
            // no turn of the loop of its own (one less per publish batch).
            while !write_buf.is_empty() {
                match stream.as_mut().poll_write(cx, &write_buf) {
                    Poll::Ready(Ok(n)) if n > 0 => {
                        write_buf.advance(n);
                        driver.wrote(n);
                    }
                    Poll::Ready(ended) => return Poll::Ready(Turn::Ended(ended.err())),
                    Poll::Pending => break,
                }
            }
            if stalled.any && took.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Turn::ConsumerTook);
            }
            if commands_open {
                let taken = commands.poll_recv_with(cx, &mut batch, |outgoing| {
                    std::mem::swap(&mut outgoing.records, &mut records);
                    std::mem::swap(&mut outgoing.frames, &mut frames);
                });
                if let Poll::Ready(more) = taken {
                    return Poll::Ready(Turn::Commands { more });
                }
            }
            if deadline.is_some() && timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Turn::Deadline);
            }
            if busy && yielding.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Turn::Yielded);
            }
            Poll::Pending
        })
        .await;
        match turn {
            Turn::Read(Ok(0) | Err(_)) => driver.machine.handle_eof(),
            Turn::Ended(err) => {
                if let Some(err) = err {
                    tracing::debug!(%err, "writing to the socket failed");
                }
                driver.machine.handle_eof();
            }
            Turn::Read(Ok(_)) => {
                let at = now();
                read_at = Some(at);
                driver.machine.handle_input(&mut read_buf, at);
                if !read_interval.is_zero() {
                    rest.as_mut().reset(tokio::time::Instant::from_std(at + read_interval));
                    resting = true;
                }
            }
            // The loop's top hands the consumer more.
            Turn::ConsumerTook => {}
            // Everything queued since the last batch: it goes out in one write.
            Turn::Commands { more: true } => {
                driver.apply_batch(&mut batch, &mut records, &mut frames);
                frames.clear();
                // A burst (up to the publish buffer's worth) leaves no
                // large vector behind in the lane or here.
                batch.shrink_to(KEPT_BATCH);
                records.shrink_to(KEPT_BATCH);
            }
            Turn::Commands { more: false } => {
                commands_open = false;
                driver.machine.close();
            }
            Turn::Deadline => driver.machine.handle_timeout(now()),
            // Nothing to do, and busy polling: the runtime polled the
            // sockets without sleeping, and this runs again.
            Turn::Yielded => continue,
        }
        if !busy_poll.is_zero() {
            active_at = Instant::now();
        }
    }
    driver.shared.end_settles();
    driver.drain_events();
    driver.fail_everything();
    // Publishers waiting for room hear that the connection is gone.
    driver.shared.room.close();
}

/// What woke one turn of the driver's loop.
enum Turn {
    /// The socket's input (`Ok(0)` at its end).
    Read(std::io::Result<usize>),
    /// A write to the socket found it closed (`None`: it took nothing) or
    /// failed.
    Ended(Option<std::io::Error>),
    /// A consumer took a delivery from its full queue.
    ConsumerTook,
    /// Commands were taken from the lane (`more`), or every sender is gone.
    Commands { more: bool },
    /// The machine's deadline passed.
    Deadline,
    /// Busy polling yielded to the runtime.
    Yielded,
}

/// What a command the machine refused fails with: the connection's error
/// once the machine is closed.
fn command_error(shared: &Shared, closed: bool, err: CommandError) -> Error {
    match err {
        CommandError::ConnectionNotOpen if closed => shared.closed_error(),
        other => Error::Command(other),
    }
}

/// Marks the connection over when the driver's task ends, also when it
/// ends without reaching the end of `run`: `closed()` and `is_closed()` then
/// say so, publishers waiting for room and new settlements fail. (Pending
/// replies fail by themselves: their senders are dropped with the driver.)
struct Over(Arc<Shared>);

impl Drop for Over {
    fn drop(&mut self) {
        let shared = &self.0;
        shared.end_settles();
        shared.room.close();
        if !*shared.closed.borrow() {
            if let Ok(mut slot) = shared.close_reason.lock() {
                slot.get_or_insert(CloseReason::ConnectionLost);
            }
            let _ = shared.events.send(ConnectionEvent::Closed(CloseReason::ConnectionLost));
            shared.closed.send_replace(true);
        }
        // After the driver is gone: a confirm still waiting is one no
        // settle will reach.
        let lines = std::mem::take(&mut *shared.lines.lock().unwrap_or_else(|p| p.into_inner()));
        let mut wake = Vec::new();
        for line in lines.iter().filter_map(std::sync::Weak::upgrade) {
            line.fail(shared.closed_error(), u64::MAX, &mut wake);
        }
        wake_all(&mut wake);
    }
}

/// What [`Driver::unstall`] found still stalled.
#[derive(Default)]
struct Stalled {
    /// Some consumer's overflow still waits for room.
    any: bool,
    /// A live consumer's does: reading stays paused.
    pausing: bool,
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Driver {
    fn routes(&mut self, channel: u16, generation: u64) -> Option<&mut ChannelRoutes> {
        self.channels
            .get_mut(usize::from(channel))
            .and_then(Option::as_mut)
            .filter(|r| r.generation == generation)
    }

    fn command_error(&self, err: CommandError) -> Error {
        command_error(&self.shared, self.machine.is_closed(), err)
    }

    /// Writes the settlements waiting in the lane.
    fn settle(&mut self) {
        let mut ops = std::mem::take(&mut self.settling);
        self.shared.take_settles(&mut ops);
        for op in &ops {
            if self.routes(op.channel, op.generation).is_none() {
                // Its channel has closed since (the broker closed it, or a
                // call on it timed out): the tag means nothing on any other
                // channel, so it is never sent; the broker redelivers.
                metrics::counter!(crate::metrics_names::RECOVERY_TOTAL, "event" => "settlement_dropped").increment(1);
                tracing::debug!(channel = op.channel, "settlement dropped: the channel has closed since");
                continue;
            }
            if let SettleKind::Ack { multiple: false } = op.kind {
                // The usual settlement, without a `Method` built for it.
                if let Err(err) = self.machine.ack_one(op.channel, op.tag) {
                    tracing::debug!(channel = op.channel, %err, "could not send");
                }
                continue;
            }
            self.send(op.channel, op.generation, op.method());
        }
        self.settling = ops;
    }

    /// Carries out one command from the handles, after the settlements
    /// queued before it.
    fn apply(&mut self, command: Command) {
        // Checked here first: most commands find the settle lane empty.
        if self.shared.settles_waiting.load(Ordering::SeqCst) {
            self.settle();
        }
        match command {
            // `settle` above took what it woke the driver for.
            Command::Settled => {}
            Command::OpenChannel { reply } => self.open_channel(reply),
            Command::Call {
                channel,
                generation,
                method,
                reply,
            } => self.call(channel, generation, method, reply),
            Command::Send {
                channel,
                generation,
                method,
            } => self.send(channel, generation, method),
            // Taken with their records by `apply_batch`.
            Command::Publishes(_) => debug_assert!(false, "publishes applied outside their batch"),
            Command::Consume {
                channel,
                generation,
                method,
                reply,
            } => self.consume(channel, generation, method, reply),
            Command::Close { reply } => self.close(reply),
        }
    }

    fn open_channel(&mut self, reply: Reply1<(u16, u64, Arc<AtomicBool>, Arc<Line>)>) {
        match self.machine.open_channel() {
            Ok((_, token)) => {
                self.pending.insert(token, Pending::Open(reply));
            }
            Err(err) => {
                let _ = reply.send(Err(self.command_error(err)));
            }
        }
    }

    fn call(&mut self, channel: u16, generation: u64, method: Method, reply: Reply1<Option<Reply>>) {
        let Some(routes) = self.routes(channel, generation) else {
            let _ = reply.send(Err(Error::ChannelNotOpen(channel)));
            return;
        };
        match &method {
            Method::BasicQos(qos) if !qos.global => routes.prefetch = qos.prefetch_count,
            Method::BasicCancel(cancel) => {
                let tag = cancel.consumer_tag.clone();
                self.cancelling(channel, generation, Some(&tag));
            }
            Method::ChannelClose(_) => self.cancelling(channel, generation, None),
            _ => {}
        }
        match self.machine.call(channel, method) {
            Ok(Some(token)) => {
                self.pending.insert(token, Pending::Call(reply));
            }
            Ok(None) => {
                let _ = reply.send(Ok(None));
            }
            Err(err) => {
                let _ = reply.send(Err(self.command_error(err)));
            }
        }
    }

    fn send(&mut self, channel: u16, generation: u64, method: Method) {
        if self.routes(channel, generation).is_none() {
            tracing::debug!(channel, method = method.name(), "dropped: the channel has closed since");
            return;
        }
        if let Err(err) = self.machine.call(channel, method) {
            tracing::debug!(channel, %err, "could not send");
        }
    }

    /// Carries out a batch taken from the lane: its commands in order, each
    /// run of publishes with the next records (and their frames) of the
    /// lane's side taken with it. Leaves `batch` and `records` empty.
    fn apply_batch(&mut self, batch: &mut Vec<Command>, records: &mut Vec<Published>, frames: &mut BytesMut) {
        let mut records = records.drain(..);
        let mut at = 0;
        for command in batch.drain(..) {
            let Command::Publishes(run) = command else {
                self.apply(command);
                continue;
            };
            if self.shared.settles_waiting.load(Ordering::SeqCst) {
                self.settle();
            }
            at = self.publish_run(records.by_ref().take(run), frames, at);
        }
        debug_assert!(records.next().is_none(), "every record has its command");
        debug_assert!(at == frames.len() || frames.is_empty(), "every frame has its record");
    }

    /// Queues a run of publishes' frames, encoded by the tasks that
    /// published them, each if its channel is still the one it was
    /// published on. The run's frames start at `from`; returns where they
    /// end.
    fn publish_run(&mut self, records: impl Iterator<Item = Published>, frames: &mut BytesMut, from: usize) -> usize {
        let closed = self.machine.is_closed();
        let mut end = from;
        let mut run = self.machine.encoded_publishes(frames, from);
        let mut records = records.peekable();
        while let Some(record) = records.next() {
            let Published {
                channel,
                generation,
                mut len,
                room,
                returned,
            } = record;
            // Given back once the next bytes to enter the write buffer (these
            // publishes' frames, or none if they were refused) are written.
            self.room_applied = self.room_applied.saturating_add(room);
            // The publishes after it on the same channel, none mandatory,
            // are taken with it (usually the whole run: one publisher).
            let mut count = 1;
            if returned.is_none() {
                let same = |next: &Published| {
                    next.channel == channel && next.generation == generation && next.returned.is_none()
                };
                while let Some(next) = records.next_if(same) {
                    len += next.len;
                    count += 1;
                    self.room_applied = self.room_applied.saturating_add(next.room);
                }
            }
            end += len;
            let routes = self
                .channels
                .get_mut(usize::from(channel))
                .and_then(Option::as_mut)
                .filter(|r| r.generation == generation);
            // A channel gone since: its line failed then, and says so to
            // every publish it had not taken.
            let Some(routes) = routes else {
                run.skip(len);
                continue;
            };
            let number = routes.taken;
            routes.taken += count;
            let taken = match returned {
                Some(key) => run.publish(channel, len, Some(*key)),
                None => run.publish_many(channel, len, count),
            };
            match taken {
                Ok(Some(seq)) => {
                    if routes.first_confirmed.is_none() {
                        let first = (number + 1).saturating_sub(seq);
                        routes.first_confirmed = Some(first);
                        routes.line.confirm_mode_from(first);
                    }
                }
                // Settles the group's last and every publish before it.
                Ok(None) => routes.line.not_requested(number + count - 1, &mut self.wake),
                // Fails the group's first and every publish after it.
                Err(err) => {
                    let error = command_error(&self.shared, closed, err);
                    routes.line.refuse(number, error, &mut self.wake);
                }
            }
        }
        drop(run);
        wake_all(&mut self.wake);
        end
    }

    fn consume(
        &mut self,
        channel: u16,
        generation: u64,
        method: acemq_codec::BasicConsume,
        reply: Reply1<(ShortString, DeliveryQueue)>,
    ) {
        let Some(routes) = self.routes(channel, generation) else {
            let _ = reply.send(Err(Error::ChannelNotOpen(channel)));
            return;
        };
        let prefetch = usize::from(routes.prefetch);
        let bound = self.shared.delivery_buffer.max(prefetch);
        let (route, queue) = ConsumerRoute::new(bound);
        let no_wait_tag = method.no_wait.then(|| method.consumer_tag.clone());
        match self.machine.call(channel, Method::BasicConsume(method)) {
            Ok(Some(token)) => {
                self.pending.insert(token, Pending::Consume { route, queue, reply });
            }
            Ok(None) => {
                // no-wait: the tag must be ours, and deliveries may follow at once.
                let tag = no_wait_tag.unwrap_or_default();
                if let Some(routes) = self.routes(channel, generation) {
                    routes.add_consumer(tag.clone(), route);
                }
                let _ = reply.send(Ok((tag, queue)));
            }
            Err(err) => {
                let _ = reply.send(Err(self.command_error(err)));
            }
        }
    }

    fn close(&mut self, reply: Reply1<()>) {
        if self.machine.is_closed() {
            let _ = reply.send(Ok(()));
        } else {
            self.closers.push(reply);
            self.machine.close();
        }
    }

    fn drain_events(&mut self) {
        while let Some(event) = self.machine.poll_event() {
            self.on_event(event);
        }
    }

    /// Routes one event of the machine to the handles that wait for it.
    fn on_event(&mut self, event: Event) {
        match event {
            Event::Opened => self.opened(),
            Event::Reply { channel, token, result } => self.on_reply(channel, token, result),
            Event::Delivery { channel, content } => self.deliver(channel, content),
            Event::Confirm {
                channel,
                seq,
                outcome,
                returned,
            } => self.confirm(channel, seq, outcome, returned),
            Event::Confirms {
                channel,
                first,
                last,
                outcome,
            } => self.confirm_run(channel, first, last, outcome),
            Event::Return { channel, content } => self.unmatched_return(channel, content),
            Event::ConsumerCancelled { channel, consumer_tag } => self.consumer_cancelled(channel, consumer_tag),
            Event::Flow { .. } => {}
            Event::ChannelClosed { channel, refusal, .. } => self.channel_closed(channel, refusal),
            Event::Blocked { reason } => {
                self.shared.blocked.send_replace(Some(reason.clone()));
                let _ = self.shared.events.send(ConnectionEvent::Blocked { reason });
            }
            Event::Unblocked => {
                self.shared.blocked.send_replace(None);
                let _ = self.shared.events.send(ConnectionEvent::Unblocked);
            }
            Event::Closed(reason) => self.closed(reason),
        }
    }

    fn opened(&mut self) {
        if let Some(tuned) = self.machine.tuned() {
            let _ = self.shared.tuned.set(tuned);
        }
        let _ = self
            .shared
            .server_properties
            .set(self.machine.server_properties().clone());
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Ok(()));
        }
    }

    #[inline]
    fn deliver(&mut self, channel: u16, content: acemq_codec::track::Content) {
        let generation = match self.channels.get(usize::from(channel)).and_then(Option::as_ref) {
            Some(routes) => routes.generation,
            None => return,
        };
        let Method::BasicDeliver(deliver) = content.method else {
            return;
        };
        let delivery = Delivery {
            consumer_tag: deliver.consumer_tag,
            delivery_tag: deliver.delivery_tag,
            redelivered: deliver.redelivered,
            exchange: deliver.exchange,
            routing_key: deliver.routing_key,
            properties: content.header.map(|h| h.properties),
            body: content.body,
            acker: Acker {
                shared: self.shared.clone(),
                channel,
                generation,
            },
        };
        let routes = self.channels[usize::from(channel)].as_mut().expect("checked above");
        let Some(route) = routes.consumer_mut(&delivery.consumer_tag) else {
            tracing::warn!(channel, consumer = %delivery.consumer_tag, "delivery for an unknown consumer");
            return;
        };
        if !route.overflow.is_empty() {
            // Behind what already waits, so the consumer keeps its order.
            route.overflow.push_back(delivery);
            return;
        }
        match route.offer(delivery) {
            Ok(()) => {}
            Err(Refused::Full(delivery)) => {
                tracing::debug!(channel, consumer = %delivery.consumer_tag, "consumer queue full: reading paused");
                self.stalled.push((channel, generation, delivery.consumer_tag.clone()));
                route.overflow.push_back(delivery);
            }
            Err(Refused::Closed(delivery)) => lost_delivery(&delivery, 0),
        }
    }

    /// Hands over what the consumers' overflows hold while there is room,
    /// and says what is still stalled.
    fn unstall(&mut self) -> Stalled {
        if self.stalled.is_empty() && self.retired.is_empty() {
            return Stalled::default();
        }
        // Consumers that take a delivery from now on wake the driver.
        self.shared.stalled.store(true, Ordering::SeqCst);
        let mut pausing = false;
        let mut stalled = std::mem::take(&mut self.stalled);
        stalled.retain(|(channel, generation, tag)| {
            let Some(route) = self.routes(*channel, *generation).and_then(|r| r.consumer_mut(tag)) else {
                return false;
            };
            let left = route.unstall();
            pausing |= left && !route.cancelling;
            left
        });
        self.stalled = stalled;
        self.retired.retain_mut(ConsumerRoute::unstall);
        let any = !self.stalled.is_empty() || !self.retired.is_empty();
        if !any {
            self.shared.stalled.store(false, Ordering::SeqCst);
        }
        Stalled { any, pausing }
    }

    /// A consumer leaves its channel: what its overflow holds is still
    /// handed over, after which its stream ends.
    fn retire(&mut self, route: ConsumerRoute) {
        if !route.overflow.is_empty() {
            self.retired.push(route);
        }
    }

    /// We asked to cancel `tag` on `channel` (all its consumers with `None`).
    fn cancelling(&mut self, channel: u16, generation: u64, tag: Option<&ShortString>) {
        if let Some(routes) = self.routes(channel, generation) {
            for route in routes.consumers.iter_mut() {
                if tag.is_none_or(|tag| *tag == route.tag) {
                    route.cancelling = true;
                }
            }
        }
    }

    /// `added` bytes entered the write buffer: the room of the publishes
    /// applied since the last transmit is given back once they are written.
    fn transmitted(&mut self, added: usize) {
        self.buffered += added as u64;
        if self.room_applied > 0 {
            let room = std::mem::take(&mut self.room_applied);
            if self.buffered == self.written {
                self.shared.room.add_permits(room as usize);
            } else {
                match self.room_written.back_mut() {
                    Some((at, more)) if *at == self.buffered => *more += room,
                    _ => self.room_written.push_back((self.buffered, room)),
                }
            }
        }
    }

    /// `n` bytes of the write buffer went to the socket.
    fn wrote(&mut self, n: usize) {
        self.written += n as u64;
        let mut room = 0usize;
        while let Some(&(at, r)) = self.room_written.front() {
            if at > self.written {
                break;
            }
            room += r as usize;
            self.room_written.pop_front();
        }
        if room > 0 {
            self.shared.room.add_permits(room);
        }
    }

    #[inline]
    fn confirm(
        &mut self,
        channel: u16,
        seq: u64,
        outcome: acemq_codec::track::Outcome,
        returned: Option<acemq_codec::track::Content>,
    ) {
        let Some(routes) = self.channels.get_mut(usize::from(channel)).and_then(Option::as_mut) else {
            return;
        };
        let Some(first) = routes.first_confirmed else {
            return;
        };
        let confirmation = match (outcome, returned.and_then(ReturnedMessage::from_content)) {
            (acemq_codec::track::Outcome::Nack, _) => Confirmation::Nack,
            (_, Some(returned)) => Confirmation::Returned(Box::new(returned)),
            (_, None) => Confirmation::Ack,
        };
        routes.line.settle(first + seq - 1, Ok(confirmation), &mut self.wake);
        wake_all(&mut self.wake);
    }

    /// Confirms `first..=last` (sequence numbers the broker confirmed
    /// together, none of them returned): when they are the oldest unsettled
    /// and acked, one move of the line's watermark.
    fn confirm_run(&mut self, channel: u16, first: u64, last: u64, outcome: acemq_codec::track::Outcome) {
        let Some(routes) = self.channels.get_mut(usize::from(channel)).and_then(Option::as_mut) else {
            return;
        };
        let Some(base) = routes.first_confirmed else {
            return;
        };
        let confirmation = match outcome {
            acemq_codec::track::Outcome::Nack => Confirmation::Nack,
            acemq_codec::track::Outcome::Ack => Confirmation::Ack,
        };
        routes
            .line
            .settle_run(base + first - 1, base + last - 1, confirmation, &mut self.wake);
        wake_all(&mut self.wake);
    }

    fn unmatched_return(&mut self, channel: u16, content: acemq_codec::track::Content) {
        if let Some(message) = ReturnedMessage::from_content(content) {
            tracing::warn!(channel, exchange = %message.exchange, routing_key = %message.routing_key, "returned message matches no publish");
            let _ = self.shared.events.send(ConnectionEvent::Returned {
                channel,
                message: Box::new(message),
            });
        }
    }

    fn consumer_cancelled(&mut self, channel: u16, consumer_tag: ShortString) {
        let route = self
            .channels
            .get_mut(usize::from(channel))
            .and_then(Option::as_mut)
            .and_then(|routes| routes.remove_consumer(&consumer_tag));
        if let Some(route) = route {
            self.retire(route);
        }
        let _ = self
            .shared
            .events
            .send(ConnectionEvent::ConsumerCancelled { channel, consumer_tag });
    }

    fn channel_closed(&mut self, channel: u16, refusal: Option<proto::Refusal>) {
        let error = match refusal {
            Some(r) => Error::ChannelClosed(r),
            None => Error::ChannelNotOpen(channel),
        };
        self.channel_gone(channel, error);
    }

    /// `channel` is closed, or closing for good: its handles see it closed,
    /// its unconfirmed publishes fail with `error`, its consumers end.
    fn channel_gone(&mut self, channel: u16, error: Error) {
        let Some(routes) = self.channels.get_mut(usize::from(channel)).and_then(Option::take) else {
            return;
        };
        routes.open.store(false, Ordering::SeqCst);
        routes.line.fail(error, routes.taken, &mut self.wake);
        wake_all(&mut self.wake);
        // Dropping the consumers' senders ends their streams, once what
        // their overflows hold is handed over.
        for route in routes.consumers {
            self.retire(route);
        }
    }

    fn closed(&mut self, reason: CloseReason) {
        if let Ok(mut slot) = self.shared.close_reason.lock() {
            slot.get_or_insert(reason.clone());
        }
        self.shared.blocked.send_replace(None);
        let error = Error::ConnectionClosed(reason.clone());
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Err(error));
        }
        let closed = match reason {
            CloseReason::TimedOut { waiting_for, after } => Err(Error::NoReply { waiting_for, after }),
            _ => Ok(()),
        };
        for closer in self.closers.drain(..) {
            let _ = closer.send(closed.clone());
        }
        let _ = self.shared.events.send(ConnectionEvent::Closed(reason));
        self.shared.closed.send_replace(true);
    }

    fn on_reply(&mut self, channel: u16, token: Token, result: Result<Reply, proto::CallError>) {
        if let Err(proto::CallError::TimedOut {
            waiting_for: waiting_for @ proto::Wait::Reply { .. },
            after,
        }) = &result
        {
            // The machine is closing the channel: its handles, publishes
            // and consumers are done with it now, not at the close-ok a
            // silent broker may never send.
            self.channel_gone(
                channel,
                Error::NoReply {
                    waiting_for: *waiting_for,
                    after: *after,
                },
            );
        }
        let Some(pending) = self.pending.remove(&token) else {
            return;
        };
        match pending {
            Pending::Open(reply) => match result {
                Ok(_) => {
                    self.next_generation += 1;
                    let generation = self.next_generation;
                    let index = usize::from(channel);
                    if self.channels.len() <= index {
                        self.channels.resize_with(index + 1, || None);
                    }
                    let open = Arc::new(AtomicBool::new(true));
                    let line = Arc::new(Line::new(self.shared.clone(), channel));
                    {
                        let mut lines = self.shared.lines.lock().unwrap_or_else(|p| p.into_inner());
                        lines.retain(|line| line.strong_count() > 0);
                        lines.push(Arc::downgrade(&line));
                    }
                    let earlier = self.channels[index].replace(ChannelRoutes {
                        generation,
                        open: open.clone(),
                        line: line.clone(),
                        taken: 0,
                        first_confirmed: None,
                        consumers: Vec::new(),
                        prefetch: 0,
                    });
                    // The machine reuses a number only once its channel has
                    // closed (and `channel_closed` emptied it); should one
                    // still be here, its publishes hear that it is gone.
                    if let Some(earlier) = earlier {
                        earlier.open.store(false, Ordering::SeqCst);
                        earlier
                            .line
                            .fail(Error::ChannelNotOpen(channel), earlier.taken, &mut self.wake);
                        wake_all(&mut self.wake);
                    }
                    let _ = reply.send(Ok((channel, generation, open, line)));
                }
                Err(err) => {
                    let _ = reply.send(Err(err.into()));
                }
            },
            Pending::Call(reply) => {
                if let Ok(Reply::Method(Method::BasicCancelOk(ok))) = &result {
                    let route = self
                        .channels
                        .get_mut(usize::from(channel))
                        .and_then(Option::as_mut)
                        .and_then(|routes| routes.remove_consumer(&ok.consumer_tag));
                    if let Some(route) = route {
                        self.retire(route);
                    }
                }
                let _ = reply.send(result.map(Some).map_err(Error::from));
            }
            Pending::Consume { route, queue, reply } => match result {
                Ok(Reply::Method(Method::BasicConsumeOk(ok))) => {
                    if let Some(routes) = self.channels.get_mut(usize::from(channel)).and_then(Option::as_mut) {
                        routes.add_consumer(ok.consumer_tag.clone(), route);
                    }
                    let _ = reply.send(Ok((ok.consumer_tag, queue)));
                }
                Ok(other) => {
                    let _ = reply.send(Err(Error::unexpected(acemq_codec::BasicConsumeOk::NAME, Some(&other))));
                }
                Err(err) => {
                    let _ = reply.send(Err(err.into()));
                }
            },
        }
    }

    /// The connection is over: everyone still waiting hears why.
    fn fail_everything(&mut self) {
        let error = self.shared.closed_error();
        for (_, pending) in self.pending.drain() {
            match pending {
                Pending::Open(r) => drop(r.send(Err(error.clone()))),
                Pending::Call(r) => drop(r.send(Err(error.clone()))),
                Pending::Consume { reply, .. } => drop(reply.send(Err(error.clone()))),
            }
        }
        for routes in self.channels.drain(..).flatten() {
            routes.open.store(false, Ordering::SeqCst);
            // The connection is gone: what was queued and never taken too.
            routes.line.fail(error.clone(), u64::MAX, &mut self.wake);
        }
        wake_all(&mut self.wake);
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Err(error));
        }
        for closer in self.closers.drain(..) {
            let _ = closer.send(Ok(()));
        }
        self.shared.closed.send_replace(true);
    }
}
