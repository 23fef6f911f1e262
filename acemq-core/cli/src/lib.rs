//! acemq-cli: the library behind the `acemq` binary; its conformance tools
//! for other programs. [`conformance::diff`] runs random operation
//! sequences on two AMQP 0-9-1 brokers and says where they answer
//! differently (`acemq conformance diff`).
#![forbid(unsafe_code)]

pub mod conformance;
// How the binary and the conformance tools print values and make text safe
// for a terminal; shared with the binary, not an API.
#[doc(hidden)]
pub mod render;
