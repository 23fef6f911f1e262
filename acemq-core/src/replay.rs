//! Replay: moving messages of `{queue}.dlq` or `{queue}.parked` back into
//! `{queue}`, and reading those queues without consuming them.
//!
//! Where a replayed message goes:
//! - **by default, into its source queue** (through the default exchange,
//!   routing key the queue's name): `{queue}` for a message of `{queue}.dlq`
//!   or `{queue}.parked`; for a set-aside queue named otherwise (one bound
//!   to a `dead_letter_to` exchange), the queue recorded in the message
//!   (`x-acemq-source-queue`, which the consumer that set it aside writes,
//!   or the broker's newest `x-death` entry). Only the service that failed
//!   sees it again: sending it to the exchange it was first published to
//!   would deliver it again to every other queue bound there too, and those
//!   services would do their work twice.
//! - **with [`ReplayOptions::to_original`], to the exchange and routing key
//!   it was first published with** (`x-acemq-original-exchange` and
//!   `-routing-key`, which the consumer records from the delivery it
//!   received, overwriting a producer's own; or, for a message the broker
//!   dead-lettered itself, the oldest `x-death` entry's exchange and key).
//!
//! The scheduler's `acemq.delay.delivery.dlq` is the exception: its
//! messages go to the destination they were scheduled for (recorded as
//! their original exchange and key), since their source queue is the
//! scheduler's own.
//!
//! A dry run lists each message's destination without moving anything.
//!
//! A replay consumes the set-aside queue on a channel of its own, at most
//! the messages that were there when it started. Each message it can send
//! back is published, mandatory and confirmed on the library channel, with
//! the same message-id, correlation and causation, attempt 1, a fresh
//! first-seen, no `x-acemq-error` and `x-acemq-replayed` one more; only
//! after its confirm is the set-aside copy acked. What it cannot send
//! back stays unacked until the end and is then returned to the queue
//! (`basic.nack` with requeue), where RabbitMQ puts it back in its place.
//!
//! Reading without consuming ([`Conn::peek`]) works the same way: deliveries
//! are taken without acks and handed back when the channel closes, in
//! order; they are marked redelivered from then on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq_codec::{BasicConsume, BasicProperties, BasicPublish, ExchangeDeclare, FieldTable, FieldValue, QueueDeclare};
use bytes::Bytes;
use tokio::task::JoinSet;

use crate::amqp::{self, Delivery};
use crate::conn::Conn;
use crate::envelope::{
    Envelope, ATTEMPT_HEADER, ERROR_HEADER, FIRST_SEEN_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
    REPLAYED_HEADER, SOURCE_QUEUE_HEADER,
};
use crate::error::Error;

/// Chooses which set-aside messages a replay moves.
pub type ReplayFilter = Arc<dyn Fn(&SetAside) -> bool + Send + Sync>;

/// Hears how a replay is getting on, after every message.
pub type ReplayProgressFn = Arc<dyn Fn(ReplayProgress) + Send + Sync>;

/// How a replay runs.
#[derive(Clone, Default)]
pub struct ReplayOptions {
    /// At most this many messages are examined (all that are there when it
    /// starts, by default).
    pub limit: Option<usize>,
    /// Examine and report, move nothing.
    pub dry_run: bool,
    /// Only the messages this accepts are moved; the others stay.
    pub filter: Option<ReplayFilter>,
    /// Called after every message examined.
    pub progress: Option<ReplayProgressFn>,
    /// Sends each message to the exchange and routing key it was first
    /// published with, instead of into its source queue (see the module
    /// docs: every queue bound there gets it again).
    pub to_original: bool,
}

impl std::fmt::Debug for ReplayOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayOptions")
            .field("limit", &self.limit)
            .field("dry_run", &self.dry_run)
            .field("filter", &self.filter.is_some())
            .field("progress", &self.progress.is_some())
            .field("to_original", &self.to_original)
            .finish()
    }
}

/// Where a replay stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayProgress {
    /// Messages looked at so far.
    pub examined: usize,
    /// Sent back (in a dry run: that would be).
    pub replayed: usize,
    /// Left where they were.
    pub kept: usize,
    /// How many it will look at in all.
    pub total: usize,
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Messages looked at.
    pub examined: usize,
    /// Sent back and removed from the set-aside queue (in a dry run: how
    /// many would be).
    pub replayed: usize,
    /// Those that stayed, each with why.
    pub kept: Vec<Kept>,
    /// Where each message sent back went (in a dry run: would go), in the
    /// order they were examined.
    pub destinations: Vec<ReplayDestination>,
}

