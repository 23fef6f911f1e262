//! Direct reply-to (`amq.rabbitmq.reply-to`), as RabbitMQ 3.10 and 4.0 do
//! it (both the same way): a pseudo-queue a channel consumes without acks,
//! the `reply-to` of that channel's publishes rewritten to an opaque
//! `amq.rabbitmq.reply-to.<suffix>` name, and a publish to the default
//! exchange with such a name as routing key handed straight to that
//! channel's reply consumer, never to a queue.
//!
//! The suffix is laid out as RabbitMQ lays out its own (the channel's
//! process id as an Erlang term in base64, a dot, a random key in base64),
//! so a reply finds its channel without a table, a channel opened again
//! under the same number (or a guessed name) is never reached, and a name
//! RabbitMQ cannot decode has the effect it has there: nothing, or the
//! connection closed with 541 INTERNAL_ERROR (see `decode_suffix`).
//!
//! Must never: route a reply to a queue, deliver one to a channel other
//! than the one whose name it carries, or refuse a reply whose channel is
//! gone (RabbitMQ drops it silently).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use acemq_codec::{BasicConsume, BasicConsumeOk, DeliverRef, QueueDeclare, QueueDeclareOk, ReplyCode, ShortString};

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

/// The node-name hash in this broker's reply names (RabbitMQ writes
/// `erlang:phash2` of its node name there, under a node called
/// `reply@<hash>`); one node, one hash.
const NODE_HASH: u32 = 71_236_805;

fn base64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Strict base64 (padded, standard alphabet); `None` if it is not.
fn unbase64(text: &[u8]) -> Option<Vec<u8>> {
    STANDARD.decode(text).ok()
}

/// A process id as RabbitMQ encodes one into a reply name (the external
/// term format of a pid): its node, and the three numbers.
struct Pid {
    node: Vec<u8>,
    id: u32,
    serial: u32,
    creation: u32,
}

