//! Per-channel protocol state: open/close phase, content assembly, the queue
//! of synchronous calls waiting for their reply, publisher confirms and
//! returns. Owned by the connection machine; never does IO.

use std::collections::{HashMap, VecDeque};

use acemq_codec::track::{Confirms, Content, ContentAssembler, Returns};
use acemq_codec::{class, Method};

use super::settle::Settlements;

/// Where a channel is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// `channel.open` sent, `open-ok` not yet received.
    Opening,
    /// Open for business.
    Open,
    /// We sent `channel.close`; everything but `close-ok` is ignored.
    Closing,
}

/// Identifies a synchronous call; its reply comes back as
/// [`super::Event::Reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub u64);

/// A synchronous method waiting for its reply.
#[derive(Debug)]
pub(crate) struct PendingCall {
    pub(crate) token: Token,
    /// The class and method ids that answer it.
    pub(crate) reply_class: u16,
    pub(crate) reply_methods: &'static [u16],
    /// The method called, e.g. `queue.declare`.
    pub(crate) method: &'static str,
    /// When its reply is due, once it is written (see `timer`); `None`
    /// for `channel.open` and `channel.close`, whose deadline is the
    /// channel's own.
    pub(crate) deadline: Option<std::time::Instant>,
}

#[derive(Debug)]
pub(crate) struct ChannelState {
    pub(crate) phase: Phase,
    pub(crate) assembler: ContentAssembler,
    pub(crate) calls: VecDeque<PendingCall>,
    pub(crate) confirms: Confirms,
    pub(crate) returns: Returns,
    /// Returned messages waiting for the confirm of their publish.
    pub(crate) returned: HashMap<u64, Content>,
    /// Deliveries not yet settled, for ack coalescing.
    pub(crate) settlements: Settlements,
    /// When the `open-ok` or `close-ok` it waits for is due, once the
    /// request is written (see `timer`).
    pub(crate) deadline: Option<std::time::Instant>,
}

impl ChannelState {
    pub(crate) fn opening() -> Self {
        ChannelState {
            phase: Phase::Opening,
            assembler: ContentAssembler::new(),
            calls: VecDeque::new(),
            confirms: Confirms::new(),
            returns: Returns::new(),
            returned: HashMap::new(),
            settlements: Settlements::default(),
            deadline: None,
        }
    }
}

/// The reply a synchronous method waits for, or `None` for methods that get
/// no reply (or asked for none with `no-wait`).
pub(crate) fn expected_reply(method: &Method) -> Option<(u16, &'static [u16])> {
    use Method::*;
    let reply: (u16, &'static [u16]) = match method {
        ChannelOpen(_) => (class::CHANNEL, &[11]),
        ChannelFlow(_) => (class::CHANNEL, &[21]),
        ChannelClose(_) => (class::CHANNEL, &[41]),
        ExchangeDeclare(m) if !m.no_wait => (class::EXCHANGE, &[11]),
        ExchangeDelete(m) if !m.no_wait => (class::EXCHANGE, &[21]),
        ExchangeBind(m) if !m.no_wait => (class::EXCHANGE, &[31]),
        ExchangeUnbind(m) if !m.no_wait => (class::EXCHANGE, &[51]),
        QueueDeclare(m) if !m.no_wait => (class::QUEUE, &[11]),
        QueueBind(m) if !m.no_wait => (class::QUEUE, &[21]),
        QueuePurge(m) if !m.no_wait => (class::QUEUE, &[31]),
        QueueDelete(m) if !m.no_wait => (class::QUEUE, &[41]),
        QueueUnbind(_) => (class::QUEUE, &[51]),
        BasicQos(_) => (class::BASIC, &[11]),
        BasicConsume(m) if !m.no_wait => (class::BASIC, &[21]),
        BasicCancel(m) if !m.no_wait => (class::BASIC, &[31]),
        BasicGet(_) => (class::BASIC, &[71, 72]),
        BasicRecover(_) => (class::BASIC, &[111]),
        ConfirmSelect(m) if !m.no_wait => (class::CONFIRM, &[11]),
        TxSelect(_) => (class::TX, &[11]),
        TxCommit(_) => (class::TX, &[21]),
        TxRollback(_) => (class::TX, &[31]),
        _ => return None,
    };
    Some(reply)
}

/// Whether a method from the server is a reply to a synchronous call.
pub(crate) fn is_reply(method: &Method) -> bool {
    use Method::*;
    matches!(
        method,
        ChannelOpenOk(_)
            | ChannelFlowOk(_)
            | ExchangeDeclareOk(_)
            | ExchangeDeleteOk(_)
            | ExchangeBindOk(_)
            | ExchangeUnbindOk(_)
            | QueueDeclareOk(_)
            | QueueBindOk(_)
            | QueuePurgeOk(_)
            | QueueDeleteOk(_)
            | QueueUnbindOk(_)
            | BasicQosOk(_)
            | BasicConsumeOk(_)
            | BasicCancelOk(_)
            | BasicGetOk(_)
            | BasicGetEmpty(_)
            | BasicRecoverOk(_)
            | ConfirmSelectOk(_)
            | TxSelectOk(_)
            | TxCommitOk(_)
            | TxRollbackOk(_)
    )
}
