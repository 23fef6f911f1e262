//! How values are printed: times, durations, header values as text and as
//! JSON, bodies; and text made safe for a terminal.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::fmt::Write as _;

use acemq_codec::{FieldTable, FieldValue};
use acemq_core::SetAside;
use base64::Engine as _;
use serde_json::{json, Map, Value};

/// `2026-12-01T23:30:00Z` (UTC, whole seconds).
pub fn time(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    timestamp(secs)
}

/// Seconds since the epoch as `2026-12-01T23:30:00Z`.
pub fn timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// `40s`, `1500ms`, `10m`, `0`.
pub fn duration(d: Duration) -> String {
    if d.is_zero() {
        "0".into()
    } else if d.subsec_millis() != 0 || d.as_secs() == 0 {
        format!("{}ms", d.as_millis())
    } else if d.as_secs().is_multiple_of(3600) {
        format!("{}h", d.as_secs() / 3600)
    } else if d.as_secs().is_multiple_of(60) {
        format!("{}m", d.as_secs() / 60)
    } else {
        format!("{}s", d.as_secs())
    }
}

/// A header value as text: `3`, `"acemq.dlx"`, `2026-12-01T23:30:00Z (1796168600)`, `{...}`.
pub fn value(v: &FieldValue) -> String {
    if let FieldValue::Timestamp(t) = v {
        return format!("{} ({t})", timestamp(*t));
    }
    if let Some(n) = v.as_i64() {
        return n.to_string();
    }
    match v {
        FieldValue::Bool(b) => b.to_string(),
        FieldValue::LongString(s) => format!("{:?}", s.to_string_lossy()),
        FieldValue::F32(f) => f.to_string(),
        FieldValue::F64(f) => f.to_string(),
        FieldValue::Decimal(d) => decimal(d.value, d.scale),
        FieldValue::Void => "void".into(),
        FieldValue::ByteArray(b) => format!("<{} bytes>", b.len()),
        FieldValue::Array(a) => format!("[{}]", a.iter().map(value).collect::<Vec<_>>().join(", ")),
        FieldValue::Table(t) => format!(
            "{{{}}}",
            t.iter()
                .map(|(k, v)| format!("{}: {}", k.to_string_lossy(), value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => format!("{other:?}"),
    }
}

fn decimal(value: u32, scale: u8) -> String {
    let digits = value.to_string();
    let scale = usize::from(scale);
    if scale == 0 {
        return digits;
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{int}.{frac}")
}

/// A header value as JSON: integers and timestamps as numbers, byte arrays
/// in base64, decimals as strings.
pub fn json_value(v: &FieldValue) -> Value {
    if let Some(n) = v.as_i64() {
        return json!(n);
    }
    match v {
        FieldValue::Bool(b) => json!(b),
        FieldValue::LongString(s) => json!(s.to_string_lossy()),
        FieldValue::Timestamp(t) => json!(t),
        FieldValue::F32(f) => json!(f),
        FieldValue::F64(f) => json!(f),
        FieldValue::Decimal(d) => json!(decimal(d.value, d.scale)),
        FieldValue::Void => Value::Null,
        FieldValue::ByteArray(b) => json!(base64(b)),
        FieldValue::Array(a) => Value::Array(a.iter().map(json_value).collect()),
        FieldValue::Table(t) => json_table(t),
        other => json!(format!("{other:?}")),
    }
}

/// A table as a JSON object (a repeated key: the first).
pub fn json_table(t: &FieldTable) -> Value {
    let mut map = Map::new();
    for (k, v) in t.iter() {
        map.entry(k.to_string_lossy().into_owned())
            .or_insert_with(|| json_value(v));
    }
    Value::Object(map)
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `text` made safe to print on a terminal, on one line: control
/// characters (C0, DEL, C1), Unicode's bidirectional overrides and
/// isolates, and so every escape sequence (ESC, CSI, OSC such as OSC 52,
/// which writes the clipboard on some terminals) are shown as escapes
/// (`\x1b`, `\u{9b}`, `\n`). A producer's bytes never reach the terminal
/// as instructions.
pub fn safe(text: &str) -> String {
    escape(text, false)
}

/// `value` as one line of JSON, exact (it parses back to the same value),
/// with the characters JSON lets through raw but a terminal obeys (DEL,
/// C1 controls, bidirectional overrides) written as `\u` escapes too:
/// JSON output is safe on a terminal and the same to a parser.
pub fn json(value: &Value) -> String {
    let text = value.to_string();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let n = u32::from(c);
        if n == 0x7f || (0x80..0xa0).contains(&n) || (0x202a..=0x202e).contains(&n) || (0x2066..=0x2069).contains(&n) {
            // Outside a string JSON is ASCII punctuation, so any such
            // character is inside one, where `\uXXXX` means it.
            let _ = write!(out, "\\u{n:04x}");
        } else {
            out.push(c);
        }
    }
    out
}

/// [`safe`] for a body shown on lines of its own: newlines and tabs stay.
pub fn safe_body(text: &str) -> String {
    escape(text, true)
}

fn escape(text: &str, keep_lines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let n = u32::from(c);
        match c {
            '\n' | '\t' if keep_lines => out.push(c),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            _ if n < 0x20 || n == 0x7f => {
                let _ = write!(out, "\\x{n:02x}");
            }
            // C1 controls (0x9b is a one-character CSI, 0x9d an OSC), the
            // bidirectional embeddings, overrides and isolates.
            _ if (0x80..0xa0).contains(&n) || (0x202a..=0x202e).contains(&n) || (0x2066..=0x2069).contains(&n) => {
                let _ = write!(out, "\\u{{{n:x}}}");
            }
            _ => out.push(c),
        }
    }
    out
}

/// One set-aside message as JSON; `position` is its place in the queue (from 1).
pub fn json_message(position: usize, m: &SetAside) -> Value {
    let text = std::str::from_utf8(&m.body).ok();
    json!({
        "position": position,
        "message_id": m.envelope.id,
        "correlation_id": m.envelope.correlation_id,
        "causation_id": m.envelope.causation_id,
        "attempt": m.envelope.attempt,
        "first_seen": time(m.envelope.first_seen),
        "error": m.error,
        "original_exchange": m.original_exchange,
        "original_routing_key": m.original_routing_key,
        "replayed": m.replayed,
        "redelivered": m.redelivered,
        "content_type": m.content_type,
        "headers": m.properties.headers.as_ref().map_or(json!({}), json_table),
        "body_size": m.body.len(),
        "body": text,
        "body_base64": if text.is_none() { Some(base64(&m.body)) } else { None },
    })
}

/// Where a message first went, as `exchange "x" key "k"`, or `unknown`.
pub fn original(m: &SetAside) -> String {
    match (&m.original_exchange, &m.original_routing_key) {
        (Some(exchange), Some(key)) => format!("exchange {exchange:?} key {key:?}"),
        (Some(exchange), None) => format!("exchange {exchange:?}, key unknown"),
        (None, Some(key)) => format!("exchange unknown, key {key:?}"),
        (None, None) => "unknown".into(),
    }
}

/// The first line of `text`, at most `max` characters, with `…` if cut.
pub fn short(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    let cut = line.chars().count() > max || line.len() < text.trim_end().len();
    let mut out: String = line.chars().take(max).collect();
    if cut {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_durations_and_base64() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(1_796_255_400), "2026-12-02T23:50:00Z");
        assert_eq!(timestamp(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(duration(Duration::from_secs(40)), "40s");
        assert_eq!(duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(duration(Duration::from_secs(600)), "10m");
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
        assert_eq!(base64(b""), "");
        assert_eq!(decimal(12345, 2), "123.45");
        assert_eq!(decimal(5, 3), "0.005");
        assert_eq!(short("abc\ndef", 10), "abc…");
        assert_eq!(short("abcdef", 3), "abc…");
    }

    #[test]
    fn control_characters_are_escaped() {
        // OSC 52 (set the clipboard), a CSI colour, C1 CSI, DEL, bidi override.
        let hostile = "a\u{1b}]52;c;ZXZpbA==\u{7}b\u{1b}[31mc\u{9b}2Jd\u{7f}e\u{202e}f\r\ng\th";
        let one_line = safe(hostile);
        assert_eq!(
            one_line,
            "a\\x1b]52;c;ZXZpbA==\\x07b\\x1b[31mc\\u{9b}2Jd\\x7fe\\u{202e}f\\r\\ng\\th"
        );
        assert!(one_line.chars().all(|c| !c.is_control()));
        let body = safe_body(hostile);
        assert!(body.ends_with("f\\r\ng\th"), "{body:?}");
        assert!(body.chars().all(|c| c == '\n' || c == '\t' || !c.is_control()));
        assert_eq!(safe("plain text: ü ✓"), "plain text: ü ✓");
    }

    #[test]
    fn json_is_exact_and_safe() {
        let hostile = "a\u{1b}]52;c;x\u{7}\u{9b}2J\u{7f}\u{202e}ü\"\\";
        let text = json(&json!({ "k\u{9b}": hostile }));
        assert!(text.chars().all(|c| !c.is_control() && c != '\u{202e}'), "{text}");
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, json!({ "k\u{9b}": hostile }));
    }
}
