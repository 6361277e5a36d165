//! Compiled components cached on disk, keyed by what identifies a version:
//! the module's SHA-256 and the engine's compatibility hash (wasmtime
//! version and settings). Loading is an mmap, so a new connection starts a
//! known module without compiling it. Each database has a directory of its
//! own, so that a deploy can tell which artifacts no version of its
//! database uses (`store_and_retain`).

use super::functions;
use crate::error::{LambdaError, Result};
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::OnceLock;
use wasmtime::component::Component;
use wasmtime::Engine;

/// Where every database's directory of artifacts is.
fn cache_root() -> PathBuf {
    crate::pg::backend::lambdastore_directory().join("cache")
}

fn cache_dir() -> PathBuf {
    cache_root().join(crate::pg::backend::database_id().to_string())
}

/// Removes the artifacts of database `oid`, just dropped (a Python guest's
/// are 50 MB apiece, and the postmaster maps them all at its start).
pub(crate) fn forget_database(oid: u32) {
    let _ = std::fs::remove_dir_all(cache_root().join(oid.to_string()));
}

fn engine_suffix(engine: &Engine) -> String {
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("-{:016x}.cwasm", hasher.finish())
}

/// The part of a module's SHA-256 (hex) that names its artifact: 128 bits
/// are plenty to tell a database's modules apart, and the whole hash made
/// names that `pg_basebackup` refuses ("file name too long for tar
/// format": the protocol's tar takes at most 99 bytes of path, and
/// `lambdastore/cache/<database oid>/` already takes up to 29).
fn artifact_key(sha256: &str) -> &str {
    &sha256[..sha256.len().min(32)]
}

fn artifact_path(engine: &Engine, sha256: &str) -> PathBuf {
    cache_dir().join(format!("{}{}", artifact_key(sha256), engine_suffix(engine)))
}

/// Compiles `wasm`, validating it, with the functions compiled before
/// taken from `functions`.
pub(crate) fn compile(engine: &Engine, wasm: &[u8]) -> Result<Component> {
    let started = std::time::Instant::now();
    functions::counts(); // from a compile that failed, if any
    let component = compile_unless_canceled(engine, wasm)?;
    // After every compile, kept or refused (a module refused after its
    // compile, such as one without the lambdastore world, left its
    // functions behind: repeated, they filled the disk).
    functions::trim(crate::gucs::compiled_functions_bytes());
    let component = component.map_err(|e| LambdaError::InvalidModule(invalid_module_message(wasm, e)))?;
    let (reused, compiled) = functions::counts();
    pgrx::debug1!(
        "lambdastore: module compiled in {} ms, {reused} of {} functions from lambdastore/functions",
        started.elapsed().as_millis(),
        reused + compiled
    );
    Ok(component)
}

/// How much stack Cranelift gets on the compiling thread: the backend's
/// own is 8 MiB, and a deeply nested function's compile may need it.
const COMPILE_STACK: usize = 8 << 20;

/// `Component::new` on a thread of its own, waited for in steps that give
/// up on a cancel, `statement_timeout` or a terminate (57014): a Python
/// guest compiles for 16 s, and its deploy or first call could not be
/// stopped before. The thread left behind finishes alone, and the functions
/// it compiled stay in `lambdastore/functions` for the next try; it calls
/// nothing of PostgreSQL's (the function store is files).
fn compile_unless_canceled(engine: &Engine, wasm: &[u8]) -> Result<wasmtime::Result<Component>> {
    let (engine, wasm) = (engine.clone(), wasm.to_vec());
    let (done, compiled) = std::sync::mpsc::sync_channel(1);
    crate::pg::process::spawn_thread("lambdastore-compile", COMPILE_STACK, move || {
        let _ = done.send(Component::new(&engine, &wasm));
    })
    .map_err(|e| LambdaError::Internal(format!("cannot start compiling: {e}")))?;
    loop {
        match compiled.recv_timeout(std::time::Duration::from_millis(20)) {
            Ok(component) => return Ok(component),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if crate::pg::backend::interrupt_pending() => {
                return Err(LambdaError::Canceled);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(LambdaError::Internal("the compiler panicked".into()));
            }
        }
    }
}

