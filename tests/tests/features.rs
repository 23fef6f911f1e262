//! Four RabbitMQ features as RabbitMQ 3.10.8 shows them, on every broker:
//! priority queues, single active consumer, consumer priorities and stream
//! retention, and the refusals of their arguments.
//!
//! Each assertion is one that held on the real broker; where RabbitMQ's
//! timing is its own (stream retention runs in the background), the test
//! waits for the outcome under the deadline instead of sleeping a guess.

use std::time::Duration;

use acemq_codec::{BasicConsume, BasicProperties, FieldTable, FieldValue, QueueDeclare, QueueDelete};
use acemq_core::amqp::{Channel, Connection, Consumer, Delivery, Error};
use acemq_tests::{brokers, step, unique, Broker, Kind, RabbitVersion};
use bytes::Bytes;

/// How long a consumer is watched to show that nothing comes to it.
const QUIET: Duration = Duration::from_millis(250);

/// How long RabbitMQ may take to apply stream retention after a roll-over.
const RETENTION_WAIT: Duration = Duration::from_secs(10);

/// How long an expected delivery may take.
const WAIT: Duration = Duration::from_secs(5);

fn table(pairs: &[(&str, FieldValue)]) -> FieldTable {
    let mut t = FieldTable::new();
    for (key, value) in pairs {
        t.insert(*key, value.clone());
    }
    t
}

fn durable(queue: &str, arguments: FieldTable) -> QueueDeclare {
    QueueDeclare {
        queue: queue.into(),
        durable: true,
        arguments,
        ..Default::default()
    }
}

/// Declares a durable queue on a channel of its own, in confirm mode.
async fn declared(conn: &Connection, queue: &str, arguments: FieldTable) -> Channel {
    let ch = conn.channel().await.unwrap();
    ch.queue_declare(durable(queue, arguments)).await.unwrap();
    ch.confirm_select().await.unwrap();
    ch
}

/// The reply code and text of a refusal.
fn refusal(err: Error) -> (u16, String) {
    let text = err.refusal().map(|r| r.text.to_string()).unwrap_or_default();
    (err.reply_code().unwrap_or(0), text)
}

async fn publish(ch: &Channel, queue: &str, priority: Option<u8>, body: &str) {
    let properties = BasicProperties {
        priority,
        ..Default::default()
    };
    let confirm = ch
        .publish("", queue, false, properties, Bytes::from(body.to_owned()))
        .await
        .unwrap();
    step(format!("the confirm of {body}"), confirm).await.unwrap();
}

/// A consumer on a channel of its own with `prefetch` and `arguments`.
async fn consumer(conn: &Connection, queue: &str, prefetch: u16, arguments: FieldTable) -> Consumer {
    let ch = conn.channel().await.unwrap();
    ch.qos(prefetch).await.unwrap();
    ch.basic_consume(BasicConsume {
        queue: queue.into(),
        arguments,
        ..Default::default()
    })
    .await
    .unwrap()
}

fn body(d: &Delivery) -> String {
    let redelivered = if d.redelivered { " (redelivered)" } else { "" };
    format!("{}{redelivered}", String::from_utf8_lossy(&d.body))
}

/// The next `n` deliveries of `c`, as bodies: fewer if one does not come
/// within [`WAIT`] (the assertion then shows what came).
async fn next(c: &mut Consumer, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < n {
        let label = format!("delivery {} of {n} to {}", got.len() + 1, c.tag());
        match step(label, tokio::time::timeout(WAIT, c.next())).await {
            Ok(Some(d)) => got.push(body(&d)),
            Ok(None) => panic!("consumer {} ended after {got:?}", c.tag()),
            Err(_) => break,
        }
    }
    got
}

/// What reaches `c` within [`QUIET`].
async fn quiet(c: &mut Consumer) -> Vec<String> {
    let mut got = Vec::new();
    while let Ok(Some(d)) = tokio::time::timeout(QUIET, c.next()).await {
        got.push(body(&d));
    }
    got
}

