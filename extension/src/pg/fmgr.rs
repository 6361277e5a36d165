//! A callback run before each call of some functions of another
//! extension, known by name (Citus' shard moves, cluster/layout.rs): the
//! function manager's hooks. `needs_fmgr_hook` is asked at every function
//! lookup (`fmgr_info`), so it answers from this backend's decision per
//! function OID, made once by a syscache lookup of the name; the hook
//! proper then runs for the named functions only, when they start.

use crate::error::Result;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CStr;

/// Functions to watch, and what to run before each of their calls.
pub(crate) struct Watch {
    /// Names of functions in `pg_catalog`, any signature.
    pub(crate) names: &'static [&'static CStr],
    /// Runs when a call of one of them starts; an error fails the call.
    pub(crate) before: fn() -> Result<()>,
}

thread_local! {
    static WATCH: Cell<Option<&'static Watch>> = const { Cell::new(None) };
    static PREVIOUS_NEEDS: Cell<pg_sys::needs_fmgr_hook_type> = const { Cell::new(None) };
    static PREVIOUS_HOOK: Cell<pg_sys::fmgr_hook_type> = const { Cell::new(None) };
    /// Whether each function looked up so far is watched.
    static WATCHED: RefCell<HashMap<pg_sys::Oid, bool>> = RefCell::new(HashMap::new());
    /// Set while a name is looked up: the lookup's own catalog scans look
    /// functions up too.
    static DECIDING: Cell<bool> = const { Cell::new(false) };
}

/// Has `watch.before` run before every call of its functions in this
/// process; once per process.
pub(crate) fn watch_calls(watch: &'static Watch) {
    WATCH.set(Some(watch));
    // SAFETY: the hooks are this process's; the previous ones are kept and
    // called by ours.
    unsafe {
        PREVIOUS_NEEDS.set(pg_sys::needs_fmgr_hook);
        pg_sys::needs_fmgr_hook = Some(needs_hook);
        PREVIOUS_HOOK.set(pg_sys::fmgr_hook);
        pg_sys::fmgr_hook = Some(hook);
    }
}

fn watched(function: pg_sys::Oid) -> bool {
    let Some(watch) = WATCH.get() else { return false };
    if let Some(known) = WATCHED.with(|w| w.borrow().get(&function).copied()) {
        return known;
    }
    // SAFETY: a plain flag of this backend's transaction state.
    if DECIDING.get() || !unsafe { pg_sys::IsTransactionState() } {
        // Decided at a later lookup: the catalog cannot be read now.
        return false;
    }
    // Cleared however the lookup ends: an ERROR in it (a cancel while the
    // syscache reads the catalog) unwinds through here, and left set, the
    // flag would keep every later call from being watched.
    struct Deciding;
    impl Drop for Deciding {
        fn drop(&mut self) {
            DECIDING.set(false);
        }
    }
    DECIDING.set(true);
    let deciding = Deciding;
    let decided = in_catalog_named(function, watch.names);
    drop(deciding);
    WATCHED.with(|w| w.borrow_mut().insert(function, decided));
    decided
}

/// Whether `function` is in `pg_catalog` and has one of `names` (two
/// syscache lookups).
fn in_catalog_named(function: pg_sys::Oid, names: &[&CStr]) -> bool {
    // SAFETY: syscache lookups by OID; NULL when missing, else a palloc'd
    // name read at once.
    unsafe {
        let name = pg_sys::get_func_name(function);
        !name.is_null()
            && names.contains(&CStr::from_ptr(name))
            && pg_sys::get_func_namespace(function) == pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE)
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn needs_hook(function: pg_sys::Oid) -> bool {
    // SAFETY: the hook installed before ours, same argument.
    let previous = PREVIOUS_NEEDS.get().is_some_and(|previous| unsafe { previous(function) });
    previous || watched(function)
}

#[pg_guard]
unsafe extern "C-unwind" fn hook(
    event: pg_sys::FmgrHookEventType::Type,
    info: *mut pg_sys::FmgrInfo,
    private: *mut pg_sys::Datum,
) {
    if let Some(previous) = PREVIOUS_HOOK.get() {
        // SAFETY: the hook installed before ours, same arguments.
        unsafe { previous(event, info, private) };
    }
    // SAFETY: the function being called, as PostgreSQL passes it.
    let function = unsafe { (*info).fn_oid };
    if event == pg_sys::FmgrHookEventType::FHET_START && watched(function) {
        if let Some(watch) = WATCH.get() {
            if let Err(e) = (watch.before)() {
                e.report("");
            }
        }
    }
}
