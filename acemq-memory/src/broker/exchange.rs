//! Exchanges and their routing: default, direct, fanout, topic (`*`, `#`),
//! headers (`x-match` all/any), and exchange-to-exchange bindings. Routing is
//! a pure function of the bindings; it must never touch a queue.
//!
//! Bindings are a set in ordered maps (by destination, then key), with an
//! index by routing key for direct exchanges and a trie of words for topic
//! exchanges: a binding check is O(log n), and a publish to a direct or
//! topic exchange costs what its matches cost, not what its bindings do.

use std::collections::{BTreeMap, HashSet};

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
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Destination {
    Queue(ShortString),
    Exchange(ShortString),
}

#[derive(Debug, Clone)]
pub(crate) struct Exchange {
    pub name: ShortString,
    pub kind: ExchangeKind,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    pub bindings: Bindings,
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
            bindings: Bindings::default(),
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
    /// `headers` reaches through this exchange's own bindings (each once).
    pub fn matches<'a>(&'a self, routing_key: &[u8], headers: Option<&FieldTable>, out: &mut Vec<&'a Destination>) {
        let b = &self.bindings;
        match self.kind {
            ExchangeKind::Direct => {
                if let Some(dests) = b.by_key.get(routing_key) {
                    out.extend(dests.keys());
                }
            }
            ExchangeKind::Fanout => out.extend(b.by_dest.keys()),
            ExchangeKind::Topic => b.topic.matches(routing_key, out),
            ExchangeKind::Headers => {
                for (dest, keys) in &b.by_dest {
                    if keys.values().flatten().any(|args| headers_match(args, headers)) {
                        out.push(dest);
                    }
                }
            }
        }
    }
}

/// One binding: where to, with which key and arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Binding {
    pub destination: Destination,
    pub key: ShortString,
    pub arguments: FieldTable,
}

/// An exchange's bindings: a set (by destination, then key, then the
/// arguments), indexed by routing key and, for topic exchanges, by words.
#[derive(Debug, Clone, Default)]
pub(crate) struct Bindings {
    by_dest: BTreeMap<Destination, BTreeMap<ShortString, Vec<FieldTable>>>,
    /// How many bindings lead to each destination with each key.
    by_key: BTreeMap<Box<[u8]>, BTreeMap<Destination, usize>>,
    topic: TopicNode,
    len: usize,
}

impl Bindings {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, binding: &Binding) -> bool {
        self.by_dest
            .get(&binding.destination)
            .and_then(|keys| keys.get(&binding.key))
            .is_some_and(|all| all.contains(&binding.arguments))
    }

    /// Adds a binding; `false` if it was there.
    pub fn insert(&mut self, binding: Binding) -> bool {
        let all = self
            .by_dest
            .entry(binding.destination.clone())
            .or_default()
            .entry(binding.key.clone())
            .or_default();
        if all.contains(&binding.arguments) {
            return false;
        }
        all.push(binding.arguments);
        *self
            .by_key
            .entry(binding.key.as_bytes().into())
            .or_default()
            .entry(binding.destination.clone())
            .or_default() += 1;
        self.topic.add(binding.key.as_bytes(), &binding.destination);
        self.len += 1;
        true
    }

    /// Removes a binding; `false` if it was not there.
    pub fn remove(&mut self, binding: &Binding) -> bool {
        let Some(keys) = self.by_dest.get_mut(&binding.destination) else {
            return false;
        };
        let Some(all) = keys.get_mut(&binding.key) else {
            return false;
        };
        let Some(at) = all.iter().position(|a| a == &binding.arguments) else {
            return false;
        };
        all.remove(at);
        if all.is_empty() {
            keys.remove(&binding.key);
            if keys.is_empty() {
                self.by_dest.remove(&binding.destination);
            }
        }
        self.forget_indexed(&binding.key, &binding.destination, 1);
        self.len -= 1;
        true
    }

    /// Removes every binding to `destination`; returns how many went.
    pub fn remove_destination(&mut self, destination: &Destination) -> usize {
        let Some(keys) = self.by_dest.remove(destination) else {
            return 0;
        };
        let mut gone = 0;
        for (key, all) in keys {
            self.forget_indexed(&key, destination, all.len());
            gone += all.len();
        }
        self.len -= gone;
        gone
    }

    /// Keeps only the bindings to destinations `keep` accepts.
    pub fn retain_destinations(&mut self, mut keep: impl FnMut(&Destination) -> bool) {
        let gone: Vec<Destination> = self.by_dest.keys().filter(|d| !keep(d)).cloned().collect();
        for destination in gone {
            self.remove_destination(&destination);
        }
    }

    fn forget_indexed(&mut self, key: &ShortString, destination: &Destination, count: usize) {
        if let Some(dests) = self.by_key.get_mut(key.as_bytes()) {
            if let Some(n) = dests.get_mut(destination) {
                *n = n.saturating_sub(count);
                if *n == 0 {
                    dests.remove(destination);
                }
            }
            if dests.is_empty() {
                self.by_key.remove(key.as_bytes());
            }
        }
        for _ in 0..count {
            self.topic.remove(key.as_bytes(), destination);
        }
    }
}

