//! The methods a client sends on an open channel, answered as RabbitMQ 3.10
//! answers them: declares and their equivalence checks, bindings, purge and
//! delete, qos, consume and cancel, settlements, confirm and tx modes: one
//! handler per method, dispatched from one table (`channel_method`).
//! Must never write a reply for a `no_wait` method.

use std::sync::Arc;
use std::time::Instant;

use acemq_codec::{
    BasicCancel, BasicCancelOk, BasicConsume, BasicConsumeOk, BasicGet, BasicQos, BasicQosOk, BasicRecoverOk,
    ChannelFlow, ChannelFlowOk, ConfirmSelect, ConfirmSelectOk, ExchangeBind, ExchangeBindOk, ExchangeDeclare,
    ExchangeDeclareOk, ExchangeDelete, ExchangeDeleteOk, ExchangeUnbind, ExchangeUnbindOk, FieldTable, FieldValue,
    Method, QueueBind, QueueBindOk, QueueDeclare, QueueDeclareOk, QueueDelete, QueueDeleteOk, QueuePurge, QueuePurgeOk,
    QueueUnbind, QueueUnbindOk, ShortString, TxCommitOk, TxRollbackOk, TxSelectOk,
};

use super::args::{self, assert_field_equivalence, assert_queue_args_equivalence, queue_settings, QueueKind};
use super::delivery::Settle;
use super::exchange::{Binding, Destination, Exchange, ExchangeKind};
use super::feature_args;
use super::queue::{ConsumerRef, Queue};
use super::stream::StartAt;
use super::{BrokerMachine, Channel, Confirms, ConnId, Consumer, TxOp};
use crate::error::{rs_exchange, rs_queue, AmqpError};

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// `prefix` and 22 random base64url characters, as RabbitMQ names
/// server-named queues and consumer tags.
pub(super) fn generated_name(prefix: &str) -> ShortString {
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

    /// Handles a method without content on an open channel: one handler per
    /// method, as RabbitMQ's `rabbit_channel` has one `handle_method` clause
    /// per method.
    pub(crate) fn channel_method(
        &mut self,
        id: ConnId,
        ch: u16,
        method: Method,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let Some(conn) = self.conns.get(&id) else { return Ok(()) };
        let from = &Origin {
            id,
            ch,
            vhost: conn.vhost.clone(),
            now,
        };
        match method {
            Method::ExchangeDeclare(m) => self.exchange_declare(from, m),
            Method::ExchangeDelete(m) => self.exchange_delete(from, m),
            Method::ExchangeBind(m) => self.exchange_bind(from, m),
            Method::ExchangeUnbind(m) => self.exchange_unbind(from, m),
            Method::QueueDeclare(m) => self.queue_declare(from, m),
            Method::QueueBind(m) => self.queue_bind(from, m),
            Method::QueueUnbind(m) => self.queue_unbind(from, m),
            Method::QueuePurge(m) => self.queue_purge(from, m),
            Method::QueueDelete(m) => self.queue_delete(from, m),
            Method::BasicQos(m) => self.basic_qos(from, m),
            Method::BasicConsume(m) => self.basic_consume(from, m),
            Method::BasicCancel(m) => self.basic_cancel(from, m),
            Method::BasicGet(m) => self.basic_get(from, m),
            method @ (Method::BasicAck(_) | Method::BasicReject(_) | Method::BasicNack(_)) => {
                self.basic_settle(from, method)
            }
            Method::BasicRecover(m) => self.basic_recover(from, m.requeue, true),
            Method::BasicRecoverAsync(m) => self.basic_recover(from, m.requeue, false),
            Method::ConfirmSelect(m) => self.confirm_select(from, m),
            Method::TxSelect(_) => self.tx_select(from),
            Method::TxCommit(_) => self.tx_commit(from),
            Method::TxRollback(_) => self.tx_rollback(from),
            Method::ChannelFlow(m) => self.channel_flow(from, m),
            Method::ChannelFlowOk(_) => Ok(()),
            Method::ChannelOpen(_) => Err(AmqpError::channel_error("second 'channel.open' seen")),
            _ => Err(AmqpError::command_invalid("unimplemented method")),
        }
    }

    // ---- exchange -------------------------------------------------------

    fn exchange_declare(&mut self, from: &Origin, m: ExchangeDeclare) -> Result<(), AmqpError> {
        let vhost = &*from.vhost;
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
                // RabbitMQ 3.10 closes the connection (503), 4.0 the channel (406).
                let text = format!("unknown exchange type '{}'", m.kind);
                return Err(if self.config.rabbitmq_version.is_4() {
                    AmqpError::precondition(text)
                } else {
                    AmqpError::command_invalid(text)
                });
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
        self.reply(from, m.no_wait, ExchangeDeclareOk {});
        Ok(())
    }

    fn exchange_delete(&mut self, from: &Origin, m: ExchangeDelete) -> Result<(), AmqpError> {
        let vhost = &*from.vhost;
        if m.exchange.is_empty() {
            return Err(default_exchange_refused());
        }
        if let Some(x) = self.vhosts.get(vhost).and_then(|v| v.exchanges.get(&m.exchange)) {
            if m.if_unused && !x.bindings.is_empty() {
                return Err(AmqpError::precondition(format!(
                    "{} in use",
                    rs_exchange(&m.exchange, vhost)
                )));
            }
            self.delete_exchange_internal(vhost, &m.exchange);
        }
        self.reply(from, m.no_wait, ExchangeDeleteOk {});
        Ok(())
    }

    fn exchange_bind(&mut self, from: &Origin, m: ExchangeBind) -> Result<(), AmqpError> {
        let destination = Destination::Exchange(m.destination.clone());
        self.bind(&from.vhost, &m.source, destination, &m.routing_key, &m.arguments, true)?;
        self.reply(from, m.no_wait, ExchangeBindOk {});
        Ok(())
    }

    fn exchange_unbind(&mut self, from: &Origin, m: ExchangeUnbind) -> Result<(), AmqpError> {
        let destination = Destination::Exchange(m.destination.clone());
        self.bind(&from.vhost, &m.source, destination, &m.routing_key, &m.arguments, false)?;
        self.reply(from, m.no_wait, ExchangeUnbindOk {});
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
        if source.is_empty() || matches!(&destination, Destination::Exchange(d) if d.is_empty()) {
            return Err(default_exchange_refused());
        }
        let binding = Binding {
            destination,
            key: key.clone(),
            arguments: arguments.clone(),
        };
        // RabbitMQ 3.10.8 removes a binding that is not there without a
        // word, whether its exchange and queue exist or not.
        if !add && !vh.exchanges.get(source).is_some_and(|x| x.bindings.contains(&binding)) {
            return Ok(());
        }
        let destination = binding.destination.clone();
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
        let mut emptied = None;
        if let Some(x) = vh.exchanges.get_mut(source) {
            if add {
                x.bindings.insert(binding);
            } else if x.bindings.remove(&binding) && x.bindings.is_empty() && x.auto_delete {
                emptied = Some(x.name.clone());
            }
        }
        if let Some(x) = emptied {
            self.delete_exchange_internal(vhost, &x);
        }
        Ok(())
    }

    // ---- queue ----------------------------------------------------------

    /// `queue.declare`: a passive one reports on the queue, any other
    /// creates it or checks that it is equivalent to the one there.
    fn queue_declare(&mut self, from: &Origin, m: QueueDeclare) -> Result<(), AmqpError> {
        let name = if m.queue.is_empty() && !m.passive {
            generated_name("amq.gen-")
        } else {
            m.queue.clone()
        };
        let counts = if name.as_bytes().starts_with(super::reply_to::REPLY_TO.as_bytes()) {
            // Every declare of these names is passive (`reply_to.rs`).
            let ok = self.declare_reply_to(&from.vhost, &m)?;
            Some((ok.message_count as usize, ok.consumer_count as usize))
        } else if m.passive {
            Some(self.queue_counts(from, &name)?)
        } else {
            self.declare_queue(from, &m, &name)?
        };
        let Some((messages, consumers)) = counts else {
            return Ok(());
        };
        if let Some(channel) = self.channel(from.id, from.ch) {
            channel.last_queue = Some(name.clone());
        }
        let ok = QueueDeclareOk {
            queue: name,
            message_count: messages as u32,
            consumer_count: consumers as u32,
        };
        self.reply(from, m.no_wait, ok);
        Ok(())
    }

    /// A passive declare: the message and consumer counts of a queue this
    /// connection may use.
    fn queue_counts(&mut self, from: &Origin, name: &ShortString) -> Result<(usize, usize), AmqpError> {
        let q = self.queue_for_use(from.id, &from.vhost, name)?;
        q.last_used = from.now;
        let (messages, consumers, quorum) = (
            q.message_count(),
            declared_consumers(q),
            q.settings.kind == QueueKind::Quorum,
        );
        Ok((messages, consumers + self.dequeue_consumers(quorum, &from.vhost, name)))
    }

    /// RabbitMQ 3.10.8's quorum queues count each unacked `basic.get`
    /// message of the queue as a consumer (each dequeue checks its message
    /// out to one of its own) until it is settled.
    fn dequeue_consumers(&self, quorum: bool, vhost: &str, queue: &ShortString) -> usize {
        if !quorum {
            return 0;
        }
        self.conns
            .values()
            .filter(|c| &*c.vhost == vhost)
            .flat_map(|c| c.channels.iter().flatten())
            .flat_map(|ch| ch.unacked.iter())
            .filter(|u| u.consumer.is_none() && &u.queue == queue)
            .count()
    }

    /// Creates the queue, or checks a redeclaration; its counts, or `None`
    /// if the virtual host is gone.
    fn declare_queue(
        &mut self,
        from: &Origin,
        m: &QueueDeclare,
        name: &ShortString,
    ) -> Result<Option<(usize, usize)>, AmqpError> {
        let vhost = &*from.vhost;
        if name.as_bytes().starts_with(b"amq.") && !m.queue.is_empty() {
            return Err(AmqpError::access_refused(format!(
                "queue name '{name}' contains reserved prefix 'amq.*'"
            )));
        }
        // RabbitMQ checks a redeclaration for equivalence only; a new queue
        // for its arguments, then its type's properties.
        if let Some(q) = self.vhosts.get_mut(vhost).and_then(|vh| vh.queues.get_mut(name)) {
            let quorum = q.settings.kind == QueueKind::Quorum;
            let (messages, consumers) = redeclared(q, from, m, name)?;
            return Ok(Some((
                messages,
                consumers + self.dequeue_consumers(quorum, vhost, name),
            )));
        }
        args::check_declare_arguments(&m.arguments, name, vhost)?;
        if matches!(args::declared_kind(&m.arguments), QueueKind::Quorum | QueueKind::Stream) {
            check_replicated_queue(m, name, vhost)?;
        }
        let settings = queue_settings(&m.arguments, name, vhost, self.config.quorum_default_delivery_limit)?;
        let Some(vh) = self.vhosts.get_mut(vhost) else {
            return Ok(None);
        };
        let owner = m.exclusive.then_some(from.id);
        let q = Queue::new(
            name.clone(),
            m.durable,
            m.auto_delete,
            owner,
            m.arguments.clone(),
            settings,
            from.now,
        );
        vh.queues.insert(name.clone(), q);
        self.schedule(&from.vhost, name);
        Ok(Some((0, 0)))
    }

    fn queue_bind(&mut self, from: &Origin, m: QueueBind) -> Result<(), AmqpError> {
        let vhost = &*from.vhost;
        let queue = self.expand_queue(from.id, from.ch, &m.queue)?;
        let key = if m.queue.is_empty() && m.routing_key.is_empty() {
            queue.clone()
        } else {
            m.routing_key.clone()
        };
        if m.exchange.is_empty() {
            return Err(default_exchange_refused());
        }
        if !self.exchange_exists(vhost, &m.exchange.to_string_lossy()) {
            return Err(AmqpError::no_exchange(&m.exchange, vhost));
        }
        self.queue_for_use(from.id, vhost, &queue)?;
        self.bind(vhost, &m.exchange, Destination::Queue(queue), &key, &m.arguments, true)?;
        self.reply(from, m.no_wait, QueueBindOk {});
        Ok(())
    }

    fn queue_unbind(&mut self, from: &Origin, m: QueueUnbind) -> Result<(), AmqpError> {
        let vhost = &*from.vhost;
        let queue = self.expand_queue(from.id, from.ch, &m.queue)?;
        let key = if m.queue.is_empty() && m.routing_key.is_empty() {
            queue.clone()
        } else {
            m.routing_key.clone()
        };
        if m.exchange.is_empty() {
            return Err(default_exchange_refused());
        }
        // Only a binding that is there is checked (exclusive owner included).
        let bound = self
            .vhosts
            .get(vhost)
            .and_then(|v| v.exchanges.get(&m.exchange))
            .is_some_and(|x| {
                x.bindings.contains(&Binding {
                    destination: Destination::Queue(queue.clone()),
                    key: key.clone(),
                    arguments: m.arguments.clone(),
                })
            });
        if bound {
            self.queue_for_use(from.id, vhost, &queue)?;
        }
        self.bind(vhost, &m.exchange, Destination::Queue(queue), &key, &m.arguments, false)?;
        // queue.unbind has no `no_wait`.
        self.reply(from, false, QueueUnbindOk {});
        Ok(())
    }

    fn queue_purge(&mut self, from: &Origin, m: QueuePurge) -> Result<(), AmqpError> {
        let queue = self.expand_queue(from.id, from.ch, &m.queue)?;
        let q = self.queue_for_use(from.id, &from.vhost, &queue)?;
        if q.is_stream() {
            // RabbitMQ 3.10.8 closes the connection (540).
            return Err(AmqpError::not_implemented(format!(
                "queue.purge not supported by stream queues {}",
                rs_queue(&queue, &from.vhost)
            )));
        }
        let n = q.purge();
        let ok = QueuePurgeOk {
            message_count: n as u32,
        };
        self.reply(from, m.no_wait, ok);
        Ok(())
    }

    fn queue_delete(&mut self, from: &Origin, m: QueueDelete) -> Result<(), AmqpError> {
        let vhost = &*from.vhost;
        let queue = self.expand_queue(from.id, from.ch, &m.queue)?;
        let exists = self.vhosts.get(vhost).is_some_and(|v| v.queues.contains_key(&queue));
        let mut count = 0;
        if exists {
            let q = self.queue_for_use(from.id, vhost, &queue)?;
            // RabbitMQ 3.10.8: a quorum queue refuses both flags with a
            // 540, a stream ignores them (and counts 0 messages deleted).
            if q.settings.kind == QueueKind::Quorum && (m.if_unused || m.if_empty) {
                let flag = if m.if_unused { "if-unused" } else { "if-empty" };
                return Err(AmqpError::not_implemented(format!(
                    "cannot delete {}. queue.delete operations with {flag} flag set are not supported by quorum queues",
                    rs_queue(&queue, vhost)
                )));
            }
            let stream = q.is_stream();
            if m.if_unused && !stream && !q.consumers.is_empty() {
                return Err(AmqpError::precondition(format!("{} in use", rs_queue(&queue, vhost))));
            }
            if m.if_empty && !stream && q.message_count() > 0 {
                return Err(AmqpError::precondition(format!(
                    "{} not empty",
                    rs_queue(&queue, vhost)
                )));
            }
            // RabbitMQ 3.10.8's stream coordinator answers `{ok, 0}`.
            count = if stream { 0 } else { q.message_count() };
        }
        // The answer goes out before the deletion's `basic.cancel`s, as
        // RabbitMQ sends them: its channel answers `delete-ok` as soon as the
        // queue process has gone, and learns of its consumers' end only
        // after. A client that waits for `delete-ok` on a channel with a
        // consumer of that queue (kombu deleting the queue it consumes)
        // must not meet the cancel first.
        let ok = QueueDeleteOk {
            message_count: count as u32,
        };
        self.reply(from, m.no_wait, ok);
        if exists {
            self.delete_queue_internal(vhost, &queue);
        }
        Ok(())
    }

    // ---- basic ----------------------------------------------------------

    fn basic_qos(&mut self, from: &Origin, m: BasicQos) -> Result<(), AmqpError> {
        if m.prefetch_size != 0 {
            return Err(AmqpError::not_implemented(format!(
                "prefetch_size!=0 ({})",
                m.prefetch_size
            )));
        }
        let Some(channel) = self.channel(from.id, from.ch) else {
            return Ok(());
        };
        if m.global {
            channel.global_prefetch = m.prefetch_count;
        } else {
            channel.prefetch = m.prefetch_count;
        }
        let queues: Vec<ShortString> = channel.consumers.iter().map(|c| c.queue.clone()).collect();
        self.reply(from, false, BasicQosOk {});
        for q in queues {
            self.dispatch(&from.vhost, &q, from.now);
        }
        Ok(())
    }

    fn basic_consume(&mut self, from: &Origin, m: BasicConsume) -> Result<(), AmqpError> {
        let (id, ch, vhost, now) = (from.id, from.ch, &*from.vhost, from.now);
        let queue = self.expand_queue(id, ch, &m.queue)?;
        let v4 = self.config.rabbitmq_version.is_4();
        let tag = if m.consumer_tag.is_empty() {
            generated_name("amq.ctag-")
        } else {
            m.consumer_tag.clone()
        };
        if m.queue.as_bytes() == super::reply_to::REPLY_TO.as_bytes() {
            if let Some(ok) = self.consume_reply_to(id, ch, &m, tag)? {
                self.reply(from, m.no_wait, ok);
            }
            return Ok(());
        }
        let Some(channel) = self.channel(id, ch) else {
            return Ok(());
        };
        let prefetch = channel.prefetch;
        let global_prefetch = channel.global_prefetch;
        if channel.consumers.iter().any(|c| c.tag == tag) {
            return Err(AmqpError::not_allowed(format!("attempt to reuse consumer tag '{tag}'")));
        }
        let q = self.queue_for_use(id, vhost, &queue)?;
        args::check_consume_arguments(&m.arguments, q.settings.kind, &queue, vhost)?;
        let priority = feature_args::consumer_priority(&m.arguments, &queue, vhost)?;
        // Only a classic queue keeps a consumer exclusive: RabbitMQ 3.10.8's
        // quorum queues and streams take the flag and ignore it. It refuses
        // an exclusive consumer on a classic queue with a single active
        // consumer, even an idle one.
        let exclusive = m.exclusive && q.settings.kind == QueueKind::Classic;
        let single_classic = q.settings.single_active_consumer && q.settings.kind == QueueKind::Classic;
        if q.consumers.iter().any(|c| c.exclusive) || (exclusive && (!q.consumers.is_empty() || single_classic)) {
            return Err(AmqpError::access_refused(format!(
                "{} in exclusive use",
                rs_queue(&queue, vhost)
            )));
        }
        // A global prefetch (RabbitMQ's channel limiter) is classic queues'
        // only: a quorum queue refuses the consumer at once, a stream after
        // its own checks below.
        let global_qos_refused =
            || AmqpError::not_implemented(format!("{} does not support global qos", rs_queue(&queue, vhost)));
        if global_prefetch > 0 && q.settings.kind == QueueKind::Quorum {
            return Err(global_qos_refused());
        }
        let mut stream_next = 0;
        if q.is_stream() {
            // Worded differently by each version: 3.10 "... for 'queue 'q'
            // in vhost '/''" and "... by stream queues queue 'q' ...", 4.0
            // "... for stream queue 'q' ..." and "... by stream queue 'q' ...".
            if prefetch == 0 {
                let named = rs_queue(&queue, vhost);
                return Err(AmqpError::precondition(if v4 {
                    format!("consumer prefetch count is not set for stream {named}")
                } else {
                    format!("consumer prefetch count is not set for '{named}'")
                }));
            }
            if m.no_ack {
                let streams = if v4 { "stream" } else { "stream queues" };
                return Err(AmqpError::not_implemented(format!(
                    "automatic acknowledgement not supported by {streams} {}",
                    rs_queue(&queue, vhost)
                )));
            }
            if global_prefetch > 0 {
                return Err(global_qos_refused());
            }
            stream_next = stream_start(q, m.arguments.get("x-stream-offset"))?;
        }
        q.attach_consumer(ConsumerRef {
            conn: id,
            channel: ch,
            tag: tag.clone(),
            exclusive,
            priority,
        });
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
        self.reply(from, m.no_wait, BasicConsumeOk { consumer_tag: tag });
        self.dispatch(vhost, &queue, now);
        Ok(())
    }

    fn basic_cancel(&mut self, from: &Origin, m: BasicCancel) -> Result<(), AmqpError> {
        if self.cancel_reply_to(from.id, from.ch, &m.consumer_tag) {
            let ok = BasicCancelOk {
                consumer_tag: m.consumer_tag,
            };
            self.reply(from, m.no_wait, ok);
            return Ok(());
        }
        let removed = self.channel(from.id, from.ch).and_then(|channel| {
            let at = channel.consumers.iter().position(|c| c.tag == m.consumer_tag)?;
            Some(channel.consumers.remove(at))
        });
        if let Some(consumer) = removed {
            let handed_over =
                self.detach_consumer(&from.vhost, from.id, from.ch, &consumer.tag, &consumer.queue, from.now);
            if let Some(q) = self
                .vhosts
                .get_mut(&*from.vhost)
                .and_then(|v| v.queues.get_mut(&consumer.queue))
            {
                q.cancelled_holding(from.id, from.ch, consumer.tag.clone(), consumer.in_flight);
            }
            if handed_over {
                self.dispatch(&from.vhost, &consumer.queue, from.now);
            }
        }
        let ok = BasicCancelOk {
            consumer_tag: m.consumer_tag,
        };
        self.reply(from, m.no_wait, ok);
        Ok(())
    }

    fn basic_get(&mut self, from: &Origin, m: BasicGet) -> Result<(), AmqpError> {
        let queue = self.expand_queue(from.id, from.ch, &m.queue)?;
        self.get(from.id, from.ch, &queue, m.no_ack, from.now)
    }

    /// `basic.ack`, `basic.reject`, `basic.nack`: settled now, or at commit
    /// in a transaction.
    fn basic_settle(&mut self, from: &Origin, method: Method) -> Result<(), AmqpError> {
        if self.channel(from.id, from.ch).is_some_and(|c| c.tx.is_some()) {
            let Some((tag, multiple, how)) = settlement(method) else {
                return Ok(());
            };
            let taken = self.take_unacked(from.id, from.ch, tag, multiple)?;
            if let Some(tx) = self.channel(from.id, from.ch).and_then(|c| c.tx.as_mut()) {
                tx.push(TxOp::Settle(taken, how));
            }
            return Ok(());
        }
        self.settle_method(from.id, from.ch, method, from.now)
    }

    fn settle_method(&mut self, id: ConnId, ch: u16, method: Method, now: Instant) -> Result<(), AmqpError> {
        let Some((tag, multiple, how)) = settlement(method) else {
            return Ok(());
        };
        self.settle(id, ch, tag, multiple, how, now)
    }
}

