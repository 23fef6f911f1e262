//! A small fake server that misbehaves: the client closes with the right
//! connection error, keeps what it can, and nothing panics.

use std::time::Duration;

use acemq_codec::*;
use acemq_core::amqp::{CloseReason, Config, Connection, Error};
use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct FakeConn {
    stream: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl FakeConn {
    async fn recv(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = self
                .decoder
                .decode(&mut self.buf)
                .expect("the client sends valid frames")
            {
                return Some(frame);
            }
            if self.stream.read_buf(&mut self.buf).await.ok()? == 0 {
                return None;
            }
        }
    }

    async fn recv_method(&mut self) -> Option<Method> {
        loop {
            match self.recv().await? {
                Frame::Method(_, m) => return Some(m),
                Frame::Heartbeat => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    async fn send(&mut self, frame: Frame) {
        let mut out = BytesMut::new();
        frame.encode(&mut out).unwrap();
        self.stream.write_all(&out).await.unwrap();
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// The server side of the handshake, then one channel opened by the client.
    async fn handshake(&mut self) {
        let mut header = [0u8; 8];
        self.stream.read_exact(&mut header).await.unwrap();
        assert_eq!(check_protocol_header(&header), Ok(true));
        let start = ConnectionStart {
            version_major: 0,
            version_minor: 9,
            mechanisms: "PLAIN AMQPLAIN".into(),
            locales: "en_US".into(),
            ..Default::default()
        };
        self.send(Frame::Method(0, start.into())).await;
        let Some(Method::ConnectionStartOk(ok)) = self.recv_method().await else {
            panic!()
        };
        assert_eq!(ok.mechanism, "PLAIN");
        let tune = ConnectionTune {
            channel_max: 16,
            frame_max: 131_072,
            heartbeat: 0,
        };
        self.send(Frame::Method(0, tune.into())).await;
        assert!(matches!(self.recv_method().await, Some(Method::ConnectionTuneOk(_))));
        assert!(matches!(self.recv_method().await, Some(Method::ConnectionOpen(_))));
        self.send(Frame::Method(0, ConnectionOpenOk::default().into())).await;
    }

    async fn accept_channel(&mut self) -> u16 {
        let frame = self.recv().await.unwrap();
        let Frame::Method(ch, Method::ChannelOpen(_)) = frame else {
            panic!("{frame:?}")
        };
        self.send(Frame::Method(ch, ChannelOpenOk::default().into())).await;
        ch
    }

    /// Reads until the client's connection.close, answers it, and returns its code.
    async fn expect_close(&mut self) -> u16 {
        loop {
            match self.recv().await {
                Some(Frame::Method(0, Method::ConnectionClose(close))) => {
                    self.send(Frame::Method(0, ConnectionCloseOk {}.into())).await;
                    return close.reply_code;
                }
                Some(_) => continue,
                None => panic!("the client hung up without connection.close"),
            }
        }
    }
}

/// Starts a one-connection fake server running `script`; returns its URL.
async fn fake_server<F, Fut>(script: F) -> (String, tokio::task::JoinHandle<()>)
where
    F: FnOnce(FakeConn) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("amqp://guest:guest@{}/", listener.local_addr().unwrap());
    let handle = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        script(FakeConn {
            stream,
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(0),
        })
        .await;
    });
    (url, handle)
}

fn config() -> Config {
    Config::default().with_connection_timeout(Duration::from_secs(5))
}

async fn protocol_error_code(conn: &Connection) -> ReplyCode {
    match tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .unwrap()
    {
        CloseReason::ProtocolError { code, .. } => code,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn garbage_from_the_server_is_a_frame_error() {
    acemq_tests::deadline(async {
        let (url, server) = fake_server(|mut s| async move {
            s.handshake().await;
            s.send_raw(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            assert_eq!(s.expect_close().await, 501);
        })
        .await;
        let conn = Connection::open(&url, config()).await.unwrap();
        assert_eq!(protocol_error_code(&conn).await, ReplyCode::FrameError);
        server.await.unwrap();
    })
    .await
}

#[tokio::test]
async fn an_oversized_frame_is_a_frame_error_before_it_is_buffered() {
    acemq_tests::deadline(async {
        let (url, server) = fake_server(|mut s| async move {
            s.handshake().await;
            // A body frame header announcing 64 MiB, far above frame_max 131072.
            let mut header = BytesMut::new();
            header.put_u8(3);
            header.put_u16(1);
            header.put_u32(64 << 20);
            s.send_raw(&header).await;
            assert_eq!(s.expect_close().await, 501);
        })
        .await;
        let conn = Connection::open(&url, config()).await.unwrap();
        let _ch = conn.channel().await;
        assert_eq!(protocol_error_code(&conn).await, ReplyCode::FrameError);
        server.await.unwrap();
    })
    .await
}

#[tokio::test]
async fn a_frame_for_an_unopened_channel_is_a_channel_error() {
    acemq_tests::deadline(async {
        let (url, server) = fake_server(|mut s| async move {
            s.handshake().await;
            let deliver = BasicDeliver {
                delivery_tag: 1,
                ..Default::default()
            };
            s.send(Frame::Method(9, deliver.into())).await;
            assert_eq!(s.expect_close().await, 504);
        })
        .await;
        let conn = Connection::open(&url, config()).await.unwrap();
        assert_eq!(protocol_error_code(&conn).await, ReplyCode::ChannelError);
        server.await.unwrap();
    })
    .await
}

#[tokio::test]
async fn an_unknown_method_is_command_invalid() {
    acemq_tests::deadline(async {
        let (url, server) = fake_server(|mut s| async move {
            s.handshake().await;
            s.send_raw(&[1, 0, 0, 0, 0, 0, 4, 0, 99, 0, 1, 0xCE]).await;
            assert_eq!(s.expect_close().await, 503);
        })
        .await;
        let conn = Connection::open(&url, config()).await.unwrap();
        assert_eq!(protocol_error_code(&conn).await, ReplyCode::CommandInvalid);
        server.await.unwrap();
    })
    .await
}

#[tokio::test]
async fn garbage_instead_of_connection_start_fails_the_open() {
    acemq_tests::deadline(async {
        let (url, server) = fake_server(|mut s| async move {
            let mut header = [0u8; 8];
            s.stream.read_exact(&mut header).await.unwrap();
            s.send_raw(&[0xff; 64]).await;
        })
        .await;
        let err = Connection::open(&url, config()).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::ConnectionClosed(CloseReason::ProtocolError {
                    code: ReplyCode::FrameError,
                    ..
                })
            ),
            "{err:?}"
        );
        server.await.unwrap();
    })
    .await
}

#[tokio::test]
async fn a_server_that_hangs_up_mid_handshake_fails_the_open() {
    acemq_tests::deadline(async {
        let (url, server) = fake_server(|mut s| async move {
            let mut header = [0u8; 8];
            s.stream.read_exact(&mut header).await.unwrap();
        })
        .await;
        let err = Connection::open(&url, config()).await.unwrap_err();
        assert!(
            matches!(err, Error::ConnectionClosed(CloseReason::ConnectionLost)),
            "{err:?}"
        );
        server.await.unwrap();
    })
    .await
}

/// A delivery whose headers nest 20,000 deep (about 100 KB, inside one
/// 131072-byte frame; lapin's and amqprs's codecs abort on 8 KB of this)
/// arrives as a delivery with undecodable properties; the next delivery on
/// the same connection is fine.
#[tokio::test]
async fn a_poison_delivery_keeps_the_connection_up() {
    acemq_tests::deadline(async {
        let (url, server) = fake_server(|mut s| async move {
            s.handshake().await;
            let ch = s.accept_channel().await;
            let Some(Method::BasicConsume(_)) = s.recv_method().await else {
                panic!()
            };
            s.send(Frame::Method(
                ch,
                BasicConsumeOk {
                    consumer_tag: "c".into(),
                }
                .into(),
            ))
            .await;

            let deliver = |tag| BasicDeliver {
                consumer_tag: "c".into(),
                delivery_tag: tag,
                ..Default::default()
            };
            // The poison: headers = 20,000 nested arrays.
            let mut bomb: Vec<u8> = Vec::new();
            for _ in 0..20_000 {
                let mut level = vec![b'A'];
                level.extend_from_slice(&(bomb.len() as u32).to_be_bytes());
                level.extend_from_slice(&bomb);
                bomb = level;
            }
            let mut table = vec![1, b'k'];
            table.extend_from_slice(&bomb);
            let mut payload = BytesMut::new();
            payload.put_u16(60);
            payload.put_u16(0);
            payload.put_u64(6);
            payload.put_u16(0x2000);
            payload.put_u32(table.len() as u32);
            payload.put_slice(&table);
            s.send(Frame::Method(ch, deliver(1).into())).await;
            let mut raw = BytesMut::new();
            raw.put_u8(2);
            raw.put_u16(ch);
            raw.put_u32(payload.len() as u32);
            raw.put_slice(&payload);
            raw.put_u8(0xCE);
            s.send_raw(&raw).await;
            s.send(Frame::Body(ch, Bytes::from_static(b"poison"))).await;
            // Then a good one.
            s.send(Frame::Method(ch, deliver(2).into())).await;
            s.send(Frame::Header(ch, ContentHeader::basic(4, BasicProperties::default())))
                .await;
            s.send(Frame::Body(ch, Bytes::from_static(b"good"))).await;
            // The client acks the poison (after setting it aside) and the good
            // one; acks in order may come folded into one multiple ack.
            let mut acked_up_to = 0;
            while acked_up_to < 2 {
                match s.recv_method().await {
                    Some(Method::BasicAck(a)) => {
                        assert!(a.multiple || a.delivery_tag == acked_up_to + 1, "{a:?}");
                        assert!(a.delivery_tag > acked_up_to, "{a:?}");
                        acked_up_to = a.delivery_tag;
                    }
                    Some(Method::ConnectionClose(c)) => panic!("closed with {}", c.reply_code),
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(acked_up_to, 2);
            assert_eq!(s.expect_close().await, 200);
        })
        .await;
        let conn = Connection::open(&url, config()).await.unwrap();
        let ch = conn.channel().await.unwrap();
        let mut consumer = ch.consume("q").await.unwrap();
        let poison = consumer.next().await.unwrap();
        let raw = poison.properties.as_ref().unwrap_err();
        assert_eq!(raw.error, DecodeErrorKind::NestingTooDeep(64));
        assert_eq!(
            &poison.body[..],
            b"poison",
            "the body still arrives, so the message can be set aside"
        );
        poison.ack().unwrap();
        let good = consumer.next().await.unwrap();
        assert!(good.properties.is_ok());
        assert_eq!(&good.body[..], b"good");
        good.ack().unwrap();
        assert!(!conn.is_closed());
        conn.close().await.unwrap();
        server.await.unwrap();
    })
    .await
}

/// Short protocol timeouts, heartbeats off: only the engine's own deadlines
/// can end these waits.
fn impatient() -> Config {
    let mut config = config();
    config.tune.heartbeat = 0;
    config.channel_open_timeout = Duration::from_millis(300);
    config.close_timeout = Duration::from_millis(300);
    config
}

#[tokio::test]
async fn a_broker_that_never_answers_close_ok_cannot_make_close_wait_for_ever() {
    acemq_tests::deadline(async {
        let (url, server) = fake_server(|mut s| async move {
            s.handshake().await;
            // Read the close, answer nothing, and keep the socket open.
            while let Some(frame) = s.recv().await {
                if matches!(frame, Frame::Method(0, Method::ConnectionClose(_))) {
                    break;
                }
            }
            let _ = s.recv().await;
        })
        .await;
        let conn = Connection::open(&url, impatient()).await.unwrap();
        assert_eq!(conn.tuned().heartbeat, 0);
        let started = tokio::time::Instant::now();
        let err = conn.close().await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::NoReply {
                    waiting_for: acemq_core::proto::Wait::ConnectionCloseOk,
                    ..
                }
            ),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(matches!(conn.closed().await, CloseReason::TimedOut { .. }));
        server.await.unwrap();
    })
    .await
}

#[tokio::test]
async fn a_channel_open_the_broker_never_answers_fails_and_the_connection_goes_on() {
    acemq_tests::deadline(async {
        let (url, server) = fake_server(|mut s| async move {
            s.handshake().await;
            // The first channel.open gets no answer; the client gives up on
            // it and closes the channel, which is answered.
            let Some(Frame::Method(ch, Method::ChannelOpen(_))) = s.recv().await else {
                panic!("expected channel.open")
            };
            let Some(Frame::Method(closed, Method::ChannelClose(_))) = s.recv().await else {
                panic!("expected channel.close")
            };
            assert_eq!(closed, ch);
            s.send(Frame::Method(ch, ChannelCloseOk {}.into())).await;
            // The next one is answered: the connection still works.
            s.accept_channel().await;
            assert_eq!(s.expect_close().await, 200);
        })
        .await;
        let conn = Connection::open(&url, impatient()).await.unwrap();
        let err = conn.channel().await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::NoReply {
                    waiting_for: acemq_core::proto::Wait::ChannelOpenOk,
                    ..
                }
            ),
            "{err}"
        );
        let ch = conn.channel().await.unwrap();
        assert!(ch.is_open());
        conn.close().await.unwrap();
        server.await.unwrap();
    })
    .await
}

// ---- a broker that stays connected but stops answering ----

/// The answer a working broker gives to `method`, if it has one.
fn answer(method: &Method) -> Option<Method> {
    Some(match method {
        Method::ChannelOpen(_) => ChannelOpenOk::default().into(),
        Method::ChannelClose(_) => ChannelCloseOk {}.into(),
        Method::ConfirmSelect(_) => ConfirmSelectOk {}.into(),
        Method::BasicQos(_) => BasicQosOk {}.into(),
        Method::BasicConsume(m) => BasicConsumeOk {
            consumer_tag: if m.consumer_tag.is_empty() {
                "ctag-1".into()
            } else {
                m.consumer_tag.clone()
            },
        }
        .into(),
        Method::BasicCancel(m) => BasicCancelOk {
            consumer_tag: m.consumer_tag.clone(),
        }
        .into(),
        Method::ExchangeDeclare(_) => ExchangeDeclareOk {}.into(),
        Method::QueueDeclare(m) => QueueDeclareOk {
            queue: m.queue.clone(),
            ..Default::default()
        }
        .into(),
        Method::QueueBind(_) => QueueBindOk {}.into(),
        _ => return None,
    })
}

/// A server for any number of connections that answers like a broker
/// until `silent` is set, then answers nothing at all (not even a
/// `close-ok`) and keeps every socket open: a broker that stays connected
/// but stopped answering, as one whose quorum queue lost its majority does.
/// With `closes` set, it still answers `channel.close` and
/// `connection.close` while silent; with `blocks`, it says
/// `connection.blocked` when a publish comes while silent (and then
/// confirms nothing, as a blocked RabbitMQ reads nothing).
async fn stalling_server(
    silent: std::sync::Arc<std::sync::atomic::AtomicBool>,
    closes: bool,
    blocks: bool,
) -> (String, tokio::task::JoinHandle<()>) {
    use std::sync::atomic::Ordering;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("amqp://guest:guest@{}/", listener.local_addr().unwrap());
    let handle = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let silent = silent.clone();
            tokio::spawn(async move {
                let mut s = FakeConn {
                    stream,
                    buf: BytesMut::new(),
                    decoder: FrameDecoder::new(0),
                };
                s.handshake().await;
                while let Some(frame) = s.recv().await {
                    let Frame::Method(ch, method) = frame else { continue };
                    let is_close = matches!(method, Method::ChannelClose(_) | Method::ConnectionClose(_));
                    if silent.load(Ordering::SeqCst) && !(closes && is_close) {
                        if blocks && matches!(method, Method::BasicPublish(_)) {
                            let blocked = ConnectionBlocked {
                                reason: "low on memory".into(),
                            };
                            s.send(Frame::Method(0, blocked.into())).await;
                        }
                        continue;
                    }
                    if let Method::ConnectionClose(_) = method {
                        s.send(Frame::Method(0, ConnectionCloseOk {}.into())).await;
                        return;
                    }
                    if let Some(reply) = answer(&method) {
                        s.send(Frame::Method(ch, reply)).await;
                    }
                }
            });
        }
    });
    (url, handle)
}

