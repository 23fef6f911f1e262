//! `Publisher<T>`: typed publishing with confirms by default, mandatory
//! errors that name the message, and `connection.blocked` handled so that
//! a publish made while blocked is refused at once; one
//! already written waits at most `blocked_timeout` of continuous block, and
//! at most `publish_timeout` for a broker that does not confirm it.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq_codec::{BasicProperties, BasicPublish, ShortString};
use bytes::Bytes;
use serde::Serialize;
use tokio::time::Instant;
use tracing::Instrument;

use crate::amqp::{Confirmation, PublishConfirm};
use crate::codec::{Codec, Json};
use crate::confirm::{await_confirm, outcome_label, report, resolve, ConfirmTimeouts, SendResult};
use crate::conn::Conn;
use crate::envelope::Envelope;
use crate::error::{is_loss, Error};
use crate::properties::Outgoing;
use crate::trace;

/// A message on its way, kept whole so that it can be written again on the
/// new connection after a recovery, with the same message-id and attempt.
pub(crate) struct Flight {
    publish: Arc<BasicPublish>,
    properties: Arc<BasicProperties>,
    body: Bytes,
    /// On the library channel (always confirmed) or the application's.
    library: bool,
}

impl Flight {
    pub(crate) fn library(publish: BasicPublish, properties: BasicProperties, body: Bytes) -> Flight {
        Flight {
            publish: Arc::new(publish),
            properties: Arc::new(properties),
            body,
            library: true,
        }
    }

    /// Writes it on the channel of the moment, waiting through a recovery
    /// (at most `publish_timeout`); `written` says whether an earlier write
    /// may have arrived, for the error if the wait runs out.
    pub(crate) async fn write(&self, conn: &Conn, written: bool) -> Result<PublishConfirm, Error> {
        let inner = &conn.inner;
        let slot = if self.library {
            &inner.library_channel
        } else {
            &inner.publish_channel
        };
        if let Some(pending) = slot.publish_now(&self.publish, &self.properties, &self.body) {
            return Ok(pending);
        }
        // The channel is closed or the publish buffer full: wait (through a
        // recovery, for room), at most `publish_timeout`.
        let deadline = Instant::now() + inner.config.publish_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = match slot.get(&inner.publishing, left, written).await {
                Ok(channel) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let write = channel.publish_shared(&self.publish, &self.properties, &self.body);
                    match tokio::time::timeout(left, write).await {
                        Ok(written) => written.map_err(Error::from),
                        Err(_) if written => return Err(Error::ConnectionLost { may_have_arrived: true }),
                        Err(_) => {
                            return Err(Error::PublishBufferFull {
                                waited: inner.config.publish_timeout,
                            })
                        }
                    }
                }
                Err(err) => Err(err),
            };
            let err = match attempt {
                Ok(pending) => return Ok(pending),
                Err(err) => err,
            };
            if inner.config.without_recovery || !is_loss(&err) {
                return Err(err);
            }
            if Instant::now() >= deadline {
                return Err(Error::ConnectionLost {
                    may_have_arrived: written,
                });
            }
            // The connection died under us (perhaps one a recovery had just
            // made): once the supervisor has seen it, the slot waits for the
            // next recovery.
            tracing::debug!(%err, "the publishing connection failed under a send; trying again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the confirm of `pending` (or, with `None`, writes it again
    /// first); across a loss, writes it again and waits anew.
    async fn confirm_through_recovery(
        &self,
        conn: &Conn,
        mut pending: Option<PublishConfirm>,
        message_id: &str,
    ) -> Result<Confirmation, Error> {
        let inner = &conn.inner;
        loop {
            let confirm = match pending.take() {
                Some(confirm) => confirm,
                None => self.write(conn, true).await?,
            };
            let mut blocked = confirm.blocked_changes();
            match await_confirm(confirm, &mut blocked, ConfirmTimeouts::of(&inner.config), message_id).await {
                Err(err) if !inner.config.without_recovery && is_loss(&err) => {
                    tracing::debug!(message_id, %err, "the connection died before the confirm; writing the message again");
                }
                other => return other,
            }
        }
    }
}

impl Conn {
    /// Publishes raw bytes on the library's own channel, which is always
    /// confirmed, even on a connection without confirms: what acemq uses for
    /// retry and rung hops, set-asides and replays, and what you can use for
    /// a hop of your own that must not go unconfirmed. Returns once the
    /// broker has confirmed it; a nack or (with `mandatory`) a return is an
    /// error. The message id in `properties` names it in errors. It rides
    /// through a recovery as [`crate::Publisher::send`] does.
    pub async fn publish_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        properties: BasicProperties,
        body: Bytes,
    ) -> Result<(), Error> {
        let message_id = properties
            .message_id
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default();
        let publish = BasicPublish {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            mandatory,
            ..Default::default()
        };
        let result = self.publish_library(publish, properties, body, &message_id).await;
        crate::metrics_names::publish(outcome_label(result.as_ref()));
        result.map(|_| ())
    }

