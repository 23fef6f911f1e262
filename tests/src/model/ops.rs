//! What the model-based test of the consumer generates: a set-up (queues,
//! retry policy, prefetch) and a sequence of operations on it, as plain
//! data (so a shrunk failure prints as a sequence to commit as a test).
//!
//! It must never hold anything that is not `Debug` and `Clone`: proptest
//! prints and copies these while shrinking.

use std::time::Duration;

use acemq_core::RetryPolicy;
use proptest::prelude::*;

/// The type of a source queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueType {
    /// A durable classic queue without arguments: a broker redelivery shows
    /// only as `redelivered`.
    Classic,
    /// A durable quorum queue with acemq's dead-letter arguments: a broker
    /// redelivery also raises `x-delivery-count`.
    Quorum,
}

/// Where the policy's waits are spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waits {
    /// Every wait in the consumer ([`IN_PROCESS_WAIT`], no rungs).
    InProcess,
    /// Every wait on one rung ([`RUNG_WAIT`]).
    Rungs,
    /// The first wait in the consumer, the later ones on rungs.
    Both,
}

/// The in-process wait: tens of milliseconds, so a sequence runs in about a second.
pub const IN_PROCESS_WAIT: Duration = Duration::from_millis(20);
/// The rung wait (its queue's `x-message-ttl`): the broker dead-letters the
/// message back to its queue after it.
pub const RUNG_WAIT: Duration = Duration::from_millis(40);

/// The set-up of a sequence: one or two source queues, one consumer on each
/// (the same handler and policy, on one `Conn`), and the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// The source queues (one or two).
    pub queues: Vec<QueueType>,
    /// Where the waits are spent.
    pub waits: Waits,
    /// The policy's `max_attempts` (the first delivery counts).
    pub max_attempts: u32,
    /// Each consumer's prefetch.
    pub prefetch: u16,
}

impl Setup {
    /// The retry policy the consumers run with.
    pub fn policy(&self) -> RetryPolicy {
        match self.waits {
            Waits::InProcess => RetryPolicy::fixed(self.max_attempts, IN_PROCESS_WAIT)
                .with_jitter(0.2)
                .wait_in_broker_from(Duration::ZERO),
            Waits::Rungs => RetryPolicy::fixed(self.max_attempts, RUNG_WAIT).wait_in_broker_from(RUNG_WAIT),
            // 20 ms in the consumer, then 40 ms and more on rungs.
            Waits::Both => RetryPolicy::exponential(self.max_attempts, IN_PROCESS_WAIT, RUNG_WAIT * 2)
                .with_jitter(0.2)
                .wait_in_broker_from(RUNG_WAIT),
        }
    }
}

/// What the handler answers on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `Ack::accept()`.
    Accept,
    /// `Ack::retry(err)`.
    Retry,
    /// `Ack::retry(fatal(err))`.
    Fatal,
    /// `Ack::retry(fatal(err))` with an error text of [`LONG_ERROR`] bytes
    /// (the set-aside trims it to fit `frame_max`).
    LongFatal,
    /// `Ack::park(reason)`.
    Park,
    /// The handler panics: a failed attempt, settled like a retry.
    Panic,
    /// The handler takes [`SLOW`], then accepts.
    Slow,
}

/// The length of a [`Outcome::LongFatal`] error text.
pub const LONG_ERROR: usize = 20 * 1024;
/// How long a [`Outcome::Slow`] handler takes.
pub const SLOW: Duration = Duration::from_millis(60);

/// The `timestamp` property another producer may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timestamp {
    /// None.
    Absent,
    /// A plausible one (November 2023).
    Plausible,
    /// At an edge of the 64-bit field: 0, 2^63 - 1, 2^63, 2^63 + 1, `u64::MAX`.
    Edge(u64),
}

impl Timestamp {
    /// The property's value.
    pub fn value(self) -> Option<u64> {
        match self {
            Timestamp::Absent => None,
            Timestamp::Plausible => Some(1_700_000_000),
            Timestamp::Edge(v) => Some(v),
        }
    }
}

/// The edges a [`Timestamp::Edge`] is drawn from: a consumer must read
/// those past `i64` (2^63 and more) as absent.
pub const TIMESTAMP_EDGES: [u64; 5] = [0, (1 << 63) - 1, 1 << 63, (1 << 63) + 1, u64::MAX];

/// What another producer may put into a message that acemq reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostile {
    /// Nothing.
    Nothing,
    /// `x-acemq-attempt` as a string ("5"): read as absent.
    AttemptString,
    /// `x-acemq-attempt` negative (-2): read as absent.
    AttemptNegative,
    /// `x-acemq-attempt` 3 written as a 64-bit integer, as another language
    /// might: read as 3.
    AttemptLong,
    /// `x-acemq-first-seen` as a table: read as absent.
    FirstSeenTable,
    /// `x-acemq-first-seen` as a timestamp of `u64::MAX`: read as absent.
    FirstSeenHuge,
    /// A header table within [`NEAR_FRAME_MAX`] bytes of `frame_max`.
    NearFrameMax,
    /// A body that is not JSON: set aside at once, never handled.
    Undecodable,
    /// An `x-acemq-routing-slip` the producer wrote, whose next step is the
    /// queue's sink (`{queue}.sink`): a consumer built without
    /// `.routing_slips(...)` never follows it.
    ForeignSlip,
}

