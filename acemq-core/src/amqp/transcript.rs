//! Wire transcripts: what went over one connection's socket, frame by frame,
//! each with its time and direction ([`Transcript`], [`TranscriptEntry`]),
//! recorded when [`super::Config::transcript`] asks for it.
//!
//! The driver hands the recorder the bytes of each read and of each batch it
//! queues for writing; the recorder splits them into frames on its own
//! (a body frame is counted, never copied) and decodes the others with the
//! codec. It never touches the bytes the machine parses, so a connection
//! recorded behaves as one that is not; one that is not recorded pays one
//! branch per read and per write batch.
//!
//! It must never panic on what a peer sends, nor keep more than its
//! capacity of entries; it imports nothing of the engine but the codec.

use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use acemq_codec::{
    ContentHeader, Frame, FrameDecoder, Method, UndecodableHeader, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT,
    FRAME_METHOD, FRAME_OVERHEAD,
};
use bytes::BytesMut;

/// Method and content header frames larger than this are listed with
/// their size but not decoded (their bytes are skipped, not kept).
pub const MAX_DECODED_FRAME: usize = 4 << 20;

/// How many characters of one frame's fields [`Transcript`]'s `Display`
/// shows before it cuts the line.
pub const DISPLAY_BUDGET: usize = 480;

/// Which way a frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From this client to the broker.
    Sent,
    /// From the broker to this client.
    Received,
}

impl Direction {
    /// `>>` for sent, `<<` for received.
    pub fn arrow(self) -> &'static str {
        match self {
            Direction::Sent => ">>",
            Direction::Received => "<<",
        }
    }
}

/// One frame (or stretch of bytes) as the recorder saw it on the wire.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
// As `Frame`: a content header is moved, not boxed.
#[allow(clippy::large_enum_variant)]
pub enum WireFrame {
    /// The 8 bytes that open a connection (`AMQP 0 0 9 1`), or what came in
    /// their place.
    ProtocolHeader([u8; 8]),
    /// A method frame.
    Method {
        /// Its channel.
        channel: u16,
        /// The method with its fields.
        method: Method,
    },
    /// A content header frame.
    Header {
        /// Its channel.
        channel: u16,
        /// Class, body size and properties.
        header: ContentHeader,
    },
    /// A content header whose properties do not decode.
    UndecodableHeader {
        /// Its channel.
        channel: u16,
        /// What could be read of it, and the error.
        header: UndecodableHeader,
    },
    /// A body frame: only its size is kept.
    Body {
        /// Its channel.
        channel: u16,
        /// Its payload's size in bytes.
        size: usize,
    },
    /// A heartbeat frame.
    Heartbeat,
    /// A frame of a known type and size that did not decode (an unknown
    /// method, a payload too short or too long, a bad end byte).
    Undecodable {
        /// Its frame type.
        frame_type: u8,
        /// Its channel.
        channel: u16,
        /// Its payload's size, as its frame header says.
        size: usize,
        /// The codec's error.
        error: acemq_codec::Error,
    },
    /// A method or header frame larger than [`MAX_DECODED_FRAME`]: listed,
    /// not decoded.
    TooLarge {
        /// Its frame type.
        frame_type: u8,
        /// Its channel.
        channel: u16,
        /// Its payload's size.
        size: usize,
    },
    /// Bytes that are no frame (an unknown frame type): the framing of this
    /// direction is lost, and every later stretch of it is listed this way,
    /// by size.
    Unframed {
        /// How many bytes.
        size: usize,
        /// Why the framing was lost (on the first such entry).
        error: Option<acemq_codec::Error>,
    },
}

impl WireFrame {
    /// The channel it is on (0 for heartbeats, protocol headers and
    /// unframed bytes).
    pub fn channel(&self) -> u16 {
        match self {
            WireFrame::Method { channel, .. }
            | WireFrame::Header { channel, .. }
            | WireFrame::UndecodableHeader { channel, .. }
            | WireFrame::Body { channel, .. }
            | WireFrame::Undecodable { channel, .. }
            | WireFrame::TooLarge { channel, .. } => *channel,
            WireFrame::ProtocolHeader(_) | WireFrame::Heartbeat | WireFrame::Unframed { .. } => 0,
        }
    }

