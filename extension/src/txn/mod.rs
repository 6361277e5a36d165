//! The state of one workflow: the tree of nested calls started by one
//! top-level `lambda_invoke`, `create_object` or `invoke_static`.
//!
//! Writes are buffered here and applied only when the top-level call
//! returns successfully, so a failed workflow leaves nothing behind. Each
//! nested call takes a savepoint in the buffer: when the callee returns an
//! error of its own, its writes (and those of its callees) are undone and
//! the caller may carry on.
#![deny(unsafe_code)] // PostgreSQL's C API only through the pg module

pub(crate) mod copy;
pub(crate) mod occ;
pub(crate) mod prepared;
pub(crate) mod versions;

use lambdastore_core::model::{CallFailure, Draw, MethodCall, ModuleKey, Reply};
pub(crate) use lambdastore_core::model::{EntryKey, ObjectInfo, Slot, Spawned};
pub(crate) use lambdastore_core::txn::buffer::WriteBuffer;

use crate::access::Caller;
use crate::catalog;
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::pg;
use copy::ObjectCopy;
use lambdastore_core::txn::entry_sets::{self, EntrySet, KnownSets, Position, SetId, Touched};
use lambdastore_core::txn::tape::Tape;
use std::cell::{Cell, RefCell};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// An object with at most this many entry sets has all its guards read at
/// once (and kept by the backend until the object is split again); one
/// with more has each set read as it is touched.
const LOAD_ALL_UP_TO: usize = 1024;

/// All guards of an object with few sets: from the backend's cache when no
/// split has committed since they were read, else from the table.
fn guards_of(object: i64, splits: u64) -> Result<Option<entry_sets::Guards>> {
    if let Some(guards) = catalog::cache::guards(object, splits) {
        return Ok(Some(guards));
    }
    let Some(lowers) = catalog::guards::all_if_few(object, LOAD_ALL_UP_TO)? else { return Ok(None) };
    let guards = entry_sets::guards(lowers);
    catalog::cache::remember_guards(object, splits, &guards);
    Ok(Some(guards))
}

pub(crate) struct Workflow {
    /// The role the workflow runs for: its spawned jobs run as this role.
    pub(crate) caller: Caller,
    /// The job this workflow runs as, if any: the parent of its spawns.
    pub(crate) parent_job: Option<i64>,
    pub(crate) timeout: Duration,
    deadline: Cell<Instant>,
    /// Time spent loading code during the workflow (`not_counted`).
    loading: Cell<Duration>,
    /// Log messages written so far, and their bytes (host `log`).
    pub(crate) logged: Cell<(usize, usize)>,
    writes: RefCell<WriteBuffer>,
    /// Objects looked up or created during this workflow.
    objects: RefCell<HashMap<i64, ObjectInfo>>,
    /// The entry sets touched so far, per object, each as loaded at its
    /// first touch (before any value under it was read).
    sets: RefCell<HashMap<i64, KnownSets>>,
    /// The read set: entry sets read, with the version seen.
    reads: RefCell<BTreeMap<SetId, i64>>,
    /// A workflow run for a call forwarded to this node: what its earlier
    /// runs drew, and what this one draws (core/src/txn/tape.rs).
    tape: Option<RefCell<Tape>>,
    /// The code version of each application a call across applications
    /// reached, pinned at the first such call (host/calls.rs `callee`): a
    /// redeploy in the middle of a workflow never mixes versions, across
    /// applications and nodes too.
    versions: RefCell<BTreeMap<String, ModuleKey>>,
    /// On a light replica: the copy of the object the call runs on, which
    /// its reads use instead of the tables (copy.rs).
    copy: Option<Rc<ObjectCopy>>,
}

impl Workflow {
    pub(crate) fn new(caller: Caller, parent_job: Option<i64>, timeout: Duration) -> Self {
        Workflow {
            caller,
            parent_job,
            timeout,
            deadline: Cell::new(Instant::now() + timeout),
            loading: Cell::new(Duration::ZERO),
            logged: Cell::new((0, 0)),
            writes: RefCell::new(WriteBuffer::default()),
            objects: RefCell::new(HashMap::new()),
            sets: RefCell::new(HashMap::new()),
            reads: RefCell::new(BTreeMap::new()),
            tape: None,
            versions: RefCell::new(BTreeMap::new()),
            copy: None,
        }
    }

    /// The workflow of a call run on a light replica of `copy`'s object.
    pub(crate) fn on_copy(mut self, copy: Rc<ObjectCopy>) -> Self {
        self.copy = Some(copy);
        self
    }

    /// The replica's copy of `object`, if the workflow reads it from one.
    pub(crate) fn copy_of(&self, object: i64) -> Option<&ObjectCopy> {
        self.copy.as_deref().filter(|copy| copy.object == object)
    }

