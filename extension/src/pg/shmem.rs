//! Shared memory that starts as zeros: what the atomics of OCC's versions
//! and of the statistics live in (and, set up once, PostgreSQL structures
//! whose empty state is not all zeros).

use pgrx::prelude::*;
use pgrx::shmem::PgSharedMemoryInitialization;
use std::cell::UnsafeCell;
use std::ffi::CStr;

/// A struct in shared memory, zeroed in place when the server starts (an
/// atomic's zero is its initial value). pgrx's `PgAtomic` builds the value
/// on the stack first and copies it: the entry-set versions' 33 MB are
/// too much for the postmaster's stack.
pub(crate) struct Zeroed<T> {
    name: &'static CStr,
    shared: UnsafeCell<*const T>,
    /// Run once on the zeroed struct, when the server starts.
    init: Option<fn(&T)>,
}

// SAFETY: written once, by the shared-memory startup hook before any
// backend exists (children inherit it); read-only afterwards.
unsafe impl<T> Sync for Zeroed<T> {}

impl<T> Zeroed<T> {
    pub(crate) const fn new(name: &'static CStr) -> Self {
        Zeroed { name, shared: UnsafeCell::new(std::ptr::null()), init: None }
    }

    /// Zeroed, then `init` once (before any backend exists).
    pub(crate) const fn then(name: &'static CStr, init: fn(&T)) -> Self {
        Zeroed { name, shared: UnsafeCell::new(std::ptr::null()), init: Some(init) }
    }

    pub(crate) fn get(&self) -> &T {
        // SAFETY: set at startup (see `Sync`) and never freed; callers
        // first check that the library was preloaded (else there is none).
        unsafe { (*self.shared.get()).as_ref() }.expect("the shared memory was set up at startup")
    }
}

impl<T> PgSharedMemoryInitialization for Zeroed<T> {
    type Value = bool; // unused: the memory is zeroed

    unsafe fn on_shmem_request(&'static self) {
        // SAFETY: called from the shmem_request hook.
        unsafe { pg_sys::RequestAddinShmemSpace(size_of::<T>()) };
    }

    unsafe fn on_shmem_startup(&'static self, _: bool) {
        // SAFETY: called from the shmem_startup hook, as pgrx's own types
        // do: under AddinShmemInitLock (MainLWLockArray[21]), the struct
        // found by name or allocated and zeroed.
        unsafe {
            let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
            pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            let mut found = false;
            let shared = pg_sys::ShmemInitStruct(self.name.as_ptr(), size_of::<T>(), &mut found).cast::<T>();
            assert!(shared.is_aligned(), "shared memory is not aligned");
            if !found {
                shared.cast::<u8>().write_bytes(0, size_of::<T>());
                if let Some(init) = self.init {
                    init(&*shared);
                }
            }
            *self.shared.get() = shared;
            pg_sys::LWLockRelease(lock);
        }
    }
}
