//! Serializable workflows: Silo-style optimistic concurrency control on
//! entry sets (DESIGN §6).
//!
//! During a workflow reads take no locks: they record each entry set they
//! touch with the version seen when the object's sets were loaded, *before*
//! any value was read (so a version never describes a newer value than the
//! one read). At the end of the workflow `commit`:
//! 1. try-locks the written sets exclusively and the read sets shared, as
//!    transaction-level advisory locks, in one global order, never waiting;
//! 2. reloads the sets and checks that every read set still has the version
//!    seen, and that every written key still falls in the set locked for it
//!    (a concurrent split could have moved it);
//! 3. applies the writes and bumps the written sets' versions in this
//!    PostgreSQL transaction, so a version and its data become visible
//!    together at commit;
//! 4. maybe splits a written set, with a probability that grows with its
//!    recent conflicts.
//!
//! Locks are held until the SQL transaction ends, so a transaction of
//! several workflows is serializable as a whole. Any failure is 40001.

use super::entry_sets::{lock_key, Position, SetId};
use super::Workflow;
use crate::catalog;
use crate::error::{LambdaError, Result};
use crate::gucs;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

thread_local! {
    /// Conflicts this backend suffered per entry set since it last
    /// committed a write to it; written into the set's counter then.
    static SEEN_CONFLICTS: RefCell<HashMap<SetId, i64>> = RefCell::new(HashMap::new());
}

/// OCC reads versions and values with fresh snapshots (READ COMMITTED per
/// statement); under a transaction snapshot its validation would read stale
/// versions and pass wrongly, so those isolation levels are refused.
pub fn check_isolation() -> Result<()> {
    // SAFETY: a plain int of the current transaction, read on the main thread.
    let level = unsafe { pg_sys::XactIsoLevel };
    if gucs::occ() && level >= pg_sys::XACT_REPEATABLE_READ as i32 {
        return Err(LambdaError::IsolationLevel(
            "lambdas need READ COMMITTED isolation: LambdaStore makes workflows serializable itself \
             (lambdastore.concurrency_control = occ); to rely on PostgreSQL's REPEATABLE READ or \
             SERIALIZABLE instead, SET lambdastore.concurrency_control = off"
                .into(),
        ));
    }
    Ok(())
}

fn describe((object, (field, key)): &SetId) -> String {
    format!("entry set of object {object} starting at field \"{field}\" key \\x{}", hex::encode(key))
}

fn conflict(set: &SetId, why: &str) -> LambdaError {
    SEEN_CONFLICTS.with(|seen| *seen.borrow_mut().entry(set.clone()).or_default() += 1);
    LambdaError::SerializationFailure(format!("{} {why}", describe(set)))
}

