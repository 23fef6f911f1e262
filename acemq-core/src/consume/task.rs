//! The consumer task: the task every consumer a `Conn` records for
//! recovery runs (`consume`'s and the `Scheduler`'s). Started on the
//! consuming connection of the moment, it hands each delivery to its owner
//! (for `consume`, [`super::delivery`]; it never handles one itself), waits
//! through a loss for the supervisor to reattach it (or reattaches itself),
//! subscribes again when the broker cancels it or closes its channel
//! (unless built to end then), pauses (`basic.cancel` on its channel,
//! holding what arrived before the answer) and resumes (what it held, then
//! `basic.consume` again under a new tag), and on close cancels, hands back
//! what nobody started on, drains the work under way up to the drain
//! timeout and closes its channel. How it ended is published on its record, for `closed()`
//! and `Conn::close`.
//!
//! It never settles a delivery on a channel other than the one it came on:
//! a delivery's acker names its channel, and once that channel is gone the
//! engine drops (and counts) its settlements.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use acemq_codec::BasicConsume;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::amqp::CloseReason;
use crate::amqp::{self, Delivery};
use crate::config::RecoveryEvent;
use crate::conn::{
    emit, lock, reattach, until_set, with_tag, Attachment, Backoff, ConnState, ConsumerRecord, Flow, LinkPhase,
};
use crate::error::Error;

/// What a consumer does when the broker cancels it (`basic.cancel`: its
/// queue was deleted, or lost its leader) or closes its channel (e.g. 406
/// PRECONDITION_FAILED for a delivery not acknowledged within RabbitMQ's
/// `consumer_timeout`). Either way [`crate::RecoveryEvent::ConsumerCancelled`]
/// reports it with the broker's reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnCancel {
    /// Subscribe again (the default): with the recovery backoff
    /// (`recovery_delay` doubling to `recovery_delay_max`, jittered), on a
    /// new channel, with the consumer's tag, arguments and prefetch, once
    /// its queue exists again; [`crate::RecoveryEvent::ConsumerResubscribed`]
    /// reports it. Deliveries from the closed channel are never settled on
    /// the new one: their acks are dropped and counted, and the broker
    /// redelivers them.
    #[default]
    Resubscribe,
    /// End the consumer: [`crate::Consumer::closed`] returns
    /// [`Error::ConsumerCancelled`] with the broker's reason.
    End,
}

/// A consumer started and recorded, whose task is still to be spawned.
pub(crate) struct Started {
    pub(crate) record: Arc<ConsumerRecord>,
    /// Set when it is to stop.
    pub(crate) shutdown: watch::Receiver<bool>,
    attachment: Attachment,
    attachments: mpsc::UnboundedReceiver<Result<Attachment, Error>>,
    ended: watch::Sender<Option<Result<(), Error>>>,
    on_cancel: OnCancel,
}

/// `basic.consume` of `method` after `basic.qos(prefetch)`, on a channel of
/// the consuming connection (waiting through a recovery), recorded with the
/// tag the broker gave so that recovery reattaches it.
pub(crate) async fn start(inner: &ConnState, method: BasicConsume, prefetch: u16) -> Result<Started, Error> {
    let ((channel, deliveries), generation) = inner
        .on_consuming(|connection| {
            let method = method.clone();
            async move {
                let channel = connection.channel().await?;
                channel.qos(prefetch).await?;
                let deliveries = channel.basic_consume(method).await?;
                Ok((channel, deliveries))
            }
        })
        .await?;
    let (shutdown_tx, shutdown) = watch::channel(false);
    let (ended, ended_rx) = watch::channel(None);
    let (attach, attachments) = mpsc::unbounded_channel();
    let record = Arc::new(ConsumerRecord::new(
        with_tag(method, deliveries.tag()),
        prefetch,
        attach,
        shutdown_tx,
        ended_rx,
    ));
    inner.add_consumer(record.clone());
    Ok(Started {
        record,
        shutdown,
        attachment: Attachment {
            channel,
            deliveries,
            generation,
        },
        attachments,
        ended,
        on_cancel: OnCancel::default(),
    })
}

