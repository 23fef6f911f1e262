//! What one client cannot do to the others: its output is bounded (a
//! consumer that does not read stops getting deliveries and the messages
//! stay queued), a write that makes no progress drops its connection, a
//! connection that has not logged in holds a small buffer, and a broker
//! full of queues and bindings routes a publish as fast as an empty one.

mod common;

use std::time::Duration;

use acemq_codec::{
    encode_content, encode_method, BasicConsume, BasicProperties, BasicPublish, ChannelOpen, ConfirmSelect,
    ConnectionOpen, ConnectionTuneOk, ExchangeDeclare, FieldTable, Method, QueueBind, QueueDeclare, PROTOCOL_HEADER,
};
use acemq_memory::{Broker, BrokerConfig};
use bytes::BytesMut;
use common::{start_ok_plain, Client};
use tokio::io::AsyncWriteExt;

/// The bytes of a client that logs in as guest, declares `queue` and
/// consumes it (`no_ack` or with prefetch 0), all at once: it never reads.
fn consumer_script(queue: &str, no_ack: bool) -> BytesMut {
    let mut out = BytesMut::new();
    out.extend_from_slice(&PROTOCOL_HEADER);
    let mut push = |ch: u16, m: Method| encode_method(ch, &m, &mut out).unwrap();
    push(0, start_ok_plain("guest", "guest").into());
    push(
        0,
        ConnectionTuneOk {
            channel_max: 2047,
            frame_max: 131_072,
            heartbeat: 0,
        }
        .into(),
    );
    push(
        0,
        ConnectionOpen {
            virtual_host: "/".into(),
            ..Default::default()
        }
        .into(),
    );
    push(1, ChannelOpen::default().into());
    push(
        1,
        QueueDeclare {
            queue: queue.into(),
            ..Default::default()
        }
        .into(),
    );
    push(
        1,
        BasicConsume {
            queue: queue.into(),
            consumer_tag: "stalled".into(),
            no_ack,
            ..Default::default()
        }
        .into(),
    );
    out
}

