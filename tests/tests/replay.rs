//! Replay on every broker: set-aside messages go back into their source
//! queue (or, with `to_original`, to the exchange and key they were first
//! published to), with the same id, correlation and causation, attempt 1, a
//! fresh first-seen and `x-acemq-replayed`; a dry run moves nothing and
//! lists where each would go, a limit stops where it says, a message that
//! cannot go back stays with the reason, and a producer's own
//! `x-acemq-original-*` headers never choose where a replay publishes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::{BasicProperties, ExchangeDelete, FieldTable, FieldValue};
use acemq_core::envelope::{ERROR_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER, REPLAYED_HEADER};
use acemq_core::{consume, Ack, Conn, Consumer, Message, ReplayOptions, RetryPolicy, Topology};
use acemq_tests::{brokers, deadline, depth, unique, Broker};
use tokio::time::Instant;

#[derive(Debug)]
struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("payment declined")
    }
}

impl std::error::Error for Declined {}

/// What the consumer does while `failing`.
#[derive(Clone, Copy)]
enum Failure {
    /// Retries until the attempts are gone, then the dlq.
    Retry,
    /// Parks it.
    Park,
}

/// A service: queue `q` with dead letters, bound to topic exchange `x` under
/// `order.placed`; a consumer that fails as `failure` while `failing`,
/// accepts (and records) otherwise. Another service's queue `other` is
/// bound to `x` with the same key (nobody consumes it).
struct Service {
    conn: Conn,
    q: String,
    x: String,
    other: String,
    failing: Arc<AtomicBool>,
    handled: Arc<Mutex<Vec<Message<u32>>>>,
    consumer: Consumer,
}

async fn service(b: &Broker, failure: Failure) -> Service {
    let conn = b.conn().await;
    let q = unique("replay");
    let x = unique("replay.x");
    let other = unique("replay.other");
    Topology::new()
        .queue(&q)
        .dead_letters(&q)
        .queue(&other)
        .exchange(&x, "topic")
        .bind(&q, &x, "order.placed")
        .bind(&other, &x, "order.placed")
        .declare(&conn)
        .await
        .unwrap();
    let failing = Arc::new(AtomicBool::new(true));
    let handled: Arc<Mutex<Vec<Message<u32>>>> = Arc::default();
    let handler = {
        let (failing, handled) = (failing.clone(), handled.clone());
        move |m: Message<u32>| {
            let ack = match (failing.load(Ordering::SeqCst), failure) {
                (true, Failure::Retry) => Ack::retry(Declined),
                (true, Failure::Park) => Ack::park("needs a person"),
                (false, _) => {
                    handled.lock().unwrap().push(m);
                    Ack::accept()
                }
            };
            std::future::ready(ack)
        }
    };
    let consumer = consume(&conn, &q, handler)
        .retry_with(RetryPolicy::fixed(2, Duration::ZERO))
        .await
        .unwrap();
    Service {
        conn,
        q,
        x,
        other,
        failing,
        handled,
        consumer,
    }
}

impl Service {
    async fn wait_depth(&self, queue: &str, n: u32) {
        let ch = self.conn.consuming_connection().channel().await.unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let now = depth(&ch, queue).await;
            if now == n {
                return;
            }
            assert!(Instant::now() < until, "{queue} holds {now}, not {n}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn depth(&self, queue: &str) -> u32 {
        let ch = self.conn.consuming_connection().channel().await.unwrap();
        depth(&ch, queue).await
    }

    async fn wait_handled(&self, n: usize) -> Vec<Message<u32>> {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let handled = self.handled.lock().unwrap().clone();
            if handled.len() >= n {
                return handled;
            }
            assert!(Instant::now() < until, "handled {} of {n}", handled.len());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn send(&self, payloads: impl IntoIterator<Item = u32>) -> Vec<String> {
        let publisher = self.conn.publisher::<u32>(&self.x, "order.placed").mandatory();
        let mut ids = Vec::new();
        for n in payloads {
            let mut envelope = acemq_core::Envelope::new()
                .with_correlation_id(format!("corr-{n}"))
                .with_causation_id(format!("cause-{n}"));
            // First seen an hour ago: a replay gives it a fresh one.
            envelope.first_seen -= Duration::from_secs(3600);
            ids.push(envelope.id.clone());
            publisher.send_envelope(envelope, &n).await.unwrap();
        }
        ids
    }

    async fn close(self) {
        self.consumer.close().await.unwrap();
        self.conn.close().await.unwrap();
    }
}

fn header<'a>(m: &'a Message<u32>, key: &str) -> Option<&'a FieldValue> {
    m.envelope.headers.get(key)
}

