//! Typed fields of an object: [`Cell`], [`Map`], [`MultiMap`], [`Set`].
//!
//! A field holds only its name; the host knows the current object, so a field
//! always reads and writes the object the running function was called on.
//! Values are stored as JSON (readable with `psql`), keys with the
//! order-preserving [key encoding](crate::key).
//!
//! Accessors do not return `Result`: a stored value that does not decode as
//! the field's type (say, written by an older version of the application) is
//! treated as absent *and* makes the running function's call fail with
//! [`CallError::Application`](crate::CallError::Application) when it returns,
//! so nothing it wrote is kept. Use [`Cell::try_get`] or [`Map::try_get`] to
//! handle such values yourself.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::__private::fail_later;
use crate::desc::FieldKind;
use crate::host::{self, Direction, Entry};
use crate::key::{decode_key, encode_key, prefix_successor, Key, OwnedKey};

/// A field type: [`#[lambda_object]`](crate::lambda_object) binds each field
/// of an object struct to its name through this trait.
pub trait Field {
    /// The kind reported by `describe`.
    const KIND: FieldKind;
    /// The field stored under `name`.
    fn bind(name: &'static str) -> Self;
}

/// A stored entry that does not decode as the field's types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {message}")]
pub struct FieldError {
    field: &'static str,
    message: String,
}

impl FieldError {
    /// The field's name.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

fn decode_value<V: DeserializeOwned>(field: &'static str, bytes: &[u8]) -> Result<V, FieldError> {
    serde_json::from_slice(bytes).map_err(|e| FieldError {
        field,
        message: format!("stored value does not decode as {}: {e}", std::any::type_name::<V>()),
    })
}

fn decode_map_key<K: OwnedKey>(field: &'static str, bytes: &[u8]) -> Result<K, FieldError> {
    decode_key(bytes).map_err(|e| FieldError {
        field,
        message: format!("stored key does not decode as {}: {e}", std::any::type_name::<K>()),
    })
}

/// `Some(value)`, or `None` after deferring the failure to the end of the call.
fn or_fail_later<T>(result: Result<T, FieldError>) -> Option<T> {
    result.map_err(|e| fail_later(e.to_string())).ok()
}

thread_local! {
    /// The buffer values are encoded into, kept between writes: a fresh
    /// `serde_json::to_vec` starts at 128 bytes and grew four times for
    /// each 1 KiB value.
    static ENCODED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn write_value<V: Serialize + ?Sized>(field: &'static str, key: &[u8], value: &V) {
    let put = |buffer: &mut Vec<u8>| match crate::json::to_writer(&mut *buffer, value) {
        Ok(()) => host::put(field, key, buffer),
        Err(e) => fail_later(format!("field `{field}`: value does not encode as JSON: {e}")),
    };
    ENCODED.with(|kept| match kept.try_borrow_mut() {
        Ok(mut buffer) => {
            buffer.clear();
            put(&mut buffer);
        }
        // A value whose `Serialize` writes a field itself.
        Err(_) => put(&mut Vec::new()),
    });
}

macro_rules! field_common {
    ($ty:ident<$($p:ident),+>, $kind:expr) => {
        impl<$($p),+> Field for $ty<$($p),+> {
            const KIND: FieldKind = $kind;
            fn bind(name: &'static str) -> Self {
                $ty { name, _types: PhantomData }
            }
        }

        impl<$($p),+> $ty<$($p),+> {
            /// The field stored under `name` (what `#[lambda_object]` does for
            /// each field).
            pub const fn new(name: &'static str) -> Self {
                $ty { name, _types: PhantomData }
            }

            /// The field's name.
            pub fn name(&self) -> &'static str {
                self.name
            }
        }

        impl<$($p),+> fmt::Debug for $ty<$($p),+> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($ty)).field(&self.name).finish()
            }
        }
    };
}

