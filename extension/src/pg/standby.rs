//! Hot standbys: whether this server is one, how far it has replayed the
//! primary's WAL, where this session's last commit ended, and the one
//! snapshot every call of a transaction reads with there.
//!
//! On a primary, OCC validation catches a call whose reads saw two
//! different moments. On a standby no version ever moves (replay does not
//! run our commit callbacks), so a call must never see two moments: all of
//! a transaction's calls read with the snapshot its first call took, kept
//! registered until the transaction ends so that replay cancels the
//! transaction (a recovery conflict) rather than remove rows it can still
//! see.

use pgrx::pg_sys;
use std::cell::Cell;

/// Whether this server is a standby replaying WAL (read-only).
pub(crate) fn in_recovery() -> bool {
    // SAFETY: reads shared recovery state; callable in any backend.
    unsafe { pg_sys::RecoveryInProgress() }
}

/// The WAL position this standby has replayed up to (0 on a primary that
/// was never one).
pub(crate) fn replayed() -> u64 {
    // SAFETY: reads the shared replay position; the timeline is not wanted.
    unsafe { pg_sys::GetXLogReplayRecPtr(std::ptr::null_mut()) }
}

/// Where this server's WAL ends now: on a primary, no commit can be
/// visible past it.
pub(crate) fn wal_end() -> u64 {
    // SAFETY: reads the shared insert position (errors during recovery,
    // so only called on a primary).
    unsafe { pg_sys::GetXLogInsertRecPtr() }
}

/// The end of this session's last commit record (0 before its first
/// commit that wrote): once a standby has replayed past it, what that
/// transaction wrote is visible there.
pub(crate) fn last_commit_end() -> u64 {
    // SAFETY: a plain integer of this backend, set at each commit that wrote.
    unsafe { pg_sys::XactLastCommitEnd }
}

thread_local! {
    /// The snapshot of the transaction's first call on a standby: the
    /// transaction's local id, and the copy registered on it.
    static FIRST_CALL: Cell<Option<(u32, pg_sys::Snapshot)>> = const { Cell::new(None) };
}

/// Runs `f` (a call, top-level) reading as of the transaction's first
/// call when this server is a standby; as is on a primary. Under
/// REPEATABLE READ that is the transaction snapshot anyway.
pub(crate) fn reading_as_of_first_call<R>(f: impl FnOnce() -> R) -> R {
    if !in_recovery() {
        return f();
    }
    // SAFETY: inside a transaction with a statement's snapshot set (an SQL
    // function is running). The copy is registered on the top transaction's
    // resource owner, released by `at_transaction_end` or by the abort;
    // the push is popped below, or by the (sub)transaction's abort when
    // `f` raises an error.
    unsafe {
        let transaction = crate::pg::xact::local_transaction();
        let snapshot = match FIRST_CALL.get() {
            Some((id, snapshot)) if id == transaction => snapshot,
            _ => {
                let snapshot =
                    pg_sys::RegisterSnapshotOnOwner(pg_sys::GetActiveSnapshot(), pg_sys::TopTransactionResourceOwner);
                FIRST_CALL.set(Some((transaction, snapshot)));
                snapshot
            }
        };
        pg_sys::PushActiveSnapshot(snapshot);
        let result = f();
        pg_sys::PopActiveSnapshot();
        result
    }
}

/// The snapshot a point read uses: the statement's own on a standby (the
/// first call's, pushed by `reading_as_of_first_call`), else a fresh one
/// of READ COMMITTED (catalog/probe.rs).
pub(crate) fn snapshot_for_reads() -> pg_sys::Snapshot {
    // SAFETY: inside a transaction; on a standby a call's snapshot is set.
    unsafe {
        if in_recovery() && pg_sys::ActiveSnapshotSet() {
            pg_sys::GetActiveSnapshot()
        } else {
            pg_sys::GetTransactionSnapshot()
        }
    }
}

/// Before the transaction's resource owner is released at commit (where
/// a snapshot still registered is reported as leaked); at abort the owner
/// releases it.
pub(crate) fn at_transaction_end(committing: bool) {
    if let Some((_, snapshot)) = FIRST_CALL.take() {
        if committing {
            // SAFETY: registered on the top transaction's owner, which is
            // still the current transaction's at pre-commit.
            unsafe { pg_sys::UnregisterSnapshotFromOwner(snapshot, pg_sys::TopTransactionResourceOwner) };
        }
    }
}

/// Waits until this standby has replayed the primary's WAL up to `lsn`, at
/// most `timeout`; whether it has. PostgreSQL 15 wakes no backend as
/// replay advances, so the position is polled every millisecond.
pub(crate) fn wait_for_replay(lsn: u64, timeout: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + timeout;
    loop {
        if replayed() >= lsn {
            return true;
        }
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        super::process::wait_latch(left.min(std::time::Duration::from_millis(1)));
    }
}
