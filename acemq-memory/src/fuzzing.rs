//! Entry points for fuzzing the broker with arbitrary client bytes, shared
//! by the cargo-fuzz target (`fuzz/fuzz_targets/broker.rs`) and the stable
//! property tests (`no_panic_tests`, `corpus_tests`). Compiled only for
//! fuzzing (`--cfg fuzzing`, which cargo-fuzz passes) and for this crate's
//! tests: never part of the API, and nothing in the broker may call it. The
//! only promise is that nothing panics.

use std::time::{Duration, Instant};

use acemq_codec::{
    encode_content, encode_method, BasicAck, BasicCancel, BasicConsume, BasicGet, BasicNack, BasicProperties,
    BasicPublish, BasicQos, BasicRecover, BasicReject, ChannelClose, ChannelOpen, ConfirmSelect, ConnectionClose,
    ConnectionOpen, ConnectionStartOk, ConnectionTuneOk, ExchangeBind, ExchangeDeclare, ExchangeDelete, FieldArray,
    FieldTable, FieldValue, Method, QueueBind, QueueDeclare, QueueDelete, QueuePurge, QueueUnbind, TxCommit,
    TxRollback, TxSelect, PROTOCOL_HEADER,
};
use bytes::BytesMut;

use crate::{BrokerConfig, BrokerMachine, Fate, Session};

#[cfg(test)]
mod corpus_tests;
#[cfg(test)]
mod no_panic_tests;

fn push(out: &mut BytesMut, channel: u16, method: impl Into<Method>) {
    let _ = encode_method(channel, &method.into(), out);
}

/// The bytes of a client that logs in as guest, opens vhost `/` with
/// `heartbeat`, and opens channels 1 and 2 (1 in confirm mode).
pub fn handshake(heartbeat: u16) -> BytesMut {
    let mut out = BytesMut::new();
    out.extend_from_slice(&PROTOCOL_HEADER);
    push(
        &mut out,
        0,
        ConnectionStartOk {
            client_properties: FieldTable::new(),
            mechanism: "PLAIN".into(),
            response: b"\0guest\0guest".as_slice().into(),
            locale: "en_US".into(),
        },
    );
    push(
        &mut out,
        0,
        ConnectionTuneOk {
            channel_max: 2047,
            frame_max: 131_072,
            heartbeat,
        },
    );
    push(
        &mut out,
        0,
        ConnectionOpen {
            virtual_host: "/".into(),
            ..Default::default()
        },
    );
    push(&mut out, 1, ChannelOpen::default());
    push(&mut out, 2, ChannelOpen::default());
    push(&mut out, 1, ConfirmSelect { no_wait: false });
    out
}

/// A well-behaved consumer of a classic, a quorum and a stream queue, so
/// that whatever the fuzzed client publishes reaches another connection.
fn consumer_script() -> BytesMut {
    let mut out = handshake(0);
    let durable = |name: &str, kind: &str| QueueDeclare {
        queue: name.into(),
        durable: true,
        arguments: [("x-queue-type", FieldValue::from(kind))].into_iter().collect(),
        ..Default::default()
    };
    push(&mut out, 2, durable("fuzz", "classic"));
    push(&mut out, 2, durable("fuzz.qq", "quorum"));
    push(&mut out, 2, durable("fuzz.stream", "stream"));
    push(
        &mut out,
        2,
        BasicQos {
            prefetch_count: 3,
            ..Default::default()
        },
    );
    for queue in ["fuzz", "fuzz.qq", "fuzz.stream"] {
        let mut arguments = FieldTable::new();
        arguments.insert("x-stream-offset", "first");
        push(
            &mut out,
            2,
            BasicConsume {
                queue: queue.into(),
                consumer_tag: queue.into(),
                arguments,
                ..Default::default()
            },
        );
    }
    out
}