impl Started {
    /// What it does when the broker cancels it (see [`OnCancel`]).
    pub(crate) fn on_cancel(mut self, on_cancel: OnCancel) -> Self {
        self.on_cancel = on_cancel;
        self
    }

    /// Runs it on a task of its own: `each` starts the work of a delivery
    /// in the given set. `what` names it in logs. When it ends it leaves
    /// the `Conn`'s records and publishes how it ended.
    pub(crate) fn spawn<E>(
        self,
        inner: Arc<ConnState>,
        what: String,
        drain_timeout: Duration,
        each: E,
    ) -> tokio::task::JoinHandle<()>
    where
        E: FnMut(&mut JoinSet<()>, Delivery) + Send + 'static,
    {
        let Started {
            record,
            shutdown,
            attachment,
            attachments,
            ended,
            on_cancel,
        } = self;
        tokio::spawn(async move {
            let outcome = run(
                &inner,
                &record,
                &what,
                attachment,
                attachments,
                shutdown,
                (drain_timeout, on_cancel),
                each,
            )
            .await;
            if let Err(err) = &outcome {
                tracing::error!(queue = %what, %err, "the consumer ended");
            }
            inner.remove_consumer(&record);
            ended.send_replace(Some(outcome));
        })
    }
}

impl ConsumerRecord {
    /// Stops the consumer and waits for its task; the error it had already
    /// ended with, if it had.
    pub(crate) async fn close(&self, done: tokio::task::JoinHandle<()>) -> Result<(), Error> {
        self.shutdown.send_replace(true);
        done.await.map_err(|e| Error::ConsumerFailed(Arc::new(e)))?;
        self.ended.borrow().clone().unwrap_or(Ok(()))
    }

    /// Asks the consumer to pause (`true`) or resume, and waits until its
    /// task has done it (see `Consumer::pause`): at most `within`. A later
    /// opposite call that overtakes it ends the wait as well.
    pub(crate) async fn pause_or_resume(&self, paused: bool, within: Duration) -> Result<(), Error> {
        if let Some(ended) = self.ended.borrow().clone() {
            return ended.and(Err(Error::Closed(CloseReason::ByClient)));
        }
        self.set_paused(paused);
        let target = if paused { Flow::Paused } else { Flow::Running };
        let mut flow = self.flow.subscribe();
        let mut asked = self.pause.subscribe();
        let mut ended = self.ended.clone();
        let waited = tokio::time::timeout(within, async {
            tokio::select! {
                _ = flow.wait_for(|f| *f == target) => Ok(()),
                _ = asked.wait_for(|p| *p != paused) => Ok(()),
                outcome = ended.wait_for(Option::is_some) => match outcome {
                    Ok(outcome) => outcome.clone().unwrap_or(Ok(())).and(Err(Error::Closed(CloseReason::ByClient))),
                    Err(_) => Err(Error::Closed(CloseReason::ByClient)),
                },
            }
        })
        .await;
        waited.unwrap_or(Err(Error::Engine(amqp::Error::Timeout(within))))
    }

    /// Waits until the consumer has ended: `Ok` once closed, or its error.
    pub(crate) async fn closed(&self) -> Result<(), Error> {
        let mut ended = self.ended.clone();
        let outcome = ended.wait_for(Option::is_some).await;
        match outcome {
            Ok(outcome) => outcome.clone().unwrap_or(Ok(())),
            Err(_) => Ok(()),
        }
    }
}

/// Where a consumer stands with the broker, in its task.
enum Sub {
    /// Subscribed: deliveries flow on the attachment.
    Live(Attachment),
    /// Paused on a channel that was open when its `basic.cancel` was
    /// answered; `held` came before the answer and were not started.
    Cancelled(Attachment, VecDeque<Delivery>),
    /// No subscription and no channel to resume on: it needs one on a
    /// connection of link generation `after` or later.
    Detached {
        /// The oldest link generation it may subscribe on.
        after: u64,
    },
}

/// What a step of the consumer task came to.
enum Next {
    /// Go on from this state.
    Go(Sub),
    /// The consumer closes (from this state).
    Close(Sub),
    /// The consumer ends with this error (from this state).
    End(Sub, Error),
}

