//! Request and reply over direct reply-to (statements 35 to 43 of
//! `docs/statements.md`): first the broker's side with the raw `amqp` API
//! (acemq-memory imitating 3.10 and 4.0, and both RabbitMQ nodes, must
//! agree), then `Requester` and `Ack::reply` on every broker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::{BasicCancel, BasicConsume, BasicProperties, FieldValue, QueueDeclare, ShortString};
use acemq_core::amqp::{self, Channel, Config, Confirmation, Connection};
use acemq_core::envelope::ERROR_HEADER;
use acemq_core::{consume, Ack, Conn, Error, Message, RetryPolicy, Topology};
use acemq_tests::{brokers, deadline, depth, exclusive_queue, unique, Broker};
use bytes::Bytes;
use tokio::time::Instant;

const REPLY_TO: &str = "amq.rabbitmq.reply-to";
const PREFIX: &str = "amq.rabbitmq.reply-to.";

/// Where a raw scenario runs: every broker of the suite, and acemq-memory
/// imitating RabbitMQ 4.0 besides (the suite's acemq-memory imitates 3.10).
async fn every_broker() -> Vec<(String, String, Config)> {
    let mut all: Vec<(String, String, Config)> = brokers()
        .await
        .into_iter()
        .map(|b| (format!("{:?}", b.kind), b.url.clone(), b.config()))
        .collect();
    let name = unique("memory-4");
    let memory4 = acemq_memory::Broker::named_with(&name, || {
        acemq_memory::BrokerConfig::for_version(acemq_memory::RabbitMqVersion::V4_0)
    });
    std::mem::forget(memory4);
    all.push(("Memory (4.0)".into(), format!("memory://{name}/"), Config::default()));
    all
}

