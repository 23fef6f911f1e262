//! Request and reply over RabbitMQ's direct reply-to: [`Requester`] sends a
//! request and waits for its [`Reply`], and a handler answers with
//! [`crate::Ack::reply`] (published here by `send_reply`).
//!
//! A requester keeps one channel of the publishing connection, its
//! **reply channel**: in confirm mode, consuming the pseudo-queue
//! `amq.rabbitmq.reply-to` without acks, and publishing every request with
//! `reply-to: amq.rabbitmq.reply-to` (RabbitMQ accepts that name only on the
//! channel that consumes it, and rewrites it to a name of its own that the
//! replier publishes to). Each request has a correlation-id of its own; a
//! task reads the replies and hands each to the request waiting for its
//! correlation-id. A reply that no request waits for (unknown, late,
//! forged, a duplicate) is dropped.
//!
//! Must never: leave a waiter behind (a request that ends, by its reply, an
//! error, its timeout or its future being dropped, removes its own; the end
//! of its reply channel fails every request that waited on it); hand a
//! reply to a request other than the one whose correlation-id it carries;
//! or, on the handler's side, publish a reply anywhere but to a direct
//! reply-to name, or to a named queue the handler allowed (statements 34 and
//! 43 of `docs/statements.md`).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use acemq_codec::{BasicConsume, BasicProperties, BasicPublish, FieldTable, FieldValue, ShortString};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::ack::{BoxError, ReplyOutput};
use crate::amqp::{self, CloseReason, Confirmation, Delivery};
use crate::codec::{Codec, Json};
use crate::confirm::{await_confirm, ConfirmTimeouts};
use crate::conn::{lock, Conn};
use crate::envelope::{hop_id, Envelope, ATTEMPT_HEADER, CAUSATION_HEADER, FIRST_SEEN_HEADER};
use crate::error::{is_loss, Error};
use crate::publish::Flight;

/// The pseudo-queue a reply channel consumes, and the `reply-to` of its
/// requests.
pub const DIRECT_REPLY_TO: &str = "amq.rabbitmq.reply-to";
/// What the name RabbitMQ gives a reply channel starts with.
pub const DIRECT_REPLY_TO_PREFIX: &str = "amq.rabbitmq.reply-to.";

/// How long a request waits before trying again to open its reply channel
/// on a connection that turned out to be gone (the recovery has not yet
/// noticed the loss).
const REOPEN_PAUSE: Duration = Duration::from_millis(20);

impl Conn {
    /// A [`Requester`] of `Req` to `exchange` with `routing_key`, whose
    /// replies decode as `Resp`.
    ///
    /// ```no_run
    /// # async fn demo(conn: acemq_core::Conn) -> Result<(), acemq_core::Error> {
    /// use std::time::Duration;
    /// let prices = conn.requester::<String, u64>("", "prices");
    /// let reply = prices.request(&"ACME".to_string(), Duration::from_secs(5)).await?;
    /// println!("{}", reply.payload);
    /// # Ok(()) }
    /// ```
    pub fn requester<Req, Resp>(&self, exchange: &str, routing_key: &str) -> Requester<Req, Resp> {
        Requester {
            shared: Arc::new(Shared {
                conn: self.clone(),
                table: Mutex::new(Table::default()),
                session: tokio::sync::Mutex::new(None),
                prefix: Envelope::new().id,
                next: AtomicU64::new(0),
            }),
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            codec: Json,
            _types: PhantomData,
        }
    }
}

/// Sends requests of `Req` to one exchange and routing key and waits for
/// their replies, `Resp`, over direct reply-to (see [`Conn::requester`]).
/// Cloning it shares its reply channel; many requests can be in flight on
/// one requester at once.
///
/// A request is published mandatory and confirmed: one that reaches no
/// queue fails at once with [`Error::Unroutable`]. Its reply comes within
/// the timeout or the request fails with [`Error::RequestTimedOut`]; if the
/// reply channel closes first (a connection loss), it fails with
/// [`Error::ReplyChannelLost`], and the next request opens a new one once
/// the connection is back.
pub struct Requester<Req, Resp, C = Json> {
    shared: Arc<Shared>,
    exchange: String,
    routing_key: String,
    codec: C,
    _types: PhantomData<fn(&Req) -> Resp>,
}

