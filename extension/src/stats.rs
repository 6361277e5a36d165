//! Per-function counters for `lambdastore.stats`: calls, commits, aborts by
//! reason, execution time. They live in shared memory — counters of an
//! aborted transaction must survive it — so they need the library in
//! `shared_preload_libraries`; without it the view is empty.

use crate::error::LambdaError;
use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::shmem::PGRXSharedMemory;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Distinct (application, type, function) triples tracked; later ones are
/// counted under the last slot's "(other)" row rather than lost silently.
const SLOTS: usize = 512;
const NAME: usize = 48;

#[derive(Clone, Copy)]
pub struct Slot {
    used: bool,
    app: [u8; NAME],
    ty: [u8; NAME],
    function: [u8; NAME],
    calls: i64,
    commits: i64,
    conflicts: i64,
    timeouts: i64,
    traps: i64,
    limits: i64,
    errors: i64,
    total_us: i64,
}

impl Slot {
    const EMPTY: Slot = Slot {
        used: false,
        app: [0; NAME],
        ty: [0; NAME],
        function: [0; NAME],
        calls: 0,
        commits: 0,
        conflicts: 0,
        timeouts: 0,
        traps: 0,
        limits: 0,
        errors: 0,
        total_us: 0,
    };
}

#[derive(Clone, Copy)]
pub struct Table([Slot; SLOTS]);

impl Default for Table {
    fn default() -> Self {
        Table([Slot::EMPTY; SLOTS])
    }
}

// SAFETY: plain old data: no pointers, fixed size.
unsafe impl PGRXSharedMemory for Table {}

// SAFETY: the name is unique to this extension.
static STATS: PgLwLock<Table> = unsafe { PgLwLock::new(c"lambdastore_stats") };
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Requests the shared memory; only possible while preloading.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests the features of every PostgreSQL version
pub fn init() {
    // SAFETY: a flag the postmaster sets while loading preload libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pgrx::pg_shmem_init!(STATS);
        ENABLED.store(true, Ordering::Relaxed);
    }
}

fn fixed(name: &str) -> [u8; NAME] {
    let mut out = [0; NAME];
    let mut end = name.len().min(NAME);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&name.as_bytes()[..end]);
    out
}

fn text(bytes: &[u8; NAME]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(NAME);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Counts one top-level call and its outcome.
pub fn record(app: &str, ty: &str, function: &str, outcome: Result<(), &LambdaError>, elapsed: Duration) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let (app, ty, function) = (fixed(app), fixed(ty), fixed(function));
    let mut table = STATS.exclusive();
    let slots = &mut table.0;
    let index = slots
        .iter()
        .position(|s| !s.used || (s.app == app && s.ty == ty && s.function == function))
        .unwrap_or(SLOTS - 1);
    let slot = &mut slots[index];
    if !slot.used {
        *slot = Slot { used: true, app, ty, function, ..Slot::EMPTY };
    } else if index == SLOTS - 1 && (slot.app != app || slot.ty != ty || slot.function != function) {
        slot.function = fixed("(other)");
    }
    slot.calls += 1;
    slot.total_us += elapsed.as_micros() as i64;
    match outcome {
        Ok(()) => slot.commits += 1,
        Err(LambdaError::SerializationFailure(_)) => slot.conflicts += 1,
        Err(LambdaError::Timeout(_) | LambdaError::Canceled) => slot.timeouts += 1,
        Err(LambdaError::Trap { .. }) => slot.traps += 1,
        Err(
            LambdaError::MemoryLimit { .. } | LambdaError::TooLarge { .. } | LambdaError::CallDepth(_),
        ) => slot.limits += 1,
        Err(_) => slot.errors += 1,
    }
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
        let table = STATS.share();
        table
            .0
            .iter()
            .filter(|s| s.used)
            .map(|s| {
                let total_ms = s.total_us as f64 / 1000.0;
                (
                    text(&s.app),
                    text(&s.ty),
                    text(&s.function),
                    s.calls,
                    s.commits,
                    s.conflicts,
                    s.timeouts,
                    s.traps,
                    s.limits,
                    s.errors,
                    total_ms,
                    total_ms / s.calls.max(1) as f64,
                )
            })
            .collect()
    } else {
        pgrx::notice!("lambdastore.stats needs lambdastore in shared_preload_libraries");
        Vec::new()
    };
    TableIterator::new(rows)
}
