//! Serializable workflows: Silo-style optimistic concurrency control on
//! entry sets (docs/ARCHITECTURE.md, "Serializable workflows").
//!
//! During a workflow reads take no locks: they record each entry set they
//! touch with the version seen when the object's sets were loaded, *before*
//! any value was read (so a version never describes a newer value than the
//! one read), after waiting a little for a writer that is committing the
//! set (`version_at_first_touch`). Versions live in shared memory (`versions`). At the end of
//! the workflow `commit`:
//! 1. try-locks the written sets exclusively, as transaction-level advisory
//!    locks, in one global order, never waiting; while it holds a set the
//!    transaction counts as its writer in shared memory (a workflow about
//!    to call an object on another node takes them before the call leaves,
//!    `hold_written`);
//! 2. checks, as Silo does, that no other transaction is a writer of a read
//!    set and that its version is still the one seen, and that no object
//!    it loaded sets of was split since (a split moves keys between sets).
//!    Reads take no lock: a shared lock on a hot set cost every reader a
//!    trip through one lock-manager partition, 15% of a read-only call;
//! 3. applies the writes in this PostgreSQL transaction and queues the
//!    written sets' version bumps, which the commit callback applies once
//!    the data is visible and before the locks are released;
//! 4. maybe splits a written set at the keys it wrote, with a probability
//!    that grows with its recent conflicts.
//!
//! Write locks are held until the SQL transaction ends, and every workflow
//! also validates again what the transaction's earlier workflows read, so a
//! transaction of several workflows is serializable as a whole: it is
//! serialized at its last workflow's validation. Any failure is 40001.

use super::prepared;
use super::versions::{self, Stale};
use super::Workflow;
use crate::catalog;
use crate::cluster::route;
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::pg::{self, locks::Tried};
use lambdastore_core::txn::entry_sets::{lock_key, Position, SetId};
use std::collections::BTreeMap;

/// OCC reads versions and values with fresh snapshots (READ COMMITTED per
/// statement); under a transaction snapshot its validation would read stale
/// versions and pass wrongly, so those isolation levels are refused.
pub(crate) fn check_isolation() -> Result<()> {
    if !gucs::occ() {
        return Ok(());
    }
    if versions::available() {
        prepared::sweep()?;
    } else {
        return Err(LambdaError::NotPreloaded(
            "lambdastore.concurrency_control = occ keeps entry-set versions in shared memory, which needs \
             lambdastore in shared_preload_libraries (or a superuser's SET lambdastore.concurrency_control = off)"
                .into(),
        ));
    }
    // On a hot standby nothing is written, and every call of a transaction
    // reads with one snapshot anyway (pg/standby.rs).
    if pg::xact::has_transaction_snapshot() && !pg::standby::in_recovery() {
        return Err(LambdaError::IsolationLevel(
            "lambdas need READ COMMITTED isolation: LambdaStore makes workflows serializable itself \
             (lambdastore.concurrency_control = occ); to rely on PostgreSQL's REPEATABLE READ or \
             SERIALIZABLE instead, a superuser may SET lambdastore.concurrency_control = off"
                .into(),
        ));
    }
    Ok(())
}

fn describe((object, (field, key)): &SetId) -> String {
    format!("entry set of object {object} starting at field \"{field}\" key \\x{}", hex::encode(key))
}

fn conflict(set: &SetId, why: &str) -> LambdaError {
    versions::count_conflict(set);
    LambdaError::SerializationFailure(format!("{} {why}", describe(set)))
}

/// Exclusive advisory lock on an entry set, like
/// `pg_try_advisory_xact_lock(key)`: visible in `pg_locks`, released at
/// transaction end, never waited for. While held, the transaction counts
/// as a writer of the set in shared memory, which readers check.
fn try_lock(set: &SetId) -> bool {
    match pg::locks::try_advisory_xact(lock_key(set) as u64) {
        Tried::Busy => false,
        Tried::Acquired => {
            versions::hold(set);
            true
        }
        Tried::AlreadyHeld => true,
    }
}

/// The version of `set` to record at its first touch, before any value in
/// it is read.
///
/// A set another transaction holds for writing is one that transaction is
/// committing (on a Citus cluster, usually prepared and waiting for COMMIT
/// PREPARED, a window of a few milliseconds): recording its version now
/// fails validation for certain, and the client's retry is likely to meet
/// the next writer. So the reader waits for it to end, as PostgreSQL waits
/// for a transaction holding a row it updates, bounded by
/// `lambdastore.commit_wait` and half the call's time left, then reads
/// what it committed. After the bound the version is recorded all the
/// same, and validation fails as before; an interrupt is noticed at
/// `keep_going`. A transaction that holds sets never waits (two of them
/// could wait for each other), on this node or, on a Citus cluster,
/// anywhere (`holds_sets`).
pub(crate) fn version_at_first_touch(set: &SetId, workflow: &Workflow) -> i64 {
    if versions::written_by_others(set) && !holds_sets() {
        wait_for_writers(workflow, set);
    }
    versions::version(set)
}