/// One value, stored under the empty key of its field.
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::prelude::*;
/// # let _host = lambdastore_sdk::mock::MockHost::standalone();
///
/// let owner: Cell<String> = Cell::new("owner");
/// assert_eq!(owner.get(), None);
/// owner.set("ada");
/// assert_eq!(owner.get().as_deref(), Some("ada"));
/// assert!(owner.clear());
/// assert_eq!(owner.get_or_default(), "");
/// ```
pub struct Cell<T> {
    name: &'static str,
    _types: PhantomData<fn() -> T>,
}

field_common!(Cell<T>, FieldKind::Cell);

impl<T: Serialize + DeserializeOwned> Cell<T> {
    /// The value, if set.
    pub fn get(&self) -> Option<T> {
        or_fail_later(self.try_get()).flatten()
    }

    /// The value, if set; an error if the stored value does not decode.
    pub fn try_get(&self) -> Result<Option<T>, FieldError> {
        host::get(self.name, &[]).map(|bytes| decode_value(self.name, &bytes)).transpose()
    }

    /// The value, or `T::default()` if unset.
    pub fn get_or_default(&self) -> T
    where
        T: Default,
    {
        self.get().unwrap_or_default()
    }

    /// Stores `value` (a `&T`, or a borrowed form such as `&str` for a
    /// `Cell<String>`).
    pub fn set<Q: Serialize + ?Sized>(&self, value: &Q)
    where
        T: Borrow<Q>,
    {
        write_value(self.name, &[], value)
    }

    /// Removes the value; returns whether there was one.
    pub fn clear(&self) -> bool {
        host::delete(self.name, &[])
    }
}

/// Ordered keys to values.
///
/// Keys are any [`Key`]: integers, strings, byte strings, booleans, object
/// references, options and tuples of those. Iteration is in key order.
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::prelude::*;
/// # let _host = lambdastore_sdk::mock::MockHost::standalone();
///
/// let scores: Map<String, u32> = Map::new("scores");
/// scores.insert("bob", &3);
/// scores.insert("ada", &5);
/// assert_eq!(scores.get("ada"), Some(5));
/// assert!(scores.contains_key("bob"));
///
/// let in_order: Vec<(String, u32)> = scores.iter().collect();
/// assert_eq!(in_order, [("ada".to_string(), 5), ("bob".to_string(), 3)]);
/// assert_eq!(scores.last(), Some(("bob".to_string(), 3)));
/// assert!(scores.remove("bob"));
/// assert_eq!(scores.iter().rev().limit(1).next(), Some(("ada".to_string(), 5)));
/// ```
pub struct Map<K, V> {
    name: &'static str,
    _types: PhantomData<fn() -> (K, V)>,
}

field_common!(Map<K, V>, FieldKind::Map);

impl<K: OwnedKey, V: Serialize + DeserializeOwned> Map<K, V> {
    /// The value of `key`.
    pub fn get<Q: Key + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        or_fail_later(self.try_get(key)).flatten()
    }

    /// The value of `key`; an error if the stored value does not decode.
    pub fn try_get<Q: Key + ?Sized>(&self, key: &Q) -> Result<Option<V>, FieldError>
    where
        K: Borrow<Q>,
    {
        host::get(self.name, &encode_key(key)).map(|bytes| decode_value(self.name, &bytes)).transpose()
    }

    /// Whether `key` has a value.
    pub fn contains_key<Q: Key + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        host::get(self.name, &encode_key(key)).is_some()
    }

    /// Stores `value` under `key`, replacing any previous value. (Unlike
    /// `BTreeMap::insert` it does not read the previous value: that would be
    /// one more host round trip and one more read to validate.)
    pub fn insert<Q: Key + ?Sized, W: Serialize + ?Sized>(&self, key: &Q, value: &W)
    where
        K: Borrow<Q>,
        V: Borrow<W>,
    {
        write_value(self.name, &encode_key(key), value)
    }

    /// Removes `key`; returns whether it was there.
    pub fn remove<Q: Key + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        host::delete(self.name, &encode_key(key))
    }

    /// Entries with keys in `bounds`, in key order (see [`Iter`] for
    /// reversing and limiting).
    pub fn range(&self, bounds: impl RangeBounds<K>) -> Iter<(K, V)> {
        let (start, end) = key_bounds(&bounds);
        Iter::new(self.name, start, end, decode_entry::<K, V>)
    }

    /// All entries, in key order.
    pub fn iter(&self) -> Iter<(K, V)> {
        self.range(..)
    }

    /// The entry with the smallest key.
    pub fn first(&self) -> Option<(K, V)> {
        self.iter().limit(1).next()
    }

    /// The entry with the largest key.
    pub fn last(&self) -> Option<(K, V)> {
        self.iter().rev().limit(1).next()
    }

    /// Whether the map has no entries.
    pub fn is_empty(&self) -> bool {
        host::scan(self.name, None, None, 1, Direction::Forward).is_empty()
    }
}

