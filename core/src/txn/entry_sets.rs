//! Entry sets: an object's (field, key) space divided by guards into
//! ranges, each with a version. They are the unit of locking and
//! validation: a set covers [its lower bound, the next set's lower bound).

use std::collections::BTreeMap;
use std::ops::Bound::{Included, Unbounded};
use std::rc::Rc;

pub use crate::model::{Guards, Position, SetId};

#[derive(Clone, Debug)]
pub struct EntrySet {
    pub lower: Position,
    pub version: i64,
}

/// What a workflow knows of one object's entry sets: all its guards when the
/// object has few enough (else each set is loaded as it is touched), and
/// the sets touched so far with the version seen at first touch, before
/// any value under them was read. A set that changed since fails
/// validation, and so does an object split since `splits` was read (before
/// any of its guards).
#[derive(Debug)]
pub struct KnownSets {
    known: Known,
    pub splits: u64,
}

#[derive(Debug)]
enum Known {
    /// Every guard, and the sets touched by the index of their guard: every
    /// warm read passes here, and an index compares without `memcmp`.
    Complete { guards: Guards, touched: BTreeMap<usize, Touched> },
    /// The sets touched, by lower bound, with the next set's lower bound
    /// (None: to the end of the object).
    Partial { touched: BTreeMap<Position, (Touched, Option<Position>)> },
}

/// A set a workflow has touched.
#[derive(Debug)]
pub struct Touched {
    pub set: EntrySet,
    /// Already in the workflow's read set: a read of a key in a set read
    /// before copies nothing.
    pub read: bool,
}

impl Touched {
    fn new(set: EntrySet) -> Self {
        Touched { set, read: false }
    }
}

impl KnownSets {
    /// The single set of an object created by this workflow.
    pub fn fresh() -> Self {
        Self::complete(Rc::new(vec![Position::default()]), 0)
    }

    /// Every guard of the object is known.
    pub fn complete(guards: Guards, splits: u64) -> Self {
        KnownSets { known: Known::Complete { guards, touched: BTreeMap::new() }, splits }
    }

    /// Nothing known yet of an object with many sets: each is loaded as it
    /// is touched.
    pub fn partial(splits: u64) -> Self {
        KnownSets { known: Known::Partial { touched: BTreeMap::new() }, splits }
    }

    /// The set containing (field, key): as touched before, else from the
    /// guards with its version now (`version`), else None (not known).
    pub fn containing(&mut self, field: &str, key: &[u8], version: impl Fn(&Position) -> i64) -> Option<&mut Touched> {
        match &mut self.known {
            Known::Complete { guards, touched } => {
                // The last guard at or below the position; the first is ("", "").
                let i = match guards.len() {
                    1 => 0,
                    _ => {
                        guards.partition_point(|guard| (guard.0.as_str(), guard.1.as_slice()) <= (field, key)).max(1)
                            - 1
                    }
                };
                Some(touched.entry(i).or_insert_with(|| {
                    Touched::new(EntrySet { version: version(&guards[i]), lower: guards[i].clone() })
                }))
            }
            Known::Partial { touched } => {
                let position = (field.to_string(), key.to_vec());
                let (_, (set, upper)) =
                    touched.range_mut::<Position, _>((Unbounded, Included(&position))).next_back()?;
                upper.as_ref().is_none_or(|upper| position < *upper).then_some(set)
            }
        }
    }

    /// With every guard known: the sets of `field` starting strictly inside
    /// (start, end), touched now.
    pub fn inside(
        &mut self,
        field: &str,
        start: &[u8],
        end: Option<&[u8]>,
        version: impl Fn(&Position) -> i64,
    ) -> Option<Vec<EntrySet>> {
        let Known::Complete { guards, touched } = &mut self.known else { return None };
        let first = guards.partition_point(|guard| (guard.0.as_str(), guard.1.as_slice()) <= (field, start));
        let within = |guard: &Position| guard.0 == field && end.is_none_or(|end| guard.1.as_slice() < end);
        let count = guards[first..].iter().take_while(|guard| within(guard)).count();
        let touch = |i: usize| {
            let lower = &guards[i];
            touched
                .entry(i)
                .or_insert_with(|| Touched::new(EntrySet { version: version(lower), lower: lower.clone() }))
                .set
                .clone()
        };
        Some((first..first + count).map(touch).collect())
    }

