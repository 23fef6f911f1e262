//! The entry point of the `connection` fuzz target
//! (`fuzz/fuzz_targets/connection.rs`): the client connection machine
//! ([`Connection`]) between a scripted application and a scripted broker.
//! Compiled only for fuzzing (`--cfg fuzzing`, which cargo-fuzz passes) and
//! for this crate's tests, which replay the committed corpus through the
//! same code on stable (`crate::fuzzing`'s `corpus_tests`). Not part of the
//! API: it changes with the target, and nothing in the engine may call it.
//!
//! An input is a three-byte header (`Setup`) and a script. The header picks
//! what the broker's `connection.tune` offers and the client asks for, how
//! far the handshake goes, how the client logs in, and how the broker's bytes
//! are cut into reads. Each script step is an opcode byte (`Op`) and its
//! operands: broker frames (built with acemq-codec's encoders, some broken on
//! purpose, or bytes taken straight from the input), application commands
//! (`open_channel`, calls, publishes, acks, `close`) and the driver's inputs
//! (time passing, end of file). The broker answers the client's calls as
//! RabbitMQ would when told to, so channels are open, consuming and in
//! confirm mode when the garbage arrives.
//!
//! After every read and every step the harness drains the machine and panics,
//! which is the finding, when it misbehaves: a panic of its own; output or
//! events out of proportion to what went in; more than one frame of unparsed
//! input kept in the read buffer; bytes written that are not whole frames
//! within the negotiated `frame_max`; a deadline that has already passed; a
//! reply, confirm or channel close that answers nothing; events after
//! `Closed`; a connection that ends with a call unanswered. What the broker
//! sends is never trusted, so a broken input is not a finding in itself.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use acemq_codec::PublishEncoder;
use acemq_codec::{
    encode_body, encode_content, encode_method, BasicAck, BasicCancel, BasicCancelOk, BasicConsume, BasicConsumeOk,
    BasicDeliver, BasicGet, BasicGetEmpty, BasicGetOk, BasicNack, BasicProperties, BasicPublish, BasicQos, BasicQosOk,
    BasicRecover, BasicRecoverAsync, BasicRecoverOk, BasicReject, BasicReturn, ChannelClose, ChannelCloseOk,
    ChannelFlow, ChannelFlowOk, ChannelOpen, ChannelOpenOk, ConfirmSelect, ConfirmSelectOk, ConnectionBlocked,
    ConnectionClose, ConnectionCloseOk, ConnectionOpenOk, ConnectionSecure, ConnectionStart, ConnectionTune,
    ConnectionUnblocked, ConnectionUpdateSecret, ConnectionUpdateSecretOk, ContentHeader, ExchangeDeclare,
    ExchangeDeclareOk, FieldTable, FieldValue, Frame, FrameDecoder, Method, QueueBind, QueueBindOk, QueueDeclare,
    QueueDeclareOk, ShortString, TxCommit, TxCommitOk, TxRollbackOk, TxSelect, TxSelectOk, DEFAULT_FRAME_MAX,
    FRAME_MIN_SIZE, FRAME_OVERHEAD, PROTOCOL_HEADER,
};
use bytes::{Buf, BytesMut};

use super::{return_key, Auth, CommandError, Connection, ConnectionParams, Event, Reply, Secret, Token, TuneRequest};

/// What the machine may write in one step beyond what the step itself
/// accounts for: a `connection.close` with a 255-byte text, a heartbeat.
const SLACK: usize = 512;

/// Feeds `data` to a client connection as described in the module docs.
/// Panics only when the machine breaks one of the rules listed there.
pub fn client_connection(data: &[u8]) {
    let mut input = Reader(data);
    let setup = Setup::parse([input.byte(), input.byte(), input.byte()]);
    let mut harness = Harness::new(&setup);
    harness.handshake(&setup);
    while !input.is_empty() {
        let op = Op::from_byte(input.byte());
        harness.step(op, &mut input);
        if setup.auto_answer {
            harness.answer(64);
        }
    }
    harness.end();
}

/// The committed seeds of the `connection` target, by file name: each a
/// header and a script. `crate::fuzzing`'s `corpus_tests` checks that
/// `fuzz/corpus/connection/` holds these (and writes them).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    seeds::all()
}

/// Publishes one message the one way a publish enters the machine, as the
/// driver does it: its frames encoded by `encoder` (a [`PublishEncoder`],
/// as the command queue encodes them) for the connection's `frame_max`, then
/// taken with [`Connection::encoded_publishes`], matched to its return when
/// it is mandatory. Returns its confirm sequence number when the channel is
/// in confirm mode; on an error (encoding, or a refusal) nothing is written.
/// For this harness and the machine's unit tests.
pub(crate) fn publish_encoded(
    conn: &mut Connection,
    encoder: &mut PublishEncoder,
    channel: u16,
    publish: &BasicPublish,
    properties: &BasicProperties,
    body: &[u8],
) -> Result<Option<u64>, CommandError> {
    let frame_max = conn.tuned().map_or(FRAME_MIN_SIZE, |t| t.frame_max);
    let mut frames = BytesMut::new();
    encoder.encode(channel, publish, properties, body, frame_max, &mut frames)?;
    let len = frames.len();
    let seq = conn
        .encoded_publishes(&mut frames, 0)
        .publish(channel, len, return_key(publish, properties));
    seq
}

// ---------------------------------------------------------------- the input

/// The input after the header: bytes taken from the front, zeros once it
/// runs out (so a script cut short still runs).
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

/// What the three header bytes choose. Index 0 of every table is what a
/// client meets against RabbitMQ with default settings.
///
/// - byte 0: bits 0-1 the broker's heartbeat, bits 2-4 its `frame_max`,
///   bits 5-6 its `channel_max`, bit 7 whether the broker answers every call
///   at once after each step (otherwise only at `Op::Answer`);
/// - byte 1: bits 0-1 the handshake (full; none; start only; start and tune),
///   bits 2-4 the size of the reads the broker's bytes arrive in, bits 5-6
///   the client's mechanism, bit 7 whether the broker offers EXTERNAL;
/// - byte 2: the client's `tune-ok` wishes: bits 0-1 heartbeat, bits 2-3
///   `frame_max`, bits 4-5 `channel_max`.
#[derive(Debug)]
struct Setup {
    tune: ConnectionTune,
    auto_answer: bool,
    handshake: Handshake,
    read_size: usize,
    params: ConnectionParams,
    mechanisms: &'static str,
}

const HEARTBEATS: [u16; 4] = [60, 0, 1, 4];
const FRAME_MAXES: [u32; 8] = [131_072, 0, 1, 9, 4096, 8192, 10_000, 65_536];
const CHANNEL_MAXES: [u16; 4] = [2047, 0, 1, 3];
const READ_SIZES: [usize; 8] = [usize::MAX, 1, 2, 3, 7, 8, 64, 4096];
const WANTED_HEARTBEATS: [u16; 4] = [60, 0, 1, 10];
const WANTED_FRAME_MAXES: [u32; 4] = [131_072, 0, 4096, 1 << 20];
const WANTED_CHANNEL_MAXES: [u16; 4] = [2047, 0, 1, u16::MAX];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handshake {
    /// start, tune and open-ok.
    Full,
    /// Nothing: the script starts at `ExpectStart`.
    None,
    /// start only: the script starts at `ExpectTune`.
    Start,
    /// start and tune: the script starts at `ExpectOpenOk`.
    StartTune,
}

