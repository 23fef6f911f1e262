//! Protocol bookkeeping both peers need: content assembly (with the frame
//! decoder's step that decodes straight into an assembler,
//! [`FrameDecoder::decode_assembled`](crate::FrameDecoder::decode_assembled)),
//! publisher confirms, return pairing and the blocked state.
//!
//! Everything here is a pure function of frames (or, for that one step, of
//! a frame's bytes): no clock, no IO, no allocation sized by the peer's
//! word (that step reserves room for a frame only once its size has passed
//! `frame_max`, as the decoder does). It imports `frame`; `frame` must
//! never import it.

mod blocked;
mod confirms;
mod content;
mod decode;
mod returns;

pub use blocked::{Blocked, BlockedChange};
pub use confirms::{ConfirmError, Confirms, Outcome};
pub use content::{AssembleError, Assembly, Content, ContentAssembler, ContentError, Decoded, DEFAULT_MAX_BODY};
pub use returns::{ReturnKey, ReturnMatch, Returns};
