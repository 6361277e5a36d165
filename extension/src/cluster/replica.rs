//! Light replicas, the LambdaStore paper's way to spread a hot object's
//! compute: a node named in `lambdastore.light_replicas` for an object it
//! does not store runs that object's calls itself, on a copy of its entries,
//! instead of sending them to the owner (docs/ARCHITECTURE.md, "Light
//! replicas").
//!
//! A call on a replica makes two round trips to the owner, inside the
//! caller's transaction: `Fetch` brings the object's entry sets with their
//! versions (and its entries, when the copy this backend holds is not at
//! those versions any more), read as a workflow on the owner reads them:
//! versions first, waiting for a committing writer, then the values. The
//! lambda then runs here against the copy (txn/copy.rs), recording the
//! copy's versions, and `Commit` hands the owner its read set and writes,
//! which the owner validates and applies as it would its own workflow's
//! (`occ::commit`, locks kept to the end of the transaction, validated
//! again at COMMIT). So a copy that went stale since the fetch fails with
//! 40001, never with a wrong answer, and the owner spends on a call only
//! the fetch and the commit: the compute stays here.
//!
//! A run here reads and writes its own object only. A nested call, a spawn,
//! a timer or a new object hands the call to the owner (`HandOver`): it
//! runs there from the start, as if no replica existed; nothing of the run
//! here was sent anywhere.
//!
//! Copies are kept per backend, by object. One fetched by a transaction
//! may hold that transaction's own uncommitted writes (the owner's reads
//! see them, under versions that only move at its commit), so a copy is
//! kept for later transactions only if its transaction commits; and a
//! transaction that holds sets on the owner for writing (it wrote there,
//! by any call) always gets the entries, never "your copy is current".

use crate::access::{self, Caller, Privilege};
use crate::catalog;
use crate::cluster::{layout, remote, route};
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::txn::copy::ObjectCopy;
use crate::txn::{occ, versions, Workflow};
use crate::workflow;
use lambdastore_core::model::{Forwarded, Position, ReplicaAsk, ReplicaSnapshot};
use lambdastore_core::txn::entry_sets;
use pgrx::pg_sys::BuiltinOid::*;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// The method name a replica's request travels under in `_call_here` (no
/// method can have it: names are identifiers).
pub(crate) const REPLICA: &str = "(replica)";

/// An object with more sets than this is not copied (its guards are read
/// set by set, not all at once): its calls go to the owner.
const MAX_SETS: usize = 1024;

/// The bytes of copies a backend keeps; past it, it forgets them all.
const MAX_COPIES_BYTES: usize = 256 << 20;

#[derive(Default)]
struct Copies {
    /// Fetched by transactions that committed.
    kept: HashMap<i64, Rc<ObjectCopy>>,
    /// Fetched by this transaction.
    pending: HashMap<i64, Rc<ObjectCopy>>,
}

thread_local! {
    static COPIES: RefCell<Copies> = RefCell::new(Copies::default());
    /// (catalog generation, the objects this node is a light replica of).
    static REPLICATED_HERE: RefCell<Option<(u64, Rc<HashSet<i64>>)>> = const { RefCell::new(None) };
}

/// Runs a call from SQL of `object`, stored on `owner`, on this node if it
/// is a light replica of it; None when it is not, or when the call needs
/// the owner (`HandOver`): then it goes there as any call does.
pub(crate) fn invoke(caller: Caller, object: i64, owner: &str, method: &str, args: &str) -> Result<Option<String>> {
    if !gucs::occ() || !serves(object)? {
        return Ok(None);
    }
    let Some((snapshot, copy)) = fetch(caller, owner, object)? else { return Ok(None) };
    let finish = |workflow: &Workflow, with_writes: bool| finish(caller, owner, object, workflow, with_writes);
    match workflow::invoke_on_copy(caller, &snapshot.info, &snapshot.module, copy, method, args, finish) {
        Err(LambdaError::HandOver(_)) => Ok(None),
        outcome => {
            let result = outcome?;
            workflow::before_answer()?;
            Ok(Some(result))
        }
    }
}

/// Whether this node is a light replica of `object`.
fn serves(object: i64) -> Result<bool> {
    Ok(replicated_here()?.contains(&object))
}

/// Whether this node is a light replica of `object`, or, when the object
/// is not known yet, of any: then a call made here is not handed to
/// Citus' delegation (cluster/delegate.rs), which would send it to the
/// owner before this node could run it. Yes when the table cannot be
/// read: the call then runs here, where `lambda_invoke` reports the error.
pub(crate) fn may_run_here(object: Option<i64>) -> bool {
    replicated_here().map_or(true, |objects| object.map_or(!objects.is_empty(), |object| objects.contains(&object)))
}

/// The objects this node is a light replica of (a handful: replicas are
/// for hot objects). Remembered under the catalog generation, which
/// adding or dropping a replica moves on every node.
fn replicated_here() -> Result<Rc<HashSet<i64>>> {
    let generation = catalog::cache::generation();
    let cached = REPLICATED_HERE.with(|r| r.borrow().clone());
    if let Some((_, objects)) = cached.filter(|(seen, _)| Some(*seen) == generation) {
        return Ok(objects);
    }
    // Asked while a statement is planned too, as the session's role,
    // which may not read the table: as the tables' owner.
    let objects: HashSet<i64> = access::as_storage(|_| {
        let node = layout::this_node()?;
        catalog::query(
            "SELECT object_id FROM lambdastore.light_replicas WHERE node = $1",
            &[TEXTOID],
            &[node.as_str().into()],
            |rows| rows.into_iter().map(|row| Ok(row.get::<i64>(1)?.unwrap_or_default())).collect(),
        )
    })?;
    let objects = Rc::new(objects);
    if let Some(generation) = generation.filter(|_| catalog::cache::may_fill()) {
        REPLICATED_HERE.with(|r| *r.borrow_mut() = Some((generation, objects.clone())));
    }
    Ok(objects)
}

