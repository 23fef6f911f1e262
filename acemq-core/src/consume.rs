//! Consuming: a handler per message, the attempt counter on the message,
//! retries as republishes, dead letters and parked messages, rungs, and a
//! close that finishes work instead of cutting it in half.
//!
//! Every delivery runs in its own task: it decodes, waits for a handler slot
//! (`concurrency`), runs the handler, and carries out what the handler and
//! the retry policy decided. (On a current-thread runtime the work starts in
//! the consumer's loop and becomes a task only if it has to wait.) A wait spent in the process holds the delivery
//! (and its prefetch slot) but not a handler slot.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use acemq_codec::{
    BasicConsume, BasicProperties, BasicPropertiesRef, BasicPublish, FieldTable, FieldValue, ShortString,
};
use serde::de::DeserializeOwned;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::ack::{Ack, BoxError};
use crate::amqp::Delivery;
use crate::attached::{self, settle_sent, OnCancel};
use crate::codec::{Codec, Json};
use crate::conn::Conn;
use crate::conn::{lock, ConsumerRecord};
use crate::envelope::{
    Envelope, ATTEMPT_HEADER, ERROR_HEADER, FIRST_SEEN_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
    REPLAYED_HEADER, SOURCE_QUEUE_HEADER,
};
use crate::error::Error;
use crate::hop::Destination;
use crate::hops::SlipDestinations;
use crate::retry::{rung_name, Decision, RetryPolicy};
use crate::set_aside::{publish_held, OnNoRoute};
use crate::topology::{self, DLX};

/// The longest `x-acemq-error` written: a huge error must not push a message
/// over `frame_max`.
pub const MAX_ERROR_TEXT: usize = 16 * 1024;

/// A message as a handler sees it.
#[derive(Debug, Clone)]
pub struct Message<T> {
    /// The decoded payload.
    pub payload: T,
    /// The envelope. Its `attempt` counts every earlier handler call and
    /// every broker redelivery once: the attempt written on the message
    /// (retries write it advanced), plus, for a copy the broker delivered
    /// before, a quorum queue's `x-delivery-count`, or one where the queue
    /// keeps no count (a classic queue's redeliveries of one copy count as
    /// one). A handler that panics has made an attempt. Headers of another
    /// type or out of range are read as absent (see [`Envelope::read_from`]).
    pub envelope: Envelope,
    /// Whether the broker delivered this copy before.
    pub redelivered: bool,
    /// The exchange it was published to.
    pub exchange: String,
    /// The routing key it was published with.
    pub routing_key: String,
    /// The queue it was consumed from.
    pub queue: String,
}

