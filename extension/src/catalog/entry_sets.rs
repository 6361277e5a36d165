//! Entry-set rows: loading an object's sets, bumping versions, guards.

use super::{probe, query};
use crate::error::Result;
use crate::txn::entry_sets::{EntrySet, Position, SetId};
use pgrx::pg_sys::BuiltinOid::*;

fn entry_set(row: &pgrx::spi::SpiHeapTupleData<'_>, first: usize) -> pgrx::spi::Result<EntrySet> {
    Ok(EntrySet {
        lower: (row.get::<String>(first)?.unwrap_or_default(), row.get::<Vec<u8>>(first + 1)?.unwrap_or_default()),
        version: row.get::<i64>(first + 2)?.unwrap_or_default(),
    })
}

/// The set containing (field, key) as committed now, and the lower bound of
/// the set after it (None: it extends to the end of the object).
pub fn around(object: i64, field: &str, key: &[u8]) -> Result<(EntrySet, Option<Position>)> {
    let rows = query(
        "(SELECT true, lower_field, lower_key, version FROM lambdastore.entry_sets
           WHERE object_id = $1 AND (lower_field, lower_key) <= ($2 COLLATE \"C\", $3)
           ORDER BY lower_field DESC, lower_key DESC LIMIT 1)
         UNION ALL
         (SELECT false, lower_field, lower_key, version FROM lambdastore.entry_sets
           WHERE object_id = $1 AND (lower_field, lower_key) > ($2 COLLATE \"C\", $3)
           ORDER BY lower_field, lower_key LIMIT 1)",
        &[INT8OID, TEXTOID, BYTEAOID],
        &[object.into(), field.into(), key.into()],
        |rows| rows.into_iter().map(|row| Ok((row.get::<bool>(1)?.unwrap_or(false), entry_set(&row, 2)?))).collect::<pgrx::spi::Result<Vec<_>>>(),
    )?;
    let mut containing = None;
    let mut next = None;
    for (is_containing, set) in rows {
        if is_containing {
            containing = Some(set);
        } else {
            next = Some(set.lower);
        }
    }
    // Every object has a set from ("", ""); one created by hand might not.
    let containing = containing.unwrap_or(EntrySet { lower: (String::new(), Vec::new()), version: 0 });
    Ok((containing, next))
}

/// All of an object's sets in order, if it has at most `max`: one index
/// range read instead of one query per set touched, for the common object
/// with few sets.
pub fn all_if_few(object: i64, max: usize) -> Result<Option<Vec<EntrySet>>> {
    if probe::usable() {
        let sets = probe::by_prefix(c"entry_sets", c"entry_sets_pkey", &[probe::Part::Int8(object)], max + 1, |row| {
            EntrySet {
                lower: (row.text(2).unwrap_or_default(), row.bytes(3).unwrap_or_default()),
                version: row.int8(4).unwrap_or_default(),
            }
        })?;
        return Ok((sets.len() <= max).then_some(sets));
    }
    let sets = query(
        "SELECT lower_field, lower_key, version FROM lambdastore.entry_sets
          WHERE object_id = $1 ORDER BY lower_field, lower_key LIMIT $2",
        &[INT8OID, INT8OID],
        &[object.into(), (max as i64 + 1).into()],
        |rows| rows.into_iter().map(|row| entry_set(&row, 1)).collect::<pgrx::spi::Result<Vec<_>>>(),
    )?;
    Ok((sets.len() <= max).then_some(sets))
}

/// The sets of `field` starting strictly inside (start, end): with the set
/// containing `start`, every set a scan of [start, end) overlaps.
pub fn inside(object: i64, field: &str, start: &[u8], end: Option<&[u8]>) -> Result<Vec<EntrySet>> {
    let read = |rows: pgrx::spi::SpiTupleTable<'_>| rows.into_iter().map(|row| entry_set(&row, 1)).collect::<pgrx::spi::Result<Vec<_>>>();
    match end {
        Some(end) => query(
            "SELECT lower_field, lower_key, version FROM lambdastore.entry_sets
              WHERE object_id = $1 AND lower_field = $2 AND lower_key > $3 AND lower_key < $4
              ORDER BY lower_key",
            &[INT8OID, TEXTOID, BYTEAOID, BYTEAOID],
            &[object.into(), field.into(), start.into(), end.into()],
            read,
        ),
        None => query(
            "SELECT lower_field, lower_key, version FROM lambdastore.entry_sets
              WHERE object_id = $1 AND lower_field = $2 AND lower_key > $3 ORDER BY lower_key",
            &[INT8OID, TEXTOID, BYTEAOID],
            &[object.into(), field.into(), start.into()],
            read,
        ),
    }
}

/// The current version and conflicts of a set (None: no such set now).
/// One primary-key probe per set: a workflow locks few sets, and simple
/// statements keep generic plans (array arguments would be re-planned on
/// every execution).
pub fn current((object, (field, key)): &SetId) -> Result<Option<(i64, i64)>> {
    if probe::usable() {
        let key = [probe::Part::Int8(*object), probe::Part::Text(field), probe::Part::Bytes(key)];
        return Ok(probe::by_key(c"entry_sets", c"entry_sets_pkey", &key, |row| row.int8(4).zip(row.int8(5)))?.flatten());
    }
    query(
        "SELECT version, conflicts FROM lambdastore.entry_sets
          WHERE object_id = $1 AND lower_field = $2 AND lower_key = $3",
        &[INT8OID, TEXTOID, BYTEAOID],
        &[(*object).into(), field.as_str().into(), key.as_slice().into()],
        |rows| match rows.into_iter().next() {
            Some(row) => Ok(row.get::<i64>(1)?.zip(row.get::<i64>(2)?)),
            None => Ok(None),
        },
    )
}

/// Whether a set now starts after `set`'s lower bound and at or before
/// `written`: a split committed since the workflow loaded the set.
pub fn split_since((object, (lower_field, lower_key)): &SetId, (field, key): &Position) -> Result<bool> {
    query(
        "SELECT EXISTS (SELECT FROM lambdastore.entry_sets
                         WHERE object_id = $1
                           AND (lower_field, lower_key) > ($2 COLLATE \"C\", $3)
                           AND (lower_field, lower_key) <= ($4 COLLATE \"C\", $5))",
        &[INT8OID, TEXTOID, BYTEAOID, TEXTOID, BYTEAOID],
        &[(*object).into(), lower_field.as_str().into(), lower_key.as_slice().into(), field.as_str().into(), key.as_slice().into()],
        |rows| Ok(rows.first().get_one::<bool>()?.unwrap_or(false)),
    )
}

pub fn count(object: i64) -> Result<usize> {
    query("SELECT count(*) FROM lambdastore.entry_sets WHERE object_id = $1", &[INT8OID], &[object.into()], |rows| {
        Ok(rows.first().get_one::<i64>()?.unwrap_or_default() as usize)
    })
}

/// Makes the set's new version (and its recent conflicts, halved then
/// increased by what this backend saw) part of this transaction.
pub fn bump((object, (field, key)): &SetId, conflicts: i64) -> Result<()> {
    query(
        "INSERT INTO lambdastore.entry_sets AS s (object_id, lower_field, lower_key, version, conflicts)
         VALUES ($1, $2, $3, 1, $4)
         ON CONFLICT (object_id, lower_field, lower_key)
         DO UPDATE SET version = s.version + 1, conflicts = s.conflicts / 2 + EXCLUDED.conflicts",
        &[INT8OID, TEXTOID, BYTEAOID, INT8OID],
        &[(*object).into(), field.as_str().into(), key.as_slice().into(), conflicts.into()],
        |_| Ok(()),
    )
}

/// Inserts a guard: a new set starting at `lower` with `version`.
pub fn insert_guard(object: i64, field: &str, key: &[u8], version: i64) -> Result<()> {
    query(
        "INSERT INTO lambdastore.entry_sets (object_id, lower_field, lower_key, version)
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        &[INT8OID, TEXTOID, BYTEAOID, INT8OID],
        &[object.into(), field.into(), key.into(), version.into()],
        |_| Ok(()),
    )
}
