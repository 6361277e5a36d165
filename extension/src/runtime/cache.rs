//! Compiled components cached on disk, keyed by what identifies a version:
//! the module's SHA-256 and the engine's compatibility hash (wasmtime
//! version and settings). Loading is an mmap, so a new connection starts a
//! known module without compiling it.

use crate::error::{LambdaError, Result};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use wasmtime::component::Component;
use wasmtime::Engine;

fn cache_dir() -> PathBuf {
    // SAFETY: DataDir is set by the postmaster before any backend runs SQL
    // and never changes afterwards.
    let data_dir = unsafe { std::ffi::CStr::from_ptr(pgrx::pg_sys::DataDir) };
    PathBuf::from(data_dir.to_string_lossy().into_owned()).join("lambdastore").join("cache")
}

fn artifact_path(engine: &Engine, sha256: &str) -> PathBuf {
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    cache_dir().join(format!("{sha256}-{:016x}.cwasm", hasher.finish()))
}

/// Compiles `wasm` (validating it) and stores the artifact for later loads.
pub fn compile(engine: &Engine, sha256: &str, wasm: &[u8]) -> Result<Component> {
    let component = Component::new(engine, wasm)
        .map_err(|e| LambdaError::InvalidModule(invalid_module_message(wasm, e)))?;
    if let Err(e) = store(engine, sha256, &component) {
        // A cache that cannot be written costs a compile later, nothing else.
        pgrx::warning!("lambdastore: cannot cache compiled module {sha256}: {e}");
    }
    Ok(component)
}

/// Loads the artifact of `sha256`, compiling `wasm()` if it is not cached.
pub fn load(engine: &Engine, sha256: &str, wasm: impl FnOnce() -> Result<Vec<u8>>) -> Result<Component> {
    let path = artifact_path(engine, sha256);
    if path.exists() {
        // SAFETY: the file was written by `store` below from a component this
        // engine compiled; it lives in the data directory, which is as
        // trusted as the server's own binaries.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok(component),
            Err(e) => pgrx::warning!("lambdastore: ignoring unusable cached module {}: {e}", path.display()),
        }
    }
    compile(engine, sha256, &wasm()?)
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