/// Whether this transaction holds entry sets for writing: on this node,
/// or (on a Citus cluster) on another one it reached or was sent from.
pub(crate) fn holds_sets() -> bool {
    versions::holding_any() || route::holds_sets_elsewhere()
}

/// Waits until no other transaction holds `set` for writing, at most
/// `lambdastore.commit_wait` and half the workflow's time left: a call that
/// waited must still have time to run, else a long wait would end as a
/// timeout instead of a 40001.
fn wait_for_writers(workflow: &Workflow, set: &SetId) {
    let until = std::time::Instant::now() + gucs::commit_wait().min(workflow.time_left() / 2);
    loop {
        // A prepared transaction that has ended lets go only when a sweep
        // finishes it (prepared.rs).
        prepared::finish_ended();
        let left = until.saturating_duration_since(std::time::Instant::now());
        if !versions::written_by_others(set) || left.is_zero() || workflow.keep_going().is_err() {
            break;
        }
        // Woken by the writer; a prepared one is finished by the backend
        // running COMMIT PREPARED, or by the sweep above.
        versions::wait_for_writers(set, left.min(PREPARED_SWEEP));
    }
    versions::stop_waiting();
}

/// How often a waiting reader sweeps for ended prepared transactions
/// itself, should no one else finish them.
const PREPARED_SWEEP: std::time::Duration = std::time::Duration::from_millis(5);

/// Validates the workflow and applies its writes (see the module doc).
pub(crate) fn commit(workflow: &Workflow) -> Result<()> {
    let writes = workflow.writes.borrow();
    if !gucs::occ() {
        return if writes.is_empty() { Ok(()) } else { apply(&writes, workflow, false) };
    }

    let written = written_sets(workflow, &writes)?;

    // 1. Lock the written sets, in one order: (object, lower bound).
    for set in written.keys() {
        if !try_lock(set) {
            return Err(conflict(set, "is locked by a concurrent transaction"));
        }
    }

    // 2. Validate what this workflow and the transaction's earlier ones
    //    read: no other writer holds the set and its version is the one
    //    seen; and no object whose sets were loaded has been split since
    //    (its keys may have moved to a set not recorded). A split holds the
    //    split set as a writer until it has bumped the counter.
    let splits = workflow.splits_seen();
    let now = versions::mark();
    workflow_still_as_read(workflow, &splits, now)?;
    let reads = workflow.reads.borrow();

    // 3. Apply; the written sets' versions go up once this commits.
    apply(&writes, workflow, true)?;
    for set in written.keys() {
        versions::bump_at_commit(set);
    }

    // What later workflows of this transaction must validate again, all
    // found as read at `now`. A set both read is at the same version in
    // both (both were just validated). Inserted one by one: `append`
    // rebuilds the whole map, every call of a long transaction.
    drop(reads);
    keep_for_later(workflow, splits, now);

    // 4. Maybe split: only sets of an object that has met conflicts lately
    //    (an uncontended object stays one set, however often it is
    //    written); the hotter the set, the likelier, at every key just
    //    written in it (a contended set is usually contended throughout,
    //    and one guard per commit converged slowly). We hold the set for
    //    writing, so no one else writes it and its readers fail validation
    //    until we end; every part ends above its old version.
    //    Or maybe merge, on an object that has met no conflict for a while
    //    (`versions::calm`): a set costs every call that touches it (its
    //    lock, its counters, a longer search for it), and an object once
    //    hot would keep its sets for ever. One change of the guards per
    //    commit at most.
    let mut guards_changed = false;
    for (set, keys) in &written {
        let (conflicts, object_contended) = versions::cool_down(set);
        if !object_contended {
            if !guards_changed && random() < gucs::merge_chance() && versions::calm(set.0) {
                guards_changed = merge(set)?;
            }
            continue;
        }
        if guards_changed || random() >= gucs::split_chance() * (1 + conflicts) as f64 {
            continue;
        }
        let room = gucs::max_entry_sets().saturating_sub(catalog::guards::count(set.0)?);
        let mut guards: Vec<&Position> = keys.iter().filter(|key| **key > set.1).collect();
        guards.sort();
        guards.dedup();
        for guard in guards.into_iter().take(room) {
            catalog::guards::insert_guard(set.0, &guard.0, &guard.1)?;
            versions::split_at_commit(set, &(set.0, guard.clone()));
            guards_changed = true;
        }
    }
    Ok(())
}

