//! The consumer task: the task every consumer a `Conn` records for
//! recovery runs (`consume`'s and the `Scheduler`'s). Started on the
//! consuming connection of the moment, it hands each delivery to its owner
//! (for `consume`, [`super::delivery`]; it never handles one itself), waits
//! through a loss for the supervisor to reattach it (or reattaches itself),
//! subscribes again when the broker cancels it or closes its channel
//! (unless built to end then), and on close cancels, hands back what nobody
//! started on, drains the work under way up to the drain timeout and closes
//! its channel. How it ended is published on its record, for `closed()`
//! and `Conn::close`.
//!
//! It never settles a delivery on a channel other than the one it came on:
//! a delivery's acker names its channel, and once that channel is gone the
//! engine drops (and counts) its settlements.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::BasicConsume;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::amqp::CloseReason;
use crate::amqp::{self, Delivery};
use crate::config::RecoveryEvent;
use crate::conn::{
    emit, reattach, until_set, with_tag, Attachment, Backoff, ConnState, ConsumerRecord, LinkPhase, StreamPosition,
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
    let record = Arc::new(ConsumerRecord {
        queue: Mutex::new(method.queue.to_string()),
        method: Mutex::new(with_tag(method, deliveries.tag())),
        prefetch,
        stream: Mutex::new(StreamPosition::default()),
        attach,
        shutdown: shutdown_tx,
        ended: ended_rx,
    });
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

#[allow(clippy::too_many_arguments)]
async fn run<E>(
    inner: &ConnState,
    record: &ConsumerRecord,
    what: &str,
    mut attachment: Attachment,
    mut attachments: mpsc::UnboundedReceiver<Result<Attachment, Error>>,
    mut shutdown: watch::Receiver<bool>,
    (drain_timeout, on_cancel): (Duration, OnCancel),
    mut each: E,
) -> Result<(), Error>
where
    E: FnMut(&mut JoinSet<()>, Delivery),
{
    let mut tasks = JoinSet::new();
    // Made once: a fresh wait per delivery would register with the watch
    // (a lock) every time round the loop.
    let mut stop = std::pin::pin!(until_set(&mut shutdown));
    let outcome = loop {
        let closing = loop {
            tokio::select! {
                biased;
                _ = &mut stop => break true,
                delivery = attachment.deliveries.next() => match delivery {
                    Some(delivery) => {
                        each(&mut tasks, delivery);
                        // What else has arrived goes too, without another turn.
                        while let Some(delivery) = attachment.deliveries.try_next() {
                            each(&mut tasks, delivery);
                        }
                        // Finished work is reaped here as well, so a busy
                        // stream never lets it pile up.
                        while tasks.try_join_next().is_some() {}
                    }
                    None => break false,
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        };
        if closing {
            break Ok(());
        }
        let connection = attachment.channel.connection().clone();
        if !connection.is_closed() {
            // The channel or the consumer went, not the connection: the
            // broker cancelled it (its queue was deleted) or closed the channel.
            let reason = cancel_reason(&attachment.channel);
            let resubscribing = on_cancel == OnCancel::Resubscribe;
            tracing::warn!(queue = %what, %reason, resubscribing, "the broker cancelled the consumer");
            emit(
                inner,
                RecoveryEvent::ConsumerCancelled {
                    queue: what.to_string(),
                    reason: reason.clone(),
                    resubscribing,
                },
            );
            if !resubscribing {
                break Err(Error::ConsumerCancelled {
                    queue: what.to_string(),
                    reason,
                });
            }
            match resubscribe(inner, record, &attachment, &mut stop, &mut tasks).await {
                Resubscribed::Again(next, attempts) => {
                    emit(
                        inner,
                        RecoveryEvent::ConsumerResubscribed {
                            queue: what.to_string(),
                            reason,
                            attempts,
                        },
                    );
                    // The old channel goes with its handles; a delivery
                    // still in a handler keeps its acker, whose settlement
                    // the engine drops.
                    attachment = next;
                    continue;
                }
                Resubscribed::Closing => break Ok(()),
                // The connection went meanwhile: recovery takes over.
                Resubscribed::Lost => {}
            }
        }
        if inner.config.without_recovery {
            let reason = connection.close_reason().unwrap_or(CloseReason::ConnectionLost);
            break Err(Error::Closed(reason));
        }
        tracing::info!(queue = %what, "the consuming connection was lost; waiting for its recovery");
        match next_attachment(inner, record, &attachment, &mut attachments, &mut stop, &mut tasks).await {
            Ok(Some(next)) => attachment = next,
            Ok(None) => break Ok(()),
            Err(err) => break Err(err),
        }
    };
    // Stop the flow, then give back what nobody has started on. The
    // cancel and the work under way share the drain timeout: a broker that
    // does not answer the cancel holds the close up no longer than that.
    let drain_deadline = tokio::time::Instant::now() + drain_timeout;
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
    let drained = tokio::time::timeout_at(drain_deadline, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(queue = %what, ?drain_timeout, "work still running after the drain timeout; its messages go back to the broker");
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    let _ = attachment.channel.close().await;
    outcome
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
}

/// Subscribes a cancelled consumer again on a new channel of the consuming
/// connection, with the recovery backoff between tries, until its queue is
/// there again; the work under way goes on meanwhile.
async fn resubscribe<S: Future>(
    inner: &ConnState,
    record: &ConsumerRecord,
    cancelled: &Attachment,
    stop: &mut Pin<&mut S>,
    tasks: &mut JoinSet<()>,
) -> Resubscribed {
    let mut backoff = Backoff::new(inner.config.recovery_delay, inner.config.recovery_delay_max);
    let mut attempts = 0u32;
    loop {
        let delay = backoff.next_delay();
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                biased;
                _ = stop.as_mut() => return Resubscribed::Closing,
                _ = &mut sleep => break,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        let (conn, generation) = {
            let snapshot = inner.consuming.subscribe();
            let snapshot = snapshot.borrow();
            if !matches!(snapshot.phase, LinkPhase::Up) || snapshot.generation != cancelled.generation {
                return Resubscribed::Lost;
            }
            (snapshot.conn.clone(), snapshot.generation)
        };
        attempts += 1;
        let queue = record.queue.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let attempt = reattach(&conn, record, generation);
        tokio::pin!(attempt);
        let result = loop {
            tokio::select! {
                biased;
                _ = stop.as_mut() => return Resubscribed::Closing,
                result = &mut attempt => break result,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
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

/// Waits for the supervisor to reattach the consumer after a loss; the work
/// under way goes on meanwhile. `None` when closing. If the connection is
/// back but nothing was handed over (the consumer started while the
/// supervisor was restoring), it reattaches itself.
async fn next_attachment<S: Future>(
    inner: &ConnState,
    record: &ConsumerRecord,
    dead: &Attachment,
    attachments: &mut mpsc::UnboundedReceiver<Result<Attachment, Error>>,
    stop: &mut Pin<&mut S>,
    tasks: &mut JoinSet<()>,
) -> Result<Option<Attachment>, Error> {
    let mut snapshots = inner.consuming.subscribe();
    loop {
        tokio::select! {
            biased;
            _ = stop.as_mut() => return Ok(None),
            next = attachments.recv() => match next {
                Some(Ok(next)) if next.generation > dead.generation => return Ok(Some(next)),
                Some(Ok(_stale)) => {}
                Some(Err(err)) => return Err(err),
                None => return Err(Error::Closed(CloseReason::ByClient)),
            },
            changed = async {
                snapshots
                    .wait_for(|s| match s.phase {
                        LinkPhase::Up => s.generation > dead.generation,
                        LinkPhase::Down(_) => true,
                        LinkPhase::Recovering => false,
                    })
                    .await
                    .map(|s| (s.phase.clone(), s.conn.clone(), s.generation))
            } => {
                let Ok((phase, conn, generation)) = changed else {
                    return Err(Error::Closed(CloseReason::ByClient));
                };
                if let LinkPhase::Down(err) = phase {
                    return Err(err);
                }
                // The supervisor hands attachments over before it says the
                // link is up: one for us would be waiting now.
                match attachments.try_recv() {
                    Ok(Ok(next)) if next.generation > dead.generation => return Ok(Some(next)),
                    Ok(Err(err)) => return Err(err),
                    _ => return reattach(&conn, record, generation).await.map(Some),
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}
