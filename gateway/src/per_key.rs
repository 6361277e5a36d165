//! A bound on what one API key may hold at once. A wait keeps its pooled
//! connection until the job finishes or the wait times out, so one
//! application long-polling many jobs could otherwise take every connection
//! and make the other applications' calls queue behind it.
//!
//! Counted by the key as sent, before the database has checked it: the
//! point is to refuse before a connection is taken. A key that is wrong is
//! refused by the database at once, so its slot is soon free again.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

pub struct PerKey {
    limit: usize,
    held: Mutex<HashMap<String, usize>>,
}

/// A slot of one key, given back when dropped (also when the client goes
/// away and the handler is dropped mid-wait).
pub struct Slot<'a> {
    per_key: &'a PerKey,
    key: String,
}

impl PerKey {
    pub fn new(limit: usize) -> Self {
        Self { limit, held: Mutex::new(HashMap::new()) }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A slot for `key`, or `None` when it holds `limit` already.
    pub fn acquire(&self, key: &str) -> Option<Slot<'_>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(key.to_string()).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Slot { per_key: self, key: key.to_string() })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut held = self.per_key.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            // Only keys with slots in use stay in the map.
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PerKey;

    #[test]
    fn a_key_gets_at_most_limit_slots_and_others_are_unaffected() {
        let waits = PerKey::new(2);
        let (a1, a2) = (waits.acquire("a"), waits.acquire("a"));
        assert!(a1.is_some() && a2.is_some());
        assert!(waits.acquire("a").is_none());
        assert!(waits.acquire("b").is_some());
        drop(a1);
        assert!(waits.acquire("a").is_some(), "a dropped slot is given back");
    }

    #[test]
    fn a_key_without_slots_in_use_is_forgotten() {
        let waits = PerKey::new(1);
        drop(waits.acquire("a"));
        assert!(waits.held.lock().unwrap().is_empty());
    }
}