/// A running consumer. Dropping it leaves it running; [`Consumer::close`]
/// (or [`Conn::close`]) stops it gracefully. It rides through a recovery of
/// its connection: it is reattached with its tag, arguments and prefetch.
pub struct Consumer {
    queue: String,
    record: Arc<ConsumerRecord>,
    done: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("queue", &self.queue)
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl Consumer {
    /// The queue it consumes.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Stops consuming: cancels the consumer, returns deliveries that never
    /// reached a handler to the broker, lets running handlers finish and
    /// settle up to the drain timeout (an in-process retry wait cut short is
    /// republished with its attempt advanced), then closes the channel.
    ///
    /// Returns the error the consumer had already ended with, if it had.
    pub async fn close(self) -> Result<(), Error> {
        self.record.close(self.done).await
    }

    /// Waits until the consumer has ended, and says how: `Ok` once closed,
    /// or the error it ended with. Nothing ends quietly: a broker cancel
    /// with [`OnCancel::End`] ([`Error::ConsumerCancelled`] with the
    /// broker's reason), a connection lost without
    /// recovery ([`Error::Closed`]), a reattachment that failed or a
    /// recovery that gave up.
    pub async fn closed(&self) -> Result<(), Error> {
        self.record.closed().await
    }

    /// Whether the consumer has stopped (closed, or ended with an error).
    /// True as soon as it has said how it ended, which [`Conn::close`]
    /// waits for, even if its task has not quite returned yet.
    pub fn is_finished(&self) -> bool {
        self.done.is_finished() || self.record.ended.borrow().is_some()
    }
}

/// Starts building a consumer of `T` on `queue`; `.await` it (after setting
/// options) to start consuming.
///
/// ```no_run
/// # async fn demo(conn: acemq_core::Conn) -> Result<(), acemq_core::Error> {
/// use std::time::Duration;
/// use acemq_core::{consume, Ack, Message, RetryPolicy};
///
/// let consumer = consume(&conn, "orders", |m: Message<serde_json::Value>| async move {
///     println!("order {}", m.payload);
///     Ack::accept()
/// })
/// .prefetch(20)
/// .retry_with(RetryPolicy::exponential(5, Duration::from_secs(1), Duration::from_secs(60)))
/// .await?;
/// consumer.close().await?;
/// # Ok(()) }
/// ```
pub fn consume<T, F, Fut>(conn: &Conn, queue: &str, handler: F) -> ConsumerBuilder<T, F, Json>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ack> + Send + 'static,
{
    ConsumerBuilder {
        conn: conn.clone(),
        queue: queue.to_string(),
        handler,
        prefetch: 20,
        concurrency: None,
        retry: None,
        drain_timeout: Duration::from_secs(20),
        on_cancel: OnCancel::default(),
        arguments: FieldTable::new(),
        then: None,
        slips: None,
        dead_letter_to: None,
        codec: Json,
        _payload: PhantomData,
    }
}

/// Options of a consumer; `.await` starts it.
pub struct ConsumerBuilder<T, F, C> {
    conn: Conn,
    queue: String,
    handler: F,
    prefetch: u16,
    concurrency: Option<usize>,
    retry: Option<RetryPolicy>,
    drain_timeout: Duration,
    on_cancel: OnCancel,
    arguments: FieldTable,
    then: Option<Destination>,
    slips: Option<Arc<dyn SlipDestinations>>,
    dead_letter_to: Option<String>,
    codec: C,
    _payload: PhantomData<fn() -> T>,
}

impl<T, F, C> ConsumerBuilder<T, F, C> {
    /// Follows routing slips ([`crate::hops::RoutingSlip`]): an accepted
    /// message (or its `Ack::then` output) goes on to the next step of its
    /// slip, if `allow` accepts that step's exchange and routing key; a step
    /// it refuses is a fatal error of the message (set aside in `.dlq` with
    /// the reason). Without this, a consumer never publishes where a
    /// message's headers say: a message with a slip is handled and acked
    /// like any other, its slip header ignored (left as it is, not
    /// followed), since whoever published it wrote the slip.
    pub fn routing_slips(mut self, allow: impl SlipDestinations) -> Self {
        self.slips = Some(Arc::new(allow));
        self
    }

    /// Sets give-ups (exhausted retries, fatal errors, undecodable messages)
    /// aside in the service's own dead-letter `exchange`, as the queue's
    /// `x-dead-letter-exchange` does for the broker's dead letters, instead
    /// of `{queue}.dlq` (which it then does not declare): a confirmed
    /// publish carrying `x-acemq-error` and the envelope, with the queue's
    /// `x-dead-letter-routing-key` if this `Conn` declared it with one, else
    /// the key the message was first published with. Not needed for a queue
    /// declared with [`crate::Topology::dead_letter_to`] on the same `Conn`:
    /// its consumers do this already. `Ack::park` still goes to
    /// `{queue}.parked`.
    pub fn dead_letter_to(mut self, exchange: &str) -> Self {
        self.dead_letter_to = Some(exchange.to_string());
        self
    }

    /// Where the outputs of [`Ack::then`] go: `publisher`'s exchange and
    /// routing key (and its persistence). Each is a library hop (mandatory,
    /// confirmed), with a message-id derived from the input's and the hop's
    /// ([`crate::envelope::hop_id`]), the input's id as causation, its
    /// correlation, and attempt 1; the input is acked after the confirm. A
    /// hop that fails is a failure of the input, retried under its policy.
    pub fn then<O, C2>(mut self, publisher: &crate::Publisher<O, C2>) -> Self {
        self.then = Some(Destination {
            exchange: publisher.publish.exchange.to_string(),
            routing_key: publisher.publish.routing_key.to_string(),
            persistent: publisher.persistent,
        });
        self
    }

    pub(crate) fn then_to(mut self, destination: Destination) -> Self {
        self.then = Some(destination);
        self
    }

    /// An argument of `basic.consume`, e.g. `x-stream-offset` for a stream
    /// (`FieldValue::from("first")`, or an offset as `FieldValue::I64`) or
    /// `x-priority`. A consumer with `x-stream-offset` is tracked as a
    /// stream consumer: after a recovery it resumes at the oldest offset
    /// it was given and has not finished, or just after the newest.
    pub fn argument(mut self, name: &str, value: impl Into<FieldValue>) -> Self {
        self.arguments.insert(name, value.into());
        self
    }

    /// How many unacknowledged deliveries the broker sends ahead (20).
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch.max(1);
        self
    }