/// A channel in confirm mode consuming `amq.rabbitmq.reply-to`, and the
/// name the broker gives its replies (read back from a publish of its own).
async fn reply_channel(conn: &Connection) -> (Channel, amqp::Consumer, String) {
    let ch = conn.channel().await.unwrap();
    ch.confirm_select().await.unwrap();
    let consumer = ch
        .basic_consume(BasicConsume {
            queue: REPLY_TO.into(),
            no_ack: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let q = exclusive_queue(&ch).await;
    let props = BasicProperties {
        reply_to: Some(REPLY_TO.into()),
        ..Default::default()
    };
    let confirm = ch.publish("", &q, true, props, &b"request"[..]).await.unwrap();
    assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
    let got = ch.basic_get(&q, true).await.unwrap().expect("the request");
    let name = got.properties.as_ref().unwrap().reply_to.as_ref().unwrap().to_string();
    (ch, consumer, name)
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn unbase64(s: &str) -> Vec<u8> {
    let (mut out, mut buf, mut bits) = (Vec::new(), 0u32, 0);
    for c in s.bytes().take_while(|&c| c != b'=') {
        buf = (buf << 6) | BASE64.iter().position(|&a| a == c).expect("base64") as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    out
}

fn base64(d: &[u8]) -> String {
    let mut s = String::new();
    for ch in d.chunks(3) {
        let b = [ch[0], *ch.get(1).unwrap_or(&0), *ch.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            s.push(if i <= ch.len() {
                BASE64[((n >> (18 - 6 * i)) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    s
}

/// `name` with the last digit of the node hash in its process id changed:
/// well formed, but of a node the broker does not know.
fn other_node(name: &str) -> String {
    let (pid, key) = name[PREFIX.len()..].split_once('.').expect("two parts");
    let mut raw = unbase64(pid);
    let last = 5 + usize::from(u16::from_be_bytes([raw[3], raw[4]])) - 1;
    raw[last] = if raw[last] == b'1' { b'2' } else { b'1' };
    format!("{PREFIX}{}.{key}", base64(&raw))
}

/// `name` with the first character of its process id changed: two parts
/// that do not decode.
fn mangled(name: &str) -> String {
    let suffix = &name[PREFIX.len()..];
    let changed = if suffix.starts_with('A') { 'B' } else { 'A' };
    format!("{PREFIX}{changed}{}", &suffix[1..])
}

fn with_correlation(id: &str) -> BasicProperties {
    BasicProperties {
        correlation_id: Some(id.into()),
        ..Default::default()
    }
}

async fn next_within(consumer: &mut amqp::Consumer, within: Duration) -> Option<amqp::Delivery> {
    tokio::time::timeout(within, consumer.next()).await.ok().flatten()
}

fn refusal_code(err: &amqp::Error) -> Option<(u16, String)> {
    match err {
        amqp::Error::ChannelClosed(r) => Some((r.code, r.text.clone())),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_35_the_reply_pseudo_queue_is_consumed_only_without_acks_and_once_per_channel() {
    deadline(async {
        for (kind, url, config) in every_broker().await {
            let conn = Connection::open(&url, config).await.unwrap();
            let ch = conn.channel().await.unwrap();
            let err = ch
                .basic_consume(BasicConsume {
                    queue: REPLY_TO.into(),
                    no_ack: false,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(
                refusal_code(&err),
                Some((406, "PRECONDITION_FAILED - reply consumer cannot acknowledge".into())),
                "{kind}"
            );
            let ch = conn.channel().await.unwrap();
            let first = ch
                .basic_consume(BasicConsume {
                    queue: REPLY_TO.into(),
                    no_ack: true,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert!(
                first.tag().as_bytes().starts_with(b"amq.ctag"),
                "{kind}: {}",
                first.tag()
            );
            let err = ch
                .basic_consume(BasicConsume {
                    queue: REPLY_TO.into(),
                    no_ack: true,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(
                refusal_code(&err),
                Some((406, "PRECONDITION_FAILED - reply consumer already set".into())),
                "{kind}"
            );
            // Another channel has a reply consumer of its own.
            let (_other, _c, name) = reply_channel(&conn).await;
            assert!(name.starts_with(PREFIX), "{kind}: {name}");
            // The reply consumer's tag is not a queue consumer's: a queue
            // consumer may take it, and then a reply consumer may not.
            let ch = conn.channel().await.unwrap();
            ch.basic_consume(BasicConsume {
                queue: REPLY_TO.into(),
                consumer_tag: "shared-tag".into(),
                no_ack: true,
                ..Default::default()
            })
            .await
            .unwrap();
            let q = exclusive_queue(&ch).await;
            ch.basic_consume(BasicConsume {
                queue: q.as_str().into(),
                consumer_tag: "shared-tag".into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
            let ch = conn.channel().await.unwrap();
            let q = exclusive_queue(&ch).await;
            ch.basic_consume(BasicConsume {
                queue: q.as_str().into(),
                consumer_tag: "queue-tag".into(),
                ..Default::default()
            })
            .await
            .unwrap();
            let err = ch
                .basic_consume(BasicConsume {
                    queue: REPLY_TO.into(),
                    consumer_tag: "queue-tag".into(),
                    no_ack: true,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(err.reply_code(), Some(530), "{kind}: {err}");
            assert!(conn.is_closed() || conn.channel().await.is_err(), "{kind}");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_36_reply_to_the_pseudo_queue_needs_a_reply_consumer_on_the_channel_and_becomes_an_opaque_name() {
    deadline(async {
        for (kind, url, config) in every_broker().await {
            let conn = Connection::open(&url, config).await.unwrap();
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            let props = BasicProperties {
                reply_to: Some(REPLY_TO.into()),
                ..Default::default()
            };
            let confirm = ch.publish("", &q, false, props.clone(), &b"x"[..]).await.unwrap();
            let err = confirm.await.unwrap_err();
            assert_eq!(
                refusal_code(&err),
                Some((406, "PRECONDITION_FAILED - fast reply consumer does not exist".into())),
                "{kind}"
            );
            // On the channel that consumes it, the name is rewritten; two
            // channels get two names; other reply-to values pass untouched.
            let (ch1, _c1, name1) = reply_channel(&conn).await;
            let (_ch2, _c2, name2) = reply_channel(&conn).await;
            assert!(
                name1.len() > PREFIX.len() && name1.starts_with(PREFIX),
                "{kind}: {name1}"
            );
            assert_ne!(name1, name2, "{kind}");
            let q = exclusive_queue(&ch1).await;
            for untouched in [
                "replies",
                "amq.rabbitmq.reply-to.someone-else",
                "amq.rabbitmq.reply-tox",
            ] {
                let props = BasicProperties {
                    reply_to: Some(untouched.into()),
                    ..Default::default()
                };
                ch1.publish("", &q, false, props, &b"x"[..])
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                let got = ch1.basic_get(&q, true).await.unwrap().unwrap();
                let reply_to = got.properties.as_ref().unwrap().reply_to.clone();
                assert_eq!(reply_to, Some(ShortString::from(untouched)), "{kind}");
            }
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_37_a_reply_goes_to_the_reply_consumer_of_the_channel_its_name_stands_for() {
    deadline(async {
        for (kind, url, config) in every_broker().await {
            let requester = Connection::open(&url, config.clone()).await.unwrap();
            let replier = Connection::open(&url, config).await.unwrap();
            let (_ch, mut replies, name) = reply_channel(&requester).await;
            let (_bystander_ch, mut bystander, _) = reply_channel(&requester).await;
            let out = replier.channel().await.unwrap();
            out.confirm_select().await.unwrap();
            for n in 0..2 {
                let props = BasicProperties {
                    headers: Some([("n", FieldValue::I32(n))].into_iter().collect()),
                    ..with_correlation(&format!("c{n}"))
                };
                let confirm = out.publish("", &name, false, props, &b"pong"[..]).await.unwrap();
                assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{kind}");
            }
            let mut tags = Vec::new();
            for n in 0..2 {
                let d = next_within(&mut replies, Duration::from_secs(5))
                    .await
                    .unwrap_or_else(|| panic!("{kind}: reply {n}"));
                assert_eq!(d.exchange.as_bytes(), b"", "{kind}");
                assert_eq!(d.routing_key.to_string(), name, "{kind}");
                assert!(!d.redelivered, "{kind}");
                let props = d.properties.as_ref().unwrap();
                assert_eq!(props.correlation_id, Some(ShortString::from(format!("c{n}"))), "{kind}");
                assert_eq!(&d.body[..], b"pong", "{kind}");
                tags.push(d.delivery_tag);
            }
            // A reply takes the channel's next delivery tag without using it up.
            assert_eq!(tags[0], tags[1], "{kind}");
            assert!(
                next_within(&mut bystander, Duration::from_millis(200)).await.is_none(),
                "{kind}: the other channel got a reply"
            );
            // Through any exchange but the default one, the name is a plain
            // routing key: no queue, so nothing is delivered.
            let confirm = out
                .publish("amq.direct", &name, true, with_correlation("x"), &b"lost"[..])
                .await
                .unwrap();
            assert!(matches!(confirm.await.unwrap(), Confirmation::Returned(_)), "{kind}");
            assert!(
                next_within(&mut replies, Duration::from_millis(200)).await.is_none(),
                "{kind}"
            );
            requester.close().await.unwrap();
            replier.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_38_a_mandatory_reply_is_returned_even_when_delivered_and_a_reply_to_no_channel_is_dropped() {
    deadline(async {
        for (kind, url, config) in every_broker().await {
            let requester = Connection::open(&url, config.clone()).await.unwrap();
            let replier = Connection::open(&url, config).await.unwrap();
            let (ch, mut replies, name) = reply_channel(&requester).await;
            let out = replier.channel().await.unwrap();
            out.confirm_select().await.unwrap();
            // Delivered, and returned as unroutable all the same.
            let confirm = out
                .publish("", &name, true, with_correlation("m"), &b"mandatory"[..])
                .await
                .unwrap();
            match confirm.await.unwrap() {
                Confirmation::Returned(ret) => assert_eq!(ret.reply_code, 312, "{kind}"),
                other => panic!("{kind}: {other:?}"),
            }
            let d = next_within(&mut replies, Duration::from_secs(5)).await;
            assert_eq!(d.map(|d| d.body), Some(Bytes::from_static(b"mandatory")), "{kind}");
            // Cancelled: replies are dropped from then on.
            ch.basic_cancel(BasicCancel {
                consumer_tag: replies.tag().clone(),
                no_wait: false,
            })
            .await
            .unwrap();
            let dropped = out
                .publish("", &name, false, with_correlation("c"), &b"x"[..])
                .await
                .unwrap();
            assert_eq!(dropped.await.unwrap(), Confirmation::Ack, "{kind}");
            // Its channel gone, a forged name, a name of garbage: dropped
            // (acked, or returned when mandatory), and the replier's channel
            // stays open.
            ch.close().await.unwrap();
            let (other_key, pid_part) = (format!("{name}x"), name.split_once("==.").unwrap().0.to_string() + "==");
            let no_key = format!("{pid_part}.AAAAAAAAAAAAAAAAAAAAAA==");
            for target in [
                name.as_str(),
                other_key.as_str(),
                no_key.as_str(),
                "amq.rabbitmq.reply-to.",
                "amq.rabbitmq.reply-to.abc",
                "amq.rabbitmq.reply-to.a.b.c",
            ] {
                let confirm = out
                    .publish("", target, false, with_correlation("g"), &b"x"[..])
                    .await
                    .unwrap();
                assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{kind}: {target}");
                let confirm = out
                    .publish("", target, true, with_correlation("g"), &b"x"[..])
                    .await
                    .unwrap();
                assert!(
                    matches!(confirm.await.unwrap(), Confirmation::Returned(_)),
                    "{kind}: {target}"
                );
            }
            assert!(out.is_open(), "{kind}");
            assert!(
                next_within(&mut replies, Duration::from_millis(200)).await.is_none(),
                "{kind}"
            );
            requester.close().await.unwrap();
            replier.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_38_a_reply_name_of_two_parts_that_does_not_decode_closes_the_connection_with_541() {
    deadline(async {
        for (kind, url, config) in every_broker().await {
            let v4 = kind.contains("4");
            let requester = Connection::open(&url, config.clone()).await.unwrap();
            let (_ch, _replies, name) = reply_channel(&requester).await;
            let (mangled, other_node) = (mangled(&name), other_node(&name));
            let mut cases = vec![
                ("amq.rabbitmq.reply-to.x.y", true),
                ("amq.rabbitmq.reply-to.AAAA.AAAA", true),
                ("amq.rabbitmq.reply-to.g2QAA2Zvbw==.AAAA", true),
                (mangled.as_str(), true),
                // A node the broker does not know: 3.10 crashes, 4.0 drops it.
                (other_node.as_str(), !v4),
            ];
            cases.push((name.as_str(), false));
            for (target, crashes) in cases {
                for declare in [false, true] {
                    let conn = Connection::open(&url, config.clone()).await.unwrap();
                    let ch = conn.channel().await.unwrap();
                    ch.confirm_select().await.unwrap();
                    let result = if declare {
                        ch.queue_declare(QueueDeclare {
                            queue: target.into(),
                            passive: true,
                            ..Default::default()
                        })
                        .await
                        .map(|_| ())
                    } else {
                        match ch.publish("", target, false, with_correlation("h"), &b"x"[..]).await {
                            Ok(confirm) => confirm.await.map(|_| ()),
                            Err(e) => Err(e),
                        }
                    };
                    // 4.0 asks for a process an atom names, and finds none: 404.
                    let crashes = crashes && !(v4 && declare && target.contains("g2QAA2Zvbw=="));
                    if crashes {
                        assert_eq!(
                            result.as_ref().err().and_then(amqp::Error::reply_code),
                            Some(541),
                            "{kind}: {target} (declare: {declare}): {result:?}"
                        );
                        assert!(conn.is_closed() || conn.channel().await.is_err(), "{kind}");
                    } else {
                        let expected = if declare && target != name.as_str() {
                            Some(404)
                        } else {
                            None
                        };
                        assert_eq!(
                            result.as_ref().err().and_then(amqp::Error::reply_code),
                            expected,
                            "{kind}: {target} (declare: {declare}): {result:?}"
                        );
                        conn.close().await.unwrap();
                    }
                }
            }
            requester.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_39_declaring_a_reply_name_is_passive_and_finds_only_a_live_reply_consumer() {
    deadline(async {
        for (kind, url, config) in every_broker().await {
            let conn = Connection::open(&url, config).await.unwrap();
            let (ch, _replies, name) = reply_channel(&conn).await;
            let other = conn.channel().await.unwrap();
            for (queue, passive) in [
                (REPLY_TO, true),
                (REPLY_TO, false),
                (name.as_str(), true),
                (name.as_str(), false),
            ] {
                let ok = other
                    .queue_declare(QueueDeclare {
                        queue: queue.into(),
                        passive,
                        durable: !passive,
                        ..Default::default()
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{kind}: {queue}: {e}"))
                    .expect("declare-ok");
                assert_eq!(ok.queue.to_string(), queue, "{kind}");
                assert_eq!((ok.message_count, ok.consumer_count), (0, 1), "{kind}: {queue}");
            }
            ch.close().await.unwrap();
            let forged = format!("{name}x");
            for queue in [
                name.as_str(),
                forged.as_str(),
                "amq.rabbitmq.reply-to.",
                "amq.rabbitmq.reply-tox",
            ] {
                let ch = conn.channel().await.unwrap();
                let err = ch
                    .queue_declare(QueueDeclare {
                        queue: queue.into(),
                        passive: false,
                        ..Default::default()
                    })
                    .await
                    .unwrap_err();
                assert_eq!(
                    refusal_code(&err),
                    Some((404, format!("NOT_FOUND - no queue '{queue}' in vhost '/'"))),
                    "{kind}"
                );
            }
            conn.close().await.unwrap();
        }
    })
    .await
}

// ---- Requester and Ack::reply ------------------------------------------

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Quote {
    n: u32,
    doubled: u64,
}

/// A queue with its dead letters, and a handler that doubles.
async fn doubler(conn: &Conn, queue: &str) -> acemq_core::Consumer {
    Topology::new()
        .queue(queue)
        .dead_letters(queue)
        .declare(conn)
        .await
        .unwrap();
    consume(conn, queue, |m: Message<u32>| async move {
        Ack::reply(&Quote {
            n: m.payload,
            doubled: u64::from(m.payload) * 2,
        })
    })
    .await
    .unwrap()
}

async fn take(conn: &Conn, queue: &str, within: Duration) -> Option<amqp::GetMessage> {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let until = Instant::now() + within;
    loop {
        if let Some(m) = ch.basic_get(queue, true).await.unwrap() {
            return Some(m);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_40_a_request_gets_the_reply_its_handler_gives_with_ack_reply() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.double");
            let handler = doubler(&conn, &q).await;
            let requester = conn.requester::<u32, Quote>("", &q);
            for (n, timeout) in [
                (1, Duration::from_secs(10)),
                (2, Duration::MAX),
                (21, Duration::from_secs(10)),
            ] {
                let reply = requester.request(&n, timeout).await.unwrap();
                assert_eq!(
                    reply.payload,
                    Quote {
                        n,
                        doubled: u64::from(n) * 2
                    },
                    "{:?}",
                    b.kind
                );
                assert_eq!(
                    reply.properties.correlation_id.as_ref().map(|c| c.to_string()),
                    Some(reply.correlation_id.clone())
                );
            }
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            handler.close().await.unwrap();
            assert_eq!(
                depth(&conn.consuming_connection().channel().await.unwrap(), &q).await,
                0
            );
            conn.close().await.unwrap();
        }
    })
    .await
}

/// A replier of its own on the raw API: takes `n` requests, then answers
/// them in shuffled order (the reply's body is the request's times three).
async fn shuffled_replier(b: &Broker, queue: &str, n: usize) -> tokio::task::JoinHandle<()> {
    let conn = b.connect().await;
    let ch = conn.channel().await.unwrap();
    ch.confirm_select().await.unwrap();
    ch.queue_declare(QueueDeclare {
        queue: queue.into(),
        auto_delete: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut requests = ch
        .basic_consume(BasicConsume {
            queue: queue.into(),
            no_ack: true,
            ..Default::default()
        })
        .await
        .unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while held.len() < n {
            let d = requests.next().await.expect("a request");
            held.push(d);
        }
        shuffle(&mut held);
        let mut confirms = Vec::new();
        for d in held {
            let props = d.properties.as_ref().unwrap();
            let n: u32 = serde_json::from_slice(&d.body).unwrap();
            let reply = serde_json::to_vec(&(u64::from(n) * 3)).unwrap();
            let to = props.reply_to.as_ref().unwrap().to_string();
            let reply_props = BasicProperties {
                correlation_id: props.correlation_id.clone(),
                ..Default::default()
            };
            confirms.push(ch.publish("", &to, false, reply_props, reply).await.unwrap());
        }
        for c in confirms {
            c.await.unwrap();
        }
        let _ = conn.close().await;
    })
}

/// Shuffles `items` (Fisher-Yates on a xorshift seeded from the clock).
fn shuffle<T>(items: &mut [T]) {
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(88_172_645_463_325_252, |d| d.as_nanos() as u64)
        | 1;
    for i in (1..items.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        items.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

/// Runs every future in a task of its own; their outputs in order.
async fn all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("the task ran"));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_40_two_hundred_concurrent_requests_each_get_their_own_reply_in_shuffled_order() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.shuffled");
            let replier = shuffled_replier(&b, &q, 200).await;
            let requester = conn.requester::<u32, u64>("", &q);
            let asks = (0..200u32).map(|n| {
                let requester = requester.clone();
                async move { (n, requester.request(&n, Duration::from_secs(30)).await) }
            });
            for (n, reply) in all(asks).await {
                let reply = reply.unwrap_or_else(|e| panic!("{:?}: request {n}: {e}", b.kind));
                assert_eq!(reply.payload, u64::from(n) * 3, "{:?}", b.kind);
            }
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            replier.await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_41_an_unroutable_request_fails_at_once() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let requester = conn.requester::<u32, u64>("", &unique("rpc.nobody"));
            let started = Instant::now();
            let err = requester.request(&1, Duration::from_secs(20)).await.unwrap_err();
            assert!(
                matches!(err, Error::Unroutable { code: 312, .. }),
                "{:?}: {err}",
                b.kind
            );
            assert!(started.elapsed() < Duration::from_secs(5), "{:?}", b.kind);
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_41_a_request_whose_replier_is_gone_times_out_and_leaves_no_waiter() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.gone");
            // A replier that answered once and then went away.
            let handler = doubler(&conn, &q).await;
            let requester = conn.requester::<u32, Quote>("", &q);
            requester.request(&1, Duration::from_secs(10)).await.unwrap();
            handler.close().await.unwrap();
            let started = Instant::now();
            let err = requester.request(&2, Duration::from_millis(500)).await.unwrap_err();
            assert!(matches!(err, Error::RequestTimedOut { .. }), "{:?}: {err}", b.kind);
            assert!(started.elapsed() >= Duration::from_millis(500), "{:?}", b.kind);
            assert!(started.elapsed() < Duration::from_secs(5), "{:?}", b.kind);
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            // The request waits in the queue; a replier that comes back
            // answers it to no one, and the next request is answered.
            let handler = doubler(&conn, &q).await;
            let reply = requester.request(&3, Duration::from_secs(10)).await.unwrap();
            assert_eq!(reply.payload.n, 3, "{:?}", b.kind);
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            handler.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_41_timed_out_and_cancelled_requests_leave_no_waiter() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.silent");
            Topology::new().queue(&q).declare(&conn).await.unwrap();
            let requester = conn.requester::<u32, u64>("", &q);
            let timed_out = (0..100u32).map(|n| {
                let requester = requester.clone();
                async move { requester.request(&n, Duration::from_millis(300)).await }
            });
            let cancelled = (0..100u32).map(|n| {
                let requester = requester.clone();
                async move {
                    tokio::time::timeout(
                        Duration::from_millis(200),
                        requester.request(&n, Duration::from_secs(60)),
                    )
                    .await
                }
            });
            let (timed_out, cancelled) = tokio::join!(all(timed_out), all(cancelled));
            for r in timed_out {
                assert!(matches!(r, Err(Error::RequestTimedOut { .. })), "{:?}: {r:?}", b.kind);
            }
            assert!(cancelled.iter().all(Result::is_err), "{:?}", b.kind);
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            // Futures dropped mid-flight, without a timeout: spawned, aborted.
            let spawned: Vec<_> = (0..50u32)
                .map(|n| {
                    let requester = requester.clone();
                    tokio::spawn(async move { requester.request(&n, Duration::from_secs(60)).await })
                })
                .collect();
            let until = Instant::now() + Duration::from_secs(10);
            while requester.pending() < 50 {
                assert!(Instant::now() < until, "{:?}: {} waiting", b.kind, requester.pending());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for task in &spawned {
                task.abort();
            }
            for task in spawned {
                let _ = task.await;
            }
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_41_replies_with_unknown_missing_duplicate_or_undecodable_correlation_are_dropped() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.hostile");
            let raw = b.connect().await;
            let ch = raw.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            ch.queue_declare(QueueDeclare {
                queue: q.as_str().into(),
                auto_delete: true,
                ..Default::default()
            })
            .await
            .unwrap();
            let mut requests = ch
                .basic_consume(BasicConsume {
                    queue: q.as_str().into(),
                    no_ack: true,
                    ..Default::default()
                })
                .await
                .unwrap();
            let answers = Arc::new(AtomicUsize::new(0));
            let counted = answers.clone();
            let replier = tokio::spawn(async move {
                while let Some(d) = requests.next().await {
                    let props = d.properties.as_ref().unwrap();
                    let to = props.reply_to.as_ref().unwrap().to_string();
                    let real = props.correlation_id.clone();
                    let hostile = [
                        Some(ShortString::from("not-a-request-of-yours")),
                        None,
                        Some(ShortString::from(format!("{}.999999", real.as_ref().unwrap()))),
                        Some(ShortString::from_bytes(Bytes::from_static(b"\xff\xfe")).unwrap()),
                    ];
                    for correlation_id in hostile {
                        let props = BasicProperties {
                            correlation_id,
                            ..Default::default()
                        };
                        ch.publish("", &to, false, props, &b"666"[..])
                            .await
                            .unwrap()
                            .await
                            .unwrap();
                    }
                    // The real one, twice, the second one different.
                    for body in [&b"7"[..], &b"8"[..]] {
                        let props = BasicProperties {
                            correlation_id: real.clone(),
                            ..Default::default()
                        };
                        ch.publish("", &to, false, props, body).await.unwrap().await.unwrap();
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            });
            let requester = conn.requester::<u32, u64>("", &q);
            for n in 0..3 {
                let reply = requester.request(&n, Duration::from_secs(10)).await.unwrap();
                assert_eq!(reply.payload, 7, "{:?}", b.kind);
                assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            }
            assert!(answers.load(Ordering::SeqCst) >= 2, "{:?}", b.kind);
            raw.close().await.unwrap();
            let _ = replier.await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_41_a_reply_that_does_not_decode_fails_its_request_with_decode() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.undecodable");
            Topology::new().queue(&q).dead_letters(&q).declare(&conn).await.unwrap();
            let handler = consume(&conn, &q, |_: Message<u32>| async {
                Ack::reply_bytes(&b"not json"[..], "text/plain")
            })
            .await
            .unwrap();
            let requester = conn.requester::<u32, u64>("", &q);
            let err = requester.request(&1, Duration::from_secs(10)).await.unwrap_err();
            assert!(matches!(err, Error::Decode(_)), "{:?}: {err}", b.kind);
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            handler.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_42_requests_in_flight_at_a_connection_loss_fail_with_reply_channel_lost_and_later_ones_work() {
    deadline(async {
        for b in brokers().await {
            let name = unique("rpc-recovery");
            let mut config = acemq_core::Config::default();
            config.recovery_delay = Duration::from_millis(50);
            config.recovery_delay_max = Duration::from_millis(400);
            config.engine.connection_name = Some(name.clone());
            let conn = b.conn_with(config).await;
            let q = unique("rpc.slow");
            Topology::new().queue(&q).dead_letters(&q).declare(&conn).await.unwrap();
            // Holds the first three requests until the loss; answers the rest.
            let held = Arc::new(tokio::sync::Semaphore::new(0));
            let release = Arc::new(tokio::sync::Notify::new());
            let (h, r) = (held.clone(), release.clone());
            let handler = consume(&conn, &q, move |m: Message<u32>| {
                let (h, r) = (h.clone(), r.clone());
                async move {
                    if m.payload < 3 && !m.redelivered {
                        h.add_permits(1);
                        r.notified().await;
                    }
                    Ack::reply(&(u64::from(m.payload) + 100))
                }
            })
            .await
            .unwrap();
            let requester = conn.requester::<u32, u64>("", &q);
            let in_flight: Vec<_> = (0..3u32)
                .map(|n| {
                    let requester = requester.clone();
                    tokio::spawn(async move { requester.request(&n, Duration::from_secs(60)).await })
                })
                .collect();
            let _ = tokio::time::timeout(Duration::from_secs(20), held.acquire_many(3))
                .await
                .expect("the three requests reach the handler");
            let started = Instant::now();
            b.force_close(&format!("{name}-publish"));
            for task in in_flight {
                let err = task.await.unwrap().unwrap_err();
                assert!(matches!(err, Error::ReplyChannelLost { .. }), "{:?}: {err}", b.kind);
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{:?}", b.kind);
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            release.notify_waiters();
            let reply = requester.request(&7, Duration::from_secs(30)).await.unwrap();
            assert_eq!(reply.payload, 107, "{:?}", b.kind);
            assert_eq!(requester.pending(), 0, "{:?}", b.kind);
            release.notify_waiters();
            handler.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

fn error_text(m: &amqp::GetMessage) -> String {
    m.properties
        .as_ref()
        .ok()
        .and_then(|p| p.headers.as_ref())
        .and_then(|h| h.get(ERROR_HEADER))
        .and_then(FieldValue::as_str)
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_43_a_request_whose_reply_to_is_missing_or_a_queue_is_dead_lettered_with_the_reason() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.noreplyto");
            let replies = unique("rpc.named-replies");
            Topology::new().queue(&replies).declare(&conn).await.unwrap();
            let handler = doubler(&conn, &q).await;
            // No reply-to at all: a plain publish.
            conn.publisher::<u32>("", &q).send(&5).await.unwrap();
            let dead = take(&conn, &format!("{q}.dlq"), Duration::from_secs(20))
                .await
                .unwrap_or_else(|| panic!("{:?}: not dead-lettered", b.kind));
            assert!(
                error_text(&dead).contains("no reply-to"),
                "{:?}: {}",
                b.kind,
                error_text(&dead)
            );
            // A reply-to that names a queue: refused unless the handler allows it.
            let ch = conn.publishing_connection().channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let props = BasicProperties {
                reply_to: Some(replies.as_str().into()),
                correlation_id: Some("named-1".into()),
                ..Default::default()
            };
            ch.publish("", &q, true, props, &b"6"[..]).await.unwrap().await.unwrap();
            let dead = take(&conn, &format!("{q}.dlq"), Duration::from_secs(20))
                .await
                .unwrap_or_else(|| panic!("{:?}: not dead-lettered", b.kind));
            assert!(
                error_text(&dead).contains("not a direct reply-to name"),
                "{:?}: {}",
                b.kind,
                error_text(&dead)
            );
            assert!(
                take(&conn, &replies, Duration::from_millis(200)).await.is_none(),
                "{:?}",
                b.kind
            );
            handler.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_43_a_request_whose_reply_to_rabbitmq_could_not_decode_is_dead_lettered_and_the_connection_stays_up()
{
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.mangled");
            let handler = doubler(&conn, &q).await;
            let raw = b.connect().await;
            let (_raw_ch, _replies, name) = reply_channel(&raw).await;
            let ch = raw.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            for reply_to in [mangled(&name), format!("{PREFIX}x.y")] {
                let props = BasicProperties {
                    reply_to: Some(reply_to.as_str().into()),
                    correlation_id: Some("mangled".into()),
                    ..Default::default()
                };
                ch.publish("", &q, true, props, &b"4"[..]).await.unwrap().await.unwrap();
                let dead = take(&conn, &format!("{q}.dlq"), Duration::from_secs(20))
                    .await
                    .unwrap_or_else(|| panic!("{:?}: not dead-lettered", b.kind));
                assert!(
                    error_text(&dead).contains("not a reply name as RabbitMQ writes them"),
                    "{:?}: {}",
                    b.kind,
                    error_text(&dead)
                );
            }
            let generation_before = conn.publishing_connection();
            let requester = conn.requester::<u32, Quote>("", &q);
            assert_eq!(
                requester
                    .request(&8, Duration::from_secs(10))
                    .await
                    .unwrap()
                    .payload
                    .doubled,
                16
            );
            assert!(
                !generation_before.is_closed(),
                "{:?}: the publishing connection was lost",
                b.kind
            );
            raw.close().await.unwrap();
            handler.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_43_a_reply_to_a_node_rabbitmq_3_10_does_not_know_costs_one_connection_and_dead_letters_the_request()
{
    deadline(async {
        for b in brokers().await {
            let v4 = b.version() == Some(acemq_tests::RabbitVersion::V4_0);
            let mut config = acemq_core::Config::default();
            config.recovery_delay = Duration::from_millis(50);
            config.recovery_delay_max = Duration::from_millis(400);
            let conn = b.conn_with(config).await;
            let q = unique("rpc.other-node");
            Topology::new().queue(&q).dead_letters(&q).declare(&conn).await.unwrap();
            let calls = Arc::new(AtomicUsize::new(0));
            let counted = calls.clone();
            let handler = consume(&conn, &q, move |m: Message<u32>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ack::reply(&(m.payload + 1)) }
            })
            .await
            .unwrap();
            let raw = b.connect().await;
            let (ch, _replies, name) = reply_channel(&raw).await;
            let props = BasicProperties {
                reply_to: Some(other_node(&name).as_str().into()),
                correlation_id: Some("other-node".into()),
                ..Default::default()
            };
            ch.publish("", &q, true, props, &b"1"[..]).await.unwrap().await.unwrap();
            let dead = take(&conn, &format!("{q}.dlq"), Duration::from_secs(if v4 { 1 } else { 30 })).await;
            if v4 {
                assert!(dead.is_none(), "{:?}: dead-lettered", b.kind);
            } else {
                let dead = dead.unwrap_or_else(|| panic!("{:?}: not dead-lettered", b.kind));
                assert!(error_text(&dead).contains("541"), "{:?}: {}", b.kind, error_text(&dead));
            }
            // The connection is back (on 3.10), and requests are answered.
            let requester = conn.requester::<u32, u32>("", &q);
            assert_eq!(requester.request(&5, Duration::from_secs(30)).await.unwrap().payload, 6);
            assert_eq!(calls.load(Ordering::SeqCst), 2, "{:?}", b.kind);
            assert_eq!(
                depth(&conn.consuming_connection().channel().await.unwrap(), &q).await,
                0
            );
            raw.close().await.unwrap();
            handler.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_43_a_reply_goes_to_a_named_queue_only_when_the_handler_allows_that_name() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.named");
            let replies = unique("rpc.allowed-replies");
            Topology::new()
                .queue(&q)
                .dead_letters(&q)
                .queue(&replies)
                .declare(&conn)
                .await
                .unwrap();
            let prefix = replies.clone();
            let handler = consume(&conn, &q, move |m: Message<u32>| {
                let prefix = prefix.clone();
                async move { Ack::reply_named(&(m.payload + 1), move |queue: &str| queue == prefix) }
            })
            .await
            .unwrap();
            let ch = conn.publishing_connection().channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            for (reply_to, body) in [(replies.as_str(), &b"1"[..]), ("rpc.elsewhere", &b"2"[..])] {
                let props = BasicProperties {
                    reply_to: Some(reply_to.into()),
                    correlation_id: Some(format!("to-{reply_to}").as_str().into()),
                    ..Default::default()
                };
                ch.publish("", &q, true, props, body).await.unwrap().await.unwrap();
            }
            let reply = take(&conn, &replies, Duration::from_secs(20))
                .await
                .unwrap_or_else(|| panic!("{:?}: no reply in the named queue", b.kind));
            assert_eq!(&reply.body[..], b"2", "{:?}", b.kind);
            let props = reply.properties.as_ref().unwrap();
            assert_eq!(props.correlation_id, Some(ShortString::from(format!("to-{replies}"))));
            let dead = take(&conn, &format!("{q}.dlq"), Duration::from_secs(20))
                .await
                .unwrap_or_else(|| panic!("{:?}: the refused one is not dead-lettered", b.kind));
            assert_eq!(&dead.body[..], b"2", "{:?}", b.kind);
            assert!(
                error_text(&dead).contains("rpc.elsewhere"),
                "{:?}: {}",
                b.kind,
                error_text(&dead)
            );
            handler.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_43_a_reply_to_a_requester_that_is_gone_acks_the_request_after_one_handler_call() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let q = unique("rpc.orphan");
            Topology::new().queue(&q).dead_letters(&q).declare(&conn).await.unwrap();
            // The requests first, from a requester that then goes away.
            let raw = b.connect().await;
            let (ch, _replies, _) = reply_channel(&raw).await;
            for n in 0..3u32 {
                let props = BasicProperties {
                    reply_to: Some(REPLY_TO.into()),
                    correlation_id: Some(format!("orphan-{n}").as_str().into()),
                    ..Default::default()
                };
                let body = serde_json::to_vec(&n).unwrap();
                ch.publish("", &q, true, props, body).await.unwrap().await.unwrap();
            }
            // A named reply queue that was deleted, too.
            let gone = unique("rpc.deleted-replies");
            let props = BasicProperties {
                reply_to: Some(gone.as_str().into()),
                correlation_id: Some("to-a-deleted-queue".into()),
                ..Default::default()
            };
            ch.publish("", &q, true, props, &b"3"[..]).await.unwrap().await.unwrap();
            raw.close().await.unwrap();
            let calls: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
            let seen = calls.clone();
            let handler = consume(&conn, &q, move |m: Message<u32>| {
                *seen.lock().unwrap().entry(m.payload).or_default() += 1;
                async move { Ack::reply_named(&m.payload, |_: &str| true) }
            })
            .retry_with(RetryPolicy::fixed(3, Duration::from_millis(10)))
            .await
            .unwrap();
            let until = Instant::now() + Duration::from_secs(20);
            while calls.lock().unwrap().len() < 4 {
                assert!(Instant::now() < until, "{:?}: {:?}", b.kind, calls.lock().unwrap());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            handler.close().await.unwrap();
            let ch = conn.consuming_connection().channel().await.unwrap();
            assert_eq!(depth(&ch, &q).await, 0, "{:?}", b.kind);
            assert_eq!(depth(&ch, &format!("{q}.dlq")).await, 0, "{:?}", b.kind);
            assert!(
                calls.lock().unwrap().values().all(|&n| n == 1),
                "{:?}: {:?}",
                b.kind,
                calls.lock().unwrap()
            );
            conn.close().await.unwrap();
        }
    })
    .await
}
