//! Declaration arguments: validating them, reading the queue settings they
//! carry, and RabbitMQ's equivalence check on redeclare (integers compared by
//! value across widths, texts as RabbitMQ writes them). Must never accept a
//! value RabbitMQ would refuse without saying so.

use acemq_codec::{FieldTable, FieldValue, ShortString};

use crate::error::{invalid, rs_queue, type_name, AmqpError};

/// The queue types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueKind {
    Classic,
    Quorum,
    Stream,
}

/// What happens when a queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overflow {
    DropHead,
    RejectPublish,
    RejectPublishDlx,
}

/// The settings a queue's arguments carry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QueueSettings {
    pub kind: QueueKind,
    pub message_ttl: Option<u64>,
    pub expires: Option<u64>,
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
    pub dead_letter_exchange: Option<ShortString>,
    pub dead_letter_routing_key: Option<ShortString>,
    pub delivery_limit: Option<u64>,
    /// `x-max-priority` (classic queues): the highest message priority
    /// kept apart; a higher one counts as this one.
    pub max_priority: Option<u8>,
    /// `x-single-active-consumer`: one consumer gets every delivery.
    pub single_active_consumer: bool,
    /// Streams' retention: `x-max-age` in milliseconds.
    pub max_age_ms: Option<u64>,
    /// Streams: `x-stream-max-segment-size-bytes`.
    pub max_segment_size: Option<u64>,
}

/// RabbitMQ's type class: every integer width is one class.
fn type_class(value: &FieldValue) -> &'static str {
    match value {
        FieldValue::I8(_)
        | FieldValue::U8(_)
        | FieldValue::I16(_)
        | FieldValue::U16(_)
        | FieldValue::I32(_)
        | FieldValue::U32(_)
        | FieldValue::I64(_)
        | FieldValue::I64L(_) => "int",
        FieldValue::F32(_) | FieldValue::F64(_) => "float",
        other => type_name(other),
    }
}

/// A value as Erlang's `~s`/`~p` would print it in a reply text.
pub(crate) fn show(value: &FieldValue) -> String {
    if let Some(n) = value.as_i64() {
        return n.to_string();
    }
    match value {
        FieldValue::LongString(s) => s.to_string_lossy().into_owned(),
        FieldValue::ByteArray(b) => String::from_utf8_lossy(b).into_owned(),
        FieldValue::Bool(b) => b.to_string(),
        FieldValue::F32(f) => f.to_string(),
        FieldValue::F64(f) => f.to_string(),
        FieldValue::Decimal(d) => format!("{{{},{}}}", d.scale, d.value),
        FieldValue::Void => "undefined".to_owned(),
        FieldValue::Array(_) => "[...]".to_owned(),
        FieldValue::Table(_) => "[...]".to_owned(),
        _ => String::new(),
    }
}

