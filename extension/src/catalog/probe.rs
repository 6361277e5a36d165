//! Point reads by primary key straight through the index, without SPI's
//! plan cache, portal and executor: a warm call reads each entry and checks
//! each entry-set version this way, and executor start-up cost more than
//! the index lookup itself.
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

        let parts: Vec<(pg_sys::Datum, u32)> = prefix.iter().map(Part::datum).collect();
        let mut keys: Vec<pg_sys::ScanKeyData> = vec![std::mem::zeroed(); parts.len()];
        for (i, ((datum, equal), key)) in parts.iter().zip(keys.iter_mut()).enumerate() {
            // Attribute numbers are the table's (the key's columns come
            // first); ScanKeyInit compares text under the "C" collation,
            // the columns' own.
            let attno = pg_sys::AttrNumber::try_from(i + 1).expect("a short key");
            let strategy = pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber;
            pg_sys::ScanKeyInit(key, attno, strategy, (*equal).into(), *datum);
        }

        // The ordered form: the index is used even under
        // ignore_system_indexes, so rows come in key order.
        let scan = pg_sys::systable_beginscan_ordered(relation, index, snapshot, keys.len() as i32, keys.as_mut_ptr());
        let mut rows = Vec::new();
        while rows.len() < limit {
            let tuple = pg_sys::systable_getnext_ordered(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            rows.push(read(&Row { tuple, desc: (*relation).rd_att }));
        }
        pg_sys::systable_endscan_ordered(scan);
        // Like the executor, keep the locks until the transaction ends.
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::UnregisterSnapshot(snapshot);
        for ((datum, equal), _) in parts.iter().zip(prefix) {
            if *equal != pg_sys::F_INT8EQ {
                pg_sys::pfree(datum.cast_mut_ptr());
            }
        }
        Ok(rows)
    }
}
