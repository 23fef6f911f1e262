//! Nothing a client sends makes the broker panic: arbitrary bytes, and
//! sequences of well-formed frames with arbitrary fields, after a valid
//! handshake or without one. Unit tests, because the entry point
//! ([`super::client_bytes`]) is compiled only for tests and fuzzing.

use crate::fuzzing::client_bytes;
use acemq_codec::{
    encode_content, encode_method, BasicAck, BasicCancel, BasicConsume, BasicGet, BasicNack, BasicProperties,
    BasicPublish, BasicQos, BasicRecover, BasicReject, ChannelClose, ChannelCloseOk, ChannelFlow, ChannelOpen,
    ConfirmSelect, ExchangeBind, ExchangeDeclare, ExchangeDelete, FieldTable, FieldValue, Method, QueueBind,
    QueueDeclare, QueueDelete, QueuePurge, QueueUnbind, TxCommit, TxRollback, TxSelect,
};
use bytes::BytesMut;
use proptest::prelude::*;

const NAMES: &[&str] = &[
    "",
    "fuzz",
    "fuzz.qq",
    "fuzz.stream",
    "x",
    "amq.direct",
    "amq.topic",
    "q.#",
    "amq.gen-1",
];

fn name() -> impl Strategy<Value = String> {
    prop::sample::select(NAMES).prop_map(str::to_owned)
}

fn arguments() -> impl Strategy<Value = FieldTable> {
    let key = prop::sample::select(
        &[
            "x-queue-type",
            "x-message-ttl",
            "x-expires",
            "x-max-length",
            "x-overflow",
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-delivery-limit",
            "x-stream-offset",
            "x-match",
            "alternate-exchange",
        ][..],
    );
    let value = prop_oneof![
        prop::sample::select(
            &[
                "classic",
                "quorum",
                "stream",
                "reject-publish",
                "first",
                "any",
                "",
                "fuzz"
            ][..]
        )
        .prop_map(FieldValue::from),
        (-5i64..5000).prop_map(FieldValue::I64),
        (0u64..2_000_000_000).prop_map(FieldValue::Timestamp),
        any::<bool>().prop_map(FieldValue::Bool),
    ];
    prop::collection::vec((key, value), 0..3).prop_map(|pairs| pairs.into_iter().collect())
}

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        (
            name(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            arguments()
        )
            .prop_map(|(queue, passive, durable, exclusive, auto_delete, arguments)| {
                QueueDeclare {
                    queue: queue.as_str().into(),
                    passive,
                    durable,
                    exclusive,
                    auto_delete,
                    arguments,
                    ..Default::default()
                }
                .into()
            }),
        (
            name(),
            prop::sample::select(&["direct", "fanout", "topic", "headers", "nope"][..]),
            any::<bool>(),
            any::<bool>(),
            arguments()
        )
            .prop_map(|(exchange, kind, durable, internal, arguments)| {
                ExchangeDeclare {
                    exchange: exchange.as_str().into(),
                    kind: kind.into(),
                    durable,
                    internal,
                    arguments,
                    ..Default::default()
                }
                .into()
            }),
        (name(), name(), name(), arguments()).prop_map(|(q, x, k, arguments)| {
            QueueBind {
                queue: q.as_str().into(),
                exchange: x.as_str().into(),
                routing_key: k.as_str().into(),
                arguments,
                ..Default::default()
            }
            .into()
        }),
        (name(), name(), name()).prop_map(|(q, x, k)| {
            QueueUnbind {
                queue: q.as_str().into(),
                exchange: x.as_str().into(),
                routing_key: k.as_str().into(),
                ..Default::default()
            }
            .into()
        }),
        (name(), name(), name()).prop_map(|(d, s, k)| {
            ExchangeBind {
                destination: d.as_str().into(),
                source: s.as_str().into(),
                routing_key: k.as_str().into(),
                ..Default::default()
            }
            .into()
        }),
        (name(), any::<bool>()).prop_map(|(x, if_unused)| ExchangeDelete {
            exchange: x.as_str().into(),
            if_unused,
            ..Default::default()
        }
        .into()),
        (name(), any::<bool>(), any::<bool>()).prop_map(|(q, if_unused, if_empty)| {
            QueueDelete {
                queue: q.as_str().into(),
                if_unused,
                if_empty,
                ..Default::default()
            }
            .into()
        }),
        name().prop_map(|q| QueuePurge {
            queue: q.as_str().into(),
            ..Default::default()
        }
        .into()),
        (0u16..5, any::<bool>()).prop_map(|(prefetch_count, global)| BasicQos {
            prefetch_count,
            global,
            ..Default::default()
        }
        .into()),
        (name(), name(), any::<bool>(), any::<bool>(), arguments()).prop_map(
            |(q, tag, no_ack, exclusive, arguments)| {
                BasicConsume {
                    queue: q.as_str().into(),
                    consumer_tag: tag.as_str().into(),
                    no_ack,
                    exclusive,
                    arguments,
                    ..Default::default()
                }
                .into()
            }
        ),
        name().prop_map(|tag| BasicCancel {
            consumer_tag: tag.as_str().into(),
            no_wait: false
        }
        .into()),
        (name(), any::<bool>()).prop_map(|(q, no_ack)| BasicGet {
            queue: q.as_str().into(),
            no_ack,
            ..Default::default()
        }
        .into()),
        (0u64..8, any::<bool>()).prop_map(|(delivery_tag, multiple)| BasicAck { delivery_tag, multiple }.into()),
        (0u64..8, any::<bool>(), any::<bool>()).prop_map(|(delivery_tag, multiple, requeue)| BasicNack {
            delivery_tag,
            multiple,
            requeue
        }
        .into()),
        (0u64..8, any::<bool>()).prop_map(|(delivery_tag, requeue)| BasicReject { delivery_tag, requeue }.into()),
        any::<bool>().prop_map(|requeue| BasicRecover { requeue }.into()),
        any::<bool>().prop_map(|active| ChannelFlow { active }.into()),
        Just(ConfirmSelect { no_wait: false }.into()),
        Just(TxSelect {}.into()),
        Just(TxCommit {}.into()),
        Just(TxRollback {}.into()),
        Just(ChannelOpen::default().into()),
        Just(ChannelCloseOk {}.into()),
        Just(
            ChannelClose {
                reply_code: 200,
                ..Default::default()
            }
            .into()
        ),
    ]
}

