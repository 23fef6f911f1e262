//! Every normalisation of the differential transcript, in one place: what
//! may legitimately differ between acemq-memory and RabbitMQ is rewritten
//! here before anything is recorded, and nowhere else. Everything not
//! named here is compared exactly.
//!
//! Not recorded at all (so nothing to normalise): product, version and
//! platform strings of `connection.start`, channel numbers (the client
//! chooses them), and queue counts while a run converges (only the counts
//! once it is quiet are recorded, see the runner).
//!
//! The same normalisation serves two RabbitMQ versions, acemq-memory
//! against the RabbitMQ it imitates, or any two brokers: it rewrites only
//! names and ids the broker or the harness chooses (the sequence's name
//! prefix, generated consumer tags), a wall-clock time, the order of a
//! table's keys, and a count that only timing decides. Reply codes, reply
//! texts, flags, properties and the order of events on a channel are
//! compared as they are.

use std::collections::HashMap;

use acemq_codec::{BasicProperties, FieldArray, FieldTable, FieldValue};

use super::ops::Q;

/// `text` with the sequence's name prefix (unique to the sequence and the
/// broker, so it differs between the two runs) written `P`: a queue is
/// `P.qc` in every transcript.
pub fn prefix(text: &str, prefix: &str) -> String {
    text.replace(prefix, "P")
}

/// The normaliser of one run: it numbers server-chosen names in the order
/// they first appear, so the same run on both brokers gets the same names.
#[derive(Debug, Default)]
pub struct Normaliser {
    tags: HashMap<String, String>,
}

impl Normaliser {
    /// A consumer tag. Tags the server generates (the client sent an empty
    /// one) are `amq.ctag-` and a random suffix on RabbitMQ: they become
    /// `amq.ctag-#N`, N counting the run's generated tags in the order they
    /// first appear. A tag the client chose is kept as it is.
    pub fn consumer_tag(&mut self, tag: &str) -> String {
        if !tag.starts_with("amq.ctag-") {
            return tag.to_string();
        }
        let next = self.tags.len();
        self.tags
            .entry(tag.to_string())
            .or_insert_with(|| format!("amq.ctag-#{next}"))
            .clone()
    }

    /// Reply texts name server-generated consumer tags now and then (e.g.
    /// a 530 about a reused tag); they are numbered as in
    /// [`Normaliser::consumer_tag`]. Everything else in a text is compared.
    pub fn text(&mut self, text: &str) -> String {
        let Some(at) = text.find("amq.ctag-") else {
            return text.to_string();
        };
        let end = text[at..]
            .find(|c: char| c == '\'' || c == '"' || c.is_whitespace())
            .map_or(text.len(), |n| at + n);
        let tag = self.consumer_tag(&text[at..end]);
        format!("{}{}{}", &text[..at], tag, self.text(&text[end..]))
    }
}

/// The counts of a `queue.declare-ok` for a queue of type `kind` (as the
/// run declared it; `None` when it does not know), as recorded. A stream's message count is not compared: RabbitMQ 3.10.8
/// answers with the count of its queue metrics (`rabbit_stream_queue:stat`
/// reads `queue_coarse_metrics`, sampled every few seconds), 0 until the
/// first sample, so the same run reads 0 or the length by timing alone.
/// Its consumer count is compared (RabbitMQ always says 0).
pub fn declare_counts(kind: Option<Q>, message_count: u32, consumer_count: u32) -> String {
    if kind != Some(Q::Classic) && kind != Some(Q::Quorum) {
        format!("(_,{consumer_count})")
    } else {
        format!("({message_count},{consumer_count})")
    }
}

/// A message's properties as recorded.
///
/// - Field tables are sorted by key, recursively: a table is a map to its
///   readers (RabbitMQ rebuilds `headers` when it adds `x-death` and does
///   not keep the publisher's order; no client looks a header up by
///   position). Duplicate keys keep their relative order.
/// - Each `x-death` entry's `time` is dropped: it is the broker's wall
///   clock at the death.
pub fn properties(props: &BasicProperties) -> BasicProperties {
    let mut props = props.clone();
    if let Some(headers) = props.headers.take() {
        let mut headers = table(&headers);
        if let Some(FieldValue::Array(deaths)) = headers.remove("x-death") {
            let deaths = deaths
                .iter()
                .map(|death| match death {
                    FieldValue::Table(t) => {
                        let mut t = t.clone();
                        t.remove("time");
                        FieldValue::Table(t)
                    }
                    other => other.clone(),
                })
                .collect();
            headers = table(&headers);
            headers.insert("x-death", FieldValue::Array(FieldArray(deaths)));
            headers = table(&headers);
        }
        props.headers = Some(headers);
    }
    props
}

fn table(t: &FieldTable) -> FieldTable {
    let mut entries: Vec<(String, FieldValue)> = t
        .iter()
        .map(|(k, v)| (k.as_str().unwrap_or_default().to_string(), value(v)))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().collect()
}

fn value(v: &FieldValue) -> FieldValue {
    match v {
        FieldValue::Table(t) => FieldValue::Table(table(t)),
        FieldValue::Array(a) => FieldValue::Array(FieldArray(a.iter().map(value).collect())),
        other => other.clone(),
    }
}