    /// How many handlers run at once (the prefetch by default).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = Some(concurrency.max(1));
        self
    }

    /// The retry policy for this consumer (instead of the connection's).
    pub fn retry_with(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// How long `close` lets running handlers finish (20 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// What the consumer does when the broker cancels it (its queue
    /// deleted) or closes its channel (e.g. 406 for a delivery not
    /// acknowledged within RabbitMQ's `consumer_timeout`): subscribe again
    /// ([`OnCancel::Resubscribe`], the default) or end
    /// ([`OnCancel::End`], the reason then in [`Consumer::closed`]).
    pub fn on_cancel(mut self, on_cancel: OnCancel) -> Self {
        self.on_cancel = on_cancel;
        self
    }

    /// Decodes payloads with another codec.
    pub fn with_codec<C2>(self, codec: C2) -> ConsumerBuilder<T, F, C2> {
        ConsumerBuilder {
            conn: self.conn,
            queue: self.queue,
            handler: self.handler,
            prefetch: self.prefetch,
            concurrency: self.concurrency,
            retry: self.retry,
            drain_timeout: self.drain_timeout,
            on_cancel: self.on_cancel,
            arguments: self.arguments,
            then: self.then,
            slips: self.slips,
            dead_letter_to: self.dead_letter_to,
            codec,
            _payload: PhantomData,
        }
    }
}

impl<T, F, Fut, C> IntoFuture for ConsumerBuilder<T, F, C>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ack> + Send + 'static,
    C: Codec,
{
    type Output = Result<Consumer, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<Consumer, Error>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.start())
    }
}

impl<T, F, Fut, C> ConsumerBuilder<T, F, C>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ack> + Send + 'static,
    C: Codec,
{
    async fn start(self) -> Result<Consumer, Error> {
        let policy = self
            .retry
            .or_else(|| self.conn.config().retry.clone())
            .unwrap_or_else(RetryPolicy::immediate);
        // The set-aside queues and the rungs, with Topology's arguments, so
        // either may come first; never the source queue's arguments. Not for
        // a server-named queue (`amq.gen-*`): RabbitMQ refuses names under
        // `amq.` to clients, and such a queue lives only as long as its
        // connection anyway.
        let declared = topology::declared_dead_letter_to(&self.conn.declared(), &self.queue);
        let dead_letter_to = match (self.dead_letter_to, declared) {
            (Some(exchange), declared) => {
                let key = declared.filter(|(x, _)| *x == exchange).and_then(|(_, key)| key);
                Some((exchange, key))
            }
            (None, declared) => declared,
        };
        if !self.queue.starts_with("amq.") {
            // With a dead-letter exchange of the service's own, no `.dlq`.
            let suffixes: &[&str] = match dead_letter_to {
                Some(_) => &["parked"],
                None => &["dlq", "parked"],
            };
            let mut declarations = topology::set_aside_queue_declarations(&self.queue, suffixes);
            declarations.extend(topology::rung_declarations(&self.queue, &policy));
            topology::apply(&self.conn, &declarations).await?;
            self.conn.record_declarations(&declarations);
        }

        let method = BasicConsume {
            queue: self.queue.as_str().into(),
            arguments: self.arguments,
            ..Default::default()
        };
        let stream = method.arguments.contains_key("x-stream-offset");
        let started = attached::start(&self.conn.inner, method, self.prefetch).await?;
        let record = started.record.clone();
        let shared = Arc::new(Shared {
            conn: self.conn.clone(),
            queue: self.queue.clone(),
            handler: self.handler,
            codec: self.codec,
            policy,
            handler_slots: Semaphore::new(self.concurrency.unwrap_or(usize::from(self.prefetch))),
            shutdown: started.shutdown.clone(),
            record: record.clone(),
            stream,
            then: self.then,
            slips: self.slips,
            dead_letter_to,
            inline: inline_waker(),
            _payload: PhantomData,
        });
        let done = started.on_cancel(self.on_cancel).spawn(
            self.conn.inner.clone(),
            self.queue.clone(),
            self.drain_timeout,
            move |tasks, delivery| spawn_delivery(&shared, tasks, delivery),
        );
        Ok(Consumer {
            queue: self.queue,
            record,
            done,
        })
    }
}

struct Shared<T, F, C> {
    conn: Conn,
    queue: String,
    handler: F,
    codec: C,
    policy: RetryPolicy,
    handler_slots: Semaphore,
    shutdown: watch::Receiver<bool>,
    record: Arc<ConsumerRecord>,
    /// Started with `x-stream-offset`: offsets are tracked for recovery.
    stream: bool,
    /// Where `Ack::then` outputs go.
    then: Option<Destination>,
    /// The routing slip steps it follows; `None`: slips are not followed.
    slips: Option<Arc<dyn SlipDestinations>>,
    /// The service's own dead-letter exchange and routing key (`None`: the
    /// message's), where give-ups go instead of `{queue}.dlq`.
    dead_letter_to: Option<(String, Option<String>)>,
    /// Set on a current-thread runtime: each delivery's work is first
    /// polled in the consumer's loop (see `spawn_delivery`).
    inline: Option<std::task::Waker>,
    _payload: PhantomData<fn() -> T>,
}

