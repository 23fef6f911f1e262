//! A stream's log, kept as RabbitMQ 3.10.8 (osiris) keeps it: entries with
//! offsets, grouped in segments of at most `x-stream-max-segment-size-bytes`,
//! and retention (`x-max-length-bytes`, `x-max-age`) that drops whole
//! segments, oldest first, only when a segment rolls over. Never blocks a
//! publish and never renumbers an offset.
//!
//! What is observable on RabbitMQ and copied here: a segment rolls over right
//! after the write that takes it to its maximum size or past it; each new
//! segment begins with a tracking chunk that takes one offset, so offsets
//! leap by one at every roll-over; at a roll-over the oldest segments go
//! while the log holds more than `x-max-length-bytes`, or while the newest
//! message of the oldest segment is older than `x-max-age`; the segment just
//! begun always stays. The size of an entry on disk is an estimate (the
//! AMQP 1.0 encoding osiris stores, with its chunk header): a consumer sees
//! the same kind of gaps and cuts as on RabbitMQ, not necessarily at the
//! same offsets.

use std::collections::VecDeque;
use std::sync::Arc;

use acemq_codec::FieldValue;
use bytes::BytesMut;

use super::args::QueueSettings;
use super::message::Message;

/// RabbitMQ's default `x-stream-max-segment-size-bytes`: 500 MB.
const DEFAULT_MAX_SEGMENT_SIZE: u64 = 500_000_000;

/// The bytes a segment file starts with.
const SEGMENT_HEADER: u64 = 8;

/// The bytes an entry takes on disk besides its body, exchange, routing key
/// and properties (chunk header, record header, AMQP 1.0 sections). With it,
/// the number of messages per segment matches what RabbitMQ 3.10.8 showed
/// for bodies of 10, 100 and 500 bytes published one at a time.
const ENTRY_OVERHEAD: u64 = 138;

/// One entry of a stream's log.
#[derive(Debug, Clone)]
pub(crate) struct StreamEntry {
    pub offset: u64,
    pub timestamp_ms: u64,
    pub msg: Arc<Message>,
}

/// A segment's bookkeeping: its entries are the next `entries` of the log.
#[derive(Debug, Clone, Copy)]
struct Segment {
    entries: usize,
    bytes: u64,
    newest_ms: u64,
}

impl Segment {
    fn empty() -> Self {
        Segment {
            entries: 0,
            bytes: SEGMENT_HEADER,
            newest_ms: 0,
        }
    }
}

/// Where a stream consumer starts, from its `x-stream-offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartAt {
    First,
    Last,
    Next,
    Offset(u64),
    /// Seconds since the epoch.
    Timestamp(i64),
}

impl StartAt {
    /// Reads `x-stream-offset` (`None` when absent: `next`); `Err` for a
    /// value RabbitMQ refuses.
    pub fn parse(value: Option<&FieldValue>) -> Result<Self, ()> {
        Ok(match value {
            None => StartAt::Next,
            Some(FieldValue::LongString(s)) => match s.as_bytes() {
                b"first" => StartAt::First,
                b"last" => StartAt::Last,
                b"next" => StartAt::Next,
                _ => return Err(()),
            },
            Some(FieldValue::Timestamp(secs)) => StartAt::Timestamp(*secs as i64),
            Some(v) => match v.as_i64() {
                Some(n) => StartAt::Offset(n.max(0) as u64),
                None => return Err(()),
            },
        })
    }
}

/// The log of one stream.
#[derive(Debug)]
pub(crate) struct StreamLog {
    entries: VecDeque<StreamEntry>,
    /// Oldest first; the last one is being written.
    segments: VecDeque<Segment>,
    /// The bytes of every segment together, kept as they change (so a
    /// roll-over never sums the segments).
    total_bytes: u64,
    next_offset: u64,
    max_segment_size: u64,
    max_bytes: Option<u64>,
    max_age_ms: Option<u64>,
}