/// Publishes `count` messages of `size` bytes to `queue` with confirms,
/// waiting for each window of confirms.
async fn publish_confirmed(client: &mut Client, queue: &str, count: usize, size: usize) {
    let body = vec![0x42u8; size];
    let publish: Method = BasicPublish {
        routing_key: queue.into(),
        ..Default::default()
    }
    .into();
    let mut sent = 0;
    while sent < count {
        let n = 16.min(count - sent);
        let mut out = BytesMut::new();
        for _ in 0..n {
            encode_content(1, &publish, &BasicProperties::default(), &body, 131_072, &mut out).unwrap();
        }
        client.send_bytes(&out).await;
        sent += n;
        let mut acked = 0;
        while acked < sent as u64 {
            match client.method().await {
                (1, Method::BasicAck(a)) => acked = a.delivery_tag,
                other => panic!("expected a confirm, got {other:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_ack_consumer_that_does_not_read_stops_getting_deliveries_and_messages_stay_queued() {
    common::deadline::deadline(async {
        let limit = 256 * 1024;
        let broker = Broker::new(
            BrokerConfig::default()
                .with_output_limit(limit)
                .with_write_timeout(Duration::from_secs(120))
                .with_duplex_capacity(64 * 1024),
        );
        let mut stalled = broker.connect();
        stalled.write_all(&consumer_script("stalled", true)).await.unwrap();

        let mut publisher = Client::open(&broker).await;
        publisher.open_channel(1).await;
        publisher.call(1, ConfirmSelect { no_wait: false }).await;
        // Wait for the consumer to be attached before publishing.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while broker.queue_info("/", "stalled").is_none_or(|q| q.consumers == 0) {
            assert!(tokio::time::Instant::now() < deadline, "the consumer never attached");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // 64 MiB for a consumer that reads nothing.
        let size = 64 * 1024;
        publish_confirmed(&mut publisher, "stalled", 1024, size).await;

        let stats = broker.stats();
        assert!(
            stats.output_buffered <= limit + size + 4096,
            "{} bytes buffered for connections (limit {limit})",
            stats.output_buffered
        );
        let queued = broker.queue_info("/", "stalled").unwrap().messages;
        assert!(queued > 900, "the messages stay queued: only {queued} of 1024 are");

        // Everyone else goes on: a round trip on another queue.
        let mut other = Client::open(&broker).await;
        other.open_channel(1).await;
        other.declare_queue(1, "other", FieldTable::new()).await;
        other.publish(1, "", "other", b"hello").await;
        let got = other.call(
            1,
            acemq_codec::BasicGet {
                queue: "other".into(),
                no_ack: true,
                ..Default::default()
            },
        );
        let got = tokio::time::timeout(Duration::from_secs(5), got)
            .await
            .expect("a get answers");
        assert!(matches!(got, Method::BasicGetOk(_)), "{got:?}");
        drop(stalled);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_makes_no_progress_drops_the_connection_and_its_unacked_messages_go_back() {
    common::deadline::deadline(async {
        let broker = Broker::new(
            BrokerConfig::default()
                .with_output_limit(64 * 1024)
                .with_write_timeout(Duration::from_millis(500))
                .with_duplex_capacity(16 * 1024),
        );
        let mut stalled = broker.connect();
        stalled.write_all(&consumer_script("slow", false)).await.unwrap();
        let mut publisher = Client::open(&broker).await;
        publisher.open_channel(1).await;
        publisher.call(1, ConfirmSelect { no_wait: false }).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while broker.queue_info("/", "slow").is_none_or(|q| q.consumers == 0) {
            assert!(tokio::time::Instant::now() < deadline, "the consumer never attached");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        publish_confirmed(&mut publisher, "slow", 64, 16 * 1024).await;
        assert_eq!(broker.connection_count(), 2);

        // The stalled connection goes once a write has waited 500 ms.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while broker.connection_count() > 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the stalled connection was never dropped"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let q = broker.queue_info("/", "slow").unwrap();
        assert_eq!((q.messages, q.unacked, q.consumers), (64, 0, 0), "everything went back");
        assert_eq!(broker.stats().output_buffered, 0);
        drop(stalled);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_has_not_logged_in_holds_a_small_buffer() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let addr = broker.listen_tcp("127.0.0.1:0").await.unwrap();
        let mut sockets = Vec::new();
        for _ in 0..200 {
            let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
            socket.write_all(&PROTOCOL_HEADER).await.unwrap();
            sockets.push(socket);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while broker.stats().connections < 200 {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", broker.stats());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let reserved = broker.stats().input_reserved;
        assert!(
            reserved <= 200 * 8 * 1024,
            "200 connections before login reserve {reserved} bytes for input"
        );

        // One that logs in gets the full buffer.
        let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut client = Client::over(socket);
        client.handshake("guest", "guest", "/", 0).await;
        client.open_channel(1).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while broker.stats().input_reserved < reserved + 32 * 1024 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a logged-in connection has a full buffer: {:?}",
                broker.stats()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(sockets);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_is_refused_from_a_remote_address_and_others_are_not() {
    common::deadline::deadline(async {
        let Some(ip) = non_loopback_ip() else {
            panic!("this machine has no non-loopback address to connect from (hostname -I is empty)");
        };
        let broker = Broker::new(BrokerConfig::default().with_user(acemq_memory::User::new("app", "secret")));
        let addr = broker.listen_tcp("0.0.0.0:0").await.unwrap();
        let remote = std::net::SocketAddr::new(ip, addr.port());

        let mut refused = Client::over(tokio::net::TcpStream::connect(remote).await.unwrap());
        refused.send_bytes(&PROTOCOL_HEADER).await;
        refused.expect(|m| matches!(m, Method::ConnectionStart(_))).await;
        refused.send(0, start_ok_plain("guest", "guest")).await;
        let close = refused.expect(|m| matches!(m, Method::ConnectionClose(_))).await;
        let Method::ConnectionClose(close) = close else {
            unreachable!()
        };
        assert_eq!(close.reply_code, 403);
        assert_eq!(
            close.reply_text.to_string(),
            "ACCESS_REFUSED - user 'guest' can only connect via localhost"
        );

        let mut app = Client::over(tokio::net::TcpStream::connect(remote).await.unwrap());
        app.handshake("app", "secret", "/", 0).await;
        app.open_channel(1).await;

        let local = std::net::SocketAddr::from(([127, 0, 0, 1], addr.port()));
        let mut guest = Client::over(tokio::net::TcpStream::connect(local).await.unwrap());
        guest.handshake("guest", "guest", "/", 0).await;
        guest.open_channel(1).await;

        // With no loopback users, guest may come from anywhere.
        let open = Broker::new(BrokerConfig::default().with_loopback_users(Vec::<String>::new()));
        let addr = open.listen_tcp("0.0.0.0:0").await.unwrap();
        let remote = std::net::SocketAddr::new(ip, addr.port());
        let mut guest = Client::over(tokio::net::TcpStream::connect(remote).await.unwrap());
        guest.handshake("guest", "guest", "/", 0).await;
        guest.open_channel(1).await;
    })
    .await;
}

/// The first address `hostname -I` gives that is not loopback.
fn non_loopback_ip() -> Option<std::net::IpAddr> {
    let out = std::process::Command::new("hostname").arg("-I").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_open_past_max_connections_is_refused_with_530() {
    common::deadline::deadline(async {
        let broker = Broker::new(BrokerConfig::default().with_max_connections(Some(2)));
        let first = Client::open(&broker).await;
        let _second = Client::open(&broker).await;
        let mut third = Client::raw(&broker);
        third.send_bytes(&PROTOCOL_HEADER).await;
        third.expect(|m| matches!(m, Method::ConnectionStart(_))).await;
        third.send(0, start_ok_plain("guest", "guest")).await;
        third.expect(|m| matches!(m, Method::ConnectionTune(_))).await;
        third
            .send(
                0,
                ConnectionTuneOk {
                    channel_max: 2047,
                    frame_max: 131_072,
                    heartbeat: 0,
                },
            )
            .await;
        third
            .send(
                0,
                ConnectionOpen {
                    virtual_host: "/".into(),
                    ..Default::default()
                },
            )
            .await;
        let close = third.expect(|m| matches!(m, Method::ConnectionClose(_))).await;
        let Method::ConnectionClose(close) = close else {
            unreachable!()
        };
        assert_eq!(close.reply_code, 530);
        assert_eq!(
            close.reply_text.to_string(),
            "NOT_ALLOWED - connection refused: node connection limit (2) is reached"
        );
        // Once one goes, another may open.
        first.hang_up().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while broker.connection_count() > 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} connections",
                broker.connection_count()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut fourth = Client::open(&broker).await;
        fourth.open_channel(1).await;
    })
    .await;
}

/// Declares `queues` queues bound to `amq.direct` by name and a fanout of
/// `fanout` bindings, then times `publishes` confirmed publishes to one
/// direct queue; the same on an empty broker. Returns (empty, loaded).
async fn publish_costs(queues: usize, fanout: usize, publishes: usize) -> (Duration, Duration) {
    async fn target(client: &mut Client) {
        client.open_channel(1).await;
        client.declare_queue(1, "target", FieldTable::new()).await;
        client
            .call(
                1,
                QueueBind {
                    queue: "target".into(),
                    exchange: "amq.direct".into(),
                    routing_key: "target".into(),
                    ..Default::default()
                },
            )
            .await;
        client.call(1, ConfirmSelect { no_wait: false }).await;
    }
    async fn timed(client: &mut Client, publishes: usize) -> Duration {
        let started = std::time::Instant::now();
        for _ in 0..publishes {
            client.publish(1, "amq.direct", "target", b"x").await;
            match client.method().await {
                (1, Method::BasicAck(_)) => {}
                other => panic!("expected a confirm, got {other:?}"),
            }
        }
        started.elapsed()
    }
    let empty_broker = Broker::default();
    let mut empty = Client::open(&empty_broker).await;
    target(&mut empty).await;

    let loaded_broker = Broker::default();
    let mut loaded = Client::open(&loaded_broker).await;
    loaded.open_channel(2).await;
    let mut out = BytesMut::new();
    let push = |out: &mut BytesMut, m: Method| encode_method(2, &m, out).unwrap();
    push(
        &mut out,
        ExchangeDeclare {
            exchange: "wide".into(),
            kind: "fanout".into(),
            no_wait: true,
            ..Default::default()
        }
        .into(),
    );
    for n in 0..queues {
        let name = format!("q.{n}");
        push(
            &mut out,
            QueueDeclare {
                queue: name.as_str().into(),
                no_wait: true,
                ..Default::default()
            }
            .into(),
        );
        push(
            &mut out,
            QueueBind {
                queue: name.as_str().into(),
                exchange: "amq.direct".into(),
                routing_key: name.as_str().into(),
                no_wait: true,
                ..Default::default()
            }
            .into(),
        );
        if n < fanout {
            push(
                &mut out,
                QueueBind {
                    queue: name.as_str().into(),
                    exchange: "wide".into(),
                    no_wait: true,
                    ..Default::default()
                }
                .into(),
            );
        }
        if out.len() > 64 * 1024 {
            loaded.send_bytes(&out).await;
            out.clear();
        }
    }
    loaded.send_bytes(&out).await;
    target(&mut loaded).await;
    assert!(loaded_broker.queue_info("/", &format!("q.{}", queues - 1)).is_some());

    timed(&mut empty, publishes / 10).await;
    timed(&mut loaded, publishes / 10).await;
    let (mut e, mut l) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        e.push(timed(&mut empty, publishes).await);
        l.push(timed(&mut loaded, publishes).await);
    }
    e.sort();
    l.sort();
    (e[1], l[1])
}

/// The bench (`benches/routing.rs`) holds the release build to 2x; a debug
/// build on a shared machine is held to 3x here. Before the timer heap and
/// the routing index, every wake-up scanned the 100,000 queues and every
/// publish to `amq.direct` its 100,000 bindings, and declaring them was
/// quadratic: this did not finish within its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_to_a_direct_queue_costs_about_the_same_with_100k_queues_and_a_fanout_of_10k_declared() {
    common::deadline::deadline(async {
        let (empty, loaded) = publish_costs(100_000, 10_000, 2_000).await;
        let ratio = loaded.as_secs_f64() / empty.as_secs_f64();
        assert!(
            ratio <= 3.0,
            "2,000 publishes: {empty:?} on an empty broker, {loaded:?} on a loaded one ({ratio:.2}x)"
        );
    })
    .await;
}