/// Stores the artifact for later loads; a cache that cannot be written
/// costs a compile later, nothing else.
fn store_or_warn(engine: &Engine, sha256: &str, component: &Component) {
    if let Err(e) = store(engine, sha256, component) {
        pgrx::warning!("lambdastore: cannot cache compiled module {sha256}: {e}");
    }
}

/// Stores the artifact of a version just registered, then removes every
/// other artifact of this database's cache that no module in `in_use`
/// needs: those of modules no version uses, or of another engine. Files
/// still being written (`.tmp<pid>`) are left alone, and so is any file
/// written in the last `RECENT`: it may be the artifact of a version that
/// another deploy is registering now, which `in_use`, read before that
/// deploy commits, cannot show (a Python guest's deploy takes 16 s, and
/// removed the artifacts other tests had just deployed). Removing one that
/// is still wanted only costs a compile at its next load.
pub(crate) fn store_and_retain(engine: &Engine, sha256: &str, component: &Component, in_use: HashSet<String>) {
    store_or_warn(engine, sha256, component);
    let suffix = engine_suffix(engine);
    let Ok(files) = std::fs::read_dir(cache_dir()) else { return };
    for file in files.flatten() {
        let name = file.file_name().to_string_lossy().into_owned();
        let wanted = name
            .strip_suffix(&suffix)
            .is_some_and(|key| key == artifact_key(sha256) || in_use.iter().any(|sha| artifact_key(sha) == key));
        // Lock files (`compiling`) go too: one removed while in use only
        // lets a second backend compile at the same time.
        if !wanted && !name.contains(".tmp") && !written_lately(&file) {
            let _ = std::fs::remove_file(file.path());
        }
    }
}

/// How long a new artifact is safe from other deploys' cleanup.
const RECENT: std::time::Duration = std::time::Duration::from_secs(600);

fn written_lately(file: &std::fs::DirEntry) -> bool {
    let modified = file.metadata().and_then(|m| m.modified());
    modified.is_ok_and(|at| at.elapsed().is_ok_and(|age| age < RECENT))
}

/// Loads the artifact of `sha256`, compiling `wasm()` if it is not cached.
/// One backend of the server compiles a version at a time: the others
/// wait for its artifact (a burst of first calls of a new version, or a
/// node's first calls after a deploy elsewhere on a Citus cluster, would
/// each compile it: 16 s of CPU apiece for a Python guest).
pub(crate) fn load(engine: &Engine, sha256: &str, wasm: impl FnOnce() -> Result<Vec<u8>>) -> Result<Component> {
    if let Some(component) = cached(engine, sha256) {
        return Ok(component);
    }
    let _compiling = compiling(engine, sha256)?;
    if let Some(component) = cached(engine, sha256) {
        return Ok(component); // compiled by the backend that held the lock
    }
    let component = compile(engine, &wasm()?)?;
    store_or_warn(engine, sha256, &component);
    Ok(component)
}

/// An exclusive lock on compiling `sha256` (a lock file beside its
/// artifact), waited for in steps that give up on a cancel or a
/// terminate: a lambda may be on the stack (a nested call's version is
/// loaded there), so no ERROR is raised here, and the call fails with
/// 57014 as at any other interrupt. Without a lock file (a cache that
/// cannot be written), None: this backend compiles on its own.
fn compiling(engine: &Engine, sha256: &str) -> Result<Option<std::fs::File>> {
    let path = artifact_path(engine, sha256).with_extension("lock");
    let file = std::fs::create_dir_all(cache_dir())
        .and_then(|_| std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path));
    let Ok(file) = file else { return Ok(None) };
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) => {
                if crate::pg::backend::interrupt_pending() {
                    return Err(LambdaError::Canceled);
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::Error(_)) => return Ok(None),
        }
    }
}

