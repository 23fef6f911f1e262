//! Which messages a command works on: the filters of the command line
//! (`--error-contains`, `--older-than`, `--header`, `--group`, `--id`), the
//! failure groups of `dlq summary` (errors with their numbers and ids
//! masked), and the age of a message.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use acemq_codec::FieldValue;
use acemq_core::{Conn, SetAside};
use clap::Args;

use crate::{parse_duration, render, Failure, SetAsideQueue};

/// The filters a command takes; a message must pass them all.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct Filters {
    /// Only messages whose error (x-acemq-error, or the broker's
    /// dead-letter reason) contains TEXT.
    #[arg(long, value_name = "TEXT")]
    error_contains: Option<String>,
    /// Only messages first seen at least this long ago (e.g. 30m, 2h, 7d).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Option<Duration>,
    /// Only messages whose header K has the value V (a string as it is, a
    /// number in decimal; repeatable: all must match).
    #[arg(long = "header", value_name = "K=V", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// Only the messages of failure group N of `acemq dlq summary`.
    #[arg(long, value_name = "N")]
    group: Option<usize>,
    /// Only the message with this message-id (repeatable).
    #[arg(long = "id", value_name = "MESSAGE_ID")]
    ids: Vec<String>,
}

/// `K=V`: a header's name and the value to compare with.
fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{text:?}: write the header as NAME=VALUE")),
    }
}

impl Filters {
    /// Whether any filter is given.
    pub(crate) fn any(&self) -> bool {
        self.error_contains.is_some()
            || self.older_than.is_some()
            || !self.headers.is_empty()
            || self.group.is_some()
            || !self.ids.is_empty()
    }

    /// Whether only `--id` is given (a replay of ids says "not selected by --id").
    pub(crate) fn ids_only(&self) -> bool {
        !self.ids.is_empty()
            && self.error_contains.is_none()
            && self.older_than.is_none()
            && self.headers.is_empty()
            && self.group.is_none()
    }

    /// The selector these filters make for `queue`; `--group N` reads the
    /// queue's groups first (as `dlq summary` numbers them), and a group
    /// that is not there is a usage error.
    pub(crate) async fn selector(&self, conn: &Conn, queue: &SetAsideQueue) -> Result<Selector, Failure> {
        let group = match self.group {
            None => None,
            Some(n) => {
                let name = queue.name();
                let messages = read_all(conn, &name).await?;
                let groups = Summary::of(&messages, SystemTime::now()).errors;
                match n.checked_sub(1).and_then(|i| groups.get(i)) {
                    Some(group) => Some(group.error.clone()),
                    None => {
                        return Err(Failure::usage(format!(
                            "--group {n}: {name} has {} failure group{} (see acemq dlq summary {}{})",
                            groups.len(),
                            if groups.len() == 1 { "" } else { "s" },
                            queue.queue,
                            if queue.parked { " --parked" } else { "" }
                        )))
                    }
                }
            }
        };
        Ok(Selector {
            error_contains: self.error_contains.clone(),
            first_seen_before: self.older_than.map(|d| SystemTime::now().checked_sub(d)),
            headers: self.headers.clone(),
            group,
            ids: self.ids.iter().cloned().collect(),
        })
    }
}

/// Every message of `queue` (up to what one reader holds unacked), in order,
/// read without consuming it.
pub(crate) async fn read_all(conn: &Conn, queue: &str) -> Result<Vec<SetAside>, Failure> {
    conn.peek(queue, usize::from(u16::MAX))
        .await
        .map_err(|e| Failure::broker(format!("cannot read {queue}"), e))
}

/// The filters, ready to test messages.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selector {
    error_contains: Option<String>,
    /// `Some(None)`: older than the clock reaches back, so nothing is.
    first_seen_before: Option<Option<SystemTime>>,
    headers: Vec<(String, String)>,
    /// The normalised error of the chosen group.
    group: Option<String>,
    ids: HashSet<String>,
}

