#![no_main]

//! How the acemq API reads a delivery: arbitrary properties, headers, body,
//! exchange and routing key through what the consumer, `replay` and the
//! scheduler read (envelope, attempt, first seen, routing slip, original
//! destination, due time) and the copies they would publish; see
//! `acemq-core/src/fuzzing.rs` for the format and what is checked.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| acemq_core::fuzzing::delivery(data));