/// `impatient()` with a short call timeout.
fn call_impatient() -> Config {
    let mut config = impatient();
    config.call_timeout = Duration::from_millis(300);
    config
}

#[tokio::test]
async fn every_call_kind_fails_after_the_call_timeout_and_leaves_its_channel_closed() {
    acemq_tests::deadline(async {
        use acemq_core::proto::Wait;
        let silent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (url, server) = stalling_server(silent.clone(), true, false).await;
        let conn = Connection::open(&url, call_impatient()).await.unwrap();
        // A channel per call, opened while the broker still answers.
        let mut channels = Vec::new();
        for _ in 0..15 {
            channels.push(conn.channel().await.unwrap());
        }
        silent.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut ch = channels.into_iter();
        let mut calls: Vec<(&str, _)> = Vec::new();
        macro_rules! call {
            ($name:literal, $call:expr) => {{
                let c = ch.next().unwrap();
                let started = tokio::time::Instant::now();
                let result = $call(c.clone()).await;
                calls.push(($name, (c, started.elapsed(), result.map(|_| ()))));
            }};
        }
        call!("exchange.declare", |c: acemq_core::amqp::Channel| async move {
            c.exchange_declare(ExchangeDeclare::default()).await.map(|_| ())
        });
        call!("exchange.bind", |c: acemq_core::amqp::Channel| async move {
            c.exchange_bind(ExchangeBind::default()).await.map(|_| ())
        });
        call!("exchange.unbind", |c: acemq_core::amqp::Channel| async move {
            c.exchange_unbind(ExchangeUnbind::default()).await.map(|_| ())
        });
        call!("exchange.delete", |c: acemq_core::amqp::Channel| async move {
            c.exchange_delete(ExchangeDelete::default()).await.map(|_| ())
        });
        call!("queue.declare", |c: acemq_core::amqp::Channel| async move {
            c.queue_declare(QueueDeclare::default()).await.map(|_| ())
        });
        call!("queue.bind", |c: acemq_core::amqp::Channel| async move {
            c.queue_bind(QueueBind::default()).await.map(|_| ())
        });
        call!("queue.unbind", |c: acemq_core::amqp::Channel| async move {
            c.queue_unbind(QueueUnbind::default()).await.map(|_| ())
        });
        call!("queue.purge", |c: acemq_core::amqp::Channel| async move {
            c.queue_purge(QueuePurge::default()).await.map(|_| ())
        });
        call!("queue.delete", |c: acemq_core::amqp::Channel| async move {
            c.queue_delete(QueueDelete::default()).await.map(|_| ())
        });
        call!("basic.qos", |c: acemq_core::amqp::Channel| async move { c.qos(10).await });
        call!("basic.consume", |c: acemq_core::amqp::Channel| async move {
            c.consume("q").await.map(|_| ())
        });
        call!("basic.get", |c: acemq_core::amqp::Channel| async move {
            c.basic_get("q", false).await.map(|_| ())
        });
        call!("confirm.select", |c: acemq_core::amqp::Channel| async move {
            c.confirm_select().await
        });
        call!("tx.select", |c: acemq_core::amqp::Channel| async move { c.tx_select().await });
        call!("basic.cancel", |c: acemq_core::amqp::Channel| async move {
            c.basic_cancel(BasicCancel {
                consumer_tag: "ctag-1".into(),
                no_wait: false,
            })
            .await
            .map(|_| ())
        });
        for (name, (channel, waited, result)) in calls {
            let err = result.expect_err(name);
            assert!(
                matches!(err, Error::NoReply { waiting_for: Wait::Reply { to }, after } if to == name && after == Duration::from_millis(300)),
                "{name}: {err}"
            );
            assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3), "{name}: {waited:?}");
            // The handle is dead: the channel was closed under it.
            assert!(!channel.is_open(), "{name}");
            assert!(matches!(channel.qos(1).await, Err(Error::ChannelNotOpen(_))), "{name}");
        }
        // The connection itself goes on, and closes when asked.
        assert!(!conn.is_closed());
        conn.close().await.unwrap();
        server.abort();
    })
    .await
}

