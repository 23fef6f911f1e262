//! The tokio driver: one task per connection that owns the socket (any
//! transport from `io`) and the protocol machine. It reads into one buffer
//! and lets the machine parse in place; it writes everything queued while
//! the previous write was in flight in one go; it carries out commands from
//! the API handles and routes the machine's events to them. Its state is
//! one [`Driver`]; [`run`] is a short loop over its `drive_*` steps.
//!
//! It makes no protocol decision (the machine does), and it reaches the
//! handles only through what `state` holds: it never imports a handle's
//! module.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use acemq_codec::{Method, ShortString};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::time::Sleep;

use super::batch_queue;
use super::error::Error;
use super::message::{Confirmation, ConnectionEvent, ReturnedMessage};
use super::pending_confirms::{wake_all, PendingConfirms};
use super::state::{
    Acker, ChannelConfirms, Command, ConnectionState, Delivery, DeliveryQueue, Outgoing, Published, Reply1, SettleKind,
    SettleOp,
};
use super::transcript::Recorder;
use crate::proto::{self, CloseReason, CommandError, Event, Reply, Token};

/// How many commands' room the driver's batch vector keeps between bursts.
const KEPT_BATCH: usize = 1024;

enum Pending {
    Open(Reply1<(u16, u64, Arc<AtomicBool>, Arc<ChannelConfirms>)>),
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
    confirms: Arc<ChannelConfirms>,
    /// How many of its publishes the driver has taken: the number of the
    /// next (see `pending_confirms.rs`).
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
    tx: batch_queue::Sender<Delivery>,
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
        let (tx, rx) = batch_queue::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let route = ConsumerRoute {
            tag: ShortString::default(),
            tx,
            queued: queued.clone(),
            bound: bound.max(1),
            overflow: VecDeque::new(),
            cancelling: false,
        };
        (route, DeliveryQueue::new(rx, queued))
    }

    /// Queues `delivery` if there is room. The count is raised before the
    /// send and the consumer lowers it after taking one, then looks at
    /// `ConnectionState::stalled`; the driver sets that flag before it looks at the
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

/// The driver task's state: the protocol machine, what the handles wait on
/// (replies, channels, consumers), the socket's buffers and the loop's own
/// flags. [`run`] turns its loop; each step is a `drive_*` method.
struct Driver {
    machine: proto::Connection,
    state: Arc<ConnectionState>,
    pending: HashMap<Token, Pending>,
    channels: Vec<Option<ChannelRoutes>>,
    next_generation: u64,
    opened: Option<oneshot::Sender<Result<(), Error>>>,
    closers: Vec<Reply1<()>>,
    /// The wakers of confirms resolved together, woken once the tracker's
    /// lock is let go (kept for its capacity).
    wake: Vec<Waker>,
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
    /// Settlements taken from the settle queue (kept for its allocation).
    settling: Vec<SettleOp>,
    /// What the socket gave and the machine has not parsed yet.
    read_buf: BytesMut,
    /// What waits to be written to the socket.
    write_buf: BytesMut,
    /// What the command queue held when last taken (its allocation is kept:
    /// the queue and the driver swap two vectors back and forth).
    batch: Vec<Command>,
    /// The publishes' records and frames that came with it (swapped with
    /// the queue's side the same way).
    records: Vec<Published>,
    frames: BytesMut,
    /// Some handle is left: the command queue is open.
    commands_open: bool,
    /// The socket is read (not paused for a full consumer queue).
    reading: bool,
    /// With a read interval, the socket rests after each read until the
    /// rest timer goes off: its input gathers meanwhile.
    resting: bool,
    /// The time a read was handled at, which the loop's next turn takes as
    /// its own rather than read the clock again (nothing slept between).
    read_at: Option<Instant>,
    /// How long the loop polls before it sleeps ([`super::Config::busy_poll`]).
    busy_poll: Duration,
    /// With busy polling, when the driver last did something (it polls
    /// until `busy_poll` after that, then sleeps).
    active_at: Instant,
    /// The least time between two reads ([`super::Config::read_interval`]).
    read_interval: Duration,
    /// The transcript's recorder, when the connection records one: shown
    /// every read and every batch put in the write buffer.
    transcript: Option<Box<Recorder>>,
    /// A caller asked for the raw connection: the loop hands the socket
    /// over after this batch.
    #[cfg(feature = "conformance")]
    raw: Option<Reply1<super::raw::RawParts>>,
    /// Dropped after everything above, however the task ends.
    end: EndGuard,
    /// Dropped last: commands queued after the end are dropped with it.
    commands: batch_queue::Receiver<Command, Outgoing>,
}