fn same_value(a: &FieldValue, b: &FieldValue) -> bool {
    if type_class(a) != type_class(b) {
        return false;
    }
    match (a.as_i64(), b.as_i64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn described(value: Option<&FieldValue>) -> String {
    match value {
        None => "none".to_owned(),
        Some(v) => format!("the value '{}' of type '{}'", show(v), type_name(v)),
    }
}

/// RabbitMQ's `assert_args_equivalence` for `keys`; `what` is
/// `queue 'q' in vhost '/'` or the exchange's equivalent.
pub(crate) fn assert_args_equivalence(
    current: &FieldTable,
    received: &FieldTable,
    what: &str,
    keys: &[&str],
) -> Result<(), AmqpError> {
    for key in keys {
        let (cur, new) = (current.get(key), received.get(key));
        // RabbitMQ 3.10.8 takes a queue declared without a type as classic
        // on both sides: `classic` and no argument are equivalent.
        if *key == "x-queue-type" {
            let classic = FieldValue::from("classic");
            if same_value(cur.unwrap_or(&classic), new.unwrap_or(&classic)) {
                continue;
            }
        }
        match (cur, new) {
            (None, None) => {}
            (Some(c), Some(n)) if same_value(c, n) => {}
            (Some(c), Some(n)) => {
                return Err(AmqpError::precondition(format!(
                    "inequivalent arg '{key}' for {what}: received '{}' but current is '{}'",
                    show(n),
                    show(c)
                )))
            }
            (c, n) => {
                return Err(AmqpError::precondition(format!(
                    "inequivalent arg '{key}' for {what}: received {} but current is {}",
                    described(n),
                    described(c)
                )))
            }
        }
    }
    Ok(())
}

/// RabbitMQ's `assert_field_equivalence` for a flag or the exchange type.
pub(crate) fn assert_field_equivalence(
    current: impl std::fmt::Display,
    received: impl std::fmt::Display,
    what: &str,
    field: &str,
) -> Result<(), AmqpError> {
    let (current, received) = (current.to_string(), received.to_string());
    if current == received {
        Ok(())
    } else {
        Err(AmqpError::precondition(format!(
            "inequivalent arg '{field}' for {what}: received '{received}' but current is '{current}'"
        )))
    }
}

/// The queue equivalence check on arguments.
pub(crate) fn assert_queue_args_equivalence(
    kind: QueueKind,
    current: &FieldTable,
    received: &FieldTable,
    queue: &ShortString,
    vhost: &str,
) -> Result<(), AmqpError> {
    // RabbitMQ 3.10.8 compares the arguments the queue's type takes, in
    // the order of that type's list.
    assert_args_equivalence(current, received, &rs_queue(queue, vhost), type_arguments(kind))
}

/// A non-negative integer argument; `positive` refuses 0 too (`x-expires`).
fn int_arg(
    args: &FieldTable,
    key: &str,
    positive: bool,
    queue: &ShortString,
    vhost: &str,
) -> Result<Option<u64>, AmqpError> {
    let Some(value) = args.get(key) else {
        return Ok(None);
    };
    let Some(n) = value.as_i64().filter(|_| !matches!(value, FieldValue::Timestamp(_))) else {
        return Err(invalid(
            key,
            queue,
            vhost,
            format!("{{unacceptable_type,{}}}", type_name(value)),
        ));
    };
    if n < 0 {
        return Err(invalid(key, queue, vhost, format!("{{value_negative,{n}}}")));
    }
    if positive && n == 0 {
        return Err(invalid(key, queue, vhost, "{value_zero,0}"));
    }
    Ok(Some(n as u64))
}

fn str_arg(args: &FieldTable, key: &str, queue: &ShortString, vhost: &str) -> Result<Option<ShortString>, AmqpError> {
    match args.get(key) {
        None => Ok(None),
        Some(FieldValue::LongString(s)) => match ShortString::from_bytes(s.to_bytes()) {
            Some(s) => Ok(Some(s)),
            None => Err(invalid(key, queue, vhost, "{too_long}")),
        },
        Some(other) => Err(invalid(
            key,
            queue,
            vhost,
            format!("{{unacceptable_type,{}}}", type_name(other)),
        )),
    }
}

fn parse_kind(args: &FieldTable, queue: &ShortString, vhost: &str) -> Result<QueueKind, AmqpError> {
    Ok(match args.get("x-queue-type") {
        None => QueueKind::Classic,
        Some(FieldValue::LongString(s)) => match s.as_bytes() {
            b"classic" => QueueKind::Classic,
            b"quorum" => QueueKind::Quorum,
            b"stream" => QueueKind::Stream,
            other => {
                return Err(invalid(
                    "x-queue-type",
                    queue,
                    vhost,
                    format!("{{unsupported_queue_type,<<\"{}\">>}}", String::from_utf8_lossy(other)),
                ))
            }
        },
        Some(other) => {
            return Err(invalid(
                "x-queue-type",
                queue,
                vhost,
                format!("{{unacceptable_type,{}}}", type_name(other)),
            ))
        }
    })
}

fn overflow_arg(args: &FieldTable, queue: &ShortString, vhost: &str) -> Result<Overflow, AmqpError> {
    Ok(match args.get("x-overflow") {
        None => Overflow::DropHead,
        Some(FieldValue::LongString(s)) => match s.as_bytes() {
            b"drop-head" => Overflow::DropHead,
            b"reject-publish" => Overflow::RejectPublish,
            b"reject-publish-dlx" => Overflow::RejectPublishDlx,
            other => {
                return Err(invalid(
                    "x-overflow",
                    queue,
                    vhost,
                    format!("{{invalid_overflow,<<\"{}\">>}}", String::from_utf8_lossy(other)),
                ))
            }
        },
        Some(other) => {
            return Err(invalid(
                "x-overflow",
                queue,
                vhost,
                format!("{{unacceptable_type,{}}}", type_name(other)),
            ))
        }
    })
}

/// RabbitMQ 3.10.8's `declare_args()`: the order in which the arguments
/// of a new queue are validated.
const DECLARE_ARGS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
];

/// RabbitMQ 3.10.8's `check_declare_arguments`, for a new queue: the type
/// first, then the values of the arguments its type takes (in
/// [`DECLARE_ARGS`] order), then any argument another type takes but this
/// one does not (in the table's order). Arguments no type knows are ignored.
pub(crate) fn check_declare_arguments(args: &FieldTable, queue: &ShortString, vhost: &str) -> Result<(), AmqpError> {
    let kind = parse_kind(args, queue, vhost)?;
    let takes = type_arguments(kind);
    for key in DECLARE_ARGS
        .iter()
        .filter(|k| takes.contains(k) && args.contains_key(k))
    {
        match *key {
            "x-expires" => drop(int_arg(args, key, true, queue, vhost)?),
            "x-message-ttl" | "x-max-length" | "x-max-length-bytes" => drop(int_arg(args, key, false, queue, vhost)?),
            "x-dead-letter-exchange" => drop(str_arg(args, key, queue, vhost)?),
            "x-dead-letter-routing-key" => {
                str_arg(args, key, queue, vhost)?;
                if !args.contains_key("x-dead-letter-exchange") {
                    // RabbitMQ 3.10.8's words (later versions explain it in a sentence).
                    return Err(invalid(key, queue, vhost, "routing_key_but_no_dlx_defined"));
                }
            }
            "x-overflow" => drop(overflow_arg(args, queue, vhost)?),
            "x-max-priority" | "x-single-active-consumer" | "x-max-age" | "x-stream-max-segment-size-bytes" => {
                let mut only = FieldTable::new();
                if let Some(value) = args.get(key) {
                    only.insert(*key, value.clone());
                }
                super::feature_args::feature_settings(&only, queue, vhost)?;
            }
            _ => {}
        }
    }
    check_type_arguments(args, kind, queue, vhost)
}

/// Validates a queue's arguments and reads its settings.
pub(crate) fn queue_settings(
    args: &FieldTable,
    queue: &ShortString,
    vhost: &str,
    default_delivery_limit: Option<u64>,
) -> Result<QueueSettings, AmqpError> {
    let kind = parse_kind(args, queue, vhost)?;
    let overflow = overflow_arg(args, queue, vhost)?;
    let dead_letter_exchange = str_arg(args, "x-dead-letter-exchange", queue, vhost)?;
    let dead_letter_routing_key = str_arg(args, "x-dead-letter-routing-key", queue, vhost)?;
    if dead_letter_routing_key.is_some() && dead_letter_exchange.is_none() {
        return Err(invalid(
            "x-dead-letter-routing-key",
            queue,
            vhost,
            // RabbitMQ 3.10.8's words (later versions explain it in a sentence).
            "routing_key_but_no_dlx_defined",
        ));
    }
    let delivery_limit = int_arg(args, "x-delivery-limit", false, queue, vhost)?;
    let features = super::feature_args::feature_settings(args, queue, vhost)?;
    // RabbitMQ (3.10 and 4.0) takes a segment size of 0, and refuses one
    // above 3 GB once the arguments are otherwise valid.
    if kind == QueueKind::Stream && features.max_segment_size.is_some_and(|n| n > MAX_STREAM_SEGMENT_SIZE) {
        return Err(AmqpError::precondition(
            "Exceeded max value for x-stream-max-segment-size-bytes",
        ));
    }
    Ok(QueueSettings {
        kind,
        message_ttl: int_arg(args, "x-message-ttl", false, queue, vhost)?,
        expires: int_arg(args, "x-expires", true, queue, vhost)?,
        max_length: int_arg(args, "x-max-length", false, queue, vhost)?,
        max_length_bytes: int_arg(args, "x-max-length-bytes", false, queue, vhost)?,
        overflow,
        dead_letter_exchange,
        dead_letter_routing_key,
        delivery_limit: match kind {
            QueueKind::Quorum => delivery_limit.or(default_delivery_limit),
            _ => None,
        },
        max_priority: features.max_priority,
        single_active_consumer: features.single_active_consumer,
        max_age_ms: features.max_age_ms,
        max_segment_size: features.max_segment_size,
    })
}

/// The largest `x-stream-max-segment-size-bytes` RabbitMQ accepts.
const MAX_STREAM_SEGMENT_SIZE: u64 = 3_000_000_000;

/// The type a declaration asks for, before its arguments are validated
/// (an unknown `x-queue-type` is refused later, by [`queue_settings`]).
pub(crate) fn declared_kind(args: &FieldTable) -> QueueKind {
    match args.get("x-queue-type").and_then(FieldValue::as_str) {
        Some("quorum") => QueueKind::Quorum,
        Some("stream") => QueueKind::Stream,
        _ => QueueKind::Classic,
    }
}

/// RabbitMQ 3.10.8's `check_consume_arguments`, the key part: a consumer
/// argument another queue type takes but this one does not is refused
/// (values are checked where they are used).
pub(crate) fn check_consume_arguments(
    args: &FieldTable,
    kind: QueueKind,
    queue: &ShortString,
    vhost: &str,
) -> Result<(), AmqpError> {
    const CLASSIC: &[&str] = &["x-cancel-on-ha-failover", "x-priority", "x-credit"];
    const QUORUM: &[&str] = &["x-priority", "x-credit"];
    const STREAM: &[&str] = &["x-stream-offset", "x-credit"];
    refuse_other_types_arguments(args, kind, [CLASSIC, QUORUM, STREAM], queue, vhost)
}

/// The queue arguments `kind` takes.
fn type_arguments(kind: QueueKind) -> &'static [&'static str] {
    match kind {
        QueueKind::Classic => CLASSIC_ARGUMENTS,
        QueueKind::Quorum => QUORUM_ARGUMENTS,
        QueueKind::Stream => STREAM_ARGUMENTS,
    }
}

