//! Deadlines for tests: a test that hangs fails, naming itself and what it
//! was waiting for, instead of running until CI gives up.
//!
//! [`deadline`] wraps a test's body. A watchdog thread measures the limit in
//! real time, so a test on a paused tokio clock (where a hundred virtual
//! seconds pass in a millisecond) is held to the same wall-clock limit as any
//! other. When the limit passes, the watchdog wakes the test, which then
//! panics with its name and its open [`waiting_for`] labels. If the test
//! cannot be woken (its thread is blocked outside async code), the watchdog
//! prints the same message straight to stderr and aborts the process, so
//! even that hang ends as a failure.
//!
//! The limit is [`DEFAULT_LIMIT`], or `ACEMQ_TEST_DEADLINE` seconds when that
//! is set. Nothing here reads a tokio clock or touches a broker.
//!
//! One file, test support only and never part of acemq-memory's API:
//! acemq-memory's integration tests have it as `common::deadline`, its
//! no-panic unit tests as `crate::deadline`, and the workspace's tests crate
//! as `acemq_tests::deadline` (each includes this file by path).

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long a test may run when `ACEMQ_TEST_DEADLINE` does not say.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(180);

/// How long the watchdog waits, after waking an expired test, for it to
/// fail by itself before aborting the process.
const GRACE: Duration = Duration::from_secs(15);

/// The limit from `ACEMQ_TEST_DEADLINE` (seconds), or [`DEFAULT_LIMIT`].
pub fn limit() -> Duration {
    std::env::var("ACEMQ_TEST_DEADLINE")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(DEFAULT_LIMIT, Duration::from_secs)
}

/// Runs `body` under [`limit()`]; see the module docs. Inside another
/// deadline (a [`deadline_blocking`] test that builds its own runtime), it
/// shares that one's watchdog and limit.
pub fn deadline<F: Future>(body: F) -> Deadline<F> {
    deadline_of(limit(), body)
}

/// Runs `body` under `limit` (or the enclosing deadline's); see [`deadline`].
pub fn deadline_of<F: Future>(limit: Duration, body: F) -> Deadline<F> {
    let (watch, owner) = current_or_new(limit);
    Deadline {
        body: Box::pin(body),
        watch,
        owner,
    }
}

/// Runs a test that is not async (one that builds its own runtimes) under
/// [`limit()`]. Deadlines awaited inside it share its limit, so when it
/// passes, the one being awaited fails with the labels; a test blocked
/// outside async code is aborted with them.
pub fn deadline_blocking<T>(body: impl FnOnce() -> T) -> T {
    let (watch, owner) = current_or_new(limit());
    let _finish = Finish { watch: &watch, owner };
    let _enter = Enter::new(&watch);
    body()
}

/// The deadline this thread runs under, or a new one with its watchdog
/// (then `true`: the caller owns it and ends it).
fn current_or_new(limit: Duration) -> (Arc<Watch>, bool) {
    if let Some(watch) = CURRENT.with(|c| c.borrow().clone()) {
        return (watch, false);
    }
    let test = std::thread::current().name().unwrap_or("<unnamed test>").to_owned();
    let watch = Arc::new(Watch {
        test,
        limit,
        state: Mutex::new(WatchState::default()),
        done: Condvar::new(),
    });
    let watchdog = watch.clone();
    std::thread::Builder::new()
        .name(format!("deadline of {}", watch.test))
        .spawn(move || watchdog.run())
        .expect("a watchdog thread starts");
    (watch, true)
}

/// Makes `watch` this thread's deadline until dropped (also when unwinding).
struct Enter {
    previous: Option<Arc<Watch>>,
}

impl Enter {
    fn new(watch: &Arc<Watch>) -> Enter {
        Enter {
            previous: CURRENT.with(|c| c.replace(Some(watch.clone()))),
        }
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| c.replace(previous));
    }
}

/// Tells the watchdog the test is over, if this deadline owns it.
struct Finish<'a> {
    watch: &'a Watch,
    owner: bool,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        if self.owner {
            self.watch.lock().finished = true;
            self.watch.done.notify_all();
        }
    }
}

/// Labels what the test is waiting for until the guard is dropped. Labels
/// nest; the message of an expired deadline lists the open ones, oldest
/// first. Outside a [`deadline`] (or in a spawned task) it does nothing.
pub fn waiting_for(what: impl Into<String>) -> Waiting {
    let watch = CURRENT.with(|c| c.borrow().clone());
    let mut id = 0;
    if let Some(watch) = &watch {
        let mut state = watch.lock();
        state.next_label += 1;
        id = state.next_label;
        state.labels.push((id, what.into()));
    }
    Waiting { watch, id }
}

/// Awaits `fut` with `what` as its [`waiting_for`] label.
pub async fn step<F: Future>(what: impl Into<String>, fut: F) -> F::Output {
    let _label = waiting_for(what);
    fut.await
}

/// The guard of a [`waiting_for`] label.
#[must_use = "the label is removed when the guard is dropped"]
pub struct Waiting {
    watch: Option<Arc<Watch>>,
    id: u64,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting").finish_non_exhaustive()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(watch) = &self.watch {
            // By id: a guard moved elsewhere may outlive one made after it.
            watch.lock().labels.retain(|(id, _)| *id != self.id);
        }
    }
}

