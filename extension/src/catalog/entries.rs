//! Entry rows: point reads, ordered range scans, and applying a workflow's
//! buffered writes in a few set-based statements.

use super::{probe, query};
use crate::error::Result;
use crate::txn::{EntryKey, WriteBuffer};
use pgrx::pg_sys::BuiltinOid::*;

pub fn get((object, field, key): &EntryKey) -> Result<Option<Vec<u8>>> {
    if probe::usable() {
        let key = [probe::Part::Int8(*object), probe::Part::Text(field), probe::Part::Bytes(key)];
        return Ok(probe::by_key(c"entries", c"entries_pkey", &key, |row| row.bytes(4))?.flatten());
    }
    query(
        "SELECT value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key = $3",
        &[INT8OID, TEXTOID, BYTEAOID],
        &[(*object).into(), field.as_str().into(), key.as_slice().into()],
        |rows| match rows.into_iter().next() {
            Some(row) => row.get::<Vec<u8>>(1),
            None => Ok(None),
        },
    )
}

/// Entries of one field with start <= key < end, in key order (or
/// reverse), at most `limit`.
pub fn scan(
    object: i64,
    field: &str,
    start: Option<&[u8]>,
    end: Option<&[u8]>,
    limit: usize,
    forward: bool,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    // One plan per shape, so that each is a plain index range scan.
    let sql = match (end.is_some(), forward) {
        (true, true) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key >= $3 AND key < $5 ORDER BY key LIMIT $4",
        (true, false) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key >= $3 AND key < $5 ORDER BY key DESC LIMIT $4",
        (false, true) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key >= $3 ORDER BY key LIMIT $4",
        (false, false) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key >= $3 ORDER BY key DESC LIMIT $4",
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let start = start.unwrap_or_default();
    let mut args = vec![object.into(), field.into(), start.into(), limit.into()];
    let mut types = vec![INT8OID, TEXTOID, BYTEAOID, INT8OID];
    if let Some(end) = end {
        args.push(end.into());
        types.push(BYTEAOID);
    }
    query(sql, &types, &args, |rows| {
        rows.into_iter()
            .map(|row| Ok((row.get::<Vec<u8>>(1)?.unwrap_or_default(), row.get::<Vec<u8>>(2)?.unwrap_or_default())))
            .collect()
    })
}

/// Inserts the created objects (each with its first entry set), deletes
/// and upserts entries, then queues the spawned calls as jobs (the outbox).
/// One kept single-row statement per change: statements with array
/// arguments would be re-planned on every execution (their generic plan
/// never looks cheaper than a custom one), and a workflow writes few entries.
pub fn apply(writes: &WriteBuffer) -> Result<()> {
    for (id, app, type_name) in writes.created() {
        query(
            "WITH o AS (INSERT INTO lambdastore.objects (object_id, app, type_name) VALUES ($1, $2, $3))
             INSERT INTO lambdastore.entry_sets (object_id) VALUES ($1)",
            &[INT8OID, TEXTOID, TEXTOID],
            &[(*id).into(), app.as_str().into(), type_name.as_str().into()],
            |_| Ok(()),
        )?;
    }
    for ((object, field, key), slot) in writes.entries() {
        match slot {
            Some(value) => query(
                "INSERT INTO lambdastore.entries (object_id, field, key, value) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (object_id, field, key) DO UPDATE SET value = EXCLUDED.value",
                &[INT8OID, TEXTOID, BYTEAOID, BYTEAOID],
                &[(*object).into(), field.as_str().into(), key.as_slice().into(), value.as_slice().into()],
                |_| Ok(()),
            )?,
            None => query(
                "DELETE FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key = $3",
                &[INT8OID, TEXTOID, BYTEAOID],
                &[(*object).into(), field.as_str().into(), key.as_slice().into()],
                |_| Ok(()),
            )?,
        }
    }
    if !writes.spawned().is_empty() {
        super::jobs::insert_spawned(writes.spawned(), crate::jobs::current_job())?;
        crate::jobs::wake_workers_at_commit();
    }
    Ok(())
}