/// Feeds `data` to a broker as one client's bytes: the first byte picks
/// whether a valid handshake comes first, how the bytes are chunked, and
/// which faults and clock jumps happen between chunks. Panics only if the
/// broker does.
pub fn client_bytes(data: &[u8]) {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let mut now = Instant::now();
    let mut machine = BrokerMachine::new(BrokerConfig::default(), now);
    let mut consumer = Session::new(&mut machine, now);
    let mut script = consumer_script();
    consumer.handle_input(&mut machine, &mut script, now);
    let mut client = Session::new(&mut machine, now);
    let mut input = if mode & 1 == 1 {
        handshake(u16::from(mode >> 6))
    } else {
        BytesMut::new()
    };
    let chunk = match (mode >> 1) & 3 {
        0 => usize::MAX,
        1 => 1,
        2 => 7,
        _ => 64,
    };
    for (i, part) in data.chunks(chunk.min(data.len().max(1))).enumerate() {
        input.extend_from_slice(part);
        client.handle_input(&mut machine, &mut input, now);
        if mode & 8 != 0 && i % 3 == 2 {
            now += Duration::from_millis(700 * (i as u64 % 5));
            client.handle_timeout(&mut machine, now);
            consumer.handle_timeout(&mut machine, now);
            machine.handle_timeout(now);
        }
        if mode & 16 != 0 {
            machine.set_memory_alarm(i % 2 == 0);
        }
        if mode & 32 != 0 && i == 3 {
            machine.close_all("fuzz");
        }
        let _ = machine.take_output(client.id());
        let _ = machine.take_output(consumer.id());
        let _ = machine.take_woken();
        if client.fate() != Fate::Running {
            break;
        }
    }
    if mode & 32 != 0 {
        machine.restart(now);
    }
    machine.remove_conn(client.id(), now);
    machine.remove_conn(consumer.id(), now);
    let _ = machine.poll_timeout();
}

/// The output limit of the broker [`served_connection`] runs.
pub const SERVED_OUTPUT_LIMIT: usize = 16 * 1024;
/// The largest message body it accepts.
pub const SERVED_MAX_MESSAGE: u64 = 64 * 1024;

/// What a connection of [`served_connection`] may have buffered at most:
/// the output limit, one delivery or `get-ok` of the largest message with
/// its frames, and a handful of methods written past the limit.
pub const SERVED_OUTPUT_BOUND: usize = SERVED_OUTPUT_LIMIT + SERVED_MAX_MESSAGE as usize + 64 * 1024;

/// Feeds `data` to a broker as one client's bytes through the tokio layer
/// itself (the task that serves each connection: reads, the session, the
/// output limit, the write timeout), over an in-process duplex stream, on
/// a paused clock. The first byte is the mode, as in [`client_bytes`]
/// (bit 0: a valid handshake first; bits 1-2: the chunk size), and bits 3-4
/// choose how the client reads: everything, nothing at all, or a few bytes
/// now and then. A well-behaved consumer reads everything on a second
/// connection. After every chunk the broker's buffered output must stay
/// within [`SERVED_OUTPUT_BOUND`] per connection; at the end both
/// connections must be gone once their sockets are. Panics if the broker
/// does, or breaks either promise.
pub fn served_connection(data: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let config = BrokerConfig::default()
            .with_output_limit(SERVED_OUTPUT_LIMIT)
            .with_max_message_size(SERVED_MAX_MESSAGE)
            .with_write_timeout(Duration::from_secs(5))
            .with_duplex_capacity(4096);
        let broker = crate::Broker::new(config);

        let (mut consumer_read, mut consumer_write) = tokio::io::split(broker.connect());
        let drain = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = consumer_read.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        });
        let _ = consumer_write.write_all(&consumer_script()).await;

        let (mut client_read, mut client_write) = tokio::io::split(broker.connect());
        let reading = (mode >> 3) & 3;
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match reading {
                    // Reads nothing: the broker's writes to it stall.
                    1 => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        continue;
                    }
                    // A few bytes a second.
                    2 => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        client_read.read(&mut buf[..64]).await
                    }
                    _ => client_read.read(&mut buf).await,
                };
                if !matches!(n, Ok(n) if n > 0) {
                    break;
                }
            }
        });

        let mut input = if mode & 1 == 1 {
            handshake(0).to_vec()
        } else {
            Vec::new()
        };
        input.extend_from_slice(data);
        let chunk = match (mode >> 1) & 3 {
            0 => input.len().max(1),
            1 => 1,
            2 => 7,
            _ => 64,
        };
        let bound = 2 * SERVED_OUTPUT_BOUND;
        for part in input.chunks(chunk) {
            // A client that is not read may be stuck writing: bounded too.
            let _ = tokio::time::timeout(Duration::from_secs(10), client_write.write_all(part)).await;
            tokio::task::yield_now().await;
            let buffered = broker.stats().output_buffered;
            assert!(buffered <= bound, "{buffered} bytes buffered for two connections");
        }
        // Let every timer run out (the clock is paused: this is instant).
        tokio::time::sleep(Duration::from_secs(30)).await;
        let buffered = broker.stats().output_buffered;
        assert!(buffered <= bound, "{buffered} bytes buffered for two connections");

        drop(client_write);
        reader.abort();
        let _ = reader.await;
        drop(consumer_write);
        tokio::time::sleep(Duration::from_secs(30)).await;
        drain.abort();
        let _ = drain.await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        let stats = broker.stats();
        assert_eq!(stats.connections, 0, "connections left behind: {stats:?}");
        assert_eq!(stats.output_buffered, 0, "output left behind: {stats:?}");
    });
}

