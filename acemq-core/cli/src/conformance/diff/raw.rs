//! A publish written frame by frame, on a connection of its own, for what
//! the engine never sends: one body frame of a chosen size around the
//! negotiated `frame_max`. Must never wait without a deadline, and must
//! record what the broker answered, not interpret it.

use std::time::Duration;

use acemq_codec::*;
use acemq_core::amqp::AmqpUrl;
use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

use super::{Broker, RawStream};

/// The `frame_max` the raw connection asks for in `tune-ok`: the smallest
/// RabbitMQ 3.10 and 4.0 take, so the bodies stay small.
pub const RAW_FRAME_MAX: u32 = 4096;

/// How long one answer may take.
const REPLY: Duration = Duration::from_secs(10);

struct Raw {
    io: RawStream,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl Raw {
    async fn open(broker: &Broker) -> Result<Raw, String> {
        let io = match broker.dial_raw() {
            Some(dial) => timeout(REPLY, dial())
                .await
                .map_err(|_| "connect timed out".to_string())?
                .map_err(|e| format!("connect: {e}"))?,
            None => return Err("this broker takes no hand-written frames".into()),
        };
        Ok(Raw {
            io,
            buf: BytesMut::new(),
            // Reads whatever the broker sends; the limit is for the broker.
            decoder: FrameDecoder::new(0),
        })
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        match timeout(REPLY, self.io.write_all(bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("write failed: {e}")),
            Err(_) => Err("write timed out".into()),
        }
    }

    async fn send(&mut self, channel: u16, method: impl Into<Method>) -> Result<(), String> {
        let mut out = BytesMut::new();
        encode_method(channel, &method.into(), &mut out).map_err(|e| e.to_string())?;
        self.write(&out).await
    }

    /// The next method frame (heartbeats and content are skipped).
    async fn method(&mut self) -> Result<(u16, Method), String> {
        loop {
            match self.decoder.decode(&mut self.buf) {
                Ok(Some(Frame::Method(ch, m))) => return Ok((ch, m)),
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => return Err(format!("undecodable answer: {e}")),
            }
            match timeout(REPLY, self.io.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) => return Err("socket closed".into()),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(format!("read failed: {e}")),
                Err(_) => return Err(format!("no answer within {REPLY:?}")),
            }
        }
    }

    /// The handshake with the URL's user, password and virtual host (PLAIN),
    /// asking for [`RAW_FRAME_MAX`], and channel 1.
    async fn handshake(&mut self, url: &AmqpUrl) -> Result<(), String> {
        let mut response = vec![0];
        response.extend_from_slice(url.username.as_bytes());
        response.push(0);
        response.extend_from_slice(url.password.expose().as_bytes());
        self.write(&PROTOCOL_HEADER).await?;
        let (_, Method::ConnectionStart(_)) = self.method().await? else {
            return Err("no connection.start".into());
        };
        let start_ok = ConnectionStartOk {
            mechanism: "PLAIN".into(),
            response: response.as_slice().into(),
            locale: "en_US".into(),
            ..Default::default()
        };
        self.send(0, start_ok).await?;
        let (_, Method::ConnectionTune(tune)) = self.method().await? else {
            return Err("no connection.tune".into());
        };
        let tune_ok = ConnectionTuneOk {
            channel_max: tune.channel_max,
            frame_max: RAW_FRAME_MAX,
            heartbeat: 0,
        };
        self.send(0, tune_ok).await?;
        self.send(
            0,
            ConnectionOpen {
                virtual_host: url.vhost.as_str().into(),
                ..Default::default()
            },
        )
        .await?;
        let (_, Method::ConnectionOpenOk(_)) = self.method().await? else {
            return Err("no connection.open-ok".into());
        };
        self.send(1, ChannelOpen::default()).await?;
        let (1, Method::ChannelOpenOk(_)) = self.method().await? else {
            return Err("no channel.open-ok".into());
        };
        self.send(1, ConfirmSelect::default()).await?;
        let (1, Method::ConfirmSelectOk(_)) = self.method().await? else {
            return Err("no confirm.select-ok".into());
        };
        Ok(())
    }
}

/// Opens a connection to `url` with `frame_max` [`RAW_FRAME_MAX`] and a
/// channel in confirm mode, publishes a message of `payload` bytes to the
/// default exchange with `routing_key` in one body frame of that payload,
/// and says what came back: the confirm (so the message is where it goes
/// before the sequence moves on), or the close the broker sent instead.
pub async fn publish_one_body_frame(broker: &Broker, routing_key: &str, payload: usize) -> String {
    let mut raw = match Raw::open(broker).await {
        Ok(raw) => raw,
        Err(e) => return format!("could not connect: {e}"),
    };
    if let Err(e) = raw.handshake(broker.url()).await {
        return format!("handshake failed: {e}");
    }
    let mut out = BytesMut::new();
    let publish = BasicPublish {
        exchange: "".into(),
        routing_key: routing_key.into(),
        ..Default::default()
    };
    let header = Frame::Header(1, ContentHeader::basic(payload as u64, BasicProperties::default()));
    let encoded = encode_method(1, &publish.into(), &mut out)
        .and_then(|()| header.encode(&mut out))
        .map(|()| {
            out.put_u8(3);
            out.put_u16(1);
            out.put_u32(payload as u32);
            out.put_bytes(b'x', payload);
            out.put_u8(0xCE);
        });
    if let Err(e) = encoded {
        return format!("could not encode: {e}");
    }
    if let Err(e) = raw.write(&out).await {
        return e;
    }
    let answer = match raw.method().await {
        Ok((1, Method::BasicAck(_))) => "acked".to_string(),
        Ok((1, Method::BasicNack(_))) => "nacked".to_string(),
        Ok((ch, Method::ConnectionClose(close))) => {
            let _ = raw.send(0, ConnectionCloseOk {}).await;
            return format!(
                "connection closed on ch{ch}: {} {:?} ({}.{})",
                close.reply_code, close.reply_text, close.class_id, close.method_id
            );
        }
        Ok((ch, other)) => format!("ch{ch} {}", other.name()),
        Err(e) => return e,
    };
    let close = ConnectionClose {
        reply_code: 200,
        reply_text: "bye".into(),
        ..Default::default()
    };
    if raw.send(0, close).await.is_ok() {
        // The close-ok, or whatever ends the connection: either way it ends.
        let _ = raw.method().await;
    }
    answer
}
