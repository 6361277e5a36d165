//! Roles and the identity a backend runs as.

use pgrx::pg_sys::{self, Oid};
use std::ffi::CStr;

/// The current user (`current_user`, not the session's).
pub(crate) fn current_user() -> Oid {
    // SAFETY: reads this backend's current user id.
    unsafe { pg_sys::GetUserId() }
}

pub(crate) fn is_superuser(role: Oid) -> bool {
    // SAFETY: a syscache lookup (cached for the last role asked).
    unsafe { pg_sys::superuser_arg(role) }
}

/// Whether `member` has the privileges of `role` (is it, inherits it, or
/// is a superuser).
pub(crate) fn has_privileges_of(member: Oid, role: Oid) -> bool {
    // SAFETY: a catalog lookup by OID.
    unsafe { pg_sys::has_privs_of_role(member, role) }
}

/// Whether `member` is `role` or a member of it, inheriting its
/// privileges or not (it may `SET ROLE` to it), or is a superuser.
pub(crate) fn is_member_of(member: Oid, role: Oid) -> bool {
    // SAFETY: a catalog lookup by OID.
    unsafe { pg_sys::is_member_of_role(member, role) }
}

/// A role's name; `None` once it has been dropped.
pub(crate) fn name(role: Oid) -> Option<String> {
    // SAFETY: returns a palloc'd copy, or NULL (noerr) for a dropped role.
    let name = unsafe { pg_sys::GetUserNameFromId(role, true) };
    // SAFETY: a NUL-terminated string just returned, when not NULL.
    (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
}

/// Runs `body` as the bootstrap superuser, as a SECURITY DEFINER function
/// owned by it would (`SECURITY_LOCAL_USERID_CHANGE`); the user and
/// security context are restored when `body` returns or unwinds.
pub(crate) fn as_bootstrap_superuser<R>(body: impl FnOnce() -> R) -> R {
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    // SAFETY: saves and sets this backend's current user.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(
            Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID),
            context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
        );
    }
    struct Restore(Oid, i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: restores what was saved above.
            unsafe { pg_sys::SetUserIdAndSecContext(self.0, self.1) };
        }
    }
    let _restore = Restore(user, context);
    body()
}

/// Whether `role` holds every right of `mode` (`ACL_SELECT`, ...) on
/// `relation` (its ACL, by OID).
pub(crate) fn may(relation: Oid, role: Oid, mode: u32) -> bool {
    let mode = mode as pg_sys::AclMode;
    // SAFETY: an ACL check by OID on the main thread.
    unsafe { pg_sys::pg_class_aclmask(relation, role, mode, pg_sys::AclMaskHow::ACLMASK_ALL) == mode }
}

/// A function PostgreSQL calls when a syscache entry is invalidated.
pub(crate) type SyscacheCallback = unsafe extern "C-unwind" fn(pg_sys::Datum, i32, u32);

/// Has `callback` called whenever a role or a role membership changes (in
/// this backend or, through invalidations, any other); once per process.
pub(crate) fn on_role_change(callback: SyscacheCallback) {
    use pg_sys::SysCacheIdentifier::*;
    // SAFETY: registers a plain function with no argument.
    unsafe {
        for cache in [AUTHMEMROLEMEM, AUTHOID] {
            pg_sys::CacheRegisterSyscacheCallback(cache as i32, Some(callback), pg_sys::Datum::from(0));
        }
    }
}
