//! Bounds on the waits in flight: per API key, and all keys together. A
//! wait keeps its pooled connection until the job finishes or the wait
//! times out, so one application long-polling many jobs could otherwise
//! take every connection and make the other applications' calls queue
//! behind it. The bound for all keys together matters because an
//! application may hold many keys (`lambdastore.create_api_key`), and the
//! gateway cannot tell which application a key is before the database has
//! checked it.
//!
//! Counted by the key as sent, before the database has checked it: the
//! point is to refuse before a connection is taken. A key that is wrong is
//! refused by the database at once, so its slot is soon free again.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

pub struct WaitSlots {
    per_key: usize,
    in_all: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    by_key: HashMap<String, usize>,
    in_all: usize,
}

/// Which bound refused a slot.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The key holds `limit` slots already.
    Key { limit: usize },
    /// All keys together hold `limit` slots already.
    All { limit: usize },
}

/// A slot of one key, given back when dropped (also when the client goes
/// away and the handler is dropped mid-wait).
pub struct Slot<'a> {
    slots: &'a WaitSlots,
    key: String,
}

impl WaitSlots {
    pub fn new(per_key: usize, in_all: usize) -> Self {
        Self { per_key, in_all, held: Mutex::new(Held::default()) }
    }

    /// A slot for `key`, unless it or all keys together hold their limit.
    pub fn acquire(&self, key: &str) -> Result<Slot<'_>, Refused> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.by_key.get(key).is_some_and(|&count| count >= self.per_key) {
            return Err(Refused::Key { limit: self.per_key });
        }
        if held.in_all >= self.in_all {
            return Err(Refused::All { limit: self.in_all });
        }
        *held.by_key.entry(key.to_string()).or_insert(0) += 1;
        held.in_all += 1;
        Ok(Slot { slots: self, key: key.to_string() })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.in_all -= 1;
        if let Some(count) = held.by_key.get_mut(&self.key) {
            *count -= 1;
            // Only keys with slots in use stay in the map.
            if *count == 0 {
                held.by_key.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Refused, WaitSlots};

    #[test]
    fn a_key_gets_at_most_limit_slots_and_others_are_unaffected() {
        let waits = WaitSlots::new(2, 10);
        let (a1, a2) = (waits.acquire("a"), waits.acquire("a"));
        assert!(a1.is_ok() && a2.is_ok());
        assert_eq!(waits.acquire("a").err(), Some(Refused::Key { limit: 2 }));
        assert!(waits.acquire("b").is_ok());
        drop(a1);
        assert!(waits.acquire("a").is_ok(), "a dropped slot is given back");
    }

    #[test]
    fn all_keys_together_get_at_most_their_limit() {
        let waits = WaitSlots::new(2, 3);
        let held: Vec<_> = ["a", "a", "b"].iter().map(|key| waits.acquire(key).unwrap()).collect();
        assert_eq!(waits.acquire("c").err(), Some(Refused::All { limit: 3 }));
        assert_eq!(waits.acquire("a").err(), Some(Refused::Key { limit: 2 }), "the key's own bound is named first");
        drop(held);
        assert!(waits.acquire("c").is_ok(), "dropped slots are given back to all keys");
    }

    #[test]
    fn a_key_without_slots_in_use_is_forgotten() {
        let waits = WaitSlots::new(1, 1);
        drop(waits.acquire("a"));
        let held = waits.held.lock().unwrap();
        assert!(held.by_key.is_empty() && held.in_all == 0);
    }
}
