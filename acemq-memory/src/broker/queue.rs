//! Queues: the ready list of classic and quorum queues (TTL from the head,
//! max-length, requeue in original order), and the append-only log of
//! streams. A queue never talks to consumers itself; the broker does that.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_codec::{FieldTable, ShortString};

use super::args::{Overflow, QueueKind, QueueSettings};
use super::ids::ConnId;
use super::message::Message;
use super::stream::StreamLog;

/// A message in a queue, with its queue-side bookkeeping.
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub msg: Arc<Message>,
    /// Position in the queue; a requeued message goes back to its place.
    pub seq: u64,
    pub expires_at: Option<Instant>,
    pub redelivered: bool,
    /// Quorum queues: how many times it was returned.
    pub delivery_count: u64,
    /// Priority queues: its priority, capped at `x-max-priority` (0 elsewhere).
    pub priority: u8,
}

impl Queued {
    /// Whether it is served before a message of `priority` published as
    /// `seq`: higher priority first, then in publish order.
    fn ahead_of(&self, priority: u8, seq: u64) -> bool {
        self.priority > priority || (self.priority == priority && self.seq < seq)
    }
}

/// A consumer, as the queue knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsumerRef {
    pub conn: ConnId,
    pub channel: u16,
    pub tag: ShortString,
    pub exclusive: bool,
    /// `x-priority` of `basic.consume` (0 without one).
    pub priority: i64,
}

/// Why a message left a queue for a dead-letter exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeathReason {
    Rejected,
    Expired,
    MaxLen,
    DeliveryLimit,
}

impl DeathReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeathReason::Rejected => "rejected",
            DeathReason::Expired => "expired",
            DeathReason::MaxLen => "maxlen",
            DeathReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// What became of a message offered to a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueued {
    Accepted,
    /// `x-overflow=reject-publish`: refused, the publisher gets a nack.
    Rejected,
}

#[derive(Debug)]
pub(crate) struct Queue {
    pub name: ShortString,
    pub durable: bool,
    pub auto_delete: bool,
    pub exclusive_owner: Option<ConnId>,
    pub arguments: FieldTable,
    pub settings: QueueSettings,
    pub ready: VecDeque<Queued>,
    pub ready_bytes: u64,
    next_seq: u64,
    /// In the order they registered.
    pub consumers: Vec<ConsumerRef>,
    pub round_robin: usize,
    /// The distinct consumer priorities, highest first.
    pub consumer_levels: Vec<i64>,
    /// Single active consumer: the one that gets deliveries.
    pub active: Option<(ConnId, u16, ShortString)>,
    /// Quorum queues: cancelled consumers that still hold unacked
    /// messages, with how many (RabbitMQ counts them as consumers).
    pub lingering: Vec<((ConnId, u16, ShortString), u32)>,
    /// Quorum queues: how many messages at the head of `ready` were
    /// returned (served first, in the order they came back).
    returned: usize,
    /// Messages delivered and not yet settled.
    pub unacked: u64,
    pub last_used: Instant,
    pub had_consumers: bool,
    pub log: StreamLog,
    /// The deadline of its current timer in the broker's timer heap.
    pub scheduled: Option<Instant>,
}

impl Queue {
    pub fn new(
        name: ShortString,
        durable: bool,
        auto_delete: bool,
        exclusive_owner: Option<ConnId>,
        arguments: FieldTable,
        settings: QueueSettings,
        now: Instant,
    ) -> Self {
        Queue {
            name,
            durable,
            auto_delete,
            exclusive_owner,
            arguments,
            ready: VecDeque::new(),
            ready_bytes: 0,
            next_seq: 0,
            consumers: Vec::new(),
            round_robin: 0,
            consumer_levels: Vec::new(),
            active: None,
            lingering: Vec::new(),
            returned: 0,
            unacked: 0,
            last_used: now,
            had_consumers: false,
            log: StreamLog::new(&settings),
            scheduled: None,
            settings,
        }
    }

    pub fn is_stream(&self) -> bool {
        self.settings.kind == QueueKind::Stream
    }

    /// Ready messages (the log length for a stream).
    pub fn message_count(&self) -> usize {
        if self.is_stream() {
            self.log.len()
        } else {
            self.ready.len()
        }
    }

    fn is_full(&self, extra_bytes: u64) -> bool {
        let over_count = self
            .settings
            .max_length
            .is_some_and(|max| self.ready.len() as u64 >= max);
        let over_bytes = self
            .settings
            .max_length_bytes
            .is_some_and(|max| self.ready_bytes + extra_bytes > max);
        over_count || over_bytes
    }

    fn over_limits(&self) -> bool {
        let over_count = self
            .settings
            .max_length
            .is_some_and(|max| self.ready.len() as u64 > max);
        let over_bytes = self.settings.max_length_bytes.is_some_and(|max| self.ready_bytes > max);
        over_count || over_bytes
    }

