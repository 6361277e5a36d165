//! The wasmtime `Engine` and the backend's epoch ticker.
//!
//! The engine is made once per process tree where it can be: in the
//! postmaster when it maps the disk cache's artifacts at server start
//! (artifacts.rs, `lambdastore.preload_artifacts`), so that every backend
//! inherits it with them; else at a backend's first lambda call. wasmtime
//! keeps nothing per process in it that a fork would break (its
//! `/proc/self/pagemap` descriptor is replaced in the child by a
//! `pthread_atfork` handler). The ticker thread is never started in the
//! postmaster, because forked children do not inherit threads: each backend
//! starts its own at its first call. It only ever calls
//! `increment_epoch()`, blocks every signal (PostgreSQL's handlers must run
//! on the main thread), and parks once no invocation has run for `LINGER`,
//! so idle connections cost nothing and busy ones never pay a futex
//! wake-up per call.

use super::functions;
use crate::gucs::MAX_CALL_DEPTH_LIMIT;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

/// Resolution of deadlines and of noticing a query cancel, once a call has
/// run for a tick.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The ticker's period while calls are short: a call is first checked at
/// most this long after it starts. Each wake-up is a timer interrupt and two
/// context switches, often a cross-CPU wake-up as well; at 5 ms, 8 busy
/// backends on 2 cores ran 6–7% fewer read-only calls a second
/// (docs/PERFORMANCE.md, "Changes that made a warm call cheaper").
const SLOW_TICK: Duration = Duration::from_millis(50);

/// Time without a call before the ticker parks. Unparking it costs the
/// calling backend a futex syscall and a context switch, 8% of a warm
/// no-op call when it parked after every call; a few idle wake-ups per
/// second of a connection that has just been busy cost far less.
const LINGER: Duration = Duration::from_millis(250);

/// Wasm's share of the backend's native stack. Synchronous wasm runs on the
/// backend's stack, and nested calls stack up, so it stays far below
/// PostgreSQL's `max_stack_depth` (2 MB by default; the OS limit is larger),
/// which host code checks before every nested call.
const MAX_WASM_STACK: usize = 256 * 1024;

/// Instances alive at once in a backend: one per nested call on the stack,
/// plus one for deploy-time validation.
const POOL_SLOTS: u32 = MAX_CALL_DEPTH_LIMIT as u32 + 2;

/// Core module instances one component may make (Python's 38, with room).
const CORE_INSTANCES_PER_COMPONENT: u32 = 64;

/// Bytes of a slot kept resident between instances where the kernel lacks
/// PAGEMAP_SCAN (before Linux 6.7): wasmtime then memsets all of them when
/// an instance ends, so they are few: a Rust lambda's stack, data and first
/// heap pages (see .cargo/config.toml for the stack size). Tables too.
const KEEP_RESIDENT: usize = 512 * 1024;

/// Bytes of a slot's linear memory kept resident where the kernel has
/// PAGEMAP_SCAN: wasmtime then copies back only the pages the instance
/// wrote, so this bounds memory, not work. A Python call writes some 1.1 MB
/// scattered over the interpreter's 11 MB image; kept, the next instance
/// finds them mapped instead of faulting each one in again (a warm call in
/// half the time, docs/PERFORMANCE.md "Python guests"). Rust lambdas
/// mostly write less than `KEEP_RESIDENT`: little changes for them.
const KEEP_RESIDENT_SCANNED: usize = 4 << 20;

/// Address space of one linear memory: just under 4 GiB and without guard
/// pages, so compiled code checks bounds explicitly instead of relying on
/// faults. With guard pages wasmtime must `mprotect` a reused slot back to
/// the new instance's initial size, and Rust guests grow their memory for
/// every heap allocation, so every call paid two `mprotect`s, each a TLB
/// shootdown in a process with a second thread (the epoch ticker): 15–20%
/// of a warm call. The explicit checks cost about 1% of a compute-bound one
/// (docs/ARCHITECTURE.md, "The sandbox and its limits").
const MEMORY_RESERVATION: usize = (4 << 30) - (64 << 10);

pub(crate) struct Ticker {
    thread: Thread,
    state: Arc<TickerState>,
}

/// What the backend and its ticker share.
#[derive(Default)]
struct TickerState {
    /// Invocations started (upper 32 bits, wrapping) and running now (lower
    /// 32 bits; nested calls count each), in one word so that starting a
    /// call is one atomic add.
    calls: AtomicU64,
    /// Set by the ticker just before it parks, so that only a call that
    /// finds it parked pays for waking it.
    parked: AtomicBool,
}

const ONE_RUNNING: u64 = 1;
const ONE_STARTED: u64 = 1 << 32;
const RUNNING_MASK: u64 = ONE_STARTED - 1;

static ENGINE: OnceLock<Engine> = OnceLock::new();

static TICKER: OnceLock<Ticker> = OnceLock::new();