/// Where a replay sent one message (or, in a dry run, would send it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayDestination {
    /// Its message-id.
    pub message_id: String,
    /// The exchange (`""`, the default exchange, for its source queue).
    pub exchange: String,
    /// The routing key (the source queue's name, through the default exchange).
    pub routing_key: String,
}

/// A message a replay left where it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its message-id.
    pub message_id: String,
    /// Why it stayed (no original destination, the exchange is gone, the
    /// broker returned or refused it, the filter left it out, a dry run).
    pub reason: String,
}

/// A set-aside message as an operator sees it.
#[derive(Debug, Clone)]
pub struct SetAside {
    /// Its envelope (id, attempt, first seen, correlation, causation, headers).
    pub envelope: Envelope,
    /// Why it was set aside (`x-acemq-error`), or the broker's dead-letter
    /// reason (`x-first-death-reason`) for one the broker moved itself.
    pub error: Option<String>,
    /// The exchange it first went to.
    pub original_exchange: Option<String>,
    /// The routing key it first went with.
    pub original_routing_key: Option<String>,
    /// The queue it was set aside from, as recorded in it
    /// (`x-acemq-source-queue`, or the broker's newest `x-death` entry).
    pub source_queue: Option<String>,
    /// How often it was replayed before (`x-acemq-replayed`).
    pub replayed: u32,
    /// Whether the broker delivered it before (a listing marks it so).
    pub redelivered: bool,
    /// Its body.
    pub body: Bytes,
    /// Its `content-type`.
    pub content_type: Option<String>,
    /// Its properties as received (what is readable of them).
    pub properties: BasicProperties,
}