/// Starts the task of one delivery; a stream consumer notes its offset first.
fn spawn_delivery<T, F, Fut, C>(shared: &Arc<Shared<T, F, C>>, tasks: &mut JoinSet<()>, delivery: Delivery)
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ack> + Send + 'static,
    C: Codec,
{
    if shared.stream {
        if let Some(offset) = stream_offset(&delivery) {
            lock(&shared.record.stream).given(offset);
        }
    }
    let mut work = Box::pin(process(shared.clone(), delivery));
    if let Some(waker) = &shared.inline {
        // On a current-thread runtime a task of its own buys a delivery no
        // parallelism: it runs here until it first has to wait (most
        // handlers never do), and only then becomes a task, which polls it
        // again with its own waker.
        let mut cx = std::task::Context::from_waker(waker);
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.as_mut().poll(&mut cx)));
        match polled {
            Ok(std::task::Poll::Ready(())) => return,
            Ok(std::task::Poll::Pending) => {}
            Err(_) => {
                // As a panicked task would: the delivery stays unacknowledged.
                tracing::error!(queue = %shared.queue, "a delivery's work panicked; the broker redelivers it");
                return;
            }
        }
    }
    tasks.spawn(work);
}

/// A waker that does nothing: the first poll of a delivery's work made in
/// the consumer's own loop (see `spawn_delivery`), whose wake-ups the task
/// it then becomes takes over.
struct FirstPoll;

impl std::task::Wake for FirstPoll {
    fn wake(self: Arc<Self>) {}
}

/// The waker for first polls in the consumer's loop, when the runtime is
/// current-thread (elsewhere every delivery gets a task, for parallelism).
fn inline_waker() -> Option<std::task::Waker> {
    let flavor = tokio::runtime::Handle::try_current().ok()?.runtime_flavor();
    (flavor == tokio::runtime::RuntimeFlavor::CurrentThread).then(|| std::task::Waker::from(Arc::new(FirstPoll)))
}

/// The `x-stream-offset` header of a delivery from a stream.
pub(crate) fn stream_offset(delivery: &Delivery) -> Option<i64> {
    let properties = delivery.properties.as_ref().ok()?.view();
    properties.headers?.get("x-stream-offset")?.as_i64()
}

/// The broker's count of a quorum queue's redeliveries.
const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// The attempt a delivery is, from the attempt written on the message
/// (`written`, `x-acemq-attempt`: 1 on first publish) and what the broker
/// says of this copy. The rule, so that the attempt rises by exactly one
/// per handler call and per broker redelivery:
///
/// - Every republish the library makes (an in-process or rung retry, a
///   set-aside, a recovery's cut-short wait) writes the attempt of the call
///   it follows plus one, and never carries `x-delivery-count`: the copy it
///   makes is new to the broker, which has counted nothing of it.
/// - A copy the broker has not delivered before (`redelivered` false) adds
///   nothing, whatever `x-delivery-count` it carries: a count on such a
///   copy was written by whoever published it (another client republishing
///   a quorum delivery, or an older acemq), not by this queue.
/// - A copy delivered before adds the broker's count of its redeliveries:
///   a quorum queue's `x-delivery-count` (each return, nack or reject with
///   requeue, and each redelivery after a lost channel counts once; on
///   RabbitMQ 3.10 and 4.0 alike), or one when there is none (a classic
///   queue, or a quorum queue that did not say). A classic queue says only
///   that the copy was delivered before, not how often: there several
///   redeliveries of one copy count as one.
///
/// A count that is not a non-negative integer is read as absent.
pub(crate) fn delivered_attempt(written: u32, headers: &FieldTable, redelivered: bool) -> u32 {
    if !redelivered {
        return written;
    }
    let count = headers
        .get(DELIVERY_COUNT_HEADER)
        .and_then(FieldValue::as_i64)
        .and_then(|n| u32::try_from(n).ok());
    written.saturating_add(count.unwrap_or(0).max(1))
}

/// The parts of the envelope a retry decision needs.
struct RetryFacts {
    attempt: u32,
    first_seen: SystemTime,
    /// Whether the message carries a routing slip (an accept forwards it).
    slip: bool,
}