/// Makes `set`, which this transaction holds for writing, and a neighbour
/// one set, if the neighbour's lock is free: the guard between them goes.
/// Like a split, it fails every workflow that loaded the object's guards
/// before it commits (the split count), so none files a read under a set
/// that is gone. Returns whether it merged.
fn merge(set: &SetId) -> Result<bool> {
    let Some((kept, removed)) = catalog::guards::merge_partners(set.0, &set.1)? else { return Ok(false) };
    let (kept, removed): (SetId, SetId) = ((set.0, kept), (set.0, removed));
    let neighbour = if removed == *set { &kept } else { &removed };
    if !try_lock(neighbour) {
        return Ok(false);
    }
    catalog::guards::delete_guard(set.0, &removed.1)?;
    versions::merge_at_commit(&kept, &removed);
    Ok(true)
}

/// Which set each write falls in, by the sets loaded during the workflow,
/// with the positions written in it. Objects created by this workflow are
/// invisible to others: no locks.
fn written_sets(workflow: &Workflow, writes: &super::WriteBuffer) -> Result<BTreeMap<SetId, Vec<Position>>> {
    let mut written: BTreeMap<SetId, Vec<Position>> = BTreeMap::new();
    for ((object, field, key), _) in writes.entries() {
        if workflow.is_created(*object) {
            continue;
        }
        let lower = workflow.containing(*object, field, key)?.lower;
        written.entry((*object, lower)).or_default().push((field.clone(), key.clone()));
    }
    Ok(written)
}

/// Before a nested call to another node: takes the write locks of the
/// sets `workflow` has written so far, where they are free. The call is a
/// round trip or more, and a concurrent workflow that read one of those
/// sets meanwhile would read a version this transaction is about to
/// change and fail at validation (a transfer across two nodes failed 5%
/// of the time, each failure a client's retry). Held, the set makes that
/// reader wait for this transaction to end (`version_at_first_touch`), as
/// a row lock makes a concurrent UPDATE wait, and it reads what this one
/// wrote. A set another transaction holds is left for `commit`: never
/// waited for, so no lock order matters. Holding a set longer only ever
/// makes others fail or wait, never miss a change.
pub(crate) fn hold_written(workflow: &Workflow) -> Result<()> {
    if !gucs::occ() {
        return Ok(());
    }
    for set in written_sets(workflow, &workflow.writes.borrow())?.keys() {
        try_lock(set);
    }
    Ok(())
}

/// Checks that every set read is still at the version seen, with no other
/// writer, and that no object whose guards were loaded was split since.
fn still_as_read<'a>(
    reads: impl Iterator<Item = (&'a SetId, &'a i64)>,
    splits: impl Iterator<Item = (&'a i64, &'a u64)>,
) -> Result<()> {
    let mut reads = reads.peekable();
    // A prepared transaction still counts as the writer of its sets after
    // COMMIT PREPARED until a sweep finishes it.
    prepared::finish_ended();
    // Prepared transactions that survived a restart may have written any
    // set (prepared.rs).
    if let Some((set, _)) = reads.peek().filter(|_| prepared::blocked()) {
        return Err(conflict(
            set,
            "may have been written by a transaction prepared before the server restarted whose entry sets are \
             unknown (see lambdastore.prepared())",
        ));
    }
    for (set, seen) in reads {
        match versions::unchanged(set, *seen) {
            Ok(()) => {}
            // Sets share version counters (stripes): say so, since the set
            // named may be one nobody touched.
            Err(Stale::Written) => {
                // A prepared transaction stays until someone ends it: name
                // it, so that an operator can (README "Prepared transactions").
                if let Some(xid) = prepared::holder_of(set) {
                    return Err(conflict(set, &held_by_prepared(xid)));
                }
                return Err(conflict(
                    set,
                    "is being written by a concurrent transaction (or a set sharing its version counter is)",
                ));
            }
            Err(Stale::Changed(now)) => {
                return Err(conflict(
                    set,
                    &format!("changed (version {seen} -> {now}; or a set sharing its version counter did)"),
                ));
            }
        }
    }
    for (object, seen) in splits {
        if versions::splits(*object) != *seen {
            return Err(conflict(&(*object, Position::default()), "was split or merged by a concurrent transaction"));
        }
    }
    Ok(())
}

