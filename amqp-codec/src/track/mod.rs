//! Protocol bookkeeping both peers need: content assembly, publisher
//! confirms, return pairing and the blocked state.
//!
//! Everything here is a pure function of frames: no clock, no IO, no
//! allocation sized by the peer's word.

mod blocked;
mod confirms;
mod content;
pub(crate) use content::Progress;
mod returns;

pub use blocked::{Blocked, BlockedChange};
pub use confirms::{ConfirmError, Confirms, Outcome};
pub use content::{AssembleError, Assembly, Content, ContentAssembler, ContentError, Decoded, DEFAULT_MAX_BODY};
pub use returns::{ReturnKey, ReturnMatch, Returns};
