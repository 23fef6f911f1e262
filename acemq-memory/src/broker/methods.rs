//! The methods a client sends on an open channel, answered as RabbitMQ 3.10
//! answers them: declares and their equivalence checks, bindings, purge and
//! delete, qos, consume and cancel, settlements, confirm and tx modes.
//! Must never write a reply for a `no_wait` method.

use std::time::Instant;

use amqp_codec::{
    BasicCancelOk, BasicConsumeOk, BasicQosOk, BasicRecoverOk, ChannelFlowOk, ConfirmSelectOk, ExchangeBindOk,
    ExchangeDeclare, ExchangeDeclareOk, ExchangeDeleteOk, ExchangeUnbindOk, FieldTable, FieldValue, Method,
    QueueBindOk, QueueDeclare, QueueDeclareOk, QueueDeleteOk, QueuePurgeOk, QueueUnbindOk, ShortString, TxCommitOk,
    TxRollbackOk, TxSelectOk,
};

use super::args::{self, assert_field_equivalence, assert_queue_args_equivalence, queue_settings, QueueKind};
use super::delivery::Settle;
use super::exchange::{Binding, Destination, Exchange, ExchangeKind};
use super::queue::{ConsumerRef, Queue};
use super::{BrokerMachine, Channel, Confirms, ConnId, Consumer, TxOp};
use crate::error::{rs_exchange, rs_queue, AmqpError};

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// `prefix` and 22 random base64url characters, as RabbitMQ names
/// server-named queues and consumer tags.
fn generated_name(prefix: &str) -> ShortString {
    let mut name = String::with_capacity(prefix.len() + 22);
    name.push_str(prefix);
    let (mut a, mut b) = (rand::random::<u64>(), rand::random::<u64>());
    for i in 0..22 {
        let source = if i < 11 { &mut a } else { &mut b };
        name.push(BASE64URL[(*source & 63) as usize] as char);
        *source >>= 6;
    }
    name.into()
}

fn default_exchange_refused() -> AmqpError {
    AmqpError::access_refused("operation not permitted on the default exchange")
}

impl BrokerMachine {
    /// Opens channel `ch` of connection `id`.
    pub(crate) fn open_channel(&mut self, id: ConnId, ch: u16) -> Result<(), AmqpError> {
        let max_body = self.config.max_message_size;
        let Some(conn) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        if conn.channel_max != 0 && conn.open_channels >= usize::from(conn.channel_max) {
            return Err(AmqpError::not_allowed(format!(
                "number of channels opened ({}) has reached the negotiated channel_max ({})",
                conn.open_channels, conn.channel_max
            )));
        }
        let index = usize::from(ch);
        if conn.channels.len() <= index {
            conn.channels.resize_with(index + 1, || None);
        }
        conn.channels[index] = Some(Channel::new(max_body));
        conn.open_channels += 1;
        Ok(())
    }

    /// Forgets channel `ch` (after its close handshake).
    pub(crate) fn drop_channel(&mut self, id: ConnId, ch: u16, now: Instant) {
        self.release_channel(id, ch, now);
        if let Some(conn) = self.conns.get_mut(&id) {
            if let Some(slot) = conn.channels.get_mut(usize::from(ch)) {
                if slot.take().is_some() {
                    conn.open_channels = conn.open_channels.saturating_sub(1);
                }
            }
        }
    }

    /// A queue this connection may use: 404 if it does not exist, 405 if
    /// another connection owns it.
    pub(crate) fn queue_for_use(
        &mut self,
        id: ConnId,
        vhost: &str,
        queue: &ShortString,
    ) -> Result<&mut Queue, AmqpError> {
        let q = self
            .vhosts
            .get_mut(vhost)
            .and_then(|v| v.queues.get_mut(queue))
            .ok_or_else(|| AmqpError::no_queue(queue, vhost))?;
        match q.exclusive_owner {
            Some(owner) if owner != id => Err(AmqpError::queue_locked(queue, vhost)),
            _ => Ok(q),
        }
    }

