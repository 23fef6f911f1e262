//! Entry points for fuzzing the broker with arbitrary client bytes, shared
//! by the cargo-fuzz target (`fuzz/fuzz_targets/broker.rs`) and the stable
//! property tests. Not an API: the only promise is that nothing panics.

use std::time::{Duration, Instant};

use amqp_codec::{
    encode_method, BasicConsume, BasicQos, ChannelOpen, ConfirmSelect, ConnectionOpen, ConnectionStartOk,
    ConnectionTuneOk, FieldTable, FieldValue, Method, QueueDeclare, PROTOCOL_HEADER,
};
use bytes::BytesMut;

use crate::{BrokerConfig, BrokerMachine, Fate, Session};

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
