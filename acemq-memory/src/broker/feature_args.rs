//! The arguments of priority queues, single active consumer, consumer
//! priorities and stream retention, checked with RabbitMQ 3.10.8's reply
//! texts (observed on the real broker). Must never accept a value RabbitMQ
//! refuses, nor refuse one it takes.

use acemq_codec::{FieldTable, FieldValue, ReplyCode, ShortString};

use crate::error::{invalid, type_name, AmqpError};

/// RabbitMQ's highest supported `x-max-priority`.
const MAX_SUPPORTED_PRIORITY: i64 = 255;

/// The settings the four features' queue arguments carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FeatureSettings {
    pub max_priority: Option<u8>,
    pub single_active_consumer: bool,
    pub max_age_ms: Option<u64>,
    pub max_segment_size: Option<u64>,
}

/// Reads `x-max-priority`, `x-single-active-consumer`, `x-max-age` and
/// `x-stream-max-segment-size-bytes` (the queue type has already been
/// checked to allow them).
pub(crate) fn feature_settings(
    args: &FieldTable,
    queue: &ShortString,
    vhost: &str,
) -> Result<FeatureSettings, AmqpError> {
    let max_priority = match expected_integer(args, "x-max-priority", queue, vhost)? {
        None => None,
        Some(n) if n < 0 => {
            return Err(invalid(
                "x-max-priority",
                queue,
                vhost,
                format!("{{value_negative,{n}}}"),
            ))
        }
        Some(n) if n > MAX_SUPPORTED_PRIORITY => {
            return Err(invalid(
                "x-max-priority",
                queue,
                vhost,
                format!("{{max_value_exceeded,{n}}}"),
            ))
        }
        Some(n) => u8::try_from(n).ok(),
    };
    let single_active_consumer = match args.get("x-single-active-consumer") {
        None => false,
        Some(FieldValue::Bool(on)) => *on,
        Some(other) => {
            return Err(invalid(
                "x-single-active-consumer",
                queue,
                vhost,
                format!("{{unacceptable_type,{}}}", type_name(other)),
            ))
        }
    };
    let max_age_ms = match args.get("x-max-age") {
        None => None,
        Some(FieldValue::LongString(s)) => Some(max_age(s.as_bytes()).map_err(|e| match e {
            MaxAgeError::Invalid => invalid("x-max-age", queue, vhost, "invalid_max_age"),
            // RabbitMQ 3.10.8 crashes on an age without digits; the
            // connection is closed with a bare 541.
            MaxAgeError::NoDigits => AmqpError {
                code: ReplyCode::InternalError,
                text: "INTERNAL_ERROR".to_owned(),
                class_id: 0,
                method_id: 0,
            },
        })?),
        Some(other) => {
            return Err(invalid(
                "x-max-age",
                queue,
                vhost,
                format!("{{unacceptable_type,{}}}", type_name(other)),
            ))
        }
    };
    let max_segment_size = match expected_integer(args, "x-stream-max-segment-size-bytes", queue, vhost)? {
        None => None,
        Some(n) if n < 0 => {
            return Err(invalid(
                "x-stream-max-segment-size-bytes",
                queue,
                vhost,
                format!("{{value_negative,{n}}}"),
            ))
        }
        Some(n) => Some(n as u64),
    };
    Ok(FeatureSettings {
        max_priority,
        single_active_consumer,
        max_age_ms,
        max_segment_size,
    })
}

/// An integer argument checked as RabbitMQ checks `x-max-priority`,
/// `x-stream-max-segment-size-bytes` and `x-priority`: any other type is
/// `"expected integer, got T"` (quoted: Erlang prints it as a string).
fn expected_integer(args: &FieldTable, key: &str, queue: &ShortString, vhost: &str) -> Result<Option<i64>, AmqpError> {
    match args.get(key) {
        None => Ok(None),
        Some(value) => match value.as_i64().filter(|_| !matches!(value, FieldValue::Timestamp(_))) {
            Some(n) => Ok(Some(n)),
            None => Err(invalid(
                key,
                queue,
                vhost,
                format!("\"expected integer, got {}\"", type_name(value)),
            )),
        },
    }
}