impl<Req, Resp, C: Clone> Clone for Requester<Req, Resp, C> {
    fn clone(&self) -> Self {
        Requester {
            shared: self.shared.clone(),
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            codec: self.codec.clone(),
            _types: PhantomData,
        }
    }
}

impl<Req, Resp, C> Requester<Req, Resp, C> {
    /// How many requests wait for their reply at this moment (shared by
    /// the requester's clones).
    pub fn pending(&self) -> usize {
        lock(&self.shared.table).waiters.len()
    }
}

impl<Req, Resp, C> std::fmt::Debug for Requester<Req, Resp, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requester")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("pending", &self.pending())
            .finish()
    }
}

/// The reply to a request.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Reply<R> {
    /// The decoded body.
    pub payload: R,
    /// The correlation-id the request was sent with and the reply came with.
    pub correlation_id: String,
    /// The reply's properties, as received.
    pub properties: BasicProperties,
}

/// What a requester's requests and its reply task share.
struct Shared {
    conn: Conn,
    table: Mutex<Table>,
    /// The reply channel, opened by the first request and again after it
    /// closed.
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// Every correlation-id of this requester starts with it.
    prefix: String,
    next: AtomicU64,
}

/// The requests waiting for a reply, and which reply channel is live.
#[derive(Default)]
struct Table {
    waiters: HashMap<String, Waiter>,
    /// The number of the reply channel replies can still come on.
    live: Option<u64>,
    /// The number the next reply channel gets.
    sessions: u64,
}

struct Waiter {
    session: u64,
    tx: oneshot::Sender<Result<Arrived, Error>>,
}

/// A reply as it arrived, decoded by the request that waited for it.
struct Arrived {
    properties: BasicProperties,
    body: Bytes,
}

/// One reply channel and the task reading its replies.
struct Session {
    id: u64,
    channel: amqp::Channel,
    reader: tokio::task::AbortHandle,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
        let channel = self.channel.clone();
        if channel.is_open() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = channel.close().await;
                });
            }
        }
    }
}

/// Removes its request's waiter when the request ends, however it ends.
struct Waiting<'a> {
    shared: &'a Shared,
    correlation_id: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.shared.table).waiters.remove(self.correlation_id);
    }
}

impl<Req: Serialize, Resp: DeserializeOwned, C: Codec> Requester<Req, Resp, C> {
    /// Encodes requests and decodes replies with another codec.
    pub fn with_codec<C2: Codec>(self, codec: C2) -> Requester<Req, Resp, C2> {
        Requester {
            shared: self.shared,
            exchange: self.exchange,
            routing_key: self.routing_key,
            codec,
            _types: PhantomData,
        }
    }

    /// Sends `payload` and waits at most `timeout` for its reply.
    ///
    /// Errors: [`Error::PublishingPaused`] at once while the broker blocks
    /// the publishing connection; [`Error::RequestTimedOut`] when no reply came in time (the
    /// request may still be handled; a reply that comes later is dropped);
    /// [`Error::Unroutable`] or [`Error::Nacked`] at once when the broker
    /// does not take the request; [`Error::ReplyChannelLost`] when the reply
    /// channel closed first; [`Error::Decode`] for a reply that does not
    /// decode. Dropping the future gives the request up the same way as a
    /// timeout.
    pub async fn request(&self, payload: &Req, timeout: Duration) -> Result<Reply<Resp>, Error> {
        let body = self.codec.encode(payload).map_err(Error::Encode)?;
        let n = self.shared.next.fetch_add(1, Ordering::Relaxed);
        let correlation_id = format!("{}.{n}", self.shared.prefix);
        // A timeout too long for the clock (`Duration::MAX`) waits a
        // century instead.
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        match tokio::time::timeout_at(deadline, self.exchange(Bytes::from(body), &correlation_id, deadline)).await {
            Ok(result) => result,
            Err(_) => Err(Error::RequestTimedOut {
                correlation_id,
                waited: timeout,
            }),
        }
    }

