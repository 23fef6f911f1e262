//! A raw AMQP 0-9-1 client for the checks: it writes exactly the frames a
//! check asks for (well-formed or not, in any order) over a plain
//! `tokio::net::TcpStream`, encoded with acemq-codec, and reads the
//! broker's frames as they come, content put together. It never decides
//! anything for the check: a `channel.close` or `connection.close` from the
//! broker is answered with its `close-ok` and handed back as what the
//! broker said. Every read is bounded by the check's deadline, which the
//! runner enforces around the whole check.

use std::collections::VecDeque;
use std::time::Duration;

use acemq_codec::{
    encode_content, encode_method, BasicProperties, ChannelCloseOk, ChannelOpen, ConnectionCloseOk, ConnectionOpen,
    ConnectionStartOk, ConnectionTuneOk, FieldTable, Frame, FrameDecoder, Method, ReplyCode, FRAME_BODY, FRAME_END,
    PROTOCOL_HEADER,
};
use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Got, Obs, Step, Target};

/// What the client offers in its handshake.
#[derive(Debug, Clone)]
pub(crate) struct Hello {
    /// `consumer_cancel_notify`, `authentication_failure_close`,
    /// `publisher_confirms`, `basic.nack`, `connection.blocked` in the
    /// client's capabilities.
    pub capabilities: bool,
    /// The password (the target's by default).
    pub password: Option<String>,
    /// The virtual host (the target's by default).
    pub vhost: Option<String>,
    /// `frame_max` of `tune-ok` (`None`: the broker's offer).
    pub frame_max: Option<u32>,
    /// `channel_max` of `tune-ok` (`None`: the broker's offer).
    pub channel_max: Option<u16>,
    /// `heartbeat` of `tune-ok` (0 by default: no heartbeats).
    pub heartbeat: u16,
    /// The SASL mechanism (`PLAIN` by default).
    pub mechanism: &'static str,
}

impl Default for Hello {
    fn default() -> Self {
        Hello {
            capabilities: true,
            password: None,
            vhost: None,
            frame_max: None,
            channel_max: None,
            heartbeat: 0,
            mechanism: "PLAIN",
        }
    }
}

/// A method the broker sent, with its content when it carries one.
#[derive(Debug, Clone)]
pub(crate) struct In {
    /// The channel.
    pub ch: u16,
    /// The method.
    pub method: Method,
    /// Properties and body of a `basic.deliver`, `basic.return` or `basic.get-ok`.
    pub content: Option<(BasicProperties, Vec<u8>)>,
}

impl In {
    /// The headers of the content, if any.
    pub fn headers(&self) -> Option<&FieldTable> {
        self.content.as_ref().and_then(|(p, _)| p.headers.as_ref())
    }
}

/// One connection to the broker under test.
pub(crate) struct Wire {
    stream: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
    /// Methods read but not yet taken.
    inbox: VecDeque<In>,
    /// `frame_max` as negotiated (4096 before `tune`).
    pub frame_max: u32,
    /// `channel_max` as negotiated.
    pub channel_max: u16,
    /// `connection.start` as the broker sent it.
    pub start: Option<acemq_codec::ConnectionStart>,
    /// `connection.tune` as the broker sent it.
    pub tune: Option<acemq_codec::ConnectionTune>,
    /// Set once the broker closed the connection (or it went away).
    pub closed: Option<Obs>,
}

/// `connection.close CODE NAME` / `channel.close CODE NAME`, with the text.
pub(crate) fn close_obs(what: &str, code: u16, text: &str) -> Obs {
    Obs::with_text(format!("{what} {code} {}", ReplyCode::from_u16(code).name()), text)
}