    /// A library hop. While the broker blocks publishing, it waits for the
    /// block to lift (the delivery it is for is held meanwhile, instead of
    /// going back to the broker and round again), at most `blocked_timeout`;
    /// then it fails with [`Error::PublishingPaused`].
    pub(crate) async fn publish_library(
        &self,
        publish: BasicPublish,
        properties: BasicProperties,
        body: Bytes,
        message_id: &str,
    ) -> Result<SendResult, Error> {
        self.write_library(publish, properties, body, message_id.to_owned())
            .await?
            .confirmed(self)
            .await
    }

    /// The first half of [`Conn::publish_library`]: waits out a block, then
    /// writes the message; [`LibraryWrite::confirmed`] is the second half.
    /// Several writes before their confirms keep a batch in flight.
    ///
    /// This is the one path of every library publish, where its trace
    /// context is written: a child of the current context, or of the one
    /// the message carries (see [`crate::trace`]).
    pub(crate) async fn write_library(
        &self,
        publish: BasicPublish,
        mut properties: BasicProperties,
        body: Bytes,
        message_id: String,
    ) -> Result<LibraryWrite, Error> {
        let span = trace::send_span(
            &publish.exchange,
            &publish.routing_key,
            &message_id,
            properties.correlation_id.as_ref().and_then(|c| c.as_str()),
        );
        let parent = trace::library_parent(&properties);
        if let Some(context) = trace::next(parent.as_ref(), !span.is_disabled()) {
            trace::inject(&mut properties, &context);
            trace::record_ids(&span, &context, parent.as_ref());
        }
        let written = async {
            self.wait_unblocked().await?;
            let flight = Flight::library(publish, properties, body);
            let pending = flight.write(self, false).await?;
            Ok::<_, Error>((flight, pending))
        }
        .instrument(span.clone())
        .await;
        let (flight, pending) = written.inspect_err(|err| {
            span.record("outcome", outcome_label(Err(err)));
        })?;
        Ok(LibraryWrite {
            flight,
            pending,
            message_id,
            span,
        })
    }

    /// Returns once the publishing connection is not blocked, or fails with
    /// [`Error::PublishingPaused`] after `blocked_timeout` of block.
    pub(crate) async fn wait_unblocked(&self) -> Result<(), Error> {
        let Some(reason) = self.inner.publishing.blocked_reason() else {
            return Ok(());
        };
        let mut blocked = self.inner.publishing.current().blocked_changes();
        let timeout = self.inner.config.blocked_timeout;
        let lifted = tokio::time::timeout(timeout, async {
            let _ = blocked.wait_for(Option::is_none).await;
        })
        .await;
        lifted.map_err(|_| Error::PublishingPaused { reason })
    }

    /// A publisher of `T` to `exchange` with `routing_key`, JSON-encoded,
    /// persistent, confirmed (unless the connection is without confirms).
    pub fn publisher<T: Serialize>(&self, exchange: &str, routing_key: &str) -> Publisher<T, Json> {
        Publisher::new(self.clone(), exchange, routing_key)
    }
}