    async fn exchange(&self, body: Bytes, correlation_id: &str, deadline: Instant) -> Result<Reply<Resp>, Error> {
        // As a publisher's send: refused at once while the broker blocks.
        if let Some(reason) = self.shared.conn.inner.publishing.blocked_reason() {
            return Err(Error::PublishingPaused { reason });
        }
        let session = self.shared.session(deadline).await?;
        let (tx, rx) = oneshot::channel();
        let _waiting = self.shared.wait_for(&session, correlation_id, tx)?;
        let envelope = Envelope::new().with_correlation_id(correlation_id);
        let mut properties = BasicProperties {
            content_type: Some(self.codec.content_type().into()),
            delivery_mode: Some(1),
            reply_to: Some(DIRECT_REPLY_TO.into()),
            timestamp: Some(crate::hop::now_secs()),
            ..Default::default()
        };
        envelope.write_to(&mut properties);
        let lost = |err: Error| {
            if is_loss(&err) {
                Error::ReplyChannelLost {
                    correlation_id: correlation_id.to_string(),
                    reason: err.to_string(),
                }
            } else {
                err
            }
        };
        let confirm = session
            .channel
            .publish(&self.exchange, &self.routing_key, true, properties, body)
            .await
            .map_err(|e| lost(e.into()))?;
        match confirm.await.map_err(|e| lost(e.into()))? {
            Confirmation::Ack | Confirmation::NotRequested => {}
            Confirmation::Nack => {
                return Err(Error::Nacked {
                    message_id: envelope.id,
                })
            }
            Confirmation::Returned(ret) => {
                return Err(Error::Unroutable {
                    message_id: envelope.id,
                    exchange: self.exchange.clone(),
                    routing_key: self.routing_key.clone(),
                    code: ret.reply_code,
                    text: crate::text::owned_lossy(ret.reply_text.as_bytes()),
                })
            }
        }
        let arrived = rx.await.map_err(|_| Error::ReplyChannelLost {
            correlation_id: correlation_id.to_string(),
            reason: "the requester's reply task ended".into(),
        })??;
        let payload = self.codec.decode(&arrived.body).map_err(Error::Decode)?;
        Ok(Reply {
            payload,
            correlation_id: correlation_id.to_string(),
            properties: arrived.properties,
        })
    }
}

impl Shared {
    /// The live reply channel, opened (on the publishing connection, once
    /// it is up) if there is none.
    async fn session(self: &Arc<Self>, deadline: Instant) -> Result<Arc<Session>, Error> {
        let mut slot = self.session.lock().await;
        if let Some(session) = slot.as_ref() {
            if session.channel.is_open() && lock(&self.table).live == Some(session.id) {
                return Ok(session.clone());
            }
        }
        *slot = None;
        loop {
            let (connection, _) = self.conn.inner.publishing.connection(deadline, false).await?;
            match self.open(&connection).await {
                Ok(session) => {
                    let session = Arc::new(session);
                    *slot = Some(session.clone());
                    return Ok(session);
                }
                // The connection went away before the link knew it: wait
                // for the recovery (bounded by the request's timeout).
                Err(err) if is_loss(&err) => tokio::time::sleep(REOPEN_PAUSE).await,
                Err(err) => return Err(err),
            }
        }
    }