async fn delete(conn: &Connection, queue: &str) {
    let ch = conn.channel().await.unwrap();
    ch.queue_delete(QueueDelete {
        queue: queue.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    ch.close().await.unwrap();
}

async fn consumer_count(conn: &Connection, queue: &str) -> u32 {
    let ch = conn.channel().await.unwrap();
    let passive = QueueDeclare {
        queue: queue.into(),
        passive: true,
        ..Default::default()
    };
    let ok = ch.queue_declare(passive).await.unwrap().unwrap();
    ch.close().await.unwrap();
    ok.consumer_count
}

/// `x-max-priority`: waiting messages go out highest priority first, in
/// publish order within a priority; a priority above the maximum counts as
/// the maximum, no priority as 0; a requeued message goes back to its place;
/// a redeclare must repeat the argument. Quorum queues refuse it.
#[tokio::test(flavor = "multi_thread")]
async fn priority_queue_delivers_highest_priority_first() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            let q = unique("priority");
            let ch = declared(&conn, &q, table(&[("x-max-priority", FieldValue::U8(5))])).await;
            let published = [
                (None, "none-1"),
                (Some(1), "1-a"),
                (Some(9), "9"),
                (Some(3), "3-a"),
                (Some(5), "5"),
                (Some(0), "0"),
                (Some(1), "1-b"),
                (None, "none-2"),
                (Some(3), "3-b"),
            ];
            for (priority, body) in published {
                publish(&ch, &q, priority, body).await;
            }
            let head = ch.basic_get(&q, false).await.unwrap().expect("a message");
            let head_body = String::from_utf8_lossy(&head.body).into_owned();
            assert_eq!((head_body.as_str(), head.message_count), ("9", 8), "{:?}", b.kind);
            head.nack(true).unwrap();
            let mut order = Vec::new();
            while let Some(m) = ch.basic_get(&q, true).await.unwrap() {
                order.push(String::from_utf8_lossy(&m.body).into_owned());
            }
            assert_eq!(
                order,
                ["9", "5", "3-a", "3-b", "1-a", "1-b", "none-1", "0", "none-2"],
                "{:?}: above the maximum is the maximum, none is 0",
                b.kind
            );

            // A consumer that attaches to waiting messages takes them in the same order.
            for (priority, body) in [(Some(2), "2"), (None, "none"), (Some(4), "4")] {
                publish(&ch, &q, priority, body).await;
            }
            let mut c = consumer(&conn, &q, 10, FieldTable::new()).await;
            assert_eq!(next(&mut c, 3).await, ["4", "2", "none"], "{:?}", b.kind);

            let redeclare = conn.channel().await.unwrap();
            let err = redeclare
                .queue_declare(durable(&q, table(&[("x-max-priority", FieldValue::I32(6))])))
                .await
                .unwrap_err();
            assert_eq!(
                refusal(err),
                (
                    406,
                    format!(
                        "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue '{q}' in vhost '/': \
                         received '6' but current is '5'"
                    )
                ),
                "{:?}",
                b.kind
            );
            let same = conn.channel().await.unwrap();
            same.queue_declare(durable(&q, table(&[("x-max-priority", FieldValue::I64(5))])))
                .await
                .expect("the same maximum in another integer width is equivalent");

            let quorum = unique("priority.quorum");
            let err = conn
                .channel()
                .await
                .unwrap()
                .queue_declare(durable(
                    &quorum,
                    table(&[
                        ("x-queue-type", "quorum".into()),
                        ("x-max-priority", FieldValue::I32(5)),
                    ]),
                ))
                .await
                .unwrap_err();
            assert_eq!(
                refusal(err),
                (
                    406,
                    format!(
                        "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{quorum}' in vhost '/' \
                         of queue type rabbit_quorum_queue"
                    )
                ),
                "{:?}",
                b.kind
            );
            delete(&conn, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

/// `x-single-active-consumer`: every consumer gets its consume-ok, but only
/// the first registered gets deliveries. Cancelled, its unacked messages
/// stay with its channel and the next consumer takes over the rest; when
/// its channel closes, those come back, redelivered, to the one active now.
/// A classic queue hands over to the highest consumer priority first; a
/// quorum queue does on RabbitMQ 4.0 too (it keeps its waiting consumers
/// ordered by priority), but on 3.10 and acemq-memory it hands over in
/// registration order whatever the priorities. A quorum queue counts only the
/// active consumer (and a cancelled one until its unacked messages are
/// settled); a classic one refuses an exclusive consumer.
#[tokio::test(flavor = "multi_thread")]
async fn single_active_consumer_hands_over_in_registration_order() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            for kind in ["classic", "quorum"] {
                let on = |what: &str| format!("{:?}, {kind}: {what}", b.kind);
                let q = unique(&format!("single-active.{kind}"));
                let arguments = table(&[("x-queue-type", kind.into()), ("x-single-active-consumer", true.into())]);
                let ch = declared(&conn, &q, arguments).await;
                let exclusive = conn.channel().await.unwrap();
                let outcome = exclusive
                    .basic_consume(BasicConsume {
                        queue: q.as_str().into(),
                        exclusive: true,
                        ..Default::default()
                    })
                    .await;
                match kind {
                    "classic" => assert_eq!(
                        refusal(outcome.unwrap_err()),
                        (
                            403,
                            format!("ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")
                        ),
                        "{}",
                        on("an exclusive consumer, alone")
                    ),
                    _ => outcome.expect("an exclusive consumer, alone").cancel().await.unwrap(),
                }

                let mut first = consumer(&conn, &q, 10, FieldTable::new()).await;
                let mut second = consumer(&conn, &q, 10, FieldTable::new()).await;
                let mut third = consumer(&conn, &q, 10, FieldTable::new()).await;
                let counted = if kind == "quorum" { 1 } else { 3 };
                assert_eq!(consumer_count(&conn, &q).await, counted, "{}", on("consumer count"));

                for body in ["m0", "m1", "m2"] {
                    publish(&ch, &q, None, body).await;
                }
                assert_eq!(next(&mut first, 3).await, ["m0", "m1", "m2"], "{}", on("first"));
                assert_eq!(quiet(&mut second).await, Vec::<String>::new(), "{}", on("second waits"));
                assert_eq!(quiet(&mut third).await, Vec::<String>::new(), "{}", on("third waits"));

                first.cancel().await.unwrap();
                for body in ["m3", "m4"] {
                    publish(&ch, &q, None, body).await;
                }
                assert_eq!(next(&mut second, 2).await, ["m3", "m4"], "{}", on("second took over"));
                // A quorum queue counts the active consumer, and a cancelled
                // one until its unacked messages are settled.
                assert_eq!(consumer_count(&conn, &q).await, 2, "{}", on("count after the cancel"));
                first.channel().close().await.unwrap();
                assert_eq!(
                    next(&mut second, 3).await,
                    ["m0 (redelivered)", "m1 (redelivered)", "m2 (redelivered)"],
                    "{}",
                    on("the first one's unacked come back when its channel closes")
                );
                assert_eq!(
                    quiet(&mut third).await,
                    Vec::<String>::new(),
                    "{}",
                    on("third still waits")
                );
                let counted = if kind == "quorum" { 1 } else { 2 };
                assert_eq!(
                    consumer_count(&conn, &q).await,
                    counted,
                    "{}",
                    on("count after the close")
                );

                second.channel().close().await.unwrap();
                // Classic queues put returned messages back in their places;
                // quorum queues serve returns first, in the order they came back.
                let expected: &[&str] = if kind == "quorum" {
                    &["m3", "m4", "m0", "m1", "m2"]
                } else {
                    &["m0", "m1", "m2", "m3", "m4"]
                };
                let expected: Vec<String> = expected.iter().map(|m| format!("{m} (redelivered)")).collect();
                assert_eq!(next(&mut third, 5).await, expected, "{}", on("third took over"));
                delete(&conn, &q).await;

                // Who takes over when the waiting consumers have priorities.
                let q = unique(&format!("single-active.{kind}.priorities"));
                let arguments = table(&[("x-queue-type", kind.into()), ("x-single-active-consumer", true.into())]);
                let ch = declared(&conn, &q, arguments).await;
                let active = consumer(&conn, &q, 10, FieldTable::new()).await;
                let mut plain = consumer(&conn, &q, 10, FieldTable::new()).await;
                let mut high = consumer(&conn, &q, 10, table(&[("x-priority", FieldValue::I32(5))])).await;
                active.cancel().await.unwrap();
                publish(&ch, &q, None, "after").await;
                let by_priority = kind == "classic" || b.version() == Some(RabbitVersion::V4_0);
                let (took_over, waits) = if by_priority {
                    (&mut high, &mut plain)
                } else {
                    (&mut plain, &mut high)
                };
                assert_eq!(
                    next(took_over, 1).await,
                    ["after"],
                    "{}",
                    on("hand-over with priorities")
                );
                assert_eq!(quiet(waits).await, Vec::<String>::new(), "{}", on("the other waits"));

                delete(&conn, &q).await;
            }
            conn.close().await.unwrap();
        }
    })
    .await
}

