//! Each owner's count of unfinished tasks, for the per-owner limit, kept in memory.
//!
//! Only this process's writer changes the tasks (see the module docs of `sqlite`), so it sees
//! every change that moves a task into or out of the unfinished statuses, and knows the counts
//! without a table. With one (`owner_load`, schema versions 10 to 12), a task's insert read
//! and wrote it and its last commit wrote it again: two statements and a lookup for each task,
//! about 15,000 of the 650,000 instructions of a `start_*` call (callgrind, the profile bench's
//! `start-load`). The counts are taken from the tasks at open, through the status index, which
//! costs one lookup per unfinished task.
//!
//! A write changes the counts as it changes the tasks, inside its batch's transaction, and
//! those changes count only once that transaction commits: [`OwnerLoad::mark`] and
//! [`OwnerLoad::undo_to`] drop a failed write's own changes, [`OwnerLoad::settle`] applies or
//! drops the batch's.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;

use crate::store::StoreError;

/// The counts, shared by the writer and the store's readers of them. Each method holds the
/// lock for a map operation only.
#[derive(Debug, Default)]
pub(super) struct OwnerLoad(Mutex<Counts>);

#[derive(Debug, Default)]
struct Counts {
    committed: HashMap<String, u64>,
    /// The changes of the batch being written, in order, applied when it commits. A batch
    /// holds at most a few hundred writes, so a look through it is cheaper than a second map.
    batch: Vec<(String, i64)>,
}

impl OwnerLoad {
    /// The counts the tasks stored through `conn` give.
    pub(super) fn load(conn: &Connection) -> Result<OwnerLoad, StoreError> {
        // One status at a time, so that each is a range of `tasks_by_status`.
        let mut stmt =
            conn.prepare("SELECT owner, count(*) FROM tasks WHERE status = ?1 GROUP BY owner")?;
        let mut committed = HashMap::<String, u64>::new();
        for status in ["pending", "running", "paused", "input_required"] {
            let rows = stmt.query_map([status], |row| Ok((row.get(0)?, row.get(1)?)))?;
            for row in rows {
                let (owner, count): (String, u64) = row?;
                *committed.entry(owner).or_default() += count;
            }
        }
        Ok(OwnerLoad(Mutex::new(Counts {
            committed,
            batch: Vec::new(),
        })))
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.0.lock().expect("owner load lock")
    }

    /// `owner`'s unfinished tasks, counting the changes of the batch being written.
    pub(super) fn unfinished(&self, owner: &str) -> u64 {
        let counts = self.counts();
        let pending: i64 = counts
            .batch
            .iter()
            .filter(|(changed, _)| changed == owner)
            .map(|(_, delta)| delta)
            .sum();
        counts.committed(owner).saturating_add_signed(pending)
    }

    /// `owner`'s unfinished tasks as committed.
    pub(super) fn committed(&self, owner: &str) -> u64 {
        self.counts().committed(owner)
    }

    /// Changes `owner`'s count by `delta`: +1 for a task stored unfinished, -1 for one that
    /// finished, in the write that does either, after its own statement applied.
    pub(super) fn change(&self, owner: &str, delta: i64) {
        self.counts().batch.push((owner.to_owned(), delta));
    }

    /// Where the batch's changes stand before a write runs.
    pub(super) fn mark(&self) -> usize {
        self.counts().batch.len()
    }

    /// Drops the changes made since `mark`: the write that made them was undone alone.
    pub(super) fn undo_to(&self, mark: usize) {
        self.counts().batch.truncate(mark);
    }

    /// Applies the batch's changes if its transaction `committed`, and drops them either way.
    pub(super) fn settle(&self, committed: bool) {
        let mut counts = self.counts();
        let Counts {
            committed: map,
            batch,
        } = &mut *counts;
        if !committed {
            batch.clear();
            return;
        }
        for (owner, delta) in batch.drain(..) {
            let count = map
                .get(&owner)
                .copied()
                .unwrap_or(0)
                .saturating_add_signed(delta);
            // An owner with nothing unfinished needs no entry: owners come and go.
            if count == 0 {
                map.remove(&owner);
            } else {
                map.insert(owner, count);
            }
        }
    }
}

impl Counts {
    fn committed(&self, owner: &str) -> u64 {
        self.committed.get(owner).copied().unwrap_or(0)
    }
}

/// Tasks of three owners (id, owner, status), in every status, and what each owner has
/// unfinished among them: what the counts taken at open must give, however the database was
/// made (migrated from before the counts, or written by the store).
#[cfg(test)]
pub(super) mod sample {
    pub(in crate::store::sqlite) const TASKS: [(&str, &str, &str); 7] = [
        ("a1", "a", "pending"),
        ("a2", "a", "running"),
        ("a3", "a", "completed"),
        ("b1", "b", "paused"),
        ("b2", "b", "input_required"),
        ("b3", "b", "failed"),
        ("c1", "c", "cancelled"),
    ];
    pub(in crate::store::sqlite) const UNFINISHED: [(&str, u64); 3] =
        [("a", 2), ("b", 2), ("c", 0)];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_count_once_their_batch_commits() {
        let load = OwnerLoad::default();
        load.change("ann", 1);
        load.change("ann", 1);
        assert_eq!(load.unfinished("ann"), 2, "the batch sees its own changes");
        assert_eq!(load.committed("ann"), 0, "nothing is committed yet");
        load.settle(true);
        assert_eq!(load.committed("ann"), 2);

        load.change("ann", -1);
        load.settle(false);
        assert_eq!(
            load.unfinished("ann"),
            2,
            "a batch rolled back changes nothing"
        );
    }

    #[test]
    fn a_write_undone_alone_takes_only_its_own_changes() {
        let load = OwnerLoad::default();
        load.change("ann", 1);
        let mark = load.mark();
        load.change("bob", 1);
        load.change("ann", 1);
        load.undo_to(mark);
        load.settle(true);
        assert_eq!((load.committed("ann"), load.committed("bob")), (1, 0));
    }

    #[test]
    fn an_owner_left_with_nothing_unfinished_is_forgotten() {
        let load = OwnerLoad::default();
        load.change("ann", 1);
        load.settle(true);
        load.change("ann", -1);
        load.settle(true);
        assert!(load.counts().committed.is_empty());
    }
}