impl Pid {
    fn to_binary(&self) -> Vec<u8> {
        let mut out = vec![131, 88, 118];
        out.extend_from_slice(&(self.node.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.node);
        for n in [self.id, self.serial, self.creation] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        out
    }

    /// What RabbitMQ's `pid_recomposition:from_binary` accepts.
    fn from_binary(bin: &[u8]) -> Option<Pid> {
        let (new, data) = match bin {
            [131, 88, rest @ ..] => (true, rest),
            [131, 103, rest @ ..] => (false, rest),
            _ => return None,
        };
        let (node, rest) = match data {
            [118, hi, lo, rest @ ..] => {
                let len = usize::from(u16::from_be_bytes([*hi, *lo]));
                (rest.get(..len)?, rest.get(len..)?)
            }
            [119, len, rest @ ..] => (rest.get(..usize::from(*len))?, rest.get(usize::from(*len)..)?),
            _ => return None,
        };
        let word = |at: usize| -> Option<u32> { Some(u32::from_be_bytes(rest.get(at..at + 4)?.try_into().ok()?)) };
        let creation = match (new, rest.len()) {
            (true, 12) => word(8)?,
            (false, 9) => u32::from(rest[8]),
            _ => return None,
        };
        std::str::from_utf8(node).ok()?;
        Some(Pid {
            node: node.to_vec(),
            id: word(0)?,
            serial: word(4)?,
            creation,
        })
    }
}

/// A new reply name's suffix for channel `ch` of connection `id`, laid out
/// as RabbitMQ lays out its own: the channel's "pid" in base64, a dot, a
/// random key in base64.
fn new_suffix(id: ConnId, ch: u16) -> String {
    let pid = Pid {
        node: format!("reply@{NODE_HASH}").into_bytes(),
        id: id as u32,
        serial: u32::from(ch),
        creation: (id >> 32) as u32,
    };
    let key: [u8; 16] = rand::random();
    format!("{}.{}", base64(&pid.to_binary()), base64(&key))
}

/// What the broker makes of a reply name's suffix.
#[derive(Debug, PartialEq, Eq)]
enum Decoded {
    /// It names this connection's channel (if the key matches too).
    Channel(ConnId, u16),
    /// It names nothing: a reply to it is dropped, a declare is 404.
    Nothing,
    /// RabbitMQ's channel process crashes decoding it: the connection is
    /// closed with 541 INTERNAL_ERROR.
    Crash,
}

/// The node hash of a node name `reply@<hash>`; `Err` where RabbitMQ's
/// `list_to_integer` fails.
fn node_hash(node: &[u8]) -> Result<u64, ()> {
    let host = match node.iter().position(|&b| b == b'@') {
        Some(at) => &node[at + 1..],
        None => return Err(()),
    };
    std::str::from_utf8(host).ok().and_then(|h| h.parse().ok()).ok_or(())
}

/// RabbitMQ's decoding of a reply name's suffix, with what each version
/// does when it fails. 3.10 tries the current layout on the two
/// dot-separated parts and crashes on anything in it that does not decode,
/// or on a node it does not know; 4.0 catches those and tries the original
/// layout (a whole pid term), which crashes in both versions on two parts
/// that are not base64 of a pid. Any other number of parts names nothing.
///
/// On 4.0 a `queue.declare` of a name whose original layout decodes to an
/// atom is 404 (it asks a process of that name, which is not there), where
/// a reply to it crashes.
fn decode_suffix(suffix: &[u8], v4: bool, declare: bool) -> Decoded {
    let lexemes: Vec<&[u8]> = suffix.split(|&b| b == b'.').filter(|p| !p.is_empty()).collect();
    let current = |pid_part: &[u8]| -> Result<Decoded, ()> {
        let pid = Pid::from_binary(&unbase64(pid_part).ok_or(())?).ok_or(())?;
        if node_hash(&pid.node)? != u64::from(NODE_HASH) {
            return Err(());
        }
        let id = ConnId::from(pid.id) | (ConnId::from(pid.creation) << 32);
        Ok(u16::try_from(pid.serial).map_or(Decoded::Nothing, |ch| Decoded::Channel(id, ch)))
    };
    let original = || match lexemes.as_slice() {
        [pid_part, _] => match unbase64(pid_part) {
            Some(term) if Pid::from_binary(&term).is_some() => Decoded::Nothing,
            Some(term) if declare && is_atom(&term) => Decoded::Nothing,
            _ => Decoded::Crash,
        },
        _ => Decoded::Nothing,
    };
    if !v4 {
        return match lexemes.as_slice() {
            [pid_part, _] => current(pid_part).unwrap_or(Decoded::Crash),
            _ => Decoded::Nothing,
        };
    }
    let first_split = suffix.iter().position(|&b| b == b'.').map(|at| &suffix[..at]);
    match first_split.map(current) {
        Some(Ok(decoded)) => decoded,
        _ => original(),
    }
}

/// Whether `term` is an atom in the external term format.
fn is_atom(term: &[u8]) -> bool {
    match term {
        [131, 100 | 118, hi, lo, name @ ..] => name.len() == usize::from(u16::from_be_bytes([*hi, *lo])),
        [131, 115 | 119, len, name @ ..] => name.len() == usize::from(*len),
        _ => false,
    }
}

/// The connection error RabbitMQ's crashed channel leaves.
fn crashed() -> AmqpError {
    AmqpError {
        code: ReplyCode::InternalError,
        text: "INTERNAL_ERROR".into(),
        class_id: 0,
        method_id: 0,
    }
}

impl BrokerMachine {
    /// The channel whose reply consumer `suffix` names, if it is still there
    /// and not closing; an error where RabbitMQ crashes on the name.
    fn reply_target(&mut self, suffix: &[u8], declare: bool) -> Result<Option<(ConnId, u16, ShortString)>, AmqpError> {
        let (id, ch) = match decode_suffix(suffix, self.config.rabbitmq_version.is_4(), declare) {
            Decoded::Channel(id, ch) => (id, ch),
            Decoded::Nothing => return Ok(None),
            Decoded::Crash => return Err(crashed()),
        };
        Ok(self.live_reply_consumer(id, ch, suffix))
    }

    fn live_reply_consumer(&mut self, id: ConnId, ch: u16, suffix: &[u8]) -> Option<(ConnId, u16, ShortString)> {
        let channel = self.conns.get_mut(&id)?.channel_mut(ch)?;
        let consumer = channel.reply_consumer.as_ref()?;
        (!channel.closing && consumer.suffix.as_bytes() == suffix).then(|| (id, ch, consumer.tag.clone()))
    }