/// A library publish written and not yet confirmed (from
/// [`Conn::write_library`]).
pub(crate) struct LibraryWrite {
    flight: Flight,
    pending: PublishConfirm,
    message_id: String,
    /// Its `send` span, which the confirm ends.
    span: tracing::Span,
}

impl LibraryWrite {
    /// Waits for the broker (writing the message again after a recovery):
    /// a nack, a return and a library channel without confirms are errors.
    pub(crate) async fn confirmed(self, conn: &Conn) -> Result<SendResult, Error> {
        let LibraryWrite {
            flight,
            pending,
            message_id,
            span,
        } = self;
        let result = async {
            let confirmation = flight
                .confirm_through_recovery(conn, Some(pending), &message_id)
                .await?;
            let (exchange, routing_key) = (&flight.publish.exchange, &flight.publish.routing_key);
            match resolve(confirmation, &message_id, exchange, routing_key)? {
                SendResult { confirmed: false, .. } => Err(Error::LibraryChannelUnconfirmed {
                    message_id: message_id.clone(),
                }),
                confirmed => Ok(confirmed),
            }
        }
        .instrument(span.clone())
        .await;
        span.record("outcome", outcome_label(result.as_ref()));
        result
    }
}

/// Publishes `T` to one exchange and routing key.
pub struct Publisher<T, C = Json> {
    pub(crate) conn: Conn,
    /// The `basic.publish` of every message (exchange, routing key,
    /// mandatory), built once and shared by the messages on their way.
    pub(crate) publish: Arc<BasicPublish>,
    pub(crate) persistent: bool,
    pub(crate) content_type: Option<ShortString>,
    pub(crate) codec: C,
    _payload: PhantomData<fn(&T)>,
}

impl<T, C: Clone> Clone for Publisher<T, C> {
    fn clone(&self) -> Self {
        Publisher {
            conn: self.conn.clone(),
            publish: self.publish.clone(),
            persistent: self.persistent,
            content_type: self.content_type.clone(),
            codec: self.codec.clone(),
            _payload: PhantomData,
        }
    }
}

impl<T, C> std::fmt::Debug for Publisher<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("exchange", &self.publish.exchange)
            .field("routing_key", &self.publish.routing_key)
            .field("mandatory", &self.publish.mandatory)
            .field("persistent", &self.persistent)
            .finish()
    }
}

impl<T: Serialize> Publisher<T, Json> {
    pub(crate) fn new(conn: Conn, exchange: &str, routing_key: &str) -> Self {
        Publisher {
            conn,
            publish: Arc::new(BasicPublish {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
                ..Default::default()
            }),
            persistent: true,
            content_type: None,
            codec: Json,
            _payload: PhantomData,
        }
    }
}

impl<T: Serialize, C: Codec> Publisher<T, C> {
    /// A message that reaches no queue is an error rather than a silent drop.
    pub fn mandatory(mut self) -> Self {
        self.publish = Arc::new(BasicPublish {
            mandatory: true,
            ..BasicPublish::clone(&self.publish)
        });
        self
    }

    /// Messages are not written to disk by the broker (delivery mode 1).
    pub fn transient(mut self) -> Self {
        self.persistent = false;
        self
    }

    /// Overrides the codec's `content-type`.
    pub fn content_type(mut self, content_type: &str) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// Encodes payloads with another codec.
    pub fn with_codec<C2: Codec>(self, codec: C2) -> Publisher<T, C2> {
        Publisher {
            conn: self.conn,
            publish: self.publish,
            persistent: self.persistent,
            content_type: self.content_type,
            codec,
            _payload: PhantomData,
        }
    }

    /// Sends a new message and returns once the broker has it. A nack, a
    /// mandatory message that reaches no queue, and a block are errors.
    pub async fn send(&self, payload: &T) -> Result<(), Error> {
        self.send_envelope(Envelope::new(), payload).await
    }

