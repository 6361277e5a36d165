//! The catalog tables (sql/schema.sql) through SPI: applications and their
//! module versions, objects, and entries.
//!
//! Statements run through prepared plans kept for the life of the backend.
//! They are mutating plans (`prepare_mut`), so under READ COMMITTED every
//! statement takes a fresh snapshot and sees the transaction's own writes.

pub mod cache;
pub mod entries;
pub mod entry_sets;
pub mod jobs;
pub mod modules;
pub mod objects;
mod probe;

use crate::error::{LambdaError, Result};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{PgBuiltInOids, PgOid};
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::ManuallyDrop;

thread_local! {
    // ManuallyDrop: plans live as long as the backend; freeing them from a
    // thread-local destructor during process exit would touch memory
    // contexts that are already gone.
    static PLANS: RefCell<HashMap<&'static str, ManuallyDrop<OwnedPreparedStatement>>> =
        RefCell::new(HashMap::new());
}

/// The OID of relation `name` in schema lambdastore (InvalidOid if there is
/// none: the extension is being dropped or recreated). Two syscache lookups.
pub fn relation(name: &std::ffi::CStr) -> pgrx::pg_sys::Oid {
    use pgrx::pg_sys;
    // SAFETY: syscache lookups by name; both return InvalidOid when missing.
    unsafe { pg_sys::get_relname_relid(name.as_ptr(), pg_sys::get_namespace_oid(c"lambdastore".as_ptr(), true)) }
}

/// Whether the current user may read relation `oid`: the check SPI makes
/// on every statement, for the paths that skip SPI (probes, the cache).
pub fn may_select(oid: pgrx::pg_sys::Oid) -> bool {
    use pgrx::pg_sys;
    // SAFETY: an ACL check by OID on the main thread.
    unsafe {
        pg_sys::pg_class_aclcheck(oid, pg_sys::GetUserId(), pg_sys::ACL_SELECT as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Runs the kept plan of `sql` (preparing it on first use) and hands the
/// rows to `read` while the SPI connection is open.
pub fn query<R>(
    sql: &'static str,
    types: &[PgBuiltInOids],
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(SpiTupleTable<'_>) -> pgrx::spi::Result<R>,
) -> Result<R> {
    Spi::connect(|client| {
        // Taken out of the map while in use, so that a nested use of the
        // same statement (a trigger calling back into us) prepares its own.
        let plan = match PLANS.with(|plans| plans.borrow_mut().remove(sql)) {
            Some(plan) => plan,
            None => ManuallyDrop::new(prepare(client, sql, types)?),
        };
        // `select` runs the mutating plan all the same (a fresh snapshot per
        // statement), but unlike `update` does not force an XID on the
        // transaction: a read-only call must stay a read-only transaction,
        // with no commit record to write and flush.
        let outcome = client.select(&*plan, None, args).and_then(read);
        PLANS.with(|plans| plans.borrow_mut().insert(sql, plan));
        outcome
    })
    .map_err(|e| LambdaError::Internal(format!("SPI: {e}")))
}

fn prepare(client: &SpiClient<'_>, sql: &str, types: &[PgBuiltInOids]) -> pgrx::spi::Result<OwnedPreparedStatement> {
    let oids: Vec<PgOid> = types.iter().map(|t| PgOid::BuiltIn(*t)).collect();
    Ok(client.prepare_mut(sql, &oids)?.keep())
}