    async fn open(self: &Arc<Self>, connection: &amqp::Connection) -> Result<Session, Error> {
        let channel = connection.channel().await?;
        let opened = async {
            channel.confirm_select().await?;
            channel
                .basic_consume(BasicConsume {
                    queue: DIRECT_REPLY_TO.into(),
                    no_ack: true,
                    ..Default::default()
                })
                .await
        }
        .await;
        let consumer = match opened {
            Ok(consumer) => consumer,
            Err(err) => {
                let _ = channel.close().await;
                return Err(err.into());
            }
        };
        let id = {
            let mut table = lock(&self.table);
            table.sessions += 1;
            table.live = Some(table.sessions);
            table.sessions
        };
        let reader = tokio::spawn(read_replies(Arc::downgrade(self), id, consumer)).abort_handle();
        Ok(Session { id, channel, reader })
    }

    /// Registers a request's waiter on `session`, unless that reply channel
    /// has already closed.
    fn wait_for<'a>(
        &'a self,
        session: &Session,
        correlation_id: &'a str,
        tx: oneshot::Sender<Result<Arrived, Error>>,
    ) -> Result<Waiting<'a>, Error> {
        let mut table = lock(&self.table);
        if table.live != Some(session.id) {
            return Err(Error::ReplyChannelLost {
                correlation_id: correlation_id.to_string(),
                reason: "the reply channel closed".into(),
            });
        }
        table.waiters.insert(
            correlation_id.to_string(),
            Waiter {
                session: session.id,
                tx,
            },
        );
        Ok(Waiting {
            shared: self,
            correlation_id,
        })
    }

    /// Hands a reply to the request waiting for its correlation-id, if one
    /// does on this reply channel; drops it otherwise.
    fn dispatch(&self, session: u64, delivery: Delivery) {
        let Ok(properties) = &delivery.properties else {
            tracing::warn!("dropped a reply whose properties could not be decoded");
            return;
        };
        let view = properties.view();
        let Some(correlation_id) = view.correlation_id.and_then(|c| std::str::from_utf8(c).ok()) else {
            tracing::debug!("dropped a reply without a readable correlation-id");
            return;
        };
        let waiter = {
            let mut table = lock(&self.table);
            match table.waiters.get(correlation_id) {
                Some(waiter) if waiter.session == session => table.waiters.remove(correlation_id),
                _ => None,
            }
        };
        let Some(waiter) = waiter else {
            tracing::debug!(correlation_id, "dropped a reply no request waits for");
            return;
        };
        let arrived = Arrived {
            properties: BasicProperties::clone(properties),
            body: delivery.body,
        };
        let _ = waiter.tx.send(Ok(arrived));
    }

    /// The reply channel `session` closed: every request waiting on it fails.
    fn session_lost(&self, session: u64, reason: &str) {
        let lost: Vec<(String, Waiter)> = {
            let mut table = lock(&self.table);
            if table.live == Some(session) {
                table.live = None;
            }
            let ids: Vec<String> = table
                .waiters
                .iter()
                .filter(|(_, w)| w.session == session)
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| table.waiters.remove(&id).map(|w| (id, w)))
                .collect()
        };
        for (correlation_id, waiter) in lost {
            let _ = waiter.tx.send(Err(Error::ReplyChannelLost {
                correlation_id,
                reason: reason.to_string(),
            }));
        }
    }
}

/// The task of one reply channel: hands each reply on until the channel
/// closes, then fails the requests still waiting on it.
async fn read_replies(shared: Weak<Shared>, session: u64, mut consumer: amqp::Consumer) {
    while let Some(delivery) = consumer.next().await {
        let Some(shared) = shared.upgrade() else { return };
        shared.dispatch(session, delivery);
    }
    let channel = consumer.channel();
    let reason = match channel.close_error() {
        Some(err) => format!("the reply channel closed: {err}"),
        None => match channel.connection().close_reason() {
            Some(reason) => format!("the connection closed: {reason}"),
            None => "the reply consumer ended".to_string(),
        },
    };
    if let Some(shared) = shared.upgrade() {
        shared.session_lost(session, &reason);
    }
}