    /// The method, for a method frame.
    pub fn method(&self) -> Option<&Method> {
        match self {
            WireFrame::Method { method, .. } => Some(method),
            _ => None,
        }
    }

    /// A short name: the method's (`basic.publish`), or `header`, `body`,
    /// `heartbeat`, `protocol-header`, `undecodable`, `too-large`,
    /// `unframed`.
    pub fn name(&self) -> &'static str {
        match self {
            WireFrame::Method { method, .. } => method.name(),
            WireFrame::Header { .. } | WireFrame::UndecodableHeader { .. } => "header",
            WireFrame::Body { .. } => "body",
            WireFrame::Heartbeat => "heartbeat",
            WireFrame::ProtocolHeader(_) => "protocol-header",
            WireFrame::Undecodable { .. } => "undecodable",
            WireFrame::TooLarge { .. } => "too-large",
            WireFrame::Unframed { .. } => "unframed",
        }
    }

    fn from_frame(frame: Frame) -> WireFrame {
        match frame {
            Frame::Method(channel, method) => WireFrame::Method { channel, method },
            Frame::Header(channel, header) => WireFrame::Header { channel, header },
            Frame::UndecodableHeader(channel, header) => WireFrame::UndecodableHeader { channel, header },
            Frame::Body(channel, body) => WireFrame::Body {
                channel,
                size: body.len(),
            },
            Frame::Heartbeat => WireFrame::Heartbeat,
        }
    }
}

/// One line of a transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscriptEntry {
    /// When, since the recording began (the connection's first dial).
    pub at: Duration,
    /// Which way.
    pub direction: Direction,
    /// What.
    pub frame: WireFrame,
}

impl fmt::Display for TranscriptEntry {
    /// One line: time, direction, channel, what; fields cut at
    /// [`DISPLAY_BUDGET`] characters, control characters escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = Bounded::new(DISPLAY_BUDGET);
        let _ = self.write_fields(&mut line);
        write!(
            f,
            "{:>10.6}s {} ch{:<5} {}",
            self.at.as_secs_f64(),
            self.direction.arrow(),
            self.frame.channel(),
            line.finish()
        )
    }
}

impl TranscriptEntry {
    fn write_fields(&self, out: &mut Bounded) -> fmt::Result {
        match &self.frame {
            WireFrame::Method { method, .. } => {
                out.write_str(method.name())?;
                out.method_fields(method)
            }
            WireFrame::Header { header, .. } => {
                write!(
                    out,
                    "header class={} body-size={} properties={:?}",
                    header.class_id, header.body_size, header.properties
                )
            }
            WireFrame::UndecodableHeader { header, .. } => write!(
                out,
                "header class={} body-size={} properties undecodable ({}, {} bytes)",
                header.class_id,
                header.body_size,
                header.error,
                header.raw_properties.len()
            ),
            WireFrame::Body { size, .. } => write!(out, "body {size} bytes"),
            WireFrame::Heartbeat => out.write_str("heartbeat"),
            WireFrame::ProtocolHeader(bytes) => write!(out, "protocol-header {bytes:02x?}"),
            WireFrame::Undecodable {
                frame_type,
                size,
                error,
                ..
            } => write!(out, "undecodable frame type {frame_type}, {size} bytes: {error}"),
            WireFrame::TooLarge { frame_type, size, .. } => {
                write!(out, "frame type {frame_type} of {size} bytes, too large to decode")
            }
            WireFrame::Unframed {
                size,
                error: Some(error),
            } => write!(out, "unframed {size} bytes: {error}"),
            WireFrame::Unframed { size, error: None } => write!(out, "unframed {size} bytes"),
        }
    }
}

