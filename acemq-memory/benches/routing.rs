//! Routing under load: what a publish to a direct exchange costs on a broker
//! that holds 100,000 queues (each bound to `amq.direct` by its name) and a
//! fanout exchange with 10,000 bindings, against the same publish on an
//! empty broker. Each publish waits for its confirm, so every one pays a
//! whole wake-up of the connection (timers, routing, the confirm).
//!
//! `cargo bench -p acemq-memory --bench routing` prints both costs and their
//! ratio, and exits 1 if the loaded broker costs more than twice the empty
//! one (`ACEMQ_BENCH_QUEUES`, `ACEMQ_BENCH_FANOUT`, `ACEMQ_BENCH_PUBLISHES`
//! change the sizes).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use acemq_codec::{
    encode_content, encode_method, BasicProperties, BasicPublish, ChannelOpen, ConfirmSelect, ConnectionOpen,
    ConnectionStartOk, ConnectionTuneOk, ExchangeDeclare, Frame, FrameDecoder, Method, QueueBind, QueueDeclare,
    QueuePurge, PROTOCOL_HEADER,
};
use acemq_memory::Broker;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};

/// A raw client on one channel.
struct Client {
    read: ReadHalf<DuplexStream>,
    write: WriteHalf<DuplexStream>,
    buf: BytesMut,
    decoder: FrameDecoder,
    out: BytesMut,
}

impl Client {
    async fn open(broker: &Broker) -> Client {
        let (read, write) = tokio::io::split(broker.connect());
        let mut c = Client {
            read,
            write,
            buf: BytesMut::with_capacity(256 * 1024),
            decoder: FrameDecoder::new(0),
            out: BytesMut::new(),
        };
        c.write.write_all(&PROTOCOL_HEADER).await.unwrap();
        c.method().await;
        c.push(
            0,
            ConnectionStartOk {
                mechanism: "PLAIN".into(),
                response: b"\0guest\0guest".as_slice().into(),
                locale: "en_US".into(),
                ..Default::default()
            },
        );
        c.flush().await;
        c.method().await;
        c.push(
            0,
            ConnectionTuneOk {
                channel_max: 2047,
                frame_max: 131_072,
                heartbeat: 0,
            },
        );
        c.push(
            0,
            ConnectionOpen {
                virtual_host: "/".into(),
                ..Default::default()
            },
        );
        c.push(1, ChannelOpen::default());
        c.push(1, ConfirmSelect { no_wait: false });
        c.flush().await;
        for _ in 0..3 {
            c.method().await;
        }
        c
    }

    fn push(&mut self, ch: u16, m: impl Into<Method>) {
        encode_method(ch, &m.into(), &mut self.out).unwrap();
    }

    async fn flush(&mut self) {
        self.write.write_all(&self.out).await.unwrap();
        self.out.clear();
    }

