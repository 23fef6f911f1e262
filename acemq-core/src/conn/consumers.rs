//! What a `Conn` records of each running consumer, for recovery to reattach
//! it: `ConsumerRecord` (its queue, its `basic.consume` with the tag the
//! broker first gave, its prefetch, where a stream consumer stands, and the
//! channels to and from its task), the `Attachment` it is handed after a
//! loss, and `reattach`, which makes one on a connection.
//!
//! It also carries a consumer's pause: what `Consumer::pause`/`resume` ask
//! for, and where the consumer task says how it stands ([`Flow`]); the
//! supervisor reattaches no paused consumer.
//!
//! A record is data and one call: it never runs the consumer (that is
//! `consume/task.rs`) nor decides when to reattach (that is the supervisor and
//! the consumer's own task).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use acemq_codec::{BasicConsume, FieldValue, ShortString};
use tokio::sync::{mpsc, watch};

use crate::amqp;
use crate::error::Error;

/// What is known of a consumer, for reattaching it: its queue (renamed when
/// a server-named queue is declared anew), its `basic.consume` with the tag
/// the broker first gave, its prefetch, and where a stream consumer is.
pub(crate) struct ConsumerRecord {
    pub(crate) queue: Mutex<String>,
    pub(crate) method: Mutex<BasicConsume>,
    pub(crate) prefetch: u16,
    pub(crate) stream: Mutex<StreamPosition>,
    /// Where the supervisor hands a reattached consumer (or why it could not).
    pub(crate) attach: mpsc::UnboundedSender<Result<Attachment, Error>>,
    /// Set to stop the consumer (by `Consumer::close` or `Conn::close`).
    pub(crate) shutdown: watch::Sender<bool>,
    /// How the consumer ended, once it has.
    pub(crate) ended: watch::Receiver<Option<Result<(), Error>>>,
    /// Whether it is asked to be paused (by `Consumer::pause`, cleared by
    /// `resume`); `paused` mirrors it for the per-delivery check.
    pub(crate) pause: watch::Sender<bool>,
    paused: AtomicBool,
    /// How it stands with the broker, as its task last said.
    pub(crate) flow: watch::Sender<Flow>,
}

/// How a consumer stands with the broker, as its task says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Subscribed: the broker sends.
    Running,
    /// Paused: no subscription (its `basic.cancel` was answered, or there
    /// is no connection); no handler starts.
    Paused,
    /// Neither: not paused, and subscribing (again) after a loss or a
    /// broker cancel.
    Waiting,
}

/// A consumer's new channel and deliveries after a recovery.
pub(crate) struct Attachment {
    pub(crate) channel: amqp::Channel,
    pub(crate) deliveries: amqp::Consumer,
    /// The link generation of the connection it is on.
    pub(crate) generation: u64,
}

/// The stream offsets a consumer was given: those still unsettled, and the
/// newest. A reattached stream consumer starts at the oldest unsettled one,
/// or just after the newest (statement 19 of `docs/statements.md`).
#[derive(Debug, Default)]
pub(crate) struct StreamPosition {
    unsettled: std::collections::BTreeMap<i64, u32>,
    newest: Option<i64>,
}

impl StreamPosition {
    /// A delivery at `offset` was given to the consumer.
    pub(crate) fn given(&mut self, offset: i64) {
        *self.unsettled.entry(offset).or_default() += 1;
        self.newest = Some(self.newest.map_or(offset, |n| n.max(offset)));
    }

    /// The delivery at `offset` was settled (or handed back).
    pub(crate) fn settled(&mut self, offset: i64) {
        if let Some(count) = self.unsettled.get_mut(&offset) {
            *count -= 1;
            if *count == 0 {
                self.unsettled.remove(&offset);
            }
        }
    }

    /// Just after the newest offset given, if any.
    pub(crate) fn after_newest(&self) -> Option<i64> {
        self.newest.map(|n| n.saturating_add(1))
    }

    /// Where to resume, if anything was given.
    pub(crate) fn resume_at(&self) -> Option<i64> {
        match self.unsettled.keys().next() {
            Some(&oldest) => Some(oldest),
            None => self.newest.map(|n| n.saturating_add(1)),
        }
    }
}

impl ConsumerRecord {
    /// A record of `method` (with the tag the broker gave), its prefetch
    /// and the channels to and from its task; running, not paused.
    pub(crate) fn new(
        method: BasicConsume,
        prefetch: u16,
        attach: mpsc::UnboundedSender<Result<Attachment, Error>>,
        shutdown: watch::Sender<bool>,
        ended: watch::Receiver<Option<Result<(), Error>>>,
    ) -> ConsumerRecord {
        ConsumerRecord {
            queue: Mutex::new(method.queue.to_string()),
            method: Mutex::new(method),
            prefetch,
            stream: Mutex::new(StreamPosition::default()),
            attach,
            shutdown,
            ended,
            pause: watch::channel(false).0,
            paused: AtomicBool::new(false),
            flow: watch::channel(Flow::Running).0,
        }
    }

