//! `Link`: one of a `Conn`'s two AMQP connections as the rest of the crate
//! sees it, the connection of the moment with its generation (one more per
//! recovery) and its phase (up, recovering, down for good). Everything that
//! needs the current connection asks its link, which also lets a call wait
//! (bounded) through a recovery.
//!
//! A link only holds and hands out: it never dials, restores or decides
//! that a connection is lost. The supervisor (`recovery.rs` beside it) is the one
//! writer of a new connection or phase.

use tokio::sync::watch;
use tokio::time::Instant;

use crate::amqp;
use crate::amqp::CloseReason;
use crate::error::Error;

/// Where a link stands.
#[derive(Debug, Clone)]
pub(crate) enum LinkPhase {
    /// The connection is open and restored.
    Up,
    /// The connection was lost; the supervisor is redialling.
    Recovering,
    /// For good: recovery gave up, is turned off, or the `Conn` was closed.
    /// Everyone waiting gets this error.
    Down(Error),
}

/// The current connection of a link, its generation (one more per
/// recovery), and where it stands.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) conn: amqp::Connection,
    pub(crate) generation: u64,
    pub(crate) phase: LinkPhase,
}

/// One of a `Conn`'s connections, as the rest of the crate sees it: the
/// connection of the moment, replaced by its supervisor after a loss.
pub(crate) struct Link {
    /// `publish` or `consume`, in events and logs.
    pub(crate) which: &'static str,
    state: watch::Sender<Snapshot>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("which", &self.which)
            .finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new(which: &'static str, conn: amqp::Connection) -> Link {
        conn.refuse_raw();
        let (state, _) = watch::channel(Snapshot {
            conn,
            generation: 0,
            phase: LinkPhase::Up,
        });
        Link { which, state }
    }

    /// The connection of the moment (the dead one while recovering).
    pub(crate) fn current(&self) -> amqp::Connection {
        self.state.borrow().conn.clone()
    }

    /// The generation of the connection of the moment.
    pub(crate) fn generation(&self) -> u64 {
        self.state.borrow().generation
    }

    /// Whether the link is up (not recovering, not down for good).
    pub(crate) fn is_up(&self) -> bool {
        matches!(self.state.borrow().phase, LinkPhase::Up)
    }

    /// Why the broker blocks the current connection, while it does. A new
    /// connection starts unblocked.
    pub(crate) fn blocked_reason(&self) -> Option<String> {
        let state = self.state.borrow();
        match state.phase {
            LinkPhase::Up => state.conn.blocked_reason(),
            _ => None,
        }
    }

    /// The connection once it is up, waiting through a recovery until
    /// `deadline`. Past it, [`Error::ConnectionLost`] with `may_have_arrived`.
    pub(crate) async fn connection(
        &self,
        deadline: Instant,
        may_have_arrived: bool,
    ) -> Result<(amqp::Connection, u64), Error> {
        let mut rx = self.state.subscribe();
        loop {
            {
                let state = rx.borrow_and_update();
                match &state.phase {
                    LinkPhase::Up => return Ok((state.conn.clone(), state.generation)),
                    LinkPhase::Down(err) => return Err(err.clone()),
                    LinkPhase::Recovering => {}
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::Closed(CloseReason::ByClient)),
                Err(_) => return Err(Error::ConnectionLost { may_have_arrived }),
            }
        }
    }

    /// Watches the link's snapshots.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Snapshot> {
        self.state.subscribe()
    }

    /// Moves the link to `phase`, on `conn` (a new generation) if given.
    /// Only the supervisor calls it.
    pub(super) fn set(&self, conn: Option<amqp::Connection>, phase: LinkPhase) {
        self.state.send_modify(|state| {
            if let Some(conn) = conn {
                conn.refuse_raw();
                state.conn = conn;
                state.generation += 1;
            }
            state.phase = phase;
        });
    }
}
