//! Applications' owners and the privileges they granted
//! (`lambdastore.grants`); see access.rs for what they allow.

use super::{query, query_cluster};
use crate::error::{LambdaError, Result};
use pgrx::pg_sys::{BuiltinOid::*, Oid};

// Roles are stored by OID and by name. On one server the OID decides: a
// new role that reuses a dropped owner's name is not the owner. On a Citus
// cluster the rows are copies on every node, where Citus creates each role
// under an OID of that node's own, so the OID stored by one node may be
// another role's on the next: there the name decides, looked up on the
// node that checks.

/// The role stored as (`oid`, `name`), as an OID of this node (InvalidOid:
/// no such role here).
fn role(oid: Option<Oid>, name: Option<String>) -> Result<Oid> {
    if !crate::cluster::layout::distributed()? {
        stored_roles_are_ours()?;
        return Ok(oid.unwrap_or(pgrx::pg_sys::InvalidOid));
    }
    let Some(name) = name.and_then(|n| std::ffi::CString::new(n).ok()) else { return Ok(pgrx::pg_sys::InvalidOid) };
    Ok(crate::pg::backend::role_oid_if_any(&name).unwrap_or(pgrx::pg_sys::InvalidOid))
}

// A dump restored into another server brings the old server's OIDs, which
// name other roles there, or none: the role that got an owner's old OID
// would own its applications, and jobs and API keys would act as it.
// `lambdastore.roles_from` holds the system identifier of the server whose
// OIDs the tables hold, written when the first application is made here
// (`stamp_roles`); a restore brings the old server's. Until a superuser's
// `adopt_restored_roles` maps the OIDs by the stored names, everything that
// reads or writes a stored role refuses: while another server's identifier
// is there, and while there is none but applications are (a restore that
// is loading the tables, or a dump of 0.1.0).

thread_local! {
    /// The local transaction in which the OIDs were last seen ours: asked
    /// again in each transaction (a restore or an adopt may commit between
    /// two, or roll back).
    static OURS_IN: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Ok if the role OIDs the tables hold are this server's; 55000 after a
/// restore of another server's dump, until a superuser adopts its roles.
/// (On a Citus cluster names decide: always Ok.)
pub(crate) fn stored_roles_are_ours() -> Result<()> {
    let transaction = crate::pg::xact::local_transaction();
    if OURS_IN.get() == Some(transaction) || crate::cluster::layout::distributed()? {
        return Ok(());
    }
    let ours = query(
        "SELECT COALESCE((SELECT pg_catalog.bool_and(system_identifier = $1) FROM lambdastore.roles_from),
                         NOT EXISTS (SELECT FROM lambdastore.applications))",
        &[INT8OID],
        &[system_identifier().into()],
        |rows| Ok(rows.first().get_one::<bool>()?.unwrap_or(false)),
    )?;
    if !ours {
        return Err(LambdaError::RolesOfAnotherServer);
    }
    OURS_IN.set(Some(transaction));
    Ok(())
}

fn system_identifier() -> i64 {
    // SAFETY: reads the control file's value, set at start.
    unsafe { pgrx::pg_sys::GetSystemIdentifier() as i64 }
}

/// Writes this server's identifier into `roles_from` if it holds none,
/// before the first application is made (schema.sql).
fn stamp_roles() -> Result<()> {
    stored_roles_are_ours()?;
    query(
        "INSERT INTO lambdastore.roles_from SELECT $1 WHERE NOT EXISTS (SELECT FROM lambdastore.roles_from)",
        &[INT8OID],
        &[system_identifier().into()],
        |_| Ok(()),
    )
}

/// After `ALTER ROLE ... RENAME` (pg/xact.rs), the new name beside the
/// role's OID as owner and grantee, in this database: the name decides on a
/// Citus cluster, and maps the OID after a restore into another server (a
/// renamed owner lost its applications on a cluster). On a cluster, from
/// the coordinator, whose OIDs the rows hold (the reference tables reach
/// every node); in a database without the extension, nothing. Runs as
/// the tables' owner with the fixed `search_path` (access::role_renamed).
pub(crate) fn role_renamed(role: Oid) {
    if !super::installed() {
        return;
    }
    let renamed = (|| {
        if !crate::cluster::layout::on_coordinator()? {
            return Ok(());
        }
        for sql in [
            "UPDATE lambdastore.applications SET owner_name = $2 WHERE owner = $1 AND owner_name <> $2",
            "UPDATE lambdastore.grants SET grantee_name = $2 WHERE grantee = $1 AND grantee_name <> $2",
        ] {
            query_cluster(sql, &[OIDOID, TEXTOID], &[role.into(), name_of(role).into()], |_| Ok(()))?;
        }
        Ok(())
    })();
    renamed.unwrap_or_else(|err: LambdaError| err.report("following a role's new name"));
}

