//! Buffered writes of a workflow, with an undo journal for savepoints.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::model::{EntryKey, Slot, Spawned};

enum Undo {
    /// The entry's buffered state before a write (`None`: not buffered).
    Entry(EntryKey, Option<Slot>),
    /// An object created by this workflow.
    Created(i64),
    /// A spawned call (the last one).
    Spawned,
}

/// What a write costs beside its bytes: the map's node slot, the three
/// allocations of its key and value, and the journal's copy of the key
/// (1,000,000 one-byte writes took a backend to 515 MB).
const WRITE_OVERHEAD: usize = 256;

#[derive(Default)]
pub struct WriteBuffer {
    entries: BTreeMap<EntryKey, Slot>,
    /// Objects to insert, in creation order: (id, app, type).
    created: Vec<(i64, String, String)>,
    spawned: Vec<Spawned>,
    journal: Vec<Undo>,
    /// Bytes of every write and spawned call so far (field, key, value, or
    /// a call's names and arguments, and `WRITE_OVERHEAD`): about what the
    /// buffer and its journal, which keeps each overwritten value, hold at
    /// most.
    bytes: usize,
}

impl WriteBuffer {
    #[inline]
    pub fn savepoint(&self) -> usize {
        self.journal.len()
    }

    /// Undoes every change after `savepoint`; returns the ids of the
    /// objects whose creation was undone.
    pub fn rollback_to(&mut self, savepoint: usize) -> Vec<i64> {
        let mut forgotten = Vec::new();
        while self.journal.len() > savepoint {
            match self.journal.pop().expect("journal is longer than the savepoint") {
                Undo::Entry(key, Some(previous)) => {
                    self.entries.insert(key, previous);
                }
                Undo::Entry(key, None) => {
                    self.entries.remove(&key);
                }
                Undo::Created(id) => {
                    self.created.retain(|(created, _, _)| *created != id);
                    forgotten.push(id);
                }
                Undo::Spawned => {
                    self.spawned.pop();
                }
            }
        }
        forgotten
    }

    /// The buffered state of an entry: `None` if this workflow has not
    /// written it, `Some(None)` if it deleted it.
    #[inline]
    pub fn get(&self, key: &EntryKey) -> Option<&Slot> {
        self.entries.get(key)
    }

    #[inline]
    pub fn put(&mut self, key: EntryKey, value: Vec<u8>) {
        self.write(key, Some(value));
    }

    #[inline]
    pub fn delete(&mut self, key: EntryKey) {
        self.write(key, None);
    }

    /// What a write of this entry would bring the buffer's bytes to.
    #[inline]
    pub fn bytes_after(&self, key: &EntryKey, value: Option<&[u8]>) -> usize {
        self.bytes.saturating_add(WRITE_OVERHEAD + key.1.len() + key.2.len() + value.map_or(0, <[u8]>::len))
    }

    fn write(&mut self, key: EntryKey, slot: Slot) {
        self.bytes = self.bytes_after(&key, slot.as_deref());
        let previous = self.entries.insert(key.clone(), slot);
        self.journal.push(Undo::Entry(key, previous));
    }

    pub fn create_object(&mut self, id: i64, app: String, type_name: String) {
        self.created.push((id, app, type_name));
        self.journal.push(Undo::Created(id));
    }

    /// What queueing `call` would bring the buffer's bytes to: its
    /// arguments are held until the commit as written values are.
    #[inline]
    pub fn bytes_after_spawn(&self, call: &Spawned) -> usize {
        let timer = call.timer.as_ref().map_or(0, String::len);
        self.bytes.saturating_add(WRITE_OVERHEAD + call.app.len() + call.method.len() + call.args.len() + timer)
    }

    pub fn spawn(&mut self, call: Spawned) {
        self.bytes = self.bytes_after_spawn(&call);
        self.spawned.push(call);
        self.journal.push(Undo::Spawned);
    }

    /// Buffered entries of one field with start <= key < end.
    pub fn range<'a>(
        &'a self,
        object: i64,
        field: &str,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
    ) -> impl DoubleEndedIterator<Item = (&'a [u8], &'a Slot)> + 'a {
        let lower = (object, field.to_string(), start.unwrap_or_default().to_vec());
        let upper = match end {
            Some(end) => Bound::Excluded((object, field.to_string(), end.to_vec())),
            // Every key of `field` sorts before the first key of the next
            // field name; "field\0" is the smallest name after `field`.
            None => Bound::Excluded((object, format!("{field}\0"), Vec::new())),
        };
        self.entries.range((Bound::Included(lower), upper)).map(|((_, _, key), slot)| (key.as_slice(), slot))
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.created.is_empty() && self.spawned.is_empty()
    }

    #[inline]
    pub fn spawned(&self) -> &[Spawned] {
        &self.spawned
    }

    #[inline]
    pub fn created(&self) -> &[(i64, String, String)] {
        &self.created
    }

    pub fn entries(&self) -> impl Iterator<Item = (&EntryKey, &Slot)> {
        self.entries.iter()
    }
}