impl Setup {
    fn parse([tune, setup, wanted]: [u8; 3]) -> Self {
        let pick = |byte: u8, shift: u32, mask: u8| usize::from((byte >> shift) & mask);
        let auth = match pick(setup, 5, 3) {
            0 | 3 => Auth::plain("guest", "guest"),
            1 => Auth::AmqPlain {
                username: "guest".into(),
                password: Secret::new("guest"),
            },
            _ => Auth::External,
        };
        Setup {
            tune: ConnectionTune {
                heartbeat: HEARTBEATS[pick(tune, 0, 3)],
                frame_max: FRAME_MAXES[pick(tune, 2, 7)],
                channel_max: CHANNEL_MAXES[pick(tune, 5, 3)],
            },
            auto_answer: tune & 0x80 != 0,
            handshake: [Handshake::Full, Handshake::None, Handshake::Start, Handshake::StartTune][pick(setup, 0, 3)],
            read_size: READ_SIZES[pick(setup, 2, 7)],
            params: ConnectionParams {
                auth,
                vhost: "/".into(),
                tune: TuneRequest {
                    heartbeat: WANTED_HEARTBEATS[pick(wanted, 0, 3)],
                    frame_max: WANTED_FRAME_MAXES[pick(wanted, 2, 3)],
                    channel_max: WANTED_CHANNEL_MAXES[pick(wanted, 4, 3)],
                },
                connection_name: (pick(setup, 5, 3) == 3).then(|| "fuzz".into()),
                ..ConnectionParams::default()
            },
            mechanisms: if setup & 0x80 != 0 {
                "PLAIN AMQPLAIN EXTERNAL"
            } else {
                "AMQPLAIN PLAIN"
            },
        }
    }
}

/// One script step. The opcode byte is taken modulo the number of ops; the
/// operands each op reads are listed with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Op {
    // ---- the broker
    /// `n`, then `n` bytes sent as they are.
    Raw,
    /// Everything left in the input, sent as it is.
    RawRest,
    /// A heartbeat frame.
    Heartbeat,
    /// `n`: the broker's next `1 + n % 4` answers to the client's calls.
    Answer,
    /// `channel, tag, size`: a `basic.deliver` with a body of `body_size(size)` bytes.
    Deliver,
    /// `channel, tag, flags`: a `basic.ack` (flags bit 1: `basic.nack`;
    /// bit 0: multiple) of a tag chosen from what the client published.
    Confirm,
    /// `channel, pick, flags`: a `basic.return` of one of the client's recent
    /// publishes (flags bit 0: another routing key, bit 1: no message id).
    Return,
    /// `channel, tag, size`: a `basic.get-ok` with its message.
    GetOk,
    /// `channel, code`: the broker closes a channel (instead of answering
    /// what it asked).
    ChannelClose,
    /// `code`: the broker closes the connection (and answers nothing more).
    ConnectionClose,
    /// `flags`: `connection.blocked` (bit 0 clear) or `unblocked`.
    Blocked,
    /// `channel, flags`: `channel.flow`.
    Flow,
    /// `channel, flags`: the broker cancels consumer "c".
    Cancel,
    /// `channel, which`: a reply method, whether or not anything waits for it.
    StrayReply,
    /// `which`: a method on channel 0 (a second start, a tune, a secure, ...).
    ConnectionMethod,
    /// `kind, channel, n`: a frame broken on purpose (see `Harness::mangled`).
    Mangled,
    // ---- the application
    /// `connection.open_channel()`.
    OpenChannel,
    /// `channel, which, flags`: `connection.call(channel, method)`.
    Call,
    /// `channel, flags, size`: a publish with a body of `body_size(size)` bytes
    /// (flags bit 0: mandatory, bit 1: to exchange "x", bit 2: routing key
    /// "none", bit 3: no message id).
    Publish,
    /// `channel, kind, n`: an ack, nack or reject of a delivery.
    Settle,
    /// `connection.close()`.
    Close,
    // ---- the driver
    /// `t`: time passes (see `Harness::step`), then `handle_timeout`.
    Advance,
    /// The clock jumps to `poll_timeout()` (an hour if none), then `handle_timeout`.
    AdvanceToDeadline,
    /// `handle_eof`: the socket closed.
    Eof,
}

impl Op {
    const ALL: [Op; 24] = [
        Op::Raw,
        Op::RawRest,
        Op::Heartbeat,
        Op::Answer,
        Op::Deliver,
        Op::Confirm,
        Op::Return,
        Op::GetOk,
        Op::ChannelClose,
        Op::ConnectionClose,
        Op::Blocked,
        Op::Flow,
        Op::Cancel,
        Op::StrayReply,
        Op::ConnectionMethod,
        Op::Mangled,
        Op::OpenChannel,
        Op::Call,
        Op::Publish,
        Op::Settle,
        Op::Close,
        Op::Advance,
        Op::AdvanceToDeadline,
        Op::Eof,
    ];

    fn from_byte(b: u8) -> Op {
        Op::ALL[usize::from(b) % Op::ALL.len()]
    }
}

// The seeds write `op as u8`; the harness reads `Op::ALL[byte]`.
const _: () = {
    let mut i = 0;
    while i < Op::ALL.len() {
        assert!(Op::ALL[i] as usize == i, "Op::ALL is in declaration order");
        i += 1;
    }
};

/// A channel number named by one byte: mostly one of the four the
/// application opens first, sometimes an edge.
fn channel_of(b: u8) -> u16 {
    const EDGES: [u16; 8] = [0, 5, 63, 64, 2047, 2048, 65_534, 65_535];
    if b >= 0xF8 {
        EDGES[usize::from(b & 7)]
    } else {
        1 + u16::from(b % 4)
    }
}

/// A body size named by one byte: below 128 that many bytes, above up to
/// 17 KB, across every `frame_max`.
fn body_size(b: u8) -> usize {
    match b {
        0..=127 => usize::from(b),
        _ => usize::from(b - 127) * 135,
    }
}

fn encoded(channel: u16, method: impl Into<Method>) -> BytesMut {
    let mut out = BytesMut::new();
    encode_method(channel, &method.into(), &mut out).expect("the broker's methods encode");
    out
}

// ---------------------------------------------------------------- the harness

struct Harness {
    conn: Connection,
    now: Instant,
    read_size: usize,
    /// What `handle_input` is handed: bytes of the broker not yet parsed.
    read_buf: BytesMut,
    /// Encodes the application's publishes, keeping frames from one to the
    /// next as a channel's command queue does.
    encoder: PublishEncoder,
    broker: Broker,
    app: App,
}

impl Harness {
    fn new(setup: &Setup) -> Self {
        let now = Instant::now();
        Harness {
            conn: Connection::new(setup.params.clone(), now),
            now,
            read_size: setup.read_size,
            read_buf: BytesMut::new(),
            encoder: PublishEncoder::new(),
            broker: Broker::new(setup.tune.clone()),
            app: App::default(),
        }
    }

    fn handshake(&mut self, setup: &Setup) {
        self.drain(SLACK, 0, "Connection::new");
        if setup.handshake == Handshake::None {
            return;
        }
        let mut server_properties = FieldTable::new();
        server_properties.insert("product", FieldValue::from("RabbitMQ"));
        let start = ConnectionStart {
            version_major: 0,
            version_minor: 9,
            server_properties,
            mechanisms: setup.mechanisms.into(),
            locales: "en_US".into(),
        };
        self.feed(&encoded(0, start));
        if setup.handshake == Handshake::Start {
            return;
        }
        self.answer(1);
        if setup.handshake == Handshake::StartTune {
            return;
        }
        self.answer(1);
        let offered = setup
            .mechanisms
            .split_whitespace()
            .any(|m| m == setup.params.auth.mechanism());
        let usable = self.conn.tuned().is_some_and(|t| t.frame_max >= FRAME_MIN_SIZE);
        if offered && usable {
            assert!(self.app.opened, "a valid handshake did not open the connection");
        }
    }

    /// Hands `bytes` to the machine in reads of `read_size`, as a socket would.
    fn feed(&mut self, bytes: &[u8]) {
        for part in bytes.chunks(self.read_size) {
            if self.conn.is_closed() {
                // A driver stops reading once the machine is closed.
                self.broker.answers.clear();
                return;
            }
            let before = self.read_buf.len() + part.len();
            self.read_buf.extend_from_slice(part);
            self.conn.handle_input(&mut self.read_buf, self.now);
            let consumed = before - self.read_buf.len();
            if !self.conn.is_closed() {
                let frame_max = self.conn.tuned().map_or(DEFAULT_FRAME_MAX, |t| t.frame_max);
                assert!(
                    self.read_buf.len() <= frame_max as usize + FRAME_OVERHEAD,
                    "handle_input left {} bytes unparsed with frame_max {frame_max}",
                    self.read_buf.len()
                );
            }
            // Nothing answers more than it was sent, beyond one close; an
            // event that resolves nothing takes at least one frame.
            self.drain(consumed + SLACK, 1 + consumed / FRAME_OVERHEAD, "a read");
        }
    }

