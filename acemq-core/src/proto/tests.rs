//! The connection machine driven frame by frame with a virtual clock: no
//! tokio, no socket. A scripted server side built with acemq-codec.

use std::time::{Duration, Instant};

use acemq_codec::track::Outcome;
use acemq_codec::*;
use bytes::{Bytes, BytesMut};

use super::*;

struct Peer {
    conn: Connection,
    now: Instant,
    decoder: FrameDecoder,
    /// What the client wrote, not yet read by the test.
    written: BytesMut,
}

impl Peer {
    fn new() -> Self {
        Peer::with(ConnectionParams::default())
    }

    fn with(params: ConnectionParams) -> Self {
        let now = Instant::now();
        Peer {
            conn: Connection::new(params, now),
            now,
            decoder: FrameDecoder::new(0),
            written: BytesMut::new(),
        }
    }

    /// A peer past the handshake, with the server's heartbeat proposal.
    fn open(heartbeat: u16) -> Self {
        Peer::new().handshake(heartbeat)
    }

    /// A peer past the handshake where neither side wants heartbeats.
    fn open_without_heartbeats() -> Self {
        let mut params = ConnectionParams::default();
        params.tune.heartbeat = 0;
        let p = Peer::with(params).handshake(0);
        assert_eq!(p.conn.tuned().unwrap().heartbeat, 0);
        p
    }

    fn handshake(mut self, heartbeat: u16) -> Self {
        let p = &mut self;
        let mut header = p.take_raw(8);
        assert_eq!(check_protocol_header(&header.split_to(8)), Ok(true));
        p.server(
            0,
            ConnectionStart {
                version_major: 0,
                version_minor: 9,
                mechanisms: "PLAIN AMQPLAIN".into(),
                locales: "en_US".into(),
                ..Default::default()
            },
        );
        let Method::ConnectionStartOk(ok) = p.client_method() else {
            panic!()
        };
        assert_eq!(ok.mechanism, "PLAIN");
        assert_eq!(ok.response.as_bytes(), b"\0guest\0guest");
        p.server(
            0,
            ConnectionTune {
                channel_max: 2047,
                frame_max: 131_072,
                heartbeat,
            },
        );
        assert!(matches!(p.client_method(), Method::ConnectionTuneOk(_)));
        let Method::ConnectionOpen(open) = p.client_method() else {
            panic!()
        };
        assert_eq!(open.virtual_host, "/");
        p.server(0, ConnectionOpenOk::default());
        assert_eq!(p.conn.poll_event(), Some(Event::Opened));
        self
    }

    fn flush(&mut self) {
        self.conn.poll_transmit(&mut self.written, self.now);
    }

    fn take_raw(&mut self, n: usize) -> BytesMut {
        self.flush();
        self.written.split_to(n)
    }

    fn client_frame(&mut self) -> Option<Frame> {
        self.flush();
        self.decoder.decode(&mut self.written).unwrap()
    }

    fn client_method(&mut self) -> Method {
        match self.client_frame() {
            Some(Frame::Method(_, m)) => m,
            other => panic!("expected a method, got {other:?}"),
        }
    }

    fn server_frames(&mut self, frames: &[Frame]) {
        let mut buf = BytesMut::new();
        for f in frames {
            f.encode(&mut buf).unwrap();
        }
        self.conn.handle_input(&mut buf, self.now);
        assert!(buf.is_empty());
    }

    fn server(&mut self, channel: u16, method: impl Into<Method>) {
        self.server_frames(&[Frame::Method(channel, method.into())]);
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.conn.poll_event()).collect()
    }

    fn open_channel(&mut self) -> u16 {
        let (id, token) = self.conn.open_channel().unwrap();
        assert!(matches!(self.client_method(), Method::ChannelOpen(_)));
        self.server(id, ChannelOpenOk::default());
        assert!(matches!(&self.events()[..], [Event::Reply { token: t, result: Ok(_), .. }] if *t == token));
        id
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.conn.handle_timeout(self.now);
    }
}

#[test]
fn the_handshake_negotiates_and_sends_the_capabilities() {
    let mut p = Peer::new();
    p.take_raw(8);
    p.server(
        0,
        ConnectionStart {
            version_major: 0,
            version_minor: 9,
            mechanisms: "PLAIN".into(),
            ..Default::default()
        },
    );
    let Method::ConnectionStartOk(ok) = p.client_method() else {
        panic!()
    };
    let caps = ok
        .client_properties
        .get("capabilities")
        .and_then(FieldValue::as_table)
        .unwrap();
    assert_eq!(caps.get("connection.blocked"), Some(&FieldValue::Bool(true)));
    p.server(
        0,
        ConnectionTune {
            channel_max: 0,
            frame_max: 0,
            heartbeat: 30,
        },
    );
    let Method::ConnectionTuneOk(ok) = p.client_method() else {
        panic!()
    };
    assert_eq!((ok.channel_max, ok.frame_max, ok.heartbeat), (2047, 131_072, 30));
    assert!(!p.conn.is_open());
}

#[test]
fn a_refused_login_ends_with_the_brokers_reason() {
    let mut p = Peer::new();
    p.take_raw(8);
    p.server(
        0,
        ConnectionStart {
            version_major: 0,
            version_minor: 9,
            mechanisms: "PLAIN".into(),
            ..Default::default()
        },
    );
    p.client_method();
    p.server(
        0,
        ConnectionClose {
            reply_code: 403,
            reply_text: "ACCESS_REFUSED - Login was refused".into(),
            class_id: 0,
            method_id: 0,
        },
    );
    assert!(matches!(p.client_method(), Method::ConnectionCloseOk(_)));
    match &p.events()[..] {
        [Event::Closed(CloseReason::ByServer(r))] => assert_eq!(r.code, 403),
        other => panic!("{other:?}"),
    }
    assert!(p.conn.is_closed());
}

#[test]
fn a_mechanism_the_broker_does_not_offer_is_refused_before_sending_credentials() {
    let mut p = Peer::new();
    p.take_raw(8);
    p.server(
        0,
        ConnectionStart {
            version_major: 0,
            version_minor: 9,
            mechanisms: "EXTERNAL".into(),
            ..Default::default()
        },
    );
    // Nothing is sent (no credentials, no close before start-ok): the socket just closes.
    assert_eq!(p.client_frame(), None);
    assert!(p.conn.is_closed());
    assert!(matches!(
        &p.events()[..],
        [Event::Closed(CloseReason::ProtocolError {
            code: ReplyCode::AccessRefused,
            ..
        })]
    ));
}