    /// Asks for the consumer to be paused (`true`) or to run; whether that
    /// changed anything.
    pub(crate) fn set_paused(&self, paused: bool) -> bool {
        self.paused.store(paused, Ordering::SeqCst);
        self.pause.send_if_modified(|p| std::mem::replace(p, paused) != paused)
    }

    /// Whether the consumer is asked to be paused.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// Returns once the consumer is not asked to be paused (`true`), or
    /// once `shutdown` is set (`false`).
    pub(crate) async fn until_resumed(&self, shutdown: &watch::Receiver<bool>) -> bool {
        let mut pause = self.pause.subscribe();
        let mut shutdown = shutdown.clone();
        let resumed = tokio::select! {
            _ = pause.wait_for(|p| !*p) => true,
            _ = shutdown.wait_for(|s| *s) => false,
        };
        resumed && !*shutdown.borrow()
    }

    /// The task says how the consumer stands.
    pub(crate) fn set_flow(&self, flow: Flow) {
        self.flow.send_if_modified(|f| std::mem::replace(f, flow) != flow);
    }

    /// The `basic.consume` to send now: the recorded one on the current queue
    /// name, with a stream consumer's offset moved to where it stands.
    fn consume_method(&self) -> BasicConsume {
        let mut method = self.method.lock().unwrap_or_else(|p| p.into_inner()).clone();
        method.queue = self.queue.lock().unwrap_or_else(|p| p.into_inner()).as_str().into();
        if let Some(offset) = self.stream.lock().unwrap_or_else(|p| p.into_inner()).resume_at() {
            method.arguments.insert("x-stream-offset", FieldValue::I64(offset));
        }
        method
    }

    /// The `basic.consume` that resumes a paused consumer on the channel it
    /// paused on: as [`ConsumerRecord::consume_method`], except that a
    /// stream consumer goes on just after the newest offset it was given
    /// (what it was given and has not settled is still being handled on
    /// that channel, not lost).
    pub(crate) fn resume_method(&self) -> BasicConsume {
        let mut method = self.consume_method();
        if let Some(next) = self.stream.lock().unwrap_or_else(|p| p.into_inner()).after_newest() {
            method.arguments.insert("x-stream-offset", FieldValue::I64(next));
        }
        method
    }
}

/// Channel, `basic.qos`, then `basic.consume` with the recorded tag, on the
/// connection of link generation `generation`.
pub(crate) async fn reattach(
    conn: &amqp::Connection,
    record: &ConsumerRecord,
    generation: u64,
) -> Result<Attachment, Error> {
    let channel = conn.channel().await?;
    channel.qos(record.prefetch).await?;
    let deliveries = channel.basic_consume(record.consume_method()).await?;
    Ok(Attachment {
        channel,
        deliveries,
        generation,
    })
}

/// The consumer tag the broker gave, recorded so the consumer comes back
/// under the same tag.
pub(crate) fn with_tag(mut method: BasicConsume, tag: &ShortString) -> BasicConsume {
    method.consumer_tag = tag.clone();
    method
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_consumer_resumes_at_its_oldest_unsettled_offset_or_after_its_newest() {
        let mut at = StreamPosition::default();
        assert_eq!(at.resume_at(), None);
        for offset in [10, 11, 12] {
            at.given(offset);
        }
        at.settled(10);
        at.settled(12);
        assert_eq!(at.resume_at(), Some(11));
        at.settled(11);
        assert_eq!(at.resume_at(), Some(13));
    }

    #[test]
    fn a_paused_stream_consumer_resumes_after_its_newest_offset_even_with_some_unsettled() {
        let mut at = StreamPosition::default();
        assert_eq!(at.after_newest(), None);
        for offset in [4, 5, 6] {
            at.given(offset);
        }
        at.settled(6);
        assert_eq!(at.resume_at(), Some(4));
        assert_eq!(at.after_newest(), Some(7));
    }

    #[test]
    fn pausing_and_resuming_say_whether_they_changed_anything() {
        let (attach, _attachments) = mpsc::unbounded_channel();
        let (shutdown, _) = watch::channel(false);
        let (_, ended) = watch::channel(None);
        let record = ConsumerRecord::new(BasicConsume::default(), 1, attach, shutdown, ended);
        assert!(!record.is_paused());
        assert!(record.set_paused(true));
        assert!(!record.set_paused(true), "a second pause changes nothing");
        assert!(record.is_paused() && *record.pause.borrow());
        assert!(record.set_paused(false));
        assert!(!record.set_paused(false));
        assert!(!record.is_paused());
    }
}