/// What the loop polls in place, pinned on the task's stack: the socket
/// and its two timers.
struct Pinned<'a, S> {
    /// One stream, read and written from this one task: no `split`, whose
    /// halves take a lock on every read and write.
    stream: Pin<&'a mut S>,
    /// The machine's next deadline, on one timer kept for the whole
    /// connection (a timer made for each turn of the loop was put into
    /// tokio's timer wheel and taken out again on every turn).
    timer: Pin<&'a mut Sleep>,
    /// With a read interval, when the socket's rest after a read is over.
    rest: Pin<&'a mut Sleep>,
}

/// What one turn waits for besides the socket and the command queue.
struct Waits<'a, T, Y> {
    /// A consumer taking a delivery, while some consumer is stalled.
    took: Option<Pin<&'a mut T>>,
    /// The machine's deadline, when it has one.
    deadline: bool,
    /// A yield to the runtime, when busy polling.
    yielding: Option<Pin<&'a mut Y>>,
}

/// Runs a connection over `stream` until it ends. `opened` hears when the
/// handshake is done (or failed).
pub(crate) async fn run<S>(
    stream: S,
    machine: proto::Connection,
    state: Arc<ConnectionState>,
    commands: batch_queue::Receiver<Command, Outgoing>,
    opened: oneshot::Sender<Result<(), Error>>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let consumers = state.clone();
    let mut driver = Driver::new(machine, state, commands, opened);
    let stream = std::pin::pin!(stream);
    let timer = std::pin::pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    let rest = std::pin::pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    let mut io = Pinned { stream, timer, rest };
    loop {
        driver.settle();
        driver.drain_events();
        let turn_at = driver.drive_transmit();
        let stalled = driver.drive_consumers(turn_at);
        if driver.machine.is_closed() {
            driver.hang_up(io.stream.as_mut()).await;
            break;
        }
        let deadline = driver.drive_timer(io.timer.as_mut());
        driver.make_room_to_read();
        // What this turn waits for, polled in this order (the first ready
        // wins): the socket's input (unless it rests after the last read),
        // room to write, a consumer taking a delivery, new commands, the
        // machine's deadline, and, when busy polling, a yield to the runtime.
        let mut took = std::pin::pin!(consumers.consumer_took.notified());
        let mut yielding = std::pin::pin!(tokio::task::yield_now());
        let mut waits = Waits {
            took: stalled.any.then_some(took.as_mut()),
            deadline,
            yielding: driver.busy().then_some(yielding.as_mut()),
        };
        match std::future::poll_fn(|cx| driver.poll_turn(cx, &mut io, &mut waits)).await {
            Turn::Read(Ok(0) | Err(_)) => driver.machine.handle_eof(),
            Turn::Ended(err) => driver.drive_write_failed(err),
            Turn::Read(Ok(n)) => driver.drive_read(io.rest.as_mut(), n),
            // The loop's top hands the consumer more.
            Turn::ConsumerTook => {}
            Turn::Commands { more: true } => {
                driver.drive_commands();
                #[cfg(feature = "conformance")]
                if let Some(reply) = driver.raw.take() {
                    driver.run_raw(reply, io.stream.as_mut()).await;
                    break;
                }
            }
            Turn::Commands { more: false } => driver.drive_no_more_commands(),
            Turn::Deadline => driver.machine.handle_timeout(now()),
            // Nothing to do, and busy polling: the runtime polled the
            // sockets without sleeping, and this runs again.
            Turn::Yielded => continue,
        }
        driver.mark_active();
    }
    driver.finish();
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
    /// Commands were taken from the command queue (`more`), or every sender is gone.
    Commands { more: bool },
    /// The machine's deadline passed.
    Deadline,
    /// Busy polling yielded to the runtime.
    Yielded,
}