    /// A set of an object with many sets, loaded from the table.
    pub fn insert(&mut self, set: EntrySet, upper: Option<Position>) -> &mut Touched {
        let Known::Partial { touched } = &mut self.known else {
            unreachable!("only sets of a partially known object are loaded")
        };
        let lower = set.lower.clone();
        touched.insert(lower.clone(), (Touched::new(set), upper));
        &mut touched.get_mut(&lower).expect("inserted above").0
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
#[inline]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn position(field: &str, key: &str) -> Position {
        (field.to_string(), key.as_bytes().to_vec())
    }

    /// Guards at ("", ""), ("f", "m") and ("g", ""); each set's version is
    /// the length of its guard's key, so a test can tell them apart.
    fn three_sets() -> KnownSets {
        KnownSets::complete(guards(vec![position("f", "m"), position("g", "")]), 0)
    }

    fn version(lower: &Position) -> i64 {
        lower.0.len() as i64 * 10 + lower.1.len() as i64
    }

    #[test]
    fn the_origin_guard_is_always_first() {
        assert_eq!(*guards(vec![position("f", "m")]), vec![Position::default(), position("f", "m")]);
        assert_eq!(guards(vec![Position::default()]).len(), 1);
    }

    #[test]
    fn a_key_falls_in_the_set_of_the_last_guard_at_or_below_it() {
        let mut sets = three_sets();
        let lower = |sets: &mut KnownSets, field: &str, key: &str| {
            sets.containing(field, key.as_bytes(), version).map(|t| t.set.lower.clone())
        };
        assert_eq!(lower(&mut sets, "f", "a"), Some(Position::default()));
        assert_eq!(lower(&mut sets, "f", "m"), Some(position("f", "m")));
        assert_eq!(lower(&mut sets, "f", "z"), Some(position("f", "m")));
        assert_eq!(lower(&mut sets, "g", ""), Some(position("g", "")));
        assert_eq!(lower(&mut sets, "h", "a"), Some(position("g", "")));
        // The version is the one seen at first touch.
        assert_eq!(sets.containing("f", b"n", |_| 99).map(|t| t.set.version), Some(11));
    }

    #[test]
    fn a_scan_touches_the_sets_starting_inside_its_range() {
        let mut sets = three_sets();
        let lowers = |sets: Option<Vec<EntrySet>>| sets.unwrap().into_iter().map(|s| s.lower).collect::<Vec<_>>();
        assert_eq!(lowers(sets.inside("f", b"a", None, version)), [position("f", "m")]);
        assert_eq!(lowers(sets.inside("f", b"a", Some(b"m"), version)), Vec::<Position>::new());
        assert_eq!(lowers(sets.inside("f", b"m", None, version)), Vec::<Position>::new());
        assert!(KnownSets::partial(0).inside("f", b"", None, version).is_none());
    }

    #[test]
    fn a_partly_known_object_knows_only_the_sets_loaded() {
        let mut sets = KnownSets::partial(3);
        assert!(sets.containing("f", b"a", version).is_none());
        sets.insert(EntrySet { lower: position("f", ""), version: 5 }, Some(position("f", "m")));
        assert_eq!(sets.containing("f", b"a", version).map(|t| t.set.version), Some(5));
        assert!(sets.containing("f", b"m", version).is_none());
        assert_eq!(sets.splits, 3);
    }

    #[test]
    fn lock_keys_differ_by_object_field_and_key() {
        let keys = [
            lock_key(&(1, position("f", "a"))),
            lock_key(&(2, position("f", "a"))),
            lock_key(&(1, position("g", "a"))),
            lock_key(&(1, position("f", "b"))),
            // The separator keeps ("fa", "") apart from ("f", "a").
            lock_key(&(1, position("fa", ""))),
        ];
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
        assert_eq!(lock_key(&(1, position("f", "a"))), keys[0]);
    }
}
