//! The operations a differential sequence is made of, and the proptest
//! strategies that generate them.
//!
//! An operation is an intention over a small universe (two connections
//! with two channels each, three queues, four exchanges), not a frame: the
//! runner turns it into methods against the state it has seen (which
//! delivery tag "the second unacked message" is, whether a channel must be
//! reopened), so every subsequence of a sequence is a sequence too and
//! proptest can shrink freely. Nothing here may generate what the brokers
//! answer by timing: TTLs and expiries are either 0 (decided at enqueue) or
//! an hour (never reached in a run).

use proptest::prelude::*;

/// How many connections a sequence uses.
pub const CONNECTIONS: usize = 2;
/// How many channels each connection has.
pub const CHANNELS: usize = 2;

/// One of the four channels: connection `0 / CHANNELS`, channel `0 % CHANNELS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ch(pub u8);

impl Ch {
    /// The connection it belongs to.
    pub fn conn(self) -> usize {
        usize::from(self.0) / CHANNELS
    }

    /// Its index on that connection.
    pub fn index(self) -> usize {
        usize::from(self.0) % CHANNELS
    }
}

/// A queue of the universe. Each slot has one type for the whole sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Q {
    /// A classic queue.
    Classic,
    /// A quorum queue.
    Quorum,
    /// A stream.
    Stream,
}

impl Q {
    /// Every slot.
    pub const ALL: [Q; 3] = [Q::Classic, Q::Quorum, Q::Stream];

    /// Its `x-queue-type`.
    pub fn queue_type(self) -> &'static str {
        match self {
            Q::Classic => "classic",
            Q::Quorum => "quorum",
            Q::Stream => "stream",
        }
    }

    /// A short name, used in queue names.
    pub fn short(self) -> &'static str {
        match self {
            Q::Classic => "qc",
            Q::Quorum => "qq",
            Q::Stream => "qs",
        }
    }
}

/// An exchange of the universe: one of each type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum X {
    /// A direct exchange.
    Direct,
    /// A fanout exchange.
    Fanout,
    /// A topic exchange.
    Topic,
    /// A headers exchange.
    Headers,
}

impl X {
    /// Every slot.
    pub const ALL: [X; 4] = [X::Direct, X::Fanout, X::Topic, X::Headers];

    /// Its exchange type.
    pub fn kind(self) -> &'static str {
        match self {
            X::Direct => "direct",
            X::Fanout => "fanout",
            X::Topic => "topic",
            X::Headers => "headers",
        }
    }
}

/// A routing or binding key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// `a`
    A,
    /// `b`
    B,
    /// `a.b`
    AB,
    /// `a.*` (a topic pattern; a plain key elsewhere)
    AStar,
    /// `#`
    Hash,
    /// The name of a queue (for the default exchange and dead-letter keys).
    Queue(Q),
}

/// Where a publish goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The default exchange.
    Default,
    /// One of the universe's exchanges.
    Exchange(X),
    /// An exchange nobody declares (404).
    Missing,
}

/// The matching arguments of a binding to the headers exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// No arguments (matches every message on a headers exchange).
    None,
    /// `x-match=all, h1=a`
    AllH1,
    /// `x-match=any, h1=a, h2=1`
    AnyH1H2,
    /// `x-match=all, h1=a, h2=1`
    AllH1H2,
}

/// An integer argument and the width it is written with: RabbitMQ compares
/// integer arguments by type class, so `I 5` and `l 5` are equivalent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
    /// Written as `I`.
    I(i32),
    /// Written as `l`.
    L(i32),
}

/// `x-overflow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// `drop-head`
    DropHead,
    /// `reject-publish`
    RejectPublish,
    /// `reject-publish-dlx`
    RejectPublishDlx,
}

/// `x-dead-letter-exchange`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dlx {
    /// The default exchange (`""`).
    Default,
    /// One of the universe's exchanges.
    Exchange(X),
}

