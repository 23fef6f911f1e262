//! `connection.blocked` under a real memory alarm. Its own test binary: the
//! alarm blocks every publishing connection of the broker, so nothing else
//! may run beside it, and the tests here take turns (`ALARM`).

use std::time::{Duration, Instant};

use acemq_codec::{BasicProperties, QueueDeclare};
use acemq_core::amqp::{Confirmation, ConnectionEvent};
use acemq_core::{is_blocked, Config, Error};
use acemq_tests::{brokers, brokers_with_tls, counts_by_outcome, exclusive_queue, unique, Broker};

static ALARM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Clears the alarm when dropped, so a failing test leaves the broker usable.
struct AlarmGuard<'a>(&'a Broker);

impl AlarmGuard<'_> {
    fn raise(b: &Broker) -> AlarmGuard<'_> {
        b.set_memory_alarm(true);
        AlarmGuard(b)
    }
}

impl Drop for AlarmGuard<'_> {
    fn drop(&mut self) {
        self.0.set_memory_alarm(false);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_alarm_blocks_a_publishing_connection_with_its_reason_then_unblocks_it() {
    acemq_tests::deadline(async {
        let _turn = ALARM.lock().await;
        for b in brokers().await {
            let conn = b.connect().await;
            let mut events = conn.events();
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            // RabbitMQ blocks only connections that have published.
            let first = ch
                .publish("", &q, false, BasicProperties::default(), "before")
                .await
                .unwrap();
            assert_eq!(first.await.unwrap(), Confirmation::Ack);

            b.set_memory_alarm(true);
            // RabbitMQ sends connection.blocked when a connection publishes under the alarm.
            let during = ch
                .publish("", &q, false, BasicProperties::default(), "during")
                .await
                .unwrap();
            let blocked = tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    match events.recv().await.unwrap() {
                        ConnectionEvent::Blocked { reason } => break reason,
                        _ => continue,
                    }
                }
            })
            .await;
            // Clear the alarm before any assertion can fail, so the broker is left usable.
            let was_blocked = conn.is_blocked();
            b.set_memory_alarm(false);

            assert_eq!(
                blocked.expect("connection.blocked within 20 s"),
                "low on memory",
                "{:?}",
                b.kind
            );
            assert!(was_blocked);
            let unblocked = tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    if let ConnectionEvent::Unblocked = events.recv().await.unwrap() {
                        break;
                    }
                }
            })
            .await;
            assert!(unblocked.is_ok(), "connection.unblocked within 20 s");
            assert!(!conn.is_blocked());
            // The publish made while blocked waited in the socket and completes now.
            assert_eq!(
                tokio::time::timeout(Duration::from_secs(20), during)
                    .await
                    .unwrap()
                    .unwrap(),
                Confirmation::Ack
            );
            conn.close().await.unwrap();
        }
    })
    .await
}