impl Selector {
    /// Whether `m` passes every filter.
    pub(crate) fn matches(&self, m: &SetAside) -> bool {
        if !self.ids.is_empty() && !self.ids.contains(&m.envelope.id) {
            return false;
        }
        if let Some(text) = &self.error_contains {
            if !m.error.as_deref().unwrap_or("").contains(text.as_str()) {
                return false;
            }
        }
        if let Some(before) = self.first_seen_before {
            match before {
                Some(before) if m.envelope.first_seen <= before => {}
                _ => return false,
            }
        }
        for (key, wanted) in &self.headers {
            let value = m.properties.headers.as_ref().and_then(|h| h.get(key));
            if value.map(header_text).as_deref() != Some(wanted.as_str()) {
                return false;
            }
        }
        if let Some(group) = &self.group {
            if &error_group(m) != group {
                return false;
            }
        }
        true
    }
}

/// A header's value as `--header K=V` compares it: a string as it is, a
/// number in decimal, a boolean as `true`/`false`, anything else as listed.
fn header_text(v: &FieldValue) -> String {
    match v {
        FieldValue::LongString(s) => s.to_string_lossy().into_owned(),
        FieldValue::Bool(b) => b.to_string(),
        FieldValue::Timestamp(t) => t.to_string(),
        other => other.as_i64().map_or_else(|| render::value(other), |n| n.to_string()),
    }
}

/// The failure group of a message: its error, normalised.
pub(crate) fn error_group(m: &SetAside) -> String {
    match &m.error {
        Some(error) => normalise(error),
        None => NO_ERROR.into(),
    }
}

const NO_ERROR: &str = "(no error recorded)";

/// An error text with what differs between occurrences of one failure
/// masked: UUIDs as `<uuid>`, hex ids (`0x1f`, or 8 or more hex digits with
/// a digit among them) as `<hex>`, other runs of digits as `<n>`; white
/// space collapsed. `card declined for order 1` and `... order 2` are one
/// group.
pub(crate) fn normalise(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let word = |c: char| c.is_ascii_alphanumeric();
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            if !out.ends_with(' ') && !out.is_empty() {
                out.push(' ');
            }
            i += 1;
            continue;
        }
        let starts_word = i == 0 || !word(chars[i - 1]);
        if starts_word && is_uuid(&chars[i..]) && chars.get(i + 36).is_none_or(|&c| !word(c)) {
            out.push_str("<uuid>");
            i += 36;
            continue;
        }
        if !word(c) {
            out.push(c);
            i += 1;
            continue;
        }
        let end = (i..chars.len()).find(|&j| !word(chars[j])).unwrap_or(chars.len());
        let token: String = chars[i..end].iter().collect();
        let hex_digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit());
        let is_hex = match token.strip_prefix("0x").or_else(|| token.strip_prefix("0X")) {
            Some(rest) => hex_digits(rest),
            None => token.len() >= 8 && hex_digits(&token) && token.chars().any(|c| c.is_ascii_digit()),
        };
        if is_hex && !token.chars().all(|c| c.is_ascii_digit()) {
            out.push_str("<hex>");
        } else {
            // Runs of digits inside the word (`order42`, `v2`) are masked too.
            let mut digits = false;
            for ch in token.chars() {
                if ch.is_ascii_digit() {
                    if !digits {
                        out.push_str("<n>");
                    }
                    digits = true;
                } else {
                    out.push(ch);
                    digits = false;
                }
            }
        }
        i = end;
    }
    out.trim_end().to_string()
}

