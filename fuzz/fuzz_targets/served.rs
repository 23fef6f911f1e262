#![no_main]

//! Arbitrary client bytes into acemq-memory's served connection: the tokio
//! task that reads a socket, runs the session and writes its output under
//! the output limit and the write timeout, over an in-process stream on a
//! paused clock; the client reads everything, nothing, or a trickle. Nothing
//! may panic, and the broker's buffered output stays within its bound.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| acemq_memory::fuzzing::served_connection(data));
