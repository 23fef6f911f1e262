//! Consuming: a handler per message, the attempt counter on the message,
//! retries as republishes, dead letters and parked messages, rungs, and a
//! close that finishes work instead of cutting it in half.
//!
//! Here is what a service sees: [`consume`], its [`ConsumerBuilder`], the
//! running [`Consumer`] and the [`Message`] a handler gets; `.await` on the
//! builder declares the consumer's set-aside queues and rungs, starts the
//! consumer task and hands it the per-delivery work. A delivery's path runs
//! one way, one file a step:
//!
//! - `task.rs`, the consumer task (every consumer a `Conn` records runs one,
//!   the `Scheduler`'s too): it receives deliveries and hands each over,
//!   rides through recoveries and broker cancels, and drains on close;
//! - `delivery.rs`, one delivery: decode, a handler slot, the handler, and
//!   its verdict carried out (an ack, a hop, a retry, a set-aside);
//! - `outcome.rs`, how it ended: the settlement sent, and the outcome
//!   counted in `acemq_handled_total`.
//!
//! Must never: ack a delivery before what its verdict publishes is
//! confirmed, lose a message on close (what no handler started on goes back
//! to the broker; an in-process retry wait cut short is republished), or
//! follow a routing slip for a consumer that did not opt in.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use acemq_codec::{BasicConsume, FieldTable, FieldValue};
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use crate::ack::Ack;
use crate::codec::{Codec, Json};
use crate::conn::Conn;
use crate::conn::ConsumerRecord;
use crate::envelope::Envelope;
use crate::error::Error;
use crate::hop::{Destination, SlipDestinations};
use crate::retry::RetryPolicy;
use crate::topology;

pub(crate) mod delivery;
pub(crate) mod outcome;
pub(crate) mod task;

pub use task::OnCancel;

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
    /// The properties it arrived with, typed (content type and encoding,
    /// delivery mode, priority, reply-to, expiration, timestamp, type,
    /// user-id, app-id, the headers); a value that is not what its property
    /// may hold reads as absent.
    pub properties: crate::properties::MessageProperties,
}

/// A running consumer. Dropping it leaves it running; [`Consumer::close`]
/// (or [`Conn::close`]) stops it gracefully. It rides through a recovery of
/// its connection: it is reattached with its tag, arguments and prefetch.
pub struct Consumer {
    queue: String,
    record: Arc<ConsumerRecord>,
    done: tokio::task::JoinHandle<()>,
    /// How long `pause` and `resume` wait.
    publish_timeout: Duration,
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

