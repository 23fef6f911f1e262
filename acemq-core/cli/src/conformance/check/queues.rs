//! Queues: server-named queues, lifetimes (exclusive, auto-delete,
//! x-expires), TTLs, x-max-length, and the counts in the replies.

use std::time::Duration;

use acemq_codec::{
    BasicCancel, BasicConsume, BasicProperties, FieldValue, Method, QueueDeclare, QueueDelete, QueuePurge,
};

use super::channel::{fill, get, queue};
use super::wire::In;
use super::{answer, args, check, Check, Ctx, Expect, Got, Obs, Step};

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "queues.server-named",
            "queue.declare with an empty name gets a server-named amq.gen-* queue",
            Expect::Both("queue.declare-ok with an amq.gen- name"),
            server_named
        ),
        check!(
            "queues.exclusive-deleted-on-close",
            "an exclusive queue is deleted when its connection closes",
            Expect::Both("channel.close 404 NOT_FOUND"),
            exclusive_deleted
        ),
        check!(
            "queues.auto-delete-after-last-consumer",
            "an auto-delete queue is deleted when its last consumer is cancelled",
            Expect::Both("channel.close 404 NOT_FOUND"),
            auto_delete
        ),
        check!(
            "queues.x-expires",
            "a queue unused for its x-expires (100 ms) is deleted",
            Expect::Both("channel.close 404 NOT_FOUND"),
            x_expires
        ),
        check!(
            "queues.message-ttl",
            "a message older than the queue's x-message-ttl is not delivered",
            Expect::Both("basic.get-empty"),
            message_ttl
        ),
        check!(
            "queues.message-expiration",
            "a message older than its expiration property is not delivered",
            Expect::Both("basic.get-empty"),
            message_expiration
        ),
        check!(
            "queues.max-length-drop-head",
            "x-max-length 2 with three messages drops the oldest",
            Expect::Both("m2, m3"),
            max_length
        ),
        check!(
            "queues.declare-ok-counts",
            "queue.declare-ok counts the ready messages (not the unacked one) and the consumers",
            Expect::Both("queue.declare-ok messages=1 consumers=1"),
            declare_ok_counts
        ),
        check!(
            "queues.purge-ok-count",
            "queue.purge-ok counts the messages purged",
            Expect::Both("queue.purge-ok messages=3"),
            purge_count
        ),
        check!(
            "queues.delete-ok-count",
            "queue.delete-ok counts the messages deleted with the queue",
            Expect::Both("queue.delete-ok messages=2"),
            delete_count
        ),
        check!(
            "queues.get-empty",
            "basic.get on an empty queue is answered with basic.get-empty",
            Expect::Both("basic.get-empty"),
            get_empty
        ),
        check!(
            "queues.get-ok-message-count",
            "basic.get-ok counts the messages left behind it",
            Expect::Both("basic.get-ok message_count=1"),
            get_ok_count
        ),
    ]
}

fn passive(name: &str) -> QueueDeclare {
    QueueDeclare {
        passive: true,
        ..queue(name)
    }
}

async fn server_named(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let declare = QueueDeclare {
        exclusive: true,
        ..queue("")
    };
    Ok(match w.call(1, declare).await {
        Ok(Method::QueueDeclareOk(ok)) if ok.queue.as_bytes().starts_with(b"amq.gen-") => {
            Obs::new("queue.declare-ok with an amq.gen- name")
        }
        Ok(Method::QueueDeclareOk(ok)) => Obs::new(format!("queue.declare-ok named {:?}", ok.queue.to_string_lossy())),
        other => answer(other)?,
    })
}

