//! The sans-IO protocol core: the client connection and channel machines.
//! Frames in, frames and events out, `now` passed in; no socket, clock or
//! task anywhere in here.

mod channel;
mod connection;
#[cfg(any(fuzzing, test))]
pub mod fuzzing;
mod handshake;
mod settle;
#[cfg(test)]
mod tests;
mod timer;

pub use channel::Token;
pub(crate) use connection::{goodbye, return_key};
pub use connection::{
    CallError, CloseReason, CommandError, Connection, ConnectionParams, EncodedPublishes, Event, Initiator, Refusal,
    Reply,
};
pub use handshake::{Auth, Secret, TuneRequest, Tuned, MIN_FRAME_MAX};
pub use timer::{Timeouts, Wait};
