//! The model: what the consumer must do with every message of a sequence,
//! and the check of what it did against that.
//!
//! It never looks at a broker or a clock: it is a pure function of what the
//! runner recorded (the handler's calls, where each message was found at
//! the end, the broker redeliveries the test caused), so a failure can be
//! reasoned about from the record alone.
//!
//! A message no fault touched while the consumer had it is predicted
//! exactly: every attempt number the handler sees, how many calls, and the
//! one place it ends in. A message that was in the consumer's hands when
//! the connection was closed (forced, or by `Conn::close`) may be
//! redelivered, and a redelivery may run a handler again; for it the model
//! checks what still holds: it is never lost, each attempt number is one
//! its history allows, and where it ended is a place its script can send it.
//!
//! A message whose queue another client deleted (and declared again) before
//! it was done may have gone with the queue: that is the deleting client's
//! loss, not the consumer's. The model allows it only where a copy of the
//! message could have been in the queue (or on its way back to it) then:
//! before its last predicted call. Otherwise the deletion, and the broker's
//! cancel of the consumer that comes with it, must change nothing: the
//! attempts and the end are the ones predicted without it, and no call is
//! made twice. Each cancel of a running consumer must be followed by its
//! subscribing again ([`check_cancel`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::ops::{Hostile, Outcome, Props, QueueType, Setup};

/// The most times one message may come back as a broker redelivery within
/// any one second: more is a hot loop (a message requeued and redelivered
/// at once, again and again).
pub const MAX_REDELIVERIES_PER_SECOND: usize = 10;

/// One handler call, as the handler recorded it.
#[derive(Debug, Clone)]
pub struct Call {
    /// `Envelope.attempt`.
    pub attempt: u32,
    /// `Message.redelivered`.
    pub redelivered: bool,
    /// When it began.
    pub at: Instant,
}

/// Where a copy of a message was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// `{queue}.dlq`.
    Dlq,
    /// `{queue}.parked`.
    Parked,
    /// `{queue}.sink`, where a producer's routing slip points.
    Sink,
    /// Still in its source queue at the end.
    Queued,
    /// Taken out of its source queue by the client that then deleted it.
    Deleted,
}

/// A copy of a message found in one of the places.
#[derive(Debug, Clone)]
pub struct Found {
    /// Where.
    pub place: Place,
    /// Its `x-acemq-error`, if any.
    pub error: Option<String>,
    /// Its `x-acemq-attempt`, if it is an integer.
    pub attempt: Option<i64>,
    /// Whether the broker had delivered it before.
    pub redelivered: bool,
}

/// Everything the runner knows about one message.
#[derive(Debug, Clone)]
pub struct Record {
    /// Its number (in the body).
    pub n: usize,
    /// The type of the queue it was published to.
    pub queue: QueueType,
    /// Its properties.
    pub props: Props,
    /// The handler's answers.
    pub script: Vec<Outcome>,
    /// Redeliveries another client caused, by copy (0 is the published
    /// copy, `k` the copy the `k`-th call's retry made).
    pub steals: BTreeMap<usize, u32>,
    /// Whether a consumer ran at some point after it was published.
    pub consumed: bool,
    /// Faults that hit it while the consumer may have held it (each a
    /// possible broker redelivery); none means it is predicted exactly.
    pub faults: Vec<String>,
    /// Whether the test deleted its queue's `.dlq` while the consumer may
    /// have been setting it aside there (a set-aside the broker confirmed
    /// just before the delete goes with the queue): found nowhere is then
    /// no fault of the consumer's.
    pub dlq_deleted: bool,
    /// Whether another client deleted its queue (and declared it again)
    /// before it was done, or at any time after a fault that may have left
    /// a second copy of it: a copy that was in the queue then, or on its
    /// way back to it from a rung, went with the queue.
    pub queue_deleted: bool,
    /// The handler's calls, in order.
    pub calls: Vec<Call>,
    /// Where copies of it were found.
    pub found: Vec<Found>,
}

/// Where a message ends, as the model predicts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Accepted and acknowledged.
    Handled,
    /// In `.dlq`, its error containing this.
    Dlq(String),
    /// In `.parked` with this reason.
    Parked(String),
    /// Never reached a consumer: still in its queue.
    Queued,
}

/// The model's prediction for a message no fault touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prediction {
    /// The attempt the handler sees on each call.
    pub attempts: Vec<u32>,
    /// Where it ends.
    pub end: End,
}

/// How [`check`] says a message was lost: neither handled nor found anywhere.
pub const LOST: &str = "lost";

/// The error text of a [`Outcome::Retry`] and [`Outcome::Panic`].
pub const RETRY_ERROR: &str = "model says retry";
/// The error text of a [`Outcome::Fatal`].
pub const FATAL_ERROR: &str = "model says fatal";
/// The reason of a [`Outcome::Park`].
pub const PARK_REASON: &str = "model says park";
/// What a [`Outcome::Panic`] handler panics with (the runner's panic hook
/// keeps these quiet).
pub const PANIC_TEXT: &str = "the model's handler panics";