/// `x-priority` of `basic.consume`: the highest priority consumers get the
/// messages, round-robin among themselves, while they have prefetch credit;
/// a lower one gets messages only while all of them are blocked, and loses
/// them again as soon as one has credit. Classic and quorum queues alike.
#[tokio::test(flavor = "multi_thread")]
async fn consumer_priorities_serve_the_highest_with_credit_first() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            for kind in ["classic", "quorum"] {
                let on = |what: &str| format!("{:?}, {kind}: {what}", b.kind);
                let q = unique(&format!("consumer-priority.{kind}"));
                let ch = declared(&conn, &q, table(&[("x-queue-type", kind.into())])).await;
                let mut low = consumer(&conn, &q, 100, FieldTable::new()).await;
                let mut high = consumer(&conn, &q, 2, table(&[("x-priority", FieldValue::I32(10))])).await;
                let mut also_high = consumer(&conn, &q, 2, table(&[("x-priority", FieldValue::I64(10))])).await;
                for i in 0..7 {
                    publish(&ch, &q, None, &format!("m{i}")).await;
                }
                assert_eq!(next(&mut high, 2).await, ["m0", "m2"], "{}", on("high"));
                assert_eq!(next(&mut also_high, 2).await, ["m1", "m3"], "{}", on("also high"));
                assert_eq!(
                    next(&mut low, 3).await,
                    ["m4", "m5", "m6"],
                    "{}",
                    on("low, while both high are blocked")
                );

                high.channel().basic_ack(0, true).unwrap();
                // A round trip on the same channel: the ack has reached the
                // queue before the next publish does (a quorum queue settles
                // through its log, apart from the publishes).
                let passive = QueueDeclare {
                    queue: q.as_str().into(),
                    passive: true,
                    ..Default::default()
                };
                high.channel().queue_declare(passive).await.unwrap();
                for i in 7..10 {
                    publish(&ch, &q, None, &format!("m{i}")).await;
                }
                assert_eq!(
                    next(&mut high, 2).await,
                    ["m7", "m8"],
                    "{}",
                    on("high has credit again")
                );
                assert_eq!(next(&mut low, 1).await, ["m9"], "{}", on("low"));
                assert_eq!(
                    quiet(&mut also_high).await,
                    Vec::<String>::new(),
                    "{}",
                    on("still blocked")
                );
                delete(&conn, &q).await;
            }
            conn.close().await.unwrap();
        }
    })
    .await
}