/// The tag, `multiple` and kind of a settlement method.
fn settlement(method: Method) -> Option<(u64, bool, Settle)> {
    Some(match method {
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
        _ => return None,
    })
}

impl BrokerMachine {
    /// `basic.recover` (answered with `recover-ok`) and `basic.recover-async`
    /// (not answered): only with `requeue`.
    fn basic_recover(&mut self, from: &Origin, requeue: bool, answer: bool) -> Result<(), AmqpError> {
        if !requeue {
            return Err(AmqpError::not_implemented("requeue=false"));
        }
        self.recover(from.id, from.ch, from.now);
        self.reply(from, !answer, BasicRecoverOk {});
        Ok(())
    }

    // ---- confirm, tx, flow ----------------------------------------------

    fn confirm_select(&mut self, from: &Origin, m: ConfirmSelect) -> Result<(), AmqpError> {
        let Some(channel) = self.channel(from.id, from.ch) else {
            return Ok(());
        };
        if channel.tx.is_some() {
            return Err(AmqpError::precondition("cannot switch from tx to confirm mode"));
        }
        if channel.confirm.is_none() {
            channel.confirm = Some(Confirms::default());
        }
        self.reply(from, m.no_wait, ConfirmSelectOk {});
        Ok(())
    }

    fn tx_select(&mut self, from: &Origin) -> Result<(), AmqpError> {
        let Some(channel) = self.channel(from.id, from.ch) else {
            return Ok(());
        };
        if channel.confirm.is_some() {
            return Err(AmqpError::precondition("cannot switch from confirm to tx mode"));
        }
        if channel.tx.is_none() {
            channel.tx = Some(Vec::new());
        }
        self.reply(from, false, TxSelectOk {});
        Ok(())
    }

