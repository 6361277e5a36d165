//! An entry's new value written straight to the heap, as the executor's
//! statement would write it, without the executor: its start-up for each
//! entry, and `ON CONFLICT`'s lock of the row (a WAL record of its own),
//! cost more than the write itself. A value of an existing entry is
//! written over its row (`heap_update`); a new entry is inserted
//! (`heap_insert`) after locking its object's row as the foreign key's
//! check would. Where this path could differ from the statement it
//! answers false, having written nothing, and the statement runs.

use super::probe::{Bounds, Part, Row, Scan};
use super::Place;
use crate::error::{LambdaError, Result};
use pgrx::pg_sys;
use pgrx::IntoDatum;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

thread_local! {
    /// Where the current workflow read its entries' rows, by a hash of the
    /// key (`remember_row`): a workflow mostly writes what it read (a
    /// balance, a counter), and a write then goes to that row without a
    /// second probe of the index. Only a hint: `update_last_column` takes
    /// the row there only if it is the key's visible version, and probes
    /// otherwise. Forgotten when a workflow starts and when the transaction
    /// ends, so that a location never outlives the file it points into (a
    /// TRUNCATE between two workflows of a transaction makes a new one).
    static READ_AT: RefCell<HashMap<u64, pg_sys::ItemPointerData>> = RefCell::new(HashMap::new());
}

/// Row locations a workflow remembers at most: a call writes few entries,
/// and a workflow reading many is not slowed by keeping them all.
const REMEMBERED_ROWS: usize = 1024;

fn key_hash((object, field, key): (i64, &str, &[u8])) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (object, field, key).hash(&mut hasher);
    hasher.finish()
}

/// Remembers that the workflow found the entry `key`'s row at `at`.
pub(crate) fn remember_row(key: (i64, &str, &[u8]), at: pg_sys::ItemPointerData) {
    READ_AT.with(|rows| {
        let mut rows = rows.borrow_mut();
        if rows.len() < REMEMBERED_ROWS {
            rows.insert(key_hash(key), at);
        }
    });
}

/// Forgets every row location (see `READ_AT`).
pub(crate) fn forget_rows() {
    READ_AT.with(|rows| rows.borrow_mut().clear());
}

fn remembered_row(key: (i64, &str, &[u8])) -> Option<pg_sys::ItemPointerData> {
    READ_AT.with(|rows| rows.borrow().get(&key_hash(key)).copied())
}

/// Which writes a table lets this path make (`plain`), remembered per
/// table until the next relcache invalidation, which every change of the
/// table sends (`catalog::remembered_plain`).
#[derive(Clone, Copy)]
pub(crate) struct Plain {
    /// A new value over an existing row.
    update: bool,
    /// A new row.
    insert: bool,
}