/// Before `DROP ROLE` (pg/xact.rs): refused (2BP01) while one of `roles`
/// owns an application, holds a grant or made a schedule in this
/// database. Dropped, it left its applications to no one but superusers,
/// its grants to a future role of its OID, and its schedules failing every
/// tick (42704) for good. PostgreSQL refuses so for its own objects; ours
/// are rows, which it cannot see, and a database other than this one is
/// not looked at. On a cluster, from the coordinator, by name (the name
/// decides there); its schedules are then not counted. Runs as the tables'
/// owner with the fixed `search_path` (access::roles_dropping).
pub(crate) fn refuse_dropping(roles: &[Oid]) -> Result<()> {
    if !super::installed() || !crate::cluster::layout::on_coordinator()? || stored_roles_are_ours().is_err() {
        return Ok(()); // after a restore, the stored OIDs may be anyone's
    }
    // Forgets the roles no longer in use first, so that PostgreSQL's own
    // check after this one does not refuse them (`mark_roles`).
    mark_roles(roles)?;
    let distributed = crate::cluster::layout::distributed()?;
    let (owned, granted) = if distributed {
        (
            "SELECT pg_catalog.string_agg(name, ', ' ORDER BY name) FROM lambdastore.applications
              WHERE owner_name = $2::name",
            "SELECT pg_catalog.string_agg(DISTINCT app, ', ' ORDER BY app) FROM lambdastore.grants
              WHERE grantee_name = $2::name",
        )
    } else {
        (
            "SELECT pg_catalog.string_agg(name, ', ' ORDER BY name) FROM lambdastore.applications WHERE owner = $1",
            "SELECT pg_catalog.string_agg(DISTINCT app, ', ' ORDER BY app) FROM lambdastore.grants WHERE grantee = $1",
        )
    };
    for &role in roles {
        let name = name_of(role);
        let listed = |sql: &'static str| -> Result<Option<String>> {
            let list = query(sql, &[OIDOID, TEXTOID], &[role.into(), name.as_str().into()], |rows| {
                rows.first().get::<String>(1)
            })?;
            Ok(list.filter(|list| !list.is_empty()))
        };
        let mut uses = Vec::new();
        if let Some(apps) = listed(owned)? {
            uses.push(format!("it owns the applications {apps}"));
        }
        if let Some(apps) = listed(granted)? {
            uses.push(format!("it was granted the applications {apps}"));
        }
        if !distributed {
            let made = "SELECT NULLIF(pg_catalog.count(*), 0)::text FROM lambdastore.schedules WHERE created_by = $1";
            if let Some(count) = listed(made)? {
                uses.push(format!("it made {count} schedules"));
            }
        }
        if !uses.is_empty() {
            return Err(LambdaError::RoleInUse { role: name, uses: uses.join("; ") });
        }
    }
    Ok(())
}

// PostgreSQL refuses `DROP ROLE` in any database of the server while its
// catalog of what roles are used by (`pg_shdepend`) names the role.
// `refuse_dropping` is a hook in this database's sessions and cannot see
// a `DROP ROLE` run in another database: so each role that owns an
// application, holds a grant or (on one server) made a schedule here is
// named there too, as holding a privilege on the column `owner` of
// `lambdastore.applications` (an entry must name something PostgreSQL can
// describe; no one is granted that column). The other database's
// `DROP ROLE` then fails with 2BP01, "1 object in database ...".
// `DROP OWNED` leaves the entries (they are in no ACL), `DROP EXTENSION`
// takes them with the table; a dump does not carry them, and
// `adopt_restored_roles` records them again (`mark_all_roles`).