/// The attempt header a message is published with, as acemq must read it.
pub fn first_header(props: &Props) -> u32 {
    match props.hostile {
        Hostile::AttemptLong => 3,
        _ => 1,
    }
}

/// The handler's answer on call `i` (0-based): the script's, then accept.
pub fn outcome_at(script: &[Outcome], i: usize) -> Outcome {
    script.get(i).copied().unwrap_or(Outcome::Accept)
}

/// What the attempt of a copy becomes with `redeliveries` broker
/// redeliveries: a quorum queue counts each (`x-delivery-count`), a classic
/// queue only says `redelivered`.
fn with_redeliveries(queue: QueueType, header: u32, redeliveries: u32) -> u32 {
    match queue {
        QueueType::Quorum => header + redeliveries,
        QueueType::Classic => header + redeliveries.min(1),
    }
}

/// The exact course of a message no fault touched.
pub fn predict(setup: &Setup, r: &Record) -> Prediction {
    if !r.consumed {
        return Prediction {
            attempts: Vec::new(),
            end: End::Queued,
        };
    }
    if r.props.hostile == Hostile::Undecodable {
        return Prediction {
            attempts: Vec::new(),
            end: End::Dlq("body could not be decoded".into()),
        };
    }
    let mut header = first_header(&r.props);
    let mut attempts = Vec::new();
    for i in 0.. {
        let attempt = with_redeliveries(r.queue, header, r.steals.get(&i).copied().unwrap_or(0));
        attempts.push(attempt);
        let end = match outcome_at(&r.script, i) {
            Outcome::Accept | Outcome::Slow => End::Handled,
            Outcome::Park => End::Parked(PARK_REASON.into()),
            Outcome::Fatal => End::Dlq(format!("fatal: {FATAL_ERROR}")),
            Outcome::LongFatal => End::Dlq("fatal: ".into()),
            Outcome::Retry | Outcome::Panic if attempt >= setup.max_attempts => {
                End::Dlq(format!("gave up after {attempt} attempts (max {})", setup.max_attempts))
            }
            Outcome::Retry | Outcome::Panic => {
                header = attempt + 1;
                continue;
            }
        };
        return Prediction { attempts, end };
    }
    unreachable!("the loop returns")
}

/// Whether the call `i` of `r` accepted the message. A consumer built
/// without `.routing_slips(...)` handles a message with a producer's slip as
/// an ordinary one: it never follows the slip to its sink.
pub fn accepted_at(r: &Record, i: usize) -> bool {
    matches!(outcome_at(&r.script, i), Outcome::Accept | Outcome::Slow)
}

/// Checks one message; `Err` says what is wrong with it.
pub fn check(setup: &Setup, r: &Record) -> Result<(), String> {
    check_rate(r)?;
    let handled = (0..r.calls.len()).any(|i| accepted_at(r, i));
    let taken = r.found.iter().filter(|f| f.place == Place::Deleted).count();
    if taken > 0 && !r.queue_deleted {
        return Err("found in its queue when it was deleted, but not counted as in it".into());
    }
    if !handled && r.found.len() == taken {
        if r.dlq_deleted || (r.queue_deleted && may_have_gone_with_its_queue(setup, r)) {
            return Ok(());
        }
        if taken > 0 {
            return Err(format!(
                "taken out of its queue when it was deleted, after its last call (attempts {:?}): \
                 a copy the consumer should not have made",
                r.calls.iter().map(|c| c.attempt).collect::<Vec<_>>()
            ));
        }
        return Err(format!(
            "{LOST}: {} calls (attempts {:?}), found nowhere",
            r.calls.len(),
            r.calls.iter().map(|c| c.attempt).collect::<Vec<_>>()
        ));
    }
    if r.faults.is_empty() {
        check_exact(setup, r)
    } else {
        check_allowed(setup, r)
    }
}

/// Whether message `r`, never handled and found nowhere but in its deleted
/// queue, may have been in that queue (or on its way back to it) when
/// another client deleted it: a copy was still to be delivered.
/// Without faults its calls are then exactly the first ones predicted, and
/// fewer than predicted (an undecodable message is set aside on its one
/// delivery, which no call shows, so it may have gone at any time); with
/// faults, [`check_allowed`] judges the calls.
fn may_have_gone_with_its_queue(setup: &Setup, r: &Record) -> bool {
    if !r.faults.is_empty() || r.props.hostile == Hostile::Undecodable {
        return true;
    }
    let predicted = predict(setup, r);
    let attempts: Vec<u32> = r.calls.iter().map(|c| c.attempt).collect();
    attempts.len() < predicted.attempts.len().max(1) && predicted.attempts.starts_with(&attempts)
}

/// What became of one cancel of a running consumer by the broker (its
/// queue deleted by another client, then declared again).
#[derive(Debug, Clone)]
pub struct Cancel {
    /// The queue.
    pub queue: String,
    /// Whether `RecoveryEvent::ConsumerCancelled` reported it.
    pub reported: bool,
    /// How long after the deletion `RecoveryEvent::ConsumerResubscribed`
    /// came, if it came within the runner's limit.
    pub resubscribed: Option<Duration>,
}