#[test]
fn heartbeats_go_out_at_half_the_interval_and_a_silent_peer_is_dead_after_two() {
    let mut p = Peer::open(10);
    assert_eq!(p.conn.tuned().unwrap().heartbeat, 10);
    assert_eq!(p.conn.poll_timeout(), Some(p.now + Duration::from_secs(5)));
    p.advance(Duration::from_secs(5));
    assert_eq!(p.client_frame(), Some(Frame::Heartbeat));
    // The peer's heartbeat keeps the connection alive.
    p.advance(Duration::from_secs(5));
    assert_eq!(p.client_frame(), Some(Frame::Heartbeat));
    p.server_frames(&[Frame::Heartbeat]);
    p.advance(Duration::from_secs(15));
    assert!(!p.conn.is_closed());
    p.advance(Duration::from_secs(5));
    assert!(p.conn.is_closed());
    assert_eq!(p.events(), [Event::Closed(CloseReason::HeartbeatTimeout)]);
}

#[test]
fn a_server_channel_close_fails_the_pending_call_and_keeps_the_connection() {
    let mut p = Peer::open(0);
    let ch = p.open_channel();
    let token = p
        .conn
        .call(
            ch,
            QueueDeclare {
                queue: "q".into(),
                passive: true,
                ..Default::default()
            }
            .into(),
        )
        .unwrap()
        .unwrap();
    p.client_method();
    p.server(
        ch,
        ChannelClose {
            reply_code: 404,
            reply_text: "NOT_FOUND - no queue 'q' in vhost '/'".into(),
            class_id: 50,
            method_id: 10,
        },
    );
    assert!(matches!(p.client_method(), Method::ChannelCloseOk(_)));
    let events = p.events();
    assert!(matches!(&events[0], Event::ChannelClosed { refusal: Some(r), .. } if r.code == 404));
    match &events[1] {
        Event::Reply {
            token: t,
            result: Err(CallError::ChannelClosed(r)),
            ..
        } => {
            assert_eq!(*t, token);
            assert_eq!(r.method_name(), Some("queue.declare"));
        }
        other => panic!("{other:?}"),
    }
    assert!(p.conn.is_open());
    assert!(!p.conn.is_channel_open(ch));
    assert_eq!(p.open_channel(), ch, "the number is free again");
}

