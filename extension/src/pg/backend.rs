//! This backend: its database, PRNG, clock, stack, pending interrupts,
//! the flushing of its files, and what it looks up by name.

use pgrx::pg_sys;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha12Rng;
use std::cell::RefCell;

/// The extension's own directory in the data directory, `lambdastore/`.
pub(crate) fn lambdastore_directory() -> std::path::PathBuf {
    // SAFETY: DataDir is set by the postmaster before it loads the preload
    // libraries, and never changes afterwards.
    let data_dir = unsafe { std::ffi::CStr::from_ptr(pg_sys::DataDir) };
    std::path::PathBuf::from(data_dir.to_string_lossy().into_owned()).join("lambdastore")
}

/// The OID of the database this backend serves.
pub(crate) fn database_id() -> u32 {
    // SAFETY: set at backend start, never changed after.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// The name of the database this backend serves ("" before it has one).
pub(crate) fn database_name() -> String {
    // SAFETY: MyDatabaseId is set once connected; get_database_name returns a palloc'd copy or NULL.
    unsafe {
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        if name.is_null() {
            return String::new();
        }
        std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned()
    }
}

/// Flushes `file`'s data (and the size that reading it needs) to disk as
/// PostgreSQL flushes its own: not at all under `fsync = off`.
pub(crate) fn flush_data(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain system call on an open descriptor; it reads the
    // `fsync` setting, from the main thread.
    match unsafe { pg_sys::pg_fdatasync(file.as_raw_fd()) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Flushes `file` (a directory too: its entries) as `flush_data` does,
/// metadata included.
pub(crate) fn flush(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: as in `flush_data`.
    match unsafe { pg_sys::pg_fsync(file.as_raw_fd()) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Uniform in [0, 1), from the backend's PRNG (seeded at backend start).
pub(crate) fn random_f64() -> f64 {
    // SAFETY: the global PRNG, used from the main thread only.
    unsafe { pg_sys::pg_prng_double(&raw mut pg_sys::pg_global_prng_state) }
}

/// Draws of a stream before it is seeded again (2 MiB of output).
const DRAWS_PER_SEED: u32 = 1 << 18;

thread_local! {
    /// The process's cryptographic stream: (the process it was seeded in,
    /// draws left, the stream).
    static STREAM: RefCell<Option<(i32, u32, ChaCha12Rng)>> = const { RefCell::new(None) };
}

/// 64 cryptographically random bits; None if the operating system's source
/// gave nothing. A ChaCha12 stream (the `rand` crate's `StdRng`) seeded from
/// `strong_random` in this process, and again every `DRAWS_PER_SEED` draws:
/// OpenSSL's generator behind `strong_random` takes about 1.7 µs a call.
/// Seeded in the process that draws, never inherited across a fork.
pub(crate) fn strong_random_u64() -> Option<u64> {
    // SAFETY: this process's id, set once when it started.
    let pid = unsafe { pg_sys::MyProcPid };
    STREAM.with(|stream| {
        let mut stream = stream.borrow_mut();
        match stream.as_mut() {
            Some((seeded_in, left, _)) if *seeded_in == pid && *left > 0 => *left -= 1,
            _ => {
                let mut seed = [0u8; 32];
                if !strong_random(&mut seed) {
                    return None;
                }
                *stream = Some((pid, DRAWS_PER_SEED - 1, ChaCha12Rng::from_seed(seed)));
            }
        }
        stream.as_mut().map(|(_, _, rng)| rng.next_u64())
    })
}

/// The system clock in microseconds since 1970-01-01 (PostgreSQL counts
/// from 2000-01-01).
pub(crate) fn now_unix_micros() -> i64 {
    const UNIX_TO_POSTGRES_EPOCH_MICROS: i64 = 946_684_800 * 1_000_000;
    // SAFETY: reads the system clock; no PostgreSQL state is touched.
    unsafe { pg_sys::GetCurrentTimestamp() + UNIX_TO_POSTGRES_EPOCH_MICROS }
}

/// Whether a DEBUG2 message would go anywhere (the server log or the
/// client), so that one is only formatted when someone asked for it.
pub(crate) fn debug2_wanted() -> bool {
    // SAFETY: reads the log level settings; no state is changed.
    unsafe { pg_sys::message_level_is_interesting(pg_sys::DEBUG2 as i32) }
}

/// Whether the stack is near `max_stack_depth`.
pub(crate) fn stack_too_deep() -> bool {
    // SAFETY: compares the stack pointer with PostgreSQL's stack base.
    unsafe { pg_sys::stack_is_too_deep() }
}

/// Whether a query cancel, `statement_timeout` or a termination is
/// pending: PostgreSQL's signal handlers only set these flags.
pub(crate) fn interrupt_pending() -> bool {
    // SAFETY: sig_atomic_t flags written by signal handlers; a volatile
    // read is how PostgreSQL itself reads them.
    unsafe {
        std::ptr::read_volatile(&raw const pg_sys::QueryCancelPending) != 0
            || std::ptr::read_volatile(&raw const pg_sys::ProcDiePending) != 0
    }
}

/// The OID of role `name`, if there is one.
pub(crate) fn role_oid_if_any(name: &std::ffi::CStr) -> Option<pg_sys::Oid> {
    // SAFETY: a syscache lookup by name; missing_ok returns InvalidOid.
    let oid = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The OID of role `name`; raises 42704 when there is none.
pub(crate) fn role_oid(name: &std::ffi::CStr) -> pg_sys::Oid {
    // SAFETY: a syscache lookup by name; missing_ok false raises 42704.
    unsafe { pg_sys::get_role_oid(name.as_ptr(), false) }
}

/// The OID of relation `schema.name`, if there is one.
pub(crate) fn relation_oid(schema: &std::ffi::CStr, name: &str) -> Option<pg_sys::Oid> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: syscache lookups by name; InvalidOid when missing.
    let oid = unsafe { pg_sys::get_relname_relid(name.as_ptr(), pg_sys::get_namespace_oid(schema.as_ptr(), true)) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// Whether function `oid` is named `name` (a syscache lookup, nothing
/// else: safe in any statement's planning).
pub(crate) fn function_is_named(oid: pg_sys::Oid, name: &std::ffi::CStr) -> bool {
    // SAFETY: a syscache lookup by OID; NULL when missing, else a palloc'd
    // name read at once.
    unsafe {
        let found = pg_sys::get_func_name(oid);
        !found.is_null() && std::ffi::CStr::from_ptr(found) == name
    }
}

/// Whether the open transaction has counted changes to `relation` (its
/// pending statistics, kept while `track_counts` is on); `None` when
/// statistics are off and nothing can be told.
pub(crate) fn changed_in_transaction(relation: pg_sys::Oid) -> Option<bool> {
    // SAFETY: a plain bool setting.
    if !unsafe { pg_sys::pgstat_track_counts } {
        return None;
    }
    // SAFETY: this backend's pending statistics of `relation`; the entry's
    // `trans` is set while the open transaction has counts.
    Some(unsafe { pg_sys::find_tabstat_entry(relation).as_ref() }.is_some_and(|s| !s.trans.is_null()))
}

/// "40001" from PostgreSQL's packed form (five 6-bit characters,
/// `unpack_sql_state`).
pub(crate) fn sqlstate_text(code: pgrx::PgSqlErrorCode) -> String {
    let packed = code as i32;
    (0..5).map(|i| (((packed >> (6 * i)) & 0x3F) as u8 + b'0') as char).collect()
}

/// The functions of citus.so this extension calls, all `void f(void)` in
/// Citus 13, called inside a transaction as Citus' executor calls them.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Citus {
    /// Open a transaction block on every node reached from now on.
    UseCoordinatedTransaction,
    /// Commit the nodes reached in two phases.
    Use2PCForCoordinatedTransaction,
}

/// Calls `f` of citus.so (PostgreSQL caches the library's handle); false
/// when the library has no such function.
pub(crate) fn call_citus(f: Citus) -> bool {
    let symbol = match f {
        Citus::UseCoordinatedTransaction => c"UseCoordinatedTransaction",
        Citus::Use2PCForCoordinatedTransaction => c"Use2PCForCoordinatedTransaction",
    };
    // SAFETY: signalNotFound false returns NULL instead of raising.
    let found =
        unsafe { pg_sys::load_external_function(c"citus".as_ptr(), symbol.as_ptr(), false, std::ptr::null_mut()) };
    if found.is_null() {
        return false;
    }
    // SAFETY: every `Citus` is `void f(void)` (above).
    unsafe { std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C-unwind" fn()>(found)() };
    true
}

/// A PostgreSQL condition variable, placed in shared memory zeroed and
/// `init`ialized at server start, before any backend can wait on it.
#[repr(transparent)]
pub(crate) struct Condition(std::cell::UnsafeCell<pg_sys::ConditionVariable>);

// SAFETY: a condition variable is PostgreSQL's to share between processes
// (its own spinlock guards it); Rust only passes its address.
unsafe impl Sync for Condition {}

impl Condition {
    /// At server start, in the shared memory being set up.
    pub(crate) fn init(&self) {
        // SAFETY: a zeroed condition variable no backend uses yet.
        unsafe { pg_sys::ConditionVariableInit(self.0.get()) };
    }

    /// Wakes every backend sleeping on it: a spinlock and setting
    /// latches, which cannot fail (safe at commit).
    pub(crate) fn broadcast(&self) {
        // SAFETY: initialized at server start.
        unsafe { pg_sys::ConditionVariableBroadcast(self.0.get()) };
    }

    /// Sleeps at most `millis`, or until woken. The first call only
    /// prepares to sleep, so that a wake-up between the caller's check
    /// and the sleep is not lost: call it in a loop that checks first,
    /// then `cancel_sleep`. Interrupts are checked inside (an error
    /// cancels the sleep as the transaction aborts). Shown in
    /// `pg_stat_activity` as wait event `Extension`.
    pub(crate) fn sleep(&self, millis: i64) {
        // SAFETY: initialized at server start.
        unsafe {
            pg_sys::ConditionVariableTimedSleep(self.0.get(), millis as std::ffi::c_long, pg_sys::PG_WAIT_EXTENSION)
        };
    }
}

/// Ends the sleeping `Condition::sleep` began (a no-op when none did).
pub(crate) fn cancel_sleep() {
    // SAFETY: a no-op when this backend is not prepared to sleep.
    unsafe { pg_sys::ConditionVariableCancelSleep() };
}

/// Whether the postmaster is loading `shared_preload_libraries` now (the
/// only time shared memory and background workers can be asked for).
pub(crate) fn preloading() -> bool {
    // SAFETY: a flag the postmaster sets while loading preload libraries.
    unsafe { pg_sys::process_shared_preload_libraries_in_progress }
}

/// A function PostgreSQL calls when a relation's cache entry is invalidated.
pub(crate) type RelcacheCallback = unsafe extern "C-unwind" fn(pg_sys::Datum, pg_sys::Oid);

/// Has `callback` called at every relcache invalidation (Citus sends one
/// when shards are created or moved); once per process.
pub(crate) fn on_relation_change(callback: RelcacheCallback) {
    // SAFETY: registers a plain function with no argument.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(callback), pg_sys::Datum::from(0)) };
}

/// Fills `buffer` from the operating system's random source; false if it
/// could not.
pub(crate) fn strong_random(buffer: &mut [u8]) -> bool {
    // SAFETY: writes exactly `buffer.len()` bytes into the buffer.
    unsafe { pg_sys::pg_strong_random(buffer.as_mut_ptr().cast(), buffer.len()) }
}

/// Keeps the running statement's text out of the server log should it
/// fail now (a deploy's module bytes); set again by the next statement.
pub(crate) fn forget_statement_text() {
    // SAFETY: the statement text this backend logs on error, a pointer
    // this backend owns; NULL is what it holds between statements.
    unsafe { pg_sys::debug_query_string = std::ptr::null() };
}

/// Forgets a cancel request already acted on (a job's statement timeout
/// reached), so that the job runner's next step does not stop for it.
/// While held, a query cancel (`pg_cancel_backend`) of this process stays
/// pending at `CHECK_FOR_INTERRUPTS` instead of raising an ERROR there
/// (PostgreSQL holds it so while a backend reads a client's message). Any
/// ERROR ends the hold: PostgreSQL's `errfinish` resets the count.
pub(crate) fn hold_cancel(hold: bool) {
    // SAFETY: a counter of this process, read and written on its main thread.
    unsafe { pg_sys::QueryCancelHoldoffCount = u32::from(hold) };
}

pub(crate) fn clear_query_cancel() {
    // SAFETY: a flag of this process, read and written on its main thread.
    unsafe { pg_sys::QueryCancelPending = 0 };
}
