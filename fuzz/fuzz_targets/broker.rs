#![no_main]

//! Arbitrary client bytes into the broker machine (acemq-memory): with or
//! without a valid handshake first, chunked, with clock jumps, alarms and
//! forced closes in between. Nothing may panic.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| acemq_memory::fuzzing::client_bytes(data));
