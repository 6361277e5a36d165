//! A light replica's copy of an object (cluster/replica.rs keeps them): its
//! entry sets with the versions the owner last reported, and its entries.
//! A workflow running the object on the replica reads here instead of the
//! tables and records the copy's versions in its read set; the owner
//! validates them at the end, so a stale copy ends in 40001, never in a
//! wrong answer.

use lambdastore_core::model::{EntryRow, Guards, Position};
use lambdastore_core::txn::entry_sets;
use std::collections::BTreeMap;
use std::ops::Bound;

/// One object's copy.
#[derive(Debug)]
pub(crate) struct ObjectCopy {
    pub(crate) object: i64,
    /// The owner's split counter for the object when the sets were read.
    pub(crate) splits: u64,
    pub(crate) guards: Guards,
    /// The version of each set, by the index of its guard.
    versions: Vec<i64>,
    entries: BTreeMap<(String, Vec<u8>), Vec<u8>>,
    /// Keys and values, for the replica's memory bound.
    pub(crate) bytes: usize,
}

impl ObjectCopy {
    /// A copy of `object` from the owner's answer: its sets in order (the
    /// first at the empty position) and every entry.
    pub(crate) fn new(object: i64, splits: u64, sets: Vec<(Position, i64)>, rows: Vec<EntryRow>) -> Self {
        let bytes = rows.iter().map(|(field, key, value)| field.len() + key.len() + value.len()).sum();
        let entries = rows.into_iter().map(|(field, key, value)| ((field, key), value)).collect();
        let (lowers, versions) = sets.into_iter().unzip();
        ObjectCopy { object, splits, guards: entry_sets::guards(lowers), versions, entries, bytes }
    }

    /// The sets and their versions, as the owner is asked about them.
    pub(crate) fn sets(&self) -> Vec<(Position, i64)> {
        self.guards.iter().cloned().zip(self.versions.iter().copied()).collect()
    }

    /// The version of the set starting at `lower` (one of the guards).
    pub(crate) fn version(&self, lower: &Position) -> i64 {
        match self.guards.binary_search(lower) {
            Ok(i) => self.versions.get(i).copied().unwrap_or_default(),
            // Not a guard: no such set in this copy, a version no set has.
            Err(_) => i64::MIN,
        }
    }

    pub(crate) fn get(&self, field: &str, key: &[u8]) -> Option<Vec<u8>> {
        self.entries.get(&(field.to_string(), key.to_vec())).cloned()
    }

    /// Entries of `field` with start <= key < end, in key order (or
    /// reverse), at most `limit`: what the table's scan returns.
    pub(crate) fn scan(
        &self,
        field: &str,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: usize,
        forward: bool,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let low = Bound::Included((field.to_string(), start.unwrap_or_default().to_vec()));
        let high = match end {
            Some(end) => Bound::Excluded((field.to_string(), end.to_vec())),
            None => Bound::Excluded((format!("{field}\0"), Vec::new())),
        };
        let range = self.entries.range((low, high)).map(|((_, key), value)| (key.clone(), value.clone()));
        if forward {
            range.take(limit).collect()
        } else {
            range.rev().take(limit).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ObjectCopy;

    fn copy() -> ObjectCopy {
        let rows = [("a", 1u8), ("a", 2), ("a", 3), ("ab", 1), ("b", 1)]
            .iter()
            .map(|(f, k)| (f.to_string(), vec![*k], vec![*k + 10]))
            .collect();
        ObjectCopy::new(7, 0, vec![(Default::default(), 4), (("a".into(), vec![3]), 9)], rows)
    }

    #[test]
    fn scans_one_field_in_either_order_within_bounds() {
        let c = copy();
        let keys = |rows: Vec<(Vec<u8>, Vec<u8>)>| rows.into_iter().map(|(k, _)| k[0]).collect::<Vec<_>>();
        assert_eq!(keys(c.scan("a", None, None, 10, true)), [1, 2, 3]);
        assert_eq!(keys(c.scan("a", Some(&[2]), None, 10, false)), [3, 2]);
        assert_eq!(keys(c.scan("a", None, Some(&[3]), 1, false)), [2]);
        assert_eq!(c.get("ab", &[1]), Some(vec![11]));
        assert_eq!((c.version(&Default::default()), c.version(&("a".into(), vec![3]))), (4, 9));
        assert_eq!(c.version(&("a".into(), vec![2])), i64::MIN);
    }
}
