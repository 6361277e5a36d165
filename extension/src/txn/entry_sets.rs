//! Entry sets: an object's (field, key) space divided by guards into
//! ranges, each with a version. They are the unit of locking and
//! validation: a set covers [its lower bound, the next set's lower bound).

use std::collections::BTreeMap;

/// A position in an object's key space, in `entries` primary-key order.
pub type Position = (String, Vec<u8>);

/// Identifies an entry set: (object, lower bound).
pub type SetId = (i64, Position);

#[derive(Clone, Debug)]
pub struct EntrySet {
    pub lower: Position,
    pub version: i64,
}

/// What a workflow knows of one object's entry sets, each with the lower
/// bound of the next set (its upper bound), as loaded at the object's first
/// touch: all of them for an object with few sets, else each set as it is
/// touched, which keeps objects with many guards cheap. A set that changed
/// since it was loaded fails validation.
#[derive(Debug, Default)]
pub struct KnownSets {
    /// lower bound -> (set, upper bound; None: to the end of the object)
    sets: BTreeMap<Position, (EntrySet, Option<Position>)>,
}

impl KnownSets {
    /// The single set of an object created by this workflow.
    pub fn fresh() -> Self {
        let mut known = KnownSets::default();
        let set = EntrySet { lower: (String::new(), Vec::new()), version: 0 };
        known.sets.insert(set.lower.clone(), (set, None));
        known
    }

    /// The known set containing (field, key), if any.
    pub fn containing(&self, field: &str, key: &[u8]) -> Option<&EntrySet> {
        let position = (field.to_string(), key.to_vec());
        let (_, (set, upper)) = self.sets.range(..=position.clone()).next_back()?;
        match upper {
            Some(upper) if position >= *upper => None,
            _ => Some(set),
        }
    }

    /// Every set of an object, in order: each set's upper bound is the
    /// next one's lower bound. A key space that does not start with a set
    /// (possible only for rows made by hand) starts with an implicit one.
    pub fn complete(sets: Vec<EntrySet>) -> Self {
        let mut known = KnownSets::default();
        let origin: Position = (String::new(), Vec::new());
        let mut sets = sets.into_iter().peekable();
        if sets.peek().is_none_or(|first| first.lower != origin) {
            let upper = sets.peek().map(|first| first.lower.clone());
            known.insert(EntrySet { lower: origin, version: 0 }, upper);
        }
        while let Some(set) = sets.next() {
            let upper = sets.peek().map(|next| next.lower.clone());
            known.insert(set, upper);
        }
        known
    }

    pub fn insert(&mut self, set: EntrySet, upper: Option<Position>) {
        self.sets.insert(set.lower.clone(), (set, upper));
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
