//! Where publish confirms wait for the broker: one slab of entries per
//! connection, instead of a `oneshot` (an allocation, its reference counts
//! and the runtime's budget check) per message.
//!
//! An entry has two owners. The publish's [`Ticket`] travels with its
//! command to the driver, which settles it once the broker has spoken; the
//! [`PublishConfirm`](super::PublishConfirm) holds its [`Claim`] and takes
//! the outcome. The entry is free again only once both are done, so an index
//! is never reused while either side still holds it:
//!
//! | entry | driver holds the ticket | driver has settled |
//! |---|---|---|
//! | claim held | `Waiting` (a waker, maybe) | `Done` (the outcome) |
//! | claim dropped | `Abandoned` | free |
//!
//! When the driver ends, the book is closed: a claim still waiting then
//! fails (a ticket dropped with its queued command, or with the driver
//! after a panic, is never settled; the close stands in for it).

use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use super::{Confirmation, Error};

/// The driver's half of an entry: settle it exactly once.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Ticket(u32);

/// The waiting future's half of an entry.
#[derive(Debug)]
pub(crate) struct Claim(u32);

type Outcome = Result<Confirmation, Error>;

enum Entry {
    Free,
    Waiting(Option<Waker>),
    Done(Outcome),
    Abandoned,
}

#[derive(Default)]
struct Slab {
    entries: Vec<Entry>,
    free: Vec<u32>,
    closed: bool,
}

impl Slab {
    fn release(&mut self, index: u32) {
        self.entries[index as usize] = Entry::Free;
        self.free.push(index);
    }

    /// Settles one entry; the waker to wake (outside the lock) if any.
    fn settle(&mut self, Ticket(index): Ticket, outcome: Outcome) -> Option<Waker> {
        let entry = &mut self.entries[index as usize];
        match std::mem::replace(entry, Entry::Done(outcome)) {
            Entry::Waiting(waker) => waker,
            Entry::Abandoned => {
                self.release(index);
                None
            }
            Entry::Free | Entry::Done(_) => {
                debug_assert!(false, "an entry settled twice");
                None
            }
        }
    }
}

/// The slab (see the module docs).
#[derive(Default)]
pub(crate) struct Book {
    slab: Mutex<Slab>,
}

impl std::fmt::Debug for Book {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slab = self.lock();
        f.debug_struct("Book")
            .field("entries", &slab.entries.len())
            .field("free", &slab.free.len())
            .field("closed", &slab.closed)
            .finish()
    }
}

impl Book {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slab> {
        // No code panics under this lock; a poisoned one is still whole.
        self.slab.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new entry, waiting.
    pub(crate) fn open(&self) -> (Ticket, Claim) {
        let mut slab = self.lock();
        let index = match slab.free.pop() {
            Some(index) => {
                slab.entries[index as usize] = Entry::Waiting(None);
                index
            }
            None => {
                let index = u32::try_from(slab.entries.len()).expect("fewer than 2^32 confirms outstanding");
                slab.entries.push(Entry::Waiting(None));
                index
            }
        };
        (Ticket(index), Claim(index))
    }

    /// An entry whose command never left: both halves at once.
    pub(crate) fn forget(&self, ticket: Ticket, claim: Claim) {
        debug_assert_eq!(ticket.0, claim.0);
        self.lock().release(claim.0);
    }

