//! `acemq dlq export` and `acemq dlq import`: messages as NDJSON, one
//! message a line, with the body and every property and header exactly
//! (the type of each header value kept). The format is written out in
//! README.md and in acemq-core's guide (the operators chapter).
//!
//! A line:
//!
//! ```json
//! {"format":"acemq-dlq/1","queue":"orders.dlq","position":1,"message_id":"…","error":"…",
//!  "properties":{"content_type":"application/json","delivery_mode":2,
//!                "headers":[["x-acemq-attempt",{"I":3}],["x-acemq-error",{"S":"…"}]]},
//!  "body":"eyJpZCI6MX0="}
//! ```
//!
//! `queue`, `position`, `message_id` and `error` are for the reader;
//! import reads `format`, `properties` and `body` only.

use std::io::{BufRead, Write};

use acemq_codec::{BasicProperties, Decimal, FieldArray, FieldTable, FieldValue, LongString, ShortString};
use acemq_core::{Conn, SetAside};
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::Failure;

/// The `format` of every line.
pub(crate) const FORMAT: &str = "acemq-dlq/1";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("bad base64 ({e})"))
}

/// Bytes as a JSON string when they are UTF-8, else `{"base64": "…"}`.
fn bytes_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => json!(text),
        Err(_) => json!({ "base64": b64(bytes) }),
    }
}

fn json_bytes(v: &Value) -> Result<Vec<u8>, String> {
    match v {
        Value::String(s) => Ok(s.as_bytes().to_vec()),
        Value::Object(o) if o.len() == 1 => match o.get("base64") {
            Some(Value::String(s)) => unb64(s),
            _ => Err(format!("expected a string or {{\"base64\": …}}, found {v}")),
        },
        _ => Err(format!("expected a string or {{\"base64\": …}}, found {v}")),
    }
}

fn short(v: &Value) -> Result<ShortString, String> {
    let bytes = json_bytes(v)?;
    let len = bytes.len();
    ShortString::from_bytes(Bytes::from(bytes)).ok_or_else(|| format!("a short string of {len} bytes (at most 255)"))
}

/// A field value as `{"TYPE": value}`, TYPE its AMQP type letter.
pub(crate) fn value_json(v: &FieldValue) -> Value {
    let (code, value) = match v {
        FieldValue::Bool(b) => ("t", json!(b)),
        FieldValue::I8(n) => ("b", json!(n)),
        FieldValue::U8(n) => ("B", json!(n)),
        FieldValue::I16(n) => ("s", json!(n)),
        FieldValue::U16(n) => ("u", json!(n)),
        FieldValue::I32(n) => ("I", json!(n)),
        FieldValue::U32(n) => ("i", json!(n)),
        FieldValue::I64(n) => ("l", json!(n)),
        FieldValue::I64L(n) => ("L", json!(n)),
        // Floats by their bits: every one, NaNs and -0 included, comes back.
        FieldValue::F32(f) => ("f", json!(format!("{:#010x}", f.to_bits()))),
        FieldValue::F64(f) => ("d", json!(format!("{:#018x}", f.to_bits()))),
        FieldValue::Decimal(d) => ("D", json!({ "scale": d.scale, "value": d.value })),
        FieldValue::LongString(s) => ("S", bytes_json(s.as_bytes())),
        FieldValue::Array(a) => ("A", Value::Array(a.iter().map(value_json).collect())),
        FieldValue::Timestamp(t) => ("T", json!(t)),
        FieldValue::Table(t) => ("F", table_json(t)),
        FieldValue::Void => ("V", Value::Null),
        FieldValue::ByteArray(b) => ("x", json!(b64(b))),
    };
    let mut map = Map::new();
    map.insert(code.into(), value);
    Value::Object(map)
}

/// A table as `[[name, value], …]`, in order, repeated names kept.
pub(crate) fn table_json(t: &FieldTable) -> Value {
    Value::Array(
        t.iter()
            .map(|(k, v)| json!([bytes_json(k.as_bytes()), value_json(v)]))
            .collect(),
    )
}

fn int<T: TryFrom<i64>>(v: &Value) -> Result<T, String> {
    v.as_i64()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| format!("{v} is not an integer of the field's type"))
}

