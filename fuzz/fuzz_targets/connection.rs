#![no_main]

//! The client connection machine (acemq-core's sans-IO `proto::Connection`)
//! between a scripted application and a scripted broker: a handshake, then
//! broker frames, garbage, commands and clock jumps chosen by the input; see
//! `acemq-core/src/proto/fuzzing.rs` for the format and what is checked.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| acemq_core::proto::fuzzing::client_connection(data));
