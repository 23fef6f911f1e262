//! One client connection, sans-IO: the protocol header, the
//! `start`/`tune`/`open` handshake, channel lifecycles, heartbeats, the
//! close handshakes, and blocking a publisher during a memory alarm. Frames
//! on open channels go to the [`BrokerMachine`]; a publish is put together
//! from its frames by the channel's `acemq_codec::track::ContentAssembler`.
//!
//! ```text
//! ExpectProtocolHeader --AMQP0091--> ExpectStartOk --start-ok--> ExpectTuneOk
//!   --tune-ok--> ExpectOpen --open--> Open --close / hard error--> Closing --> finished
//! ```
//!
//! It never panics on input: every byte sequence ends in a frame, a close, or
//! a dropped socket. It never reads or writes a frame's bytes itself: frames
//! come from acemq-codec's decoder and replies go out through its encoders.

use std::time::{Duration, Instant};

use acemq_codec::track::{AssembleError, Assembly, Content, ContentError, Decoded};
use acemq_codec::{
    check_protocol_header, BasicPublish, ChannelCloseOk, ChannelOpenOk, ConnectionBlocked, ConnectionCloseOk,
    ConnectionOpenOk, ConnectionStart, ConnectionTune, ConnectionUnblocked, ConnectionUpdateSecretOk,
    Error as DecodeError, FieldTable, FieldValue, Frame, FrameDecoder, Method, ReplyCode, PROTOCOL_HEADER,
};
use bytes::{Buf, BufMut, BytesMut};

use crate::broker::{BrokerMachine, Capabilities, ConnId, Fault, Header, Publication};
use crate::error::AmqpError;

/// What the session waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    ExpectProtocolHeader,
    ExpectStartOk,
    ExpectTuneOk,
    ExpectOpen,
    Open,
    /// The broker sent `connection.close`; only `close-ok` matters now.
    Closing,
    /// Nothing more is read; the socket goes when a deadline passes.
    Doomed,
}

/// What the driver should do with the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Keep going.
    Running,
    /// Write what is pending, then close.
    Close,
    /// Drop the socket now, writing nothing more.
    Sever,
}

/// The broker's side of one client connection. A driver feeds it bytes with
/// [`Session::handle_input`], calls [`Session::handle_timeout`] when
/// [`Session::poll_timeout`] is due, writes [`BrokerMachine::take_output`]
/// for [`Session::id`] and tells it with [`Session::transmitted`], and acts
/// on [`Session::fate`].
#[derive(Debug)]
pub struct Session {
    id: ConnId,
    phase: Phase,
    decoder: FrameDecoder,
    heartbeat: Option<Duration>,
    last_recv: Instant,
    last_send: Instant,
    deadline: Option<Instant>,
    blocked: bool,
    blocked_sent: bool,
    fate: Fate,
    mechanism: String,
    /// Input was left unprocessed because the output was full.
    input_held: bool,
}

const BLOCKED_REASON: &str = "low on memory";

/// The frame size limits, as RabbitMQ's reader (`rabbit_reader`, 3.10 and
/// 4.0 alike) checks them from a frame's 7-byte header: with a negotiated
/// `frame_max` of N (not 0), a frame is refused only when its payload is
/// larger than N itself. The limit it means is N - 8 (the whole frame
/// within N), but it lets clients run over by one empty frame's size (8
/// bytes), since many are off by one or by eight; so a frame of N + 8
/// bytes on the wire (a body payload of exactly N, as some clients split
/// a large body) passes, and one of N + 9 is a `FRAME_ERROR`. Until
/// `tune-ok` the N it checks against is 4096 (its `initial_frame_max`).
const FRAME_ALLOWANCE: u32 = 8;
/// `frame_max` before `tune-ok` (see [`FRAME_ALLOWANCE`]).
const HANDSHAKE_FRAME_MAX: u32 = 4096;

impl Session {
    /// Registers a new connection with `machine`.
    pub fn new(machine: &mut BrokerMachine, now: Instant) -> Session {
        let id = machine.add_conn();
        let handshake = machine.config().handshake_timeout;
        Session {
            id,
            phase: Phase::ExpectProtocolHeader,
            decoder: FrameDecoder::new(HANDSHAKE_FRAME_MAX).with_allowance(FRAME_ALLOWANCE),
            heartbeat: None,
            last_recv: now,
            last_send: now,
            deadline: now.checked_add(handshake),
            blocked: false,
            blocked_sent: false,
            fate: Fate::Running,
            mechanism: String::new(),
            input_held: false,
        }
    }