/// What a command the machine refused fails with: the connection's error
/// once the machine is closed.
fn command_error(state: &ConnectionState, closed: bool, err: CommandError) -> Error {
    match err {
        CommandError::ConnectionNotOpen if closed => state.closed_error(),
        other => Error::Command(other),
    }
}

/// Marks the connection over when the driver's task ends, also when it
/// ends without reaching the end of `run`: `closed()` and `is_closed()` then
/// say so, publishers waiting for room and new settlements fail, and every
/// confirm still pending fails. (Pending replies fail by themselves: their
/// senders are dropped with the driver.)
struct EndGuard {
    state: Arc<ConnectionState>,
    /// Every channel's pending confirms, to fail those still there when the
    /// driver ends however it ends.
    confirms: Vec<Weak<ChannelConfirms>>,
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        let state = &self.state;
        state.end_settles();
        state.room.close();
        if !*state.closed.borrow() {
            if let Ok(mut slot) = state.close_reason.lock() {
                slot.get_or_insert(CloseReason::ConnectionLost);
            }
            let _ = state.events.send(ConnectionEvent::Closed(CloseReason::ConnectionLost));
            state.closed.send_replace(true);
        }
        // After the driver is gone: a confirm still waiting is one no
        // resolve will reach.
        let confirms = std::mem::take(&mut self.confirms);
        let mut wake = Vec::new();
        for confirms in confirms.iter().filter_map(Weak::upgrade) {
            confirms.pending.fail(state.closed_error(), u64::MAX, &mut wake);
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
    fn new(
        machine: proto::Connection,
        state: Arc<ConnectionState>,
        commands: batch_queue::Receiver<Command, Outgoing>,
        opened: oneshot::Sender<Result<(), Error>>,
    ) -> Self {
        Driver {
            transcript: state.transcript.clone().map(|log| Box::new(Recorder::new(log))),
            #[cfg(feature = "conformance")]
            raw: None,
            machine,
            busy_poll: state.busy_poll,
            read_interval: state.read_interval,
            // However the task ends (a bug that panics, or a runtime shut
            // down under it), everyone waiting on the connection hears that
            // it is over.
            end: EndGuard {
                state: state.clone(),
                confirms: Vec::new(),
            },
            state,
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
            read_buf: BytesMut::with_capacity(128 * 1024),
            write_buf: BytesMut::with_capacity(128 * 1024),
            batch: Vec::new(),
            records: Vec::new(),
            frames: BytesMut::new(),
            commands_open: true,
            reading: true,
            resting: false,
            read_at: None,
            active_at: Instant::now(),
            commands,
        }
    }

    // ---- the loop's steps, in the order of a turn ----

    /// Puts what the machine has to send in the write buffer; the turn's
    /// time (that of the read just handled, if any).
    fn drive_transmit(&mut self) -> Instant {
        let before = self.write_buf.len();
        let turn_at = self.read_at.take().unwrap_or_else(now);
        self.machine.poll_transmit(&mut self.write_buf, turn_at);
        if let Some(recorder) = &mut self.transcript {
            recorder.sent(&self.write_buf[before..]);
        }
        self.transmitted(self.write_buf.len() - before);
        turn_at
    }

    /// Hands the consumers what their overflows hold: a full consumer
    /// queue pauses reading until that consumer takes one.
    fn drive_consumers(&mut self, turn_at: Instant) -> Stalled {
        let stalled = self.unstall();
        let read = !stalled.pausing || !self.machine.is_open();
        if read != self.reading {
            self.reading = read;
            self.machine.pause_input(!self.reading, turn_at);
        }
        stalled
    }

    /// The machine is closed: says close-ok (or close) before hanging up,
    /// briefly.
    async fn hang_up<S: AsyncWrite>(&mut self, mut stream: Pin<&mut S>) {
        if !self.write_buf.is_empty() {
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&self.write_buf)).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
    }

