//! Point reads and range scans by primary key straight through the index,
//! without SPI's plan cache, portal and executor: a warm call reads each
//! entry, scans a field's range and checks each entry-set version this way,
//! and executor start-up (a cursor's, for a scan) cost more than the index
//! lookup itself. Entries are written the same way (in_place.rs), with the
//! scans here.
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
    pub(super) fn datum(&self) -> (pg_sys::Datum, u32) {
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
    /// SAFETY: `tuple` (described by `desc`) stays valid while the row is
    /// read.
    pub(super) unsafe fn new(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Row {
        Row { tuple, desc }
    }

    /// Where the row version is in its table.
    pub(crate) fn at(&self) -> pg_sys::ItemPointerData {
        // SAFETY: the tuple is alive for the scan.
        unsafe { (*self.tuple).t_self }
    }

    /// Whether the row's first columns are `key`.
    pub(super) fn has_key(&self, key: &[Part<'_>]) -> bool {
        key.iter().enumerate().all(|(i, part)| match (self.datum(i + 1), part) {
            (Some((datum, false)), Part::Int8(n)) => datum.value() as i64 == *n,
            // SAFETY: the columns are text and bytea where the key has
            // them (the callers' tables); a detoasted copy is freed.
            (Some((datum, false)), Part::Text(text)) => unsafe { varlena_is(datum, text.as_bytes()) },
            (Some((datum, false)), Part::Bytes(bytes)) => unsafe { varlena_is(datum, bytes) },
            _ => false,
        })
    }

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

/// Whether the text or bytea `datum` holds `bytes`.
///
/// SAFETY: `datum` is a varlena.
unsafe fn varlena_is(datum: pg_sys::Datum, bytes: &[u8]) -> bool {
    // SAFETY: the caller's promise; `plain` is ours to free when a copy.
    unsafe {
        let stored = datum.cast_mut_ptr::<pg_sys::varlena>();
        let plain = pg_sys::pg_detoast_datum_packed(stored);
        let same = pgrx::varlena::varlena_to_byte_slice(plain) == bytes;
        if plain != stored {
            pg_sys::pfree(plain.cast());
        }
        same
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

/// An ordered index scan for the rows whose key starts with some parts,
/// and whose next column is within some bounds.
pub(super) struct Scan {
    scan: pg_sys::SysScanDesc,
    /// The keys: column, strategy, datum (text and bytea are copies, freed
    /// at `end`) and comparison function.
    conditions: Vec<(usize, u32, pg_sys::Datum, u32)>,
}

impl Scan {
    /// SAFETY: `relation` and `index` open, `snapshot` registered, until
    /// `end`.
    pub(super) unsafe fn begin(
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
    pub(super) fn next(&self, forward: bool) -> Option<pg_sys::HeapTuple> {
        let direction = if forward {
            pg_sys::ScanDirection::ForwardScanDirection
        } else {
            pg_sys::ScanDirection::BackwardScanDirection
        };
        // SAFETY: the scan is open (`begin`).
        let tuple = unsafe { pg_sys::systable_getnext_ordered(self.scan, direction) };
        (!tuple.is_null()).then_some(tuple)
    }

    pub(super) fn end(self) {
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
