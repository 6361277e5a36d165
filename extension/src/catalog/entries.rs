//! Entry rows: point reads, ordered range scans, and applying a workflow's
//! buffered writes in a few set-based statements.

use super::query;
use crate::error::Result;
use crate::txn::{EntryKey, WriteBuffer};
use pgrx::pg_sys::BuiltinOid::*;

pub fn get((object, field, key): &EntryKey) -> Result<Option<Vec<u8>>> {
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

/// Inserts the created objects (each with its first entry set), then
/// deletes and upserts entries, each kind in one statement.
pub fn apply(writes: &WriteBuffer) -> Result<()> {
    let created = writes.created();
    if !created.is_empty() {
        let ids: Vec<i64> = created.iter().map(|(id, _, _)| *id).collect();
        let apps: Vec<String> = created.iter().map(|(_, app, _)| app.clone()).collect();
        let types: Vec<String> = created.iter().map(|(_, _, ty)| ty.clone()).collect();
        query(
            "WITH o AS (INSERT INTO lambdastore.objects (object_id, app, type_name)
                        SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[]) RETURNING object_id)
             INSERT INTO lambdastore.entry_sets (object_id) SELECT object_id FROM o",
            &[INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID],
            &[ids.into(), apps.into(), types.into()],
            |_| Ok(()),
        )?;
    }

    let (mut put_ids, mut put_fields, mut put_keys, mut put_values) = (vec![], vec![], vec![], vec![]);
    let (mut del_ids, mut del_fields, mut del_keys) = (vec![], vec![], vec![]);
    for ((object, field, key), slot) in writes.entries() {
        match slot {
            Some(value) => {
                put_ids.push(*object);
                put_fields.push(field.clone());
                put_keys.push(key.clone());
                put_values.push(value.clone());
            }
            None => {
                del_ids.push(*object);
                del_fields.push(field.clone());
                del_keys.push(key.clone());
            }
        }
    }
    if !del_ids.is_empty() {
        query(
            "DELETE FROM lambdastore.entries e
              USING unnest($1::bigint[], $2::text[], $3::bytea[]) AS d(object_id, field, key)
              WHERE e.object_id = d.object_id AND e.field = d.field AND e.key = d.key",
            &[INT8ARRAYOID, TEXTARRAYOID, BYTEAARRAYOID],
            &[del_ids.into(), del_fields.into(), del_keys.into()],
            |_| Ok(()),
        )?;
    }
    if !put_ids.is_empty() {
        query(
            "INSERT INTO lambdastore.entries (object_id, field, key, value)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::bytea[], $4::bytea[])
             ON CONFLICT (object_id, field, key) DO UPDATE SET value = EXCLUDED.value",
            &[INT8ARRAYOID, TEXTARRAYOID, BYTEAARRAYOID, BYTEAARRAYOID],
            &[put_ids.into(), put_fields.into(), put_keys.into(), put_values.into()],
            |_| Ok(()),
        )?;
    }
    Ok(())
}