    async fn method(&mut self) -> Method {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf).expect("valid frames") {
                match frame {
                    Frame::Method(_, m) => return m,
                    other => panic!("expected a method, got {other:?}"),
                }
            }
            if self.buf.capacity() - self.buf.len() < 65_536 {
                self.buf.reserve(256 * 1024);
            }
            let n = self.read.read_buf(&mut self.buf).await.expect("read");
            assert!(n > 0, "broker closed the connection");
        }
    }

    /// Declares `count` queues bound to `amq.direct` by their names, and a
    /// fanout exchange bound to `fanout` of them; waits for the last reply.
    async fn load(&mut self, count: usize, fanout: usize) {
        self.push(
            1,
            ExchangeDeclare {
                exchange: "bench.fanout".into(),
                kind: "fanout".into(),
                no_wait: true,
                ..Default::default()
            },
        );
        for n in 0..count {
            let queue = format!("bench.q.{n}");
            self.push(
                1,
                QueueDeclare {
                    queue: queue.as_str().into(),
                    no_wait: true,
                    ..Default::default()
                },
            );
            self.push(
                1,
                QueueBind {
                    queue: queue.as_str().into(),
                    exchange: "amq.direct".into(),
                    routing_key: queue.as_str().into(),
                    no_wait: true,
                    ..Default::default()
                },
            );
            if n < fanout {
                self.push(
                    1,
                    QueueBind {
                        queue: queue.as_str().into(),
                        exchange: "bench.fanout".into(),
                        no_wait: true,
                        ..Default::default()
                    },
                );
            }
            if self.out.len() > 256 * 1024 {
                self.flush().await;
            }
        }
        self.target().await;
    }

    /// The queue the publishes go to, bound to `amq.direct`.
    async fn target(&mut self) {
        self.push(
            1,
            QueueDeclare {
                queue: "bench.target".into(),
                ..Default::default()
            },
        );
        self.push(
            1,
            QueueBind {
                queue: "bench.target".into(),
                exchange: "amq.direct".into(),
                routing_key: "bench.target".into(),
                ..Default::default()
            },
        );
        self.flush().await;
        let declared = self.method().await;
        assert!(matches!(declared, Method::QueueDeclareOk(_)), "{declared:?}");
        let bound = self.method().await;
        assert!(matches!(bound, Method::QueueBindOk(_)), "{bound:?}");
    }

    /// Publishes `count` messages to `amq.direct`, each waiting for its
    /// confirm; returns the time per publish. The queue is purged after.
    async fn publish(&mut self, count: usize) -> Duration {
        let publish: Method = BasicPublish {
            exchange: "amq.direct".into(),
            routing_key: "bench.target".into(),
            ..Default::default()
        }
        .into();
        let props = BasicProperties::default();
        let body = [0x5Au8; 64];
        let started = Instant::now();
        for _ in 0..count {
            encode_content(1, &publish, &props, &body, 131_072, &mut self.out).unwrap();
            self.flush().await;
            match self.method().await {
                Method::BasicAck(_) => {}
                other => panic!("expected a confirm, got {other:?}"),
            }
        }
        let per_publish = started.elapsed() / count as u32;
        self.push(
            1,
            QueuePurge {
                queue: "bench.target".into(),
                ..Default::default()
            },
        );
        self.flush().await;
        self.method().await;
        per_publish
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() -> ExitCode {
    // `cargo test --benches` runs this without `--bench`: keep it small then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (queues, fanout, publishes) = if quick {
        (2_000, 200, 200)
    } else {
        (
            env("ACEMQ_BENCH_QUEUES", 100_000),
            env("ACEMQ_BENCH_FANOUT", 10_000),
            env("ACEMQ_BENCH_PUBLISHES", 5_000),
        )
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let empty_broker = Broker::default();
        let mut empty = Client::open(&empty_broker).await;
        empty.target().await;

        let loaded_broker = Broker::default();
        let mut loaded = Client::open(&loaded_broker).await;
        let started = Instant::now();
        loaded.load(queues, fanout).await;
        println!(
            "declared {queues} queues bound to amq.direct and a fanout of {fanout} bindings in {:.2} s",
            started.elapsed().as_secs_f64()
        );

        // Warm up both, then alternate rounds so that both see the same machine.
        empty.publish(publishes / 10 + 1).await;
        loaded.publish(publishes / 10 + 1).await;
        let (mut on_empty, mut on_loaded) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            on_empty.push(empty.publish(publishes).await);
            on_loaded.push(loaded.publish(publishes).await);
        }
        let (e, l) = (median(on_empty), median(on_loaded));
        let ratio = l.as_secs_f64() / e.as_secs_f64();
        println!(
            "publish to a direct queue, confirmed one by one ({publishes} x 5 rounds, medians): \
             empty broker {:.2} us, loaded broker {:.2} us, ratio {ratio:.2}",
            e.as_secs_f64() * 1e6,
            l.as_secs_f64() * 1e6
        );
        if ratio > 2.0 && !quick {
            eprintln!("the loaded broker costs more than twice the empty one");
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    })
}
