//! Background workers that run asynchronous jobs, and the shared memory
//! through which sessions wake them.
//!
//! Background workers must be registered in `_PG_init()` and can only be
//! started when the library is loaded through `shared_preload_libraries`.
//! The registry in shared memory holds, per worker, the `PGPROC` number
//! whose latch wakes it and the job it is running (the `running` column of
//! `lambdastore.queue`), and, per session blocked in `lambdastore.wait`, the
//! job it waits for. Latches, not polling: a worker sleeps until a commit
//! that queued jobs sets its latch, or until a retried job's backoff ends.

use crate::gucs::MAX_WORKERS;
use crate::pg::process;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime};
use pgrx::lwlock::PgLwLock;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::shmem::PGRXSharedMemory;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Sessions that can block in `lambdastore.wait` with a latch; more
/// waiters still work, by polling every `POLL` instead.
const MAX_WAITERS: usize = 256;
const POLL: Duration = Duration::from_millis(10);

#[derive(Clone, Copy)]
struct Slot {
    /// Index into `ProcGlobal->allProcs`, -1 if free.
    procno: i32,
    /// A worker's running job, or a waiter's awaited job; 0 if none.
    job: i64,
}

impl Slot {
    const FREE: Slot = Slot { procno: -1, job: 0 };
}

/// What the workers know of `lambdastore.database` (`Registry::database`).
#[derive(Clone, Copy, PartialEq)]
enum Database {
    /// No worker has tried it since the server started, or it was just created.
    Unknown,
    Connected,
    /// A worker's connection failed: the others wait for the database to
    /// exist instead of failing in turn.
    Missing,
}

#[derive(Clone, Copy)]
pub(crate) struct Registry {
    workers: [Slot; MAX_WORKERS],
    waiters: [Slot; MAX_WAITERS],
    database: Database,
    /// Whether a worker said it waits for the missing database: once.
    announced: bool,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            workers: [Slot::FREE; MAX_WORKERS],
            waiters: [Slot::FREE; MAX_WAITERS],
            database: Database::Unknown,
            announced: false,
        }
    }
}

// SAFETY: plain old data: no pointers, fixed size.
unsafe impl PGRXSharedMemory for Registry {}

// SAFETY: the name is unique to this extension.
static REGISTRY: PgLwLock<Registry> = unsafe { PgLwLock::new(c"lambdastore_workers") };
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Requests the registry's shared memory; from `_PG_init`, while preloading.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests the features of every PostgreSQL version
pub(crate) fn request_shared_memory() {
    pgrx::pg_shmem_init!(REGISTRY);
    ENABLED.store(true, Ordering::Relaxed);
}

