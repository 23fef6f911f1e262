//! What RabbitMQ does not implement and says so with 540 NOT_IMPLEMENTED,
//! and `channel.flow`.

use acemq_codec::{BasicProperties, BasicPublish, BasicQos, BasicRecover, BasicRecoverAsync, ChannelFlow, Method};

use super::wire::{method_payload, raw_frame};
use super::{answer, check, Check, Ctx, Expect, Obs, Step};

const NOT_IMPLEMENTED: &str = "connection.close 540 NOT_IMPLEMENTED";

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "not-implemented.qos-prefetch-size-540",
            "basic.qos with a prefetch_size other than 0 closes the connection with 540",
            Expect::Both(NOT_IMPLEMENTED),
            prefetch_size
        ),
        check!(
            "not-implemented.publish-immediate-540",
            "basic.publish with immediate=true closes the connection with 540",
            Expect::Both(NOT_IMPLEMENTED),
            immediate
        ),
        check!(
            "not-implemented.recover-requeue-false-540",
            "basic.recover with requeue=false closes the connection with 540",
            Expect::Both(NOT_IMPLEMENTED),
            recover_no_requeue
        ),
        check!(
            "not-implemented.recover-async-requeue-false-540",
            "basic.recover-async with requeue=false closes the connection with 540",
            Expect::Both(NOT_IMPLEMENTED),
            recover_async_no_requeue
        ),
        check!(
            "flow.inactive-540",
            "channel.flow active=false (a client asking the broker to stop) closes the connection with 540",
            Expect::Both(NOT_IMPLEMENTED),
            flow_inactive
        ),
        check!(
            "flow.active-ok",
            "channel.flow active=true is answered with channel.flow-ok active=true",
            Expect::Both("channel.flow-ok active=true"),
            flow_active
        ),
    ]
}

async fn prefetch_size(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let qos = BasicQos {
        prefetch_size: 1,
        prefetch_count: 10,
        global: false,
    };
    answer(w.call(1, qos).await)
}

async fn immediate(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    let publish = BasicPublish {
        routing_key: cx.name("nowhere").as_str().into(),
        immediate: true,
        ..Default::default()
    };
    let mut out = bytes::BytesMut::new();
    let _ = acemq_codec::encode_content(1, &publish.into(), &BasicProperties::default(), b"x", 4096, &mut out);
    w.send_bytes(&out).await?;
    answer(w.next_any().await.map(|m| m.method))
}

async fn recover_no_requeue(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    answer(w.call(1, BasicRecover { requeue: false }).await)
}

async fn recover_async_no_requeue(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    // No reply is defined: what follows is the close, or (if the broker
    // takes it) the reply to a basic.qos sent after it.
    let mut bytes = raw_frame(1, 1, &method_payload(BasicRecoverAsync { requeue: false }), 0xce);
    bytes.extend_from_slice(&raw_frame(1, 1, &method_payload(BasicQos::default()), 0xce));
    w.send_bytes(&bytes).await?;
    answer(w.next_any().await.map(|m| m.method))
}

async fn flow_inactive(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    answer(w.call(1, ChannelFlow { active: false }).await)
}

async fn flow_active(cx: Ctx) -> Step<Obs> {
    let mut w = cx.channel().await?;
    Ok(match w.call(1, ChannelFlow { active: true }).await {
        Ok(Method::ChannelFlowOk(ok)) => Obs::new(format!("channel.flow-ok active={}", ok.active)),
        other => answer(other)?,
    })
}