    /// The connection's id in the machine.
    pub fn id(&self) -> ConnId {
        self.id
    }

    /// What the driver should do with the socket.
    pub fn fate(&self) -> Fate {
        self.fate
    }

    /// Whether the driver should read more input: not while blocked by an
    /// alarm (RabbitMQ stops reading the socket), nor once closing.
    pub fn wants_read(&self) -> bool {
        self.fate == Fate::Running && !self.blocked && self.phase != Phase::Doomed
    }

    /// Whether the client has logged in (its `start-ok` was accepted): until
    /// then a driver keeps its input buffer small.
    pub fn is_authenticated(&self) -> bool {
        !matches!(self.phase, Phase::ExpectProtocolHeader | Phase::ExpectStartOk)
    }

    /// Whether [`Session::handle_input`] left input unprocessed because the
    /// connection's output was full: call it again once the output has
    /// room ([`BrokerMachine::output_has_room`]), without waiting for more.
    pub fn input_held(&self) -> bool {
        self.input_held
    }

    /// Bytes arrived from the client.
    pub fn received(&mut self, now: Instant) {
        self.last_recv = now;
    }

    /// Bytes were written to the client.
    pub fn transmitted(&mut self, now: Instant) {
        self.last_send = now;
    }

    /// When [`Session::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.fate != Fate::Running {
            return None;
        }
        let mut next = self.deadline;
        if let (Phase::Open, Some(hb)) = (self.phase, self.heartbeat) {
            let send = self.last_send + hb / 2;
            next = Some(next.map_or(send, |n| n.min(send)));
            if !self.blocked {
                let drop = self.last_recv + hb * 2;
                next = Some(next.map_or(drop, |n| n.min(drop)));
            }
        }
        next
    }

    /// Heartbeats, the handshake deadline, and close deadlines.
    pub fn handle_timeout(&mut self, machine: &mut BrokerMachine, now: Instant) {
        if self.fate != Fate::Running {
            return;
        }
        if self.deadline.is_some_and(|d| d <= now) {
            tracing::debug!(conn = self.id, phase = ?self.phase, "connection deadline passed, dropping it");
            self.fate = Fate::Sever;
            return;
        }
        if let (Phase::Open, Some(hb)) = (self.phase, self.heartbeat) {
            if !self.blocked && self.last_recv + hb * 2 <= now {
                tracing::debug!(conn = self.id, "missed heartbeats from client, dropping it");
                self.fate = Fate::Sever;
                return;
            }
            if self.last_send + hb / 2 <= now {
                if let Some(conn) = machine.conns.get_mut(&self.id) {
                    if conn.out.is_empty() {
                        let _ = Frame::Heartbeat.encode(&mut conn.out);
                    }
                }
                self.last_send = now;
            }
        }
    }

    /// The client went away (EOF or a socket error).
    pub fn handle_eof(&mut self, machine: &mut BrokerMachine, now: Instant) {
        machine.release_conn(self.id, now);
        self.fate = Fate::Sever;
    }

    /// Processes what is in `buf` (consuming whole frames), after applying
    /// faults and alarm changes. Replies go to the machine's outbox.
    pub fn handle_input(&mut self, machine: &mut BrokerMachine, buf: &mut BytesMut, now: Instant) {
        self.apply_outside_changes(machine, now);
        self.input_held = false;
        while self.fate == Fate::Running && !self.blocked && self.phase != Phase::Doomed {
            // A client that does not read its replies is not read either:
            // what is left in `buf` waits until the output has room.
            if !machine.output_has_room(self.id) {
                self.input_held = !buf.is_empty();
                break;
            }
            if self.phase == Phase::ExpectProtocolHeader {
                match check_protocol_header(buf) {
                    Ok(false) => break,
                    Ok(true) => {
                        buf.advance(8);
                        self.send_start(machine);
                    }
                    Err(_) => {
                        // RabbitMQ 4.0 answers bytes that do not start with
                        // `AMQP` with AMQP 1.0's SASL header; a bad version
                        // after `AMQP`, and anything on 3.10, with 0-9-1's.
                        let amqp_1_0 = machine.config().rabbitmq_version.is_4() && !buf.starts_with(b"AMQP");
                        if let Some(conn) = machine.conns.get_mut(&self.id) {
                            conn.out.put_slice(if amqp_1_0 {
                                b"AMQP\x03\x01\x00\x00"
                            } else {
                                &PROTOCOL_HEADER
                            });
                        }
                        self.fate = Fate::Close;
                    }
                }
                continue;
            }
            if !self.next_frame(machine, buf, now) {
                break;
            }
            machine.process_dead_letters(now);
        }
        machine.flush_confirms(self.id);
    }

    /// Takes the next whole frame off `buf` and handles it; `false` if
    /// there is none yet. Once the connection is open, the header and body
    /// frames of a publish in progress go straight into the channel's
    /// assembler ([`FrameDecoder::decode_assembled`]: no frame is built and
    /// the finished message is moved once); every other frame is decoded
    /// whole, so a publish starts, and is refused, as any method would be.
    #[inline(always)]
    fn next_frame(&mut self, machine: &mut BrokerMachine, buf: &mut BytesMut, now: Instant) -> bool {
        if self.phase == Phase::Open {
            let id = self.id;
            let conns = &mut machine.conns;
            let decoded = self.decoder.decode_assembled(buf, |ch| {
                let channel = conns.get_mut(&id)?.channel_mut(ch)?;
                // A channel being closed has had its assembler reset.
                channel.assembler.in_progress().then_some(&mut channel.assembler)
            });
            match decoded {
                Ok(Decoded::NeedMore) => return false,
                Ok(Decoded::Partial(_)) => return true,
                Ok(Decoded::Complete(ch)) => {
                    let content = machine
                        .conns
                        .get_mut(&self.id)
                        .and_then(|c| c.channel_mut(ch))
                        .and_then(|c| c.assembler.take_complete());
                    if let Some(content) = content {
                        let result = self.publish_content(machine, ch, content, now);
                        self.refuse_if_err(machine, ch, result, now);
                    }
                    return true;
                }
                Ok(Decoded::Other) => {}
                Err(AssembleError::Content { channel, error }) => {
                    self.refuse_if_err(machine, channel, Err(refused_content(&error)), now);
                    return true;
                }
                Err(AssembleError::Decode(err)) => {
                    self.decode_failed(machine, buf, err, now);
                    return true;
                }
                // `AssembleError` may grow; whatever it is, the stream is suspect.
                Err(err) => {
                    self.undecodable(machine, buf, ReplyCode::FrameError, err, now);
                    return true;
                }
            }
        }
        match self.decoder.decode(buf) {
            Ok(None) => false,
            Ok(Some(frame)) => {
                self.handle_frame(machine, frame, now);
                true
            }
            Err(err) => {
                self.decode_failed(machine, buf, err, now);
                true
            }
        }
    }

    /// The client's bytes do not decode: closes the connection with the
    /// error's reply code (an oversized frame in RabbitMQ's words: the
    /// frame's type, its payload size, and the limit it means, `frame_max`
    /// less the 8-byte envelope).
    fn decode_failed(&mut self, machine: &mut BrokerMachine, buf: &mut BytesMut, err: DecodeError, now: Instant) {
        if let DecodeError::FrameTooLarge { size, frame_max } = err {
            let frame_type = buf.first().copied().unwrap_or_default();
            let detail = format!(
                "type {frame_type}, all octets = <<>>: {{frame_too_large,{},{}}}",
                size.saturating_sub(8),
                frame_max.saturating_sub(8)
            );
            return self.undecodable(machine, buf, ReplyCode::FrameError, detail, now);
        }
        match err {
            // RabbitMQ's reader crashes on ids that name no method: the
            // socket closes with no `connection.close`.
            DecodeError::UnknownMethod { .. } => {
                tracing::debug!(conn = self.id, %err, "unknown method, dropping the connection");
                buf.clear();
                machine.release_conn(self.id, now);
                self.fate = Fate::Sever;
            }
            // A heartbeat frame on a channel is unexpected there (505; the
            // rarer heartbeat on channel 0 with a payload gets the same here,
            // 501 on RabbitMQ); any other frame that does not decode is a
            // frame error (501).
            DecodeError::Malformed { kind, .. } => {
                let code = if kind == acemq_codec::DecodeErrorKind::BadHeartbeat {
                    ReplyCode::UnexpectedFrame
                } else {
                    ReplyCode::FrameError
                };
                self.undecodable(machine, buf, code, err, now);
            }
            _ => self.undecodable(machine, buf, err.reply_code(), err, now),
        }
    }

    /// The client sent bytes that do not decode: nothing after them can be
    /// trusted, so they are dropped and the connection closed.
    fn undecodable(
        &mut self,
        machine: &mut BrokerMachine,
        buf: &mut BytesMut,
        code: ReplyCode,
        err: impl std::fmt::Display,
        now: Instant,
    ) {
        buf.clear();
        self.connection_error(machine, AmqpError::new(code, err), now);
    }

    /// Faults from the test handle and alarm changes.
    fn apply_outside_changes(&mut self, machine: &mut BrokerMachine, now: Instant) {
        let alarm = machine.alarm;
        let Some(conn) = machine.conns.get_mut(&self.id) else {
            self.fate = Fate::Sever;
            return;
        };
        match conn.fault.take() {
            Some(Fault::Sever) => {
                self.fate = Fate::Sever;
                machine.release_conn(self.id, now);
                return;
            }
            Some(Fault::FlushAndDrop) => {
                self.fate = Fate::Close;
                return;
            }
            Some(Fault::Close(error)) => {
                if self.phase == Phase::Open {
                    self.connection_error(machine, error, now);
                } else if self.phase != Phase::Closing {
                    self.fate = Fate::Sever;
                    machine.release_conn(self.id, now);
                }
                return;
            }
            None => {}
        }
        if self.blocked && !alarm {
            self.blocked = false;
            if self.blocked_sent {
                self.blocked_sent = false;
                machine.send(self.id, 0, ConnectionUnblocked {});
            }
        }
    }

    fn send_start(&mut self, machine: &mut BrokerMachine) {
        let mut caps = FieldTable::new();
        for cap in [
            "publisher_confirms",
            "exchange_exchange_bindings",
            "basic.nack",
            "consumer_cancel_notify",
            "connection.blocked",
            "consumer_priorities",
            "authentication_failure_close",
            "per_consumer_qos",
            "direct_reply_to",
        ] {
            caps.push(cap, true);
        }
        let mut props = FieldTable::new();
        props.push("capabilities", caps);
        props.push("cluster_name", machine.config().cluster_name.as_str());
        props.push("copyright", "acemq authors");
        props.push(
            "information",
            "acemq-memory: an in-process AMQP 0-9-1 broker that behaves like RabbitMQ 3.10",
        );
        props.push("platform", "Rust");
        props.push("product", "acemq-memory");
        props.push("version", env!("CARGO_PKG_VERSION"));
        let start = ConnectionStart {
            version_major: 0,
            version_minor: 9,
            server_properties: props,
            mechanisms: "PLAIN AMQPLAIN".into(),
            locales: "en_US".into(),
        };
        machine.send(self.id, 0, start);
        self.phase = Phase::ExpectStartOk;
    }

    #[inline(always)]
    fn handle_frame(&mut self, machine: &mut BrokerMachine, frame: Frame, now: Instant) {
        if matches!(frame, Frame::Heartbeat) {
            return;
        }
        if self.phase == Phase::ExpectOpen && matches!(frame, Frame::Method(0, Method::ConnectionClose(_))) {
            machine.send(self.id, 0, ConnectionCloseOk {});
            self.fate = Fate::Close;
            return;
        }
        // Before `tune-ok` RabbitMQ answers nothing it did not expect (a
        // `connection.close` included): it waits a few seconds and drops
        // the socket, as for a refused `tune-ok`.
        match self.phase {
            Phase::ExpectProtocolHeader | Phase::Doomed => {}
            Phase::ExpectStartOk => match frame {
                Frame::Method(0, Method::ConnectionStartOk(m)) => self.start_ok(machine, m, now),
                other => self.silent_close(machine, unexpected(&other, "connection.start_ok"), now),
            },
            Phase::ExpectTuneOk => match frame {
                Frame::Method(0, Method::ConnectionTuneOk(m)) => self.tune_ok(machine, m, now),
                other => self.silent_close(machine, unexpected(&other, "connection.tune_ok"), now),
            },
            Phase::ExpectOpen => match frame {
                Frame::Method(0, Method::ConnectionOpen(m)) => self.open(machine, m, now),
                other => self.handshake_error(machine, unexpected(&other, "connection.open")),
            },
            Phase::Closing => match frame {
                Frame::Method(0, Method::ConnectionCloseOk(_)) => self.fate = Fate::Close,
                Frame::Method(0, Method::ConnectionClose(_)) => {
                    machine.send(self.id, 0, ConnectionCloseOk {});
                    self.fate = Fate::Close;
                }
                _ => {}
            },
            Phase::Open => self.open_frame(machine, frame, now),
        }
    }

    fn start_ok(&mut self, machine: &mut BrokerMachine, m: acemq_codec::ConnectionStartOk, now: Instant) {
        let caps = m.client_properties.get("capabilities").and_then(FieldValue::as_table);
        let flag = |name: &str| caps.and_then(|c| c.get(name)).and_then(FieldValue::as_bool) == Some(true);
        let capabilities = Capabilities {
            consumer_cancel_notify: flag("consumer_cancel_notify"),
            connection_blocked: flag("connection.blocked"),
            authentication_failure_close: flag("authentication_failure_close"),
        };
        let mechanism = m.mechanism.to_string_lossy().into_owned();
        let credentials = match mechanism.as_str() {
            "PLAIN" => plain_credentials(m.response.as_bytes()),
            "AMQPLAIN" => amqplain_credentials(m.response.as_bytes()),
            _ => {
                let error = AmqpError::command_invalid(format!("unknown authentication mechanism '{mechanism}'"));
                return self.silent_close(machine, error, now);
            }
        };
        self.mechanism = mechanism;
        let user = credentials.and_then(|(user, password)| {
            machine
                .config()
                .users
                .iter()
                .find(|u| u.name == user && u.password == password)
                .map(|u| u.name.clone())
        });
        let refusal = match &user {
            None => Some(format!(
                "Login was refused using authentication mechanism {}. For details see the broker logfile.",
                self.mechanism
            )),
            Some(name) => {
                let loopback = machine.conns.get(&self.id).is_none_or(|c| c.loopback);
                let local_only = machine.config().loopback_users.iter().any(|u| u == name);
                (local_only && !loopback).then(|| format!("user '{name}' can only connect via localhost"))
            }
        };
        let (Some(user), None) = (user, refusal.clone()) else {
            tracing::info!(
                conn = self.id,
                reason = refusal.as_deref().unwrap_or(""),
                "login refused"
            );
            if capabilities.authentication_failure_close {
                let error = AmqpError::access_refused(refusal.unwrap_or_default());
                self.handshake_error(machine, error);
            } else {
                self.fate = Fate::Close;
            }
            return;
        };
        let config = machine.config();
        let tune = ConnectionTune {
            channel_max: config.channel_max,
            frame_max: config.frame_max,
            heartbeat: config.heartbeat,
        };
        if let Some(conn) = machine.conns.get_mut(&self.id) {
            conn.caps = capabilities;
            conn.user = user;
        }
        machine.send(self.id, 0, tune);
        self.phase = Phase::ExpectTuneOk;
    }

    fn tune_ok(&mut self, machine: &mut BrokerMachine, m: acemq_codec::ConnectionTuneOk, now: Instant) {
        let config = machine.config();
        let frame_ok = negotiated_ok(
            u64::from(m.frame_max),
            u64::from(config.frame_min),
            u64::from(config.frame_max),
        );
        let channel_ok = negotiated_ok(u64::from(m.channel_max), 1, u64::from(config.channel_max));
        if !frame_ok || !channel_ok {
            // RabbitMQ answers a refused tune-ok with no close at all: it
            // waits a few seconds and drops the socket.
            tracing::debug!(conn = self.id, ?m, "refused tune-ok");
            self.phase = Phase::Doomed;
            self.deadline = now.checked_add(config.close_timeout);
            return;
        }
        self.decoder.set_frame_max(m.frame_max);
        self.heartbeat = (m.heartbeat > 0).then(|| Duration::from_secs(u64::from(m.heartbeat)));
        if let Some(conn) = machine.conns.get_mut(&self.id) {
            conn.frame_max = m.frame_max;
            conn.channel_max = m.channel_max;
        }
        self.phase = Phase::ExpectOpen;
    }

    fn open(&mut self, machine: &mut BrokerMachine, m: acemq_codec::ConnectionOpen, now: Instant) {
        let vhost = m.virtual_host.to_string_lossy().into_owned();
        let Some(conn) = machine.conns.get(&self.id) else {
            return;
        };
        let user = conn.user.clone();
        let open_now = machine.conns.values().filter(|c| c.open && !c.dead).count();
        let error = if let Some(limit) = machine.config().max_connections.filter(|max| open_now >= *max) {
            Some(AmqpError::not_allowed(format!(
                "connection refused: node connection limit ({limit}) is reached"
            )))
        } else if !machine.vhosts.contains_key(&vhost) {
            Some(AmqpError::not_allowed(format!("vhost {vhost} not found")))
        } else {
            let allowed = machine
                .config()
                .users
                .iter()
                .find(|u| u.name == user)
                .is_some_and(|u| u.vhosts.as_ref().is_none_or(|v| v.contains(&vhost)));
            (!allowed).then(|| AmqpError::not_allowed(format!("access to vhost '{vhost}' refused for user '{user}'")))
        };
        if let Some(error) = error {
            let error = error.caused_by(&Method::ConnectionOpen(m));
            return self.connection_error(machine, error, now);
        }
        if let Some(conn) = machine.conns.get_mut(&self.id) {
            conn.open = true;
            conn.vhost = vhost.into();
        }
        machine.send(self.id, 0, ConnectionOpenOk::default());
        self.phase = Phase::Open;
        self.deadline = None;
        self.last_recv = now;
        self.last_send = now;
    }

    /// A frame once the connection is open: channel 0 is the connection's,
    /// every other channel's frames go by where that channel is in its
    /// lifecycle.
    #[inline(always)]
    fn open_frame(&mut self, machine: &mut BrokerMachine, frame: Frame, now: Instant) {
        let ch = frame.channel();
        if ch == 0 {
            return self.connection_frame(machine, frame, now);
        }
        let Some(conn) = machine.conns.get(&self.id) else {
            return;
        };
        match conn.channel(ch).map(|c| c.closing) {
            None => self.unopened_channel_frame(machine, ch, frame, now),
            Some(true) => self.closing_channel_frame(machine, ch, frame, now),
            Some(false) => self.channel_frame(machine, ch, frame, now),
        }
    }

    /// A frame on channel 0 of an open connection: its close handshake,
    /// `update-secret`; anything else closes the connection.
    fn connection_frame(&mut self, machine: &mut BrokerMachine, frame: Frame, now: Instant) {
        let error = match frame {
            Frame::Method(_, Method::ConnectionClose(_)) => {
                machine.send(self.id, 0, ConnectionCloseOk {});
                machine.release_conn(self.id, now);
                self.fate = Fate::Close;
                return;
            }
            Frame::Method(_, Method::ConnectionUpdateSecret(_)) => {
                // As RabbitMQ's internal (user name and password) backend:
                // RabbitMQ hands the secret only to backends whose
                // credentials expire (3.10: `state_can_expire`, 4.0: an
                // `expiry_timestamp` other than `never`), and the internal
                // one's never do, so any secret is accepted unchecked, for
                // any user, and the connection goes on as that user. The
                // next login still needs the user's password.
                machine.send(self.id, 0, ConnectionUpdateSecretOk {});
                return;
            }
            Frame::Method(_, Method::ConnectionCloseOk(_)) => return,
            Frame::Method(_, method) => {
                AmqpError::channel_error("unexpected method in connection state running").caused_by(&method)
            }
            other => AmqpError::new(
                ReplyCode::UnexpectedFrame,
                format!("expected method frame, got {} on channel 0", frame_kind(&other)),
            ),
        };
        self.connection_error(machine, error, now)
    }

    /// A frame on a channel that is not open: `channel.open` opens it, a
    /// late `close-ok` is dropped, anything else closes the connection.
    fn unopened_channel_frame(&mut self, machine: &mut BrokerMachine, ch: u16, frame: Frame, now: Instant) {
        match frame {
            Frame::Method(_, Method::ChannelOpen(_)) => self.open_channel(machine, ch, now),
            Frame::Method(_, Method::ChannelCloseOk(_)) => {}
            _ => {
                let error = AmqpError::channel_error("expected 'channel.open'");
                self.connection_error(machine, error, now);
            }
        }
    }

    /// `channel.open`: the machine refuses one past the negotiated
    /// `channel_max` open channels (530), as RabbitMQ counts them; the
    /// channel's number itself is not checked.
    fn open_channel(&mut self, machine: &mut BrokerMachine, ch: u16, now: Instant) {
        match machine.open_channel(self.id, ch) {
            Ok(()) => machine.send(self.id, ch, ChannelOpenOk::default()),
            Err(error) => self.connection_error(machine, error, now),
        }
    }

    /// A frame on a channel the broker closed: only the close handshake
    /// counts until the client's `close-ok`.
    fn closing_channel_frame(&mut self, machine: &mut BrokerMachine, ch: u16, frame: Frame, now: Instant) {
        match frame {
            Frame::Method(_, Method::ChannelCloseOk(_)) => machine.drop_channel(self.id, ch, now),
            Frame::Method(_, Method::ChannelClose(_)) => machine.send(self.id, ch, ChannelCloseOk {}),
            _ => {}
        }
    }

    /// A frame on an open channel: its close handshake, a frame of a
    /// publish, or a method for the broker. A refusal closes the channel or,
    /// if it is a hard error, the connection.
    #[inline(always)]
    fn channel_frame(&mut self, machine: &mut BrokerMachine, ch: u16, frame: Frame, now: Instant) {
        let result = match frame {
            Frame::Method(_, Method::ChannelClose(_)) => {
                machine.drop_channel(self.id, ch, now);
                machine.send(self.id, ch, ChannelCloseOk {});
                return;
            }
            Frame::Method(_, Method::ChannelCloseOk(_)) => return,
            Frame::Method(_, Method::BasicPublish(_))
            | Frame::Header(..)
            | Frame::UndecodableHeader(..)
            | Frame::Body(..) => self.content_frame(machine, ch, frame, now),
            Frame::Method(_, method) => self.method_frame(machine, ch, method, now),
            // Heartbeats are on channel 0.
            Frame::Heartbeat => Ok(()),
        };
        self.refuse_if_err(machine, ch, result, now);
    }

    /// A refusal closes the channel or, if it is a hard error, the
    /// connection.
    #[inline(always)]
    fn refuse_if_err(&mut self, machine: &mut BrokerMachine, ch: u16, result: Result<(), AmqpError>, now: Instant) {
        if let Err(error) = result {
            if error.is_hard() {
                self.connection_error(machine, error, now);
            } else {
                self.channel_error(machine, ch, error, now);
            }
        }
    }

    /// `basic.publish`, or a content header or body frame while no publish
    /// is in progress (which the assembler refuses): fed to the channel's
    /// [`acemq_codec::track::ContentAssembler`]. Starting a publish during a
    /// memory alarm blocks the connection.
    #[inline(always)]
    fn content_frame(
        &mut self,
        machine: &mut BrokerMachine,
        ch: u16,
        frame: Frame,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let starts_publish = matches!(frame, Frame::Method(..));
        let Some(channel) = machine.conns.get_mut(&self.id).and_then(|c| c.channel_mut(ch)) else {
            return Ok(());
        };
        match channel.assembler.push(frame) {
            Ok(Assembly::Complete(content)) => return self.publish_content(machine, ch, content, now),
            Ok(Assembly::Partial | Assembly::Method(_)) => {}
            Err(error) => return Err(refused_content(&error)),
        }
        if starts_publish && machine.alarm {
            self.block(machine);
        }
        Ok(())
    }

    /// A whole message from the channel's assembler, published.
    #[inline(always)]
    fn publish_content(
        &mut self,
        machine: &mut BrokerMachine,
        ch: u16,
        content: Content,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let Method::BasicPublish(publish) = content.method else {
            // Only `basic.publish` starts content here.
            return Ok(());
        };
        let header = match content.header {
            Ok(header) => Header::Decoded(header.properties),
            Err(raw) => Header::Raw(raw),
        };
        let publication = Publication {
            publish,
            header,
            body: content.body,
        };
        machine
            .publish(self.id, ch, publication, now)
            .map_err(|e| MethodIds(BasicPublish::CLASS_ID, BasicPublish::METHOD_ID).apply(e))
    }

    /// A method without content, for the broker; none may come between a
    /// publish and the end of its content.
    #[inline(always)]
    fn method_frame(
        &mut self,
        machine: &mut BrokerMachine,
        ch: u16,
        method: Method,
        now: Instant,
    ) -> Result<(), AmqpError> {
        let publishing = machine
            .conns
            .get(&self.id)
            .and_then(|c| c.channel(ch))
            .is_some_and(|c| c.assembler.in_progress());
        if publishing {
            return Err(refused_content(&ContentError::UnexpectedFrame {
                expected: "content header",
                got: "method",
            }));
        }
        let blame = MethodIds::of(&method);
        machine
            .channel_method(self.id, ch, method, now)
            .map_err(|e| blame.apply(e))
    }

    /// A memory alarm: reading stops, and a client that advertised
    /// `connection.blocked` is told why, once.
    fn block(&mut self, machine: &mut BrokerMachine) {
        self.blocked = true;
        let notify = machine.conns.get(&self.id).is_some_and(|c| c.caps.connection_blocked);
        if notify && !self.blocked_sent {
            self.blocked_sent = true;
            machine.send(
                self.id,
                0,
                ConnectionBlocked {
                    reason: BLOCKED_REASON.into(),
                },
            );
        }
    }

    /// A soft error: `channel.close`, and the channel ignores everything until `close-ok`.
    fn channel_error(&mut self, machine: &mut BrokerMachine, ch: u16, error: AmqpError, now: Instant) {
        tracing::debug!(conn = self.id, ch, text = %error.text, "channel error");
        machine.send(self.id, ch, error.close_method(ch));
        machine.release_channel(self.id, ch, now);
    }

    /// A hard error once open: `connection.close`, then wait for `close-ok`.
    fn connection_error(&mut self, machine: &mut BrokerMachine, error: AmqpError, now: Instant) {
        if self.phase != Phase::Open {
            return self.handshake_error(machine, error);
        }
        tracing::debug!(conn = self.id, text = %error.text, "connection error");
        machine.send(self.id, 0, error.close_method(0));
        machine.release_conn(self.id, now);
        self.phase = Phase::Closing;
        self.deadline = now.checked_add(machine.config().close_timeout);
    }

    /// An error before the connection is open: `connection.close`, then the socket goes.
    /// A handshake error RabbitMQ does not answer: nothing more is read,
    /// and the socket is dropped after `close_timeout`.
    fn silent_close(&mut self, machine: &mut BrokerMachine, error: AmqpError, now: Instant) {
        tracing::debug!(conn = self.id, text = %error.text, "handshake error, closing silently");
        self.phase = Phase::Doomed;
        self.deadline = now.checked_add(machine.config().close_timeout);
    }

    fn handshake_error(&mut self, machine: &mut BrokerMachine, error: AmqpError) {
        tracing::debug!(conn = self.id, text = %error.text, "handshake error");
        machine.send(self.id, 0, error.close_method(0));
        self.fate = Fate::Close;
    }
}

