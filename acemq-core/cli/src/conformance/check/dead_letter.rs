//! Dead-lettering and the `x-death` header: reasons (rejected, expired,
//! maxlen), counts, queue, exchange, routing keys, `x-first-death-*` and
//! `x-last-death-*`.

use std::time::Duration;

use acemq_codec::{BasicNack, BasicProperties, BasicReject, FieldArray, FieldTable, FieldValue, QueueDeclare};

use super::channel::{get, queue, tag_of};
use super::wire::{In, Wire};
use super::{args, check, Check, Ctx, Expect, Got, Obs, Step};

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "dead-letter.rejected",
            "basic.reject requeue=false dead-letters with x-death reason rejected, count 1, queue, exchange, routing-keys",
            Expect::Both(
                "x-death [reason=rejected count=1 queue=<source> exchange=\"\" routing-keys=[<source>]]; \
                 x-first-death reason=rejected queue=<source> exchange=\"\""
            ),
            rejected
        ),
        check!(
            "dead-letter.nacked",
            "basic.nack requeue=false dead-letters with reason rejected",
            Expect::Both(
                "x-death [reason=rejected count=1 queue=<source> exchange=\"\" routing-keys=[<source>]]; \
                 x-first-death reason=rejected queue=<source> exchange=\"\""
            ),
            nacked
        ),
        check!(
            "dead-letter.expired-queue-ttl",
            "a message past the queue's x-message-ttl is dead-lettered with reason expired",
            Expect::Both(
                "x-death [reason=expired count=1 queue=<source> exchange=\"\" routing-keys=[<source>]]; \
                 x-first-death reason=expired queue=<source> exchange=\"\""
            ),
            expired_queue_ttl
        ),
        check!(
            "dead-letter.expired-message-ttl",
            "a message past its expiration is dead-lettered with reason expired and original-expiration, its expiration removed",
            Expect::Both(
                "x-death [reason=expired count=1 queue=<source> exchange=\"\" routing-keys=[<source>] \
                 original-expiration=10]; x-first-death reason=expired queue=<source> exchange=\"\"; \
                 expiration property absent"
            ),
            expired_message_ttl
        ),
        check!(
            "dead-letter.maxlen",
            "the head dropped by x-max-length is dead-lettered with reason maxlen",
            Expect::Both(
                "x-death [reason=maxlen count=1 queue=<source> exchange=\"\" routing-keys=[<source>]]; \
                 x-first-death reason=maxlen queue=<source> exchange=\"\"; body m1"
            ),
            maxlen
        ),
        check!(
            "dead-letter.cycle-count",
            "a message rejected around a cycle A→B→A→B: one x-death entry per queue and reason, A's count 2, newest first",
            Expect::Both(
                "x-death [reason=rejected count=2 queue=<a> exchange=\"\" routing-keys=[<a>]] \
                 [reason=rejected count=1 queue=<b> exchange=\"\" routing-keys=[<b>]]; \
                 x-first-death reason=rejected queue=<a> exchange=\"\""
            ),
            cycle_count
        ),
        check!(
            "dead-letter.cc-routing-keys",
            "x-death's routing-keys lists the routing key and the CC header's keys",
            Expect::Both("routing-keys=[<source>, cc-key]"),
            cc_routing_keys
        ),
        check!(
            "dead-letter.last-death-headers",
            "x-last-death-reason, -queue and -exchange: written by 4.0, not by 3.10",
            Expect::Each {
                v3_10: Some("no x-last-death-* headers"),
                v4_0: Some("x-last-death reason=rejected queue=<source> exchange=\"\""),
            },
            last_death_headers
        ),
    ]
}

/// A dead-letter queue and a source queue dead-lettering into it through
/// the default exchange, with `extra` arguments on the source.
async fn pair<const N: usize>(cx: &Ctx, w: &mut Wire, extra: [(&str, FieldValue); N]) -> Step<(String, String)> {
    let dlq = cx.queue("dlq");
    let src = cx.queue("source");
    w.call(1, queue(&dlq)).await?;
    let mut arguments = args([
        ("x-dead-letter-exchange", FieldValue::from("")),
        ("x-dead-letter-routing-key", FieldValue::from(dlq.as_str())),
    ]);
    for (k, v) in extra {
        arguments.push(k, v);
    }
    w.call(
        1,
        QueueDeclare {
            arguments,
            ..queue(&src)
        },
    )
    .await?;
    Ok((src, dlq))
}