/// The arguments of a queue declaration, each one present or not; the
/// values are those RabbitMQ compares on a redeclare.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueArgs {
    /// `x-message-ttl`
    pub message_ttl: Option<Int>,
    /// `x-max-length`
    pub max_length: Option<Int>,
    /// `x-overflow`
    pub overflow: Option<Overflow>,
    /// `x-dead-letter-exchange`
    pub dead_letter_exchange: Option<Dlx>,
    /// `x-dead-letter-routing-key`
    pub dead_letter_routing_key: Option<Key>,
    /// `x-expires`
    pub expires: Option<Int>,
    /// `x-delivery-limit` (quorum queues)
    pub delivery_limit: Option<Int>,
}

/// A message's properties, as generated; the runner adds a message-id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Props {
    /// `delivery-mode` 1 or 2.
    pub delivery_mode: Option<u8>,
    /// `expiration`: `"0"` (expires unless delivered at once) or an hour.
    pub expiration: Option<&'static str>,
    /// Header `h1`: `a` or `b`.
    pub h1: Option<&'static str>,
    /// Header `h2`: an `I` 1 or 2.
    pub h2: Option<i32>,
    /// `content-type` and `correlation-id`.
    pub labelled: bool,
}

/// `x-stream-offset` of a stream consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offset {
    /// No argument (`next`).
    Unset,
    /// `first`
    First,
    /// `last`
    Last,
    /// `next`
    Next,
    /// A number, as `l`.
    At(i64),
}

/// One step of a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // the fields are the method's, named as in the spec
pub enum Op {
    /// `queue.declare`; `other_type` declares the slot with the next slot's
    /// type (406 on a redeclare), `durable` false is inequivalent too.
    DeclareQueue {
        ch: Ch,
        q: Q,
        args: QueueArgs,
        durable: bool,
        passive: bool,
        other_type: bool,
    },
    /// `queue.delete`
    DeleteQueue {
        ch: Ch,
        q: Q,
        if_unused: bool,
        if_empty: bool,
    },
    /// `queue.purge`
    PurgeQueue { ch: Ch, q: Q },
    /// `exchange.declare`; `other_type` declares it as the next slot's type.
    DeclareExchange {
        ch: Ch,
        x: X,
        durable: bool,
        passive: bool,
        other_type: bool,
    },
    /// `exchange.delete`
    DeleteExchange { ch: Ch, x: X, if_unused: bool },
    /// `queue.bind`
    BindQueue { ch: Ch, q: Q, x: X, key: Key, args: Match },
    /// `queue.unbind`
    UnbindQueue { ch: Ch, q: Q, x: X, key: Key, args: Match },
    /// `exchange.bind`
    BindExchange {
        ch: Ch,
        destination: X,
        source: X,
        key: Key,
    },
    /// `exchange.unbind`
    UnbindExchange {
        ch: Ch,
        destination: X,
        source: X,
        key: Key,
    },
    /// `basic.publish` (on a channel in neither confirm nor tx mode the
    /// runner selects confirms first, so the publish has been routed when
    /// the next operation starts)
    Publish {
        ch: Ch,
        to: Target,
        key: Key,
        mandatory: bool,
        props: Props,
    },
    /// `basic.get`
    Get { ch: Ch, q: Q, no_ack: bool },
    /// `basic.consume` (with `basic.qos` first when `prefetch` says so).
    /// A channel holds one consumer at most (see the runner).
    Consume {
        ch: Ch,
        q: Q,
        no_ack: bool,
        exclusive: bool,
        server_tag: bool,
        prefetch: Option<u16>,
        offset: Offset,
    },
    /// `basic.cancel` of the channel's consumer.
    Cancel { ch: Ch },
    /// `basic.ack` of the `pick`th unacked delivery of the channel (an
    /// unknown tag when there is none).
    Ack { ch: Ch, pick: u8, multiple: bool },
    /// `basic.nack`
    Nack {
        ch: Ch,
        pick: u8,
        multiple: bool,
        requeue: bool,
    },
    /// `basic.reject`
    Reject { ch: Ch, pick: u8, requeue: bool },
    /// `basic.recover` with `requeue`.
    Recover { ch: Ch },
    /// `basic.qos` (per consumer).
    Qos { ch: Ch, prefetch: u16 },
    /// `confirm.select`
    ConfirmSelect { ch: Ch },
    /// `tx.select`
    TxSelect { ch: Ch },
    /// `tx.commit`
    TxCommit { ch: Ch },
    /// `tx.rollback`
    TxRollback { ch: Ch },
    /// `channel.close` (its unacked deliveries go back to their queues).
    CloseChannel { ch: Ch },
    /// `channel.flow` (RabbitMQ refuses `active=false` with a 540).
    Flow { ch: Ch, active: bool },
    /// A publish on a connection of its own, written frame by frame with
    /// one body frame of `frame_max` plus `over` bytes of payload (see
    /// `raw.rs`), to the classic queue's name.
    BodyFrame { over: i16 },
}