/// Replays the one message set aside in `suffix` (into the source queue,
/// or `to_original`) and checks the copy the service handles.
async fn replays_one(b: &Broker, failure: Failure, suffix: &str, to_original: bool) {
    let s = service(b, failure).await;
    let ids = s.send([7]).await;
    let set_aside = format!("{}.{suffix}", s.q);
    s.wait_depth(&set_aside, 1).await;
    s.failing.store(false, Ordering::SeqCst);

    let options = ReplayOptions {
        to_original,
        ..Default::default()
    };
    let report = s.conn.replay(&set_aside, options).await.unwrap();
    assert_eq!((report.examined, report.replayed), (1, 1), "{:?}: {report:?}", b.kind);
    assert!(report.kept.is_empty(), "{:?}: {report:?}", b.kind);
    let handled = s.wait_handled(1).await;
    let m = &handled[0];
    assert_eq!(m.payload, 7);
    assert_eq!(m.envelope.id, ids[0], "{:?}: the same message-id", b.kind);
    assert_eq!(m.envelope.correlation_id.as_deref(), Some("corr-7"), "{:?}", b.kind);
    assert_eq!(m.envelope.causation_id.as_deref(), Some("cause-7"), "{:?}", b.kind);
    assert_eq!(m.envelope.attempt, 1, "{:?}: attempt 1 again", b.kind);
    let age = std::time::SystemTime::now()
        .duration_since(m.envelope.first_seen)
        .unwrap_or_default();
    assert!(
        age < Duration::from_secs(60),
        "{:?}: a fresh first-seen ({age:?} old)",
        b.kind
    );
    if to_original {
        assert_eq!(m.exchange, s.x, "{:?}: back to its exchange", b.kind);
        assert_eq!(m.routing_key, "order.placed", "{:?}: under its key", b.kind);
    } else {
        assert_eq!(
            m.exchange, "",
            "{:?}: into the queue, through the default exchange",
            b.kind
        );
        assert_eq!(m.routing_key, s.q, "{:?}", b.kind);
    }
    let destination = (
        report.destinations[0].exchange.as_str(),
        report.destinations[0].routing_key.as_str(),
    );
    assert_eq!(
        destination,
        (m.exchange.as_str(), m.routing_key.as_str()),
        "{:?}",
        b.kind
    );
    assert_eq!(header(m, REPLAYED_HEADER), Some(&FieldValue::I32(1)), "{:?}", b.kind);
    assert_eq!(header(m, ERROR_HEADER), None, "{:?}: the error is removed", b.kind);
    assert_eq!(s.depth(&set_aside).await, 0, "{:?}: acked after the confirm", b.kind);
    // The other service bound to the same exchange and key had the first
    // publish; only a replay to the original exchange gives it a second.
    let other = if to_original { 2 } else { 1 };
    s.wait_depth(&s.other, other).await;
    s.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_is_replayed_into_its_source_queue_alone_and_handled_with_a_fresh_envelope() {
    deadline(async {
        for b in brokers().await {
            replays_one(&b, Failure::Retry, "dlq", false).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parked_message_is_replayed_into_its_source_queue_the_same_way() {
    deadline(async {
        for b in brokers().await {
            replays_one(&b, Failure::Park, "parked", false).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn to_original_replays_to_the_exchange_and_key_it_was_first_published_with_and_every_bound_queue_gets_it() {
    deadline(async {
        for b in brokers().await {
            replays_one(&b, Failure::Retry, "dlq", true).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_original_exchange_never_chooses_where_a_replay_publishes() {
    deadline(async {
        for b in brokers().await {
            let s = service(&b, Failure::Retry).await;
            let dlq = format!("{}.dlq", s.q);
            // Another client publishes with its own x-acemq-original-*
            // headers: once through the service's exchange, once straight
            // into the queue.
            let trap = unique("replay.trap");
            Topology::new()
                .queue(&trap)
                .exchange(&format!("{trap}.x"), "fanout")
                .bind(&trap, &format!("{trap}.x"), "")
                .declare(&s.conn)
                .await
                .unwrap();
            let ch = s.conn.publishing_connection().channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            for (n, (exchange, key)) in [(1u32, (s.x.as_str(), "order.placed")), (2, ("", s.q.as_str()))] {
                let mut headers = FieldTable::new();
                headers.insert(ORIGINAL_EXCHANGE_HEADER, FieldValue::from(format!("{trap}.x")));
                headers.insert(ORIGINAL_ROUTING_KEY_HEADER, FieldValue::from("anything"));
                let props = BasicProperties {
                    message_id: Some(format!("forged-{n}").as_str().into()),
                    headers: Some(headers),
                    ..Default::default()
                };
                ch.publish(exchange, key, true, props, n.to_string())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
            s.wait_depth(&dlq, 2).await;
            // The set-aside copies record where the messages really came through.
            let mut listed = s.conn.peek(&dlq, 2).await.unwrap();
            listed.sort_by(|a, b| a.envelope.id.cmp(&b.envelope.id));
            let origins: Vec<(Option<&str>, Option<&str>)> = listed
                .iter()
                .map(|m| (m.original_exchange.as_deref(), m.original_routing_key.as_deref()))
                .collect();
            assert_eq!(
                origins,
                [
                    (Some(s.x.as_str()), Some("order.placed")),
                    (Some(""), Some(s.q.as_str()))
                ],
                "{:?}",
                b.kind
            );
            // A replay puts them back into the source queue; the trap gets nothing.
            s.failing.store(false, Ordering::SeqCst);
            let report = s.conn.replay(&dlq, ReplayOptions::default()).await.unwrap();
            assert_eq!(report.replayed, 2, "{:?}: {report:?}", b.kind);
            let handled = s.wait_handled(2).await;
            assert!(
                handled.iter().all(|m| m.exchange.is_empty() && m.routing_key == s.q),
                "{:?}",
                b.kind
            );
            assert_eq!(
                s.depth(&trap).await,
                0,
                "{:?}: nothing went where the producer said",
                b.kind
            );
            s.close().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_moves_nothing_and_lists_each_destination_and_a_listing_keeps_the_order() {
    deadline(async {
        for b in brokers().await {
            let s = service(&b, Failure::Retry).await;
            let ids = s.send([1, 2, 3]).await;
            let dlq = format!("{}.dlq", s.q);
            s.wait_depth(&dlq, 3).await;
            let options = ReplayOptions {
                dry_run: true,
                ..Default::default()
            };
            let report = s.conn.replay(&dlq, options).await.unwrap();
            assert_eq!((report.examined, report.replayed), (3, 3), "{:?}: {report:?}", b.kind);
            assert_eq!(s.depth(&dlq).await, 3, "{:?}: nothing moved", b.kind);
            let into = |report: &acemq_core::ReplayReport| {
                let mut to: Vec<(String, String, String)> = report
                    .destinations
                    .iter()
                    .map(|d| (d.message_id.clone(), d.exchange.clone(), d.routing_key.clone()))
                    .collect();
                to.sort();
                to
            };
            let mut sorted_ids = ids.clone();
            sorted_ids.sort();
            let want = |exchange: &str, key: &str| -> Vec<(String, String, String)> {
                sorted_ids
                    .iter()
                    .map(|id| (id.clone(), exchange.to_string(), key.to_string()))
                    .collect()
            };
            assert_eq!(
                into(&report),
                want("", &s.q),
                "{:?}: each into its source queue",
                b.kind
            );
            let options = ReplayOptions {
                dry_run: true,
                to_original: true,
                ..Default::default()
            };
            let report = s.conn.replay(&dlq, options).await.unwrap();
            assert_eq!(into(&report), want(&s.x, "order.placed"), "{:?}", b.kind);
            assert_eq!(s.depth(&dlq).await, 3, "{:?}: nothing moved", b.kind);
            // A listing reads them without taking them, in the queue's
            // order (the order the handlers gave up on them), every time.
            let first: Vec<String> = s
                .conn
                .peek(&dlq, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|m| m.envelope.id)
                .collect();
            let mut sorted = first.clone();
            sorted.sort();
            let mut sent = ids.clone();
            sent.sort();
            assert_eq!(sorted, sent, "{:?}", b.kind);
            for _ in 0..2 {
                let listed = s.conn.peek(&dlq, 10).await.unwrap();
                let listed_ids: Vec<String> = listed.iter().map(|m| m.envelope.id.clone()).collect();
                assert_eq!(listed_ids, first, "{:?}: the same order", b.kind);
                assert!(listed
                    .iter()
                    .all(|m| m.error.as_deref().is_some_and(|e| e.contains("declined"))));
                assert!(listed
                    .iter()
                    .all(|m| m.original_exchange.as_deref() == Some(s.x.as_str())));
                assert_eq!(s.depth(&dlq).await, 3, "{:?}: a listing takes nothing", b.kind);
            }
            assert!(s.handled.lock().unwrap().is_empty(), "{:?}", b.kind);
            s.close().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_limit_stops_where_it_says() {
    deadline(async {
        for b in brokers().await {
            let s = service(&b, Failure::Retry).await;
            s.send(0..5).await;
            let dlq = format!("{}.dlq", s.q);
            s.wait_depth(&dlq, 5).await;
            s.failing.store(false, Ordering::SeqCst);
            let queued: Vec<String> = s
                .conn
                .peek(&dlq, 5)
                .await
                .unwrap()
                .into_iter()
                .map(|m| m.envelope.id)
                .collect();
            let options = ReplayOptions {
                limit: Some(2),
                ..Default::default()
            };
            let report = s.conn.replay(&dlq, options).await.unwrap();
            assert_eq!((report.examined, report.replayed), (2, 2), "{:?}: {report:?}", b.kind);
            let handled = s.wait_handled(2).await;
            let mut replayed: Vec<String> = handled.iter().map(|m| m.envelope.id.clone()).collect();
            replayed.sort();
            let mut oldest = queued[..2].to_vec();
            oldest.sort();
            assert_eq!(replayed, oldest, "{:?}: the two at the head of the queue", b.kind);
            let left: Vec<String> = s
                .conn
                .peek(&dlq, 5)
                .await
                .unwrap()
                .into_iter()
                .map(|m| m.envelope.id)
                .collect();
            assert_eq!(left, queued[2..], "{:?}: the rest, in order", b.kind);
            assert_eq!(s.depth(&dlq).await, 3, "{:?}", b.kind);
            s.close().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_whose_original_exchange_is_gone_stays_with_the_reason() {
    deadline(async {
        for b in brokers().await {
            let s = service(&b, Failure::Retry).await;
            let ids = s.send([9]).await;
            let dlq = format!("{}.dlq", s.q);
            s.wait_depth(&dlq, 1).await;
            let ch = s.conn.consuming_connection().channel().await.unwrap();
            ch.exchange_delete(ExchangeDelete {
                exchange: s.x.as_str().into(),
                ..Default::default()
            })
            .await
            .unwrap();
            let to_original = ReplayOptions {
                to_original: true,
                ..Default::default()
            };
            let report = s.conn.replay(&dlq, to_original).await.unwrap();
            assert_eq!(report.replayed, 0, "{:?}: {report:?}", b.kind);
            assert_eq!(report.kept.len(), 1, "{:?}: {report:?}", b.kind);
            assert_eq!(report.kept[0].message_id, ids[0]);
            assert!(
                report.kept[0].reason.contains("no longer exists"),
                "{:?}: {}",
                b.kind,
                report.kept[0].reason
            );
            assert_eq!(s.depth(&dlq).await, 1, "{:?}: it stayed", b.kind);
            s.close().await;
        }
    })
    .await;
}

/// The replay rate (printed, not asserted: speed is measured, never
/// asserted in a test) of 10,000 dead letters, on each broker.
#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_dead_letters_are_replayed_and_none_is_lost() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("replay-many");
            Topology::new().queue(&q).dead_letters(&q).declare(&conn).await.unwrap();
            let dlq = format!("{q}.dlq");
            // Set aside as the consumer would: the original destination in
            // the headers.
            let ch = conn.publishing_connection().channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let mut confirms = Vec::new();
            for n in 0..10_000u32 {
                let mut headers = FieldTable::new();
                headers.insert(ORIGINAL_EXCHANGE_HEADER, FieldValue::from(""));
                headers.insert(ORIGINAL_ROUTING_KEY_HEADER, FieldValue::from(q.as_str()));
                headers.insert(ERROR_HEADER, FieldValue::from("set aside by the test"));
                let props = BasicProperties {
                    message_id: Some(format!("m-{n}").as_str().into()),
                    delivery_mode: Some(2),
                    headers: Some(headers),
                    ..Default::default()
                };
                confirms.push(ch.publish("", &dlq, true, props, n.to_string()).await.unwrap());
            }
            for confirm in confirms {
                confirm.await.unwrap();
            }
            let started = Instant::now();
            let report = conn.replay(&dlq, ReplayOptions::default()).await.unwrap();
            let took = started.elapsed();
            println!(
                "{:?}: replayed {} of 10,000 dead letters in {took:?}: {:.0} msg/s",
                b.kind,
                report.replayed,
                report.replayed as f64 / took.as_secs_f64()
            );
            assert_eq!(
                report.replayed,
                10_000,
                "{:?}: {:?}",
                b.kind,
                &report.kept[..report.kept.len().min(3)]
            );
            let check = conn.consuming_connection().channel().await.unwrap();
            assert_eq!(depth(&check, &dlq).await, 0, "{:?}", b.kind);
            assert_eq!(depth(&check, &q).await, 10_000, "{:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_filter_on_the_envelope_moves_only_what_it_selects() {
    deadline(async {
        for b in brokers().await {
            let s = service(&b, Failure::Retry).await;
            s.send([1, 2, 3]).await;
            let dlq = format!("{}.dlq", s.q);
            s.wait_depth(&dlq, 3).await;
            s.failing.store(false, Ordering::SeqCst);
            let options = ReplayOptions {
                filter: Some(Arc::new(|m: &acemq_core::SetAside| {
                    m.envelope.correlation_id.as_deref() == Some("corr-2")
                })),
                ..Default::default()
            };
            let report = s.conn.replay(&dlq, options).await.unwrap();
            assert_eq!((report.examined, report.replayed), (3, 1), "{:?}: {report:?}", b.kind);
            assert!(report.kept.iter().all(|k| k.reason.contains("filter")), "{report:?}");
            let handled = s.wait_handled(1).await;
            assert_eq!(handled[0].payload, 2, "{:?}", b.kind);
            assert_eq!(s.depth(&dlq).await, 2, "{:?}: the others stayed", b.kind);
            s.close().await;
        }
    })
    .await;
}
