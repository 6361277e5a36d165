//! Heavyweight locks: advisory ones on our own keys and on Citus', and a
//! relation lock owned by the top transaction.

use pgrx::pg_sys;

/// What trying an exclusive transaction-level lock gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tried {
    Acquired,
    AlreadyHeld,
    Busy,
}

/// An advisory lock tag of this database: `(key1, key2, class)` as
/// PostgreSQL's and Citus' advisory locks lay them out (`class` 1 is the
/// int8 form of `pg_advisory_xact_lock`; Citus uses its own classes).
fn advisory(key1: u32, key2: u32, class: u16) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        locktag_field1: super::backend::database_id(),
        locktag_field2: key1,
        locktag_field3: key2,
        locktag_field4: class,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// `pg_try_advisory_xact_lock(key)`: exclusive, released at transaction
/// end, visible in `pg_locks`, never waited for.
pub(crate) fn try_advisory_xact(key: u64) -> Tried {
    let tag = advisory((key >> 32) as u32, key as u32, 1);
    // SAFETY: a valid tag; transaction-scoped, never waits.
    match unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, true) } {
        pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL => Tried::Busy,
        pg_sys::LockAcquireResult::LOCKACQUIRE_OK => Tried::Acquired,
        _ => Tried::AlreadyHeld,
    }
}

/// Waits for and takes, for the rest of the transaction, the advisory lock
/// `(key1, key2, class)` in each of `modes`, in order.
pub(crate) fn advisory_xact(key1: u32, key2: u32, class: u16, modes: &[u32]) {
    let tag = advisory(key1, key2, class);
    for &mode in modes {
        // SAFETY: a valid tag, inside a transaction; waits (interruptibly).
        unsafe { pg_sys::LockAcquire(&tag, mode as pg_sys::LOCKMODE, false, false) };
    }
}

/// Takes `relation` in `mode` for the rest of the top transaction, waiting
/// if `wait`, else only if free at once; whether it was taken. Owned by
/// the top transaction, so that a subtransaction rolled back does not
/// release it. Accepts invalidations once it holds the lock.
pub(crate) fn relation_for_transaction(relation: pg_sys::Oid, mode: u32, wait: bool) -> bool {
    // SAFETY: inside a transaction; the resource owner is restored before
    // anything can fail (both calls raise only on interrupts, which abort
    // the transaction and reset it anyway).
    unsafe {
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::CurrentResourceOwner = pg_sys::TopTransactionResourceOwner;
        let got = if wait {
            pg_sys::LockRelationOid(relation, mode as pg_sys::LOCKMODE);
            true
        } else {
            pg_sys::ConditionalLockRelationOid(relation, mode as pg_sys::LOCKMODE)
        };
        pg_sys::CurrentResourceOwner = owner;
        got
    }
}
