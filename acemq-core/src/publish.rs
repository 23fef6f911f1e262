//! `Publisher<T>`: typed publishing with confirms by default, mandatory
//! errors that name the message, and `connection.blocked` handled as the
//! seed describes: a publish made while blocked is refused at once; one
//! already written waits at most `blocked_timeout` of continuous block.

use std::marker::PhantomData;
use std::pin::pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use amqp_codec::{BasicProperties, BasicPublish, ShortString};
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::amqp::{Confirmation, PublishConfirm};
use crate::codec::{Codec, Json};
use crate::conn::Conn;
use crate::envelope::Envelope;
use crate::error::Error;
use crate::metrics_names;

/// What the broker said about a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendResult {
    /// The broker has the message (false without confirms: nothing was promised).
    pub confirmed: bool,
    /// It reached a queue. Meaningful with `mandatory`; always true without
    /// confirms, because only the confirm proves no return is coming.
    pub routed: bool,
}

/// Publishes `T` to one exchange and routing key.
pub struct Publisher<T, C = Json> {
    conn: Conn,
    exchange: ShortString,
    routing_key: ShortString,
    mandatory: bool,
    persistent: bool,
    content_type: Option<ShortString>,
    codec: C,
    _payload: PhantomData<fn(&T)>,
}

impl<T, C: Clone> Clone for Publisher<T, C> {
    fn clone(&self) -> Self {
        Publisher {
            conn: self.conn.clone(),
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            mandatory: self.mandatory,
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
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("mandatory", &self.mandatory)
            .field("persistent", &self.persistent)
            .finish()
    }
}

impl<T: Serialize> Publisher<T, Json> {
    pub(crate) fn new(conn: Conn, exchange: &str, routing_key: &str) -> Self {
        Publisher {
            conn,
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            mandatory: false,
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
        self.mandatory = true;
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
            exchange: self.exchange,
            routing_key: self.routing_key,
            mandatory: self.mandatory,
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

    /// Sends a new message and says whether it was confirmed and routed. A
    /// mandatory message that reaches no queue is `routed: false` here, not
    /// an error.
    pub async fn send_result(&self, payload: &T) -> Result<SendResult, Error> {
        match self.publish(Envelope::new(), payload).await {
            Err(Error::Unroutable { .. }) => Ok(SendResult {
                confirmed: true,
                routed: false,
            }),
            other => other,
        }
    }

    /// Sends a message with this envelope (a replay keeps its id,
    /// first_seen, correlation and causation). Errors as [`Publisher::send`].
    pub async fn send_envelope(&self, envelope: Envelope, payload: &T) -> Result<(), Error> {
        self.publish(envelope, payload).await.map(|_| ())
    }

    async fn publish(&self, envelope: Envelope, payload: &T) -> Result<SendResult, Error> {
        let result = self.publish_inner(&envelope, payload).await;
        let outcome = outcome_label(&result);
        metrics_names::publish(outcome);
        match &result {
            Ok(_) => {
                tracing::debug!(message_id = %envelope.id, exchange = %self.exchange, routing_key = %self.routing_key, outcome, "published")
            }
            Err(err) => {
                tracing::warn!(message_id = %envelope.id, exchange = %self.exchange, routing_key = %self.routing_key, outcome, %err, "publish failed")
            }
        }
        result
    }

    async fn publish_inner(&self, envelope: &Envelope, payload: &T) -> Result<SendResult, Error> {
        let inner = &self.conn.inner;
        if let Some(reason) = inner.publishing.blocked_reason() {
            return Err(Error::PublishingPaused { reason });
        }
        let body = self.codec.encode(payload).map_err(|e| Error::Encode(e.0))?;
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
        let publish = BasicPublish {
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            mandatory: self.mandatory,
            ..Default::default()
        };
        let channel = inner.publish_channel.get().await?;
        let pending = channel.basic_publish(publish, properties, Bytes::from(body))?;
        if !inner.confirms {
            return Ok(SendResult {
                confirmed: false,
                routed: true,
            });
        }
        let blocked = inner.publishing.blocked_changes();
        let confirmation = await_confirm(pending, blocked, inner.config.blocked_timeout, &envelope.id).await?;
        settle(confirmation, &envelope.id, &self.exchange, &self.routing_key)
    }
}

/// The `outcome` label of `acemq_publish_total` for a publish's result.
pub(crate) fn outcome_label(result: &Result<SendResult, Error>) -> &'static str {
    match result {
        Ok(SendResult { confirmed: false, .. }) => "unconfirmed",
        Ok(_) => "confirmed",
        Err(Error::PublishingPaused { .. }) => "refused",
        Err(Error::Unroutable { .. }) => "unroutable",
        Err(Error::Nacked { .. }) => "nacked",
        Err(_) => "failed",
    }
}

/// What the broker's confirmation means for the sender: an ack is a
/// confirmed, routed send; a nack and a return are errors naming the message.
pub(crate) fn settle(
    confirmation: Confirmation,
    message_id: &str,
    exchange: &ShortString,
    routing_key: &ShortString,
) -> Result<SendResult, Error> {
    match confirmation {
        Confirmation::Ack => Ok(SendResult {
            confirmed: true,
            routed: true,
        }),
        Confirmation::Returned(ret) => Err(Error::Unroutable {
            message_id: message_id.to_string(),
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            code: ret.reply_code,
            text: ret.reply_text.to_string(),
        }),
        Confirmation::Nack => Err(Error::Nacked {
            message_id: message_id.to_string(),
        }),
        Confirmation::NotRequested => Ok(SendResult {
            confirmed: false,
            routed: true,
        }),
    }
}

/// Waits for a confirm; gives up with [`Error::ConnectionBlocked`] once the
/// connection has been blocked for `blocked_timeout` without a break.
pub(crate) async fn await_confirm(
    pending: PublishConfirm,
    mut blocked: watch::Receiver<Option<String>>,
    blocked_timeout: Duration,
    message_id: &str,
) -> Result<Confirmation, Error> {
    let mut pending = pin!(pending);
    let mut block_started: Option<Instant> = None;
    loop {
        let is_blocked = blocked.borrow_and_update().is_some();
        block_started = match (is_blocked, block_started) {
            (true, None) => Some(Instant::now()),
            (true, started) => started,
            (false, _) => None,
        };
        let deadline = block_started.map(|at| at + blocked_timeout);
        tokio::select! {
            result = &mut pending => return result.map_err(Error::from),
            changed = blocked.changed() => {
                if changed.is_err() {
                    // The connection is gone; the confirm future says how.
                    return pending.await.map_err(Error::from);
                }
            }
            _ = sleep_until(deadline) => {
                return Err(Error::ConnectionBlocked {
                    message_id: message_id.to_string(),
                    waited: blocked_timeout,
                });
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