    /// Offers a new message. Messages dropped from the head to make room are
    /// pushed to `dropped`.
    pub fn enqueue(
        &mut self,
        msg: Arc<Message>,
        now: Instant,
        wall_ms: u64,
        dropped: &mut Vec<(Queued, DeathReason)>,
    ) -> Enqueued {
        if self.is_stream() {
            self.log.append(msg, wall_ms);
            return Enqueued::Accepted;
        }
        let size = msg.body.len() as u64;
        // RabbitMQ 3.10.8's quorum queues refuse a publish only once they
        // are over the limit (the publish that takes them over is kept),
        // and take reject-publish-dlx as drop-head.
        let quorum = self.settings.kind == QueueKind::Quorum;
        let (overflow, full) = match self.settings.overflow {
            Overflow::RejectPublishDlx if quorum => (Overflow::DropHead, false),
            other if quorum => (other, self.over_limits()),
            other => (other, self.is_full(size)),
        };
        match overflow {
            Overflow::RejectPublish | Overflow::RejectPublishDlx if full => {
                if overflow == Overflow::RejectPublishDlx {
                    let seq = self.next_seq;
                    dropped.push((self.queued(msg, seq, now), DeathReason::MaxLen));
                }
                return Enqueued::Rejected;
            }
            _ => {}
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let queued = self.queued(msg, seq, now);
        self.ready_bytes += size;
        if queued.priority == 0 {
            self.ready.push_back(queued);
        } else {
            let at = self.ready.partition_point(|m| m.ahead_of(queued.priority, queued.seq));
            self.ready.insert(at, queued);
        }
        // (A quorum queue with reject-publish stays over its limit.)
        while !(quorum && overflow == Overflow::RejectPublish) && self.over_limits() {
            match self.pop_ready() {
                Some(head) => dropped.push((head, DeathReason::MaxLen)),
                None => break,
            }
        }
        Enqueued::Accepted
    }

    fn queued(&self, msg: Arc<Message>, seq: u64, now: Instant) -> Queued {
        let ttl = match (self.settings.message_ttl, msg.expiration_ms()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let priority = match self.settings.max_priority {
            Some(max) => msg.properties().and_then(|p| p.priority).unwrap_or(0).min(max),
            None => 0,
        };
        Queued {
            msg,
            seq,
            expires_at: ttl.and_then(|ms| now.checked_add(Duration::from_millis(ms))),
            redelivered: false,
            delivery_count: 0,
            priority,
        }
    }

    pub fn pop_ready(&mut self) -> Option<Queued> {
        let head = self.ready.pop_front()?;
        self.ready_bytes -= head.msg.body.len() as u64;
        self.returned = self.returned.saturating_sub(1);
        Some(head)
    }

    /// Puts a returned message back: in a classic queue in its original
    /// place (among its priority), in a quorum queue after the messages
    /// returned before it, ahead of the rest (RabbitMQ's `returns`).
    pub fn requeue(&mut self, queued: Queued) {
        self.ready_bytes += queued.msg.body.len() as u64;
        let at = if self.settings.kind == QueueKind::Quorum {
            self.returned += 1;
            self.returned - 1
        } else {
            self.ready.partition_point(|m| m.ahead_of(queued.priority, queued.seq))
        };
        self.ready.insert(at.min(self.ready.len()), queued);
    }

    /// The consumer count `queue.declare-ok` reports: a quorum queue with a
    /// single active consumer counts only the active one, and a quorum
    /// queue counts cancelled consumers until their unacked messages are
    /// settled.
    pub fn consumer_count(&self) -> usize {
        if self.settings.kind != QueueKind::Quorum {
            return self.consumers.len();
        }
        let attached = if self.settings.single_active_consumer {
            self.consumers.len().min(1)
        } else {
            self.consumers.len()
        };
        attached + self.lingering.len()
    }

    /// Drops expired messages, but only from the head: a message with a long
    /// TTL at the head holds back shorter ones behind it, as in RabbitMQ.
    /// `strict` keeps messages that expire exactly now (a TTL of 0 still
    /// reaches a waiting consumer).
    pub fn expire_head(&mut self, now: Instant, strict: bool, expired: &mut Vec<(Queued, DeathReason)>) {
        while let Some(at) = self.ready.front().and_then(|m| m.expires_at) {
            let due = if strict { at < now } else { at <= now };
            if !due {
                break;
            }
            if let Some(head) = self.pop_ready() {
                expired.push((head, DeathReason::Expired));
            }
        }
    }

    /// When this queue next needs attention: its head expiring, or `x-expires`.
    pub fn deadline(&self) -> Option<Instant> {
        let head = self.ready.front().and_then(|m| m.expires_at);
        let unused = match self.settings.expires {
            Some(ms) if self.consumers.is_empty() => self.last_used.checked_add(Duration::from_millis(ms)),
            _ => None,
        };
        match (head, unused) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether `x-expires` has run out.
    pub fn unused_expired(&self, now: Instant) -> bool {
        match self.settings.expires {
            Some(ms) => {
                self.consumers.is_empty()
                    && self
                        .last_used
                        .checked_add(Duration::from_millis(ms))
                        .is_some_and(|at| at <= now)
            }
            None => false,
        }
    }

    /// Empties the ready list; returns how many messages went.
    pub fn purge(&mut self) -> usize {
        let n = self.ready.len();
        self.ready.clear();
        self.ready_bytes = 0;
        self.returned = 0;
        n
    }
}
