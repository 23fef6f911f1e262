//! A frame-script client for driving the broker with raw AMQP frames built
//! by acemq-codec: send methods and content, assert what comes back.
#![allow(dead_code)]

pub mod deadline;

use std::time::Duration;

use acemq_codec::{
    encode_content, encode_method, BasicProperties, BasicPublish, ChannelOpen, ConnectionOpen, ConnectionStartOk,
    ConnectionTuneOk, FieldTable, FieldValue, Frame, FrameDecoder, Method, QueueDeclare, PROTOCOL_HEADER,
};
use acemq_memory::Broker;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// How long `recv` waits; on a paused clock this is virtual time.
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Client {
    writer: Box<dyn AsyncWrite + Unpin + Send>,
    frames: mpsc::UnboundedReceiver<Frame>,
    pub frame_max: u32,
}

/// A message as a consumer sees it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub channel: u16,
    pub method: Method,
    pub properties: BasicProperties,
    pub body: Bytes,
}

impl Delivery {
    pub fn header(&self, key: &str) -> Option<&FieldValue> {
        self.properties.headers.as_ref()?.get(key)
    }

    pub fn delivery_tag(&self) -> u64 {
        match &self.method {
            Method::BasicDeliver(d) => d.delivery_tag,
            Method::BasicGetOk(g) => g.delivery_tag,
            _ => 0,
        }
    }

    pub fn redelivered(&self) -> bool {
        match &self.method {
            Method::BasicDeliver(d) => d.redelivered,
            Method::BasicGetOk(g) => g.redelivered,
            _ => false,
        }
    }
}

pub fn client_properties() -> FieldTable {
    let mut caps = FieldTable::new();
    for cap in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
    ] {
        caps.insert(cap, true);
    }
    let mut props = FieldTable::new();
    props.insert("product", "acemq-memory tests");
    props.insert("capabilities", caps);
    props
}

pub fn args(pairs: &[(&str, FieldValue)]) -> FieldTable {
    pairs.iter().map(|(k, v)| (*k, v.clone())).collect()
}

impl Client {
    /// A connection with nothing sent yet.
    pub fn raw(broker: &Broker) -> Client {
        Client::over(broker.connect())
    }