/// The artifacts the postmaster mapped at start, by path: inherited by
/// every backend, which then only maps those deployed since. An artifact's
/// name is its module's hash and the engine's, so one found here is the
/// module asked for even if its file has gone since.
static PRELOADED: OnceLock<HashMap<PathBuf, Component>> = OnceLock::new();

/// Maps every artifact of this engine in every database's cache, with its
/// copy-on-write memory images, and keeps them for the backends to inherit
/// (called in the postmaster). Mapping a Python guest's artifact costs 3–4
/// ms, mostly wasmtime reading its metadata: a session's first call paid
/// it. One that cannot be mapped is left to the backends, which warn.
pub(crate) fn preload(engine: &Engine) {
    let started = std::time::Instant::now();
    let suffix = engine_suffix(engine);
    let databases = std::fs::read_dir(cache_root()).into_iter().flatten().flatten();
    let files = databases.flat_map(|dir| std::fs::read_dir(dir.path()).into_iter().flatten().flatten());
    let mut preloaded = HashMap::new();
    for path in files.map(|file| file.path()) {
        if !path.to_string_lossy().ends_with(&suffix) {
            continue; // another engine's, a lock file, or one being written
        }
        // A damaged file must not keep the server from starting.
        let mapped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let component = map(engine, &path)?;
            component.initialize_copy_on_write_image()?;
            Ok::<_, wasmtime::Error>(component)
        }));
        match mapped {
            Ok(Ok(component)) => {
                preloaded.insert(path, component);
            }
            Ok(Err(e)) => pgrx::log!("lambdastore: not preloading {}: {e:#}", path.display()),
            Err(_) => pgrx::log!("lambdastore: not preloading {}: wasmtime panicked", path.display()),
        }
    }
    pgrx::log!("lambdastore: {} compiled modules mapped in {} ms", preloaded.len(), started.elapsed().as_millis());
    let _ = PRELOADED.set(preloaded);
}

/// The cached artifact of `sha256`, if there is a usable one: the one the
/// postmaster mapped, else the file's.
pub(crate) fn cached(engine: &Engine, sha256: &str) -> Option<Component> {
    let path = artifact_path(engine, sha256);
    if let Some(component) = PRELOADED.get().and_then(|preloaded| preloaded.get(&path)) {
        pgrx::debug1!("lambdastore: module {} mapped by the postmaster", artifact_key(sha256));
        return Some(component.clone());
    }
    if !path.exists() {
        return None;
    }
    match map(engine, &path) {
        Ok(component) => Some(component),
        Err(e) => {
            pgrx::warning!("lambdastore: ignoring unusable cached module {}: {e}", path.display());
            None
        }
    }
}

/// Maps the artifact at `path` (wasmtime checks that this engine made it).
fn map(engine: &Engine, path: &std::path::Path) -> wasmtime::Result<Component> {
    // SAFETY: the cache's files are written by `store` below from
    // components an engine compiled; they live in the data directory, which
    // is as trusted as the server's own binaries.
    unsafe { Component::deserialize_file(engine, path) }
}

fn store(engine: &Engine, sha256: &str, component: &Component) -> std::io::Result<()> {
    let path = artifact_path(engine, sha256);
    let bytes = component.serialize().map_err(std::io::Error::other)?;
    std::fs::create_dir_all(path.parent().expect("artifact path has a parent"))?;
    // Write then rename, so that a concurrent reader never maps half a file.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

fn invalid_module_message(wasm: &[u8], err: wasmtime::Error) -> String {
    const WASM_MAGIC: &[u8] = b"\0asm";
    if !wasm.starts_with(WASM_MAGIC) {
        return "not a WebAssembly binary (it does not start with \\0asm)".into();
    }
    if wasm.len() >= 8 && wasm[4..8] == [1, 0, 0, 0] {
        return "this is a core WebAssembly module; deploy a component (see `make lambdas` and lambdastore-componentize)".into();
    }
    format!("{err:#}")
}