    /// Sends the broker's next `n` answers to what the client wrote.
    fn answer(&mut self, n: usize) {
        for _ in 0..n {
            let Some((_, bytes)) = self.broker.answers.pop_front() else {
                return;
            };
            self.feed(&bytes);
        }
    }

    /// Takes every event and every byte written, and checks them.
    fn drain(&mut self, write_allowance: usize, free_events: usize, what: &str) {
        let mut free = 0;
        while let Some(event) = self.conn.poll_event() {
            free += usize::from(self.app.on_event(event));
        }
        assert!(
            free <= free_events,
            "{what}: {free} events that answer nothing, at most {free_events} expected"
        );
        assert_eq!(
            self.conn.is_closed(),
            self.app.closed,
            "{what}: is_closed() and the Closed event disagree"
        );
        let mut written = BytesMut::new();
        self.conn.poll_transmit(&mut written, self.now);
        assert!(
            written.len() <= write_allowance,
            "{what}: the client wrote {} bytes, at most {write_allowance} expected",
            written.len()
        );
        self.broker.read(&written);
        if let Some(deadline) = self.conn.poll_timeout() {
            assert!(
                deadline > self.now,
                "{what}: poll_timeout() is {:?} in the past after handling",
                self.now - deadline
            );
        }
        for (&channel, seqs) in &self.app.outstanding {
            assert_eq!(
                self.conn.unconfirmed(channel),
                seqs.len(),
                "{what}: unconfirmed({channel}) disagrees with the confirms seen"
            );
        }
    }

    /// What a step may write when every channel may have something to say
    /// (a held ack before a close, a `channel.close` when a wait times out).
    fn per_channel_allowance(&self) -> usize {
        SLACK + 64 * self.app.live.len()
    }

    /// The frame_max the broker encodes content with.
    fn broker_frame_max(&self) -> u32 {
        self.conn
            .tuned()
            .map_or(FRAME_MIN_SIZE, |t| t.frame_max)
            .max(FRAME_MIN_SIZE)
    }

    fn step(&mut self, op: Op, r: &mut Reader) {
        match op {
            Op::Raw => {
                let n = usize::from(r.byte());
                self.feed(r.take(n));
            }
            Op::RawRest => self.feed(r.rest()),
            Op::Heartbeat => {
                let mut out = BytesMut::new();
                Frame::Heartbeat.encode(&mut out).expect("a heartbeat encodes");
                self.feed(&out);
            }
            Op::Answer => {
                let n = 1 + usize::from(r.byte() % 4);
                self.answer(n);
            }
            Op::Deliver | Op::GetOk => {
                let channel = channel_of(r.byte());
                let tag = self.broker.next_tag(channel, r.byte());
                let body = vec![b'd'; body_size(r.byte())];
                let method: Method = if op == Op::Deliver {
                    BasicDeliver {
                        consumer_tag: "c".into(),
                        delivery_tag: tag,
                        redelivered: tag.is_multiple_of(3),
                        exchange: "".into(),
                        routing_key: "q".into(),
                    }
                    .into()
                } else {
                    BasicGetOk {
                        delivery_tag: tag,
                        redelivered: false,
                        exchange: "".into(),
                        routing_key: "q".into(),
                        message_count: 0,
                    }
                    .into()
                };
                let mut out = BytesMut::new();
                let properties = BasicProperties {
                    message_id: Some("d".into()),
                    ..Default::default()
                };
                encode_content(channel, &method, &properties, &body, self.broker_frame_max(), &mut out)
                    .expect("a delivery encodes");
                self.feed(&out);
            }
            Op::Confirm => {
                let channel = channel_of(r.byte());
                let pick = r.byte();
                let flags = r.byte();
                let tag = self.app.confirm_tag(channel, pick);
                let multiple = flags & 1 != 0;
                let out = if flags & 2 == 0 {
                    encoded(
                        channel,
                        BasicAck {
                            delivery_tag: tag,
                            multiple,
                        },
                    )
                } else {
                    encoded(
                        channel,
                        BasicNack {
                            delivery_tag: tag,
                            multiple,
                            requeue: false,
                        },
                    )
                };
                self.feed(&out);
            }
            Op::Return => {
                let channel = channel_of(r.byte());
                let pick = usize::from(r.byte());
                let flags = r.byte();
                let (exchange, routing_key, message_id) = self
                    .app
                    .recent
                    .get(&channel)
                    .filter(|recent| !recent.is_empty())
                    .map(|recent| recent[pick % recent.len()].clone())
                    .unwrap_or_else(|| ("".into(), "none".into(), None));
                let ret = BasicReturn {
                    reply_code: 312,
                    reply_text: "NO_ROUTE".into(),
                    exchange,
                    routing_key: if flags & 1 != 0 { "other".into() } else { routing_key },
                };
                let properties = BasicProperties {
                    message_id: message_id.filter(|_| flags & 2 == 0),
                    ..Default::default()
                };
                let mut out = BytesMut::new();
                encode_content(
                    channel,
                    &ret.into(),
                    &properties,
                    b"r",
                    self.broker_frame_max(),
                    &mut out,
                )
                .expect("a return encodes");
                self.feed(&out);
            }
            Op::ChannelClose => {
                let channel = channel_of(r.byte());
                const CODES: [u16; 8] = [404, 406, 403, 405, 320, 541, 200, 0];
                let close = ChannelClose {
                    reply_code: CODES[usize::from(r.byte() % 8)],
                    reply_text: "NOT_FOUND - no queue 'q' in vhost '/'".into(),
                    class_id: 50,
                    method_id: 10,
                };
                // The close is the broker's answer to what the channel asked.
                self.broker.answers.retain(|(on, _)| *on != channel);
                self.feed(&encoded(channel, close));
            }
            Op::ConnectionClose => {
                const CODES: [u16; 6] = [320, 541, 501, 403, 200, 0];
                let close = ConnectionClose {
                    reply_code: CODES[usize::from(r.byte()) % CODES.len()],
                    reply_text: "CONNECTION_FORCED - broker forced connection closure".into(),
                    class_id: 0,
                    method_id: 0,
                };
                self.broker.answers.clear();
                self.feed(&encoded(0, close));
            }
            Op::Blocked => {
                let out = if r.byte() & 1 == 0 {
                    encoded(
                        0,
                        ConnectionBlocked {
                            reason: "low on memory".into(),
                        },
                    )
                } else {
                    encoded(0, ConnectionUnblocked {})
                };
                self.feed(&out);
            }
            Op::Flow => {
                let channel = channel_of(r.byte());
                let active = r.byte() & 1 != 0;
                self.feed(&encoded(channel, ChannelFlow { active }));
            }
            Op::Cancel => {
                let channel = channel_of(r.byte());
                let no_wait = r.byte() & 1 != 0;
                let cancel = BasicCancel {
                    consumer_tag: "c".into(),
                    no_wait,
                };
                self.feed(&encoded(channel, cancel));
            }
            Op::StrayReply => {
                let channel = channel_of(r.byte());
                let reply: Method = match r.byte() % 14 {
                    0 => ChannelOpenOk::default().into(),
                    1 => ChannelCloseOk {}.into(),
                    2 => ChannelFlowOk { active: true }.into(),
                    3 => BasicQosOk {}.into(),
                    4 => BasicConsumeOk {
                        consumer_tag: "c".into(),
                    }
                    .into(),
                    5 => BasicCancelOk {
                        consumer_tag: "c".into(),
                    }
                    .into(),
                    6 => ConfirmSelectOk {}.into(),
                    7 => BasicGetEmpty::default().into(),
                    8 => QueueDeclareOk {
                        queue: "q".into(),
                        message_count: 0,
                        consumer_count: 0,
                    }
                    .into(),
                    9 => TxSelectOk {}.into(),
                    10 => BasicRecoverOk {}.into(),
                    11 => ExchangeDeclareOk {}.into(),
                    // Methods only a client sends.
                    12 => ChannelOpen::default().into(),
                    _ => BasicQos::default().into(),
                };
                self.feed(&encoded(channel, reply));
            }
            Op::ConnectionMethod => {
                let start = |major, mechanisms: &str| ConnectionStart {
                    version_major: major,
                    version_minor: 9,
                    server_properties: FieldTable::new(),
                    mechanisms: mechanisms.into(),
                    locales: "en_US".into(),
                };
                let method: Method = match r.byte() % 10 {
                    0 => start(0, "PLAIN AMQPLAIN").into(),
                    1 => start(8, "PLAIN").into(),
                    2 => start(0, "").into(),
                    3 => self.broker.tune.clone().into(),
                    4 => ConnectionOpenOk::default().into(),
                    5 => ConnectionSecure {
                        challenge: b"challenge".as_slice().into(),
                    }
                    .into(),
                    6 => ConnectionUpdateSecretOk {}.into(),
                    7 => ConnectionCloseOk {}.into(),
                    8 => ConnectionUpdateSecret {
                        new_secret: b"secret".as_slice().into(),
                        reason: "refresh".into(),
                    }
                    .into(),
                    _ => ChannelOpenOk::default().into(),
                };
                self.feed(&encoded(0, method));
            }
            Op::Mangled => {
                let kind = r.byte();
                let channel = channel_of(r.byte());
                let n = r.byte();
                let out = self.mangled(kind, channel, n);
                self.feed(&out);
            }
            Op::OpenChannel => {
                let was_open = self.conn.is_open();
                if let Ok((channel, token)) = self.conn.open_channel() {
                    assert!(was_open, "open_channel succeeded on a connection that is not open");
                    self.app.issued(token);
                    assert!(
                        self.app.live.insert(channel),
                        "open_channel handed out channel {channel}, which is open"
                    );
                }
                self.drain(SLACK, 0, "open_channel");
            }
            Op::Call => {
                let channel = channel_of(r.byte());
                let which = r.byte();
                let flags = r.byte();
                self.call(channel, which, flags);
            }
            Op::Publish => {
                let channel = channel_of(r.byte());
                let flags = r.byte();
                let size = body_size(r.byte());
                self.publish(channel, flags, size);
            }
            Op::Settle => {
                let channel = channel_of(r.byte());
                let kind = r.byte();
                let n = u64::from(r.byte());
                let delivered = self.app.delivered.get(&channel).copied().unwrap_or(0);
                let tag = if kind & 8 == 0 {
                    delivered.saturating_sub(n % 8)
                } else {
                    delivered.saturating_add(1 + n)
                };
                let method: Method = match kind % 5 {
                    0 | 1 => BasicAck {
                        delivery_tag: tag,
                        multiple: kind % 5 == 1,
                    }
                    .into(),
                    2 | 3 => BasicNack {
                        delivery_tag: tag,
                        multiple: kind % 5 == 3,
                        requeue: kind & 16 != 0,
                    }
                    .into(),
                    _ => BasicReject {
                        delivery_tag: tag,
                        requeue: kind & 16 != 0,
                    }
                    .into(),
                };
                let was_open = self.conn.is_open();
                let result = self.conn.call(channel, method);
                assert!(
                    was_open || result.is_err(),
                    "a settle succeeded on a connection that is not open"
                );
                if let Ok(token) = result {
                    assert_eq!(token, None, "a settle waits for no reply");
                }
                self.drain(SLACK, 0, "a settle");
            }
            Op::Close => {
                self.conn.close();
                self.drain(self.per_channel_allowance(), 1, "close");
            }
            Op::Advance => {
                let t = r.byte();
                let n = u64::from(t & 63);
                self.now += match t >> 6 {
                    0 => Duration::from_millis(10 * n),
                    1 => Duration::from_millis(250 * n),
                    2 => Duration::from_secs(n),
                    _ => Duration::from_secs(60 * n),
                };
                self.conn.handle_timeout(self.now);
                self.drain(self.per_channel_allowance(), 1, "handle_timeout");
            }
            Op::AdvanceToDeadline => {
                self.now = self.conn.poll_timeout().unwrap_or(self.now + Duration::from_secs(3600));
                self.conn.handle_timeout(self.now);
                self.drain(self.per_channel_allowance(), 1, "handle_timeout at the deadline");
            }
            Op::Eof => {
                self.conn.handle_eof();
                self.drain(SLACK, 1, "handle_eof");
            }
        }
    }

