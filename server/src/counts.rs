//! Per-key counts of what is alive now: the open streams of each session, the calls waiting
//! for each task. A key is present only while its count is above zero.

use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct Counts(Mutex<HashMap<String, usize>>);

impl Counts {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.0.lock().expect("counts lock")
    }

    pub fn add(&self, key: &str) {
        *self.map().entry(key.to_owned()).or_default() += 1;
    }

    /// One fewer under `key`; whether that was the last (decided under the lock, so of two
    /// removals at once exactly one is last).
    pub fn remove(&self, key: &str) -> bool {
        let mut map = self.map();
        let Some(count) = map.get_mut(key) else {
            return false;
        };
        *count -= 1;
        let last = *count == 0;
        if last {
            map.remove(key);
        }
        last
    }

    pub fn get(&self, key: &str) -> usize {
        self.map().get(key).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.map().values().sum()
    }

    /// The keys counted now.
    pub fn keys(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_lives_while_its_count_is_above_zero() {
        let counts = Counts::default();
        counts.add("a");
        counts.add("a");
        counts.add("b");
        assert_eq!((counts.get("a"), counts.total()), (2, 3));
        assert!(!counts.remove("a"));
        assert!(counts.remove("a"));
        assert!(!counts.remove("a"), "nothing left to remove");
        assert_eq!(counts.keys(), vec!["b".to_owned()]);
    }
}
