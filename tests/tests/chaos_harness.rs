//! The chaos helpers do what they say, against every real RabbitMQ node the
//! harness finds (3.10 and 4.0: `ACEMQ_RABBITMQ_URL`,
//! `ACEMQ_RABBITMQ4_URL`, or the default private nodes): forced
//! closes, a stopped app, kill -9 and restart on the node's data, a paused
//! VM, and the in-test proxy's cuts and blackholes; the cluster too when
//! `ACEMQ_RABBITMQ_CLUSTER_URL` is set. Only the low-level `Connection` API
//! and raw TCP. Every test holds `chaos::serial()`.

use std::time::{Duration, Instant};

use acemq_codec::{BasicProperties, QueueDeclare, QueueDelete, ReplyCode};
use acemq_core::amqp::{CloseReason, Config, Confirmation, Connection};
use acemq_tests::chaos::{self, host_port, Proxy};
use acemq_tests::{all_brokers, deadline, depth, step, unique, Kind};
use bytes::Bytes;

fn config() -> Config {
    Config::default().with_connection_timeout(Duration::from_secs(10))
}

async fn open(url: &str) -> Connection {
    step(format!("a connection to {url}"), Connection::open(url, config()))
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

/// How the connection ended, within 20 s.
async fn closed(conn: &Connection, what: &str) -> CloseReason {
    step(
        format!("the connection to end: {what}"),
        tokio::time::timeout(Duration::from_secs(20), conn.closed()),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: the connection is still open after 20 s"))
}

fn exclusive() -> QueueDeclare {
    QueueDeclare {
        exclusive: true,
        ..Default::default()
    }
}

fn durable(queue: &str) -> QueueDeclare {
    QueueDeclare {
        queue: queue.into(),
        durable: true,
        ..Default::default()
    }
}

fn delete(queue: &str) -> QueueDelete {
    QueueDelete {
        queue: queue.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn close_all_connections_closes_every_connection_from_the_broker() {
    deadline(async {
        let _serial = chaos::serial().await;
        for (v, url) in chaos::rabbitmq_nodes().await {
            let (a, b) = (open(&url).await, open(&url).await);
            let _ch = a.channel().await.unwrap();
            chaos::close_all_connections(v, "closed by chaos_harness").await;
            for conn in [&a, &b] {
                match closed(conn, "close_all_connections").await {
                    CloseReason::ByServer(r) => {
                        assert_eq!(r.reply_code(), ReplyCode::ConnectionForced, "{}", r.text);
                        assert!(r.text.contains("closed by chaos_harness"), "{}", r.text);
                    }
                    other => panic!("close_all_connections: {other:?}"),
                }
            }
            // The broker itself is fine.
            open(&url).await.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_app_closes_the_port_and_start_app_reopens_it() {
    deadline(async {
        let _serial = chaos::serial().await;
        for (v, url) in chaos::rabbitmq_nodes().await {
            let addr = host_port(&url);
            let conn = open(&url).await;
            chaos::stop_app(v).await;
            let reason = closed(&conn, "stop_app").await;
            assert!(
                matches!(reason, CloseReason::ByServer(_) | CloseReason::ConnectionLost),
                "stop_app: {reason:?}"
            );
            assert!(
                !chaos::amqp_answers(&addr).await,
                "the AMQP port answers after stop_app"
            );
            assert!(
                Connection::open(&url, config()).await.is_err(),
                "a connection opened after stop_app"
            );

            let before = Instant::now();
            let at = chaos::start_app(v).await;
            assert!(before <= at && at <= Instant::now());
            assert!(chaos::amqp_answers(&addr).await);
            open(&url).await.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_and_restart_keeps_durable_queues_persistent_messages_and_tls() {
    deadline(async {
        let _serial = chaos::serial().await;
        for (v, url) in chaos::rabbitmq_nodes().await {
            // The TLS broker's settings, read before the kill: the restarted node
            // must still present the same certificates.
            let tls = all_brokers()
                .await
                .into_iter()
                .find(|b| b.kind == Kind::rabbit(v, true));
            let queue = unique("chaos.survives");
            let conn = open(&url).await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            ch.queue_declare(durable(&queue)).await.unwrap();
            let persistent = BasicProperties {
                delivery_mode: Some(2),
                ..Default::default()
            };
            let confirm = ch
                .publish("", &queue, true, persistent, Bytes::from_static(b"survives"))
                .await
                .unwrap();
            assert_eq!(confirm.await.unwrap(), Confirmation::Ack);

            let before = Instant::now();
            let down_for = Duration::from_secs(1);
            let at = chaos::kill_and_restart(v, down_for).await;
            assert!(
                at >= before + down_for && at <= Instant::now(),
                "{:?} after the kill",
                at - before
            );
            eprintln!(
                "kill_and_restart: the node answered again {:?} after the kill",
                at - before
            );
            assert_eq!(closed(&conn, "kill -9").await, CloseReason::ConnectionLost);

            let conn = open(&url).await;
            let ch = conn.channel().await.unwrap();
            assert_eq!(depth(&ch, &queue).await, 1, "the persistent message survived");
            let got = ch.basic_get(&queue, true).await.unwrap().expect("the message");
            assert_eq!(got.body, Bytes::from_static(b"survives"));
            ch.queue_delete(delete(&queue)).await.unwrap();
            conn.close().await.unwrap();
            if let Some(tls) = tls {
                tls.connect().await.close().await.unwrap();
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_leaves_nothing_listening_and_restart_right_after_brings_it_back() {
    deadline(async {
        let _serial = chaos::serial().await;
        for (v, url) in chaos::rabbitmq_nodes().await {
            let addr = host_port(&url);
            let conn = open(&url).await;
            chaos::kill(v).await;
            assert!(
                tokio::net::TcpStream::connect(&addr).await.is_err(),
                "something still listens on {addr} after kill"
            );
            assert_eq!(closed(&conn, "kill -9").await, CloseReason::ConnectionLost);
            let before = Instant::now();
            let at = chaos::restart(v).await;
            assert!(before <= at && at <= Instant::now());
            eprintln!("restart: the node answered {:?} after restart began", at - before);
            let conn = open(&url).await;
            let ch = conn.channel().await.unwrap();
            assert!(!ch.queue_declare(exclusive()).await.unwrap().unwrap().queue.is_empty());
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_silences_the_broker_and_resume_makes_it_answer() {
    deadline(async {
        let _serial = chaos::serial().await;
        for (v, url) in chaos::rabbitmq_nodes().await {
            let addr = host_port(&url);
            // RabbitMQ's heartbeat (60 s) is far longer than the pause: only the
            // broker's silence is measured here.
            let conn = open(&url).await;
            let ch = conn.channel().await.unwrap();
            chaos::pause(v).await;
            let declare = ch.queue_declare(exclusive());
            tokio::pin!(declare);
            assert!(
                tokio::time::timeout(Duration::from_secs(2), &mut declare)
                    .await
                    .is_err(),
                "a paused broker answered queue.declare"
            );
            assert!(!conn.is_closed(), "{:?}", conn.close_reason());
            // Its sockets stay open: TCP connects, AMQP gets no answer.
            assert!(tokio::net::TcpStream::connect(&addr).await.is_ok());
            assert!(!chaos::amqp_answers(&addr).await);

            chaos::resume(v).await;
            let ok = step(
                "queue.declare-ok after resume",
                tokio::time::timeout(Duration::from_secs(20), declare),
            )
            .await
            .expect("no answer to queue.declare 20 s after resume")
            .unwrap()
            .unwrap();
            assert!(!ok.queue.is_empty());
            assert!(chaos::amqp_answers(&addr).await);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn proxy_cut_all_ends_connections_and_keeps_accepting() {
    deadline(async {
        let _serial = chaos::serial().await;
        // The proxy is the same in front of either version: the first will do.
        let Some((_, url)) = chaos::rabbitmq_nodes().await.into_iter().next() else {
            return;
        };
        let proxy = Proxy::start(host_port(&url)).await;
        let through = proxy.url_for(&url);
        let conn = open(&through).await;
        let ch = conn.channel().await.unwrap();
        ch.queue_declare(exclusive()).await.unwrap();
        assert_eq!(proxy.connections(), 1);

        proxy.cut_all();
        assert_eq!(closed(&conn, "cut_all").await, CloseReason::ConnectionLost);
        proxy.wait_connections(0, Duration::from_secs(5)).await;

        let again = open(&through).await;
        again.channel().await.unwrap().queue_declare(exclusive()).await.unwrap();
        assert_eq!(proxy.connections(), 1);
        again.close().await.unwrap();
        proxy.wait_connections(0, Duration::from_secs(5)).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn proxy_blackhole_stops_replies_and_lifting_it_restores_them() {
    deadline(async {
        let _serial = chaos::serial().await;
        // The proxy is the same in front of either version: the first will do.
        let Some((_, url)) = chaos::rabbitmq_nodes().await.into_iter().next() else {
            return;
        };
        let proxy = Proxy::start(host_port(&url)).await;
        let proxy_addr = format!("127.0.0.1:{}", proxy.port());
        let conn = open(&proxy.url_for(&url)).await;
        let ch = conn.channel().await.unwrap();

        proxy.blackhole(true);
        let declare = ch.queue_declare(exclusive());
        tokio::pin!(declare);
        assert!(
            tokio::time::timeout(Duration::from_secs(2), &mut declare)
                .await
                .is_err(),
            "queue.declare was answered through a blackhole"
        );
        assert!(!conn.is_closed(), "{:?}", conn.close_reason());
        assert_eq!(proxy.connections(), 1, "the blackholed socket stays open");
        // A new connection is accepted, and blackholed too.
        assert!(!chaos::amqp_answers(&proxy_addr).await);

        proxy.blackhole(false);
        // The declare above was dropped on the way; a new request is answered.
        let ch2 = step(
            "channel.open-ok after the blackhole",
            tokio::time::timeout(Duration::from_secs(10), conn.channel()),
        )
        .await
        .expect("no channel.open-ok after the blackhole was lifted")
        .unwrap();
        ch2.queue_declare(exclusive()).await.unwrap();
        assert!(chaos::amqp_answers(&proxy_addr).await);
        conn.close().await.unwrap();
        drop(proxy);
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn proxy_url_for_replaces_only_the_hosts() {
    deadline(async {
        let _serial = chaos::serial().await;
        let proxy = Proxy::start("127.0.0.1:9").await;
        let p = proxy.port();
        assert_eq!(
            proxy.url_for("amqp://guest:guest@127.0.0.1:5672/?heartbeat=5"),
            format!("amqp://guest:guest@127.0.0.1:{p}/?heartbeat=5")
        );
        assert_eq!(
            proxy.url_for("amqps://u:p%40ss@localhost:5671/%2f"),
            format!("amqps://u:p%40ss@127.0.0.1:{p}/%2f")
        );
        assert_eq!(proxy.url_for("amqp://h1:1,h2:2/v"), format!("amqp://127.0.0.1:{p}/v"));
        assert_eq!(proxy.url_for("amqp://host"), format!("amqp://127.0.0.1:{p}"));
        assert_eq!(proxy.upstream(), "127.0.0.1:9");
    })
    .await
}

/// Only when a cluster runs (`scripts/rabbitmq.sh cluster start`, then the
/// lines of `cluster env` exported): no test run starts one.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_kill_and_restart_of_one_node() {
    deadline(async {
        let _serial = chaos::serial().await;
        let Some(url) = chaos::cluster_url().await else { return };
        let node = |n| format!("amqp://guest:guest@{}/", chaos::cluster_node(n));
        // One cluster: a queue declared through node 1 is seen through node 3.
        let queue = unique("chaos.cluster");
        let c1 = open(&node(1)).await;
        c1.channel()
            .await
            .unwrap()
            .queue_declare(durable(&queue))
            .await
            .unwrap();
        let c3 = open(&node(3)).await;
        let ch3 = c3.channel().await.unwrap();
        assert_eq!(depth(&ch3, &queue).await, 0);

        chaos::cluster_kill(1).await;
        assert_eq!(closed(&c1, "cluster kill 1").await, CloseReason::ConnectionLost);
        assert!(!chaos::amqp_answers(&chaos::cluster_node(1)).await);
        // The cluster URL still connects: the client tries the next host.
        let c = open(&url).await;
        c.channel().await.unwrap().queue_declare(exclusive()).await.unwrap();
        c.close().await.unwrap();

        let before = Instant::now();
        let at = chaos::cluster_restart(1).await;
        assert!(before <= at && at <= Instant::now());
        let c1 = open(&node(1)).await;
        let ch1 = c1.channel().await.unwrap();
        assert_eq!(depth(&ch1, &queue).await, 0);
        ch1.queue_delete(delete(&queue)).await.unwrap();
        c1.close().await.unwrap();
        c3.close().await.unwrap();
    })
    .await
}