/// The engine every component of this process tree is compiled, mapped and
/// instantiated with: made here at the first use in this process or
/// inherited from the postmaster.
pub(crate) fn engine() -> &'static Engine {
    ENGINE.get_or_init(|| {
        let started = std::time::Instant::now();
        let scan = pagemap_scan();
        let engine = Engine::new(&config(scan)).expect("wasmtime engine configuration is valid");
        pgrx::debug1!(
            "lambdastore: wasmtime engine ready in {} µs (PAGEMAP_SCAN: {scan})",
            started.elapsed().as_micros()
        );
        engine
    })
}

/// This backend's epoch ticker, started at its first call.
pub(crate) fn ticker() -> &'static Ticker {
    TICKER.get_or_init(|| {
        let state = Arc::new(TickerState::default());
        let thread = spawn_ticker(engine().clone(), state.clone());
        Ticker { thread, state }
    })
}

/// Marks an invocation as running for as long as the guard lives, so that
/// the ticker advances the epoch.
pub(crate) struct Running<'a>(&'a Ticker);

impl Ticker {
    pub(crate) fn start(&self) -> Running<'_> {
        // SeqCst on both sides (increment here then read `parked`; set
        // `parked` there then read `calls`): at least one of the two sees
        // the other, so the ticker never sleeps through a running call.
        self.state.calls.fetch_add(ONE_STARTED | ONE_RUNNING, Ordering::SeqCst);
        if self.state.parked.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
        Running(self)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.state.calls.fetch_sub(ONE_RUNNING, Ordering::SeqCst);
    }
}

fn config(pagemap_scan: bool) -> Config {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(POOL_SLOTS)
        // wit-component adds small shim modules next to the main module;
        // a Python guest (componentize-py) links some 40, one per shared
        // library of the interpreter and its shims.
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .total_core_instances(POOL_SLOTS * CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(2)
        .total_memories(POOL_SLOTS * 2)
        .max_tables_per_component(4)
        .total_tables(POOL_SLOTS * 4)
        // The limit per instance is the `lambdastore.memory_limit` GUC
        // (below 4 GiB), enforced by the store's limiter; this is only the
        // hard ceiling.
        .max_memory_size(MEMORY_RESERVATION)
        // Reset what a freed slot's instance wrote in place (copied back or
        // zeroed) rather than with madvise: madvise in a process with a
        // second thread (the ticker) costs a TLB shootdown, and the next
        // call would fault the pages back in.
        .linear_memory_keep_resident(if pagemap_scan { KEEP_RESIDENT_SCANNED } else { KEEP_RESIDENT })
        .table_keep_resident(KEEP_RESIDENT)
        // Where the kernel has PAGEMAP_SCAN (Linux 6.7+), reset only the
        // pages the last instance dirtied instead of memsetting all of
        // what is kept resident.
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
    // Infallible in this wasmtime: it only keeps the store.
    let _ = config.enable_incremental_compilation(functions::store());
    config
}

/// Whether the kernel has the PAGEMAP_SCAN ioctl, probed as wasmtime's
/// `Enabled::Auto` probes it: a scan of nothing.
fn pagemap_scan() -> bool {
    use std::os::fd::AsRawFd;
    /// `_IOWR('f', 16, struct pm_scan_arg)` of linux/fs.h.
    const PAGEMAP_SCAN: libc::c_ulong = 0xC060_6610;
    let Ok(pagemap) = std::fs::File::open("/proc/self/pagemap") else { return false };
    // struct pm_scan_arg: twelve u64s, the first its size, the rest zero (an
    // empty range, no output vector).
    let mut arg = [0u64; 12];
    arg[0] = std::mem::size_of_val(&arg) as u64;
    // SAFETY: the argument is a valid pm_scan_arg the kernel only reads and
    // writes within; the descriptor is open for the call's duration.
    unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN, arg.as_mut_ptr()) >= 0 }
}

/// The ticker's stack: Rust's default for a thread, plenty for its loop.
const TICKER_STACK: usize = 2 << 20;

fn spawn_ticker(engine: Engine, state: Arc<TickerState>) -> Thread {
    let handle = crate::pg::process::spawn_thread("lambdastore-epoch", TICKER_STACK, move || {
        let mut period = SLOW_TICK;
        let mut last_started = None;
        let mut idle = Duration::ZERO;
        loop {
            std::thread::sleep(period);
            engine.increment_epoch();
            let calls = state.calls.load(Ordering::SeqCst);
            let (started, running) = (calls >> 32, calls & RUNNING_MASK);
            let none_started = last_started == Some(started);
            last_started = Some(started);
            // A call already running at the last wake-up may be a
            // runaway: watch it closely. Short calls are over long
            // before a tick, and waking often only slows them.
            period = if running > 0 && none_started { EPOCH_TICK } else { SLOW_TICK };
            if running > 0 || !none_started {
                idle = Duration::ZERO;
                continue;
            }
            idle += period;
            if idle >= LINGER {
                state.parked.store(true, Ordering::SeqCst);
                // A spurious or early unpark only costs one more loop.
                if state.calls.load(Ordering::SeqCst) & RUNNING_MASK == 0 {
                    std::thread::park();
                }
                state.parked.store(false, Ordering::SeqCst);
                idle = Duration::ZERO;
                last_started = None;
            }
        }
    })
    .expect("spawn the epoch ticker thread");
    handle.thread().clone()
}