/// What runs a consumer task, besides its state.
struct Runner<'a, S, E> {
    inner: &'a ConnState,
    record: &'a ConsumerRecord,
    what: &'a str,
    on_cancel: OnCancel,
    attachments: mpsc::UnboundedReceiver<Result<Attachment, Error>>,
    pause: watch::Receiver<bool>,
    stop: Pin<&'a mut S>,
    tasks: JoinSet<()>,
    each: E,
}

#[allow(clippy::too_many_arguments)]
async fn run<E>(
    inner: &ConnState,
    record: &ConsumerRecord,
    what: &str,
    attachment: Attachment,
    attachments: mpsc::UnboundedReceiver<Result<Attachment, Error>>,
    mut shutdown: watch::Receiver<bool>,
    (drain_timeout, on_cancel): (Duration, OnCancel),
    each: E,
) -> Result<(), Error>
where
    E: FnMut(&mut JoinSet<()>, Delivery),
{
    // Made once: a fresh wait per delivery would register with the watch
    // (a lock) every time round the loop.
    let stop = std::pin::pin!(until_set(&mut shutdown));
    let mut runner = Runner {
        inner,
        record,
        what,
        on_cancel,
        attachments,
        pause: record.pause.subscribe(),
        stop,
        tasks: JoinSet::new(),
        each,
    };
    let mut sub = Sub::Live(attachment);
    let (sub, outcome) = loop {
        let paused = *runner.pause.borrow_and_update();
        record.set_flow(match (&sub, paused) {
            (Sub::Live(_), _) => Flow::Running,
            (_, true) => Flow::Paused,
            (_, false) => Flow::Waiting,
        });
        let next = match (sub, paused) {
            (Sub::Live(attachment), false) => runner.consume(attachment).await,
            (Sub::Live(attachment), true) => runner.pause(attachment).await,
            (Sub::Cancelled(attachment, held), false) => runner.resume(attachment, held).await,
            (Sub::Detached { after }, false) => runner.attach(after).await,
            (paused, true) => runner.idle(paused).await,
        };
        sub = match next {
            Next::Go(sub) => sub,
            Next::Close(sub) => break (sub, Ok(())),
            Next::End(sub, err) => break (sub, Err(err)),
        };
    };
    runner.drain(sub, drain_timeout).await;
    outcome
}