    /// RabbitMQ's shortcut: an empty queue name means the channel's most
    /// recently declared queue.
    fn expand_queue(&mut self, id: ConnId, ch: u16, queue: &ShortString) -> Result<ShortString, AmqpError> {
        if !queue.is_empty() {
            return Ok(queue.clone());
        }
        self.conns
            .get_mut(&id)
            .and_then(|c| c.channel_mut(ch))
            .and_then(|c| c.last_queue.clone())
            .ok_or_else(|| AmqpError::not_found("no previously declared queue"))
    }

    fn channel(&mut self, id: ConnId, ch: u16) -> Option<&mut Channel> {
        self.conns.get_mut(&id).and_then(|c| c.channel_mut(ch))
    }

    /// Handles a method without content on an open channel.
    pub(crate) fn channel_method(
        &mut self,
        id: ConnId,
        ch: u16,
        method: Method,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let Some(conn) = self.conns.get(&id) else { return Ok(()) };
        let vhost = conn.vhost.clone();
        match method {
            Method::ExchangeDeclare(m) => self.exchange_declare(id, ch, &vhost, m),
            Method::ExchangeDelete(m) => {
                if m.exchange.is_empty() {
                    return Err(default_exchange_refused());
                }
                if let Some(x) = self.vhosts.get(&*vhost).and_then(|v| v.exchanges.get(&m.exchange)) {
                    if m.if_unused && !x.bindings.is_empty() {
                        return Err(AmqpError::precondition(format!(
                            "{} in use",
                            rs_exchange(&m.exchange, &vhost)
                        )));
                    }
                    self.delete_exchange_internal(&vhost, &m.exchange);
                }
                if !m.no_wait {
                    self.send(id, ch, ExchangeDeleteOk {});
                }
                Ok(())
            }
            Method::ExchangeBind(m) => {
                self.bind(
                    &vhost,
                    &m.source,
                    Destination::Exchange(m.destination.clone()),
                    &m.routing_key,
                    &m.arguments,
                    true,
                )?;
                if !m.no_wait {
                    self.send(id, ch, ExchangeBindOk {});
                }
                Ok(())
            }
            Method::ExchangeUnbind(m) => {
                self.bind(
                    &vhost,
                    &m.source,
                    Destination::Exchange(m.destination.clone()),
                    &m.routing_key,
                    &m.arguments,
                    false,
                )?;
                if !m.no_wait {
                    self.send(id, ch, ExchangeUnbindOk {});
                }
                Ok(())
            }
            Method::QueueDeclare(m) => self.queue_declare(id, ch, &vhost, m, now),
            Method::QueueBind(m) => {
                let queue = self.expand_queue(id, ch, &m.queue)?;
                let key = if m.queue.is_empty() && m.routing_key.is_empty() {
                    queue.clone()
                } else {
                    m.routing_key.clone()
                };
                if m.exchange.is_empty() {
                    return Err(default_exchange_refused());
                }
                if !self.exchange_exists(&vhost, &m.exchange.to_string_lossy()) {
                    return Err(AmqpError::no_exchange(&m.exchange, &vhost));
                }
                self.queue_for_use(id, &vhost, &queue)?;
                self.bind(&vhost, &m.exchange, Destination::Queue(queue), &key, &m.arguments, true)?;
                if !m.no_wait {
                    self.send(id, ch, QueueBindOk {});
                }
                Ok(())
            }
            Method::QueueUnbind(m) => {
                let queue = self.expand_queue(id, ch, &m.queue)?;
                let key = if m.queue.is_empty() && m.routing_key.is_empty() {
                    queue.clone()
                } else {
                    m.routing_key.clone()
                };
                if m.exchange.is_empty() {
                    return Err(default_exchange_refused());
                }
                self.queue_for_use(id, &vhost, &queue)?;
                self.bind(
                    &vhost,
                    &m.exchange,
                    Destination::Queue(queue),
                    &key,
                    &m.arguments,
                    false,
                )?;
                self.send(id, ch, QueueUnbindOk {});
                Ok(())
            }
            Method::QueuePurge(m) => {
                let queue = self.expand_queue(id, ch, &m.queue)?;
                let q = self.queue_for_use(id, &vhost, &queue)?;
                let n = if q.is_stream() { 0 } else { q.purge() };
                if !m.no_wait {
                    self.send(
                        id,
                        ch,
                        QueuePurgeOk {
                            message_count: n as u32,
                        },
                    );
                }
                Ok(())
            }
            Method::QueueDelete(m) => {
                let queue = self.expand_queue(id, ch, &m.queue)?;
                let exists = self.vhosts.get(&*vhost).is_some_and(|v| v.queues.contains_key(&queue));
                let mut count = 0;
                if exists {
                    let q = self.queue_for_use(id, &vhost, &queue)?;
                    if m.if_unused && !q.consumers.is_empty() {
                        return Err(AmqpError::precondition(format!("{} in use", rs_queue(&queue, &vhost))));
                    }
                    if m.if_empty && q.message_count() > 0 {
                        return Err(AmqpError::precondition(format!(
                            "{} not empty",
                            rs_queue(&queue, &vhost)
                        )));
                    }
                    count = self.delete_queue_internal(&vhost, &queue).unwrap_or(0);
                }
                if !m.no_wait {
                    self.send(
                        id,
                        ch,
                        QueueDeleteOk {
                            message_count: count as u32,
                        },
                    );
                }
                Ok(())
            }
            Method::BasicQos(m) => {
                if m.prefetch_size != 0 {
                    return Err(AmqpError::not_implemented(format!(
                        "prefetch_size!=0 ({})",
                        m.prefetch_size
                    )));
                }
                let Some(channel) = self.channel(id, ch) else {
                    return Ok(());
                };
                if m.global {
                    channel.global_prefetch = m.prefetch_count;
                } else {
                    channel.prefetch = m.prefetch_count;
                }
                let queues: Vec<ShortString> = channel.consumers.iter().map(|c| c.queue.clone()).collect();
                self.send(id, ch, BasicQosOk {});
                for q in queues {
                    self.dispatch(&vhost, &q, now);
                }
                Ok(())
            }
            Method::BasicConsume(m) => self.consume(id, ch, &vhost, m, now),
            Method::BasicCancel(m) => {
                let removed = self.channel(id, ch).and_then(|channel| {
                    let at = channel.consumers.iter().position(|c| c.tag == m.consumer_tag)?;
                    Some(channel.consumers.remove(at))
                });
                if let Some(consumer) = removed {
                    self.detach_consumer(&vhost, id, ch, &consumer.tag, &consumer.queue, now);
                }
                if !m.no_wait {
                    self.send(
                        id,
                        ch,
                        BasicCancelOk {
                            consumer_tag: m.consumer_tag,
                        },
                    );
                }
                Ok(())
            }
            Method::BasicGet(m) => {
                let queue = self.expand_queue(id, ch, &m.queue)?;
                self.get(id, ch, &queue, m.no_ack, now)
            }
            method @ (Method::BasicAck(_) | Method::BasicReject(_) | Method::BasicNack(_)) => {
                if let Some(tx) = self.channel(id, ch).and_then(|c| c.tx.as_mut()) {
                    tx.push(TxOp::Settle(method));
                    return Ok(());
                }
                self.settle_method(id, ch, method, now)
            }
            Method::BasicRecover(m) => {
                if !m.requeue {
                    return Err(AmqpError::not_implemented("requeue=false"));
                }
                self.recover(id, ch, now);
                self.send(id, ch, BasicRecoverOk {});
                Ok(())
            }
            Method::BasicRecoverAsync(m) => {
                if !m.requeue {
                    return Err(AmqpError::not_implemented("requeue=false"));
                }
                self.recover(id, ch, now);
                Ok(())
            }
            Method::ConfirmSelect(m) => {
                let Some(channel) = self.channel(id, ch) else {
                    return Ok(());
                };
                if channel.tx.is_some() {
                    return Err(AmqpError::precondition("cannot switch from tx to confirm mode"));
                }
                if channel.confirm.is_none() {
                    channel.confirm = Some(Confirms::default());
                }
                if !m.no_wait {
                    self.send(id, ch, ConfirmSelectOk {});
                }
                Ok(())
            }
            Method::TxSelect(_) => {
                let Some(channel) = self.channel(id, ch) else {
                    return Ok(());
                };
                if channel.confirm.is_some() {
                    return Err(AmqpError::precondition("cannot switch from confirm to tx mode"));
                }
                if channel.tx.is_none() {
                    channel.tx = Some(Vec::new());
                }
                self.send(id, ch, TxSelectOk {});
                Ok(())
            }
            Method::TxCommit(_) => {
                let Some(channel) = self.channel(id, ch) else {
                    return Ok(());
                };
                let Some(tx) = channel.tx.as_mut() else {
                    return Err(AmqpError::precondition("channel is not transactional"));
                };
                let ops = std::mem::take(tx);
                for op in ops {
                    match op {
                        TxOp::Publish(content) => self.route_and_enqueue(id, ch, &vhost, *content, None, now),
                        TxOp::Settle(method) => self.settle_method(id, ch, method, now)?,
                    }
                }
                self.send(id, ch, TxCommitOk {});
                Ok(())
            }
            Method::TxRollback(_) => {
                let Some(channel) = self.channel(id, ch) else {
                    return Ok(());
                };
                let Some(tx) = channel.tx.as_mut() else {
                    return Err(AmqpError::precondition("channel is not transactional"));
                };
                tx.clear();
                self.send(id, ch, TxRollbackOk {});
                Ok(())
            }
            Method::ChannelFlow(m) => {
                let Some(channel) = self.channel(id, ch) else {
                    return Ok(());
                };
                channel.flow = m.active;
                let queues: Vec<ShortString> = channel.consumers.iter().map(|c| c.queue.clone()).collect();
                self.send(id, ch, ChannelFlowOk { active: m.active });
                for q in queues {
                    self.dispatch(&vhost, &q, now);
                }
                Ok(())
            }
            Method::ChannelFlowOk(_) => Ok(()),
            Method::ChannelOpen(_) => Err(AmqpError::channel_error("second 'channel.open' seen")),
            _ => Err(AmqpError::command_invalid("unimplemented method")),
        }
    }

