//! Entry sets: an object's (field, key) space divided by guards into
//! ranges, each with a version. They are the unit of locking and
//! validation: a set covers [its lower bound, the next set's lower bound).

use std::ops::Bound;

/// A position in an object's key space, in `entries` primary-key order.
pub type Position = (String, Vec<u8>);

/// Identifies an entry set: (object, lower bound).
pub type SetId = (i64, Position);

#[derive(Clone, Debug)]
pub struct EntrySet {
    pub lower: Position,
    pub version: i64,
    pub conflicts: i64,
}

/// The entry sets of one object, sorted by lower bound. The first always
/// starts at ("", "") so every position has a set.
#[derive(Clone, Debug)]
pub struct EntrySets(pub Vec<EntrySet>);

impl EntrySets {
    /// The set of a new object: one set covering everything.
    pub fn fresh() -> Self {
        EntrySets(vec![EntrySet { lower: (String::new(), Vec::new()), version: 0, conflicts: 0 }])
    }

    fn index_of(&self, field: &str, key: &[u8]) -> usize {
        // Last set whose lower bound is <= (field, key).
        let after = self.0.partition_point(|s| (s.lower.0.as_str(), s.lower.1.as_slice()) <= (field, key));
        after.saturating_sub(1)
    }

    pub fn containing(&self, field: &str, key: &[u8]) -> &EntrySet {
        &self.0[self.index_of(field, key)]
    }

    /// Every set overlapping the entries of `field` with start <= key < end.
    pub fn overlapping(&self, field: &str, start: &[u8], end: Option<&[u8]>) -> &[EntrySet] {
        let first = self.index_of(field, start);
        let upper: Bound<(&str, &[u8])> = match end {
            Some(end) => Bound::Excluded((field, end)),
            None => Bound::Unbounded,
        };
        let last = self.0[first..]
            .iter()
            .take_while(|s| {
                let lower = (s.lower.0.as_str(), s.lower.1.as_slice());
                match upper {
                    Bound::Excluded(hi) => lower < hi,
                    // Without an end, the range ends with the field itself:
                    // sets starting in a later field do not overlap it.
                    _ => lower.0 <= field,
                }
            })
            .count();
        &self.0[first..first + last.max(1)]
    }

    pub fn find(&self, lower: &Position) -> Option<&EntrySet> {
        self.0.binary_search_by(|s| s.lower.cmp(lower)).ok().map(|i| &self.0[i])
    }
}

/// The advisory-lock key of an entry set: a 64-bit FNV-1a hash of the object
/// and lower bound. A collision only makes two sets share a lock (a false
/// conflict), never a missed one.
pub fn lock_key((object, (field, key)): &SetId) -> i64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let bytes = object.to_be_bytes().into_iter().chain(field.bytes()).chain([0xff]).chain(key.iter().copied());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash as i64
}
