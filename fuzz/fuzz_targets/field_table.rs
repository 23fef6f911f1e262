#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| acemq_codec::fuzzing::field_table(data));