/// Writes `value` as the entry (object, field, key) of `lambdastore.entries`
/// at `place`, as `INSERT ... ON CONFLICT (object_id, field, key) DO UPDATE
/// SET value = EXCLUDED.value` would at READ COMMITTED. An entry with a
/// visible row gets the value written over that row. A new entry is
/// inserted only where the transaction holds its set for writing
/// (`exclusive`, OCC's lock), so that no other inserts the same key
/// meanwhile: a concurrent insert would end this one with a unique
/// violation where the statement would update. Returns false, having written nothing, where the
/// statement must run instead: a concurrent transaction updated or deleted
/// the row since (the statement follows the row as READ COMMITTED does); a
/// new entry whose object's row is gone or changed (the statement's
/// foreign-key check says so), or not `exclusive`; the current
/// user lacks the statement's rights (the statement says so); or the tables
/// are not the plain ones this path knows (`plain`). Used only where probes
/// are (`probe::usable`): under REPEATABLE READ or SERIALIZABLE the
/// statement runs.
pub(crate) fn write_entry(
    place: Place,
    (object, field, key): (i64, &str, &[u8]),
    value: &[u8],
    exclusive: bool,
) -> Result<bool> {
    let entries = (super::relation(c"entries", place)?, super::relation(c"entries_pkey", place)?);
    let objects = (super::relation(c"objects", place)?, super::relation(c"objects_pkey", place)?);
    if [entries.0, entries.1, objects.0, objects.1].contains(&pg_sys::InvalidOid) {
        return Err(LambdaError::Internal("lambdastore.entries, lambdastore.objects or an index is missing".into()));
    }
    if !super::may(entries.0, pg_sys::ACL_INSERT | pg_sys::ACL_UPDATE) {
        return Ok(false);
    }
    let parts = [Part::Int8(object), Part::Text(field), Part::Bytes(key)];
    // SAFETY: every call below is a PostgreSQL function used as the
    // executor uses it, on the main thread inside a transaction; an ERROR
    // raised by any of them unwinds to the resource owner, which releases
    // the relations, buffers, scans and snapshots. The rows are written as
    // the executor's UPDATE and INSERT write them (the heap, then the index
    // entries they need), under the locks those take.
    unsafe {
        pg_sys::CommandCounterIncrement();
        let lock = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
        let relation = pg_sys::table_open(entries.0, lock);
        let index = pg_sys::index_open(entries.1, lock);
        let shape = super::remembered_plain(entries.0, || plain(relation, index, objects.0));
        let written = if shape.update {
            pg_sys::CheckCmdReplicaIdentity(relation, pg_sys::CmdType::CMD_UPDATE);
            match update_last_column(relation, index, &parts, value, remembered_row((object, field, key))) {
                Found::Written => Ok(true),
                Found::None if exclusive && shape.insert => match lock_object(objects, object) {
                    ObjectRow::Locked => {
                        insert_row(relation, index, &parts, value);
                        Ok(true)
                    }
                    ObjectRow::Gone => Err(deleted_meanwhile(object)),
                    ObjectRow::Changed => Ok(false),
                },
                Found::None => Ok(false),
                // A row deleted since the snapshot may be the object's
                // delete: its entries go with it. Only a delete committed
                // between the snapshot and the update lands here (one still
                // running holds the object's entry sets, and the call's
                // commit is refused before it writes): not met by a test.
                Found::Changed => match object_row(objects, object) {
                    None => Err(deleted_meanwhile(object)),
                    Some(_) => Ok(false),
                },
            }
        } else {
            Ok(false)
        };
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        written
    }
}

/// A workflow's write to an object that a concurrent `delete_object`
/// deleted after the workflow found it (a call running while the delete
/// committed): retried, the call finds no object (42704). The statement's
/// own write met the entries' foreign key instead (23503).
fn deleted_meanwhile(object: i64) -> LambdaError {
    LambdaError::SerializationFailure(format!("object {object} was deleted by a concurrent transaction"))
}

/// What `lock_object` found.
enum ObjectRow {
    /// Its row, locked.
    Locked,
    /// No row: deleted, and the delete committed.
    Gone,
    /// A row that changed since the snapshot: the statement follows it.
    Changed,
}

/// What `update_last_column` found.
enum Found {
    /// The row, now with the new value.
    Written,
    /// The row, changed or deleted by a concurrent transaction since the
    /// snapshot: the statement follows it.
    Changed,
    /// No visible row.
    None,
}

/// The columns of `lambdastore.entries`, in order: the key's, then the value.
const COLUMNS: [pg_sys::Oid; 4] = [pg_sys::INT8OID, pg_sys::TEXTOID, pg_sys::BYTEAOID, pg_sys::BYTEAOID];

