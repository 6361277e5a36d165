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
pub(crate) struct WriteBuffer {
    entries: BTreeMap<EntryKey, Slot>,
    /// Objects to insert, in creation order: (id, app, type).
    created: Vec<(i64, String, String)>,
    spawned: Vec<Spawned>,
    journal: Vec<Undo>,
    /// Bytes of every write so far (field, key, value and
    /// `WRITE_OVERHEAD`): about what the buffer and its journal, which keeps
    /// each overwritten value, hold at most.
    bytes: usize,
}

impl WriteBuffer {
    pub(crate) fn savepoint(&self) -> usize {
        self.journal.len()
    }

    /// Undoes every change after `savepoint`; returns the ids of the
    /// objects whose creation was undone.
    pub(crate) fn rollback_to(&mut self, savepoint: usize) -> Vec<i64> {
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
    pub(crate) fn get(&self, key: &EntryKey) -> Option<&Slot> {
        self.entries.get(key)
    }

    pub(crate) fn put(&mut self, key: EntryKey, value: Vec<u8>) {
        self.write(key, Some(value));
    }

    pub(crate) fn delete(&mut self, key: EntryKey) {
        self.write(key, None);
    }

    /// What a write of this entry would bring the buffer's bytes to.
    pub(crate) fn bytes_after(&self, key: &EntryKey, value: Option<&[u8]>) -> usize {
        self.bytes.saturating_add(WRITE_OVERHEAD + key.1.len() + key.2.len() + value.map_or(0, <[u8]>::len))
    }

    fn write(&mut self, key: EntryKey, slot: Slot) {
        self.bytes = self.bytes_after(&key, slot.as_deref());
        let previous = self.entries.insert(key.clone(), slot);
        self.journal.push(Undo::Entry(key, previous));
    }

    pub(crate) fn create_object(&mut self, id: i64, app: String, type_name: String) {
        self.created.push((id, app, type_name));
        self.journal.push(Undo::Created(id));
    }

    pub(crate) fn spawn(&mut self, call: Spawned) {
        self.spawned.push(call);
        self.journal.push(Undo::Spawned);
    }

    /// Buffered entries of one field with start <= key < end.
    pub(crate) fn range<'a>(
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

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.created.is_empty() && self.spawned.is_empty()
    }

    pub(crate) fn spawned(&self) -> &[Spawned] {
        &self.spawned
    }

    pub(crate) fn created(&self) -> &[(i64, String, String)] {
        &self.created
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = (&EntryKey, &Slot)> {
        self.entries.iter()
    }
}
