//! The consumer's promises under messages and histories it did not write
//! itself, on every broker: the attempt a handler sees counts every handler
//! call and every broker redelivery exactly once, whatever the queue type
//! and whatever mix of redeliveries, waits, rungs and recoveries a message
//! went through; and no property, header or body a producer can publish
//! makes a consumer panic, stall or keep a prefetch slot.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use acemq_codec::{BasicProperties, FieldTable, FieldValue, QueueDeclare, QueueDelete};
use acemq_core::envelope::{
    ATTEMPT_HEADER, CAUSATION_HEADER, ERROR_HEADER, FIRST_SEEN_HEADER, ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER, REPLAYED_HEADER,
};
use acemq_core::pipeline::{ROUTING_SLIP_HEADER, ROUTING_SLIP_STEP_HEADER};
use acemq_core::{consume, Ack, Config, Conn, Message, RecoveryEvent, ReplayOptions, RetryPolicy, Topology};
use acemq_tests::{on_every_broker, secs, unique, Broker};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
}

#[derive(Debug)]
struct Boom(&'static str);
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}
impl std::error::Error for Boom {}

/// The queue types a source queue can have.
#[derive(Debug, Clone, Copy, PartialEq)]
enum QueueType {
    /// acemq's own: durable quorum, dead-lettering to `{queue}.dlq`.
    Quorum,
    /// Declared by another service: durable classic, no arguments.
    Classic,
}

/// Declares `q` as `kind` (with the rungs of `policy`), on `conn`.
async fn declare(conn: &Conn, q: &str, kind: QueueType, policy: &RetryPolicy) {
    match kind {
        QueueType::Quorum => Topology::new()
            .queue(q)
            .dead_letters(q)
            .retries(q, policy)
            .declare(conn)
            .await
            .unwrap(),
        QueueType::Classic => {
            let ch = conn.consuming_connection().channel().await.unwrap();
            let plain = QueueDeclare {
                queue: q.into(),
                durable: true,
                ..Default::default()
            };
            ch.queue_declare(plain).await.unwrap();
        }
    }
}

/// Deletes `q` and every queue acemq made for it.
async fn cleanup(conn: &Conn, q: &str, policy: &RetryPolicy) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let mut names = vec![q.to_string(), format!("{q}.dlq"), format!("{q}.parked")];
    names.extend(policy.rungs().into_iter().map(|d| acemq_core::retry::rung_name(q, d)));
    for name in names {
        let _ = ch
            .queue_delete(QueueDelete {
                queue: name.as_str().into(),
                ..Default::default()
            })
            .await;
    }
    conn.close().await.unwrap();
}