fn bits(v: &Value) -> Result<u64, String> {
    v.as_str()
        .and_then(|s| s.strip_prefix("0x"))
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .ok_or_else(|| format!("{v}: a float is written as its bits, \"0x…\""))
}

pub(crate) fn json_value(v: &Value) -> Result<FieldValue, String> {
    let Some((code, value)) = v.as_object().filter(|o| o.len() == 1).and_then(|o| o.iter().next()) else {
        return Err(format!("a field value is {{\"TYPE\": value}}, found {v}"));
    };
    Ok(match code.as_str() {
        "t" => FieldValue::Bool(value.as_bool().ok_or_else(|| format!("{value} is not a boolean"))?),
        "b" => FieldValue::I8(int(value)?),
        "B" => FieldValue::U8(int(value)?),
        "s" => FieldValue::I16(int(value)?),
        "u" => FieldValue::U16(int(value)?),
        "I" => FieldValue::I32(int(value)?),
        "i" => FieldValue::U32(int(value)?),
        "l" => FieldValue::I64(int(value)?),
        "L" => FieldValue::I64L(int(value)?),
        "f" => FieldValue::F32(f32::from_bits(
            u32::try_from(bits(value)?).map_err(|_| format!("{value}: more than 32 bits"))?,
        )),
        "d" => FieldValue::F64(f64::from_bits(bits(value)?)),
        "D" => FieldValue::Decimal(Decimal {
            scale: int(&value["scale"])?,
            value: value["value"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("{value}: a decimal's value is a 32-bit unsigned integer"))?,
        }),
        "S" => FieldValue::LongString(LongString::from(json_bytes(value)?)),
        "A" => FieldValue::Array(FieldArray(
            value
                .as_array()
                .ok_or_else(|| format!("{value} is not an array"))?
                .iter()
                .map(json_value)
                .collect::<Result<_, _>>()?,
        )),
        "T" => FieldValue::Timestamp(value.as_u64().ok_or_else(|| format!("{value} is not a timestamp"))?),
        "F" => FieldValue::Table(json_table(value)?),
        "V" if value.is_null() => FieldValue::Void,
        "x" => FieldValue::ByteArray(Bytes::from(unb64(
            value.as_str().ok_or_else(|| format!("{value} is not base64"))?,
        )?)),
        other => return Err(format!("unknown field type {other:?}")),
    })
}

pub(crate) fn json_table(v: &Value) -> Result<FieldTable, String> {
    let entries = v
        .as_array()
        .ok_or_else(|| format!("a table is [[name, value], …], found {v}"))?;
    let mut table = FieldTable::new();
    for entry in entries {
        match entry.as_array().map(Vec::as_slice) {
            Some([name, value]) => table.push(short(name)?, json_value(value)?),
            _ => return Err(format!("a table entry is [name, value], found {entry}")),
        }
    }
    Ok(table)
}

/// The properties that are present, by their field names.
pub(crate) fn properties_json(p: &BasicProperties) -> Value {
    let mut map = Map::new();
    let mut text = |name: &str, v: &Option<ShortString>| {
        if let Some(v) = v {
            map.insert(name.into(), bytes_json(v.as_bytes()));
        }
    };
    text("content_type", &p.content_type);
    text("content_encoding", &p.content_encoding);
    text("correlation_id", &p.correlation_id);
    text("reply_to", &p.reply_to);
    text("expiration", &p.expiration);
    text("message_id", &p.message_id);
    text("type", &p.kind);
    text("user_id", &p.user_id);
    text("app_id", &p.app_id);
    text("cluster_id", &p.cluster_id);
    if let Some(h) = &p.headers {
        map.insert("headers".into(), table_json(h));
    }
    if let Some(n) = p.delivery_mode {
        map.insert("delivery_mode".into(), json!(n));
    }
    if let Some(n) = p.priority {
        map.insert("priority".into(), json!(n));
    }
    if let Some(t) = p.timestamp {
        map.insert("timestamp".into(), json!(t));
    }
    Value::Object(map)
}

