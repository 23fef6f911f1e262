//! Publisher confirms and returns: tags, ordering, nacks.

use std::time::Duration;

use acemq_codec::{BasicProperties, ConfirmSelect, FieldValue, Method, QueueDeclare, ReplyCode};

use super::channel::queue;
use super::wire::{In, Wire};
use super::{answer, args, check, Check, Ctx, Expect, Got, Obs, Step};

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "confirms.select-ok",
            "confirm.select is answered with confirm.select-ok",
            Expect::Both("confirm.select-ok"),
            select_ok
        ),
        check!(
            "confirms.ack-routed",
            "a publish routed to a classic queue is acked with tag 1, alone",
            Expect::Both("basic.ack 1"),
            ack_routed
        ),
        check!(
            "confirms.ack-unroutable",
            "an unroutable publish without mandatory is acked, with no return",
            Expect::Both("basic.ack 1"),
            ack_unroutable
        ),
        check!(
            "confirms.return-before-ack",
            "an unroutable mandatory publish gets basic.return 312 first, then its basic.ack",
            Expect::Both("basic.return 312 NO_ROUTE, then basic.ack 1"),
            return_before_ack
        ),
        check!(
            "confirms.mandatory-routed",
            "a routed mandatory publish gets its basic.ack and no return",
            Expect::Both("basic.ack 1"),
            mandatory_routed
        ),
        check!(
            "confirms.every-tag-once",
            "50 publishes to a classic queue: every tag acked exactly once (multiple acks allowed), never nacked",
            Expect::Both("tags 1-50 each acked once"),
            every_tag_once
        ),
        check!(
            "confirms.tags-per-channel",
            "each channel numbers its publishes from 1",
            Expect::Both("channel 1: basic.ack 1, channel 2: basic.ack 1"),
            tags_per_channel
        ),
        check!(
            "confirms.reject-publish-nack",
            "x-overflow reject-publish: the publish past x-max-length is nacked",
            Expect::Both("basic.ack 1, then basic.nack 2"),
            reject_publish_nack
        ),
    ]
}

/// One confirm or return, as a line.
pub(crate) fn confirm_line(m: &In) -> String {
    match &m.method {
        Method::BasicAck(a) if a.multiple => format!("basic.ack {} multiple", a.delivery_tag),
        Method::BasicAck(a) => format!("basic.ack {}", a.delivery_tag),
        Method::BasicNack(n) if n.multiple => format!("basic.nack {} multiple", n.delivery_tag),
        Method::BasicNack(n) => format!("basic.nack {}", n.delivery_tag),
        Method::BasicReturn(r) => format!(
            "basic.return {} {}",
            r.reply_code,
            ReplyCode::from_u16(r.reply_code).name()
        ),
        other => other.name().to_string(),
    }
}

/// A channel 1 in confirm mode.
async fn confirming(cx: &Ctx) -> Step<Wire> {
    let mut w = cx.channel().await?;
    w.call(1, ConfirmSelect::default()).await?;
    Ok(w)
}

/// The methods on channel 1 up to the `n`th confirm (ack or nack), and
/// anything more within 200 ms.
async fn lines(w: &mut Wire, n: usize) -> Step<Obs> {
    let mut out = Vec::new();
    let mut text = None;
    let mut confirms = 0;
    while confirms < n {
        match w.next_on(1).await {
            Ok(m) => {
                match &m.method {
                    Method::BasicReturn(r) => text = Some(r.reply_text.to_string_lossy().into_owned()),
                    Method::BasicAck(_) | Method::BasicNack(_) => confirms += 1,
                    _ => {}
                }
                out.push(confirm_line(&m));
            }
            Err(Got::Saw(o)) => {
                out.push(o.summary);
                return Ok(Obs {
                    summary: out.join(", then "),
                    text: o.text,
                });
            }
            Err(other) => return Err(other),
        }
    }
    if let Ok(Some(m)) = w.next_within(Duration::from_millis(200)).await {
        out.push(confirm_line(&m));
    }
    Ok(Obs {
        summary: out.join(", then "),
        text,
    })
}

async fn select_ok(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    answer(w.call(1, ConfirmSelect::default()).await)
}

