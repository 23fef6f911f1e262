//! The consuming side of the acemq API: statements 1–12 of `docs/statements.md`, each
//! a test named after it, run on acemq-memory with a paused clock (delays at
//! full scale: a 160 s rung takes no real time) and on RabbitMQ with the same
//! shape a hundred times faster.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use acemq_codec::{BasicProperties, FieldArray, FieldTable, FieldValue, QueueDeclare, QueueDelete};
use acemq_core::amqp::Confirmation;
use acemq_core::envelope::{ERROR_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER};
use acemq_core::topology::Declaration;
use acemq_core::{consume, fatal, Ack, Config, Conn, Envelope, Error, Message, RetryPolicy, Topology};
use acemq_tests::{brokers, counter_total, depth, on_every_broker, secs, unique, Broker, Kind, Moment, RabbitVersion};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
}

/// A fresh source queue with acemq's topology (quorum, dead letters, the rungs of `policy`).
async fn setup(b: &Broker, policy: &RetryPolicy) -> (Conn, String) {
    let conn = b.conn_with(Config::default()).await;
    let q = unique("consume");
    Topology::new()
        .queue(&q)
        .dead_letters(&q)
        .retries(&q, policy)
        .declare(&conn)
        .await
        .unwrap();
    (conn, q)
}

async fn cleanup(conn: &Conn, queue: &str) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    for d in conn.declared() {
        if let Declaration::Queue { name, .. } = d {
            if name.starts_with(queue) {
                let _ = ch
                    .queue_delete(QueueDelete {
                        queue: name.as_str().into(),
                        ..Default::default()
                    })
                    .await;
            }
        }
    }
    conn.close().await.unwrap();
}

/// Polls until `check` holds (on the paused clock too), for at most `limit`.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "condition not met within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One handler call, as the test records it.
#[derive(Debug, Clone)]
struct Call {
    attempt: u32,
    id: String,
    redelivered: bool,
    /// It carried `x-death`: it came through a broker dead-letter route (a rung).
    dead_lettered: bool,
    when: Moment,
}

type Calls = Arc<Mutex<Vec<Call>>>;

fn record(calls: &Calls, m: &Message<Order>) -> usize {
    let mut calls = calls.lock().unwrap();
    calls.push(Call {
        attempt: m.envelope.attempt,
        id: m.envelope.id.clone(),
        redelivered: m.redelivered,
        dead_lettered: m.envelope.headers.contains_key("x-death"),
        when: Moment::now(),
    });
    calls.len()
}

/// Starts a consumer on `q` that records every call and answers call `n`
/// (from 1) with `verdict(n)`.
async fn recording<V>(conn: &Conn, q: &str, policy: RetryPolicy, verdict: V) -> (acemq_core::Consumer, Calls)
where
    V: Fn(usize) -> Ack + Send + Sync + 'static,
{
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let consumer = consume(conn, q, move |m: Message<Order>| {
        let ack = verdict(record(&seen, &m));
        async move { ack }
    })
    .retry_with(policy)
    .await
    .unwrap();
    (consumer, calls)
}

/// Takes the one message in `queue`, if any, through the engine.
async fn take(conn: &Conn, queue: &str) -> Option<acemq_core::amqp::GetMessage> {
    let ch = conn.consuming_connection().channel().await.unwrap();
    ch.basic_get(queue, true).await.unwrap()
}

async fn take_eventually(conn: &Conn, queue: &str, limit: Duration) -> acemq_core::amqp::GetMessage {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(m) = take(conn, queue).await {
            return m;
        }
        assert!(Instant::now() < deadline, "nothing in {queue} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn header<'a>(m: &'a acemq_core::amqp::GetMessage, key: &str) -> Option<&'a FieldValue> {
    m.properties.as_ref().ok()?.headers.as_ref()?.get(key)
}

#[derive(Debug)]
struct Boom(&'static str);
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}
impl std::error::Error for Boom {}

// ---- 1 ----

#[test]
fn statement_01_a_retry_is_a_republish_with_the_attempt_advanced_and_redeliveries_count() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            let policy = RetryPolicy::fixed(5, secs(1, scale)).with_jitter(0.0);
            let (conn, q) = setup(&b, &policy).await;
            let (consumer, calls) = recording(&conn, &q, policy, |n| {
                if n < 3 {
                    Ack::retry(Boom("not yet"))
                } else {
                    Ack::accept()
                }
            })
            .await;
            conn.publisher::<Order>("", &q).send(&Order { id: 1 }).await.unwrap();
            eventually(secs(30, scale) + Duration::from_secs(5), || {
                calls.lock().unwrap().len() == 3
            })
            .await;
            consumer.close().await.unwrap();
            let calls = calls.lock().unwrap().clone();
            assert_eq!(
                calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
                [1, 2, 3],
                "{:?}",
                b.kind
            );
            assert!(
                calls.iter().all(|c| c.id == calls[0].id),
                "the message id never changes"
            );
            assert!(
                calls.iter().all(|c| !c.redelivered),
                "a retry is a republish, not a redelivery"
            );

            // A broker requeue does not advance the header, but the redelivery counts.
            let publisher = conn.publisher::<Order>("", &q);
            publisher.send(&Order { id: 2 }).await.unwrap();
            let ch = conn.consuming_connection().channel().await.unwrap();
            let got = take_get(&ch, &q).await;
            got.nack(true).unwrap();
            let attempts: Calls = Arc::default();
            let seen = attempts.clone();
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                record(&seen, &m);
                async { Ack::accept() }
            })
            .await
            .unwrap();
            eventually(Duration::from_secs(10), || attempts.lock().unwrap().len() == 1).await;
            consumer.close().await.unwrap();
            let first = attempts.lock().unwrap()[0].clone();
            assert!(first.redelivered);
            assert_eq!(first.attempt, 2, "{:?}: header 1 plus one redelivery", b.kind);
            cleanup(&conn, &q).await;
        });
    })
}