/// A test body under a deadline; see [`deadline`].
#[must_use = "a deadline does nothing unless awaited"]
pub struct Deadline<F> {
    body: Pin<Box<F>>,
    watch: Arc<Watch>,
    /// Whether this deadline started the watchdog (and so ends it).
    owner: bool,
}

impl<F> std::fmt::Debug for Deadline<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadline")
            .field("test", &self.watch.test)
            .field("limit", &self.watch.limit)
            .finish_non_exhaustive()
    }
}

impl<F: Future> Future for Deadline<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let watch = self.watch.clone();
        {
            let mut state = watch.lock();
            if state.expired {
                let message = watch.message(&state.labels);
                // Failing now: the watchdog need not abort.
                state.finished = true;
                drop(state);
                watch.done.notify_all();
                panic!("{message}");
            }
            state.waker = Some(cx.waker().clone());
        }
        let _enter = Enter::new(&watch);
        self.body.as_mut().poll(cx)
    }
}

impl<F> Drop for Deadline<F> {
    fn drop(&mut self) {
        drop(Finish {
            watch: &self.watch,
            owner: self.owner,
        });
    }
}

thread_local! {
    /// The deadline whose body this thread is polling.
    static CURRENT: std::cell::RefCell<Option<Arc<Watch>>> = const { std::cell::RefCell::new(None) };
}

struct Watch {
    test: String,
    limit: Duration,
    state: Mutex<WatchState>,
    done: Condvar,
}

#[derive(Default)]
struct WatchState {
    labels: Vec<(u64, String)>,
    next_label: u64,
    waker: Option<Waker>,
    expired: bool,
    finished: bool,
}

impl Watch {
    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        // A panicking test poisons nothing worth refusing.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn message(&self, labels: &[(u64, String)]) -> String {
        let waiting = if labels.is_empty() {
            "nothing named (label the wait with deadline::waiting_for)".to_owned()
        } else {
            let names: Vec<&str> = labels.iter().map(|(_, name)| name.as_str()).collect();
            names.join(" > ")
        };
        format!(
            "DEADLINE: test `{}` did not finish within {:?}; it was waiting for: {waiting}",
            self.test, self.limit
        )
    }

    /// The watchdog: sleeps until the limit, then wakes the test, then
    /// aborts if the test does not fail by itself.
    fn run(&self) {
        let start = Instant::now();
        let mut state = self.lock();
        while !state.finished {
            let Some(left) = self.limit.checked_sub(start.elapsed()) else {
                break;
            };
            state = self.done.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        if state.finished {
            return;
        }
        state.expired = true;
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
        let woken = Instant::now();
        while !state.finished {
            let Some(left) = GRACE.checked_sub(woken.elapsed()) else {
                break;
            };
            state = self.done.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        if state.finished {
            return;
        }
        // Straight to the file descriptor: the test harness captures
        // `eprintln!`, and an aborted process prints nothing it captured.
        let message = format!(
            "{} (and it did not wake within {GRACE:?}: aborting)\n",
            self.message(&state.labels)
        );
        let _ = std::io::stderr().write_all(message.as_bytes());
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: Future>(fut: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(fut)
    }

    #[test]
    fn a_body_that_finishes_in_time_returns_its_value() {
        assert_eq!(block_on(deadline_of(Duration::from_secs(5), async { 7 })), 7);
    }

    #[test]
    fn a_hang_fails_naming_the_test_and_what_it_waited_for() {
        let panic = std::panic::catch_unwind(|| {
            block_on(deadline_of(Duration::from_millis(200), async {
                let _outer = waiting_for("the broker");
                step("a reply that never comes", std::future::pending::<()>()).await
            }))
        })
        .unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("a_hang_fails_naming_the_test_and_what_it_waited_for"),
            "{message}"
        );
        assert!(
            message.contains("waiting for: the broker > a reply that never comes"),
            "{message}"
        );
    }

    #[test]
    fn the_limit_is_real_time_even_on_a_paused_clock() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        // An hour of virtual time passes in no real time, well within the limit.
        runtime.block_on(deadline_of(Duration::from_secs(5), async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }));
    }

    #[test]
    fn a_runtime_inside_a_blocking_deadline_fails_with_its_labels() {
        let panic = std::panic::catch_unwind(|| {
            std::thread::Builder::new()
                .name("outer_test".into())
                .spawn(|| {
                    let watch = Arc::new(Watch {
                        test: "outer_test".into(),
                        limit: Duration::from_millis(200),
                        state: Mutex::new(WatchState::default()),
                        done: Condvar::new(),
                    });
                    let watchdog = watch.clone();
                    std::thread::spawn(move || watchdog.run());
                    let _finish = Finish {
                        watch: &watch,
                        owner: true,
                    };
                    let _enter = Enter::new(&watch);
                    // What `deadline_blocking` does, with a short limit.
                    block_on(deadline(step("on the second broker", std::future::pending::<()>())))
                })
                .unwrap()
                .join()
                .map_err(|p| p.downcast_ref::<String>().cloned())
        })
        .unwrap();
        let message = panic.unwrap_err().unwrap();
        assert!(message.contains("`outer_test`"), "{message}");
        assert!(message.contains("waiting for: on the second broker"), "{message}");
    }

    #[test]
    fn labels_close_with_their_guards() {
        let panic = std::panic::catch_unwind(|| {
            block_on(deadline_of(Duration::from_millis(200), async {
                step("done already", async {}).await;
                std::future::pending::<()>().await
            }))
        })
        .unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(message.contains("waiting for: nothing named"), "{message}");
    }
}