#[test]
fn a_forced_close_is_answered_and_reported_as_320() {
    let mut p = Peer::open(0);
    p.open_channel();
    p.server(
        0,
        ConnectionClose {
            reply_code: 320,
            reply_text: "CONNECTION_FORCED - broker forced connection closure".into(),
            class_id: 0,
            method_id: 0,
        },
    );
    assert!(matches!(p.client_method(), Method::ConnectionCloseOk(_)));
    match &p.events()[..] {
        [Event::Closed(CloseReason::ByServer(r))] => assert_eq!(r.reply_code(), ReplyCode::ConnectionForced),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_frame_on_an_unopened_channel_closes_the_connection_with_504() {
    let mut p = Peer::open(0);
    p.server(
        7,
        BasicAck {
            delivery_tag: 1,
            multiple: false,
        },
    );
    assert!(matches!(p.client_method(), Method::ConnectionClose(c) if c.reply_code == 504));
    // Everything but close-ok is ignored now.
    p.server(0, ConnectionBlocked { reason: "x".into() });
    assert!(p.events().is_empty());
    p.server(0, ConnectionCloseOk {});
    assert!(matches!(
        &p.events()[..],
        [Event::Closed(CloseReason::ProtocolError {
            code: ReplyCode::ChannelError,
            ..
        })]
    ));
}

/// An open connection with one channel in confirm mode, events taken.
/// Publishes one message through [`Connection::encoded_publishes`], the
/// one way into the machine, encoded as the driver's command queue encodes
/// it (see `fuzzing::publish_encoded`).
fn publish_one(
    conn: &mut Connection,
    channel: u16,
    publish: &BasicPublish,
    properties: &BasicProperties,
    body: &[u8],
) -> Result<Option<u64>, CommandError> {
    super::fuzzing::publish_encoded(conn, &mut PublishEncoder::new(), channel, publish, properties, body)
}

fn confirming_peer() -> (Peer, u16) {
    let mut p = Peer::open(0);
    let ch = p.open_channel();
    p.conn.call(ch, ConfirmSelect { no_wait: false }.into()).unwrap();
    p.client_method();
    p.server(ch, ConfirmSelectOk {});
    p.events();
    (p, ch)
}

#[test]
fn confirms_and_returns_pair_through_the_machine() {
    let (mut p, ch) = confirming_peer();
    let publish = |key: &str| BasicPublish {
        routing_key: key.into(),
        mandatory: true,
        ..Default::default()
    };
    let props = |id: &str| BasicProperties {
        message_id: Some(id.into()),
        ..Default::default()
    };
    assert_eq!(
        publish_one(&mut p.conn, ch, &publish("q"), &props("a"), b"1").unwrap(),
        Some(1)
    );
    assert_eq!(
        publish_one(&mut p.conn, ch, &publish("none"), &props("b"), b"2").unwrap(),
        Some(2)
    );
    assert_eq!(
        publish_one(&mut p.conn, ch, &publish("q"), &props("c"), b"3").unwrap(),
        Some(3)
    );
    assert_eq!(p.conn.unconfirmed(ch), 3);
    let ret = BasicReturn {
        reply_code: 312,
        reply_text: "NO_ROUTE".into(),
        exchange: "".into(),
        routing_key: "none".into(),
    };
    p.server_frames(&[
        Frame::Method(ch, ret.into()),
        Frame::Header(ch, ContentHeader::basic(1, props("b"))),
        Frame::Body(ch, Bytes::from_static(b"2")),
        Frame::Method(
            ch,
            BasicAck {
                delivery_tag: 3,
                multiple: true,
            }
            .into(),
        ),
    ]);
    let confirms: Vec<(u64, Outcome, bool)> = p
        .events()
        .into_iter()
        .flat_map(|e| match e {
            Event::Confirm {
                seq, outcome, returned, ..
            } => vec![(seq, outcome, returned.is_some())],
            Event::Confirms {
                first, last, outcome, ..
            } => (first..=last).map(|seq| (seq, outcome, false)).collect(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        confirms,
        [
            (1, Outcome::Ack, false),
            (2, Outcome::Ack, true),
            (3, Outcome::Ack, false)
        ]
    );
}

#[test]
fn frames_encoded_by_the_caller_go_out_as_given_numbered_and_matched_to_their_return() {
    let (mut p, ch) = confirming_peer();
    let publish = BasicPublish {
        routing_key: "none".into(),
        mandatory: true,
        ..Default::default()
    };
    let props = BasicProperties {
        message_id: Some("m".into()),
        ..Default::default()
    };
    let mut frames = BytesMut::new();
    encode_content(ch, &publish.clone().into(), &props, b"body", 131_072, &mut frames).unwrap();
    let returned = return_key(&publish, &props);
    assert!(returned.is_some(), "a mandatory publish has a key");
    let mut run = frames.clone();
    let len = run.len();
    assert_eq!(
        p.conn
            .encoded_publishes(&mut run, 0)
            .publish(ch, len, returned)
            .unwrap(),
        Some(1)
    );
    assert!(run.is_empty(), "a whole run becomes the write buffer");
    assert_eq!(p.take_raw(frames.len()), frames, "written as given");
    // A channel that is not open refuses them, and nothing is written.
    let mut run = frames.clone();
    assert!(matches!(
        p.conn.encoded_publishes(&mut run, 0).publish(ch + 1, len, None),
        Err(CommandError::ChannelNotOpen(c)) if c == ch + 1
    ));
    p.flush();
    assert!(p.written.is_empty(), "{:?}", p.written);
    assert_eq!(p.conn.unconfirmed(ch), 1);
    let ret = BasicReturn {
        reply_code: 312,
        reply_text: "NO_ROUTE".into(),
        exchange: "".into(),
        routing_key: "none".into(),
    };
    p.server_frames(&[
        Frame::Method(ch, ret.into()),
        Frame::Header(ch, ContentHeader::basic(4, props.clone())),
        Frame::Body(ch, Bytes::from_static(b"body")),
        Frame::Method(
            ch,
            BasicAck {
                delivery_tag: 1,
                multiple: false,
            }
            .into(),
        ),
    ]);
    let confirms: Vec<(u64, bool)> = p
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Confirm { seq, returned, .. } => Some((seq, returned.is_some())),
            Event::Confirms { .. } => panic!("a returned publish is confirmed alone"),
            _ => None,
        })
        .collect();
    assert_eq!(confirms, [(1, true)], "the return is paired with its publish");
}

/// The frames of one message with `body` on `ch`, as the caller encodes them.
fn encoded(ch: u16, body: &[u8]) -> BytesMut {
    let publish = BasicPublish {
        routing_key: "q".into(),
        ..Default::default()
    };
    let mut frames = BytesMut::new();
    encode_content(
        ch,
        &publish.into(),
        &BasicProperties::default(),
        body,
        131_072,
        &mut frames,
    )
    .unwrap();
    frames
}

/// `n` messages m0, m1, … on `ch`, each encoded, and all of them in one
/// buffer.
fn encoded_run(ch: u16, n: usize) -> (Vec<BytesMut>, BytesMut) {
    let messages: Vec<BytesMut> = (0..n).map(|i| encoded(ch, format!("m{i}").as_bytes())).collect();
    let mut frames = BytesMut::new();
    for m in &messages {
        frames.extend_from_slice(m);
    }
    (messages, frames)
}

#[test]
fn a_run_of_encoded_publishes_writes_those_taken_in_order_and_none_of_those_left_out() {
    let (mut p, ch) = confirming_peer();
    // Two runs in one buffer, the second starting where the first ends,
    // after a frame of the machine's own (the caller applied a command
    // between them): m0 m1 | m2 m3 m4 m5.
    let (messages, mut frames) = encoded_run(ch, 6);
    let first = messages[0].len() + messages[1].len();
    {
        let mut run = p.conn.encoded_publishes(&mut frames, 0);
        assert_eq!(run.publish(ch, messages[0].len(), None).unwrap(), Some(1));
        assert_eq!(run.publish(ch, messages[1].len(), None).unwrap(), Some(2));
    }
    assert_eq!(
        frames.len(),
        first + messages[2..].iter().map(BytesMut::len).sum::<usize>(),
        "a part is copied"
    );
    p.conn
        .call(
            ch,
            BasicQos {
                prefetch_count: 7,
                ..Default::default()
            }
            .into(),
        )
        .unwrap();
    {
        let mut run = p.conn.encoded_publishes(&mut frames, first);
        // Left out by the caller, refused by the machine, taken, left out.
        run.skip(messages[2].len());
        assert!(run.publish(ch + 1, messages[3].len(), None).is_err());
        assert_eq!(run.publish(ch, messages[4].len(), None).unwrap(), Some(3));
        run.skip(messages[5].len());
    }
    let mut expected = BytesMut::new();
    expected.extend_from_slice(&messages[0]);
    expected.extend_from_slice(&messages[1]);
    let mut qos = BytesMut::new();
    acemq_codec::Frame::Method(
        ch,
        BasicQos {
            prefetch_count: 7,
            ..Default::default()
        }
        .into(),
    )
    .encode(&mut qos)
    .unwrap();
    expected.extend_from_slice(&qos);
    expected.extend_from_slice(&messages[4]);
    assert_eq!(p.take_raw(expected.len()), expected);
    p.flush();
    assert!(p.written.is_empty(), "nothing else: {:?}", p.written);
    assert_eq!(p.conn.unconfirmed(ch), 3);
}

/// Messages taken at once are numbered and written as they would be one by
/// one; a refused group is left out whole, and what follows it goes on.
#[test]
fn publishes_taken_at_once_are_numbered_and_written_as_one_by_one() {
    let (mut p, ch) = confirming_peer();
    let (messages, mut frames) = encoded_run(ch, 7);
    let lens = |range: std::ops::Range<usize>| messages[range].iter().map(BytesMut::len).sum::<usize>();
    {
        let mut run = p.conn.encoded_publishes(&mut frames, 0);
        // m0–m2 at once, m3 alone, m4–m5 on a channel not open, m6 at once.
        assert_eq!(run.publish_many(ch, lens(0..3), 3).unwrap(), Some(1));
        assert_eq!(run.publish(ch, lens(3..4), None).unwrap(), Some(4));
        assert!(matches!(
            run.publish_many(ch + 1, lens(4..6), 2),
            Err(CommandError::ChannelNotOpen(c)) if c == ch + 1
        ));
        assert_eq!(run.publish_many(ch, lens(6..7), 1).unwrap(), Some(5));
    }
    let mut expected = BytesMut::new();
    for m in messages[..4].iter().chain(&messages[6..]) {
        expected.extend_from_slice(m);
    }
    assert_eq!(p.take_raw(expected.len()), expected);
    p.flush();
    assert!(p.written.is_empty(), "nothing else: {:?}", p.written);
    assert_eq!(p.conn.unconfirmed(ch), 5);
    p.server(
        ch,
        BasicAck {
            delivery_tag: 5,
            multiple: true,
        },
    );
    assert!(matches!(
        &p.events()[..],
        [Event::Confirms {
            first: 1,
            last: 5,
            outcome: Outcome::Ack,
            ..
        }]
    ));
}

/// Acks taken before the events are (the several acks of one read) come as
/// one event while their runs follow on with one outcome; a nack between
/// them, or a gap, starts another.
#[test]
fn acks_that_follow_on_come_as_one_event_until_the_outcome_changes() {
    let (mut p, ch) = confirming_peer();
    let (_, mut frames) = encoded_run(ch, 9);
    let len = frames.len();
    p.conn
        .encoded_publishes(&mut frames, 0)
        .publish_many(ch, len, 9)
        .unwrap();
    p.flush();
    let ack = |tag, multiple| {
        Method::from(BasicAck {
            delivery_tag: tag,
            multiple,
        })
    };
    let nack = |tag| {
        Method::from(BasicNack {
            delivery_tag: tag,
            multiple: false,
            requeue: false,
        })
    };
    // 1–2, 3 and 4 follow on; 5 is nacked; 6 follows the nack with an ack;
    // 8 leaves 7 outstanding, so 7 and then 9 come after it.
    for method in [
        ack(2, true),
        ack(3, false),
        ack(4, true),
        nack(5),
        ack(6, true),
        ack(8, false),
        ack(7, false),
        ack(9, false),
    ] {
        p.server(ch, method);
    }
    let runs: Vec<(u64, u64, Outcome)> = p
        .events()
        .into_iter()
        .map(|e| match e {
            Event::Confirms {
                first, last, outcome, ..
            } => (first, last, outcome),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        runs,
        [
            (1, 4, Outcome::Ack),
            (5, 5, Outcome::Nack),
            (6, 6, Outcome::Ack),
            (8, 8, Outcome::Ack),
            (7, 7, Outcome::Ack),
            (9, 9, Outcome::Ack),
        ]
    );
    assert_eq!(p.conn.unconfirmed(ch), 0);
}

#[test]
fn a_whole_run_is_copied_behind_what_waits_to_be_written() {
    let (mut p, ch) = confirming_peer();
    p.conn
        .call(
            ch,
            BasicQos {
                prefetch_count: 3,
                ..Default::default()
            }
            .into(),
        )
        .unwrap();
    let mut frames = encoded(ch, b"after the qos");
    let message = frames.clone();
    let len = frames.len();
    assert_eq!(
        p.conn.encoded_publishes(&mut frames, 0).publish(ch, len, None).unwrap(),
        Some(1)
    );
    assert_eq!(frames, message, "copied, not taken");
    assert!(matches!(p.client_method(), Method::BasicQos(_)));
    assert_eq!(p.take_raw(len), message);
}

/// A confirm is read where it lies only where decoding it whole would do
/// the same: one in the middle of a message is the frame out of place it
/// always was, and one on a channel being closed is ignored.
#[test]
fn a_confirm_in_the_middle_of_a_message_is_out_of_place_and_one_on_a_closing_channel_is_ignored() {
    let (mut p, ch) = confirming_peer();
    let publish = BasicPublish {
        routing_key: "q".into(),
        ..Default::default()
    };
    assert_eq!(
        publish_one(&mut p.conn, ch, &publish, &BasicProperties::default(), b"x").unwrap(),
        Some(1)
    );
    let close = ChannelClose {
        reply_code: 200,
        reply_text: "bye".into(),
        class_id: 0,
        method_id: 0,
    };
    p.conn.call(ch, close.into()).unwrap();
    while p.client_frame().is_some() {}
    p.server(
        ch,
        BasicAck {
            delivery_tag: 1,
            multiple: false,
        },
    );
    assert_eq!(p.events(), []);
    p.server(ch, ChannelCloseOk {});
    assert!(matches!(
        &p.events()[0],
        Event::ChannelClosed { unconfirmed, .. } if unconfirmed == &[1]
    ));

    let (mut p, ch) = confirming_peer();
    assert_eq!(
        publish_one(&mut p.conn, ch, &publish, &BasicProperties::default(), b"x").unwrap(),
        Some(1)
    );
    while p.client_frame().is_some() {}
    let deliver = BasicDeliver {
        consumer_tag: "c".into(),
        delivery_tag: 1,
        redelivered: false,
        exchange: "".into(),
        routing_key: "q".into(),
    };
    p.server_frames(&[Frame::Method(ch, deliver.into())]);
    p.server(
        ch,
        BasicAck {
            delivery_tag: 1,
            multiple: false,
        },
    );
    assert!(matches!(p.client_method(), Method::ConnectionClose(c) if c.reply_code == 505));
    assert!(!p.events().iter().any(|e| matches!(e, Event::Confirms { .. })));
}

#[test]
fn a_multiple_ack_gives_one_event_per_run_of_consecutive_publishes() {
    let (mut p, ch) = confirming_peer();
    let publish = BasicPublish {
        routing_key: "q".into(),
        ..Default::default()
    };
    for seq in 1..=1000 {
        assert_eq!(
            publish_one(&mut p.conn, ch, &publish, &BasicProperties::default(), b"x").unwrap(),
            Some(seq)
        );
    }
    // 7 nacked alone, then everything up to 600 acked, then 1000 nacked.
    p.server(
        ch,
        BasicNack {
            delivery_tag: 7,
            multiple: false,
            requeue: false,
        },
    );
    p.server(
        ch,
        BasicAck {
            delivery_tag: 600,
            multiple: true,
        },
    );
    p.server(
        ch,
        BasicNack {
            delivery_tag: 1000,
            multiple: true,
            requeue: false,
        },
    );
    let runs: Vec<(u64, u64, Outcome)> = p
        .events()
        .into_iter()
        .map(|e| match e {
            Event::Confirms {
                channel,
                first,
                last,
                outcome,
            } if channel == ch => (first, last, outcome),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        runs,
        [
            (7, 7, Outcome::Nack),
            (1, 6, Outcome::Ack),
            (8, 600, Outcome::Ack),
            (601, 1000, Outcome::Nack)
        ]
    );
    assert_eq!(p.conn.unconfirmed(ch), 0);
}

#[test]
fn blocked_and_unblocked_are_reported_once_each() {
    let mut p = Peer::open(0);
    p.server(
        0,
        ConnectionBlocked {
            reason: "low on memory".into(),
        },
    );
    p.server(
        0,
        ConnectionBlocked {
            reason: "low on memory".into(),
        },
    );
    assert!(p.conn.is_blocked());
    p.server(0, ConnectionUnblocked {});
    assert_eq!(
        p.events(),
        [
            Event::Blocked {
                reason: "low on memory".into()
            },
            Event::Unblocked
        ]
    );
}

#[test]
fn a_body_is_split_at_the_negotiated_frame_max() {
    let mut p = Peer::open(0);
    let ch = p.open_channel();
    let body = vec![1u8; 300_000];
    publish_one(
        &mut p.conn,
        ch,
        &BasicPublish::default(),
        &BasicProperties::default(),
        &body,
    )
    .unwrap();
    assert!(matches!(
        p.client_frame(),
        Some(Frame::Method(_, Method::BasicPublish(_)))
    ));
    assert!(matches!(p.client_frame(), Some(Frame::Header(..))));
    let mut sizes = Vec::new();
    while let Some(Frame::Body(_, b)) = p.client_frame() {
        sizes.push(b.len());
    }
    assert_eq!(sizes, [131_064, 131_064, 300_000 - 2 * 131_064]);
}

#[test]
fn client_close_waits_for_close_ok() {
    let mut p = Peer::open(0);
    p.conn.close();
    assert!(matches!(p.client_method(), Method::ConnectionClose(c) if c.reply_code == 200));
    assert!(!p.conn.is_closed());
    assert!(matches!(p.conn.open_channel(), Err(CommandError::ConnectionNotOpen)));
    p.server(0, ConnectionCloseOk {});
    assert_eq!(p.events(), [Event::Closed(CloseReason::ByClient)]);
}

/// Delivers `tags` on `ch` to consumer "c", one empty message each.
fn deliver(p: &mut Peer, ch: u16, tags: std::ops::RangeInclusive<u64>) {
    for tag in tags {
        let deliver = BasicDeliver {
            consumer_tag: "c".into(),
            delivery_tag: tag,
            redelivered: false,
            exchange: "".into(),
            routing_key: "q".into(),
        };
        p.server_frames(&[
            Frame::Method(ch, deliver.into()),
            Frame::Header(ch, ContentHeader::basic(0, BasicProperties::default())),
        ]);
    }
    p.events();
}

fn ack(p: &mut Peer, ch: u16, tag: u64) {
    let ack = BasicAck {
        delivery_tag: tag,
        multiple: false,
    };
    assert_eq!(p.conn.call(ch, ack.into()).unwrap(), None);
}

/// Every method the client has written since the last look.
fn written_methods(p: &mut Peer) -> Vec<Method> {
    std::iter::from_fn(|| match p.client_frame() {
        Some(Frame::Method(_, m)) => Some(m),
        Some(other) => panic!("expected a method, got {other:?}"),
        None => None,
    })
    .collect()
}

#[test]
fn acks_of_the_oldest_deliveries_go_out_as_one_multiple_ack_in_the_same_write() {
    let mut p = Peer::open(0);
    let ch = p.open_channel();
    deliver(&mut p, ch, 1..=100);
    for tag in 1..=100 {
        ack(&mut p, ch, tag);
    }
    assert_eq!(
        written_methods(&mut p),
        [Method::BasicAck(BasicAck {
            delivery_tag: 100,
            multiple: true
        })]
    );
}

#[test]
fn an_ack_past_a_delivery_still_in_hand_is_written_alone_and_the_multiple_ack_stops_short() {
    let mut p = Peer::open(0);
    let ch = p.open_channel();
    deliver(&mut p, ch, 1..=4);
    for tag in [1, 2, 4] {
        ack(&mut p, ch, tag);
    }
    let single = |tag| {
        Method::BasicAck(BasicAck {
            delivery_tag: tag,
            multiple: false,
        })
    };
    let multiple = |tag| {
        Method::BasicAck(BasicAck {
            delivery_tag: tag,
            multiple: true,
        })
    };
    assert_eq!(written_methods(&mut p), [single(4), multiple(2)]);
    ack(&mut p, ch, 3);
    assert_eq!(written_methods(&mut p), [multiple(3)]);
}

#[test]
fn ack_one_writes_what_an_ack_through_call_writes() {
    // The same acks, in an order with a gap, through `call` and through
    // `ack_one`: the same methods go out, after every step.
    let mut by_call = Peer::open(0);
    let mut by_ack_one = Peer::open(0);
    let ch = by_call.open_channel();
    assert_eq!(by_ack_one.open_channel(), ch);
    for p in [&mut by_call, &mut by_ack_one] {
        deliver(p, ch, 1..=6);
    }
    for tags in [&[1, 2, 4][..], &[3], &[6, 5]] {
        for &tag in tags {
            ack(&mut by_call, ch, tag);
            by_ack_one.conn.ack_one(ch, tag).unwrap();
        }
        let written = written_methods(&mut by_call);
        assert!(!written.is_empty());
        assert_eq!(written_methods(&mut by_ack_one), written, "after acking {tags:?}");
    }
    // A channel that is not open refuses it as `call` does.
    assert_eq!(
        by_ack_one.conn.ack_one(9, 1).unwrap_err().to_string(),
        by_call
            .conn
            .call(9, BasicAck::default().into())
            .unwrap_err()
            .to_string()
    );
}

#[test]
fn a_channel_close_and_a_connection_close_let_held_acks_out_first() {
    let mut p = Peer::open(0);
    let ch = p.open_channel();
    let other = p.open_channel();
    deliver(&mut p, ch, 1..=2);
    deliver(&mut p, other, 1..=3);
    ack(&mut p, ch, 1);
    p.conn.call(ch, ChannelClose::default().into()).unwrap();
    let methods = written_methods(&mut p);
    assert_eq!(
        methods[0],
        Method::BasicAck(BasicAck {
            delivery_tag: 1,
            multiple: true
        })
    );
    assert!(matches!(methods[1], Method::ChannelClose(_)), "{methods:?}");
    ack(&mut p, other, 1);
    ack(&mut p, other, 2);
    p.conn.close();
    let methods = written_methods(&mut p);
    assert_eq!(
        methods[0],
        Method::BasicAck(BasicAck {
            delivery_tag: 2,
            multiple: true
        })
    );
    assert!(matches!(methods[1], Method::ConnectionClose(_)), "{methods:?}");
}

// ---- deadlines of the waits for the broker (timer.rs) ----

fn closed_reason(events: &[Event]) -> Option<&CloseReason> {
    events.iter().find_map(|e| match e {
        Event::Closed(reason) => Some(reason),
        _ => None,
    })
}

/// The connection is still up just before `after`, and closed at `after`
/// with a timeout naming `waiting_for`.
fn ends_exactly_after(p: &mut Peer, after: Duration, waiting_for: Wait) {
    p.advance(after - Duration::from_millis(1));
    assert!(!p.conn.is_closed());
    p.advance(Duration::from_millis(1));
    assert!(p.conn.is_closed());
    assert_eq!(
        closed_reason(&p.events()),
        Some(&CloseReason::TimedOut { waiting_for, after })
    );
}

#[test]
fn a_broker_that_never_starts_the_handshake_times_it_out_without_heartbeats() {
    let mut p = Peer::new();
    p.take_raw(8);
    let handshake = Timeouts::default().handshake;
    assert_eq!(p.conn.poll_timeout(), Some(p.now + handshake));
    ends_exactly_after(&mut p, handshake, Wait::Handshake);
    assert_eq!(p.conn.poll_timeout(), None);
}

#[test]
fn an_open_connection_without_heartbeats_has_no_timer_running() {
    let p = Peer::open_without_heartbeats();
    assert_eq!(p.conn.poll_timeout(), None);
}

#[test]
fn an_unanswered_channel_open_fails_and_the_channel_is_closed_keeping_its_number() {
    let mut p = Peer::open_without_heartbeats();
    let (id, token) = p.conn.open_channel().unwrap();
    assert!(matches!(p.client_method(), Method::ChannelOpen(_)));
    let open = Timeouts::default().channel_open;
    assert_eq!(p.conn.poll_timeout(), Some(p.now + open));
    p.advance(open);
    assert_eq!(
        p.events(),
        vec![Event::Reply {
            channel: id,
            token,
            result: Err(CallError::TimedOut {
                waiting_for: Wait::ChannelOpenOk,
                after: open
            }),
        }]
    );
    // The broker may still open it, so the client closes it, and the
    // number is not handed out again until the broker says it is closed.
    assert!(matches!(p.client_method(), Method::ChannelClose(c) if c.reply_code == 200));
    let (other, _) = p.conn.open_channel().unwrap();
    assert_ne!(other, id);
    // A late open-ok is ignored; the close-ok frees the number.
    p.server(id, ChannelOpenOk::default());
    p.server(id, ChannelCloseOk {});
    assert!(p
        .events()
        .iter()
        .any(|e| matches!(e, Event::ChannelClosed { channel, refusal: None, .. } if *channel == id)));
    assert!(!p.conn.is_closed());
    assert_eq!(p.conn.open_channel().unwrap().0, id);
}

#[test]
fn the_channel_open_deadline_does_not_run_while_the_broker_blocks_the_connection() {
    let mut p = Peer::open_without_heartbeats();
    p.server(
        0,
        ConnectionBlocked {
            reason: "low on memory".into(),
        },
    );
    let (id, _) = p.conn.open_channel().unwrap();
    p.flush();
    let open = Timeouts::default().channel_open;
    p.advance(open * 3);
    assert!(!p.events().iter().any(|e| matches!(e, Event::Reply { .. })));
    p.server(0, ConnectionUnblocked {});
    p.server(id, ChannelOpenOk::default());
    assert!(p
        .events()
        .iter()
        .any(|e| matches!(e, Event::Reply { result: Ok(_), .. })));
    assert!(p.conn.is_channel_open(id));
}

#[test]
fn a_channel_close_without_close_ok_ends_the_connection_in_bounded_time() {
    let mut p = Peer::open_without_heartbeats();
    let ch = p.open_channel();
    let token = p.conn.call(ch, goodbye().into()).unwrap().unwrap();
    p.flush();
    let close = Timeouts::default().close;
    p.advance(close);
    // The connection is closed politely first...
    assert!(matches!(p.client_method(), Method::ChannelClose(_)));
    assert!(matches!(p.client_method(), Method::ConnectionClose(c) if c.reply_code == 504));
    // ...and given up on when that is not answered either.
    p.advance(close);
    assert!(p.conn.is_closed());
    let events = p.events();
    let timed_out = CloseReason::TimedOut {
        waiting_for: Wait::ChannelCloseOk,
        after: close,
    };
    assert!(events.iter().any(|e| matches!(
        e,
        Event::Reply { token: t, result: Err(CallError::ConnectionClosed(r)), .. } if *t == token && *r == timed_out
    )));
    assert_eq!(closed_reason(&events), Some(&timed_out));
}

#[test]
fn a_close_the_broker_never_answers_ends_after_the_close_timeout() {
    let mut p = Peer::open_without_heartbeats();
    p.conn.close();
    assert!(matches!(p.client_method(), Method::ConnectionClose(c) if c.reply_code == 200));
    ends_exactly_after(&mut p, Timeouts::default().close, Wait::ConnectionCloseOk);
}

#[test]
fn a_close_answered_in_time_is_a_close_by_the_client() {
    let mut p = Peer::open_without_heartbeats();
    p.conn.close();
    p.flush();
    p.advance(Timeouts::default().close / 2);
    p.server(0, ConnectionCloseOk {});
    assert_eq!(closed_reason(&p.events()), Some(&CloseReason::ByClient));
    assert_eq!(p.conn.poll_timeout(), None);
}

/// One of each synchronous call a client makes on an open channel, as the
/// machine's callers send them (with a reply expected).
fn every_call_kind() -> Vec<Method> {
    vec![
        ExchangeDeclare::default().into(),
        ExchangeDelete::default().into(),
        ExchangeBind::default().into(),
        ExchangeUnbind::default().into(),
        QueueDeclare::default().into(),
        QueueBind::default().into(),
        QueueUnbind::default().into(),
        QueuePurge::default().into(),
        QueueDelete::default().into(),
        BasicQos::default().into(),
        BasicConsume::default().into(),
        BasicCancel::default().into(),
        BasicGet::default().into(),
        BasicRecover::default().into(),
        ConfirmSelect::default().into(),
        TxSelect::default().into(),
        TxCommit::default().into(),
        TxRollback::default().into(),
        ChannelFlow::default().into(),
    ]
}

#[test]
fn every_unanswered_call_fails_after_the_call_timeout_and_its_channel_is_closed() {
    let call = Timeouts::default().call;
    for method in every_call_kind() {
        let name = method.name();
        let mut p = Peer::open_without_heartbeats();
        let ch = p.open_channel();
        let token = p
            .conn
            .call(ch, method)
            .unwrap()
            .unwrap_or_else(|| panic!("{name} expects a reply"));
        p.client_method();
        assert_eq!(p.conn.poll_timeout(), Some(p.now + call), "{name}");
        p.advance(call - Duration::from_millis(1));
        assert_eq!(p.events(), vec![], "{name}");
        p.advance(Duration::from_millis(1));
        assert_eq!(
            p.events(),
            vec![Event::Reply {
                channel: ch,
                token,
                result: Err(CallError::TimedOut {
                    waiting_for: Wait::Reply { to: name },
                    after: call,
                }),
            }],
            "{name}"
        );
        // The channel is closed: nothing more goes on it, and its number
        // comes back once the broker confirms.
        assert!(
            matches!(p.client_method(), Method::ChannelClose(c) if c.reply_code == 200),
            "{name}"
        );
        assert!(!p.conn.is_channel_open(ch));
        assert_eq!(
            p.conn.call(ch, QueueDeclare::default().into()),
            Err(CommandError::ChannelNotOpen(ch))
        );
        p.server(ch, ChannelCloseOk {});
        assert!(p
            .events()
            .iter()
            .any(|e| matches!(e, Event::ChannelClosed { channel, refusal: None, .. } if *channel == ch)));
        assert!(!p.conn.is_closed(), "{name}");
        assert_eq!(p.open_channel(), ch);
    }
}

#[test]
fn calls_behind_an_unanswered_call_fail_with_it_and_a_late_reply_answers_none_of_them() {
    let call = Timeouts::default().call;
    let mut p = Peer::open_without_heartbeats();
    let ch = p.open_channel();
    let first = p.conn.call(ch, QueueDeclare::default().into()).unwrap().unwrap();
    let second = p.conn.call(ch, QueueBind::default().into()).unwrap().unwrap();
    p.flush();
    p.advance(call);
    let timed_out = Err(CallError::TimedOut {
        waiting_for: Wait::Reply { to: "queue.declare" },
        after: call,
    });
    let replies: Vec<_> = p
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Reply { token, result, .. } => Some((token, result)),
            _ => None,
        })
        .collect();
    assert_eq!(replies, vec![(first, timed_out.clone()), (second, timed_out)]);
    // The broker wakes up: its late declare-ok is ignored on the closing channel.
    p.server(
        ch,
        QueueDeclareOk {
            queue: "q".into(),
            ..Default::default()
        },
    );
    assert!(!p.conn.is_closed());
    assert_eq!(p.events(), vec![]);
}

#[test]
fn a_call_answered_in_time_leaves_no_deadline_and_the_next_runs_from_its_own_write() {
    let call = Timeouts::default().call;
    let mut p = Peer::open_without_heartbeats();
    let ch = p.open_channel();
    p.conn.call(ch, QueueDeclare::default().into()).unwrap();
    p.flush();
    p.advance(call / 2);
    p.server(
        ch,
        QueueDeclareOk {
            queue: "q".into(),
            ..Default::default()
        },
    );
    p.events();
    // The answered call's deadline is stale: it fires nothing. The next
    // call's runs from when it is written, not from when it is made.
    p.conn.call(ch, QueueBind::default().into()).unwrap();
    p.advance(call / 2);
    p.flush();
    p.advance(call / 2);
    assert_eq!(p.events(), vec![]);
    assert!(p.conn.is_channel_open(ch));
    p.advance(call / 2);
    assert!(matches!(
        &p.events()[..],
        [Event::Reply {
            result: Err(CallError::TimedOut {
                waiting_for: Wait::Reply { to: "queue.bind" },
                ..
            }),
            ..
        }]
    ));
}

#[test]
fn the_call_deadline_does_not_run_while_the_broker_blocks_the_connection() {
    let call = Timeouts::default().call;
    let mut p = Peer::open_without_heartbeats();
    let ch = p.open_channel();
    p.server(
        0,
        ConnectionBlocked {
            reason: "low on memory".into(),
        },
    );
    p.events();
    p.conn.call(ch, QueueDeclare::default().into()).unwrap();
    p.flush();
    p.advance(call * 3);
    assert!(!p.events().iter().any(|e| matches!(e, Event::Reply { .. })));
    p.server(0, ConnectionUnblocked {});
    p.server(
        ch,
        QueueDeclareOk {
            queue: "q".into(),
            ..Default::default()
        },
    );
    assert!(p
        .events()
        .iter()
        .any(|e| matches!(e, Event::Reply { result: Ok(_), .. })));
    assert!(p.conn.is_channel_open(ch));
}

#[test]
fn a_channel_whose_call_timed_out_and_whose_close_is_unanswered_ends_the_connection_in_bounded_time() {
    let timeouts = Timeouts::default();
    let mut p = Peer::open_without_heartbeats();
    let ch = p.open_channel();
    p.conn.call(ch, QueueDeclare::default().into()).unwrap();
    assert!(matches!(p.client_method(), Method::QueueDeclare(_)));
    p.advance(timeouts.call);
    assert!(matches!(p.client_method(), Method::ChannelClose(_)));
    p.advance(timeouts.close);
    assert!(matches!(p.client_method(), Method::ConnectionClose(c) if c.reply_code == 504));
    p.advance(timeouts.close);
    assert!(p.conn.is_closed());
}

fn secret_update_reply(events: &[Event], token: Token) -> Option<&Result<Reply, CallError>> {
    events.iter().find_map(|e| match e {
        Event::Reply {
            channel: 0,
            token: t,
            result,
        } if *t == token => Some(result),
        _ => None,
    })
}

#[test]
fn update_secret_writes_the_secret_and_its_ok_answers_the_oldest_update() {
    let mut p = Peer::open_without_heartbeats();
    let first = p.conn.update_secret(&Secret::new("token-1"), "refresh").unwrap();
    let second = p.conn.update_secret(&Secret::new("token-2"), &"r".repeat(300)).unwrap();
    let Method::ConnectionUpdateSecret(m) = p.client_method() else {
        panic!("expected update-secret")
    };
    assert_eq!(
        (m.new_secret.as_bytes(), m.reason.as_bytes()),
        (&b"token-1"[..], &b"refresh"[..])
    );
    let Method::ConnectionUpdateSecret(m) = p.client_method() else {
        panic!("expected update-secret")
    };
    assert_eq!(m.new_secret.as_bytes(), b"token-2");
    assert_eq!(m.reason.as_bytes().len(), 255, "the reason is cut to a short string");
    p.server(0, ConnectionUpdateSecretOk {});
    let events = p.events();
    assert!(matches!(secret_update_reply(&events, first), Some(Ok(_))));
    assert!(secret_update_reply(&events, second).is_none());
    p.server(0, ConnectionUpdateSecretOk {});
    assert!(matches!(secret_update_reply(&p.events(), second), Some(Ok(_))));
    // One more, asked for by nobody, changes nothing.
    p.server(0, ConnectionUpdateSecretOk {});
    assert!(p.events().is_empty());
    assert!(p.conn.is_open());
}

#[test]
fn an_unanswered_update_secret_times_out_and_its_late_ok_answers_no_later_update() {
    let call = Timeouts::default().call;
    let mut p = Peer::open_without_heartbeats();
    let late = p.conn.update_secret(&Secret::new("a"), "").unwrap();
    p.flush();
    p.advance(call - Duration::from_millis(1));
    assert!(p.events().is_empty());
    p.advance(Duration::from_millis(1));
    let events = p.events();
    assert!(matches!(
        secret_update_reply(&events, late),
        Some(Err(CallError::TimedOut {
            waiting_for: Wait::Reply {
                to: "connection.update-secret"
            },
            ..
        }))
    ));
    let next = p.conn.update_secret(&Secret::new("b"), "").unwrap();
    p.flush();
    p.server(0, ConnectionUpdateSecretOk {});
    assert!(p.events().is_empty(), "the late ok was the first update's");
    p.server(0, ConnectionUpdateSecretOk {});
    assert!(matches!(secret_update_reply(&p.events(), next), Some(Ok(_))));
    assert!(p.conn.is_open());
}

#[test]
fn an_update_secret_waits_through_a_block_and_fails_when_the_connection_ends() {
    let call = Timeouts::default().call;
    let mut p = Peer::open_without_heartbeats();
    p.server(
        0,
        ConnectionBlocked {
            reason: "low on memory".into(),
        },
    );
    p.events();
    let token = p.conn.update_secret(&Secret::new("a"), "").unwrap();
    p.flush();
    p.advance(call * 3);
    assert!(secret_update_reply(&p.events(), token).is_none());
    p.server(
        0,
        ConnectionClose {
            reply_code: 530,
            reply_text: "NOT_ALLOWED - New secret was refused by one of the backends".into(),
            class_id: 10,
            method_id: 70,
        },
    );
    let events = p.events();
    assert!(matches!(
        secret_update_reply(&events, token),
        Some(Err(CallError::ConnectionClosed(CloseReason::ByServer(r)))) if r.code == 530
    ));
    assert!(p.conn.update_secret(&Secret::new("b"), "").is_err());
}

#[test]
fn update_secret_is_refused_before_the_connection_is_open() {
    let mut p = Peer::new();
    assert_eq!(
        p.conn.update_secret(&Secret::new("a"), ""),
        Err(CommandError::ConnectionNotOpen)
    );
}

#[test]
fn the_machines_debug_never_shows_the_credentials_it_has_to_write() {
    let params = ConnectionParams {
        auth: Auth::plain("guest", "pw-in-start-ok"),
        ..ConnectionParams::default()
    };
    let mut p = Peer::with(params);
    p.take_raw(8);
    p.server(
        0,
        ConnectionStart {
            version_major: 0,
            version_minor: 9,
            mechanisms: "PLAIN".into(),
            locales: "en_US".into(),
            ..Default::default()
        },
    );
    // start-ok waits in the machine, unwritten.
    let debug = format!("{:?}", p.conn);
    assert!(!debug.contains("pw-in-start-ok"), "{debug}");
    assert!(debug.contains("unwritten_bytes"), "{debug}");

    let mut p = Peer::open_without_heartbeats();
    p.conn.update_secret(&Secret::new("token-in-update"), "").unwrap();
    let debug = format!("{:?}", p.conn);
    assert!(!debug.contains("token-in-update"), "{debug}");
}