pub(crate) fn json_properties(v: &Value) -> Result<BasicProperties, String> {
    let map = v
        .as_object()
        .ok_or_else(|| format!("\"properties\" is an object, found {v}"))?;
    let mut p = BasicProperties::default();
    for (name, value) in map {
        let field = |e: String| format!("properties.{name}: {e}");
        match name.as_str() {
            "content_type" => p.content_type = Some(short(value).map_err(field)?),
            "content_encoding" => p.content_encoding = Some(short(value).map_err(field)?),
            "correlation_id" => p.correlation_id = Some(short(value).map_err(field)?),
            "reply_to" => p.reply_to = Some(short(value).map_err(field)?),
            "expiration" => p.expiration = Some(short(value).map_err(field)?),
            "message_id" => p.message_id = Some(short(value).map_err(field)?),
            "type" => p.kind = Some(short(value).map_err(field)?),
            "user_id" => p.user_id = Some(short(value).map_err(field)?),
            "app_id" => p.app_id = Some(short(value).map_err(field)?),
            "cluster_id" => p.cluster_id = Some(short(value).map_err(field)?),
            "headers" => p.headers = Some(json_table(value).map_err(field)?),
            "delivery_mode" => p.delivery_mode = Some(int(value).map_err(field)?),
            "priority" => p.priority = Some(int(value).map_err(field)?),
            "timestamp" => {
                p.timestamp = Some(
                    value
                        .as_u64()
                        .ok_or_else(|| field(format!("{value} is not a timestamp")))?,
                )
            }
            other => return Err(format!("unknown property {other:?}")),
        }
    }
    Ok(p)
}

/// One exported line (without its newline).
pub(crate) fn export_line(queue: &str, position: usize, m: &SetAside) -> String {
    crate::render::json(&json!({
        "format": FORMAT,
        "queue": queue,
        "position": position,
        "message_id": m.envelope.id,
        "error": m.error,
        "properties": properties_json(&m.properties),
        "body": b64(&m.body),
    }))
}

/// One line to import: its properties and body.
pub(crate) fn import_line(line: &str) -> Result<(BasicProperties, Bytes), String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    match v.get("format").and_then(Value::as_str) {
        Some(FORMAT) => {}
        Some(other) => return Err(format!("format {other:?}: this acemq reads {FORMAT:?}")),
        None => return Err(format!("no \"format\": {FORMAT:?}")),
    }
    let properties = json_properties(v.get("properties").unwrap_or(&Value::Object(Map::new())))?;
    let body = v
        .get("body")
        .and_then(Value::as_str)
        .ok_or_else(|| "no \"body\" (base64)".to_string())
        .and_then(unb64)?;
    Ok((properties, Bytes::from(body)))
}

/// Reads every line of `input` as a message to import; the first bad line
/// fails the whole file (nothing is imported from a file that is not
/// whole).
pub(crate) fn read_import(input: impl BufRead) -> Result<Vec<(BasicProperties, Bytes)>, Failure> {
    let mut out = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| format!("cannot read the input: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let message = import_line(&line).map_err(|e| format!("line {}: {e}; nothing was imported", n + 1))?;
        out.push(message);
    }
    Ok(out)
}

/// Imports `messages` into `queue` in order, each published (mandatory,
/// confirmed) before the next; stops at the first that fails, and returns
/// how many went in before it, with its error.
pub(crate) async fn import(
    conn: &Conn,
    queue: &str,
    messages: Vec<(BasicProperties, Bytes)>,
) -> Result<(), (usize, acemq_core::Error)> {
    for (done, (properties, body)) in messages.into_iter().enumerate() {
        conn.publish_confirmed("", queue, true, properties, body)
            .await
            .map_err(|e| (done, e))?;
    }
    Ok(())
}