/// Whether `relation` is a plain heap table of `COLUMNS`, whose only index
/// is `index`, and whose UPDATE and INSERT run nothing but the write: no
/// CHECK, no row security, no rule, not a partition, no trigger but the
/// foreign keys' checks. An UPDATE that keeps the key skips its foreign
/// keys' checks; an INSERT is made here only where the one foreign key is
/// `(object_id)` on `objects`'s `(object_id)`, whose check `object_locked`
/// makes. A table someone changed takes the statement's path.
///
/// SAFETY: `relation` and `index` are open.
unsafe fn plain(relation: pg_sys::Relation, index: pg_sys::Relation, objects: pg_sys::Oid) -> Plain {
    // SAFETY: the caller's promise; the relcache entries stay valid while
    // the relations are open.
    unsafe {
        let never = Plain { update: false, insert: false };
        let (rel, form) = (&*relation, &*(*relation).rd_rel);
        let desc = &*rel.rd_att;
        let columns = COLUMNS.len();
        if form.relkind != pg_sys::RELKIND_RELATION as std::ffi::c_char
            || form.relam != pg_sys::HEAP_TABLE_AM_OID
            || form.relrowsecurity
            || form.relhasrules
            || form.relispartition
            || desc.natts as usize != columns
            || desc
                .attrs
                .as_slice(columns)
                .iter()
                .zip(COLUMNS)
                .any(|(column, type_oid)| column.attisdropped || column.atttypid != type_oid)
            || (!desc.constr.is_null() && ((*desc.constr).num_check > 0 || (*desc.constr).has_generated_stored))
        {
            return never;
        }
        let indexes = pg_sys::RelationGetIndexList(relation);
        let only = pgrx::PgList::<pg_sys::Oid>::from_pg(indexes);
        let only_this = only.len() == 1 && only.get_oid(0) == Some((*index).rd_id);
        pg_sys::list_free(indexes);
        let index_form = &*(*index).rd_index;
        if !only_this
            || !index_form.indimmediate
            || index_form.indisexclusion
            || !pg_sys::RelationGetIndexExpressions(index).is_null()
            || !pg_sys::RelationGetIndexPredicate(index).is_null()
        {
            return never;
        }

        let keys = pgrx::PgList::<pg_sys::ForeignKeyCacheInfo>::from_pg(pg_sys::RelationGetFKeyList(relation));
        let value_in_a_key = keys.iter_ptr().any(|fk| {
            let fk = &*fk;
            fk.conkey[..fk.nkeys as usize].contains(&(columns as i16))
        });
        let only_the_object = keys.len() == 1
            && keys.iter_ptr().all(|fk| {
                let fk = &*fk;
                fk.nkeys == 1 && fk.conkey[0] == 1 && fk.confkey[0] == 1 && fk.confrelid == objects
            });
        let Some(triggers) = rel.trigdesc.as_ref() else {
            return Plain { update: !value_in_a_key, insert: keys.is_empty() };
        };
        let all = std::slice::from_raw_parts(triggers.triggers, triggers.numtriggers as usize);
        let others_on = |event: u32| {
            all.iter().any(|t| {
                (t.tgtype as u32 & event) != 0 && pg_sys::RI_FKey_trigger_type(t.tgfoid) != pg_sys::RI_TRIGGER_FK as i32
            })
        };
        let update = !(triggers.trig_update_before_row
            || triggers.trig_update_instead_row
            || triggers.trig_update_before_statement
            || triggers.trig_update_after_statement
            || triggers.trig_update_old_table
            || triggers.trig_update_new_table
            || others_on(pg_sys::TRIGGER_TYPE_UPDATE)
            || value_in_a_key);
        let insert = !(triggers.trig_insert_before_row
            || triggers.trig_insert_instead_row
            || triggers.trig_insert_before_statement
            || triggers.trig_insert_after_statement
            || triggers.trig_insert_new_table
            || others_on(pg_sys::TRIGGER_TYPE_INSERT))
            && (keys.is_empty() || only_the_object);
        Plain { update, insert }
    }
}