#[derive(Debug, Clone)]
enum Step {
    Method(u16, Method),
    Publish(u16, String, String, bool, Option<String>, usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u16..4, method()).prop_map(|(ch, m)| Step::Method(ch, m)),
        2 => (1u16..4, name(), name(), any::<bool>(), prop::option::of(prop::sample::select(&["0", "10", "x"][..]).prop_map(str::to_owned)), prop_oneof![9 => 0usize..300, 1 => Just(140_000usize)])
            .prop_map(|(ch, x, k, mandatory, expiration, size)| Step::Publish(ch, x, k, mandatory, expiration, size)),
    ]
}

fn encode(steps: &[Step]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for step in steps {
        match step {
            Step::Method(ch, m) => {
                let _ = encode_method(*ch, m, &mut out);
            }
            Step::Publish(ch, x, k, mandatory, expiration, size) => {
                let publish = BasicPublish {
                    exchange: x.as_str().into(),
                    routing_key: k.as_str().into(),
                    mandatory: *mandatory,
                    ..Default::default()
                };
                let props = BasicProperties {
                    expiration: expiration.as_deref().map(Into::into),
                    delivery_mode: Some(2),
                    ..Default::default()
                };
                let body = vec![1u8; *size];
                let _ = encode_content(*ch, &publish.into(), &props, &body, 131_072, &mut out);
            }
        }
    }
    out.to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(mode in any::<u8>(), bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let mut data = vec![mode];
        data.extend(bytes);
        crate::deadline::deadline_blocking(|| client_bytes(&data));
    }

    #[test]
    fn arbitrary_frame_sequences_after_a_handshake_never_panic(mode in any::<u8>(), steps in prop::collection::vec(step(), 0..40)) {
        let mut data = vec![mode | 1];
        data.extend(encode(&steps));
        crate::deadline::deadline_blocking(|| client_bytes(&data));
    }
}
