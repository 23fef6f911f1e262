//! Entry points for the cargo-fuzz targets in `fuzz/`. Compiled only for
//! fuzzing (`--cfg fuzzing`, which cargo-fuzz passes) and for this crate's
//! tests, which replay the committed corpus through exactly the same code
//! (`corpus_tests`): never part of the API, and nothing in the codec may
//! call it.
//!
//! Each function takes arbitrary bytes and panics only when an invariant of
//! the codec is broken: that panic is the finding. Input errors are expected
//! and ignored.

use std::collections::{BTreeMap, HashSet};

use bytes::{Bytes, BytesMut};

use crate::track::{
    Assembly, Blocked, ConfirmError, Confirms, ContentAssembler, Outcome, ReturnKey, ReturnMatch, Returns,
};
use crate::{BasicProperties, ContentHeader, FieldTable, Frame, FrameDecoder, Method};

#[cfg(test)]
mod corpus_tests;

/// The `frame_max` and nesting limit a fuzz input asks for, from its first byte.
pub(crate) fn limits(selector: u8) -> (u32, usize) {
    let frame_max = match selector & 0x3 {
        0 => 0,
        1 => crate::FRAME_MIN_SIZE,
        2 => crate::DEFAULT_FRAME_MAX,
        _ => 1 << 20,
    };
    let depth = 1 + (usize::from(selector >> 2) % 64);
    (frame_max, depth)
}

/// Decodes frames from the input fed in uneven chunks, and checks that the
/// streaming decoder and the one-shot decoder agree frame by frame.
pub fn decode_frames(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (frame_max, depth) = limits(selector);
    let decoder = FrameDecoder::new(frame_max).with_max_depth(depth);
    let whole = Bytes::copy_from_slice(rest);

    let mut oneshot = Vec::new();
    let mut offset = 0;
    let oneshot_end = loop {
        match decoder.decode_slice(&whole.slice(offset..)) {
            Ok((frame, used)) => {
                assert!(used >= crate::FRAME_OVERHEAD, "a frame is at least 8 bytes");
                oneshot.push(frame);
                offset += used;
            }
            Err(err) => break err,
        }
    };

    let mut streamed = Vec::new();
    let mut buf = BytesMut::new();
    let chunk = 1 + usize::from(selector % 13);
    let mut stream_error = None;
    'outer: for part in rest.chunks(chunk) {
        buf.extend_from_slice(part);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => streamed.push(frame),
                Ok(None) => break,
                Err(err) => {
                    stream_error = Some(err);
                    break 'outer;
                }
            }
        }
    }
    assert_eq!(
        oneshot.len(),
        streamed.len(),
        "one-shot and streaming decoders disagree"
    );
    for (a, b) in oneshot.iter().zip(&streamed) {
        assert_eq!(encode(a), encode(b), "one-shot and streaming decoders disagree");
    }
    match (oneshot_end, &stream_error) {
        (crate::Error::Incomplete { .. }, None) => {}
        (a, Some(b)) => assert_eq!(&a, b, "decoders disagree on the error"),
        (a, None) => panic!("one-shot decoder failed with {a:?}, streaming did not"),
    }

    // The frames just decoded, assembled with `push`, against
    // `decode_assembled` over the same bytes in other chunks.
    let mut assemblers = BTreeMap::new();
    let mut frame_by_frame = Vec::new();
    for frame in streamed {
        push_logged(&mut assemblers, frame, &mut frame_by_frame);
    }
    frame_by_frame.extend(stream_error.map(Seen::End));
    let chunk = 1 + usize::from(selector.rotate_left(3) % 17);
    let assembled = assemble_in_one_step(&decoder, rest, chunk);
    assert_eq!(
        frame_by_frame, assembled,
        "decode_assembled disagrees with decode and push"
    );
}

/// What a reader of a stream sees, message by message: the log both ways of
/// assembling content must agree on.
#[derive(Debug, PartialEq)]
enum Seen {
    /// A frame on channel 0, or a heartbeat, encoded.
    Connection(Bytes),
    /// A method without content, on a channel.
    Method(u16, Method),
    /// A whole message, on a channel.
    Content(u16, crate::track::Content),
    /// A content sequence error on a channel (its assembler reset).
    ContentError(u16, crate::track::ContentError),
    /// The stream error that ended it.
    End(crate::Error),
}

