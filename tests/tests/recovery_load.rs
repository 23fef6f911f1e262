//! The recovery issue's proof under load, on RabbitMQ: 20,000 confirmed
//! sends at full speed into a durable quorum queue while the node is killed
//! (SIGKILL) and restarted twice and every connection is force-closed once.
//! A consumer accepts everything. It prints, and asserts where the issue
//! says so:
//! - lost: sends that returned `Ok` and were never consumed (must be 0);
//! - duplicates: deliveries of a message already consumed (allowed only
//!   for sends unconfirmed at a crash, or acks cut off by one);
//! - time to resume: from the moment the broker accepts connections again
//!   to the consumer's first delivery after it;
//! - the recovery events, in order.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_core::{consume, Ack, Config, Message, RecoveryEvent, Topology};
use acemq_tests::{chaos, deadline, unique};
use std::time::Instant;

const MESSAGES: u64 = 20_000;
const WINDOW: usize = 500;

#[derive(Default)]
struct Seen {
    unique: BTreeSet<u64>,
    deliveries: u64,
    at: Vec<Instant>,
}

/// Waits, at most a minute, until each of the two connections has recovered
/// from every loss so far.
async fn both_connections_up(events: &Mutex<Vec<(Instant, RecoveryEvent)>>) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let down: Vec<&str> = {
            let log = events.lock().unwrap();
            let count = |which: &str, lost: bool| {
                log.iter()
                    .filter(|(_, e)| match e {
                        RecoveryEvent::Lost { which: w, .. } => lost && *w == which,
                        RecoveryEvent::Recovered { which: w, .. } => !lost && *w == which,
                        _ => false,
                    })
                    .count()
            };
            ["publish", "consume"]
                .into_iter()
                .filter(|which| count(which, true) != count(which, false))
                .collect()
        };
        if down.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "{down:?} not recovered a minute after the last fault: {:?}",
            events.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_under_load_loses_no_confirmed_send_across_two_kills_and_a_forced_close() {
    deadline(async {
        let _serial = chaos::serial().await;
        let brokers: Vec<_> = acemq_tests::brokers().await.into_iter().collect();
        let rabbits: Vec<_> = brokers.into_iter().filter(|b| b.kind.is_rabbit_tcp()).collect();
        if rabbits.is_empty() {
            eprintln!("\n!!!! SKIPPING the recovery load test: it needs RabbitMQ !!!!\n");
            return;
        }
        for b in rabbits {
            let v = b.rabbit();
            let events: Arc<Mutex<Vec<(Instant, RecoveryEvent)>>> = Arc::default();
            let config = Config::default()
                .with_on_recovery({
                    let events = events.clone();
                    move |e| events.lock().unwrap().push((Instant::now(), e))
                })
                .with_recovery_delay(Duration::from_millis(100))
                .with_recovery_delay_max(Duration::from_secs(1))
                .with_publish_timeout(Duration::from_secs(120));
            let conn = b.conn_with(config).await;
            let queue = unique("load");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let seen: Arc<Mutex<Seen>> = Arc::default();
            let handler = {
                let seen = seen.clone();
                move |m: Message<u64>| {
                    let mut s = seen.lock().unwrap();
                    s.deliveries += 1;
                    s.unique.insert(m.payload);
                    s.at.push(Instant::now());
                    std::future::ready(Ack::accept())
                }
            };
            let consumer = consume(&conn, &queue, handler).prefetch(500).await.unwrap();
            // A freshly declared quorum queue killed at once can come back
            // without a leader for a minute (see `statement_17_recovers_from_a_broker_restart`).
            tokio::time::sleep(Duration::from_secs(3)).await;

            let publisher = conn.publisher::<u64>("", &queue).mandatory();
            let mut window = std::collections::VecDeque::new();
            let mut confirmed = BTreeSet::new();
            let mut failed = Vec::new();
            let mut back_up = Vec::new();
            let mut chaos_task: Option<tokio::task::JoinHandle<Vec<Instant>>> = None;
            let started = Instant::now();
            for n in 0..MESSAGES {
                // The faults, while sends are in flight: a kill at a quarter,
                // a forced close at half, a kill at three quarters.
                let fault = match n {
                    n if n == MESSAGES / 4 => Some("kill"),
                    n if n == MESSAGES / 2 => Some("close"),
                    n if n == MESSAGES * 3 / 4 => Some("kill"),
                    _ => None,
                };
                if let Some(fault) = fault {
                    if let Some(task) = chaos_task.take() {
                        back_up.extend(task.await.unwrap());
                    }
                    // Each fault is to hit both connections: the one not
                    // blocked by the sends may still be redialling (its backoff
                    // has jitter) after the other is back.
                    both_connections_up(&events).await;
                    // The fault lands now, with a window of sends in flight;
                    // the restart runs beside the sends, which wait for it.
                    if fault == "kill" {
                        chaos::kill(v).await;
                        chaos_task = Some(tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            vec![chaos::restart(v).await]
                        }));
                    } else {
                        chaos::close_all_connections(v, "the acemq load test").await;
                        back_up.push(Instant::now());
                    }
                }
                if window.len() == WINDOW {
                    let (id, pending): (u64, acemq_core::PendingSend) = window.pop_front().unwrap();
                    match pending.await {
                        Ok(()) => {
                            confirmed.insert(id);
                        }
                        Err(e) => failed.push((id, e.to_string())),
                    }
                }
                match publisher.begin_send(&n).await {
                    Ok(pending) => window.push_back((n, pending)),
                    Err(e) => failed.push((n, e.to_string())),
                }
            }
            for (id, pending) in window {
                match pending.await {
                    Ok(()) => {
                        confirmed.insert(id);
                    }
                    Err(e) => failed.push((id, e.to_string())),
                }
            }
            if let Some(task) = chaos_task.take() {
                back_up.extend(task.await.unwrap());
            }
            let published_in = started.elapsed();

            // Everything confirmed must come through.
            let until = Instant::now() + Duration::from_secs(120);
            loop {
                let missing = confirmed.difference(&seen.lock().unwrap().unique).count();
                if missing == 0 || Instant::now() > until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let s = std::mem::take(&mut *seen.lock().unwrap());
            let lost: Vec<u64> = confirmed.difference(&s.unique).copied().take(20).collect();
            let lost_count = confirmed.difference(&s.unique).count();
            let duplicates = s.deliveries - s.unique.len() as u64;
            let resumes: Vec<Duration> = back_up
                .iter()
                .map(|up| {
                    s.at.iter()
                        .find(|at| *at >= up)
                        .map(|at| at.duration_since(*up))
                        .unwrap_or(Duration::MAX)
                })
                .collect();
            let log = events.lock().unwrap().clone();
            println!(
                "recovery load test on {:?} ({v}), {MESSAGES} confirmed sends into a quorum queue, window {WINDOW}:",
                b.kind
            );
            println!(
                "  published in {published_in:?}; confirmed {}, failed {}",
                confirmed.len(),
                failed.len()
            );
            for (id, e) in failed.iter().take(5) {
                println!("    failed {id}: {e}");
            }
            println!("  lost: {lost_count} {lost:?}");
            println!(
                "  duplicates: {duplicates} (deliveries {}, unique {})",
                s.deliveries,
                s.unique.len()
            );
            println!("  time to resume after each fault (broker accepting -> first delivery): {resumes:?}");
            println!("  events:");
            for (at, e) in &log {
                println!("    +{:>8.3}s {e}", at.duration_since(started).as_secs_f64());
            }
            assert_eq!(lost_count, 0, "{v}: confirmed sends never consumed: {lost:?}");
            assert!(
                failed.is_empty(),
                "{v}: sends failed: {:?}",
                &failed[..failed.len().min(5)]
            );
            assert_eq!(resumes.len(), 3, "{v}: three faults");
            assert!(
                resumes.iter().all(|r| *r < Duration::from_secs(60)),
                "{v}: the consumer resumed: {resumes:?}"
            );
            for label in ["lost", "retrying", "recovered"] {
                assert!(
                    log.iter().filter(|(_, e)| e.label() == label).count() >= 6,
                    "{v}: {label} for both connections at each fault: {log:?}"
                );
            }
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}
