//! Recovery, when a connection drops: one supervisor per AMQP
//! connection of a [`Conn`](crate::Conn). A supervisor reports a loss at once,
//! redials with capped and jittered backoff (every host of the URL in turn),
//! then restores on the new connection, in this order: the channels and their
//! confirm mode, every recorded declaration (a server-named queue anew, its
//! new name given to its bindings and consumers), `basic.qos` and every
//! consumer with its tag and arguments. Only then is the connection handed
//! out again, on its `Link`.
//!
//! The low-level [`amqp::Connection`] never recovers: the supervisor watches
//! it end and replaces it. The supervisor is the one writer of a link's
//! connection and phase; it holds the `Conn`'s state weakly, and nothing
//! of the state holds or imports it (`Conn::open` starts it).

use std::sync::{Arc, Weak};
use std::time::Duration;

use rand::RngExt;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::consumers::reattach;
use super::link::LinkPhase;
use super::state::{emit, until_set, ConnState};
use crate::amqp::CloseReason;
use crate::amqp::{self, ConnectionEvent};
use crate::config::RecoveryEvent;
use crate::declaration::Declaration;
use crate::error::{is_loss, is_silence, Error};

/// The redial delays: `first`, doubling up to `max`, each with ±20% jitter.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            next: first,
            max: max.max(first),
        }
    }

    /// The next delay, jittered.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let factor = rand::rng().random_range(0.8..=1.2);
        base.mul_f64(factor)
    }
}

/// Starts the supervisor of `link`. It holds the `Conn` weakly: when every
/// handle is gone, the connection closes and the supervisor ends.
pub(crate) fn supervise(state: &Arc<ConnState>, link: &'static str) {
    let weak = Arc::downgrade(state);
    let closing = state.closing.subscribe();
    // Subscribed here, not in the task: what the connection reports between
    // now and the task's first poll is not lost.
    let first = watched(state, link);
    tokio::spawn(supervisor(weak, link, closing, first));
}

/// What `which`'s current connection reports, and its closed flag.
type Watched = (broadcast::Receiver<ConnectionEvent>, watch::Receiver<bool>);

fn watched(state: &ConnState, which: &'static str) -> Watched {
    let conn = state.link(which).current();
    (conn.events(), conn.state.closed.subscribe())
}

/// The connection and what it reports, until it ends; `None` if the `Conn`
/// is gone or closing.
async fn watch_until_lost(
    weak: &Weak<ConnState>,
    which: &'static str,
    closing: &mut watch::Receiver<bool>,
    (mut events, mut closed): Watched,
) -> Option<CloseReason> {
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(ConnectionEvent::Blocked { reason }) => {
                    let state = weak.upgrade()?;
                    emit(&state, RecoveryEvent::Blocked { reason });
                }
                Ok(ConnectionEvent::Unblocked) => {
                    let state = weak.upgrade()?;
                    emit(&state, RecoveryEvent::Unblocked);
                }
                Ok(ConnectionEvent::Closed(reason)) => return Some(reason),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    until_set(&mut closed).await;
                    return close_reason(weak, which);
                }
            },
            // The connection may have ended before this task subscribed to
            // its events (a broker closing it just after the dial): the
            // flag, unlike the broadcast, holds that for late subscribers.
            _ = until_set(&mut closed) => return close_reason(weak, which),
            _ = until_set(closing) => return None,
        }
    }
}

/// Why `which`'s current connection ended (set before its closed flag).
fn close_reason(weak: &Weak<ConnState>, which: &'static str) -> Option<CloseReason> {
    let state = weak.upgrade()?;
    let reason = state.link(which).current().close_reason();
    Some(reason.unwrap_or(CloseReason::ConnectionLost))
}