/// Feeds a frame on a channel to that channel's assembler, as
/// [`crate::track::ContentAssembler::push`] does, and logs what came of it.
fn push_logged(assemblers: &mut BTreeMap<u16, ContentAssembler>, frame: Frame, seen: &mut Vec<Seen>) {
    let channel = frame.channel();
    if channel == 0 || matches!(frame, Frame::Heartbeat) {
        seen.push(Seen::Connection(encode(&frame)));
        return;
    }
    match assemblers.entry(channel).or_default().push(frame) {
        Ok(Assembly::Method(method)) => seen.push(Seen::Method(channel, method)),
        Ok(Assembly::Partial) => {}
        Ok(Assembly::Complete(content)) => seen.push(Seen::Content(channel, content)),
        Err(error) => seen.push(Seen::ContentError(channel, error)),
    }
}

/// A stream through `FrameDecoder::take_ack` and `decode_assembled`, fed
/// in chunks of `chunk` bytes, with `decode` and `push` for what they leave.
fn assemble_in_one_step(decoder: &FrameDecoder, input: &[u8], chunk: usize) -> Vec<Seen> {
    use crate::track::{AssembleError, Decoded};
    let mut assemblers: BTreeMap<u16, ContentAssembler> = BTreeMap::new();
    let mut seen = Vec::new();
    let mut buf = BytesMut::new();
    for part in input.chunks(chunk) {
        buf.extend_from_slice(part);
        loop {
            // A confirm read where it lies, as the client's machine does,
            // when no message is half-read on its channel.
            let idle = |ch| !assemblers.get(&ch).is_some_and(ContentAssembler::in_progress);
            if let Some(ack) = decoder.take_ack(&mut buf, idle) {
                seen.push(Seen::Method(ack.channel, ack.into()));
                continue;
            }
            match decoder.decode_assembled(&mut buf, |ch| Some(assemblers.entry(ch).or_default())) {
                Ok(Decoded::NeedMore) => break,
                Ok(Decoded::Partial(channel)) => {
                    assert!(assemblers[&channel].in_progress(), "a partial message is in progress");
                }
                Ok(Decoded::Complete(channel)) => {
                    let assembler = assemblers.get_mut(&channel).expect("an assembler was given");
                    let content = assembler.take_complete().expect("a complete message to take");
                    assert!(!assembler.has_complete() && !assembler.in_progress());
                    seen.push(Seen::Content(channel, content));
                }
                Ok(Decoded::Other) => match decoder.decode(&mut buf) {
                    Ok(Some(frame)) => push_logged(&mut assemblers, frame, &mut seen),
                    Ok(None) => panic!("decode_assembled saw a whole frame, decode did not"),
                    Err(err) => {
                        seen.push(Seen::End(err));
                        return seen;
                    }
                },
                Err(AssembleError::Content { channel, error }) => {
                    assert!(!assemblers[&channel].in_progress(), "the assembler was reset");
                    seen.push(Seen::ContentError(channel, error));
                }
                Err(AssembleError::Decode(err)) => {
                    seen.push(Seen::End(err));
                    return seen;
                }
            }
        }
    }
    seen
}

/// Decodes each frame, encodes it, decodes that again: the second decode must
/// succeed, and encoding it again must give the same bytes (decode → encode is
/// stable after one pass; field values such as `t` normalise on the first).
/// A content header's properties are salvaged too (see `salvage_agrees`),
/// and published after the last `basic.publish` decoded through one
/// [`crate::PublishEncoder`] for the whole input: twice with the same
/// properties, with bodies of two sizes, it writes what
/// [`crate::encode_content`] writes.
pub fn roundtrip(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (frame_max, depth) = limits(selector);
    let decoder = FrameDecoder::new(0).with_max_depth(depth);
    let mut buf = Bytes::copy_from_slice(rest);
    let mut publisher = (crate::PublishEncoder::new(), crate::BasicPublish::default());
    while let Ok((frame, used)) = decoder.decode_slice(&buf) {
        let first = encode(&frame);
        publish_agrees(&mut publisher, &frame, frame_max);
        if let Frame::Header(channel, header) = &frame {
            // The properties as received encode as the bytes received; built
            // into fields, they must encode as the same bytes.
            let mut built = header.clone();
            built.properties = header.properties.clone().into_basic().into();
            assert_eq!(
                encode(&Frame::Header(*channel, built)),
                first,
                "properties built from validated bytes encode differently"
            );
            // Read through a view, straight from the bytes, they are the
            // values building them gives (compared as printed, so that a NaN
            // equals itself).
            assert_eq!(
                format!("{:?}", header.properties.view().to_owned()),
                format!("{:?}", *header.properties),
                "properties read through a view differ from those built"
            );
        }
        salvage_agrees(&decoder, &frame);
        let (again, used_again) = decoder
            .decode_slice(&first)
            .unwrap_or_else(|err| panic!("re-encoded {frame:?} does not decode: {err}"));
        assert_eq!(used_again, first.len(), "re-encoded frame has trailing bytes");
        let second = encode(&again);
        assert_eq!(
            first, second,
            "encode(decode(encode(frame))) differs from encode(frame)"
        );
        buf = buf.slice(used..);
    }
}