/// What one connection's recorder holds: at most its capacity of entries,
/// the oldest dropped first (counted in [`Transcript::dropped`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transcript {
    entries: Vec<TranscriptEntry>,
    dropped: u64,
    started: Option<SystemTime>,
}

impl Transcript {
    /// The entries, oldest first.
    pub fn entries(&self) -> &[TranscriptEntry] {
        &self.entries
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> std::slice::Iter<'_, TranscriptEntry> {
        self.entries.iter()
    }

    /// How many entries there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many older entries were dropped to keep within the capacity.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// When the recording began (wall clock), the origin of every
    /// [`TranscriptEntry::at`].
    pub fn started(&self) -> Option<SystemTime> {
        self.started
    }

    /// The entries, oldest first, by value.
    pub fn into_entries(self) -> Vec<TranscriptEntry> {
        self.entries
    }
}

impl IntoIterator for Transcript {
    type Item = TranscriptEntry;
    type IntoIter = std::vec::IntoIter<TranscriptEntry>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a> IntoIterator for &'a Transcript {
    type Item = &'a TranscriptEntry;
    type IntoIter = std::slice::Iter<'a, TranscriptEntry>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

impl fmt::Display for Transcript {
    /// One line per entry (see [`TranscriptEntry`]'s `Display`), after a
    /// line saying how many were dropped, if any.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dropped > 0 {
            writeln!(f, "... {} earlier frames dropped (capacity reached)", self.dropped)?;
        }
        for entry in &self.entries {
            writeln!(f, "{entry}")?;
        }
        Ok(())
    }
}

/// The entries a recorder keeps, shared with the connection's handles.
#[derive(Debug)]
pub(crate) struct TranscriptLog {
    capacity: usize,
    started: Instant,
    started_wall: SystemTime,
    entries: Mutex<(VecDeque<TranscriptEntry>, u64)>,
}

impl TranscriptLog {
    /// A log keeping at most `capacity` entries (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        TranscriptLog {
            capacity: capacity.max(1),
            started: Instant::now(),
            started_wall: SystemTime::now(),
            entries: Mutex::new((VecDeque::new(), 0)),
        }
    }

    /// What it holds now.
    pub(crate) fn snapshot(&self) -> Transcript {
        let guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        Transcript {
            entries: guard.0.iter().cloned().collect(),
            dropped: guard.1,
            started: Some(self.started_wall),
        }
    }

    fn push_all(&self, direction: Direction, frames: &mut Vec<WireFrame>) {
        if frames.is_empty() {
            return;
        }
        let at = Instant::now().saturating_duration_since(self.started);
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (entries, dropped) = &mut *guard;
        for frame in frames.drain(..) {
            if entries.len() == self.capacity {
                entries.pop_front();
                *dropped += 1;
            }
            entries.push_back(TranscriptEntry { at, direction, frame });
        }
    }
}

/// The driver's recorder: the shared log and one splitter per direction.
#[derive(Debug)]
pub(crate) struct Recorder {
    log: Arc<TranscriptLog>,
    sent: Splitter,
    received: Splitter,
    /// Kept for its allocation.
    frames: Vec<WireFrame>,
}

impl Recorder {
    pub(crate) fn new(log: Arc<TranscriptLog>) -> Self {
        Recorder {
            log,
            sent: Splitter::default(),
            received: Splitter::default(),
            frames: Vec::new(),
        }
    }

    /// Bytes queued to be written, now.
    pub(crate) fn sent(&mut self, bytes: &[u8]) {
        self.sent.feed(bytes, &mut self.frames);
        self.log.push_all(Direction::Sent, &mut self.frames);
    }

    /// Bytes read, now.
    pub(crate) fn received(&mut self, bytes: &[u8]) {
        self.received.feed(bytes, &mut self.frames);
        self.log.push_all(Direction::Received, &mut self.frames);
    }
}