    pub fn over<S: AsyncRead + AsyncWrite + Send + 'static>(stream: S) -> Client {
        let (mut reader, writer) = tokio::io::split(stream);
        let (tx, frames) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let decoder = FrameDecoder::new(0);
            let mut buf = BytesMut::with_capacity(64 * 1024);
            loop {
                loop {
                    match decoder.decode(&mut buf) {
                        Ok(Some(frame)) => {
                            if tx.send(frame).is_err() {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(_) => {
                            // The protocol header the broker sends back on a bad header.
                            return;
                        }
                    }
                }
                match reader.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        Client {
            writer: Box::new(writer),
            frames,
            frame_max: 131_072,
        }
    }

    /// Handshake as guest/guest on vhost `/`, heartbeats off.
    pub async fn open(broker: &Broker) -> Client {
        Client::open_with(broker, "guest", "guest", "/", 0).await
    }

    pub async fn open_with(broker: &Broker, user: &str, password: &str, vhost: &str, heartbeat: u16) -> Client {
        let mut client = Client::raw(broker);
        client.handshake(user, password, vhost, heartbeat).await;
        client
    }

    pub async fn handshake(&mut self, user: &str, password: &str, vhost: &str, heartbeat: u16) {
        self.send_bytes(&PROTOCOL_HEADER).await;
        self.expect(|m| matches!(m, Method::ConnectionStart(_))).await;
        self.send(0, start_ok_plain(user, password)).await;
        let tune = self.expect(|m| matches!(m, Method::ConnectionTune(_))).await;
        let Method::ConnectionTune(tune) = tune else {
            unreachable!()
        };
        self.send(
            0,
            ConnectionTuneOk {
                channel_max: tune.channel_max,
                frame_max: tune.frame_max,
                heartbeat,
            },
        )
        .await;
        self.send(
            0,
            ConnectionOpen {
                virtual_host: vhost.into(),
                ..Default::default()
            },
        )
        .await;
        self.expect(|m| matches!(m, Method::ConnectionOpenOk(_))).await;
    }

    /// Closes the socket from the client side, without a close handshake.
    pub async fn hang_up(mut self) {
        let _ = self.writer.shutdown().await;
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        let _ = self.writer.write_all(bytes).await;
        let _ = self.writer.flush().await;
    }

    pub async fn send(&mut self, channel: u16, method: impl Into<Method>) {
        let mut out = BytesMut::new();
        encode_method(channel, &method.into(), &mut out).unwrap();
        self.send_bytes(&out).await;
    }

    pub async fn publish_with(
        &mut self,
        channel: u16,
        publish: BasicPublish,
        properties: BasicProperties,
        body: &[u8],
    ) {
        let mut out = BytesMut::new();
        encode_content(channel, &publish.into(), &properties, body, self.frame_max, &mut out).unwrap();
        self.send_bytes(&out).await;
    }

    pub async fn publish(&mut self, channel: u16, exchange: &str, routing_key: &str, body: &[u8]) {
        let publish = BasicPublish {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            ..Default::default()
        };
        self.publish_with(channel, publish, BasicProperties::default(), body)
            .await;
    }

    /// The next frame; `None` once the broker closed the connection.
    pub async fn recv_frame(&mut self) -> Option<Frame> {
        match tokio::time::timeout(WAIT, self.frames.recv()).await {
            Ok(frame) => frame,
            Err(_) => panic!("no frame from the broker within {WAIT:?}"),
        }
    }

    /// The next frame that is not a heartbeat.
    pub async fn next(&mut self) -> Frame {
        loop {
            match self.recv_frame().await {
                Some(Frame::Heartbeat) => continue,
                Some(frame) => return frame,
                None => panic!("the broker closed the connection"),
            }
        }
    }

    /// The next method, which must satisfy `pred`.
    pub async fn expect(&mut self, pred: impl Fn(&Method) -> bool) -> Method {
        match self.next().await {
            Frame::Method(_, m) if pred(&m) => m,
            other => panic!("unexpected frame {other:?}"),
        }
    }

    /// The next method with its channel.
    pub async fn method(&mut self) -> (u16, Method) {
        match self.next().await {
            Frame::Method(ch, m) => (ch, m),
            other => panic!("expected a method frame, got {other:?}"),
        }
    }

    /// A content-bearing method with its header and body.
    pub async fn content(&mut self) -> Delivery {
        let (channel, method) = self.method().await;
        assert!(method.has_content(), "expected content, got {method:?}");
        let header = match self.next().await {
            Frame::Header(_, h) => h,
            other => panic!("expected a content header, got {other:?}"),
        };
        let mut body = BytesMut::new();
        while (body.len() as u64) < header.body_size {
            match self.next().await {
                Frame::Body(_, part) => body.extend_from_slice(&part),
                other => panic!("expected a body frame, got {other:?}"),
            }
        }
        Delivery {
            channel,
            method,
            properties: header.properties.into_basic(),
            body: body.freeze(),
        }
    }

    /// The rest of a content-bearing message whose method was already read.
    pub async fn content_after(&mut self, method: Method) -> Delivery {
        let header = match self.next().await {
            Frame::Header(_, h) => h,
            other => panic!("expected a content header, got {other:?}"),
        };
        let mut body = BytesMut::new();
        while (body.len() as u64) < header.body_size {
            match self.next().await {
                Frame::Body(_, part) => body.extend_from_slice(&part),
                other => panic!("expected a body frame, got {other:?}"),
            }
        }
        Delivery {
            channel: 0,
            method,
            properties: header.properties.into_basic(),
            body: body.freeze(),
        }
    }

    /// Sends `method` and returns the reply.
    pub async fn call(&mut self, channel: u16, method: impl Into<Method>) -> Method {
        self.send(channel, method).await;
        self.method().await.1
    }

    pub async fn open_channel(&mut self, channel: u16) {
        self.send(channel, ChannelOpen::default()).await;
        self.expect(|m| matches!(m, Method::ChannelOpenOk(_))).await;
    }

    pub async fn declare(&mut self, channel: u16, queue: QueueDeclare) -> Method {
        self.call(channel, queue).await
    }

    /// Declares a durable queue with `arguments` and expects declare-ok.
    pub async fn declare_queue(&mut self, channel: u16, name: &str, arguments: FieldTable) {
        let reply = self
            .call(
                channel,
                QueueDeclare {
                    queue: name.into(),
                    durable: true,
                    arguments,
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::QueueDeclareOk(_)), "declare {name}: {reply:?}");
    }

    /// Whether the broker closes the socket (after any frames it sends first).
    pub async fn closed(&mut self) -> bool {
        loop {
            match self.recv_frame().await {
                None => return true,
                Some(Frame::Heartbeat) => continue,
                Some(_) => continue,
            }
        }
    }

    /// Asserts that nothing but heartbeats arrives for `wait`.
    pub async fn silent_for(&mut self, wait: Duration) {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.frames.recv()).await {
                Err(_) => return,
                Ok(Some(Frame::Heartbeat)) => continue,
                Ok(other) => panic!("expected silence, got {other:?}"),
            }
        }
    }
}

pub fn start_ok_plain(user: &str, password: &str) -> ConnectionStartOk {
    ConnectionStartOk {
        client_properties: client_properties(),
        mechanism: "PLAIN".into(),
        response: format!("\0{user}\0{password}").into_bytes().into(),
        locale: "en_US".into(),
    }
}

/// A channel-close's code and text.
pub fn close_of(method: &Method) -> (u16, String, u16, u16) {
    match method {
        Method::ChannelClose(c) => (c.reply_code, c.reply_text.to_string(), c.class_id, c.method_id),
        Method::ConnectionClose(c) => (c.reply_code, c.reply_text.to_string(), c.class_id, c.method_id),
        other => panic!("expected a close, got {other:?}"),
    }
}