/// A node of the topic trie: one word of a binding key per level (`*` and
/// `#` are words too), with the destinations whose key ends here.
#[derive(Debug, Clone, Default)]
struct TopicNode {
    children: BTreeMap<Box<[u8]>, TopicNode>,
    ends: BTreeMap<Destination, usize>,
    /// This node is a `#` word: it may take one more word and stay.
    is_hash: bool,
}

impl TopicNode {
    fn add(&mut self, key: &[u8], destination: &Destination) {
        let mut node = self;
        for word in key.split(|b| *b == b'.') {
            node = node.children.entry(word.into()).or_default();
            node.is_hash = word == b"#";
        }
        *node.ends.entry(destination.clone()).or_default() += 1;
    }

    /// Removes one binding of `key` to `destination`; returns whether this
    /// node is empty now (so its parent drops it).
    fn remove(&mut self, key: &[u8], destination: &Destination) -> bool {
        let mut words = key.split(|b| *b == b'.');
        self.remove_words(&mut words, destination);
        self.children.is_empty() && self.ends.is_empty()
    }

    fn remove_words<'k>(&mut self, words: &mut impl Iterator<Item = &'k [u8]>, destination: &Destination) {
        match words.next() {
            None => {
                if let Some(n) = self.ends.get_mut(destination) {
                    *n -= 1;
                    if *n == 0 {
                        self.ends.remove(destination);
                    }
                }
            }
            Some(word) => {
                if let Some(child) = self.children.get_mut(word) {
                    child.remove_words(words, destination);
                    if child.children.is_empty() && child.ends.is_empty() {
                        self.children.remove(word);
                    }
                }
            }
        }
    }

    /// The destinations whose binding key matches `routing_key`, each once.
    fn matches<'a>(&'a self, routing_key: &[u8], out: &mut Vec<&'a Destination>) {
        if self.children.is_empty() {
            return;
        }
        let words: Vec<&[u8]> = routing_key.split(|b| *b == b'.').collect();
        let mut seen_states = HashSet::new();
        let mut found: HashSet<&'a Destination> = HashSet::new();
        self.walk(&words, 0, &mut seen_states, &mut found, out);
    }

    /// Visits each (node, position) once, with a constant number of steps
    /// from each, so patterns of many `#` stay linear in nodes times words.
    fn walk<'a>(
        &'a self,
        words: &[&[u8]],
        at: usize,
        seen_states: &mut HashSet<(*const TopicNode, usize)>,
        found: &mut HashSet<&'a Destination>,
        out: &mut Vec<&'a Destination>,
    ) {
        if !seen_states.insert((self as *const TopicNode, at)) {
            return;
        }
        if at == words.len() {
            for dest in self.ends.keys() {
                if found.insert(dest) {
                    out.push(dest);
                }
            }
        }
        // Entering a `#` takes no word; staying in it takes one more.
        if let Some(hash) = self.children.get(b"#".as_slice()) {
            hash.walk(words, at, seen_states, found, out);
        }
        if self.is_hash && at < words.len() {
            self.walk(words, at + 1, seen_states, found, out);
        }
        if at < words.len() {
            if let Some(child) = self.children.get(words[at]) {
                child.walk(words, at + 1, seen_states, found, out);
            }
            if words[at] != b"*" {
                if let Some(star) = self.children.get(b"*".as_slice()) {
                    star.walk(words, at + 1, seen_states, found, out);
                }
            }
        }
    }
}