#[tokio::test]
async fn tx_commit_and_rollback_fail_after_the_call_timeout() {
    acemq_tests::deadline(async {
        use acemq_core::proto::Wait;
        let silent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (url, server) = stalling_server(silent.clone(), true, false).await;
        let conn = Connection::open(&url, call_impatient()).await.unwrap();
        let (a, b) = (conn.channel().await.unwrap(), conn.channel().await.unwrap());
        silent.store(true, std::sync::atomic::Ordering::SeqCst);
        let commit = a.tx_commit().await.unwrap_err();
        assert!(
            matches!(
                commit,
                Error::NoReply {
                    waiting_for: Wait::Reply { to: "tx.commit" },
                    ..
                }
            ),
            "{commit}"
        );
        let rollback = b.tx_rollback().await.unwrap_err();
        assert!(
            matches!(
                rollback,
                Error::NoReply {
                    waiting_for: Wait::Reply { to: "tx.rollback" },
                    ..
                }
            ),
            "{rollback}"
        );
        conn.close().await.unwrap();
        server.abort();
    })
    .await
}

#[tokio::test]
async fn conn_calls_and_confirms_fail_in_time_and_close_returns_when_the_broker_stops_answering() {
    acemq_tests::deadline(async {
        use acemq_core::{consume, Ack, Conn, Topology};
        let silent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Nothing is answered once silent, not even a close.
        let (url, server) = stalling_server(silent.clone(), false, false).await;
        let config = acemq_core::Config::default()
            .with_engine(call_impatient())
            .with_publish_timeout(Duration::from_millis(500))
            .with_without_recovery(true);
        let conn = Conn::open(&url, config).await.unwrap();
        let consumer = consume(&conn, "q", |_: acemq_core::Message<serde_json::Value>| async {
            Ack::accept()
        })
        .drain_timeout(Duration::from_millis(300))
        .await
        .unwrap();
        silent.store(true, std::sync::atomic::Ordering::SeqCst);

        // A declaration fails in bounded time with the typed error (its
        // channel's open goes unanswered first).
        let started = tokio::time::Instant::now();
        let err = Topology::new().queue("other").declare(&conn).await.unwrap_err();
        assert!(
            matches!(&err, acemq_core::Error::Engine(Error::NoReply { .. })),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

        // A send written but never confirmed fails after publish_timeout.
        let started = tokio::time::Instant::now();
        let err = conn.publisher::<u32>("", "q").send(&1).await.unwrap_err();
        assert!(matches!(err, acemq_core::Error::NotConfirmed { .. }), "{err}");
        assert!(started.elapsed() >= Duration::from_millis(500) && started.elapsed() < Duration::from_secs(3));

        // Close: the consumer's cancel, its channel's close and both
        // connections' closes all go unanswered, each bounded.
        let started = tokio::time::Instant::now();
        let _ = tokio::time::timeout(Duration::from_secs(10), conn.close())
            .await
            .expect("Conn::close returns although the broker answers nothing");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert!(consumer.is_finished());
        server.abort();
    })
    .await
}

#[tokio::test]
async fn a_sqlite_outbox_batch_never_outlives_its_lease_and_leaves_unconfirmed_rows_unmarked() {
    acemq_tests::deadline(async {
        use acemq_core::outbox::Outbox;
        use acemq_core::{Conn, Envelope};
        let silent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Once silent it blocks the publishing connection at the first
        // publish: a confirm then waits for blocked_timeout, far past the lease.
        let (url, server) = stalling_server(silent.clone(), true, true).await;
        let config = acemq_core::Config::default()
            .with_engine(call_impatient())
            .with_publish_timeout(Duration::from_millis(500))
            .with_blocked_timeout(Duration::from_secs(60))
            .with_without_recovery(true);
        let conn = Conn::open(&url, config).await.unwrap();
        let db = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let outbox = Outbox::new(db.clone());
        outbox.migrate().await.unwrap();
        let publisher = conn.publisher::<u32>("", "q");
        let mut tx = db.begin().await.unwrap();
        outbox.enqueue(&mut tx, &publisher, Envelope::new(), &1).await.unwrap();
        tx.commit().await.unwrap();
        silent.store(true, std::sync::atomic::Ordering::SeqCst);

        let lease = Duration::from_secs(2);
        let relay = outbox.relay(&conn).lease(lease);
        let started = tokio::time::Instant::now();
        let batch = tokio::time::timeout(Duration::from_secs(20), relay.run_once())
            .await
            .expect("the batch ends with its lease")
            .unwrap();
        assert!(started.elapsed() <= lease, "{:?}", started.elapsed());
        assert_eq!(
            (batch.claimed, batch.dispatched, batch.refused, batch.unmarked),
            (1, 0, 0, 1)
        );
        // Unmarked: not dispatched, not refused, free for the next claim once the lease ends.
        let (dispatched, attempts): (Option<i64>, i64) =
            sqlx::query_as("SELECT dispatched_at, attempts FROM acemq_outbox")
                .fetch_one(&db)
                .await
                .unwrap();
        assert_eq!((dispatched, attempts), (None, 0));
        assert_eq!(outbox.waiting().await.unwrap(), 1);
        server.abort();
    })
    .await
}

#[tokio::test]
async fn the_drain_s_basic_cancel_is_bounded_by_the_drain_timeout() {
    acemq_tests::deadline(async {
        use acemq_core::{consume, Ack, Conn};
        let silent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (url, server) = stalling_server(silent.clone(), true, false).await;
        // The cancel's own call timeout is long: only the drain timeout can end it.
        let mut engine = call_impatient();
        engine.call_timeout = Duration::from_secs(30);
        let config = acemq_core::Config::default()
            .with_engine(engine)
            .with_without_recovery(true);
        let conn = Conn::open(&url, config).await.unwrap();
        let consumer = consume(&conn, "q", |_: acemq_core::Message<serde_json::Value>| async {
            Ack::accept()
        })
        .drain_timeout(Duration::from_millis(300))
        .await
        .unwrap();
        silent.store(true, std::sync::atomic::Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        consumer.close().await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        conn.close().await.unwrap();
        server.abort();
    })
    .await
}