    fn tx_commit(&mut self, from: &Origin) -> Result<(), AmqpError> {
        let Some(channel) = self.channel(from.id, from.ch) else {
            return Ok(());
        };
        let Some(tx) = channel.tx.as_mut() else {
            return Err(AmqpError::precondition("channel is not transactional"));
        };
        let ops = std::mem::take(tx);
        for op in &ops {
            if let TxOp::Settle(taken, how) = op {
                self.refuse_stream_rejects(from.id, taken, *how)?;
            }
        }
        for op in ops {
            match op {
                TxOp::Publish(content) => {
                    self.route_and_enqueue(from.id, from.ch, &from.vhost, *content, None, from.now)
                }
                TxOp::Settle(taken, how) => self.apply_settlement(from.id, from.ch, taken, how, from.now),
            }
        }
        self.reply(from, false, TxCommitOk {});
        Ok(())
    }

    fn tx_rollback(&mut self, from: &Origin) -> Result<(), AmqpError> {
        let Some(channel) = self.channel(from.id, from.ch) else {
            return Ok(());
        };
        let Some(tx) = channel.tx.as_mut() else {
            return Err(AmqpError::precondition("channel is not transactional"));
        };
        // Settlements made in the transaction are undone: their deliveries
        // are unacked again, in tag order, as RabbitMQ 3.10.8 does.
        let ops = std::mem::take(tx);
        for op in ops {
            if let TxOp::Settle(taken, _) = op {
                channel.unacked.extend(taken);
            }
        }
        channel.unacked.make_contiguous().sort_by_key(|u| u.tag);
        self.reply(from, false, TxRollbackOk {});
        Ok(())
    }

