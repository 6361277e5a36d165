//! Entry-set rows: an object's guards, the lower bounds of its sets. Their
//! versions and conflict counts live in shared memory (txn/versions.rs).

use super::{probe, query_at};
use crate::cluster::layout;
use crate::error::Result;
use lambdastore_core::model::Position;
use pgrx::pg_sys::BuiltinOid::*;

fn position(row: &pgrx::spi::SpiHeapTupleData<'_>, first: usize) -> pgrx::spi::Result<Position> {
    Ok((row.get::<String>(first)?.unwrap_or_default(), super::bytes(row, first + 1)?.unwrap_or_default()))
}

/// The lower bound of the set containing (field, key) as committed now,
/// and that of the set after it (None: it extends to the end of the object).
pub(crate) fn around(object: i64, field: &str, key: &[u8]) -> Result<(Position, Option<Position>)> {
    let rows = query_at(
        layout::place(object)?,
        "(SELECT true, lower_field, lower_key FROM lambdastore.entry_sets
           WHERE object_id = $1 AND (lower_field, lower_key) <= ($2 COLLATE \"C\", $3)
           ORDER BY lower_field DESC, lower_key DESC LIMIT 1)
         UNION ALL
         (SELECT false, lower_field, lower_key FROM lambdastore.entry_sets
           WHERE object_id = $1 AND (lower_field, lower_key) > ($2 COLLATE \"C\", $3)
           ORDER BY lower_field, lower_key LIMIT 1)",
        &[INT8OID, TEXTOID, BYTEAOID],
        &[object.into(), field.into(), key.into()],
        |rows| {
            rows.into_iter()
                .map(|row| Ok((row.get::<bool>(1)?.unwrap_or(false), position(&row, 2)?)))
                .collect::<pgrx::spi::Result<Vec<_>>>()
        },
    )?;
    let mut containing = None;
    let mut next = None;
    for (is_containing, lower) in rows {
        if is_containing {
            containing = Some(lower);
        } else {
            next = Some(lower);
        }
    }
    // Every object has a set from ("", ""); one created by hand might not.
    Ok((containing.unwrap_or_default(), next))
}

/// All of an object's guards in order, if it has at most `max`: one index
/// range read instead of one query per set touched, for the common object
/// with few sets.
pub(crate) fn all_if_few(object: i64, max: usize) -> Result<Option<Vec<Position>>> {
    let lowers = if probe::usable() {
        probe::by_prefix(
            layout::place(object)?,
            c"entry_sets",
            c"entry_sets_pkey",
            &[probe::Part::Int8(object)],
            max + 1,
            |row| (row.text(2).unwrap_or_default(), row.bytes(3).unwrap_or_default()),
        )?
    } else {
        query_at(
            layout::place(object)?,
            "SELECT lower_field, lower_key FROM lambdastore.entry_sets
              WHERE object_id = $1 ORDER BY lower_field, lower_key LIMIT $2",
            &[INT8OID, INT8OID],
            &[object.into(), (max as i64 + 1).into()],
            |rows| rows.into_iter().map(|row| position(&row, 1)).collect::<pgrx::spi::Result<Vec<_>>>(),
        )?
    };
    Ok((lowers.len() <= max).then_some(lowers))
}

/// The guards of `field` strictly inside (start, end): with the set
/// containing `start`, every set a scan of [start, end) overlaps.
pub(crate) fn inside(object: i64, field: &str, start: &[u8], end: Option<&[u8]>) -> Result<Vec<Position>> {
    let read = |rows: pgrx::spi::SpiTupleTable<'_>| {
        rows.into_iter().map(|row| position(&row, 1)).collect::<pgrx::spi::Result<Vec<_>>>()
    };
    match end {
        Some(end) => query_at(
            layout::place(object)?,
            "SELECT lower_field, lower_key FROM lambdastore.entry_sets
              WHERE object_id = $1 AND lower_field = $2 AND lower_key > $3 AND lower_key < $4
              ORDER BY lower_key",
            &[INT8OID, TEXTOID, BYTEAOID, BYTEAOID],
            &[object.into(), field.into(), start.into(), end.into()],
            read,
        ),
        None => query_at(
            layout::place(object)?,
            "SELECT lower_field, lower_key FROM lambdastore.entry_sets
              WHERE object_id = $1 AND lower_field = $2 AND lower_key > $3 ORDER BY lower_key",
            &[INT8OID, TEXTOID, BYTEAOID],
            &[object.into(), field.into(), start.into()],
            read,
        ),
    }
}

pub(crate) fn count(object: i64) -> Result<usize> {
    query_at(
        layout::place(object)?,
        "SELECT count(*) FROM lambdastore.entry_sets WHERE object_id = $1",
        &[INT8OID],
        &[object.into()],
        |rows| Ok(rows.first().get_one::<i64>()?.unwrap_or_default() as usize),
    )
}

/// Inserts a guard: a new set starting at (field, key).
pub(crate) fn insert_guard(object: i64, field: &str, key: &[u8]) -> Result<()> {
    super::note_write();
    query_at(
        layout::place(object)?,
        "INSERT INTO lambdastore.entry_sets (object_id, lower_field, lower_key)
         VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        &[INT8OID, TEXTOID, BYTEAOID],
        &[object.into(), field.into(), key.into()],
        |_| Ok(()),
    )
}

/// The two sets a merge of `lower`'s set makes one, as (kept, removed):
/// the set before it and itself, or, for the first set, itself and the one
/// after it. None if the object has one set.
pub(crate) fn merge_partners(object: i64, lower: &Position) -> Result<Option<(Position, Position)>> {
    if *lower == Position::default() {
        let (_, next) = around(object, "", &[])?;
        return Ok(next.map(|next| (lower.clone(), next)));
    }
    let before = query_at(
        layout::place(object)?,
        "SELECT lower_field, lower_key FROM lambdastore.entry_sets
          WHERE object_id = $1 AND (lower_field, lower_key) < ($2 COLLATE \"C\", $3)
          ORDER BY lower_field DESC, lower_key DESC LIMIT 1",
        &[INT8OID, TEXTOID, BYTEAOID],
        &[object.into(), lower.0.as_str().into(), lower.1.as_slice().into()],
        |rows| rows.into_iter().map(|row| position(&row, 1)).next().transpose(),
    )?;
    // Every object has a set from ("", ""); one created by hand might not.
    Ok(Some((before.unwrap_or_default(), lower.clone())))
}

/// Removes a guard: its set becomes part of the set before it.
pub(crate) fn delete_guard(object: i64, lower: &Position) -> Result<()> {
    super::note_write();
    query_at(
        layout::place(object)?,
        "DELETE FROM lambdastore.entry_sets WHERE object_id = $1 AND lower_field = $2 AND lower_key = $3",
        &[INT8OID, TEXTOID, BYTEAOID],
        &[object.into(), lower.0.as_str().into(), lower.1.as_slice().into()],
        |_| Ok(()),
    )
}
