//! The per-backend wasmtime `Engine` and its epoch ticker.
//!
//! Built lazily at the first lambda call of a backend, never in `_PG_init`
//! (which may run in the postmaster: forked children do not inherit
//! threads). The ticker thread only ever calls `increment_epoch()`, blocks
//! every signal (PostgreSQL's handlers must run on the main thread), and
//! parks whenever no invocation is running so idle connections cost nothing.

use crate::gucs::MAX_CALL_DEPTH_LIMIT;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

/// Resolution of deadlines and of noticing a query cancel.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Wasm's share of the backend's native stack. Synchronous wasm runs on the
/// backend's stack, and nested calls stack up, so it stays far below
/// PostgreSQL's `max_stack_depth` (2 MB by default; the OS limit is larger),
/// which host code checks before every nested call.
const MAX_WASM_STACK: usize = 256 * 1024;

/// Instances alive at once in a backend: one per nested call on the stack,
/// plus one for deploy-time validation.
const POOL_SLOTS: u32 = MAX_CALL_DEPTH_LIMIT as u32 + 2;

/// Bytes of a slot kept resident between instances: a lambda's stack,
/// data and first heap pages (see .cargo/config.toml for the stack size).
const KEEP_RESIDENT: usize = 512 * 1024;

/// Address space of one linear memory: just under 4 GiB and without guard
/// pages, so compiled code checks bounds explicitly instead of relying on
/// faults. With guard pages wasmtime must `mprotect` a reused slot back to
/// the new instance's initial size, and Rust guests grow their memory for
/// every heap allocation, so every call paid two `mprotect`s, each a TLB
/// shootdown in a process with a second thread (the epoch ticker): 15–20%
/// of a warm call. The explicit checks cost about 1% of a compute-bound one
/// (README, "Performance").
const MEMORY_RESERVATION: usize = (4 << 30) - (64 << 10);

pub struct Runtime {
    pub engine: Engine,
    ticker: Thread,
    running: Arc<AtomicUsize>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        let started = std::time::Instant::now();
        let engine = Engine::new(&config()).expect("wasmtime engine configuration is valid");
        let running = Arc::new(AtomicUsize::new(0));
        let ticker = spawn_ticker(engine.clone(), running.clone());
        pgrx::debug1!("lambdastore: wasmtime engine ready in {} µs", started.elapsed().as_micros());
        Runtime { engine, ticker, running }
    })
}

/// Marks an invocation as running for as long as the guard lives, so that
/// the ticker advances the epoch.
pub struct Running<'a>(&'a Runtime);

impl Runtime {
    pub fn start(&self) -> Running<'_> {
        if self.running.fetch_add(1, Ordering::SeqCst) == 0 {
            self.ticker.unpark();
        }
        Running(self)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

fn config() -> Config {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(POOL_SLOTS)
        // wit-component adds small shim modules next to the main module.
        .max_core_instances_per_component(8)
        .total_core_instances(POOL_SLOTS * 8)
        .max_memories_per_component(2)
        .total_memories(POOL_SLOTS * 2)
        .max_tables_per_component(4)
        .total_tables(POOL_SLOTS * 4)
        // The limit per instance is the `lambdastore.memory_limit` GUC
        // (below 4 GiB), enforced by the store's limiter; this is only the
        // hard ceiling.
        .max_memory_size(MEMORY_RESERVATION)
        // Reset a freed slot's first pages with memset rather than madvise:
        // madvise in a process with a second thread (the ticker) costs a
        // TLB shootdown, and the next call would fault the pages back in.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(KEEP_RESIDENT)
        // Where the kernel has PAGEMAP_SCAN (Linux 6.7+), reset only the
        // pages the last instance dirtied instead of memsetting all of
        // KEEP_RESIDENT.
        .pagemap_scan(Enabled::Auto);

    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK)
        .memory_reservation(MEMORY_RESERVATION as u64)
        .memory_guard_size(0)
        .guard_before_linear_memory(false)
        .cranelift_opt_level(OptLevel::Speed)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

fn spawn_ticker(engine: Engine, running: Arc<AtomicUsize>) -> Thread {
    // Block every signal before spawning so the new thread inherits a full
    // mask from its first instruction, then restore ours.
    // SAFETY: plain libc calls on local, initialised sigset_t values.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut previous: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
    }
    let handle = std::thread::Builder::new()
        .name("lambdastore-epoch".into())
        .spawn(move || loop {
            if running.load(Ordering::SeqCst) == 0 {
                std::thread::park();
                continue;
            }
            std::thread::sleep(EPOCH_TICK);
            engine.increment_epoch();
        })
        .expect("spawn the epoch ticker thread");
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
    }
    handle.thread().clone()
}