async fn take_get(ch: &acemq_core::amqp::Channel, q: &str) -> acemq_core::amqp::GetMessage {
    for _ in 0..500 {
        if let Some(m) = ch.basic_get(q, false).await.unwrap() {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no message in {q}");
}

// ---- 2 ----

#[test]
fn statement_02_max_attempts_counts_the_first_delivery_then_the_dlq_with_the_error() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            let policy = RetryPolicy::fixed(3, secs(1, scale)).with_jitter(0.0);
            let (conn, q) = setup(&b, &policy).await;
            let (consumer, calls) = recording(&conn, &q, policy, |_| Ack::retry(Boom("payment service down"))).await;
            conn.publisher::<Order>("", &q).send(&Order { id: 7 }).await.unwrap();
            let dead = take_eventually(&conn, &format!("{q}.dlq"), secs(60, scale) + Duration::from_secs(5)).await;
            consumer.close().await.unwrap();
            assert_eq!(calls.lock().unwrap().len(), 3, "{:?}: one try and two retries", b.kind);
            let error = header(&dead, ERROR_HEADER).and_then(FieldValue::as_str).unwrap();
            assert!(error.contains("payment service down"), "{error}");
            assert!(error.contains("3 attempts"), "{error}");
            assert_eq!(
                header(&dead, ORIGINAL_EXCHANGE_HEADER).and_then(FieldValue::as_str),
                Some("")
            );
            assert_eq!(
                header(&dead, ORIGINAL_ROUTING_KEY_HEADER).and_then(FieldValue::as_str),
                Some(q.as_str())
            );
            assert_eq!(serde_json::from_slice::<Order>(&dead.body).unwrap(), Order { id: 7 });
            cleanup(&conn, &q).await;
        });
    })
}

// ---- 3 ----

#[test]
fn statement_03_fatal_errors_undecodable_bodies_and_refused_properties_go_to_the_dlq_at_once() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            let policy = RetryPolicy::fixed(5, secs(1, scale));
            let (conn, q) = setup(&b, &policy).await;
            let (consumer, calls) = recording(&conn, &q, policy, |_| {
                Ack::retry(fatal(Boom("no customer on this order")))
            })
            .await;
            let dlq = format!("{q}.dlq");
            conn.publisher::<Order>("", &q).send(&Order { id: 1 }).await.unwrap();
            let dead = take_eventually(&conn, &dlq, Duration::from_secs(10)).await;
            assert!(header(&dead, ERROR_HEADER)
                .and_then(FieldValue::as_str)
                .unwrap()
                .contains("no customer"));
            assert_eq!(calls.lock().unwrap().len(), 1, "fatal: no retries");

            // A body that does not decode never reaches the handler.
            let raw = conn.publishing_connection().channel().await.unwrap();
            raw.confirm_select().await.unwrap();
            raw.publish("", &q, false, BasicProperties::default(), "not json")
                .await
                .unwrap()
                .await
                .unwrap();
            let dead = take_eventually(&conn, &dlq, Duration::from_secs(10)).await;
            assert_eq!(&dead.body[..], b"not json");
            let error = header(&dead, ERROR_HEADER)
                .and_then(FieldValue::as_str)
                .unwrap()
                .to_string();
            assert!(error.contains("body could not be decoded"), "{error}");

            // Properties the codec refuses (headers nested deeper than 64) are
            // set aside once; the connection stays up.
            let mut deep = FieldValue::Void;
            for _ in 0..80 {
                deep = FieldValue::Array(FieldArray(vec![deep]));
            }
            let mut headers = FieldTable::new();
            headers.insert("deep", deep);
            let poison = BasicProperties {
                headers: Some(headers),
                message_id: Some("poison-1".into()),
                correlation_id: Some("corr-1".into()),
                timestamp: Some(1_700_000_000),
                ..Default::default()
            };
            raw.publish("", &q, false, poison, "{\"id\":3}")
                .await
                .unwrap()
                .await
                .unwrap();
            let dead = take_eventually(&conn, &dlq, Duration::from_secs(10)).await;
            let error = header(&dead, ERROR_HEADER)
                .and_then(FieldValue::as_str)
                .unwrap()
                .to_string();
            assert!(
                error.contains("properties could not be decoded"),
                "{:?}: {error}",
                b.kind
            );
            // What could still be read went with it, so it can be found.
            let kept = dead.properties.as_ref().expect("the set-aside copy decodes");
            assert_eq!(kept.message_id.as_ref().map(|s| s.to_string()), Some("poison-1".into()));
            assert_eq!(
                kept.correlation_id.as_ref().map(|s| s.to_string()),
                Some("corr-1".into())
            );
            assert_eq!(kept.timestamp, Some(1_700_000_000), "{:?}", b.kind);
            assert_eq!(calls.lock().unwrap().len(), 1, "neither reached the handler");
            assert!(!conn.consuming_connection().is_closed());
            assert!(
                take(&conn, &dlq).await.is_none(),
                "set aside once, not redelivered forever"
            );
            consumer.close().await.unwrap();
            cleanup(&conn, &q).await;
        });
    })
}

