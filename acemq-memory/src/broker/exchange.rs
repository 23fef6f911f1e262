//! Exchanges and their routing: default, direct, fanout, topic (`*`, `#`),
//! headers (`x-match` all/any), and exchange-to-exchange bindings. Routing is
//! a pure function of the bindings; it must never touch a queue.

use acemq_codec::{FieldTable, FieldValue, ShortString};

/// The four exchange types RabbitMQ ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl ExchangeKind {
    pub fn parse(kind: &[u8]) -> Option<Self> {
        match kind {
            b"direct" => Some(ExchangeKind::Direct),
            b"fanout" => Some(ExchangeKind::Fanout),
            b"topic" => Some(ExchangeKind::Topic),
            b"headers" => Some(ExchangeKind::Headers),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
        }
    }
}

/// Where a binding leads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Destination {
    Queue(ShortString),
    Exchange(ShortString),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Binding {
    pub destination: Destination,
    pub key: ShortString,
    pub arguments: FieldTable,
}

#[derive(Debug, Clone)]
pub(crate) struct Exchange {
    pub name: ShortString,
    pub kind: ExchangeKind,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    pub bindings: Vec<Binding>,
}

impl Exchange {
    pub fn new(name: &str, kind: ExchangeKind, durable: bool) -> Self {
        Exchange {
            name: name.into(),
            kind,
            durable,
            auto_delete: false,
            internal: false,
            arguments: FieldTable::new(),
            bindings: Vec::new(),
        }
    }

    /// The alternate exchange named in the arguments, if any.
    pub fn alternate(&self) -> Option<ShortString> {
        match self.arguments.get("alternate-exchange") {
            Some(FieldValue::LongString(s)) => ShortString::from_bytes(s.to_bytes()),
            _ => None,
        }
    }

    /// Appends the destinations that a message with `routing_key` and
    /// `headers` reaches through this exchange's own bindings.
    pub fn matches<'a>(&'a self, routing_key: &[u8], headers: Option<&FieldTable>, out: &mut Vec<&'a Destination>) {
        for binding in &self.bindings {
            let hit = match self.kind {
                ExchangeKind::Direct => binding.key.as_bytes() == routing_key,
                ExchangeKind::Fanout => true,
                ExchangeKind::Topic => topic_matches(binding.key.as_bytes(), routing_key),
                ExchangeKind::Headers => headers_match(&binding.arguments, headers),
            };
            if hit {
                out.push(&binding.destination);
            }
        }
    }
}

/// Topic matching: words separated by `.`, `*` is exactly one word, `#` is
/// zero or more. Dynamic programming, so a pattern of many `#` cannot blow up.
pub(crate) fn topic_matches(pattern: &[u8], key: &[u8]) -> bool {
    let pattern: Vec<&[u8]> = pattern.split(|b| *b == b'.').collect();
    let words: Vec<&[u8]> = key.split(|b| *b == b'.').collect();
    // reachable[j]: the pattern prefix seen so far matches words[..j].
    let mut reachable = vec![false; words.len() + 1];
    reachable[0] = true;
    for part in &pattern {
        let mut next = vec![false; words.len() + 1];
        match *part {
            b"#" => {
                let mut any = false;
                for j in 0..=words.len() {
                    any |= reachable[j];
                    next[j] = any;
                }
            }
            b"*" => {
                next[1..].copy_from_slice(&reachable[..words.len()]);
            }
            literal => {
                for j in 0..words.len() {
                    next[j + 1] = reachable[j] && words[j] == literal;
                }
            }
        }
        reachable = next;
    }
    reachable[words.len()]
}

/// Headers matching as RabbitMQ does it: `x-match` is `all` (default),
/// `any`, `all-with-x` or `any-with-x`; binding arguments starting with `x-`
/// are ignored unless `-with-x`; a void binding value only needs the key.
pub(crate) fn headers_match(binding: &FieldTable, headers: Option<&FieldTable>) -> bool {
    let mode = binding.get("x-match").and_then(FieldValue::as_str).unwrap_or("all");
    let (any, with_x) = match mode {
        "any" => (true, false),
        "any-with-x" => (true, true),
        "all-with-x" => (false, true),
        _ => (false, false),
    };
    let empty = FieldTable::new();
    let headers = headers.unwrap_or(&empty);
    let mut considered = 0;
    for (key, wanted) in binding.iter() {
        if key.as_bytes() == b"x-match" || (!with_x && key.as_bytes().starts_with(b"x-")) {
            continue;
        }
        considered += 1;
        let hit = match headers.get(key.as_str().unwrap_or("")) {
            None => false,
            Some(_) if matches!(wanted, FieldValue::Void) => true,
            Some(have) => values_equal(wanted, have),
        };
        if any && hit {
            return true;
        }
        if !any && !hit {
            return false;
        }
    }
    let _ = considered;
    !any
}

/// Equality by value, integers of any width compared as numbers.
pub(crate) fn values_equal(a: &FieldValue, b: &FieldValue) -> bool {
    match (a.as_i64(), b.as_i64()) {
        (Some(x), Some(y)) if !matches!(a, FieldValue::Timestamp(_)) && !matches!(b, FieldValue::Timestamp(_)) => {
            x == y
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_patterns_match_as_rabbitmq_does() {
        let cases: &[(&str, &str, bool)] = &[
            ("a.b.c", "a.b.c", true),
            ("a.*.c", "a.b.c", true),
            ("a.*.c", "a.c", false),
            ("a.#", "a", true),
            ("a.#", "a.b.c", true),
            ("#", "", true),
            ("#", "a.b", true),
            ("#.c", "a.b.c", true),
            ("*.b.#", "a.b", true),
            ("*", "a.b", false),
            ("a.#.#.b", "a.b", true),
            ("a.#.c", "a.x.y.c", true),
            ("a.#.c", "a.x.y.d", false),
            ("", "", true),
            ("*", "", true),
        ];
        for (pattern, key, expected) in cases {
            assert_eq!(
                topic_matches(pattern.as_bytes(), key.as_bytes()),
                *expected,
                "{pattern} ~ {key}"
            );
        }
    }

    #[test]
    fn headers_all_and_any() {
        let mut binding = FieldTable::new();
        binding.insert("x-match", "any");
        binding.insert("a", FieldValue::I32(1));
        binding.insert("b", "x");
        let mut headers = FieldTable::new();
        headers.insert("a", FieldValue::I64(1));
        assert!(headers_match(&binding, Some(&headers)));
        binding.insert("x-match", "all");
        assert!(!headers_match(&binding, Some(&headers)));
        headers.insert("b", "x");
        assert!(headers_match(&binding, Some(&headers)));
    }
}