/// A frame that broke the content sequence of a publish, refused as
/// RabbitMQ words it and blamed on `basic.publish`.
fn refused_content(error: &ContentError) -> AmqpError {
    let detail = match error {
        ContentError::UnexpectedFrame { got: "method", .. } => {
            "expected content header for class 60, got non content header frame instead".to_owned()
        }
        ContentError::UnexpectedFrame { expected, got } => {
            format!("expected {expected} frame, got {got} frame instead")
        }
        ContentError::TooLarge { body_size, max } => {
            format!("message size {body_size} is larger than configured max size {max}")
        }
        ContentError::BodyOverrun { body_size, received } => {
            format!("content body of {received} bytes exceeds the announced {body_size}")
        }
        // The class mismatch, in the assembler's words, which are RabbitMQ's.
        other => other.to_string(),
    };
    MethodIds(BasicPublish::CLASS_ID, BasicPublish::METHOD_ID).apply(AmqpError::new(error.reply_code(), detail))
}

/// The class and method a reply blames.
struct MethodIds(u16, u16);

impl MethodIds {
    fn of(method: &Method) -> Self {
        MethodIds(method.class_id(), method.method_id())
    }

    fn apply(&self, mut error: AmqpError) -> AmqpError {
        if error.class_id == 0 {
            error.class_id = self.0;
            error.method_id = self.1;
        }
        error
    }
}

