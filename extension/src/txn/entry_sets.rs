//! Entry sets: an object's (field, key) space divided by guards into
//! ranges, each with a version. They are the unit of locking and
//! validation: a set covers [its lower bound, the next set's lower bound).

use std::collections::BTreeMap;
use std::rc::Rc;

/// A position in an object's key space, in `entries` primary-key order.
pub type Position = (String, Vec<u8>);

/// Identifies an entry set: (object, lower bound).
pub type SetId = (i64, Position);

#[derive(Clone, Debug)]
pub struct EntrySet {
    pub lower: Position,
    pub version: i64,
}

/// An object's guards in order, starting at ("", ""): each set covers
/// [its guard, the next guard). Shared between workflows of a backend
/// (catalog/cache.rs keeps them per split count).
pub type Guards = Rc<Vec<Position>>;

/// What a workflow knows of one object's entry sets: all its guards when the
/// object has few enough (else each set is loaded as it is touched), and
/// the sets touched so far with the version seen at first touch, before
/// any value under them was read. A set that changed since fails
/// validation, and so does an object split since `splits` was read (before
/// any of its guards).
#[derive(Debug, Default)]
pub struct KnownSets {
    guards: Option<Guards>,
    /// lower bound -> (set, upper bound; None: to the end of the object)
    sets: BTreeMap<Position, (EntrySet, Option<Position>)>,
    pub splits: u64,
}

impl KnownSets {
    /// The single set of an object created by this workflow.
    pub fn fresh() -> Self {
        KnownSets { guards: Some(Rc::new(vec![Position::default()])), ..KnownSets::default() }
    }

    /// Every guard of the object is known.
    pub fn complete(guards: Guards, splits: u64) -> Self {
        KnownSets { guards: Some(guards), splits, ..KnownSets::default() }
    }

    /// Nothing known yet of an object with many sets: each is loaded as it
    /// is touched.
    pub fn partial(splits: u64) -> Self {
        KnownSets { splits, ..KnownSets::default() }
    }

    /// The set containing (field, key): as touched before, else from the
    /// guards with its version now (`version`), else None (not known).
    pub fn containing(&mut self, field: &str, key: &[u8], version: impl Fn(&Position) -> i64) -> Option<EntrySet> {
        let position = (field.to_string(), key.to_vec());
        if let Some((_, (set, upper))) = self.sets.range(..=position.clone()).next_back() {
            if upper.as_ref().is_none_or(|upper| position < *upper) {
                return Some(set.clone());
            }
        }
        let guards = self.guards.clone()?;
        // The last guard at or below the position; the first is ("", "").
        let i = guards.partition_point(|guard| *guard <= position).max(1) - 1;
        Some(self.touch(&guards, i, &version))
    }

    /// With every guard known: the sets of `field` starting strictly inside
    /// (start, end), touched now.
    pub fn inside(&mut self, field: &str, start: &[u8], end: Option<&[u8]>, version: impl Fn(&Position) -> i64) -> Option<Vec<EntrySet>> {
        let guards = self.guards.clone()?;
        let from = (field.to_string(), start.to_vec());
        let first = guards.partition_point(|guard| *guard <= from);
        let within = |guard: &Position| guard.0 == field && end.is_none_or(|end| guard.1.as_slice() < end);
        let count = guards[first..].iter().take_while(|guard| within(guard)).count();
        Some((first..first + count).map(|i| self.touch(&guards, i, &version)).collect())
    }

    fn touch(&mut self, guards: &[Position], i: usize, version: &impl Fn(&Position) -> i64) -> EntrySet {
        let lower = guards[i].clone();
        if let Some((set, _)) = self.sets.get(&lower) {
            return set.clone();
        }
        let set = EntrySet { version: version(&lower), lower };
        self.insert(set.clone(), guards.get(i + 1).cloned());
        set
    }

    pub fn insert(&mut self, set: EntrySet, upper: Option<Position>) {
        self.sets.insert(set.lower.clone(), (set, upper));
    }
}

/// Guards as read from the table, with the origin ("", "") first even for
/// an object whose rows were made by hand without it.
pub fn guards(mut lowers: Vec<Position>) -> Guards {
    if lowers.first() != Some(&Position::default()) {
        lowers.insert(0, Position::default());
    }
    Rc::new(lowers)
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
