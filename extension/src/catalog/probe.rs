//! Point reads by primary key straight through the index, without SPI's
//! plan cache, portal and executor: a warm call reads each entry and checks
//! each entry-set version this way, and executor start-up cost more than
//! the index lookup itself.
//!
//! A probe behaves like the kept SPI statement it replaces: the caller's
//! table privilege is checked, the command counter is advanced so the
//! transaction's own earlier writes are seen, and the read uses a fresh
//! snapshot of READ COMMITTED. Probes are used only at READ COMMITTED (which
//! OCC requires): under REPEATABLE READ or SERIALIZABLE, allowed with
//! `concurrency_control = off`, reads keep going through SPI and the
//! executor, which reads the transaction snapshot and takes SSI's locks.

use crate::error::{LambdaError, Result};
use pgrx::pg_sys;
use pgrx::{FromDatum, IntoDatum};
use std::ffi::CStr;
use std::num::NonZeroUsize;

/// Whether a probe reads what the SPI statement would.
pub fn usable() -> bool {
    // SAFETY: a plain int of the current transaction, read on the main thread.
    unsafe { pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// A primary key of (object_id bigint, text collate "C", bytea).
pub struct Key<'a> {
    pub object: i64,
    pub text: &'a str,
    pub bytes: &'a [u8],
}

/// The columns of one row, read while the scan still holds it.
pub struct Row {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
}

impl Row {
    /// Column `attno` (from 1) as bytea, detoasted and copied.
    pub fn bytes(&self, attno: usize) -> Option<Vec<u8>> {
        self.datum(attno).and_then(|(datum, is_null)| {
            // SAFETY: the column is bytea (see the callers' tables).
            unsafe { Vec::<u8>::from_polymorphic_datum(datum, is_null, pg_sys::BYTEAOID) }
        })
    }

    pub fn int8(&self, attno: usize) -> Option<i64> {
        self.datum(attno).and_then(|(datum, is_null)| {
            // SAFETY: the column is bigint (see the callers' tables).
            unsafe { i64::from_polymorphic_datum(datum, is_null, pg_sys::INT8OID) }
        })
    }

    fn datum(&self, attno: usize) -> Option<(pg_sys::Datum, bool)> {
        // SAFETY: the tuple and its descriptor are alive for the scan.
        let datum = unsafe { pgrx::heap_getattr_raw(self.tuple, NonZeroUsize::new(attno)?, self.desc) };
        Some(datum.map_or((pg_sys::Datum::from(0), true), |d| (d, false)))
    }
}

/// Looks up `key` in `table`'s primary-key index `index` (both in schema
/// lambdastore) and hands the visible row, if any, to `read`.
pub fn by_key<R>(table: &CStr, index: &CStr, key: &Key<'_>, read: impl FnOnce(&Row) -> R) -> Result<Option<R>> {
    // SAFETY: every call below is a PostgreSQL function used as the
    // executor uses it, on the main thread inside a transaction; an ERROR
    // raised by any of them unwinds to the resource owner, which releases
    // the relation, scan and snapshot.
    unsafe {
        let namespace = pg_sys::get_namespace_oid(c"lambdastore".as_ptr(), false);
        let table_oid = pg_sys::get_relname_relid(table.as_ptr(), namespace);
        let index_oid = pg_sys::get_relname_relid(index.as_ptr(), namespace);
        if table_oid == pg_sys::InvalidOid || index_oid == pg_sys::InvalidOid {
            return Err(LambdaError::Internal(format!("lambdastore.{table:?} or its index is missing")));
        }
        if pg_sys::pg_class_aclcheck(table_oid, pg_sys::GetUserId(), pg_sys::ACL_SELECT as pg_sys::AclMode)
            != pg_sys::AclResult::ACLCHECK_OK
        {
            pg_sys::aclcheck_error(
                pg_sys::AclResult::ACLCHECK_NO_PRIV,
                pg_sys::ObjectType::OBJECT_TABLE,
                pg_sys::get_rel_name(table_oid),
            );
        }

        pg_sys::CommandCounterIncrement();
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
        let relation = pg_sys::table_open(table_oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);

        let text = key.text.into_datum().expect("text is not null");
        let bytes = key.bytes.into_datum().expect("bytea is not null");
        let mut keys: [pg_sys::ScanKeyData; 3] = std::mem::zeroed();
        let equal = pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber;
        // Attribute numbers are the table's; ScanKeyInit compares text
        // under the "C" collation, the columns' own.
        pg_sys::ScanKeyInit(&mut keys[0], 1, equal, pg_sys::F_INT8EQ.into(), pg_sys::Datum::from(key.object));
        pg_sys::ScanKeyInit(&mut keys[1], 2, equal, pg_sys::F_TEXTEQ.into(), text);
        pg_sys::ScanKeyInit(&mut keys[2], 3, equal, pg_sys::F_BYTEAEQ.into(), bytes);

        let scan = pg_sys::systable_beginscan(relation, index_oid, true, snapshot, 3, keys.as_mut_ptr());
        let tuple = pg_sys::systable_getnext(scan);
        let result = (!tuple.is_null()).then(|| read(&Row { tuple, desc: (*relation).rd_att }));
        pg_sys::systable_endscan(scan);
        // Like the executor, keep the lock until the transaction ends.
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::pfree(text.cast_mut_ptr());
        pg_sys::pfree(bytes.cast_mut_ptr());
        Ok(result)
    }
}
