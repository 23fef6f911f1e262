//! What passes between the API handles and the driver task: commands one
//! way; deliveries, `basic.get` results, returned messages and publisher
//! confirmations the other. Every type the two sides share lives here, so
//! neither imports the other's module.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use acemq_codec::track::{Content, ReturnKey};
use acemq_codec::{BasicConsume, Method, PublishEncoder, ShortString, UndecodableHeader};
use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use super::Error;
use crate::proto::{CloseReason, Reply};

pub(crate) type Reply1<T> = oneshot::Sender<Result<T, Error>>;

/// What the API handles ask the driver to do.
pub(crate) enum Command {
    OpenChannel {
        reply: Reply1<(u16, u64, Arc<AtomicBool>, Arc<super::line::Line>)>,
    },
    /// A method; the reply (if the method has one) is sent back.
    Call {
        channel: u16,
        generation: u64,
        method: Method,
        reply: Reply1<Option<Reply>>,
    },
    /// A method without a reply (acks), fire and forget.
    Send {
        channel: u16,
        generation: u64,
        method: Method,
    },
    /// The next `n` publishes of the lane's [`Outgoing`] side, in order: a
    /// run of publishes is one command, however long.
    Publishes(usize),
    /// `basic.consume`: the driver makes the consumer's delivery queue (its
    /// bound depends on the channel's prefetch) and hands back its end.
    Consume {
        channel: u16,
        generation: u64,
        method: BasicConsume,
        reply: Reply1<(ShortString, super::driver::DeliveryQueue)>,
    },
    Close {
        reply: Reply1<()>,
    },
    /// Settlements wait in the connection's settle lane: sent by the first
    /// one into an empty lane, to wake the driver.
    Settled,
}

/// The command lane's side state: the publishes queued since the driver
/// last took the lane, encoded by the tasks that published them. A publish
/// encodes its frames into `frames` and adds its record under the lane's
/// lock, so records, frames and the [`Command::Publishes`] that counts them
/// are in one order with every other command.
#[derive(Debug, Default)]
pub(crate) struct Outgoing {
    /// One per publish, oldest first.
    pub(crate) records: Vec<Published>,
    /// Their frames, one after the other.
    pub(crate) frames: BytesMut,
    /// Keeps the last message's method and header frames to copy (it stays
    /// in the lane: the driver takes only the records and the frames).
    pub(crate) encoder: PublishEncoder,
    /// Room of the publish buffer taken from its semaphore and not yet
    /// given to a publish: publishes take their room from here under the
    /// lane's lock, and go to the semaphore (one atomic operation more, as
    /// costly here as the lock) only when it runs short, for a chunk at a
    /// time. A publish that must wait for room gives it back first.
    pub(crate) credit: u32,
}

/// One publish in [`Outgoing`]: whose it is and what its frames take.
#[derive(Debug)]
pub(crate) struct Published {
    pub(crate) channel: u16,
    pub(crate) generation: u64,
    /// How many bytes of `Outgoing::frames` are its frames.
    pub(crate) len: usize,
    /// The room it took in the connection's publish buffer (see
    /// [`super::connection::Config::publish_buffer`]), given back once
    /// its frames are written to the socket.
    pub(crate) room: u32,
    /// What a `basic.return` of it is matched by, when it is mandatory
    /// (boxed: rare, and the records stay small).
    pub(crate) returned: Option<Box<ReturnKey>>,
}

/// Something that happened to the connection as a whole.
#[derive(Debug, Clone, PartialEq)]
pub enum ConnectionEvent {
    /// The broker blocked publishing (RabbitMQ stops reading the socket).
    Blocked {
        /// Why, e.g. `low on memory`.
        reason: String,
    },
    /// The block is lifted.
    Unblocked,
    /// The broker cancelled a consumer (its queue went away).
    ConsumerCancelled {
        /// The channel.
        channel: u16,
        /// The consumer.
        consumer_tag: ShortString,
    },
    /// A returned message that pairs with no confirmed publish (e.g. a
    /// mandatory publish on a channel without confirms).
    Returned {
        /// The channel.
        channel: u16,
        /// The message.
        message: Box<ReturnedMessage>,
    },
    /// The connection ended.
    Closed(CloseReason),
}

/// Properties as received: validated, as the codec hands them over (they
/// dereference to [`acemq_codec::BasicProperties`], built on first access),
/// or the raw header when the codec refused them (too deeply nested, an
/// unknown field type). Such a message can still be acknowledged or set
/// aside; the connection is fine.
pub type Properties = Result<acemq_codec::Properties, UndecodableHeader>;

/// A message delivered to a consumer.
#[derive(Debug)]
pub struct Delivery {
    /// The consumer it is for.
    pub consumer_tag: ShortString,
    /// The channel-wide delivery tag, for ack/nack/reject.
    pub delivery_tag: u64,
    /// Whether the broker delivered it before.
    pub redelivered: bool,
    /// The exchange it was published to.
    pub exchange: ShortString,
    /// The routing key it was published with.
    pub routing_key: ShortString,
    /// Its properties.
    pub properties: Properties,
    /// Its body (zero-copy when it arrived in one frame).
    pub body: Bytes,
    pub(crate) acker: Acker,
}

/// A message fetched with `basic.get`.
#[derive(Debug)]
pub struct GetMessage {
    /// The delivery tag, for ack/nack/reject.
    pub delivery_tag: u64,
    /// Whether the broker delivered it before.
    pub redelivered: bool,
    /// The exchange it was published to.
    pub exchange: ShortString,
    /// The routing key it was published with.
    pub routing_key: ShortString,
    /// How many messages are left in the queue.
    pub message_count: u32,
    /// Its properties.
    pub properties: Properties,
    /// Its body.
    pub body: Bytes,
    pub(crate) acker: Acker,
}