/// A message from another publisher, without a message-id, keeps one id
/// across every retry and into the dlq (`Envelope.id` is stable).
#[test]
fn a_message_without_a_message_id_keeps_one_id_across_retries_and_into_the_dlq() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            let policy = RetryPolicy::fixed(3, secs(1, scale));
            let (conn, q) = setup(&b, &policy).await;
            let (consumer, calls) = recording(&conn, &q, policy, |_| Ack::retry(Boom("not yet"))).await;
            let raw = conn.publishing_connection().channel().await.unwrap();
            raw.confirm_select().await.unwrap();
            let props = BasicProperties {
                content_type: Some("application/json".into()),
                ..Default::default()
            };
            raw.publish("", &q, false, props, "{\"id\":7}")
                .await
                .unwrap()
                .await
                .unwrap();
            let dead = take_eventually(&conn, &format!("{q}.dlq"), Duration::from_secs(20)).await;
            let ids: Vec<String> = calls.lock().unwrap().iter().map(|e| e.id.clone()).collect();
            assert_eq!(ids.len(), 3, "{:?}: {ids:?}", b.kind);
            assert!(ids.iter().all(|id| *id == ids[0]), "{:?}: {ids:?}", b.kind);
            let dead_id = dead
                .properties
                .as_ref()
                .unwrap()
                .message_id
                .as_ref()
                .map(|s| s.to_string());
            assert_eq!(dead_id.as_deref(), Some(ids[0].as_str()), "{:?}", b.kind);
            consumer.close().await.unwrap();
            cleanup(&conn, &q).await;
        });
    })
}

// ---- 4 ----

#[test]
fn statement_04_park_republishes_to_parked_with_the_reason() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, _scale| async move {
            let policy = RetryPolicy::immediate();
            let (conn, q) = setup(&b, &policy).await;
            let consumer = consume(&conn, &q, |_m: Message<Order>| async {
                Ack::park("needs a human: odd address")
            })
            .await
            .unwrap();
            conn.publisher::<Order>("", &q).send(&Order { id: 4 }).await.unwrap();
            let parked = take_eventually(&conn, &format!("{q}.parked"), Duration::from_secs(10)).await;
            consumer.close().await.unwrap();
            assert_eq!(
                header(&parked, ERROR_HEADER).and_then(FieldValue::as_str),
                Some("needs a human: odd address")
            );
            assert_eq!(
                header(&parked, ORIGINAL_ROUTING_KEY_HEADER).and_then(FieldValue::as_str),
                Some(q.as_str())
            );
            cleanup(&conn, &q).await;
        });
    })
}

// ---- 5 ----

#[test]
fn statement_05_give_up_after_dead_letters_a_message_first_seen_too_long_ago() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            let policy = RetryPolicy::fixed(10, secs(1, scale)).give_up_after(Duration::from_secs(3600));
            let (conn, q) = setup(&b, &policy).await;
            let (consumer, calls) = recording(&conn, &q, policy, |_| Ack::retry(Boom("still failing"))).await;
            let mut old = Envelope::new();
            old.first_seen = SystemTime::now() - Duration::from_secs(2 * 3600);
            conn.publisher::<Order>("", &q)
                .send_envelope(old, &Order { id: 5 })
                .await
                .unwrap();
            let dead = take_eventually(&conn, &format!("{q}.dlq"), Duration::from_secs(10)).await;
            consumer.close().await.unwrap();
            assert_eq!(calls.lock().unwrap().len(), 1);
            assert!(header(&dead, ERROR_HEADER)
                .and_then(FieldValue::as_str)
                .unwrap()
                .contains("first seen"));
            cleanup(&conn, &q).await;
        });
    })
}

// ---- 6 and 7: pure policy, no broker ----

#[test]
fn statement_06_jitter_is_twenty_percent_both_ways_settable_and_never_on_broker_waits() {
    acemq_tests::deadline_blocking(|| {
        let now = SystemTime::now();
        let spread = |policy: &RetryPolicy, attempt: u32| -> (Duration, Duration) {
            let waits: Vec<Duration> = (0..3000)
                .map(|_| match policy.decide(attempt, now, &Boom("x"), now) {
                    acemq_core::Decision::WaitInProcess(d) | acemq_core::Decision::WaitInBroker(d) => d,
                    other => panic!("{other:?}"),
                })
                .collect();
            (*waits.iter().min().unwrap(), *waits.iter().max().unwrap())
        };
        let (lo, hi) = spread(&RetryPolicy::fixed(9, Duration::from_secs(10)), 1);
        assert!(
            lo >= Duration::from_secs(8) && lo < Duration::from_millis(8400),
            "{lo:?}"
        );
        assert!(
            hi <= Duration::from_secs(12) && hi > Duration::from_millis(11600),
            "{hi:?}"
        );
        let (lo, _) = spread(&RetryPolicy::fixed(9, Duration::from_secs(10)).with_jitter(0.5), 1);
        assert!(lo < Duration::from_secs(6));
        assert_eq!(
            spread(&RetryPolicy::fixed(9, Duration::from_secs(10)).with_jitter(0.0), 1),
            (Duration::from_secs(10), Duration::from_secs(10))
        );
        // A wait in the broker is exactly the rung's TTL.
        assert_eq!(
            spread(&RetryPolicy::fixed(9, Duration::from_secs(40)), 1),
            (Duration::from_secs(40), Duration::from_secs(40))
        );
    })
}

#[test]
fn statement_07_schedules_are_the_unjittered_delays() {
    acemq_tests::deadline_blocking(|| {
        let s = Duration::from_secs;
        assert_eq!(RetryPolicy::exponential(4, s(1), s(3)).schedule(), [s(1), s(2), s(3)]);
        assert_eq!(RetryPolicy::fixed(3, s(5)).schedule(), [s(5), s(5)]);
        assert_eq!(
            RetryPolicy::exponential(6, s(10), s(0)).schedule(),
            [s(10), s(20), s(40), s(80), s(160)]
        );
    })
}

// ---- 8 ----

