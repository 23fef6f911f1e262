//! `connection.blocked` under a real memory alarm. Its own test binary: the
//! alarm blocks every publishing connection of the broker, so nothing else
//! may run beside it.

use std::time::Duration;

use acemq_core::amqp::{Confirmation, ConnectionEvent};
use acemq_tests::brokers;
use amqp_codec::{BasicProperties, QueueDeclare};

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_alarm_blocks_a_publishing_connection_with_its_reason_then_unblocks_it() {
    for b in brokers().await {
        let conn = b.connect().await;
        let mut events = conn.events();
        let ch = conn.channel().await.unwrap();
        ch.confirm_select().await.unwrap();
        let q = ch
            .queue_declare(QueueDeclare {
                exclusive: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .unwrap()
            .queue
            .to_string();
        // RabbitMQ blocks only connections that have published.
        let first = ch
            .publish("", &q, false, BasicProperties::default(), "before".into())
            .unwrap();
        assert_eq!(first.await.unwrap(), Confirmation::Ack);

        b.set_memory_alarm(true);
        // RabbitMQ sends connection.blocked when a connection publishes under the alarm.
        let during = ch
            .publish("", &q, false, BasicProperties::default(), "during".into())
            .unwrap();
        let blocked = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match events.recv().await.unwrap() {
                    ConnectionEvent::Blocked { reason } => break reason,
                    _ => continue,
                }
            }
        })
        .await;
        // Clear the alarm before any assertion can fail, so the broker is left usable.
        let was_blocked = conn.is_blocked();
        b.set_memory_alarm(false);

        assert_eq!(
            blocked.expect("connection.blocked within 20 s"),
            "low on memory",
            "{:?}",
            b.kind
        );
        assert!(was_blocked);
        let unblocked = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let ConnectionEvent::Unblocked = events.recv().await.unwrap() {
                    break;
                }
            }
        })
        .await;
        assert!(unblocked.is_ok(), "connection.unblocked within 20 s");
        assert!(!conn.is_blocked());
        // The publish made while blocked waited in the socket and completes now.
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(20), during)
                .await
                .unwrap()
                .unwrap(),
            Confirmation::Ack
        );
        conn.close().await.unwrap();
    }
}