/// The envelope's id of a delivery, for the paths that republish it (made
/// again from the properties rather than kept from the envelope: an
/// accepted message never needs it).
pub(crate) fn id_of(delivery: &Delivery, properties: &BasicProperties) -> String {
    Envelope::id_of(&properties.view(), &delivery.body)
}

/// A panic in a handler, as an error for the retry policy.
#[derive(Debug)]
struct HandlerPanicked(String);

impl std::fmt::Display for HandlerPanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the handler panicked: {}", self.0)
    }
}

impl std::error::Error for HandlerPanicked {}

async fn process<T, F, Fut, C>(shared: Arc<Shared<T, F, C>>, delivery: Delivery)
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ack> + Send + 'static,
    C: Codec,
{
    let span = tracing::info_span!(
        "acemq.delivery",
        queue = %shared.queue,
        message_id = tracing::field::Empty,
        attempt = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    async move {
        let result = handle(&shared, &delivery).await;
        let name = match &result {
            Ok(name) => *name,
            Err(err) => {
                // A held publish gives up only when the consumer closes or
                // the delivery's connection is gone (see `set_aside.rs`), so
                // this is no hot loop: nothing is lost, the broker has it.
                tracing::error!(%err, "could not settle the message; returning it to the broker");
                let _ = settle_sent(&delivery, delivery.nack(true));
                "requeued"
            }
        };
        if shared.stream && result.is_ok() {
            if let Some(offset) = stream_offset(&delivery) {
                lock(&shared.record.stream).settled(offset);
            }
        }
        tracing::Span::current().record("outcome", name);
        if name != "requeued" {
            crate::metrics_names::handled(name);
        }
    }
    .instrument(span)
    .await
}

/// Runs one delivery to its end; returns the outcome's name. Each step is
/// one function: the properties and the body must decode (or the message
/// is set aside), a handler slot is taken (or the message goes back to the
/// broker when closing), the handler runs (a panic is a retry), and its
/// verdict is carried out.
async fn handle<T, F, Fut, C>(shared: &Shared<T, F, C>, delivery: &Delivery) -> Result<&'static str, Error>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ack> + Send + 'static,
    C: Codec,
{
    // Read straight from the received bytes; `BasicProperties` are built
    // only for what needs them (a retry, a set-aside, a hop).
    let properties = match &delivery.properties {
        Ok(p) => p,
        Err(raw) => {
            // Whatever can still be read goes with it (message-id,
            // correlation-id, timestamp...), so an operator can find it.
            let salvaged = raw.salvage();
            let reason = format!(
                "the message's properties could not be decoded: {} (not kept: {})",
                raw.error,
                salvaged.lost.join(", ")
            );
            return Box::pin(set_aside_undecodable(shared, delivery, &salvaged.properties, &reason)).await;
        }
    };
    let envelope = envelope_of(&properties.view(), delivery);
    // What a retry needs once the envelope has gone to the handler.
    let facts = RetryFacts {
        attempt: envelope.attempt,
        first_seen: envelope.first_seen,
        slip: shared.slips.is_some() && crate::hop::has_slip_in(&envelope.headers),
    };
    let payload: T = match shared.codec.decode(&delivery.body) {
        Ok(payload) => payload,
        Err(err) => {
            let reason = format!("the body could not be decoded: {err}");
            return Box::pin(set_aside_undecodable(shared, delivery, properties, &reason)).await;
        }
    };
    let Some(permit) = handler_slot(shared).await else {
        settle_sent(delivery, delivery.nack(true))?;
        return Ok("returned");
    };
    let message = Message {
        payload,
        envelope,
        redelivered: delivery.redelivered,
        exchange: crate::text::owned_lossy(delivery.exchange.as_bytes()),
        routing_key: crate::text::owned_lossy(delivery.routing_key.as_bytes()),
        queue: shared.queue.clone(),
    };
    let verdict = run_handler(&shared.handler, message).await;
    drop(permit);
    carry_out(shared, delivery, properties, &facts, verdict).await
}

/// The envelope as the handler sees it: the attempt counts redeliveries
/// (see [`delivered_attempt`]).
pub(crate) fn envelope_of(properties: &BasicPropertiesRef<'_>, delivery: &Delivery) -> Envelope {
    let mut envelope = Envelope::read_from_message_view(properties, &delivery.body);
    envelope.attempt = delivered_attempt(envelope.attempt, &envelope.headers, delivery.redelivered);
    let span = tracing::Span::current();
    span.record("message_id", envelope.id.as_str());
    span.record("attempt", envelope.attempt);
    envelope
}

/// A message that cannot reach a handler goes to the dlq at once.
async fn set_aside_undecodable<T, F, C>(
    shared: &Shared<T, F, C>,
    delivery: &Delivery,
    properties: &BasicProperties,
    reason: &str,
) -> Result<&'static str, Error> {
    set_aside(shared, delivery, properties, "dlq", reason).await?;
    settle_sent(delivery, delivery.ack())?;
    Ok("undecodable")
}

