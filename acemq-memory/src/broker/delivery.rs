//! Publishing, routing, delivery to consumers, settlement, and the
//! dead-letter loop. The hot path: no lock, no thread hop, bodies shared as
//! `Bytes`, one `Arc` per published message, and a delivery written from the
//! property bytes the message came with (never decoded and encoded again
//! unless the broker changes a property).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use acemq_codec::{
    BasicAck, BasicGetEmpty, BasicGetOk, BasicNack, BasicReturn, DeliverRef, FieldTable, FieldValue, ReplyCode,
    ShortString,
};

use super::dead_letter::{dead_lettered, is_death_cycle};
use super::exchange::Destination;
use super::message::{Header, Message, Outgoing};
use super::queue::{ConsumerRef, DeathReason, Enqueued, Queued};
use super::Publication;
use super::{
    wake_conn, write_content, write_delivery, write_method, BrokerMachine, Conn, ConnId, DeadLetter, QueueKind,
    Unacked, VHost,
};
use crate::error::AmqpError;
use crate::RabbitMqVersion;

/// How a settlement treats the messages it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    Ack,
    Requeue,
    Discard,
}

/// The queues a message reaches from `exchange`, following
/// exchange-to-exchange bindings and alternate exchanges, each once.
pub(crate) fn route(
    vhost: &VHost,
    exchange: &ShortString,
    key: &ShortString,
    headers: Option<&FieldTable>,
) -> Vec<ShortString> {
    if exchange.is_empty() {
        return if vhost.queues.contains_key(key) {
            vec![key.clone()]
        } else {
            Vec::new()
        };
    }
    let mut queues: Vec<ShortString> = Vec::new();
    // Each queue once, in the order first reached (a set, so that a
    // fanout to many queues stays linear).
    let mut reached: HashSet<&ShortString> = HashSet::new();
    let mut visited: HashSet<&ShortString> = HashSet::from([exchange]);
    let mut stack: Vec<&ShortString> = vec![exchange];
    let mut dests = Vec::new();
    while let Some(name) = stack.pop() {
        let Some(x) = vhost.exchanges.get(name) else { continue };
        dests.clear();
        x.matches(key.as_bytes(), headers, &mut dests);
        if dests.is_empty() {
            if let Some(alternate) = x.arguments.get("alternate-exchange").and_then(|_| {
                vhost
                    .exchanges
                    .get_key_value(&x.alternate().unwrap_or_default())
                    .map(|(k, _)| k)
            }) {
                if visited.insert(alternate) {
                    stack.push(alternate);
                }
            }
        }
        for dest in dests.drain(..) {
            match dest {
                Destination::Queue(q) => {
                    if vhost.queues.contains_key(q) && reached.insert(q) {
                        queues.push(q.clone());
                    }
                }
                Destination::Exchange(e) => {
                    if visited.insert(e) {
                        stack.push(e);
                    }
                }
            }
        }
    }
    queues
}