/// A mandatory message the broker could not route (`basic.return`).
#[derive(Debug, Clone, PartialEq)]
pub struct ReturnedMessage {
    /// The reply code, e.g. 312 NO_ROUTE.
    pub reply_code: u16,
    /// The reply text, e.g. `NO_ROUTE`.
    pub reply_text: ShortString,
    /// The exchange it was published to.
    pub exchange: ShortString,
    /// The routing key it was published with.
    pub routing_key: ShortString,
    /// Its properties.
    pub properties: Properties,
    /// Its body.
    pub body: Bytes,
}

/// What the broker said about a publish.
#[derive(Debug, Clone, PartialEq)]
pub enum Confirmation {
    /// `basic.ack`: the broker has it (routed to at least one queue, or
    /// dropped as unroutable without `mandatory`).
    Ack,
    /// `basic.nack`: the broker refused it (e.g. `x-overflow=reject-publish`).
    Nack,
    /// Returned as unroutable (`basic.return`), then confirmed: the broker
    /// dropped it.
    Returned(Box<ReturnedMessage>),
    /// The channel is not in confirm mode: nothing will be said.
    NotRequested,
}

impl ReturnedMessage {
    pub(crate) fn from_content(content: Content) -> Option<Self> {
        let Method::BasicReturn(ret) = content.method else {
            return None;
        };
        Some(ReturnedMessage {
            reply_code: ret.reply_code,
            reply_text: ret.reply_text,
            exchange: ret.exchange,
            routing_key: ret.routing_key,
            properties: content.header.map(|h| h.properties),
            body: content.body,
        })
    }
}

/// Sends acknowledgements for a delivery on the channel it came from; stale
/// ones (the channel has since closed) are dropped by the driver.
#[derive(Debug, Clone)]
pub(crate) struct Acker {
    /// Where settlements go (see [`super::driver::Shared::settle`]).
    pub(crate) shared: Arc<super::driver::Shared>,
    pub(crate) channel: u16,
    pub(crate) generation: u64,
}

impl Acker {
    /// An acker of no connection, whose settlements go nowhere: for a
    /// delivery made up outside the driver (the `delivery` fuzz harness's).
    #[cfg(any(fuzzing, test))]
    pub(crate) fn detached() -> Acker {
        let (commands, _) = super::lane::with_side::<Command, Outgoing>();
        let shared = super::driver::Shared::new(Default::default(), commands.downgrade());
        Acker {
            shared: Arc::new(shared),
            channel: 1,
            generation: 0,
        }
    }

    /// Whether the connection the delivery came on has ended.
    pub(crate) fn connection_gone(&self) -> bool {
        self.shared.connection_gone()
    }

    /// Puts a settlement in the connection's settle lane (one lock, no
    /// command of its own).
    fn settle(&self, tag: u64, kind: SettleKind) -> Result<(), Error> {
        let op = SettleOp {
            channel: self.channel,
            generation: self.generation,
            tag,
            kind,
        };
        self.shared.settle(op).map_err(|()| Error::ChannelNotOpen(self.channel))
    }

    pub(crate) fn ack(&self, tag: u64, multiple: bool) -> Result<(), Error> {
        self.settle(tag, SettleKind::Ack { multiple })
    }

    pub(crate) fn nack(&self, tag: u64, multiple: bool, requeue: bool) -> Result<(), Error> {
        self.settle(tag, SettleKind::Nack { multiple, requeue })
    }

    pub(crate) fn reject(&self, tag: u64, requeue: bool) -> Result<(), Error> {
        self.settle(tag, SettleKind::Reject { requeue })
    }
}

/// One settlement on its way to the driver.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SettleOp {
    pub(crate) channel: u16,
    pub(crate) generation: u64,
    pub(crate) tag: u64,
    pub(crate) kind: SettleKind,
}

/// Which settlement.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SettleKind {
    Ack { multiple: bool },
    Nack { multiple: bool, requeue: bool },
    Reject { requeue: bool },
}

impl SettleOp {
    /// The method that says it.
    pub(crate) fn method(&self) -> Method {
        let delivery_tag = self.tag;
        match self.kind {
            SettleKind::Ack { multiple } => acemq_codec::BasicAck { delivery_tag, multiple }.into(),
            SettleKind::Nack { multiple, requeue } => acemq_codec::BasicNack {
                delivery_tag,
                multiple,
                requeue,
            }
            .into(),
            SettleKind::Reject { requeue } => acemq_codec::BasicReject { delivery_tag, requeue }.into(),
        }
    }
}

macro_rules! settle_methods {
    ($ty:ty) => {
        impl $ty {
            /// Acknowledges this message.
            pub fn ack(&self) -> Result<(), Error> {
                self.acker.ack(self.delivery_tag, false)
            }

            /// Acknowledges this message and every earlier one on the channel.
            pub fn ack_multiple(&self) -> Result<(), Error> {
                self.acker.ack(self.delivery_tag, true)
            }

            /// Negatively acknowledges it; `requeue` puts it back in the queue,
            /// otherwise it is dead-lettered or dropped.
            pub fn nack(&self, requeue: bool) -> Result<(), Error> {
                self.acker.nack(self.delivery_tag, false, requeue)
            }

            /// Rejects it (like `nack` for one message).
            pub fn reject(&self, requeue: bool) -> Result<(), Error> {
                self.acker.reject(self.delivery_tag, requeue)
            }

            /// The channel it arrived on.
            pub fn channel_id(&self) -> u16 {
                self.acker.channel
            }
        }
    };
}

settle_methods!(Delivery);
settle_methods!(GetMessage);
