//! Per-function counters for `lambdastore.stats`: calls, commits, aborts by
//! reason, execution time. They live in shared memory — counters of an
//! aborted transaction must survive it — so they need the library in
//! `shared_preload_libraries`; without it the view is empty.
//!
//! A call adds to its function's counters with atomics and takes no lock:
//! the names of the counted functions are in a table under an LWLock, which
//! a backend takes once per function, to find or claim its slot, and then
//! remembers the slot. (Every call used to take that lock exclusively and
//! scan the table: one lock for every call of every backend.)

use crate::error::LambdaError;
use crate::pg::shmem::Zeroed;
use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::shmem::PGRXSharedMemory;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

/// Distinct (application, type, function) triples tracked; later ones are
/// counted under the last slot's "(other)" row rather than lost silently.
const SLOTS: usize = 2048;
/// Bytes kept of each name: an application's whole (63 at most), a type's
/// or function's (of any length) cut to fit, ending in "…".
const NAME: usize = 64;

#[derive(Clone, Copy)]
pub(crate) struct Name {
    used: bool,
    /// The database the calls ran in: the table is the server's, and an
    /// application of the same name in another database is another one.
    database: u32,
    /// Of the whole names: two functions whose names are cut alike are
    /// counted apart.
    hash: u64,
    app: [u8; NAME],
    ty: [u8; NAME],
    function: [u8; NAME],
}

impl Name {
    const EMPTY: Name = Name { used: false, database: 0, hash: 0, app: [0; NAME], ty: [0; NAME], function: [0; NAME] };

    fn new(app: &str, ty: &str, function: &str) -> Name {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: the same in every backend of the server.
        let mut hasher = std::hash::DefaultHasher::new();
        (app, ty, function).hash(&mut hasher);
        Name {
            used: true,
            database: crate::pg::backend::database_id(),
            hash: hasher.finish(),
            app: fixed(app),
            ty: fixed(ty),
            function: fixed(function),
        }
    }

    fn same(&self, other: &Name) -> bool {
        self.database == other.database
            && self.hash == other.hash
            && self.app == other.app
            && self.ty == other.ty
            && self.function == other.function
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Names([Name; SLOTS]);

impl Default for Names {
    fn default() -> Self {
        Names([Name::EMPTY; SLOTS])
    }
}

// SAFETY: plain old data: no pointers, fixed size.
unsafe impl PGRXSharedMemory for Names {}

/// One slot's counters, a cache line of their own so that backends calling
/// different functions do not share one.
#[repr(align(64))]
pub(crate) struct Counters {
    calls: AtomicI64,
    commits: AtomicI64,
    conflicts: AtomicI64,
    timeouts: AtomicI64,
    traps: AtomicI64,
    limits: AtomicI64,
    errors: AtomicI64,
    total_us: AtomicI64,
}

// SAFETY: the names are unique to this extension.
static NAMES: PgLwLock<Names> = unsafe { PgLwLock::new(c"lambdastore_stats") };
static COUNTERS: Zeroed<[Counters; SLOTS]> = Zeroed::new(c"lambdastore_stats_counters");
static ENABLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The slot of each function this backend has counted, by application,
    /// type and function (nested so that a lookup borrows the names).
    /// Slots are never freed, so a remembered one stays right.
    static SLOT_OF: RefCell<HashMap<String, HashMap<String, HashMap<String, usize>>>> = RefCell::new(HashMap::new());
}

/// Requests the shared memory; from `_PG_init`, while preloading.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests the features of every PostgreSQL version
pub(crate) fn request_shared_memory() {
    pgrx::pg_shmem_init!(NAMES);
    pgrx::pg_shmem_init!(COUNTERS = false);
    ENABLED.store(true, Ordering::Relaxed);
}

fn fixed(name: &str) -> [u8; NAME] {
    const CUT: &str = "…";
    let mut out = [0; NAME];
    if name.len() <= NAME {
        out[..name.len()].copy_from_slice(name.as_bytes());
        return out;
    }
    let mut end = NAME - CUT.len();
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&name.as_bytes()[..end]);
    out[end..end + CUT.len()].copy_from_slice(CUT.as_bytes());
    out
}