/// A consumer the broker cancelled says so and subscribes again.
pub fn check_cancel(c: &Cancel) -> Result<(), String> {
    match (c.reported, c.resubscribed) {
        (true, Some(_)) => Ok(()),
        (false, _) => Err(format!(
            "the consumer of {} never reported the broker's cancel (no ConsumerCancelled)",
            c.queue
        )),
        (true, None) => Err(format!(
            "the consumer of {} was cancelled and never subscribed again (no ConsumerResubscribed)",
            c.queue
        )),
    }
}

/// No more than [`MAX_REDELIVERIES_PER_SECOND`] redelivered calls in any second.
fn check_rate(r: &Record) -> Result<(), String> {
    let again: Vec<Instant> = r.calls.iter().filter(|c| c.redelivered).map(|c| c.at).collect();
    for (i, start) in again.iter().enumerate() {
        let within = again[i..]
            .iter()
            .take_while(|t| t.duration_since(*start) < Duration::from_secs(1))
            .count();
        if within > MAX_REDELIVERIES_PER_SECOND {
            return Err(format!(
                "redelivered {within} times within one second (at most {MAX_REDELIVERIES_PER_SECOND})"
            ));
        }
    }
    Ok(())
}

fn check_exact(setup: &Setup, r: &Record) -> Result<(), String> {
    let predicted = predict(setup, r);
    let mut wrong = Vec::new();
    let attempts: Vec<u32> = r.calls.iter().map(|c| c.attempt).collect();
    if attempts != predicted.attempts {
        wrong.push(format!(
            "the handler saw attempts {attempts:?}, the model predicts {:?}",
            predicted.attempts
        ));
    }
    let found: Vec<String> = r.found.iter().map(describe).collect();
    let matches = |f: &Found| match (&predicted.end, f.place) {
        (End::Dlq(text), Place::Dlq) => f.error.as_deref().is_some_and(|e| e.contains(text.as_str())),
        (End::Parked(text), Place::Parked) => f.error.as_deref() == Some(text.as_str()),
        (End::Queued, Place::Queued) => true,
        _ => false,
    };
    let expected = usize::from(predicted.end != End::Handled);
    if r.found.len() != expected || !r.found.iter().all(matches) {
        wrong.push(format!(
            "the model predicts it ends {:?}; found {}",
            predicted.end,
            if found.is_empty() {
                "nowhere".to_string()
            } else {
                found.join(", ")
            }
        ));
    } else if predicted.end == End::Queued {
        let stolen = r.steals.values().sum::<u32>() > 0;
        if r.found[0].redelivered != stolen {
            wrong.push(format!(
                "still queued with redelivered={}, the model predicts {stolen}",
                r.found[0].redelivered
            ));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

fn describe(f: &Found) -> String {
    let mut text = format!("{:?}", f.place);
    if let Some(attempt) = f.attempt {
        let _ = write!(text, " attempt {attempt}");
    }
    if f.redelivered {
        text.push_str(" redelivered");
    }
    if let Some(error) = &f.error {
        let shown: String = error.chars().take(120).collect();
        let _ = write!(text, " error {shown:?}");
    }
    text
}

/// A message a fault touched: what must hold whatever the timing.
fn check_allowed(setup: &Setup, r: &Record) -> Result<(), String> {
    // Each copy's attempt header is the first one or one more than a call
    // before it saw; a redelivered copy adds at most one (classic) or one
    // per possible redelivery (quorum).
    let possible_redeliveries = r.steals.values().sum::<u32>() + r.faults.len() as u32;
    let most = match r.queue {
        QueueType::Classic => 1,
        QueueType::Quorum => possible_redeliveries.max(1),
    };
    let mut headers = vec![first_header(&r.props)];
    for (i, call) in r.calls.iter().enumerate() {
        let fits = headers.iter().any(|&h| {
            if call.redelivered {
                (h + 1..=h + most).contains(&call.attempt)
            } else {
                call.attempt == h
            }
        });
        if !fits {
            return Err(format!(
                "call {i} saw attempt {} (redelivered: {}); the copies' attempts could be {headers:?}, \
                 plus at most {most} for a redelivery",
                call.attempt, call.redelivered
            ));
        }
        headers.push(call.attempt + 1);
    }
    for f in &r.found {
        let allowed = match f.place {
            Place::Queued | Place::Deleted => true,
            Place::Parked => r.script.contains(&Outcome::Park),
            Place::Sink => false,
            Place::Dlq => f.error.as_deref().is_some_and(|e| {
                e.contains("gave up after")
                    || (e.contains("fatal: ")
                        && r.script
                            .iter()
                            .any(|o| matches!(o, Outcome::Fatal | Outcome::LongFatal)))
                    || (e.contains("could not be decoded") && r.props.hostile == Hostile::Undecodable)
            }),
        };
        if !allowed {
            return Err(format!("found {}, which its script cannot lead to", describe(f)));
        }
    }
    let bound = (setup.max_attempts as usize + 1) * (2 + possible_redeliveries as usize) * 2;
    if r.calls.len() > bound {
        return Err(format!("{} handler calls (at most {bound} allowed)", r.calls.len()));
    }
    Ok(())
}