/// How far below `frame_max` a [`Hostile::NearFrameMax`] message's header
/// frame is: room for a retry's headers and the broker's `x-death`, not for
/// a long error text.
pub const NEAR_FRAME_MAX: usize = 3 * 1024;

/// How long a [`Op::Cancel`] with `gap` leaves the queue deleted.
pub const CANCEL_GAP: Duration = Duration::from_millis(150);

/// The properties of one publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Props {
    /// With a `message-id` (without one, acemq derives it from the message).
    pub message_id: bool,
    /// Persistent (`delivery-mode` 2).
    pub persistent: bool,
    /// The `timestamp` property.
    pub timestamp: Timestamp,
    /// One hostile thing, or nothing.
    pub hostile: Hostile,
}

/// One step of a sequence. Each acts on the broker or the consumer as it
/// is when the step comes; one that makes no sense then (`Close` while
/// nothing runs) does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Another producer publishes one message (the next number) to queue
    /// `q` with the low-level channel; the handler answers its calls with
    /// `script` in order, then accepts.
    Publish {
        /// The queue's index in the set-up (modulo their number).
        q: usize,
        /// Its properties.
        props: Props,
        /// The handler's answer to each call.
        script: Vec<Outcome>,
    },
    /// Another client takes the message at the head of queue `q` with
    /// `basic.get` and nacks it with requeue: a broker redelivery.
    Steal {
        /// The queue's index.
        q: usize,
    },
    /// A new `Conn` and one consumer per queue.
    Start,
    /// `Conn::close()`.
    Close,
    /// The broker closes the consumer's connections (acemq-memory: its
    /// fault handle, 320 CONNECTION_FORCED; RabbitMQ: the test's proxy cuts
    /// them); the `Conn` recovers.
    ForceClose,
    /// Another client deletes `{queue}.dlq` (after reading what it holds).
    DeleteDlq {
        /// The queue's index.
        q: usize,
    },
    /// Another client deletes queue `q` and declares it again, as a
    /// deployment's topology does: the broker cancels its consumer
    /// (`basic.cancel`), which must subscribe again once the queue is back
    /// and go on. What the deleted queue held (ready, or delivered and not
    /// yet acknowledged) went with it: the deleting client's loss.
    Cancel {
        /// The queue's index.
        q: usize,
        /// Declared again only after [`CANCEL_GAP`], so that the consumer's
        /// first tries to subscribe again find no queue.
        gap: bool,
    },
    /// Waits until every message the running consumer has is done: quiet.
    Quiet,
}

fn queue_type() -> impl Strategy<Value = QueueType> {
    prop_oneof![Just(QueueType::Classic), Just(QueueType::Quorum)]
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop::collection::vec(queue_type(), 1..=2),
        prop_oneof![Just(Waits::InProcess), Just(Waits::Rungs), Just(Waits::Both)],
        1u32..=5,
        1u16..=4,
    )
        .prop_map(|(queues, waits, max_attempts, prefetch)| Setup {
            queues,
            waits,
            max_attempts,
            prefetch,
        })
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        4 => Just(Outcome::Accept),
        4 => Just(Outcome::Retry),
        1 => Just(Outcome::Fatal),
        1 => Just(Outcome::LongFatal),
        1 => Just(Outcome::Park),
        1 => Just(Outcome::Panic),
        1 => Just(Outcome::Slow),
    ]
}

fn timestamp() -> impl Strategy<Value = Timestamp> {
    prop_oneof![
        4 => Just(Timestamp::Absent),
        2 => Just(Timestamp::Plausible),
        1 => prop::sample::select(TIMESTAMP_EDGES.to_vec()).prop_map(Timestamp::Edge),
    ]
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        12 => Just(Hostile::Nothing),
        1 => Just(Hostile::AttemptString),
        1 => Just(Hostile::AttemptNegative),
        1 => Just(Hostile::AttemptLong),
        1 => Just(Hostile::FirstSeenTable),
        1 => Just(Hostile::FirstSeenHuge),
        1 => Just(Hostile::NearFrameMax),
        1 => Just(Hostile::Undecodable),
        1 => Just(Hostile::ForeignSlip),
    ]
}

fn props() -> impl Strategy<Value = Props> {
    (any::<bool>(), any::<bool>(), timestamp(), hostile()).prop_map(|(message_id, persistent, timestamp, hostile)| {
        Props {
            message_id,
            persistent,
            timestamp,
            hostile,
        }
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..2, props(), prop::collection::vec(outcome(), 0..=4))
            .prop_map(|(q, props, script)| Op::Publish { q, props, script }),
        2 => (0usize..2).prop_map(|q| Op::Steal { q }),
        3 => Just(Op::Start),
        1 => Just(Op::Close),
        1 => Just(Op::ForceClose),
        1 => (0usize..2).prop_map(|q| Op::DeleteDlq { q }),
        1 => (0usize..2, any::<bool>()).prop_map(|(q, gap)| Op::Cancel { q, gap }),
        2 => Just(Op::Quiet),
    ]
}

/// A set-up and up to `max_len` operations.
pub fn sequence(max_len: usize) -> impl Strategy<Value = (Setup, Vec<Op>)> {
    (setup(), prop::collection::vec(op(), 1..=max_len))
}