    fn settle_method(&mut self, id: ConnId, ch: u16, method: Method, now: Instant) -> Result<(), AmqpError> {
        let (tag, multiple, how) = match method {
            Method::BasicAck(m) => (m.delivery_tag, m.multiple, Settle::Ack),
            Method::BasicReject(m) => (
                m.delivery_tag,
                false,
                if m.requeue { Settle::Requeue } else { Settle::Discard },
            ),
            Method::BasicNack(m) => (
                m.delivery_tag,
                m.multiple,
                if m.requeue { Settle::Requeue } else { Settle::Discard },
            ),
            _ => return Ok(()),
        };
        self.settle(id, ch, tag, multiple, how, now)
    }

    fn exchange_declare(&mut self, id: ConnId, ch: u16, vhost: &str, m: ExchangeDeclare) -> Result<(), AmqpError> {
        let Some(vh) = self.vhosts.get_mut(vhost) else {
            return Ok(());
        };
        if m.passive {
            if !vh.exchanges.contains_key(&m.exchange) {
                return Err(AmqpError::no_exchange(&m.exchange, vhost));
            }
        } else {
            if m.exchange.is_empty() {
                return Err(default_exchange_refused());
            }
            if m.exchange.as_bytes().starts_with(b"amq.") {
                return Err(AmqpError::access_refused(format!(
                    "exchange name '{}' contains reserved prefix 'amq.*'",
                    m.exchange
                )));
            }
            let Some(kind) = ExchangeKind::parse(m.kind.as_bytes()) else {
                return Err(AmqpError::command_invalid(format!(
                    "unknown exchange type '{}'",
                    m.kind
                )));
            };
            match vh.exchanges.get(&m.exchange) {
                Some(x) => {
                    let what = rs_exchange(&m.exchange, vhost);
                    assert_field_equivalence(x.kind.name(), kind.name(), &what, "type")?;
                    assert_field_equivalence(x.durable, m.durable, &what, "durable")?;
                    assert_field_equivalence(x.auto_delete, m.auto_delete, &what, "auto_delete")?;
                    assert_field_equivalence(x.internal, m.internal, &what, "internal")?;
                    args::assert_args_equivalence(&x.arguments, &m.arguments, &what, &["alternate-exchange"])?;
                }
                None => {
                    let mut x = Exchange::new("", kind, m.durable);
                    x.name = m.exchange.clone();
                    x.auto_delete = m.auto_delete;
                    x.internal = m.internal;
                    x.arguments = m.arguments.clone();
                    vh.exchanges.insert(m.exchange.clone(), x);
                }
            }
        }
        if !m.no_wait {
            self.send(id, ch, ExchangeDeclareOk {});
        }
        Ok(())
    }