fn decode_entry<K: OwnedKey, V: DeserializeOwned>(field: &'static str, entry: Entry) -> Result<(K, V), FieldError> {
    Ok((decode_map_key(field, &entry.key)?, decode_value(field, &entry.value)?))
}

/// Scan bounds (inclusive start, exclusive end) of a range of whole keys.
fn key_bounds<K: Key>(bounds: &impl RangeBounds<K>) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    // Encodings are prefix-free, so `enc(k) ++ [0]` is the smallest byte
    // string above `enc(k)` that can follow it.
    let after = |k: &K| {
        let mut bytes = encode_key(k);
        bytes.push(0);
        bytes
    };
    let start = match bounds.start_bound() {
        Bound::Included(k) => Some(encode_key(k)),
        Bound::Excluded(k) => Some(after(k)),
        Bound::Unbounded => None,
    };
    let end = match bounds.end_bound() {
        Bound::Included(k) => Some(after(k)),
        Bound::Excluded(k) => Some(encode_key(k)),
        Bound::Unbounded => None,
    };
    (start, end)
}

/// Scan bounds of a range of keys that each prefix several entries.
fn prefix_bounds<K: Key>(bounds: &impl RangeBounds<K>) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let start = match bounds.start_bound() {
        Bound::Included(k) => Some(encode_key(k)),
        Bound::Excluded(k) => prefix_successor(&encode_key(k)),
        Bound::Unbounded => None,
    };
    let end = match bounds.end_bound() {
        Bound::Included(k) => prefix_successor(&encode_key(k)),
        Bound::Excluded(k) => Some(encode_key(k)),
        Bound::Unbounded => None,
    };
    (start, end)
}

/// The most entries fetched from the host at a time.
const PAGE: u32 = 128;

/// An iterator over a key range of a field, fetching entries from the host
/// in pages as it goes.
///
/// Call [`rev`](Iter::rev) and [`limit`](Iter::limit) before iterating:
/// `limit` bounds what is fetched from the host (and so what the
/// transaction reads), unlike `Iterator::take`, which may fetch a page more.
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::prelude::*;
/// # let _host = lambdastore_sdk::mock::MockHost::standalone();
///
/// let events: Map<u64, String> = Map::new("events");
/// for i in 0..10u64 {
///     events.insert(&i, &format!("event {i}"));
/// }
/// let newest: Vec<u64> = events.iter().rev().limit(3).map(|(k, _)| k).collect();
/// assert_eq!(newest, [9, 8, 7]);
/// let middle: Vec<u64> = events.range(3..=5).map(|(k, _)| k).collect();
/// assert_eq!(middle, [3, 4, 5]);
/// ```
pub struct Iter<T> {
    field: &'static str,
    start: Option<Vec<u8>>,
    end: Option<Vec<u8>>,
    dir: Direction,
    remaining: Option<u32>,
    page: VecDeque<Entry>,
    exhausted: bool,
    decode: fn(&'static str, Entry) -> Result<T, FieldError>,
}

impl<T> Iter<T> {
    fn new(
        field: &'static str,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        decode: fn(&'static str, Entry) -> Result<T, FieldError>,
    ) -> Self {
        Iter {
            field,
            start,
            end,
            dir: Direction::Forward,
            remaining: None,
            page: VecDeque::new(),
            exhausted: false,
            decode,
        }
    }

