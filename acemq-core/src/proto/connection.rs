//! The client connection machine: bytes in, frames and events out, time
//! passed in. It owns no socket, clock or task.
//!
//! A driver polls it in this order, again and again:
//! 1. feed what the socket read with [`Connection::handle_input`] (or
//!    [`Connection::handle_eof`]), and [`Connection::handle_timeout`] when the
//!    deadline from [`Connection::poll_timeout`] has passed;
//! 2. apply the application's commands ([`Connection::open_channel`],
//!    [`Connection::call`], [`Connection::encoded_publishes`], ...);
//! 3. drain [`Connection::poll_event`] until `None`;
//! 4. write what [`Connection::poll_transmit`] gives;
//! 5. sleep until the socket is readable, a command arrives, or
//!    [`Connection::poll_timeout`].
//!
//! Every rule of the protocol lives here, so it is testable without tokio.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use acemq_codec::track::{
    AssembleError, Assembly, Blocked, BlockedChange, Content, Decoded, Outcome, ReturnKey, ReturnMatch,
};
use acemq_codec::{
    encode_method, BasicProperties, BasicPublish, ChannelClose, ChannelCloseOk, ChannelFlowOk, ConnectionClose,
    ConnectionCloseOk, ConnectionOpen, ConnectionStartOk, ConnectionTuneOk, ConnectionUpdateSecret, EncodeError,
    FieldTable, Frame, FrameDecoder, LongString, Method, ReplyCode, ShortString, FRAME_MIN_SIZE, PROTOCOL_HEADER,
};
use bytes::BytesMut;

use super::channel::{expected_reply, is_reply, ChannelState, PendingCall, Phase, Token};
use super::handshake::{client_properties, negotiate, Auth, Secret, TuneRequest, Tuned};
use super::settle::Settle;
use super::timer::{ChannelDeadlines, Deadlines, Timeouts, Timer, Wait};

/// What a `basic.return` of a mandatory publish is matched by; `None` for
/// a publish that is not mandatory (the broker returns none of those).
pub(crate) fn return_key(publish: &BasicPublish, properties: &BasicProperties) -> Option<ReturnKey> {
    publish.mandatory.then(|| ReturnKey {
        exchange: publish.exchange.clone(),
        routing_key: publish.routing_key.clone(),
        message_id: properties.message_id.clone(),
    })
}

/// A refusal from the broker: the reply code and text of a `channel.close`
/// or `connection.close`, and the method that caused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The reply code, e.g. 404.
    pub code: u16,
    /// The reply text, e.g. `NOT_FOUND - no queue 'q' in vhost '/'`.
    pub text: String,
    /// The class of the method that caused it (0 if none).
    pub class_id: u16,
    /// The method that caused it (0 if none).
    pub method_id: u16,
}

impl Refusal {
    /// The reply code as a [`ReplyCode`].
    pub fn reply_code(&self) -> ReplyCode {
        ReplyCode::from_u16(self.code)
    }

    /// The name of the method that caused it, e.g. `queue.declare`.
    pub fn method_name(&self) -> Option<&'static str> {
        Method::name_of(self.class_id, self.method_id)
    }

    fn from_channel_close(close: &ChannelClose) -> Self {
        Refusal {
            code: close.reply_code,
            text: close.reply_text.to_string(),
            class_id: close.class_id,
            method_id: close.method_id,
        }
    }

    fn from_connection_close(close: &ConnectionClose) -> Self {
        Refusal {
            code: close.reply_code,
            text: close.reply_text.to_string(),
            class_id: close.class_id,
            method_id: close.method_id,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.code, self.text)?;
        if let Some(name) = self.method_name() {
            write!(f, " (in reply to {name})")?;
        }
        Ok(())
    }
}

/// Who started a close (as h2 names it): the application, the engine on
/// its own (a deadline, a broker that broke the protocol), or the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Initiator {
    /// The application asked for it.
    User,
    /// The engine decided it.
    Library,
    /// The broker (or the network between) did it.
    Remote,
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// We closed it and the broker agreed.
    ByClient,
    /// The broker closed it (e.g. 320 CONNECTION_FORCED, 403 ACCESS_REFUSED, 530 NOT_ALLOWED).
    ByServer(Refusal),
    /// The broker broke the protocol; we closed with this code and text.
    ProtocolError {
        /// The code we closed with.
        code: ReplyCode,
        /// What the broker did wrong.
        text: String,
    },
    /// Nothing arrived for two heartbeat intervals.
    HeartbeatTimeout,
    /// The broker did not answer in time (the handshake, or a `close-ok`),
    /// so the connection was dropped.
    TimedOut {
        /// What was awaited.
        waiting_for: Wait,
        /// How long it was awaited.
        after: Duration,
    },
    /// The socket closed without a close handshake.
    ConnectionLost,
}

impl CloseReason {
    /// Who started it.
    pub fn initiator(&self) -> Initiator {
        match self {
            CloseReason::ByClient => Initiator::User,
            CloseReason::ProtocolError { .. } | CloseReason::HeartbeatTimeout | CloseReason::TimedOut { .. } => {
                Initiator::Library
            }
            CloseReason::ByServer(_) | CloseReason::ConnectionLost => Initiator::Remote,
        }
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::ByClient => f.write_str("closed by the client"),
            CloseReason::ByServer(r) => write!(f, "closed by the broker: {r}"),
            CloseReason::ProtocolError { code, text } => write!(f, "protocol error ({code}): {text}"),
            CloseReason::HeartbeatTimeout => f.write_str("no heartbeat from the broker for two intervals"),
            CloseReason::TimedOut { waiting_for, after } => {
                write!(f, "the broker did not answer {waiting_for} within {after:?}")
            }
            CloseReason::ConnectionLost => f.write_str("the connection was lost"),
        }
    }
}

/// The answer to a synchronous call.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The reply method (e.g. `queue.declare-ok`, `basic.get-empty`).
    Method(Method),
    /// `basic.get-ok` with its message.
    Content(Box<Content>),
}

/// Why a call got no reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The broker closed the channel (this call, or another on the channel, was refused).
    ChannelClosed(Refusal),
    /// This side closed the channel (its `channel.close` was written after
    /// the call), so the call got no answer.
    ChannelClosedByClient {
        /// The channel.
        channel: u16,
    },
    /// The connection ended.
    ConnectionClosed(CloseReason),
    /// The broker did not answer in time. For `channel.open`, the channel
    /// is then closed (its number is reused once the broker confirms).
    TimedOut {
        /// What was awaited.
        waiting_for: Wait,
        /// How long it was awaited.
        after: Duration,
    },
}