/// Registers `lambdastore.workers` job runners and the rebalancer; from `_PG_init`, while
/// preloading (background workers can only be started then).
pub(crate) fn register() {
    for index in 0..crate::gucs::workers() {
        BackgroundWorkerBuilder::new(&format!("lambdastore job runner {index}"))
            .set_type("lambdastore job runner")
            .set_library("lambdastore")
            .set_function("lambdastore_job_runner_main")
            .set_argument(Some(pg_sys::Datum::from(index)))
            .enable_spi_access()
            .set_start_time(BgWorkerStartTime::RecoveryFinished)
            // After an error exit; after a crash of any process, the
            // postmaster restarts every worker itself.
            .set_restart_time(Some(Duration::from_secs(5)))
            .load();
    }
    // On every node: whether this one is a coordinator is only known once
    // connected, and the setting can be turned on by a reload.
    BackgroundWorkerBuilder::new("lambdastore rebalancer")
        .set_type("lambdastore rebalancer")
        .set_library("lambdastore")
        .set_function("lambdastore_rebalancer_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

/// How long a worker waits for the first one's connection before trying its own.
const FIRST_CONNECTION: Duration = Duration::from_secs(10);
/// How often workers look for a missing `lambdastore.database`. Nothing
/// signals a CREATE DATABASE; this is the only wait that polls.
const DATABASE_POLL: Duration = Duration::from_secs(1);
/// Whether this process got its connection (read when it exits).
static CONNECTED_HERE: AtomicBool = AtomicBool::new(false);

/// Connects this worker to `lambdastore.database`. A database that does
/// not exist ends the connecting process with a FATAL error, and the
/// postmaster starts it again every few seconds: with every worker doing
/// so, the log filled with one FATAL line per worker per restart until
/// the database was created. Now the first worker (`first`: job runner 0,
/// or the rebalancer when there are no runners) connects alone, the others
/// wait for how that went, and after a failure every worker waits for the
/// database without a connection (reading the shared catalog
/// pg_database), says so once, and restarts when it exists.
pub(crate) fn connect_to_database(first: bool) {
    let database = crate::gucs::database();
    let started = std::time::Instant::now();
    loop {
        let known = REGISTRY.share().database; // the lock is released here, not after the match
        match known {
            Database::Missing => wait_for_database(&database),
            Database::Connected => break,
            Database::Unknown if first || started.elapsed() >= FIRST_CONNECTION => break,
            Database::Unknown => process::wait_latch(POLL),
        }
    }
    // Runs when a failed connection ends this process (a FATAL error
    // exits through it).
    process::before_exit(note_failed_connection, 0);
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    CONNECTED_HERE.store(true, Ordering::Relaxed);
    let mut registry = REGISTRY.exclusive();
    registry.database = Database::Connected;
    registry.announced = false;
}

#[pg_guard]
unsafe extern "C-unwind" fn note_failed_connection(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    if !CONNECTED_HERE.load(Ordering::Relaxed) {
        REGISTRY.exclusive().database = Database::Missing;
    }
}

/// Waits until `database` exists, then exits so that the postmaster
/// starts this worker again (a process connects to one database once).
fn wait_for_database(database: &str) -> ! {
    BackgroundWorker::connect_worker_to_spi(None, None); // shared catalogs only
    {
        let mut registry = REGISTRY.exclusive();
        if !registry.announced {
            registry.announced = true;
            pgrx::warning!(
                "lambdastore: database \"{database}\" (lambdastore.database) does not exist: the background workers wait for it to be created"
            );
        }
    }
    loop {
        if process::database_exists(database) {
            REGISTRY.exclusive().database = Database::Unknown;
            process::exit(1); // restarted after the worker's restart time
        }
        process::wait_latch(DATABASE_POLL);
    }
}

/// Whether job runners serve `database` (by configuration: they may be
/// starting or restarting right now).
pub(crate) fn running_for(database: &str) -> bool {
    ENABLED.load(Ordering::Relaxed) && crate::gucs::workers() > 0 && crate::gucs::database() == database
}

/// Wakes every job runner.
pub(crate) fn wake_workers() {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let registry = REGISTRY.share();
    for slot in registry.workers.iter().filter(|s| s.procno >= 0) {
        process::set_latch(slot.procno);
    }
}

/// Wakes the sessions waiting for `job`.
pub(crate) fn wake_waiters(job: i64) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let registry = REGISTRY.share();
    for slot in registry.waiters.iter().filter(|s| s.procno >= 0 && s.job == job) {
        process::set_latch(slot.procno);
    }
}

/// The jobs the workers are running now.
pub(crate) fn running_jobs() -> Vec<i64> {
    if !ENABLED.load(Ordering::Relaxed) {
        return Vec::new();
    }
    REGISTRY.share().workers.iter().filter(|s| s.procno >= 0 && s.job != 0).map(|s| s.job).collect()
}

/// Takes worker slot `index` for this process until it exits.
pub(crate) fn attach_worker(index: usize) {
    REGISTRY.exclusive().workers[index] = Slot { procno: process::procno(), job: 0 };
    process::before_exit(detach_worker, index);
}

#[pg_guard]
unsafe extern "C-unwind" fn detach_worker(_code: std::ffi::c_int, index: pg_sys::Datum) {
    REGISTRY.exclusive().workers[index.value()] = Slot::FREE;
}

pub(crate) fn set_running(index: usize, job: i64) {
    REGISTRY.exclusive().workers[index].job = job;
}

/// A session's place among the waiters, given up when dropped (also when
/// a cancel unwinds out of `lambdastore.wait`).
pub(crate) struct Waiter {
    slot: Option<usize>,
}

impl Waiter {
    pub(crate) fn register(job: i64) -> Waiter {
        if !ENABLED.load(Ordering::Relaxed) {
            return Waiter { slot: None };
        }
        let mut registry = REGISTRY.exclusive();
        let slot = registry.waiters.iter().position(|s| s.procno < 0);
        if let Some(index) = slot {
            registry.waiters[index] = Slot { procno: process::procno(), job };
        }
        Waiter { slot }
    }

    /// Sleeps until the latch is set (the job may have finished), `left`
    /// has passed, or an interrupt arrives (which is then processed: a
    /// cancel raises its error here).
    pub(crate) fn sleep(&self, left: Duration) {
        let left = if self.slot.is_some() { left } else { left.min(POLL) };
        process::wait_latch(left);
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(index) = self.slot {
            REGISTRY.exclusive().waiters[index] = Slot::FREE;
        }
    }
}

/// Runs `body` in a transaction of its own, with a snapshot, under the
/// fixed `search_path` (a worker is a superuser, and its session's path
/// comes from settings a database's owner may change).
/// A cancel of the worker is held throughout (`runner::run_cancellable`
/// lets it act on a job's lambda only).
pub(crate) fn transaction<R>(body: impl FnOnce() -> R) -> R {
    crate::pg::backend::hold_cancel(true);
    process::in_own_transaction(|| crate::access::with_fixed_search_path(body))
}