async fn supervisor(weak: Weak<ConnState>, which: &'static str, mut closing: watch::Receiver<bool>, first: Watched) {
    let mut next = Some(first);
    loop {
        let current = match next.take() {
            Some(first) => first,
            None => {
                let Some(state) = weak.upgrade() else { return };
                watched(&state, which)
            }
        };
        let Some(reason) = watch_until_lost(&weak, which, &mut closing, current).await else {
            return;
        };
        let Some(state) = weak.upgrade() else { return };
        let link = state.link(which);
        if reason == CloseReason::ByClient || *closing.borrow() {
            link.set(None, LinkPhase::Down(Error::Closed(CloseReason::ByClient)));
            return;
        }
        let lost_at = Instant::now();
        emit(
            &state,
            RecoveryEvent::Lost {
                which,
                reason: reason.to_string(),
            },
        );
        if state.config.without_recovery {
            link.set(None, LinkPhase::Down(Error::Closed(reason)));
            return;
        }
        link.set(None, LinkPhase::Recovering);
        drop(state);
        match redial(&weak, which, &mut closing, lost_at, reason).await {
            Some(true) => continue,
            _ => return,
        }
    }
}

/// Redials until a connection is up and restored (`Some(true)`), recovery
/// gives up (`Some(false)`), or the `Conn` goes (`None`).
async fn redial(
    weak: &Weak<ConnState>,
    which: &'static str,
    closing: &mut watch::Receiver<bool>,
    lost_at: Instant,
    reason: CloseReason,
) -> Option<bool> {
    let (mut backoff, give_up) = {
        let state = weak.upgrade()?;
        let config = &state.config;
        (
            Backoff::new(config.recovery_delay, config.recovery_delay_max),
            config.recovery_give_up,
        )
    };
    let mut last = LastFailure::lost(reason);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let delay = backoff.next_delay();
        {
            let state = weak.upgrade()?;
            if give_up.is_some_and(|g| lost_at.elapsed() + delay > g) {
                let error = Error::RecoveryGaveUp {
                    which,
                    attempts: attempt - 1,
                    last_error: Arc::new(last.error),
                };
                emit(
                    &state,
                    RecoveryEvent::GaveUp {
                        which,
                        attempts: attempt - 1,
                        error: last.words,
                    },
                );
                state.link(which).set(None, LinkPhase::Down(error.clone()));
                fail_consumers(&state, which, &error);
                return Some(false);
            }
            emit(
                &state,
                RecoveryEvent::Retrying {
                    which,
                    attempt,
                    delay,
                    error: last.words.clone(),
                },
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = until_set(closing) => return stop(weak, which),
        }
        let (url, engine) = {
            let state = weak.upgrade()?;
            (state.dial_url(), state.engine_config(which))
        };
        let dialled = tokio::select! {
            dialled = amqp::Connection::open_url(&url, engine) => dialled,
            _ = until_set(closing) => return stop(weak, which),
        };
        let conn = match dialled {
            Ok(conn) => conn,
            Err(err) => {
                last = LastFailure::failed(err.to_string(), err.into());
                continue;
            }
        };
        let state = weak.upgrade()?;
        // The restore's calls are each bounded by `call_timeout`; the whole
        // of it, by what is left of `recovery_give_up`, so that a broker
        // that answers the handshake and then nothing cannot keep recovery
        // from giving up.
        let restored = match give_up {
            Some(give_up) => tokio::time::timeout_at(lost_at + give_up, restore(&state, which, &conn))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Engine(amqp::Error::Timeout(
                        give_up.saturating_sub(lost_at.elapsed().min(give_up)),
                    )))
                }),
            None => restore(&state, which, &conn).await,
        };
        match restored {
            Ok((consumers, failed)) => {
                if *closing.borrow() {
                    let _ = conn.close().await;
                    return stop(weak, which);
                }
                state.link(which).set(Some(conn), LinkPhase::Up);
                emit(
                    &state,
                    RecoveryEvent::Recovered {
                        which,
                        downtime: lost_at.elapsed(),
                        consumers,
                        failed,
                    },
                );
                return Some(true);
            }
            Err(err) => {
                tracing::warn!(which, %err, "the new connection failed while it was being restored");
                last = LastFailure::failed(err.to_string(), err);
                let _ = conn.close().await;
            }
        }
    }
}

/// Why the last try failed, or why the connection was lost: the error
/// recovery gives up with ([`Error::RecoveryGaveUp`]'s `last_error`), and
/// the words the events say it in.
struct LastFailure {
    error: Error,
    words: String,
}

