//! Stream queues: what consuming one needs (prefetch, manual acks), what
//! it refuses, `x-stream-offset`, settling a stream delivery. On a broker
//! that refuses `x-queue-type: stream` every check here is not applicable.

use std::time::Duration;

use acemq_codec::{
    BasicConsume, BasicNack, BasicProperties, BasicQos, ConfirmSelect, FieldValue, Method, QueueDeclare,
};

use super::channel::queue;
use super::wire::{In, Wire};
use super::{answer, args, check, Check, Ctx, Expect, Got, Obs, Step};

const PRECONDITION: &str = "channel.close 406 PRECONDITION_FAILED";
const NOT_IMPLEMENTED: &str = "connection.close 540 NOT_IMPLEMENTED";

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "stream.exclusive-refused-406",
            "an exclusive stream is refused with 406",
            Expect::Both(PRECONDITION),
            exclusive
        ),
        check!(
            "stream.consume-without-prefetch-406",
            "basic.consume from a stream without basic.qos is refused with 406",
            Expect::Both(PRECONDITION),
            consume_without_prefetch
        ),
        check!(
            "stream.consume-no-ack-540",
            "basic.consume from a stream with no-ack closes the connection with 540",
            Expect::Both(NOT_IMPLEMENTED),
            consume_no_ack
        ),
        check!(
            "stream.get-540",
            "basic.get from a stream closes the connection with 540",
            Expect::Both(NOT_IMPLEMENTED),
            get_refused
        ),
        check!(
            "stream.purge-540",
            "queue.purge of a stream closes the connection with 540",
            Expect::Both(NOT_IMPLEMENTED),
            purge
        ),
        check!(
            "stream.global-qos-540",
            "basic.consume from a stream under a global basic.qos closes the connection with 540",
            Expect::Both(NOT_IMPLEMENTED),
            global_qos
        ),
        check!(
            "stream.offset-first",
            "x-stream-offset first delivers the stream from its start, each with its x-stream-offset",
            Expect::Both("m1 at x-stream-offset 0, m2 at x-stream-offset 1"),
            offset_first
        ),
        check!(
            "stream.offset-next",
            "x-stream-offset next delivers only what is published after the consume",
            Expect::Both("first delivery m2"),
            offset_next
        ),
        check!(
            "stream.nack",
            "basic.nack of a stream delivery: 3.10 closes the connection with 540, 4.0 takes it as an ack",
            Expect::Each {
                v3_10: Some("connection.close 540 NOT_IMPLEMENTED"),
                v4_0: Some("nack taken, no error within 1.5 s"),
            },
            nack
        ),
        check!(
            "stream.delivery-mode",
            "a stream message published without delivery_mode: 3.10 gives none back, 4.0 gives 1",
            Expect::Each {
                v3_10: Some("delivery_mode absent"),
                v4_0: Some("delivery_mode 1"),
            },
            delivery_mode
        ),
    ]
}

fn stream(name: &str) -> QueueDeclare {
    QueueDeclare {
        durable: true,
        arguments: args([("x-queue-type", FieldValue::from("stream"))]),
        ..queue(name)
    }
}

/// Channel 1 open and a stream declared (else not applicable).
async fn with_stream(cx: &Ctx) -> Step<(Wire, String)> {
    let mut w = cx.channel().await?;
    let q = cx.queue("stream");
    match w.call(1, stream(&q)).await {
        Ok(_) => Ok((w, q)),
        Err(Got::Saw(o)) => Err(Got::NotApplicable(format!(
            "the broker refuses x-queue-type stream: {}{}",
            o.summary,
            o.text.map(|t| format!(" ({t})")).unwrap_or_default()
        ))),
        Err(other) => Err(other),
    }
}

/// Publishes `bodies` to `q` on a confirming channel 2 and waits for their acks.
async fn publish_confirmed(w: &mut Wire, q: &str, bodies: &[&str], props: BasicProperties) -> Step<()> {
    w.open_channel(2).await?;
    w.call(2, ConfirmSelect::default()).await?;
    for body in bodies {
        w.publish(2, "", q, false, props.clone(), body.as_bytes()).await?;
    }
    let mut confirmed = 0u64;
    while confirmed < bodies.len() as u64 {
        match w.next_on(2).await?.method {
            Method::BasicAck(a) => confirmed = confirmed.max(a.delivery_tag),
            other => return Err(Got::saw(format!("{} while publishing to the stream", other.name()))),
        }
    }
    Ok(())
}

async fn subscribe(w: &mut Wire, q: &str, offset: &str) -> Step<()> {
    w.call(
        1,
        BasicQos {
            prefetch_count: 10,
            ..Default::default()
        },
    )
    .await?;
    let consume = BasicConsume {
        queue: q.into(),
        consumer_tag: "c".into(),
        arguments: args([("x-stream-offset", FieldValue::from(offset))]),
        ..Default::default()
    };
    w.call(1, consume).await?;
    Ok(())
}

async fn delivery(w: &mut Wire) -> Step<In> {
    let m = w.next_on(1).await?;
    if matches!(m.method, Method::BasicDeliver(_)) {
        Ok(m)
    } else {
        Err(Got::saw(format!("{} instead of basic.deliver", m.method.name())))
    }
}