/// What happened, for the application.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// The handshake is done; see [`Connection::tuned`].
    Opened,
    /// The reply to a synchronous call. A token the application was never
    /// given belongs to a call the machine made itself (the `channel.close`
    /// after a `channel.open` timed out) and can be ignored.
    Reply {
        /// The channel.
        channel: u16,
        /// The call.
        token: Token,
        /// The reply, or why there is none.
        result: Result<Reply, CallError>,
    },
    /// A message for a consumer (`basic.deliver` with its content).
    Delivery {
        /// The channel.
        channel: u16,
        /// The message.
        content: Content,
    },
    /// A publish was confirmed, and it was returned first: `returned` is
    /// the `basic.return` paired with it. (The machine gives publishes
    /// that were not returned as [`Event::Confirms`].)
    Confirm {
        /// The channel.
        channel: u16,
        /// The publish sequence number.
        seq: u64,
        /// Ack or nack.
        outcome: Outcome,
        /// The `basic.return` paired with it, if it was returned.
        returned: Option<Content>,
    },
    /// Every publish numbered `first..=last` was confirmed with `outcome`,
    /// and none of them was returned. One ack or nack with `multiple` set
    /// gives one such event per run of consecutive outstanding numbers, so
    /// a confirm costs the application one event per run, not one per
    /// message; a run that follows on from the one of the event before it
    /// (the next ack of the same read, with the same outcome) extends that
    /// event instead. Each publish is confirmed once, by this or by
    /// [`Event::Confirm`], in ascending order on its channel.
    Confirms {
        /// The channel.
        channel: u16,
        /// The first sequence number of the run.
        first: u64,
        /// The last sequence number of the run (`first` for a run of one).
        last: u64,
        /// Ack or nack.
        outcome: Outcome,
    },
    /// A `basic.return` that pairs with no outstanding publish (or arrived on
    /// a channel without confirms).
    Return {
        /// The channel.
        channel: u16,
        /// The returned message.
        content: Content,
    },
    /// The broker cancelled a consumer (its queue was deleted).
    ConsumerCancelled {
        /// The channel.
        channel: u16,
        /// The consumer.
        consumer_tag: ShortString,
    },
    /// The broker asked to pause or resume content on a channel.
    Flow {
        /// The channel.
        channel: u16,
        /// Whether content may flow.
        active: bool,
    },
    /// A channel closed: by the broker with a refusal, or by us (`None`).
    ChannelClosed {
        /// The channel.
        channel: u16,
        /// The broker's reason, if it closed it.
        refusal: Option<Refusal>,
        /// Publishes that were never confirmed.
        unconfirmed: Vec<u64>,
    },
    /// The broker blocked publishing on this connection.
    Blocked {
        /// Why, e.g. `low on memory`.
        reason: String,
    },
    /// The block is lifted.
    Unblocked,
    /// The connection ended. No event follows.
    Closed(CloseReason),
}