    /// Adds (or with `add == false` removes) a binding from `source`.
    fn bind(
        &mut self,
        vhost: &str,
        source: &ShortString,
        destination: Destination,
        key: &ShortString,
        arguments: &FieldTable,
        add: bool,
    ) -> Result<(), AmqpError> {
        let Some(vh) = self.vhosts.get_mut(vhost) else {
            return Ok(());
        };
        if source.is_empty() {
            return Err(default_exchange_refused());
        }
        if !vh.exchanges.contains_key(source) {
            return Err(AmqpError::no_exchange(source, vhost));
        }
        match &destination {
            Destination::Exchange(d) if d.is_empty() => return Err(default_exchange_refused()),
            Destination::Exchange(d) if !vh.exchanges.contains_key(d) => {
                return Err(AmqpError::no_exchange(d, vhost));
            }
            Destination::Queue(q) if !vh.queues.contains_key(q) => return Err(AmqpError::no_queue(q, vhost)),
            _ => {}
        }
        let binding = Binding {
            destination,
            key: key.clone(),
            arguments: arguments.clone(),
        };
        let mut emptied = None;
        if let Some(x) = vh.exchanges.get_mut(source) {
            if add {
                if !x.bindings.contains(&binding) {
                    x.bindings.push(binding);
                }
            } else {
                let before = x.bindings.len();
                x.bindings.retain(|b| b != &binding);
                if before > 0 && x.bindings.is_empty() && x.auto_delete {
                    emptied = Some(x.name.clone());
                }
            }
        }
        if let Some(x) = emptied {
            self.delete_exchange_internal(vhost, &x);
        }
        Ok(())
    }

