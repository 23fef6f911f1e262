//! Frames: sizes at the edges of `frame_max`, malformed and unknown
//! frames, frames on channels that are not open, content out of order.

use acemq_codec::{
    BasicProperties, BasicPublish, ChannelOpen, ConfirmSelect, ConnectionTuneOk, ContentHeader, Frame, QueueDeclare,
    FRAME_END, FRAME_HEARTBEAT, FRAME_METHOD,
};
use bytes::BytesMut;

use super::wire::{body_frame, method_payload, raw_frame, Hello, Wire, CLOSED_SILENTLY};
use super::{answer, check, Check, Ctx, Expect, Got, Obs, Step};

const FRAME_ERROR: &str = "connection.close 501 FRAME_ERROR";
const UNEXPECTED_FRAME: &str = "connection.close 505 UNEXPECTED_FRAME";
const CHANNEL_ERROR: &str = "connection.close 504 CHANNEL_ERROR";

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "frames.frame-max.whole-frame-at-limit",
            "with frame_max 4096, a body frame of exactly 4096 bytes is taken",
            Expect::Both("basic.ack"),
            whole_frame_at_limit
        ),
        check!(
            "frames.frame-max.payload-at-limit",
            "with frame_max 4096, a body frame whose payload is 4096 bytes (8 over) is still taken",
            Expect::Both("basic.ack"),
            payload_at_limit
        ),
        check!(
            "frames.frame-max.payload-over-limit-501",
            "with frame_max 4096, a payload of 4097 bytes closes the connection with 501",
            Expect::Both(FRAME_ERROR),
            payload_over_limit
        ),
        check!(
            "frames.bad-frame-end-501",
            "a frame whose end octet is not 0xCE closes the connection with 501",
            Expect::Both(FRAME_ERROR),
            bad_frame_end
        ),
        check!(
            "frames.unknown-frame-type",
            "a frame of an unknown type (9) closes the connection",
            Expect::Both(FRAME_ERROR),
            unknown_frame_type
        ),
        check!(
            "frames.unknown-method",
            "a method id the class does not have (basic 250): the socket closes without connection.close",
            Expect::Both(CLOSED_SILENTLY),
            unknown_method
        ),
        check!(
            "frames.unknown-class",
            "a class id that does not exist (1000): the socket closes without connection.close",
            Expect::Both(CLOSED_SILENTLY),
            unknown_class
        ),
        check!(
            "frames.truncated-arguments-501",
            "a queue.declare frame cut short inside its arguments closes the connection with 501",
            Expect::Both(FRAME_ERROR),
            truncated_arguments
        ),
        check!(
            "frames.channel-not-open-504",
            "a method on a channel that was never opened closes the connection with 504",
            Expect::Both(CHANNEL_ERROR),
            channel_not_open
        ),
        check!(
            "frames.channel-open-twice-504",
            "channel.open on a channel already open closes the connection with 504",
            Expect::Both(CHANNEL_ERROR),
            channel_open_twice
        ),
        check!(
            "frames.channel-count-above-max-530",
            "with channel_max 2, opening a third channel closes the connection with 530",
            Expect::Both("connection.close 530 NOT_ALLOWED"),
            channel_count_above_max
        ),
        check!(
            "frames.channel-number-above-max",
            "with channel_max 10, channel number 11 opens (the limit counts open channels, not numbers)",
            Expect::Both("channel.open-ok"),
            channel_number_above_max
        ),
        check!(
            "frames.header-without-method-505",
            "a content header with no publish before it closes the connection with 505",
            Expect::Both(UNEXPECTED_FRAME),
            header_without_method
        ),
        check!(
            "frames.body-without-header-505",
            "a body frame right after basic.publish (no header) closes the connection with 505",
            Expect::Both(UNEXPECTED_FRAME),
            body_without_header
        ),
        check!(
            "frames.method-inside-content-505",
            "a method frame where the publish's content header belongs closes the connection with 505",
            Expect::Both(UNEXPECTED_FRAME),
            method_inside_content
        ),
        check!(
            "frames.heartbeat-on-channel-505",
            "a heartbeat frame on channel 1 closes the connection with 505",
            Expect::Both(UNEXPECTED_FRAME),
            heartbeat_on_channel
        ),
        check!(
            "frames.body-overrun-505",
            "a body frame longer than the header's body size, then a method: the connection closes with 505",
            Expect::Both(UNEXPECTED_FRAME),
            body_overrun
        ),
        check!(
            "frames.tune-ok-after-open-504",
            "connection.tune-ok once the connection is open closes it with 504",
            Expect::Both(CHANNEL_ERROR),
            tune_ok_after_open
        ),
    ]
}

/// A connection of frame_max 4096 with channel 1 open (in confirm mode
/// when `confirm`).
async fn small(cx: &Ctx, confirm: bool) -> Step<Wire> {
    let hello = Hello {
        frame_max: Some(4096),
        ..Hello::default()
    };
    let mut w = Wire::open(cx.target(), &hello).await?;
    w.open_channel(1).await?;
    if confirm {
        w.call(1, ConfirmSelect::default()).await?;
    }
    Ok(w)
}

/// The frames of a publish on channel 1 up to its content header, for
/// a body of `size` bytes.
fn publish_head(cx: &Ctx, size: u64) -> Vec<u8> {
    let publish = BasicPublish {
        routing_key: cx.name("nowhere").as_str().into(),
        ..Default::default()
    };
    let mut out = raw_frame(FRAME_METHOD, 1, &method_payload(publish), FRAME_END);
    let mut header = BytesMut::new();
    let _ = Frame::Header(1, ContentHeader::basic(size, BasicProperties::default())).encode(&mut header);
    out.extend_from_slice(&header);
    out
}