#[test]
fn statement_08_short_waits_stay_in_the_consumer_and_long_ones_go_to_the_rungs() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            // exponential(6, 10 s, 0): 10 s and 20 s here, 40 s, 80 s and 160 s on rungs.
            let policy = RetryPolicy::exponential(6, secs(10, scale), Duration::ZERO)
                .with_jitter(0.0)
                .wait_in_broker_from(secs(30, scale));
            let rungs: Vec<String> = policy
                .rungs()
                .into_iter()
                .map(|d| acemq_core::retry::rung_name("q", d))
                .collect();
            if scale == 1 {
                assert_eq!(rungs, ["q.retry.40s", "q.retry.80s", "q.retry.160s"]);
            } else {
                assert_eq!(rungs, ["q.retry.400ms", "q.retry.800ms", "q.retry.1600ms"]);
            }
            let (conn, q) = setup(&b, &policy).await;
            let (consumer, calls) = recording(&conn, &q, policy, |_| Ack::retry(Boom("try later"))).await;
            conn.publisher::<Order>("", &q).send(&Order { id: 8 }).await.unwrap();
            take_eventually(&conn, &format!("{q}.dlq"), secs(400, scale) + Duration::from_secs(10)).await;
            consumer.close().await.unwrap();
            let calls = calls.lock().unwrap().clone();
            assert_eq!(calls.len(), 6, "{:?}", b.kind);
            let gaps: Vec<_> = calls.windows(2).map(|w| w[1].when.since(&w[0].when)).collect();
            for (gap, expected) in gaps.iter().zip([10, 20, 40, 80, 160]) {
                let expected = secs(expected, scale);
                // The broker's TTL and delivery add a little; never less than
                // the wait (on the clock the broker times it by, or ours).
                assert!(gap.at_least(expected), "{:?}: gap {gap} < {expected:?}", b.kind);
                assert!(
                    gap.monotonic < expected + expected / 2 + Duration::from_millis(300),
                    "{:?}: gap {gap} vs {expected:?}",
                    b.kind
                );
            }
            assert_eq!(calls.iter().map(|c| c.attempt).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6]);
            cleanup(&conn, &q).await;
        });
    })
}

// ---- 9 ----

/// Whether `queue` exists on the broker (a passive declare on a channel of its own).
async fn queue_exists(conn: &Conn, queue: &str) -> bool {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let passive = QueueDeclare {
        queue: queue.into(),
        passive: true,
        ..Default::default()
    };
    match ch.queue_declare(passive).await {
        Ok(_) => true,
        Err(err) if err.refusal().map(|r| r.code) == Some(404) => false,
        Err(err) => panic!("a passive declare of {queue}: {err}"),
    }
}

