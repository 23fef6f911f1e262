//! [`RecoveryLog`]: every [`RecoveryEvent`] a `Conn` reports, kept in order
//! for a test to wait on and inspect.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_core::{Config, RecoveryEvent};
use tokio::time::Instant;

/// Every [`RecoveryEvent`] of the `Conn`s opened with [`RecoveryLog::config`],
/// in the order they were reported. Clones share the log.
#[derive(Clone, Default)]
pub struct RecoveryLog(Arc<Mutex<Vec<RecoveryEvent>>>);

impl RecoveryLog {
    /// `config` reporting here, with quick redials for tests (50 ms, at
    /// most 400 ms apart).
    pub fn config(&self, config: Config) -> Config {
        let seen = self.0.clone();
        config
            .with_on_recovery(move |event| seen.lock().unwrap_or_else(|p| p.into_inner()).push(event))
            .with_recovery_delay(Duration::from_millis(50))
            .with_recovery_delay_max(Duration::from_millis(400))
    }

    /// A copy of the events so far.
    pub fn all(&self) -> Vec<RecoveryEvent> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many events have this [`RecoveryEvent::label`].
    pub fn count(&self, label: &str) -> usize {
        self.all().iter().filter(|e| e.label() == label).count()
    }

    /// How many `Recovered` events the connection `which` ("publish" or
    /// "consume") reported.
    pub fn recovered_on(&self, which: &str) -> usize {
        self.all()
            .iter()
            .filter(|e| matches!(e, RecoveryEvent::Recovered { which: w, .. } if *w == which))
            .count()
    }

    /// Waits until `done` holds for the events, failing the test (with
    /// every event) after `within`.
    pub async fn wait(&self, what: &str, within: Duration, done: impl Fn(&[RecoveryEvent]) -> bool) {
        self.poll(what, within, |events| done(events).then_some(())).await
    }

    /// The first event `pick` accepts (what it makes of it), waiting at
    /// most `within`.
    pub async fn first<T>(&self, what: &str, within: Duration, pick: impl Fn(&RecoveryEvent) -> Option<T>) -> T {
        self.poll(what, within, |events| events.iter().find_map(&pick)).await
    }

    async fn poll<T>(&self, what: &str, within: Duration, answer: impl Fn(&[RecoveryEvent]) -> Option<T>) -> T {
        let _label = crate::waiting_for(format!("recovery events: {what}"));
        let until = Instant::now() + within;
        loop {
            if let Some(found) = answer(&self.all()) {
                return found;
            }
            assert!(
                Instant::now() < until,
                "no {what} within {within:?}; events: {:#?}",
                self.all()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