    /// Iterates in descending key order.
    #[allow(clippy::should_implement_trait)] // Not double-ended: the scan direction is chosen up front.
    pub fn rev(mut self) -> Self {
        self.dir = match self.dir {
            Direction::Forward => Direction::Backward,
            Direction::Backward => Direction::Forward,
        };
        self
    }

    /// Yields at most `n` entries.
    pub fn limit(mut self, n: u32) -> Self {
        self.remaining = Some(n);
        self
    }

    fn fetch(&mut self) {
        let want = self.remaining.map_or(PAGE, |r| r.min(PAGE));
        if want == 0 {
            self.exhausted = true;
            return;
        }
        let entries = host::scan(self.field, self.start.as_deref(), self.end.as_deref(), want, self.dir);
        if (entries.len() as u32) < want {
            self.exhausted = true;
        }
        if let Some(r) = &mut self.remaining {
            *r -= entries.len() as u32;
        }
        // Resume the next page right after the last entry seen.
        if let Some(last) = entries.last() {
            match self.dir {
                Direction::Forward => {
                    let mut after = last.key.clone();
                    after.push(0);
                    self.start = Some(after);
                }
                Direction::Backward => self.end = Some(last.key.clone()),
            }
        }
        self.page.extend(entries);
    }
}

impl<T> Iterator for Iter<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        loop {
            if self.page.is_empty() {
                if self.exhausted {
                    return None;
                }
                self.fetch();
                continue;
            }
            let entry = self.page.pop_front()?;
            // An entry that does not decode is skipped and fails the call.
            if let Some(item) = or_fail_later((self.decode)(self.field, entry)) {
                return Some(item);
            }
        }
    }
}

impl<T> fmt::Debug for Iter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iter")
            .field("field", &self.field)
            .field("dir", &self.dir)
            .field("remaining", &self.remaining)
            .finish_non_exhaustive()
    }
}

/// Ordered keys to several values each.
///
/// Each value is its own entry, keyed by the encoded key followed by an
/// 8-byte random suffix from the host, so values of one key are in no
/// particular order.
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::prelude::*;
/// # let _host = lambdastore_sdk::mock::MockHost::standalone();
///
/// let tags: MultiMap<String, String> = MultiMap::new("tags");
/// tags.insert("rust", "fast");
/// tags.insert("rust", "safe");
/// tags.insert("wasm", "portable");
///
/// let mut rust = tags.get_all("rust");
/// rust.sort();
/// assert_eq!(rust, ["fast", "safe"]);
/// assert_eq!(tags.iter().count(), 3);
/// assert_eq!(tags.remove_all("rust"), 2);
/// assert!(!tags.contains_key("rust"));
/// ```
pub struct MultiMap<K, V> {
    name: &'static str,
    _types: PhantomData<fn() -> (K, V)>,
}

field_common!(MultiMap<K, V>, FieldKind::MultiMap);

const SUFFIX_LEN: usize = 8;

impl<K: OwnedKey, V: Serialize + DeserializeOwned> MultiMap<K, V> {
    /// Adds `value` under `key`.
    pub fn insert<Q: Key + ?Sized, W: Serialize + ?Sized>(&self, key: &Q, value: &W)
    where
        K: Borrow<Q>,
        V: Borrow<W>,
    {
        let prefix = encode_key(key);
        // A repeated suffix would overwrite a value; 64 random bits make
        // that unlikely, the check makes it impossible.
        let entry_key = loop {
            let mut entry_key = prefix.clone();
            entry_key.extend_from_slice(&host::random_u64().to_be_bytes());
            if host::get(self.name, &entry_key).is_none() {
                break entry_key;
            }
        };
        write_value(self.name, &entry_key, value)
    }