/// A command the machine cannot carry out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The connection is not open (still in the handshake, closing or closed).
    #[error("the connection is not open")]
    ConnectionNotOpen,
    /// The channel is not open.
    #[error("channel {0} is not open")]
    ChannelNotOpen(u16),
    /// Every channel number up to `channel_max` is in use.
    #[error("no free channel (channel_max {0})")]
    NoFreeChannel(u16),
    /// The method cannot be sent by a client through this call.
    #[error("{0} cannot be sent this way")]
    NotAllowed(&'static str),
    /// The message or method cannot be encoded.
    #[error("cannot encode: {0}")]
    Encode(#[from] EncodeError),
}

/// What the connection needs to know before it starts.
#[derive(Debug, Clone)]
pub struct ConnectionParams {
    /// How to authenticate.
    pub auth: Auth,
    /// The virtual host to open.
    pub vhost: String,
    /// What to ask for in `tune-ok`.
    pub tune: TuneRequest,
    /// A name for the connection, shown in RabbitMQ's management UI.
    pub connection_name: Option<String>,
    /// How long each answer from the broker may take.
    pub timeouts: Timeouts,
}

impl Default for ConnectionParams {
    fn default() -> Self {
        ConnectionParams {
            auth: Auth::plain("guest", "guest"),
            vhost: "/".into(),
            tune: TuneRequest::default(),
            connection_name: None,
            timeouts: Timeouts::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    ExpectStart,
    ExpectTune,
    ExpectOpenOk,
    Open,
    /// We sent `connection.close`; waiting for `close-ok`.
    Closing(CloseReason),
    Closed,
}

/// The client side of one AMQP connection. See the module docs for the
/// polling order.
///
/// Its `Debug` shows where it stands, never the bytes waiting to be
/// written: they may hold `start-ok`'s or `update-secret`'s credentials.
pub struct Connection {
    params: ConnectionParams,
    state: State,
    decoder: FrameDecoder,
    outbox: BytesMut,
    events: VecDeque<Event>,
    tuned: Option<Tuned>,
    server_properties: FieldTable,
    /// Indexed by channel number; `None` is a free number.
    channels: Vec<Option<Box<ChannelState>>>,
    blocked: Blocked,
    next_token: u64,
    last_received: Instant,
    /// The driver is not reading (see [`Connection::pause_input`]).
    input_paused: bool,
    last_sent: Instant,
    /// The runs of sequence numbers a confirm resolved, kept for the next.
    scratch: Vec<(u64, u64)>,
    /// Channels holding back a coalesced ack (see `settle`).
    holding: Vec<u16>,
    /// When the handshake must be done; `None` once it is.
    handshake_deadline: Option<Instant>,
    /// When our `connection.close` must be answered; set when it is written.
    close_deadline: Option<Instant>,
    /// Channel waits, earliest first (see [`ChannelDeadlines`]).
    channel_deadlines: ChannelDeadlines,
    /// Channels that started a wait since the last transmit: their deadline
    /// runs from the moment the request is written (the next `poll_transmit`).
    unarmed: Vec<u16>,
    /// Calls on open channels, earliest deadline first.
    call_deadlines: Deadlines<(u16, Token)>,
    /// Calls made since the last transmit, armed as `unarmed` is.
    unarmed_calls: Vec<(u16, Token)>,
    /// `connection.update-secret`s sent and not answered, oldest first
    /// (the broker answers them in order).
    secret_updates: VecDeque<SecretUpdate>,
}

/// One `connection.update-secret` waiting for its `update-secret-ok`.
#[derive(Debug, Clone, Copy)]
struct SecretUpdate {
    token: Token,
    /// When it must be answered; `None` until it is written.
    deadline: Option<Instant>,
    /// Its wait ended with a timeout; a late `-ok` is taken for it, not
    /// for the next one.
    expired: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("state", &self.state)
            .field("params", &self.params)
            .field("tuned", &self.tuned)
            .field("channels", &self.channels.iter().flatten().count())
            .field("blocked", &self.blocked.is_blocked())
            .field("events", &self.events.len())
            .field("unwritten_bytes", &self.outbox.len())
            .field("secret_updates", &self.secret_updates.len())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// A connection about to send the protocol header.
    pub fn new(params: ConnectionParams, now: Instant) -> Self {
        let mut outbox = BytesMut::with_capacity(4096);
        outbox.extend_from_slice(&PROTOCOL_HEADER);
        Connection {
            state: State::ExpectStart,
            decoder: FrameDecoder::new(FRAME_MIN_SIZE.max(131_072)),
            outbox,
            events: VecDeque::new(),
            tuned: None,
            server_properties: FieldTable::new(),
            channels: Vec::new(),
            blocked: Blocked::new(),
            next_token: 0,
            last_received: now,
            input_paused: false,
            last_sent: now,
            scratch: Vec::new(),
            holding: Vec::new(),
            handshake_deadline: now.checked_add(params.timeouts.handshake),
            close_deadline: None,
            channel_deadlines: ChannelDeadlines::default(),
            unarmed: Vec::new(),
            call_deadlines: Deadlines::default(),
            unarmed_calls: Vec::new(),
            secret_updates: VecDeque::new(),
            params,
        }
    }

    // ---- getters ----

    /// The negotiated limits, once `tune` is done.
    pub fn tuned(&self) -> Option<Tuned> {
        self.tuned
    }

    /// What the broker said about itself in `connection.start`.
    pub fn server_properties(&self) -> &FieldTable {
        &self.server_properties
    }

    /// Whether the handshake is done and the connection is not closing.
    pub fn is_open(&self) -> bool {
        self.state == State::Open
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Whether the broker has blocked publishing on this connection.
    pub fn is_blocked(&self) -> bool {
        self.blocked.is_blocked()
    }

    /// Whether a channel is open.
    pub fn is_channel_open(&self, channel: u16) -> bool {
        matches!(self.channel(channel), Some(c) if c.phase == Phase::Open)
    }

    /// How many publishes on `channel` wait for a confirm.
    pub fn unconfirmed(&self, channel: u16) -> usize {
        self.channel(channel).map_or(0, |c| c.confirms.outstanding())
    }

    // ---- inputs ----

    /// Feeds bytes read from the socket; whole frames are taken off the front
    /// of `buf` and handled, a partial frame stays for the next read.
    pub fn handle_input(&mut self, buf: &mut BytesMut, now: Instant) {
        if buf.is_empty() {
            return;
        }
        self.last_received = now;
        while !matches!(self.state, State::Closed) {
            // Content for an open channel goes straight into its assembler,
            // a delivery decoded where it will be handed over; every other
            // frame is decoded whole and handled by `handle_frame`.
            let decoder = self.decoder;
            let open = self.state == State::Open;
            // A confirm (most of what a publisher reads) for an open channel
            // with no content half-read is read where it lies: the method
            // `decode` would give, without building a frame.
            if open {
                let channels = &self.channels;
                let confirm = decoder.take_ack(buf, |channel| {
                    channels
                        .get(usize::from(channel))
                        .and_then(|c| c.as_deref())
                        .is_some_and(|state| state.phase == Phase::Open && !state.assembler.in_progress())
                });
                if let Some(ack) = confirm {
                    let outcome = if ack.nack { Outcome::Nack } else { Outcome::Ack };
                    self.on_confirm(ack.channel, outcome, ack.delivery_tag, ack.multiple);
                    continue;
                }
            }
            let channels = &mut self.channels;
            let decoded = decoder.decode_assembled(buf, |channel| {
                let state = channels.get_mut(usize::from(channel))?.as_deref_mut()?;
                (open && state.phase == Phase::Open).then_some(&mut state.assembler)
            });
            match decoded {
                Ok(Decoded::NeedMore) => break,
                Ok(Decoded::Partial(_)) => {}
                Ok(Decoded::Complete(channel)) => {
                    if let Some(content) = self.channel_mut(channel).and_then(|c| c.assembler.take_complete()) {
                        self.channel_content(channel, content);
                    }
                }
                Ok(Decoded::Other) => match decoder.decode(buf) {
                    Ok(Some(frame)) => self.handle_frame(frame),
                    Ok(None) => break,
                    Err(err) => return self.undecodable(buf, err.reply_code(), err),
                },
                Err(AssembleError::Content { channel, error }) => {
                    self.protocol_error(error.reply_code(), format!("on channel {channel}: {error}"));
                }
                Err(AssembleError::Decode(err)) => return self.undecodable(buf, err.reply_code(), err),
                // `AssembleError` may grow; whatever it is, the stream is suspect.
                Err(err) => return self.undecodable(buf, ReplyCode::FrameError, err),
            }
        }
    }

    /// The broker sent bytes that do not decode: nothing after them can be
    /// trusted, so they are dropped and the connection closed.
    fn undecodable(&mut self, buf: &mut BytesMut, code: ReplyCode, err: impl std::fmt::Display) {
        buf.clear();
        self.protocol_error(code, format!("undecodable frame from the broker: {err}"));
    }

    /// The socket reached end of file or failed.
    pub fn handle_eof(&mut self) {
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Closed => {}
            // We were closing and the broker just hung up: good enough.
            State::Closing(reason) => self.finish(reason),
            _ => self.finish(CloseReason::ConnectionLost),
        }
    }

    /// Time has passed: every timer whose deadline is at or before `now`
    /// fires: a heartbeat is sent, a silent broker is declared dead, and a
    /// wait that took too long ends with its error.
    pub fn handle_timeout(&mut self, now: Instant) {
        for timer in Timer::ALL {
            if self.is_closed() {
                return;
            }
            if self.deadline(timer).is_some_and(|at| at <= now) {
                self.fire(timer, now);
            }
        }
    }

    // ---- commands ----

    /// Opens a channel on the lowest free number. The reply (`channel.open-ok`)
    /// comes as [`Event::Reply`] with the returned token.
    pub fn open_channel(&mut self) -> Result<(u16, Token), CommandError> {
        self.ensure_open()?;
        let max = self.tuned.map_or(u16::MAX, |t| t.channel_max);
        let id = (1..=max)
            .find(|&id| self.channel(id).is_none())
            .ok_or(CommandError::NoFreeChannel(max))?;
        let index = usize::from(id);
        if self.channels.len() <= index {
            self.channels.resize_with(index + 1, || None);
        }
        self.channels[index] = Some(Box::new(ChannelState::opening()));
        let token = self.push_call(id, &Method::ChannelOpen(Default::default()))?;
        self.unarmed.push(id);
        Ok((id, token.expect("channel.open has a reply")))
    }

    /// Sends a method on an open channel. Returns a token when the method
    /// expects a reply (see [`Event::Reply`]). `channel.close` starts the
    /// close handshake; `confirm.select` starts numbering publishes.
    /// Content-bearing methods go through [`Connection::encoded_publishes`].
    pub fn call(&mut self, channel: u16, method: Method) -> Result<Option<Token>, CommandError> {
        self.ensure_open()?;
        if method.has_content() {
            return Err(CommandError::NotAllowed(method.name()));
        }
        if method.class_id() == acemq_codec::class::CONNECTION || matches!(method, Method::ChannelOpen(_)) {
            return Err(CommandError::NotAllowed(method.name()));
        }
        match self.channel(channel) {
            Some(c) if c.phase == Phase::Open => {}
            _ => return Err(CommandError::ChannelNotOpen(channel)),
        }
        let state = self.channel_mut(channel).expect("checked above");
        match state.settlements.on_send(&method) {
            Settle::Held => {
                self.note_holding(channel);
                return Ok(None);
            }
            Settle::Write { flush_first: true } => self.release_held(channel),
            Settle::Write { flush_first: false } => {}
        }
        let token = self.push_call(channel, &method)?;
        let state = self.channel_mut(channel).expect("checked above");
        match method {
            Method::ConfirmSelect(_) => state.confirms.select(),
            Method::ChannelClose(_) => {
                state.phase = Phase::Closing;
                self.unarmed.push(channel);
            }
            _ => {}
        }
        Ok(token)
    }

    /// Sends `connection.update-secret` with `secret` (RabbitMQ: a new
    /// OAuth 2 token for the connection's user) and `reason` (cut to 255
    /// bytes). The broker's `update-secret-ok` comes as [`Event::Reply`]
    /// on channel 0 with the returned token; a broker that refuses the
    /// secret closes the connection instead (RabbitMQ: 530 NOT_ALLOWED).
    /// The answer is awaited at most [`Timeouts::call`] (blocked time not
    /// counted); past it the token's reply is [`CallError::TimedOut`], and
    /// an answer that comes later is taken for it, not for the next update.
    pub fn update_secret(&mut self, secret: &Secret, reason: &str) -> Result<Token, CommandError> {
        self.ensure_open()?;
        let method = Method::ConnectionUpdateSecret(ConnectionUpdateSecret {
            new_secret: LongString::from(secret.expose().as_bytes().to_vec()),
            reason: ShortString::from(crate::text::prefix_within(reason, 255)),
        });
        encode_method(0, &method, &mut self.outbox)?;
        self.next_token += 1;
        let token = Token(self.next_token);
        self.secret_updates.push_back(SecretUpdate {
            token,
            deadline: None,
            expired: false,
        });
        Ok(token)
    }

    /// `basic.ack` of one delivery (`multiple` clear): what [`Connection::call`]
    /// does with that method, without building it when the ack is held back
    /// to be coalesced (the usual case: a consumer acking in order).
    pub fn ack_one(&mut self, channel: u16, delivery_tag: u64) -> Result<(), CommandError> {
        if self.state == State::Open {
            if let Some(state) = self.channel_mut(channel) {
                if state.phase == Phase::Open && state.settlements.hold_ack(delivery_tag) {
                    self.note_holding(channel);
                    return Ok(());
                }
            }
        }
        let ack = acemq_codec::BasicAck {
            delivery_tag,
            multiple: false,
        };
        self.call(channel, ack.into()).map(|_| ())
    }

    /// Publishes messages their caller has encoded, a run at a time: the
    /// one way a publish enters the machine. `frames`, from `from` on, holds
    /// one message after the other: the `basic.publish` method frame, the
    /// content header and the body frames of each, as
    /// [`PublishEncoder`](acemq_codec::PublishEncoder) writes them for this
    /// connection's `frame_max`; the machine does not read them. Each message is then taken, in order,
    /// with [`EncodedPublishes::publish`] (the channel is checked then, so a
    /// channel closed since its frames were encoded refuses them) or left
    /// out with [`EncodedPublishes::skip`].
    ///
    /// The frames of the messages taken are queued, in order, when the run
    /// is dropped. While the run lives nothing else can be written, so
    /// nothing comes between them. When the run was all of `frames`, every
    /// message was taken and nothing else waits to be written, queueing
    /// them costs no copy: `frames` becomes the write buffer, and comes back
    /// empty, with the write buffer's allocation.
    ///
    /// This lets a client encode on its callers' side and hand the machine
    /// only bytes.
    pub fn encoded_publishes<'a>(&'a mut self, frames: &'a mut BytesMut, from: usize) -> EncodedPublishes<'a> {
        EncodedPublishes {
            conn: self,
            frames,
            taken_from: from,
            at: from,
        }
    }

    /// Whether `channel` takes a publish now.
    fn open_channel_for_publish(&mut self, channel: u16) -> Result<&mut ChannelState, CommandError> {
        self.ensure_open()?;
        match self
            .channels
            .get_mut(usize::from(channel))
            .and_then(|c| c.as_deref_mut())
        {
            Some(state) if state.phase == Phase::Open => Ok(state),
            _ => Err(CommandError::ChannelNotOpen(channel)),
        }
    }

    /// Numbers a publish on `channel` whose frames are written (or about to
    /// be), and remembers what its return is matched by.
    fn account_publish(
        &mut self,
        channel: u16,
        returned: impl FnOnce() -> Option<ReturnKey>,
    ) -> Result<Option<u64>, CommandError> {
        let state = self.open_channel_for_publish(channel)?;
        let seq = state.confirms.on_publish();
        if let Some(seq) = seq {
            if let Some(key) = returned() {
                state.returns.on_mandatory_publish(seq, key);
            }
        }
        Ok(seq)
    }

    /// The driver stops (`true`) or resumes reading the socket because a
    /// consumer's queue is full. While it does not read, the broker's
    /// silence says nothing: the heartbeat's idle timer waits, and starts
    /// again from `now` when reading resumes.
    pub fn pause_input(&mut self, paused: bool, now: Instant) {
        self.input_paused = paused;
        if !paused {
            self.last_received = now;
        }
    }

    /// Starts closing the connection with a normal close (200).
    pub fn close(&mut self) {
        self.close_with(ReplyCode::Success.code(), "Goodbye".into(), CloseReason::ByClient);
    }

    // ---- outputs ----

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Moves every byte waiting to be written into `dst`; returns whether
    /// there was any. Counts as sending for the heartbeat.
    pub fn poll_transmit(&mut self, dst: &mut BytesMut, now: Instant) -> bool {
        self.release_all_held();
        self.arm_waits(now);
        if self.outbox.is_empty() {
            return false;
        }
        if dst.is_empty() {
            std::mem::swap(dst, &mut self.outbox);
            // The buffer handed back has been written out from its front:
            // empty, it starts again at the front of its allocation for
            // free (copying nothing, allocating nothing), rather than fill
            // the tail and then move what it holds to the front.
            let _ = self.outbox.try_reclaim(self.outbox.capacity() + 1);
        } else {
            dst.extend_from_slice(&self.outbox);
            self.outbox.clear();
        }
        self.last_sent = now;
        true
    }

    /// When [`Connection::handle_timeout`] should next be called: the
    /// earliest deadline of any timer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        Timer::ALL.into_iter().filter_map(|timer| self.deadline(timer)).min()
    }

    // ---- internals ----

    /// When `timer` fires, if it is running.
    fn deadline(&self, timer: Timer) -> Option<Instant> {
        if self.is_closed() {
            return None;
        }
        match timer {
            Timer::Handshake => self.handshake_deadline,
            Timer::CloseOk => self.close_deadline,
            Timer::HeartbeatSend => Some(self.last_sent + self.heartbeat_interval()? / 2),
            Timer::HeartbeatIdle if self.input_paused => None,
            Timer::HeartbeatIdle => Some(self.last_received + self.heartbeat_interval()? * 2),
            Timer::Channel => self.channel_deadlines.next(),
            Timer::Call => self.call_deadlines.next(),
            Timer::SecretUpdate => self
                .secret_updates
                .iter()
                .filter(|u| !u.expired)
                .find_map(|u| u.deadline),
        }
    }

    fn fire(&mut self, timer: Timer, now: Instant) {
        match timer {
            Timer::Handshake => {
                let after = self.params.timeouts.handshake;
                self.finish(CloseReason::TimedOut {
                    waiting_for: Wait::Handshake,
                    after,
                });
            }
            Timer::CloseOk => {
                let reason = match std::mem::replace(&mut self.state, State::Closed) {
                    // We asked to close and the broker never agreed: say so.
                    State::Closing(CloseReason::ByClient) => CloseReason::TimedOut {
                        waiting_for: Wait::ConnectionCloseOk,
                        after: self.params.timeouts.close,
                    },
                    // Closing for a reason of our own: that reason stands.
                    State::Closing(reason) => reason,
                    _ => return,
                };
                self.finish(reason);
            }
            Timer::HeartbeatIdle => self.finish(CloseReason::HeartbeatTimeout),
            Timer::HeartbeatSend => {
                // Sent even while blocked: RabbitMQ does not read a blocked
                // connection, but does not judge it dead for that either.
                Frame::Heartbeat.encode(&mut self.outbox).ok();
                // Counted as sent now, so that the timer does not fire again
                // before the driver writes it.
                self.last_sent = now;
            }
            Timer::Channel => {
                while let Some((at, channel)) = self.channel_deadlines.pop_due(now) {
                    if self.is_closed() {
                        return;
                    }
                    if self.channel(channel).is_some_and(|c| c.deadline == Some(at)) {
                        self.channel_wait_expired(channel, now);
                    }
                }
            }
            Timer::Call => {
                while let Some((at, (channel, token))) = self.call_deadlines.pop_due(now) {
                    if self.is_closed() {
                        return;
                    }
                    let due = self.channel(channel).is_some_and(|c| {
                        c.phase == Phase::Open
                            && c.calls
                                .iter()
                                .any(|call| call.token == token && call.deadline == Some(at))
                    });
                    if due {
                        self.call_expired(channel, token, now);
                    }
                }
            }
            Timer::SecretUpdate => self.secret_updates_expired(now),
        }
    }

    /// Every `update-secret` whose wait has passed fails with
    /// [`CallError::TimedOut`] (unless the broker blocks the connection: it
    /// reads nothing then, and the wait starts over).
    fn secret_updates_expired(&mut self, now: Instant) {
        let blocked = self.blocked.is_blocked();
        let after = self.params.timeouts.call;
        for update in self.secret_updates.iter_mut().filter(|u| !u.expired) {
            match update.deadline {
                Some(at) if at <= now && blocked => update.deadline = now.checked_add(after),
                Some(at) if at <= now => {
                    update.expired = true;
                    tracing::warn!(?after, "no update-secret-ok from the broker");
                    self.events.push_back(Event::Reply {
                        channel: 0,
                        token: update.token,
                        result: Err(CallError::TimedOut {
                            waiting_for: Wait::Reply {
                                to: ConnectionUpdateSecret::NAME,
                            },
                            after,
                        }),
                    });
                }
                _ => {}
            }
        }
    }

    /// Starts the deadline of every wait whose request is about to be written.
    fn arm_waits(&mut self, now: Instant) {
        if matches!(self.state, State::Closing(_)) && self.close_deadline.is_none() {
            self.close_deadline = now.checked_add(self.params.timeouts.close);
        }
        let mut unarmed = std::mem::take(&mut self.unarmed);
        for channel in unarmed.drain(..) {
            self.arm_channel(channel, now);
        }
        self.unarmed = unarmed;
        let mut unarmed = std::mem::take(&mut self.unarmed_calls);
        for (channel, token) in unarmed.drain(..) {
            self.arm_call(channel, token, now);
        }
        self.unarmed_calls = unarmed;
        let call = self.params.timeouts.call;
        for update in self.secret_updates.iter_mut().filter(|u| u.deadline.is_none()) {
            update.deadline = now.checked_add(call);
        }
    }

    /// Starts the deadline of `token`'s reply on `channel`.
    fn arm_call(&mut self, channel: u16, token: Token, now: Instant) {
        let Some(at) = now.checked_add(self.params.timeouts.call) else {
            return;
        };
        let Some(state) = self.channel_mut(channel) else { return };
        let Some(call) = state.calls.iter_mut().find(|call| call.token == token) else {
            return;
        };
        call.deadline = Some(at);
        self.call_deadlines.arm(at, (channel, token));
    }

    /// The call `token` on `channel` waited too long for its reply: it and
    /// every call behind it fail, and the channel is closed, since a reply
    /// that came now would be taken for the next call's.
    fn call_expired(&mut self, channel: u16, token: Token, now: Instant) {
        if self.blocked.is_blocked() {
            // The broker reads nothing while it blocks us: the wait starts over.
            self.arm_call(channel, token, now);
            return;
        }
        let after = self.params.timeouts.call;
        let Some(state) = self
            .channels
            .get_mut(usize::from(channel))
            .and_then(|c| c.as_deref_mut())
        else {
            return;
        };
        let Some(to) = state
            .calls
            .iter()
            .find(|call| call.token == token)
            .map(|call| call.method)
        else {
            return;
        };
        tracing::warn!(
            channel,
            call = to,
            ?after,
            "no reply from the broker: closing the channel"
        );
        fail_calls(
            &mut self.events,
            channel,
            state,
            CallError::TimedOut {
                waiting_for: Wait::Reply { to },
                after,
            },
        );
        // Acks already made are said before the channel goes.
        self.release_held(channel);
        let state = self.channel_mut(channel).expect("checked above");
        state.phase = Phase::Closing;
        // A method the machine writes on its own always encodes.
        self.push_call(channel, &Method::ChannelClose(goodbye())).ok();
        self.arm_channel(channel, now);
    }

    /// Starts the deadline of what `channel` waits for (by its phase).
    fn arm_channel(&mut self, channel: u16, now: Instant) {
        let timeouts = self.params.timeouts;
        let Some(state) = self.channel_mut(channel) else { return };
        let wait = match state.phase {
            Phase::Opening => Wait::ChannelOpenOk,
            Phase::Closing => Wait::ChannelCloseOk,
            Phase::Open => return,
        };
        let Some(at) = now.checked_add(timeouts.of(wait)) else {
            return;
        };
        state.deadline = Some(at);
        self.channel_deadlines.arm(at, channel);
    }

    /// `channel` waited too long for `open-ok` or `close-ok`.
    fn channel_wait_expired(&mut self, channel: u16, now: Instant) {
        if self.blocked.is_blocked() {
            // The broker reads nothing while it blocks us: the wait starts over.
            self.arm_channel(channel, now);
            return;
        }
        let timeouts = self.params.timeouts;
        let Some(state) = self.channel_mut(channel) else { return };
        state.deadline = None;
        match state.phase {
            Phase::Opening => {
                // The only call an opening channel has is its channel.open.
                if let Some(call) = state.calls.pop_front() {
                    self.events.push_back(Event::Reply {
                        channel,
                        token: call.token,
                        result: Err(CallError::TimedOut {
                            waiting_for: Wait::ChannelOpenOk,
                            after: timeouts.channel_open,
                        }),
                    });
                }
                // The broker may still open it: close it, and keep the
                // number until the broker says it is closed.
                let state = self.channel_mut(channel).expect("checked above");
                state.phase = Phase::Closing;
                // A method the machine writes on its own always encodes.
                self.push_call(channel, &Method::ChannelClose(goodbye())).ok();
                self.arm_channel(channel, now);
            }
            Phase::Closing => {
                // A broker that does not close a channel cannot be trusted
                // with its number, nor with the rest of the connection.
                let text = format!("no channel.close-ok for channel {channel}");
                self.close_with(
                    ReplyCode::ChannelError.code(),
                    ShortString::from(text.as_str()),
                    CloseReason::TimedOut {
                        waiting_for: Wait::ChannelCloseOk,
                        after: timeouts.close,
                    },
                );
            }
            Phase::Open => {}
        }
    }

    fn heartbeat_interval(&self) -> Option<Duration> {
        match self.tuned {
            Some(t) if t.heartbeat > 0 => Some(Duration::from_secs(u64::from(t.heartbeat))),
            _ => None,
        }
    }

    fn ensure_open(&self) -> Result<(), CommandError> {
        if self.state == State::Open {
            Ok(())
        } else {
            Err(CommandError::ConnectionNotOpen)
        }
    }

    fn channel(&self, id: u16) -> Option<&ChannelState> {
        self.channels.get(usize::from(id)).and_then(|c| c.as_deref())
    }

    fn channel_mut(&mut self, id: u16) -> Option<&mut ChannelState> {
        self.channels.get_mut(usize::from(id)).and_then(|c| c.as_deref_mut())
    }

    /// Writes a method and, if it expects a reply, queues the call.
    fn push_call(&mut self, channel: u16, method: &Method) -> Result<Option<Token>, CommandError> {
        encode_method(channel, method, &mut self.outbox)?;
        let Some((reply_class, reply_methods)) = expected_reply(method) else {
            return Ok(None);
        };
        self.next_token += 1;
        let token = Token(self.next_token);
        // `channel.open` and `channel.close` are bounded by the channel's
        // own deadline; every other call by its own.
        let own_deadline = !matches!(method, Method::ChannelOpen(_) | Method::ChannelClose(_));
        if let Some(state) = self.channel_mut(channel) {
            state.calls.push_back(PendingCall {
                token,
                reply_class,
                reply_methods,
                method: method.name(),
                deadline: None,
            });
            if own_deadline {
                self.unarmed_calls.push((channel, token));
            }
        }
        Ok(Some(token))
    }

    /// `channel` holds back an ack: it is let out before the next write.
    fn note_holding(&mut self, channel: u16) {
        if self.holding.last() != Some(&channel) {
            self.holding.push(channel);
        }
    }

    /// Writes the ack `channel` holds back, if any, as one multiple ack.
    fn release_held(&mut self, channel: u16) {
        let Some(tag) = self.channel_mut(channel).and_then(|c| c.settlements.take_held()) else {
            return;
        };
        self.send(
            channel,
            acemq_codec::BasicAck {
                delivery_tag: tag,
                multiple: true,
            },
        );
    }

    /// Writes every held-back ack.
    fn release_all_held(&mut self) {
        let mut holding = std::mem::take(&mut self.holding);
        for &channel in &holding {
            self.release_held(channel);
        }
        holding.clear();
        self.holding = holding;
    }

    fn send(&mut self, channel: u16, method: impl Into<Method>) {
        // Methods the machine sends on its own are small and always encode.
        encode_method(channel, &method.into(), &mut self.outbox).ok();
    }

    fn handle_frame(&mut self, frame: Frame) {
        let channel = frame.channel();
        if let State::Closing(_) = self.state {
            // After our connection.close, only close and close-ok matter.
            if let Frame::Method(0, method) = frame {
                self.closing_method(method);
            }
            return;
        }
        if channel == 0 {
            match frame {
                Frame::Heartbeat => {}
                Frame::Method(_, method) => self.connection_method(method),
                _ => self.protocol_error(ReplyCode::CommandInvalid, "content frame on channel 0".into()),
            }
            return;
        }
        if self.state != State::Open {
            self.protocol_error(
                ReplyCode::ChannelError,
                format!("frame on channel {channel} before the connection is open"),
            );
            return;
        }
        let Some(state) = self.channel_mut(channel) else {
            self.protocol_error(
                ReplyCode::ChannelError,
                format!("frame on channel {channel}, which is not open"),
            );
            return;
        };
        if state.phase == Phase::Closing {
            // Everything but channel.close / close-ok is ignored until close-ok.
            if let Frame::Method(_, method) = frame {
                self.closing_channel_method(channel, method);
            }
            return;
        }
        match state.assembler.push(frame) {
            Ok(Assembly::Partial) => {}
            Ok(Assembly::Method(method)) => self.channel_method(channel, method),
            Ok(Assembly::Complete(content)) => self.channel_content(channel, content),
            Err(err) => self.protocol_error(err.reply_code(), format!("on channel {channel}: {err}")),
        }
    }

    fn connection_method(&mut self, method: Method) {
        match (&self.state, method) {
            (_, Method::ConnectionClose(close)) => {
                self.send(0, ConnectionCloseOk {});
                self.state = State::Closed;
                self.finish(CloseReason::ByServer(Refusal::from_connection_close(&close)));
            }
            (State::ExpectStart, Method::ConnectionStart(start)) => self.on_start(start),
            (State::ExpectTune, Method::ConnectionTune(tune)) => {
                let tuned = negotiate(&tune, &self.params.tune);
                self.tuned = Some(tuned);
                self.decoder.set_frame_max(tuned.frame_max);
                self.send(0, ConnectionTuneOk::from(tuned));
                let open = ConnectionOpen {
                    virtual_host: self.params.vhost.as_str().into(),
                    ..Default::default()
                };
                self.send(0, open);
                self.state = State::ExpectOpenOk;
            }
            (State::ExpectTune, Method::ConnectionSecure(_)) => {
                self.protocol_error(
                    ReplyCode::NotImplemented,
                    "the broker sent a SASL challenge; acemq's mechanisms take none".into(),
                );
            }
            (State::ExpectOpenOk, Method::ConnectionOpenOk(_)) => {
                self.state = State::Open;
                self.handshake_deadline = None;
                self.events.push_back(Event::Opened);
            }
            (State::Open, Method::ConnectionBlocked(m)) => {
                let method = Method::ConnectionBlocked(m);
                if let Some(BlockedChange::Blocked { reason }) = self.blocked.handle(&method) {
                    self.events.push_back(Event::Blocked {
                        reason: reason.to_string(),
                    });
                }
            }
            (State::Open, Method::ConnectionUnblocked(m)) => {
                if let Some(BlockedChange::Unblocked) = self.blocked.handle(&Method::ConnectionUnblocked(m)) {
                    self.events.push_back(Event::Unblocked);
                }
            }
            (State::Open, Method::ConnectionUpdateSecretOk(ok)) => {
                // One unasked for is harmless: nothing waits for it.
                if let Some(update) = self.secret_updates.pop_front() {
                    if !update.expired {
                        self.events.push_back(Event::Reply {
                            channel: 0,
                            token: update.token,
                            result: Ok(Reply::Method(Method::ConnectionUpdateSecretOk(ok))),
                        });
                    }
                }
            }
            (_, other) => self.protocol_error(
                ReplyCode::CommandInvalid,
                format!("unexpected {} on channel 0", other.name()),
            ),
        }
    }

    fn on_start(&mut self, start: acemq_codec::ConnectionStart) {
        if (start.version_major, start.version_minor) != (0, 9) {
            self.protocol_error(
                ReplyCode::NotImplemented,
                format!("the broker speaks AMQP {}-{}", start.version_major, start.version_minor),
            );
            return;
        }
        let mechanism = self.params.auth.mechanism();
        let offered = start.mechanisms.to_string_lossy();
        if !offered.split_whitespace().any(|m| m == mechanism) {
            self.protocol_error(
                ReplyCode::AccessRefused,
                format!("the broker does not offer {mechanism} (it offers {offered})"),
            );
            return;
        }
        self.server_properties = start.server_properties;
        let start_ok = ConnectionStartOk {
            client_properties: client_properties(self.params.connection_name.as_deref()),
            mechanism: mechanism.into(),
            response: self.params.auth.response(),
            locale: "en_US".into(),
        };
        self.send(0, start_ok);
        self.state = State::ExpectTune;
    }

    fn closing_method(&mut self, method: Method) {
        match method {
            Method::ConnectionCloseOk(_) => {
                if let State::Closing(reason) = std::mem::replace(&mut self.state, State::Closed) {
                    self.finish(reason);
                }
            }
            Method::ConnectionClose(close) => {
                // Both sides closed at once: answer, and end with the broker's reason.
                self.send(0, ConnectionCloseOk {});
                self.state = State::Closed;
                let reason = CloseReason::ByServer(Refusal::from_connection_close(&close));
                self.finish(reason);
            }
            _ => {}
        }
    }

    fn closing_channel_method(&mut self, channel: u16, method: Method) {
        match method {
            Method::ChannelCloseOk(_) => {
                let Some(mut state) = self.channels[usize::from(channel)].take() else {
                    return;
                };
                // Say the channel is gone before answering any call, so that a
                // caller woken by the answer already sees it closed.
                let mut unconfirmed = Vec::new();
                state.confirms.fail_all(&mut unconfirmed);
                self.events.push_back(Event::ChannelClosed {
                    channel,
                    refusal: None,
                    unconfirmed,
                });
                // The close-ok answers our channel.close call, the last one queued.
                let last = state.calls.pop_back();
                fail_calls(
                    &mut self.events,
                    channel,
                    &mut state,
                    CallError::ChannelClosedByClient { channel },
                );
                if let Some(call) = last {
                    self.events.push_back(Event::Reply {
                        channel,
                        token: call.token,
                        result: Ok(Reply::Method(Method::ChannelCloseOk(ChannelCloseOk {}))),
                    });
                }
            }
            Method::ChannelClose(_) => self.send(channel, ChannelCloseOk {}),
            _ => {}
        }
    }

    fn channel_method(&mut self, channel: u16, method: Method) {
        if is_reply(&method) {
            self.resolve_call(channel, Reply::Method(method));
            return;
        }
        match method {
            Method::BasicAck(ack) => self.on_confirm(channel, Outcome::Ack, ack.delivery_tag, ack.multiple),
            Method::BasicNack(nack) => self.on_confirm(channel, Outcome::Nack, nack.delivery_tag, nack.multiple),
            Method::ChannelClose(close) => {
                self.send(channel, ChannelCloseOk {});
                self.server_closed_channel(channel, Refusal::from_channel_close(&close));
            }
            Method::BasicCancel(cancel) => {
                if !cancel.no_wait {
                    self.send(
                        channel,
                        acemq_codec::BasicCancelOk {
                            consumer_tag: cancel.consumer_tag.clone(),
                        },
                    );
                }
                self.events.push_back(Event::ConsumerCancelled {
                    channel,
                    consumer_tag: cancel.consumer_tag,
                });
            }
            Method::ChannelFlow(flow) => {
                self.send(channel, ChannelFlowOk { active: flow.active });
                self.events.push_back(Event::Flow {
                    channel,
                    active: flow.active,
                });
            }
            other => self.protocol_error(
                ReplyCode::CommandInvalid,
                format!("unexpected {} on channel {channel}", other.name()),
            ),
        }
    }

    fn channel_content(&mut self, channel: u16, content: Content) {
        match &content.method {
            Method::BasicDeliver(deliver) => {
                if let Some(state) = self.channel_mut(channel) {
                    state.settlements.on_delivery(deliver.delivery_tag);
                }
                self.events.push_back(Event::Delivery { channel, content })
            }
            Method::BasicGetOk(get) => {
                if let Some(state) = self.channel_mut(channel) {
                    state.settlements.on_delivery(get.delivery_tag);
                }
                self.resolve_call(channel, Reply::Content(Box::new(content)))
            }
            Method::BasicReturn(ret) => {
                let Some(state) = self.channel_mut(channel) else { return };
                let message_id = content
                    .header
                    .as_ref()
                    .ok()
                    .and_then(|h| h.properties.message_id.as_ref());
                match state.returns.on_return(ret.clone(), message_id) {
                    ReturnMatch::Matched(seq) => {
                        state.returned.insert(seq, content);
                    }
                    ReturnMatch::Unmatched(_) => self.events.push_back(Event::Return { channel, content }),
                }
            }
            other => {
                let name = other.name();
                self.protocol_error(
                    ReplyCode::CommandInvalid,
                    format!("{name} with content from the broker"),
                );
            }
        }
    }

    fn resolve_call(&mut self, channel: u16, reply: Reply) {
        let (class_id, method_id) = match &reply {
            Reply::Method(m) => (m.class_id(), m.method_id()),
            Reply::Content(c) => (c.method.class_id(), c.method.method_id()),
        };
        let Some(state) = self.channel_mut(channel) else { return };
        // Look before taking: a call the reply does not answer stays queued,
        // so that closing the connection answers it.
        let Some(call) = state.calls.front() else {
            self.protocol_error(
                ReplyCode::UnexpectedFrame,
                format!(
                    "{} on channel {channel}, which is waiting for no reply",
                    Method::name_of(class_id, method_id).unwrap_or("reply")
                ),
            );
            return;
        };
        if call.reply_class != class_id || !call.reply_methods.contains(&method_id) {
            self.protocol_error(
                ReplyCode::UnexpectedFrame,
                format!(
                    "{} on channel {channel} does not answer the call waiting there",
                    Method::name_of(class_id, method_id).unwrap_or("reply")
                ),
            );
            return;
        }
        let token = call.token;
        state.calls.pop_front();
        if matches!(&reply, Reply::Method(Method::ChannelOpenOk(_))) {
            state.phase = Phase::Open;
            state.deadline = None;
        }
        self.events.push_back(Event::Reply {
            channel,
            token,
            result: Ok(reply),
        });
    }

    fn on_confirm(&mut self, channel: u16, outcome: Outcome, tag: u64, multiple: bool) {
        let Some(state) = self
            .channels
            .get_mut(usize::from(channel))
            .and_then(|c| c.as_deref_mut())
        else {
            return;
        };
        let mut runs = std::mem::take(&mut self.scratch);
        runs.clear();
        if let Err(err) = state.confirms.on_confirm_runs(outcome, tag, multiple, &mut runs) {
            self.scratch = runs;
            self.protocol_error(ReplyCode::CommandInvalid, format!("on channel {channel}: {err}"));
            return;
        }
        let events = &mut self.events;
        let end_run = |events: &mut VecDeque<Event>, run: Option<(u64, u64)>| {
            if let Some((first, last)) = run {
                // A run that follows on from the last event's, with the
                // same outcome, extends it: the acks of one read (RabbitMQ
                // sends several, each `multiple`) then cost the application
                // one event, not one each.
                if let Some(Event::Confirms {
                    channel: c,
                    last: back,
                    outcome: o,
                    ..
                }) = events.back_mut()
                {
                    if *c == channel && *o == outcome && back.checked_add(1) == Some(first) {
                        *back = last;
                        return;
                    }
                }
                events.push_back(Event::Confirms {
                    channel,
                    first,
                    last,
                    outcome,
                });
            }
        };
        if state.returns.is_empty() {
            // No mandatory publish waits for its confirm: nothing to pair,
            // each run the tracker resolved is one event (usually one run:
            // a multiple ack of the oldest outstanding).
            for &run in &runs {
                end_run(events, Some(run));
            }
            self.scratch = runs;
            return;
        }
        // Runs of consecutive numbers not returned go out as one event.
        let mut run: Option<(u64, u64)> = None;
        for seq in runs.iter().flat_map(|&(first, last)| first..=last) {
            let returned = if state.returns.resolve(seq).is_some() {
                state.returned.remove(&seq)
            } else {
                None
            };
            match (&mut run, returned) {
                (Some((_, last)), None) if last.checked_add(1) == Some(seq) => *last = seq,
                (_, None) => end_run(events, run.replace((seq, seq))),
                (_, returned) => {
                    end_run(events, run.take());
                    events.push_back(Event::Confirm {
                        channel,
                        seq,
                        outcome,
                        returned,
                    });
                }
            }
        }
        end_run(events, run);
        self.scratch = runs;
    }

    fn server_closed_channel(&mut self, channel: u16, refusal: Refusal) {
        let Some(mut state) = self.channels.get_mut(usize::from(channel)).and_then(Option::take) else {
            return;
        };
        let mut unconfirmed = Vec::new();
        state.confirms.fail_all(&mut unconfirmed);
        self.events.push_back(Event::ChannelClosed {
            channel,
            refusal: Some(refusal.clone()),
            unconfirmed,
        });
        fail_calls(&mut self.events, channel, &mut state, CallError::ChannelClosed(refusal));
    }

    /// The broker broke the protocol: close the connection with `code`.
    fn protocol_error(&mut self, code: ReplyCode, text: String) {
        if matches!(self.state, State::Closing(_) | State::Closed) {
            // Already leaving: one warning per connection is enough.
            return;
        }
        tracing::warn!(code = code.code(), %text, "closing the connection: protocol error");
        let reply_text = ShortString::from(crate::text::prefix_within(&text, 255));
        self.close_with(code.code(), reply_text, CloseReason::ProtocolError { code, text });
    }

    fn close_with(&mut self, code: u16, text: ShortString, reason: CloseReason) {
        match self.state {
            State::Closing(_) | State::Closed => return,
            State::ExpectStart => {
                // Nothing to close politely before connection.start.
                self.state = State::Closed;
                self.finish(reason);
                return;
            }
            _ => {}
        }
        // Acks the application made are said before goodbye.
        self.release_all_held();
        self.send(
            0,
            ConnectionClose {
                reply_code: code,
                reply_text: text,
                class_id: 0,
                method_id: 0,
            },
        );
        self.state = State::Closing(reason);
    }

    /// Ends the connection: every pending call fails, every channel closes.
    fn finish(&mut self, reason: CloseReason) {
        self.state = State::Closed;
        for (id, slot) in self.channels.iter_mut().enumerate() {
            let Some(mut state) = slot.take() else { continue };
            let error = CallError::ConnectionClosed(reason.clone());
            fail_calls(&mut self.events, id as u16, &mut state, error);
        }
        for update in std::mem::take(&mut self.secret_updates) {
            if !update.expired {
                self.events.push_back(Event::Reply {
                    channel: 0,
                    token: update.token,
                    result: Err(CallError::ConnectionClosed(reason.clone())),
                });
            }
        }
        self.blocked.reset();
        self.events.push_back(Event::Closed(reason));
    }
}

/// Every call still waiting on `channel` gets `error` as its answer, in order.
fn fail_calls(events: &mut VecDeque<Event>, channel: u16, state: &mut ChannelState, error: CallError) {
    for call in state.calls.drain(..) {
        events.push_back(Event::Reply {
            channel,
            token: call.token,
            result: Err(error.clone()),
        });
    }
}

/// A normal `channel.close` (200, "Goodbye"), as a client sends it.
pub(crate) fn goodbye() -> ChannelClose {
    ChannelClose {
        reply_code: ReplyCode::Success.code(),
        reply_text: "Goodbye".into(),
        class_id: 0,
        method_id: 0,
    }
}

/// A run of publishes encoded by the caller (see
/// [`Connection::encoded_publishes`]).
#[derive(Debug)]
pub struct EncodedPublishes<'a> {
    conn: &'a mut Connection,
    frames: &'a mut BytesMut,
    /// Where the frames taken but not yet queued start.
    taken_from: usize,
    /// Where the next message's frames start.
    at: usize,
}

impl EncodedPublishes<'_> {
    /// Takes the next message: its frames are the next `len` bytes, on
    /// `channel`; `returned` is what a `basic.return` of it is matched by,
    /// for a mandatory publish. Returns its confirm sequence number when the
    /// channel is in confirm mode. On an error its frames are left out, as
    /// by [`EncodedPublishes::skip`].
    pub fn publish(
        &mut self,
        channel: u16,
        len: usize,
        returned: Option<ReturnKey>,
    ) -> Result<Option<u64>, CommandError> {
        let seq = self.conn.account_publish(channel, || returned);
        match seq {
            Ok(_) => self.at += len,
            Err(_) => self.skip(len),
        }
        seq
    }

    /// Takes the next `count` messages at once, all on `channel` and none
    /// mandatory, their frames the next `len` bytes: as `count` calls of
    /// [`EncodedPublishes::publish`] would. Returns the first one's confirm
    /// sequence number when the channel is in confirm mode (the others
    /// follow it). On an error all of them are left out.
    pub fn publish_many(&mut self, channel: u16, len: usize, count: u64) -> Result<Option<u64>, CommandError> {
        let seq = self
            .conn
            .open_channel_for_publish(channel)
            .map(|state| state.confirms.on_publishes(count));
        match seq {
            Ok(_) => self.at += len,
            Err(_) => self.skip(len),
        }
        seq
    }

    /// Leaves the next message out: its `len` bytes are never written.
    pub fn skip(&mut self, len: usize) {
        // What was taken before it is queued now, so that it stays in order
        // with what is taken after.
        if let Some(taken) = self.frames.get(self.taken_from..self.at) {
            self.conn.outbox.extend_from_slice(taken);
        }
        self.at += len;
        self.taken_from = self.at;
    }
}

impl Drop for EncodedPublishes<'_> {
    fn drop(&mut self) {
        let outbox = &mut self.conn.outbox;
        if self.taken_from == 0 && self.at == self.frames.len() && outbox.is_empty() {
            std::mem::swap(outbox, self.frames);
        } else if let Some(taken) = self.frames.get(self.taken_from..self.at) {
            outbox.extend_from_slice(taken);
        }
    }
}