impl BrokerMachine {
    /// `basic.publish` with its content, on channel `ch` of connection `id`.
    pub(crate) fn publish(
        &mut self,
        id: ConnId,
        ch: u16,
        mut content: Publication,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let publish = &content.publish;
        if publish.immediate {
            return Err(AmqpError::not_implemented("immediate=true"));
        }
        let Some(conn) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        let vhost = conn.vhost.clone();
        if let Header::Decoded(properties) = &content.header {
            if let Some(user_id) = &properties.user_id {
                if user_id.as_bytes() != conn.user.as_bytes() {
                    return Err(AmqpError::precondition(format!(
                        "user_id property set to '{user_id}' but authenticated user was '{}'",
                        conn.user
                    )));
                }
            }
            if let Some(expiration) = &properties.expiration {
                let valid = expiration.as_str().is_some_and(|s| {
                    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u64>().is_ok()
                });
                if !valid {
                    return Err(AmqpError::precondition(format!(
                        "invalid expiration '{expiration}': no_integer"
                    )));
                }
            }
        }
        let Some(vh) = self.vhosts.get(&*vhost) else {
            return Ok(());
        };
        match vh.exchanges.get(&publish.exchange) {
            None => return Err(AmqpError::no_exchange(&publish.exchange, &vhost)),
            Some(x) if x.internal => {
                return Err(AmqpError::access_refused(format!(
                    "cannot publish to internal exchange '{}' in vhost '{vhost}'",
                    publish.exchange
                )))
            }
            Some(_) => {}
        }
        if let Header::Decoded(properties) = &mut content.header {
            let reply_to = properties.view().reply_to;
            if let Some(rewritten) = reply_to.and_then(|r| self.rewrite_reply_to(id, ch, r).transpose()) {
                properties.reply_to = Some(rewritten?.into());
            }
        }
        self.check_reply_key(publish.exchange.as_bytes(), publish.routing_key.as_bytes())?;
        if publish.exchange.is_empty() && super::reply_to::is_reply_key(publish.routing_key.as_bytes()) {
            // RabbitMQ routes as it takes the publish, in a transaction too:
            // a reply is delivered now, and no rollback takes it back.
            let mut header = content.header.clone();
            sender_selected_keys(&mut header);
            if self.config.rabbitmq_version.is_4() {
                sort_headers(&mut header);
            }
            let reply = Message {
                exchange: publish.exchange.clone(),
                routing_key: publish.routing_key.clone(),
                header,
                body: content.body.clone(),
            };
            self.deliver_reply(publish.routing_key.as_bytes(), &reply);
        }
        let Some(channel) = self.conns.get_mut(&id).and_then(|c| c.channel_mut(ch)) else {
            return Ok(());
        };
        if let Some(tx) = &mut channel.tx {
            tx.push(super::TxOp::Publish(Box::new(content)));
            return Ok(());
        }
        let seq = channel.confirm.as_mut().map(|c| {
            c.next_seq += 1;
            c.next_seq
        });
        self.route_and_enqueue(id, ch, &vhost, content, seq, now);
        Ok(())
    }

    pub(crate) fn route_and_enqueue(
        &mut self,
        id: ConnId,
        ch: u16,
        vhost: &Arc<str>,
        content: Publication,
        seq: Option<u64>,
        now: Instant,
    ) {
        let Publication {
            publish,
            mut header,
            body,
        } = content;
        let mandatory = publish.mandatory;
        let also = sender_selected_keys(&mut header);
        if self.config.rabbitmq_version.is_4() {
            sort_headers(&mut header);
        }
        let msg = Arc::new(Message {
            exchange: publish.exchange,
            routing_key: publish.routing_key,
            header,
            body,
        });
        if msg.exchange.is_empty() {
            // Replies go straight to their channel, never to a queue; the one
            // its routing key names has gone already (see `publish`).
            let mut replied: Vec<&ShortString> = vec![&msg.routing_key];
            for key in &also {
                if super::reply_to::is_reply_key(key.as_bytes()) && !replied.contains(&key) {
                    replied.push(key);
                    self.deliver_reply(key.as_bytes(), &msg);
                }
            }
        }
        let wall = self.wall_ms(now);
        let queues = match self.vhosts.get(&**vhost) {
            Some(vh) => {
                let mut queues = route(vh, &msg.exchange, &msg.routing_key, msg.headers());
                if !also.is_empty() {
                    let mut reached: HashSet<ShortString> = queues.iter().cloned().collect();
                    for key in &also {
                        for q in route(vh, &msg.exchange, key, msg.headers()) {
                            if reached.insert(q.clone()) {
                                queues.push(q);
                            }
                        }
                    }
                }
                queues
            }
            None => return,
        };
        let mut rejected = false;
        let mut dropped = Vec::new();
        for qname in &queues {
            let Some(q) = self.vhosts.get_mut(&**vhost).and_then(|v| v.queues.get_mut(qname)) else {
                continue;
            };
            if q.enqueue(msg.clone(), now, wall, &mut dropped) == Enqueued::Rejected {
                rejected = true;
            }
            if !dropped.is_empty() {
                let dead = std::mem::take(&mut dropped);
                self.queue_dead_letters(vhost, qname, dead);
            }
            self.dispatch_inner(vhost, qname, now, true);
        }
        self.publish_outcome(id, ch, &msg, mandatory && queues.is_empty(), rejected, seq);
    }