/// Splits one direction's bytes into frames, on its own copy of what it
/// needs: the frame header, and the payload of method and header frames.
#[derive(Debug, Default)]
struct Splitter {
    /// Past the first byte (a protocol header can only come first).
    begun: bool,
    /// What is kept of the frame being read.
    buf: BytesMut,
    /// Body bytes (or those of a frame too large) still to pass.
    skip: usize,
    /// The framing is lost.
    unframed: bool,
}

impl Splitter {
    fn feed(&mut self, mut input: &[u8], out: &mut Vec<WireFrame>) {
        loop {
            if self.skip > 0 {
                let n = self.skip.min(input.len());
                self.skip -= n;
                input = &input[n..];
            }
            if input.is_empty() {
                return;
            }
            if self.unframed {
                out.push(WireFrame::Unframed {
                    size: input.len(),
                    error: None,
                });
                return;
            }
            if !self.begun && self.buf.is_empty() && input[0] != b'A' {
                self.begun = true;
            }
            if !self.begun {
                // `AMQP` and four bytes: taken whole before anything else.
                let take = (8 - self.buf.len()).min(input.len());
                self.buf.extend_from_slice(&input[..take]);
                input = &input[take..];
                if self.buf.len() < 8 {
                    return;
                }
                let mut header = [0u8; 8];
                header.copy_from_slice(&self.buf[..8]);
                self.buf.clear();
                self.begun = true;
                out.push(WireFrame::ProtocolHeader(header));
                continue;
            }
            // The frame header.
            if self.buf.len() < 7 {
                let take = (7 - self.buf.len()).min(input.len());
                self.buf.extend_from_slice(&input[..take]);
                input = &input[take..];
                if self.buf.len() < 7 {
                    return;
                }
            }
            let frame_type = self.buf[0];
            let channel = u16::from_be_bytes([self.buf[1], self.buf[2]]);
            let size = u32::from_be_bytes([self.buf[3], self.buf[4], self.buf[5], self.buf[6]]) as usize;
            match frame_type {
                FRAME_BODY => {
                    out.push(WireFrame::Body { channel, size });
                    self.skip = size.saturating_add(1);
                    self.buf.clear();
                    continue;
                }
                FRAME_METHOD | FRAME_HEADER | FRAME_HEARTBEAT if size > MAX_DECODED_FRAME => {
                    out.push(WireFrame::TooLarge {
                        frame_type,
                        channel,
                        size,
                    });
                    self.skip = size.saturating_add(1);
                    self.buf.clear();
                    continue;
                }
                FRAME_METHOD | FRAME_HEADER | FRAME_HEARTBEAT => {}
                other => {
                    out.push(WireFrame::Unframed {
                        size: self.buf.len() + input.len(),
                        error: Some(acemq_codec::Error::UnknownFrameType(other)),
                    });
                    self.buf = BytesMut::new();
                    self.unframed = true;
                    return;
                }
            }
            let total = size + FRAME_OVERHEAD;
            let take = (total - self.buf.len()).min(input.len());
            self.buf.extend_from_slice(&input[..take]);
            input = &input[take..];
            if self.buf.len() < total {
                return;
            }
            let bytes = self.buf.split().freeze();
            // No limit here: the size was checked above.
            match FrameDecoder::new(0).decode_slice(&bytes) {
                Ok((frame, _)) => out.push(WireFrame::from_frame(frame)),
                Err(error) => out.push(WireFrame::Undecodable {
                    frame_type,
                    channel,
                    size,
                    error,
                }),
            }
        }
    }
}

/// A `fmt::Write` that escapes what a terminal would act on and stops after
/// a budget of characters (a write past it fails, which ends the
/// formatting early: a huge table is never formatted whole).
pub(crate) struct Bounded {
    out: String,
    left: usize,
    cut: bool,
}

impl Bounded {
    pub(crate) fn new(budget: usize) -> Self {
        Bounded {
            out: String::new(),
            left: budget,
            cut: false,
        }
    }