/// Brings the entries of `roles` in line with this database's rows: one
/// for each role in use, none for the others. Each role's shared object
/// is locked first (as `DROP ROLE` locks it), so that a drop waits for
/// this transaction and then sees its entry, and two transactions never
/// rewrite one role's entries at once. On a cluster, on the coordinator
/// (where `DROP ROLE` is run), by name. Runs as the tables' owner.
pub(crate) fn mark_roles(roles: &[Oid]) -> Result<()> {
    use pgrx::pg_sys;
    if roles.is_empty()
        || !super::installed()
        || !crate::cluster::layout::on_coordinator()?
        || stored_roles_are_ours().is_err()
    {
        return Ok(());
    }
    // The table itself, not a Citus node's shard of it.
    let Some(table) = crate::pg::backend::relation_oid(c"lambdastore", "applications") else { return Ok(()) };
    let in_use = if crate::cluster::layout::distributed()? {
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = $1 AND r.rolname IN
           (SELECT owner_name FROM lambdastore.applications UNION SELECT grantee_name FROM lambdastore.grants))"
    } else {
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = $1 AND r.oid IN
           (SELECT owner FROM lambdastore.applications UNION SELECT grantee FROM lambdastore.grants
            UNION SELECT created_by FROM lambdastore.schedules))"
    };
    let mut roles = roles.to_vec();
    roles.sort_by_key(|role| role.to_u32()); // one order: no deadlock between two
    roles.dedup();
    // SAFETY: a syscache lookup of the table's column.
    let column = unsafe { pg_sys::get_attnum(table, c"owner".as_ptr()) };
    for role in roles {
        // The bootstrap superuser cannot be dropped: PostgreSQL records
        // nothing for it.
        if role == pg_sys::InvalidOid || role == Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID) {
            continue;
        }
        // SAFETY: a lock on a shared object, held until the transaction ends.
        unsafe { pg_sys::LockSharedObject(pg_sys::AuthIdRelationId, role, 0, pg_sys::ShareUpdateExclusiveLock as i32) };
        let used =
            query(in_use, &[OIDOID], &[role.into()], |rows| Ok(rows.first().get_one::<bool>()?.unwrap_or(false)))?;
        crate::pg::roles::as_bootstrap_superuser(|| {
            query(
                "DELETE FROM pg_catalog.pg_shdepend
                  WHERE dbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
                    AND classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND objid = $2 AND objsubid = $3
                    AND refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass AND refobjid = $1",
                &[OIDOID, OIDOID, INT4OID],
                &[role.into(), table.into(), i32::from(column).into()],
                |_| Ok(()),
            )
        })?;
        if used {
            let mut depender = pg_sys::ObjectAddress {
                classId: pg_sys::RelationRelationId,
                objectId: table,
                objectSubId: column.into(),
            };
            let mut referenced =
                pg_sys::ObjectAddress { classId: pg_sys::AuthIdRelationId, objectId: role, objectSubId: 0 };
            // SAFETY: the catalog write GRANT makes, inside the
            // transaction; the addresses live across the call.
            unsafe {
                pg_sys::recordSharedDependencyOn(
                    &mut depender,
                    &mut referenced,
                    pg_sys::SharedDependencyType::SHARED_DEPENDENCY_ACL,
                );
                pg_sys::CommandCounterIncrement();
            }
        }
    }
    Ok(())
}

/// `mark_roles` for every role in use here or named in an entry of ours
/// (after a restore, which brings the rows but not the entries).
pub(crate) fn mark_all_roles() -> Result<()> {
    if !super::installed() || stored_roles_are_ours().is_err() {
        return Ok(());
    }
    let sql = if crate::cluster::layout::distributed()? {
        "SELECT r.oid FROM pg_catalog.pg_roles r
          WHERE r.rolname IN (SELECT owner_name FROM lambdastore.applications
                              UNION SELECT grantee_name FROM lambdastore.grants)
             OR r.oid IN (SELECT refobjid FROM pg_catalog.pg_shdepend
                           WHERE objid = 'lambdastore.applications'::pg_catalog.regclass)"
    } else {
        "SELECT r.oid FROM pg_catalog.pg_roles r
          WHERE r.oid IN (SELECT owner FROM lambdastore.applications UNION SELECT grantee FROM lambdastore.grants
                          UNION SELECT created_by FROM lambdastore.schedules
                          UNION SELECT refobjid FROM pg_catalog.pg_shdepend
                                 WHERE objid = 'lambdastore.applications'::pg_catalog.regclass)"
    };
    let roles = query(sql, &[], &[], |rows| {
        rows.into_iter().filter_map(|row| row.get::<Oid>(1).transpose()).collect::<pgrx::spi::Result<Vec<_>>>()
    })?;
    mark_roles(&roles)
}