    /// A frame broken on purpose, or in the wrong place:
    /// 0 bad frame end; 1 unknown frame type; 2 a body frame whose size
    /// field says one byte more than `frame_max` allows (the size alone must
    /// refuse it), or with `n` >= 128 exactly `frame_max` (it must wait for
    /// the rest, holding no more than one frame);
    /// 3 a delivery cut after `n` bytes (what follows is read as its rest);
    /// 4 a content header on channel 0; 5 a header without a method;
    /// 6 a body without a header; 7 a header announcing 2^64-1 bytes;
    /// 8 a header of class 50; 9 more body than the header announced.
    fn mangled(&self, kind: u8, channel: u16, n: u8) -> BytesMut {
        let deliver = || BasicDeliver {
            consumer_tag: "c".into(),
            delivery_tag: 1,
            redelivered: false,
            exchange: "".into(),
            routing_key: "q".into(),
        };
        let mut out = BytesMut::new();
        let frame = |frame: Frame, out: &mut BytesMut| frame.encode(out).expect("the frame encodes");
        match kind % 10 {
            0 => {
                out = encoded(
                    channel,
                    BasicAck {
                        delivery_tag: 1,
                        multiple: false,
                    },
                );
                let last = out.len() - 1;
                out[last] = n;
                if n == acemq_codec::FRAME_END {
                    out[last] = 0;
                }
            }
            1 => {
                frame(Frame::Heartbeat, &mut out);
                // 4 is the old oob-method type; above 8, nothing.
                out[0] = [0, 4, 5, 6, 7, 9, 0x41, 0xFF][usize::from(n % 8)];
            }
            2 => {
                let frame_max = self.conn.tuned().map_or(DEFAULT_FRAME_MAX, |t| t.frame_max);
                let total = if n >= 128 {
                    frame_max
                } else {
                    frame_max.saturating_add(1)
                };
                encode_body(channel, &vec![0; usize::from(n % 128)], &mut out).expect("a body encodes");
                // The frame as encoded, its size field overstated.
                let size = total.saturating_sub(FRAME_OVERHEAD as u32);
                out[3..7].copy_from_slice(&size.to_be_bytes());
            }
            3 => {
                let properties = BasicProperties::default();
                encode_content(channel, &deliver().into(), &properties, b"hello", 0, &mut out)
                    .expect("a delivery encodes");
                out.truncate(usize::from(n) % out.len());
            }
            4 => frame(
                Frame::Header(0, ContentHeader::basic(0, BasicProperties::default())),
                &mut out,
            ),
            5 => {
                frame(
                    Frame::Header(channel, ContentHeader::basic(1, BasicProperties::default())),
                    &mut out,
                );
                frame(Frame::Body(channel, "x".into()), &mut out);
            }
            6 => {
                frame(Frame::Method(channel, deliver().into()), &mut out);
                frame(Frame::Body(channel, "x".into()), &mut out);
            }
            7..=9 => {
                let mut header = ContentHeader::basic(1, BasicProperties::default());
                match kind % 10 {
                    7 => header.body_size = u64::MAX,
                    8 => header.class_id = 50,
                    _ => {}
                }
                frame(Frame::Method(channel, deliver().into()), &mut out);
                frame(Frame::Header(channel, header), &mut out);
                frame(
                    Frame::Body(channel, vec![b'x'; 1 + usize::from(n % 4)].into()),
                    &mut out,
                );
            }
            _ => unreachable!("kind % 10"),
        }
        out
    }

