//! The handshake: the protocol header, `connection.start`, logins, the
//! `tune` limits, heartbeats and `connection.open`.

use std::time::Duration;

use acemq_codec::{ConnectionClose, ConnectionOpen, FieldValue, Frame, Method, PROTOCOL_HEADER};

use super::wire::{Hello, Wire, CLOSED_SILENTLY};
use super::{check, Check, Ctx, Expect, Got, Obs, Step};

const SILENT: &str = CLOSED_SILENTLY;

pub(crate) fn checks() -> Vec<Check> {
    vec![
        check!(
            "handshake.protocol-header.other-version",
            "a protocol header of another AMQP version is answered with AMQP 0-9-1's, then the socket closes",
            Expect::Both("protocol header AMQP 0-9-1, then socket closed"),
            other_version
        ),
        check!(
            "handshake.protocol-header.not-amqp",
            "bytes that are not an AMQP header are answered with a protocol header (3.10: 0-9-1's, 4.0: AMQP 1.0 SASL's), then the socket closes",
            Expect::Each {
                v3_10: Some("protocol header AMQP 0-9-1, then socket closed"),
                v4_0: Some("protocol header AMQP 1.0 SASL, then socket closed"),
            },
            not_amqp
        ),
        check!(
            "handshake.start.offer",
            "connection.start offers 0-9, PLAIN and AMQPLAIN, and en_US",
            Expect::Both("version 0-9, mechanisms AMQPLAIN PLAIN, locales en_US"),
            start_offer
        ),
        check!(
            "handshake.start.capabilities",
            "connection.start's capabilities include RabbitMQ's nine extensions",
            Expect::Both("all 9 capabilities true"),
            capabilities
        ),
        check!(
            "handshake.auth.failure-close-403",
            "a wrong password with authentication_failure_close gets connection.close 403",
            Expect::Both("connection.close 403 ACCESS_REFUSED"),
            auth_failure_close
        ),
        check!(
            "handshake.auth.failure-silent",
            "a wrong password without authentication_failure_close: the socket closes, no connection.close",
            Expect::Both(SILENT),
            auth_failure_silent
        ),
        check!(
            "handshake.auth.unknown-mechanism",
            "an unknown SASL mechanism: the socket closes without connection.close",
            Expect::Both(SILENT),
            unknown_mechanism
        ),
        check!(
            "handshake.tune.offer",
            "connection.tune offers channel_max 2047, frame_max 131072, heartbeat 60",
            Expect::Both("channel_max 2047, frame_max 131072, heartbeat 60"),
            tune_offer
        ),
        check!(
            "handshake.tune.frame-max-floor",
            "tune-ok with frame_max 4095 (below the 4096 floor) is refused",
            Expect::Both(SILENT),
            frame_max_below_floor
        ),
        check!(
            "handshake.tune.frame-max-at-floor",
            "tune-ok with frame_max 4096 is accepted",
            Expect::Both("connection.open-ok"),
            frame_max_at_floor
        ),
        check!(
            "handshake.tune.frame-max-above-offer",
            "tune-ok with frame_max above the broker's offer is refused",
            Expect::Both(SILENT),
            frame_max_above_offer
        ),
        check!(
            "handshake.tune.frame-max-zero",
            "tune-ok with frame_max 0 (no limit) is refused when the broker has a limit",
            Expect::Both(SILENT),
            frame_max_zero
        ),
        check!(
            "handshake.tune.channel-max-above-offer",
            "tune-ok with channel_max above the broker's offer is refused",
            Expect::Both(SILENT),
            channel_max_above_offer
        ),
        check!(
            "handshake.heartbeat.sent",
            "with heartbeat 1 negotiated, the broker sends heartbeat frames",
            Expect::Both("heartbeat frames within 3 s"),
            heartbeat_sent
        ),
        check!(
            "handshake.heartbeat.missed",
            "a client silent for two heartbeat intervals is dropped",
            Expect::Both("socket closed after missed heartbeats"),
            heartbeat_missed
        ),
        check!(
            "handshake.open.vhost-refused-530",
            "connection.open of a virtual host that does not exist gets connection.close 530",
            Expect::Both("connection.close 530 NOT_ALLOWED"),
            vhost_refused
        ),
        check!(
            "handshake.open.before-tune-ok",
            "connection.open before tune-ok: the socket closes without connection.close",
            Expect::Both(SILENT),
            open_before_tune_ok
        ),
        check!(
            "handshake.close.during-handshake",
            "connection.close before connection.open: the socket closes, no close-ok",
            Expect::Both(SILENT),
            close_during_handshake
        ),
    ]
}