    /// The driver settles one entry.
    pub(crate) fn settle(&self, ticket: Ticket, outcome: Outcome) {
        let waker = self.lock().settle(ticket, outcome);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The driver settles many under one lock; `wake` collects the wakers
    /// (empty on return) to wake once the lock is let go.
    pub(crate) fn settle_all(&self, settled: impl IntoIterator<Item = (Ticket, Outcome)>, wake: &mut Vec<Waker>) {
        {
            let mut slab = self.lock();
            for (ticket, outcome) in settled {
                wake.extend(slab.settle(ticket, outcome));
            }
        }
        for waker in wake.drain(..) {
            waker.wake();
        }
    }

    /// The driver fails many with one error (their channel or connection
    /// is gone), as [`Book::settle_all`] does.
    pub(crate) fn fail_all(&self, tickets: impl IntoIterator<Item = Ticket>, error: &Error, wake: &mut Vec<Waker>) {
        self.settle_all(tickets.into_iter().map(|ticket| (ticket, Err(error.clone()))), wake);
    }

    /// The outcome once settled; `Ready(None)` if the book closed first.
    /// A claim that has returned `Ready` is spent: drop it.
    pub(crate) fn poll(&self, claim: &Claim, cx: &mut Context<'_>) -> Poll<Option<Outcome>> {
        let mut slab = self.lock();
        let closed = slab.closed;
        let index = claim.0;
        let entry = &mut slab.entries[index as usize];
        match entry {
            Entry::Done(_) => {
                let Entry::Done(outcome) = std::mem::replace(entry, Entry::Free) else {
                    unreachable!("matched above")
                };
                slab.free.push(index);
                Poll::Ready(Some(outcome))
            }
            Entry::Waiting(_) if closed => {
                // The driver may still hold the ticket: the entry stays taken.
                *entry = Entry::Abandoned;
                Poll::Ready(None)
            }
            Entry::Waiting(waker) => {
                match waker {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            Entry::Free | Entry::Abandoned => Poll::Ready(None),
        }
    }

    /// The claim is dropped before it took its outcome (or after).
    pub(crate) fn abandon(&self, claim: Claim) {
        let mut slab = self.lock();
        let index = claim.0;
        match slab.entries[index as usize] {
            Entry::Waiting(_) => slab.entries[index as usize] = Entry::Abandoned,
            Entry::Done(_) => slab.release(index),
            Entry::Free | Entry::Abandoned => {}
        }
    }

    /// The driver is gone: every claim still waiting hears it.
    pub(crate) fn close(&self) {
        let wakers: Vec<Waker> = {
            let mut slab = self.lock();
            slab.closed = true;
            slab.entries
                .iter_mut()
                .filter_map(|entry| match entry {
                    Entry::Waiting(waker) => waker.take(),
                    _ => None,
                })
                .collect()
        };
        for waker in wakers {
            waker.wake();
        }
    }

    /// Entries in the slab, free or not (for the tests of its bound).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn poll_once(book: &Book, claim: &Claim) -> Poll<Option<Outcome>> {
        let waker = Waker::noop();
        book.poll(claim, &mut Context::from_waker(waker))
    }

    #[test]
    fn an_outcome_settled_before_the_poll_is_taken_once_and_frees_the_entry() {
        let book = Book::default();
        let (ticket, claim) = book.open();
        book.settle(ticket, Ok(Confirmation::Nack));
        assert!(matches!(
            poll_once(&book, &claim),
            Poll::Ready(Some(Ok(Confirmation::Nack)))
        ));
        // Spent: the entry is free and the next publish takes it.
        let (ticket, claim2) = book.open();
        assert_eq!(ticket, Ticket(claim.0));
        book.settle(ticket, Ok(Confirmation::Ack));
        assert!(matches!(
            poll_once(&book, &claim2),
            Poll::Ready(Some(Ok(Confirmation::Ack)))
        ));
        assert_eq!(book.capacity(), 1);
    }

    #[tokio::test]
    async fn a_waiting_claim_is_woken_by_a_settle_from_another_task() {
        let book = Arc::new(Book::default());
        let (ticket, claim) = book.open();
        let waiter = {
            let book = book.clone();
            tokio::spawn(async move { std::future::poll_fn(|cx| book.poll(&claim, cx)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        book.settle_all([(ticket, Ok(Confirmation::Ack))], &mut Vec::new());
        let outcome = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken within 5 s")
            .unwrap();
        assert!(matches!(outcome, Some(Ok(Confirmation::Ack))));
    }

    #[tokio::test]
    async fn closing_the_book_fails_every_waiting_claim_and_nothing_settled() {
        let book = Arc::new(Book::default());
        let (settled, settled_claim) = book.open();
        let (_lost, lost_claim) = book.open();
        book.settle(settled, Ok(Confirmation::Ack));
        let waiter = {
            let book = book.clone();
            tokio::spawn(async move { std::future::poll_fn(|cx| book.poll(&lost_claim, cx)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        book.close();
        let outcome = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken within 5 s")
            .unwrap();
        assert!(outcome.is_none(), "a claim never settled fails once the book closes");
        // What was settled before the close is still there to take.
        assert!(matches!(
            poll_once(&book, &settled_claim),
            Poll::Ready(Some(Ok(Confirmation::Ack)))
        ));
    }

    #[test]
    fn an_entry_is_reused_only_once_both_halves_are_done() {
        let book = Book::default();
        // Abandoned first, settled after: free only after the settle.
        let (ticket, claim) = book.open();
        let ticket_index = ticket.0;
        book.abandon(claim);
        let (other, other_claim) = book.open();
        assert_ne!(
            other,
            Ticket(ticket.0),
            "an abandoned entry the driver holds is not reused"
        );
        book.settle(ticket, Ok(Confirmation::Ack));
        // Settled first, abandoned after: free only after the abandon.
        book.settle(other, Ok(Confirmation::Ack));
        let (third, third_claim) = book.open();
        assert_ne!(third.0, other_claim.0);
        assert_eq!(third.0, ticket_index, "the entry freed by the settle is the one reused");
        book.abandon(other_claim);
        book.forget(third, third_claim);
        assert_eq!(book.capacity(), 2);
        // Both entries are free: two publishes reuse them, a third grows it.
        let opened: Vec<_> = (0..2).map(|_| book.open()).collect();
        assert_eq!(book.capacity(), 2);
        let _third = book.open();
        assert_eq!(book.capacity(), 3);
        drop(opened);
    }

    #[test]
    fn the_slab_stays_as_large_as_the_most_confirms_outstanding() {
        let book = Book::default();
        let mut window = std::collections::VecDeque::new();
        for n in 0..100_000u32 {
            if window.len() == 1000 {
                let (ticket, claim): (Ticket, Claim) = window.pop_front().unwrap();
                book.settle(ticket, Ok(Confirmation::Ack));
                assert!(matches!(poll_once(&book, &claim), Poll::Ready(Some(Ok(_)))));
            }
            let (ticket, claim) = book.open();
            // Every tenth confirm's future is dropped unpolled.
            if n % 10 == 0 {
                book.abandon(claim);
                book.settle(ticket, Ok(Confirmation::Ack));
            } else {
                window.push_back((ticket, claim));
            }
        }
        assert!(book.capacity() <= 1001, "slab grew to {}", book.capacity());
    }
}