/// Publishes a decoded header's properties after the last decoded
/// `basic.publish`, through the encoder that keeps frames and through
/// `encode_content`: the bytes (or the refusal) must be the same.
fn publish_agrees(publisher: &mut (crate::PublishEncoder, crate::BasicPublish), frame: &Frame, frame_max: u32) {
    let (encoder, last) = publisher;
    let (channel, header) = match frame {
        Frame::Method(_, Method::BasicPublish(publish)) => {
            last.clone_from(publish);
            return;
        }
        Frame::Header(channel, header) => (*channel, header),
        _ => return,
    };
    let properties = std::sync::Arc::new(header.properties.clone().into_basic());
    let size = (header.body_size % 20_000) as usize;
    for body in [vec![b'b'; size], vec![b'c'; size / 3]] {
        let mut kept = BytesMut::new();
        let kept_result = encoder.encode(channel, last, &properties, &body, frame_max, &mut kept);
        let mut fresh = BytesMut::new();
        let method = Method::BasicPublish(last.clone());
        let fresh_result = crate::encode_content(channel, &method, &properties, &body, frame_max, &mut fresh);
        assert_eq!(
            kept_result.is_ok(),
            fresh_result.is_ok(),
            "PublishEncoder and encode_content disagree: {kept_result:?} against {fresh_result:?}"
        );
        assert_eq!(kept, fresh, "PublishEncoder writes other bytes than encode_content");
    }
}

/// Salvaging a header's properties gives what the decoder gave and loses
/// nothing when they decoded; when they did not, what it salvages is a
/// sound property list.
fn salvage_agrees(decoder: &FrameDecoder, frame: &Frame) {
    match frame {
        Frame::Header(_, header) => {
            let Some(raw) = header.properties.wire_bytes() else {
                return;
            };
            let salvaged = BasicProperties::salvage_with_max_depth(raw, decoder.max_depth());
            assert!(
                salvaged.lost.is_empty(),
                "salvage lost {:?} of decoded properties",
                salvaged.lost
            );
            // Compared as printed, so that a NaN equals itself.
            assert_eq!(
                format!("{:?}", salvaged.properties),
                format!("{:?}", *header.properties),
                "salvage disagrees with the decoder"
            );
        }
        Frame::UndecodableHeader(channel, header) => {
            let salvaged = header.salvage_with_max_depth(decoder.max_depth());
            let rebuilt = Frame::Header(*channel, ContentHeader::basic(0, salvaged.properties.clone()));
            match decoder.decode_slice(&encode(&rebuilt)) {
                Ok((Frame::Header(_, again), _)) => {
                    assert_eq!(
                        format!("{:?}", *again.properties),
                        format!("{:?}", salvaged.properties),
                        "salvaged properties change on a round trip"
                    )
                }
                other => panic!("salvaged properties {salvaged:?} do not decode: {other:?}"),
            }
        }
        _ => {}
    }
}

/// Decodes a field table; when it decodes, re-encoding and decoding again
/// gives the same bytes.
pub fn field_table(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (_, depth) = limits(selector);
    let input = Bytes::copy_from_slice(rest);
    if let Ok(table) = FieldTable::decode(&input, depth) {
        let mut first = BytesMut::new();
        table.encode(&mut first).expect("a decoded table encodes");
        assert_eq!(
            format!("{:?}", table.view().to_owned()),
            format!("{table:?}"),
            "a table read through a view differs from the one built"
        );
        let again = FieldTable::decode(&first.clone().freeze(), depth).expect("a re-encoded table decodes");
        let mut second = BytesMut::new();
        again.encode(&mut second).expect("a decoded table encodes");
        assert_eq!(first, second);
    }
}