/// What the broker answers to the 8 bytes `header`.
async fn header_answer(cx: &Ctx, header: &[u8]) -> Step<Obs> {
    let mut w = Wire::connect(cx.target()).await?;
    w.send_bytes(header).await?;
    let got = w.read_bytes(8).await;
    let first = if got == PROTOCOL_HEADER {
        "protocol header AMQP 0-9-1".to_string()
    } else if got == b"AMQP\x03\x01\x00\x00" {
        "protocol header AMQP 1.0 SASL".to_string()
    } else if got.is_empty() {
        "nothing".to_string()
    } else {
        format!("bytes {got:02x?}")
    };
    let closed = w.eof_within(Duration::from_secs(5)).await;
    Ok(Obs::new(if closed {
        format!("{first}, then socket closed")
    } else {
        format!("{first}, socket still open after 5 s")
    }))
}

async fn other_version(cx: Ctx) -> Step<Obs> {
    header_answer(&cx, b"AMQP\x00\x00\x0a\x00").await
}

async fn not_amqp(cx: Ctx) -> Step<Obs> {
    header_answer(&cx, b"GET / HTTP/1.1\r\n\r\n").await
}

/// Connects and reads `connection.start`.
async fn started(cx: &Ctx) -> Step<(Wire, acemq_codec::ConnectionStart)> {
    let mut w = Wire::connect(cx.target()).await?;
    w.send_bytes(&PROTOCOL_HEADER).await?;
    match w.next_on(0).await?.method {
        Method::ConnectionStart(s) => Ok((w, s)),
        other => Err(Got::saw(format!("{} instead of connection.start", other.name()))),
    }
}

async fn start_offer(cx: Ctx) -> Step<Obs> {
    let (_w, s) = started(&cx).await?;
    let words = |t: &acemq_codec::LongString| {
        let mut w: Vec<String> = t.to_string_lossy().split_whitespace().map(str::to_string).collect();
        w.sort();
        w.join(" ")
    };
    Ok(Obs::new(format!(
        "version {}-{}, mechanisms {}, locales {}",
        s.version_major,
        s.version_minor,
        words(&s.mechanisms),
        words(&s.locales)
    )))
}

async fn capabilities(cx: Ctx) -> Step<Obs> {
    let (_w, s) = started(&cx).await?;
    let caps = s.server_properties.get("capabilities").and_then(FieldValue::as_table);
    let missing: Vec<&str> = [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ]
    .into_iter()
    .filter(|c| caps.and_then(|t| t.get(c)).and_then(FieldValue::as_bool) != Some(true))
    .collect();
    Ok(Obs::new(if missing.is_empty() {
        "all 9 capabilities true".to_string()
    } else {
        format!("not true: {}", missing.join(", "))
    }))
}

/// The handshake with `hello`, as far as it goes: `connection.open-ok`, or
/// what the broker did instead.
async fn handshake(cx: &Ctx, hello: Hello) -> Step<Obs> {
    match Wire::open(cx.target(), &hello).await {
        Ok(w) => {
            w.close().await;
            Ok(Obs::new("connection.open-ok"))
        }
        Err(Got::Saw(obs)) => Ok(obs),
        Err(other) => Err(other),
    }
}

fn wrong_password() -> Option<String> {
    Some("acemq-conformance-wrong-password".into())
}

async fn auth_failure_close(cx: Ctx) -> Step<Obs> {
    handshake(
        &cx,
        Hello {
            password: wrong_password(),
            ..Hello::default()
        },
    )
    .await
}

async fn auth_failure_silent(cx: Ctx) -> Step<Obs> {
    handshake(
        &cx,
        Hello {
            password: wrong_password(),
            capabilities: false,
            ..Hello::default()
        },
    )
    .await
}

async fn unknown_mechanism(cx: Ctx) -> Step<Obs> {
    handshake(
        &cx,
        Hello {
            mechanism: "ACEMQ-NO-SUCH-MECHANISM",
            ..Hello::default()
        },
    )
    .await
}

async fn tune_offer(cx: Ctx) -> Step<Obs> {
    let mut w = Wire::connect(cx.target()).await?;
    w.send_bytes(&PROTOCOL_HEADER).await?;
    w.start_ok(cx.target(), &Hello::default()).await?;
    let t = w.tune.clone().ok_or_else(|| Got::saw("no connection.tune"))?;
    Ok(Obs::new(format!(
        "channel_max {}, frame_max {}, heartbeat {}",
        t.channel_max, t.frame_max, t.heartbeat
    )))
}

async fn frame_max_below_floor(cx: Ctx) -> Step<Obs> {
    handshake(
        &cx,
        Hello {
            frame_max: Some(4095),
            ..Hello::default()
        },
    )
    .await
}