/// The body frame payload sizes tried, as their distance from `frame_max`:
/// the largest a client keeping to `frame_max` sends (-8), one below that,
/// one below `frame_max`, `frame_max` itself, and one over.
pub const BODY_FRAME_EDGES: [i16; 5] = [-8, -7, -1, 0, 1];

impl Op {
    /// The channel it is made on.
    pub fn channel(&self) -> Ch {
        match self {
            Op::DeclareQueue { ch, .. }
            | Op::DeleteQueue { ch, .. }
            | Op::PurgeQueue { ch, .. }
            | Op::DeclareExchange { ch, .. }
            | Op::DeleteExchange { ch, .. }
            | Op::BindQueue { ch, .. }
            | Op::UnbindQueue { ch, .. }
            | Op::BindExchange { ch, .. }
            | Op::UnbindExchange { ch, .. }
            | Op::Publish { ch, .. }
            | Op::Get { ch, .. }
            | Op::Consume { ch, .. }
            | Op::Cancel { ch }
            | Op::Ack { ch, .. }
            | Op::Nack { ch, .. }
            | Op::Reject { ch, .. }
            | Op::Recover { ch }
            | Op::Qos { ch, .. }
            | Op::ConfirmSelect { ch }
            | Op::TxSelect { ch }
            | Op::TxCommit { ch }
            | Op::TxRollback { ch }
            | Op::CloseChannel { ch }
            | Op::Flow { ch, .. } => *ch,
            Op::BodyFrame { .. } => Ch(0),
        }
    }
}

fn ch() -> impl Strategy<Value = Ch> {
    (0u8..(CONNECTIONS * CHANNELS) as u8).prop_map(Ch)
}

fn q() -> impl Strategy<Value = Q> {
    prop_oneof![4 => Just(Q::Classic), 4 => Just(Q::Quorum), 2 => Just(Q::Stream)]
}

/// A queue for an operation streams refuse (with a 540 that closes the
/// connection): a stream only now and then.
fn q_not_stream() -> impl Strategy<Value = Q> {
    prop_oneof![10 => Just(Q::Classic), 10 => Just(Q::Quorum), 1 => Just(Q::Stream)]
}

fn x() -> impl Strategy<Value = X> {
    prop_oneof![Just(X::Direct), Just(X::Fanout), Just(X::Topic), Just(X::Headers)]
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        Just(Key::A),
        Just(Key::B),
        Just(Key::AB),
        Just(Key::AStar),
        Just(Key::Hash),
        q().prop_map(Key::Queue),
    ]
}

fn int(values: &'static [i32]) -> impl Strategy<Value = Int> {
    (proptest::sample::select(values), any::<bool>()).prop_map(|(v, wide)| if wide { Int::L(v) } else { Int::I(v) })
}

