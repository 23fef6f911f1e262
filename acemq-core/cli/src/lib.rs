//! acemq-cli: the library behind the `acemq` binary; its conformance tools
//! for other programs. [`conformance::check`] runs a catalogue of RabbitMQ
//! behaviours against any AMQP 0-9-1 broker and judges each reply against
//! RabbitMQ 3.10's or 4.0's (`acemq conformance check`);
//! [`conformance::diff`] runs random operation sequences on two brokers and
//! says where they answer differently (`acemq conformance diff`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conformance;
// How the binary and the conformance tools print values and make text safe
// for a terminal; shared with the binary, not an API.
#[doc(hidden)]
pub mod render;
