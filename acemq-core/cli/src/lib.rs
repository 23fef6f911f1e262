//! The library behind the `acemq` binary; its conformance checks for other
//! tools: [`conformance::check`] runs a catalogue of RabbitMQ behaviours
//! against any AMQP 0-9-1 broker and judges each reply against RabbitMQ
//! 3.10's or 4.0's.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conformance;
// How values are printed (shared with the binary, which has its own copy
// of the module): the library uses the terminal-safe text and JSON only.
#[allow(dead_code)]
mod render;
