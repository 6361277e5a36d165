//! This process as a background worker or a session that sleeps: its
//! latch and other processes' latches, its signal handlers and
//! configuration reloads, transactions of its own, hooks run at exit, and
//! the one shared catalog a worker reads before it has a database.

use pgrx::pg_sys;
use std::time::Duration;

/// `ProcGlobal->allProcs` index of this process, whose latch wakes it.
pub(crate) fn procno() -> i32 {
    // SAFETY: MyProc is set for every backend and background worker.
    unsafe { (*pg_sys::MyProc).pgprocno }
}

/// Sets the latch of the process at `procno`.
pub(crate) fn set_latch(procno: i32) {
    // SAFETY: ProcGlobal->allProcs is shared memory sized at startup and
    // procno was taken from MyProc. A stale procno (its process exited)
    // only sets some other process's latch, which is harmless.
    unsafe {
        let proc = (*pg_sys::ProcGlobal).allProcs.add(procno as usize);
        pg_sys::SetLatch(&raw mut (*proc).procLatch);
    }
}

/// Waits on this process's latch for at most `timeout`, then resets it and
/// processes interrupts (a cancel raises its error here; the postmaster's
/// death ends the process).
pub(crate) fn wait_latch(timeout: Duration) {
    let events = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as std::ffi::c_long;
    // SAFETY: MyLatch is this process's latch; called on the main thread.
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events as i32, ms, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}

/// A function run when this process exits, with its argument (a FATAL
/// error exits through it too).
pub(crate) type ExitHook = unsafe extern "C-unwind" fn(std::ffi::c_int, pg_sys::Datum);

/// Runs `hook(code, arg)` when this process exits, before its shared
/// memory is detached. `hook` must be a `#[pg_guard]` function.
pub(crate) fn before_exit(hook: ExitHook, arg: usize) {
    // SAFETY: registers a plain function with a by-value argument.
    unsafe { pg_sys::before_shmem_exit(Some(hook), pg_sys::Datum::from(arg)) };
}

/// Ends this process with `code` (a background worker with 1 is started
/// again after its restart time).
pub(crate) fn exit(code: i32) -> ! {
    // SAFETY: proc_exit runs the exit hooks and never returns.
    unsafe { pg_sys::proc_exit(code) }
}

/// Installs PostgreSQL's own handlers in a background worker, before its
/// signals are unblocked. die() only sets ProcDiePending: a worker acts on
/// it between steps, and a running lambda's epoch callback stops the
/// lambda first, so SIGTERM never lands in the middle of wasm.
pub(crate) fn handle_worker_signals() {
    // SAFETY: called first thing in the worker, on its main thread.
    unsafe {
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, Some(postgres_handlers::die));
        pg_sys::pqsignal(pg_sys::SIGHUP as i32, Some(postgres_handlers::SignalHandlerForConfigReload));
        pg_sys::BackgroundWorkerUnblockSignals();
    }
}

/// The C functions themselves: pgrx's `pg_sys` wraps them in Rust
/// functions, which cannot be signal handlers.
mod postgres_handlers {
    unsafe extern "C-unwind" {
        pub(crate) fn die(signal: std::ffi::c_int);
        pub(crate) fn SignalHandlerForConfigReload(signal: std::ffi::c_int);
    }
}

/// Re-reads the configuration files when a SIGHUP asked for it.
pub(crate) fn reload_config_if_asked() {
    // SAFETY: flag set by the SIGHUP handler; read and reset on the main thread.
    unsafe {
        if pg_sys::ConfigReloadPending != 0 {
            pg_sys::ConfigReloadPending = 0;
            pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
        }
    }
}

/// Runs `body` in a transaction of its own, with a snapshot: for a
/// background worker connected to a database and between transactions.
pub(crate) fn in_own_transaction<R>(body: impl FnOnce() -> R) -> R {
    // SAFETY: the caller is a connected worker between transactions.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = body();
    // SAFETY: pairs with the calls above.
    unsafe {
        pg_sys::PopActiveSnapshot();
        pg_sys::CommitTransactionCommand();
    }
    result
}

/// Whether `database` is in pg_database, read by a sequential scan as the
/// autovacuum launcher reads it: a process connected to no database cannot
/// open pg_database's indexes until a backend has written the shared
/// relcache init file, which a fresh cluster lacks (`get_database_oid`
/// failed there with "cannot read pg_class without having selected a
/// database").
pub(crate) fn database_exists(database: &str) -> bool {
    let mut found = false;
    // SAFETY: a transaction of its own with a snapshot around a catalog
    // heap scan; each tuple's data is read while the scan holds its page,
    // as GETSTRUCT does.
    unsafe {
        pg_sys::StartTransactionCommand();
        pg_sys::GetTransactionSnapshot();
        let relation = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let scan = pg_sys::table_beginscan_catalog(relation, 0, std::ptr::null_mut());
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let header = (*tuple).t_data;
            let row = (header as *const u8).add((*header).t_hoff as usize) as *const pg_sys::FormData_pg_database;
            if std::ffi::CStr::from_ptr((*row).datname.data.as_ptr()).to_bytes() == database.as_bytes() {
                found = true;
                break;
            }
        }
        pg_sys::heap_endscan(scan);
        pg_sys::table_close(relation, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::CommitTransactionCommand();
    }
    found
}

/// Starts a thread of this process that PostgreSQL's signals never reach:
/// a cancel, `statement_timeout`'s alarm or a terminate must run their
/// handlers on the backend's own thread, which they interrupt. Every
/// signal is blocked before the spawn, so the thread inherits a full mask
/// from its first instruction, then ours is restored. The thread may call
/// nothing of PostgreSQL's.
pub(crate) fn spawn_thread<T: Send + 'static>(
    name: &str,
    stack_size: usize,
    body: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    // SAFETY: plain libc calls on local, initialised sigset_t values.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut previous: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
    }
    let spawned = std::thread::Builder::new().name(name.into()).stack_size(stack_size).spawn(body);
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
    }
    spawned
}