    /// Whether this workflow runs on a light replica: what only an
    /// object's owner can do is handed to it (`LambdaError::HandOver`).
    pub(crate) fn on_replica(&self) -> bool {
        self.copy.is_some()
    }

    /// What a run on a replica read of its object (each set at the
    /// version seen) and wrote (field, key, value or None), for the
    /// owner to validate and apply.
    pub(crate) fn replica_outcome(&self) -> (Vec<(Position, i64)>, Vec<(String, Vec<u8>, Option<Vec<u8>>)>) {
        let Some(copy) = &self.copy else { return Default::default() };
        let reads = self
            .reads
            .borrow()
            .iter()
            .filter(|((o, _), _)| *o == copy.object)
            .map(|((_, l), v)| (l.clone(), *v))
            .collect();
        let writes =
            self.writes.borrow().entries().map(|((_, f, k), slot)| (f.clone(), k.clone(), slot.clone())).collect();
        (reads, writes)
    }

    /// On the owner: takes the reads a run on a light replica made
    /// (`reads`, under split counter `splits`) as this workflow's own, and
    /// buffers its writes, for `occ::commit` to validate and apply.
    pub(crate) fn adopt(
        &self,
        object: i64,
        splits: u64,
        reads: Vec<(Position, i64)>,
        writes: Vec<(String, Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<()> {
        let known = match guards_of(object, splits)? {
            Some(guards) => KnownSets::complete(guards, splits),
            None => KnownSets::partial(splits),
        };
        self.sets.borrow_mut().insert(object, known);
        self.reads.borrow_mut().extend(reads.into_iter().map(|(lower, version)| ((object, lower), version)));
        for (field, key, slot) in writes {
            self.write((object, field, key), slot, gucs::max_write_bytes())?;
        }
        Ok(())
    }

    /// The version of `object`'s set at `lower` to record at its first
    /// touch: the copy's on a replica, else the owner's (`occ`).
    fn version_at_first_touch(&self, object: i64, lower: &Position) -> i64 {
        match self.copy_of(object) {
            Some(copy) => copy.version(lower),
            None => occ::version_at_first_touch(&(object, lower.clone()), self),
        }
    }

    /// The workflow of a call forwarded to this node, which replays what
    /// its earlier runs drew (`earlier`).
    pub(crate) fn replaying(mut self, earlier: Vec<Draw>) -> Self {
        self.tape = Some(RefCell::new(Tape::new(earlier)));
        self
    }

    /// The time left before the deadline (at least a millisecond).
    pub(crate) fn time_left(&self) -> Duration {
        self.deadline.get().saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
    }

    /// Moves the deadline by `spent` loading code: compiling a module a
    /// node has not run yet (seconds for a Python component) is not the
    /// lambdas' time, wherever in the workflow it happens. A call sent to
    /// another node reports its own (`loading`), which its sender adds.
    pub(crate) fn not_counted(&self, spent: Duration) {
        self.deadline.set(self.deadline.get() + spent);
        self.loading.set(self.loading.get() + spent);
    }

    /// The time this workflow spent loading code.
    pub(crate) fn loading(&self) -> Duration {
        self.loading.get()
    }

    /// A value the host makes up (a random number, the clock, an object id)
    /// by `fresh`: in a forwarded call's workflow, the one its earlier runs
    /// drew at this point if they got this far. `kind` makes the draw of a
    /// value (`Draw::Random`), `value` reads one (`Draw::random`).
    pub(crate) fn draw<T: Copy>(
        &self,
        kind: fn(T) -> Draw,
        value: fn(&Draw) -> Option<T>,
        fresh: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let Some(tape) = &self.tape else { return fresh() };
        if let Some(earlier) = tape.borrow_mut().replay(|d| value(d).is_some()).map_err(|_| diverged())? {
            return Ok(value(&earlier).expect("replay checked the kind"));
        }
        let drawn = fresh()?;
        tape.borrow_mut().record(kind(drawn));
        Ok(drawn)
    }

    /// In a forwarded call's workflow, the outcome of `call` (on another
    /// node) as an earlier run got it; when no run got this far, the
    /// workflow suspends: `Suspended` carries what to tell the node that
    /// drives the transaction (`module`: the workflow's code version).
    pub(crate) fn replay_call(&self, call: MethodCall, module: &ModuleKey) -> Result<Result<String, CallFailure>> {
        let Some(tape) = &self.tape else {
            return Err(LambdaError::Internal("a call to another node from a node that cannot send it".into()));
        };
        if let Some(outcome) = tape.borrow_mut().replay_call(&call).map_err(|_| diverged())? {
            return Ok(outcome);
        }
        let needs = Reply::Needs {
            call,
            tape: tape.borrow().drawn().to_vec(),
            touched: self.touched(),
            module: module.clone(),
            versions: self.versions(),
            loading_micros: self.loading().as_micros() as u64,
        };
        Err(LambdaError::Suspended(serde_json::to_string(&needs).map_err(|e| LambdaError::Internal(e.to_string()))?))
    }

    /// The objects this workflow has looked up, read or written.
    pub(crate) fn touched(&self) -> Vec<i64> {
        let mut objects: Vec<i64> = self.objects.borrow().keys().copied().collect();
        objects.extend(self.sets.borrow().keys().copied());
        objects.sort_unstable();
        objects.dedup();
        objects
    }

    /// Whether the workflow may go on: not if a query cancel,
    /// `statement_timeout` or a termination is pending (PostgreSQL's signal
    /// handlers only set flags) or the deadline has passed. Checked by the
    /// epoch callback while wasm runs, and inside long host work.
    pub(crate) fn keep_going(&self) -> Result<()> {
        if pg::backend::interrupt_pending() {
            return Err(LambdaError::Canceled);
        }
        if Instant::now() >= self.deadline.get() {
            let ms = self.timeout.as_millis();
            return Err(LambdaError::Timeout { ms, capped: gucs::timeout_capped(ms) });
        }
        Ok(())
    }

    /// The buffered writes, to read (a scan merges them with the table's
    /// entries); they change only through the methods below.
    pub(crate) fn writes(&self) -> std::cell::Ref<'_, WriteBuffer> {
        self.writes.borrow()
    }

    /// The buffered state of an entry: `None` if this workflow has not
    /// written it, `Some(None)` if it deleted it.
    pub(crate) fn buffered(&self, key: &EntryKey) -> Option<Slot> {
        self.writes.borrow().get(key).cloned()
    }

    /// Buffers a write (`None`: a delete), unless it would take the buffer
    /// and its journal past `max_bytes` (54000, `max_write_size`).
    pub(crate) fn write(&self, key: EntryKey, slot: Slot, max_bytes: usize) -> Result<()> {
        let size = self.writes.borrow().bytes_after(&key, slot.as_deref());
        within_write_size("the workflow's buffered writes would be", size, max_bytes)?;
        let mut writes = self.writes.borrow_mut();
        match slot {
            Some(value) => writes.put(key, value),
            None => writes.delete(key),
        }
        Ok(())
    }

    /// A savepoint of the write buffer (`rollback_to` returns to it).
    pub(crate) fn savepoint(&self) -> usize {
        self.writes.borrow().savepoint()
    }

    /// An object this workflow creates; inserted when it commits.
    pub(crate) fn create_object(&self, id: i64, info: ObjectInfo) {
        self.writes.borrow_mut().create_object(id, info.app.clone(), info.type_name.clone());
        self.remember_object(id, info);
    }

    /// Queues a call as a job when the workflow commits, unless it has
    /// spawned `max` already (54000, `max_spawns`), or its arguments would
    /// take the buffer past `max_bytes` (54000, `max_write_size`): they are
    /// server memory until the commit, as written values are.
    pub(crate) fn spawn(&self, call: Spawned, max: usize, max_bytes: usize) -> Result<()> {
        let count = self.writes.borrow().spawned().len() + 1;
        if count > max {
            return Err(LambdaError::TooMany {
                what: "calls spawned by the workflow:",
                count,
                limit: max,
                setting: "lambdastore.max_spawns",
            });
        }
        let size = self.writes.borrow().bytes_after_spawn(&call);
        within_write_size("the workflow's buffered writes and spawned calls would be", size, max_bytes)?;
        self.writes.borrow_mut().spawn(call);
        Ok(())
    }

    pub(crate) fn is_created(&self, object: i64) -> bool {
        self.writes.borrow().created().iter().any(|(id, _, _)| *id == object)
    }

    /// The entry set containing (field, key) of `object`, as of its first
    /// touch in this workflow.
    pub(crate) fn containing(&self, object: i64, field: &str, key: &[u8]) -> Result<EntrySet> {
        self.with_set(object, field, key, |touched| touched.set.clone())
    }

    /// Runs `f` on the set containing (field, key) of `object`, loading the
    /// object's sets at its first touch.
    fn with_set<R>(&self, object: i64, field: &str, key: &[u8], f: impl FnOnce(&mut Touched) -> R) -> Result<R> {
        let version = |lower: &Position| self.version_at_first_touch(object, lower);
        let mut sets = self.sets.borrow_mut();
        let known = match sets.entry(object) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => slot.insert(self.load_sets(object)?),
        };
        if let Some(touched) = known.containing(field, key, version) {
            return Ok(f(touched));
        }
        let (lower, upper) = catalog::guards::around(object, field, key)?;
        let set = EntrySet { version: version(&lower), lower };
        Ok(f(known.insert(set, upper)))
    }

