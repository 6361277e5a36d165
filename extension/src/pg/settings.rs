//! Settings (GUCs) read and set from Rust, as `SET` and a function's
//! `SET` clause would.

use pgrx::pg_sys;
use std::ffi::CStr;

/// Whose rights a setting is changed with: a superuser's may set
/// `SUSET` settings (ours are), a user's only `USERSET` ones.
#[derive(Clone, Copy)]
pub(crate) enum Rights {
    User,
    Superuser,
}

/// Whether `search_path` is `value` now (false before the settings are
/// set up).
pub(crate) fn search_path_is(value: &CStr) -> bool {
    // SAFETY: the setting's current value, a C string or NULL, read and
    // compared before anything can change it.
    unsafe {
        let current = pg_sys::namespace_search_path;
        !current.is_null() && CStr::from_ptr(current) == value
    }
}

/// Sets `name` to `value` for the rest of the transaction (`SET LOCAL`);
/// raises an ERROR itself on a bad value.
pub(crate) fn set_local(name: &CStr, value: &CStr, rights: Rights) {
    set(name, value, rights, pg_sys::GucAction::GUC_ACTION_LOCAL);
}

/// Runs `body` with `settings` (name, value), as a function's `SET`
/// clause does: restored when `body` returns or unwinds, and by the
/// (sub)transaction's abort after an error.
pub(crate) fn with<R>(settings: &[(&CStr, &CStr)], rights: Rights, body: impl FnOnce() -> R) -> R {
    // SAFETY: opens a GUC nesting level, where the settings are saved;
    // `Restore` closes it, which restores them.
    let level = unsafe { pg_sys::NewGUCNestLevel() };
    struct Restore(i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: closes the level opened above; levels opened inside
            // `body` were closed by then, or by an abort.
            unsafe { pg_sys::AtEOXact_GUC(true, self.0) };
        }
    }
    let _restore = Restore(level);
    for (name, value) in settings {
        set(name, value, rights, pg_sys::GucAction::GUC_ACTION_SAVE);
    }
    body()
}

/// Runs `body` with the plan cache choosing a kept plan's generic plan
/// (`plan_cache_mode = force_generic_plan`), for statements whose best plan
/// is the same whatever their parameters. Left to itself, the cache
/// compares the generic plan's cost with the custom plans': a scan's `LIMIT
/// $n` makes the generic one look dearer, and the statement was planned
/// again at every call (a sixth of a nested `deposit`'s CPU). The variable is
/// set directly rather than through `SET`, which would cost a GUC nesting
/// level per statement: only the plan cache reads it, in `body`, and it is
/// restored when `body` returns or unwinds.
pub(crate) fn with_generic_plans<R>(body: impl FnOnce() -> R) -> R {
    struct Restore(i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: a plain int of this backend, put back as it was.
            unsafe { pg_sys::plan_cache_mode = self.0 };
        }
    }
    // SAFETY: as above; no other thread reads it.
    let _restore = Restore(unsafe { pg_sys::plan_cache_mode });
    unsafe { pg_sys::plan_cache_mode = pg_sys::PlanCacheMode::PLAN_CACHE_MODE_FORCE_GENERIC_PLAN as i32 };
    body()
}

/// `set_local`, where `rights` allow it: false (and nothing set) for a
/// setting they may not change, or a value it does not take.
pub(crate) fn set_local_if_allowed(name: &CStr, value: &CStr, rights: Rights) -> bool {
    // Below ERROR, a refusal is reported (at DEBUG1) and answered 0.
    set_at(name, value, rights, pg_sys::GucAction::GUC_ACTION_LOCAL, pg_sys::DEBUG1 as i32)
}

fn context_of(rights: Rights) -> pg_sys::GucContext::Type {
    match rights {
        Rights::User => pg_sys::GucContext::PGC_USERSET,
        Rights::Superuser => pg_sys::GucContext::PGC_SUSET,
    }
}

fn set(name: &CStr, value: &CStr, rights: Rights, action: pg_sys::GucAction::Type) {
    // 0: a refusal or a bad value raises an ERROR.
    set_at(name, value, rights, action, 0);
}

/// `set_config_option` for this session, a refusal reported at `elevel`;
/// whether it took the value.
fn set_at(name: &CStr, value: &CStr, rights: Rights, action: pg_sys::GucAction::Type, elevel: i32) -> bool {
    // SAFETY: valid C strings that outlive the call.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            context_of(rights),
            pg_sys::GucSource::PGC_S_SESSION,
            action,
            true,
            elevel,
            false,
        ) > 0
    }
}

/// A setting's value now, as SHOW prints it (None for one that does not
/// exist).
pub(crate) fn current(name: &CStr) -> Option<String> {
    // SAFETY: a setting by name, missing_ok; returns a palloc'd string or NULL.
    let value = unsafe { pg_sys::GetConfigOptionByName(name.as_ptr(), std::ptr::null_mut(), true) };
    // SAFETY: a NUL-terminated string just returned, or NULL.
    (!value.is_null()).then(|| unsafe { CStr::from_ptr(value) }.to_string_lossy().into_owned())
}

/// Sets `name` to `value` for the rest of this process, over whatever the
/// configuration says (a background worker's own defaults).
pub(crate) fn set_for_process(name: &CStr, value: &CStr) {
    // SAFETY: valid C strings that outlive the call; raises an ERROR on a
    // bad value.
    unsafe {
        pg_sys::SetConfigOption(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        );
    }
}
