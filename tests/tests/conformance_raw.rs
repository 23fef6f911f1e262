//! Raw frames and wire transcripts on the low-level API (feature
//! `conformance`), against every broker: what a broker answers to frames
//! the state machine would never send, each reply code as the broker gives
//! it; the API of a raw connection failing typed; and transcripts that list
//! exactly the frames that went over the wire.

use std::time::Duration;

use acemq_codec::{
    BasicConsume, BasicProperties, BasicPublish, ConnectionClose, ConnectionCloseOk, ContentHeader, FieldTable, Frame,
    Method, QueueDeclare,
};
use acemq_core::amqp::{Confirmation, Connection, Direction, Error, RawConnection, RawError, Transcript, WireFrame};
use acemq_tests::{brokers, unique, Broker, RabbitVersion};
use bytes::Bytes;

const WAIT: Duration = Duration::from_secs(10);

/// A connection whose heartbeats (which nothing answers once raw) are a
/// minute apart, far longer than a test, and its raw side, after
/// `channels` channels were opened by the API.
async fn raw_after(b: &Broker, query: &str, channels: usize) -> (Connection, RawConnection) {
    let url = format!("{}?heartbeat=60{query}", b.url);
    let conn = Connection::open(&url, b.config().with_transcript(1000))
        .await
        .unwrap_or_else(|e| panic!("{:?}: {e}", b.kind));
    // Held until the switch: a channel whose last handle is dropped is
    // closed (`channel.close` goes out).
    let mut open = Vec::new();
    for _ in 0..channels {
        open.push(conn.channel().await.unwrap());
    }
    let mut raw = conn.raw().await.unwrap();
    drop(open);
    raw.set_timeout(WAIT);
    (conn, raw)
}

/// What the broker answered: its first `connection.close` or
/// `channel.close` (read as frames, anything before it skipped), or how the
/// input ended without one.
#[derive(Debug, PartialEq)]
enum Answer {
    Close {
        code: u16,
        class_id: u16,
        method_id: u16,
    },
    ChannelClose {
        channel: u16,
        code: u16,
        class_id: u16,
        method_id: u16,
    },
    Hangup,
}

async fn answer(b: &Broker, raw: &mut RawConnection) -> Answer {
    for _ in 0..100 {
        match raw.recv().await {
            Ok(Frame::Method(0, Method::ConnectionClose(close))) => {
                // The close is acknowledged, and the broker then hangs up.
                raw.send(&Frame::Method(0, ConnectionCloseOk {}.into())).await.ok();
                let end = drain_to_end(raw).await;
                assert!(end, "{:?}: the broker hangs up after close-ok", b.kind);
                return Answer::Close {
                    code: close.reply_code,
                    class_id: close.class_id,
                    method_id: close.method_id,
                };
            }
            Ok(Frame::Method(channel, Method::ChannelClose(close))) => {
                return Answer::ChannelClose {
                    channel,
                    code: close.reply_code,
                    class_id: close.class_id,
                    method_id: close.method_id,
                };
            }
            Ok(_) => continue,
            Err(RawError::Ended { .. }) => return Answer::Hangup,
            Err(RawError::TimedOut(after)) => panic!("{:?}: no answer within {after:?}", b.kind),
            Err(other) => panic!("{:?}: {other}", b.kind),
        }
    }
    panic!("{:?}: no close among 100 frames", b.kind)
}

/// Every broker's answer against the one expected of it, all shown when
/// one differs.
fn check(answers: Vec<(acemq_tests::Kind, Answer, Answer)>) {
    let wrong: Vec<_> = answers.iter().filter(|(_, got, expected)| got != expected).collect();
    assert!(wrong.is_empty(), "(broker, answer, expected): {answers:#?}");
}

/// Reads until the input ends; whether it did within the deadline.
async fn drain_to_end(raw: &mut RawConnection) -> bool {
    for _ in 0..100 {
        match raw.recv().await {
            Err(RawError::Ended { .. }) => return true,
            Err(RawError::TimedOut(_)) => return false,
            _ => continue,
        }
    }
    false
}