    /// What is known of an object's sets when the workflow first touches it.
    fn load_sets(&self, object: i64) -> Result<KnownSets> {
        if self.is_created(object) {
            return Ok(KnownSets::fresh());
        }
        if let Some(copy) = self.copy_of(object) {
            return Ok(KnownSets::complete(copy.guards.clone(), copy.splits));
        }
        // The split counter first, then the guards (versions come later, at
        // each set's first touch), all before any value is read
        // (txn/versions.rs).
        let splits = versions::splits(object);
        Ok(match guards_of(object, splits)? {
            Some(guards) => KnownSets::complete(guards, splits),
            None => KnownSets::partial(splits),
        })
    }

    /// The split counter of each object whose sets this workflow loaded
    /// (objects it created are invisible to others and left out).
    pub(crate) fn splits_seen(&self) -> Vec<(i64, u64)> {
        let sets = self.sets.borrow();
        sets.iter().filter(|(id, _)| !self.is_created(**id)).map(|(id, known)| (*id, known.splits)).collect()
    }

    /// Records a point read (or an existence check) of (field, key). Must
    /// run before the value is read: see `occ`.
    pub(crate) fn record_read(&self, object: i64, field: &str, key: &[u8]) -> Result<()> {
        if !gucs::occ() || self.is_created(object) {
            return Ok(());
        }
        let first = self.with_set(object, field, key, |touched| {
            (!std::mem::replace(&mut touched.read, true)).then(|| touched.set.clone())
        })?;
        if let Some(set) = first {
            self.reads.borrow_mut().entry((object, set.lower)).or_insert(set.version);
        }
        Ok(())
    }

