//! Channel errors and their codes (404, 405, 406, 403), the connection
//! errors a channel's method can cause (503, 530), settling unknown
//! deliveries, and a channel used again after the broker closed it.

use acemq_codec::{
    BasicAck, BasicConsume, BasicDeliver, BasicGet, BasicProperties, ChannelOpen, ConfirmSelect, ExchangeDeclare,
    ExchangeDelete, FieldValue, Method, QueueBind, QueueDeclare, QueueDelete, TxCommit, TxSelect,
};

use super::wire::Wire;
use super::{answer, args, check, Check, Ctx, Expect, Got, Obs, Step};

const NOT_FOUND: &str = "channel.close 404 NOT_FOUND";
const PRECONDITION: &str = "channel.close 406 PRECONDITION_FAILED";
const ACCESS_REFUSED: &str = "channel.close 403 ACCESS_REFUSED";

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "channel.queue.passive-missing-404",
            "a passive queue.declare of a queue that does not exist closes the channel with 404",
            Expect::Both(NOT_FOUND),
            passive_missing_queue
        ),
        check!(
            "channel.exchange.passive-missing-404",
            "a passive exchange.declare of an exchange that does not exist closes the channel with 404",
            Expect::Both(NOT_FOUND),
            passive_missing_exchange
        ),
        check!(
            "channel.queue.bind-missing-exchange-404",
            "queue.bind to an exchange that does not exist closes the channel with 404",
            Expect::Both(NOT_FOUND),
            bind_missing_exchange
        ),
        check!(
            "channel.basic.consume-missing-queue-404",
            "basic.consume from a queue that does not exist closes the channel with 404",
            Expect::Both(NOT_FOUND),
            consume_missing_queue
        ),
        check!(
            "channel.basic.publish-missing-exchange-404",
            "basic.publish to an exchange that does not exist closes the channel with 404",
            Expect::Both(NOT_FOUND),
            publish_missing_exchange
        ),
        check!(
            "channel.queue.redeclare-other-args-406",
            "declaring a queue again with another x-max-length closes the channel with 406",
            Expect::Both(PRECONDITION),
            redeclare_other_args
        ),
        check!(
            "channel.queue.redeclare-other-durable-406",
            "declaring a queue again with another durable flag closes the channel with 406",
            Expect::Both(PRECONDITION),
            redeclare_other_durable
        ),
        check!(
            "channel.exchange.redeclare-other-type-406",
            "declaring an exchange again with another type closes the channel with 406",
            Expect::Both(PRECONDITION),
            redeclare_other_type
        ),
        check!(
            "channel.exchange.amq-prefix-403",
            "declaring an exchange named amq.* closes the channel with 403",
            Expect::Both(ACCESS_REFUSED),
            exchange_amq_prefix
        ),
        check!(
            "channel.queue.amq-prefix-403",
            "declaring a queue named amq.* closes the channel with 403",
            Expect::Both(ACCESS_REFUSED),
            queue_amq_prefix
        ),
        check!(
            "channel.exchange.delete-default-403",
            "exchange.delete of the default exchange closes the channel with 403",
            Expect::Both(ACCESS_REFUSED),
            delete_default_exchange
        ),
        check!(
            "channel.basic.ack-unknown-tag-406",
            "basic.ack of a delivery tag never given closes the channel with 406",
            Expect::Both(PRECONDITION),
            ack_unknown_tag
        ),
        check!(
            "channel.basic.ack-twice-406",
            "acking the same delivery twice closes the channel with 406",
            Expect::Both(PRECONDITION),
            ack_twice
        ),
        check!(
            "channel.reopen-after-close",
            "after the broker closed a channel (and got close-ok) the same channel number opens again and works",
            Expect::Both("channel.close 404 NOT_FOUND, then channel.open-ok, then queue.declare-ok"),
            reopen_after_close
        ),
        check!(
            "channel.queue.exclusive-other-connection-405",
            "another connection's exclusive queue cannot be declared: the channel closes with 405",
            Expect::Both("channel.close 405 RESOURCE_LOCKED"),
            exclusive_other_connection
        ),
        check!(
            "channel.basic.exclusive-consumer-taken-403",
            "basic.consume on a queue with an exclusive consumer closes the channel with 403",
            Expect::Both(ACCESS_REFUSED),
            exclusive_consumer_taken
        ),
        check!(
            "channel.basic.consume-duplicate-tag-530",
            "a second basic.consume with the same tag on a channel closes the connection with 530",
            Expect::Both("connection.close 530 NOT_ALLOWED"),
            duplicate_tag
        ),
        check!(
            "channel.queue.delete-if-empty-406",
            "queue.delete if-empty of a queue holding a message closes the channel with 406",
            Expect::Both(PRECONDITION),
            delete_if_empty
        ),
        check!(
            "channel.queue.delete-if-unused-406",
            "queue.delete if-unused of a queue with a consumer closes the channel with 406",
            Expect::Both(PRECONDITION),
            delete_if_unused
        ),
        check!(
            "channel.queue.invalid-arg-406",
            "x-max-length given as a string closes the channel with 406",
            Expect::Both(PRECONDITION),
            invalid_arg
        ),
        check!(
            "channel.queue.unknown-type-406",
            "an unknown x-queue-type closes the channel with 406",
            Expect::Both(PRECONDITION),
            unknown_queue_type
        ),
        check!(
            "channel.tx.commit-not-transactional-406",
            "tx.commit without tx.select closes the channel with 406",
            Expect::Both(PRECONDITION),
            commit_not_transactional
        ),
        check!(
            "channel.confirm.select-after-tx-406",
            "confirm.select on a transactional channel closes the channel with 406",
            Expect::Both(PRECONDITION),
            confirm_after_tx
        ),
        check!(
            "channel.exchange.unknown-type",
            "exchange.declare of an unknown type: 3.10 closes the connection with 503, 4.0 the channel with 406",
            Expect::Each {
                v3_10: Some("connection.close 503 COMMAND_INVALID"),
                v4_0: Some(PRECONDITION),
            },
            unknown_exchange_type
        ),
        check!(
            "channel.server-method-from-client-503",
            "a client sending basic.deliver (a server's method) closes the connection with 503",
            Expect::Both("connection.close 503 COMMAND_INVALID"),
            server_method_from_client
        ),
    ]
}