    /// Pauses the consumer without closing it: no handler starts from now
    /// on, handlers already running finish and settle as usual, and the
    /// broker stops sending. Returns once the broker has stopped (its
    /// answer to the `basic.cancel` came), or at once when there is no
    /// connection to stop; at most `publish_timeout`.
    ///
    /// Deliveries the broker had already sent and no handler had started
    /// are held, unacknowledged and in order, and handled first on
    /// [`Consumer::resume`]: handing them back would count as a redelivery
    /// (on a quorum queue the broker raises their `x-delivery-count`, so
    /// the attempt a handler sees would rise without a handler call, and a
    /// queue's delivery limit could drop them). The broker keeps them
    /// assigned to this consumer meanwhile (at most the prefetch). A pause
    /// longer than RabbitMQ's `consumer_timeout` makes the broker close the
    /// channel and take them back (one redelivery); the consumer then
    /// subscribes on a new channel when resumed, as after a broker cancel.
    /// acemq hands nothing back itself, but RabbitMQ (3.10 and 4.0) returns
    /// to a quorum queue a delivery that was on its way to the consumer
    /// when the cancel took effect: that one comes back as a redelivery,
    /// counted once, as any redelivery is.
    ///
    /// A paused consumer stays paused through a recovery of its connection
    /// (it is not subscribed on the new one; the messages it held are
    /// redelivered to whoever consumes), and through a broker cancel. A
    /// stream consumer resumes just after the newest offset it was given.
    /// Pausing a paused consumer does nothing; a `resume` that overtakes a
    /// `pause` ends its wait. [`Consumer::close`] works while paused: held
    /// deliveries go back to the broker.
    ///
    /// Why a `basic.cancel` and not flow control: RabbitMQ refuses a
    /// client's `channel.flow` with `active=false` (540 NOT_IMPLEMENTED,
    /// closing the connection), and a prefetch cannot be set to nothing
    /// (`basic.qos` 0 means no limit). Cancelling stops the broker on every
    /// queue type, while the channel stays open for the running handlers'
    /// acknowledgements.
    ///
    /// An error says the consumer has ended (its error, or [`Error::Closed`]
    /// after a close), or that the pause took longer than `publish_timeout`
    /// (the consumer pauses all the same).
    ///
    /// ```no_run
    /// # async fn demo(conn: acemq_core::Conn) -> Result<(), acemq_core::Error> {
    /// use acemq_core::{consume, Ack, Message};
    /// let consumer = consume(&conn, "orders", |m: Message<String>| async move {
    ///     println!("{}", m.payload);
    ///     Ack::accept()
    /// })
    /// .await?;
    /// // The payment service is down: stop taking orders, keep our place.
    /// consumer.pause().await?;
    /// // ... and back.
    /// consumer.resume().await?;
    /// # Ok(()) }
    /// ```
    pub async fn pause(&self) -> Result<(), Error> {
        self.record.pause_or_resume(true, self.publish_timeout).await
    }

    /// Resumes a paused consumer: the deliveries it held are handled first,
    /// then it subscribes again on its channel with its tag and arguments
    /// (a stream consumer just after the newest offset it was given).
    /// Returns once the broker has answered the subscription. During a
    /// recovery it waits for the connection, at most `publish_timeout`
    /// (then an error, and the consumer subscribes when the connection is
    /// back). If its queue went while it was paused, the broker refuses
    /// the subscription: that is handled as a broker cancel ([`OnCancel`]).
    /// Resuming a running consumer does nothing.
    pub async fn resume(&self) -> Result<(), Error> {
        self.record.pause_or_resume(false, self.publish_timeout).await
    }

    /// Whether the consumer is paused (asked to by [`Consumer::pause`] and
    /// not resumed since).
    pub fn is_paused(&self) -> bool {
        self.record.is_paused()
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
    /// Follows routing slips ([`crate::pipeline::RoutingSlip`]): an accepted
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
    /// (`FieldValue::from("first")`, or an offset as `FieldValue::I64`);
    /// for `x-priority` see [`ConsumerBuilder::priority`]. A consumer with
    /// `x-stream-offset` is tracked as a
    /// stream consumer: after a recovery it resumes at the oldest offset
    /// it was given and has not finished, or just after the newest.
    pub fn argument(mut self, name: &str, value: impl Into<FieldValue>) -> Self {
        self.arguments.insert(name, value.into());
        self
    }

    /// The consumer's priority on its queue (`x-priority` of
    /// `basic.consume`, 0 unless set; negative is allowed): while a
    /// consumer of higher priority has room in its prefetch, the broker
    /// sends only to it; consumers of equal priority take turns. With a
    /// single-active-consumer queue, the highest priority is the active one.
    pub fn priority(self, priority: i32) -> Self {
        self.argument("x-priority", FieldValue::I32(priority))
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
        let started = task::start(&self.conn.inner, method, self.prefetch).await?;
        let record = started.record.clone();
        let handling = Arc::new(delivery::Handling {
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
            inline: delivery::inline_waker(),
            _payload: PhantomData,
        });
        let done = started.on_cancel(self.on_cancel).spawn(
            self.conn.inner.clone(),
            self.queue.clone(),
            self.drain_timeout,
            move |tasks, received| delivery::spawn(&handling, tasks, received),
        );
        Ok(Consumer {
            queue: self.queue,
            record,
            done,
            publish_timeout: self.conn.config().publish_timeout,
        })
    }
}