impl SetAside {
    pub(crate) fn read(delivery: &Delivery) -> SetAside {
        let properties = match &delivery.properties {
            Ok(p) => p.as_ref().clone(),
            Err(raw) => raw.salvage().properties,
        };
        let envelope = Envelope::read_from_message(&properties, &delivery.body);
        let header = |key: &str| {
            properties
                .headers
                .as_ref()
                .and_then(|h| h.get(key))
                .and_then(FieldValue::as_str)
                .map(str::to_string)
        };
        let (death_exchange, death_key) = first_death(&properties);
        SetAside {
            source_queue: header(SOURCE_QUEUE_HEADER).or_else(|| last_death_queue(&properties)),
            error: header(ERROR_HEADER).or_else(|| header("x-first-death-reason")),
            original_exchange: header(ORIGINAL_EXCHANGE_HEADER).or(death_exchange),
            original_routing_key: header(ORIGINAL_ROUTING_KEY_HEADER).or(death_key),
            replayed: properties
                .headers
                .as_ref()
                .and_then(|h| h.get(REPLAYED_HEADER))
                .and_then(FieldValue::as_i64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
            redelivered: delivery.redelivered,
            body: delivery.body.clone(),
            content_type: properties.content_type.as_ref().map(|c| c.to_string()),
            envelope,
            properties,
        }
    }

    /// The exchange and routing key it was first published with, if known.
    fn original(&self) -> Option<(&str, &str)> {
        Some((
            self.original_exchange.as_deref()?,
            self.original_routing_key.as_deref()?,
        ))
    }

    /// Where a replay from `from` sends it (see the module docs), or why it
    /// cannot go back.
    pub(crate) fn destination(&self, from: &str, to_original: bool) -> Result<(String, String), String> {
        // The scheduler's set-asides: their source queue is the scheduler's
        // own; they go to the destination they were scheduled for.
        let scheduled = from == format!("{}.dlq", crate::schedule::DELIVERY);
        if to_original || scheduled {
            return self
                .original()
                .map(|(exchange, key)| (exchange.to_string(), key.to_string()))
                .ok_or_else(|| "no original exchange and routing key recorded".to_string());
        }
        // A `{queue}.dlq` or `{queue}.parked` goes back into `{queue}`,
        // whatever the message says; elsewhere, the queue it records.
        let stem = from.strip_suffix(".dlq").or_else(|| from.strip_suffix(".parked"));
        match stem.filter(|q| !q.is_empty()).or(self.source_queue.as_deref()) {
            Some(queue) => Ok((String::new(), queue.to_string())),
            None => {
                Err("no source queue recorded (to_original sends it to the exchange it was first published to)".into())
            }
        }
    }

    /// The properties of the replayed copy.
    pub(crate) fn replay_properties(&self) -> BasicProperties {
        let mut props = self.properties.clone();
        if props.message_id.is_none() {
            props.message_id = Some(self.envelope.id.as_str().into());
        }
        let mut headers = FieldTable::new();
        for (key, value) in props.headers.iter().flat_map(FieldTable::iter) {
            let name = key.as_bytes();
            let dropped = [
                ATTEMPT_HEADER,
                FIRST_SEEN_HEADER,
                ERROR_HEADER,
                REPLAYED_HEADER,
                SOURCE_QUEUE_HEADER,
            ]
            .iter()
            .any(|h| h.as_bytes() == name)
                // The broker's dead-letter history: the replayed copy starts
                // a life of its own.
                || name == b"x-death"
                || name == b"x-delivery-count"
                || name.starts_with(b"x-first-death-")
                || name.starts_with(b"x-last-death-");
            if !dropped {
                headers.push(key.clone(), value.clone());
            }
        }
        headers.insert(ATTEMPT_HEADER, FieldValue::I32(1));
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        headers.insert(FIRST_SEEN_HEADER, FieldValue::Timestamp(now));
        let replayed = i32::try_from(self.replayed.saturating_add(1)).unwrap_or(i32::MAX);
        headers.insert(REPLAYED_HEADER, FieldValue::I32(replayed));
        props.headers = Some(headers);
        props
    }
}

/// The exchange and first routing key of the oldest `x-death` entry (the
/// broker's own dead-lettering: TTL, max-length, a rejection).
fn first_death(properties: &BasicProperties) -> (Option<String>, Option<String>) {
    let oldest = properties
        .headers
        .as_ref()
        .and_then(|h| h.get("x-death"))
        .and_then(FieldValue::as_array)
        .and_then(|deaths| deaths.0.last())
        .and_then(FieldValue::as_table);
    let Some(death) = oldest else {
        return (None, None);
    };
    let exchange = death.get("exchange").and_then(FieldValue::as_str).map(str::to_string);
    let key = death
        .get("routing-keys")
        .and_then(FieldValue::as_array)
        .and_then(|keys| keys.0.first())
        .and_then(FieldValue::as_str)
        .map(str::to_string);
    (exchange, key)
}

/// The queue of the newest `x-death` entry: the queue the broker
/// dead-lettered it from last.
fn last_death_queue(properties: &BasicProperties) -> Option<String> {
    let newest = properties
        .headers
        .as_ref()?
        .get("x-death")?
        .as_array()?
        .0
        .first()?
        .as_table()?;
    newest.get("queue")?.as_str().map(str::to_string)
}

/// How long a replay or a listing waits for the next delivery of a queue
/// that said it had more.
const NEXT_DELIVERY: Duration = Duration::from_secs(5);
/// Replayed copies in flight at once, waiting for their confirms.
const WINDOW: usize = 256;

impl Conn {
    /// Moves the messages of `from` (a `{queue}.dlq` or `{queue}.parked`)
    /// back into their source queue, or with [`ReplayOptions::to_original`]
    /// to where they were first published, as the module docs say; returns
    /// what it did and where each went. A message that cannot go back
    /// stays, and the report says why.
    pub async fn replay(&self, from: &str, options: ReplayOptions) -> Result<ReplayReport, Error> {
        let (channel, mut deliveries, total) = match self.open_reader(from, options.limit).await? {
            Some(reader) => reader,
            None => return Ok(ReplayReport::default()),
        };
        let mut report = ReplayReport::default();
        let mut held = Vec::new();
        let mut exchanges: HashMap<String, Result<(), String>> = HashMap::new();
        let mut in_flight: JoinSet<(Delivery, String, Result<(), Error>)> = JoinSet::new();
        let progress = |report: &ReplayReport| {
            if let Some(progress) = &options.progress {
                progress(ReplayProgress {
                    examined: report.examined,
                    replayed: report.replayed,
                    kept: report.kept.len(),
                    total,
                });
            }
        };
        while report.examined < total {
            let Ok(Some(delivery)) = tokio::time::timeout(NEXT_DELIVERY, deliveries.next()).await else {
                break;
            };
            report.examined += 1;
            let aside = SetAside::read(&delivery);
            let message_id = aside.envelope.id.clone();
            let verdict = match (&options.filter, aside.destination(from, options.to_original)) {
                (Some(filter), _) if !filter(&aside) => Err("not selected by the filter".to_string()),
                (_, Err(reason)) => Err(reason),
                (_, Ok((exchange, key))) => self
                    .exchange_exists(&mut exchanges, &exchange)
                    .await
                    .map(|()| (exchange, key)),
            };
            match verdict {
                Err(reason) => {
                    report.kept.push(Kept { message_id, reason });
                    held.push(delivery);
                }
                Ok((exchange, routing_key)) if options.dry_run => {
                    report.replayed += 1;
                    report.destinations.push(ReplayDestination {
                        message_id,
                        exchange,
                        routing_key,
                    });
                    held.push(delivery);
                }
                Ok((exchange, routing_key)) => {
                    report.destinations.push(ReplayDestination {
                        message_id: message_id.clone(),
                        exchange: exchange.clone(),
                        routing_key: routing_key.clone(),
                    });
                    let publish = BasicPublish {
                        exchange: exchange.as_str().into(),
                        routing_key: routing_key.as_str().into(),
                        mandatory: true,
                        ..Default::default()
                    };
                    let conn = self.clone();
                    let properties = aside.replay_properties();
                    let body = aside.body.clone();
                    in_flight.spawn(async move {
                        let sent = conn.publish_library(publish, properties, body, &message_id).await;
                        (delivery, message_id, sent.map(|_| ()))
                    });
                    if in_flight.len() >= WINDOW {
                        if let Some(done) = in_flight.join_next().await {
                            on_resolved(done, &mut report, &mut held)?;
                        }
                    }
                }
            }
            progress(&report);
        }
        while let Some(done) = in_flight.join_next().await {
            on_resolved(done, &mut report, &mut held)?;
            progress(&report);
        }
        // Only what was sent back and confirmed was acked; the rest goes
        // back to the queue, in its place.
        let _ = deliveries.cancel().await;
        for delivery in held {
            let _ = delivery.nack(true);
        }
        let _ = channel.close().await;
        Ok(report)
    }