/// What later workflows of this transaction (and on Citus, the rounds
/// that validate every node before an answer or the commit) must validate
/// again: `workflow`'s reads, all found as read at `now`.
fn keep_for_later(workflow: &Workflow, splits: Vec<(i64, u64)>, now: versions::Mark) {
    versions::validated(|earlier| {
        for (set, seen) in std::mem::take(&mut *workflow.reads.borrow_mut()) {
            earlier.reads.entry(set).or_insert(seen);
        }
        for (object, seen) in splits {
            earlier.splits.entry(object).or_insert(seen);
        }
        earlier.checked = Some(now);
    });
}

/// A workflow's failure, as the caller may see it: a lambda's `Err`, a
/// trap or a limit reached after reads is an answer computed from those
/// reads, and is given only if they are still as read (with the
/// transaction's earlier reads); else the failure becomes 40001, which the
/// client retries. Without this, an error could come from values read at
/// two different moments, an answer no serial order gives (the property
/// the TM literature calls opacity); the bank's `withdraw_if_covered` said
/// "not covered: balance 0 + 0 < 100" while every committed state held
/// 100. Nothing is locked: a failed workflow writes nothing.
pub(crate) fn failed(workflow: &Workflow, failure: LambdaError) -> LambdaError {
    if !gucs::occ() || !versions::available() || !computed_from_reads(&failure) {
        return failure;
    }
    let (splits, now) = (workflow.splits_seen(), versions::mark());
    // On a Citus node that drives the transaction, what its calls read on
    // other nodes counts too (a nested call's answer came from there).
    match workflow_still_as_read(workflow, &splits, now).and_then(|_| reads_elsewhere_hold()) {
        Ok(()) => {
            // The failure is an answer the transaction goes on from (a
            // caller on the node that sent this call may handle it and
            // commit): what it was computed from must hold at the end too.
            keep_for_later(workflow, splits, now);
            failure
        }
        Err(LambdaError::SerializationFailure(why)) => LambdaError::SerializationFailure(format!(
            "{why}; the call's failure, computed from what it read, is not an answer: {failure}"
        )),
        Err(other) => other,
    }
}

/// On the node driving a Citus transaction: every other node it ran calls
/// on checks what they read, now (an answer is about to leave); 40001 if
/// something changed. A node a call arrived at answers to the node that
/// sent it, which does this.
pub(crate) fn reads_elsewhere_hold() -> Result<()> {
    if !gucs::occ() || !versions::available() || route::arrived() {
        return Ok(());
    }
    route::validate_reached()
}

/// Checks, at `now`, what `workflow` read (`splits`: the split counts of
/// the objects whose sets it loaded) and what the transaction's earlier
/// workflows read: at commit and before a failure leaves.
fn workflow_still_as_read(workflow: &Workflow, splits: &[(i64, u64)], now: versions::Mark) -> Result<()> {
    let reads = workflow.reads.borrow();
    versions::validated(|earlier| {
        let recheck = earlier.may_have_changed(now);
        let earlier_reads = recheck.then(|| earlier.reads.iter()).into_iter().flatten();
        let earlier_splits = recheck.then(|| earlier.splits.iter()).into_iter().flatten();
        still_as_read(reads.iter().chain(earlier_reads), splits.iter().map(|(o, s)| (o, s)).chain(earlier_splits))
    })
}

/// Whether a failure is one a lambda's run computed (so its reads decide
/// whether it stands): not a cancel, a conflict already, an object that
/// moved, a run stopped for another node, or an internal error.
pub(crate) fn computed_from_reads(failure: &LambdaError) -> bool {
    use LambdaError::*;
    match failure {
        Canceled | SerializationFailure(_) | Moved { .. } | Suspended(_) | HandOver(_) | Internal(_) => false,
        Remote { code, .. } => !matches!(
            code,
            pgrx::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE | pgrx::PgSqlErrorCode::ERRCODE_QUERY_CANCELED
        ),
        _ => true,
    }
}

/// Why a set held by prepared transaction `xid` fails validation: its gid
/// when a statement runs (a snapshot is needed to ask `pg_prepared_xacts`;
/// at PREPARE and COMMIT, where validation runs again, there is none, and
/// a query there failed with XX000 instead of 40001), else its XID.
fn held_by_prepared(xid: u32) -> String {
    let snapshot = pg::xact::has_snapshot();
    let gid = snapshot.then(|| catalog::prepared_gid(xid).ok().flatten()).flatten();
    let which = gid.map_or(format!("with XID {xid}"), |gid| format!("'{gid}'"));
    // On Citus the transaction is this node's, and lambdastore.prepared()
    // lists only the node's own.
    let node = snapshot.then(|| crate::cluster::layout::this_node().ok()).flatten().filter(|node| node != "local");
    let (on, there) = node.map_or((String::new(), ""), |node| (format!(" on {node}"), " there"));
    format!(
        "is held by prepared transaction {which}{on} until it is committed or rolled back \
         (COMMIT PREPARED or ROLLBACK PREPARED{there}; see lambdastore.prepared(){there})"
    )
}

