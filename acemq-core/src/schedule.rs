//! Scheduled sends (statement 26 of `docs/statements.md`): [`Publisher::send_at`] and
//! [`Publisher::send_after`] over a binary delay ladder kept in the broker,
//! and the [`Scheduler`] that takes what falls due off the ladder and
//! delivers it. No wait is held in a process, so a restart loses none.
//!
//! # The ladder, exactly as it is declared
//!
//! These names and arguments are a wire contract (`docs/wire-contract.md`): every
//! service that schedules declares the same, so none of them gets a 406.
//! They are listed by [`ladder_declarations`], in the order declared:
//!
//! | what | name | declared as |
//! |---|---|---|
//! | delivery exchange | `acemq.delay.delivery` | topic, durable, no arguments |
//! | delivery queue | `acemq.delay.delivery` | durable classic, no arguments; bound to exchange `acemq.delay.delivery` with `#` |
//! | level NN exchange (NN = 00..27, from 00 up) | `acemq.delay.NN` | topic, durable, no arguments |
//! | level NN queue | `acemq.delay.NN` | durable classic with exactly two arguments: `x-message-ttl` = 2^NN × 1000 ms, and `x-dead-letter-exchange` = `S` `acemq.delay.(NN−1)` (level 00: `acemq.delay.delivery`); no `x-dead-letter-routing-key`, so the routing key is kept |
//! | level NN queue binding | exchange `acemq.delay.NN` → queue `acemq.delay.NN` | key: bit NN is `1` (`*.` × (27 − NN), then `1.#`) |
//! | level NN exchange binding | exchange `acemq.delay.NN` → exchange `acemq.delay.(NN−1)` (level 00: `acemq.delay.delivery`) | key: bit NN is `0` (`*.` × (27 − NN), then `0.#`) |
//!
//! `x-message-ttl` is written as `I` (signed 32-bit) where it fits, levels
//! 00 to 21 (2^21 × 1000 = 2,097,152,000 ms), and as `l` (signed 64-bit) for
//! levels 22 to 27, whose values do not fit in 32 bits (2^22 × 1000 is
//! 4,194,304,000; 2^27 × 1000 is 134,217,728,000). RabbitMQ (3.10.8, checked
//! by declaring) accepts every one of them as `l`, refuses the 32-bit
//! wrap-around (406 `value_negative`), and takes an `I` and an `l` of the
//! same value as equivalent on redeclare, so a service that writes `l` for
//! every level agrees with this one.
//!
//! A scheduler also declares `acemq.dlx`, `acemq.delay.delivery.dlq` and
//! `acemq.delay.delivery.parked` as for any queue with dead letters (the
//! `{queue}.dlq` rows of the wire contract), for the messages it cannot deliver.
//!
//! # A scheduled message
//!
//! A delay is whole seconds, the wait rounded up (a message never leaves the
//! ladder before it is due), from 0 up to 2^28 − 1 s (about 8.5 years);
//! [`MAX_DELAY`] is that. Longer is [`Error::DelayTooLong`], and nothing is
//! sent. The message is the publisher's as [`Publisher::send`] would write
//! it (payload, codec, content-type, delivery mode, envelope), with three
//! headers more:
//!
//! - `x-acemq-deliver-to-exchange` (`S`): the publisher's exchange;
//! - `x-acemq-deliver-to-routing-key` (`S`): the publisher's routing key;
//! - `x-acemq-deliver-at` (`T`): the due time in whole seconds, rounded down
//!   (the second in which it falls due).
//!
//! It is a library publish (mandatory, confirmed on the library channel,
//! even on a connection without confirms) to exchange `acemq.delay.NN` of
//! its delay's highest set bit (level 00 for a delay of 0), with the 28 bits
//! of the delay, most significant first, as its routing key:
//! `0.0.…0.1.0.1.0` for 10 s. At each level a bit of 1 sends it into that
//! level's queue, where it waits 2^NN s and is dead-lettered, key unchanged,
//! to the level below; a bit of 0 passes it on at once. From level 00 it
//! reaches `acemq.delay.delivery`.
//!
//! # The delivery
//!
//! A [`Scheduler`] (any process may run one; several share the work)
//! consumes `acemq.delay.delivery` and republishes each message to the
//! exchange and routing key in its headers, as a library publish, then acks
//! it. The delivered copy keeps the body and the properties (content-type,
//! delivery mode, correlation-id, timestamp, application headers...), and:
//!
//! - its message-id is derived from the scheduled message's id and this hop
//!   (a version-5 UUID of the id, the destination and the due time), so a
//!   copy delivered twice (a scheduler that died between its publish and its
//!   ack) has the same id, and a consumer that dedupes on `Envelope.id` sees
//!   it once;
//! - `x-acemq-causation-id` is the scheduled message's id, `x-acemq-attempt`
//!   is 1, `x-acemq-first-seen` is the time of delivery;
//! - the `x-acemq-deliver-*` headers, the broker's `x-death`,
//!   `x-first-death-*` and `x-last-death-*` (the ladder's bookkeeping; left
//!   in, they would make RabbitMQ drop a message scheduled again as a
//!   dead-letter cycle), set-aside headers (`x-acemq-error`,
//!   `x-acemq-original-*`, `x-acemq-replayed`), `expiration` and `user-id`
//!   (which RabbitMQ checks against the scheduler's own login) are removed.
//!
//! A message that reaches the scheduler before its `x-acemq-deliver-at` by
//! the scheduler's clock (which the ladder never does by itself; another
//! host's clock, or a message published to the ladder by hand, can) waits
//! in the process until it is due, holding its delivery, when that is at
//! most [`HOLD_AT_MOST`]; a longer wait goes back onto the ladder for what
//! remains, so that no long wait is held in a process either.
//!
//! A delivery to an exchange that does not exist (a passive declare says
//! so before the publish, which would otherwise close the library channel
//! under every publish in flight; the answer is kept for 5 s) or that
//! reaches no queue (NO_ROUTE) is set aside in `acemq.delay.delivery.dlq`
//! with `x-acemq-error`, its destination as `x-acemq-original-exchange` and
//! `-routing-key`, and the id it would have been delivered with, so that
//! `Conn::replay` delivers it once the destination exists. So is a message
//! without a destination, or whose properties cannot be read. Any other
//! failure (a nack, a refusal, a block, a lost connection) hands the message
//! back to the queue after a second, to be tried again.
//!
//! `acemq_scheduled_total{outcome}` counts what the schedulers did:
//! `delivered`; `redelivered` (delivered from a copy the broker had given
//! out before, a possible duplicate, with the same id); `rescheduled` (back
//! onto the ladder, early); `dead_lettered`; `failed` (handed back to be
//! tried again); `returned` (handed back unfinished when closing).
//!
//! # Clocks
//!
//! Due times are wall-clock seconds, read by [`wall_clock`]: the system
//! clock, moved by however far tokio's clock is from the real monotonic one.
//! That is nothing at all unless tokio's clock is paused, as in tests, where
//! the ladder's TTLs (in acemq-memory) and the due times then run on the
//! same virtual time.
//!
//! RabbitMQ times the ladder's waits on its own system clock as well: a
//! message's expiry is the broker's system time when it is enqueued plus
//! the level's TTL. A wait is as long as the broker's system clock says,
//! then; where that clock is stepped, or corrected against a monotonic
//! clock that runs slow, a wait measured on a monotonic clock can come out
//! a little short or long.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq_codec::{BasicConsume, BasicProperties, BasicPublish, ExchangeDeclare, FieldTable, FieldValue, ShortString};
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{watch, OnceCell};
use tokio::time::Instant;