    /// `basic.consume` of `amq.rabbitmq.reply-to`: only without acks, one
    /// per channel; the tag of one of the channel's queue consumers is a
    /// connection error.
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
        // Only the channel's queue consumers count, as in RabbitMQ: the
        // reply consumer's own tag is not among them.
        if channel.consumers.iter().any(|c| c.tag == m.consumer_tag) {
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
            || (is_reply_key(name) && self.reply_target(&name[REPLY_TO_PREFIX.len()..], true)?.is_some());
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
    pub(crate) fn rewrite_reply_to(
        &mut self,
        id: ConnId,
        ch: u16,
        reply_to: &[u8],
    ) -> Result<Option<String>, AmqpError> {
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

    /// Checks a publish's routing key before it is routed: a reply name
    /// on the default exchange that RabbitMQ crashes decoding is a
    /// connection error.
    pub(crate) fn check_reply_key(&mut self, exchange: &[u8], routing_key: &[u8]) -> Result<(), AmqpError> {
        if exchange.is_empty() && is_reply_key(routing_key) {
            self.reply_target(&routing_key[REPLY_TO_PREFIX.len()..], false)?;
        }
        Ok(())
    }

    /// Hands a reply (a publish to the default exchange whose routing key is
    /// a reply name) to the reply consumer the name stands for, if it is
    /// still there; otherwise drops it. Like RabbitMQ, the delivery takes
    /// the channel's next delivery tag without using it up.
    pub(crate) fn deliver_reply(&mut self, routing_key: &[u8], msg: &super::Message) {
        let Ok(Some((id, ch, tag))) = self.reply_target(&routing_key[REPLY_TO_PREFIX.len()..], false) else {
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
    fn a_suffix_names_its_connection_and_channel_on_both_versions() {
        let suffix = new_suffix(0x1_0000_002a, 7);
        for (v4, declare) in [(false, false), (true, false), (false, true), (true, true)] {
            assert_eq!(
                decode_suffix(suffix.as_bytes(), v4, declare),
                Decoded::Channel(0x1_0000_002a, 7)
            );
        }
    }

    #[test]
    fn garbage_names_nothing_or_crashes_as_each_version_does() {
        let other_node = {
            let pid = Pid {
                node: b"reply@12".to_vec(),
                id: 1,
                serial: 1,
                creation: 0,
            };
            format!("{}.AAAA", base64(&pid.to_binary()))
        };
        // (suffix, 3.10, 4.0)
        let cases = [
            ("", Decoded::Nothing, Decoded::Nothing),
            ("abc", Decoded::Nothing, Decoded::Nothing),
            ("a.b.c", Decoded::Nothing, Decoded::Nothing),
            ("x.y", Decoded::Crash, Decoded::Crash),
            ("AAAA.AAAA", Decoded::Crash, Decoded::Crash),
            ("g2QAA2Zvbw==.AAAA", Decoded::Crash, Decoded::Crash),
            (other_node.as_str(), Decoded::Crash, Decoded::Nothing),
        ];
        for (suffix, v3, v4) in cases {
            assert_eq!(decode_suffix(suffix.as_bytes(), false, false), v3, "3.10: {suffix:?}");
            assert_eq!(decode_suffix(suffix.as_bytes(), true, false), v4, "4.0: {suffix:?}");
        }
        // 4.0 asks for a process named by an atom, and finds none.
        let atom = b"g2QAA2Zvbw==.AAAA";
        assert_eq!(decode_suffix(atom, true, true), Decoded::Nothing);
        assert_eq!(decode_suffix(atom, false, true), Decoded::Crash);
    }

    #[test]
    fn base64_round_trips_and_refuses_what_is_not() {
        for bytes in [&b""[..], b"a", b"ab", b"abc", b"abcd", &[0xff, 0, 0x80]] {
            assert_eq!(unbase64(base64(bytes).as_bytes()).as_deref(), Some(bytes));
        }
        for bad in ["x", "AAA", "A===", "AA*A"] {
            assert_eq!(unbase64(bad.as_bytes()), None, "{bad}");
        }
    }
}