/// Takes the one message of `queue` (acked), waiting up to `limit` for it
/// (and for the consuming connection, should it be recovering).
async fn take_eventually(conn: &Conn, queue: &str, limit: Duration) -> acemq_core::amqp::GetMessage {
    let deadline = Instant::now() + limit;
    let mut channel = None;
    loop {
        if channel.is_none() {
            channel = conn.consuming_connection().channel().await.ok();
        }
        if let Some(ch) = &channel {
            match ch.basic_get(queue, true).await {
                Ok(Some(m)) => return m,
                Ok(None) => {}
                Err(_) => channel = None,
            }
        }
        assert!(Instant::now() < deadline, "nothing in {queue} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn header<'a>(m: &'a acemq_core::amqp::GetMessage, key: &str) -> Option<&'a FieldValue> {
    m.properties.as_ref().ok()?.headers.as_ref()?.get(key)
}

/// Another client takes the one message of `q` with `basic.get` and
/// returns it with `basic.nack(requeue)`: one broker redelivery.
async fn redeliver_once(b: &Broker, q: &str) {
    let other = b.connect().await;
    let ch = other.channel().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        if let Some(m) = ch.basic_get(q, false).await.unwrap() {
            break m;
        }
        assert!(Instant::now() < deadline, "the message never reached {q}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    got.nack(true).unwrap();
    other.close().await.unwrap();
}

/// What a message went through before the consumer saw it, and how the
/// consumer waits between attempts.
#[derive(Debug, Clone, Copy)]
struct Mix {
    queue: QueueType,
    /// How many times another client takes it and returns it first.
    nacks: u32,
    /// Waits spent on rungs (else in the process).
    rungs: bool,
}

/// One message through `mix`, then a consumer whose handler always asks
/// for a retry, with 6 attempts: the attempts the handler saw, and the
/// dead letter.
async fn attempts_through(b: &Broker, scale: u32, mix: Mix) -> (Vec<u32>, acemq_core::amqp::GetMessage) {
    let conn = b.conn_with(Config::default()).await;
    let q = unique("attempts");
    let policy = if mix.rungs {
        // Every wait on a rung.
        RetryPolicy::fixed(6, secs(1, scale))
            .with_jitter(0.0)
            .wait_in_broker_from(secs(1, scale))
    } else {
        // Every wait in the process: the issue's own policy.
        RetryPolicy::fixed(6, Duration::from_millis(50))
            .with_jitter(0.0)
            .wait_in_broker_from(Duration::from_secs(3600))
    };
    declare(&conn, &q, mix.queue, &policy).await;
    conn.publisher::<Order>("", &q).send(&Order { id: 1 }).await.unwrap();
    for _ in 0..mix.nacks {
        redeliver_once(b, &q).await;
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let calls = seen.clone();
    let consumer = consume(&conn, &q, move |m: Message<Order>| {
        calls.lock().unwrap().push(m.envelope.attempt);
        async { Ack::retry(Boom("always")) }
    })
    .retry_with(policy.clone())
    .await
    .unwrap();
    let dead = take_eventually(&conn, &format!("{q}.dlq"), secs(60, scale) + Duration::from_secs(10)).await;
    consumer.close().await.unwrap();
    cleanup(&conn, &q, &policy).await;
    let seen = seen.lock().unwrap().clone();
    (seen, dead)
}

#[test]
fn the_attempt_rises_by_one_per_handler_call_and_per_broker_redelivery() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            for queue in [QueueType::Quorum, QueueType::Classic] {
                for rungs in [false, true] {
                    let mix = Mix { queue, nacks: 1, rungs };
                    let (seen, dead) = attempts_through(&b, scale, mix).await;
                    // The redelivery is attempt 2; each retry one more; the
                    // sixth is the last.
                    assert_eq!(seen, [2, 3, 4, 5, 6], "{:?}: {mix:?}", b.kind);
                    assert_eq!(
                        header(&dead, ATTEMPT_HEADER).and_then(FieldValue::as_i64),
                        Some(6),
                        "{:?}: {mix:?}: the dead letter carries the last attempt",
                        b.kind
                    );
                    assert_eq!(
                        header(&dead, "x-delivery-count"),
                        None,
                        "{:?}: {mix:?}: the broker's count never travels on a republish",
                        b.kind
                    );
                }
            }
            // A quorum queue counts each redelivery: two returns, attempt 3;
            // five, attempt 6, the last, whose dead letter says so.
            for (nacks, expected) in [(2, &[3, 4, 5, 6][..]), (5, &[6])] {
                let mix = Mix {
                    queue: QueueType::Quorum,
                    nacks,
                    rungs: false,
                };
                let (seen, dead) = attempts_through(&b, scale, mix).await;
                assert_eq!(seen, expected, "{:?}: {mix:?}", b.kind);
                assert_eq!(
                    header(&dead, ATTEMPT_HEADER).and_then(FieldValue::as_i64),
                    Some(6),
                    "{:?}: {mix:?}",
                    b.kind
                );
            }
        });
    })
}