async fn ack_routed(cx: Ctx) -> Step<Obs> {
    let mut w = confirming(&cx).await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    w.publish(1, "", &q, false, BasicProperties::default(), b"x").await?;
    lines(&mut w, 1).await
}

async fn ack_unroutable(cx: Ctx) -> Step<Obs> {
    let mut w = confirming(&cx).await?;
    w.publish(1, "", &cx.name("nowhere"), false, BasicProperties::default(), b"x")
        .await?;
    lines(&mut w, 1).await
}

async fn return_before_ack(cx: Ctx) -> Step<Obs> {
    let mut w = confirming(&cx).await?;
    w.publish(1, "", &cx.name("nowhere"), true, BasicProperties::default(), b"x")
        .await?;
    lines(&mut w, 1).await
}

async fn mandatory_routed(cx: Ctx) -> Step<Obs> {
    let mut w = confirming(&cx).await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    w.publish(1, "", &q, true, BasicProperties::default(), b"x").await?;
    lines(&mut w, 1).await
}

async fn every_tag_once(cx: Ctx) -> Step<Obs> {
    const N: u64 = 50;
    let mut w = confirming(&cx).await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    for _ in 0..N {
        w.publish(1, "", &q, false, BasicProperties::default(), b"x").await?;
    }
    let mut acked = vec![0u32; N as usize + 1];
    let mut problems = Vec::new();
    while acked[1..].contains(&0) {
        let m = w.next_on(1).await?;
        let (tag, multiple, nack) = match &m.method {
            Method::BasicAck(a) => (a.delivery_tag, a.multiple, false),
            Method::BasicNack(n) => (n.delivery_tag, n.multiple, true),
            other => {
                problems.push(other.name().to_string());
                continue;
            }
        };
        if nack {
            problems.push(format!("basic.nack {tag}"));
        }
        if tag == 0 || tag > N {
            problems.push(format!("tag {tag} out of range"));
            continue;
        }
        let range = if multiple {
            (1..=tag as usize).filter(|&t| acked[t] == 0).collect::<Vec<_>>()
        } else {
            vec![tag as usize]
        };
        if range.is_empty() || (!multiple && acked[tag as usize] > 0) {
            problems.push(format!("tag {tag} confirmed again"));
        }
        for t in range {
            acked[t] += 1;
        }
    }
    if let Ok(Some(m)) = w.next_within(Duration::from_millis(200)).await {
        problems.push(format!("then {}", confirm_line(&m)));
    }
    Ok(Obs::new(if problems.is_empty() {
        format!("tags 1-{N} each acked once")
    } else {
        problems.join(", ")
    }))
}

async fn tags_per_channel(cx: Ctx) -> Step<Obs> {
    let mut w = confirming(&cx).await?;
    w.open_channel(2).await?;
    w.call(2, ConfirmSelect::default()).await?;
    let q = cx.queue("q");
    w.call(1, queue(&q)).await?;
    w.publish(1, "", &q, false, BasicProperties::default(), b"x").await?;
    let first = confirm_line(&w.next_on(1).await?);
    w.publish(2, "", &q, false, BasicProperties::default(), b"x").await?;
    let second = confirm_line(&w.next_on(2).await?);
    Ok(Obs::new(format!("channel 1: {first}, channel 2: {second}")))
}

async fn reject_publish_nack(cx: Ctx) -> Step<Obs> {
    let mut w = confirming(&cx).await?;
    let q = cx.queue("q");
    let declare = QueueDeclare {
        arguments: args([
            ("x-max-length", FieldValue::I32(1)),
            ("x-overflow", FieldValue::from("reject-publish")),
        ]),
        ..queue(&q)
    };
    w.call(1, declare).await?;
    w.publish(1, "", &q, false, BasicProperties::default(), b"1").await?;
    let first = confirm_line(&w.next_on(1).await?);
    w.publish(1, "", &q, false, BasicProperties::default(), b"2").await?;
    // A multiple nack of tag 2 nacks nothing else (1 is acked): the same.
    let second = confirm_line(&w.next_on(1).await?).replace("basic.nack 2 multiple", "basic.nack 2");
    Ok(Obs::new(format!("{first}, then {second}")))
}