fn queue_args(q: Q) -> BoxedStrategy<QueueArgs> {
    let overflow = prop_oneof![
        Just(Overflow::DropHead),
        Just(Overflow::RejectPublish),
        Just(Overflow::RejectPublishDlx)
    ];
    let dlx = prop_oneof![Just(Dlx::Default), x().prop_map(Dlx::Exchange)];
    // Streams take none of these; they are generated rarely there, to see
    // the refusal.
    let p = if q == Q::Stream { 0.05 } else { 0.3 };
    (
        proptest::option::weighted(p, int(&[0, 3_600_000])),
        // Not 0: a classic queue of max-length 0 hands a message straight
        // to a waiting consumer on RabbitMQ and drops it here (a known
        // difference, see acemq-memory's crate docs).
        proptest::option::weighted(p, int(&[1, 2])),
        proptest::option::weighted(p, overflow),
        proptest::option::weighted(p, dlx),
        proptest::option::weighted(p, key()),
        proptest::option::weighted(p / 2.0, int(&[3_600_000, 7_200_000])),
        proptest::option::weighted(if q == Q::Quorum { p } else { 0.02 }, int(&[1, 2])),
    )
        .prop_map(
            |(
                message_ttl,
                max_length,
                overflow,
                dead_letter_exchange,
                dead_letter_routing_key,
                expires,
                delivery_limit,
            )| {
                QueueArgs {
                    message_ttl,
                    max_length,
                    overflow,
                    dead_letter_exchange,
                    dead_letter_routing_key,
                    expires,
                    delivery_limit,
                }
            },
        )
        .boxed()
}

fn props() -> impl Strategy<Value = Props> {
    (
        proptest::option::of(1u8..=2),
        proptest::option::weighted(0.2, proptest::sample::select(&["0", "3600000"][..])),
        proptest::option::of(proptest::sample::select(&["a", "b"][..])),
        proptest::option::of(1i32..=2),
        any::<bool>(),
    )
        .prop_map(|(delivery_mode, expiration, h1, h2, labelled)| Props {
            delivery_mode,
            expiration,
            h1,
            h2,
            labelled,
        })
}

fn matching() -> impl Strategy<Value = Match> {
    prop_oneof![
        Just(Match::None),
        Just(Match::AllH1),
        Just(Match::AnyH1H2),
        Just(Match::AllH1H2)
    ]
}

fn offset() -> impl Strategy<Value = Offset> {
    prop_oneof![
        Just(Offset::Unset),
        Just(Offset::First),
        Just(Offset::Last),
        Just(Offset::Next),
        (0i64..4).prop_map(Offset::At),
    ]
}

fn declare_queue() -> impl Strategy<Value = Op> {
    (ch(), q())
        .prop_flat_map(|(ch, q)| {
            (
                Just(ch),
                Just(q),
                queue_args(q),
                proptest::bool::weighted(0.95),
                proptest::bool::weighted(0.1),
                proptest::bool::weighted(0.05),
            )
        })
        .prop_map(|(ch, q, args, durable, passive, other_type)| Op::DeclareQueue {
            ch,
            q,
            args,
            durable,
            passive,
            other_type,
        })
}

fn consume() -> impl Strategy<Value = Op> {
    (ch(), q())
        .prop_flat_map(|(ch, q)| {
            let stream = q == Q::Stream;
            (
                Just(ch),
                Just(q),
                // Streams close the connection on no-ack (540): rarely.
                proptest::bool::weighted(if stream { 0.02 } else { 0.3 }),
                proptest::bool::weighted(0.1),
                proptest::bool::weighted(0.3),
                // Streams need a prefetch: almost always given there.
                proptest::option::weighted(if stream { 0.97 } else { 0.6 }, 1u16..=3),
                offset(),
            )
        })
        .prop_map(|(ch, q, no_ack, exclusive, server_tag, prefetch, offset)| Op::Consume {
            ch,
            q,
            no_ack,
            exclusive,
            server_tag,
            prefetch,
            offset,
        })
}

