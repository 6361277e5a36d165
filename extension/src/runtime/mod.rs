//! A narrow wrapper around wasmtime, and the only place that makes engines
//! and stores: one engine, made in the postmaster or at a backend's first
//! call, and each backend's epoch ticker (engine.rs); compiled components
//! cached on disk, which the postmaster maps at start (artifacts.rs), and
//! compiled functions, which later compiles reuse (functions.rs); and
//! `call`, which runs guest code in a fresh store with a memory limit and a
//! deadline. It knows nothing of workflows, objects or the catalog: a
//! store's data is generic, and the host interface (host/) links itself
//! into a `linker()`.

mod artifacts;
mod engine;
mod functions;

use crate::error::{from_wasmtime, LambdaError, Result};
use std::collections::HashSet;
use std::time::Instant;
use wasmtime::{Store, UpdateDeadline};

pub(crate) use wasmtime::component::{Component, Linker};

/// Maps every artifact of the disk cache now, in the postmaster, so that
/// the backends it forks inherit them (`lambdastore.preload_artifacts`).
pub(crate) fn preload_artifacts() {
    artifacts::preload(engine::engine());
}

pub(crate) use artifacts::forget_database;

/// Compiles `wasm`, validating it, unless the disk cache has the artifact
/// of these bytes (`sha256`): the same module deployed as another
/// application, or again after a redeploy (a Python guest takes 13 s to
/// compile). Compiling cannot be interrupted: the caller bounds its size.
pub(crate) fn compile_or_cached(sha256: &str, wasm: &[u8]) -> Result<Component> {
    let engine = engine::engine();
    match artifacts::cached(engine, sha256) {
        Some(component) => Ok(component),
        None => artifacts::compile(engine, wasm),
    }
}

/// The component whose bytes hash to `sha256`: mapped from the disk cache,
/// else compiled from `wasm()` and cached.
pub(crate) fn load(sha256: &str, wasm: impl FnOnce() -> Result<Vec<u8>>) -> Result<Component> {
    artifacts::load(engine::engine(), sha256, wasm)
}

/// Caches a version's compiled component once it is registered, and
/// removes this database's artifacts of modules no version uses (`in_use`).
pub(crate) fn cache_compiled(sha256: &str, component: &Component, in_use: Vec<String>) {
    artifacts::store_and_retain(engine::engine(), sha256, component, in_use.into_iter().collect::<HashSet<_>>());
}

/// A linker for stores holding `T`, to add the host interface to.
pub(crate) fn linker<T: 'static>() -> Linker<Sandboxed<T>> {
    Linker::new(engine::engine())
}

/// What a store holds: the caller's data and the limits wasmtime asks
/// about when memory or tables grow.
pub(crate) struct Sandboxed<T> {
    pub(crate) data: T,
    limits: Limits,
}

struct Limits {
    memory_limit: usize,
    /// The largest size a linear memory of the store was given, its
    /// initial size included.
    memory_size: usize,
}

impl<T> Sandboxed<T> {
    /// The largest linear memory the store's instance has had, in bytes.
    pub(crate) fn memory_size(&self) -> usize {
        self.limits.memory_size
    }
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            return Err(LambdaError::MemoryLimit { limit: self.memory_limit, requested: desired }.into());
        }
        self.memory_size = self.memory_size.max(desired);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        // Tables hold function references; no sane guest needs millions.
        Ok(desired <= 1 << 20)
    }
}

/// Runs `f` in a fresh store holding `data`, whose linear memory may grow
/// to `memory_limit` bytes (past it: a trap with `MemoryLimit`), and which
/// `keep_going` may stop at every epoch tick (its error traps). Errors come
/// back as `LambdaError`s, after every wasm frame has been left.
pub(crate) fn call<T: 'static, R>(
    data: T,
    memory_limit: usize,
    keep_going: fn(&T) -> Result<()>,
    f: impl FnOnce(&mut Store<Sandboxed<T>>) -> wasmtime::Result<R>,
) -> Result<R> {
    let ticker = engine::ticker();
    let mut store = Store::new(engine::engine(), Sandboxed { data, limits: Limits { memory_limit, memory_size: 0 } });
    store.limiter(|state| &mut state.limits);
    // With epoch interruption on, every store needs a deadline: here, every
    // tick, where the callback decides whether to go on.
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |ctx| {
        keep_going(&ctx.data().data)?;
        Ok(UpdateDeadline::Continue(1))
    });
    let running = ticker.start();
    let result = f(&mut store).map_err(from_wasmtime);
    drop(running);
    // The instance's linear memory is reset for the next one as the store
    // drops (the pooling allocator's slot): timed for `make bench-python`
    // only when the line will go somewhere.
    if crate::pg::backend::debug2_wanted() {
        let started = Instant::now();
        drop(store);
        pgrx::debug2!("lambdastore: a store dropped, its memory reset, in {} µs", started.elapsed().as_micros());
    }
    result
}