/// Feeds the frames in the input to the trackers, as one peer would see them:
/// content assembly per channel, confirms and returns for every publish, the
/// blocked state. Checks that every publish is resolved at most once, that
/// resolved and outstanding publishes add up, and that a return is paired
/// with a mandatory publish that has not been confirmed yet.
pub fn trackers(data: &[u8]) {
    let decoder = FrameDecoder::new(1 << 20);
    let mut buf = Bytes::copy_from_slice(data);
    let mut channels: BTreeMap<u16, Channel> = BTreeMap::new();
    let mut blocked = Blocked::new();
    while let Ok((frame, used)) = decoder.decode_slice(&buf) {
        buf = buf.slice(used..);
        let channel = frame.channel();
        if let Frame::Method(0, method) = &frame {
            let was = blocked.is_blocked();
            let change = blocked.handle(method);
            assert_eq!(change.is_some(), was != blocked.is_blocked());
            continue;
        }
        if matches!(frame, Frame::Heartbeat) {
            continue;
        }
        let state = channels.entry(channel).or_default();
        match state.assembler.push(frame) {
            Ok(Assembly::Method(method)) => state.method(&method),
            Ok(Assembly::Complete(content)) => {
                let message_id = content
                    .header
                    .as_ref()
                    .ok()
                    .and_then(|h| h.properties.message_id.clone());
                state.content(&content.method, message_id);
            }
            Ok(Assembly::Partial) => {}
            Err(_) => state.assembler.reset(),
        }
        state.check();
    }
}

#[derive(Default)]
struct Channel {
    assembler: ContentAssembler,
    confirms: Confirms,
    returns: Returns,
    published: u64,
    resolved: HashSet<u64>,
    returned: HashSet<u64>,
    scratch: Vec<u64>,
}

impl Channel {
    fn method(&mut self, method: &Method) {
        let (outcome, tag, multiple) = match method {
            Method::ConfirmSelect(_) => {
                self.confirms.select();
                return;
            }
            Method::BasicAck(m) => (Outcome::Ack, m.delivery_tag, m.multiple),
            Method::BasicNack(m) => (Outcome::Nack, m.delivery_tag, m.multiple),
            _ => return,
        };
        self.scratch.clear();
        let before = self.confirms.outstanding();
        match self.confirms.on_confirm(outcome, tag, multiple, &mut self.scratch) {
            Ok(()) => {
                assert!(!self.scratch.is_empty(), "a confirm resolves at least one publish");
                assert_eq!(before - self.scratch.len(), self.confirms.outstanding());
                for &seq in &self.scratch {
                    assert!(seq <= tag && seq >= 1);
                    assert!(self.resolved.insert(seq), "publish {seq} resolved twice");
                    let ret = self.returns.resolve(seq);
                    assert_eq!(ret.is_some(), self.returned.contains(&seq));
                }
            }
            Err(ConfirmError::UnknownTag { published, .. }) => {
                assert!(tag == 0 || tag > published, "a published tag is not unknown");
                assert!(self.scratch.is_empty(), "a refused confirm resolves nothing");
            }
            Err(_) => assert!(self.scratch.is_empty(), "a refused confirm resolves nothing"),
        }
    }

    fn content(&mut self, method: &Method, message_id: Option<crate::ShortString>) {
        match method {
            Method::BasicPublish(publish) => {
                if let Some(seq) = self.confirms.on_publish() {
                    self.published += 1;
                    assert_eq!(seq, self.published, "sequence numbers start at 1 and have no gaps");
                    if publish.mandatory {
                        self.returns.on_mandatory_publish(
                            seq,
                            ReturnKey {
                                exchange: publish.exchange.clone(),
                                routing_key: publish.routing_key.clone(),
                                message_id,
                            },
                        );
                    }
                }
            }
            Method::BasicReturn(ret) => match self.returns.on_return(ret.clone(), message_id.as_ref()) {
                ReturnMatch::Matched(seq) => {
                    assert!(!self.resolved.contains(&seq), "return paired with a confirmed publish");
                    assert!(self.returned.insert(seq), "publish {seq} returned twice");
                }
                ReturnMatch::Unmatched(_) => {}
            },
            _ => {}
        }
    }

    fn check(&self) {
        assert_eq!(
            self.resolved.len() as u64 + self.confirms.outstanding() as u64,
            self.published,
            "every publish is either resolved or outstanding"
        );
    }
}

fn encode(frame: &Frame) -> Bytes {
    let mut out = BytesMut::new();
    frame
        .encode(&mut out)
        .unwrap_or_else(|err| panic!("decoded frame {frame:?} does not encode: {err}"));
    out.freeze()
}