use crate::amqp::Delivery;
use crate::codec::Codec;
use crate::confirm::report;
use crate::conn::Conn;
use crate::conn::{lock, ConnState, ConsumerRecord};
use crate::consume::outcome::{ack, requeue};
use crate::consume::task;
use crate::declaration::Declaration;
use crate::envelope::{
    hop_id, Envelope, ATTEMPT_HEADER, CAUSATION_HEADER, ERROR_HEADER, FIRST_SEEN_HEADER, ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER, REPLAYED_HEADER,
};
use crate::error::Error;
use crate::publish::Publisher;
use crate::topology::{self, DLX};

/// How many levels the ladder has: level NN holds a message 2^NN s.
pub const LEVELS: u32 = 28;

/// The longest delay the ladder can hold: 2^28 − 1 s, about 8.5 years.
pub const MAX_DELAY: Duration = Duration::from_secs((1 << LEVELS) - 1);

/// The exchange and the queue a [`Scheduler`] consumes: where messages
/// land when they fall due.
pub const DELIVERY: &str = "acemq.delay.delivery";

/// Header: the exchange a scheduled message goes to when due (`S`).
pub const DELIVER_TO_EXCHANGE_HEADER: &str = "x-acemq-deliver-to-exchange";
/// Header: the routing key a scheduled message goes with when due (`S`).
pub const DELIVER_TO_ROUTING_KEY_HEADER: &str = "x-acemq-deliver-to-routing-key";
/// Header: when a scheduled message falls due, whole seconds rounded down (`T`).
pub const DELIVER_AT_HEADER: &str = "x-acemq-deliver-at";

/// The longest a message that reached the scheduler early is held in the
/// process before it is delivered; an earlier one goes back onto the ladder.
pub const HOLD_AT_MOST: Duration = Duration::from_secs(60);

/// How long the scheduler trusts what a passive declare said about a
/// destination exchange.
const EXCHANGE_RECHECK: Duration = Duration::from_secs(5);

/// How long a delivery that failed for a reason that may pass (a nack, a
/// block, a lost connection) is held before it goes back to the queue.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// The exchange and the queue of ladder level `level` (0..=27):
/// `acemq.delay.07`.
pub fn level_name(level: u32) -> String {
    format!("acemq.delay.{level:02}")
}

/// The routing key of a delay of `delay_secs` whole seconds on the ladder:
/// its 28 bits, most significant first, dot-separated (`0.0.…1.0.1.0` for
/// 10 s). Bits above the 28th are ignored.
pub fn ladder_routing_key(delay_secs: u64) -> String {
    let mut key = String::with_capacity(2 * LEVELS as usize);
    for level in (0..LEVELS).rev() {
        if level != LEVELS - 1 {
            key.push('.');
        }
        key.push(if (delay_secs >> level) & 1 == 1 { '1' } else { '0' });
    }
    key
}