    /// Records a range scan: every set it overlaps, so that an entry
    /// inserted into the range later (a phantom) changes a version it saw.
    pub(crate) fn record_scan(&self, object: i64, field: &str, start: &[u8], end: Option<&[u8]>) -> Result<()> {
        if !gucs::occ() || self.is_created(object) {
            return Ok(());
        }
        let first = self.containing(object, field, start)?;
        let version = |lower: &Position| self.version_at_first_touch(object, lower);
        let known = self.sets.borrow_mut().get_mut(&object).and_then(|known| known.inside(field, start, end, version));
        let inside = match known {
            Some(sets) => sets,
            None => catalog::guards::inside(object, field, start, end)?
                .into_iter()
                .map(|lower| EntrySet { version: version(&lower), lower })
                .collect(),
        };
        let mut reads = self.reads.borrow_mut();
        for set in std::iter::once(first).chain(inside) {
            reads.entry((object, set.lower)).or_insert(set.version);
        }
        Ok(())
    }

    /// The code version of `app` this workflow runs, if it has run any.
    pub(crate) fn version_of(&self, app: &str) -> Option<ModuleKey> {
        self.versions.borrow().get(app).cloned()
    }

    /// Pins `versions` (an application's first wins): what the workflow
    /// runs, or what the parts of it on other nodes ran.
    pub(crate) fn pin<'a>(&self, versions: impl IntoIterator<Item = &'a ModuleKey>) {
        let mut pinned = self.versions.borrow_mut();
        for key in versions {
            if !pinned.contains_key(&key.app) {
                pinned.insert(key.app.clone(), key.clone());
            }
        }
    }

    /// Every pinned version, to send with a call to another node.
    pub(crate) fn versions(&self) -> Vec<ModuleKey> {
        self.versions.borrow().values().cloned().collect()
    }

    pub(crate) fn known_object(&self, id: i64) -> Option<ObjectInfo> {
        self.objects.borrow().get(&id).cloned()
    }

    pub(crate) fn remember_object(&self, id: i64, info: ObjectInfo) {
        self.objects.borrow_mut().insert(id, info);
    }

    /// Undoes everything after `savepoint`, including objects created since.
    pub(crate) fn rollback_to(&self, savepoint: usize) {
        let forgotten = self.writes.borrow_mut().rollback_to(savepoint);
        let mut objects = self.objects.borrow_mut();
        for id in forgotten {
            objects.remove(&id);
        }
    }
}

/// A forwarded call's run that went another way than its earlier run: a
/// value it read changed meanwhile (a concurrent commit).
fn diverged() -> LambdaError {
    LambdaError::SerializationFailure(
        "a call forwarded from another node read other values when it ran again after a call it needed on a third node"
            .into(),
    )
}

/// 54000 (`max_write_size`) when the write buffer would hold `size` bytes,
/// over `max_bytes`.
fn within_write_size(what: &'static str, size: usize, max_bytes: usize) -> Result<()> {
    if size > max_bytes {
        return Err(LambdaError::TooLarge { what, size, limit: max_bytes, setting: "lambdastore.max_write_size" });
    }
    Ok(())
}