/// Where a reply to `request` may go: its `reply-to`, if it is a direct
/// reply-to name, or a queue name `named` allows. The error says why not.
fn reply_destination(
    request: &BasicProperties,
    named: Option<&(dyn Fn(&str) -> bool + Send + Sync)>,
) -> Result<(String, bool), String> {
    let Some(reply_to) = request.reply_to.as_ref() else {
        return Err("the request has no reply-to, so the reply has nowhere to go".into());
    };
    let Some(reply_to) = reply_to.as_str() else {
        return Err("the request's reply-to is not UTF-8".into());
    };
    if let Some(suffix) = reply_to.strip_prefix(DIRECT_REPLY_TO_PREFIX) {
        if is_reply_suffix(suffix) {
            return Ok((reply_to.to_string(), false));
        }
        return Err(format!(
            "the request's reply-to {reply_to:?} is not a reply name as RabbitMQ writes them \
             (a reply to it could make the broker close the connection)"
        ));
    }
    match named {
        Some(allow) if allow(reply_to) => Ok((reply_to.to_string(), true)),
        Some(_) => Err(format!(
            "the request's reply-to {reply_to:?} is not a direct reply-to name, nor a queue this handler's reply allows"
        )),
        None => Err(format!(
            "the request's reply-to {reply_to:?} is not a direct reply-to name (amq.rabbitmq.reply-to.*); \
             a reply goes to a named queue only with Ack::reply_named"
        )),
    }
}

/// Whether `suffix` (after `amq.rabbitmq.reply-to.`) is laid out as
/// RabbitMQ lays out its reply names: base64 of a process id (the Erlang
/// term of a pid on a node `reply@<hash>`), a dot, a base64 key. RabbitMQ
/// 3.10 and 4.0 crash the publishing channel's process, closing its whole
/// connection with 541 INTERNAL_ERROR, on a reply to a name of two parts
/// that does not decode so (statement 38).
fn is_reply_suffix(suffix: &str) -> bool {
    let Some((pid, key)) = suffix.split_once('.') else {
        return false;
    };
    let base64 = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=')
    };
    if !base64(key) {
        return false;
    }
    let Ok(bytes) = STANDARD.decode(pid) else { return false };
    // 131 (term), 88 (new pid), 118 (atom), its length, the node, then
    // id, serial and creation (4 bytes each).
    let Some(([131, 88, 118, hi, lo], rest)) = bytes.split_first_chunk::<5>() else {
        return false;
    };
    let len = usize::from(u16::from_be_bytes([*hi, *lo]));
    if rest.len() != len + 12 {
        return false;
    }
    match rest[..len].strip_prefix(b"reply@") {
        Some(hash) => !hash.is_empty() && hash.len() <= 10 && hash.iter().all(u8::is_ascii_digit),
        None => false,
    }
}