    fn call(&mut self, channel: u16, which: u8, flags: u8) {
        let bit = |i: u32| flags & (1 << i) != 0;
        let method: Method = match which % 16 {
            0 => ConfirmSelect { no_wait: bit(0) }.into(),
            1 => BasicQos {
                prefetch_count: u16::from(flags),
                ..Default::default()
            }
            .into(),
            2 => BasicConsume {
                queue: "q".into(),
                consumer_tag: if bit(2) { "".into() } else { "c".into() },
                no_ack: bit(0),
                no_wait: bit(1),
                ..Default::default()
            }
            .into(),
            3 => ChannelClose {
                reply_code: 200,
                reply_text: "bye".into(),
                class_id: 0,
                method_id: 0,
            }
            .into(),
            4 => QueueDeclare {
                queue: "q".into(),
                no_wait: bit(0),
                ..Default::default()
            }
            .into(),
            5 => BasicGet {
                queue: "q".into(),
                no_ack: bit(0),
                ..Default::default()
            }
            .into(),
            6 => ChannelFlow { active: bit(0) }.into(),
            7 => BasicCancel {
                consumer_tag: "c".into(),
                no_wait: bit(0),
            }
            .into(),
            8 => TxSelect {}.into(),
            9 => TxCommit {}.into(),
            10 => BasicRecover { requeue: bit(0) }.into(),
            11 => BasicRecoverAsync { requeue: bit(0) }.into(),
            12 => ExchangeDeclare {
                exchange: "x".into(),
                kind: "topic".into(),
                no_wait: bit(0),
                ..Default::default()
            }
            .into(),
            13 => QueueBind {
                queue: "q".into(),
                exchange: "x".into(),
                routing_key: "#".into(),
                no_wait: bit(0),
                ..Default::default()
            }
            .into(),
            // Never sent through `call`: the machine must refuse them.
            14 => ConnectionClose::default().into(),
            _ if bit(0) => BasicPublish::default().into(),
            _ => ChannelOpen::default().into(),
        };
        let refused = which % 16 >= 14;
        let was_open = self.conn.is_open();
        if let Ok(token) = self.conn.call(channel, method) {
            assert!(was_open, "a call succeeded on a connection that is not open");
            assert!(!refused, "call() sent a method it must refuse");
            if let Some(token) = token {
                self.app.issued(token);
            }
        }
        self.drain(SLACK, 0, "a call");
    }

    fn publish(&mut self, channel: u16, flags: u8, size: usize) {
        let bit = |i: u32| flags & (1 << i) != 0;
        self.app.messages += 1;
        let publish = BasicPublish {
            exchange: if bit(1) { "x".into() } else { "".into() },
            routing_key: if bit(2) { "none".into() } else { "q".into() },
            mandatory: bit(0),
            ..Default::default()
        };
        let properties = BasicProperties {
            message_id: (!bit(3)).then(|| format!("m{}", self.app.messages).into()),
            ..Default::default()
        };
        let body = vec![b'p'; size];
        let was_open = self.conn.is_open();
        if let Ok(seq) = publish_encoded(&mut self.conn, &mut self.encoder, channel, &publish, &properties, &body) {
            assert!(was_open, "a publish succeeded on a connection that is not open");
            let recent = self.app.recent.entry(channel).or_default();
            if recent.len() == 8 {
                recent.pop_front();
            }
            recent.push_back((publish.exchange, publish.routing_key, properties.message_id));
            if let Some(seq) = seq {
                self.app.published(channel, seq);
            }
        }
        let frame_max = self.conn.tuned().map_or(FRAME_MIN_SIZE, |t| t.frame_max);
        let max_body = (frame_max as usize).saturating_sub(FRAME_OVERHEAD).max(1);
        let allowance = SLACK + size + FRAME_OVERHEAD * (size / max_body + 1);
        self.drain(allowance, 0, "a publish");
    }

    /// The socket closes at the end of every input: the machine must end,
    /// with every call answered.
    fn end(&mut self) {
        self.conn.handle_eof();
        self.drain(SLACK, 1, "the final handle_eof");
        assert!(self.app.closed, "handle_eof did not end the connection");
    }
}

// ---------------------------------------------------------------- the broker

/// The broker's side of the wire: reads what the client wrote, checks that
/// it is whole frames within `frame_max`, and queues what RabbitMQ would
/// answer to each call.
struct Broker {
    tune: ConnectionTune,
    decoder: FrameDecoder,
    unread: BytesMut,
    header_seen: bool,
    /// Answers not sent yet, with their channel.
    answers: VecDeque<(u16, BytesMut)>,
    /// The last delivery tag given out on each channel.
    tags: BTreeMap<u16, u64>,
    gets: u64,
}

impl Broker {
    fn new(tune: ConnectionTune) -> Self {
        Broker {
            tune,
            decoder: FrameDecoder::new(FRAME_MIN_SIZE),
            unread: BytesMut::new(),
            header_seen: false,
            answers: VecDeque::new(),
            tags: BTreeMap::new(),
            gets: 0,
        }
    }

    /// A delivery tag: the next one, the same again, or a jump.
    fn next_tag(&mut self, channel: u16, pick: u8) -> u64 {
        let last = self.tags.entry(channel).or_default();
        *last = match pick {
            0xF0.. => u64::MAX - u64::from(pick & 15),
            _ => last.saturating_add(u64::from(pick % 4)),
        };
        *last
    }

    fn read(&mut self, written: &[u8]) {
        if written.is_empty() {
            return;
        }
        self.unread.extend_from_slice(written);
        if !self.header_seen {
            assert!(
                self.unread.starts_with(&PROTOCOL_HEADER),
                "the client did not start with the protocol header"
            );
            self.unread.advance(PROTOCOL_HEADER.len());
            self.header_seen = true;
        }
        loop {
            match self.decoder.decode(&mut self.unread) {
                Ok(Some(frame)) => self.answer(frame),
                Ok(None) => break,
                Err(err) => panic!("the client wrote a frame that does not decode: {err}"),
            }
        }
        assert!(self.unread.is_empty(), "poll_transmit handed over part of a frame");
    }

    fn answer(&mut self, frame: Frame) {
        let Frame::Method(channel, method) = frame else {
            return;
        };
        let reply: Method = match method {
            Method::ConnectionStartOk(_) => self.tune.clone().into(),
            Method::ConnectionTuneOk(ok) => {
                // Frames up to FRAME_MIN_SIZE are always allowed.
                self.decoder.set_frame_max(match ok.frame_max {
                    0 => 0,
                    n => n.max(FRAME_MIN_SIZE),
                });
                return;
            }
            Method::ConnectionOpen(_) => ConnectionOpenOk::default().into(),
            Method::ConnectionClose(_) => ConnectionCloseOk {}.into(),
            Method::ChannelOpen(_) => {
                self.tags.remove(&channel);
                ChannelOpenOk::default().into()
            }
            Method::ChannelClose(_) => ChannelCloseOk {}.into(),
            Method::ChannelFlow(flow) => ChannelFlowOk { active: flow.active }.into(),
            Method::ConfirmSelect(m) if !m.no_wait => ConfirmSelectOk {}.into(),
            Method::BasicQos(_) => BasicQosOk {}.into(),
            Method::BasicConsume(m) if !m.no_wait => BasicConsumeOk {
                consumer_tag: if m.consumer_tag.is_empty() {
                    "amq.ctag-1".into()
                } else {
                    m.consumer_tag
                },
            }
            .into(),
            Method::BasicCancel(m) if !m.no_wait => BasicCancelOk {
                consumer_tag: m.consumer_tag,
            }
            .into(),
            Method::BasicGet(_) => {
                self.gets += 1;
                if self.gets.is_multiple_of(2) {
                    BasicGetEmpty::default().into()
                } else {
                    let tag = self.next_tag(channel, 1);
                    let get_ok = BasicGetOk {
                        delivery_tag: tag,
                        redelivered: false,
                        exchange: "".into(),
                        routing_key: "q".into(),
                        message_count: 0,
                    };
                    let mut out = BytesMut::new();
                    let properties = BasicProperties::default();
                    encode_content(channel, &get_ok.into(), &properties, b"got", 0, &mut out)
                        .expect("a get-ok encodes");
                    self.answers.push_back((channel, out));
                    return;
                }
            }
            Method::BasicRecover(_) => BasicRecoverOk {}.into(),
            Method::QueueDeclare(m) if !m.no_wait => QueueDeclareOk {
                queue: m.queue,
                message_count: 0,
                consumer_count: 0,
            }
            .into(),
            Method::QueueBind(m) if !m.no_wait => QueueBindOk {}.into(),
            Method::ExchangeDeclare(m) if !m.no_wait => ExchangeDeclareOk {}.into(),
            Method::TxSelect(_) => TxSelectOk {}.into(),
            Method::TxCommit(_) => TxCommitOk {}.into(),
            Method::TxRollback(_) => TxRollbackOk {}.into(),
            _ => return,
        };
        self.answers.push_back((channel, encoded(channel, reply)));
    }
}