/// At PREPARE (and, on the node that commits a distributed transaction,
/// at its commit): validates again everything this transaction's
/// workflows read. By now every node's part has taken its write locks;
/// reads still as read at this point were unchanged from when they were
/// read to now, which includes the moment the last lock was taken, where
/// the distributed transaction is serialized.
pub(crate) fn validate_again() -> Result<()> {
    if !gucs::occ() || !versions::available() {
        return Ok(());
    }
    let now = versions::mark();
    versions::validated(|earlier| {
        if !earlier.may_have_changed(now) {
            return Ok(());
        }
        still_as_read(earlier.reads.iter(), earlier.splits.iter())?;
        earlier.checked = Some(now);
        Ok(())
    })
}

/// At COMMIT of a transaction that wrote through lambdas on this node:
/// makes the order of commit records agree with the serial order, which a
/// hot standby shows (it makes a transaction visible when it replays the
/// commit record, and a reader there has no versions to validate).
///
/// A transaction T1 that read x is serialized before T2 that later wrote
/// x. Without this, T1 validated when its call ended, T2 could write x and
/// commit first, and a reader on a standby replaying between the two saw
/// T2's x without T1's writes: a state of no serial order. So T1 marks its
/// reads as committing, then validates them again (40001 if T2 wrote x
/// first); T2, before its commit record, waits until no reader of what it
/// wrote is committing. Read-only transactions write no commit record and
/// need neither. On Citus, standbys of nodes are not read from: a node's
/// part of a transaction another node drives is left alone (Citus reports
/// a part's failed COMMIT as XX000, not as its 40001), and a prepared
/// transaction's reads are not marked.
pub(crate) fn before_commit() -> Result<()> {
    if !gucs::occ() || !versions::available() || !versions::holding_any() || route::arrived() {
        return Ok(());
    }
    versions::wait_for_committing_readers();
    versions::validated(|earlier| versions::mark_committing(earlier.reads.keys()));
    validate_again()
}

/// `exclusive`: the written sets are locked for writing (step 1).
fn apply(writes: &super::WriteBuffer, workflow: &Workflow, exclusive: bool) -> Result<()> {
    catalog::entries::apply(writes.created(), writes.entries(), exclusive, || workflow.keep_going())
}

/// `lambdastore.split(object, field, key)`: inserts a guard by hand.
/// Returns false if `(field, key)` already starts a set.
pub(crate) fn split(object: i64, field: &str, key: &[u8]) -> Result<bool> {
    let (lower, _) = catalog::guards::around(object, field, key)?;
    if lower.0 == field && lower.1 == key {
        return Ok(false);
    }
    let id: SetId = (object, lower);
    if !try_lock(&id) {
        return Err(conflict(&id, "is locked by a concurrent transaction"));
    }
    // Check again under the lock: the set may have been split since.
    let (now, _) = catalog::guards::around(object, field, key)?;
    if now != id.1 {
        return Err(conflict(&id, "was split by a concurrent transaction"));
    }
    catalog::guards::insert_guard(object, field, key)?;
    versions::split_at_commit(&id, &(object, (field.to_string(), key.to_vec())));
    Ok(true)
}

/// Holds every entry set of `object` for writing until the transaction
/// ends, and moves all their versions on when it commits, as a workflow
/// writing each of them would: `delete_object` deletes every entry. A
/// workflow that read the object meanwhile fails validation, and one that
/// writes it fails to lock (40001, never waiting), instead of waiting on
/// the deleted rows and then meeting their foreign key to an object that
/// is gone (23503); the delete itself fails so if one holds a set. Like a
/// write, it may then be prepared only by a superuser (prepared.rs).
pub(crate) fn hold_whole_object(object: i64) -> Result<()> {
    if !gucs::occ() {
        return Ok(());
    }
    let mut lowers = catalog::guards::all_if_few(object, i32::MAX as usize)?.unwrap_or_default();
    // Every object has a set from ("", ""); one created by hand might not.
    lowers.push(Position::default());
    lowers.sort();
    lowers.dedup();
    for lower in lowers {
        let set = (object, lower);
        if !try_lock(&set) {
            return Err(conflict(&set, "is locked by a concurrent transaction"));
        }
        versions::bump_at_commit(&set);
    }
    Ok(())
}

fn random() -> f64 {
    pg::backend::random_f64()
}
