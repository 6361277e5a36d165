//! Entries of the current object: reads see the workflow's own buffered
//! writes first, then the table; writes go to the buffer only.

use super::{Direction, Entry, HostState};
use crate::catalog::entries as table;
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::txn::EntryKey;
use lambdastore_core::txn::buffer::merge_scan;

fn key_of(state: &HostState, field: String, key: Vec<u8>, op: &'static str) -> Result<EntryKey> {
    state.refuse_in_describe(format_args!("an entry to {op}"))?;
    // PostgreSQL's text ends at a NUL: the stored name would not be the
    // name written, two fields could look alike, and a dump would not
    // restore.
    if field.contains('\0') {
        return Err(LambdaError::InvalidParameter(format!(
            "field name {field:?} of \"{}.{}\" contains a NUL byte",
            state.frame.type_name, state.frame.function
        )));
    }
    if state.frame.object == 0 {
        return Err(LambdaError::NoObject {
            ty: state.frame.type_name.clone(),
            function: state.frame.function.clone(),
            op,
        });
    }
    Ok((state.frame.object, field, key))
}

fn check_writable(state: &HostState) -> Result<()> {
    if state.frame.readonly {
        return Err(LambdaError::ReadonlyWrite {
            ty: state.frame.type_name.clone(),
            function: state.frame.function.clone(),
        });
    }
    Ok(())
}

pub(crate) fn get(state: &HostState, field: String, key: Vec<u8>) -> Result<Option<Vec<u8>>> {
    let key = key_of(state, field, key, "read")?;
    state.workflow.record_read(key.0, &key.1, &key.2)?;
    if let Some(buffered) = state.workflow.buffered(&key) {
        return Ok(buffered);
    }
    // A function that may write may write what it reads: the table keeps
    // where the row is, for that write (a readonly one pays nothing).
    stored(state, &key, !state.frame.readonly)
}

/// A stored entry: from the table (remembering where its row is when
/// `for_writing`), or on a light replica from its copy.
fn stored(state: &HostState, key: &EntryKey, for_writing: bool) -> Result<Option<Vec<u8>>> {
    match state.workflow.copy_of(key.0) {
        Some(copy) => Ok(copy.get(&key.1, &key.2)),
        None => table::get(key, for_writing),
    }
}

pub(crate) fn put(state: &HostState, field: String, key: Vec<u8>, value: Vec<u8>) -> Result<()> {
    let key = key_of(state, field, key, "write")?;
    check_writable(state)?;
    table::check_key_size(&key.1, &key.2)?;
    // The buffer and its undo journal are host memory, outside the
    // lambda's memory limit.
    state.workflow.write(key, Some(value), gucs::max_write_bytes())
}

pub(crate) fn delete(state: &HostState, field: String, key: Vec<u8>) -> Result<bool> {
    let key = key_of(state, field, key, "write")?;
    check_writable(state)?;
    state.workflow.record_read(key.0, &key.1, &key.2)?;
    let existed = match state.workflow.buffered(&key) {
        Some(buffered) => buffered.is_some(),
        None => stored(state, &key, false)?.is_some(),
    };
    state.workflow.write(key, None, gucs::max_write_bytes())?;
    Ok(existed)
}

/// Merges the table's entries in [start, end) with the buffered ones. Each
/// buffered key can hide at most one stored entry, so asking the table for
/// `limit + buffered` rows is always enough.
pub(crate) fn scan(
    state: &HostState,
    field: String,
    start: Option<Vec<u8>>,
    end: Option<Vec<u8>>,
    limit: u32,
    dir: Direction,
) -> Result<Vec<Entry>> {
    let (object, field, _) = key_of(state, field, Vec::new(), "read")?;
    let limit = limit as usize;
    if limit == 0 || matches!((&start, &end), (Some(s), Some(e)) if s >= e) {
        return Ok(Vec::new());
    }
    state.workflow.record_scan(object, &field, start.as_deref().unwrap_or_default(), end.as_deref())?;
    let writes = state.workflow.writes();
    let buffered: Vec<(&[u8], &Option<Vec<u8>>)> = {
        let range = writes.range(object, &field, start.as_deref(), end.as_deref());
        match dir {
            Direction::Forward => range.collect(),
            Direction::Backward => range.rev().collect(),
        }
    };
    let forward = matches!(dir, Direction::Forward);
    // Streamed, so that neither a huge range nor a slow one can run past
    // the scan limit or the workflow's deadline before anyone looks.
    let wanted = limit.saturating_add(buffered.len());
    let stored = match state.workflow.copy_of(object) {
        Some(copy) => copy.scan(&field, start.as_deref(), end.as_deref(), wanted, forward),
        None => table::scan(
            object,
            &field,
            start.as_deref(),
            end.as_deref(),
            wanted,
            forward,
            gucs::max_scan_bytes(),
            || state.workflow.keep_going(),
        )?,
    };

    let merged = merge_scan(stored, buffered, forward, limit);
    Ok(merged.into_iter().map(|(key, value)| Entry { key, value }).collect())
}