/// Writes `line` and a newline to `out` and flushes it: only a line
/// written out is a line exported.
pub(crate) fn write_line(out: &mut impl Write, line: &str) -> std::io::Result<()> {
    out.write_all(line.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_type_round_trips() {
        let mut inner = FieldTable::new();
        inner.push("k", FieldValue::I64L(-5));
        inner.push("k", FieldValue::Void);
        let mut headers = FieldTable::new();
        for v in [
            FieldValue::Bool(true),
            FieldValue::I8(-1),
            FieldValue::U8(255),
            FieldValue::I16(-300),
            FieldValue::U16(65_535),
            FieldValue::I32(i32::MIN),
            FieldValue::U32(u32::MAX),
            FieldValue::I64(i64::MIN),
            FieldValue::I64L(i64::MAX),
            FieldValue::F32(f32::from_bits(0x7fc0_0001)),
            FieldValue::F64(-0.0),
            FieldValue::Decimal(Decimal {
                scale: 2,
                value: 12_345,
            }),
            FieldValue::LongString(LongString::from(vec![0xff, 0x00, b'a'])),
            FieldValue::LongString("\u{1b}]52;c;x\u{7}".into()),
            FieldValue::Array(FieldArray(vec![FieldValue::I32(1), FieldValue::from("two")])),
            FieldValue::Timestamp(u64::MAX),
            FieldValue::Table(inner),
            FieldValue::Void,
            FieldValue::ByteArray(Bytes::from_static(b"\x00\x01")),
        ] {
            headers.push(format!("h{}", char::from(v.type_code())).as_str(), v);
        }
        headers.push(
            ShortString::from_bytes(Bytes::from_static(b"\xfe-not-utf8")).unwrap(),
            FieldValue::I32(1),
        );
        let props = BasicProperties {
            content_type: Some("application/json".into()),
            message_id: Some(ShortString::from_bytes(Bytes::from_static(b"\xc3")).unwrap()),
            headers: Some(headers),
            delivery_mode: Some(2),
            priority: Some(9),
            timestamp: Some(1_700_000_000),
            kind: Some("order.placed".into()),
            ..Default::default()
        };
        let json = properties_json(&props);
        let back = json_properties(&serde_json::from_str(&json.to_string()).unwrap()).unwrap();
        let encode = |p: &BasicProperties| {
            let mut buf = bytes::BytesMut::new();
            p.encode(&mut buf).unwrap();
            buf
        };
        assert_eq!(encode(&back), encode(&props), "byte for byte: {json}");
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        let ok = format!("{{\"format\":\"{FORMAT}\",\"properties\":{{}},\"body\":\"aGk=\"}}");
        let (_, body) = import_line(&ok).unwrap();
        assert_eq!(&body[..], b"hi");
        for (bad, says) in [
            ("{", "not JSON"),
            ("{\"body\":\"aGk=\"}", "no \"format\""),
            (&*format!("{{\"format\":\"{FORMAT}\"}}"), "no \"body\""),
            (&*format!("{{\"format\":\"{FORMAT}\",\"body\":\"%%%\"}}"), "bad base64"),
            (
                &*format!("{{\"format\":\"{FORMAT}\",\"body\":\"\",\"properties\":{{\"priority\":300}}}}"),
                "properties.priority",
            ),
            (
                &*format!(
                    "{{\"format\":\"{FORMAT}\",\"body\":\"\",\"properties\":{{\"headers\":[[\"a\",{{\"Q\":1}}]]}}}}"
                ),
                "unknown field type",
            ),
            (
                &*format!(
                    "{{\"format\":\"{FORMAT}\",\"body\":\"\",\"properties\":{{\"message_id\":\"{}\"}}}}",
                    "m".repeat(256)
                ),
                "at most 255",
            ),
            (
                &*format!(
                    "{{\"format\":\"{FORMAT}\",\"body\":\"\",\"properties\":{{\"headers\":[[\"{}\",{{\"V\":null}}]]}}}}",
                    "h".repeat(256)
                ),
                "at most 255",
            ),
            (
                &*format!("{{\"format\":\"{FORMAT}\",\"body\":\"\",\"properties\":{{\"headers\":[[\"a\",{{\"f\":\"0x1ffffffff\"}}]]}}}}"),
                "more than 32 bits",
            ),
            (
                &*format!("{{\"format\":\"{FORMAT}\",\"body\":\"\",\"properties\":{{\"colour\":\"red\"}}}}"),
                "unknown property",
            ),
            ("{\"format\":\"acemq-dlq/2\",\"body\":\"\"}", "this acemq reads"),
        ] {
            let err = import_line(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let input = format!("{ok}\n\n{{\n");
        let err = read_import(input.as_bytes()).unwrap_err();
        assert!(err.message.contains("line 3"), "{err:?}");
    }
}
