//! OCC across PREPARE TRANSACTION and COMMIT PREPARED: what a node's part
//! of a distributed transaction needs when Citus commits it in two phases.
//!
//! A transaction that wrote counts as the writer of its entry sets until
//! its version bumps are applied, and the bumps wait until its rows are
//! visible (versions.rs). Both happen in the commit callback, which
//! PostgreSQL does not run for a prepared transaction: COMMIT PREPARED may
//! come from any backend, or after a crash. So at PREPARE the transaction
//! first validates its reads again (every node's write locks are taken by
//! then: the point where the whole distributed transaction is serialized),
//! then hands its writer counts and queued bumps to a slot in shared
//! memory, keyed by its XID. Any backend that later finds the XID no
//! longer running (`sweep`, at the start of every workflow and in every
//! job runner's loop) applies the bumps if it committed, then drops the
//! writer counts. Until then readers of those sets fail validation, as
//! they would while the transaction ran: late sweeps cost false conflicts,
//! never missed ones.
//!
//! After a crash, shared memory starts empty while prepared transactions
//! survive with their locks but without their counts. The first sweep
//! after startup registers every prepared transaction it finds as having
//! written everything: until each ends, every validation on this node
//! fails (40001); when one commits, every version moves on. Citus' 2PC
//! recovery (`recover_prepared_transactions()`, run by its maintenance
//! daemon every `citus.recover_2pc_interval`) ends them.

use super::versions;
use crate::error::{LambdaError, Result};
use crate::shmem::Zeroed;
use pgrx::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Prepared transactions with lambdastore state at once (Citus prepares
/// at most one per node per distributed transaction).
const SLOTS: usize = 128;
/// Writer counts plus queued bumps one prepared transaction may carry.
const ENTRIES: usize = 1024;

/// A slot's state: free, being filled or swept by one backend, or holding
/// the state of the prepared transaction `xid` (`READY | xid << 2`).
const FREE: u64 = 0;
const BUSY: u64 = 1;
const READY: u64 = 2;
/// An XID found prepared after a restart, whose sets are unknown.
const UNKNOWN: u64 = 3;

pub(crate) struct Registry {
    /// Slots not free: 0 makes `sweep` a single load.
    used: AtomicU32,
    /// Whether the prepared transactions that survived a restart were
    /// looked for since the server (re)started.
    recovered: AtomicBool,
    /// Transactions of `UNKNOWN` slots still running: every validation
    /// fails while there are any.
    unknown: AtomicU32,
    slots: [Slot; SLOTS],
}

struct Slot {
    state: AtomicU64,
    len: AtomicU32,
    entries: [AtomicU64; ENTRIES],
}

// SAFETY: the name is unique to this extension.
static SHARED: Zeroed<Registry> = Zeroed::new(c"lambdastore_prepared_transactions");

/// Requests the shared memory; from `_PG_init`, while preloading.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests the features of every PostgreSQL version
pub(crate) fn request_shared_memory() {
    pgrx::pg_shmem_init!(SHARED = false);
}

fn shared() -> Option<&'static Registry> {
    versions::available().then(|| SHARED.get())
}

/// At PREPARE TRANSACTION, after `occ::validate_again`: moves this
/// transaction's writer counts and queued bumps into a slot. An error
/// leaves it unprepared (the transaction aborts).
///
/// A transaction that queued jobs takes a slot too (maybe with no entry):
/// COMMIT PREPARED runs no callback to wake the job runners, so they poll
/// for the slot's end, and run the jobs then, as they would have when woken.
pub(crate) fn at_prepare(queued_jobs: bool) -> Result<()> {
    let Some(shared) = shared() else { return Ok(()) };
    let len = versions::prepared_len();
    if len == 0 && !queued_jobs {
        return Ok(());
    }
    if len > ENTRIES {
        return Err(LambdaError::Prepared(format!(
            "a prepared transaction may carry {ENTRIES} entry-set locks and version changes; this one has {len}"
        )));
    }
    // SAFETY: a transaction that wrote has an XID.
    let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
    let Some(slot) = shared.slots.iter().find(|s| s.state.compare_exchange(FREE, BUSY, SeqCst, SeqCst).is_ok()) else {
        return Err(LambdaError::Prepared(format!(
            "{SLOTS} prepared transactions already hold lambdastore entry sets on this node"
        )));
    };
    let entries = versions::take_for_prepare();
    for (entry, value) in slot.entries.iter().zip(&entries) {
        entry.store(*value, SeqCst);
    }
    slot.len.store(entries.len() as u32, SeqCst);
    shared.used.fetch_add(1, SeqCst);
    slot.state.store(READY | u64::from(xid) << 2, SeqCst);
    Ok(())
}

