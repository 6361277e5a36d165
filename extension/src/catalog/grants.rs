//! Applications' owners and the privileges they granted
//! (`lambdastore.grants`); see access.rs for what they allow.

use super::{query, query_cluster};
use crate::error::{LambdaError, Result};
use pgrx::pg_sys::{BuiltinOid::*, Oid};

/// The owner of `app`; `None` if there is no such application.
pub(crate) fn owner(app: &str) -> Result<Option<Oid>> {
    query("SELECT owner FROM lambdastore.applications WHERE name = $1", &[TEXTOID], &[app.into()], |rows| {
        Ok(rows.into_iter().next().map(|row| row.get::<Oid>(1)).transpose()?.flatten())
    })
}

/// The roles granted `privilege` on `app`.
pub(crate) fn granted(app: &str, privilege: &str) -> Result<Vec<Oid>> {
    query(
        "SELECT grantee FROM lambdastore.grants WHERE app = $1 AND privilege = $2",
        &[TEXTOID, TEXTOID],
        &[app.into(), privilege.into()],
        |rows| rows.into_iter().map(|row| Ok(row.get::<Oid>(1)?.unwrap_or(pgrx::pg_sys::InvalidOid))).collect(),
    )
}

/// Creates `app` owned by `owner` unless it exists; then locks its row
/// until the transaction ends and returns its owner.
pub(crate) fn create_and_lock(app: &str, owner: Oid) -> Result<Oid> {
    query_cluster(
        "INSERT INTO lambdastore.applications (name, owner) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        &[TEXTOID, OIDOID],
        &[app.into(), owner.into()],
        |_| Ok(()),
    )?;
    lock(app)?.ok_or_else(|| LambdaError::UnknownApplication(app.to_string()))
}

/// Locks the application's row until the transaction ends; its owner.
pub(crate) fn lock(app: &str) -> Result<Option<Oid>> {
    query_cluster(
        "SELECT owner FROM lambdastore.applications WHERE name = $1 FOR UPDATE",
        &[TEXTOID],
        &[app.into()],
        |rows| Ok(rows.into_iter().next().map(|row| row.get::<Oid>(1)).transpose()?.flatten()),
    )
}

pub(crate) fn grant(app: &str, grantee: Oid, privilege: &str) -> Result<()> {
    super::cache::changed();
    query_cluster(
        "INSERT INTO lambdastore.grants (app, grantee, privilege) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        &[TEXTOID, OIDOID, TEXTOID],
        &[app.into(), grantee.into(), privilege.into()],
        |_| Ok(()),
    )
}

/// False if it was not granted.
pub(crate) fn revoke(app: &str, grantee: Oid, privilege: &str) -> Result<bool> {
    super::cache::changed();
    query_cluster(
        "DELETE FROM lambdastore.grants WHERE app = $1 AND grantee = $2 AND privilege = $3 RETURNING 1",
        &[TEXTOID, OIDOID, TEXTOID],
        &[app.into(), grantee.into(), privilege.into()],
        |rows| Ok(!rows.is_empty()),
    )
}

pub(crate) fn set_owner(app: &str, owner: Oid) -> Result<()> {
    super::cache::changed();
    query_cluster(
        "UPDATE lambdastore.applications SET owner = $2 WHERE name = $1",
        &[TEXTOID, OIDOID],
        &[app.into(), owner.into()],
        |_| Ok(()),
    )
}