/// Topic matching of one pattern: words separated by `.`, `*` is exactly
/// one word, `#` is zero or more. Dynamic programming; the tests' reference
/// for the trie.
#[cfg(test)]
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

    fn queue(name: &str) -> Destination {
        Destination::Queue(name.into())
    }

    fn binding(dest: &str, key: &str) -> Binding {
        Binding {
            destination: queue(dest),
            key: key.into(),
            arguments: FieldTable::new(),
        }
    }

    fn routed(x: &Exchange, key: &str) -> Vec<Destination> {
        let mut out = Vec::new();
        x.matches(key.as_bytes(), None, &mut out);
        let mut out: Vec<Destination> = out.into_iter().cloned().collect();
        out.sort();
        out
    }

    #[test]
    fn bindings_are_a_set_and_unbinding_removes_one() {
        let mut x = Exchange::new("x", ExchangeKind::Direct, false);
        assert!(x.bindings.insert(binding("q", "k")));
        assert!(!x.bindings.insert(binding("q", "k")), "the same binding twice is one");
        let mut with_args = binding("q", "k");
        with_args.arguments.insert("a", 1i32);
        assert!(x.bindings.insert(with_args.clone()), "other arguments, another binding");
        assert!(x.bindings.contains(&with_args));
        assert_eq!(routed(&x, "k"), vec![queue("q")], "a destination is reached once");
        assert!(x.bindings.remove(&binding("q", "k")));
        assert_eq!(routed(&x, "k"), vec![queue("q")], "the other binding still routes");
        assert!(!x.bindings.remove(&binding("q", "k")));
        assert!(x.bindings.remove(&with_args));
        assert!(x.bindings.is_empty());
        assert!(routed(&x, "k").is_empty());
        assert!(
            x.bindings.by_key.is_empty() && x.bindings.topic.children.is_empty(),
            "indexes emptied"
        );
    }

    #[test]
    fn removing_a_destination_removes_all_its_bindings() {
        let mut x = Exchange::new("x", ExchangeKind::Topic, false);
        for key in ["a.*", "a.#", "b"] {
            x.bindings.insert(binding("q", key));
        }
        x.bindings.insert(binding("r", "a.b"));
        assert_eq!(routed(&x, "a.b"), vec![queue("q"), queue("r")]);
        assert_eq!(x.bindings.remove_destination(&queue("q")), 3);
        assert_eq!(routed(&x, "a.b"), vec![queue("r")]);
        assert!(routed(&x, "b").is_empty());
    }

    #[test]
    fn many_hashes_in_a_pattern_do_not_blow_up() {
        let mut x = Exchange::new("x", ExchangeKind::Topic, false);
        let pattern = vec!["#"; 200].join(".") + ".z";
        x.bindings.insert(binding("q", &pattern));
        let key = vec!["a"; 200].join(".");
        let started = std::time::Instant::now();
        assert!(routed(&x, &key).is_empty());
        assert_eq!(routed(&x, &(key + ".z")), vec![queue("q")]);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    proptest::proptest! {
        /// The trie routes as the one-pattern matcher does, for every
        /// binding at once.
        #[test]
        fn the_topic_trie_agrees_with_pattern_matching(
            patterns in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(vec!["a", "b", "*", "#", ""]), 1..5), 1..8),
            keys in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(vec!["a", "b", "*", "#", ""]), 1..6), 1..8),
        ) {
            let mut x = Exchange::new("x", ExchangeKind::Topic, false);
            let patterns: Vec<String> = patterns.iter().map(|p| p.join(".")).collect();
            for (n, p) in patterns.iter().enumerate() {
                x.bindings.insert(binding(&format!("q{n}"), p));
            }
            for key in keys.iter().map(|k| k.join(".")) {
                let mut expected: Vec<Destination> = patterns
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| topic_matches(p.as_bytes(), key.as_bytes()))
                    .map(|(n, _)| queue(&format!("q{n}")))
                    .collect();
                expected.sort();
                proptest::prop_assert_eq!(routed(&x, &key), expected, "key {:?}", key);
            }
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