/// Whether `chars` starts with a UUID: 8-4-4-4-12 hex digits.
fn is_uuid(chars: &[char]) -> bool {
    chars.len() >= 36
        && chars[..36].iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// One failure group.
#[derive(Debug, Clone)]
pub(crate) struct ErrorGroup {
    /// The normalised error.
    pub(crate) error: String,
    pub(crate) count: usize,
    /// One error of the group as it was written.
    pub(crate) example: String,
    /// The message-ids, in queue order.
    pub(crate) ids: Vec<String>,
}

/// Where a message was first published: exchange and routing key, each
/// `None` when it is not recorded.
pub(crate) type Destination = (Option<String>, Option<String>);

/// The age buckets, by lower bound.
pub(crate) const AGES: [(Duration, &str); 4] = [
    (Duration::ZERO, "under 1 hour"),
    (Duration::from_secs(3600), "1 hour to 1 day"),
    (Duration::from_secs(86_400), "1 to 7 days"),
    (Duration::from_secs(7 * 86_400), "7 days or more"),
];

/// A queue's messages counted by failure group, original destination and age.
#[derive(Debug, Clone, Default)]
pub(crate) struct Summary {
    /// By normalised error, most frequent first (ties: by the error's
    /// text); group N is `errors[N - 1]`.
    pub(crate) errors: Vec<ErrorGroup>,
    /// `(exchange, routing key)` (either unknown: `None`), and the count;
    /// most frequent first.
    pub(crate) destinations: Vec<(Destination, usize)>,
    /// The count in each of [`AGES`].
    pub(crate) ages: [usize; 4],
}

impl Summary {
    pub(crate) fn of(messages: &[SetAside], now: SystemTime) -> Summary {
        let mut errors: HashMap<String, ErrorGroup> = HashMap::new();
        let mut destinations: BTreeMap<Destination, usize> = BTreeMap::new();
        let mut ages = [0; 4];
        for m in messages {
            let key = error_group(m);
            let group = errors.entry(key.clone()).or_insert_with(|| ErrorGroup {
                error: key,
                count: 0,
                example: m.error.clone().unwrap_or_else(|| NO_ERROR.into()),
                ids: Vec::new(),
            });
            group.count += 1;
            group.ids.push(m.envelope.id.clone());
            *destinations
                .entry((m.original_exchange.clone(), m.original_routing_key.clone()))
                .or_default() += 1;
            let age = now.duration_since(m.envelope.first_seen).unwrap_or(Duration::ZERO);
            let bucket = AGES.iter().rposition(|(from, _)| age >= *from).unwrap_or(0);
            ages[bucket] += 1;
        }
        let mut errors: Vec<ErrorGroup> = errors.into_values().collect();
        errors.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.error.cmp(&b.error)));
        let mut destinations: Vec<_> = destinations.into_iter().collect();
        destinations.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Summary {
            errors,
            destinations,
            ages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_normalised() {
        assert_eq!(
            normalise("fatal: card declined for order 42"),
            "fatal: card declined for order <n>"
        );
        assert_eq!(
            normalise("no customer 3f2a0c7e-1b2c-4d5e-8f90-a1b2c3d4e5f6 in  shard\n7"),
            "no customer <uuid> in shard <n>"
        );
        assert_eq!(
            normalise("tx 0x1F3a failed at 9f86d081884c7d65, retry order42"),
            "tx <hex> failed at <hex>, retry order<n>"
        );
        // Words that happen to be hex letters, and numbers that are all
        // digits, are not hex ids.
        assert_eq!(
            normalise("deadline exceeded after 12345678 ms"),
            "deadline exceeded after <n> ms"
        );
        assert_eq!(normalise("bad cafe"), "bad cafe");
    }

    #[test]
    fn headers_compare_as_text() {
        assert_eq!(header_text(&FieldValue::from("eu")), "eu");
        assert_eq!(header_text(&FieldValue::I32(7)), "7");
        assert_eq!(header_text(&FieldValue::U8(7)), "7");
        assert_eq!(header_text(&FieldValue::Bool(true)), "true");
        assert_eq!(parse_header("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_header("=x").is_err());
        assert!(parse_header("x").is_err());
    }
}