/// One message on a queue of `kind` whose handler retries, except call 2,
/// which is running when the consuming connection is forced closed and
/// accepts once the loss is seen (its ack cannot reach the broker): the
/// attempts the handler saw, and the dead letter.
async fn attempts_across_a_recovery(
    b: &Broker,
    scale: u32,
    kind: QueueType,
) -> (Vec<u32>, acemq_core::amqp::GetMessage) {
    let name = unique("attempts-rec");
    let lost = Arc::new(Semaphore::new(0));
    let mut config = Config::default();
    let seen_lost = lost.clone();
    config.on_recovery = Some(Arc::new(move |event| {
        if matches!(event, RecoveryEvent::Lost { which: "consume", .. }) {
            seen_lost.add_permits(1);
        }
    }));
    config.recovery_delay = Duration::from_millis(50);
    config.recovery_delay_max = Duration::from_millis(400);
    config.engine.connection_name = Some(name.clone());
    let conn = b.conn_with(config).await;
    let q = unique("attempts");
    let policy = RetryPolicy::fixed(6, Duration::from_millis(50))
        .with_jitter(0.0)
        .wait_in_broker_from(Duration::from_secs(3600));
    declare(&conn, &q, kind, &policy).await;
    conn.publisher::<Order>("", &q).send(&Order { id: 1 }).await.unwrap();
    let running = Arc::new(Semaphore::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (calls, started, lost_seen) = (seen.clone(), running.clone(), lost.clone());
    let consumer = consume(&conn, &q, move |m: Message<Order>| {
        let call = {
            let mut calls = calls.lock().unwrap();
            calls.push(m.envelope.attempt);
            calls.len()
        };
        let (started, lost_seen) = (started.clone(), lost_seen.clone());
        async move {
            if call != 2 {
                return Ack::retry(Boom("always"));
            }
            started.add_permits(1);
            lost_seen.acquire().await.unwrap().forget();
            Ack::accept()
        }
    })
    .retry_with(policy.clone())
    .await
    .unwrap();
    running.acquire().await.unwrap().forget();
    b.force_close(&format!("{name}-consume"));
    let dead = take_eventually(&conn, &format!("{q}.dlq"), secs(60, scale) + Duration::from_secs(30)).await;
    consumer.close().await.unwrap();
    cleanup(&conn, &q, &policy).await;
    let seen = seen.lock().unwrap().clone();
    (seen, dead)
}

#[test]
fn a_recovery_redelivery_counts_once_between_retries() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            for kind in [QueueType::Quorum, QueueType::Classic] {
                let (seen, dead) = attempts_across_a_recovery(&b, scale, kind).await;
                // Call 2's delivery comes back once: attempt 3.
                assert_eq!(seen, [1, 2, 3, 4, 5, 6], "{:?}: {kind:?}", b.kind);
                assert_eq!(
                    header(&dead, ATTEMPT_HEADER).and_then(FieldValue::as_i64),
                    Some(6),
                    "{:?}: {kind:?}",
                    b.kind
                );
                assert_eq!(header(&dead, "x-delivery-count"), None, "{:?}: {kind:?}", b.kind);
            }
        });
    })
}

#[test]
fn a_delivery_count_written_by_a_producer_is_not_counted() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, _scale| async move {
            let conn = b.conn_with(Config::default()).await;
            let q = unique("attempts");
            let policy = RetryPolicy::immediate();
            declare(&conn, &q, QueueType::Quorum, &policy).await;
            // Another client republishes a quorum delivery as it got it.
            let raw = conn.publishing_connection().channel().await.unwrap();
            raw.confirm_select().await.unwrap();
            let mut headers = FieldTable::new();
            headers.insert("x-delivery-count", FieldValue::I64(4));
            let properties = BasicProperties {
                headers: Some(headers),
                ..Default::default()
            };
            let publish = |body: &'static str| {
                let (raw, properties, q) = (&raw, properties.clone(), q.clone());
                async move {
                    raw.publish("", &q, false, properties, body)
                        .await
                        .unwrap()
                        .await
                        .unwrap()
                }
            };
            // Order 2 is returned once by another client: the broker's own
            // count replaces the one it was published with.
            publish("{\"id\":2}").await;
            redeliver_once(&b, &q).await;
            // Order 1 never was.
            publish("{\"id\":1}").await;
            let seen = Arc::new(Mutex::new(Vec::new()));
            let calls = seen.clone();
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                let mut calls = calls.lock().unwrap();
                calls.push((m.payload.id, m.redelivered, m.envelope.attempt));
                calls.sort();
                async { Ack::accept() }
            })
            .await
            .unwrap();
            let until = Instant::now() + Duration::from_secs(10);
            while seen.lock().unwrap().len() < 2 {
                assert!(Instant::now() < until, "{:?}: {:?}", b.kind, seen.lock().unwrap());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            consumer.close().await.unwrap();
            cleanup(&conn, &q, &policy).await;
            assert_eq!(
                *seen.lock().unwrap(),
                [(1, false, 1), (2, true, 2)],
                "{:?}: only the broker's count of this copy counts",
                b.kind
            );
        });
    })
}