    /// Writes what the publisher is owed: `basic.return` for an unroutable
    /// mandatory message (before its ack), and the confirm. Acks are held
    /// back and coalesced into one `multiple` ack by [`Self::flush_confirms`].
    fn publish_outcome(
        &mut self,
        id: ConnId,
        ch: u16,
        msg: &Message,
        returned: bool,
        rejected: bool,
        seq: Option<u64>,
    ) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        let frame_max = conn.frame_max;
        let Conn { channels, out, .. } = conn;
        let Some(channel) = channels.get_mut(usize::from(ch)).and_then(Option::as_mut) else {
            return;
        };
        if returned {
            let ret = BasicReturn {
                reply_code: ReplyCode::NoRoute.code(),
                reply_text: "NO_ROUTE".into(),
                exchange: msg.exchange.clone(),
                routing_key: msg.routing_key.clone(),
            };
            write_content(out, ch, &ret.into(), msg, frame_max, None);
        }
        let (Some(seq), Some(confirms)) = (seq, channel.confirm.as_mut()) else {
            return;
        };
        if rejected {
            if let Some(upto) = confirms.pending_ack.take() {
                write_ack(out, ch, upto, confirms.written);
                confirms.written = upto;
            }
            let nack = BasicNack {
                delivery_tag: seq,
                multiple: false,
                requeue: false,
            };
            write_method(out, ch, &nack.into());
            confirms.written = seq;
        } else {
            confirms.pending_ack = Some(seq);
        }
    }

    /// Writes the acks held back on every channel of connection `id`.
    pub(crate) fn flush_confirms(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        let Conn { channels, out, .. } = conn;
        for (n, slot) in channels.iter_mut().enumerate() {
            let Some(confirms) = slot.as_mut().and_then(|c| c.confirm.as_mut()) else {
                continue;
            };
            if let Some(upto) = confirms.pending_ack.take() {
                write_ack(out, n as u16, upto, confirms.written);
                confirms.written = upto;
            }
        }
    }

    /// Delivers what a queue has to the consumers that have room.
    pub(crate) fn dispatch(&mut self, vhost: &str, qname: &ShortString, now: Instant) {
        self.dispatch_inner(vhost, qname, now, false);
    }

    /// `fresh`: right after a publish, a message whose TTL ends now may still
    /// go to a waiting consumer, and is expired at once if none takes it.
    fn dispatch_inner(&mut self, vhost: &str, qname: &ShortString, now: Instant, fresh: bool) {
        self.dispatch_queue(vhost, qname, now, fresh);
        self.schedule(vhost, qname);
    }

    fn dispatch_queue(&mut self, vhost: &str, qname: &ShortString, now: Instant, fresh: bool) {
        let mut dead = Vec::new();
        {
            let BrokerMachine {
                vhosts,
                conns,
                woken,
                config,
                ..
            } = self;
            let Some(q) = vhosts.get_mut(vhost).and_then(|v| v.queues.get_mut(qname)) else {
                return;
            };
            if q.is_stream() {
                dispatch_stream(q, conns, woken, config.rabbitmq_version, config.output_limit.max(4096));
                return;
            }
            let quorum = q.settings.kind == QueueKind::Quorum;
            let limit = config.output_limit.max(4096);
            q.expire_head(now, true, &mut dead);
            while !q.ready.is_empty() && !q.consumers.is_empty() {
                let Some(m) = q.ready.front() else { break };
                let mut chosen = None;
                for idx in q.candidates() {
                    let extra = (quorum && m.delivery_count > 0)
                        .then(|| ("x-delivery-count", FieldValue::I64(m.delivery_count as i64)));
                    match try_deliver(conns, woken, &q.consumers[idx], m, extra, limit) {
                        Attempt::Busy => continue,
                        outcome => {
                            chosen = Some((idx, outcome));
                            break;
                        }
                    }
                }
                let Some((idx, outcome)) = chosen else { break };
                let Some(m) = q.pop_ready() else { break };
                if let Attempt::Tracked(tag) = outcome {
                    track(conns, &q.consumers[idx], &q.name, tag, m);
                    q.unacked += 1;
                }
                q.round_robin = (idx + 1) % q.consumers.len();
                q.expire_head(now, true, &mut dead);
            }
            if fresh {
                q.expire_head(now, false, &mut dead);
            }
        }
        if !dead.is_empty() {
            self.queue_dead_letters(vhost, qname, dead);
        }
    }

    /// Settles deliveries on a channel: `basic.ack`, `basic.nack`, `basic.reject`.
    pub(crate) fn settle(
        &mut self,
        id: ConnId,
        ch: u16,
        tag: u64,
        multiple: bool,
        how: Settle,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let taken = self.take_unacked(id, ch, tag, multiple)?;
        self.refuse_stream_rejects(id, &taken, how)?;
        self.apply_settlement(id, ch, taken, how, now);
        Ok(())
    }

    /// A stream delivery can only be acked on RabbitMQ 3.10: it answers a
    /// `basic.reject` or `basic.nack` of one (at once, or at `tx.commit`)
    /// by closing the connection (540). RabbitMQ 4.0 takes either as an
    /// ack (the consumer's credit comes back; nothing is requeued).
    pub(crate) fn refuse_stream_rejects(&self, id: ConnId, taken: &[Unacked], how: Settle) -> Result<(), AmqpError> {
        if how == Settle::Ack || self.config.rabbitmq_version.is_4() {
            return Ok(());
        }
        let Some(stream) = taken.iter().find(|entry| entry.queued.is_none()) else {
            return Ok(());
        };
        let vhost = self.conns.get(&id).map(|c| c.vhost.clone()).unwrap_or_default();
        Err(AmqpError::not_implemented(format!(
            "basic.nack and basic.reject not supported by stream queues {}",
            crate::error::rs_queue(&stream.queue, &vhost)
        )))
    }

    /// Takes the deliveries a settlement covers off the channel's unacked
    /// list (an unknown tag is refused now, in a transaction too).
    pub(crate) fn take_unacked(
        &mut self,
        id: ConnId,
        ch: u16,
        tag: u64,
        multiple: bool,
    ) -> Result<Vec<Unacked>, AmqpError> {
        let Some(channel) = self.conns.get_mut(&id).and_then(|c| c.channel_mut(ch)) else {
            return Ok(Vec::new());
        };
        Ok(if multiple && tag == 0 {
            channel.unacked.drain(..).collect()
        } else {
            let pos = channel
                .unacked
                .binary_search_by_key(&tag, |u| u.tag)
                .map_err(|_| AmqpError::precondition(format!("unknown delivery tag {tag}")))?;
            if multiple {
                channel.unacked.drain(..=pos).collect()
            } else {
                channel.unacked.remove(pos).into_iter().collect()
            }
        })
    }

    /// Carries out a settlement of deliveries taken with [`Self::take_unacked`].
    pub(crate) fn apply_settlement(&mut self, id: ConnId, ch: u16, taken: Vec<Unacked>, how: Settle, now: Instant) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let vhost = conn.vhost.clone();
        let Some(channel) = conn.channel_mut(ch) else {
            return;
        };
        let mut of_cancelled = false;
        for entry in &taken {
            if let Some(tag) = &entry.consumer {
                match channel.consumers.iter_mut().find(|c| &c.tag == tag) {
                    Some(consumer) => consumer.in_flight = consumer.in_flight.saturating_sub(1),
                    None => of_cancelled = true,
                }
            }
        }
        if of_cancelled {
            self.settled_by_cancelled(&vhost, id, ch, taken.iter());
        }
        let mut touched: Vec<ShortString> = Vec::new();
        let mut pending: Option<(ShortString, u64)> = None;
        for entry in taken {
            match how {
                Settle::Requeue => self.return_to_queue(&vhost, entry, &mut touched),
                Settle::Ack | Settle::Discard => {
                    match &mut pending {
                        Some((queue, count)) if *queue == entry.queue => *count += 1,
                        _ => {
                            if let Some((queue, count)) = pending.take() {
                                self.settled(&vhost, &queue, count, &mut touched);
                            }
                            pending = Some((entry.queue.clone(), 1));
                        }
                    }
                    if how == Settle::Discard {
                        if let Some(queued) = entry.queued {
                            self.queue_dead_letters(&vhost, &entry.queue, vec![(queued, DeathReason::Rejected)]);
                        }
                    }
                }
            }
        }
        if let Some((queue, count)) = pending.take() {
            self.settled(&vhost, &queue, count, &mut touched);
        }
        for q in touched {
            self.dispatch(&vhost, &q, now);
        }
    }

    fn settled(&mut self, vhost: &str, queue: &ShortString, count: u64, touched: &mut Vec<ShortString>) {
        if let Some(q) = self.vhosts.get_mut(vhost).and_then(|v| v.queues.get_mut(queue)) {
            q.unacked = q.unacked.saturating_sub(count);
        }
        if !touched.contains(queue) {
            touched.push(queue.clone());
        }
    }

    /// `basic.recover` with requeue: every unacked message of the channel
    /// goes back, redelivered.
    pub(crate) fn recover(&mut self, id: ConnId, ch: u16, now: Instant) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        let vhost = conn.vhost.clone();
        let Some(channel) = conn.channel_mut(ch) else { return };
        let unacked = std::mem::take(&mut channel.unacked);
        for consumer in &mut channel.consumers {
            consumer.in_flight = 0;
        }
        self.settled_by_cancelled(&vhost, id, ch, unacked.iter());
        let mut touched = Vec::new();
        for entry in unacked {
            self.return_to_queue(&vhost, entry, &mut touched);
        }
        for q in touched {
            self.dispatch(&vhost, &q, now);
        }
    }

    /// `basic.get`.
    pub(crate) fn get(
        &mut self,
        id: ConnId,
        ch: u16,
        queue: &ShortString,
        no_ack: bool,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let Some(conn) = self.conns.get(&id) else { return Ok(()) };
        let vhost = conn.vhost.clone();
        let version = self.config.rabbitmq_version;
        let mut dead = Vec::new();
        let result = {
            let q = self.queue_for_use(id, &vhost, queue)?;
            if q.is_stream() {
                return Err(AmqpError::not_implemented(format!(
                    "basic.get not supported by stream queues {}",
                    crate::error::rs_queue(queue, &vhost)
                )));
            }
            q.last_used = now;
            q.expire_head(now, false, &mut dead);
            let popped = q.pop_ready();
            if popped.is_some() && !no_ack {
                q.unacked += 1;
            }
            let quorum = q.settings.kind == QueueKind::Quorum;
            popped.map(|m| (m, q.ready.len() as u32, quorum))
        };
        if !dead.is_empty() {
            self.queue_dead_letters(&vhost, queue, dead);
        }
        self.schedule(&vhost, queue);
        let Some(conn) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        let frame_max = conn.frame_max;
        let Conn { channels, out, .. } = conn;
        let Some(channel) = channels.get_mut(usize::from(ch)).and_then(Option::as_mut) else {
            return Ok(());
        };
        match result {
            None => write_method(out, ch, &BasicGetEmpty::default().into()),
            Some((m, remaining, quorum)) => {
                let tag = channel.next_tag;
                channel.next_tag += 1;
                let get_ok = BasicGetOk {
                    delivery_tag: tag,
                    redelivered: m.redelivered,
                    exchange: m.msg.exchange.clone(),
                    routing_key: m.msg.routing_key.clone(),
                    message_count: remaining,
                };
                // RabbitMQ 3.10 writes the count on every quorum get, 0
                // included (a delivery to a consumer has it only once the
                // message came back); 4.0 writes it on both only once the
                // message came back.
                let counted = quorum && (!version.is_4() || m.delivery_count > 0);
                let extra = counted.then(|| ("x-delivery-count", FieldValue::I64(m.delivery_count as i64)));
                write_content(out, ch, &get_ok.into(), &m.msg, frame_max, extra);
                if !no_ack {
                    channel.unacked.push_back(Unacked {
                        tag,
                        queue: queue.clone(),
                        consumer: None,
                        queued: Some(m),
                    });
                }
            }
        }
        Ok(())
    }

    /// Sends messages that left `queue` towards its dead-letter exchange, if
    /// it has one; otherwise they are dropped.
    pub(crate) fn queue_dead_letters(&mut self, vhost: &str, queue: &ShortString, dead: Vec<(Queued, DeathReason)>) {
        if dead.is_empty() {
            return;
        }
        let Some(q) = self.vhosts.get(vhost).and_then(|v| v.queues.get(queue)) else {
            return;
        };
        let Some(exchange) = q.settings.dead_letter_exchange.clone() else {
            return;
        };
        let routing_key = q.settings.dead_letter_routing_key.clone();
        let vhost: Arc<str> = Arc::from(vhost);
        for (queued, reason) in dead {
            self.dead_letters.push_back(DeadLetter {
                vhost: vhost.clone(),
                queue: queue.clone(),
                queued,
                reason,
                exchange: exchange.clone(),
                routing_key: routing_key.clone(),
            });
        }
    }

    /// Routes the dead letters waiting, and any they cause in turn. Cycles
    /// without a client rejection are dropped, as RabbitMQ does.
    pub(crate) fn process_dead_letters(&mut self, now: Instant) {
        let mut budget = 100_000u32;
        while let Some(dl) = self.dead_letters.pop_front() {
            budget -= 1;
            if budget == 0 {
                tracing::warn!("dead-letter loop did not settle; dropping the rest");
                self.dead_letters.clear();
                break;
            }
            let time = self.wall_ms(now) / 1000;
            let msg = Arc::new(dead_lettered(
                &dl.queued.msg,
                &dl.queue,
                dl.reason,
                &dl.exchange,
                dl.routing_key.as_ref(),
                time,
                self.config.rabbitmq_version.is_4(),
            ));
            let Some(vh) = self.vhosts.get(&*dl.vhost) else {
                continue;
            };
            if !vh.exchanges.contains_key(&dl.exchange) {
                continue;
            }
            let targets: Vec<ShortString> = route(vh, &dl.exchange, &msg.routing_key, msg.headers())
                .into_iter()
                .filter(|q| !is_death_cycle(q, &msg))
                .collect();
            let wall = self.wall_ms(now);
            for target in targets {
                let mut dropped = Vec::new();
                if let Some(q) = self.vhosts.get_mut(&*dl.vhost).and_then(|v| v.queues.get_mut(&target)) {
                    q.enqueue(msg.clone(), now, wall, &mut dropped);
                }
                self.queue_dead_letters(&dl.vhost, &target, dropped);
                self.dispatch_inner(&dl.vhost, &target, now, true);
            }
        }
    }
}

