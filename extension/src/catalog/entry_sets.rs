//! Entry-set rows: loading an object's sets, bumping versions, guards.

use super::query;
use crate::error::Result;
use crate::txn::entry_sets::{EntrySet, EntrySets, SetId};
use pgrx::pg_sys::BuiltinOid::*;

/// The object's entry sets, as committed now (a fresh snapshot).
pub fn load(object: i64) -> Result<EntrySets> {
    let sets = query(
        "SELECT lower_field, lower_key, version, conflicts FROM lambdastore.entry_sets
          WHERE object_id = $1 ORDER BY lower_field, lower_key",
        &[INT8OID],
        &[object.into()],
        |rows| {
            rows.into_iter()
                .map(|row| {
                    Ok(EntrySet {
                        lower: (row.get::<String>(1)?.unwrap_or_default(), row.get::<Vec<u8>>(2)?.unwrap_or_default()),
                        version: row.get::<i64>(3)?.unwrap_or_default(),
                        conflicts: row.get::<i64>(4)?.unwrap_or_default(),
                    })
                })
                .collect::<pgrx::spi::Result<Vec<_>>>()
        },
    )?;
    // An object created before entry sets existed, or by hand: one set.
    Ok(if sets.is_empty() { EntrySets::fresh() } else { EntrySets(sets) })
}

/// Makes the sets' new versions (and their recent conflicts, halved then
/// increased by what this backend saw) part of this transaction.
pub fn bump(sets: &[(SetId, i64)]) -> Result<()> {
    let ids: Vec<i64> = sets.iter().map(|((o, _), _)| *o).collect();
    let fields: Vec<String> = sets.iter().map(|((_, (f, _)), _)| f.clone()).collect();
    let keys: Vec<Vec<u8>> = sets.iter().map(|((_, (_, k)), _)| k.clone()).collect();
    let conflicts: Vec<i64> = sets.iter().map(|(_, c)| *c).collect();
    query(
        "INSERT INTO lambdastore.entry_sets AS s (object_id, lower_field, lower_key, version, conflicts)
         SELECT o, f, k, 1, c FROM unnest($1::bigint[], $2::text[], $3::bytea[], $4::bigint[]) AS u(o, f, k, c)
         ON CONFLICT (object_id, lower_field, lower_key)
         DO UPDATE SET version = s.version + 1, conflicts = s.conflicts / 2 + EXCLUDED.conflicts",
        &[INT8ARRAYOID, TEXTARRAYOID, BYTEAARRAYOID, INT8ARRAYOID],
        &[ids.into(), fields.into(), keys.into(), conflicts.into()],
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