#[test]
fn statement_09_a_missing_rung_degrades_to_an_in_process_wait_and_is_counted() {
    acemq_tests::deadline_blocking(|| {
        let all = tokio::runtime::Runtime::new().unwrap().block_on(brokers());
        for b in all {
            let kind = b.kind;
            let scale = if kind == Kind::Memory { 1 } else { 100 };
            // A recorder of this broker's run alone: the count is asserted per broker.
            let recorder = metrics_util::debugging::DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(kind == Kind::Memory)
                .build()
                .unwrap();
            let delay = secs(40, scale);
            let (calls, rung_there_after) = metrics::with_local_recorder(&recorder, || {
                runtime.block_on(acemq_tests::deadline(async {
                    let policy = RetryPolicy::fixed(2, delay).wait_in_broker_from(secs(30, scale));
                    let (conn, q) = setup(&b, &policy).await;
                    let rung = acemq_core::retry::rung_name(&q, delay);
                    let (consumer, calls) = recording(&conn, &q, policy, |n| {
                        if n == 1 {
                            Ack::retry(Boom("once"))
                        } else {
                            Ack::accept()
                        }
                    })
                    .await;
                    // Behind the consumer's back, the rung goes away.
                    let ch = conn.consuming_connection().channel().await.unwrap();
                    ch.queue_delete(QueueDelete {
                        queue: rung.as_str().into(),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                    assert!(!queue_exists(&conn, &rung).await, "{kind:?}: the rung is gone");
                    conn.publisher::<Order>("", &q).send(&Order { id: 9 }).await.unwrap();
                    eventually(secs(60, scale) + Duration::from_secs(5), || {
                        calls.lock().unwrap().len() == 2
                    })
                    .await;
                    consumer.close().await.unwrap();
                    let rung_there_after = queue_exists(&conn, &rung).await;
                    cleanup(&conn, &q).await;
                    let calls = calls.lock().unwrap().clone();
                    (calls, rung_there_after)
                }))
            });
            assert_eq!(calls.len(), 2, "{kind:?}: one try and one retry");
            assert_eq!(calls[1].attempt, 2, "{kind:?}");
            assert!(
                calls[1].when.at - calls[0].when.at >= delay,
                "{kind:?}: the retry still waited the rung's {delay:?} ({:?})",
                calls[1].when.at - calls[0].when.at
            );
            // The wait was not spent in a rung: the retry came back without
            // the x-death a rung's dead-lettering writes. The rung was
            // declared again, as at start, for the retries after this one.
            assert!(rung_there_after, "{kind:?}: the missing rung was declared again");
            assert!(
                !calls[1].dead_lettered,
                "{kind:?}: the retry passed through a broker dead-letter route (a rung), not an in-process wait"
            );
            assert!(
                !calls[1].redelivered,
                "{kind:?}: the retry is a republish, not a requeue"
            );
            assert_eq!(
                counter_total(&snapshotter, acemq_core::metrics_names::RUNG_MISSING_TOTAL),
                1,
                "{kind:?}: acemq_rung_missing_total counts this broker's missing rung"
            );
        }
    })
}

// ---- 10 and 11 ----

/// The arguments the broker stores for `queue`: `key=value(type)` pairs on
/// acemq-memory, `rabbitmqctl list_queues`' arguments column on RabbitMQ.
/// RabbitMQ 4.0 stores `x-queue-type` for every queue, also one declared
/// without it (its default type, `classic`); 3.10 stores what was given.
fn stored_arguments(b: &Broker, queue: &str) -> String {
    if let Some(memory) = &b.memory {
        return describe(&memory.queue_info("/", queue).expect(queue).arguments);
    }
    let listing = b.rabbitmqctl(&["list_queues", "name", "arguments"]);
    let line = listing
        .lines()
        .find(|l| l.split('\t').next() == Some(queue))
        .unwrap_or_else(|| panic!("{queue} not listed in:\n{listing}"));
    line.split_once('\t')
        .map(|(_, args)| args.to_string())
        .unwrap_or_default()
}

#[test]
fn statement_10_the_consumer_declares_topologys_set_asides_and_rungs_in_either_order_never_the_source_queues_dead_letters(
) {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, _scale| async move {
            let kind = b.kind;
            let policy = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::ZERO);
            // What a consumer of `q` declares: Topology's dlx, dlq, parked and
            // rungs for it, with the same arguments, and nothing of `q` itself.
            let expected = |q: &str| {
                Topology::new()
                    .dead_letters(q)
                    .retries(q, &policy)
                    .declarations()
                    .unwrap()
            };
            let check_declared = |conn: &Conn, q: &str| {
                let declared = conn.declared();
                for d in &declared {
                    if let Declaration::Queue { name, arguments, .. } = d {
                        assert_ne!(name, q, "{kind:?}: the consumer declared its source queue: {d:?}");
                        assert_ne!(
                            arguments.get("x-dead-letter-exchange").and_then(FieldValue::as_str),
                            Some(acemq_core::topology::DLX),
                            "{kind:?}: only a source queue dead-letters to acemq.dlx: {d:?}"
                        );
                    }
                }
                assert_eq!(declared, expected(q), "{kind:?}");
            };

            // A source queue another client declared without dead letters (a
            // plain durable classic queue): the consumer starts on it with no
            // 406 and leaves its arguments alone.
            let q = unique("plain-source");
            let other = b.connect().await;
            let other_ch = other.channel().await.unwrap();
            let plain = QueueDeclare {
                queue: q.as_str().into(),
                durable: true,
                ..Default::default()
            };
            other_ch.queue_declare(plain.clone()).await.unwrap();
            let conn = b.conn_with(Config::default()).await;
            let handled: Calls = Arc::default();
            let seen = handled.clone();
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                record(&seen, &m);
                async { Ack::accept() }
            })
            .retry_with(policy.clone())
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: the consumer could not start on a queue without dead letters: {e}"));
            conn.publisher::<Order>("", &q).send(&Order { id: 10 }).await.unwrap();
            eventually(Duration::from_secs(10), || handled.lock().unwrap().len() == 1).await;
            consumer.close().await.unwrap();
            check_declared(&conn, &q);
            let stored = stored_arguments(&b, &q);
            if b.version() == Some(RabbitVersion::V4_0) {
                assert_eq!(
                    stored, r#"[{"x-queue-type","classic"}]"#,
                    "{kind:?}: the source queue's arguments changed"
                );
            } else {
                assert!(
                    !stored.contains("x-dead-letter") && !stored.contains("x-queue-type"),
                    "{kind:?}: the source queue's arguments changed: {stored}"
                );
            }
            // Its owner's declaration still holds.
            other_ch
                .queue_declare(plain)
                .await
                .unwrap_or_else(|e| panic!("{kind:?}: redeclaring the plain queue: {e}"));
            other_ch
                .queue_delete(QueueDelete {
                    queue: q.as_str().into(),
                    ..Default::default()
                })
                .await
                .unwrap();
            other.close().await.unwrap();
            cleanup(&conn, &q).await;

            // With Topology on another connection, in either order, no 406.
            let q = unique("order");
            let owner = b.conn_with(Config::default()).await;
            let conn = b.conn_with(Config::default()).await;
            // Consumer first (on a queue Topology declared without rungs), then
            // the whole Topology.
            Topology::new()
                .queue(&q)
                .dead_letters(&q)
                .declare(&owner)
                .await
                .unwrap();
            let consumer = consume(&conn, &q, |_m: Message<Order>| async { Ack::accept() })
                .retry_with(policy.clone())
                .await
                .unwrap();
            consumer.close().await.unwrap();
            Topology::new()
                .queue(&q)
                .dead_letters(&q)
                .retries(&q, &policy)
                .declare(&owner)
                .await
                .unwrap();
            // Topology first, then a consumer: again no refusal.
            let consumer = consume(&conn, &q, |_m: Message<Order>| async { Ack::accept() })
                .retry_with(policy.clone())
                .await
                .unwrap();
            consumer.close().await.unwrap();
            check_declared(&conn, &q);
            conn.close().await.unwrap();
            cleanup(&owner, &q).await;
        });
    })
}

#[test]
fn statement_11_dead_letters_and_dead_letter_to_on_one_queue_is_refused() {
    acemq_tests::deadline_blocking(|| {
        let topology = Topology::new()
            .queue("orders")
            .dead_letters("orders")
            .dead_letter_to("orders", "orders-dead");
        let err = topology.declarations().unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(err.to_string().contains("dead_letters and dead_letter_to"), "{err}");
    })
}

// ---- 12 ----