async fn exclusive_deleted(cx: Ctx) -> Step<Obs> {
    let q = cx.queue("q");
    let mut owner = cx.channel().await?;
    owner
        .call(
            1,
            QueueDeclare {
                exclusive: true,
                ..queue(&q)
            },
        )
        .await?;
    owner.close().await;
    let mut w = cx.channel().await?;
    // RabbitMQ deletes it as the connection goes: allow it a moment.
    for ch in 1..20u16 {
        if ch > 1 {
            w.open_channel(ch).await?;
        }
        let obs = answer(w.call(ch, passive(&q)).await)?;
        if obs.summary != "queue.declare-ok" {
            return Ok(obs);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Obs::new(
        "queue.declare-ok (still there 2 s after its connection closed)",
    ))
}

async fn auto_delete(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(
        1,
        QueueDeclare {
            auto_delete: true,
            ..queue(&q)
        },
    )
    .await?;
    let consume = BasicConsume {
        queue: q.as_str().into(),
        consumer_tag: "c".into(),
        ..Default::default()
    };
    w.call(1, consume).await?;
    w.call(
        1,
        BasicCancel {
            consumer_tag: "c".into(),
            no_wait: false,
        },
    )
    .await?;
    for ch in 2..20u16 {
        w.open_channel(ch).await?;
        let obs = answer(w.call(ch, passive(&q)).await)?;
        if obs.summary != "queue.declare-ok" {
            return Ok(obs);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Obs::new(
        "queue.declare-ok (still there 2 s after its last consumer went)",
    ))
}

async fn x_expires(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    let declare = QueueDeclare {
        arguments: args([("x-expires", FieldValue::I32(100))]),
        ..queue(&q)
    };
    w.call(1, declare).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    answer(w.call(1, passive(&q)).await)
}

async fn message_ttl(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    let declare = QueueDeclare {
        arguments: args([("x-message-ttl", FieldValue::I32(50))]),
        ..queue(&q)
    };
    w.call(1, declare).await?;
    w.publish(1, "", &q, false, BasicProperties::default(), b"m1").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    answer(get_method(&mut w, &q).await)
}

async fn get_method(w: &mut super::wire::Wire, q: &str) -> Step<Method> {
    match get(w, 1, q).await? {
        Some(m) => Ok(m.method),
        None => Ok(Method::BasicGetEmpty(Default::default())),
    }
}

async fn message_expiration(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    let props = BasicProperties {
        expiration: Some("50".into()),
        ..Default::default()
    };
    w.publish(1, "", &q, false, props, b"m1").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    answer(get_method(&mut w, &q).await)
}

async fn max_length(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    let declare = QueueDeclare {
        arguments: args([("x-max-length", FieldValue::I32(2))]),
        ..queue(&q)
    };
    w.call(1, declare).await?;
    for body in ["m1", "m2", "m3"] {
        w.publish(1, "", &q, false, BasicProperties::default(), body.as_bytes())
            .await?;
    }
    // Wait until the publishes are in (a passive declare is answered after them).
    w.call(1, passive(&q)).await?;
    let mut bodies = Vec::new();
    while let Some(m) = get(&mut w, 1, &q).await? {
        bodies.push(
            m.content
                .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default(),
        );
        if bodies.len() > 3 {
            break;
        }
    }
    Ok(Obs::new(bodies.join(", ")))
}

async fn declare_ok_counts(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    fill(&mut w, 1, &q, 2).await?;
    w.open_channel(2).await?;
    w.call(
        2,
        acemq_codec::BasicQos {
            prefetch_count: 1,
            ..Default::default()
        },
    )
    .await?;
    let consume = BasicConsume {
        queue: q.as_str().into(),
        consumer_tag: "c".into(),
        ..Default::default()
    };
    w.call(2, consume).await?;
    // One message goes to the consumer (prefetch 1); one stays ready.
    w.next_on(2).await?;
    let mut last = Obs::new("no reply");
    for _ in 0..20 {
        last = match w.call(1, passive(&q)).await {
            Ok(Method::QueueDeclareOk(ok)) => Obs::new(format!(
                "queue.declare-ok messages={} consumers={}",
                ok.message_count, ok.consumer_count
            )),
            other => return answer(other),
        };
        if last.summary.ends_with("messages=1 consumers=1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(last)
}

async fn purge_count(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    fill(&mut w, 1, &q, 3).await?;
    let purge = QueuePurge {
        queue: q.as_str().into(),
        ..Default::default()
    };
    Ok(match w.call(1, purge).await {
        Ok(Method::QueuePurgeOk(ok)) => Obs::new(format!("queue.purge-ok messages={}", ok.message_count)),
        other => answer(other)?,
    })
}

async fn delete_count(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    fill(&mut w, 1, &q, 2).await?;
    let delete = QueueDelete {
        queue: q.as_str().into(),
        ..Default::default()
    };
    Ok(match w.call(1, delete).await {
        Ok(Method::QueueDeleteOk(ok)) => Obs::new(format!("queue.delete-ok messages={}", ok.message_count)),
        other => answer(other)?,
    })
}

async fn get_empty(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    answer(get_method(&mut w, &q).await)
}

async fn get_ok_count(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    fill(&mut w, 1, &q, 2).await?;
    match get(&mut w, 1, &q).await? {
        Some(In {
            method: Method::BasicGetOk(ok),
            ..
        }) => Ok(Obs::new(format!("basic.get-ok message_count={}", ok.message_count))),
        Some(m) => Ok(Obs::new(m.method.name())),
        None => Err(Got::saw("basic.get-empty")),
    }
}
