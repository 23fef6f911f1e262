//! The connection machine's timers: a closed set, each with its deadline
//! kept by the machine, so that the driver only ever asks for the earliest
//! one ([`super::Connection::poll_timeout`]) and calls
//! [`super::Connection::handle_timeout`] when it has passed.
//!
//! Every wait for the broker has one: the handshake, each `channel.open`,
//! every other synchronous call on a channel (declare, bind, qos, consume,
//! cancel, get, purge, delete, `tx.*`, `confirm.select`, ...), each
//! `connection.update-secret`, each channel `close-ok`, and the
//! connection's `close-ok`. A broker that
//! stays connected but never answers (a quorum queue that lost its
//! majority does this) ends the wait with a typed error naming what was
//! awaited; nothing waits for ever, even with heartbeats off. This file
//! holds no clock: deadlines are computed from the `now` the driver passes
//! in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The machine's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// `connection.start` through `open-ok` must be done by then.
    Handshake,
    /// Our `connection.close` must be answered by then.
    CloseOk,
    /// Time to say something, so the broker knows we are alive.
    HeartbeatSend,
    /// The broker has said nothing for two heartbeat intervals.
    HeartbeatIdle,
    /// The earliest channel wait (`open-ok` or `close-ok`).
    Channel,
    /// The earliest reply to a call on an open channel.
    Call,
    /// The oldest `connection.update-secret` still waiting for its `-ok`.
    SecretUpdate,
}

impl Timer {
    /// Every timer, in the order [`super::Connection::handle_timeout`]
    /// checks them.
    pub(crate) const ALL: [Timer; 7] = [
        Timer::Handshake,
        Timer::CloseOk,
        Timer::HeartbeatIdle,
        Timer::HeartbeatSend,
        Timer::Channel,
        Timer::Call,
        Timer::SecretUpdate,
    ];
}

/// What a deadline was waiting for, in the error it ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wait {
    /// The handshake (`connection.start`, `tune`, `open-ok`).
    Handshake,
    /// `channel.open-ok`.
    ChannelOpenOk,
    /// `channel.close-ok` after our `channel.close`.
    ChannelCloseOk,
    /// `connection.close-ok` after our `connection.close`.
    ConnectionCloseOk,
    /// The reply to a synchronous call on an open channel, or to
    /// `connection.update-secret` (bounded by [`Timeouts::call`] too).
    Reply {
        /// The call, e.g. `queue.declare`.
        to: &'static str,
    },
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Wait::Handshake => "the handshake",
            Wait::ChannelOpenOk => "channel.open-ok",
            Wait::ChannelCloseOk => "channel.close-ok",
            Wait::ConnectionCloseOk => "connection.close-ok",
            Wait::Reply { to } => return write!(f, "the reply to {to}"),
        })
    }
}

/// How long the machine waits for each answer from the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From the protocol header to `connection.open-ok`.
    pub handshake: Duration,
    /// For `channel.open-ok`. Time the broker spends blocking the
    /// connection (`connection.blocked`) does not count: RabbitMQ does not
    /// read a blocked connection at all.
    pub channel_open: Duration,
    /// For a `close-ok`, of a channel (blocked time not counted, as for
    /// `channel_open`) or of the connection.
    pub close: Duration,
    /// For the reply to any other synchronous call on an open channel
    /// (blocked time not counted, as for `channel_open`). When it passes,
    /// the call and every call queued behind it on that channel fail with
    /// [`Wait::Reply`], and the machine closes the channel: an answer that
    /// comes later would be taken for the answer to the next call.
    ///
    /// 30 s by default, as for the handshake and `channel.open`: long
    /// enough for a broker that is slow but working (a quorum queue's
    /// declare or delete waits for its members to agree; a purge or delete
    /// of a long queue takes seconds), short enough that a broker that
    /// stopped answering is noticed while someone still waits for it. For
    /// reference, the RabbitMQ .NET client waits 20 s
    /// (`ConnectionFactory.DefaultContinuationTimeout`) and the Java client
    /// 10 minutes (`ConnectionFactory.DEFAULT_CHANNEL_RPC_TIMEOUT`), which
    /// leaves a stuck service looking alive for a long time.
    pub call: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            handshake: Duration::from_secs(30),
            channel_open: Duration::from_secs(30),
            close: Duration::from_secs(10),
            call: Duration::from_secs(30),
        }
    }
}

impl Timeouts {
    /// How long `wait` may take.
    pub(crate) fn of(&self, wait: Wait) -> Duration {
        match wait {
            Wait::Handshake => self.handshake,
            Wait::ChannelOpenOk => self.channel_open,
            Wait::ChannelCloseOk | Wait::ConnectionCloseOk => self.close,
            Wait::Reply { .. } => self.call,
        }
    }
}

/// The deadlines of channel waits (keyed by channel) or of calls (keyed
/// by channel and call), earliest first.
///
/// A channel waits for at most one `open-ok` or `close-ok` at a time, and a
/// call for one reply; each deadline is kept in its own state, and this
/// queue only orders them so that the earliest is found without looking at
/// every channel. An entry that has stopped waiting (the answer came) is
/// stale and is skipped when its time comes. Most entries go at the back;
/// one with a shorter timeout than those before it is inserted in order.
#[derive(Debug)]
pub(crate) struct Deadlines<K> {
    queue: VecDeque<(Instant, K)>,
}

impl<K> Default for Deadlines<K> {
    fn default() -> Self {
        Deadlines { queue: VecDeque::new() }
    }
}

/// The deadlines of channels' `open-ok` and `close-ok`.
pub(crate) type ChannelDeadlines = Deadlines<u16>;

impl<K> Deadlines<K> {
    /// `key` starts waiting until `at`.
    pub(crate) fn arm(&mut self, at: Instant, key: K) {
        // Open and close timeouts may differ: keep the queue sorted.
        let index = self.queue.partition_point(|(t, _)| *t <= at);
        self.queue.insert(index, (at, key));
    }

    /// The earliest deadline, stale or not.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.queue.front().map(|(at, _)| *at)
    }

    /// The next entry due at `now`, if any.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, K)> {
        match self.queue.front() {
            Some((at, _)) if *at <= now => self.queue.pop_front(),
            _ => None,
        }
    }
}