/// The first message to reach `q` within 3 s.
pub(crate) async fn arrival(w: &mut Wire, ch: u16, q: &str) -> Step<In> {
    for _ in 0..150 {
        if let Some(m) = get(w, ch, q).await? {
            return Ok(m);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(Got::saw(format!(
        "nothing dead-lettered within 3 s (queue {q} stayed empty)"
    )))
}

fn text(v: Option<&FieldValue>, names: &[(&str, &str)]) -> String {
    match v {
        None => "absent".into(),
        Some(FieldValue::LongString(s)) => {
            let s = s.to_string_lossy();
            names.iter().find(|(real, _)| *real == s).map_or_else(
                || {
                    if s.is_empty() {
                        "\"\"".to_string()
                    } else {
                        s.into_owned()
                    }
                },
                |(_, shown)| shown.to_string(),
            )
        }
        Some(FieldValue::Array(a)) => list(a, names),
        Some(other) => other.as_i64().map_or_else(|| format!("{other:?}"), |n| n.to_string()),
    }
}

fn list(a: &FieldArray, names: &[(&str, &str)]) -> String {
    let items: Vec<String> = a.iter().map(|v| text(Some(v), names)).collect();
    format!("[{}]", items.join(", "))
}

/// `x-death` and `x-first-death-*` as one line, the queue names shown as
/// `names` says.
pub(crate) fn deaths(headers: Option<&FieldTable>, names: &[(&str, &str)]) -> String {
    let Some(h) = headers else { return "no headers".into() };
    let entries = match h.get("x-death") {
        Some(FieldValue::Array(a)) => a
            .iter()
            .map(|e| match e.as_table() {
                Some(t) => {
                    let mut line = format!(
                        "[reason={} count={} queue={} exchange={} routing-keys={}",
                        text(t.get("reason"), names),
                        text(t.get("count"), names),
                        text(t.get("queue"), names),
                        text(t.get("exchange"), names),
                        text(t.get("routing-keys"), names),
                    );
                    if let Some(v) = t.get("original-expiration") {
                        line.push_str(&format!(" original-expiration={}", text(Some(v), names)));
                    }
                    line.push(']');
                    line
                }
                None => "[not a table]".into(),
            })
            .collect::<Vec<_>>()
            .join(" "),
        Some(_) => "not an array".into(),
        None => "absent".into(),
    };
    format!(
        "x-death {entries}; x-first-death reason={} queue={} exchange={}",
        text(h.get("x-first-death-reason"), names),
        text(h.get("x-first-death-queue"), names),
        text(h.get("x-first-death-exchange"), names),
    )
}

/// Publishes one message to `src`, takes it with `basic.get` and settles
/// it with `settle` (reject or nack, no requeue); returns what reaches `dlq`.
async fn settle_into(w: &mut Wire, src: &str, dlq: &str, nack: bool) -> Step<In> {
    w.publish(1, "", src, false, BasicProperties::default(), b"x").await?;
    let m = arrival(w, 1, src).await?;
    let tag = tag_of(&m);
    if nack {
        w.send(
            1,
            BasicNack {
                delivery_tag: tag,
                multiple: false,
                requeue: false,
            },
        )
        .await?;
    } else {
        w.send(
            1,
            BasicReject {
                delivery_tag: tag,
                requeue: false,
            },
        )
        .await?;
    }
    arrival(w, 1, dlq).await
}

async fn settled(cx: Ctx, nack: bool) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let (src, dlq) = pair(&cx, &mut w, []).await?;
    let m = settle_into(&mut w, &src, &dlq, nack).await?;
    Ok(Obs::new(deaths(m.headers(), &[(&src, "<source>")])))
}

async fn rejected(cx: Ctx) -> Step<Obs> {
    settled(cx, false).await
}

async fn nacked(cx: Ctx) -> Step<Obs> {
    settled(cx, true).await
}

async fn expired_queue_ttl(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let (src, dlq) = pair(&cx, &mut w, [("x-message-ttl", FieldValue::I32(10))]).await?;
    w.publish(1, "", &src, false, BasicProperties::default(), b"x").await?;
    let m = arrival(&mut w, 1, &dlq).await?;
    Ok(Obs::new(deaths(m.headers(), &[(&src, "<source>")])))
}

async fn expired_message_ttl(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let (src, dlq) = pair(&cx, &mut w, []).await?;
    let props = BasicProperties {
        expiration: Some("10".into()),
        ..Default::default()
    };
    w.publish(1, "", &src, false, props, b"x").await?;
    // RabbitMQ expires a message at the head of a queue when it looks: a get does.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = get(&mut w, 1, &src).await?;
    let m = arrival(&mut w, 1, &dlq).await?;
    let expiration = match m.content.as_ref().and_then(|(p, _)| p.expiration.as_ref()) {
        None => "expiration property absent".to_string(),
        Some(e) => format!("expiration property {:?}", e.to_string_lossy()),
    };
    Ok(Obs::new(format!(
        "{}; {expiration}",
        deaths(m.headers(), &[(&src, "<source>")])
    )))
}

async fn maxlen(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let (src, dlq) = pair(&cx, &mut w, [("x-max-length", FieldValue::I32(1))]).await?;
    w.publish(1, "", &src, false, BasicProperties::default(), b"m1").await?;
    w.publish(1, "", &src, false, BasicProperties::default(), b"m2").await?;
    let m = arrival(&mut w, 1, &dlq).await?;
    let body = m
        .content
        .as_ref()
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    Ok(Obs::new(format!(
        "{}; body {body}",
        deaths(m.headers(), &[(&src, "<source>")])
    )))
}

async fn reject(w: &mut Wire, m: &In) -> Step<()> {
    w.send(
        1,
        BasicReject {
            delivery_tag: tag_of(m),
            requeue: false,
        },
    )
    .await
}

async fn cycle_count(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let a = cx.queue("a");
    let b = cx.queue("b");
    for (q, to) in [(&a, &b), (&b, &a)] {
        let declare = QueueDeclare {
            arguments: args([
                ("x-dead-letter-exchange", FieldValue::from("")),
                ("x-dead-letter-routing-key", FieldValue::from(to.as_str())),
            ]),
            ..queue(q)
        };
        w.call(1, declare).await?;
    }
    w.publish(1, "", &a, false, BasicProperties::default(), b"x").await?;
    let mut m = arrival(&mut w, 1, &a).await?;
    for next in [&b, &a, &b] {
        reject(&mut w, &m).await?;
        m = arrival(&mut w, 1, next).await?;
    }
    Ok(Obs::new(deaths(m.headers(), &[(&a, "<a>"), (&b, "<b>")])))
}

async fn cc_routing_keys(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let (src, dlq) = pair(&cx, &mut w, []).await?;
    let cc = FieldArray(vec![FieldValue::from("cc-key")]);
    let props = BasicProperties {
        headers: Some(args([("CC", FieldValue::Array(cc))])),
        ..Default::default()
    };
    w.publish(1, "", &src, false, props, b"x").await?;
    let m = arrival(&mut w, 1, &src).await?;
    reject(&mut w, &m).await?;
    let m = arrival(&mut w, 1, &dlq).await?;
    let names = [(src.as_str(), "<source>")];
    let keys = m
        .headers()
        .and_then(|h| h.get("x-death"))
        .and_then(FieldValue::as_array)
        .and_then(|a| a.iter().next())
        .and_then(FieldValue::as_table)
        .map(|t| text(t.get("routing-keys"), &names))
        .unwrap_or_else(|| "absent".into());
    Ok(Obs::new(format!("routing-keys={keys}")))
}

async fn last_death_headers(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let (src, dlq) = pair(&cx, &mut w, []).await?;
    let m = settle_into(&mut w, &src, &dlq, false).await?;
    let names = [(src.as_str(), "<source>")];
    let h = m.headers();
    let get = |k: &str| h.and_then(|h| h.get(k));
    if ["x-last-death-reason", "x-last-death-queue", "x-last-death-exchange"]
        .iter()
        .all(|k| get(k).is_none())
    {
        return Ok(Obs::new("no x-last-death-* headers"));
    }
    Ok(Obs::new(format!(
        "x-last-death reason={} queue={} exchange={}",
        text(get("x-last-death-reason"), &names),
        text(get("x-last-death-queue"), &names),
        text(get("x-last-death-exchange"), &names),
    )))
}