/// RabbitMQ 4.0 gives every message to an AMQP 0-9-1 client with its
/// headers sorted by key (byte order), one entry per key (the first), from
/// whatever queue (its `mc_amqpl:protocol_state`); 3.10 keeps the
/// publisher's order. Done once, as the message comes in: a table already
/// in that order keeps the bytes it came with.
fn sort_headers(header: &mut Header) {
    let Header::Decoded(props) = header else {
        return;
    };
    let in_order = match props.view().headers {
        None => true,
        Some(headers) => {
            let mut previous: Option<&[u8]> = None;
            headers.iter().all(|(key, _)| {
                let after = previous.is_none_or(|p| p < key);
                previous = Some(key);
                after
            })
        }
    };
    if in_order {
        return;
    }
    if let Some(headers) = props.headers.as_mut() {
        let mut entries: Vec<_> = std::mem::take(headers).into_iter().collect();
        // Stable: of equal keys the first stays first, and is the one kept.
        entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        entries.dedup_by(|later, earlier| later.0 == earlier.0);
        *headers = entries.into_iter().collect();
    }
}

/// RabbitMQ's sender-selected distribution: the `CC` and `BCC` headers
/// carry more routing keys; `BCC` is removed before the message is stored.
/// Only that removal changes the properties: a message without `BCC` keeps
/// the property bytes it came with.
fn sender_selected_keys(header: &mut Header) -> Vec<ShortString> {
    let Header::Decoded(props) = header else {
        return Vec::new();
    };
    let Some(headers) = props.headers.as_ref() else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for name in ["CC", "BCC"] {
        if let Some(FieldValue::Array(values)) = headers.get(name) {
            for value in values.iter() {
                if let FieldValue::LongString(key) = value {
                    if let Some(key) = ShortString::from_bytes(key.to_bytes()) {
                        keys.push(key);
                    }
                }
            }
        }
    }
    if headers.contains_key("BCC") {
        if let Some(headers) = props.headers.as_mut() {
            headers.remove("BCC");
        }
    }
    keys
}