    /// Sets the timer to the machine's next deadline; whether it has one.
    fn drive_timer(&mut self, mut timer: Pin<&mut Sleep>) -> bool {
        let Some(at) = self.machine.poll_timeout().map(tokio::time::Instant::from_std) else {
            return false;
        };
        // Moved only when the deadline comes sooner (or the timer went
        // off): a heartbeat's deadline moves later on every send and
        // receive, and a timer left earlier only wakes the loop once, to
        // find nothing due and set the later one.
        if at < timer.deadline() || timer.is_elapsed() {
            timer.as_mut().reset(at);
        }
        true
    }

    fn make_room_to_read(&mut self) {
        if self.read_buf.capacity() - self.read_buf.len() < 16 * 1024 {
            self.read_buf.reserve(64 * 1024);
        }
    }

    /// Whether this turn busy-polls (yields to the runtime rather than
    /// sleep).
    fn busy(&self) -> bool {
        !self.busy_poll.is_zero() && self.active_at.elapsed() < self.busy_poll
    }

    /// One poll of what a turn waits for (see [`run`]), in its order.
    #[inline]
    fn poll_turn<S, T, Y>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut Pinned<'_, S>,
        waits: &mut Waits<'_, T, Y>,
    ) -> Poll<Turn>
    where
        S: AsyncRead + AsyncWrite,
        T: Future<Output = ()>,
        Y: Future<Output = ()>,
    {
        if self.resting && io.rest.as_mut().poll(cx).is_ready() {
            self.resting = false;
        }
        if self.reading && !self.resting {
            let mut stream = io.stream.as_mut();
            if let Poll::Ready(read) = std::pin::pin!(stream.read_buf(&mut self.read_buf)).poll(cx) {
                return Poll::Ready(Turn::Read(read));
            }
        }
        // What the socket takes is written here, within this turn: a
        // write makes no event and nothing new to transmit, so it needs
        // no turn of the loop of its own (one less per publish batch).
        while !self.write_buf.is_empty() {
            match io.stream.as_mut().poll_write(cx, &self.write_buf) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    self.write_buf.advance(n);
                    self.wrote(n);
                }
                Poll::Ready(ended) => return Poll::Ready(Turn::Ended(ended.err())),
                Poll::Pending => break,
            }
        }
        if let Some(took) = &mut waits.took {
            if took.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Turn::ConsumerTook);
            }
        }
        if self.commands_open {
            let (records, frames) = (&mut self.records, &mut self.frames);
            let taken = self.commands.poll_recv_with(cx, &mut self.batch, |outgoing| {
                std::mem::swap(&mut outgoing.records, records);
                std::mem::swap(&mut outgoing.frames, frames);
            });
            if let Poll::Ready(more) = taken {
                return Poll::Ready(Turn::Commands { more });
            }
        }
        if waits.deadline && io.timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Turn::Deadline);
        }
        if let Some(yielding) = &mut waits.yielding {
            if yielding.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Turn::Yielded);
            }
        }
        Poll::Pending
    }

    /// The socket's input (its last `n` bytes new): the machine parses it
    /// in place. With a read interval the socket then rests.
    fn drive_read(&mut self, rest: Pin<&mut Sleep>, n: usize) {
        let at = now();
        self.read_at = Some(at);
        if let Some(recorder) = &mut self.transcript {
            recorder.received(&self.read_buf[self.read_buf.len() - n..]);
        }
        self.machine.handle_input(&mut self.read_buf, at);
        if !self.read_interval.is_zero() {
            rest.reset(tokio::time::Instant::from_std(at + self.read_interval));
            self.resting = true;
        }
    }

    /// A write to the socket found it closed or failed.
    fn drive_write_failed(&mut self, err: Option<std::io::Error>) {
        if let Some(err) = err {
            tracing::debug!(%err, "writing to the socket failed");
        }
        self.machine.handle_eof();
    }

    /// Everything queued since the last batch: it goes out in one write.
    fn drive_commands(&mut self) {
        // Taken out while it is applied (moving a vector's three words).
        let mut batch = std::mem::take(&mut self.batch);
        let mut records = std::mem::take(&mut self.records);
        self.apply_batch(&mut batch, &mut records);
        self.frames.clear();
        // A burst (up to the publish buffer's worth) leaves no large
        // vector behind in the queue or here.
        batch.shrink_to(KEPT_BATCH);
        records.shrink_to(KEPT_BATCH);
        self.batch = batch;
        self.records = records;
    }

    /// Every handle is gone: the connection closes.
    fn drive_no_more_commands(&mut self) {
        self.commands_open = false;
        self.machine.close();
    }

    /// With busy polling, notes that the driver did something.
    fn mark_active(&mut self) {
        if !self.busy_poll.is_zero() {
            self.active_at = Instant::now();
        }
    }

    /// The loop is over: later settlements fail, the last events are
    /// routed, everyone still waiting hears why, and publishers waiting
    /// for room hear that the connection is gone.
    fn finish(&mut self) {
        self.state.end_settles();
        self.drain_events();
        self.fail_everything();
        self.state.room.close();
    }

    // ---- what the steps do to the connection ----
    fn routes(&mut self, channel: u16, generation: u64) -> Option<&mut ChannelRoutes> {
        self.channels
            .get_mut(usize::from(channel))
            .and_then(Option::as_mut)
            .filter(|r| r.generation == generation)
    }

    fn command_error(&self, err: CommandError) -> Error {
        command_error(&self.state, self.machine.is_closed(), err)
    }

    /// Writes the settlements waiting in the settle queue.
    fn settle(&mut self) {
        let mut ops = std::mem::take(&mut self.settling);
        self.state.take_settles(&mut ops);
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
        // Checked here first: most commands find the settle queue empty.
        if self.state.settles_waiting.load(Ordering::SeqCst) {
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
            Command::UpdateSecret { secret, reason, reply } => self.update_secret(&secret, &reason, reply),
            #[cfg(feature = "conformance")]
            Command::Raw { reply } => self.raw_requested(reply),
        }
    }

    /// A caller asks for the raw connection: granted on an open connection
    /// (the handshake done, no close begun). From here every handle's
    /// error is [`Error::Raw`]; the loop hands the socket over once this
    /// batch is done, and what the batch still holds is dropped.
    #[cfg(feature = "conformance")]
    fn raw_requested(&mut self, reply: Reply1<super::raw::RawParts>) {
        if !self.machine.is_open() || self.raw.is_some() {
            let _ = reply.send(Err(self.command_error(CommandError::ConnectionNotOpen)));
            return;
        }
        self.state.raw.store(true, Ordering::SeqCst);
        self.raw = Some(reply);
    }

    /// Runs the connection raw until the caller hangs up or the socket
    /// ends: what the machine queued before goes out first, everything
    /// that waited on the machine fails with [`Error::Raw`], and the
    /// socket is the caller's (through the pump of `raw.rs`).
    #[cfg(feature = "conformance")]
    async fn run_raw<S: AsyncRead + AsyncWrite>(&mut self, reply: Reply1<super::raw::RawParts>, stream: Pin<&mut S>) {
        let before = self.write_buf.len();
        self.machine.poll_transmit(&mut self.write_buf, now());
        if let Some(recorder) = &mut self.transcript {
            recorder.sent(&self.write_buf[before..]);
        }
        self.abandon_for_raw();
        let frame_max = self
            .state
            .tuned
            .get()
            .map_or(acemq_codec::FRAME_MIN_SIZE, |tuned| tuned.frame_max);
        let (parts, ends) = super::raw::pair(frame_max);
        // A caller gone already drops its ends: the pump then hangs up.
        let _ = reply.send(Ok(parts));
        let transcript = self.transcript.as_deref_mut();
        let reason = super::raw::pump(stream, &mut self.read_buf, &mut self.write_buf, transcript, ends).await;
        if let Ok(mut slot) = self.state.close_reason.lock() {
            slot.get_or_insert(reason.clone());
        }
        let _ = self.state.events.send(ConnectionEvent::Closed(reason));
    }

    /// Everything that waited on the machine fails with [`Error::Raw`]:
    /// calls, channels (their publishes, taken or not, and consumers),
    /// settlements, publishers waiting for room; later commands are refused.
    #[cfg(feature = "conformance")]
    fn abandon_for_raw(&mut self) {
        self.commands.close();
        self.commands_open = false;
        self.state.end_settles();
        self.state.room.close();
        self.state.blocked.send_replace(None);
        for (_, pending) in self.pending.drain() {
            match pending {
                Pending::Open(r) => drop(r.send(Err(Error::Raw))),
                Pending::Call(r) => drop(r.send(Err(Error::Raw))),
                Pending::Consume { reply, .. } => drop(reply.send(Err(Error::Raw))),
            }
        }
        for routes in self.channels.drain(..).flatten() {
            routes.open.store(false, Ordering::SeqCst);
            routes.confirms.pending.fail(Error::Raw, u64::MAX, &mut self.wake);
        }
        wake_all(&mut self.wake);
        self.stalled.clear();
        self.retired.clear();
        for closer in self.closers.drain(..) {
            let _ = closer.send(Err(Error::Raw));
        }
    }

    fn update_secret(&mut self, secret: &proto::Secret, reason: &str, reply: Reply1<Option<Reply>>) {
        match self.machine.update_secret(secret, reason) {
            Ok(token) => {
                self.pending.insert(token, Pending::Call(reply));
            }
            Err(err) => {
                let _ = reply.send(Err(self.command_error(err)));
            }
        }
    }

    fn open_channel(&mut self, reply: Reply1<(u16, u64, Arc<AtomicBool>, Arc<ChannelConfirms>)>) {
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

    /// Carries out a batch taken from the command queue: its commands in order, each
    /// run of publishes with the next records (and their frames) of the
    /// queue's side taken with it. Leaves `batch` and `records` empty.
    fn apply_batch(&mut self, batch: &mut Vec<Command>, records: &mut Vec<Published>) {
        let mut records = records.drain(..);
        let mut at = 0;
        for command in batch.drain(..) {
            let Command::Publishes(run) = command else {
                self.apply(command);
                // What follows a switch to raw is dropped with the batch:
                // its callers hear `Error::Raw` (their publishes, from
                // their channel's failure).
                #[cfg(feature = "conformance")]
                if self.raw.is_some() {
                    return;
                }
                continue;
            };
            if self.state.settles_waiting.load(Ordering::SeqCst) {
                self.settle();
            }
            at = self.publish_run(records.by_ref().take(run), at);
        }
        debug_assert!(records.next().is_none(), "every record has its command");
        debug_assert!(
            at == self.frames.len() || self.frames.is_empty(),
            "every frame has its record"
        );
    }

    /// Queues a run of publishes' frames, encoded by the tasks that
    /// published them, each if its channel is still the one it was
    /// published on. The run's frames start at `from`; returns where they
    /// end.
    fn publish_run(&mut self, records: impl Iterator<Item = Published>, from: usize) -> usize {
        let closed = self.machine.is_closed();
        let mut end = from;
        let mut run = self.machine.encoded_publishes(&mut self.frames, from);
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
            // A channel gone since: its confirms failed then, and says so to
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
                        routes.confirms.pending.confirm_mode_from(first);
                    }
                }
                // Resolves the group's last and every publish before it.
                Ok(None) => routes
                    .confirms
                    .pending
                    .not_requested(number + count - 1, &mut self.wake),
                // Fails the group's first and every publish after it.
                Err(err) => {
                    let error = command_error(&self.state, closed, err);
                    routes.confirms.pending.refuse(number, error, &mut self.wake);
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
        let bound = self.state.delivery_buffer.max(prefetch);
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
        if self.machine.is_closed() && !*self.state.closed.borrow() {
            return self.drain_final_events();
        }
        while let Some(event) = self.machine.poll_event() {
            self.on_event(event);
        }
    }

    /// The machine has ended the connection: its last events fail every
    /// waiting call, then say it closed. The connection is marked closed
    /// (reason first, then the flag) before any of them is routed, so a
    /// caller woken by its failure finds `Connection::is_closed` true.
    #[cold]
    fn drain_final_events(&mut self) {
        let events: Vec<Event> = std::iter::from_fn(|| self.machine.poll_event()).collect();
        let reason = events.iter().find_map(|event| match event {
            Event::Closed(reason) => Some(reason.clone()),
            _ => None,
        });
        if let Some(reason) = reason {
            if let Ok(mut slot) = self.state.close_reason.lock() {
                slot.get_or_insert(reason);
            }
            self.state.closed.send_replace(true);
        }
        for event in events {
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
                self.state.blocked.send_replace(Some(reason.clone()));
                let _ = self.state.events.send(ConnectionEvent::Blocked { reason });
            }
            Event::Unblocked => {
                self.state.blocked.send_replace(None);
                let _ = self.state.events.send(ConnectionEvent::Unblocked);
            }
            Event::Closed(reason) => self.closed(reason),
        }
    }

    fn opened(&mut self) {
        if let Some(tuned) = self.machine.tuned() {
            let _ = self.state.tuned.set(tuned);
        }
        let _ = self
            .state
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
                connection: self.state.clone(),
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
        self.state.stalled.store(true, Ordering::SeqCst);
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
            self.state.stalled.store(false, Ordering::SeqCst);
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
                self.state.room.add_permits(room as usize);
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
            self.state.room.add_permits(room);
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
        routes
            .confirms
            .pending
            .resolve(first + seq - 1, Ok(confirmation), &mut self.wake);
        wake_all(&mut self.wake);
    }

    /// Confirms `first..=last` (sequence numbers the broker confirmed
    /// together, none of them returned): when they are the oldest unresolved
    /// and acked, one move of the tracker's watermark.
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
            .confirms
            .pending
            .resolve_run(base + first - 1, base + last - 1, confirmation, &mut self.wake);
        wake_all(&mut self.wake);
    }

    fn unmatched_return(&mut self, channel: u16, content: acemq_codec::track::Content) {
        if let Some(message) = ReturnedMessage::from_content(content) {
            tracing::warn!(channel, exchange = %message.exchange, routing_key = %message.routing_key, "returned message matches no publish");
            let _ = self.state.events.send(ConnectionEvent::Returned {
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
            .state
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
        routes.confirms.pending.fail(error, routes.taken, &mut self.wake);
        wake_all(&mut self.wake);
        // Dropping the consumers' senders ends their streams, once what
        // their overflows hold is handed over.
        for route in routes.consumers {
            self.retire(route);
        }
    }

    fn closed(&mut self, reason: CloseReason) {
        if let Ok(mut slot) = self.state.close_reason.lock() {
            slot.get_or_insert(reason.clone());
        }
        self.state.blocked.send_replace(None);
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
        let _ = self.state.events.send(ConnectionEvent::Closed(reason));
        self.state.closed.send_replace(true);
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
                    let confirms = Arc::new(ChannelConfirms {
                        connection: self.state.clone(),
                        pending: PendingConfirms::new(channel),
                    });
                    let registered = &mut self.end.confirms;
                    registered.retain(|confirms| confirms.strong_count() > 0);
                    registered.push(Arc::downgrade(&confirms));
                    let earlier = self.channels[index].replace(ChannelRoutes {
                        generation,
                        open: open.clone(),
                        confirms: confirms.clone(),
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
                            .confirms
                            .pending
                            .fail(Error::ChannelNotOpen(channel), earlier.taken, &mut self.wake);
                        wake_all(&mut self.wake);
                    }
                    let _ = reply.send(Ok((channel, generation, open, confirms)));
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
        let error = self.state.closed_error();
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
            routes.confirms.pending.fail(error.clone(), u64::MAX, &mut self.wake);
        }
        wake_all(&mut self.wake);
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Err(error));
        }
        for closer in self.closers.drain(..) {
            let _ = closer.send(Ok(()));
        }
        self.state.closed.send_replace(true);
    }
}
