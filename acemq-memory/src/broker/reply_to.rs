//! Direct reply-to (`amq.rabbitmq.reply-to`), as RabbitMQ 3.10 and 4.0 do
//! it (both the same way): a pseudo-queue a channel consumes without acks,
//! the `reply-to` of that channel's publishes rewritten to an opaque
//! `amq.rabbitmq.reply-to.<suffix>` name, and a publish to the default
//! exchange with such a name as routing key handed straight to that
//! channel's reply consumer, never to a queue.
//!
//! The suffix names the connection and channel and carries a random key,
//! so a reply finds its channel without a table, and a channel opened
//! again under the same number (or a guessed name) is never reached.
//!
//! Must never: route a reply to a queue, deliver one to a channel other
//! than the one whose name it carries, or refuse a reply whose channel is
//! gone (RabbitMQ drops it silently).

use std::time::Instant;

use acemq_codec::{BasicConsume, BasicConsumeOk, DeliverRef, QueueDeclare, QueueDeclareOk, ShortString};

use super::{wake_conn, write_delivery, BrokerMachine, ConnId, Outgoing};
use crate::error::AmqpError;

/// The pseudo-queue a channel consumes its replies from.
pub(crate) const REPLY_TO: &str = "amq.rabbitmq.reply-to";
/// What every reply name starts with.
pub(crate) const REPLY_TO_PREFIX: &str = "amq.rabbitmq.reply-to.";

/// A channel's reply consumer: its tag, and the suffix of the name its
/// publishes' `reply-to` is rewritten to.
#[derive(Debug, Clone)]
pub(crate) struct ReplyConsumer {
    pub tag: ShortString,
    pub suffix: String,
}

/// Whether `routing_key` names a reply, on the default exchange.
pub(crate) fn is_reply_key(routing_key: &[u8]) -> bool {
    routing_key.starts_with(REPLY_TO_PREFIX.as_bytes())
}

/// `<random key>.<connection>.<channel>`: the random part first, so the
/// name reads as opaque.
fn new_suffix(id: ConnId, ch: u16) -> String {
    let key = super::methods::generated_name("");
    format!("{key}.{id:x}.{ch:x}")
}

/// The connection and channel a suffix names, if it reads as one.
fn parse_suffix(suffix: &[u8]) -> Option<(ConnId, u16)> {
    let text = std::str::from_utf8(suffix).ok()?;
    let mut parts = text.rsplitn(3, '.');
    let ch = u16::from_str_radix(parts.next()?, 16).ok()?;
    let id = ConnId::from_str_radix(parts.next()?, 16).ok()?;
    parts.next()?;
    Some((id, ch))
}

impl BrokerMachine {
    /// The channel whose reply consumer `suffix` names, if it is still there
    /// and not closing.
    fn reply_target(&mut self, suffix: &[u8]) -> Option<(ConnId, u16, ShortString)> {
        let (id, ch) = parse_suffix(suffix)?;
        let channel = self.conns.get_mut(&id)?.channel_mut(ch)?;
        let consumer = channel.reply_consumer.as_ref()?;
        (!channel.closing && consumer.suffix.as_bytes() == suffix).then(|| (id, ch, consumer.tag.clone()))
    }

    /// `basic.consume` of `amq.rabbitmq.reply-to`: only without acks, one
    /// per channel; a tag in use on the channel is a connection error.
    pub(crate) fn consume_reply_to(
        &mut self,
        id: ConnId,
        ch: u16,
        m: &BasicConsume,
        tag: ShortString,
    ) -> Result<Option<BasicConsumeOk>, AmqpError> {
        let Some(channel) = self.conns.get_mut(&id).and_then(|c| c.channel_mut(ch)) else {
            return Ok(None);
        };
        let tag_in_use = channel.consumers.iter().any(|c| c.tag == m.consumer_tag)
            || channel.reply_consumer.as_ref().is_some_and(|r| r.tag == m.consumer_tag);
        if !m.consumer_tag.is_empty() && tag_in_use {
            return Err(AmqpError::not_allowed(format!(
                "attempt to reuse consumer tag '{}'",
                m.consumer_tag
            )));
        }
        if !m.no_ack {
            return Err(AmqpError::precondition("reply consumer cannot acknowledge"));
        }
        if channel.reply_consumer.is_some() {
            return Err(AmqpError::precondition("reply consumer already set"));
        }
        channel.reply_consumer = Some(ReplyConsumer {
            tag: tag.clone(),
            suffix: new_suffix(id, ch),
        });
        Ok(Some(BasicConsumeOk { consumer_tag: tag }))
    }

