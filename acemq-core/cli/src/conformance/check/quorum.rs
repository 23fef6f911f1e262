//! Quorum queues: what they refuse, `x-delivery-count`, delivery limits.
//! On a broker that refuses `x-queue-type: quorum` every check here is
//! not applicable.

use acemq_codec::{BasicReject, FieldValue, QueueDeclare};

use super::channel::{fill, get, queue, tag_of};
use super::dead_letter::{arrival, deaths};
use super::wire::Wire;
use super::{answer, args, check, Check, Ctx, Expect, Got, Obs, Step};

const PRECONDITION: &str = "channel.close 406 PRECONDITION_FAILED";

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "quorum.exclusive-refused-406",
            "an exclusive quorum queue is refused with 406",
            Expect::Both(PRECONDITION),
            exclusive
        ),
        check!(
            "quorum.non-durable-refused-406",
            "a non-durable quorum queue is refused with 406",
            Expect::Both(PRECONDITION),
            non_durable
        ),
        check!(
            "quorum.auto-delete-refused-406",
            "an auto-delete quorum queue is refused with 406",
            Expect::Both(PRECONDITION),
            auto_delete
        ),
        check!(
            "quorum.max-priority-refused-406",
            "x-max-priority on a quorum queue is refused with 406",
            Expect::Both(PRECONDITION),
            max_priority
        ),
        check!(
            "quorum.global-qos-540",
            "basic.consume from a quorum queue under a global basic.qos closes the connection with 540",
            Expect::Both("connection.close 540 NOT_IMPLEMENTED"),
            global_qos
        ),
        check!(
            "quorum.delivery-count-first-get",
            "x-delivery-count on a message's first basic.get: 0 on 3.10, absent on 4.0",
            Expect::Each {
                v3_10: Some("x-delivery-count 0"),
                v4_0: Some("no x-delivery-count"),
            },
            delivery_count_first
        ),
        check!(
            "quorum.delivery-count-after-return",
            "a message returned once (reject requeue=true) comes back with x-delivery-count 1",
            Expect::Both("x-delivery-count 1, redelivered"),
            delivery_count_after_return
        ),
        check!(
            "quorum.default-delivery-limit",
            "without x-delivery-limit: 4.0 drops a message after 20 returns, 3.10 keeps it",
            Expect::Each {
                v3_10: Some("still there after 25 returns"),
                v4_0: Some("gone after 21 returns"),
            },
            default_delivery_limit
        ),
        check!(
            "quorum.delivery-limit-dead-letter",
            "past x-delivery-limit 1 the message is dead-lettered with reason delivery_limit",
            Expect::Both(
                "x-death [reason=delivery_limit count=1 queue=<source> exchange=\"\" routing-keys=[<source>]]; \
                 x-first-death reason=delivery_limit queue=<source> exchange=\"\""
            ),
            delivery_limit_dead_letter
        ),
    ]
}

fn quorum(name: &str) -> QueueDeclare {
    QueueDeclare {
        durable: true,
        arguments: args([("x-queue-type", FieldValue::from("quorum"))]),
        ..queue(name)
    }
}

/// A connection with channel 1 open on a broker that has quorum queues
/// (else the check is not applicable).
async fn with_quorum(cx: &Ctx) -> Step<Wire> {
    let mut w = cx.channel().await?;
    match w.call(1, quorum(&cx.queue("probe"))).await {
        Ok(_) => Ok(w),
        Err(Got::Saw(o)) => Err(Got::NotApplicable(format!(
            "the broker refuses x-queue-type quorum: {}{}",
            o.summary,
            o.text.map(|t| format!(" ({t})")).unwrap_or_default()
        ))),
        Err(other) => Err(other),
    }
}

async fn refused(cx: Ctx, change: fn(QueueDeclare) -> QueueDeclare) -> Step<Obs> {
    let mut w = with_quorum(&cx).await?;
    let q = change(quorum(&cx.queue("q")));
    answer(w.call(1, q).await)
}

async fn exclusive(cx: Ctx) -> Step<Obs> {
    refused(cx, |q| QueueDeclare { exclusive: true, ..q }).await
}

async fn non_durable(cx: Ctx) -> Step<Obs> {
    refused(cx, |q| QueueDeclare { durable: false, ..q }).await
}

async fn auto_delete(cx: Ctx) -> Step<Obs> {
    refused(cx, |q| QueueDeclare { auto_delete: true, ..q }).await
}