fn write_ack(out: &mut bytes::BytesMut, ch: u16, upto: u64, written: u64) {
    let ack = BasicAck {
        delivery_tag: upto,
        multiple: upto > written + 1,
    };
    write_method(out, ch, &ack.into());
}

/// What became of an offer to a consumer.
enum Attempt {
    /// No room (prefetch, flow, closing): try the next consumer.
    Busy,
    /// Delivered with `no_ack`: nothing to track.
    Settled,
    /// Delivered with this delivery tag: track it until settled.
    Tracked(u64),
}

/// Offers the queue's head to a consumer: if it has room, writes the
/// delivery to its connection's outbox.
fn try_deliver(
    conns: &mut super::FastMap<ConnId, Conn>,
    woken: &mut Vec<ConnId>,
    cref: &ConsumerRef,
    m: &Queued,
    extra: Option<(&str, FieldValue)>,
    limit: usize,
) -> Attempt {
    let Some(conn) = conns.get_mut(&cref.conn) else {
        return Attempt::Busy;
    };
    if !conn.room_for_delivery(limit) {
        return Attempt::Busy;
    }
    let frame_max = conn.frame_max;
    let Conn { channels, out, .. } = &mut *conn;
    let Some(channel) = channels.get_mut(usize::from(cref.channel)).and_then(Option::as_mut) else {
        return Attempt::Busy;
    };
    if channel.closing {
        return Attempt::Busy;
    }
    let global_ok = channel.global_prefetch == 0 || channel.unacked.len() < usize::from(channel.global_prefetch);
    let Some(consumer) = channel.consumers.iter_mut().find(|c| c.tag == cref.tag) else {
        return Attempt::Busy;
    };
    let no_ack = consumer.no_ack;
    if !no_ack && !(global_ok && (consumer.prefetch == 0 || consumer.in_flight < u32::from(consumer.prefetch))) {
        return Attempt::Busy;
    }
    let tag = channel.next_tag;
    channel.next_tag += 1;
    if !no_ack {
        consumer.in_flight += 1;
    }
    let deliver = DeliverRef {
        consumer_tag: &cref.tag,
        delivery_tag: tag,
        redelivered: m.redelivered,
        exchange: &m.msg.exchange,
        routing_key: &m.msg.routing_key,
    };
    write_delivery(out, cref.channel, &deliver, &m.msg, frame_max, extra.into());
    wake_conn(cref.conn, conn, woken);
    if no_ack {
        Attempt::Settled
    } else {
        Attempt::Tracked(tag)
    }
}