    /// A method's fields as its `Debug` shows them, without the enum's
    /// variant around them: ` { field: value, .. }` (nothing for a method
    /// without fields).
    fn method_fields(&mut self, method: &Method) -> fmt::Result {
        let mut inner = Bounded::new(self.left);
        let result = write!(inner, "{method:?}");
        let cut = inner.cut || result.is_err();
        let mut text = inner.out;
        // `Variant(Struct { .. })`: drop `Variant(` and its `)`.
        if let Some(open) = text.find('(') {
            text.drain(..=open);
            if !cut && text.ends_with(')') {
                text.pop();
            }
        }
        if let Some(brace) = text.find(" { ") {
            if text[..brace].chars().all(|c| c.is_ascii_alphanumeric()) {
                text.drain(..brace);
            }
        } else if text.chars().all(|c| c.is_ascii_alphanumeric()) {
            // A method without fields shows only its name.
            text.clear();
        }
        // Already escaped and within the budget.
        self.left = self.left.saturating_sub(text.chars().count());
        self.out.push_str(&text);
        if cut {
            self.cut = true;
            return Err(fmt::Error);
        }
        Ok(())
    }

    pub(crate) fn finish(mut self) -> String {
        if self.cut {
            self.out.push_str(" …(cut)");
        }
        self.out
    }
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if self.left == 0 {
                self.cut = true;
                return Err(fmt::Error);
            }
            if needs_escape(c) {
                let escaped = format!("\\u{{{:x}}}", c as u32);
                self.left = self.left.saturating_sub(escaped.len());
                self.out.push_str(&escaped);
            } else {
                self.left -= 1;
                self.out.push(c);
            }
        }
        Ok(())
    }
}

