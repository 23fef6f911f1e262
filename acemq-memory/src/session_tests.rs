//! The session driven without tokio: bytes in, frames out, a virtual clock.

use std::time::{Duration, Instant};

use acemq_codec::{encode_method, ConnectionTuneOk, Frame, FrameDecoder, Method, PROTOCOL_HEADER};
use bytes::BytesMut;

use crate::broker::{BrokerMachine, ConnId};
use crate::session::{Fate, Session};
use crate::BrokerConfig;

fn frames(machine: &mut BrokerMachine, id: ConnId) -> Vec<Frame> {
    let mut out = machine.take_output(id);
    let decoder = FrameDecoder::new(0);
    let mut frames = Vec::new();
    while let Ok(Some(frame)) = decoder.decode(&mut out) {
        frames.push(frame);
    }
    frames
}

fn open(heartbeat: u16) -> (BrokerMachine, Session, Instant) {
    let now = Instant::now();
    let mut machine = BrokerMachine::new(BrokerConfig::default(), now);
    let mut session = Session::new(&mut machine, now);
    let mut input = crate::fuzzing::handshake(heartbeat);
    session.handle_input(&mut machine, &mut input, now);
    assert!(input.is_empty());
    let names: Vec<&str> = frames(&mut machine, session.id())
        .iter()
        .map(|f| match f {
            Frame::Method(_, m) => m.name(),
            _ => "other",
        })
        .collect();
    assert_eq!(
        names,
        [
            "connection.start",
            "connection.tune",
            "connection.open-ok",
            "channel.open-ok",
            "channel.open-ok",
            "confirm.select-ok"
        ]
    );
    (machine, session, now)
}

#[test]
fn the_handshake_needs_no_runtime() {
    let (machine, session, _) = open(0);
    assert_eq!(session.fate(), Fate::Running);
    assert_eq!(machine.connection_count(), 1);
    assert_eq!(session.poll_timeout(), None);
}

#[test]
fn heartbeat_deadlines_follow_the_negotiated_interval() {
    let (mut machine, mut session, start) = open(4);
    assert_eq!(session.poll_timeout(), Some(start + Duration::from_secs(2)));
    session.handle_timeout(&mut machine, start + Duration::from_secs(2));
    assert_eq!(frames(&mut machine, session.id()), [Frame::Heartbeat]);
    session.transmitted(start + Duration::from_secs(2));
    session.handle_timeout(&mut machine, start + Duration::from_secs(8));
    assert_eq!(
        session.fate(),
        Fate::Sever,
        "two intervals without a byte from the client"
    );
}

#[test]
fn a_refused_tune_ok_waits_then_drops_without_a_frame() {
    let now = Instant::now();
    let mut machine = BrokerMachine::new(BrokerConfig::default(), now);
    let mut session = Session::new(&mut machine, now);
    session.handle_input(&mut machine, &mut BytesMut::from(&PROTOCOL_HEADER[..]), now);
    let mut tune = BytesMut::new();
    encode_method(
        0,
        &acemq_codec::ConnectionStartOk {
            mechanism: "PLAIN".into(),
            response: b"\0guest\0guest".as_slice().into(),
            ..Default::default()
        }
        .into(),
        &mut tune,
    )
    .unwrap();
    encode_method(
        0,
        &ConnectionTuneOk {
            channel_max: 10,
            frame_max: 1024,
            heartbeat: 0,
        }
        .into(),
        &mut tune,
    )
    .unwrap();
    session.handle_input(&mut machine, &mut tune, now);
    let _ = frames(&mut machine, session.id());
    assert_eq!(session.poll_timeout(), Some(now + Duration::from_secs(3)));
    session.handle_timeout(&mut machine, now + Duration::from_secs(3));
    assert_eq!(session.fate(), Fate::Sever);
    assert!(frames(&mut machine, session.id()).is_empty());
}

