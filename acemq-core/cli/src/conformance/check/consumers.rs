//! Consumers: cancel notifications, prefetch, redelivery, recover,
//! server-named tags.

use std::time::Duration;

use acemq_codec::{BasicAck, BasicCancel, BasicConsume, BasicQos, BasicRecover, ChannelClose, Method, QueueDelete};

use super::channel::{fill, get, queue, tag_of};
use super::wire::{Hello, In, Wire};
use super::{answer, check, Check, Ctx, Expect, Got, Obs, Step};

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "consumers.cancel-notify-on-delete",
            "a client with consumer_cancel_notify gets basic.cancel when its queue is deleted",
            Expect::Both("basic.cancel for the consumer's tag"),
            cancel_notify
        ),
        check!(
            "consumers.no-cancel-without-capability",
            "a client without consumer_cancel_notify gets no basic.cancel when its queue is deleted",
            Expect::Both("nothing within 500 ms"),
            no_cancel_without_capability
        ),
        check!(
            "consumers.cancel-unknown-tag",
            "basic.cancel of a tag that is not a consumer is answered with cancel-ok",
            Expect::Both("basic.cancel-ok"),
            cancel_unknown_tag
        ),
        check!(
            "consumers.server-named-tag",
            "basic.consume with an empty tag gets a server-named amq.ctag-* tag",
            Expect::Both("consume-ok with an amq.ctag- tag"),
            server_named_tag
        ),
        check!(
            "consumers.exclusive-with-consumers-403",
            "an exclusive basic.consume on a queue that has a consumer is refused with 403",
            Expect::Both("channel.close 403 ACCESS_REFUSED"),
            exclusive_with_consumers
        ),
        check!(
            "consumers.prefetch-limit",
            "with basic.qos 1 a consumer gets one message, the next only after its ack",
            Expect::Both("m1, nothing more until its ack, then m2"),
            prefetch_limit
        ),
        check!(
            "consumers.redelivered-after-channel-close",
            "an unacked delivery comes back redelivered once its channel closes",
            Expect::Both("m1 redelivered"),
            redelivered_after_close
        ),
        check!(
            "consumers.recover-requeue",
            "basic.recover requeue=true is answered with recover-ok and the message comes back redelivered",
            Expect::Both("basic.recover-ok, then m1 redelivered"),
            recover_requeue
        ),
    ]
}

fn consume(q: &str, tag: &str) -> BasicConsume {
    BasicConsume {
        queue: q.into(),
        consumer_tag: tag.into(),
        ..Default::default()
    }
}

fn body(m: &In) -> String {
    m.content
        .as_ref()
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

async fn deleted_under(cx: &Ctx, hello: Hello) -> Step<(Wire, String)> {
    let mut w = Wire::open(cx.target(), &hello).await?;
    w.open_channel(1).await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    w.call(1, consume(&q, "c")).await?;
    w.open_channel(2).await?;
    w.call(
        2,
        QueueDelete {
            queue: q.as_str().into(),
            ..Default::default()
        },
    )
    .await?;
    Ok((w, q))
}

async fn cancel_notify(cx: Ctx) -> Step<Obs> {
    let (mut w, _) = deleted_under(&cx, Hello::default()).await?;
    Ok(match w.next_on(1).await?.method {
        Method::BasicCancel(c) if c.consumer_tag.as_bytes() == b"c" => Obs::new("basic.cancel for the consumer's tag"),
        Method::BasicCancel(c) => Obs::new(format!("basic.cancel for {:?}", c.consumer_tag.to_string_lossy())),
        other => Obs::new(other.name()),
    })
}

async fn no_cancel_without_capability(cx: Ctx) -> Step<Obs> {
    let hello = Hello {
        capabilities: false,
        ..Hello::default()
    };
    let (mut w, _) = deleted_under(&cx, hello).await?;
    Ok(match w.next_within(Duration::from_millis(500)).await? {
        None => Obs::new("nothing within 500 ms"),
        Some(m) => Obs::new(m.method.name()),
    })
}

async fn cancel_unknown_tag(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let cancel = BasicCancel {
        consumer_tag: "acemq-no-such-consumer".into(),
        no_wait: false,
    };
    answer(w.call(1, cancel).await)
}

async fn server_named_tag(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    Ok(match w.call(1, consume(&q, "")).await {
        Ok(Method::BasicConsumeOk(ok)) if ok.consumer_tag.as_bytes().starts_with(b"amq.ctag-") => {
            Obs::new("consume-ok with an amq.ctag- tag")
        }
        Ok(Method::BasicConsumeOk(ok)) => {
            Obs::new(format!("consume-ok with tag {:?}", ok.consumer_tag.to_string_lossy()))
        }
        other => answer(other)?,
    })
}

async fn exclusive_with_consumers(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    w.call(1, consume(&q, "first")).await?;
    w.open_channel(2).await?;
    let exclusive = BasicConsume {
        exclusive: true,
        ..consume(&q, "second")
    };
    answer(w.call(2, exclusive).await)
}

async fn prefetch_limit(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    fill(&mut w, 1, &q, 2).await?;
    w.call(
        1,
        BasicQos {
            prefetch_count: 1,
            ..Default::default()
        },
    )
    .await?;
    w.call(1, consume(&q, "c")).await?;
    let first = w.next_on(1).await?;
    let mut steps = vec![body(&first)];
    match w.next_within(Duration::from_millis(300)).await? {
        None => steps.push("nothing more until its ack".into()),
        Some(m) => steps.push(format!("then {} before any ack", body(&m))),
    }
    w.send(
        1,
        BasicAck {
            delivery_tag: tag_of(&first),
            multiple: false,
        },
    )
    .await?;
    if steps[1].starts_with("nothing") {
        let second = w.next_on(1).await?;
        steps.push(format!("then {}", body(&second)));
    }
    Ok(Obs::new(steps.join(", ")))
}

fn redelivered(m: &In) -> bool {
    match &m.method {
        Method::BasicGetOk(g) => g.redelivered,
        Method::BasicDeliver(d) => d.redelivered,
        _ => false,
    }
}

async fn redelivered_after_close(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    fill(&mut w, 1, &q, 1).await?;
    w.call(1, consume(&q, "c")).await?;
    w.next_on(1).await?;
    let close = ChannelClose {
        reply_code: 200,
        reply_text: "bye".into(),
        class_id: 0,
        method_id: 0,
    };
    w.call(1, close).await?;
    w.open_channel(2).await?;
    let m = super::dead_letter::arrival(&mut w, 2, &q).await?;
    Ok(Obs::new(format!(
        "{} {}",
        body(&m),
        if redelivered(&m) {
            "redelivered"
        } else {
            "not redelivered"
        }
    )))
}

async fn recover_requeue(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    fill(&mut w, 1, &q, 1).await?;
    get(&mut w, 1, &q).await?.ok_or_else(|| Got::saw("basic.get-empty"))?;
    let reply = answer(w.call(1, BasicRecover { requeue: true }).await)?;
    if reply.summary != "basic.recover-ok" {
        return Ok(reply);
    }
    let m = super::dead_letter::arrival(&mut w, 1, &q).await?;
    Ok(Obs::new(format!(
        "basic.recover-ok, then {} {}",
        body(&m),
        if redelivered(&m) {
            "redelivered"
        } else {
            "not redelivered"
        }
    )))
}