    fn queue_declare(
        &mut self,
        id: ConnId,
        ch: u16,
        vhost: &str,
        m: QueueDeclare,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let name = if m.queue.is_empty() && !m.passive {
            generated_name("amq.gen-")
        } else {
            m.queue.clone()
        };
        let (messages, consumers) = if m.passive {
            let q = self.queue_for_use(id, vhost, &name)?;
            q.last_used = now;
            (q.message_count(), q.consumers.len())
        } else {
            if name.as_bytes().starts_with(b"amq.") && !m.queue.is_empty() {
                return Err(AmqpError::access_refused(format!(
                    "queue name '{name}' contains reserved prefix 'amq.*'"
                )));
            }
            let settings = queue_settings(&m.arguments, &name, vhost, self.config.quorum_default_delivery_limit)?;
            let Some(vh) = self.vhosts.get_mut(vhost) else {
                return Ok(());
            };
            match vh.queues.get_mut(&name) {
                Some(q) => {
                    let locked = match q.exclusive_owner {
                        Some(owner) => owner != id,
                        None => m.exclusive,
                    };
                    if locked {
                        return Err(AmqpError::queue_locked(&name, vhost));
                    }
                    let what = rs_queue(&name, vhost);
                    assert_field_equivalence(q.durable, m.durable, &what, "durable")?;
                    assert_field_equivalence(q.auto_delete, m.auto_delete, &what, "auto_delete")?;
                    assert_queue_args_equivalence(&q.arguments, &m.arguments, &name, vhost)?;
                    q.last_used = now;
                    (q.message_count(), q.consumers.len())
                }
                None => {
                    if matches!(settings.kind, QueueKind::Quorum | QueueKind::Stream) {
                        let what = rs_queue(&name, vhost);
                        let refused = if !m.durable {
                            Some("non-durable")
                        } else if m.exclusive {
                            Some("exclusive-declare")
                        } else if m.auto_delete {
                            Some("auto-delete")
                        } else {
                            None
                        };
                        if let Some(property) = refused {
                            return Err(AmqpError::precondition(format!(
                                "invalid property '{property}' for {what}"
                            )));
                        }
                    }
                    let owner = m.exclusive.then_some(id);
                    let q = Queue::new(
                        name.clone(),
                        m.durable,
                        m.auto_delete,
                        owner,
                        m.arguments.clone(),
                        settings,
                        now,
                    );
                    vh.queues.insert(name.clone(), q);
                    (0, 0)
                }
            }
        };
        if let Some(channel) = self.channel(id, ch) {
            channel.last_queue = Some(name.clone());
        }
        if !m.no_wait {
            self.send(
                id,
                ch,
                QueueDeclareOk {
                    queue: name,
                    message_count: messages as u32,
                    consumer_count: consumers as u32,
                },
            );
        }
        Ok(())
    }