/// Publishes `body` to `q` with `properties`, confirmed, as another
/// producer would (nothing of acemq's envelope added).
async fn publish_raw(conn: &Conn, q: &str, properties: BasicProperties, body: String) {
    let raw = conn.publishing_connection().channel().await.unwrap();
    raw.confirm_select().await.unwrap();
    raw.publish("", q, false, properties, body)
        .await
        .unwrap()
        .await
        .unwrap();
    let _ = raw.close().await;
}

/// One call of a handler, as recorded.
#[derive(Debug, Clone)]
struct Seen {
    id: u32,
    attempt: u32,
    first_seen: SystemTime,
    causation: Option<String>,
}

/// Waits until `seen` holds `n` calls, at most `limit`.
async fn calls(seen: &Arc<Mutex<Vec<Seen>>>, n: usize, limit: Duration, what: &str) -> Vec<Seen> {
    let until = Instant::now() + limit;
    loop {
        let now = seen.lock().unwrap().clone();
        if now.len() >= n {
            return now;
        }
        assert!(
            Instant::now() < until,
            "{what}: {} of {n} calls within {limit:?}: {now:?}",
            now.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// 2^63 + 1 seconds: no clock can hold it.
const FAR_TIMESTAMP: u64 = (1 << 63) + 1;

#[test]
fn a_timestamp_out_of_range_is_read_as_absent_and_keeps_no_prefetch_slot() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, _scale| async move {
            let conn = b.conn_with(Config::default()).await;
            let q = unique("hostile");
            let policy = RetryPolicy::immediate();
            declare(&conn, &q, QueueType::Quorum, &policy).await;
            // Six with a timestamp of 2^63 + 1 ahead of ten good ones.
            for id in 1..=16 {
                let timestamp = if id <= 6 { FAR_TIMESTAMP } else { 1_700_000_000 };
                let properties = BasicProperties {
                    timestamp: Some(timestamp),
                    ..Default::default()
                };
                publish_raw(&conn, &q, properties, format!("{{\"id\":{id}}}")).await;
            }
            let seen = Arc::new(Mutex::new(Vec::new()));
            let record = seen.clone();
            let started = SystemTime::now();
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                record.lock().unwrap().push(Seen {
                    id: m.payload.id,
                    attempt: m.envelope.attempt,
                    first_seen: m.envelope.first_seen,
                    causation: None,
                });
                async { Ack::accept() }
            })
            .prefetch(5)
            .await
            .unwrap();
            let mut all = calls(&seen, 16, Duration::from_secs(15), "sixteen messages").await;
            consumer.close().await.unwrap();
            cleanup(&conn, &q, &policy).await;
            all.sort_by_key(|s| s.id);
            assert_eq!(
                all.iter().map(|s| s.id).collect::<Vec<_>>(),
                (1..=16).collect::<Vec<_>>(),
                "{:?}: every message handled once",
                b.kind
            );
            for s in &all {
                assert_eq!(s.attempt, 1, "{:?}: {s:?}", b.kind);
                if s.id <= 6 {
                    // Read as absent: first seen is when it was read.
                    let read_at = s.first_seen.duration_since(started - Duration::from_secs(1));
                    assert!(read_at.is_ok(), "{:?}: {s:?}", b.kind);
                } else {
                    assert_eq!(
                        s.first_seen,
                        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
                        "{:?}",
                        b.kind
                    );
                }
            }
        });
    })
}