impl LastFailure {
    /// The connection was lost: the events give the reason alone.
    fn lost(reason: CloseReason) -> LastFailure {
        LastFailure {
            words: reason.to_string(),
            error: Error::Closed(reason),
        }
    }

    /// A redial or a restore failed; `words` are what the error said where
    /// it was made.
    fn failed(words: String, error: Error) -> LastFailure {
        LastFailure { error, words }
    }
}

fn stop(weak: &Weak<ConnState>, which: &'static str) -> Option<bool> {
    let state = weak.upgrade()?;
    state
        .link(which)
        .set(None, LinkPhase::Down(Error::Closed(CloseReason::ByClient)));
    None
}

/// Every consumer of the consuming link hears that recovery gave up.
fn fail_consumers(state: &ConnState, which: &str, error: &Error) {
    if which != "consume" {
        return;
    }
    for record in state.consumer_records() {
        let _ = record.attach.send(Err(error.clone()));
    }
}

/// Restores what `which` had on the new connection `conn`. Returns how many
/// consumers were reattached and what could not be restored. An error means
/// the new connection itself failed (the attempt is retried).
async fn restore(
    state: &ConnState,
    which: &'static str,
    conn: &amqp::Connection,
) -> Result<(usize, Vec<String>), Error> {
    if which == "publish" {
        state.publish_channel.reopen_on(conn).await?;
        state.library_channel.reopen_on(conn).await?;
        return Ok((0, Vec::new()));
    }
    let mut failed = Vec::new();
    redeclare(state, conn, &mut failed).await?;
    let mut reattached = 0;
    let generation = state.consuming.generation() + 1;
    for record in state.consumer_records() {
        // A paused consumer stays paused: its task subscribes it on
        // whatever connection there is when it is resumed.
        if record.is_paused() {
            continue;
        }
        let queue = record.queue.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match reattach(conn, &record, generation).await {
            Ok(attachment) => {
                if record.attach.send(Ok(attachment)).is_ok() {
                    reattached += 1;
                }
            }
            Err(err) if is_loss(&err) || is_silence(&err) => return Err(err),
            Err(err) => {
                failed.push(format!("consumer of {queue}: {err}"));
                let _ = record.attach.send(Err(err));
            }
        }
    }
    Ok((reattached, failed))
}

/// Replays every recorded declaration in order. A server-named queue is
/// declared anew; its new name replaces the old in later bindings and in
/// consumers, and is reported. A refused declaration is listed in `failed`.
async fn redeclare(state: &ConnState, conn: &amqp::Connection, failed: &mut Vec<String>) -> Result<(), Error> {
    let declarations = state.declarations();
    let mut channel = conn.channel().await?;
    let mut renames: Vec<(String, String)> = Vec::new();
    for mut declaration in declarations {
        declaration.rename_queues(&renames);
        match declaration.apply(&channel).await {
            Ok(new_name) => {
                if let (Declaration::ServerNamedQueue { name, .. }, Some(new_name)) = (&declaration, new_name) {
                    if *name != new_name {
                        renames.push((name.clone(), new_name.clone()));
                        state.rename_queue(name, &new_name);
                        emit(
                            state,
                            RecoveryEvent::QueueRenamed {
                                from: name.clone(),
                                to: new_name,
                            },
                        );
                    }
                }
            }
            Err(err) if (is_loss(&err) && conn.is_closed()) || is_silence(&err) => return Err(err),
            Err(err) => {
                failed.push(format!("{declaration:?}: {err}"));
                channel = conn.channel().await?;
            }
        }
    }
    let _ = channel.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_both_ways() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
        let bases = [1.0, 2.0, 4.0, 4.0, 4.0];
        let mut below = false;
        let mut above = false;
        for _ in 0..200 {
            let mut b = backoff.clone();
            for base in bases {
                let d = b.next_delay().as_secs_f64();
                assert!(d >= base * 0.8 - 1e-9 && d <= base * 1.2 + 1e-9, "{d} around {base}");
                below |= d < base;
                above |= d > base;
            }
        }
        assert!(below && above, "jitter goes both ways");
        assert!(backoff.next_delay() <= Duration::from_secs_f64(1.2));
    }
}