/// A scan's result: the stored entries and the buffered writes of the same
/// range, each already in scan order (`forward` or reversed), merged; on
/// equal keys the buffer wins, and a buffered delete hides the entry. At
/// most `limit` entries. Each buffered key hides at most one stored entry,
/// so `limit + buffered` stored rows are always enough.
pub fn merge_scan(
    stored: Vec<(Vec<u8>, Vec<u8>)>,
    buffered: Vec<(&[u8], &Slot)>,
    forward: bool,
    limit: usize,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let before = |a: &[u8], b: &[u8]| if forward { a < b } else { a > b };
    let mut out = Vec::with_capacity(limit.min(stored.len() + buffered.len()));
    let (mut s, mut b) = (stored.into_iter().peekable(), buffered.into_iter().peekable());
    while out.len() < limit {
        let take_buffered = match (s.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some((sk, _)), Some((bk, _))) => {
                if sk.as_slice() == *bk {
                    s.next(); // shadowed by the buffered write
                    true
                } else {
                    before(bk, sk)
                }
            }
        };
        if take_buffered {
            let (key, slot) = b.next().expect("peeked");
            if let Some(value) = slot {
                out.push((key.to_vec(), value.clone()));
            }
        } else {
            out.push(s.next().expect("peeked"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(field: &str, key: &str) -> EntryKey {
        (1, field.to_string(), key.as_bytes().to_vec())
    }

    fn spawned() -> Spawned {
        Spawned { object: 2, app: "a".into(), method: "m".into(), args: "{}".into(), ..Default::default() }
    }

    #[test]
    fn a_savepoint_undoes_writes_creations_and_spawns_after_it() {
        let mut buffer = WriteBuffer::default();
        buffer.put(key("f", "a"), b"1".to_vec());
        let savepoint = buffer.savepoint();
        buffer.put(key("f", "a"), b"2".to_vec());
        buffer.delete(key("f", "b"));
        buffer.create_object(7, "a".into(), "T".into());
        buffer.spawn(spawned());
        assert_eq!(buffer.rollback_to(savepoint), vec![7]);
        assert_eq!(buffer.get(&key("f", "a")), Some(&Some(b"1".to_vec())));
        assert_eq!(buffer.get(&key("f", "b")), None);
        assert!(buffer.created().is_empty() && buffer.spawned().is_empty());
        assert!(!buffer.is_empty());
        buffer.rollback_to(0);
        assert!(buffer.is_empty());
    }

    #[test]
    fn bytes_count_every_write_overwritten_ones_included() {
        let mut buffer = WriteBuffer::default();
        let k = key("f", "k");
        let one = buffer.bytes_after(&k, Some(b"12345"));
        assert_eq!(one, WRITE_OVERHEAD + 1 + 1 + 5);
        buffer.put(k.clone(), b"12345".to_vec());
        buffer.put(k.clone(), b"12345".to_vec());
        assert_eq!(buffer.bytes_after(&k, None), 3 * WRITE_OVERHEAD + 2 * (1 + 1 + 5) + 2);
    }

    #[test]
    fn a_range_stays_inside_its_field_and_bounds() {
        let mut buffer = WriteBuffer::default();
        for (field, k) in [("f", "a"), ("f", "b"), ("f", "c"), ("f\0x", "a"), ("fg", "a"), ("e", "z")] {
            buffer.put(key(field, k), k.as_bytes().to_vec());
        }
        let keys = |start: Option<&[u8]>, end: Option<&[u8]>| -> Vec<Vec<u8>> {
            buffer.range(1, "f", start, end).map(|(k, _)| k.to_vec()).collect()
        };
        assert_eq!(keys(None, None), [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(keys(Some(b"b"), None), [b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(keys(Some(b"a"), Some(b"c")), [b"a".to_vec(), b"b".to_vec()]);
        assert!(buffer.range(2, "f", None, None).next().is_none());
    }

    #[test]
    fn a_merged_scan_prefers_the_buffer_and_hides_its_deletes() {
        let stored = |keys: &[&str]| keys.iter().map(|k| (k.as_bytes().to_vec(), b"stored".to_vec())).collect();
        let (new, gone) = (Some(b"new".to_vec()), None);
        let buffered: Vec<(&[u8], &Slot)> = vec![(b"b", &new), (b"c", &gone), (b"e", &new)];
        let merged = merge_scan(stored(&["a", "b", "c", "d"]), buffered, true, 10);
        let expect = [("a", "stored"), ("b", "new"), ("d", "stored"), ("e", "new")];
        assert_eq!(merged, expect.map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())));

        let buffered: Vec<(&[u8], &Slot)> = vec![(b"e", &new), (b"c", &gone), (b"b", &new)];
        let merged = merge_scan(stored(&["d", "c", "b", "a"]), buffered, false, 3);
        let keys: Vec<_> = merged.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(keys, [b"e".as_slice(), b"d", b"b"]);
    }
}
