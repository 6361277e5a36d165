//! Entry rows: point reads, ordered range scans, and applying a workflow's
//! buffered writes.

use super::{in_place, probe, query_at, query_chunks};
use crate::cluster::layout;
use crate::error::{LambdaError, Result};
use lambdastore_core::model::{EntryKey, EntryRow, Slot};
use pgrx::pg_sys::BuiltinOid::*;

/// The most bytes an entry's field name and key may have together. Both go
/// into the primary key's btree, whose entries PostgreSQL limits to 2,704
/// bytes on 8 kB pages (a third of a page) with the object id and headers;
/// past it the write would fail at the commit with the index's own words.
const MAX_KEY_BYTES: usize = 2048;

/// An entry's (or an entry set's first) field and key fit the index (54000).
pub(crate) fn check_key_size(field: &str, key: &[u8]) -> Result<()> {
    let size = field.len() + key.len();
    if size > MAX_KEY_BYTES {
        return Err(LambdaError::KeyTooLong { size, limit: MAX_KEY_BYTES });
    }
    Ok(())
}

/// The entry's value; `for_writing`: the workflow may write it next, so
/// where its row is is remembered for that write (in_place.rs).
pub(crate) fn get((object, field, key): &EntryKey, for_writing: bool) -> Result<Option<Vec<u8>>> {
    let place = layout::place(*object)?;
    if probe::usable() {
        let parts = [probe::Part::Int8(*object), probe::Part::Text(field), probe::Part::Bytes(key)];
        let read = |row: &probe::Row| {
            if for_writing {
                in_place::remember_row((*object, field, key), row.at());
            }
            row.bytes(4)
        };
        return Ok(probe::by_key(place, c"entries", c"entries_pkey", &parts, read)?.flatten());
    }
    query_at(
        place,
        "SELECT value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key = $3",
        &[INT8OID, TEXTOID, BYTEAOID],
        &[(*object).into(), field.as_str().into(), key.as_slice().into()],
        |rows| match rows.into_iter().next() {
            Some(row) => super::bytes(&row, 1),
            None => Ok(None),
        },
    )
}

/// Entries of one field with start <= key < end, in key order (or
/// reverse), at most `limit`. Rows are fetched in chunks; between chunks
/// `keep_going` may stop the scan, and more than `max_bytes` of keys and
/// values fail it (54000, `lambdastore.max_scan_size`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scan(
    object: i64,
    field: &str,
    start: Option<&[u8]>,
    end: Option<&[u8]>,
    limit: usize,
    forward: bool,
    max_bytes: usize,
    mut keep_going: impl FnMut() -> Result<()>,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let place = layout::place(object)?;
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let mut keep = |key: Vec<u8>, value: Vec<u8>, out: &mut Vec<(Vec<u8>, Vec<u8>)>| {
        bytes = bytes.saturating_add(key.len() + value.len());
        if let Some(too_large) = past_scan_limit("the scan returns more than", bytes, max_bytes) {
            return Err(too_large);
        }
        out.push((key, value));
        Ok(())
    };
    if probe::usable() {
        // Straight through the index, as `get` reads: an SPI cursor's
        // portal and executor cost more than reading a few entries.
        let prefix = [probe::Part::Int8(object), probe::Part::Text(field)];
        let bounds = probe::Bounds { from: start, before: end };
        probe::by_range(place, c"entries", c"entries_pkey", &prefix, bounds, forward, |row| {
            keep(row.bytes(3).unwrap_or_default(), row.bytes(4).unwrap_or_default(), &mut out)?;
            if out.len() % SCAN_CHUNK as usize == 0 {
                keep_going()?;
            }
            Ok(out.len() < limit)
        })?;
        return Ok(out);
    }
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
    query_chunks(place, sql, &types, &args, SCAN_CHUNK, |rows| {
        for row in rows {
            let key = super::bytes(&row, 1)?.unwrap_or_default();
            let value = super::bytes(&row, 2)?.unwrap_or_default();
            if let Err(too_large) = keep(key, value, &mut out) {
                return Ok(Err(too_large));
            }
        }
        Ok(keep_going())
    })?;
    Ok(out)
}

