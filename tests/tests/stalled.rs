//! A RabbitMQ that stays connected but stops answering (its node stopped
//! with SIGSTOP: sockets open, nothing read or written), with heartbeats
//! off so that only the call deadlines can end the waits: every call fails
//! after `call_timeout` with the typed error, and `Conn::close()` returns
//! within a bound. On this run's own RabbitMQ 3.10 node only: the shared
//! 4.0 node is never paused (the scripted server of `bad_server.rs` shows
//! the same for any broker).

use std::time::Duration;

use acemq_codec::{ExchangeDeclare, QueueBind, QueueDeclare, QueuePurge};
use acemq_core::amqp::{Config, Error};
use acemq_core::proto::Wait;
use acemq_core::{consume, Ack, Topology};
use acemq_tests::{brokers, chaos, deadline, unique, RabbitVersion};
use tokio::time::Instant;

fn impatient(base: Config) -> Config {
    let mut config = base;
    config.tune.heartbeat = 0;
    config.call_timeout = Duration::from_secs(1);
    config.close_timeout = Duration::from_secs(2);
    config
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_paused_rabbitmq_every_call_fails_after_the_call_timeout_and_close_returns() {
    deadline(async {
        for b in brokers().await {
            if b.version() != Some(RabbitVersion::V3_10) || b.kind.is_tls() {
                continue;
            }
            let _serial = chaos::serial().await;
            let engine = impatient(b.config());
            let conn = b.connect_with(engine.clone()).await;
            let mut channels = Vec::new();
            for _ in 0..6 {
                channels.push(conn.channel().await.unwrap());
            }
            let api = b
                .conn_with(acemq_core::Config::default().with_engine(engine.clone()))
                .await;
            let queue = unique("stalled");
            Topology::new().queue(&queue).declare(&api).await.unwrap();
            let consumer = consume(&api, &queue, |_: acemq_core::Message<u32>| async { Ack::accept() })
                .drain_timeout(Duration::from_secs(1))
                .await
                .unwrap();

            chaos::pause(RabbitVersion::V3_10).await;
            // All at once: once a call times out its channel is closed, and a
            // broker that does not confirm that close within close_timeout
            // has the whole connection closed.
            let at = Instant::now();
            let timed = |r: Result<(), Error>| (at.elapsed(), r);
            let (a, b2, c, d, e, f) = tokio::join!(
                async {
                    timed(
                        channels[0]
                            .exchange_declare(ExchangeDeclare::default())
                            .await
                            .map(|_| ()),
                    )
                },
                async { timed(channels[1].queue_declare(QueueDeclare::default()).await.map(|_| ())) },
                async { timed(channels[2].queue_bind(QueueBind::default()).await.map(|_| ())) },
                async { timed(channels[3].queue_purge(QueuePurge::default()).await.map(|_| ())) },
                async { timed(channels[4].qos(10).await) },
                async { timed(channels[5].confirm_select().await) },
            );
            let calls = [
                ("exchange.declare", a),
                ("queue.declare", b2),
                ("queue.bind", c),
                ("queue.purge", d),
                ("basic.qos", e),
                ("confirm.select", f),
            ];
            let closing = Instant::now();
            let closed = tokio::time::timeout(Duration::from_secs(30), api.close()).await;
            let close_took = closing.elapsed();
            let raw_closing = Instant::now();
            let raw_closed = tokio::time::timeout(Duration::from_secs(30), conn.close()).await;
            let raw_close_took = raw_closing.elapsed();
            chaos::resume(RabbitVersion::V3_10).await;

            for (name, (took, result)) in calls {
                let err = result.expect_err(name);
                assert!(
                    matches!(err, Error::NoReply { waiting_for: Wait::Reply { to }, .. } if to == name),
                    "{name}: {err}"
                );
                assert!(
                    took >= Duration::from_secs(1) && took < Duration::from_secs(5),
                    "{name}: {took:?}"
                );
            }
            assert!(closed.is_ok(), "Conn::close returned");
            assert!(close_took < Duration::from_secs(15), "Conn::close took {close_took:?}");
            assert!(consumer.is_finished());
            assert!(
                raw_closed.is_ok() && raw_close_took < Duration::from_secs(5),
                "{raw_close_took:?}"
            );

            // The node answers again: clean up.
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            let _ = ch
                .queue_delete(acemq_codec::QueueDelete {
                    queue: queue.as_str().into(),
                    ..Default::default()
                })
                .await;
            conn.close().await.unwrap();
        }
    })
    .await
}