/// What a consumer from `first` reads of a stream: (body number, offset)
/// of each message, up to message `last`.
async fn read_stream(conn: &Connection, queue: &str, last: usize) -> Vec<(usize, i64)> {
    let mut c = consumer(conn, queue, 1000, table(&[("x-stream-offset", "first".into())])).await;
    let mut read = Vec::new();
    loop {
        let d = step(format!("stream {queue} up to message {last}"), c.next())
            .await
            .expect("the consumer is still on");
        let number: usize = String::from_utf8_lossy(&d.body[..4]).parse().expect("a numbered body");
        let offset = d
            .properties
            .as_ref()
            .ok()
            .and_then(|p| p.headers.as_ref())
            .and_then(|h| h.get("x-stream-offset"))
            .and_then(FieldValue::as_i64)
            .expect("x-stream-offset");
        read.push((number, offset));
        if number == last {
            break;
        }
    }
    c.channel().close().await.unwrap();
    read
}

/// Publishes messages `range` to a stream, each a 100-byte body starting
/// with its number, one at a time (each its own chunk, as on RabbitMQ).
async fn fill(ch: &Channel, queue: &str, range: std::ops::Range<usize>) {
    for i in range {
        publish(ch, queue, None, &format!("{i:04}{}", "x".repeat(96))).await;
    }
}