// ---------------------------------------------------------------- the application

/// What the application has been promised: calls waiting for a reply,
/// publishes waiting for a confirm, open channels. Every event must keep a
/// promise or be news (a delivery, a block); none may come after `Closed`.
#[derive(Default)]
struct App {
    waiting: BTreeSet<Token>,
    answered: BTreeSet<Token>,
    /// Channels handed out by `open_channel` and not reported closed.
    live: BTreeSet<u16>,
    /// Publish sequence numbers not yet confirmed, by channel.
    outstanding: BTreeMap<u16, BTreeSet<u64>>,
    last_seq: BTreeMap<u16, u64>,
    /// The highest delivery tag seen on each channel.
    delivered: BTreeMap<u16, u64>,
    /// The last few publishes on each channel, for returns to name.
    recent: BTreeMap<u16, VecDeque<(ShortString, ShortString, Option<ShortString>)>>,
    messages: u64,
    opened: bool,
    closed: bool,
}

impl App {
    fn issued(&mut self, token: Token) {
        assert!(
            !self.answered.contains(&token) && self.waiting.insert(token),
            "token {token:?} handed out twice"
        );
    }

    fn published(&mut self, channel: u16, seq: u64) {
        let last = self.last_seq.entry(channel).or_default();
        assert!(seq > *last, "publish sequence {seq} after {last} on channel {channel}");
        *last = seq;
        self.outstanding.entry(channel).or_default().insert(seq);
    }

    /// A tag for a confirm from the broker: the last publish, the oldest
    /// outstanding one, a few before the last, or any small number.
    fn confirm_tag(&self, channel: u16, pick: u8) -> u64 {
        let last = self.last_seq.get(&channel).copied().unwrap_or(0);
        let oldest = self.outstanding.get(&channel).and_then(|s| s.first().copied());
        let n = u64::from(pick >> 2);
        match pick & 3 {
            0 => last,
            1 => oldest.unwrap_or(last),
            2 => last.saturating_sub(n),
            _ => n,
        }
    }

    fn delivery(&mut self, channel: u16, method: &Method) {
        let tag = match method {
            Method::BasicDeliver(d) => d.delivery_tag,
            Method::BasicGetOk(g) => g.delivery_tag,
            _ => return,
        };
        let seen = self.delivered.entry(channel).or_default();
        *seen = (*seen).max(tag);
    }

    /// Checks one event; returns whether it is news rather than a promise kept.
    fn on_event(&mut self, event: Event) -> bool {
        assert!(!self.closed, "an event after Closed: {event:?}");
        match event {
            Event::Opened => {
                assert!(!self.opened, "Opened twice");
                self.opened = true;
                true
            }
            Event::Reply { channel, token, result } => {
                // A token the application never saw is one of the machine's
                // own calls (the channel.close after a channel.open timed
                // out); every token is answered once at most.
                assert!(self.answered.insert(token), "a second reply to {token:?}");
                self.waiting.remove(&token);
                if let Ok(Reply::Content(content)) = &result {
                    self.delivery(channel, &content.method);
                }
                false
            }
            Event::Confirm { channel, seq, .. } => {
                let outstanding = self.outstanding.entry(channel).or_default();
                assert!(
                    outstanding.remove(&seq),
                    "a confirm of {seq} on channel {channel}, which is not outstanding"
                );
                false
            }
            Event::Confirms {
                channel, first, last, ..
            } => {
                assert!(first <= last, "a run of confirms from {first} to {last}");
                let outstanding = self.outstanding.entry(channel).or_default();
                for seq in first..=last {
                    assert!(
                        outstanding.remove(&seq),
                        "a confirm of {seq} on channel {channel}, which is not outstanding"
                    );
                }
                false
            }
            Event::ChannelClosed {
                channel, unconfirmed, ..
            } => {
                assert!(
                    self.live.remove(&channel),
                    "ChannelClosed for {channel}, which is not open"
                );
                let mut left = self.outstanding.remove(&channel).unwrap_or_default();
                for seq in unconfirmed {
                    assert!(
                        left.remove(&seq),
                        "channel {channel} closed with {seq} unconfirmed twice"
                    );
                }
                assert!(
                    left.is_empty(),
                    "channel {channel} closed without reporting publishes {left:?}"
                );
                self.last_seq.remove(&channel);
                self.delivered.remove(&channel);
                self.recent.remove(&channel);
                false
            }
            Event::Delivery { channel, content } => {
                self.delivery(channel, &content.method);
                true
            }
            Event::Return { .. }
            | Event::ConsumerCancelled { .. }
            | Event::Flow { .. }
            | Event::Blocked { .. }
            | Event::Unblocked => true,
            Event::Closed(reason) => {
                assert!(
                    self.waiting.is_empty(),
                    "the connection ended ({reason}) with calls {:?} unanswered",
                    self.waiting
                );
                self.closed = true;
                self.live.clear();
                self.outstanding.clear();
                true
            }
        }
    }
}

// ---------------------------------------------------------------- the seeds

mod seeds {
    //! The seed scripts, written with the same opcodes the harness reads.

    use acemq_codec::{encode_content, encode_method, BasicAck, BasicDeliver, BasicProperties, Frame, Method};
    use bytes::BytesMut;

    use super::Op;

    /// The three header bytes, by field; `Header::default()` is RabbitMQ
    /// with default settings, a full handshake, reads of any size.
    #[derive(Clone, Copy, Default)]
    struct Header {
        heartbeat: u8,
        frame_max: u8,
        channel_max: u8,
        auto_answer: bool,
        handshake: u8,
        read_size: u8,
        auth: u8,
        offer_external: bool,
        wanted: u8,
    }

    impl Header {
        fn auto() -> Self {
            Header {
                auto_answer: true,
                ..Header::default()
            }
        }

        fn bytes(self) -> [u8; 3] {
            [
                self.heartbeat | self.frame_max << 2 | self.channel_max << 5 | u8::from(self.auto_answer) << 7,
                self.handshake | self.read_size << 2 | self.auth << 5 | u8::from(self.offer_external) << 7,
                self.wanted,
            ]
        }
    }

    struct Script(Vec<u8>);

    impl Script {
        fn new(header: Header) -> Self {
            Script(header.bytes().to_vec())
        }

        fn op(mut self, op: Op, args: &[u8]) -> Self {
            self.0.push(op as u8);
            self.0.extend_from_slice(args);
            self
        }

        /// Opens channel 1 (or the next free one) and waits for open-ok.
        fn channel(self) -> Self {
            self.op(Op::OpenChannel, &[]).op(Op::Answer, &[0])
        }

        /// A channel call and its answer.
        fn call(self, channel: u8, which: u8, flags: u8) -> Self {
            self.op(Op::Call, &[channel, which, flags]).op(Op::Answer, &[0])
        }

        /// Raw bytes, in `Op::Raw` pieces of at most 255.
        fn raw(mut self, bytes: &[u8]) -> Self {
            for piece in bytes.chunks(255) {
                self = self.op(Op::Raw, &[piece.len() as u8]);
                self.0.extend_from_slice(piece);
            }
            self
        }