async fn wait_blocked(conn: &acemq_core::Conn) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !conn.is_blocked() {
        assert!(Instant::now() < deadline, "connection.blocked within 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Statement 16 of `docs/statements.md`, per broker with its own counters, and the
/// consumer side keeps acking meanwhile.
#[test]
fn statement_16_while_blocked_a_new_publish_is_refused_at_once_and_a_written_one_fails_after_blocked_timeout_each_counted(
) {
    acemq_tests::deadline_blocking(|| {
        let all = tokio::runtime::Runtime::new().unwrap().block_on(brokers());
        for b in all {
            let kind = b.kind;
            // A recorder of this broker's run alone: the counts are this broker's.
            let recorder = metrics_util::debugging::DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            metrics::with_local_recorder(&recorder, || {
                runtime.block_on(acemq_tests::deadline(blocked_publishes(&b)))
            });
            let counts = counts_by_outcome(&snapshotter, acemq_core::metrics_names::PUBLISH_TOTAL);
            let count = |outcome: &str| counts.get(outcome).copied().unwrap_or(0);
            assert_eq!(
                count("refused"),
                2,
                "{kind:?}: the send and the begin_send made while blocked: {counts:?}"
            );
            assert_eq!(
                count("failed"),
                1,
                "{kind:?}: the written send that outlived blocked_timeout: {counts:?}"
            );
            assert_eq!(
                count("confirmed"),
                11,
                "{kind:?}: ten before the alarm, one after: {counts:?}"
            );
            assert_eq!(counts.len(), 3, "{kind:?}: no other outcome: {counts:?}");
        }
    })
}

/// Statement 16's scenario on one broker: ten confirmed sends, then under
/// the alarm one written send that fails after `blocked_timeout` and two
/// refused ones, then one confirmed send after the alarm.
async fn blocked_publishes(b: &Broker) {
    let _turn = ALARM.lock().await;
    let conn = b
        .conn_with(Config::default().with_blocked_timeout(Duration::from_secs(2)))
        .await;
    let consume_ch = conn.consuming_connection().channel().await.unwrap();
    let q = unique("blocked");
    consume_ch
        .queue_declare(QueueDeclare {
            queue: q.as_str().into(),
            durable: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let publisher = conn.publisher::<String>("", &q);
    // Ten messages before the alarm, for the consumer to ack during it.
    for i in 0..10 {
        publisher.send(&format!("before-{i}")).await.unwrap();
    }

    let alarm = AlarmGuard::raise(b);
    // Written before the block is known: waits for its confirm...
    let started = Instant::now();
    let written = publisher.send(&"written".to_string()).await.unwrap_err();
    // ... for blocked_timeout of continuous block, then fails.
    assert!(
        matches!(written, Error::ConnectionBlocked { .. }),
        "{:?}: {written}",
        b.kind
    );
    assert!(is_blocked(&written));
    assert!(started.elapsed() >= Duration::from_secs(2), "{:?}", started.elapsed());
    assert!(conn.is_blocked());

    // Known blocked: refused at once, never written.
    let started = Instant::now();
    let refused = publisher.send(&"refused".to_string()).await.unwrap_err();
    assert!(
        matches!(refused, Error::PublishingPaused { ref reason } if reason == "low on memory"),
        "{refused}"
    );
    assert!(is_blocked(&refused));
    assert!(started.elapsed() < Duration::from_millis(500));
    // The same for a pipelined send: refused before it is written.
    let refused = publisher.begin_send(&"refused".to_string()).await.unwrap_err();
    assert!(matches!(refused, Error::PublishingPaused { .. }), "{refused}");

    // The consuming connection is not blocked: acks flow.
    consume_ch.qos(100).await.unwrap();
    let mut consumer = consume_ch.consume(&q).await.unwrap();
    for _ in 0..10 {
        let d = tokio::time::timeout(Duration::from_secs(5), consumer.next())
            .await
            .expect("deliveries flow during the alarm")
            .unwrap();
        assert!(d.body.starts_with(b"\"before-"));
        d.ack().unwrap();
    }
    consumer.cancel().await.unwrap();
    let depth = acemq_tests::depth(&consume_ch, &q).await;
    assert_eq!(
        depth, 0,
        "{:?}: the acks were taken while publishing was blocked",
        b.kind
    );
    drop(alarm);

    // Unblocked: the refused message never arrives; the written one may.
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Some(m) = consume_ch.basic_get(&q, true).await.unwrap() {
        assert_ne!(&m.body[..], b"\"refused\"", "a refused publish is never delivered");
    }
    publisher.send(&"after".to_string()).await.unwrap();
    consume_ch
        .queue_delete(acemq_codec::QueueDelete {
            queue: q.as_str().into(),
            ..Default::default()
        })
        .await
        .unwrap();
    conn.close().await.unwrap();
}

/// A publish caught by a block that lifts in time completes normally.
#[tokio::test(flavor = "multi_thread")]
async fn statement_16_a_written_publish_unblocked_in_time_completes_normally() {
    acemq_tests::deadline(async {
        let _turn = ALARM.lock().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let ch = conn.consuming_connection().channel().await.unwrap();
            let q = unique("unblock");
            ch.queue_declare(QueueDeclare {
                queue: q.as_str().into(),
                exclusive: true,
                ..Default::default()
            })
            .await
            .unwrap();
            let publisher = conn.publisher::<String>("", &q);
            publisher.send(&"first".to_string()).await.unwrap();
            let alarm = AlarmGuard::raise(&b);
            let in_flight = tokio::spawn(async move { publisher.send(&"in flight".to_string()).await });
            wait_blocked(&conn).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!in_flight.is_finished(), "it waits while blocked");
            drop(alarm);
            tokio::time::timeout(Duration::from_secs(20), in_flight)
                .await
                .expect("completes after the unblock")
                .unwrap()
                .unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

/// A retry hop made while the broker blocks publishing holds its delivery
/// until the block lifts, instead of handing it back to the broker to be
/// redelivered (and handled) again and again for as long as the block lasts.
#[tokio::test(flavor = "multi_thread")]
async fn a_retry_while_publishing_is_blocked_holds_the_delivery_until_the_block_lifts() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    acemq_tests::deadline(async {
        let _turn = ALARM.lock().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("blocked-retry");
            acemq_core::Topology::new().queue(&q).declare(&conn).await.unwrap();
            let calls = Arc::new(AtomicU32::new(0));
            let go = Arc::new(tokio::sync::Semaphore::new(0));
            let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
            let handler = {
                let (calls, go) = (calls.clone(), go.clone());
                move |m: acemq_core::Message<String>| {
                    let (calls, go, done_tx) = (calls.clone(), go.clone(), done_tx.clone());
                    async move {
                        if m.payload != "retried" {
                            return acemq_core::Ack::accept();
                        }
                        calls.fetch_add(1, Ordering::SeqCst);
                        if m.envelope.attempt == 1 {
                            go.acquire().await.unwrap().forget();
                            return acemq_core::Ack::retry(std::io::Error::other("try again"));
                        }
                        let _ = done_tx.send(m.envelope.attempt);
                        acemq_core::Ack::accept()
                    }
                }
            };
            let consumer = acemq_core::consume(&conn, &q, handler).await.unwrap();
            let publisher = conn.publisher::<String>("", &q);
            publisher.send(&"retried".to_string()).await.unwrap();
            while calls.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let alarm = AlarmGuard::raise(&b);
            // RabbitMQ blocks a connection once it publishes under the alarm.
            let trigger = conn.publisher::<String>("", &q);
            let trigger = tokio::spawn(async move { trigger.send(&"trigger".to_string()).await });
            wait_blocked(&conn).await;
            go.add_permits(1);
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(
                calls.load(Ordering::SeqCst),
                1,
                "{:?}: the handler did not run again while blocked",
                b.kind
            );
            drop(alarm);
            let attempt = tokio::time::timeout(Duration::from_secs(20), done.recv())
                .await
                .expect("the retry goes through once unblocked")
                .unwrap();
            assert_eq!(attempt, 2, "{:?}", b.kind);
            let _ = trigger.await;
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

/// How many deliveries of `queue` are unacked, as the broker counts them.
fn unacked(b: &Broker, queue: &str) -> u64 {
    if let Some(memory) = &b.memory {
        return memory.queue_info("/", queue).map_or(0, |q| q.unacked);
    }
    let listing = b.rabbitmqctl(&["list_queues", "name", "messages_unacknowledged"]);
    listing
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .find(|(name, _)| *name == queue)
        .and_then(|(_, n)| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Statement 24: the input of `Ack::then` is acked only after the
/// output's confirm. While the broker blocks publishing, the output cannot
/// be confirmed: the input stays unacked, and is acked once the block lifts
/// and the output is in.
#[tokio::test(flavor = "multi_thread")]
async fn statement_24_then_acks_its_input_only_after_the_outputs_confirm() {
    acemq_tests::deadline(async {
        let _turn = ALARM.lock().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let (input, output, other) = (
                unique("then-block.in"),
                unique("then-block.out"),
                unique("then-block.x"),
            );
            for q in [&input, &output, &other] {
                acemq_core::Topology::new().queue(q).declare(&conn).await.unwrap();
            }
            conn.publisher::<u32>("", &input).send(&1).await.unwrap();
            let alarm = AlarmGuard::raise(&b);
            let trigger = conn.publisher::<u32>("", &other);
            let trigger = tokio::spawn(async move { trigger.send(&0).await });
            wait_blocked(&conn).await;
            let consumer = acemq_core::consume(&conn, &input, |m: acemq_core::Message<u32>| async move {
                acemq_core::Ack::then(&m.payload)
            })
            .then(&conn.publisher::<u32>("", &output))
            .await
            .unwrap();
            let ch = conn.consuming_connection().channel().await.unwrap();
            let until = Instant::now() + Duration::from_secs(20);
            while unacked(&b, &input) == 0 {
                assert!(Instant::now() < until, "{:?}: the input was never delivered", b.kind);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(
                unacked(&b, &input),
                1,
                "{:?}: held, not acked, while the output waits",
                b.kind
            );
            assert_eq!(acemq_tests::depth(&ch, &output).await, 0, "{:?}", b.kind);
            drop(alarm);
            let until = Instant::now() + Duration::from_secs(20);
            while acemq_tests::depth(&ch, &output).await == 0 || unacked(&b, &input) != 0 {
                assert!(
                    Instant::now() < until,
                    "{:?}: the output and the ack after the unblock",
                    b.kind
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(acemq_tests::depth(&ch, &input).await, 0, "{:?}", b.kind);
            let _ = trigger.await;
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

/// Memory use: a broker under a memory alarm stops reading the
/// socket; an engine publisher that never awaits its confirms is then held
/// back by the connection's publish buffer instead of buffering without
/// limit, and once the alarm clears every message it published is confirmed.
#[tokio::test(flavor = "multi_thread")]
async fn a_publisher_that_never_awaits_its_confirms_is_held_back_while_the_broker_stops_reading() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    // 20,000 × 4 KiB: 80 MiB if nothing held the publisher back.
    const TOTAL: u64 = 20_000;
    const BODY: usize = 4096;
    const BUFFER: usize = 256 * 1024;
    acemq_tests::deadline(async {
        let _turn = ALARM.lock().await;
        for b in brokers_with_tls().await {
            let kind = b.kind;
            let conn = b.connect_with(b.config().with_publish_buffer(BUFFER)).await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            // RabbitMQ blocks only connections that have published.
            let first = ch.publish("", &q, false, BasicProperties::default(), "first").await;
            assert_eq!(first.unwrap().await.unwrap(), Confirmation::Ack);

            let alarm = AlarmGuard::raise(&b);
            let published = Arc::new(AtomicU64::new(0));
            let publishing = tokio::spawn({
                let (ch, q, published) = (ch.clone(), q.clone(), published.clone());
                async move {
                    let body = bytes::Bytes::from(vec![b'x'; BODY]);
                    let mut confirms = Vec::with_capacity(TOTAL as usize);
                    for _ in 0..TOTAL {
                        let confirm = ch.publish("", &q, false, BasicProperties::default(), body.clone());
                        confirms.push(confirm.await.expect("queued"));
                        published.fetch_add(1, Ordering::SeqCst);
                    }
                    confirms
                }
            });
            // Until the publisher stops advancing: half a second without progress.
            let (mut last, mut backlog_max) = (u64::MAX, 0);
            let stop = Instant::now() + Duration::from_secs(30);
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                backlog_max = backlog_max.max(conn.publish_backlog());
                let now = published.load(Ordering::SeqCst);
                if now == last || now == TOTAL || Instant::now() > stop {
                    break;
                }
                last = now;
            }
            let held = published.load(Ordering::SeqCst);
            let backlog = conn.publish_backlog();
            let blocked = conn.is_blocked();
            drop(alarm);
            eprintln!(
                "{kind:?}: held back after {held} of {TOTAL} publishes ({} KiB queued); publish backlog {backlog} B \
                 (peak seen {backlog_max} B, buffer {BUFFER} B); blocked={blocked}",
                held * BODY as u64 / 1024
            );
            assert!(
                backlog <= BUFFER && backlog_max <= BUFFER,
                "{kind:?}: {backlog} / {backlog_max}"
            );
            assert!(
                held * (BODY as u64) >= BUFFER as u64 / 2,
                "{kind:?}: held back too early: {held}"
            );
            // RabbitMQ's TLS listener goes on reading while the alarm blocks
            // the connection (seen here: all 80 MiB taken by the broker,
            // 15 MiB of it still in its socket's receive queue), so there
            // only the buffer's own bound above can be checked.
            if !kind.is_tls() {
                assert!(held < TOTAL, "{kind:?}: the publisher was never held back");
                // Past the buffer, only what the sockets' own buffers took.
                assert!(
                    held * (BODY as u64) <= (BUFFER as u64) + 32 * 1024 * 1024,
                    "{kind:?}: {held} publishes got past a {BUFFER} B buffer"
                );
            }

            // The alarm is cleared: everything goes out and is confirmed.
            let confirms = tokio::time::timeout(Duration::from_secs(60), publishing)
                .await
                .expect("every publish queued within 60 s of the alarm clearing")
                .unwrap();
            for confirm in confirms {
                let confirmed = tokio::time::timeout(Duration::from_secs(60), confirm).await;
                assert_eq!(confirmed.expect("a confirm").unwrap(), Confirmation::Ack, "{kind:?}");
            }
            assert_eq!(u64::from(acemq_tests::depth(&ch, &q).await), TOTAL + 1, "{kind:?}");
            assert_eq!(conn.publish_backlog(), 0, "{kind:?}");
            conn.close().await.unwrap();
        }
    })
    .await
}