/// The close a session answers `input` with, after the handshake.
fn close_for(input: impl FnOnce(&mut BytesMut)) -> (u16, String, u16, u16) {
    let (mut machine, mut session, now) = open(0);
    let mut bytes = BytesMut::new();
    input(&mut bytes);
    session.handle_input(&mut machine, &mut bytes, now);
    let closes: Vec<_> = frames(&mut machine, session.id())
        .into_iter()
        .filter_map(|f| match f {
            Frame::Method(_, Method::ConnectionClose(c)) => Some(c),
            _ => None,
        })
        .collect();
    let [close] = &closes[..] else {
        panic!("one connection.close, got {closes:?}")
    };
    (
        close.reply_code,
        close.reply_text.to_string(),
        close.class_id,
        close.method_id,
    )
}

fn publish(out: &mut BytesMut) {
    encode_method(1, &acemq_codec::BasicPublish::default().into(), out).unwrap();
}

fn header(out: &mut BytesMut, body_size: u64) {
    let header = acemq_codec::ContentHeader::basic(body_size, acemq_codec::BasicProperties::default());
    Frame::Header(1, header).encode(out).unwrap();
}

#[test]
fn content_out_of_sequence_is_refused_in_rabbitmqs_words() {
    let unexpected = |text: &str| (505, format!("UNEXPECTED_FRAME - {text}"), 60, 40);
    assert_eq!(
        close_for(|out| header(out, 1)),
        unexpected("expected method frame, got content header frame instead")
    );
    assert_eq!(
        close_for(|out| acemq_codec::encode_body(1, b"x", out).unwrap()),
        unexpected("expected method frame, got content body frame instead")
    );
    assert_eq!(
        close_for(|out| {
            publish(out);
            encode_method(1, &acemq_codec::BasicQos::default().into(), out).unwrap();
        }),
        unexpected("expected content header for class 60, got non content header frame instead")
    );
    assert_eq!(
        close_for(|out| {
            publish(out);
            publish(out);
        }),
        unexpected("expected content header for class 60, got non content header frame instead")
    );
    assert_eq!(
        close_for(|out| {
            publish(out);
            acemq_codec::encode_body(1, b"x", out).unwrap();
        }),
        unexpected("expected content header frame, got content body frame instead")
    );
    assert_eq!(
        close_for(|out| {
            publish(out);
            header(out, 1);
            header(out, 1);
        }),
        unexpected("expected content body frame, got content header frame instead")
    );
    assert_eq!(
        close_for(|out| {
            publish(out);
            header(out, 1);
            acemq_codec::encode_body(1, b"xy", out).unwrap();
        }),
        unexpected("content body of 2 bytes exceeds the announced 1")
    );
}

#[test]
fn a_body_above_the_limit_closes_only_the_channel() {
    let (mut machine, mut session, now) = open(0);
    let max = machine.config().max_message_size;
    let mut bytes = BytesMut::new();
    publish(&mut bytes);
    header(&mut bytes, max + 1);
    session.handle_input(&mut machine, &mut bytes, now);
    let close = frames(&mut machine, session.id()).into_iter().find_map(|f| match f {
        Frame::Method(1, Method::ChannelClose(c)) => Some(c),
        _ => None,
    });
    let close = close.expect("channel.close");
    assert_eq!(close.reply_code, 406);
    assert_eq!(
        close.reply_text.to_string(),
        format!(
            "PRECONDITION_FAILED - message size {} is larger than configured max size {max}",
            max + 1
        )
    );
    assert_eq!((close.class_id, close.method_id), (60, 40));
    assert_eq!(session.fate(), Fate::Running);
}

/// A body frame of `payload` bytes (header, payload, end byte), as any
/// client could write it, whatever the limit.
fn body_frame(out: &mut BytesMut, payload: usize) {
    use bytes::BufMut;
    out.put_u8(3);
    out.put_u16(1);
    out.put_u32(payload as u32);
    out.put_bytes(b'x', payload);
    out.put_u8(0xCE);
}

