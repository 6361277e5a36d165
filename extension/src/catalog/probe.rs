//! Point reads and range scans by primary key straight through the index,
//! without SPI's plan cache, portal and executor: a warm call reads each
//! entry, scans a field's range and checks each entry-set version this way,
//! and executor start-up (a cursor's, for a scan) cost more than the index
//! lookup itself. An entry's new value is written over its row the same way
//! (`overwrite`).
//!
//! A probe behaves like the kept SPI statement it replaces: the caller's
//! table privilege is checked, the command counter is advanced so the
//! transaction's own earlier writes are seen, and the read uses a fresh
//! snapshot of READ COMMITTED (on a hot standby, the one every call of the
//! transaction reads with: pg/standby.rs). Probes are used only at READ COMMITTED (which
//! OCC requires): under REPEATABLE READ or SERIALIZABLE, allowed with
//! `concurrency_control = off`, reads keep going through SPI and the
//! executor, which reads the transaction snapshot and takes SSI's locks.

use super::Place;
use crate::error::{LambdaError, Result};
use pgrx::pg_sys;
use pgrx::{FromDatum, IntoDatum};
use std::ffi::CStr;
use std::num::NonZeroUsize;

/// Whether a probe reads what the SPI statement would.
pub(crate) fn usable() -> bool {
    !crate::pg::xact::has_transaction_snapshot()
}

/// One column of a primary key: (object_id bigint, text collate "C", bytea).
pub(crate) enum Part<'a> {
    Int8(i64),
    Text(&'a str),
    Bytes(&'a [u8]),
}

impl Part<'_> {
    /// The datum and equality function of this column (a palloc'd copy
    /// for text and bytea).
    fn datum(&self) -> (pg_sys::Datum, u32) {
        match self {
            Part::Int8(n) => (pg_sys::Datum::from(*n), pg_sys::F_INT8EQ),
            Part::Text(t) => (t.into_datum().expect("text is not null"), pg_sys::F_TEXTEQ),
            Part::Bytes(b) => (b.into_datum().expect("bytea is not null"), pg_sys::F_BYTEAEQ),
        }
    }
}

/// The columns of one row, read while the scan still holds it.
pub(crate) struct Row {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
}

impl Row {
    /// Column `attno` (from 1) as bytea, detoasted and copied.
    pub(crate) fn bytes(&self, attno: usize) -> Option<Vec<u8>> {
        self.datum(attno).and_then(|(datum, is_null)| {
            // SAFETY: the column is bytea (see the callers' tables); it is
            // copied while the scan still holds the row. (pgrx's `Vec<u8>`
            // conversion copies byte by byte: 2% of a read-only call
            // reading 5 KiB; and its `&[u8]` leaves a detoasted copy behind.)
            (!is_null).then(|| unsafe { super::bytea_bytes(datum) })
        })
    }

    pub(crate) fn text(&self, attno: usize) -> Option<String> {
        self.datum(attno).and_then(|(datum, is_null)| {
            // SAFETY: the column is text (see the callers' tables).
            unsafe { String::from_polymorphic_datum(datum, is_null, pg_sys::TEXTOID) }
        })
    }

    fn datum(&self, attno: usize) -> Option<(pg_sys::Datum, bool)> {
        // SAFETY: the tuple and its descriptor are alive for the scan.
        let datum = unsafe { pgrx::heap_getattr_raw(self.tuple, NonZeroUsize::new(attno)?, self.desc) };
        Some(datum.map_or((pg_sys::Datum::from(0), true), |d| (d, false)))
    }
}

