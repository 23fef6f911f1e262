//! The plain data the API hands out about what the broker said: events of
//! the connection as a whole, returned messages, a publish's confirmation,
//! and the properties of a message as received. Values only: nothing here
//! holds a link to a connection or knows the driver (deliveries, which can
//! be acknowledged, live with the connection's state in `state`).

use acemq_codec::track::Content;
use acemq_codec::{Method, ShortString, UndecodableHeader};
use bytes::Bytes;

use crate::proto::CloseReason;

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