/// The broker's own dead-lettering of `m` on `kind`: its `x-death` reason
/// and source queue, checked against `x-first-death-*`, routed through
/// acemq.dlx. An acemq set-aside (which writes `x-acemq-error` and no
/// `x-death`) fails here.
fn broker_death(kind: Kind, m: &acemq_core::amqp::GetMessage) -> (String, String) {
    assert!(
        header(m, ERROR_HEADER).is_none(),
        "{kind:?}: an acemq set-aside, not the broker's route: {:?}",
        m.properties
    );
    let deaths = header(m, "x-death")
        .and_then(FieldValue::as_array)
        .unwrap_or_else(|| panic!("{kind:?}: no x-death: {:?}", m.properties));
    let first = deaths.0[0].as_table().expect("an x-death entry is a table");
    let field = |key: &str| -> String {
        first
            .get(key)
            .and_then(FieldValue::as_str)
            .unwrap_or_else(|| panic!("{kind:?}: x-death without {key}: {first:?}"))
            .to_string()
    };
    let (reason, queue) = (field("reason"), field("queue"));
    assert_eq!(
        header(m, "x-first-death-reason").and_then(FieldValue::as_str),
        Some(reason.as_str()),
        "{kind:?}"
    );
    assert_eq!(
        header(m, "x-first-death-queue").and_then(FieldValue::as_str),
        Some(queue.as_str()),
        "{kind:?}"
    );
    assert_eq!(
        m.exchange,
        acemq_core::topology::DLX,
        "{kind:?}: dead-lettered through acemq.dlx"
    );
    (reason, queue)
}

#[test]
fn statement_12_messages_expired_by_the_queue_ttl_dropped_by_max_length_or_rejected_by_another_client_reach_the_dlq_through_the_brokers_route(
) {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            let kind = b.kind;
            let conn = b.conn_with(Config::default()).await;
            let base = unique("broker-route");
            let expiring = format!("{base}.ttl");
            let bounded = format!("{base}.max-length");
            let rejecting = format!("{base}.rejecting");
            let ttl = secs(100, scale);
            let ttl_ms = i32::try_from(ttl.as_millis()).unwrap();
            // acemq's source queues (quorum, dead-lettering to `{queue}.dlq`
            // through acemq.dlx), with limits of the service's own. No acemq
            // consumer runs here: only the broker can move these messages.
            Topology::new()
                .queue_with_arguments(
                    &expiring,
                    [("x-message-ttl", FieldValue::I32(ttl_ms))].into_iter().collect(),
                )
                .dead_letters(&expiring)
                .queue_with_arguments(
                    &bounded,
                    [
                        ("x-max-length", FieldValue::I32(2)),
                        ("x-overflow", FieldValue::from("drop-head")),
                    ]
                    .into_iter()
                    .collect(),
                )
                .dead_letters(&bounded)
                .queue(&rejecting)
                .dead_letters(&rejecting)
                .declare(&conn)
                .await
                .unwrap();
            // Another client: a connection of its own, below the acemq API.
            let other = b.connect().await;
            let ch = other.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let send = |queue: &str, body: &'static str| {
                // No `expiration`: only the queue's own x-message-ttl applies.
                let props = BasicProperties {
                    message_id: Some(body.into()),
                    ..Default::default()
                };
                let (ch, queue) = (&ch, queue.to_string());
                async move {
                    let confirm = ch.publish("", &queue, false, props, body).await.unwrap();
                    let confirmed = tokio::time::timeout(Duration::from_secs(10), confirm)
                        .await
                        .expect("a confirm within 10 s");
                    assert_eq!(confirmed.unwrap(), Confirmation::Ack);
                }
            };

            // Rejected (requeue=false) by the other client.
            send(&rejecting, "rejected").await;
            take_get(&ch, &rejecting).await.reject(false).unwrap();
            let dead = take_eventually(&conn, &format!("{rejecting}.dlq"), Duration::from_secs(10)).await;
            assert_eq!(&dead.body[..], b"rejected", "{kind:?}");
            assert_eq!(
                broker_death(kind, &dead),
                ("rejected".to_string(), rejecting.clone()),
                "{kind:?}"
            );

            // Dropped by x-max-length (drop-head): three into a queue of two.
            for body in ["first", "second", "third"] {
                send(&bounded, body).await;
            }
            let dead = take_eventually(&conn, &format!("{bounded}.dlq"), Duration::from_secs(10)).await;
            assert_eq!(&dead.body[..], b"first", "{kind:?}");
            assert_eq!(
                broker_death(kind, &dead),
                ("maxlen".to_string(), bounded.clone()),
                "{kind:?}"
            );
            assert_eq!(depth(&ch, &bounded).await, 2, "{kind:?}: the two newest stay");

            // Expired by the queue's x-message-ttl: held until then, never delivered.
            send(&expiring, "expired").await;
            assert_eq!(depth(&ch, &expiring).await, 1, "{kind:?}: it waits out the queue's TTL");
            tokio::time::sleep(ttl + ttl / 2).await;
            // Reading the queue makes the broker look at its expired head.
            let got = ch.basic_get(&expiring, true).await.unwrap();
            assert!(
                got.is_none(),
                "{kind:?}: a message past the queue's TTL was delivered: {:?}",
                got.map(|m| m.body)
            );
            let dead = take_eventually(&conn, &format!("{expiring}.dlq"), Duration::from_secs(10)).await;
            assert_eq!(&dead.body[..], b"expired", "{kind:?}");
            assert_eq!(
                broker_death(kind, &dead),
                ("expired".to_string(), expiring.clone()),
                "{kind:?}"
            );
            let deaths = header(&dead, "x-death").and_then(FieldValue::as_array).unwrap();
            assert!(
                deaths.0[0].as_table().unwrap().get("original-expiration").is_none(),
                "{kind:?}: the queue's TTL expired it, not a per-message expiration"
            );

            other.close().await.unwrap();
            cleanup(&conn, &base).await;
        });
    })
}