/// The queue arguments each type takes, as RabbitMQ 3.10.8's queue type
/// modules list them (`capabilities/0`, `queue_arguments`).
const CLASSIC_ARGUMENTS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-queue-master-locator",
];
const QUORUM_ARGUMENTS: &[&str] = &[
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-overflow",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-delivery-limit",
    "x-message-ttl",
    "x-queue-leader-locator",
];
const STREAM_ARGUMENTS: &[&str] = &[
    "x-max-length-bytes",
    "x-queue-type",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
];

/// Refuses an argument that another queue type takes but `kind` does not
/// (RabbitMQ ignores arguments no type knows).
fn check_type_arguments(args: &FieldTable, kind: QueueKind, queue: &ShortString, vhost: &str) -> Result<(), AmqpError> {
    let lists = [CLASSIC_ARGUMENTS, QUORUM_ARGUMENTS, STREAM_ARGUMENTS];
    refuse_other_types_arguments(args, kind, lists, queue, vhost)
}

/// Refuses the first argument of `args` (in table order) that one of the
/// types' lists (classic, quorum, stream) names but `kind`'s does not:
/// `invalid arg 'K' for queue 'Q' in vhost 'V' of queue type rabbit_*_queue`.
fn refuse_other_types_arguments(
    args: &FieldTable,
    kind: QueueKind,
    lists: [&[&str]; 3],
    queue: &ShortString,
    vhost: &str,
) -> Result<(), AmqpError> {
    let (takes, module) = match kind {
        QueueKind::Classic => (lists[0], "rabbit_classic_queue"),
        QueueKind::Quorum => (lists[1], "rabbit_quorum_queue"),
        QueueKind::Stream => (lists[2], "rabbit_stream_queue"),
    };
    for (key, _) in args.iter() {
        let key = key.to_string_lossy();
        if lists.iter().any(|l| l.contains(&&*key)) && !takes.contains(&&*key) {
            return Err(AmqpError::precondition(format!(
                "invalid arg '{key}' for {} of queue type {module}",
                rs_queue(queue, vhost)
            )));
        }
    }
    Ok(())
}