impl<S: Future, E> Runner<'_, S, E>
where
    E: FnMut(&mut JoinSet<()>, Delivery),
{
    /// Hands each delivery on until the consumer closes, is asked to pause
    /// or loses its subscription.
    async fn consume(&mut self, mut attachment: Attachment) -> Next {
        let ended = loop {
            tokio::select! {
                biased;
                _ = self.stop.as_mut() => return Next::Close(Sub::Live(attachment)),
                _ = self.pause.changed() => return Next::Go(Sub::Live(attachment)),
                delivery = attachment.deliveries.next() => match delivery {
                    Some(delivery) => {
                        (self.each)(&mut self.tasks, delivery);
                        // What else has arrived goes too, without another turn.
                        while let Some(delivery) = attachment.deliveries.try_next() {
                            (self.each)(&mut self.tasks, delivery);
                        }
                        // Finished work is reaped here as well, so a busy
                        // stream never lets it pile up.
                        while self.tasks.try_join_next().is_some() {}
                    }
                    None => break attachment,
                },
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            }
        };
        if ended.channel.connection().is_closed() {
            self.lost(ended)
        } else {
            // The channel or the consumer went, not the connection: the
            // broker cancelled it (its queue was deleted) or closed the channel.
            let reason = cancel_reason(&ended.channel);
            self.cancelled(ended, reason).await
        }
    }

    /// The consuming connection under `attachment` was lost: recovery
    /// brings a new one (unless there is none).
    fn lost(&mut self, attachment: Attachment) -> Next {
        if self.inner.config.without_recovery {
            let reason = attachment
                .channel
                .connection()
                .close_reason()
                .unwrap_or(CloseReason::ConnectionLost);
            return Next::End(Sub::Live(attachment), Error::Closed(reason));
        }
        tracing::info!(queue = %self.what, "the consuming connection was lost; waiting for its recovery");
        Next::Go(Sub::Detached {
            after: attachment.generation + 1,
        })
    }

    /// The broker cancelled the consumer or closed its channel (the
    /// connection is up): reported, then subscribed again with the backoff
    /// or ended, as built.
    async fn cancelled(&mut self, attachment: Attachment, reason: String) -> Next {
        let resubscribing = self.on_cancel == OnCancel::Resubscribe;
        tracing::warn!(queue = %self.what, %reason, resubscribing, "the broker cancelled the consumer");
        emit(
            self.inner,
            RecoveryEvent::ConsumerCancelled {
                queue: self.what.to_string(),
                reason: reason.clone(),
                resubscribing,
            },
        );
        if !resubscribing {
            let err = Error::ConsumerCancelled {
                queue: self.what.to_string(),
                reason,
            };
            return Next::End(Sub::Live(attachment), err);
        }
        let generation = attachment.generation;
        match self.resubscribe(generation).await {
            Resubscribed::Again(next, attempts) => {
                emit(
                    self.inner,
                    RecoveryEvent::ConsumerResubscribed {
                        queue: self.what.to_string(),
                        reason,
                        attempts,
                    },
                );
                // The old channel goes with its handles; a delivery still
                // in a handler keeps its acker, whose settlement the
                // engine drops.
                Next::Go(Sub::Live(next))
            }
            Resubscribed::Closing => Next::Close(Sub::Live(attachment)),
            // The connection went meanwhile: recovery takes over.
            Resubscribed::Lost => self.lost(attachment),
            // Paused meanwhile: it subscribes when resumed.
            Resubscribed::Paused => Next::Go(Sub::Detached { after: generation }),
        }
    }

    /// Pauses: `basic.cancel`, on the channel it consumes on. What arrived
    /// before the broker's answer is held, not started.
    async fn pause(&mut self, mut attachment: Attachment) -> Next {
        match attachment.deliveries.cancel().await {
            Ok(()) => {
                let mut held = VecDeque::new();
                while let Some(delivery) = attachment.deliveries.try_next() {
                    held.push_back(delivery);
                }
                tracing::info!(queue = %self.what, held = held.len(), "the consumer is paused");
                Next::Go(Sub::Cancelled(attachment, held))
            }
            Err(_) if attachment.channel.connection().is_closed() => self.lost(attachment),
            Err(err) => {
                // The broker closed the channel under the cancel: it sends
                // nothing more, and what it had sent goes back to the queue.
                let reason = cancel_reason(&attachment.channel);
                tracing::info!(queue = %self.what, %err, %reason, "the consumer's channel closed as it paused");
                let generation = attachment.generation;
                Next::Go(Sub::Detached { after: generation })
            }
        }
    }

    /// Resumes on the channel it paused on: the held deliveries first, then
    /// `basic.consume` again with its tag and arguments.
    async fn resume(&mut self, attachment: Attachment, mut held: VecDeque<Delivery>) -> Next {
        if attachment.channel.connection().is_closed() {
            // Lost while paused: the broker has the held messages back.
            return self.lost(attachment);
        }
        if !attachment.channel.is_open() {
            // Closed by the broker while paused (e.g. held past its
            // consumer timeout): the held messages went back to the queue.
            let reason = cancel_reason(&attachment.channel);
            return self.cancelled(attachment, reason).await;
        }
        while let Some(delivery) = held.pop_front() {
            (self.each)(&mut self.tasks, delivery);
        }
        // Under a new tag the broker gives: RabbitMQ 3.10 hands a quorum
        // queue's consumer that subscribes again under its old tag on the
        // same channel messages as redeliveries, raising their count.
        let mut method = self.record.resume_method();
        method.consumer_tag = "".into();
        let consumed = attachment.channel.basic_consume(method).await;
        match consumed {
            Ok(deliveries) => {
                let mut recorded = lock(&self.record.method);
                *recorded = with_tag(recorded.clone(), deliveries.tag());
                drop(recorded);
                tracing::info!(queue = %self.what, "the consumer is resumed");
                Next::Go(Sub::Live(Attachment {
                    channel: attachment.channel,
                    deliveries,
                    generation: attachment.generation,
                }))
            }
            Err(_) if attachment.channel.connection().is_closed() => self.lost(attachment),
            Err(err) => {
                // Refused (its queue deleted while it was paused): as a
                // broker cancel.
                let reason = format!("subscribing again on resume was refused: {err}");
                self.cancelled(attachment, reason).await
            }
        }
    }

    /// Paused and nothing to do but wait: for a resume, a close, the work
    /// under way, and anything recovery hands over (a subscription it made
    /// before it saw the pause is paused in turn).
    async fn idle(&mut self, sub: Sub) -> Next {
        let after = match &sub {
            Sub::Cancelled(attachment, _) => attachment.generation + 1,
            Sub::Detached { after } => *after,
            Sub::Live(attachment) => attachment.generation + 1,
        };
        let connection = match &sub {
            Sub::Cancelled(attachment, _) => Some(attachment.channel.connection().clone()),
            _ => None,
        };
        loop {
            tokio::select! {
                biased;
                _ = self.stop.as_mut() => return Next::Close(sub),
                _ = self.pause.changed() => return Next::Go(sub),
                next = self.attachments.recv() => match next {
                    Some(Ok(next)) if next.generation >= after => return Next::Go(Sub::Live(next)),
                    Some(Ok(_stale)) => {}
                    Some(Err(err)) => return Next::End(sub, err),
                    None => return Next::End(sub, Error::Closed(CloseReason::ByClient)),
                },
                reason = async {
                    match &connection {
                        Some(connection) => connection.closed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    // Lost while paused: the held messages are the broker's
                    // again; recovery leaves the consumer unsubscribed.
                    if self.inner.config.without_recovery {
                        return Next::End(sub, Error::Closed(reason));
                    }
                    return Next::Go(Sub::Detached { after });
                }
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            }
        }
    }

    /// Waits for a subscription on a connection of generation `after` or
    /// later: the one the supervisor hands over, or (if the connection is
    /// back and nothing was handed over: the consumer started or was
    /// resumed while the supervisor was restoring) one it makes itself.
    /// The work under way goes on meanwhile.
    async fn attach(&mut self, after: u64) -> Next {
        let mut snapshots = self.inner.consuming.subscribe();
        let (conn, generation) = loop {
            tokio::select! {
                biased;
                _ = self.stop.as_mut() => return Next::Close(Sub::Detached { after }),
                _ = self.pause.changed() => return Next::Go(Sub::Detached { after }),
                next = self.attachments.recv() => match next {
                    Some(Ok(next)) if next.generation >= after => return Next::Go(Sub::Live(next)),
                    Some(Ok(_stale)) => {}
                    Some(Err(err)) => return Next::End(Sub::Detached { after }, err),
                    None => return Next::End(Sub::Detached { after }, Error::Closed(CloseReason::ByClient)),
                },
                changed = async {
                    snapshots
                        .wait_for(|s| match s.phase {
                            LinkPhase::Up => s.generation >= after,
                            LinkPhase::Down(_) => true,
                            LinkPhase::Recovering => false,
                        })
                        .await
                        .map(|s| (s.phase.clone(), s.conn.clone(), s.generation))
                } => {
                    let Ok((phase, conn, generation)) = changed else {
                        return Next::End(Sub::Detached { after }, Error::Closed(CloseReason::ByClient));
                    };
                    if let LinkPhase::Down(err) = phase {
                        return Next::End(Sub::Detached { after }, err);
                    }
                    // The supervisor hands attachments over before it says
                    // the link is up: one for us would be waiting now.
                    match self.attachments.try_recv() {
                        Ok(Ok(next)) if next.generation >= after => return Next::Go(Sub::Live(next)),
                        Ok(Err(err)) => return Next::End(Sub::Detached { after }, err),
                        _ => break (conn, generation),
                    }
                }
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            }
        };
        let attempt = reattach(&conn, self.record, generation);
        tokio::pin!(attempt);
        let result = loop {
            tokio::select! {
                biased;
                _ = self.stop.as_mut() => return Next::Close(Sub::Detached { after }),
                result = &mut attempt => break result,
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            }
        };
        match result {
            Ok(next) => Next::Go(Sub::Live(next)),
            Err(_) if conn.is_closed() => Next::Go(Sub::Detached { after: generation + 1 }),
            Err(err) => Next::End(Sub::Detached { after }, err),
        }
    }

    /// Subscribes a cancelled consumer again on a new channel of the
    /// consuming connection, with the recovery backoff between tries,
    /// until its queue is there again; the work under way goes on
    /// meanwhile.
    async fn resubscribe(&mut self, cancelled: u64) -> Resubscribed {
        let inner = self.inner;
        let mut backoff = Backoff::new(inner.config.recovery_delay, inner.config.recovery_delay_max);
        let mut attempts = 0u32;
        loop {
            let delay = backoff.next_delay();
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    biased;
                    _ = self.stop.as_mut() => return Resubscribed::Closing,
                    _ = self.pause.wait_for(|p| *p) => return Resubscribed::Paused,
                    _ = &mut sleep => break,
                    Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
                }
            }
            let (conn, generation) = {
                let snapshot = inner.consuming.subscribe();
                let snapshot = snapshot.borrow();
                if !matches!(snapshot.phase, LinkPhase::Up) || snapshot.generation != cancelled {
                    return Resubscribed::Lost;
                }
                (snapshot.conn.clone(), snapshot.generation)
            };
            attempts += 1;
            let queue = lock(&self.record.queue).clone();
            let attempt = reattach(&conn, self.record, generation);
            tokio::pin!(attempt);
            let result = loop {
                tokio::select! {
                    biased;
                    _ = self.stop.as_mut() => return Resubscribed::Closing,
                    result = &mut attempt => break result,
                    Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
                }
            };
            match result {
                Ok(next) => return Resubscribed::Again(next, attempts),
                Err(_) if conn.is_closed() => return Resubscribed::Lost,
                Err(err) => {
                    tracing::info!(%queue, attempts, %err, "subscribing the consumer again failed; trying again");
                }
            }
        }
    }

    /// Stops the flow, then gives back what nobody has started on, lets the
    /// work under way finish up to the drain timeout, and closes the
    /// channel. The cancel and the work share the drain timeout: a broker
    /// that does not answer the cancel holds the close up no longer.
    async fn drain(mut self, sub: Sub, drain_timeout: Duration) {
        let what = self.what;
        let drain_deadline = tokio::time::Instant::now() + drain_timeout;
        let channel = match sub {
            Sub::Live(mut attachment) => {
                match tokio::time::timeout_at(drain_deadline, attachment.deliveries.cancel()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => tracing::debug!(queue = %what, %err, "cancelling the consumer"),
                    Err(_) => {
                        tracing::warn!(queue = %what, ?drain_timeout, "the broker did not answer basic.cancel within the drain timeout")
                    }
                }
                while let Some(delivery) = attachment.deliveries.try_next() {
                    let _ = delivery.nack(true);
                }
                Some(attachment.channel)
            }
            Sub::Cancelled(attachment, held) => {
                for delivery in held {
                    let _ = delivery.nack(true);
                }
                Some(attachment.channel)
            }
            Sub::Detached { .. } => None,
        };
        let tasks = &mut self.tasks;
        let drained =
            tokio::time::timeout_at(drain_deadline, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(queue = %what, ?drain_timeout, "work still running after the drain timeout; its messages go back to the broker");
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
        if let Some(channel) = channel {
            let _ = channel.close().await;
        }
    }
}

/// The broker's reason for ending a consumer whose connection is still up.
fn cancel_reason(channel: &amqp::Channel) -> String {
    match channel.close_error() {
        Some(amqp::Error::ChannelClosed(refusal)) => format!("channel closed by the broker: {refusal}"),
        Some(other) => format!("channel closed: {other}"),
        None => "basic.cancel from the broker (its queue was deleted or became unavailable)".to_string(),
    }
}

/// How a resubscription ended.
enum Resubscribed {
    /// Subscribed again, after this many tries.
    Again(Attachment, u32),
    /// The consumer is closing.
    Closing,
    /// The consuming connection went (or is recovering): the consumer waits
    /// for recovery as after any loss.
    Lost,
    /// The consumer was paused: it subscribes when resumed.
    Paused,
}