        fn raw_rest(self, bytes: &[u8]) -> Self {
            let mut script = self.op(Op::RawRest, &[]);
            script.0.extend_from_slice(bytes);
            script
        }
    }

    // Channel bytes: `channel_of(0)` is channel 1, `channel_of(1)` channel 2.
    const CH1: u8 = 0;
    const CH2: u8 = 1;
    // Call numbers (see `Harness::call`).
    const CONFIRM_SELECT: u8 = 0;
    const QOS: u8 = 1;
    const CONSUME: u8 = 2;
    const CHANNEL_CLOSE: u8 = 3;
    const QUEUE_DECLARE: u8 = 4;
    const GET: u8 = 5;

    /// A consumer on channel 1 and a confirming publisher on channel 2.
    fn consumer_and_publisher(header: Header) -> Script {
        Script::new(header)
            .channel()
            .call(CH1, QOS, 10)
            .call(CH1, CONSUME, 0)
            .channel()
            .call(CH2, CONFIRM_SELECT, 0)
    }

    fn frames(frames: &[Frame]) -> Vec<u8> {
        let mut out = BytesMut::new();
        for frame in frames {
            frame.encode(&mut out).expect("a seed frame encodes");
        }
        out.to_vec()
    }

    fn delivery(channel: u16, tag: u64, body: &[u8]) -> Vec<u8> {
        let deliver = BasicDeliver {
            consumer_tag: "c".into(),
            delivery_tag: tag,
            redelivered: false,
            exchange: "".into(),
            routing_key: "q".into(),
        };
        let mut out = BytesMut::new();
        encode_content(
            channel,
            &deliver.into(),
            &BasicProperties::default(),
            body,
            131_072,
            &mut out,
        )
        .expect("a seed delivery encodes");
        out.to_vec()
    }

    fn method(channel: u16, method: impl Into<Method>) -> Vec<u8> {
        let mut out = BytesMut::new();
        encode_method(channel, &method.into(), &mut out).expect("a seed method encodes");
        out.to_vec()
    }