pub(crate) fn queue(name: &str) -> QueueDeclare {
    QueueDeclare {
        queue: name.into(),
        ..Default::default()
    }
}

fn exchange(name: &str, kind: &str) -> ExchangeDeclare {
    ExchangeDeclare {
        exchange: name.into(),
        kind: kind.into(),
        ..Default::default()
    }
}

async fn passive_missing_queue(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = QueueDeclare {
        passive: true,
        ..queue(&cx.name("missing"))
    };
    answer(w.call(1, q).await)
}

async fn passive_missing_exchange(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let x = ExchangeDeclare {
        passive: true,
        ..exchange(&cx.name("missing"), "direct")
    };
    answer(w.call(1, x).await)
}

async fn bind_missing_exchange(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    let bind = QueueBind {
        queue: q.as_str().into(),
        exchange: cx.name("missing").as_str().into(),
        routing_key: "k".into(),
        ..Default::default()
    };
    answer(w.call(1, bind).await)
}

async fn consume_missing_queue(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let consume = BasicConsume {
        queue: cx.name("missing").as_str().into(),
        ..Default::default()
    };
    answer(w.call(1, consume).await)
}

async fn publish_missing_exchange(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    w.publish(1, &cx.name("missing"), "k", false, BasicProperties::default(), b"x")
        .await?;
    answer(w.next_on(1).await.map(|m| m.method))
}

async fn redeclare_other_args(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    let first = QueueDeclare {
        arguments: args([("x-max-length", FieldValue::I32(10))]),
        ..queue(&q)
    };
    w.call(1, first).await?;
    let second = QueueDeclare {
        arguments: args([("x-max-length", FieldValue::I32(20))]),
        ..queue(&q)
    };
    answer(w.call(1, second).await)
}

async fn redeclare_other_durable(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    let second = QueueDeclare {
        durable: true,
        ..queue(&q)
    };
    answer(w.call(1, second).await)
}

async fn redeclare_other_type(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let x = cx.exchange("x");
    w.call(1, exchange(&x, "direct")).await?;
    answer(w.call(1, exchange(&x, "fanout")).await)
}

async fn exchange_amq_prefix(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let name = format!("amq.{}", cx.exchange("x"));
    answer(w.call(1, exchange(&name, "direct")).await)
}

async fn queue_amq_prefix(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let name = format!("amq.{}", cx.queue("q"));
    answer(w.call(1, queue(&name)).await)
}

async fn delete_default_exchange(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    answer(w.call(1, ExchangeDelete::default()).await)
}

/// Sends `method` (which has no reply) and reports the close it causes,
/// or the reply to a passive declare of a queue that is there if none.
async fn settle_then_probe(w: &mut Wire, q: &str, method: impl Into<Method>) -> Step<Obs> {
    w.send(1, method).await?;
    let probe = QueueDeclare {
        passive: true,
        ..queue(q)
    };
    answer(w.call(1, probe).await)
}

async fn ack_unknown_tag(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    settle_then_probe(
        &mut w,
        &q,
        BasicAck {
            delivery_tag: 99,
            multiple: false,
        },
    )
    .await
}

