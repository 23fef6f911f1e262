//! AMQP 0-9-1 methods: one struct per method, the [`Method`] enum over all of
//! them, and the table of ids in `table.rs`.

#[macro_use]
mod macros;
mod table;

pub use table::*;