async fn frame_max_at_floor(cx: Ctx) -> Step<Obs> {
    handshake(
        &cx,
        Hello {
            frame_max: Some(4096),
            ..Hello::default()
        },
    )
    .await
}

/// The broker's tune offer, from a handshake of its own.
async fn offer(cx: &Ctx) -> Step<acemq_codec::ConnectionTune> {
    let mut w = Wire::connect(cx.target()).await?;
    w.send_bytes(&PROTOCOL_HEADER).await?;
    w.start_ok(cx.target(), &Hello::default()).await?;
    w.tune.clone().ok_or_else(|| Got::saw("no connection.tune"))
}

async fn frame_max_above_offer(cx: Ctx) -> Step<Obs> {
    let offer = offer(&cx).await?;
    if offer.frame_max == 0 || offer.frame_max == u32::MAX {
        return Err(Got::NotApplicable("the broker offers no frame_max limit".into()));
    }
    handshake(
        &cx,
        Hello {
            frame_max: Some(offer.frame_max + 1),
            ..Hello::default()
        },
    )
    .await
}

async fn frame_max_zero(cx: Ctx) -> Step<Obs> {
    let offer = offer(&cx).await?;
    if offer.frame_max == 0 {
        return Err(Got::NotApplicable("the broker offers no frame_max limit".into()));
    }
    handshake(
        &cx,
        Hello {
            frame_max: Some(0),
            ..Hello::default()
        },
    )
    .await
}

async fn channel_max_above_offer(cx: Ctx) -> Step<Obs> {
    let offer = offer(&cx).await?;
    if offer.channel_max == 0 || offer.channel_max == u16::MAX {
        return Err(Got::NotApplicable("the broker offers no channel_max limit".into()));
    }
    handshake(
        &cx,
        Hello {
            channel_max: Some(offer.channel_max + 1),
            ..Hello::default()
        },
    )
    .await
}

async fn heartbeat_sent(cx: Ctx) -> Step<Obs> {
    let mut w = Wire::open(
        cx.target(),
        &Hello {
            heartbeat: 1,
            ..Hello::default()
        },
    )
    .await?;
    let seen = tokio::time::timeout(Duration::from_secs(3), async {
        while !matches!(w.read_frame().await?, Frame::Heartbeat) {}
        Ok::<(), Got>(())
    })
    .await;
    let obs = match seen {
        Ok(Ok(())) => Obs::new("heartbeat frames within 3 s"),
        Ok(Err(Got::Saw(o))) => o,
        Ok(Err(other)) => return Err(other),
        Err(_) => Obs::new("no heartbeat frame within 3 s"),
    };
    w.close().await;
    Ok(obs)
}

async fn heartbeat_missed(cx: Ctx) -> Step<Obs> {
    let mut w = Wire::open(
        cx.target(),
        &Hello {
            heartbeat: 1,
            ..Hello::default()
        },
    )
    .await?;
    // Reads (and so drains) but never writes: two intervals and some slack.
    Ok(Obs::new(if w.eof_within(Duration::from_secs(8)).await {
        "socket closed after missed heartbeats"
    } else {
        "still open 8 s after the client went silent"
    }))
}

async fn vhost_refused(cx: Ctx) -> Step<Obs> {
    let vhost = cx.name("no-such-vhost");
    handshake(
        &cx,
        Hello {
            vhost: Some(vhost),
            ..Hello::default()
        },
    )
    .await
}

async fn open_before_tune_ok(cx: Ctx) -> Step<Obs> {
    let mut w = Wire::connect(cx.target()).await?;
    w.send_bytes(&PROTOCOL_HEADER).await?;
    w.start_ok(cx.target(), &Hello::default()).await?;
    w.send(
        0,
        ConnectionOpen {
            virtual_host: cx.target().vhost.as_str().into(),
            ..Default::default()
        },
    )
    .await?;
    Ok(match w.next_on(0).await {
        Ok(m) => Obs::new(m.method.name()),
        Err(Got::Saw(o)) => o,
        Err(other) => return Err(other),
    })
}

async fn close_during_handshake(cx: Ctx) -> Step<Obs> {
    let mut w = Wire::connect(cx.target()).await?;
    w.send_bytes(&PROTOCOL_HEADER).await?;
    w.start_ok(cx.target(), &Hello::default()).await?;
    let close = ConnectionClose {
        reply_code: 200,
        reply_text: "bye".into(),
        class_id: 0,
        method_id: 0,
    };
    w.send(0, close).await?;
    Ok(match w.next_on(0).await {
        Ok(m) => Obs::new(m.method.name()),
        Err(Got::Saw(o)) => o,
        Err(other) => return Err(other),
    })
}