    /// Sends a new message with the properties `outgoing` sets (a routing
    /// key of its own, an expiration, a priority, reply-to, type, app-id,
    /// user headers, an envelope), otherwise as [`Publisher::send`]: the
    /// same confirms, envelope and errors. What the broker would refuse or
    /// misread is [`Error::InvalidProperties`], and nothing is sent.
    ///
    /// ```no_run
    /// # async fn demo(publisher: acemq_core::Publisher<u32>) -> Result<(), acemq_core::Error> {
    /// use std::time::Duration;
    /// use acemq_core::Outgoing;
    ///
    /// let outgoing = Outgoing::new()
    ///     .routing_key("eu.orders")
    ///     .priority(5)
    ///     .expiration(Duration::from_secs(30));
    /// publisher.send_with(&7, outgoing).await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_with(&self, payload: &T, outgoing: Outgoing) -> Result<(), Error> {
        self.begin_send_with(payload, outgoing)
            .await?
            .resolve()
            .await
            .map(|_| ())
    }

    /// [`Publisher::begin_send`] with the properties `outgoing` sets (see
    /// [`Publisher::send_with`]).
    pub async fn begin_send_with(&self, payload: &T, mut outgoing: Outgoing) -> Result<PendingSend, Error> {
        let envelope = outgoing.envelope.take().unwrap_or_default();
        self.begin(envelope, payload, Some(&outgoing)).await
    }

    /// Sends a new message and says whether it was confirmed and routed. A
    /// mandatory message that reaches no queue is `routed: false` here, not
    /// an error.
    pub async fn send_result(&self, payload: &T) -> Result<SendResult, Error> {
        self.begin(Envelope::new(), payload, None).await?.result().await
    }

    /// Sends a message with this envelope (a replay keeps its id,
    /// first_seen, correlation and causation). Errors as [`Publisher::send`].
    pub async fn send_envelope(&self, envelope: Envelope, payload: &T) -> Result<(), Error> {
        self.publish(envelope, payload).await.map(|_| ())
    }

    /// Hands a new message to the connection and returns once it is written
    /// (in order with every other send of this connection), without waiting
    /// for the broker. Awaiting the returned [`PendingSend`] gives what
    /// [`Publisher::send`] gives. This keeps many sends in flight from one
    /// task, as a window:
    ///
    /// ```no_run
    /// # async fn demo(publisher: acemq_core::Publisher<u64>) -> Result<(), acemq_core::Error> {
    /// let mut window = std::collections::VecDeque::new();
    /// for n in 0..10_000u64 {
    ///     if window.len() == 1000 {
    ///         let oldest: acemq_core::PendingSend = window.pop_front().unwrap();
    ///         oldest.await?;
    ///     }
    ///     window.push_back(publisher.begin_send(&n).await?);
    /// }
    /// for pending in window {
    ///     pending.await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A send refused before it is written (blocked connection, payload that
    /// does not encode, closed connection) is the error of this call.
    pub async fn begin_send(&self, payload: &T) -> Result<PendingSend, Error> {
        self.begin(Envelope::new(), payload, None).await
    }

    async fn publish(&self, envelope: Envelope, payload: &T) -> Result<SendResult, Error> {
        self.begin(envelope, payload, None).await?.resolve().await
    }

    /// Writes the message; a refusal here is counted and logged at once,
    /// the outcome of a written one when its [`PendingSend`] is resolved.
    async fn begin(&self, envelope: Envelope, payload: &T, outgoing: Option<&Outgoing>) -> Result<PendingSend, Error> {
        let publish = match outgoing.and_then(|o| o.routing_key.as_deref()) {
            Some(key) => Arc::new(BasicPublish {
                routing_key: ShortString::from(key),
                ..BasicPublish::clone(&self.publish)
            }),
            None => self.publish.clone(),
        };
        let span = trace::send_span(
            &publish.exchange,
            &publish.routing_key,
            &envelope.id,
            envelope.correlation_id.as_deref(),
        );
        let written = self
            .write(&envelope, payload, outgoing, &publish, &span)
            .instrument(span.clone())
            .await;
        let (flight, confirm) = match written {
            Ok(written) => written,
            Err(err) => {
                span.record("outcome", outcome_label(Err(&err)));
                report(Err(&err), &envelope.id, &publish.exchange, &publish.routing_key);
                return Err(err);
            }
        };
        let inner = &self.conn.inner;
        let confirm = inner.confirms.then_some(confirm);
        // Kept to be written again after a recovery; not needed when there
        // is no confirm to wait for, or no recovery.
        let resend = (confirm.is_some() && !inner.config.without_recovery).then(|| (self.conn.clone(), flight));
        Ok(PendingSend {
            confirm,
            resend,
            timeouts: ConfirmTimeouts::of(&inner.config),
            message_id: envelope.id,
            publish,
            span,
        })
    }

    /// Encodes and writes the message (waiting through a recovery); the
    /// message as written, and its confirm.
    async fn write(
        &self,
        envelope: &Envelope,
        payload: &T,
        outgoing: Option<&Outgoing>,
        publish: &Arc<BasicPublish>,
        span: &tracing::Span,
    ) -> Result<(Flight, PublishConfirm), Error> {
        let inner = &self.conn.inner;
        if let Some(outgoing) = outgoing {
            outgoing.check().map_err(Error::InvalidProperties)?;
        }
        if let Some(reason) = inner.publishing.blocked_reason() {
            return Err(Error::PublishingPaused { reason });
        }
        let parent = trace::TraceContext::current();
        let context = trace::next(parent.as_ref(), !span.is_disabled());
        let (mut properties, body) = self.properties_and_body(envelope, payload, context.as_ref())?;
        if let Some(context) = &context {
            trace::record_ids(span, context, parent.as_ref());
        }
        if let Some(outgoing) = outgoing {
            outgoing.write_to(&mut properties);
        }
        let flight = Flight {
            publish: publish.clone(),
            properties: Arc::new(properties),
            body,
            library: false,
        };
        let pending = flight.write(&self.conn, false).await?;
        Ok((flight, pending))
    }

    /// The message this publisher sends for `envelope` and `payload`: its
    /// publish method, properties (content-type, delivery mode, timestamp,
    /// the envelope) and encoded body. It carries a trace context when
    /// there is one to continue, or when `tracing` records acemq's spans
    /// (see [`crate::trace`]).
    #[cfg_attr(not(feature = "outbox"), allow(dead_code))]
    pub(crate) fn message(
        &self,
        envelope: &Envelope,
        payload: &T,
    ) -> Result<(Arc<BasicPublish>, BasicProperties, Bytes), Error> {
        let parent = trace::TraceContext::current();
        let context = trace::next(parent.as_ref(), trace::spans_enabled());
        let (properties, body) = self.properties_and_body(envelope, payload, context.as_ref())?;
        Ok((self.publish.clone(), properties, body))
    }

    /// The properties and encoded body of [`Publisher::message`], with
    /// `context` written in.
    fn properties_and_body(
        &self,
        envelope: &Envelope,
        payload: &T,
        context: Option<&trace::TraceContext>,
    ) -> Result<(BasicProperties, Bytes), Error> {
        let body = self.codec.encode(payload).map_err(Error::Encode)?;
        let mut properties = BasicProperties {
            content_type: Some(
                self.content_type
                    .clone()
                    .unwrap_or_else(|| self.codec.content_type().into()),
            ),
            delivery_mode: Some(if self.persistent { 2 } else { 1 }),
            timestamp: SystemTime::now().duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs()),
            ..Default::default()
        };
        envelope.write_to(&mut properties);
        if let Some(context) = context {
            trace::inject(&mut properties, context);
        }
        Ok((properties, Bytes::from(body)))
    }
}

