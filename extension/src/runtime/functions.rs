//! Cranelift's incremental cache on disk: each compiled function kept under
//! the hash of its input, so that compiling a module whose functions were
//! compiled before (a new version of an application; any Python guest,
//! whose 38 core modules are the interpreter's, the same in every Python
//! application) reuses them. A Python guest compiled in 18.6 s, another
//! one after it in 4–8 s (docs/PERFORMANCE.md, "Python guests").
//!
//! One directory per server, `lambdastore/functions/` in the data
//! directory: a key is Cranelift's SHA-256 of the function and of the
//! target's settings, so entries are good for any database and engine that
//! asks for them, and Cranelift checks its own version in each. A file per
//! function, written whole then renamed. The directory is kept under
//! `lambdastore.compiled_functions_size` by `trim`, oldest first; an entry removed, or one that cannot be
//! read or written, only costs compiling that function again. An entry is
//! machine code, trusted as the artifacts beside it are: the data
//! directory is as trusted as the server's own binaries.

use std::borrow::Cow;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use wasmtime::CacheStore;

/// The age of a file being written after which its writer is surely gone.
const ABANDONED: std::time::Duration = std::time::Duration::from_secs(3600);

/// The store the engine compiles with (`engine::config`), and what it
/// found since `counts` last read it.
#[derive(Debug, Default)]
pub(crate) struct Functions {
    reused: AtomicU64,
    compiled: AtomicU64,
}

static FUNCTIONS: LazyLock<Arc<Functions>> = LazyLock::new(Arc::default);

/// This process's store, for the engine's configuration.
pub(crate) fn store() -> Arc<Functions> {
    FUNCTIONS.clone()
}

/// How many functions came from the directory and how many were compiled
/// since the last time this was asked.
pub(crate) fn counts() -> (u64, u64) {
    (FUNCTIONS.reused.swap(0, Ordering::Relaxed), FUNCTIONS.compiled.swap(0, Ordering::Relaxed))
}

fn directory() -> PathBuf {
    crate::pg::backend::lambdastore_directory().join("functions")
}

fn path(key: &[u8]) -> PathBuf {
    directory().join(hex::encode(key))
}

impl CacheStore for Functions {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let found = std::fs::read(path(key)).ok();
        let counter = if found.is_some() { &self.reused } else { &self.compiled };
        counter.fetch_add(1, Ordering::Relaxed);
        found.map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let path = path(key);
        // Written then renamed, so that another backend compiling the same
        // function never reads half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::create_dir_all(directory())
            .and_then(|_| std::fs::write(&tmp, value))
            .and_then(|_| std::fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(tmp);
        }
        written.is_ok()
    }
}

/// Removes the oldest entries until the directory takes at most `limit`
/// bytes of disk (`lambdastore.compiled_functions_size`), counted in the
/// blocks its files take (a function's file is often smaller than one). A
/// Python guest's functions take about 40 MB, a new version of it one or
/// two more. Files being written (`.tmp<pid>`) are left alone, unless a
/// crash left them there an hour ago.
pub(crate) fn trim(limit: u64) {
    let Ok(files) = std::fs::read_dir(directory()) else { return };
    let mut entries = Vec::new();
    for file in files.flatten() {
        let Ok(metadata) = file.metadata() else { continue };
        let Ok(modified) = metadata.modified() else { continue };
        if !file.file_name().to_string_lossy().contains(".tmp") {
            entries.push((modified, metadata.blocks() * 512, file.path()));
        } else if modified.elapsed().is_ok_and(|age| age > ABANDONED) {
            let _ = std::fs::remove_file(file.path());
        }
    }
    let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
    if total <= limit {
        return;
    }
    entries.sort_unstable();
    let mut removed = 0;
    for (_, len, path) in entries {
        if total <= limit {
            break;
        }
        if std::fs::remove_file(path).is_ok() {
            total -= len;
            removed += 1;
        }
    }
    pgrx::debug1!("lambdastore: removed {removed} compiled functions from lambdastore/functions, {total} bytes left");
}