    /// Up to `limit` messages of `queue`, in order, without consuming them:
    /// they are taken without acks and handed back, in their places, when
    /// the listing's channel closes (marked redelivered from then on).
    pub async fn peek(&self, queue: &str, limit: usize) -> Result<Vec<SetAside>, Error> {
        let Some((channel, mut deliveries, total)) = self.open_reader(queue, Some(limit)).await? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(total);
        while out.len() < total {
            match tokio::time::timeout(NEXT_DELIVERY, deliveries.next()).await {
                Ok(Some(delivery)) => out.push(SetAside::read(&delivery)),
                _ => break,
            }
        }
        let _ = deliveries.cancel().await;
        let _ = channel.close().await;
        Ok(out)
    }

    /// Empties `queue`; returns how many messages it held.
    pub async fn purge(&self, queue: &str) -> Result<u32, Error> {
        let channel = self.consuming_connection().channel().await?;
        let ok = channel
            .queue_purge(acemq_codec::QueuePurge {
                queue: queue.into(),
                ..Default::default()
            })
            .await?;
        let _ = channel.close().await;
        Ok(ok.map_or(0, |ok| ok.message_count))
    }

    /// A channel consuming `queue` without acks yet, with enough prefetch
    /// for what it will read, and how many messages to read: those there
    /// now, at most `limit`. `None` when there is nothing to read.
    async fn open_reader(
        &self,
        queue: &str,
        limit: Option<usize>,
    ) -> Result<Option<(amqp::Channel, amqp::Consumer, usize)>, Error> {
        let channel = self.consuming_connection().channel().await?;
        let passive = QueueDeclare {
            queue: queue.into(),
            passive: true,
            ..Default::default()
        };
        let there = channel.queue_declare(passive).await?.map_or(0, |ok| ok.message_count);
        let total = usize::try_from(there)
            .unwrap_or(usize::MAX)
            .min(limit.unwrap_or(usize::MAX));
        if total == 0 {
            let _ = channel.close().await;
            return Ok(None);
        }
        // Enough to hold every message kept back, and no more than it reads.
        channel.qos(u16::try_from(total).unwrap_or(u16::MAX)).await?;
        let deliveries = channel
            .basic_consume(BasicConsume {
                queue: queue.into(),
                ..Default::default()
            })
            .await?;
        Ok(Some((channel, deliveries, total)))
    }

