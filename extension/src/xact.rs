//! The one end-of-transaction callback: each part's work at commit and
//! abort, in an order that is written here rather than implied by the order
//! of registration. PostgreSQL runs the commit part after the commit record
//! is written and the transaction's rows are visible, before its locks are
//! released; the pre-commit and pre-prepare parts before either, where an
//! error still aborts the transaction.

use crate::cluster::{replica, route};
use crate::jobs::{self, workers};
use crate::{catalog, txn};
use pgrx::pg_sys;

/// Registers the callback; once per process, from `_PG_init`.
pub(crate) fn init() {
    crate::pg::xact::on_transaction_events(at_transaction_end);
    // Entry-set writer counts drop only once the sets' locks are free, so
    // that a reader they wake finds them free (txn/versions.rs).
    crate::pg::xact::after_locks_released(txn::versions::at_locks_released);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        // COMMIT PREPARED runs no callback here (it may run in another
        // backend, or in recovery): what the parts would do at commit goes
        // to shared memory now, for whoever finds the transaction ended.
        // The catalog generation's bump (catalog/cache.rs); the reads
        // validated again, then the writer counts and version bumps
        // (txn/prepared.rs). The last moment to refuse, too.
        XACT_EVENT_PRE_PREPARE => {
            let queued_jobs = jobs::queue::take_inserted();
            let prepared = catalog::cache::at_prepare()
                .and_then(|_| txn::occ::validate_again())
                .and_then(|_| txn::prepared::at_prepare(queued_jobs));
            if let Err(refused) = prepared {
                refused.report("PREPARE TRANSACTION");
            }
            // The job runners look for ended prepared transactions often
            // while there are any: wake them to notice this one's jobs
            // once it commits. Not for its entry sets: the COMMIT PREPARED
            // (or ROLLBACK PREPARED) that ends it lets go of them
            // (PRE_COMMIT below). Woken at every PREPARE, the two runners of
            // a node each ran a whole round for it: 5 ms of CPU per
            // transaction across two nodes, ten times the transaction's own.
            if queued_jobs {
                workers::wake_workers();
            }
        }
        // A transaction that ran calls on several nodes: the node that
        // commits it validates its own reads again, as the prepared nodes
        // do, and (if it wrote nothing, so nothing is prepared) has the
        // others validate theirs (cluster/route.rs).
        XACT_EVENT_PRE_COMMIT => {
            if let Err(failed) = txn::occ::before_commit() {
                failed.report("COMMIT");
            }
            crate::pg::standby::at_transaction_end(true);
            if route::spread() {
                if let Err(failed) = txn::occ::validate_again().and_then(|_| route::validate_elsewhere()) {
                    failed.report("COMMIT");
                }
            }
            // After COMMIT PREPARED (which Citus sends to each node of a
            // distributed transaction): the prepared transaction's sets are
            // let go of now, and the readers waiting for them woken, rather
            // than at the next sweep (txn/prepared.rs).
            txn::prepared::finish_ended();
        }
        // Nothing here may fail. Versions first (the writer counts drop
        // after the locks, `at_locks_released`); then the catalog
        // generation; then the workers are woken, so that they find the
        // bumped versions and the new generation.
        XACT_EVENT_COMMIT => {
            txn::versions::at_commit();
            catalog::cache::at_commit();
            jobs::at_commit();
            route::at_transaction_end();
            catalog::at_transaction_end();
            replica::at_transaction_end(true);
        }
        XACT_EVENT_ABORT | XACT_EVENT_PREPARE => {
            replica::at_transaction_end(false);
            crate::pg::standby::at_transaction_end(false);
            txn::versions::at_abort();
            catalog::cache::at_abort();
            jobs::at_abort();
            route::at_transaction_end();
            catalog::at_transaction_end();
        }
        _ => {}
    }
}