/// A handler slot, or `None` when the consumer starts closing first.
async fn handler_slot<T, F, C>(shared: &Shared<T, F, C>) -> Option<tokio::sync::SemaphorePermit<'_>> {
    if *shared.shutdown.borrow() {
        return None;
    }
    if let Ok(permit) = shared.handler_slots.try_acquire() {
        return Some(permit);
    }
    let mut shutdown = shared.shutdown.clone();
    tokio::select! {
        permit = shared.handler_slots.acquire() => permit.ok(),
        _ = shutdown.wait_for(|stop| *stop) => None,
    }
}

/// Runs the handler; a panic in it is caught and becomes a retry.
async fn run_handler<T, F, Fut>(handler: &F, message: Message<T>) -> Ack
where
    F: Fn(Message<T>) -> Fut,
    Fut: Future<Output = Ack>,
{
    let mut running = std::pin::pin!(handler(message));
    let caught = std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| running.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(ack)) => std::task::Poll::Ready(Ok(ack)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    })
    .await;
    caught.unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        Ack::Retry(Box::new(HandlerPanicked(text)))
    })
}

/// Carries out the handler's verdict.
async fn carry_out<T, F, C>(
    shared: &Shared<T, F, C>,
    delivery: &Delivery,
    // As received: built into `BasicProperties` only on the paths that
    // republish (an accept without a routing slip never builds them).
    properties: &acemq_codec::Properties,
    facts: &RetryFacts,
    verdict: Ack,
) -> Result<&'static str, Error> {
    match verdict {
        Ack::Accept if facts.slip => Box::pin(forward(shared, delivery, properties, facts, None)).await,
        Ack::Accept => {
            settle_sent(delivery, delivery.ack())?;
            Ok("accepted")
        }
        Ack::Then(output) => Box::pin(forward(shared, delivery, properties, facts, Some(output))).await,
        Ack::Park(reason) => {
            Box::pin(set_aside(shared, delivery, properties, "parked", &reason)).await?;
            settle_sent(delivery, delivery.ack())?;
            Ok("parked")
        }
        // Boxed, like the set-asides: the rare paths are kept out of the
        // future every delivery's task carries.
        Ack::Retry(err) => Box::pin(retry(shared, delivery, properties, facts, err)).await,
    }
}

/// An accepted message goes on: to the next step of its routing slip (with
/// the handler's output, if it gave one), or its `Ack::then` output to the
/// consumer's destination. A hop that fails is a failure of the input.
async fn forward<T, F, C>(
    shared: &Shared<T, F, C>,
    delivery: &Delivery,
    properties: &BasicProperties,
    facts: &RetryFacts,
    output: Option<crate::ack::Output>,
) -> Result<&'static str, Error> {
    let output = match output.map(|o| o.body.map(|body| (body, o.content_type))) {
        Some(Err(err)) => {
            let err = crate::fatal(format!("the handler's output could not be encoded: {err}"));
            return Box::pin(retry(shared, delivery, properties, facts, Box::new(err))).await;
        }
        Some(Ok(output)) => Some(output),
        None => None,
    };
    let slips = shared.slips.as_deref();
    let hop = match crate::hop::next_hop(
        properties,
        &id_of(delivery, properties),
        shared.then.as_ref(),
        output,
        slips,
    ) {
        Ok(Some(hop)) => hop,
        // The last step of a slip, and no output to send on.
        Ok(None) => {
            settle_sent(delivery, delivery.ack())?;
            return Ok("accepted");
        }
        Err(err) => return Box::pin(retry(shared, delivery, properties, facts, Box::new(err))).await,
    };
    let body = hop.body.clone().unwrap_or_else(|| delivery.body.clone());
    match hop.publish(&shared.conn, properties, body).await {
        Ok(()) => {
            settle_sent(delivery, delivery.ack())?;
            Ok("accepted")
        }
        Err(err) => Box::pin(retry(shared, delivery, properties, facts, Box::new(err))).await,
    }
}

