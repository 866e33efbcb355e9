//! The running-task limit (`--max-running-tasks`).
//!
//! A task needs a slot while it works: claiming, stepping, committing (all but its last
//! commit, which it waits for without one: nothing is left for it to compute). Tasks beyond the limit
//! wait in a queue as plain entries, holding no tokio task, and one admitter hands each freed
//! slot to the oldest. A task whose step waits (its kind calls [`Env::pace`](super::Env::pace))
//! gives its slot back for the wait and takes one again after, so tasks that mostly wait (I/O
//! bound work) all make progress however many there are, while tasks that compute never run
//! more than the limit at once.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

tokio::task_local! {
    /// The slot of the worker running on this tokio task. A task-local because [`released`] is
    /// reached from deep inside a kind's step, which knows nothing of slots.
    static HELD: Held;
}

struct Held {
    slots: Arc<Semaphore>,
    /// `None` while given back.
    permit: RefCell<Option<OwnedSemaphorePermit>>,
    /// Given back by [`give_back`], for the worker's last commit: a [`released`] wait after it
    /// takes a slot again all the same.
    owed: Cell<bool>,
}

/// Runs `work` holding `permit`, which [`released`] may give back for a while.
///
/// Not an `async fn`: one would keep `work` twice, as its argument and inside the scope it
/// awaits (rustc lays both out in its state), and a worker's future is the size of its whole
/// run, kilobytes, held by every running task.
pub(super) fn holding<F: Future>(
    slots: Arc<Semaphore>,
    permit: OwnedSemaphorePermit,
    work: F,
) -> impl Future<Output = F::Output> {
    let held = Held {
        slots,
        permit: RefCell::new(Some(permit)),
        owed: Cell::new(false),
    };
    HELD.scope(held, work)
}

/// Runs `wait` without this worker's slot (if it holds one, or gave it back through
/// [`give_back`]), and takes a slot again after. Of two waits at once in one step, only the one
/// that gave the slot back takes one again: a worker never holds two.
pub(super) async fn released<F: Future>(wait: F) -> F::Output {
    let slots = HELD
        .try_with(|held| {
            // Dropping the permit gives the slot back.
            let had = held.permit.borrow_mut().take().is_some();
            (had || held.owed.replace(false)).then(|| held.slots.clone())
        })
        .ok()
        .flatten();
    let output = wait.await;
    if let Some(slots) = slots
        && let Ok(permit) = slots.acquire_owned().await
    {
        HELD.with(|held| *held.permit.borrow_mut() = Some(permit));
    }
    output
}

/// Gives this worker's slot back for the rest of its run: what is left is waiting for its
/// last commit, which computes nothing, and the next task need not wait for it. A worker that
/// goes on after all (the commit failed, and it waits to claim the task again through
/// [`released`]) takes a slot again there.
pub(super) fn give_back() {
    let _ = HELD.try_with(|held| {
        if held.permit.borrow_mut().take().is_some() {
            held.owed.set(true);
        }
    });
}

/// Tasks waiting for a slot, oldest first.
pub(super) struct Queue<T> {
    slots: Arc<Semaphore>,
    waiting: Mutex<VecDeque<T>>,
    added: Notify,
}

impl<T> Queue<T> {
    pub(super) fn new(limit: usize) -> Self {
        Queue {
            slots: Arc::new(Semaphore::new(limit.max(1))),
            waiting: Mutex::default(),
            added: Notify::new(),
        }
    }

    pub(super) fn slots(&self) -> &Arc<Semaphore> {
        &self.slots
    }