/// Publishes `n` messages to `q` through the default exchange and waits
/// until a passive declare counts them (the publishes are asynchronous).
pub(crate) async fn fill(w: &mut Wire, ch: u16, q: &str, n: u32) -> Step<()> {
    for i in 0..n {
        w.publish(
            ch,
            "",
            q,
            false,
            BasicProperties::default(),
            format!("m{}", i + 1).as_bytes(),
        )
        .await?;
    }
    for _ in 0..100 {
        let probe = QueueDeclare {
            passive: true,
            ..queue(q)
        };
        if let Method::QueueDeclareOk(ok) = w.call(ch, probe).await? {
            if ok.message_count >= n {
                return Ok(());
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Err(Got::saw(format!("{n} published messages never counted in the queue")))
}

/// `basic.get` with acks: its delivery tag, or what came instead.
pub(crate) async fn get(w: &mut Wire, ch: u16, q: &str) -> Step<Option<super::wire::In>> {
    w.send(
        ch,
        BasicGet {
            queue: q.into(),
            ..Default::default()
        },
    )
    .await?;
    let m = w.next_on(ch).await?;
    match m.method {
        Method::BasicGetOk(_) => Ok(Some(m)),
        Method::BasicGetEmpty(_) => Ok(None),
        other => Err(Got::saw(format!("{} instead of basic.get-ok", other.name()))),
    }
}

pub(crate) fn tag_of(m: &super::wire::In) -> u64 {
    match &m.method {
        Method::BasicGetOk(g) => g.delivery_tag,
        Method::BasicDeliver(d) => d.delivery_tag,
        _ => 0,
    }
}

async fn ack_twice(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    fill(&mut w, 1, &q, 1).await?;
    let m = get(&mut w, 1, &q).await?.ok_or_else(|| Got::saw("basic.get-empty"))?;
    let ack = BasicAck {
        delivery_tag: tag_of(&m),
        multiple: false,
    };
    w.send(1, ack.clone()).await?;
    settle_then_probe(&mut w, &q, ack).await
}

async fn reopen_after_close(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let missing = QueueDeclare {
        passive: true,
        ..queue(&cx.name("missing"))
    };
    let first = answer(w.call(1, missing).await)?;
    let mut steps = vec![first.summary];
    let reopened = answer(w.call(1, ChannelOpen::default()).await)?;
    let ok = reopened.summary == "channel.open-ok";
    steps.push(reopened.summary);
    if ok {
        let q = cx.queue("q");
        steps.push(answer(w.call(1, queue(&q)).await)?.summary);
    }
    Ok(Obs::new(steps.join(", then ")))
}

async fn exclusive_other_connection(cx: Ctx) -> Step<Obs> {
    let mut owner = cx.channel().await?;
    let q = cx.queue("q");
    let exclusive = QueueDeclare {
        exclusive: true,
        ..queue(&q)
    };
    owner.call(1, exclusive).await?;
    let mut other = cx.channel().await?;
    let obs = answer(other.call(1, queue(&q)).await);
    owner.close().await;
    obs
}

async fn exclusive_consumer_taken(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    let exclusive = BasicConsume {
        queue: q.as_str().into(),
        consumer_tag: "first".into(),
        exclusive: true,
        ..Default::default()
    };
    w.call(1, exclusive).await?;
    let mut other = cx.channel().await?;
    let second = BasicConsume {
        queue: q.as_str().into(),
        consumer_tag: "second".into(),
        ..Default::default()
    };
    let obs = answer(other.call(1, second).await);
    w.close().await;
    obs
}

async fn duplicate_tag(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    let consume = BasicConsume {
        queue: q.as_str().into(),
        consumer_tag: "same".into(),
        ..Default::default()
    };
    w.call(1, consume.clone()).await?;
    answer(w.call(1, consume).await)
}

async fn delete_if_empty(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    fill(&mut w, 1, &q, 1).await?;
    let delete = QueueDelete {
        queue: q.as_str().into(),
        if_empty: true,
        ..Default::default()
    };
    answer(w.call(1, delete).await)
}

async fn delete_if_unused(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    let consume = BasicConsume {
        queue: q.as_str().into(),
        consumer_tag: "c".into(),
        ..Default::default()
    };
    w.call(1, consume).await?;
    w.open_channel(2).await?;
    let delete = QueueDelete {
        queue: q.as_str().into(),
        if_unused: true,
        ..Default::default()
    };
    answer(w.call(2, delete).await)
}

async fn invalid_arg(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = QueueDeclare {
        arguments: args([("x-max-length", FieldValue::from("ten"))]),
        ..queue(&cx.queue("q"))
    };
    answer(w.call(1, q).await)
}

async fn unknown_queue_type(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = QueueDeclare {
        durable: true,
        arguments: args([("x-queue-type", FieldValue::from("acemq-no-such-type"))]),
        ..queue(&cx.queue("q"))
    };
    answer(w.call(1, q).await)
}

async fn commit_not_transactional(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    answer(w.call(1, TxCommit {}).await)
}

async fn confirm_after_tx(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    w.call(1, TxSelect {}).await?;
    answer(w.call(1, ConfirmSelect::default()).await)
}

async fn unknown_exchange_type(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    answer(w.call(1, exchange(&cx.exchange("x"), "acemq-no-such-type")).await)
}

async fn server_method_from_client(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let deliver = BasicDeliver {
        consumer_tag: "c".into(),
        delivery_tag: 1,
        redelivered: false,
        exchange: "".into(),
        routing_key: "k".into(),
    };
    // basic.deliver carries content: header and body follow.
    let mut out = bytes::BytesMut::new();
    let _ = acemq_codec::encode_content(1, &deliver.into(), &BasicProperties::default(), b"x", 4096, &mut out);
    w.send_bytes(&out).await?;
    answer(w.next_any().await.map(|m| m.method))
}