/// A message written to the connection whose broker answer is still to
/// come; from [`Publisher::begin_send`]. Await it for what
/// [`Publisher::send`] returns, or call [`PendingSend::result`] for what
/// [`Publisher::send_result`] returns. Dropping it does not take the message
/// back: the broker still gets it, but nobody hears (and no counter records)
/// what became of it.
#[must_use = "the broker's answer is only known by awaiting it"]
pub struct PendingSend {
    /// `None` without confirms: nothing to wait for.
    confirm: Option<PublishConfirm>,
    /// The message, to write again if the connection dies before its
    /// confirm (with confirms and recovery on).
    resend: Option<(Conn, Flight)>,
    timeouts: ConfirmTimeouts,
    message_id: String,
    /// Its method: the exchange and routing key it was sent to.
    publish: Arc<BasicPublish>,
    /// Its `send` span (disabled unless `tracing` records it).
    span: tracing::Span,
}

impl std::fmt::Debug for PendingSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingSend")
            .field("message_id", &self.message_id)
            .field("exchange", &self.publish.exchange)
            .field("routing_key", &self.publish.routing_key)
            .finish()
    }
}

impl PendingSend {
    /// The id of the message (its `message-id`).
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Waits for the broker and says whether the message was confirmed and
    /// routed; a mandatory message that reached no queue is `routed: false`,
    /// as with [`Publisher::send_result`].
    pub async fn result(self) -> Result<SendResult, Error> {
        match self.resolve().await {
            Err(Error::Unroutable { .. }) => Ok(SendResult {
                confirmed: true,
                routed: false,
            }),
            other => other,
        }
    }