/// RabbitMQ's `validate_negotiated_integer_value`.
fn negotiated_ok(client: u64, min: u64, server: u64) -> bool {
    if client != 0 && client < min {
        return false;
    }
    !(server != 0 && (client == 0 || client > server))
}

fn frame_kind(frame: &Frame) -> &'static str {
    match frame {
        Frame::Method(..) => "method",
        Frame::Header(..) | Frame::UndecodableHeader(..) => "content header",
        Frame::Body(..) => "content body",
        Frame::Heartbeat => "heartbeat",
    }
}

fn unexpected(frame: &Frame, expected: &str) -> AmqpError {
    match frame {
        Frame::Method(_, m) => AmqpError::command_invalid(format!("expected '{expected}', got '{}'", m.name())),
        other => AmqpError::new(
            ReplyCode::UnexpectedFrame,
            format!("expected '{expected}', got a {} frame", frame_kind(other)),
        ),
    }
}

/// PLAIN: `authzid NUL user NUL password`.
fn plain_credentials(response: &[u8]) -> Option<(String, String)> {
    let mut parts = response.split(|b| *b == 0);
    let _authzid = parts.next()?;
    let user = parts.next()?;
    let password = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    Some((
        String::from_utf8(user.to_vec()).ok()?,
        String::from_utf8(password.to_vec()).ok()?,
    ))
}

/// AMQPLAIN: a field table without its length prefix, with `LOGIN` and `PASSWORD`.
fn amqplain_credentials(response: &[u8]) -> Option<(String, String)> {
    let table = acemq_codec::sasl::decode_amqplain(response, 8).ok()?;
    let text = |key: &str| match table.get(key)? {
        FieldValue::LongString(s) => s.as_str().map(str::to_owned),
        _ => None,
    };
    Some((text("LOGIN")?, text("PASSWORD")?))
}