async fn max_priority(cx: Ctx) -> Step<Obs> {
    refused(cx, |mut q| {
        q.arguments.push("x-max-priority", FieldValue::I32(5));
        q
    })
    .await
}

async fn global_qos(cx: Ctx) -> Step<Obs> {
    let mut w = with_quorum(&cx).await?;
    let q = cx.queue("q");
    w.call(1, quorum(&q)).await?;
    w.call(
        1,
        acemq_codec::BasicQos {
            prefetch_count: 10,
            global: true,
            ..Default::default()
        },
    )
    .await?;
    let consume = acemq_codec::BasicConsume {
        queue: q.as_str().into(),
        ..Default::default()
    };
    answer(w.call(1, consume).await)
}

fn delivery_count(m: &super::wire::In) -> String {
    match m.headers().and_then(|h| h.get("x-delivery-count")) {
        None => "no x-delivery-count".into(),
        Some(v) => format!(
            "x-delivery-count {}",
            v.as_i64().map_or_else(|| format!("{v:?}"), |n| n.to_string())
        ),
    }
}

async fn delivery_count_first(cx: Ctx) -> Step<Obs> {
    let mut w = with_quorum(&cx).await?;
    let q = cx.queue("q");
    w.call(1, quorum(&q)).await?;
    fill(&mut w, 1, &q, 1).await?;
    let m = get(&mut w, 1, &q).await?.ok_or_else(|| Got::saw("basic.get-empty"))?;
    Ok(Obs::new(delivery_count(&m)))
}

async fn give_back(w: &mut Wire, m: &super::wire::In) -> Step<()> {
    w.send(
        1,
        BasicReject {
            delivery_tag: tag_of(m),
            requeue: true,
        },
    )
    .await
}

async fn delivery_count_after_return(cx: Ctx) -> Step<Obs> {
    let mut w = with_quorum(&cx).await?;
    let q = cx.queue("q");
    w.call(1, quorum(&q)).await?;
    fill(&mut w, 1, &q, 1).await?;
    let m = get(&mut w, 1, &q).await?.ok_or_else(|| Got::saw("basic.get-empty"))?;
    give_back(&mut w, &m).await?;
    let m = arrival(&mut w, 1, &q).await?;
    let redelivered = matches!(&m.method, acemq_codec::Method::BasicGetOk(g) if g.redelivered);
    Ok(Obs::new(format!(
        "{}, {}",
        delivery_count(&m),
        if redelivered { "redelivered" } else { "not redelivered" }
    )))
}

async fn default_delivery_limit(cx: Ctx) -> Step<Obs> {
    let mut w = with_quorum(&cx).await?;
    let q = cx.queue("q");
    w.call(1, quorum(&q)).await?;
    fill(&mut w, 1, &q, 1).await?;
    for returns in 0..=25 {
        // A returned message may take a moment to be back.
        let mut m = None;
        for _ in 0..10 {
            m = get(&mut w, 1, &q).await?;
            if m.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let Some(m) = m else {
            return Ok(Obs::new(format!("gone after {returns} returns")));
        };
        if returns == 25 {
            break;
        }
        give_back(&mut w, &m).await?;
    }
    Ok(Obs::new("still there after 25 returns"))
}

async fn delivery_limit_dead_letter(cx: Ctx) -> Step<Obs> {
    let mut w = with_quorum(&cx).await?;
    let dlq = cx.queue("dlq");
    let src = cx.queue("source");
    w.call(1, queue(&dlq)).await?;
    let mut declare = quorum(&src);
    declare.arguments.push("x-delivery-limit", FieldValue::I32(1));
    declare.arguments.push("x-dead-letter-exchange", FieldValue::from(""));
    declare
        .arguments
        .push("x-dead-letter-routing-key", FieldValue::from(dlq.as_str()));
    w.call(1, declare).await?;
    fill(&mut w, 1, &src, 1).await?;
    for _ in 0..5 {
        let mut m = None;
        for _ in 0..10 {
            m = get(&mut w, 1, &src).await?;
            if m.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        match m {
            Some(m) => give_back(&mut w, &m).await?,
            None => break,
        }
    }
    let m = arrival(&mut w, 1, &dlq).await?;
    Ok(Obs::new(deaths(m.headers(), &[(&src, "<source>")])))
}