/// The exchange a delay of `delay_secs` enters the ladder by: the level of
/// its highest set bit (level 00 for no delay at all).
pub fn entry_level(delay_secs: u64) -> u32 {
    match delay_secs {
        0 => 0,
        n => 63 - n.leading_zeros(),
    }
}

/// Where level `level` passes a message whose bit is 0, and dead-letters one
/// whose wait there is over: the level below, or the delivery exchange.
fn below(level: u32) -> String {
    match level {
        0 => DELIVERY.to_string(),
        n => level_name(n - 1),
    }
}

/// A topic pattern matching the keys whose bit `level` is `bit`.
fn bit_pattern(level: u32, bit: char) -> String {
    let mut pattern = "*.".repeat((LEVELS - 1 - level) as usize);
    pattern.push(bit);
    pattern.push_str(".#");
    pattern
}

/// `x-message-ttl` of level `level`: 2^level × 1000 ms, as `I` where it
/// fits in 32 bits (levels 0..=21), as `l` above.
pub fn level_ttl(level: u32) -> FieldValue {
    let ms = (1u64 << level) * 1000;
    match i32::try_from(ms) {
        Ok(ms) => FieldValue::I32(ms),
        Err(_) => FieldValue::I64(ms as i64),
    }
}

/// Every declaration of the ladder, in the order they are made (see the
/// module docs): the delivery exchange, queue and binding, then each level
/// from 00 up (exchange, queue, queue binding, exchange binding), so that
/// every exchange a binding names exists before it.
pub fn ladder_declarations() -> Vec<Declaration> {
    let mut out = vec![
        Declaration::exchange(DELIVERY, "topic"),
        Declaration::Queue {
            name: DELIVERY.into(),
            durable: true,
            arguments: FieldTable::new(),
        },
        Declaration::bind(DELIVERY, DELIVERY, "#"),
    ];
    for level in 0..LEVELS {
        let name = level_name(level);
        let mut arguments = FieldTable::new();
        arguments.push("x-message-ttl", level_ttl(level));
        arguments.push("x-dead-letter-exchange", FieldValue::from(below(level)));
        out.push(Declaration::exchange(&name, "topic"));
        out.push(Declaration::Queue {
            name: name.clone(),
            durable: true,
            arguments,
        });
        out.push(Declaration::bind(&name, &name, &bit_pattern(level, '1')));
        out.push(Declaration::exchange_bind(
            &below(level),
            &name,
            &bit_pattern(level, '0'),
        ));
    }
    out
}

/// The ladder of each live `Conn`, declared at most once.
type Ladders = Vec<(Weak<ConnState>, Arc<OnceCell<()>>)>;
static LADDERS: Mutex<Ladders> = Mutex::new(Vec::new());

/// Declares the ladder through `conn` unless it already has, and records
/// it for recovery to declare again.
async fn ensure_ladder(conn: &Conn) -> Result<(), Error> {
    let once = {
        let mut ladders = lock(&LADDERS);
        ladders.retain(|(inner, _)| inner.strong_count() > 0);
        let this = Arc::as_ptr(&conn.inner);
        match ladders.iter().find(|(inner, _)| inner.as_ptr() == this) {
            Some((_, once)) => once.clone(),
            None => {
                let once = Arc::new(OnceCell::new());
                ladders.push((Arc::downgrade(&conn.inner), once.clone()));
                once
            }
        }
    };
    if once.initialized() {
        return Ok(());
    }
    once.get_or_try_init(|| async {
        let declarations = ladder_declarations();
        topology::apply(conn, &declarations).await?;
        conn.record_declarations(&declarations);
        Ok::<(), Error>(())
    })
    .await
    .map(|_| ())
}

/// The wall clock the ladder's due times are read by: `SystemTime::now()`,
/// moved by however far tokio's clock is from the real monotonic clock —
/// no distance at all unless tokio's clock is paused (tests), where it then
/// advances with the virtual time.
pub fn wall_clock() -> SystemTime {
    let virtual_now = Instant::now().into_std();
    let real_now = std::time::Instant::now();
    let system = SystemTime::now();
    let moved = if virtual_now >= real_now {
        system.checked_add(virtual_now - real_now)
    } else {
        system.checked_sub(real_now - virtual_now)
    };
    moved.unwrap_or(system)
}