    /// `basic.cancel` of the channel's reply consumer: `true` if `tag` is it
    /// (it is gone; replies to its name are dropped from now on).
    pub(crate) fn cancel_reply_to(&mut self, id: ConnId, ch: u16, tag: &ShortString) -> bool {
        let Some(channel) = self.conns.get_mut(&id).and_then(|c| c.channel_mut(ch)) else {
            return false;
        };
        if channel.reply_consumer.as_ref().is_some_and(|r| &r.tag == tag) {
            channel.reply_consumer = None;
            return true;
        }
        false
    }

    /// A `queue.declare` of a name starting with `amq.rabbitmq.reply-to`,
    /// passive or not (every one is passive): the pseudo-queue itself, or
    /// the name of a reply consumer that is there, exists with no message
    /// and one consumer; any other such name is 404.
    pub(crate) fn declare_reply_to(&mut self, vhost: &str, m: &QueueDeclare) -> Result<QueueDeclareOk, AmqpError> {
        let name = m.queue.as_bytes();
        let exists = name == REPLY_TO.as_bytes()
            || (is_reply_key(name) && self.reply_target(&name[REPLY_TO_PREFIX.len()..]).is_some());
        if !exists {
            return Err(AmqpError::no_queue(&m.queue, vhost));
        }
        Ok(QueueDeclareOk {
            queue: m.queue.clone(),
            message_count: 0,
            consumer_count: 1,
        })
    }

    /// The `reply-to` a publish on channel `ch` carries on: `amq.rabbitmq.reply-to`
    /// becomes the channel's reply name, and is a channel error on a channel
    /// with no reply consumer. `None`: unchanged.
    pub(crate) fn rewrite_reply_to(&mut self, id: ConnId, ch: u16, reply_to: &[u8]) -> Result<Option<String>, AmqpError> {
        if reply_to != REPLY_TO.as_bytes() {
            return Ok(None);
        }
        let consumer = self
            .conns
            .get_mut(&id)
            .and_then(|c| c.channel_mut(ch))
            .and_then(|c| c.reply_consumer.as_ref());
        match consumer {
            Some(consumer) => Ok(Some(format!("{REPLY_TO_PREFIX}{}", consumer.suffix))),
            None => Err(AmqpError::precondition("fast reply consumer does not exist")),
        }
    }

    /// Hands a reply (a publish to the default exchange whose routing key is
    /// a reply name) to the reply consumer the name stands for, if it is
    /// still there; otherwise drops it. Like RabbitMQ, the delivery takes
    /// the channel's next delivery tag without using it up.
    pub(crate) fn deliver_reply(&mut self, routing_key: &[u8], msg: &super::Message, _now: Instant) {
        let Some((id, ch, tag)) = self.reply_target(&routing_key[REPLY_TO_PREFIX.len()..]) else {
            return;
        };
        let Some(conn) = self.conns.get_mut(&id) else { return };
        let frame_max = conn.frame_max;
        let Some(delivery_tag) = conn.channel_mut(ch).map(|c| c.next_tag) else {
            return;
        };
        let deliver = DeliverRef {
            consumer_tag: &tag,
            delivery_tag,
            redelivered: false,
            exchange: &msg.exchange,
            routing_key: &msg.routing_key,
        };
        write_delivery(&mut conn.out, ch, &deliver, msg, frame_max, Outgoing::default());
        wake_conn(id, conn, &mut self.woken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suffix_names_its_connection_and_channel_and_garbage_names_none() {
        let suffix = new_suffix(0x2a, 7);
        assert_eq!(parse_suffix(suffix.as_bytes()), Some((0x2a, 7)));
        for garbage in ["", "x", "a.b", "..", "key.zz.1", "key.1.10000"] {
            assert_eq!(parse_suffix(garbage.as_bytes()), None, "{garbage:?}");
        }
        assert_eq!(parse_suffix(b"\xff\xfe.1.1"), None);
    }
}