/// The consumer's `x-priority` (0 without one), refused as RabbitMQ does
/// when it is not an integer.
pub(crate) fn consumer_priority(args: &FieldTable, queue: &ShortString, vhost: &str) -> Result<i64, AmqpError> {
    Ok(expected_integer(args, "x-priority", queue, vhost)?.unwrap_or(0))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MaxAgeError {
    Invalid,
    NoDigits,
}

/// `x-max-age`: digits, then one of `Y M D h m s`, more than zero.
fn max_age(text: &[u8]) -> Result<u64, MaxAgeError> {
    let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(MaxAgeError::NoDigits);
    }
    let value = std::str::from_utf8(number)
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or(MaxAgeError::Invalid)?;
    const SECOND: u64 = 1000;
    let unit_ms = match unit {
        b"Y" => 365 * 24 * 3600 * SECOND,
        b"M" => 30 * 24 * 3600 * SECOND,
        b"D" => 24 * 3600 * SECOND,
        b"h" => 3600 * SECOND,
        b"m" => 60 * SECOND,
        b"s" => SECOND,
        _ => return Err(MaxAgeError::Invalid),
    };
    if value == 0 {
        return Err(MaxAgeError::Invalid);
    }
    Ok(value.saturating_mul(unit_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(key: &str, value: FieldValue) -> Result<FeatureSettings, AmqpError> {
        let mut args = FieldTable::new();
        args.insert(key, value);
        feature_settings(&args, &"q".into(), "/")
    }

    #[test]
    fn max_priority_is_an_integer_from_0_to_255() {
        assert_eq!(
            settings("x-max-priority", FieldValue::U8(0)).unwrap().max_priority,
            Some(0)
        );
        assert_eq!(
            settings("x-max-priority", FieldValue::I64(255)).unwrap().max_priority,
            Some(255)
        );
        let text = |v| settings("x-max-priority", v).unwrap_err().text;
        assert_eq!(
            text(FieldValue::I32(256)),
            "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'q' in vhost '/': {max_value_exceeded,256}"
        );
        assert_eq!(
            text(FieldValue::I32(-1)),
            "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'q' in vhost '/': {value_negative,-1}"
        );
        assert_eq!(
            text("ten".into()),
            "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'q' in vhost '/': \"expected integer, got longstr\""
        );
    }

    #[test]
    fn max_age_takes_digits_and_a_unit() {
        assert_eq!(max_age(b"10s"), Ok(10_000));
        assert_eq!(max_age(b"007D"), Ok(7 * 24 * 3600 * 1000));
        assert_eq!(max_age(b"1Y"), Ok(365 * 24 * 3600 * 1000));
        for invalid in [&b"0s"[..], b"10", b"10x", b"10 s", b"10ms"] {
            assert_eq!(max_age(invalid), Err(MaxAgeError::Invalid), "{invalid:?}");
        }
        for crash in [&b""[..], b"s", b"-1s", b"abc"] {
            assert_eq!(max_age(crash), Err(MaxAgeError::NoDigits), "{crash:?}");
        }
        let err = settings("x-max-age", "s".into()).unwrap_err();
        assert_eq!(
            (err.code, err.text.as_str()),
            (ReplyCode::InternalError, "INTERNAL_ERROR")
        );
        assert!(err.is_hard());
    }

    #[test]
    fn single_active_consumer_is_a_bool() {
        assert!(
            settings("x-single-active-consumer", true.into())
                .unwrap()
                .single_active_consumer
        );
        assert_eq!(
            settings("x-single-active-consumer", FieldValue::I32(1)).unwrap_err().text,
            "PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue 'q' in vhost '/': {unacceptable_type,signedint}"
        );
    }
}
