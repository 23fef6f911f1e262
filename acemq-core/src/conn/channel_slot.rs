//! `ChannelSlot`: one of the publishing connection's channels (the
//! application's, or the library's always-confirmed one) kept open: reopened
//! when the broker closes it (a refused publish closes the channel it was
//! on), and on the new connection after a recovery.
//!
//! A slot never waits for a recovery on its own account, and never holds
//! its lock across a wait for the link: the supervisor takes that lock to
//! reopen the channel before it says the link is up.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use acemq_codec::{BasicProperties, BasicPublish};
use bytes::Bytes;
use tokio::time::Instant;

use super::link::Link;
use crate::amqp;
use crate::error::Error;

/// A channel that is reopened when the broker closes it (a refused publish
/// closes the channel it was on), or on the new connection after a recovery.
pub(crate) struct ChannelSlot {
    confirm: bool,
    current: RwLock<amqp::Channel>,
    reopen: tokio::sync::Mutex<()>,
}

impl ChannelSlot {
    pub(crate) async fn open(conn: &amqp::Connection, confirm: bool) -> Result<ChannelSlot, Error> {
        let channel = Self::fresh(conn, confirm).await?;
        Ok(ChannelSlot {
            confirm,
            current: RwLock::new(channel),
            reopen: tokio::sync::Mutex::new(()),
        })
    }

    async fn fresh(conn: &amqp::Connection, confirm: bool) -> Result<amqp::Channel, Error> {
        let channel = conn.channel().await?;
        if confirm {
            channel.confirm_select().await?;
        }
        Ok(channel)
    }

    fn current(&self) -> amqp::Channel {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Publishes on the current channel if that can be done at once: the
    /// channel open, room in the publish buffer. Takes no handle of the
    /// channel and reads no clock: the common case of a send. `None` when
    /// it cannot be done now; then nothing was published.
    pub(crate) fn publish_now(
        &self,
        publish: &BasicPublish,
        properties: &Arc<BasicProperties>,
        body: &Bytes,
    ) -> Option<amqp::PublishConfirm> {
        let channel = self.current.read().unwrap_or_else(|p| p.into_inner());
        if !channel.is_open() {
            return None;
        }
        channel.publish_shared(publish, properties, body).queued()
    }

    /// The channel, reopened first if the broker closed it; while `link`
    /// recovers, waits for it (at most `timeout`; `written` says whether the
    /// message waiting may already have arrived).
    pub(crate) async fn get(&self, link: &Link, timeout: Duration, written: bool) -> Result<amqp::Channel, Error> {
        let channel = self.current();
        if channel.is_open() {
            return Ok(channel);
        }
        // Not under the lock: the supervisor takes it to reopen the channel
        // on the new connection before it says the link is up.
        let (conn, _) = link.connection(Instant::now() + timeout, written).await?;
        let _one_at_a_time = self.reopen.lock().await;
        let channel = self.current();
        if channel.is_open() {
            return Ok(channel);
        }
        let channel = Self::fresh(&conn, self.confirm).await?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = channel.clone();
        Ok(channel)
    }

    /// Opens the channel on `conn`, a connection recovery has just dialled.
    pub(crate) async fn reopen_on(&self, conn: &amqp::Connection) -> Result<(), Error> {
        let _one_at_a_time = self.reopen.lock().await;
        let channel = Self::fresh(conn, self.confirm).await?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = channel;
        Ok(())
    }
}
