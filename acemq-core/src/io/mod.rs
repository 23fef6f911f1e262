//! Transports only: TCP, TLS with rustls, and (behind the `memory` feature)
//! the in-process duplex stream to acemq-memory. The driver task that runs
//! a connection over one of them lives with the handles it serves, in
//! `amqp`. Nothing here knows the protocol, and nothing here imports
//! `amqp` (which says what a URL it cannot reach means).

mod tls;

#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "memory")]
pub(crate) use memory::connect_memory;

pub use tls::{TlsConfig, TlsError};

use std::time::Duration;

use tokio::net::TcpStream;

/// Connects TCP to `host:port` with `TCP_NODELAY`, within `timeout`.
pub(crate) async fn connect_tcp(host: &str, port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("connecting to {host}:{port}")))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}
