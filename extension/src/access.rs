//! Who may do what. Ordinary roles have no privilege on the extension's
//! tables: a role that could write `applications`, `modules` or `jobs`
//! directly could make itself an application's owner, make a protected
//! function public, or queue a job that runs as a superuser. Every change
//! and every read of application data goes through the extension's
//! functions, which check the caller against the application's owner (a
//! role OID, so a new role that reuses a dropped role's name inherits
//! nothing) and the privileges the owner granted (`lambdastore.grant`), and
//! then touch the tables as the bootstrap superuser (`as_storage`).
//!
//! Privilege answers are cached per backend, only from transactions that
//! have written nothing (so never from rows that may roll back), and
//! forgotten when a grant, a revoke or an owner change commits (the catalog
//! generation, catalog/cache.rs) or a role or role membership changes.

use crate::catalog;
use crate::error::{LambdaError, Result};
use crate::pg;
use pgrx::pg_sys::{self, Oid};
use std::cell::RefCell;

/// What a role may do with an application. The owner may do everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Privilege {
    /// Deploy, grant, revoke, change the owner, delete objects, split sets.
    Owner,
    /// Call its functions, create objects, submit jobs and see them.
    Invoke,
    /// Read its objects' state through SQL (`lambdastore.app_entries`, ...).
    Read,
}

impl Privilege {
    pub(crate) fn parse(name: &str) -> Result<Privilege> {
        match name {
            "owner" => Ok(Privilege::Owner),
            "invoke" => Ok(Privilege::Invoke),
            "read" => Ok(Privilege::Read),
            _ => Err(LambdaError::InvalidParameter(format!(
                "unknown application privilege \"{name}\": it is 'invoke' or 'read' (or 'owner' to ask)"
            ))),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Privilege::Owner => "owner",
            Privilege::Invoke => "invoke",
            Privilege::Read => "read",
        }
    }
}

/// The role a request is made for: the current user when it entered the
/// extension, or the role that submitted a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caller(pub Oid);

impl Caller {
    /// The current user.
    pub(crate) fn current() -> Caller {
        Caller(pg::roles::current_user())
    }

    pub(crate) fn is_superuser(self) -> bool {
        pg::roles::is_superuser(self.0)
    }

    /// Whether this role has the privileges of `role` (is it, inherits it,
    /// or is a superuser).
    pub(crate) fn acts_as(self, role: Oid) -> bool {
        pg::roles::has_privileges_of(self.0, role)
    }

    /// Whether this role may become `role` (`SET ROLE`): it is it, a
    /// member of it, or a superuser.
    pub(crate) fn may_become(self, role: Oid) -> bool {
        pg::roles::is_member_of(self.0, role)
    }

    pub(crate) fn name(self) -> String {
        role_name(self.0)
    }
}

/// Whether role `role` exists (a job's role may have been dropped since).
pub(crate) fn role_exists(role: Oid) -> bool {
    pg::roles::name(role).is_some()
}

/// A role's name, or its OID in brackets once it has been dropped.
pub(crate) fn role_name(role: Oid) -> String {
    pg::roles::name(role).unwrap_or_else(|| format!("(dropped role {})", role.to_u32()))
}

thread_local! {
    /// (caller, application, privilege) -> allowed, under a catalog generation.
    static ANSWERS: RefCell<(u64, Vec<((Oid, String, Privilege), bool)>)> = const { RefCell::new((0, Vec::new())) };
}