/// After `REASSIGN OWNED BY roles TO new_owner` (pg/xact.rs), which
/// PostgreSQL has run: the applications `roles` own, and on one server the
/// schedules they made, are `new_owner`'s, as their tables are. Then
/// `DROP OWNED BY` and `DROP ROLE` (`refuse_dropping`) find nothing of
/// theirs left: PostgreSQL's way to retire a role works for ours too. On a
/// cluster, from the coordinator, by name (schedules stay, as
/// `refuse_dropping` does not count them there); after a restore whose
/// roles are not adopted yet, nothing. Runs as the tables' owner with the
/// fixed `search_path` (access::owned_reassigned).
pub(crate) fn owned_reassigned(roles: &[Oid], new_owner: Oid) -> Result<()> {
    if !super::installed() || !crate::cluster::layout::on_coordinator()? || stored_roles_are_ours().is_err() {
        return Ok(());
    }
    let (owned, made) = if crate::cluster::layout::distributed()? {
        ("UPDATE lambdastore.applications SET owner = $3, owner_name = $4 WHERE owner_name = $2::name", None)
    } else {
        (
            "UPDATE lambdastore.applications SET owner = $3, owner_name = $4 WHERE owner = $1",
            Some("UPDATE lambdastore.schedules SET created_by = $3 WHERE created_by = $1"),
        )
    };
    super::cache::changed();
    for &role in roles.iter().filter(|&&role| role != new_owner) {
        for sql in std::iter::once(owned).chain(made) {
            query_cluster(
                sql,
                &[OIDOID, TEXTOID, OIDOID, TEXTOID],
                &[role.into(), name_of(role).into(), new_owner.into(), name_of(new_owner).into()],
                |_| Ok(()),
            )?;
        }
    }
    mark_roles(&[roles, &[new_owner]].concat())
}

/// After `DROP OWNED BY roles` (pg/xact.rs), which PostgreSQL has run:
/// what they were granted is revoked, as PostgreSQL revokes their
/// privileges. The applications they own are not deleted with every
/// object in them, nor their schedules: `REASSIGN OWNED` hands those over,
/// and `DROP ROLE` is refused until it has. As `owned_reassigned`.
pub(crate) fn owned_dropped(roles: &[Oid]) -> Result<()> {
    if !super::installed() || !crate::cluster::layout::on_coordinator()? || stored_roles_are_ours().is_err() {
        return Ok(());
    }
    let granted = if crate::cluster::layout::distributed()? {
        "DELETE FROM lambdastore.grants WHERE grantee_name = $2::name"
    } else {
        "DELETE FROM lambdastore.grants WHERE grantee = $1"
    };
    super::cache::changed();
    for &role in roles {
        query_cluster(granted, &[OIDOID, TEXTOID], &[role.into(), name_of(role).into()], |_| Ok(()))?;
    }
    mark_roles(roles)
}

/// The name of role `oid`, as stored beside it.
fn name_of(oid: Oid) -> String {
    crate::pg::roles::name(oid).unwrap_or_default()
}

/// The owner of `app`; `None` if there is no such application.
pub(crate) fn owner(app: &str) -> Result<Option<Oid>> {
    let row = query(
        "SELECT owner, owner_name::text FROM lambdastore.applications WHERE name = $1",
        &[TEXTOID],
        &[app.into()],
        |rows| rows.into_iter().next().map(|row| Ok((row.get::<Oid>(1)?, row.get::<String>(2)?))).transpose(),
    )?;
    row.map(|(oid, name)| role(oid, name)).transpose()
}