#[test]
fn a_body_frame_of_frame_max_bytes_of_payload_is_taken_and_one_more_is_a_frame_error() {
    // The handshake negotiated frame_max 131072: a payload of exactly that
    // (131080 bytes on the wire) passes, as on RabbitMQ ...
    let (mut machine, mut session, now) = open(0);
    let mut bytes = BytesMut::new();
    publish(&mut bytes);
    header(&mut bytes, 131_072);
    body_frame(&mut bytes, 131_072);
    session.handle_input(&mut machine, &mut bytes, now);
    let closes = frames(&mut machine, session.id())
        .into_iter()
        .filter(|f| {
            matches!(
                f,
                Frame::Method(_, Method::ConnectionClose(_) | Method::ChannelClose(_))
            )
        })
        .count();
    assert_eq!(closes, 0);
    assert_eq!(session.fate(), Fate::Running);
    // ... and one byte more is refused from the frame's header, in RabbitMQ's words.
    assert_eq!(
        close_for(|out| {
            publish(out);
            header(out, 131_073);
            body_frame(out, 131_073);
        }),
        (
            501,
            "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,131073,131064}".to_owned(),
            0,
            0
        )
    );
}

#[test]
fn channel_flow_active_false_closes_the_connection_with_540() {
    let flow =
        |active| move |out: &mut BytesMut| encode_method(1, &acemq_codec::ChannelFlow { active }.into(), out).unwrap();
    assert_eq!(
        close_for(flow(false)),
        (540, "NOT_IMPLEMENTED - active=false".to_owned(), 20, 20)
    );
    let (mut machine, mut session, now) = open(0);
    let mut bytes = BytesMut::new();
    flow(true)(&mut bytes);
    session.handle_input(&mut machine, &mut bytes, now);
    assert_eq!(
        frames(&mut machine, session.id()),
        [Frame::Method(
            1,
            Method::ChannelFlowOk(acemq_codec::ChannelFlowOk { active: true })
        )]
    );
}

/// A wake-up asks the machine for its next deadline: that comes from a
/// heap, not from a scan of every queue (which made 10,000 wake-ups with
/// 100,000 queues take 10^9 steps).
#[test]
fn the_next_deadline_comes_from_a_heap_not_a_scan_of_the_queues() {
    use acemq_codec::{encode_content, BasicProperties, BasicPublish, FieldTable, FieldValue, QueueDeclare};

    let (mut machine, mut session, now) = open(0);
    let mut input = BytesMut::new();
    for n in 0..100_000 {
        let declare = QueueDeclare {
            queue: format!("q{n}").as_str().into(),
            no_wait: true,
            ..Default::default()
        };
        encode_method(2, &declare.into(), &mut input).unwrap();
    }
    let mut ttl = FieldTable::new();
    ttl.insert("x-message-ttl", FieldValue::I32(1000));
    let declare = QueueDeclare {
        queue: "ttl".into(),
        no_wait: true,
        arguments: ttl,
        ..Default::default()
    };
    encode_method(2, &declare.into(), &mut input).unwrap();
    let publish = BasicPublish {
        routing_key: "ttl".into(),
        ..Default::default()
    };
    encode_content(
        2,
        &publish.into(),
        &BasicProperties::default(),
        b"x",
        131_072,
        &mut input,
    )
    .unwrap();
    while !input.is_empty() {
        session.handle_input(&mut machine, &mut input, now);
        let _ = machine.take_output(session.id());
        machine.output_written(session.id(), usize::MAX, now);
    }
    assert_eq!(machine.queue_info("/", "ttl").map(|q| q.messages), Some(1));

    let due = now + Duration::from_secs(1);
    let started = Instant::now();
    for _ in 0..10_000 {
        assert_eq!(machine.poll_timeout(), Some(due));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "10,000 wake-ups took {took:?}");

    machine.handle_timeout(due);
    assert_eq!(machine.queue_info("/", "ttl").map(|q| q.messages), Some(0));
    assert_eq!(machine.poll_timeout(), None, "no deadline is left");
}