/// Publishes a handler's reply to `request` (a library publish: confirmed),
/// to the default exchange with the request's `reply-to` as routing key and
/// its correlation-id. A reply that cannot go (no allowed `reply-to`, an
/// output that does not encode) is a fatal error of the request; a reply to
/// a named queue that is gone is dropped (the requester is gone).
pub(crate) async fn send_reply(
    conn: &Conn,
    request: &BasicProperties,
    request_id: &str,
    reply: ReplyOutput,
) -> Result<(), BoxError> {
    let body = reply
        .output
        .body
        .map_err(|err| crate::fatal(format!("the handler's reply could not be encoded: {err}")))?;
    let (routing_key, named) = reply_destination(request, reply.named.as_deref()).map_err(crate::fatal)?;
    let message_id = hop_id(request_id, "reply");
    let mut headers = FieldTable::new();
    headers.insert(ATTEMPT_HEADER, FieldValue::I32(1));
    headers.insert(FIRST_SEEN_HEADER, FieldValue::Timestamp(crate::hop::now_secs()));
    headers.insert(CAUSATION_HEADER, FieldValue::from(request_id));
    let properties = BasicProperties {
        content_type: Some(reply.output.content_type.as_str().into()),
        delivery_mode: Some(1),
        timestamp: Some(crate::hop::now_secs()),
        message_id: Some(message_id.as_str().into()),
        correlation_id: request.correlation_id.clone(),
        headers: Some(headers),
        ..Default::default()
    };
    // Mandatory only to a named queue: RabbitMQ returns every mandatory
    // publish to a direct reply-to name, delivered or not (statement 38).
    let publish = BasicPublish {
        exchange: ShortString::new(),
        routing_key: routing_key.as_str().into(),
        mandatory: named,
        ..Default::default()
    };
    // Written once, not again after a loss as other library publishes are:
    // a reply the broker closed the connection over would close the next
    // one too (statement 38), and a requester's reply channel does not
    // outlive a loss of its own connection anyway.
    conn.wait_unblocked().await?;
    let pending = Flight::library(publish, properties, body).write(conn, false).await?;
    let mut blocked = pending.blocked_changes();
    let timeouts = ConfirmTimeouts::of(&conn.inner.config);
    match await_confirm(pending, &mut blocked, timeouts, &message_id).await {
        Ok(Confirmation::Ack | Confirmation::NotRequested) => Ok(()),
        Ok(Confirmation::Returned(_)) => {
            tracing::info!(%routing_key, request_id, "the reply queue is gone; the reply is dropped");
            Ok(())
        }
        Ok(Confirmation::Nack) => Err(Box::new(Error::Nacked { message_id })),
        Err(Error::Closed(CloseReason::ByServer(refusal))) if refusal.code == INTERNAL_ERROR => {
            Err(Box::new(crate::fatal(format!(
                "the broker closed the publishing connection ({} {}) on the reply to {routing_key:?}",
                refusal.code, refusal.text
            ))))
        }
        Err(err) => Err(Box::new(err)),
    }
}

/// The reply code RabbitMQ closes a connection with when a channel's
/// process crashes.
const INTERNAL_ERROR: u16 = 541;

#[cfg(test)]
mod tests {
    use super::*;

    fn with_reply_to(reply_to: Option<&[u8]>) -> BasicProperties {
        BasicProperties {
            reply_to: reply_to.map(|r| ShortString::from_bytes(Bytes::copy_from_slice(r)).expect("short")),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_direct_reply_to_name_is_a_destination_unless_named_queues_are_allowed() {
        // As RabbitMQ 3.10 wrote one.
        let name = "amq.rabbitmq.reply-to.g1h2AA5yZXBseUA3MDE4MjY5MgAADWcAAAAAaxX3eg==.yAUVznGzuQRnlSje31NvIg==";
        let direct = with_reply_to(Some(name.as_bytes()));
        assert_eq!(reply_destination(&direct, None), Ok((name.into(), false)));
        for refused in [
            None,
            Some(&b"orders"[..]),
            Some(b"amq.rabbitmq.reply-to"),
            Some(b"amq.rabbitmq.reply-to."),
            Some(b"\xff\xfe"),
            Some(b"amq.rabbitmq.reply-to.x.y"),
            Some(b"amq.rabbitmq.reply-to.AAAA.AAAA"),
            Some(b"amq.rabbitmq.reply-to.g2QAA2Zvbw==.AAAA"),
            Some(b"amq.rabbitmq.reply-to.B1h2AA5yZXBseUA3MDE4MjY5MgAADWcAAAAAaxX3eg==.yAUVznGzuQRnlSje31NvIg=="),
            Some(b"amq.rabbitmq.reply-to.g1h2AA5yZXBseUA3MDE4MjY5MgAADWcAAAAAaxX3eg==.yAUV.znGz"),
        ] {
            assert!(reply_destination(&with_reply_to(refused), None).is_err(), "{refused:?}");
        }
        let allow = |q: &str| q.starts_with("replies.");
        assert_eq!(
            reply_destination(&with_reply_to(Some(b"replies.a")), Some(&allow)),
            Ok(("replies.a".into(), true))
        );
        assert!(reply_destination(&with_reply_to(Some(b"orders")), Some(&allow)).is_err());
    }
}