    /// All values of `key`.
    pub fn get_all<Q: Key + ?Sized>(&self, key: &Q) -> Vec<V>
    where
        K: Borrow<Q>,
    {
        self.key_entries(key).filter_map(|e| or_fail_later(decode_value(self.name, &e.value))).collect()
    }

    /// Whether `key` has at least one value.
    pub fn contains_key<Q: Key + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.key_entries(key).limit(1).next().is_some()
    }

    /// Removes every value of `key`; returns how many there were.
    pub fn remove_all<Q: Key + ?Sized>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
    {
        let keys: Vec<Vec<u8>> = self.key_entries(key).map(|e| e.key).collect();
        for k in &keys {
            host::delete(self.name, k);
        }
        keys.len()
    }

    /// `(key, value)` pairs with keys in `bounds`, in key order.
    pub fn range(&self, bounds: impl RangeBounds<K>) -> Iter<(K, V)> {
        let (start, end) = prefix_bounds(&bounds);
        Iter::new(self.name, start, end, decode_multi_entry::<K, V>)
    }

    /// All `(key, value)` pairs, in key order.
    pub fn iter(&self) -> Iter<(K, V)> {
        self.range(..)
    }

    fn key_entries<Q: Key + ?Sized>(&self, key: &Q) -> Iter<Entry> {
        let prefix = encode_key(key);
        let end = prefix_successor(&prefix);
        Iter::new(self.name, Some(prefix), end, |_, e| Ok(e))
    }
}

fn decode_multi_entry<K: OwnedKey, V: DeserializeOwned>(
    field: &'static str,
    entry: Entry,
) -> Result<(K, V), FieldError> {
    let Some(split) = entry.key.len().checked_sub(SUFFIX_LEN) else {
        return Err(FieldError { field, message: "stored key has no multimap suffix".to_string() });
    };
    Ok((decode_map_key(field, &entry.key[..split])?, decode_value(field, &entry.value)?))
}

/// Ordered keys without values (a map whose values are empty).
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::prelude::*;
/// # let _host = lambdastore_sdk::mock::MockHost::standalone();
///
/// let members: Set<i64> = Set::new("members");
/// members.insert(&42);
/// members.insert(&7);
/// assert!(members.contains(&42));
/// assert_eq!(members.iter().collect::<Vec<_>>(), [7, 42]);
/// assert!(members.remove(&42));
/// assert!(!members.contains(&42));
/// ```
pub struct Set<T> {
    name: &'static str,
    _types: PhantomData<fn() -> T>,
}

field_common!(Set<T>, FieldKind::Set);

impl<T: OwnedKey> Set<T> {
    /// Adds `value` (a no-op if it is there).
    pub fn insert<Q: Key + ?Sized>(&self, value: &Q)
    where
        T: Borrow<Q>,
    {
        host::put(self.name, &encode_key(value), &[])
    }

    /// Whether `value` is in the set.
    pub fn contains<Q: Key + ?Sized>(&self, value: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        host::get(self.name, &encode_key(value)).is_some()
    }

    /// Removes `value`; returns whether it was there.
    pub fn remove<Q: Key + ?Sized>(&self, value: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        host::delete(self.name, &encode_key(value))
    }

    /// Members in `bounds`, in order.
    pub fn range(&self, bounds: impl RangeBounds<T>) -> Iter<T> {
        let (start, end) = key_bounds(&bounds);
        Iter::new(self.name, start, end, |field, e| decode_map_key(field, &e.key))
    }

    /// All members, in order.
    pub fn iter(&self) -> Iter<T> {
        self.range(..)
    }

    /// Whether the set has no members.
    pub fn is_empty(&self) -> bool {
        host::scan(self.name, None, None, 1, Direction::Forward).is_empty()
    }
}