impl Wire {
    /// A TCP connection to the target, nothing sent yet.
    pub async fn connect(target: &Target) -> Step<Wire> {
        let stream = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| Got::saw(format!("cannot connect to {}:{}: {e}", target.host, target.port)))?;
        let _ = stream.set_nodelay(true);
        Ok(Wire {
            stream,
            buf: BytesMut::with_capacity(8192),
            decoder: FrameDecoder::new(0),
            inbox: VecDeque::new(),
            frame_max: 4096,
            channel_max: 0,
            start: None,
            tune: None,
            closed: None,
        })
    }

    /// Connects and runs the handshake up to `connection.open-ok`.
    pub async fn open(target: &Target, hello: &Hello) -> Step<Wire> {
        let mut w = Wire::connect(target).await?;
        w.send_bytes(&PROTOCOL_HEADER).await?;
        w.start_ok(target, hello).await?;
        let tune = w.tune.clone().ok_or_else(|| Got::saw("no connection.tune"))?;
        let frame_max = hello.frame_max.unwrap_or(tune.frame_max);
        let channel_max = hello.channel_max.unwrap_or(tune.channel_max);
        w.send(
            0,
            ConnectionTuneOk {
                channel_max,
                frame_max,
                heartbeat: hello.heartbeat,
            },
        )
        .await?;
        w.frame_max = if frame_max == 0 { 131_072 } else { frame_max };
        w.channel_max = channel_max;
        let vhost = hello.vhost.clone().unwrap_or_else(|| target.vhost.clone());
        w.send(
            0,
            ConnectionOpen {
                virtual_host: vhost.as_str().into(),
                ..Default::default()
            },
        )
        .await?;
        match w.next_on(0).await?.method {
            Method::ConnectionOpenOk(_) => Ok(w),
            other => Err(Got::saw(format!("{} instead of connection.open-ok", other.name()))),
        }
    }

    /// Reads `connection.start`, answers it with `start-ok` and reads the
    /// broker's next method (`tune` is kept in [`Wire::tune`]).
    pub async fn start_ok(&mut self, target: &Target, hello: &Hello) -> Step<()> {
        let start = match self.next_on(0).await?.method {
            Method::ConnectionStart(start) => start,
            other => return Err(Got::saw(format!("{} instead of connection.start", other.name()))),
        };
        self.start = Some(start);
        let mut caps = FieldTable::new();
        if hello.capabilities {
            for cap in [
                "publisher_confirms",
                "basic.nack",
                "consumer_cancel_notify",
                "connection.blocked",
                "authentication_failure_close",
                "exchange_exchange_bindings",
                "per_consumer_qos",
            ] {
                caps.push(cap, true);
            }
        }
        let mut props = FieldTable::new();
        props.push("product", "acemq conformance check");
        props.push("capabilities", caps);
        let password = hello.password.clone().unwrap_or_else(|| target.password.clone());
        let mut response = vec![0u8];
        response.extend_from_slice(target.username.as_bytes());
        response.push(0);
        response.extend_from_slice(password.as_bytes());
        self.send(
            0,
            ConnectionStartOk {
                client_properties: props,
                mechanism: hello.mechanism.into(),
                response: response.into(),
                locale: "en_US".into(),
            },
        )
        .await?;
        match self.next_on(0).await?.method {
            Method::ConnectionTune(tune) => {
                self.tune = Some(tune);
                Ok(())
            }
            other => Err(Got::saw(format!("{} instead of connection.tune", other.name()))),
        }
    }

    /// Writes `bytes` as they are. A write the broker refuses (it closed
    /// the socket) is what the broker said before it closed, if anything.
    pub async fn send_bytes(&mut self, bytes: &[u8]) -> Step<()> {
        let written = self.stream.write_all(bytes).await;
        match written {
            Ok(()) => Ok(()),
            Err(e) => {
                if let Some(obs) = self.closed.clone() {
                    return Err(Got::Saw(obs));
                }
                let said = self.why_closed().await;
                Err(Got::Saw(said.unwrap_or_else(|| {
                    Obs::with_text(CLOSED_SILENTLY, &format!("write failed: {e}"))
                })))
            }
        }
    }

    /// The `connection.close` the broker sent before the socket ended, if
    /// it did (read for at most a second).
    async fn why_closed(&mut self) -> Option<Obs> {
        let read = async {
            loop {
                match self.read_frame().await {
                    Ok(Frame::Method(0, Method::ConnectionClose(c))) => {
                        let obs = close_obs("connection.close", c.reply_code, &c.reply_text.to_string_lossy());
                        self.closed = Some(obs.clone());
                        return Some(obs);
                    }
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(1), read).await.ok().flatten()
    }

    /// Writes one method frame.
    pub async fn send(&mut self, ch: u16, method: impl Into<Method>) -> Step<()> {
        let mut out = BytesMut::new();
        encode_method(ch, &method.into(), &mut out).map_err(|e| Got::saw(format!("cannot encode: {e}")))?;
        self.send_bytes(&out).await
    }

    /// Writes a `basic.publish` with its content, split at the negotiated `frame_max`.
    pub async fn publish(
        &mut self,
        ch: u16,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        props: BasicProperties,
        body: &[u8],
    ) -> Step<()> {
        let publish = acemq_codec::BasicPublish {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            mandatory,
            ..Default::default()
        };
        let mut out = BytesMut::new();
        encode_content(ch, &publish.into(), &props, body, self.frame_max, &mut out)
            .map_err(|e| Got::saw(format!("cannot encode: {e}")))?;
        self.send_bytes(&out).await
    }

    /// Opens channel `ch`.
    pub async fn open_channel(&mut self, ch: u16) -> Step<()> {
        match self.call(ch, ChannelOpen::default()).await? {
            Method::ChannelOpenOk(_) => Ok(()),
            other => Err(Got::saw(format!("{} instead of channel.open-ok", other.name()))),
        }
    }

    /// Sends `method` on `ch` and returns the broker's next method there
    /// (a close of the channel or connection is the error).
    pub async fn call(&mut self, ch: u16, method: impl Into<Method>) -> Step<Method> {
        self.send(ch, method).await?;
        Ok(self.next_on(ch).await?.method)
    }

    /// The next method on `ch` (or a `connection.close`, which is the
    /// error); methods on other channels stay in the inbox.
    pub async fn next_on(&mut self, ch: u16) -> Step<In> {
        loop {
            // A connection.close ends every wait, whatever the channel.
            let wanted = |m: &In| m.ch == ch || matches!(m.method, Method::ConnectionClose(_));
            if let Some(i) = self.inbox.iter().position(wanted) {
                let m = self.inbox.remove(i).expect("a position in the inbox");
                return self.screen(m).await;
            }
            self.read_one().await?;
        }
    }

    /// The next method on any channel.
    pub async fn next_any(&mut self) -> Step<In> {
        loop {
            if let Some(m) = self.inbox.pop_front() {
                return self.screen(m).await;
            }
            self.read_one().await?;
        }
    }

    /// The next method on any channel, or `None` if none comes within `wait`.
    pub async fn next_within(&mut self, wait: Duration) -> Step<Option<In>> {
        match tokio::time::timeout(wait, self.next_any()).await {
            Ok(m) => m.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// A close from the broker is answered and becomes the error.
    async fn screen(&mut self, m: In) -> Step<In> {
        match &m.method {
            Method::ConnectionClose(c) => {
                let obs = close_obs("connection.close", c.reply_code, &c.reply_text.to_string_lossy());
                let _ = self.send(0, ConnectionCloseOk {}).await;
                self.closed = Some(obs.clone());
                Err(Got::Saw(obs))
            }
            Method::ChannelClose(c) => {
                let obs = close_obs("channel.close", c.reply_code, &c.reply_text.to_string_lossy());
                let _ = self.send(m.ch, ChannelCloseOk {}).await;
                Err(Got::Saw(obs))
            }
            _ => Ok(m),
        }
    }

    /// Bytes as they come (for the protocol header the broker answers
    /// with): up to `n` bytes, fewer if the broker closes first.
    pub async fn read_bytes(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let take = self.buf.len().min(n);
        self.buf.split_to(take).to_vec()
    }

    /// Whether the broker closes the socket (EOF or a reset) within `wait`,
    /// reading and dropping whatever comes before.
    pub async fn eof_within(&mut self, wait: Duration) -> bool {
        let read = async {
            let mut scratch = [0u8; 4096];
            loop {
                match self.stream.read(&mut scratch).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(wait, read).await.is_ok()
    }

    /// Reads until one whole method (with its content) is in the inbox.
    async fn read_one(&mut self) -> Step<()> {
        let frame = self.read_frame().await?;
        let (ch, method) = match frame {
            Frame::Heartbeat => return Ok(()),
            Frame::Method(ch, method) => (ch, method),
            other => {
                return Err(Got::saw(format!(
                    "a {} frame on channel {} outside any content",
                    kind(&other),
                    other.channel()
                )))
            }
        };
        let content = if method.has_content() {
            let header = match self.read_frame().await? {
                Frame::Header(_, h) => h,
                other => {
                    return Err(Got::saw(format!(
                        "a {} frame instead of a content header",
                        kind(&other)
                    )))
                }
            };
            let mut body = Vec::new();
            while (body.len() as u64) < header.body_size {
                match self.read_frame().await? {
                    Frame::Body(_, b) => body.extend_from_slice(&b),
                    other => return Err(Got::saw(format!("a {} frame inside a body", kind(&other)))),
                }
            }
            Some((header.properties.into_basic(), body))
        } else {
            None
        };
        self.inbox.push_back(In { ch, method, content });
        Ok(())
    }

    /// One frame; EOF is "closed without connection.close".
    pub async fn read_frame(&mut self) -> Step<Frame> {
        loop {
            match self.decoder.decode(&mut self.buf) {
                Ok(Some(frame)) => return Ok(frame),
                Ok(None) => {}
                Err(e) => return Err(Got::saw(format!("an undecodable frame from the broker: {e}"))),
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) => {
                    let obs = self.closed.clone().unwrap_or_else(|| Obs::new(CLOSED_SILENTLY));
                    return Err(Got::Saw(obs));
                }
                Ok(_) => {}
                Err(e) => {
                    let obs = self
                        .closed
                        .clone()
                        .unwrap_or_else(|| Obs::with_text(CLOSED_SILENTLY, &e.to_string()));
                    return Err(Got::Saw(obs));
                }
            }
        }
    }

    /// A polite `connection.close` (errors ignored: the check is over).
    pub async fn close(mut self) {
        if self.closed.is_some() {
            return;
        }
        let close = acemq_codec::ConnectionClose {
            reply_code: 200,
            reply_text: "bye".into(),
            class_id: 0,
            method_id: 0,
        };
        if self.send(0, close).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                loop {
                    match self.read_frame().await {
                        Ok(Frame::Method(0, Method::ConnectionCloseOk(_))) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            })
            .await;
        }
    }
}

/// What a check sees when the socket ends without a `connection.close`.
pub(crate) const CLOSED_SILENTLY: &str = "socket closed without connection.close";

fn kind(frame: &Frame) -> &'static str {
    match frame {
        Frame::Method(..) => "method",
        Frame::Header(..) | Frame::UndecodableHeader(..) => "content header",
        Frame::Body(..) => "body",
        Frame::Heartbeat => "heartbeat",
    }
}

/// A frame laid out by hand: `type`, `channel`, `payload`, then `end`
/// (0xCE for a well-formed frame).
pub(crate) fn raw_frame(frame_type: u8, ch: u16, payload: &[u8], end: u8) -> Vec<u8> {
    let mut out = BytesMut::with_capacity(payload.len() + 8);
    out.put_u8(frame_type);
    out.put_u16(ch);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.put_u8(end);
    out.to_vec()
}

/// A body frame of `len` bytes on `ch`.
pub(crate) fn body_frame(ch: u16, len: usize) -> Vec<u8> {
    raw_frame(FRAME_BODY, ch, &vec![b'x'; len], FRAME_END)
}

/// The payload of a method frame (class, method, arguments).
pub(crate) fn method_payload(method: impl Into<Method>) -> Vec<u8> {
    let mut out = BytesMut::new();
    let _ = method.into().encode(&mut out);
    out.to_vec()
}
