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