#[test]
fn envelope_headers_of_another_type_or_out_of_range_are_read_as_absent() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, _scale| async move {
            let conn = b.conn_with(Config::default()).await;
            let q = unique("hostile");
            let policy = RetryPolicy::fixed(3, Duration::from_millis(10))
                .with_jitter(0.0)
                .wait_in_broker_from(Duration::from_secs(3600));
            declare(&conn, &q, QueueType::Quorum, &policy).await;
            let given = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
            // (header, value, timestamp property): each read as if the
            // header were not there.
            let cases: Vec<(&str, FieldValue, Option<u64>)> = vec![
                (ATTEMPT_HEADER, FieldValue::from("three"), None),
                (ATTEMPT_HEADER, FieldValue::I32(-4), None),
                (ATTEMPT_HEADER, FieldValue::I64(i64::MAX), None),
                (ATTEMPT_HEADER, FieldValue::U32(3_000_000_000), None),
                (ATTEMPT_HEADER, FieldValue::Timestamp(u64::MAX), None),
                (FIRST_SEEN_HEADER, FieldValue::from("yesterday"), Some(1_700_000_000)),
                (FIRST_SEEN_HEADER, FieldValue::Timestamp(u64::MAX), Some(1_700_000_000)),
                (
                    FIRST_SEEN_HEADER,
                    FieldValue::Timestamp(FAR_TIMESTAMP),
                    Some(1_700_000_000),
                ),
                (FIRST_SEEN_HEADER, FieldValue::I64(-1), Some(1_700_000_000)),
                (FIRST_SEEN_HEADER, FieldValue::Bool(true), Some(1_700_000_000)),
                (CAUSATION_HEADER, FieldValue::I32(7), Some(1_700_000_000)),
                (ROUTING_SLIP_HEADER, FieldValue::from("not a slip"), Some(1_700_000_000)),
                (ROUTING_SLIP_STEP_HEADER, FieldValue::from("two"), Some(1_700_000_000)),
                (ROUTING_SLIP_STEP_HEADER, FieldValue::I64(-9), Some(1_700_000_000)),
            ];
            for (n, (name, value, timestamp)) in cases.iter().enumerate() {
                let mut headers = FieldTable::new();
                headers.insert(*name, value.clone());
                let properties = BasicProperties {
                    headers: Some(headers),
                    timestamp: *timestamp,
                    ..Default::default()
                };
                publish_raw(&conn, &q, properties, format!("{{\"id\":{n}}}")).await;
            }
            // Each is retried once, then accepted: the retried copy reads
            // cleanly too.
            let seen = Arc::new(Mutex::new(Vec::new()));
            let record = seen.clone();
            let started = SystemTime::now() - Duration::from_secs(1);
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                let ack = if m.envelope.attempt == 1 {
                    Ack::retry(Boom("once"))
                } else {
                    Ack::accept()
                };
                record.lock().unwrap().push(Seen {
                    id: m.payload.id,
                    attempt: m.envelope.attempt,
                    first_seen: m.envelope.first_seen,
                    causation: m.envelope.causation_id.clone(),
                });
                async move { ack }
            })
            .retry_with(policy.clone())
            .routing_slips(|_: &str, _: &str| true)
            .prefetch(3)
            .await
            .unwrap();
            let all = calls(&seen, 2 * cases.len(), Duration::from_secs(15), "each case twice").await;
            consumer.close().await.unwrap();
            cleanup(&conn, &q, &policy).await;
            for (n, (name, value, timestamp)) in cases.iter().enumerate() {
                let case: Vec<&Seen> = all.iter().filter(|s| s.id as usize == n).collect();
                let what = format!("{:?}: {name} = {value:?}", b.kind);
                assert_eq!(
                    case.iter().map(|s| s.attempt).collect::<Vec<_>>(),
                    [1, 2],
                    "{what}: read as attempt 1, retried as 2"
                );
                assert!(case.iter().all(|s| s.causation.is_none()), "{what}");
                match timestamp {
                    // Without the header, first seen is the timestamp property...
                    Some(_) => assert!(case.iter().all(|s| s.first_seen == given), "{what}: {case:?}"),
                    // ...or when it was read, and the retry keeps it.
                    None => {
                        assert!(case[0].first_seen >= started, "{what}: {case:?}");
                        let apart = case[1].first_seen.duration_since(case[0].first_seen);
                        assert!(apart.is_ok_and(|d| d <= Duration::from_secs(2)), "{what}: {case:?}");
                    }
                }
            }
        });
    })
}