/// Records an unacked delivery on the consumer's channel.
fn track(conns: &mut super::FastMap<ConnId, Conn>, cref: &ConsumerRef, qname: &ShortString, tag: u64, m: Queued) {
    if let Some(channel) = conns.get_mut(&cref.conn).and_then(|c| c.channel_mut(cref.channel)) {
        channel.unacked.push_back(Unacked {
            tag,
            queue: qname.clone(),
            consumer: Some(cref.tag.clone()),
            queued: Some(m),
        });
    }
}

/// Streams: every consumer reads the log from its own offset, as far as
/// its credit (prefetch minus unacked) allows.
///
/// RabbitMQ 4.0 keeps a stream's messages as AMQP 1.0 and converts them
/// back for delivery; of that, acemq-memory imitates what the header's
/// `durable` flag does: `delivery_mode` 2 comes back as 2, any other value
/// (or none) as 1.
fn dispatch_stream(
    q: &mut super::queue::Queue,
    conns: &mut super::FastMap<ConnId, Conn>,
    woken: &mut Vec<ConnId>,
    version: RabbitMqVersion,
    limit: usize,
) {
    for i in 0..q.consumers.len() {
        let cref = &q.consumers[i];
        let Some(conn) = conns.get_mut(&cref.conn) else {
            continue;
        };
        let frame_max = conn.frame_max;
        let mut wrote = false;
        {
            let Conn {
                channels,
                out,
                writing,
                starved,
                ..
            } = &mut *conn;
            let Some(channel) = channels.get_mut(usize::from(cref.channel)).and_then(Option::as_mut) else {
                continue;
            };
            if channel.closing {
                continue;
            }
            loop {
                let global_ok =
                    channel.global_prefetch == 0 || channel.unacked.len() < usize::from(channel.global_prefetch);
                let Some(consumer) = channel.consumers.iter_mut().find(|c| c.tag == cref.tag) else {
                    break;
                };
                let own_ok = consumer.prefetch == 0 || consumer.in_flight < u32::from(consumer.prefetch);
                if !(global_ok && own_ok) {
                    break;
                }
                if out.len() + *writing >= limit {
                    *starved = true;
                    break;
                }
                let Some(entry) = q.log.entry_from(consumer.stream_next) else {
                    break;
                };
                let offset = entry.offset;
                consumer.stream_next = offset + 1;
                consumer.in_flight += 1;
                let tag = channel.next_tag;
                channel.next_tag += 1;
                let deliver = DeliverRef {
                    consumer_tag: &cref.tag,
                    delivery_tag: tag,
                    redelivered: false,
                    exchange: &entry.msg.exchange,
                    routing_key: &entry.msg.routing_key,
                };
                let extra = Some(("x-stream-offset", FieldValue::I64(offset as i64)));
                let outgoing = Outgoing {
                    extra,
                    durable_flag: version.is_4(),
                };
                write_delivery(out, cref.channel, &deliver, &entry.msg, frame_max, outgoing);
                channel.unacked.push_back(Unacked {
                    tag,
                    queue: q.name.clone(),
                    consumer: Some(cref.tag.clone()),
                    queued: None,
                });
                q.unacked += 1;
                wrote = true;
            }
        }
        if wrote {
            wake_conn(cref.conn, conn, woken);
        }
    }
}
