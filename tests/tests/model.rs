//! The model-based test of the consumer: random sequences over one or two
//! queues (classic and quorum) and one consumer per queue on one `Conn`,
//! with publishes from another producer (hostile properties among them),
//! handler answers per message and call (accept, retry, fatal, park, panic,
//! slow), broker redeliveries (another client's `basic.get` and nack with
//! requeue, a forced close of the consumer's connections, `Conn::close`), a
//! deleted `.dlq`, a source queue deleted and declared again by another
//! client (the broker cancels the consumer, which must subscribe again and
//! go on), run against `acemq_core::consume` on a real broker and
//! checked against the model in `acemq_tests::model::check`: for every
//! message, the attempts the handler sees, where it ends, that it is never
//! lost (but for what a deleted queue took with it), never handled twice
//! unless a redelivery allows it, and never redelivered in a hot loop.
//!
//! Each broker has its test. `ACEMQ_MODEL_CASES` sets how many sequences
//! each runs (default [`CI_CASES_MEMORY`] and [`CI_CASES_RABBITMQ`], sized to
//! under 90 s a broker under CI);
//! `ACEMQ_MODEL_SEED` (a number) makes a run repeatable. A failure is
//! shrunk by proptest to a minimal sequence, printed to commit below as a
//! regression test. `scripts/model.sh --cases N` runs more.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use acemq_tests::deadline::deadline_of;
use acemq_tests::model::ops::*;
use acemq_tests::model::{run, target, MEMORY, RABBITMQ_3_10, RABBITMQ_4_0};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// Sequences per CI run on acemq-memory (about 0.1 s each, 0.2 s for one
/// with a broker cancel).
const CI_CASES_MEMORY: u32 = 300;
/// Sequences per CI run on each RabbitMQ (about 0.25 s each, 0.5 s for one
/// with a broker cancel: 100 take what 120 took before the cancel came in).
const CI_CASES_RABBITMQ: u32 = 100;
/// The longest sequence generated.
const MAX_LEN: usize = 12;
/// How long one sequence may take.
const PER_SEQUENCE: Duration = Duration::from_secs(120);
/// How long shrinking a failure may take.
const SHRINKING: Duration = Duration::from_secs(300);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn property(name: &str) {
    let rt = runtime();
    let Some(target) = rt.block_on(target(name)) else {
        return;
    };
    let cases = std::env::var("ACEMQ_MODEL_CASES")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(if name == MEMORY {
            CI_CASES_MEMORY
        } else {
            CI_CASES_RABBITMQ
        });
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 1_000,
        max_shrink_time: SHRINKING.as_millis() as u32,
        ..Config::default()
    };
    let mut runner = match std::env::var("ACEMQ_MODEL_SEED")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        Some(seed) => {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&seed.to_le_bytes());
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
        }
        None => TestRunner::new(config),
    };
    let ran = AtomicUsize::new(0);
    let shown = AtomicBool::new(false);
    let started = Instant::now();
    let result = runner.run(&sequence(MAX_LEN), |(setup, ops)| {
        let n = ran.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_multiple_of(50) {
            eprintln!("model on {name}: {n} sequences in {:.1?}", started.elapsed());
        }
        rt.block_on(deadline_of(PER_SEQUENCE, run(&setup, &ops, &target)))
            .map_err(|failure| {
                if !shown.swap(true, Ordering::Relaxed) {
                    eprintln!("model on {name}: a failure, shrinking it now:\n{failure}");
                }
                TestCaseError::fail(failure)
            })
    });
    eprintln!(
        "model on {name}: {} sequences run ({cases} cases and any shrinking) in {:.1?}",
        ran.load(Ordering::Relaxed),
        started.elapsed()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn the_consumer_keeps_the_models_promises_on_acemq_memory() {
    property(MEMORY);
}

#[test]
fn the_consumer_keeps_the_models_promises_on_rabbitmq_3_10() {
    property(RABBITMQ_3_10);
}

#[test]
fn the_consumer_keeps_the_models_promises_on_rabbitmq_4_0() {
    property(RABBITMQ_4_0);
}

/// Runs one committed sequence on every broker there is; fails with what
/// went wrong on each.
fn replay(setup: Setup, ops: Vec<Op>) {
    let rt = runtime();
    let mut failures = Vec::new();
    for name in [MEMORY, RABBITMQ_3_10, RABBITMQ_4_0] {
        let Some(target) = rt.block_on(target(name)) else {
            continue;
        };
        if let Err(failure) = rt.block_on(deadline_of(PER_SEQUENCE, run(&setup, &ops, &target))) {
            failures.push(failure);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn plain() -> Props {
    Props {
        message_id: true,
        persistent: true,
        timestamp: Timestamp::Absent,
        hostile: Hostile::Nothing,
    }
}

#[test]
fn a_message_retried_to_the_dlq_and_one_accepted_end_where_the_model_says() {
    replay(
        Setup {
            queues: vec![QueueType::Quorum, QueueType::Classic],
            waits: Waits::Both,
            max_attempts: 3,
            prefetch: 2,
        },
        vec![
            Op::Start,
            Op::Publish {
                q: 0,
                props: plain(),
                script: vec![Outcome::Retry, Outcome::Panic, Outcome::Retry],
            },
            Op::Publish {
                q: 1,
                props: plain(),
                script: vec![Outcome::Retry, Outcome::Accept],
            },
            Op::Quiet,
        ],
    );
}

#[test]
fn a_consumer_the_broker_cancels_subscribes_again_and_its_messages_end_where_the_model_says() {
    replay(
        Setup {
            queues: vec![QueueType::Classic, QueueType::Quorum],
            waits: Waits::Both,
            max_attempts: 3,
            prefetch: 2,
        },
        vec![
            Op::Start,
            Op::Publish {
                q: 0,
                props: plain(),
                script: vec![Outcome::Slow],
            },
            Op::Publish {
                q: 0,
                props: plain(),
                script: vec![Outcome::Retry, Outcome::Retry],
            },
            Op::Publish {
                q: 1,
                props: plain(),
                script: vec![Outcome::Retry],
            },
            Op::Cancel { q: 0, gap: true },
            Op::Cancel { q: 1, gap: false },
            Op::Publish {
                q: 0,
                props: plain(),
                script: vec![Outcome::Retry],
            },
            Op::Publish {
                q: 1,
                props: plain(),
                script: vec![Outcome::Park],
            },
            Op::Quiet,
        ],
    );
}

// Regression tests: sequences the property test shrank to, replayed on
// every broker. Each failed on the consumer it was found on; the message
// says what the consumer did instead.

fn from_another_producer(timestamp: Timestamp, hostile: Hostile) -> Props {
    Props {
        message_id: false,
        persistent: false,
        timestamp,
        hostile,
    }
}

/// Found: the handler saw attempts [2, 4] instead of [2, 3]. The retry's
/// republish carried the broker's `x-delivery-count`, and the next
/// delivery counted it again.
#[test]
fn a_quorum_redelivery_counts_once_and_the_retry_after_it_counts_one_more() {
    replay(
        Setup {
            queues: vec![QueueType::Quorum],
            waits: Waits::InProcess,
            max_attempts: 3,
            prefetch: 1,
        },
        vec![
            Op::Publish {
                q: 0,
                props: from_another_producer(Timestamp::Absent, Hostile::Nothing),
                script: vec![Outcome::Panic],
            },
            Op::Steal { q: 0 },
            Op::Start,
        ],
    );
}

/// Found: `timestamp` 2^63 panicked the delivery's task; the message was
/// never settled (and held its prefetch slot) until the `Conn` closed.
#[test]
fn a_timestamp_of_two_to_the_63_is_read_as_absent_and_the_message_handled() {
    replay(
        Setup {
            queues: vec![QueueType::Classic],
            waits: Waits::InProcess,
            max_attempts: 1,
            prefetch: 1,
        },
        vec![
            Op::Start,
            Op::Publish {
                q: 0,
                props: from_another_producer(Timestamp::Edge(1 << 63), Hostile::Nothing),
                script: vec![],
            },
        ],
    );
}

/// The same with the value reported from outside (2^63 + 1), and a good
/// message behind it at prefetch 1: the slot must be freed for it.
#[test]
fn a_timestamp_past_i64_never_keeps_the_prefetch_slot_from_the_next_message() {
    replay(
        Setup {
            queues: vec![QueueType::Quorum],
            waits: Waits::InProcess,
            max_attempts: 2,
            prefetch: 1,
        },
        vec![
            Op::Start,
            Op::Publish {
                q: 0,
                props: from_another_producer(Timestamp::Edge((1 << 63) + 1), Hostile::Nothing),
                script: vec![],
            },
            Op::Publish {
                q: 0,
                props: plain(),
                script: vec![Outcome::Retry],
            },
        ],
    );
}

/// Found: the set-aside of a message whose headers were near `frame_max`,
/// with a long error text, did not fit; the message was redelivered and
/// handled a second time instead of reaching the `.dlq`.
#[test]
fn a_long_error_on_a_message_near_frame_max_is_trimmed_into_the_dlq() {
    replay(
        Setup {
            queues: vec![QueueType::Classic],
            waits: Waits::InProcess,
            max_attempts: 1,
            prefetch: 1,
        },
        vec![
            Op::Publish {
                q: 0,
                props: from_another_producer(Timestamp::Absent, Hostile::NearFrameMax),
                script: vec![Outcome::LongFatal],
            },
            Op::Start,
        ],
    );
}

/// Found: with the `.dlq` deleted under the consumer, an undecodable
/// message was requeued and redelivered at once, again and again, and
/// never set aside (shrunk to a `DeleteDlq` right after `Start`; written
/// here with the deletion settled first, so that no set-aside is in flight
/// when the queue goes).
#[test]
fn a_deleted_dlq_is_declared_again_and_an_undecodable_message_set_aside_in_it() {
    replay(
        Setup {
            queues: vec![QueueType::Classic],
            waits: Waits::InProcess,
            max_attempts: 1,
            prefetch: 1,
        },
        vec![
            Op::Start,
            Op::Quiet,
            Op::DeleteDlq { q: 0 },
            Op::Publish {
                q: 0,
                props: from_another_producer(Timestamp::Absent, Hostile::Undecodable),
                script: vec![],
            },
            Op::Publish {
                q: 0,
                props: from_another_producer(Timestamp::Absent, Hostile::Nothing),
                script: vec![Outcome::Panic],
            },
        ],
    );
}