fn body(m: &In) -> String {
    m.content
        .as_ref()
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

async fn exclusive(cx: Ctx) -> Step<Obs> {
    let (mut w, _) = with_stream(&cx).await?;
    let q = QueueDeclare {
        exclusive: true,
        ..stream(&cx.queue("q"))
    };
    answer(w.call(1, q).await)
}

async fn consume_without_prefetch(cx: Ctx) -> Step<Obs> {
    let (mut w, q) = with_stream(&cx).await?;
    let consume = BasicConsume {
        queue: q.as_str().into(),
        ..Default::default()
    };
    answer(w.call(1, consume).await)
}

async fn consume_no_ack(cx: Ctx) -> Step<Obs> {
    let (mut w, q) = with_stream(&cx).await?;
    w.call(
        1,
        BasicQos {
            prefetch_count: 10,
            ..Default::default()
        },
    )
    .await?;
    let consume = BasicConsume {
        queue: q.as_str().into(),
        no_ack: true,
        ..Default::default()
    };
    answer(w.call(1, consume).await)
}

async fn get_refused(cx: Ctx) -> Step<Obs> {
    let (mut w, q) = with_stream(&cx).await?;
    let get = acemq_codec::BasicGet {
        queue: q.as_str().into(),
        ..Default::default()
    };
    answer(w.call(1, get).await)
}

async fn purge(cx: Ctx) -> Step<Obs> {
    let (mut w, q) = with_stream(&cx).await?;
    let purge = acemq_codec::QueuePurge {
        queue: q.as_str().into(),
        ..Default::default()
    };
    answer(w.call(1, purge).await)
}

async fn global_qos(cx: Ctx) -> Step<Obs> {
    let (mut w, q) = with_stream(&cx).await?;
    // A consumer prefetch (without one a stream refuses with 406 first),
    // and a global one on top.
    for global in [false, true] {
        w.call(
            1,
            BasicQos {
                prefetch_count: 10,
                global,
                ..Default::default()
            },
        )
        .await?;
    }
    let consume = BasicConsume {
        queue: q.as_str().into(),
        ..Default::default()
    };
    answer(w.call(1, consume).await)
}

async fn offset_first(cx: Ctx) -> Step<Obs> {
    let (mut w, q) = with_stream(&cx).await?;
    publish_confirmed(&mut w, &q, &["m1", "m2"], BasicProperties::default()).await?;
    subscribe(&mut w, &q, "first").await?;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let m = delivery(&mut w).await?;
        let offset = m
            .headers()
            .and_then(|h| h.get("x-stream-offset"))
            .and_then(FieldValue::as_i64)
            .map_or_else(|| "no x-stream-offset".to_string(), |o| format!("x-stream-offset {o}"));
        seen.push(format!("{} at {offset}", body(&m)));
    }
    Ok(Obs::new(seen.join(", ")))
}

async fn offset_next(cx: Ctx) -> Step<Obs> {
    let (mut w, q) = with_stream(&cx).await?;
    publish_confirmed(&mut w, &q, &["m1"], BasicProperties::default()).await?;
    subscribe(&mut w, &q, "next").await?;
    // The consumer attaches asynchronously on RabbitMQ: give it a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.publish(2, "", &q, false, BasicProperties::default(), b"m2").await?;
    let m = delivery(&mut w).await?;
    Ok(Obs::new(format!("first delivery {}", body(&m))))
}

async fn nack(cx: Ctx) -> Step<Obs> {
    let (mut w, q) = with_stream(&cx).await?;
    publish_confirmed(&mut w, &q, &["m1", "m2"], BasicProperties::default()).await?;
    w.call(
        1,
        BasicQos {
            prefetch_count: 1,
            ..Default::default()
        },
    )
    .await?;
    let consume = BasicConsume {
        queue: q.as_str().into(),
        consumer_tag: "c".into(),
        arguments: args([("x-stream-offset", FieldValue::from("first"))]),
        ..Default::default()
    };
    w.call(1, consume).await?;
    let first = delivery(&mut w).await?;
    let tag = super::channel::tag_of(&first);
    w.send(
        1,
        BasicNack {
            delivery_tag: tag,
            multiple: false,
            requeue: true,
        },
    )
    .await?;
    // Stream deliveries come a chunk at a time, whatever the prefetch:
    // what matters is whether the broker objects within a second and a half.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    loop {
        match tokio::time::timeout_at(deadline, w.next_any()).await {
            Err(_) => return Ok(Obs::new("nack taken, no error within 1.5 s")),
            Ok(Ok(_)) => {}
            Ok(Err(Got::Saw(o))) => return Ok(o),
            Ok(Err(other)) => return Err(other),
        }
    }
}

async fn delivery_mode(cx: Ctx) -> Step<Obs> {
    let (mut w, q) = with_stream(&cx).await?;
    publish_confirmed(&mut w, &q, &["m1"], BasicProperties::default()).await?;
    subscribe(&mut w, &q, "first").await?;
    let m = delivery(&mut w).await?;
    Ok(Obs::new(match m.content.as_ref().and_then(|(p, _)| p.delivery_mode) {
        None => "delivery_mode absent".to_string(),
        Some(d) => format!("delivery_mode {d}"),
    }))
}