/// Reads the stream until its oldest message is past `gone` (RabbitMQ
/// applies retention in the background, shortly after the roll-over), for
/// at most [`RETENTION_WAIT`]; the last reading.
async fn read_after_retention(conn: &Connection, queue: &str, last: usize, gone: usize) -> Vec<(usize, i64)> {
    let _waiting = acemq_tests::waiting_for(format!("retention in {queue} to drop message {gone}"));
    let until = tokio::time::Instant::now() + RETENTION_WAIT;
    loop {
        let read = read_stream(conn, queue, last).await;
        if read.first().is_some_and(|(n, _)| *n > gone) || tokio::time::Instant::now() >= until {
            return read;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes a test's streams once RabbitMQ's retention has gone quiet.
///
/// RabbitMQ 3.10.8 evaluates retention in one process for every stream
/// (`osiris_retention`), from a queue of requests made at each roll-over.
/// A stream deleted while a request for it still waits there crashes that
/// process (`{bad_return_value,missing_file}`), and osiris restarts every
/// stream's writer with it: a publish to another stream in that moment is
/// never confirmed (seen in a CI run: the first publish to the stream
/// declared next waited for its confirm until the deadline). So the streams
/// are all deleted at the end, once nothing has rolled over for a while.
async fn delete_streams(conn: &Connection, b: &Broker, streams: &[&str]) {
    if b.kind != Kind::Memory {
        step(
            "RabbitMQ's retention to go quiet",
            tokio::time::sleep(Duration::from_secs(1)),
        )
        .await;
    }
    for stream in streams {
        delete(conn, stream).await;
    }
}

/// Checks what is left of a stream: messages `from..=last`, in order,
/// with offsets that only grow and leap at the segment roll-overs.
fn assert_suffix(read: &[(usize, i64)], last: usize, b: &Broker, what: &str) {
    let numbers: Vec<usize> = read.iter().map(|(n, _)| *n).collect();
    let from = numbers[0];
    assert_eq!(numbers, (from..=last).collect::<Vec<_>>(), "{:?}: {what}", b.kind);
    assert!(
        read.windows(2).all(|w| w[1].1 > w[0].1),
        "{:?}: {what}: {read:?}",
        b.kind
    );
    assert!(
        read[read.len() - 1].1 > last as i64,
        "{:?}: {what}: each roll-over takes an offset: {read:?}",
        b.kind
    );
}

/// Stream retention works on whole segments, at roll-over: with the
/// default segment size (500 MB) nothing goes; with small segments the
/// oldest go once the stream holds more than `x-max-length-bytes`, or once
/// their messages are older than `x-max-age`, and a consumer from `first`
/// starts later than offset 0. The newest messages always stay.
#[tokio::test(flavor = "multi_thread")]
async fn stream_retention_drops_the_oldest_segments() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            let stream = |extra: &[(&str, FieldValue)]| {
                let mut args = table(&[("x-queue-type", "stream".into())]);
                for (key, value) in extra {
                    args.insert(*key, value.clone());
                }
                args
            };

            let one_segment = unique("retention.one-segment");
            let ch = declared(
                &conn,
                &one_segment,
                stream(&[("x-max-length-bytes", FieldValue::I32(5000))]),
            )
            .await;
            fill(&ch, &one_segment, 0..100).await;
            let read = read_stream(&conn, &one_segment, 99).await;
            assert_eq!(
                read,
                (0..100).map(|i| (i, i as i64)).collect::<Vec<_>>(),
                "{:?}: one segment never rolls over, so nothing goes",
                b.kind
            );

            let by_bytes = unique("retention.bytes");
            let ch = declared(
                &conn,
                &by_bytes,
                stream(&[
                    ("x-max-length-bytes", FieldValue::I32(5000)),
                    ("x-stream-max-segment-size-bytes", FieldValue::I32(1000)),
                ]),
            )
            .await;
            fill(&ch, &by_bytes, 0..100).await;
            let read = read_after_retention(&conn, &by_bytes, 99, 0).await;
            assert!(
                read[0].0 > 0 && read[0].1 > 0,
                "{:?}: the oldest are gone: {read:?}",
                b.kind
            );
            assert_suffix(&read, 99, &b, "x-max-length-bytes");
            assert!(
                read.len() <= 50,
                "{:?}: at most 5000 bytes of 100-byte bodies stay: {}",
                b.kind,
                read.len()
            );

            let by_age = unique("retention.age");
            let ch = declared(
                &conn,
                &by_age,
                stream(&[
                    ("x-max-age", "1s".into()),
                    ("x-stream-max-segment-size-bytes", FieldValue::I32(1000)),
                ]),
            )
            .await;
            fill(&ch, &by_age, 0..20).await;
            assert_eq!(
                read_stream(&conn, &by_age, 19).await[0].0,
                0,
                "{:?}: nothing is old yet",
                b.kind
            );
            step("x-max-age to pass", tokio::time::sleep(Duration::from_millis(2500))).await;
            fill(&ch, &by_age, 20..40).await;
            let read = read_after_retention(&conn, &by_age, 39, 9).await;
            assert!(read[0].0 > 9, "{:?}: the old segments are gone: {read:?}", b.kind);
            assert_suffix(&read, 39, &b, "x-max-age");
            assert!(read[0].0 <= 20, "{:?}: the new messages all stay: {read:?}", b.kind);
            delete_streams(&conn, &b, &[&one_segment, &by_bytes, &by_age]).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

/// A declare that is refused: the queue type, the arguments, and the end
/// of RabbitMQ's reply text after the queue's name.
type Refused<'a> = (&'a str, &'a [(&'a str, FieldValue)], &'a str);

/// The four features' arguments are refused with RabbitMQ 3.10.8's codes
/// and texts: types, ranges, queue types that do not take them, and the
/// consumer's `x-priority`.
#[tokio::test(flavor = "multi_thread")]
async fn feature_arguments_are_refused_as_rabbitmq_refuses_them() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            let cases: &[Refused<'_>] = &[
                (
                    "classic",
                    &[("x-max-priority", FieldValue::I32(256))],
                    ": {max_value_exceeded,256}",
                ),
                (
                    "classic",
                    &[("x-max-priority", FieldValue::I32(-1))],
                    ": {value_negative,-1}",
                ),
                (
                    "classic",
                    &[("x-max-priority", FieldValue::F64(2.0))],
                    ": \"expected integer, got double\"",
                ),
                (
                    "classic",
                    &[("x-single-active-consumer", FieldValue::from("yes"))],
                    ": {unacceptable_type,longstr}",
                ),
                (
                    "stream",
                    &[("x-single-active-consumer", true.into())],
                    " of queue type rabbit_stream_queue",
                ),
                (
                    "classic",
                    &[("x-max-age", "10s".into())],
                    " of queue type rabbit_classic_queue",
                ),
                ("stream", &[("x-max-age", "10ms".into())], ": invalid_max_age"),
                ("stream", &[("x-max-age", "0s".into())], ": invalid_max_age"),
                (
                    "stream",
                    &[("x-max-age", FieldValue::I32(10))],
                    ": {unacceptable_type,signedint}",
                ),
                (
                    "stream",
                    &[("x-stream-max-segment-size-bytes", FieldValue::from("a"))],
                    ": \"expected integer, got longstr\"",
                ),
                (
                    "stream",
                    &[("x-stream-max-segment-size-bytes", FieldValue::I32(-1))],
                    ": {value_negative,-1}",
                ),
            ];
            for (kind, arguments, why) in cases {
                let q = unique("refused");
                let key = arguments[0].0;
                let mut args = table(arguments);
                args.insert("x-queue-type", FieldValue::from(*kind));
                let ch = conn.channel().await.unwrap();
                let err = ch.queue_declare(durable(&q, args)).await.unwrap_err();
                assert_eq!(
                    refusal(err),
                    (
                        406,
                        format!("PRECONDITION_FAILED - invalid arg '{key}' for queue '{q}' in vhost '/'{why}")
                    ),
                    "{:?}: {kind} {arguments:?}",
                    b.kind
                );
            }

            // A segment size of 0 is taken; above 3 GB is refused, in words of its own.
            for (size, refused) in [(0i64, false), (3_000_000_000, false), (3_000_000_001, true)] {
                let q = unique("segment");
                let args = table(&[
                    ("x-queue-type", FieldValue::from("stream")),
                    ("x-stream-max-segment-size-bytes", FieldValue::I64(size)),
                ]);
                let ch = conn.channel().await.unwrap();
                let declared = ch.queue_declare(durable(&q, args)).await;
                match declared {
                    Ok(_) if !refused => {
                        ch.queue_delete(QueueDelete {
                            queue: q.as_str().into(),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    }
                    Err(err) if refused => assert_eq!(
                        refusal(err),
                        (
                            406,
                            "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes".to_owned()
                        ),
                        "{:?}",
                        b.kind
                    ),
                    other => panic!("{:?}: segment size {size}: {other:?}", b.kind),
                }
            }

            let q = unique("refused.consumer");
            declared(&conn, &q, FieldTable::new()).await;
            for (value, type_name) in [(FieldValue::from("high"), "longstr"), (FieldValue::Bool(true), "bool")] {
                let ch = conn.channel().await.unwrap();
                let err = ch
                    .basic_consume(BasicConsume {
                        queue: q.as_str().into(),
                        arguments: table(&[("x-priority", value)]),
                        ..Default::default()
                    })
                    .await
                    .unwrap_err();
                assert_eq!(
                    refusal(err),
                    (
                        406,
                        format!(
                            "PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{q}' in vhost '/': \
                             \"expected integer, got {type_name}\""
                        )
                    ),
                    "{:?}",
                    b.kind
                );
            }
            let negative = conn.channel().await.unwrap();
            negative
                .basic_consume(BasicConsume {
                    queue: q.as_str().into(),
                    arguments: table(&[("x-priority", FieldValue::I32(-5))]),
                    ..Default::default()
                })
                .await
                .expect("a negative consumer priority is fine");
            delete(&conn, &q).await;
            conn.close().await.unwrap();

            // An x-max-age without digits crashes RabbitMQ 3.10.8's check: the
            // whole connection goes with a bare 541.
            let conn = b.connect().await;
            let err = conn
                .channel()
                .await
                .unwrap()
                .queue_declare(durable(
                    &unique("refused.age"),
                    table(&[("x-queue-type", "stream".into()), ("x-max-age", "s".into())]),
                ))
                .await
                .unwrap_err();
            assert_eq!(refusal(err), (541, "INTERNAL_ERROR".to_owned()), "{:?}", b.kind);
            step("the connection to close", conn.closed()).await;
        }
    })
    .await
}
