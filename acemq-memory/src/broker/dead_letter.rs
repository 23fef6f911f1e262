//! Dead-lettering: the message a dead-letter exchange receives, with the
//! `x-death` and `x-first-death-*` headers written exactly as RabbitMQ 3.10
//! writes them (see amqp-codec/tests/data/rabbitmq-3.10/README.md), with
//! 4.0's `x-last-death-*` when imitating 4.0, and RabbitMQ's cycle detection. Must never change the body.

use acemq_codec::{FieldArray, FieldTable, FieldValue, LongString, ShortString};

use super::args::{set_table_value, sort_table};
use super::message::{Header, Message};
use super::queue::DeathReason;

fn long(s: &ShortString) -> FieldValue {
    FieldValue::LongString(LongString::from(s.to_bytes()))
}

/// The message as the dead-letter exchange receives it; with
/// `last_death` (RabbitMQ 4.0) also the `x-last-death-*` headers, which
/// name this death.
pub(crate) fn dead_lettered(
    old: &Message,
    queue: &ShortString,
    reason: DeathReason,
    dlx: &ShortString,
    dlrk: Option<&ShortString>,
    time_secs: u64,
    last_death: bool,
) -> Message {
    let routing_key = dlrk.cloned().unwrap_or_else(|| old.routing_key.clone());
    let header = match &old.header {
        Header::Raw(raw) => Header::Raw(raw.clone()),
        Header::Decoded(props) => {
            let mut props = props.clone();
            let mut headers = props.headers.take().unwrap_or_default();
            let mut routing_keys = vec![long(&old.routing_key)];
            if let Some(FieldValue::Array(cc)) = headers.get("CC") {
                routing_keys.extend(cc.iter().cloned());
            }
            let mut info = FieldTable::new();
            info.push("reason", FieldValue::from(reason.as_str()));
            info.push("queue", long(queue));
            info.push("time", FieldValue::Timestamp(time_secs));
            info.push("exchange", long(&old.exchange));
            info.push("routing-keys", FieldValue::Array(FieldArray(routing_keys)));
            if let Some(expiration) = props.expiration.take() {
                info.push("original-expiration", long(&expiration));
            }
            update_x_death(&mut headers, info, queue, reason, &old.exchange);
            if last_death {
                set_table_value(&mut headers, "x-last-death-reason", FieldValue::from(reason.as_str()));
                set_table_value(&mut headers, "x-last-death-queue", long(queue));
                set_table_value(&mut headers, "x-last-death-exchange", long(&old.exchange));
            }
            if dlrk.is_some() && headers.contains_key("CC") {
                headers.remove("CC");
            }
            props.headers = Some(headers);
            Header::Decoded(props)
        }
    };
    Message {
        exchange: dlx.clone(),
        routing_key,
        header,
        body: old.body.clone(),
    }
}

/// RabbitMQ 3.10's `update_x_death_header`.
fn update_x_death(
    headers: &mut FieldTable,
    info: FieldTable,
    queue: &ShortString,
    reason: DeathReason,
    exchange: &ShortString,
) {
    let with_count = |count: i64, info: FieldTable| -> FieldTable {
        let mut entry = FieldTable::new();
        entry.push("count", FieldValue::I64(count));
        for (k, v) in info {
            entry.push(k, v);
        }
        entry
    };
    match headers.get("x-death") {
        None => {
            set_table_value(headers, "x-first-death-reason", FieldValue::from(reason.as_str()));
            set_table_value(headers, "x-first-death-queue", long(queue));
            set_table_value(headers, "x-first-death-exchange", long(exchange));
            let entry = with_count(1, info);
            set_table_value(
                headers,
                "x-death",
                FieldValue::Array(FieldArray(vec![FieldValue::Table(entry)])),
            );
        }
        Some(FieldValue::Array(deaths)) => {
            let mut matched = None;
            let mut others = Vec::with_capacity(deaths.len());
            for death in deaths.iter() {
                let same = match death {
                    FieldValue::Table(t) => {
                        t.get("queue").and_then(FieldValue::as_str).map(str::as_bytes) == Some(queue.as_bytes())
                            && t.get("reason").and_then(FieldValue::as_str) == Some(reason.as_str())
                    }
                    _ => false,
                };
                match (same, death) {
                    (true, FieldValue::Table(t)) if matched.is_none() => matched = Some(t.clone()),
                    (true, _) => {}
                    _ => others.push(death.clone()),
                }
            }
            let mut entry = match matched {
                None => with_count(1, info),
                Some(mut old) => {
                    let count = old.get("count").and_then(FieldValue::as_i64);
                    match count {
                        Some(n) => {
                            old.insert("count", FieldValue::I64(n + 1));
                            old
                        }
                        None => with_count(1, old),
                    }
                }
            };
            sort_table(&mut entry);
            let mut array = vec![FieldValue::Table(entry)];
            array.extend(others);
            set_table_value(headers, "x-death", FieldValue::Array(FieldArray(array)));
        }
        Some(_) => {
            let entry = with_count(1, info);
            set_table_value(
                headers,
                "x-death",
                FieldValue::Array(FieldArray(vec![FieldValue::Table(entry)])),
            );
        }
    }
}

/// RabbitMQ's `is_death_cycle`: the message already died in `target`, and
/// nothing on the way since was a client's rejection.
pub(crate) fn is_death_cycle(target: &ShortString, msg: &Message) -> bool {
    let Some(FieldValue::Array(deaths)) = msg.headers().and_then(|h| h.get("x-death")) else {
        return false;
    };
    let queue_of = |d: &FieldValue| match d {
        FieldValue::Table(t) => t.get("queue").and_then(FieldValue::as_str).map(str::to_owned),
        _ => None,
    };
    let Some(at) = deaths
        .iter()
        .position(|d| queue_of(d).as_deref().map(str::as_bytes) == Some(target.as_bytes()))
    else {
        return false;
    };
    deaths.0[..=at].iter().all(|d| match d {
        FieldValue::Table(t) => t.get("reason").and_then(FieldValue::as_str) != Some("rejected"),
        _ => false,
    })
}