/// Control characters, and those that reorder or hide text.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_codec::{
        encode_content, encode_method, BasicProperties, BasicPublish, ConnectionClose, FieldTable, QueueDeclare,
    };

    fn split(chunks: &[&[u8]]) -> Vec<WireFrame> {
        let mut splitter = Splitter::default();
        let mut out = Vec::new();
        for chunk in chunks {
            splitter.feed(chunk, &mut out);
        }
        out
    }

    fn publish_bytes(body: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        let publish: Method = BasicPublish {
            routing_key: "q".into(),
            ..Default::default()
        }
        .into();
        encode_content(1, &publish, &BasicProperties::default(), body, 4096, &mut out).unwrap();
        out
    }

    #[test]
    fn frames_are_split_whatever_the_chunks() {
        let mut wire = BytesMut::from(&acemq_codec::PROTOCOL_HEADER[..]);
        wire.extend_from_slice(&publish_bytes(&[7u8; 10_000]));
        wire.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, 0xCE]);
        let whole = split(&[&wire[..]]);
        let names: Vec<_> = whole.iter().map(WireFrame::name).collect();
        assert_eq!(
            names,
            [
                "protocol-header",
                "basic.publish",
                "header",
                "body",
                "body",
                "body",
                "heartbeat"
            ]
        );
        assert_eq!(whole[3], WireFrame::Body { channel: 1, size: 4088 });
        // Byte by byte: the same frames.
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(split(&bytes), whole);
        let threes: Vec<&[u8]> = wire.chunks(3).collect();
        assert_eq!(split(&threes), whole);
    }

    #[test]
    fn an_unknown_method_is_undecodable_and_the_next_frame_still_reads() {
        let mut wire = BytesMut::from(&[1u8, 0, 1, 0, 0, 0, 4, 0x03, 0xE7, 0, 10, 0xCE][..]);
        encode_method(0, &ConnectionClose::default().into(), &mut wire).unwrap();
        let frames = split(&[&wire[..]]);
        assert!(
            matches!(
                &frames[0],
                WireFrame::Undecodable {
                    frame_type: 1,
                    channel: 1,
                    size: 4,
                    error: acemq_codec::Error::UnknownMethod { class: 999, method: 10 }
                }
            ),
            "{frames:?}"
        );
        assert_eq!(frames[1].name(), "connection.close");
    }

    #[test]
    fn bytes_that_are_no_frame_lose_the_framing_for_good() {
        let frames = split(&[&[1, 0, 0, 0, 0, 0, 0], &[0xCE], b"GET / HTTP/1.1\r\n", b"more"]);
        assert!(matches!(&frames[0], WireFrame::Undecodable { .. }), "{frames:?}");
        assert_eq!(
            frames[1],
            WireFrame::Unframed {
                size: 16,
                error: Some(acemq_codec::Error::UnknownFrameType(b'G'))
            }
        );
        assert_eq!(frames[2], WireFrame::Unframed { size: 4, error: None });
    }

    #[test]
    fn a_frame_too_large_is_listed_and_skipped_without_being_kept() {
        let size = MAX_DECODED_FRAME + 1;
        let mut head = vec![1u8, 0, 2];
        head.extend_from_slice(&(size as u32).to_be_bytes());
        let filler = vec![0u8; size + 1];
        let mut after = BytesMut::new();
        after.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, 0xCE]);
        let mut splitter = Splitter::default();
        let mut out = Vec::new();
        splitter.feed(&head, &mut out);
        splitter.feed(&filler, &mut out);
        assert!(splitter.buf.capacity() < 1024, "the payload is not kept");
        splitter.feed(&after, &mut out);
        assert_eq!(
            out,
            [
                WireFrame::TooLarge {
                    frame_type: 1,
                    channel: 2,
                    size
                },
                WireFrame::Heartbeat
            ]
        );
    }

    #[test]
    fn the_log_keeps_its_capacity_dropping_the_oldest() {
        let log = Arc::new(TranscriptLog::new(3));
        let mut recorder = Recorder::new(log.clone());
        for _ in 0..5 {
            recorder.received(&[8, 0, 0, 0, 0, 0, 0, 0xCE]);
        }
        let transcript = log.snapshot();
        assert_eq!((transcript.len(), transcript.dropped()), (3, 2));
        let shown = transcript.to_string();
        assert!(shown.starts_with("... 2 earlier frames dropped"), "{shown}");
        assert_eq!(shown.lines().count(), 4);
    }

    #[test]
    fn display_escapes_control_characters_and_cuts_huge_tables() {
        let mut arguments = FieldTable::default();
        for i in 0..5000 {
            arguments.insert(format!("k{i}\u{1b}[31m\u{202e}"), "v\r\n");
        }
        let method: Method = QueueDeclare {
            queue: "evil\u{1b}]0;title\u{7}".into(),
            arguments,
            ..Default::default()
        }
        .into();
        let mut wire = BytesMut::new();
        encode_method(1, &method, &mut wire).unwrap();
        let frames = split(&[&wire[..]]);
        let entry = TranscriptEntry {
            at: Duration::from_millis(1500),
            direction: Direction::Received,
            frame: frames[0].clone(),
        };
        let line = entry.to_string();
        assert!(!line.chars().any(needs_escape), "{line:?}");
        assert!(line.contains("queue.declare"), "{line}");
        assert!(line.contains("\\u{1b}"), "{line}");
        assert!(line.ends_with("…(cut)"), "{line}");
        assert!(line.chars().count() < DISPLAY_BUDGET + 80, "{}", line.len());
        assert_eq!(line.lines().count(), 1);
    }

    #[test]
    fn a_method_line_shows_its_fields_without_the_variant() {
        let entry = TranscriptEntry {
            at: Duration::ZERO,
            direction: Direction::Sent,
            frame: WireFrame::Method {
                channel: 0,
                method: ConnectionClose {
                    reply_code: 200,
                    reply_text: "Goodbye".into(),
                    ..Default::default()
                }
                .into(),
            },
        };
        let line = entry.to_string();
        assert!(line.contains(">> ch0"), "{line}");
        assert!(
            line.contains("connection.close { reply_code: 200, reply_text: \"Goodbye\""),
            "{line}"
        );
        assert!(line.ends_with('}'), "{line}");
    }
}