/// The transcript's entries from the first `from` frame on, as
/// (direction, channel, name).
fn lines(transcript: &Transcript) -> Vec<(Direction, u16, &'static str)> {
    transcript
        .iter()
        .map(|entry| (entry.direction, entry.frame.channel(), entry.frame.name()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_an_unknown_method_is_hung_up_on_by_every_broker() {
    acemq_tests::deadline(async {
        let mut answers = Vec::new();
        for b in brokers().await {
            let (_conn, mut raw) = raw_after(&b, "", 1).await;
            raw.send_bytes(RawConnection::method_bytes(1, 999, 10, &[]))
                .await
                .unwrap();
            // RabbitMQ's reader cannot parse a method of an unknown class
            // and drops the connection without a close; acemq-memory does
            // as it does.
            let expected = Answer::Hangup;
            let got = answer(&b, &mut raw).await;
            // The transcript shows it as it went: undecodable, sent.
            let transcript = raw.transcript().unwrap();
            let sent = transcript
                .iter()
                .find(|e| matches!(e.frame, WireFrame::Undecodable { .. }))
                .unwrap_or_else(|| panic!("{:?}: {transcript}", b.kind));
            assert_eq!(sent.direction, Direction::Sent);
            if let Answer::Close { .. } = got {
                assert!(
                    transcript
                        .iter()
                        .any(|e| e.direction == Direction::Received && e.frame.name() == "connection.close"),
                    "{:?}: {transcript}",
                    b.kind
                );
            }
            answers.push((b.kind, got, expected));
        }
        check(answers);
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_a_frame_over_frame_max_is_answered_with_501_frame_error() {
    acemq_tests::deadline(async {
        let mut answers = Vec::new();
        for b in brokers().await {
            let (conn, raw) = raw_after(&b, "&frame_max=8192", 1).await;
            assert_eq!(conn.tuned().frame_max, 8192);
            let publish = BasicPublish {
                routing_key: "nowhere".into(),
                ..Default::default()
            };
            let body = Bytes::from(vec![b'x'; 9000]);
            raw.send_all(&[
                Frame::Method(1, publish.into()),
                Frame::Header(1, ContentHeader::basic(body.len() as u64, BasicProperties::default())),
                Frame::Body(1, body),
            ])
            .await
            .unwrap();
            let mut raw = raw;
            let expected = Answer::Close {
                code: 501,
                class_id: 0,
                method_id: 0,
            };
            answers.push((b.kind, answer(&b, &mut raw).await, expected));
        }
        check(answers);
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_a_body_on_another_channel_than_its_header_is_answered_with_505_unexpected_frame() {
    acemq_tests::deadline(async {
        let mut answers = Vec::new();
        for b in brokers().await {
            let (_conn, mut raw) = raw_after(&b, "", 2).await;
            let publish = BasicPublish {
                routing_key: "nowhere".into(),
                ..Default::default()
            };
            raw.send_all(&[
                Frame::Method(1, publish.into()),
                Frame::Header(1, ContentHeader::basic(5, BasicProperties::default())),
                Frame::Body(2, Bytes::from_static(b"hello")),
            ])
            .await
            .unwrap();
            // Both close the connection with 505 UNEXPECTED_FRAME;
            // acemq-memory blames basic.publish (60, 40), RabbitMQ no method.
            let expected = match b.version() {
                None => Answer::Close {
                    code: 505,
                    class_id: 60,
                    method_id: 40,
                },
                Some(RabbitVersion::V3_10 | RabbitVersion::V4_0) => Answer::Close {
                    code: 505,
                    class_id: 0,
                    method_id: 0,
                },
            };
            answers.push((b.kind, answer(&b, &mut raw).await, expected));
        }
        check(answers);
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_bytes_that_are_not_a_frame_are_answered_by_the_broker() {
    acemq_tests::deadline(async {
        let mut answers = Vec::new();
        for b in brokers().await {
            let (_conn, mut raw) = raw_after(&b, "", 0).await;
            raw.send_bytes(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..]).await.unwrap();
            // An unknown frame type ('G'): 501 FRAME_ERROR from all three.
            let expected = Answer::Close {
                code: 501,
                class_id: 0,
                method_id: 0,
            };
            answers.push((b.kind, answer(&b, &mut raw).await, expected));
            let transcript = raw.transcript().unwrap();
            assert!(
                transcript
                    .iter()
                    .any(|e| e.direction == Direction::Sent
                        && matches!(e.frame, WireFrame::Unframed { error: Some(_), .. })),
                "{transcript}"
            );
        }
        check(answers);
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_connection_refuses_every_api_call_typed_and_says_it_is_raw() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = Connection::open(&format!("{}?heartbeat=60", b.url), b.config())
                .await
                .unwrap();
            let ch = conn.channel().await.unwrap();
            let queue = acemq_tests::exclusive_queue(&ch).await;
            let mut consumer = ch
                .basic_consume(BasicConsume {
                    queue: queue.as_str().into(),
                    ..Default::default()
                })
                .await
                .unwrap();
            assert!(!conn.is_raw());
            let mut raw = conn.raw().await.unwrap();
            assert!(conn.is_raw(), "{:?}", b.kind);
            assert!(!conn.is_closed(), "{:?}: the socket is still open", b.kind);
            assert!(!ch.is_open());
            assert!(matches!(conn.channel().await, Err(Error::Raw)), "{:?}", b.kind);
            let declared = ch.queue_declare(QueueDeclare::default()).await;
            assert!(matches!(declared, Err(Error::Raw)), "{:?}: {declared:?}", b.kind);
            let published = ch.publish("", &queue, false, BasicProperties::default(), "x").await;
            assert!(matches!(published, Err(Error::Raw)), "{:?}: {published:?}", b.kind);
            assert!(matches!(conn.close().await, Err(Error::Raw)), "{:?}", b.kind);
            assert!(matches!(conn.raw().await, Err(Error::Raw)), "{:?}", b.kind);
            assert!(matches!(ch.close_error(), Some(Error::Raw)), "{:?}", b.kind);
            // The consumer's stream ends.
            let next = tokio::time::timeout(WAIT, consumer.next()).await.unwrap();
            assert!(next.is_none(), "{:?}", b.kind);
            // The socket is still the caller's: a clean close by hand.
            raw.send(&Frame::Method(
                0,
                ConnectionClose {
                    reply_code: 200,
                    reply_text: "bye".into(),
                    ..Default::default()
                }
                .into(),
            ))
            .await
            .unwrap();
            let close_ok = raw.recv_timeout(WAIT).await.unwrap();
            assert_eq!(close_ok, Frame::Method(0, ConnectionCloseOk {}.into()), "{:?}", b.kind);
            drop(raw);
            tokio::time::timeout(WAIT, conn.closed()).await.unwrap();
            assert!(conn.is_closed() && conn.is_raw());
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_heartbeats_are_no_longer_answered_and_the_broker_gives_up() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = Connection::open(&format!("{}?heartbeat=1", b.url), b.config())
                .await
                .unwrap();
            let mut raw = conn.raw().await.unwrap();
            raw.set_timeout(Duration::from_secs(15));
            let mut heartbeats = 0;
            let end = loop {
                match raw.recv().await {
                    Ok(Frame::Heartbeat) => heartbeats += 1,
                    Ok(_) => {}
                    Err(err) => break err,
                }
            };
            assert!(matches!(end, RawError::Ended { .. }), "{:?}: {end}", b.kind);
            assert!(
                heartbeats >= 1,
                "{:?}: the broker's heartbeats are the caller's to see",
                b.kind
            );
            tokio::time::timeout(WAIT, conn.closed()).await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn transcript_lists_exactly_the_frames_of_a_declare_a_confirmed_publish_and_a_consume() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let url = format!("{}?heartbeat=60", b.url);
            let conn = Connection::open(&url, b.config().with_transcript(1000)).await.unwrap();
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let queue = unique("transcript");
            ch.queue_declare(QueueDeclare {
                queue: queue.as_str().into(),
                exclusive: true,
                ..Default::default()
            })
            .await
            .unwrap();
            let confirm = ch
                .publish("", &queue, false, BasicProperties::default(), "hello")
                .await
                .unwrap();
            assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
            let mut consumer = ch
                .basic_consume(BasicConsume {
                    queue: queue.as_str().into(),
                    no_ack: true,
                    ..Default::default()
                })
                .await
                .unwrap();
            let delivery = tokio::time::timeout(WAIT, consumer.next()).await.unwrap().unwrap();
            assert_eq!(&delivery.body[..], b"hello");
            conn.close().await.unwrap();
            let transcript = conn.transcript().unwrap();
            use Direction::{Received as In, Sent as Out};
            let expected = vec![
                (Out, 0, "protocol-header"),
                (In, 0, "connection.start"),
                (Out, 0, "connection.start-ok"),
                (In, 0, "connection.tune"),
                (Out, 0, "connection.tune-ok"),
                (Out, 0, "connection.open"),
                (In, 0, "connection.open-ok"),
                (Out, 1, "channel.open"),
                (In, 1, "channel.open-ok"),
                (Out, 1, "confirm.select"),
                (In, 1, "confirm.select-ok"),
                (Out, 1, "queue.declare"),
                (In, 1, "queue.declare-ok"),
                (Out, 1, "basic.publish"),
                (Out, 1, "header"),
                (Out, 1, "body"),
                (In, 1, "basic.ack"),
                (Out, 1, "basic.consume"),
                (In, 1, "basic.consume-ok"),
                (In, 1, "basic.deliver"),
                (In, 1, "header"),
                (In, 1, "body"),
                (Out, 0, "connection.close"),
                (In, 0, "connection.close-ok"),
            ];
            assert_eq!(lines(&transcript), expected, "{:?}:\n{transcript}", b.kind);
            assert_eq!(transcript.dropped(), 0);
            // Fields as values.
            let entries = transcript.entries();
            assert!(
                matches!(&entries[13].frame, WireFrame::Method { method: Method::BasicPublish(p), .. } if p.routing_key.as_str() == Some(queue.as_str()))
            );
            assert!(
                matches!(&entries[14].frame, WireFrame::Header { header, .. } if header.body_size == 5)
            );
            assert_eq!(entries[21].frame, WireFrame::Body { channel: 1, size: 5 });
            assert!(entries.windows(2).all(|w| w[0].at <= w[1].at), "times never go back");
            // One line per frame.
            let shown = transcript.to_string();
            assert_eq!(shown.lines().count(), expected.len(), "{shown}");
            assert!(shown.contains("body-size=5"), "{shown}");
            assert!(shown.contains("<< ch1     basic.ack { delivery_tag: 1"), "{shown}");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn transcript_is_none_when_off_and_keeps_its_capacity_when_on() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = Connection::open(&b.url, b.config()).await.unwrap();
            conn.channel().await.unwrap();
            assert!(conn.transcript().is_none(), "{:?}", b.kind);
            conn.close().await.unwrap();

            let url = format!("{}?heartbeat=60", b.url);
            let conn = Connection::open(&url, b.config().with_transcript(3)).await.unwrap();
            let _channel = conn.channel().await.unwrap();
            let transcript = conn.transcript().unwrap();
            // protocol header, start, start-ok, tune, tune-ok, open,
            // open-ok, channel.open, channel.open-ok: the last three kept.
            assert_eq!(transcript.len(), 3, "{:?}: {transcript}", b.kind);
            assert_eq!(transcript.dropped(), 6, "{:?}: {transcript}", b.kind);
            assert_eq!(
                lines(&transcript),
                [
                    (Direction::Received, 0, "connection.open-ok"),
                    (Direction::Sent, 1, "channel.open"),
                    (Direction::Received, 1, "channel.open-ok"),
                ]
            );
            assert!(transcript.to_string().starts_with("... 6 earlier frames dropped"));
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn transcript_shows_a_hostile_header_table_cut_and_escaped() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let url = format!("{}?heartbeat=60", b.url);
            let recorded = Connection::open(&url, b.config().with_transcript(100)).await.unwrap();
            let ch = recorded.channel().await.unwrap();
            let queue = acemq_tests::exclusive_queue(&ch).await;
            // Another client's message: thousands of headers, with escape
            // sequences and bidi overrides in keys and values.
            let other = b.connect().await;
            let other_ch = other.channel().await.unwrap();
            other_ch.confirm_select().await.unwrap();
            let mut headers = FieldTable::default();
            for i in 0..2000 {
                headers.insert(
                    format!("k{i}\u{1b}[2J\u{202e}"),
                    format!("\u{7}\r\nv{i}\u{1b}]0;owned\u{7}"),
                );
            }
            let properties = BasicProperties {
                headers: Some(headers),
                ..Default::default()
            };
            let confirm = other_ch.publish("", &queue, false, properties, "x").await.unwrap();
            assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{:?}", b.kind);
            let mut consumer = ch
                .basic_consume(BasicConsume {
                    queue: queue.as_str().into(),
                    no_ack: true,
                    ..Default::default()
                })
                .await
                .unwrap();
            tokio::time::timeout(WAIT, consumer.next()).await.unwrap().unwrap();
            let transcript = recorded.transcript().unwrap();
            let header = transcript
                .iter()
                .find(|e| e.direction == Direction::Received && e.frame.name() == "header")
                .unwrap_or_else(|| panic!("{:?}: {transcript}", b.kind));
            let line = header.to_string();
            assert!(line.ends_with("…(cut)"), "{:?}: {line}", b.kind);
            assert!(line.chars().count() < 700, "{:?}: {} chars", b.kind, line.len());
            let shown = transcript.to_string();
            assert!(
                !shown.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
                "{:?}: a control character reached the display",
                b.kind
            );
            assert_eq!(shown.lines().count(), transcript.len());
            other.close().await.unwrap();
            recorded.close().await.unwrap();
        }
    })
    .await
}

/// A `Conn`'s two connections are its recovery's and its consumers': they
/// refuse to go raw, and so do the ones a recovery dials in their place.
/// The `Conn` goes on working.
#[tokio::test(flavor = "multi_thread")]
async fn raw_is_refused_on_a_conns_connections_before_and_after_a_recovery() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let events = acemq_tests::RecoveryLog::default();
            let name = unique("raw-refused");
            let mut config = events.config(acemq_core::Config::default());
            config.engine.connection_name = Some(name.clone());
            let conn = b.conn_with(config).await;
            for (which, low) in [
                ("publish", conn.publishing_connection()),
                ("consume", conn.consuming_connection()),
            ] {
                let refused = low.raw().await;
                assert!(
                    matches!(refused, Err(Error::RawRefused)),
                    "{:?} {which}: {refused:?}",
                    b.kind
                );
                assert!(!low.is_raw());
            }
            // A recovery: the new connections are the Conn's as well.
            close_both(&b, &name).await;
            events
                .wait(
                    &format!("{:?}: both recovered", b.kind),
                    Duration::from_secs(60),
                    |_| events.recovered_on("publish") >= 1 && events.recovered_on("consume") >= 1,
                )
                .await;
            for low in [conn.publishing_connection(), conn.consuming_connection()] {
                assert!(matches!(low.raw().await, Err(Error::RawRefused)), "{:?}", b.kind);
            }
            conn.publisher::<u32>("", &name).send(&1).await.unwrap_or_else(|e| {
                // Unroutable is fine (no queue of that name): the publish was confirmed.
                assert!(matches!(e, acemq_core::Error::Unroutable { .. }), "{:?}: {e}", b.kind);
            });
            conn.close().await.unwrap();
        }
    })
    .await
}

/// Closes both connections of the `Conn` named `name` from the broker's
/// side (RabbitMQ lists a connection a moment after it opens: this waits
/// for both, at most 15 s).
async fn close_both(b: &Broker, name: &str) {
    if b.memory.is_some() {
        b.force_close(name);
        return;
    }
    let wanted = [format!("{name}-publish"), format!("{name}-consume")];
    acemq_tests::chaos::close_when_listed(
        b.rabbit(),
        "client_properties",
        2,
        "closed by the acemq raw suite",
        |line| wanted.iter().any(|w| line.contains(w.as_str())),
    )
    .await;
}
