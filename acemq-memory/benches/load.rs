//! Load test: 1,000,000 messages of 256 bytes published with confirms and
//! consumed with acks through the in-process transport, by a minimal raw-frame
//! client written with acemq-codec. Prints messages per second and peak
//! memory (VmHWM), and resident memory once the queue has drained.
//!
//! `cargo bench -p acemq-memory --bench load` (set `ACEMQ_BENCH_MESSAGES` for
//! a shorter run).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use acemq_codec::{
    encode_content, encode_method, BasicAck, BasicConsume, BasicProperties, BasicPublish, BasicQos, ChannelOpen,
    ConfirmSelect, ConnectionOpen, ConnectionStartOk, ConnectionTuneOk, Frame, FrameDecoder, Method, QueueDeclare,
    PROTOCOL_HEADER,
};
use acemq_memory::Broker;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf};
use tokio::sync::Semaphore;

const BODY: usize = 256;
const WINDOW: usize = 20_000;
const BATCH: usize = 500;
const PREFETCH: u16 = 2_000;

fn proc_status(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(|l| l.trim().to_owned()))
        .unwrap_or_else(|| format!("{field} n/a"))
}

struct Reader {
    half: ReadHalf<DuplexStream>,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl Reader {
    async fn frame(&mut self) -> Frame {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf).expect("valid frames") {
                return frame;
            }
            if self.buf.capacity() - self.buf.len() < 65_536 {
                self.buf.reserve(256 * 1024);
            }
            let n = self.half.read_buf(&mut self.buf).await.expect("read");
            assert!(n > 0, "broker closed the connection");
        }
    }

    async fn method(&mut self) -> Method {
        match self.frame().await {
            Frame::Method(_, m) => m,
            other => panic!("expected a method, got {other:?}"),
        }
    }
}

async fn send(w: &mut tokio::io::WriteHalf<DuplexStream>, ch: u16, m: impl Into<Method>) {
    let mut out = BytesMut::new();
    encode_method(ch, &m.into(), &mut out).unwrap();
    w.write_all(&out).await.unwrap();
}

async fn open(broker: &Broker) -> (Reader, tokio::io::WriteHalf<DuplexStream>) {
    let (half, mut w) = tokio::io::split(broker.connect());
    let mut r = Reader {
        half,
        buf: BytesMut::with_capacity(256 * 1024),
        decoder: FrameDecoder::new(0),
    };
    w.write_all(&PROTOCOL_HEADER).await.unwrap();
    r.method().await;
    let start_ok = ConnectionStartOk {
        mechanism: "PLAIN".into(),
        response: b"\0guest\0guest".as_slice().into(),
        locale: "en_US".into(),
        ..Default::default()
    };
    send(&mut w, 0, start_ok).await;
    r.method().await;
    send(
        &mut w,
        0,
        ConnectionTuneOk {
            channel_max: 2047,
            frame_max: 131_072,
            heartbeat: 0,
        },
    )
    .await;
    send(
        &mut w,
        0,
        ConnectionOpen {
            virtual_host: "/".into(),
            ..Default::default()
        },
    )
    .await;
    r.method().await;
    send(&mut w, 1, ChannelOpen::default()).await;
    r.method().await;
    send(
        &mut w,
        1,
        QueueDeclare {
            queue: "load".into(),
            durable: true,
            ..Default::default()
        },
    )
    .await;
    r.method().await;
    (r, w)
}

async fn run(total: u64) {
    let broker = Broker::default();
    let (mut consumer_r, mut consumer_w) = open(&broker).await;
    send(
        &mut consumer_w,
        1,
        BasicQos {
            prefetch_count: PREFETCH,
            ..Default::default()
        },
    )
    .await;
    consumer_r.method().await;
    send(
        &mut consumer_w,
        1,
        BasicConsume {
            queue: "load".into(),
            consumer_tag: "bench".into(),
            ..Default::default()
        },
    )
    .await;
    consumer_r.method().await;

    let (mut pub_r, mut pub_w) = open(&broker).await;
    send(&mut pub_w, 1, ConfirmSelect { no_wait: false }).await;
    pub_r.method().await;

    let started = Instant::now();
    let consumer = tokio::spawn(async move {
        let mut received = 0u64;
        let mut ack = BytesMut::new();
        while received < total {
            let mut last_tag = 0;
            // Everything already read, then one ack for all of it.
            loop {
                match consumer_r.decoder.decode(&mut consumer_r.buf).expect("valid frames") {
                    Some(Frame::Method(_, Method::BasicDeliver(d))) => {
                        last_tag = d.delivery_tag;
                        received += 1;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            if last_tag > 0 {
                ack.clear();
                encode_method(
                    1,
                    &BasicAck {
                        delivery_tag: last_tag,
                        multiple: true,
                    }
                    .into(),
                    &mut ack,
                )
                .unwrap();
                consumer_w.write_all(&ack).await.unwrap();
            }
            if received < total {
                if consumer_r.buf.capacity() - consumer_r.buf.len() < 65_536 {
                    consumer_r.buf.reserve(256 * 1024);
                }
                let n = consumer_r.half.read_buf(&mut consumer_r.buf).await.unwrap();
                assert!(n > 0);
            }
        }
        received
    });

    let window = Arc::new(Semaphore::new(WINDOW));
    let confirmed = Arc::new(AtomicU64::new(0));
    let confirmer = {
        let window = window.clone();
        let confirmed = confirmed.clone();
        tokio::spawn(async move {
            let mut last = 0u64;
            while last < total {
                match pub_r.frame().await {
                    Frame::Method(_, Method::BasicAck(a)) => {
                        let newly = a.delivery_tag - last;
                        last = a.delivery_tag;
                        confirmed.store(last, Ordering::Relaxed);
                        window.add_permits(newly as usize);
                    }
                    Frame::Method(_, Method::BasicNack(n)) => panic!("nacked {n:?}"),
                    _ => {}
                }
            }
        })
    };

    let body = vec![0xA5u8; BODY];
    let publish: Method = BasicPublish {
        routing_key: "load".into(),
        ..Default::default()
    }
    .into();
    let props = BasicProperties::default();
    let mut out = BytesMut::with_capacity(BATCH * (BODY + 64));
    let mut sent = 0u64;
    while sent < total {
        let n = BATCH.min((total - sent) as usize);
        window.acquire_many(n as u32).await.unwrap().forget();
        out.clear();
        for _ in 0..n {
            encode_content(1, &publish, &props, &body, 131_072, &mut out).unwrap();
        }
        pub_w.write_all(&out).await.unwrap();
        sent += n as u64;
    }
    confirmer.await.unwrap();
    let published_in = started.elapsed();
    let received = consumer.await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(received, total);
    let rate = total as f64 / elapsed.as_secs_f64();
    println!(
        "acemq-memory load: {total} x {BODY} B, confirms (window {WINDOW}) + acks (prefetch {PREFETCH}): \
         {:.0} msg/s through ({:.2} s; all confirmed after {:.2} s)",
        rate,
        elapsed.as_secs_f64(),
        published_in.as_secs_f64()
    );
    println!("peak memory: {}", proc_status("VmHWM"));
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let info = broker.queue_info("/", "load").unwrap();
    println!(
        "after drain: queue has {} ready, {} unacked; {}",
        info.messages,
        info.unacked,
        proc_status("VmRSS")
    );
}

fn main() {
    // `cargo test --benches` runs this with `--bench`-less args; keep it short then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let total: u64 = std::env::var("ACEMQ_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 10_000 } else { 1_000_000 });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(total));
}
