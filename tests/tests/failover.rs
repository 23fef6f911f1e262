//! Failover on a three-node RabbitMQ cluster (`scripts/rabbitmq.sh cluster`,
//! started by `scripts/test.sh`): a `Conn` with every node in its URL keeps
//! publishing and consuming a quorum queue of three replicas while the node
//! it is connected to is killed, and no confirmed send is lost.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::{FieldTable, FieldValue};
use acemq_core::{consume, Ack, Config, Conn, Message, RecoveryEvent, Topology};
use acemq_tests::{chaos, deadline, unique};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_node_a_conn_is_on_fails_over_to_another_host_of_its_url_without_losing_a_confirmed_send() {
    deadline(async {
        let _serial = chaos::serial().await;
        let Some(url) = chaos::cluster_url().await else { return };
        let events: Arc<Mutex<Vec<RecoveryEvent>>> = Arc::default();
        let config = Config::default()
            .with_on_recovery({
                let events = events.clone();
                move |e| events.lock().unwrap().push(e)
            })
            .with_recovery_delay(Duration::from_millis(100))
            .with_recovery_delay_max(Duration::from_secs(1))
            .with_publish_timeout(Duration::from_secs(60));
        // Node 1 is the URL's first host: both connections are on it.
        let conn = Conn::open(&url, config).await.unwrap();
        let queue = unique("failover");
        let mut arguments = FieldTable::new();
        arguments.insert("x-quorum-initial-group-size", FieldValue::I32(3));
        Topology::new()
            .queue_with_arguments(&queue, arguments)
            .declare(&conn)
            .await
            .unwrap();
        let seen: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
        let consumer = consume(&conn, &queue, {
            let seen = seen.clone();
            move |m: Message<u64>| {
                seen.lock().unwrap().insert(m.payload);
                std::future::ready(Ack::accept())
            }
        })
        .prefetch(200)
        .await
        .unwrap();

        let publisher = conn.publisher::<u64>("", &queue).mandatory();
        let mut confirmed = BTreeSet::new();
        // While the queue elects a leader on a surviving node, RabbitMQ may
        // answer a send with basic.nack: not stored, and said so. Any other
        // failure is one.
        let mut nacked = 0;
        let settle = |confirmed: &mut BTreeSet<u64>, nacked: &mut u32, id: u64, result| match result {
            Ok(()) => {
                confirmed.insert(id);
            }
            Err(acemq_core::Error::Nacked { .. }) => *nacked += 1,
            Err(e) => panic!("send {id}: {e}"),
        };
        let mut window = std::collections::VecDeque::new();
        let mut n = 0u64;
        let mut killed_at = None;
        let sending_until = Instant::now() + Duration::from_secs(90);
        // A thousand sends, the kill, then on until a thousand more are
        // confirmed by the surviving nodes.
        while confirmed.len() < 2_000 || killed_at.is_none() {
            assert!(
                Instant::now() < sending_until,
                "confirmed {}, nacked {nacked} by now",
                confirmed.len()
            );
            if n == 1_000 {
                chaos::cluster_kill(1).await;
                killed_at = Some(n);
                // New sends wait until both connections are back on other
                // nodes (the 200 in flight are written again as they are
                // awaited). Sent at once instead, RabbitMQ 3.10.8 here nacks
                // every publish of the new channel for minutes: its first
                // publish to the quorum queue found no leader
                // (`no_more_servers_to_try`, rabbitmq-server#15333).
                let until = Instant::now() + Duration::from_secs(30);
                while events
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|e| e.label() == "recovered")
                    .count()
                    < 2
                {
                    assert!(Instant::now() < until, "no failover within 30 s");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            if window.len() == 200 {
                let (id, pending): (u64, acemq_core::PendingSend) = window.pop_front().unwrap();
                settle(&mut confirmed, &mut nacked, id, pending.await);
            }
            window.push_back((n, publisher.begin_send(&n).await.unwrap()));
            n += 1;
        }
        for (id, pending) in window {
            settle(&mut confirmed, &mut nacked, id, pending.await);
        }
        let until = Instant::now() + Duration::from_secs(60);
        while confirmed.difference(&seen.lock().unwrap()).count() > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let lost: Vec<u64> = confirmed.difference(&seen.lock().unwrap()).copied().take(10).collect();
        let events = events.lock().unwrap().clone();
        println!(
            "failover: confirmed {}, nacked {nacked}, lost {lost:?}",
            confirmed.len()
        );
        for e in &events {
            println!("  {e}");
        }
        assert!(lost.is_empty(), "confirmed sends never consumed: {lost:?}");
        // Both came back on another node, the consumer with them. The
        // consumer's classic `.dlq` and `.parked` live on the killed node:
        // their redeclaration is refused (404, home node down) and listed.
        let recovered = |which: &str| {
            events.iter().find_map(|e| match e {
                RecoveryEvent::Recovered {
                    which: w,
                    consumers,
                    failed,
                    ..
                } if *w == which => Some((*consumers, failed.clone())),
                _ => None,
            })
        };
        assert_eq!(recovered("publish"), Some((0, vec![])), "{events:#?}");
        let (consumers, failed) = recovered("consume").expect("the consuming connection recovered");
        assert_eq!(consumers, 1, "{events:#?}");
        assert!(
            failed.iter().all(|f| f.contains(".dlq") || f.contains(".parked")),
            "{failed:#?}"
        );
        consumer.close().await.unwrap();
        conn.close().await.unwrap();
        chaos::cluster_restart(1).await;
    })
    .await;
}