/// Registers the callbacks that forget cached answers when a role or a
/// role membership changes; once per process, from `_PG_init`.
pub(crate) fn init() {
    pg::roles::on_role_change(forget_roles);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_roles(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    // No PostgreSQL function runs while the answers are borrowed, so no
    // invalidation can arrive then.
    ANSWERS.with(|a| a.borrow_mut().1.clear());
}

/// Whether `caller` may do what `privilege` allows with `app`; 42704 if
/// there is no such application.
pub(crate) fn allowed(caller: Caller, app: &str, privilege: Privilege) -> Result<bool> {
    if caller.is_superuser() {
        return Ok(true);
    }
    let generation = catalog::cache::generation();
    let cached = ANSWERS.with(|a| {
        let a = a.borrow();
        (generation.is_some() && a.0 == generation.unwrap_or_default())
            .then(|| a.1.iter().find(|((c, n, p), _)| *c == caller.0 && n == app && *p == privilege).map(|(_, ok)| *ok))
            .flatten()
    });
    if let Some(answer) = cached {
        return Ok(answer);
    }
    let owner = catalog::grants::owner(app)?.ok_or_else(|| LambdaError::UnknownApplication(app.to_string()))?;
    let answer = caller.acts_as(owner)
        || (privilege != Privilege::Owner
            && catalog::grants::granted(app, privilege.name())?.into_iter().any(|grantee| caller.acts_as(grantee)));
    // Only what committed rows say is remembered: a transaction that has
    // written may have created the application or changed its grants, and
    // may yet roll back.
    if let Some(generation) = generation.filter(|_| catalog::cache::may_fill()) {
        ANSWERS.with(|a| {
            let mut a = a.borrow_mut();
            if a.0 != generation || a.1.len() >= 256 {
                *a = (generation, Vec::new());
            }
            a.1.push(((caller.0, app.to_string(), privilege), answer));
        });
    }
    Ok(answer)
}

/// `allowed`, as an error (42501) when it is not.
pub(crate) fn check(caller: Caller, app: &str, privilege: Privilege) -> Result<()> {
    if allowed(caller, app, privilege)? {
        return Ok(());
    }
    let (what, how) = match privilege {
        Privilege::Owner => ("is not the owner of", "its owner hands it over with lambdastore.set_owner"),
        Privilege::Invoke => ("may not invoke", "the owner grants it with lambdastore.grant"),
        Privilege::Read => ("may not read", "the owner grants it with lambdastore.grant"),
    };
    Err(LambdaError::PermissionDenied(format!("role \"{}\" {what} application \"{app}\" ({how})", caller.name())))
}

/// 42704 unless `app` exists (for a superuser too), 42501 unless `caller`
/// holds one of `any_of` on it.
pub(crate) fn check_any(caller: Caller, app: &str, any_of: &[Privilege]) -> Result<()> {
    catalog::grants::owner(app)?.ok_or_else(|| LambdaError::UnknownApplication(app.to_string()))?;
    for privilege in any_of {
        if allowed(caller, app, *privilege)? {
            return Ok(());
        }
    }
    check(caller, app, any_of.first().copied().unwrap_or(Privilege::Owner))
}

/// 42501 unless a lambda of application `from` may call into application
/// `to` for `caller`: both `caller` and `from`'s owner, whose code makes
/// the call, may invoke `to`. (A gateway call runs as the extension's
/// owner, a job as the role that queued it: the owner's check keeps code
/// from reaching what its author may not.)
/// The refusal names `to` only to a caller who may see it: to another, an
/// object's application was a name it could not learn otherwise (a key
/// holder who could deploy mapped object ids to other tenants'
/// applications).
pub(crate) fn check_call_across(caller: Caller, from: &str, to: &str) -> Result<()> {
    let owner = catalog::grants::owner(from)?.ok_or_else(|| LambdaError::UnknownApplication(from.to_string()))?;
    for role in [caller, Caller(owner)] {
        if !allowed(role, to, Privilege::Invoke)? {
            let visible = allowed(caller, to, Privilege::Invoke)? || allowed(caller, to, Privilege::Read)?;
            let target = if visible { format!("application \"{to}\"") } else { "another application".to_string() };
            return Err(LambdaError::PermissionDenied(format!(
                "a lambda of application \"{from}\" may not call {target}: role \"{}\" may not invoke it (its \
                 owner grants it with lambdastore.grant)",
                role.name()
            )));
        }
    }
    Ok(())
}

/// Runs `body` for the current user with the privileges of the bootstrap
/// superuser, who owns the data: `body` must check what `Caller` may do
/// before it touches anything. It runs under `with_fixed_search_path`, and
/// on a hot standby reads as of the transaction's first call. An
/// error inside restores the user as it unwinds, and PostgreSQL's
/// (sub)transaction abort restores it too.
pub(crate) fn as_storage<R>(body: impl FnOnce(Caller) -> R) -> R {
    let caller = Caller::current();
    pg::roles::as_bootstrap_superuser(|| {
        with_fixed_search_path(|| pg::standby::reading_as_of_first_call(|| body(caller)))
    })
}

/// `catalog::grants::role_renamed` after an `ALTER ROLE ... RENAME`, as the
/// tables' owner with the fixed `search_path`, the check that the extension
/// is installed included: it runs inside the renaming session's statement,
/// whose `search_path` it chose (an operator `=` of a CREATEROLE role's own
/// schema ran as the superuser and made it one), and which may have no
/// USAGE on our schema (its renames failed).
pub(crate) fn role_renamed(role: Oid) {
    pg::roles::as_bootstrap_superuser(|| with_fixed_search_path(|| catalog::grants::role_renamed(role)));
}

/// `catalog::grants::refuse_dropping` before a `DROP ROLE`, as the tables'
/// owner with the fixed `search_path`, as `role_renamed`: an ERROR (2BP01)
/// ends the statement.
pub(crate) fn roles_dropping(roles: &[Oid]) {
    pg::roles::as_bootstrap_superuser(|| with_fixed_search_path(|| catalog::grants::refuse_dropping(roles)))
        .unwrap_or_else(|err| err.report("DROP ROLE"));
}

/// `catalog::grants::owned_reassigned` after a `REASSIGN OWNED`, as
/// `roles_dropping`.
pub(crate) fn owned_reassigned(roles: &[Oid], new_owner: Oid) {
    pg::roles::as_bootstrap_superuser(|| {
        with_fixed_search_path(|| catalog::grants::owned_reassigned(roles, new_owner))
    })
    .unwrap_or_else(|err| err.report("REASSIGN OWNED"));
}

/// `catalog::grants::owned_dropped` after a `DROP OWNED`, as
/// `roles_dropping`.
pub(crate) fn owned_dropped(roles: &[Oid]) {
    pg::roles::as_bootstrap_superuser(|| with_fixed_search_path(|| catalog::grants::owned_dropped(roles)))
        .unwrap_or_else(|err| err.report("DROP OWNED"));
}

/// The `search_path` of everything the extension runs with raised rights.
/// The caller's own would let it choose what a name in our statements
/// means: every role may create temporary objects, and PostgreSQL looks
/// types and tables up in the session's temporary schema first unless the
/// path names it, so a role's `CREATE DOMAIN pg_temp.text ... CHECK
/// (f(VALUE))` ran `f` as the superuser at our first `::text`. Naming
/// `pg_temp` last is PostgreSQL's own advice for SECURITY DEFINER code
/// (functions and operators are never looked up there).
pub(crate) const FIXED_SEARCH_PATH: &std::ffi::CStr = c"pg_catalog, lambdastore, pg_temp";

/// Runs `body` with `search_path` set to `FIXED_SEARCH_PATH`, as a
/// function's `SET` clause does: restored when `body` returns, and by the
/// (sub)transaction's abort after an error. Nothing to do when the path is
/// that already (a nested call).
pub(crate) fn with_fixed_search_path<R>(body: impl FnOnce() -> R) -> R {
    if pg::settings::search_path_is(FIXED_SEARCH_PATH) {
        return body();
    }
    pg::settings::with(&[(c"search_path", FIXED_SEARCH_PATH)], pg::settings::Rights::User, body)
}