impl StreamLog {
    pub fn new(settings: &QueueSettings) -> Self {
        StreamLog {
            entries: VecDeque::new(),
            segments: VecDeque::from([Segment::empty()]),
            total_bytes: SEGMENT_HEADER,
            next_offset: 0,
            max_segment_size: settings.max_segment_size.unwrap_or(DEFAULT_MAX_SEGMENT_SIZE),
            max_bytes: settings.max_length_bytes,
            max_age_ms: settings.max_age_ms,
        }
    }

    /// How many messages it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Appends a message published at `wall_ms`; a full segment rolls over
    /// and retention runs.
    pub fn append(&mut self, msg: Arc<Message>, wall_ms: u64) {
        let size = entry_size(&msg);
        self.entries.push_back(StreamEntry {
            offset: self.next_offset,
            timestamp_ms: wall_ms,
            msg,
        });
        self.next_offset += 1;
        let Some(current) = self.segments.back_mut() else {
            return;
        };
        current.entries += 1;
        current.bytes += size;
        self.total_bytes += size;
        current.newest_ms = wall_ms;
        if current.bytes >= self.max_segment_size {
            self.roll_over(wall_ms);
        }
    }

    /// A new segment, with its tracking chunk; then retention.
    fn roll_over(&mut self, wall_ms: u64) {
        self.segments.push_back(Segment::empty());
        self.total_bytes += SEGMENT_HEADER;
        self.next_offset += 1;
        while self.segments.len() > 1 {
            let Some(oldest) = self.segments.front() else { break };
            let too_big = self.max_bytes.is_some_and(|max| self.total_bytes > max);
            let too_old = self
                .max_age_ms
                .is_some_and(|age| oldest.newest_ms.saturating_add(age) < wall_ms);
            if !(too_big || too_old) {
                break;
            }
            let gone = oldest.entries;
            self.total_bytes -= oldest.bytes;
            self.segments.pop_front();
            self.entries.drain(..gone.min(self.entries.len()));
        }
    }

    /// The offset a consumer starting at `at` reads first.
    pub fn start(&self, at: StartAt) -> u64 {
        let first = self.entries.front().map_or(self.next_offset, |e| e.offset);
        match at {
            StartAt::First => first,
            StartAt::Last => self.entries.back().map_or(self.next_offset, |e| e.offset),
            StartAt::Next => self.next_offset,
            // An offset past the end waits for it, as RabbitMQ 3.10.8 does.
            StartAt::Offset(n) => n.max(first),
            StartAt::Timestamp(secs) => {
                let ms = secs.saturating_mul(1000);
                self.entries
                    .iter()
                    .find(|e| i128::from(e.timestamp_ms) >= i128::from(ms))
                    .map_or(self.next_offset, |e| e.offset)
            }
        }
    }

    /// The first entry at `offset` or after it (retention may have taken
    /// the ones a slow consumer had not read yet: it goes on from the oldest).
    pub fn entry_from(&self, offset: u64) -> Option<&StreamEntry> {
        let at = self.entries.partition_point(|e| e.offset < offset);
        self.entries.get(at)
    }
}