    /// `channel.flow`: RabbitMQ (3.10 and 4.0) answers `active=true` with
    /// `flow-ok` and refuses to stop a channel's deliveries: `active=false`
    /// closes the connection with 540.
    fn channel_flow(&mut self, from: &Origin, m: ChannelFlow) -> Result<(), AmqpError> {
        if !m.active {
            return Err(AmqpError::not_implemented("active=false"));
        }
        self.reply(from, false, ChannelFlowOk { active: true });
        Ok(())
    }

    /// Answers the method from `from`, unless it asked for no answer.
    fn reply(&mut self, from: &Origin, no_wait: bool, ok: impl Into<Method>) {
        if !no_wait {
            self.send(from.id, from.ch, ok);
        }
    }
}

/// Where a method came from: the connection, the channel, the connection's
/// virtual host; and when it arrived.
struct Origin {
    id: ConnId,
    ch: u16,
    vhost: Arc<str>,
    now: Instant,
}

/// A redeclaration of queue `q`: by its owner if it is exclusive, with
/// equivalent properties and arguments. Its counts.
fn redeclared(q: &mut Queue, from: &Origin, m: &QueueDeclare, name: &ShortString) -> Result<(usize, usize), AmqpError> {
    let vhost = &*from.vhost;
    let locked = match q.exclusive_owner {
        Some(owner) => owner != from.id,
        None => m.exclusive,
    };
    if locked {
        return Err(AmqpError::queue_locked(name, vhost));
    }
    let what = rs_queue(name, vhost);
    assert_field_equivalence(q.durable, m.durable, &what, "durable")?;
    assert_field_equivalence(q.auto_delete, m.auto_delete, &what, "auto_delete")?;
    assert_queue_args_equivalence(q.settings.kind, &q.arguments, &m.arguments, name, vhost)?;
    q.last_used = from.now;
    Ok((q.message_count(), declared_consumers(q)))
}