/// 54000 once a scan has read more than `lambdastore.max_scan_size`.
fn past_scan_limit(what: &'static str, bytes: usize, max_bytes: usize) -> Option<LambdaError> {
    (bytes > max_bytes).then_some(LambdaError::TooLarge {
        what,
        size: bytes,
        limit: max_bytes,
        setting: "lambdastore.max_scan_size",
    })
}

/// Every entry of `object`, in (field, key) order: what a light replica
/// copies (cluster/replica.rs). More than `max_bytes` fails (54000).
pub(crate) fn all(object: i64, max_bytes: usize) -> Result<Vec<EntryRow>> {
    let sql = "SELECT field, key, value FROM lambdastore.entries WHERE object_id = $1 ORDER BY field, key";
    let mut out = Vec::new();
    let mut bytes = 0usize;
    query_chunks(layout::place(object)?, sql, &[INT8OID], &[object.into()], SCAN_CHUNK, |rows| {
        for row in rows {
            let field = row.get::<String>(1)?.unwrap_or_default();
            let key = super::bytes(&row, 2)?.unwrap_or_default();
            let value = super::bytes(&row, 3)?.unwrap_or_default();
            bytes = bytes.saturating_add(field.len() + key.len() + value.len());
            if let Some(too_large) =
                past_scan_limit("a light replica's copy of the object is more than", bytes, max_bytes)
            {
                return Ok(Err(too_large));
            }
            out.push((field, key, value));
        }
        Ok(Ok(()))
    })?;
    Ok(out)
}

/// Rows fetched at a time by a scan: a few pages of typical entries.
const SCAN_CHUNK: i64 = 64;

/// Inserts the created objects (each with its first entry set), deletes
/// and upserts entries. A new value is written straight to the heap where
/// that does what the statement would (in_place.rs): over the row of an
/// entry that exists, or as a new row where `exclusive` says that the
/// transaction holds the written sets for writing, so that no other
/// inserts the same key meanwhile. Every other change is one kept
/// single-row statement: statements with array arguments would be
/// re-planned on every execution (their generic plan never looks cheaper
/// than a custom one), and a workflow writes few entries. A workflow that
/// buffered many is stopped by `keep_going` (its deadline, a cancel) every
/// `APPLY_CHECK` statements.
pub(crate) fn apply<'a>(
    created: &[(i64, String, String)],
    entries: impl Iterator<Item = (&'a EntryKey, &'a Slot)>,
    exclusive: bool,
    mut keep_going: impl FnMut() -> Result<()>,
) -> Result<()> {
    for (id, app, type_name) in created {
        super::note_write();
        query_at(
            layout::place(*id)?,
            "WITH o AS (INSERT INTO lambdastore.objects (object_id, app, type_name) VALUES ($1, $2, $3))
             INSERT INTO lambdastore.entry_sets (object_id) VALUES ($1)",
            &[INT8OID, TEXTOID, TEXTOID],
            &[(*id).into(), app.as_str().into(), type_name.as_str().into()],
            |_| Ok(()),
        )?;
    }
    for (n, ((object, field, key), slot)) in entries.enumerate() {
        if n % APPLY_CHECK == APPLY_CHECK - 1 {
            keep_going()?;
        }
        super::note_write();
        let place = layout::place(*object)?;
        let in_place = |value: &[u8]| in_place::write_entry(place, (*object, field, key), value, exclusive);
        match slot {
            Some(value) if probe::usable() && in_place(value)? => {}
            Some(value) => query_at(
                place,
                "INSERT INTO lambdastore.entries (object_id, field, key, value) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (object_id, field, key) DO UPDATE SET value = EXCLUDED.value",
                &[INT8OID, TEXTOID, BYTEAOID, BYTEAOID],
                &[(*object).into(), field.as_str().into(), key.as_slice().into(), value.as_slice().into()],
                |_| Ok(()),
            )?,
            None => query_at(
                place,
                "DELETE FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key = $3",
                &[INT8OID, TEXTOID, BYTEAOID],
                &[(*object).into(), field.as_str().into(), key.as_slice().into()],
                |_| Ok(()),
            )?,
        }
    }
    Ok(())
}

const APPLY_CHECK: usize = 256;