/// The object's sets and versions from the owner, and the copy to run on:
/// the one this backend holds when the owner found it current (the same
/// sets at the same versions), else a new one. None when the owner will not have it copied (too many sets).
fn fetch(caller: Caller, owner: &str, object: i64) -> Result<Option<(ReplicaSnapshot, Rc<ObjectCopy>)>> {
    let held = COPIES.with(|c| {
        let c = c.borrow();
        c.pending.get(&object).or_else(|| c.kept.get(&object)).cloned()
    });
    let ask = match &held {
        Some(copy) => ReplicaAsk::Fetch { splits: copy.splits, have: copy.sets() },
        None => ReplicaAsk::Fetch { splits: u64::MAX, have: Vec::new() },
    };
    let reply = ask_owner(caller, owner, object, ask, false)?;
    let mut snapshot: ReplicaSnapshot =
        serde_json::from_str(&reply).map_err(|e| LambdaError::Internal(format!("a replica's fetch answered: {e}")))?;
    if snapshot.sets.is_empty() {
        return Ok(None);
    }
    let copy = match (snapshot.entries.take(), held) {
        (Some(rows), _) => Rc::new(ObjectCopy::new(object, snapshot.splits, snapshot.sets.clone(), rows)),
        // Sent none: the copy held is at the owner's versions.
        (None, Some(held)) => held,
        (None, None) => return Err(LambdaError::Internal("the owner sent no entries for a first copy".into())),
    };
    COPIES.with(|c| c.borrow_mut().pending.insert(object, Rc::clone(&copy)));
    Ok(Some((snapshot, copy)))
}

/// The end of a run here: the owner validates its reads and applies its
/// writes (`with_writes`), in this transaction.
fn finish(caller: Caller, owner: &str, object: i64, workflow: &Workflow, with_writes: bool) -> Result<()> {
    let (reads, mut writes) = workflow.replica_outcome();
    if !with_writes {
        writes.clear();
    }
    let splits = workflow.copy_of(object).map(|copy| copy.splits).unwrap_or_default();
    let wrote = !writes.is_empty();
    ask_owner(caller, owner, object, ReplicaAsk::Commit { splits, reads, writes }, wrote).map(|_| ())
}

/// Sends `ask` to the owner of `object` in this transaction (`mark`: it
/// writes there, so the node takes part in the commit as a writer).
fn ask_owner(caller: Caller, owner: &str, object: i64, ask: ReplicaAsk, mark: bool) -> Result<String> {
    let forwarded = Forwarded { replica: Some(ask), ..Forwarded::default() };
    let context = serde_json::to_string(&forwarded).map_err(|e| LambdaError::Internal(e.to_string()))?;
    let texts = [REPLICA, "null", context.as_str()];
    let timeout = gucs::timeout(caller.is_superuser());
    route::send(remote::CALL_HERE, object, owner, texts, Vec::new(), caller, timeout, mark)
}

/// On the owner: what a light replica asked (`_call_here`), for `caller`,
/// who must be allowed to invoke the object's application.
pub(crate) fn serve(caller: Caller, object: i64, ask: ReplicaAsk) -> Result<String> {
    let (info, module) = catalog::objects::lookup(object)?;
    access::check(caller, &info.app, Privilege::Invoke)?;
    let workflow = workflow::start(caller, None, None)?;
    match ask {
        ReplicaAsk::Fetch { splits, have } => {
            // As a workflow reads: the split counter, the guards, each
            // set's version (after any committing writer), then the values.
            let now = versions::splits(object);
            let Some(lowers) = catalog::guards::all_if_few(object, MAX_SETS)? else {
                let refused = ReplicaSnapshot { info, module, splits: now, sets: Vec::new(), entries: None };
                return to_json(&refused);
            };
            let sets: Vec<(Position, i64)> = entry_sets::guards(lowers)
                .iter()
                .map(|lower| (lower.clone(), occ::version_at_first_touch(&(object, lower.clone()), &workflow)))
                .collect();
            // A transaction that wrote here reads its own writes, under
            // versions that move only at its commit: it gets the entries.
            let current = splits == now && sets == have && !versions::holding_any();
            let entries = if current { None } else { Some(catalog::entries::all(object, gucs::max_scan_bytes())?) };
            to_json(&ReplicaSnapshot { info, module, splits: now, sets, entries })
        }
        ReplicaAsk::Commit { splits, reads, writes } => {
            workflow.adopt(object, splits, reads, writes)?;
            workflow::commit(&workflow)?;
            Ok("{}".into())
        }
    }
}

fn to_json(snapshot: &ReplicaSnapshot) -> Result<String> {
    serde_json::to_string(snapshot).map_err(|e| LambdaError::Internal(e.to_string()))
}

/// At the end of every transaction: the copies it fetched are kept if it
/// committed (bounded), forgotten if not.
pub(crate) fn at_transaction_end(committed: bool) {
    COPIES.with(|c| {
        let mut c = c.borrow_mut();
        let pending = std::mem::take(&mut c.pending);
        if !committed || pending.is_empty() {
            return;
        }
        c.kept.extend(pending);
        if c.kept.values().map(|copy| copy.bytes).sum::<usize>() > MAX_COPIES_BYTES {
            c.kept.clear();
        }
    });
}