/// `docs/wire-contract.md` on the wire: the argument tables as the broker stores them.
#[test]
fn the_wire_contract_arguments_are_what_the_broker_stores() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, _scale| async move {
            let conn = b.conn_with(Config::default()).await;
            let q = unique("contract");
            let policy = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::ZERO);
            Topology::new()
                .queue(&q)
                .dead_letters(&q)
                .retries(&q, &policy)
                .declare(&conn)
                .await
                .unwrap();
            let expect_source = format!(
                "x-dead-letter-exchange=acemq.dlx(S) x-dead-letter-routing-key={q}.dlq(S) x-queue-type=quorum(S)"
            );
            let expect_rung =
                format!("x-dead-letter-exchange=(S) x-dead-letter-routing-key={q}(S) x-message-ttl=40000(I)");
            match &b.memory {
                Some(memory) => {
                    let args = |name: &str| describe(&memory.queue_info("/", name).expect(name).arguments);
                    assert_eq!(args(&q), expect_source);
                    assert_eq!(args(&format!("{q}.dlq")), "");
                    assert_eq!(args(&format!("{q}.parked")), "");
                    assert_eq!(args(&format!("{q}.retry.40s")), expect_rung);
                }
                None if b.kind.is_rabbit_tcp() => {
                    let listing = b.rabbitmqctl(&["list_queues", "name", "arguments"]);
                    let line = |name: &str| -> String {
                        listing
                            .lines()
                            .find(|l| l.split('\t').next() == Some(name))
                            .unwrap_or_else(|| panic!("{name} not listed"))
                            .to_string()
                    };
                    let source = line(&q);
                    assert!(source.contains(r#"{"x-queue-type","quorum"}"#), "{source}");
                    assert!(source.contains(r#"{"x-dead-letter-exchange","acemq.dlx"}"#), "{source}");
                    assert!(
                        source.contains(&format!(r#"{{"x-dead-letter-routing-key","{q}.dlq"}}"#)),
                        "{source}"
                    );
                    // The dlq and the rungs are classic queues declared
                    // without x-queue-type: 4.0 stores its default type.
                    let classic = b.version() == Some(RabbitVersion::V4_0);
                    let dlq = line(&format!("{q}.dlq"));
                    if classic {
                        assert!(dlq.ends_with(r#"[{"x-queue-type","classic"}]"#), "{dlq}");
                    } else {
                        assert!(dlq.ends_with("[]"), "{dlq}");
                    }
                    let rung = line(&format!("{q}.retry.40s"));
                    assert!(rung.contains(r#"{"x-message-ttl",40000}"#), "{rung}");
                    // rabbitmqctl prints the empty string as [].
                    assert!(
                        rung.contains(r#"{"x-dead-letter-exchange",[]}"#)
                            || rung.contains(r#"{"x-dead-letter-exchange",""}"#),
                        "{rung}"
                    );
                    assert!(
                        rung.contains(&format!(r#"{{"x-dead-letter-routing-key","{q}"}}"#)),
                        "{rung}"
                    );
                    assert_eq!(rung.contains(r#"{"x-queue-type","classic"}"#), classic, "{rung}");
                    assert_eq!(rung.matches("x-queue-type").count(), usize::from(classic), "{rung}");
                }
                None => {}
            }
            cleanup(&conn, &q).await;
        });
    })
}

/// `key=value(type)` pairs, sorted by key.
fn describe(table: &FieldTable) -> String {
    let mut pairs: Vec<String> = table
        .iter()
        .map(|(k, v)| {
            let value = match v {
                FieldValue::LongString(s) => s.to_string(),
                other => other
                    .as_i64()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| format!("{other:?}")),
            };
            format!("{k}={value}({})", char::from(v.type_code()))
        })
        .collect();
    pairs.sort();
    pairs.join(" ")
}

#[test]
fn a_handler_that_panics_is_retried_and_the_consumer_goes_on() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            let policy = RetryPolicy::fixed(3, secs(1, scale)).with_jitter(0.0);
            let (conn, q) = setup(&b, &policy).await;
            let calls: Calls = Arc::default();
            let seen = calls.clone();
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                let n = record(&seen, &m);
                async move {
                    if n == 1 {
                        panic!("index out of bounds in the handler");
                    }
                    Ack::accept()
                }
            })
            .retry_with(policy)
            .await
            .unwrap();
            conn.publisher::<Order>("", &q).send(&Order { id: 1 }).await.unwrap();
            conn.publisher::<Order>("", &q).send(&Order { id: 2 }).await.unwrap();
            eventually(secs(30, scale) + Duration::from_secs(5), || {
                calls.lock().unwrap().len() == 3
            })
            .await;
            assert!(!consumer.is_finished(), "{:?}: the consumer goes on", b.kind);
            consumer.close().await.unwrap();
            let attempts: Vec<u32> = calls.lock().unwrap().iter().map(|c| c.attempt).collect();
            assert_eq!(
                attempts.iter().filter(|a| **a == 2).count(),
                1,
                "the panicking one came back as attempt 2"
            );
            cleanup(&conn, &q).await;
        });
    })
}

#[test]
fn handled_outcomes_are_counted() {
    acemq_tests::deadline_blocking(|| {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(acemq_tests::deadline(async {
                let b = brokers().await.into_iter().find(|b| b.kind == Kind::Memory).unwrap();
                let policy = RetryPolicy::fixed(2, Duration::from_secs(1)).with_jitter(0.0);
                let (conn, q) = setup(&b, &policy).await;
                let consumer = consume(&conn, &q, |m: Message<Order>| async move {
                    match m.payload.id {
                        1 => Ack::accept(),
                        2 => Ack::retry(Boom("always")),
                        _ => Ack::park("look at it"),
                    }
                })
                .retry_with(policy)
                .await
                .unwrap();
                let publisher = conn.publisher::<Order>("", &q);
                for id in 1..=3 {
                    publisher.send(&Order { id }).await.unwrap();
                }
                let raw = conn.publishing_connection().channel().await.unwrap();
                raw.publish("", &q, false, BasicProperties::default(), "garbage")
                    .await
                    .unwrap();
                take_eventually(&conn, &format!("{q}.parked"), Duration::from_secs(30)).await;
                for _ in 0..2 {
                    take_eventually(&conn, &format!("{q}.dlq"), Duration::from_secs(30)).await;
                }
                consumer.close().await.unwrap();
                cleanup(&conn, &q).await;
            }));
        });
        let counts = acemq_tests::counts_by_outcome(&snapshotter, acemq_core::metrics_names::HANDLED_TOTAL);
        let get = |o: &str| counts.get(o).copied().unwrap_or(0);
        assert_eq!(get("accepted"), 1, "{counts:?}");
        assert_eq!(get("retried"), 1, "{counts:?}");
        assert_eq!(get("dead_lettered"), 1, "{counts:?}");
        assert_eq!(get("parked"), 1, "{counts:?}");
        assert_eq!(get("undecodable"), 1, "{counts:?}");
    })
}

/// Statement 20 (the shutdown half): `close()` lets a running
/// handler finish and ack, and an in-process retry wait cut short is
/// republished with its attempt advanced: nothing lost, nothing run twice.
#[test]
fn statement_20_close_finishes_running_handlers_and_republishes_cut_short_waits() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b, scale| async move {
            let policy = RetryPolicy::fixed(5, secs(20, scale)).with_jitter(0.0);
            let (conn, q) = setup(&b, &policy).await;
            let calls: Calls = Arc::default();
            let seen = calls.clone();
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                record(&seen, &m);
                async move {
                    if m.payload.id == 1 {
                        // Fails: waits 20 s in the consumer before its retry.
                        Ack::retry(Boom("later"))
                    } else {
                        // Slow but successful: still running when close() begins.
                        tokio::time::sleep(secs(2, scale)).await;
                        Ack::accept()
                    }
                }
            })
            .retry_with(policy)
            .drain_timeout(secs(10, scale))
            .await
            .unwrap();
            let publisher = conn.publisher::<Order>("", &q);
            publisher.send(&Order { id: 1 }).await.unwrap();
            publisher.send(&Order { id: 2 }).await.unwrap();
            eventually(Duration::from_secs(10), || calls.lock().unwrap().len() == 2).await;
            let started = Instant::now();
            consumer.close().await.unwrap();
            assert!(
                started.elapsed() < secs(10, scale),
                "{:?}: close did not wait out the retry",
                b.kind
            );
            // The slow handler finished and acked; the waiting message is back in
            // the queue as attempt 2, once.
            let ch = conn.consuming_connection().channel().await.unwrap();
            let back = take_get(&ch, &q).await;
            let envelope = Envelope::read_from(back.properties.as_ref().unwrap());
            assert_eq!(envelope.attempt, 2, "{:?}", b.kind);
            assert_eq!(serde_json::from_slice::<Order>(&back.body).unwrap(), Order { id: 1 });
            back.ack().unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                ch.basic_get(&q, true).await.unwrap().is_none(),
                "order 2 was acked, not returned"
            );
            drop(ch);
            cleanup(&conn, &q).await;
        });
    })
}