async fn retry<T, F, C>(
    shared: &Shared<T, F, C>,
    delivery: &Delivery,
    properties: &BasicProperties,
    envelope: &RetryFacts,
    err: BoxError,
) -> Result<&'static str, Error> {
    let decision = shared
        .policy
        .decide(envelope.attempt, envelope.first_seen, err.as_ref(), SystemTime::now());
    // The republished copy: only built where a retry republishes.
    let next = || {
        hop_properties(
            properties,
            delivery,
            &shared.queue,
            envelope.attempt.saturating_add(1),
            None,
        )
    };
    let id = id_of(delivery, properties);
    match decision {
        Decision::DeadLetter { reason } => {
            set_aside(shared, delivery, properties, "dlq", &reason).await?;
            settle_sent(delivery, delivery.ack())?;
            Ok("dead_lettered")
        }
        Decision::WaitInProcess(wait) => {
            wait_unless_closing(shared, wait).await;
            republish(shared, delivery, &shared.queue, next(), &id, OnNoRoute::Wait).await?;
            settle_sent(delivery, delivery.ack())?;
            Ok("retried")
        }
        Decision::WaitInBroker(wait) => {
            let rung = rung_name(&shared.queue, wait);
            // A missing rung is declared again for the messages after this
            // one; this one spends its wait in the process.
            let again = topology::rung_declarations(&shared.queue, &shared.policy)
                .into_iter()
                .filter(|d| matches!(d, crate::declaration::Declaration::Queue { name, .. } if *name == rung))
                .collect::<Vec<_>>();
            match republish(
                shared,
                delivery,
                &rung,
                next(),
                &id,
                OnNoRoute::DeclareAndReturn(&again),
            )
            .await
            {
                Ok(()) => {}
                Err(Error::Unroutable { .. }) => {
                    metrics::counter!(crate::metrics_names::RUNG_MISSING_TOTAL).increment(1);
                    tracing::warn!(%rung, ?wait, "the rung queue is missing; waiting in the process instead");
                    wait_unless_closing(shared, wait).await;
                    republish(shared, delivery, &shared.queue, next(), &id, OnNoRoute::Wait).await?;
                }
                Err(other) => return Err(other),
            }
            settle_sent(delivery, delivery.ack())?;
            Ok("retried")
        }
    }
}

/// Sleeps `wait`, or less if the consumer starts closing: the message is then
/// republished at once, so nothing is lost or run twice.
async fn wait_unless_closing<T, F, C>(shared: &Shared<T, F, C>, wait: Duration) {
    let mut shutdown = shared.shutdown.clone();
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
}

/// The properties for a library hop: the original's, with the attempt
/// advanced, the original exchange and routing key recorded on the first
/// hop, and the error text (bounded) for set-asides; without the broker's
/// `x-delivery-count`, which belongs to the copy received, not to the new one
/// (see [`delivered_attempt`]).
pub(crate) fn hop_properties(
    original: &BasicProperties,
    delivery: &Delivery,
    queue: &str,
    attempt: u32,
    error: Option<&str>,
) -> BasicProperties {
    let mut props = original.clone();
    // A message from another publisher may come without an id or a first
    // seen (or with one that does not read): its hops carry the ones it was
    // read with, so they stay stable.
    let has_first_seen = original
        .headers
        .as_ref()
        .and_then(|h| h.get(FIRST_SEEN_HEADER))
        .and_then(|v| crate::envelope::time_of(v.as_i64()))
        .is_some();
    if original.message_id.is_none() || !has_first_seen {
        let read = Envelope::read_from_message(original, &delivery.body);
        if props.message_id.is_none() {
            props.message_id = Some(read.id.as_str().into());
        }
        if !has_first_seen {
            let secs = read
                .first_seen
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            props
                .headers
                .get_or_insert_with(FieldTable::new)
                .insert(FIRST_SEEN_HEADER, FieldValue::Timestamp(secs));
        }
    }
    let mut headers = props.headers.take().unwrap_or_default();
    let origin_recorded = carries_librarys_origin(&headers, delivery, queue);
    headers.remove(DELIVERY_COUNT_HEADER);
    headers.insert(
        ATTEMPT_HEADER,
        FieldValue::I32(i32::try_from(attempt).unwrap_or(i32::MAX)),
    );
    if !origin_recorded {
        headers.insert(
            ORIGINAL_EXCHANGE_HEADER,
            FieldValue::from(delivery.exchange.to_string()),
        );
        headers.insert(
            ORIGINAL_ROUTING_KEY_HEADER,
            FieldValue::from(delivery.routing_key.to_string()),
        );
    }
    if let Some(error) = error {
        headers.insert(ERROR_HEADER, FieldValue::from(bounded(error)));
    }
    props.headers = Some(headers);
    props
}

