//! Applications and their module versions.

use super::query;
use crate::error::{LambdaError, Result};
use crate::runtime::Description;
use pgrx::pg_sys::BuiltinOid::*;
use pgrx::JsonB;

/// What identifies a loaded module version in a backend's cache. The id
/// alone is not enough: ids start again after the extension is recreated.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModuleKey {
    pub module_id: i64,
    pub app: String,
    pub sha256: String,
}

pub struct ModuleRow {
    pub app: String,
    pub description: Description,
}

pub fn get(module_id: i64) -> Result<ModuleRow> {
    query(
        "SELECT app, description FROM lambdastore.modules WHERE module_id = $1",
        &[INT8OID],
        &[module_id.into()],
        |rows| rows.first().get_two::<String, JsonB>(),
    )
    .and_then(|row| match row {
        (Some(app), Some(JsonB(description))) => Ok(ModuleRow {
            app,
            description: serde_json::from_value(description)
                .map_err(|e| LambdaError::Internal(format!("module {module_id} description: {e}")))?,
        }),
        _ => Err(LambdaError::Internal(format!("module {module_id} vanished"))),
    })
}

pub fn wasm(module_id: i64) -> Result<Vec<u8>> {
    query(
        "SELECT wasm FROM lambdastore.modules WHERE module_id = $1",
        &[INT8OID],
        &[module_id.into()],
        |rows| rows.first().get_one::<Vec<u8>>(),
    )?
    .ok_or_else(|| LambdaError::Internal(format!("module {module_id} vanished")))
}

/// The module an application runs now.
pub fn current(app: &str) -> Result<ModuleKey> {
    if let Some(cached) = super::cache::module(app) {
        return Ok(cached);
    }
    let module = query(
        "SELECT a.module_id, m.sha256 FROM lambdastore.applications a
           JOIN lambdastore.modules m ON m.module_id = a.module_id WHERE a.name = $1",
        &[TEXTOID],
        &[app.into()],
        |rows| {
            let Some(row) = rows.into_iter().next() else { return Ok(None) };
            Ok(Some((row.get::<i64>(1)?, row.get::<String>(2)?)))
        },
    )?
    .and_then(|(id, sha)| Some(ModuleKey { module_id: id?, app: app.to_string(), sha256: sha? }))
    .ok_or_else(|| LambdaError::UnknownApplication(app.to_string()))?;
    super::cache::remember_module(&module);
    Ok(module)
}

pub struct Deployed {
    pub module_id: i64,
    pub version: i32,
    pub unchanged: bool,
}

/// Registers a new version of `app` and makes it current, in the caller's
/// transaction. The application row is locked first, so concurrent deploys
/// of one application are serialized and versions never collide. Only the
/// application's owner (or a superuser) may deploy over it.
pub fn deploy(app: &str, sha256: &str, wasm: &[u8], description: &Description) -> Result<Deployed> {
    query(
        "INSERT INTO lambdastore.applications (name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
        &[TEXTOID],
        &[app.into()],
        |_| Ok(()),
    )?;
    let (owner, may_deploy, current_sha) = query(
        "SELECT a.owner::text,
                a.owner = current_user OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
                m.sha256
           FROM lambdastore.applications a LEFT JOIN lambdastore.modules m ON m.module_id = a.module_id
          WHERE a.name = $1 FOR UPDATE OF a",
        &[TEXTOID],
        &[app.into()],
        |rows| {
            let row = rows.first();
            Ok((row.get::<String>(1)?, row.get::<bool>(2)?, row.get::<String>(3)?))
        },
    )?;
    if may_deploy != Some(true) {
        return Err(LambdaError::PermissionDenied(format!(
            "application \"{app}\" belongs to role \"{}\"",
            owner.unwrap_or_default()
        )));
    }
    if current_sha.as_deref() == Some(sha256) {
        let (module_id, version) = query(
            "SELECT m.module_id, m.version FROM lambdastore.applications a
               JOIN lambdastore.modules m ON m.module_id = a.module_id WHERE a.name = $1",
            &[TEXTOID],
            &[app.into()],
            |rows| rows.first().get_two::<i64, i32>(),
        )?;
        return Ok(Deployed { module_id: module_id.unwrap_or_default(), version: version.unwrap_or_default(), unchanged: true });
    }
    let description_json = serde_json::to_value(description).expect("a description serializes");
    let (module_id, version) = query(
        "INSERT INTO lambdastore.modules (app, version, sha256, wasm, description)
         SELECT $1, coalesce(max(version), 0) + 1, $2, $3, $4 FROM lambdastore.modules WHERE app = $1
         RETURNING module_id, version",
        &[TEXTOID, TEXTOID, BYTEAOID, JSONBOID],
        &[app.into(), sha256.into(), wasm.into(), JsonB(description_json.clone()).into()],
        |rows| rows.first().get_two::<i64, i32>(),
    )?;
    let module_id = module_id.ok_or_else(|| LambdaError::Internal("module insert returned nothing".into()))?;
    query(
        "INSERT INTO lambdastore.object_types (module_id, app, type_name, fields, functions)
         SELECT $1, $2, t->>'name', t->'fields', t->'functions' FROM jsonb_array_elements($3->'types') t",
        &[INT8OID, TEXTOID, JSONBOID],
        &[module_id.into(), app.into(), JsonB(description_json).into()],
        |_| Ok(()),
    )?;
    super::cache::changed();
    query(
        "UPDATE lambdastore.applications SET module_id = $2 WHERE name = $1",
        &[TEXTOID, INT8OID],
        &[app.into(), module_id.into()],
        |_| Ok(()),
    )?;
    Ok(Deployed { module_id, version: version.unwrap_or_default(), unchanged: false })
}