/// One operation, weighted towards publishing and settling.
pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => declare_queue(),
        2 => (ch(), q(), proptest::bool::weighted(0.2), proptest::bool::weighted(0.2))
            .prop_map(|(ch, q, if_unused, if_empty)| Op::DeleteQueue { ch, q, if_unused, if_empty }),
        2 => (ch(), q_not_stream()).prop_map(|(ch, q)| Op::PurgeQueue { ch, q }),
        5 => (ch(), x(), proptest::bool::weighted(0.95), proptest::bool::weighted(0.1), proptest::bool::weighted(0.05))
            .prop_map(|(ch, x, durable, passive, other_type)| Op::DeclareExchange { ch, x, durable, passive, other_type }),
        1 => (ch(), x(), any::<bool>()).prop_map(|(ch, x, if_unused)| Op::DeleteExchange { ch, x, if_unused }),
        8 => (ch(), q(), x(), key(), matching()).prop_map(|(ch, q, x, key, args)| Op::BindQueue { ch, q, x, key, args }),
        1 => (ch(), q(), x(), key(), matching()).prop_map(|(ch, q, x, key, args)| Op::UnbindQueue { ch, q, x, key, args }),
        3 => (ch(), x(), x(), key()).prop_map(|(ch, destination, source, key)| Op::BindExchange { ch, destination, source, key }),
        1 => (ch(), x(), x(), key()).prop_map(|(ch, destination, source, key)| Op::UnbindExchange { ch, destination, source, key }),
        16 => (
            ch(),
            prop_oneof![6 => Just(Target::Default), 12 => x().prop_map(Target::Exchange), 1 => Just(Target::Missing)],
            key(),
            proptest::bool::weighted(0.3),
            props(),
        )
            .prop_map(|(ch, to, key, mandatory, props)| Op::Publish { ch, to, key, mandatory, props }),
        5 => (ch(), q_not_stream(), proptest::bool::weighted(0.3)).prop_map(|(ch, q, no_ack)| Op::Get { ch, q, no_ack }),
        5 => consume(),
        2 => ch().prop_map(|ch| Op::Cancel { ch }),
        5 => (ch(), any::<u8>(), proptest::bool::weighted(0.3)).prop_map(|(ch, pick, multiple)| Op::Ack { ch, pick, multiple }),
        3 => (ch(), any::<u8>(), proptest::bool::weighted(0.3), any::<bool>())
            .prop_map(|(ch, pick, multiple, requeue)| Op::Nack { ch, pick, multiple, requeue }),
        3 => (ch(), any::<u8>(), any::<bool>()).prop_map(|(ch, pick, requeue)| Op::Reject { ch, pick, requeue }),
        1 => ch().prop_map(|ch| Op::Recover { ch }),
        2 => (ch(), 0u16..=3).prop_map(|(ch, prefetch)| Op::Qos { ch, prefetch }),
        2 => ch().prop_map(|ch| Op::ConfirmSelect { ch }),
        1 => ch().prop_map(|ch| Op::TxSelect { ch }),
        2 => ch().prop_map(|ch| Op::TxCommit { ch }),
        1 => ch().prop_map(|ch| Op::TxRollback { ch }),
        1 => ch().prop_map(|ch| Op::CloseChannel { ch }),
        1 => (ch(), proptest::bool::weighted(0.3)).prop_map(|(ch, active)| Op::Flow { ch, active }),
        1 => proptest::sample::select(&BODY_FRAME_EDGES[..]).prop_map(|over| Op::BodyFrame { over }),
    ]
}

/// A sequence of up to 9 set-up operations, then 1 to `max_len` others:
/// declarations are likely early on, since most
/// operations are only interesting once something exists. With `raw`
/// false it holds no [`Op::BodyFrame`] (for brokers the harness cannot
/// write frames to by hand, see [`super::Broker::raw_frames`]).
pub fn sequence(max_len: usize, raw: bool) -> impl Strategy<Value = Vec<Op>> {
    let setup = prop_oneof![
        2 => declare_queue(),
        2 => (ch(), x()).prop_map(|(ch, x)| Op::DeclareExchange {
            ch,
            x,
            durable: true,
            passive: false,
            other_type: false
        }),
        2 => (ch(), q(), x(), key(), matching()).prop_map(|(ch, q, x, key, args)| Op::BindQueue { ch, q, x, key, args }),
        1 => (ch(), x(), x(), key()).prop_map(|(ch, destination, source, key)| Op::BindExchange { ch, destination, source, key }),
    ];
    (
        proptest::collection::vec(setup, 0..10),
        proptest::collection::vec(op(), 1..=max_len.max(1)),
    )
        .prop_map(move |(mut setup, rest)| {
            setup.extend(rest);
            if !raw {
                setup.retain(|op| !matches!(op, Op::BodyFrame { .. }));
            }
            setup
        })
}
