//! How far the writer has got through its queue, and who waits for it to get further.
//!
//! Hand-written because tokio has no such primitive: a `watch` channel of the count woke every
//! waiter at every batch the writer committed, and each woken waiter (an HTTP response holding
//! a frame back, see [`super::Sqlite::fence`]) was polled again from its connection's task down
//! to find that it had to wait on: under load, a few times per frame. Here each waiter sits in a
//! heap by the count it waits for and is woken once, when that count is reached.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use tokio::sync::oneshot;

#[derive(Default)]
pub(super) struct Progress {
    /// Writes the writer has finished (committed, or failed). It takes them in the order they
    /// were placed, so a count of `n` means the first `n` placed are done.
    finished: u64,
    waiting: BinaryHeap<Waiter>,
    /// The writer has ended: nothing more will be finished, and nobody is made to wait.
    ended: bool,
}

/// Someone waiting for the first `upto` writes.
struct Waiter {
    upto: u64,
    wake: oneshot::Sender<()>,
}

impl Progress {
    /// `None` if the first `upto` writes are done (or never will be: the writer ended), else
    /// what resolves once they are.
    pub(super) fn wait_for(&mut self, upto: u64) -> Option<oneshot::Receiver<()>> {
        if self.finished >= upto || self.ended {
            return None;
        }
        let (wake, woken) = oneshot::channel();
        self.waiting.push(Waiter { upto, wake });
        Some(woken)
    }

    /// `writes` more are finished: wakes exactly those whose writes are all done now.
    pub(super) fn advance(&mut self, writes: u64) {
        self.finished += writes;
        while self
            .waiting
            .peek()
            .is_some_and(|waiter| waiter.upto <= self.finished)
        {
            let waiter = self.waiting.pop().expect("peeked");
            // A waiter that went away (its request ended) is woken for nothing.
            let _ = waiter.wake.send(());
        }
    }

    /// The writer has ended: every waiter is let go (its receiver sees the sender dropped).
    pub(super) fn end(&mut self) {
        self.ended = true;
        self.waiting.clear();
    }
}

// The heap is a max-heap: the waiter for the fewest writes compares greatest.
impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> Ordering {
        other.upto.cmp(&self.upto)
    }
}

impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.upto == other.upto
    }
}

impl Eq for Waiter {}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot::error::TryRecvError;

    use super::*;

    /// Each waiter is woken once its writes are done, and not before, whatever the order in
    /// which they began to wait.
    #[test]
    fn each_waiter_is_woken_when_its_writes_are_done_and_not_before() {
        let mut progress = Progress::default();
        let mut third = progress.wait_for(3).expect("three writes to wait for");
        let mut first = progress.wait_for(1).expect("one write to wait for");
        let mut second = progress.wait_for(2).expect("two writes to wait for");
        progress.advance(2);
        assert_eq!(first.try_recv(), Ok(()));
        assert_eq!(second.try_recv(), Ok(()));
        assert_eq!(third.try_recv(), Err(TryRecvError::Empty), "woken early");
        assert!(progress.wait_for(2).is_none(), "two writes are done");
        progress.advance(1);
        assert_eq!(third.try_recv(), Ok(()));
    }

    /// Once the writer has ended, nobody waits: those waiting are let go and later callers
    /// are not made to wait.
    #[test]
    fn the_writer_ending_lets_every_waiter_go() {
        let mut progress = Progress::default();
        let mut waiting = progress.wait_for(1).expect("a write to wait for");
        progress.end();
        assert_eq!(waiting.try_recv(), Err(TryRecvError::Closed));
        assert!(progress.wait_for(5).is_none());
    }
}