    fn consume(
        &mut self,
        id: ConnId,
        ch: u16,
        vhost: &str,
        m: amqp_codec::BasicConsume,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let queue = self.expand_queue(id, ch, &m.queue)?;
        let tag = if m.consumer_tag.is_empty() {
            generated_name("amq.ctag-")
        } else {
            m.consumer_tag.clone()
        };
        let Some(channel) = self.channel(id, ch) else {
            return Ok(());
        };
        let prefetch = channel.prefetch;
        if channel.consumers.iter().any(|c| c.tag == tag) {
            return Err(AmqpError::not_allowed(format!("attempt to reuse consumer tag '{tag}'")));
        }
        let q = self.queue_for_use(id, vhost, &queue)?;
        if q.consumers.iter().any(|c| c.exclusive) || (m.exclusive && !q.consumers.is_empty()) {
            return Err(AmqpError::access_refused(format!(
                "{} in exclusive use",
                rs_queue(&queue, vhost)
            )));
        }
        let mut stream_next = 0;
        if q.is_stream() {
            if prefetch == 0 {
                return Err(AmqpError::precondition(format!(
                    "consumer prefetch count is not set for '{}'",
                    rs_queue(&queue, vhost)
                )));
            }
            if m.no_ack {
                return Err(AmqpError::not_implemented(format!(
                    "automatic acknowledgement not supported by stream queues {}",
                    rs_queue(&queue, vhost)
                )));
            }
            stream_next = stream_start(q, m.arguments.get("x-stream-offset"))?;
        }
        q.consumers.push(ConsumerRef {
            conn: id,
            channel: ch,
            tag: tag.clone(),
            exclusive: m.exclusive,
        });
        q.had_consumers = true;
        q.last_used = now;
        let Some(channel) = self.channel(id, ch) else {
            return Ok(());
        };
        channel.consumers.push(Consumer {
            tag: tag.clone(),
            queue: queue.clone(),
            no_ack: m.no_ack,
            prefetch,
            in_flight: 0,
            stream_next,
        });
        if !m.no_wait {
            self.send(id, ch, BasicConsumeOk { consumer_tag: tag });
        }
        self.dispatch(vhost, &queue, now);
        Ok(())
    }
}

/// Where a stream consumer starts reading, from its `x-stream-offset`.
fn stream_start(q: &Queue, offset: Option<&FieldValue>) -> Result<u64, AmqpError> {
    let len = q.log.len() as u64;
    let invalid = |v: &FieldValue| AmqpError::precondition(format!("Invalid stream offset arg: {}", args::show(v)));
    Ok(match offset {
        None => len,
        Some(FieldValue::LongString(s)) => match s.as_bytes() {
            b"first" => 0,
            b"last" => len.saturating_sub(1),
            b"next" => len,
            _ => return Err(invalid(offset.unwrap_or(&FieldValue::Void))),
        },
        Some(FieldValue::Timestamp(secs)) => {
            let ms = secs.saturating_mul(1000);
            q.log
                .iter()
                .position(|e| e.timestamp_ms >= ms)
                .map_or(len, |p| p as u64)
        }
        Some(v) => match v.as_i64() {
            Some(n) => (n.max(0) as u64).min(len),
            None => return Err(invalid(v)),
        },
    })
}
