//! The in-process transport, behind the `memory` feature: a duplex stream
//! to the acemq-memory broker of a name, whose session task runs on the
//! caller's runtime. Test support only; a production build never has it.

use tokio::io::DuplexStream;

/// Connects to the in-process broker called `name` (created on first use).
pub(crate) fn connect_memory(name: &str) -> DuplexStream {
    acemq_memory::Broker::named(name).connect()
}