/// Whether the `x-acemq-original-*` headers of a delivery were written by
/// acemq, so a hop keeps them: it came the way the library's own copies come
/// back to the queue (a retry, a rung, a replay into the queue: the default
/// exchange, routing key this queue) and as one (attempt 2 or more, or
/// replayed). Any other delivery is the message's first hop here: the
/// exchange and key it came through are recorded, whatever a producer wrote.
fn carries_librarys_origin(headers: &FieldTable, delivery: &Delivery, queue: &str) -> bool {
    let number = |key: &str| headers.get(key).and_then(FieldValue::as_i64).unwrap_or(0);
    headers.contains_key(ORIGINAL_EXCHANGE_HEADER)
        && headers.contains_key(ORIGINAL_ROUTING_KEY_HEADER)
        && delivery.exchange.as_bytes().is_empty()
        && delivery.routing_key.as_bytes() == queue.as_bytes()
        && (number(ATTEMPT_HEADER) >= 2 || number(REPLAYED_HEADER) >= 1)
}

/// At most [`MAX_ERROR_TEXT`] bytes, cut at a character boundary.
fn bounded(text: &str) -> String {
    let kept = crate::text::prefix_within(text, MAX_ERROR_TEXT);
    if kept.len() == text.len() {
        return text.to_string();
    }
    format!("{kept}…")
}

/// Republishes to `routing_key` on the default exchange (mandatory, on the
/// always-confirmed library channel), holding the delivery until the broker
/// has the copy (see [`crate::set_aside`]).
async fn republish<T, F, C>(
    shared: &Shared<T, F, C>,
    delivery: &Delivery,
    routing_key: &str,
    properties: BasicProperties,
    message_id: &str,
    on_no_route: OnNoRoute<'_>,
) -> Result<(), Error> {
    let publish = BasicPublish {
        exchange: ShortString::new(),
        routing_key: routing_key.into(),
        mandatory: true,
        ..Default::default()
    };
    let body = delivery.body.clone();
    publish_held(
        &shared.conn,
        delivery,
        &shared.shutdown,
        publish,
        properties,
        body,
        message_id,
        on_no_route,
    )
    .await
}

/// Sets a message aside in `{queue}.{suffix}` (`dlq` or `parked`) through
/// `acemq.dlx`, with the reason in `x-acemq-error` and the queue in
/// `x-acemq-source-queue`; a set-aside queue deleted since the consumer
/// started is declared again.
async fn set_aside<T, F, C>(
    shared: &Shared<T, F, C>,
    delivery: &Delivery,
    properties: &BasicProperties,
    suffix: &str,
    reason: &str,
) -> Result<(), Error> {
    // The attempt the handler saw (or would have seen), redeliveries counted.
    let attempt = envelope_of(&properties.view(), delivery).attempt;
    let mut props = hop_properties(properties, delivery, &shared.queue, attempt, Some(reason));
    props
        .headers
        .get_or_insert_with(FieldTable::new)
        .insert(SOURCE_QUEUE_HEADER, FieldValue::from(shared.queue.as_str()));
    let message_id = props.message_id.as_ref().map(|m| m.to_string()).unwrap_or_default();
    let (exchange, routing_key, again) = match &shared.dead_letter_to {
        // Give-ups to the service's own dead-letter exchange, as the broker
        // routes its dead letters there: the queue's dead-letter key, else
        // the key the message was first published with (recorded above).
        Some((exchange, key)) if suffix == "dlq" => {
            let first_key = props
                .headers
                .as_ref()
                .and_then(|h| h.get(ORIGINAL_ROUTING_KEY_HEADER))
                .and_then(FieldValue::as_str)
                .map(str::to_string);
            let key = key.clone().or(first_key).unwrap_or_default();
            // Its bindings are the service's: nothing to declare again.
            (exchange.clone(), key, Vec::new())
        }
        _ => (
            DLX.to_string(),
            format!("{}.{suffix}", shared.queue),
            topology::set_aside_queue_declarations(&shared.queue, &[suffix]),
        ),
    };
    let publish = BasicPublish {
        exchange: exchange.as_str().into(),
        routing_key: routing_key.as_str().into(),
        mandatory: true,
        ..Default::default()
    };
    let on_no_route = if again.is_empty() {
        OnNoRoute::Wait
    } else {
        OnNoRoute::Declare(&again)
    };
    tracing::info!(queue = %shared.queue, %message_id, suffix, %exchange, %routing_key, reason = %bounded(reason), "setting a message aside");
    publish_held(
        &shared.conn,
        delivery,
        &shared.shutdown,
        publish,
        props,
        delivery.body.clone(),
        &message_id,
        on_no_route,
    )
    .await
}