#[test]
fn a_handler_that_panics_is_retried_then_dead_lettered_per_policy() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            let conn = b.conn_with(Config::default()).await;
            let q = unique("hostile");
            let policy = RetryPolicy::fixed(3, Duration::from_millis(20))
                .with_jitter(0.0)
                .wait_in_broker_from(Duration::from_secs(3600));
            declare(&conn, &q, QueueType::Quorum, &policy).await;
            let seen = Arc::new(Mutex::new(Vec::new()));
            let record = seen.clone();
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                record.lock().unwrap().push(Seen {
                    id: m.payload.id,
                    attempt: m.envelope.attempt,
                    first_seen: m.envelope.first_seen,
                    causation: None,
                });
                let id = m.payload.id;
                async move {
                    if id == 1 {
                        panic!("order {id} is cursed");
                    }
                    Ack::accept()
                }
            })
            .retry_with(policy.clone())
            .prefetch(1)
            .await
            .unwrap();
            let publisher = conn.publisher::<Order>("", &q);
            publisher.send(&Order { id: 1 }).await.unwrap();
            publisher.send(&Order { id: 2 }).await.unwrap();
            let dead = take_eventually(&conn, &format!("{q}.dlq"), secs(60, scale) + Duration::from_secs(10)).await;
            // The one prefetch slot was freed each time: order 2 got through.
            let all = calls(&seen, 4, Duration::from_secs(10), "three panics and order 2").await;
            consumer.close().await.unwrap();
            cleanup(&conn, &q, &policy).await;
            let panicked: Vec<u32> = all.iter().filter(|s| s.id == 1).map(|s| s.attempt).collect();
            assert_eq!(panicked, [1, 2, 3], "{:?}: a panic is a failed attempt", b.kind);
            assert!(all.iter().any(|s| s.id == 2), "{:?}", b.kind);
            let error = header(&dead, ERROR_HEADER)
                .and_then(FieldValue::as_str)
                .unwrap_or_default();
            assert!(
                error.contains("the handler panicked: order 1 is cursed") && error.contains("3 attempts"),
                "{:?}: {error}",
                b.kind
            );
            assert_eq!(
                header(&dead, ATTEMPT_HEADER).and_then(FieldValue::as_i64),
                Some(3),
                "{:?}",
                b.kind
            );
        });
    })
}

#[test]
fn peek_and_replay_read_a_set_aside_message_with_times_out_of_range() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, _scale| async move {
            let conn = b.conn_with(Config::default()).await;
            let q = unique("hostile");
            let policy = RetryPolicy::immediate();
            declare(&conn, &q, QueueType::Quorum, &policy).await;
            let dlq = format!("{q}.dlq");
            let mut headers = FieldTable::new();
            headers.insert(ATTEMPT_HEADER, FieldValue::from("many"));
            headers.insert(REPLAYED_HEADER, FieldValue::I64(-3));
            headers.insert(ORIGINAL_EXCHANGE_HEADER, FieldValue::from(""));
            headers.insert(ORIGINAL_ROUTING_KEY_HEADER, FieldValue::from(q.as_str()));
            headers.insert("x-delivery-count", FieldValue::I64(9));
            let properties = BasicProperties {
                timestamp: Some(FAR_TIMESTAMP),
                headers: Some(headers),
                ..Default::default()
            };
            publish_raw(&conn, &dlq, properties, "{\"id\":1}".to_string()).await;
            let until = Instant::now() + Duration::from_secs(10);
            let listed = loop {
                let listed = conn.peek(&dlq, 10).await.unwrap();
                if !listed.is_empty() || Instant::now() > until {
                    break listed;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            assert_eq!(listed.len(), 1, "{:?}", b.kind);
            assert_eq!(listed[0].envelope.attempt, 1, "{:?}", b.kind);
            assert_eq!(listed[0].replayed, 0, "{:?}", b.kind);
            let report = conn.replay(&dlq, ReplayOptions::default()).await.unwrap();
            assert_eq!((report.examined, report.replayed), (1, 1), "{:?}: {report:?}", b.kind);
            let back = take_eventually(&conn, &q, Duration::from_secs(10)).await;
            cleanup(&conn, &q, &policy).await;
            assert_eq!(header(&back, ATTEMPT_HEADER), Some(&FieldValue::I32(1)), "{:?}", b.kind);
            let first_seen = header(&back, FIRST_SEEN_HEADER).and_then(FieldValue::as_i64);
            assert!(
                first_seen.is_some_and(|s| s > 1_700_000_000 && s < 4_000_000_000),
                "{:?}: {first_seen:?}",
                b.kind
            );
        });
    })
}