fn publish(
    out: &mut BytesMut,
    channel: u16,
    exchange: &str,
    key: &str,
    mandatory: bool,
    props: &BasicProperties,
    body: &[u8],
) {
    let method: Method = BasicPublish {
        exchange: exchange.into(),
        routing_key: key.into(),
        mandatory,
        ..Default::default()
    }
    .into();
    let _ = encode_content(channel, &method, props, body, 4096, out);
}

/// What a seed's client sends after the handshake.
type Script = Box<dyn Fn(&mut BytesMut)>;

/// The seed corpus of the `broker` fuzz target: for each, its name and the
/// bytes the target is given (a mode byte, see [`client_bytes`], then what
/// the client sends). Written to `fuzz/corpus/broker/` and replayed on stable
/// by `corpus_tests`.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let persistent = BasicProperties {
        delivery_mode: Some(2),
        message_id: Some("m-1".into()),
        ..Default::default()
    };
    let mut headers = FieldTable::new();
    headers.insert("x-acemq-attempt", FieldValue::I32(2));
    headers.insert(
        "x-death",
        FieldValue::Array(FieldArray(vec![FieldValue::Table(FieldTable::new())])),
    );
    let with_headers = BasicProperties {
        headers: Some(headers),
        expiration: Some("0".into()),
        priority: Some(5),
        ..Default::default()
    };
    let mut deep = FieldValue::Void;
    for _ in 0..80 {
        deep = FieldValue::Array(FieldArray(vec![deep]));
    }
    let mut deep_headers = FieldTable::new();
    deep_headers.insert("deep", deep);
    let poison = BasicProperties {
        headers: Some(deep_headers),
        ..Default::default()
    };
    let scripts: Vec<(&'static str, Script)> = vec![
        (
            "publish_confirmed",
            Box::new(move |o| publish(o, 1, "", "fuzz", false, &persistent, b"hello")),
        ),
        (
            "publish_unroutable_mandatory",
            Box::new(|o| publish(o, 1, "", "nowhere", true, &BasicProperties::default(), b"x")),
        ),
        (
            "publish_headers_expiring",
            Box::new(move |o| publish(o, 1, "", "fuzz.qq", true, &with_headers, &[7; 300])),
        ),
        (
            "publish_poison_properties",
            Box::new(move |o| publish(o, 1, "", "fuzz", false, &poison, b"{}")),
        ),
        (
            "publish_large_body",
            Box::new(|o| {
                publish(
                    o,
                    1,
                    "",
                    "fuzz.stream",
                    false,
                    &BasicProperties::default(),
                    &[1; 20_000],
                )
            }),
        ),
        (
            "get_ack_nack_reject",
            Box::new(|o| {
                publish(o, 1, "", "fuzz", false, &BasicProperties::default(), b"a");
                publish(o, 1, "", "fuzz", false, &BasicProperties::default(), b"b");
                push(
                    o,
                    2,
                    BasicGet {
                        queue: "fuzz".into(),
                        ..Default::default()
                    },
                );
                push(
                    o,
                    2,
                    BasicAck {
                        delivery_tag: 1,
                        multiple: false,
                    },
                );
                push(
                    o,
                    2,
                    BasicNack {
                        delivery_tag: 2,
                        multiple: true,
                        requeue: true,
                    },
                );
                push(
                    o,
                    2,
                    BasicReject {
                        delivery_tag: 9,
                        requeue: false,
                    },
                );
                push(o, 2, BasicRecover { requeue: true });
            }),
        ),
        (
            "exchanges_and_bindings",
            Box::new(|o| {
                push(
                    o,
                    2,
                    ExchangeDeclare {
                        exchange: "fx".into(),
                        kind: "topic".into(),
                        ..Default::default()
                    },
                );
                push(
                    o,
                    2,
                    ExchangeDeclare {
                        exchange: "fy".into(),
                        kind: "fanout".into(),
                        ..Default::default()
                    },
                );
                push(
                    o,
                    2,
                    ExchangeBind {
                        destination: "fy".into(),
                        source: "fx".into(),
                        routing_key: "a.#".into(),
                        ..Default::default()
                    },
                );
                push(
                    o,
                    2,
                    QueueBind {
                        queue: "fuzz".into(),
                        exchange: "fy".into(),
                        ..Default::default()
                    },
                );
                publish(o, 1, "fx", "a.b", true, &BasicProperties::default(), b"routed");
                push(
                    o,
                    2,
                    QueueUnbind {
                        queue: "fuzz".into(),
                        exchange: "fy".into(),
                        ..Default::default()
                    },
                );
                push(
                    o,
                    2,
                    ExchangeDelete {
                        exchange: "fx".into(),
                        ..Default::default()
                    },
                );
            }),
        ),
        (
            "queue_arguments_purge_delete",
            Box::new(|o| {
                let mut arguments = FieldTable::new();
                arguments.insert("x-message-ttl", FieldValue::I32(0));
                arguments.insert("x-max-length", FieldValue::I64(1));
                arguments.insert("x-dead-letter-exchange", FieldValue::from(""));
                arguments.insert("x-dead-letter-routing-key", FieldValue::from("fuzz"));
                push(
                    o,
                    2,
                    QueueDeclare {
                        queue: "fz".into(),
                        arguments,
                        ..Default::default()
                    },
                );
                publish(o, 1, "", "fz", false, &BasicProperties::default(), b"dies");
                push(
                    o,
                    2,
                    QueuePurge {
                        queue: "fz".into(),
                        ..Default::default()
                    },
                );
                push(
                    o,
                    2,
                    QueueDelete {
                        queue: "fz".into(),
                        ..Default::default()
                    },
                );
                push(
                    o,
                    2,
                    QueueDeclare {
                        exclusive: true,
                        ..Default::default()
                    },
                );
            }),
        ),
        (
            "consume_cancel_qos",
            Box::new(|o| {
                push(
                    o,
                    2,
                    BasicQos {
                        prefetch_count: 1,
                        global: true,
                        ..Default::default()
                    },
                );
                push(
                    o,
                    2,
                    BasicConsume {
                        queue: "fuzz".into(),
                        consumer_tag: "c".into(),
                        no_ack: true,
                        ..Default::default()
                    },
                );
                publish(o, 1, "", "fuzz", false, &BasicProperties::default(), b"to c");
                push(
                    o,
                    2,
                    BasicCancel {
                        consumer_tag: "c".into(),
                        no_wait: false,
                    },
                );
            }),
        ),
        (
            "transactions",
            Box::new(|o| {
                push(o, 2, TxSelect {});
                publish(o, 2, "", "fuzz", false, &BasicProperties::default(), b"t1");
                push(o, 2, TxCommit {});
                publish(o, 2, "", "fuzz", false, &BasicProperties::default(), b"t2");
                push(o, 2, TxRollback {});
            }),
        ),
        (
            "closes",
            Box::new(|o| {
                push(
                    o,
                    2,
                    ChannelClose {
                        reply_code: 200,
                        reply_text: "bye".into(),
                        ..Default::default()
                    },
                );
                push(
                    o,
                    0,
                    ConnectionClose {
                        reply_code: 200,
                        reply_text: "bye".into(),
                        ..Default::default()
                    },
                );
            }),
        ),
        (
            "frame_too_large",
            Box::new(|o| o.extend_from_slice(&[1, 0, 1, 0x7f, 0xff, 0xff, 0xff, 0, 0])),
        ),
        (
            "content_without_method",
            Box::new(|o| o.extend_from_slice(&[3, 0, 1, 0, 0, 0, 2, b'h', b'i', 0xce])),
        ),
    ];
    let mut out = Vec::new();
    // Each script after a valid handshake, whole and in 7-byte chunks with
    // clock jumps, alarms and forced closes; and the raw protocol edge cases.
    for (name, script) in &scripts {
        for mode in [0b0000_0001u8, 0b0011_1101] {
            let mut bytes = BytesMut::new();
            script(&mut bytes);
            let mut seed = vec![mode];
            seed.extend_from_slice(&bytes);
            out.push((*name, seed));
        }
    }
    out.push(("no_handshake_garbage", vec![0, b'A', b'M', b'Q', b'P', 0, 0, 9, 1]));
    out.push(("handshake_only_heartbeat", vec![0b0100_0001]));
    let mut header_then_bytes = vec![0b0000_0010];
    header_then_bytes.extend_from_slice(&PROTOCOL_HEADER);
    header_then_bytes.extend_from_slice(&[1, 0, 0, 0, 0, 0, 4, 0, 10, 0, 11, 0xce]);
    out.push(("header_then_a_start_ok_of_nothing", header_then_bytes));
    out
}
