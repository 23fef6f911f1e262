//! Small helpers for waiting on `tokio::time`, so that tests on a paused
//! clock control every wait. No protocol knowledge here.

use tokio::time::Instant;

/// Sleeps until `deadline`, or for ever when there is none: the arm of a
/// `select!` whose timer may not be running.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