/// The roles granted `privilege` on `app`.
pub(crate) fn granted(app: &str, privilege: &str) -> Result<Vec<Oid>> {
    let rows = query(
        "SELECT grantee, grantee_name::text FROM lambdastore.grants WHERE app = $1 AND privilege = $2",
        &[TEXTOID, TEXTOID],
        &[app.into(), privilege.into()],
        |rows| {
            rows.into_iter()
                .map(|row| Ok((row.get::<Oid>(1)?, row.get::<String>(2)?)))
                .collect::<pgrx::spi::Result<Vec<_>>>()
        },
    )?;
    rows.into_iter().map(|(oid, name)| role(oid, name)).collect()
}

/// Whether `role` exists and holds EXECUTE on `lambdastore.deploy(text,
/// bytea)`: the right to deploy (api/deploy.rs, `claim`).
pub(crate) fn may_deploy(role: Oid) -> Result<bool> {
    query(
        "SELECT CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_roles WHERE oid = $1)
                THEN pg_catalog.has_function_privilege($1, 'lambdastore.deploy(pg_catalog.text, pg_catalog.bytea)'::pg_catalog.regprocedure, 'EXECUTE')
                ELSE false END",
        &[OIDOID],
        &[role.into()],
        |rows| Ok(rows.first().get_one::<bool>()?.unwrap_or(false)),
    )
}

/// Creates `app` owned by `owner` unless it exists; then locks its row
/// until the transaction ends and returns its owner.
pub(crate) fn create_and_lock(app: &str, owner: Oid) -> Result<Oid> {
    stamp_roles()?;
    let created = query_cluster(
        "INSERT INTO lambdastore.applications (name, owner, owner_name) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO NOTHING RETURNING true",
        &[TEXTOID, OIDOID, TEXTOID],
        &[app.into(), owner.into(), name_of(owner).into()],
        |rows| Ok(!rows.is_empty()),
    )?;
    if created {
        mark_roles(&[owner])?;
    }
    lock(app)?.ok_or_else(|| LambdaError::UnknownApplication(app.to_string()))
}

/// Locks the application's row until the transaction ends; its owner.
pub(crate) fn lock(app: &str) -> Result<Option<Oid>> {
    let row = query_cluster(
        "SELECT owner, owner_name::text FROM lambdastore.applications WHERE name = $1 FOR UPDATE",
        &[TEXTOID],
        &[app.into()],
        |rows| rows.into_iter().next().map(|row| Ok((row.get::<Oid>(1)?, row.get::<String>(2)?))).transpose(),
    )?;
    row.map(|(oid, name)| role(oid, name)).transpose()
}

pub(crate) fn grant(app: &str, grantee: Oid, privilege: &str) -> Result<()> {
    stored_roles_are_ours()?;
    super::cache::changed();
    query_cluster(
        "INSERT INTO lambdastore.grants (app, grantee, grantee_name, privilege) VALUES ($1, $2, $4, $3)
         ON CONFLICT DO NOTHING",
        &[TEXTOID, OIDOID, TEXTOID, TEXTOID],
        &[app.into(), grantee.into(), privilege.into(), name_of(grantee).into()],
        |_| Ok(()),
    )?;
    mark_roles(&[grantee])
}

/// False if it was not granted.
pub(crate) fn revoke(app: &str, grantee: Oid, privilege: &str) -> Result<bool> {
    super::cache::changed();
    let revoked = query_cluster(
        "DELETE FROM lambdastore.grants
          WHERE app = $1 AND (grantee = $2 OR grantee_name = $4::name) AND privilege = $3 RETURNING 1",
        &[TEXTOID, OIDOID, TEXTOID, TEXTOID],
        &[app.into(), grantee.into(), privilege.into(), name_of(grantee).into()],
        |rows| Ok(!rows.is_empty()),
    )?;
    mark_roles(&[grantee])?;
    Ok(revoked)
}

pub(crate) fn set_owner(app: &str, owner: Oid) -> Result<()> {
    stored_roles_are_ours()?;
    let old = self::owner(app)?;
    super::cache::changed();
    query_cluster(
        "UPDATE lambdastore.applications SET owner = $2, owner_name = $3 WHERE name = $1",
        &[TEXTOID, OIDOID, TEXTOID],
        &[app.into(), owner.into(), name_of(owner).into()],
        |_| Ok(()),
    )?;
    mark_roles(&[old.unwrap_or(pgrx::pg_sys::InvalidOid), owner])
}
