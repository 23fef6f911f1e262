//! The consumer's promises under messages and histories it did not write
//! itself, on every broker: the attempt a handler sees counts every handler
//! call and every broker redelivery exactly once, whatever the queue type
//! and whatever mix of redeliveries, waits, rungs and recoveries a message
//! went through; and no property, header or body a producer can publish
//! makes a consumer panic, stall or keep a prefetch slot.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_core::envelope::ATTEMPT_HEADER;
use acemq_core::{consume, Ack, Config, Conn, Message, RecoveryEvent, RetryPolicy, Topology};
use acemq_tests::{brokers, unique, Broker, Kind};
use amqp_codec::{BasicProperties, FieldTable, FieldValue, QueueDeclare, QueueDelete};
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

/// Runs `scenario` on every broker: acemq-memory on a paused clock with
/// `scale` 1, RabbitMQ on a real clock with `scale` 100 (divide delays by it).
fn on_every_broker<F, Fut>(scenario: F)
where
    F: Fn(Broker, u32) -> Fut,
    Fut: Future<Output = ()>,
{
    let all = tokio::runtime::Runtime::new().unwrap().block_on(brokers());
    for b in all {
        let kind = b.kind;
        let runtime = if kind == Kind::Memory {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
        } else {
            tokio::runtime::Builder::new_multi_thread().enable_all().build()
        }
        .unwrap();
        let scale = if kind == Kind::Memory { 1 } else { 100 };
        runtime.block_on(acemq_tests::deadline(scenario(b, scale)));
    }
}

fn secs(n: u64, scale: u32) -> Duration {
    Duration::from_secs(n) / scale
}

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
    config.connection_name = Some(name.clone());
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