    /// A slot at once if one is free and nobody waits for it.
    pub(super) fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        let waiting = self.waiting.lock().expect("slot queue lock");
        Self::free_slot(&waiting, &self.slots)
    }

    fn free_slot(waiting: &VecDeque<T>, slots: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
        if !waiting.is_empty() {
            return None;
        }
        slots.clone().try_acquire_owned().ok()
    }

    /// A slot at once if one is free and nobody waits for it, else `item` queues.
    pub(super) fn admit_or_queue(&self, item: T) -> Option<(T, OwnedSemaphorePermit)> {
        let mut waiting = self.waiting.lock().expect("slot queue lock");
        if let Some(permit) = Self::free_slot(&waiting, &self.slots) {
            return Some((item, permit));
        }
        waiting.push_back(item);
        drop(waiting);
        self.added.notify_one();
        None
    }

    pub(super) fn len(&self) -> usize {
        self.waiting.lock().expect("slot queue lock").len()
    }

    /// Hands each freed slot to the oldest queued item (through `start`) until `shutdown`.
    pub(super) async fn run_admitter(
        &self,
        shutdown: CancellationToken,
        mut start: impl FnMut(T, OwnedSemaphorePermit),
    ) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.added.notified() => {}
            }
            while self.len() > 0 {
                let permit = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    permit = self.slots.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                };
                let next = self.waiting.lock().expect("slot queue lock").pop_front();
                match next {
                    Some(item) => start(item, permit),
                    None => break,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The one slot there is, taken by a worker.
    fn one_slot_taken() -> (Arc<Semaphore>, OwnedSemaphorePermit) {
        let slots = Arc::new(Semaphore::new(1));
        let permit = slots.clone().try_acquire_owned().expect("a free slot");
        (slots, permit)
    }

    /// `work`'s output, which a worker waiting for a slot that never comes would not give.
    async fn in_time<F: Future>(work: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(5), work)
            .await
            .expect("the worker ends in time")
    }

    #[tokio::test]
    async fn a_waiting_worker_lends_its_slot_and_takes_one_back() {
        let queue = Queue::<u32>::new(1);
        let (first, permit) = queue.admit_or_queue(1).expect("a free slot");
        assert_eq!(first, 1);
        assert!(queue.admit_or_queue(2).is_none(), "the only slot is taken");
        let slots = queue.slots().clone();
        in_time(holding(slots.clone(), permit, async {
            released(async {
                assert_eq!(slots.available_permits(), 1, "given back while waiting");
                tokio::time::sleep(Duration::from_millis(10)).await;
            })
            .await;
            assert_eq!(slots.available_permits(), 0, "taken again after the wait");
        }))
        .await;
        assert_eq!(
            slots.available_permits(),
            1,
            "returned when the worker ends"
        );
        assert_eq!(queue.len(), 1);
    }

    /// A worker that gave its slot back for its last commit, which then failed, takes a slot
    /// again when it waits to claim the task anew: it would otherwise work on without one.
    #[tokio::test]
    async fn a_worker_that_gave_its_slot_back_takes_one_again_after_a_wait() {
        let (slots, permit) = one_slot_taken();
        in_time(holding(slots.clone(), permit, async {
            give_back();
            assert_eq!(slots.available_permits(), 1, "given back");
            released(tokio::task::yield_now()).await;
            assert_eq!(slots.available_permits(), 0, "taken again after the wait");
        }))
        .await;
        assert_eq!(slots.available_permits(), 1);
    }

    /// Two waits at once in one step (a kind that paces two things together) give the one slot
    /// back once and take one slot again, not two: taking a second, the worker would wait for
    /// its own slot for ever.
    #[tokio::test]
    async fn two_waits_at_once_take_one_slot_again() {
        let (slots, permit) = one_slot_taken();
        in_time(holding(slots.clone(), permit, async {
            tokio::join!(
                released(tokio::time::sleep(Duration::from_millis(10))),
                released(tokio::time::sleep(Duration::from_millis(20))),
            );
            assert_eq!(slots.available_permits(), 0, "one slot taken again");
        }))
        .await;
        assert_eq!(slots.available_permits(), 1);
    }

    #[tokio::test]
    async fn queued_items_start_in_order_as_slots_free() {
        let queue = Arc::new(Queue::<u32>::new(1));
        let (_, permit) = queue.admit_or_queue(0).unwrap();
        for item in 1..=3 {
            assert!(queue.admit_or_queue(item).is_none());
        }
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let admitter = {
            let (queue, shutdown) = (queue.clone(), shutdown.clone());
            tokio::spawn(async move {
                queue
                    .run_admitter(shutdown, |item, permit| {
                        started_tx.send((item, permit)).unwrap();
                    })
                    .await
            })
        };
        drop(permit);
        let mut order = Vec::new();
        for _ in 1..=3 {
            let (item, permit) = tokio::time::timeout(Duration::from_secs(5), started.recv())
                .await
                .expect("admitted in time")
                .unwrap();
            assert!(
                started.try_recv().is_err(),
                "one slot: nothing else starts while {item} holds it"
            );
            order.push(item);
            drop(permit);
        }
        assert_eq!(order, [1, 2, 3]);
        shutdown.cancel();
        admitter.await.unwrap();
    }
}