fn text(bytes: &[u8; NAME]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(NAME);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The slot counting (app, ty, function): this backend's memory of it, else
/// found or claimed in the shared table.
fn slot(app: &str, ty: &str, function: &str) -> usize {
    let known = SLOT_OF.with(|slots| slots.borrow().get(app)?.get(ty)?.get(function).copied());
    if let Some(index) = known {
        return index;
    }
    let index = claim(Name::new(app, ty, function));
    SLOT_OF.with(|slots| {
        let mut slots = slots.borrow_mut();
        let of_type = slots.entry(app.to_string()).or_default().entry(ty.to_string()).or_default();
        of_type.insert(function.to_string(), index);
    });
    index
}

fn claim(wanted: Name) -> usize {
    let mut names = NAMES.exclusive();
    let names = &mut names.0;
    let index = names.iter().position(|n| !n.used || n.same(&wanted)).unwrap_or(SLOTS - 1);
    let name = &mut names[index];
    if !name.used {
        *name = wanted;
    } else if index == SLOTS - 1 && !name.same(&wanted) {
        name.function = fixed("(other)");
    }
    index
}

/// Counts one top-level call and its outcome.
pub(crate) fn record(app: &str, ty: &str, function: &str, outcome: Result<(), &LambdaError>, elapsed: Duration) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let counters = &COUNTERS.get()[slot(app, ty, function)];
    let outcome_counter = match outcome {
        Ok(()) => &counters.commits,
        Err(LambdaError::SerializationFailure(_)) => &counters.conflicts,
        Err(LambdaError::Timeout { .. } | LambdaError::Canceled) => &counters.timeouts,
        Err(LambdaError::Trap { .. }) => &counters.traps,
        Err(
            LambdaError::MemoryLimit { .. }
            | LambdaError::TooLarge { .. }
            | LambdaError::TooMany { .. }
            | LambdaError::KeyTooLong { .. }
            | LambdaError::CallDepth(_),
        ) => &counters.limits,
        Err(_) => &counters.errors,
    };
    // Relaxed: each counter is exact on its own; a reader may see a call
    // counted in `calls` and not yet in its outcome.
    counters.calls.fetch_add(1, Ordering::Relaxed);
    counters.total_us.fetch_add(elapsed.as_micros() as i64, Ordering::Relaxed);
    outcome_counter.fetch_add(1, Ordering::Relaxed);
}

#[pg_extern(schema = "lambdastore", name = "_stats")]
#[allow(clippy::type_complexity)]
fn stats() -> TableIterator<
    'static,
    (
        name!(app, String),
        name!(type_name, String),
        name!(function, String),
        name!(calls, i64),
        name!(commits, i64),
        name!(aborts_conflict, i64),
        name!(aborts_timeout, i64),
        name!(aborts_trap, i64),
        name!(aborts_limit, i64),
        name!(aborts_other, i64),
        name!(total_ms, f64),
        name!(mean_ms, f64),
    ),
> {
    let rows: Vec<_> = if ENABLED.load(Ordering::Relaxed) {
        let names = NAMES.share();
        let counters = COUNTERS.get();
        let database = crate::pg::backend::database_id();
        names
            .0
            .iter()
            .zip(counters)
            .filter(|(name, _)| name.used && name.database == database)
            .map(|(name, c)| {
                let read = |counter: &AtomicI64| counter.load(Ordering::Relaxed);
                let total_ms = read(&c.total_us) as f64 / 1000.0;
                (
                    text(&name.app),
                    text(&name.ty),
                    text(&name.function),
                    read(&c.calls),
                    read(&c.commits),
                    read(&c.conflicts),
                    read(&c.timeouts),
                    read(&c.traps),
                    read(&c.limits),
                    read(&c.errors),
                    total_ms,
                    total_ms / read(&c.calls).max(1) as f64,
                )
            })
            .collect()
    } else {
        pgrx::notice!("lambdastore.stats needs lambdastore in shared_preload_libraries");
        Vec::new()
    };
    TableIterator::new(rows)
}