/// An estimate of the bytes a message takes in a segment.
fn entry_size(msg: &Message) -> u64 {
    let mut scratch = BytesMut::new();
    let properties = msg
        .outgoing_properties(Default::default(), &mut scratch)
        .map_or(0, <[u8]>::len);
    let body = msg.body.len() as u64;
    // AMQP 1.0 binary data above 255 bytes has a 4-byte length, not 1.
    let long_body = if body > 255 { 3 } else { 0 };
    ENTRY_OVERHEAD + body + long_body + (msg.exchange.len() + msg.routing_key.len() + properties) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::message::Header;
    use acemq_codec::{FieldTable, Properties};

    fn settings(segment: u64, max_bytes: Option<u64>, max_age_ms: Option<u64>) -> QueueSettings {
        let mut args = FieldTable::new();
        args.insert("x-queue-type", "stream");
        let mut s = crate::broker::args::queue_settings(&args, &"s".into(), "/", None).unwrap();
        s.max_segment_size = Some(segment);
        s.max_length_bytes = max_bytes;
        s.max_age_ms = max_age_ms;
        s
    }

    fn message(body: usize) -> Arc<Message> {
        Arc::new(Message {
            exchange: "".into(),
            routing_key: "acemq-test.seg.28665.1".into(),
            header: Header::Decoded(Properties::default()),
            body: vec![b'x'; body].into(),
        })
    }

    fn segment_starts(log: &StreamLog) -> Vec<usize> {
        let offsets: Vec<u64> = log.entries.iter().map(|e| e.offset).collect();
        offsets
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[1] != w[0] + 1)
            .map(|(i, _)| i + 1)
            .collect()
    }

    #[test]
    fn segments_hold_as_many_messages_as_on_rabbitmq() {
        // What RabbitMQ 3.10.8 showed: (segment size, body size, messages per segment).
        for (segment, body, per_segment) in [
            (1000, 10, 6),
            (1000, 100, 4),
            (1000, 500, 2),
            (2000, 100, 8),
            (4000, 100, 16),
        ] {
            let mut log = StreamLog::new(&settings(segment, None, None));
            for _ in 0..per_segment * 3 {
                log.append(message(body), 0);
            }
            assert_eq!(
                segment_starts(&log),
                vec![per_segment, 2 * per_segment],
                "segment {segment}, body {body}"
            );
        }
    }

    /// RabbitMQ takes a segment size of 0: every message rolls a segment
    /// over. Each roll-over used to sum every segment, so 50,000 messages
    /// took seconds; with the running total they take milliseconds.
    #[test]
    fn a_segment_size_of_0_rolls_over_at_every_message_in_linear_time() {
        let mut log = StreamLog::new(&settings(0, None, None));
        let started = std::time::Instant::now();
        for _ in 0..50_000 {
            log.append(message(10), 0);
        }
        let took = started.elapsed();
        assert_eq!(log.len(), 50_000);
        assert_eq!(log.segments.len(), 50_001, "one segment per message, and the one begun");
        assert_eq!(
            log.start(StartAt::Last),
            2 * 50_000 - 2,
            "an offset leap at every roll-over"
        );
        assert!(took < std::time::Duration::from_secs(2), "50,000 appends took {took:?}");
    }

    #[test]
    fn the_running_total_is_the_sum_of_the_segments() {
        let mut log = StreamLog::new(&settings(1000, Some(5000), None));
        for n in 0..500 {
            log.append(message(n % 300), 0);
            let sum: u64 = log.segments.iter().map(|s| s.bytes).sum();
            assert_eq!(log.total_bytes, sum, "after {n} appends");
        }
    }

    #[test]
    fn retention_drops_whole_segments_at_roll_over() {
        let mut log = StreamLog::new(&settings(1000, Some(5000), None));
        for _ in 0..100 {
            log.append(message(100), 0);
        }
        // Four full segments of four stay, as on RabbitMQ; the last message too.
        assert_eq!(log.len(), 16);
        assert_eq!(log.start(StartAt::First), 84 + 21);
        assert_eq!(log.start(StartAt::Last), 99 + 24);

        let mut log = StreamLog::new(&settings(1000, None, Some(1000)));
        for _ in 0..20 {
            log.append(message(100), 0);
        }
        assert_eq!(log.len(), 20, "nothing is old yet");
        for _ in 0..3 {
            log.append(message(100), 2500);
        }
        assert_eq!(log.len(), 23, "no roll-over, no retention");
        log.append(message(100), 2500);
        assert_eq!(log.len(), 4, "the old segments went at the roll-over");
        assert_eq!(log.entry_from(0).map(|e| e.offset), Some(25));
    }
}