/// Sends `bytes` and reports the broker's next word on channel 1 (or 0).
async fn then(w: &mut Wire, bytes: &[u8]) -> Step<Obs> {
    w.send_bytes(bytes).await?;
    answer(w.next_any().await.map(|m| m.method))
}

async fn body_of(cx: Ctx, payload: usize) -> Step<Obs> {
    let mut w = small(&cx, true).await?;
    let mut bytes = publish_head(&cx, payload as u64);
    bytes.extend_from_slice(&body_frame(1, payload));
    then(&mut w, &bytes).await
}

async fn whole_frame_at_limit(cx: Ctx) -> Step<Obs> {
    body_of(cx, 4096 - 8).await
}

async fn payload_at_limit(cx: Ctx) -> Step<Obs> {
    body_of(cx, 4096).await
}

async fn payload_over_limit(cx: Ctx) -> Step<Obs> {
    body_of(cx, 4097).await
}

async fn bad_frame_end(cx: Ctx) -> Step<Obs> {
    let mut w = cx.open().await?;
    then(
        &mut w,
        &raw_frame(FRAME_METHOD, 1, &method_payload(ChannelOpen::default()), 0),
    )
    .await
}

async fn unknown_frame_type(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    then(&mut w, &raw_frame(9, 1, &[0, 0, 0, 0], FRAME_END)).await
}

async fn unknown_method(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    then(&mut w, &raw_frame(FRAME_METHOD, 1, &[0, 60, 0, 250], FRAME_END)).await
}

async fn unknown_class(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    then(&mut w, &raw_frame(FRAME_METHOD, 1, &[0x03, 0xe8, 0, 10], FRAME_END)).await
}

async fn truncated_arguments(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let declare = QueueDeclare {
        queue: cx.name("q").as_str().into(),
        ..Default::default()
    };
    let payload = method_payload(declare);
    then(&mut w, &raw_frame(FRAME_METHOD, 1, &payload[..10], FRAME_END)).await
}

async fn channel_not_open(cx: Ctx) -> Step<Obs> {
    let mut w = cx.open().await?;
    let declare = QueueDeclare {
        queue: cx.name("q").as_str().into(),
        exclusive: true,
        ..Default::default()
    };
    answer(w.call(7, declare).await)
}

async fn channel_open_twice(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    answer(w.call(1, ChannelOpen::default()).await)
}

async fn channel_count_above_max(cx: Ctx) -> Step<Obs> {
    let hello = Hello {
        channel_max: Some(2),
        ..Hello::default()
    };
    let mut w = Wire::open(cx.target(), &hello).await?;
    w.open_channel(1).await?;
    w.open_channel(2).await?;
    answer(w.call(3, ChannelOpen::default()).await)
}

async fn channel_number_above_max(cx: Ctx) -> Step<Obs> {
    let hello = Hello {
        channel_max: Some(10),
        ..Hello::default()
    };
    let mut w = Wire::open(cx.target(), &hello).await?;
    answer(w.call(11, ChannelOpen::default()).await)
}

async fn header_without_method(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let mut header = BytesMut::new();
    let _ = Frame::Header(1, ContentHeader::basic(3, BasicProperties::default())).encode(&mut header);
    then(&mut w, &header).await
}

async fn body_without_header(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let publish = BasicPublish {
        routing_key: cx.name("nowhere").as_str().into(),
        ..Default::default()
    };
    let mut bytes = raw_frame(FRAME_METHOD, 1, &method_payload(publish), FRAME_END);
    bytes.extend_from_slice(&body_frame(1, 3));
    then(&mut w, &bytes).await
}

async fn method_inside_content(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let publish = BasicPublish {
        routing_key: cx.name("nowhere").as_str().into(),
        ..Default::default()
    };
    let mut bytes = raw_frame(FRAME_METHOD, 1, &method_payload(publish), FRAME_END);
    let declare = QueueDeclare {
        queue: cx.name("q").as_str().into(),
        exclusive: true,
        ..Default::default()
    };
    bytes.extend_from_slice(&raw_frame(FRAME_METHOD, 1, &method_payload(declare), FRAME_END));
    then(&mut w, &bytes).await
}

async fn heartbeat_on_channel(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    then(&mut w, &raw_frame(FRAME_HEARTBEAT, 1, &[], FRAME_END)).await
}

async fn body_overrun(cx: Ctx) -> Step<Obs> {
    let mut w = small(&cx, true).await?;
    let mut bytes = publish_head(&cx, 10);
    bytes.extend_from_slice(&body_frame(1, 20));
    bytes.extend_from_slice(&raw_frame(
        FRAME_METHOD,
        1,
        &method_payload(acemq_codec::BasicQos::default()),
        FRAME_END,
    ));
    then(&mut w, &bytes).await
}

async fn tune_ok_after_open(cx: Ctx) -> Step<Obs> {
    let mut w = cx.open().await?;
    let tune_ok = ConnectionTuneOk {
        channel_max: w.channel_max,
        frame_max: w.frame_max,
        heartbeat: 0,
    };
    w.send(0, tune_ok).await?;
    match w.next_within(std::time::Duration::from_secs(3)).await {
        Ok(Some(m)) => Ok(Obs::new(m.method.name())),
        Ok(None) => Ok(Obs::new("no reply within 3 s")),
        Err(Got::Saw(o)) => Ok(o),
        Err(other) => Err(other),
    }
}
