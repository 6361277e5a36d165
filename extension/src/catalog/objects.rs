//! Object rows.

use super::{cache, probe, query_at};
use crate::cluster::layout;
use crate::error::{LambdaError, Result};
use lambdastore_core::model::{ModuleKey, ObjectInfo};
use pgrx::pg_sys::BuiltinOid::*;

/// The object's application and type, and the application's current
/// module; 42704 if there is no such object.
pub(crate) fn lookup(object_id: i64) -> Result<(ObjectInfo, ModuleKey)> {
    if let Some(cached) = cache::object(object_id) {
        return Ok(cached);
    }
    let (info, module) = if probe::usable() {
        probed(object_id)?
    } else {
        find(object_id)?.ok_or(LambdaError::UnknownObject(object_id))?
    };
    cache::remember_object(object_id, &info, &module);
    Ok((info, module))
}

/// The object's row by one index probe, and its application's module from
/// the cache (or one query per application). Every backend looks up each
/// object it calls once; on 10,000 objects and new connections the
/// three-table join through SPI made a cold lookup a large share of a
/// read-only call.
fn probed(object_id: i64) -> Result<(ObjectInfo, ModuleKey)> {
    let info = probe::by_key(
        layout::place(object_id)?,
        c"objects",
        c"objects_pkey",
        &[probe::Part::Int8(object_id)],
        |row| ObjectInfo { app: row.text(2).unwrap_or_default(), type_name: row.text(3).unwrap_or_default() },
    )?
    .ok_or(LambdaError::UnknownObject(object_id))?;
    // An application without a current module has no callable objects,
    // as the join said.
    let module = match super::modules::current(&info.app) {
        Err(LambdaError::UnknownApplication(_)) => return Err(LambdaError::UnknownObject(object_id)),
        other => other?,
    };
    Ok((info, module))
}

fn find(object_id: i64) -> Result<Option<(ObjectInfo, ModuleKey)>> {
    query_at(
        layout::place(object_id)?,
        "SELECT o.app, o.type_name, a.module_id, m.sha256
           FROM lambdastore.objects o JOIN lambdastore.applications a ON a.name = o.app
           JOIN lambdastore.modules m ON m.module_id = a.module_id
          WHERE o.object_id = $1",
        &[INT8OID],
        &[object_id.into()],
        |rows| {
            let Some(row) = rows.into_iter().next() else { return Ok(None) };
            let app: String = row.get(1)?.unwrap_or_default();
            let type_name: String = row.get(2)?.unwrap_or_default();
            let module_id: Option<i64> = row.get(3)?;
            let sha256: String = row.get(4)?.unwrap_or_default();
            Ok(module_id.map(|module_id| {
                let key = ModuleKey { module_id, app: app.clone(), sha256 };
                (ObjectInfo { app, type_name }, key)
            }))
        },
    )
}

/// An id for a new object. On a Citus node, one whose shard is on this
/// node, so that the workflow creating it stays on this node (the
/// sequence gives each node its own range, so ids stay unique; about one
/// draw in as many as there are nodes lands here).
pub(crate) fn next_id() -> Result<i64> {
    let Some(layout) = layout::layout()? else { return draw_id() };
    if !layout.holds_shards() {
        return Err(LambdaError::Elsewhere { object: draw_id()?, node: "another node".into() });
    }
    loop {
        let id = draw_id()?;
        if layout.owner(id).1.is_none() {
            return Ok(id);
        }
    }
}

/// A new object id, unique across a Citus cluster (`layout::unique`).
pub(crate) fn draw_id() -> Result<i64> {
    super::unique_id(c"lambdastore.object_id_seq")
}

/// Deletes an object with its entries and entry sets; false if it did not exist.
pub(crate) fn delete(object_id: i64) -> Result<bool> {
    super::note_write();
    cache::forget_object(object_id);
    cache::changed();
    query_at(
        layout::place(object_id)?,
        "DELETE FROM lambdastore.objects WHERE object_id = $1 RETURNING object_id",
        &[INT8OID],
        &[object_id.into()],
        |rows| Ok(!rows.is_empty()),
    )
}