/// The row of `table` (in schema lambdastore, at `place`) whose primary
/// key, read through its index `index`, is `key`, handed to `read`.
pub(crate) fn by_key<R>(
    place: Place,
    table: &'static CStr,
    index: &'static CStr,
    key: &[Part<'_>],
    read: impl FnOnce(&Row) -> R,
) -> Result<Option<R>> {
    let mut read = Some(read);
    Ok(by_prefix(place, table, index, key, 1, |row| (read.take().expect("one row"))(row))?.pop())
}

/// The rows of `table` whose primary key starts with `prefix`, in key
/// order, at most `limit`, each handed to `read`.
pub(crate) fn by_prefix<R>(
    place: Place,
    table: &'static CStr,
    index: &'static CStr,
    prefix: &[Part<'_>],
    limit: usize,
    mut read: impl FnMut(&Row) -> R,
) -> Result<Vec<R>> {
    let mut rows = Vec::new();
    if limit > 0 {
        by_range(place, table, index, prefix, Bounds::default(), true, |row| {
            rows.push(read(row));
            Ok(rows.len() < limit)
        })?;
    }
    Ok(rows)
}

/// Bounds on the bytea column after a key's prefix: `from <= key < before`.
#[derive(Default)]
pub(crate) struct Bounds<'a> {
    pub(crate) from: Option<&'a [u8]>,
    pub(crate) before: Option<&'a [u8]>,
}

/// The rows of `table` whose primary key starts with `prefix` and whose
/// next column is within `bounds`, in key order (or reverse), each handed
/// to `read` until it answers false or fails; its error is the scan's,
/// once the scan has ended.
pub(crate) fn by_range(
    place: Place,
    table: &'static CStr,
    index: &'static CStr,
    prefix: &[Part<'_>],
    bounds: Bounds<'_>,
    forward: bool,
    mut read: impl FnMut(&Row) -> Result<bool>,
) -> Result<()> {
    // SAFETY: every call below is a PostgreSQL function used as the
    // executor uses it, on the main thread inside a transaction; an ERROR
    // raised by any of them unwinds to the resource owner, which releases
    // the relations, scan and snapshot.
    let (table_oid, index_oid) = (super::relation(table, place)?, super::relation(index, place)?);
    unsafe {
        if table_oid == pg_sys::InvalidOid || index_oid == pg_sys::InvalidOid {
            return Err(LambdaError::Internal(format!("lambdastore.{table:?} or its index is missing")));
        }
        if !super::may_select(table_oid) {
            pg_sys::aclcheck_error(
                pg_sys::AclResult::ACLCHECK_NO_PRIV,
                pg_sys::ObjectType::OBJECT_TABLE,
                pg_sys::get_rel_name(table_oid),
            );
        }

        pg_sys::CommandCounterIncrement();
        let snapshot = pg_sys::RegisterSnapshot(crate::pg::standby::snapshot_for_reads());
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let relation = pg_sys::table_open(table_oid, lock);
        let index = pg_sys::index_open(index_oid, lock);
        let scan = Scan::begin(relation, index, snapshot, prefix, &bounds);
        let mut outcome = Ok(());
        while let Some(tuple) = scan.next(forward) {
            match read(&Row { tuple, desc: (*relation).rd_att }) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        scan.end();
        // Like the executor, keep the locks until the transaction ends.
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::UnregisterSnapshot(snapshot);
        outcome
    }
}

/// Writes `value` over the last column of the row of `table` whose primary
/// key (the columns before it) is `key`, as `UPDATE ... SET value = $4
/// WHERE (key) = ($1, $2, $3)` would at READ COMMITTED, straight through the
/// heap: the executor's start-up and `ON CONFLICT`'s lock of the row (a
/// WAL record of its own) cost more than the update itself. Returns false,
/// having written nothing, where the statement must run instead: no such
/// row is visible; a concurrent transaction updated or deleted it since
/// (the statement follows the row as READ COMMITTED does); the current
/// user lacks the statement's rights (the statement says so); or the table
/// is not the plain one this path knows (`plain`). Used only where probes
/// are (`usable`): under REPEATABLE READ or SERIALIZABLE the statement runs.
pub(crate) fn overwrite(
    place: Place,
    table: &'static CStr,
    index: &'static CStr,
    key: &[Part<'_>],
    value: &[u8],
) -> Result<bool> {
    let (table_oid, index_oid) = (super::relation(table, place)?, super::relation(index, place)?);
    if table_oid == pg_sys::InvalidOid || index_oid == pg_sys::InvalidOid {
        return Err(LambdaError::Internal(format!("lambdastore.{table:?} or its index is missing")));
    }
    if !super::may(table_oid, pg_sys::ACL_INSERT | pg_sys::ACL_UPDATE) {
        return Ok(false);
    }
    // SAFETY: as in `by_prefix`; the row is updated as the executor's
    // UPDATE does (heap_update, then the index entries a non-HOT version
    // needs), under the lock an UPDATE takes.
    unsafe {
        pg_sys::CommandCounterIncrement();
        let lock = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
        let relation = pg_sys::table_open(table_oid, lock);
        let index = pg_sys::index_open(index_oid, lock);
        let is_plain = super::remembered_plain(table_oid, || plain(relation, index, key.len()));
        let written = is_plain && {
            pg_sys::CheckCmdReplicaIdentity(relation, pg_sys::CmdType::CMD_UPDATE);
            update_last_column(relation, index, key, value)
        };
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        Ok(written)
    }
}

/// Whether `relation` is a plain heap table of the key's columns and one
/// more, whose only index is `index` and whose UPDATE runs nothing but the
/// update: no trigger (a foreign key's check of columns before the last
/// is skipped by an UPDATE that keeps them, so it may stay), no CHECK,
/// no row security, not a partition. A table someone changed takes the
/// statement's path. Remembered per table until the next relcache
/// invalidation, which every such change sends (`catalog::remembered_plain`).
///
/// SAFETY: `relation` and `index` are open.
unsafe fn plain(relation: pg_sys::Relation, index: pg_sys::Relation, key_columns: usize) -> bool {
    // SAFETY: the caller's promise; the relcache entries stay valid while
    // the relations are open.
    unsafe {
        let (rel, form) = (&*relation, &*(*relation).rd_rel);
        let desc = &*rel.rd_att;
        let last = key_columns + 1;
        if form.relkind != pg_sys::RELKIND_RELATION as std::ffi::c_char
            || form.relam != pg_sys::HEAP_TABLE_AM_OID
            || form.relrowsecurity
            || form.relispartition
            || desc.natts as usize != last
            || desc.attrs.as_slice(last)[last - 1].attisdropped
            || (!desc.constr.is_null() && ((*desc.constr).num_check > 0 || (*desc.constr).has_generated_stored))
        {
            return false;
        }
        if let Some(triggers) = rel.trigdesc.as_ref() {
            if triggers.trig_update_before_row
                || triggers.trig_update_instead_row
                || triggers.trig_update_before_statement
                || triggers.trig_update_after_statement
                || triggers.trig_update_old_table
                || triggers.trig_update_new_table
            {
                return false;
            }
            let all = std::slice::from_raw_parts(triggers.triggers, triggers.numtriggers as usize);
            let others = all.iter().any(|t| {
                (t.tgtype as u32 & pg_sys::TRIGGER_TYPE_UPDATE) != 0
                    && pg_sys::RI_FKey_trigger_type(t.tgfoid) != pg_sys::RI_TRIGGER_FK as i32
            });
            let keys = pgrx::PgList::<pg_sys::ForeignKeyCacheInfo>::from_pg(pg_sys::RelationGetFKeyList(relation));
            let on_last = keys.iter_ptr().any(|fk| {
                let fk = &*fk;
                fk.conkey[..fk.nkeys as usize].contains(&(last as i16))
            });
            if others || on_last {
                return false;
            }
        }
        let indexes = pg_sys::RelationGetIndexList(relation);
        let only = pgrx::PgList::<pg_sys::Oid>::from_pg(indexes);
        let only_this = only.len() == 1 && only.get_oid(0) == Some((*index).rd_id);
        pg_sys::list_free(indexes);
        let index_form = &*(*index).rd_index;
        only_this
            && index_form.indimmediate
            && !index_form.indisexclusion
            && pg_sys::RelationGetIndexExpressions(index).is_null()
            && pg_sys::RelationGetIndexPredicate(index).is_null()
    }
}

/// The update itself: finds the row's visible version, writes the new one
/// over it, and gives a version off its page its index entry.
///
/// SAFETY: `relation` and `index` are open under RowExclusiveLock.
unsafe fn update_last_column(
    relation: pg_sys::Relation,
    index: pg_sys::Relation,
    key: &[Part<'_>],
    value: &[u8],
) -> bool {
    // SAFETY: the caller's promise; the new tuple is ours until freed.
    unsafe {
        let desc = (*relation).rd_att;
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let scan = Scan::begin(relation, index, snapshot, key, &Bounds::default());
        let found = scan.next(true).map(|old| {
            let mut column = (*desc).natts;
            let mut datum = value.into_datum().expect("bytea is not null");
            let mut null = false;
            let new = pg_sys::heap_modify_tuple_by_cols(old, desc, 1, &mut column, &mut datum, &mut null);
            pg_sys::pfree(datum.cast_mut_ptr());
            ((*old).t_self, new)
        });
        scan.end();
        pg_sys::UnregisterSnapshot(snapshot);
        let Some((mut at, new)) = found else { return false };

        let mut failure = pg_sys::TM_FailureData::default();
        let mut mode = pg_sys::LockTupleMode::LockTupleExclusive;
        let cid = pg_sys::GetCurrentCommandId(true);
        let result =
            pg_sys::heap_update(relation, &mut at, new, cid, std::ptr::null_mut(), true, &mut failure, &mut mode);
        let written = result == pg_sys::TM_Result::TM_Ok;
        if written && (*(*new).t_data).t_infomask2 as u32 & pg_sys::HEAP_ONLY_TUPLE == 0 {
            index_new_version(relation, index, new);
        }
        pg_sys::heap_freetuple(new);
        written
    }
}

/// The index entry of a row version that left its page (not a HOT update),
/// as `ExecInsertIndexTuples` makes it for an UPDATE.
///
/// SAFETY: `relation` and `index` are open; `tuple` was just written.
unsafe fn index_new_version(relation: pg_sys::Relation, index: pg_sys::Relation, tuple: pg_sys::HeapTuple) {
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
        // The key is unchanged: a hint for btree's bottom-up deletion.
        let unchanged = true;
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
    }
}

/// An ordered index scan for the rows whose key starts with some parts,
/// and whose next column is within some bounds.
struct Scan {
    scan: pg_sys::SysScanDesc,
    /// The keys: column, strategy, datum (text and bytea are copies, freed
    /// at `end`) and comparison function.
    conditions: Vec<(usize, u32, pg_sys::Datum, u32)>,
}

impl Scan {
    /// SAFETY: `relation` and `index` open, `snapshot` registered, until
    /// `end`.
    unsafe fn begin(
        relation: pg_sys::Relation,
        index: pg_sys::Relation,
        snapshot: pg_sys::Snapshot,
        prefix: &[Part<'_>],
        bounds: &Bounds<'_>,
    ) -> Scan {
        let equal = pg_sys::BTEqualStrategyNumber;
        let mut conditions: Vec<(usize, u32, pg_sys::Datum, u32)> = prefix
            .iter()
            .enumerate()
            .map(|(i, part)| {
                let (datum, function) = part.datum();
                (i + 1, equal, datum, function)
            })
            .collect();
        let next_column = prefix.len() + 1;
        let bytea = |b: &[u8]| b.into_datum().expect("bytea is not null");
        if let Some(from) = bounds.from {
            conditions.push((next_column, pg_sys::BTGreaterEqualStrategyNumber, bytea(from), pg_sys::F_BYTEAGE));
        }
        if let Some(before) = bounds.before {
            conditions.push((next_column, pg_sys::BTLessStrategyNumber, bytea(before), pg_sys::F_BYTEALT));
        }
        // SAFETY: the caller's promise; the keys are copied by the scan,
        // their datums are kept until `end`.
        unsafe {
            let mut keys: Vec<pg_sys::ScanKeyData> = vec![std::mem::zeroed(); conditions.len()];
            for (&(column, strategy, datum, function), key) in conditions.iter().zip(keys.iter_mut()) {
                // Attribute numbers are the table's (the key's columns come
                // first); ScanKeyInit compares text under the "C" collation,
                // the columns' own.
                let attno = pg_sys::AttrNumber::try_from(column).expect("a short key");
                pg_sys::ScanKeyInit(key, attno, strategy as pg_sys::StrategyNumber, function.into(), datum);
            }
            // The ordered form: the index is used even under
            // ignore_system_indexes, so rows come in key order.
            let scan =
                pg_sys::systable_beginscan_ordered(relation, index, snapshot, keys.len() as i32, keys.as_mut_ptr());
            Scan { scan, conditions }
        }
    }

    /// The next row in key order (or reverse), valid until the next call
    /// or `end`.
    fn next(&self, forward: bool) -> Option<pg_sys::HeapTuple> {
        let direction = if forward {
            pg_sys::ScanDirection::ForwardScanDirection
        } else {
            pg_sys::ScanDirection::BackwardScanDirection
        };
        // SAFETY: the scan is open (`begin`).
        let tuple = unsafe { pg_sys::systable_getnext_ordered(self.scan, direction) };
        (!tuple.is_null()).then_some(tuple)
    }

    fn end(self) {
        // SAFETY: ends the scan begun in `begin`, then frees the keys'
        // copies of text and bytea.
        unsafe {
            pg_sys::systable_endscan_ordered(self.scan);
            for &(_, _, datum, function) in &self.conditions {
                if function != pg_sys::F_INT8EQ {
                    pg_sys::pfree(datum.cast_mut_ptr());
                }
            }
        }
    }
}