/// Advisory lock on an entry set, like `pg_try_advisory_xact_lock(key)`
/// (or `_shared`): visible in `pg_locks`, released at transaction end.
fn try_lock(set: &SetId, exclusive: bool) -> bool {
    let key = lock_key(set) as u64;
    let tag = pg_sys::LOCKTAG {
        // SAFETY: set at backend start, read on the main thread.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (key >> 32) as u32,
        locktag_field3: key as u32,
        locktag_field4: 1, // the int8 form of the advisory-lock functions
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    let mode = if exclusive { pg_sys::ExclusiveLock } else { pg_sys::ShareLock } as pg_sys::LOCKMODE;
    // SAFETY: a valid tag; transaction-scoped, never waits.
    let result = unsafe { pg_sys::LockAcquire(&tag, mode, false, true) };
    result != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Validates the workflow and applies its writes (see the module doc).
pub fn commit(workflow: &Workflow) -> Result<()> {
    let writes = workflow.writes.borrow();
    if !gucs::occ() {
        return if writes.is_empty() { Ok(()) } else { catalog::entries::apply(&writes) };
    }

    // Which set each write falls in, by the sets loaded during the workflow.
    // Objects created by this workflow are invisible to others: no locks.
    let mut written: BTreeMap<SetId, Vec<Position>> = BTreeMap::new();
    for ((object, field, key), _) in writes.entries() {
        if workflow.is_created(*object) {
            continue;
        }
        let lower = workflow.containing(*object, field, key)?.lower;
        written.entry((*object, lower)).or_default().push((field.clone(), key.clone()));
    }
    let reads = workflow.reads.borrow();

    // 1. Lock, in one order: (object, lower bound).
    let mut locks: BTreeMap<&SetId, bool> = reads.keys().map(|set| (set, false)).collect();
    for set in written.keys() {
        locks.insert(set, true);
    }
    for (set, exclusive) in &locks {
        if !try_lock(set, *exclusive) {
            return Err(conflict(set, "is locked by a concurrent transaction"));
        }
    }

    // 2. Validate against the sets as committed now: read versions are
    //    unchanged, and no set starts between a written set's lower bound
    //    and the highest key written in it (a split since we loaded it).
    let mut now: HashMap<&SetId, (i64, i64)> = HashMap::new();
    for set in locks.keys() {
        if let Some(current) = catalog::entry_sets::current(set)? {
            now.insert(set, current);
        }
    }
    for (set, seen) in reads.iter() {
        match now.get(set) {
            Some((version, _)) if version == seen => {}
            Some((version, _)) => return Err(conflict(set, &format!("changed (version {seen} -> {version})"))),
            None => return Err(conflict(set, "was merged away")),
        }
    }
    for (set, keys) in &written {
        let highest = keys.iter().max().expect("a written set has keys");
        if catalog::entry_sets::split_since(set, highest)? {
            return Err(conflict(set, "was split by a concurrent transaction"));
        }
    }

    // 3. Apply, and bump the written sets in the same transaction.
    catalog::entries::apply(&writes)?;
    if written.is_empty() {
        return Ok(());
    }
    let bumped: Vec<(SetId, i64)> = SEEN_CONFLICTS.with(|seen| {
        let mut seen = seen.borrow_mut();
        written.keys().map(|set| (set.clone(), seen.remove(set).unwrap_or(0))).collect()
    });
    for (set, conflicts) in &bumped {
        catalog::entry_sets::bump(set, *conflicts)?;
    }

    // 4. Maybe split: the hotter the set, the likelier a guard at a key
    //    just written. We hold the set's exclusive lock, so no one else can
    //    be validating against it; both halves end above its old version.
    for ((set, seen), keys) in bumped.iter().zip(written.values()) {
        let Some((version, conflicts)) = now.get(set).copied() else { continue };
        let heat = 1.0 + (conflicts / 2 + seen) as f64;
        if random() >= gucs::split_chance() * heat || catalog::entry_sets::count(set.0)? >= gucs::max_entry_sets() {
            continue;
        }
        let guard = &keys[(random() * keys.len() as f64) as usize % keys.len()];
        if *guard > set.1 {
            catalog::entry_sets::insert_guard(set.0, &guard.0, &guard.1, version + 1)?;
        }
    }
    Ok(())
}

/// `lambdastore.split(object, field, key)`: inserts a guard by hand.
/// Returns false if `(field, key)` already starts a set.
pub fn split(object: i64, field: &str, key: &[u8]) -> Result<bool> {
    let (set, _) = catalog::entry_sets::around(object, field, key)?;
    if set.lower.0 == field && set.lower.1 == key {
        return Ok(false);
    }
    let id: SetId = (object, set.lower);
    if !try_lock(&id, true) {
        return Err(conflict(&id, "is locked by a concurrent transaction"));
    }
    // Check again under the lock: the set may have been split since.
    let (now, _) = catalog::entry_sets::around(object, field, key)?;
    if now.lower != id.1 {
        return Err(conflict(&id, "was split by a concurrent transaction"));
    }
    catalog::entry_sets::bump(&id, 0)?;
    catalog::entry_sets::insert_guard(object, field, key, now.version + 1)?;
    Ok(true)
}

fn random() -> f64 {
    // SAFETY: the backend's PRNG, seeded at start, used on the main thread.
    unsafe { pg_sys::pg_prng_double(&raw mut pg_sys::pg_global_prng_state) }
}