use Ordering::SeqCst;

/// Whether prepared transactions still hold entry sets here.
pub(crate) fn pending() -> bool {
    shared().is_some_and(|s| s.used.load(SeqCst) > 0 || !s.recovered.load(SeqCst))
}

/// Whether validation must fail: prepared transactions whose sets are
/// unknown (found after a restart) are still running.
pub(crate) fn blocked() -> bool {
    shared().is_some_and(|s| s.unknown.load(SeqCst) > 0)
}

/// Finishes the slots of prepared transactions that have ended: their
/// bumps if they committed, then their writer counts. Needs a transaction
/// (it reads the commit log, and after a restart `pg_prepared_xacts`).
pub(crate) fn sweep() -> Result<()> {
    let Some(shared) = shared() else { return Ok(()) };
    if !shared.recovered.load(SeqCst) {
        recover(shared)?;
    }
    if shared.used.load(SeqCst) == 0 {
        return Ok(());
    }
    for slot in &shared.slots {
        let state = slot.state.load(SeqCst);
        let kind = state & 3;
        if kind != READY && kind != UNKNOWN {
            continue;
        }
        let xid = pg_sys::TransactionId::from((state >> 2) as u32);
        // SAFETY: proc-array and commit-log lookups by XID.
        if unsafe { pg_sys::TransactionIdIsInProgress(xid) } {
            continue;
        }
        // SAFETY: as above; the transaction has ended.
        let committed = unsafe { pg_sys::TransactionIdDidCommit(xid) };
        if slot.state.compare_exchange(state, BUSY, SeqCst, SeqCst).is_err() {
            // Another backend (a job runner, woken at PREPARE) is finishing
            // it. Wait until it is done: the validation this sweep precedes
            // must not find the writer counts of a transaction that ended.
            // Between its exchange and FREE the other backend only stores
            // atomics, so this wait is short and always ends.
            while slot.state.load(SeqCst) == BUSY {
                std::thread::yield_now();
            }
            continue;
        }
        if kind == UNKNOWN {
            if committed {
                versions::bump_everything();
            }
            shared.unknown.fetch_sub(1, SeqCst);
        } else {
            let len = slot.len.load(SeqCst) as usize;
            let entries: Vec<u64> = slot.entries[..len].iter().map(|e| e.load(SeqCst)).collect();
            versions::finish_prepared(&entries, committed);
        }
        slot.state.store(FREE, SeqCst);
        shared.used.fetch_sub(1, SeqCst);
    }
    Ok(())
}

/// After a restart: every transaction still prepared is registered as
/// having written every set (see the module doc). Once per startup.
fn recover(shared: &Registry) -> Result<()> {
    // Two backends at it at once register the transactions twice: each
    // slot is swept on its own, so that only costs a slot.
    let xids = crate::catalog::prepared_transactions()?;
    for xid in xids {
        let Some(slot) = shared.slots.iter().find(|s| s.state.compare_exchange(FREE, BUSY, SeqCst, SeqCst).is_ok())
        else {
            break;
        };
        shared.unknown.fetch_add(1, SeqCst);
        shared.used.fetch_add(1, SeqCst);
        slot.state.store(UNKNOWN | u64::from(xid) << 2, SeqCst);
    }
    shared.recovered.store(true, SeqCst);
    Ok(())
}