    /// Whether `exchange` exists (a passive declare on a channel of its
    /// own, remembered for the run): a publish to a missing one would
    /// close the library channel under every replay in flight.
    async fn exchange_exists(
        &self,
        known: &mut HashMap<String, Result<(), String>>,
        exchange: &str,
    ) -> Result<(), String> {
        if exchange.is_empty() {
            return Ok(());
        }
        if let Some(known) = known.get(exchange) {
            return known.clone();
        }
        let probe = async {
            let channel = self.consuming_connection().channel().await?;
            let found = channel
                .exchange_declare(ExchangeDeclare {
                    exchange: exchange.into(),
                    passive: true,
                    ..Default::default()
                })
                .await;
            if found.is_ok() {
                let _ = channel.close().await;
            }
            found.map(|_| ()).map_err(Error::from)
        };
        let answer = match probe.await {
            Ok(()) => Ok(()),
            Err(err) if err.refusal().is_some_and(|r| r.code == 404) => {
                Err(format!("the exchange {exchange:?} no longer exists ({err})"))
            }
            Err(err) => return Err(format!("could not check the exchange {exchange:?}: {err}")),
        };
        known.insert(exchange.to_string(), answer.clone());
        answer
    }
}

/// A queue read in order without consuming it ([`Conn::read_queue`]): each
/// message is held (delivered without an ack) until [`QueueReader::remove`]
/// acks it or [`QueueReader::keep`] keeps it; [`QueueReader::close`] hands
/// every kept message back to the queue, in its place, as a replay does.
/// Dropped without `close`, its channel goes with the connection, and the
/// broker hands back everything not removed.
pub struct QueueReader {
    channel: Option<amqp::Channel>,
    deliveries: Option<amqp::Consumer>,
    total: usize,
    read: usize,
    held: Vec<Delivery>,
}

impl std::fmt::Debug for QueueReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueReader")
            .field("total", &self.total)
            .field("read", &self.read)
            .field("held", &self.held.len())
            .finish()
    }
}

/// One message a [`QueueReader`] holds, until it is removed or kept.
#[derive(Debug)]
pub struct HeldMessage {
    /// The message as an operator sees it (its body and properties as
    /// received).
    pub message: SetAside,
    delivery: Delivery,
}

impl QueueReader {
    /// How many messages it reads in all: those in the queue when it was
    /// opened, at most the limit.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The next message, in queue order; `None` after [`QueueReader::total`]
    /// messages, or when the broker sends none for 5 s.
    pub async fn next(&mut self) -> Option<HeldMessage> {
        if self.read >= self.total {
            return None;
        }
        let deliveries = self.deliveries.as_mut()?;
        let delivery = tokio::time::timeout(NEXT_DELIVERY, deliveries.next()).await.ok()??;
        self.read += 1;
        Some(HeldMessage {
            message: SetAside::read(&delivery),
            delivery,
        })
    }

    /// Removes `held` from the queue (acks it).
    pub fn remove(&mut self, held: HeldMessage) -> Result<(), Error> {
        held.delivery.ack().map_err(Error::from)
    }

    /// Keeps `held`: it goes back to the queue, in its place, on
    /// [`QueueReader::close`].
    pub fn keep(&mut self, held: HeldMessage) {
        self.held.push(held.delivery);
    }

    /// Stops reading and hands every kept message back to the queue.
    pub async fn close(mut self) {
        if let Some(deliveries) = self.deliveries.take() {
            let _ = deliveries.cancel().await;
        }
        for delivery in self.held.drain(..) {
            let _ = delivery.nack(true);
        }
        if let Some(channel) = self.channel.take() {
            let _ = channel.close().await;
        }
    }
}

impl Conn {
    /// Opens a [`QueueReader`] on `queue`: up to `limit` of the messages
    /// there now, in order, each removed only when the caller says so.
    pub async fn read_queue(&self, queue: &str, limit: Option<usize>) -> Result<QueueReader, Error> {
        Ok(match self.open_reader(queue, limit).await? {
            Some((channel, deliveries, total)) => QueueReader {
                channel: Some(channel),
                deliveries: Some(deliveries),
                total,
                read: 0,
                held: Vec::new(),
            },
            None => QueueReader {
                channel: None,
                deliveries: None,
                total: 0,
                read: 0,
                held: Vec::new(),
            },
        })
    }
}

/// A replayed copy's confirm came: the set-aside copy is acked, or kept
/// with the reason.
fn on_resolved(
    done: Result<(Delivery, String, Result<(), Error>), tokio::task::JoinError>,
    report: &mut ReplayReport,
    held: &mut Vec<Delivery>,
) -> Result<(), Error> {
    let (delivery, message_id, sent) = done.map_err(|e| Error::ConsumerFailed(Arc::new(e)))?;
    match sent {
        Ok(()) => {
            delivery.ack().map_err(Error::from)?;
            report.replayed += 1;
        }
        Err(err) => {
            // It did not go there after all.
            if let Some(at) = report.destinations.iter().rposition(|d| d.message_id == message_id) {
                report.destinations.remove(at);
            }
            report.kept.push(Kept {
                message_id,
                reason: err.to_string(),
            });
            held.push(delivery);
        }
    }
    Ok(())
}