/// A wait in whole seconds, rounded up.
fn whole_seconds_up(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The broker's dead-lettering bookkeeping, dropped from a message going
/// onto the ladder or delivered from it: RabbitMQ drops a message as a
/// dead-letter cycle when it would dead-letter it into a queue its `x-death`
/// already names.
fn is_death_header(key: &[u8]) -> bool {
    key == b"x-death" || key.starts_with(b"x-first-death-") || key.starts_with(b"x-last-death-")
}

impl<T: Serialize, C: Codec> Publisher<T, C> {
    /// Sends a new message to this publisher's destination no earlier than
    /// `at` (and, the broker and a [`Scheduler`] willing, within about two
    /// seconds after it): it waits in the broker on the delay ladder (see
    /// [`crate::schedule`]). A time in the past is delivered at once. Returns
    /// once the broker has it (confirmed, on the library channel). More
    /// than [`MAX_DELAY`] ahead is [`Error::DelayTooLong`].
    pub async fn send_at(&self, payload: &T, at: SystemTime) -> Result<(), Error> {
        self.send_envelope_at(Envelope::new(), payload, at).await
    }

    /// Sends a new message to this publisher's destination after `delay`
    /// (whole seconds, rounded up), waiting in the broker on the delay
    /// ladder. As [`Publisher::send_at`].
    pub async fn send_after(&self, payload: &T, delay: Duration) -> Result<(), Error> {
        self.send_envelope_after(Envelope::new(), payload, delay).await
    }

    /// [`Publisher::send_at`] with this envelope (its id, correlation and
    /// causation go with the scheduled message).
    pub async fn send_envelope_at(&self, envelope: Envelope, payload: &T, at: SystemTime) -> Result<(), Error> {
        let wait = at.duration_since(wall_clock()).unwrap_or(Duration::ZERO);
        self.schedule(envelope, payload, wait, Some(at)).await
    }

    /// [`Publisher::send_after`] with this envelope.
    pub async fn send_envelope_after(&self, envelope: Envelope, payload: &T, delay: Duration) -> Result<(), Error> {
        let at = wall_clock().checked_add(delay);
        self.schedule(envelope, payload, delay, at).await
    }

    /// Puts the message on the ladder for `wait` (rounded up to seconds),
    /// due at `at`.
    async fn schedule(
        &self,
        envelope: Envelope,
        payload: &T,
        wait: Duration,
        at: Option<SystemTime>,
    ) -> Result<(), Error> {
        let delay_secs = whole_seconds_up(wait);
        let at = match at {
            Some(at) if delay_secs <= MAX_DELAY.as_secs() => at,
            _ => {
                return Err(Error::DelayTooLong {
                    message_id: envelope.id,
                    requested_secs: delay_secs,
                    max_secs: MAX_DELAY.as_secs(),
                })
            }
        };
        let exchange = ShortString::from(level_name(entry_level(delay_secs)));
        let routing_key = ShortString::from(ladder_routing_key(delay_secs));
        let result = self
            .put_on_ladder(&envelope, payload, at, &exchange, &routing_key)
            .await;
        report(result.as_ref(), &envelope.id, &exchange, &routing_key);
        result.map(|_| ())
    }

    async fn put_on_ladder(
        &self,
        envelope: &Envelope,
        payload: &T,
        at: SystemTime,
        exchange: &ShortString,
        routing_key: &ShortString,
    ) -> Result<crate::SendResult, Error> {
        // A new send while the broker blocks publishing is refused at once,
        // as `send` does (statement 16).
        if let Some(reason) = self.conn.inner.publishing.blocked_reason() {
            return Err(Error::PublishingPaused { reason });
        }
        let body = self.codec.encode(payload).map_err(Error::Encode)?;
        let mut properties = BasicProperties {
            content_type: Some(
                self.content_type
                    .clone()
                    .unwrap_or_else(|| self.codec.content_type().into()),
            ),
            delivery_mode: Some(if self.persistent { 2 } else { 1 }),
            timestamp: Some(unix_seconds(wall_clock())),
            ..Default::default()
        };
        envelope.write_to(&mut properties);
        let headers = properties.headers.get_or_insert_with(FieldTable::new);
        if headers.iter().any(|(key, _)| is_death_header(key.as_bytes())) {
            let kept: Vec<_> = headers
                .iter()
                .filter(|(key, _)| !is_death_header(key.as_bytes()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            *headers = FieldTable::new();
            for (k, v) in kept {
                headers.push(k, v);
            }
        }
        headers.insert(
            DELIVER_TO_EXCHANGE_HEADER,
            FieldValue::from(self.publish.exchange.to_string()),
        );
        headers.insert(
            DELIVER_TO_ROUTING_KEY_HEADER,
            FieldValue::from(self.publish.routing_key.to_string()),
        );
        headers.insert(DELIVER_AT_HEADER, FieldValue::Timestamp(unix_seconds(at)));
        ensure_ladder(&self.conn).await?;
        let publish = BasicPublish {
            exchange: exchange.clone(),
            routing_key: routing_key.clone(),
            mandatory: true,
            ..Default::default()
        };
        self.conn
            .publish_library(publish, properties, Bytes::from(body), &envelope.id)
            .await
    }
}

/// Starts a [`Scheduler`] with options other than the defaults.
#[derive(Debug)]
pub struct SchedulerBuilder {
    conn: Conn,
    prefetch: u16,
    drain_timeout: Duration,
}

impl SchedulerBuilder {
    /// How many due messages the broker hands this scheduler ahead, and so
    /// how many deliveries it has in flight at once (256).
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch.max(1);
        self
    }

    /// How long `close` lets deliveries under way finish (20 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Declares the ladder (once per `Conn`) and the scheduler's dead
    /// letters, and starts consuming `acemq.delay.delivery`.
    pub async fn start(self) -> Result<Scheduler, Error> {
        let conn = self.conn;
        ensure_ladder(&conn).await?;
        let set_aside = topology::set_aside_declarations(DELIVERY);
        topology::apply(&conn, &set_aside).await?;
        conn.record_declarations(&set_aside);

        let method = BasicConsume {
            queue: DELIVERY.into(),
            ..Default::default()
        };
        let started = task::start(&conn.inner, method, self.prefetch).await?;
        let record = started.record.clone();
        let deliverer = Arc::new(Deliverer {
            conn: conn.clone(),
            shutdown: started.shutdown.clone(),
            exchanges: Mutex::default(),
            asking: tokio::sync::Mutex::new(()),
        });
        let done = started.spawn(
            conn.inner.clone(),
            DELIVERY.to_string(),
            self.drain_timeout,
            move |tasks, delivery| {
                tasks.spawn(deliver(deliverer.clone(), delivery));
            },
        );
        Ok(Scheduler { record, done })
    }
}

/// Delivers scheduled messages when they fall due: consumes
/// `acemq.delay.delivery` and republishes each message to the destination
/// in its headers (see [`crate::schedule`]). Any number of processes may run
/// one; each message is delivered at least once, always with the same id.
/// Like a [`crate::Consumer`], it rides through a recovery of its
/// connection; dropping it leaves it running, and [`Scheduler::close`] (or
/// [`Conn::close`]) stops it.
pub struct Scheduler {
    record: Arc<ConsumerRecord>,
    done: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl Scheduler {
    /// Starts a scheduler on `conn` with the defaults (prefetch 256).
    pub async fn start(conn: &Conn) -> Result<Scheduler, Error> {
        Scheduler::builder(conn).start().await
    }

    /// A scheduler with options; [`SchedulerBuilder::start`] starts it.
    pub fn builder(conn: &Conn) -> SchedulerBuilder {
        SchedulerBuilder {
            conn: conn.clone(),
            prefetch: 256,
            drain_timeout: Duration::from_secs(20),
        }
    }

    /// Stops: cancels the consumer, hands back what it had not started on,
    /// lets deliveries under way finish up to the drain timeout (a message
    /// held because it came early goes back to the queue), then closes the
    /// channel. Returns the error it had already ended with, if it had.
    pub async fn close(self) -> Result<(), Error> {
        self.record.close(self.done).await
    }

    /// Waits until the scheduler has ended, and says how (as
    /// [`crate::Consumer::closed`]).
    pub async fn closed(&self) -> Result<(), Error> {
        self.record.closed().await
    }

    /// Whether it has stopped (closed, or ended with an error).
    pub fn is_finished(&self) -> bool {
        self.done.is_finished()
    }
}

/// What every delivery of one scheduler works with: its connection, its
/// shutdown signal, and what it knows of the destination exchanges.
struct Deliverer {
    conn: Conn,
    shutdown: watch::Receiver<bool>,
    /// Whether each destination exchange exists, as a passive declare said
    /// and when: a publish to a missing one would close the library
    /// channel under every other publish in flight.
    exchanges: Mutex<std::collections::HashMap<ShortString, (Instant, bool)>>,
    /// Held while a passive declare asks.
    asking: tokio::sync::Mutex<()>,
}

impl Deliverer {
    /// Whether `exchange` exists, asked at most every [`EXCHANGE_RECHECK`].
    async fn exchange_exists(&self, exchange: &ShortString) -> Result<bool, Error> {
        if exchange.is_empty() {
            return Ok(true);
        }
        let known = || {
            lock(&self.exchanges)
                .get(exchange)
                .filter(|(asked, _)| asked.elapsed() < EXCHANGE_RECHECK)
                .map(|(_, exists)| *exists)
        };
        if let Some(exists) = known() {
            return Ok(exists);
        }
        // One question at a time: the deliveries waiting on the answer
        // share it instead of each opening a channel to ask.
        let _asking = self.asking.lock().await;
        if let Some(exists) = known() {
            return Ok(exists);
        }
        let (exists, _) = self
            .conn
            .inner
            .on_consuming(|connection| async move {
                let channel = connection.channel().await?;
                let found = channel
                    .exchange_declare(ExchangeDeclare {
                        exchange: exchange.clone(),
                        passive: true,
                        ..Default::default()
                    })
                    .await
                    .map_err(Error::from);
                match found {
                    Ok(_) => {
                        let _ = channel.close().await;
                        Ok(true)
                    }
                    Err(err) if err.refusal().is_some_and(|r| r.code == 404) => Ok(false),
                    Err(err) => Err(err),
                }
            })
            .await?;
        lock(&self.exchanges).insert(exchange.clone(), (Instant::now(), exists));
        Ok(exists)
    }

    /// Forgets what is known of `exchange`: it is asked again next time.
    fn forget_exchange(&self, exchange: &ShortString) {
        lock(&self.exchanges).remove(exchange);
    }
}

/// One due message, from its arrival to its ack (or its return).
async fn deliver(deliverer: Arc<Deliverer>, delivery: Delivery) {
    let outcome = match handle(&deliverer, &delivery).await {
        Ok(outcome) => outcome,
        Err(err) => {
            tracing::warn!(%err, "a scheduled delivery failed; the message goes back to the queue");
            wait_unless_closing(&deliverer, RETRY_PAUSE).await;
            let _ = requeue(&delivery);
            Scheduled::Failed
        }
    };
    metrics::counter!(crate::metrics_names::SCHEDULED_TOTAL, "outcome" => outcome.as_str()).increment(1);
}

/// What a scheduler did with one due message: the `outcome` of
/// `acemq_scheduled_total` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheduled {
    /// Delivered to its destination, then acked.
    Delivered,
    /// Delivered from a copy the broker had given out before (a possible
    /// duplicate, with the same id), then acked.
    Redelivered,
    /// Back onto the ladder, early, then acked.
    Rescheduled,
    /// Set aside in `acemq.delay.delivery.dlq`, then acked.
    DeadLettered,
    /// Handed back to the queue after a failure, to be tried again.
    Failed,
    /// Handed back unfinished when closing.
    Returned,
}

impl Scheduled {
    /// Its label in `acemq_scheduled_total{outcome}`.
    fn as_str(self) -> &'static str {
        match self {
            Scheduled::Delivered => "delivered",
            Scheduled::Redelivered => "redelivered",
            Scheduled::Rescheduled => "rescheduled",
            Scheduled::DeadLettered => "dead_lettered",
            Scheduled::Failed => "failed",
            Scheduled::Returned => "returned",
        }
    }
}

/// Where a due message goes, from its headers.
pub(crate) struct Target {
    exchange: ShortString,
    routing_key: ShortString,
    /// `x-acemq-deliver-at`, seconds.
    deliver_at: Option<u64>,
}

impl Target {
    /// When it falls due: `x-acemq-deliver-at`, or `None` (due now) when
    /// there is none or it is no time a clock can hold (past
    /// 9999-12-31T23:59:59Z).
    pub(crate) fn due(&self) -> Option<SystemTime> {
        self.deliver_at.and_then(crate::envelope::time_of_secs)
    }
}

/// The destination in `properties`, or why there is none. A
/// `x-acemq-deliver-at` that is not a non-negative integer or timestamp is
/// read as absent.
pub(crate) fn target_of(properties: &BasicProperties) -> Result<Target, String> {
    let headers = properties.headers.as_ref();
    let text = |name: &str| -> Result<ShortString, String> {
        let value = headers
            .and_then(|h| h.get(name))
            .ok_or_else(|| format!("a scheduled message without {name}"))?;
        let text = value
            .as_str()
            .ok_or_else(|| format!("{name} is not a UTF-8 string ({value:?})"))?;
        if text.len() > 255 {
            return Err(format!("{name} is longer than 255 bytes"));
        }
        Ok(ShortString::from(text))
    };
    Ok(Target {
        exchange: text(DELIVER_TO_EXCHANGE_HEADER)?,
        routing_key: text(DELIVER_TO_ROUTING_KEY_HEADER)?,
        deliver_at: headers
            .and_then(|h| h.get(DELIVER_AT_HEADER))
            .and_then(FieldValue::as_i64)
            .and_then(|secs| u64::try_from(secs).ok()),
    })
}

async fn handle(deliverer: &Deliverer, delivery: &Delivery) -> Result<Scheduled, Error> {
    let properties = match &delivery.properties {
        Ok(properties) => properties.as_ref(),
        Err(raw) => {
            let salvaged = raw.salvage();
            let reason = format!(
                "the scheduled message's properties could not be decoded: {} (not kept: {})",
                raw.error,
                salvaged.lost.join(", ")
            );
            set_aside(deliverer, delivery, salvaged.properties, &reason).await?;
            ack(delivery)?;
            return Ok(Scheduled::DeadLettered);
        }
    };
    let input_id = match &properties.message_id {
        Some(id) => id.to_string_lossy().into_owned(),
        None => Envelope::read_from_message(properties, &delivery.body).id,
    };
    let target = match target_of(properties) {
        Ok(target) => target,
        Err(reason) => {
            let mut kept = properties.clone();
            kept.message_id = Some(input_id.as_str().into());
            set_aside(deliverer, delivery, kept, &reason).await?;
            ack(delivery)?;
            return Ok(Scheduled::DeadLettered);
        }
    };
    if let Some(due) = target.due() {
        if let Ok(early) = due.duration_since(wall_clock()) {
            if early > HOLD_AT_MOST {
                reschedule(deliverer, delivery, properties, &input_id, early).await?;
                ack(delivery)?;
                return Ok(Scheduled::Rescheduled);
            }
            if !early.is_zero() && !wait_unless_closing(deliverer, early).await {
                requeue(delivery)?;
                return Ok(Scheduled::Returned);
            }
        }
    }
    let output = delivered_properties(properties, &input_id, &target);
    let message_id = output.message_id.as_ref().map(|id| id.to_string()).unwrap_or_default();
    if !deliverer.exchange_exists(&target.exchange).await? {
        let reason = format!(
            "the scheduled delivery failed: exchange {:?} does not exist (404 NOT_FOUND)",
            target.exchange.to_string_lossy()
        );
        set_aside(deliverer, delivery, with_destination(output, &target), &reason).await?;
        ack(delivery)?;
        return Ok(Scheduled::DeadLettered);
    }
    let publish = BasicPublish {
        exchange: target.exchange.clone(),
        routing_key: target.routing_key.clone(),
        mandatory: true,
        ..Default::default()
    };
    let published = deliverer
        .conn
        .publish_library(publish, output.clone(), delivery.body.clone(), &message_id)
        .await;
    match published {
        Ok(_) => {
            ack(delivery)?;
            Ok(if delivery.redelivered {
                Scheduled::Redelivered
            } else {
                Scheduled::Delivered
            })
        }
        Err(err @ Error::Unroutable { .. }) => {
            let reason = format!("the scheduled delivery failed: {err}");
            set_aside(deliverer, delivery, with_destination(output, &target), &reason).await?;
            ack(delivery)?;
            Ok(Scheduled::DeadLettered)
        }
        // A refusal closes the library channel, perhaps for another publish
        // (an exchange deleted since it was checked): tried again, the
        // exchange asked about afresh.
        Err(err @ Error::Refused { .. }) => {
            deliverer.forget_exchange(&target.exchange);
            Err(err)
        }
        Err(err) => Err(err),
    }
}

/// The delivered copy as it is set aside: with its destination as
/// `x-acemq-original-exchange` and `-routing-key`, so that a replay
/// delivers it.
fn with_destination(mut output: BasicProperties, target: &Target) -> BasicProperties {
    let headers = output.headers.get_or_insert_with(FieldTable::new);
    headers.insert(ORIGINAL_EXCHANGE_HEADER, FieldValue::from(target.exchange.to_string()));
    headers.insert(
        ORIGINAL_ROUTING_KEY_HEADER,
        FieldValue::from(target.routing_key.to_string()),
    );
    output
}

/// The id of the delivered copy of scheduled message `input_id`: the
/// hop's derived id ([`hop_id`]) for a delivery to this destination at this
/// due time, the same for every copy of it.
fn delivered_id(input_id: &str, target: &Target) -> String {
    let at = target.deliver_at.map_or_else(String::new, |secs| secs.to_string());
    let hop = format!(
        "scheduled:{}/{}@{at}",
        target.exchange.to_string_lossy(),
        target.routing_key.to_string_lossy()
    );
    hop_id(input_id, &hop)
}

/// The properties of the delivered copy (see the module docs).
pub(crate) fn delivered_properties(input: &BasicProperties, input_id: &str, target: &Target) -> BasicProperties {
    let mut output = input.clone();
    output.message_id = Some(delivered_id(input_id, target).as_str().into());
    output.expiration = None;
    output.user_id = None;
    let mut headers = FieldTable::new();
    for (key, value) in input.headers.iter().flat_map(FieldTable::iter) {
        let k = key.as_bytes();
        let dropped = is_death_header(k)
            || k == b"x-delivery-count"
            || [
                DELIVER_TO_EXCHANGE_HEADER,
                DELIVER_TO_ROUTING_KEY_HEADER,
                DELIVER_AT_HEADER,
                ATTEMPT_HEADER,
                FIRST_SEEN_HEADER,
                CAUSATION_HEADER,
                ERROR_HEADER,
                ORIGINAL_EXCHANGE_HEADER,
                ORIGINAL_ROUTING_KEY_HEADER,
                REPLAYED_HEADER,
            ]
            .iter()
            .any(|h| h.as_bytes() == k);
        if !dropped {
            headers.push(key.clone(), value.clone());
        }
    }
    headers.insert(ATTEMPT_HEADER, FieldValue::I32(1));
    headers.insert(FIRST_SEEN_HEADER, FieldValue::Timestamp(unix_seconds(wall_clock())));
    headers.insert(CAUSATION_HEADER, FieldValue::from(input_id));
    output.headers = Some(headers);
    output
}

/// Puts a message that came `early` back onto the ladder for what remains,
/// as it was (same id and headers, without the broker's `x-death`).
async fn reschedule(
    deliverer: &Deliverer,
    delivery: &Delivery,
    properties: &BasicProperties,
    input_id: &str,
    early: Duration,
) -> Result<(), Error> {
    let delay_secs = whole_seconds_up(early).min(MAX_DELAY.as_secs());
    let mut again = properties.clone();
    again.message_id = Some(input_id.into());
    again.expiration = None;
    if let Some(headers) = again.headers.take() {
        let mut kept = FieldTable::new();
        for (key, value) in headers.iter().filter(|(key, _)| !is_death_header(key.as_bytes())) {
            kept.push(key.clone(), value.clone());
        }
        again.headers = Some(kept);
    }
    tracing::info!(
        message_id = input_id,
        ?early,
        "a scheduled message came early; back onto the ladder"
    );
    let publish = BasicPublish {
        exchange: level_name(entry_level(delay_secs)).as_str().into(),
        routing_key: ladder_routing_key(delay_secs).as_str().into(),
        mandatory: true,
        ..Default::default()
    };
    deliverer
        .conn
        .publish_library(publish, again, delivery.body.clone(), input_id)
        .await
        .map(|_| ())
}

/// Sets a message aside in `acemq.delay.delivery.dlq` through `acemq.dlx`,
/// with the reason in `x-acemq-error`.
async fn set_aside(
    deliverer: &Deliverer,
    delivery: &Delivery,
    mut properties: BasicProperties,
    reason: &str,
) -> Result<(), Error> {
    let reason = crate::text::prefix_within(reason, crate::consume::MAX_ERROR_TEXT);
    properties
        .headers
        .get_or_insert_with(FieldTable::new)
        .insert(ERROR_HEADER, FieldValue::from(reason));
    let message_id = properties
        .message_id
        .as_ref()
        .map(|id| id.to_string())
        .unwrap_or_default();
    tracing::warn!(%message_id, reason, "setting a scheduled message aside");
    let publish = BasicPublish {
        exchange: DLX.into(),
        routing_key: format!("{DELIVERY}.dlq").as_str().into(),
        mandatory: true,
        ..Default::default()
    };
    deliverer
        .conn
        .publish_library(publish, properties, delivery.body.clone(), &message_id)
        .await
        .map(|_| ())
}

/// Sleeps `wait`, or less if the scheduler starts closing: whether the
/// whole wait was slept.
async fn wait_unless_closing(deliverer: &Deliverer, wait: Duration) -> bool {
    let mut shutdown = deliverer.shutdown.clone();
    tokio::select! {
        _ = tokio::time::sleep(wait) => true,
        _ = shutdown.wait_for(|stop| *stop) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routing_key_is_the_delays_bits_most_significant_first() {
        let key = ladder_routing_key(10);
        let bits: Vec<&str> = key.split('.').collect();
        assert_eq!(bits.len(), 28);
        assert_eq!(bits[24..], ["1", "0", "1", "0"]);
        assert!(bits[..24].iter().all(|b| *b == "0"));
        assert_eq!(ladder_routing_key(MAX_DELAY.as_secs()), vec!["1"; 28].join("."));
        assert_eq!(entry_level(0), 0);
        assert_eq!(entry_level(1), 0);
        assert_eq!(entry_level(10), 3);
        assert_eq!(entry_level(3600), 11);
        assert_eq!(entry_level(30 * 24 * 3600), 21);
        assert_eq!(entry_level(MAX_DELAY.as_secs()), 27);
    }

    /// Topic matching for the ladder's patterns (`*`, a literal, a trailing `#`).
    fn matches(pattern: &str, key: &str) -> bool {
        let pattern: Vec<&str> = pattern.split('.').collect();
        let key: Vec<&str> = key.split('.').collect();
        let (fixed, rest) = match pattern.split_last() {
            Some((&"#", fixed)) => (fixed, true),
            _ => (&pattern[..], false),
        };
        (key.len() == fixed.len() || (rest && key.len() > fixed.len()))
            && fixed.iter().zip(&key).all(|(p, k)| *p == "*" || p == k)
    }

    /// Follows a message through the declared ladder: the queues it waits
    /// in, summed, and where it ends.
    fn walk(delay_secs: u64) -> (u64, Vec<String>) {
        let declarations = ladder_declarations();
        let ttl_of = |queue: &str| {
            declarations.iter().find_map(|d| match d {
                Declaration::Queue { name, arguments, .. } if name == queue => Some((
                    arguments.get("x-message-ttl").and_then(FieldValue::as_i64),
                    arguments
                        .get("x-dead-letter-exchange")
                        .and_then(FieldValue::as_str)
                        .map(str::to_owned),
                )),
                _ => None,
            })
        };
        let key = ladder_routing_key(delay_secs);
        let mut exchange = level_name(entry_level(delay_secs));
        let (mut waited_ms, mut queues) = (0u64, Vec::new());
        loop {
            let mut reached = Vec::new();
            let mut exchanges = vec![exchange.clone()];
            while let Some(x) = exchanges.pop() {
                for d in &declarations {
                    match d {
                        Declaration::Bind {
                            queue,
                            exchange,
                            routing_key,
                            ..
                        } if *exchange == x && matches(routing_key, &key) => reached.push(queue.clone()),
                        Declaration::ExchangeBind {
                            destination,
                            source,
                            routing_key,
                            ..
                        } if *source == x && matches(routing_key, &key) => exchanges.push(destination.clone()),
                        _ => {}
                    }
                }
            }
            assert_eq!(
                reached.len(),
                1,
                "{delay_secs} s reaches one queue from {exchange}: {reached:?}"
            );
            let queue = reached.pop().unwrap();
            queues.push(queue.clone());
            if queue == DELIVERY {
                return (waited_ms / 1000, queues);
            }
            let (ttl, dlx) = ttl_of(&queue).expect("a ladder queue");
            waited_ms += ttl.unwrap() as u64;
            exchange = dlx.expect("every level dead-letters");
        }
    }

    #[test]
    fn every_delay_waits_exactly_its_seconds_in_the_queues_of_its_set_bits() {
        for delay in [0, 1, 2, 3, 10, 3600, 30 * 24 * 3600, 1 << 27, MAX_DELAY.as_secs()] {
            let (waited, queues) = walk(delay);
            assert_eq!(waited, delay, "{queues:?}");
            let levels: Vec<String> = (0..LEVELS)
                .rev()
                .filter(|l| delay >> l & 1 == 1)
                .map(level_name)
                .collect();
            assert_eq!(queues[..queues.len() - 1], levels[..]);
        }
        assert_eq!(walk(10).1, ["acemq.delay.03", "acemq.delay.01", DELIVERY]);
    }

    #[test]
    fn ttls_are_32_bit_where_they_fit_and_64_bit_above() {
        assert_eq!(level_ttl(0), FieldValue::I32(1000));
        assert_eq!(level_ttl(21), FieldValue::I32(2_097_152_000));
        assert_eq!(level_ttl(22), FieldValue::I64(4_194_304_000));
        assert_eq!(level_ttl(27), FieldValue::I64(134_217_728_000));
    }

    #[test]
    fn the_delivered_id_is_stable_and_names_the_hop() {
        let to = |key: &str| Target {
            exchange: "orders".into(),
            routing_key: key.into(),
            deliver_at: Some(100),
        };
        let a = delivered_id("m-1", &to("placed"));
        assert_eq!(a, delivered_id("m-1", &to("placed")));
        assert_ne!(a, delivered_id("m-2", &to("placed")));
        assert_ne!(a, delivered_id("m-1", &to("other")));
        assert_ne!(a, "m-1");
        assert!(uuid::Uuid::parse_str(&a).is_ok());
    }
}