/// The consumer count of a `declare-ok`: RabbitMQ 3.10.8 answers 0 for a
/// stream, whatever consumes it (`rabbit_stream_queue:stat/1`); see
/// [`Queue::consumer_count`] for the others.
fn declared_consumers(q: &Queue) -> usize {
    if q.is_stream() {
        0
    } else {
        q.consumer_count()
    }
}

/// Quorum queues and streams are durable, never exclusive, never
/// auto-delete.
fn check_replicated_queue(m: &QueueDeclare, name: &ShortString, vhost: &str) -> Result<(), AmqpError> {
    let refused = if !m.durable {
        Some("non-durable")
    } else if m.exclusive {
        Some("exclusive-declare")
    } else if m.auto_delete {
        Some("auto-delete")
    } else {
        None
    };
    match refused {
        Some(property) => Err(AmqpError::precondition(format!(
            "invalid property '{property}' for {}",
            rs_queue(name, vhost)
        ))),
        None => Ok(()),
    }
}

/// Where a stream consumer starts reading, from its `x-stream-offset`.
fn stream_start(q: &Queue, offset: Option<&FieldValue>) -> Result<u64, AmqpError> {
    match StartAt::parse(offset) {
        Ok(at) => Ok(q.log.start(at)),
        Err(()) => Err(AmqpError::precondition(format!(
            "Invalid stream offset arg: {}",
            args::show(offset.unwrap_or(&FieldValue::Void))
        ))),
    }
}