    pub(super) fn all() -> Vec<(&'static str, Vec<u8>)> {
        use Op::*;
        let partial = |handshake| Header {
            handshake,
            ..Header::default()
        };
        let seeds = [
            ("seed-handshake", Script::new(Header::default())),
            (
                "seed-handshake-reads-of-1",
                Script::new(Header {
                    read_size: 1,
                    ..Header::default()
                })
                .channel(),
            ),
            (
                "seed-handshake-none-then-start",
                Script::new(partial(1))
                    .op(ConnectionMethod, &[0])
                    .op(Answer, &[1])
                    .op(OpenChannel, &[]),
            ),
            (
                "seed-handshake-start-only",
                Script::new(partial(2))
                    .op(OpenChannel, &[])
                    .op(Heartbeat, &[])
                    .op(Answer, &[1]),
            ),
            (
                "seed-handshake-start-tune",
                Script::new(partial(3)).op(Blocked, &[0]).op(ConnectionMethod, &[3]),
            ),
            (
                "seed-handshake-amqplain-named",
                Script::new(Header {
                    auth: 3,
                    ..Header::default()
                })
                .channel(),
            ),
            (
                "seed-handshake-external-refused",
                Script::new(Header {
                    auth: 2,
                    ..Header::default()
                }),
            ),
            (
                "seed-handshake-external-offered",
                Script::new(Header {
                    auth: 2,
                    offer_external: true,
                    ..Header::default()
                })
                .channel(),
            ),
            (
                "seed-handshake-old-version",
                Script::new(partial(1)).op(ConnectionMethod, &[1]),
            ),
            (
                "seed-handshake-secure",
                Script::new(partial(2)).op(ConnectionMethod, &[5]),
            ),
            (
                "seed-tiny-frame-max",
                Script::new(Header {
                    frame_max: 3,
                    ..Header::default()
                })
                .op(OpenChannel, &[])
                .op(Publish, &[CH1, 0, 1]),
            ),
            (
                "seed-frame-max-4096",
                consumer_and_publisher(Header {
                    frame_max: 4,
                    ..Header::default()
                })
                .op(Publish, &[CH2, 0, 200])
                .op(Deliver, &[CH1, 1, 200]),
            ),
            (
                "seed-one-channel-only",
                Script::new(Header {
                    channel_max: 2,
                    ..Header::auto()
                })
                .op(OpenChannel, &[])
                .op(OpenChannel, &[]),
            ),
            (
                "seed-deliveries",
                consumer_and_publisher(Header::default())
                    .op(Deliver, &[CH1, 1, 0])
                    .op(Deliver, &[CH1, 1, 1])
                    .op(Deliver, &[CH1, 1, 250])
                    .op(Settle, &[CH1, 0, 2])
                    .op(Settle, &[CH1, 0, 1])
                    .op(Settle, &[CH1, 0, 0]),
            ),
            (
                "seed-deliveries-reads-of-7",
                consumer_and_publisher(Header {
                    read_size: 4,
                    ..Header::default()
                })
                .op(Deliver, &[CH1, 1, 3])
                .op(Deliver, &[CH1, 1, 130])
                .op(Settle, &[CH1, 1, 0])
                .op(Deliver, &[CH1, 0, 1])
                .op(Settle, &[CH1, 4, 0]),
            ),
            (
                "seed-deliveries-no-ack-consumer",
                Script::new(Header::auto())
                    .op(OpenChannel, &[])
                    .op(Call, &[CH1, CONSUME, 1])
                    .op(Deliver, &[CH1, 1, 2])
                    .op(Deliver, &[CH1, 0xF0, 2])
                    .op(Settle, &[CH1, 2, 0]),
            ),
            (
                "seed-get-ok-and-get-empty",
                Script::new(Header::auto())
                    .op(OpenChannel, &[])
                    .op(Call, &[CH1, GET, 0])
                    .op(Call, &[CH1, GET, 0])
                    .op(Settle, &[CH1, 0, 0])
                    .op(Call, &[CH1, GET, 1])
                    .op(GetOk, &[CH1, 1, 1]),
            ),
            (
                "seed-confirms-ack-multiple",
                consumer_and_publisher(Header::default())
                    .op(Publish, &[CH2, 0, 1])
                    .op(Publish, &[CH2, 0, 1])
                    .op(Publish, &[CH2, 0, 1])
                    .op(Publish, &[CH2, 0, 1])
                    .op(Confirm, &[CH2, 2 | 1 << 2, 1])
                    .op(Confirm, &[CH2, 0, 0]),
            ),
            (
                "seed-confirms-nack-multiple",
                consumer_and_publisher(Header::default())
                    .op(Publish, &[CH2, 0, 0])
                    .op(Publish, &[CH2, 0, 0])
                    .op(Publish, &[CH2, 0, 0])
                    .op(Confirm, &[CH2, 1, 2])
                    .op(Confirm, &[CH2, 0, 3])
                    .op(Confirm, &[CH2, 0, 1])
                    .op(Confirm, &[CH2, 3 | 9 << 2, 0]),
            ),
            (
                "seed-return-before-ack",
                consumer_and_publisher(Header::default())
                    .op(Publish, &[CH2, 1, 1])
                    .op(Publish, &[CH2, 1 | 4, 1])
                    .op(Publish, &[CH2, 1, 1])
                    .op(Return, &[CH2, 1, 0])
                    .op(Confirm, &[CH2, 0, 1])
                    .op(Return, &[CH2, 0, 1])
                    .op(Return, &[CH1, 0, 0]),
            ),
            (
                "seed-return-without-message-id",
                consumer_and_publisher(Header::default())
                    .op(Publish, &[CH2, 1 | 8, 0])
                    .op(Return, &[CH2, 0, 2])
                    .op(Confirm, &[CH2, 0, 0]),
            ),
            (
                "seed-server-channel-close",
                consumer_and_publisher(Header::default())
                    .op(Publish, &[CH2, 1, 1])
                    .op(Call, &[CH1, QUEUE_DECLARE, 0])
                    .op(ChannelClose, &[CH1, 0])
                    .op(ChannelClose, &[CH2, 1])
                    .op(OpenChannel, &[])
                    .op(Answer, &[3]),
            ),
            (
                "seed-client-channel-close",
                consumer_and_publisher(Header::default())
                    .op(Deliver, &[CH1, 1, 1])
                    .op(Settle, &[CH1, 0, 0])
                    .op(Publish, &[CH2, 0, 1])
                    .op(Call, &[CH2, CHANNEL_CLOSE, 0])
                    .op(Confirm, &[CH2, 0, 0])
                    .op(ChannelClose, &[CH2, 0])
                    .op(Answer, &[0]),
            ),
            (
                "seed-server-connection-close",
                consumer_and_publisher(Header::default())
                    .op(Publish, &[CH2, 0, 1])
                    .op(Call, &[CH1, QUEUE_DECLARE, 0])
                    .op(ConnectionClose, &[0])
                    .op(OpenChannel, &[]),
            ),
            (
                "seed-client-close",
                consumer_and_publisher(Header::default())
                    .op(Call, &[CH1, QUEUE_DECLARE, 0])
                    .op(Close, &[])
                    .op(Deliver, &[CH1, 1, 1])
                    .op(ConnectionClose, &[4])
                    .op(Answer, &[3]),
            ),
            (
                "seed-blocked-unblocked",
                consumer_and_publisher(Header::default())
                    .op(Blocked, &[0])
                    .op(Blocked, &[0])
                    .op(Publish, &[CH2, 0, 1])
                    .op(Blocked, &[1])
                    .op(Blocked, &[1]),
            ),
            (
                "seed-flow-and-cancel",
                consumer_and_publisher(Header::auto())
                    .op(Flow, &[CH1, 0])
                    .op(Flow, &[CH1, 1])
                    .op(Cancel, &[CH1, 0])
                    .op(Cancel, &[CH1, 1])
                    .op(Call, &[CH1, 6, 1]),
            ),
            (
                "seed-heartbeats",
                Script::new(Header {
                    heartbeat: 2,
                    ..Header::auto()
                })
                .op(OpenChannel, &[])
                .op(Advance, &[50])
                .op(Heartbeat, &[])
                .op(AdvanceToDeadline, &[])
                .op(AdvanceToDeadline, &[])
                .op(Heartbeat, &[])
                .op(AdvanceToDeadline, &[])
                .op(AdvanceToDeadline, &[])
                .op(AdvanceToDeadline, &[]),
            ),
            (
                "seed-heartbeats-negotiated-off",
                Script::new(Header {
                    heartbeat: 1,
                    wanted: 1,
                    ..Header::default()
                })
                .op(AdvanceToDeadline, &[])
                .op(Advance, &[0xFF]),
            ),
            (
                "seed-heartbeat-timeout-while-closing",
                Script::new(Header {
                    heartbeat: 3,
                    ..Header::default()
                })
                .op(Close, &[])
                .op(Advance, &[0x80 | 3])
                .op(Advance, &[0x80 | 6]),
            ),
            (
                "seed-channel-open-times-out",
                Script::new(Header {
                    heartbeat: 1,
                    wanted: 1,
                    ..Header::default()
                })
                .op(OpenChannel, &[])
                .op(OpenChannel, &[])
                .op(AdvanceToDeadline, &[])
                .op(Answer, &[3])
                .op(OpenChannel, &[])
                .op(Answer, &[0])
                .op(AdvanceToDeadline, &[]),
            ),
            (
                "seed-close-oks-time-out",
                consumer_and_publisher(Header {
                    heartbeat: 1,
                    wanted: 1,
                    ..Header::default()
                })
                .op(Call, &[CH1, CHANNEL_CLOSE, 0])
                .op(Blocked, &[0])
                .op(AdvanceToDeadline, &[])
                .op(Blocked, &[1])
                .op(AdvanceToDeadline, &[])
                .op(AdvanceToDeadline, &[]),
            ),
            (
                "seed-oversized-frame",
                consumer_and_publisher(Header::default()).op(Mangled, &[2, CH1, 4]),
            ),
            (
                "seed-oversized-frame-small-max",
                Script::new(Header {
                    frame_max: 4,
                    read_size: 1,
                    ..Header::default()
                })
                .op(Mangled, &[2, 0, 9]),
            ),
            (
                "seed-frame-of-exactly-frame-max-held",
                consumer_and_publisher(Header::default())
                    .op(Mangled, &[2, CH1, 0x80 | 4])
                    .op(Deliver, &[CH1, 1, 255])
                    .op(Heartbeat, &[]),
            ),
            (
                "seed-bad-frame-end",
                consumer_and_publisher(Header::default()).op(Mangled, &[0, CH1, 0]),
            ),
            (
                "seed-unknown-frame-type",
                consumer_and_publisher(Header::default()).op(Mangled, &[1, 0, 1]),
            ),
            (
                "seed-truncated-frame",
                consumer_and_publisher(Header::default())
                    .op(Mangled, &[3, CH1, 30])
                    .op(Deliver, &[CH1, 1, 1])
                    .op(Heartbeat, &[]),
            ),
            (
                "seed-truncated-then-eof",
                consumer_and_publisher(Header::default())
                    .op(Mangled, &[3, CH1, 5])
                    .op(Eof, &[]),
            ),
            (
                "seed-content-out-of-order",
                consumer_and_publisher(Header::default())
                    .op(Mangled, &[5, CH1, 0])
                    .op(Mangled, &[6, CH2, 0])
                    .op(Mangled, &[4, 0, 0]),
            ),
            (
                "seed-content-header-limits",
                consumer_and_publisher(Header::default())
                    .op(Mangled, &[7, CH1, 0])
                    .op(Mangled, &[8, CH2, 0]),
            ),
            (
                "seed-body-longer-than-announced",
                consumer_and_publisher(Header::default()).op(Mangled, &[9, CH1, 3]),
            ),
            (
                "seed-stray-replies",
                consumer_and_publisher(Header::default())
                    .op(StrayReply, &[CH1, 3])
                    .op(StrayReply, &[2, 0])
                    .op(StrayReply, &[0xF8, 12]),
            ),
            (
                "seed-connection-methods-when-open",
                consumer_and_publisher(Header::default())
                    .op(ConnectionMethod, &[6])
                    .op(ConnectionMethod, &[0]),
            ),
            (
                "seed-frame-on-unopened-channel",
                Script::new(Header::default())
                    .op(Confirm, &[0xFC, 0, 0])
                    .op(ConnectionMethod, &[7]),
            ),
            (
                "seed-calls-refused-and-others",
                Script::new(Header::auto())
                    .op(OpenChannel, &[])
                    .op(Call, &[CH1, 14, 0])
                    .op(Call, &[CH1, 15, 0])
                    .op(Call, &[CH1, 15, 1])
                    .op(Call, &[CH1, 8, 0])
                    .op(Call, &[CH1, 9, 0])
                    .op(Call, &[CH1, 10, 0])
                    .op(Call, &[CH1, 11, 0])
                    .op(Call, &[CH1, 12, 0])
                    .op(Call, &[CH1, 13, 0])
                    .op(Call, &[CH1, 7, 0])
                    .op(Call, &[CH2, 0, 0]),
            ),
            (
                "seed-raw-frames-after-channels",
                consumer_and_publisher(Header::default())
                    .op(Publish, &[CH2, 0, 1])
                    .op(Publish, &[CH2, 0, 1])
                    .raw(&delivery(1, 1, b"hello"))
                    .raw(&frames(&[Frame::Heartbeat]))
                    .raw_rest(
                        &[
                            method(
                                2,
                                BasicAck {
                                    delivery_tag: 2,
                                    multiple: true,
                                },
                            ),
                            delivery(1, 2, &[7; 300]),
                            method(
                                1,
                                acemq_codec::ChannelClose {
                                    reply_code: 406,
                                    reply_text: "PRECONDITION_FAILED - unknown delivery tag 9".into(),
                                    class_id: 60,
                                    method_id: 80,
                                },
                            ),
                        ]
                        .concat(),
                    ),
            ),
        ];
        seeds.into_iter().map(|(name, script)| (name, script.0)).collect()
    }
}
