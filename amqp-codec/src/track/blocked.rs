//! `connection.blocked` / `connection.unblocked` state.
//!
//! The tracker keeps the reason; the caller, which has a clock, stamps when a
//! block began. Only transitions are reported.

use crate::method::Method;
use crate::types::ShortString;

/// A change of the blocked state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockedChange {
    /// The broker stopped reading this connection (e.g. `low on memory`).
    Blocked {
        /// The broker's reason.
        reason: ShortString,
    },
    /// The broker reads this connection again.
    Unblocked,
}

/// Whether the broker has blocked this connection, and why.
///
/// ```
/// use acemq_codec::track::{Blocked, BlockedChange};
/// use acemq_codec::{ConnectionBlocked, ConnectionUnblocked, Method};
/// let mut state = Blocked::new();
/// let blocked = Method::from(ConnectionBlocked { reason: "low on memory".into() });
/// assert!(matches!(state.handle(&blocked), Some(BlockedChange::Blocked { .. })));
/// assert_eq!(state.reason().map(|r| r.to_string()), Some("low on memory".to_string()));
/// assert_eq!(state.handle(&ConnectionUnblocked {}.into()), Some(BlockedChange::Unblocked));
/// assert!(!state.is_blocked());
/// ```
#[derive(Debug, Clone, Default)]
pub struct Blocked {
    reason: Option<ShortString>,
}

impl Blocked {
    /// Not blocked.
    pub fn new() -> Self {
        Blocked::default()
    }

    /// Whether the connection is blocked.
    pub fn is_blocked(&self) -> bool {
        self.reason.is_some()
    }

    /// Why it is blocked.
    pub fn reason(&self) -> Option<&ShortString> {
        self.reason.as_ref()
    }

    /// Looks at a channel-0 method; reports a transition if it is one. A
    /// second `blocked` while blocked updates the reason without a transition.
    pub fn handle(&mut self, method: &Method) -> Option<BlockedChange> {
        match method {
            Method::ConnectionBlocked(m) => {
                let was_blocked = self.reason.replace(m.reason.clone()).is_some();
                (!was_blocked).then(|| BlockedChange::Blocked {
                    reason: m.reason.clone(),
                })
            }
            Method::ConnectionUnblocked(_) => self.reason.take().map(|_| BlockedChange::Unblocked),
            _ => None,
        }
    }

    /// Forgets the state (the connection was lost).
    pub fn reset(&mut self) {
        self.reason = None;
    }
}