/// Sets `key` as RabbitMQ's `set_table_value` does: replace or add, then
/// sort the table by key (byte order, stable).
pub(crate) fn set_table_value(table: &mut FieldTable, key: &str, value: FieldValue) {
    table.insert(key, value);
    sort_table(table);
}

/// RabbitMQ's `sort_field_table`: a stable sort by key bytes.
pub(crate) fn sort_table(table: &mut FieldTable) {
    let sorted = table
        .entries()
        .windows(2)
        .all(|w| w[0].0.as_bytes() <= w[1].0.as_bytes());
    if sorted {
        return;
    }
    let mut entries: Vec<_> = std::mem::take(table).into_iter().collect();
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    *table = entries.into_iter().collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_compare_by_value_not_width() {
        let mut a = FieldTable::new();
        a.insert("x-message-ttl", FieldValue::I32(1000));
        let mut b = FieldTable::new();
        b.insert("x-message-ttl", FieldValue::I64(1000));
        assert!(assert_queue_args_equivalence(QueueKind::Classic, &a, &b, &"q".into(), "/").is_ok());
        b.insert("x-message-ttl", FieldValue::U16(999));
        let err = assert_queue_args_equivalence(QueueKind::Classic, &a, &b, &"q".into(), "/").unwrap_err();
        assert_eq!(
            err.text,
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received '999' but current is '1000'"
        );
    }

    #[test]
    fn missing_argument_text_matches_rabbitmq() {
        let mut b = FieldTable::new();
        b.insert("x-message-ttl", FieldValue::I32(2000));
        let err =
            assert_queue_args_equivalence(QueueKind::Classic, &FieldTable::new(), &b, &"q".into(), "/").unwrap_err();
        assert_eq!(
            err.text,
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '2000' of type 'signedint' but current is none"
        );
    }
}