    /// Waits for the broker's answer (writing the message again after a
    /// recovery) and resolves the send by it.
    async fn resolve(mut self) -> Result<SendResult, Error> {
        let arrived = match (self.confirm.take(), &self.resend) {
            (None, None) => Ok(Confirmation::NotRequested),
            (confirm, Some((conn, flight))) => flight.confirm_through_recovery(conn, confirm, &self.message_id).await,
            (Some(confirm), None) => {
                let mut blocked = confirm.blocked_changes();
                await_confirm(confirm, &mut blocked, self.timeouts, &self.message_id).await
            }
        };
        self.conclude(arrived)
    }

    /// What the broker's answer means for the sender, counted and logged.
    fn conclude(&self, arrived: Result<Confirmation, Error>) -> Result<SendResult, Error> {
        let (exchange, routing_key) = (&self.publish.exchange, &self.publish.routing_key);
        let result = arrived.and_then(|confirmation| resolve(confirmation, &self.message_id, exchange, routing_key));
        report(result.as_ref(), &self.message_id, exchange, routing_key);
        if !self.span.is_disabled() {
            self.span.record("outcome", outcome_label(result.as_ref()));
        }
        result
    }
}

impl std::future::IntoFuture for PendingSend {
    type Output = Result<(), Error>;
    type IntoFuture = Resolving;

    fn into_future(self) -> Resolving {
        Resolving {
            pending: Some(self),
            waiting: None,
        }
    }
}

/// Awaiting a [`PendingSend`]: the future that resolves the send (acked,
/// nacked, returned or failed). A confirm that is already there resolves it
/// at once; only one still to come is waited for with the block watch.
#[must_use = "futures do nothing unless awaited"]
pub struct Resolving {
    pending: Option<PendingSend>,
    waiting: Option<BoxedResolve>,
}

type BoxedResolve = Pin<Box<dyn Future<Output = Result<SendResult, Error>> + Send>>;

impl std::fmt::Debug for Resolving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolving").field("pending", &self.pending).finish()
    }
}

impl Future for Resolving {
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(mut pending) = self.pending.take() {
            let arrived = match pending.confirm.as_mut() {
                Some(confirm) => match Pin::new(confirm).poll(cx) {
                    Poll::Ready(arrived) => Some(arrived.map_err(Error::from)),
                    Poll::Pending => None,
                },
                None => Some(Ok(Confirmation::NotRequested)),
            };
            match arrived {
                // The connection died before the confirm: written again
                // after the recovery, on the slow path.
                Some(Err(err)) if pending.resend.is_some() && is_loss(&err) => {
                    pending.confirm = None;
                    self.waiting = Some(Box::pin(pending.resolve()));
                }
                Some(arrived) => return Poll::Ready(pending.conclude(arrived).map(|_| ())),
                None => self.waiting = Some(Box::pin(pending.resolve())),
            }
        }
        match self.waiting.as_mut() {
            Some(waiting) => waiting.as_mut().poll(cx).map(|result| result.map(|_| ())),
            None => Poll::Ready(Err(Error::PolledAfterCompletion)),
        }
    }
}