/// On a current-thread runtime a delivery's work starts in the consumer's
/// own loop and becomes a task only when it has to wait: handlers that
/// answer at once, that wait, and that panic on their first attempt all
/// settle, and every message is accepted exactly once. Run on a real
/// clock on every broker.
#[test]
fn on_a_current_thread_runtime_handlers_that_answer_at_once_wait_or_panic_all_settle_once() {
    use std::collections::HashMap;
    const MESSAGES: u32 = 300;
    acemq_tests::deadline_blocking(|| {
        let all = tokio::runtime::Runtime::new().unwrap().block_on(brokers());
        for b in all {
            let kind = b.kind;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(acemq_tests::deadline(async {
                let policy = RetryPolicy::fixed(3, Duration::ZERO);
                let (conn, q) = setup(&b, &policy).await;
                let accepted: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
                let seen = accepted.clone();
                let consumer = consume(&conn, &q, move |m: Message<Order>| {
                    let seen = seen.clone();
                    async move {
                        let id = m.payload.id;
                        match id % 3 {
                            0 => {}
                            1 => tokio::time::sleep(Duration::from_millis(20)).await,
                            _ if m.envelope.attempt == 1 => panic!("the first attempt of {id} panics"),
                            _ => {}
                        }
                        *seen.lock().unwrap().entry(id).or_default() += 1;
                        Ack::accept()
                    }
                })
                .prefetch(50)
                .retry_with(policy)
                .await
                .unwrap();
                let publisher = conn.publisher::<Order>("", &q);
                for id in 0..MESSAGES {
                    publisher.send(&Order { id }).await.unwrap();
                }
                eventually(Duration::from_secs(30), || {
                    accepted.lock().unwrap().len() == MESSAGES as usize
                })
                .await;
                consumer.close().await.unwrap();
                let accepted = accepted.lock().unwrap().clone();
                let twice: Vec<_> = accepted.iter().filter(|(_, n)| **n != 1).collect();
                assert!(twice.is_empty(), "{kind:?}: accepted more than once: {twice:?}");
                let ch = conn.consuming_connection().channel().await.unwrap();
                assert_eq!(depth(&ch, &q).await, 0, "{kind:?}");
                cleanup(&conn, &q).await;
            }));
        }
    })
}
