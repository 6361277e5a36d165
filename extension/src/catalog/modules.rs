//! Applications and their module versions.

use super::{query, query_cluster};
use crate::error::{LambdaError, Result};
use lambdastore_core::model::{Description, ModuleKey};
use pgrx::pg_sys::BuiltinOid::*;
use pgrx::pg_sys::Oid;
use pgrx::spi::SpiTupleTable;
use pgrx::JsonB;

pub(crate) struct ModuleRow {
    pub(crate) app: String,
    pub(crate) description: Description,
}

pub(crate) fn get(module_id: i64) -> Result<ModuleRow> {
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

pub(crate) fn wasm(module_id: i64) -> Result<Vec<u8>> {
    query("SELECT wasm FROM lambdastore.modules WHERE module_id = $1", &[INT8OID], &[module_id.into()], |rows| {
        rows.first().get_one::<Vec<u8>>()
    })?
    .ok_or_else(|| LambdaError::Internal(format!("module {module_id} vanished")))
}

/// The module an application runs now.
pub(crate) fn current(app: &str) -> Result<ModuleKey> {
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

pub(crate) struct Deployed {
    pub(crate) module_id: i64,
    pub(crate) version: i32,
    pub(crate) unchanged: bool,
}

/// The version `app` runs now, if its bytes hash to `sha256`: deploying
/// the same bytes again changes nothing.
pub(crate) fn running(app: &str, sha256: &str) -> Result<Option<Deployed>> {
    query(
        "SELECT m.module_id, m.version FROM lambdastore.applications a
           JOIN lambdastore.modules m ON m.module_id = a.module_id WHERE a.name = $1 AND m.sha256 = $2",
        &[TEXTOID, TEXTOID],
        &[app.into(), sha256.into()],
        |rows| {
            let Some(row) = rows.into_iter().next() else { return Ok(None) };
            Ok(Some(Deployed {
                module_id: row.get::<i64>(1)?.unwrap_or_default(),
                version: row.get::<i32>(2)?.unwrap_or_default(),
                unchanged: true,
            }))
        },
    )
}

/// The types of the version `app` runs now that `types` (a new version's)
/// lacks and that objects still are, with how many: a deploy without them
/// would leave those objects without code. A type usually stays, so the
/// objects are counted only for one that goes (in a statement of its own,
/// which Citus runs on every node).
pub(crate) fn types_dropped_in_use(app: &str, types: Vec<String>) -> Result<Vec<(String, i64)>> {
    let dropped: Vec<String> = query(
        "SELECT t.type_name FROM lambdastore.applications a
           JOIN lambdastore.object_types t ON t.module_id = a.module_id
          WHERE a.name = $1 AND t.type_name <> ALL ($2)",
        &[TEXTOID, TEXTARRAYOID],
        &[app.into(), types.into()],
        |rows| rows.into_iter().map(|row| Ok(row.get::<String>(1)?.unwrap_or_default())).collect(),
    )?;
    if dropped.is_empty() {
        return Ok(Vec::new());
    }
    query_cluster(
        "SELECT type_name, count(*) FROM lambdastore.objects
          WHERE app = $1 AND type_name = ANY ($2) GROUP BY type_name ORDER BY type_name",
        &[TEXTOID, TEXTARRAYOID],
        &[app.into(), dropped.into()],
        type_counts,
    )
}

/// Rows of `(type_name, count)`.
fn type_counts(rows: SpiTupleTable<'_>) -> pgrx::spi::Result<Vec<(String, i64)>> {
    rows.into_iter()
        .map(|row| Ok((row.get::<String>(1)?.unwrap_or_default(), row.get::<i64>(2)?.unwrap_or_default())))
        .collect()
}

/// Of `types` (types of the version being deployed that have no
/// migration, so read their fields as at version 1), those with objects of
/// `app` whose fields a later version migrated (the SDKs' cell
/// `lambdastore.version` above 1), and how many.
pub(crate) fn types_behind_their_objects(app: &str, types: Vec<String>) -> Result<Vec<(String, i64)>> {
    if types.is_empty() {
        return Ok(Vec::new());
    }
    query_cluster(
        "SELECT o.type_name, count(*) FROM lambdastore.objects o
           JOIN lambdastore.entries e ON e.object_id = o.object_id AND e.field = 'lambdastore.version'
          WHERE o.app = $1 AND o.type_name = ANY ($2) AND convert_from(e.value, 'UTF8') <> '1'
          GROUP BY o.type_name ORDER BY o.type_name",
        &[TEXTOID, TEXTARRAYOID],
        &[app.into(), types.into()],
        type_counts,
    )
}

/// Registers a new version of `app` and makes it current, in the caller's
/// transaction. The caller has locked the application's row (so concurrent
/// deploys of one application are serialized and versions never collide)
/// and checked that `deployed_by` may deploy it.
pub(crate) fn deploy(
    app: &str,
    sha256: &str,
    wasm: &[u8],
    description: &Description,
    deployed_by: Oid,
) -> Result<Deployed> {
    let description_json = serde_json::to_value(description).expect("a description serializes");
    // Drawn first, as the version (the caller holds the application's row
    // lock): Citus cannot plan an INSERT ... SELECT into a reference table
    // with a parameter in its target list.
    let id = super::unique_id(c"lambdastore.modules_module_id_seq")?;
    let version = query(
        "SELECT coalesce(max(version), 0) + 1 FROM lambdastore.modules WHERE app = $1",
        &[TEXTOID],
        &[app.into()],
        |rows| rows.first().get_one::<i32>(),
    )?
    .unwrap_or(1);
    let (module_id, version) = query_cluster(
        "INSERT INTO lambdastore.modules (module_id, app, version, sha256, wasm, description, deployed_by)
         VALUES ($6, $1, $7, $2, $3, $4, $5) RETURNING module_id, version",
        &[TEXTOID, TEXTOID, BYTEAOID, JSONBOID, OIDOID, INT8OID, INT4OID],
        &[
            app.into(),
            sha256.into(),
            wasm.into(),
            JsonB(description_json.clone()).into(),
            deployed_by.into(),
            id.into(),
            version.into(),
        ],
        |rows| rows.first().get_two::<i64, i32>(),
    )?;
    let module_id = module_id.ok_or_else(|| LambdaError::Internal("module insert returned nothing".into()))?;
    query_cluster(
        "INSERT INTO lambdastore.object_types (module_id, app, type_name, fields, functions)
         SELECT $1, $2, t->>'name', t->'fields', t->'functions' FROM jsonb_array_elements($3->'types') t",
        &[INT8OID, TEXTOID, JSONBOID],
        &[module_id.into(), app.into(), JsonB(description_json).into()],
        |_| Ok(()),
    )?;
    super::cache::changed();
    query_cluster(
        "UPDATE lambdastore.applications SET module_id = $2 WHERE name = $1",
        &[TEXTOID, INT8OID],
        &[app.into(), module_id.into()],
        |_| Ok(()),
    )?;
    Ok(Deployed { module_id, version: version.unwrap_or_default(), unchanged: false })
}

/// The hashes of every module version of this database, as this
/// transaction sees them: the compiled artifacts worth keeping.
pub(crate) fn shas_in_use() -> Result<Vec<String>> {
    query("SELECT DISTINCT sha256 FROM lambdastore.modules", &[], &[], |rows| {
        rows.into_iter().map(|row| Ok(row.get::<String>(1)?.unwrap_or_default())).collect()
    })
}