/// The update itself: finds the row's visible version (at `read_at`, where
/// the workflow read it, if it is still that; else through the index),
/// writes the new one over it, and gives a version off its page its index
/// entry.
///
/// SAFETY: `relation` and `index` are open under RowExclusiveLock.
unsafe fn update_last_column(
    relation: pg_sys::Relation,
    index: pg_sys::Relation,
    key: &[Part<'_>],
    value: &[u8],
    read_at: Option<pg_sys::ItemPointerData>,
) -> Found {
    // SAFETY: the caller's promise; the new tuple is ours until freed.
    unsafe {
        let desc = (*relation).rd_att;
        let over = |old: pg_sys::HeapTuple| {
            let mut column = (*desc).natts;
            let mut datum = value.into_datum().expect("bytea is not null");
            let mut null = false;
            let new = pg_sys::heap_modify_tuple_by_cols(old, desc, 1, &mut column, &mut datum, &mut null);
            pg_sys::pfree(datum.cast_mut_ptr());
            ((*old).t_self, new)
        };
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        // A key has one version visible to a snapshot: the one the index
        // would lead to, if it is at `read_at`.
        let mut found = read_at.and_then(|at| {
            let mut row = pg_sys::HeapTupleData { t_self: at, ..Default::default() };
            let mut buffer: pg_sys::Buffer = pg_sys::InvalidBuffer as pg_sys::Buffer;
            let visible = pg_sys::heap_fetch(relation, snapshot, &mut row, &mut buffer, false);
            let found = (visible && Row::new(&mut row, desc).has_key(key)).then(|| over(&mut row));
            if buffer != pg_sys::InvalidBuffer as pg_sys::Buffer {
                pg_sys::ReleaseBuffer(buffer);
            }
            found
        });
        if found.is_none() {
            let scan = Scan::begin(relation, index, snapshot, key, &Bounds::default());
            found = scan.next(true).map(over);
            scan.end();
        }
        pg_sys::UnregisterSnapshot(snapshot);
        let Some((mut at, new)) = found else { return Found::None };

        let mut failure = pg_sys::TM_FailureData::default();
        let mut mode = pg_sys::LockTupleMode::LockTupleExclusive;
        let cid = pg_sys::GetCurrentCommandId(true);
        let result =
            pg_sys::heap_update(relation, &mut at, new, cid, std::ptr::null_mut(), true, &mut failure, &mut mode);
        let written = result == pg_sys::TM_Result::TM_Ok;
        if written && (*(*new).t_data).t_infomask2 as u32 & pg_sys::HEAP_ONLY_TUPLE == 0 {
            // The key is unchanged: a hint for btree's bottom-up deletion.
            index_entry(relation, index, new, true);
        }
        pg_sys::heap_freetuple(new);
        if written {
            Found::Written
        } else {
            Found::Changed
        }
    }
}

/// The location of the object's row, the latest version visible (None: no
/// such row).
///
/// SAFETY: inside a transaction; `objects` (table, primary key) exist.
unsafe fn object_row(objects: (pg_sys::Oid, pg_sys::Oid), object: i64) -> Option<pg_sys::ItemPointerData> {
    // SAFETY: the caller's promise; the scan and snapshot end here.
    unsafe {
        let relation = pg_sys::table_open(objects.0, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let at = object_row_in(relation, objects.1, object);
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        at
    }
}

/// `object_row` in the objects table, open.
///
/// SAFETY: inside a transaction; `relation` is open, `index` its primary key.
unsafe fn object_row_in(
    relation: pg_sys::Relation,
    index: pg_sys::Oid,
    object: i64,
) -> Option<pg_sys::ItemPointerData> {
    // SAFETY: the caller's promise; the scan and snapshot end here.
    unsafe {
        let index = pg_sys::index_open(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let scan = Scan::begin(relation, index, snapshot, &[Part::Int8(object)], &Bounds::default());
        let at = scan.next(true).map(|row| (*row).t_self);
        scan.end();
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        at
    }
}

/// The foreign key's check of a new entry, as `RI_FKey_check` makes it at
/// READ COMMITTED: the object's row, the latest version visible, locked
/// `FOR KEY SHARE` (waiting for a transaction that holds it more strongly),
/// so that it cannot be deleted, nor its key changed, before this
/// transaction ends. `Changed` where it was changed since the snapshot (or
/// the table is not a heap): the statement's own check then follows it.
///
/// SAFETY: inside a transaction; `objects` (table, primary key) exist.
unsafe fn lock_object(objects: (pg_sys::Oid, pg_sys::Oid), object: i64) -> ObjectRow {
    // SAFETY: the caller's promise; the locked row's buffer is released
    // here, the lock itself is the transaction's.
    unsafe {
        // The lock a `SELECT ... FOR KEY SHARE` takes on the table.
        let relation = pg_sys::table_open(objects.0, pg_sys::RowShareLock as pg_sys::LOCKMODE);
        let found = match object_row_in(relation, objects.1, object) {
            None => ObjectRow::Gone,
            Some(_) if (*(*relation).rd_rel).relam != pg_sys::HEAP_TABLE_AM_OID => ObjectRow::Changed,
            Some(at) => {
                let mut row = pg_sys::HeapTupleData { t_self: at, ..Default::default() };
                let mut buffer: pg_sys::Buffer = pg_sys::InvalidBuffer as pg_sys::Buffer;
                let mut failure = pg_sys::TM_FailureData::default();
                // As the executor locks it: later versions of a row being
                // updated are locked too, so that none can be deleted.
                let follow_updates = true;
                let result = pg_sys::heap_lock_tuple(
                    relation,
                    &mut row,
                    pg_sys::GetCurrentCommandId(false),
                    pg_sys::LockTupleMode::LockTupleKeyShare,
                    pg_sys::LockWaitPolicy::LockWaitBlock,
                    follow_updates,
                    &mut buffer,
                    &mut failure,
                );
                if buffer != pg_sys::InvalidBuffer as pg_sys::Buffer {
                    pg_sys::ReleaseBuffer(buffer);
                }
                match result {
                    pg_sys::TM_Result::TM_Ok => ObjectRow::Locked,
                    // Deleted by a transaction that committed while this
                    // one waited for its lock.
                    pg_sys::TM_Result::TM_Deleted => ObjectRow::Gone,
                    _ => ObjectRow::Changed,
                }
            }
        };
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        found
    }
}

/// A new row of the key's columns and `value`, with its index entry. A key
/// that another transaction inserted meanwhile fails as the statement's
/// INSERT would without `ON CONFLICT`: waiting for that transaction, then
/// a unique violation if it committed (`write_entry` says when that cannot
/// happen).
///
/// SAFETY: `relation` and `index` are open under RowExclusiveLock, and
/// `plain` approved the table (the key's columns in its order, then the
/// value).
unsafe fn insert_row(relation: pg_sys::Relation, index: pg_sys::Relation, key: &[Part<'_>], value: &[u8]) {
    // SAFETY: the caller's promise; the datums and the tuple are ours
    // until freed, heap_insert toasts a copy where the value needs it.
    unsafe {
        let mut values: Vec<pg_sys::Datum> = key.iter().map(|part| part.datum().0).collect();
        values.push(value.into_datum().expect("bytea is not null"));
        let mut nulls = vec![false; values.len()];
        let tuple = pg_sys::heap_form_tuple((*relation).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::heap_insert(relation, tuple, pg_sys::GetCurrentCommandId(true), 0, std::ptr::null_mut());
        index_entry(relation, index, tuple, false);
        pg_sys::heap_freetuple(tuple);
        let copies = key.iter().map(|part| !matches!(part, Part::Int8(_))).chain([true]);
        for (datum, copy) in values.iter().zip(copies) {
            if copy {
                pg_sys::pfree(datum.cast_mut_ptr());
            }
        }
    }
}

/// The index entry of a row version just written, as
/// `ExecInsertIndexTuples` makes it (a unique index checks for a
/// conflicting live row, waiting for its transaction if need be);
/// `unchanged`: an UPDATE that kept the key.
///
/// SAFETY: `relation` and `index` are open; `tuple` was just written.
unsafe fn index_entry(relation: pg_sys::Relation, index: pg_sys::Relation, tuple: pg_sys::HeapTuple, unchanged: bool) {
    // SAFETY: the caller's promise; `plain` ruled out expressions, so
    // FormIndexDatum needs no executor state.
    unsafe {
        let info = pg_sys::BuildIndexInfo(index);
        let slot = pg_sys::MakeSingleTupleTableSlot((*relation).rd_att, &pg_sys::TTSOpsHeapTuple);
        pg_sys::ExecStoreHeapTuple(tuple, slot, false);
        let mut values = [pg_sys::Datum::from(0); pg_sys::INDEX_MAX_KEYS as usize];
        let mut nulls = [false; pg_sys::INDEX_MAX_KEYS as usize];
        pg_sys::FormIndexDatum(info, slot, std::ptr::null_mut(), values.as_mut_ptr(), nulls.as_mut_ptr());
        let unique = if (*(*index).rd_index).indisunique {
            pg_sys::IndexUniqueCheck::UNIQUE_CHECK_YES
        } else {
            pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO
        };
        pg_sys::index_insert(
            index,
            values.as_mut_ptr(),
            nulls.as_mut_ptr(),
            &mut (*tuple).t_self,
            relation,
            unique,
            unchanged,
            info,
        );
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        // A btree's insert keeps nothing in it; a call writing many
        // entries would otherwise hold one per entry until the memory
        // context is reset.
        pg_sys::pfree(info.cast());
    }
}
