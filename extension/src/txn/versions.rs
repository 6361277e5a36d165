//! Entry-set versions, recent-conflict counts and per-object split
//! counters, in shared memory: what OCC reads at every first touch and
//! every validation, and writes at every commit. In a table they cost a
//! statement each, and every write commit updated the same hot row.
//!
//! The counters are striped: a set's live at hash(database, object, lower
//! bound) mod `STRIPES`, an object's split count at hash(database, object)
//! mod `OBJECT_STRIPES`. Sets sharing a stripe share counters, so a write
//! to one looks like a change of the other: a false conflict, never a
//! missed one. A transaction's chance of one grows with the sets it has
//! read, so there are many stripes (33 MB of shared memory): with 65,536,
//! 7 of 20 statements of 100 read-only calls failed beside a write load.
//!
//! A version must never be visible before its data. Writes and splits
//! therefore only queue their bumps here; the commit callback applies them
//! after the transaction's rows have become visible and before its
//! entry-set locks are released (PostgreSQL calls commit callbacks between
//! the two). A reader that recorded the old version then fails validation;
//! one that loads the new version reads the new data. An aborted
//! transaction's bumps are dropped.
//!
//! A split moves keys to a new set, so a workflow that loaded the object's
//! guards before the split became visible would file later reads under the
//! old set. Each object has a split counter, read before its guards and
//! bumped after a split commits, that validation checks as well.
//!
//! A reader about to read a set that another transaction holds for writing
//! waits for it (occ.rs, `version_at_first_touch`) on one of `WAKEUPS` condition
//! variables, which every writer broadcasts as it lets go of a stripe.
//!
//! Counters reset when the server restarts, with no transaction in flight.

use crate::pg::shmem::Zeroed;
use crate::pg::{self, backend::Condition};
use lambdastore_core::txn::entry_sets::{lock_key, SetId};
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

const STRIPES: usize = 1 << 20;

/// Splits are rare: fewer stripes for the objects' split counts.
const OBJECT_STRIPES: usize = 1 << 16;

/// Condition variables readers wait on for a stripe's writers (stripe mod
/// `WAKEUPS`): a waiter woken for another stripe checks again and sleeps on.
const WAKEUPS: usize = 1024;

/// All zeros at server start (see `Zeroed`).
pub(crate) struct Stripes {
    stripes: [Stripe; STRIPES],
    objects: [ObjectStripe; OBJECT_STRIPES],
    /// Write locks taken and commits that bumped anything, in every
    /// database: what tells a transaction of many calls that its earlier
    /// reads need no second check (see `Validated`).
    changes: AtomicU64,
    wakeups: [Condition; WAKEUPS],
}

/// One stripe's counters, side by side in one cache line: a call reads
/// the version and the writer count of every set it touches, and a write
/// also the others. In four arrays of a million, each touch of a set cost
/// four cache and TLB misses; the loads of `version` and
/// `written_by_others` were the largest items of lambdastore.so in a
/// profile of writes to objects of many sets (docs/PERFORMANCE.md).
#[repr(C, align(32))]
struct Stripe {
    version: AtomicU64,
    /// Transactions holding a set of this stripe for writing: Silo's lock
    /// bit, which readers check instead of taking a lock.
    writers: AtomicU32,
    /// Transactions committing (between their last validation and the end
    /// of their commit) that read a set of this stripe: a writer of the
    /// stripe waits for them before it commits (`wait_for_committing_readers`).
    committing_readers: AtomicU32,
    conflicts: AtomicU32,
}

/// An object stripe's counters, side by side for the same reason.
#[repr(C, align(16))]
struct ObjectStripe {
    splits: AtomicU64,
    /// Conflicts on any of the object's sets, slowly forgotten (see
    /// `cool_down`): whether the object is contended at all.
    conflicts: AtomicU32,
    /// When one of the object's sets last met a conflict, in seconds since
    /// 1970: an object is merged back only once it has been calm for a
    /// while (`calm`).
    last_conflict: AtomicU32,
}

// SAFETY: the name is unique to this extension.
static SHARED: Zeroed<Stripes> = Zeroed::then(c"lambdastore_entry_set_versions", |stripes| {
    for wakeup in &stripes.wakeups {
        wakeup.init();
    }
});
static ENABLED: AtomicBool = AtomicBool::new(false);

enum Pending {
    /// A written set: one more version.
    Write(usize),
    /// A split: the old set and the object move on, and the new set's
    /// version ends above the old one's.
    Split { old: usize, new: usize, object: usize },
}

/// What earlier workflows of the current transaction validated: each later
/// workflow validates it again, so that a transaction of several workflows
/// is serializable as a whole.
#[derive(Default)]
pub(crate) struct Validated {
    pub(crate) reads: BTreeMap<SetId, i64>,
    pub(crate) splits: HashMap<i64, u64>,
    /// Taken before the last validation, which found all of the above as
    /// read.
    pub(crate) checked: Option<Mark>,
}

impl Validated {
    /// Whether the reads and splits above may have changed since they were
    /// last checked: another transaction has taken a write lock or
    /// committed since `checked`. If not, they are still as read, and a
    /// transaction of n calls does not check every earlier read again at
    /// every call (n² checks: 8,000 calls in one statement took 1.6 s).
    pub(crate) fn may_have_changed(&self, now: Mark) -> bool {
        self.checked.is_none_or(|then| now.changes - then.changes != now.own - then.own)
    }
}

/// A point in the shared change count, and how much of it is this
/// backend's own write locks (which leave its reads valid).
#[derive(Clone, Copy)]
pub(crate) struct Mark {
    changes: u64,
    own: u64,
}

/// Where the change count stands now. Taken before a validation, so that
/// a change it does not include is seen by that validation or the next.
pub(crate) fn mark() -> Mark {
    let changes = shared().map_or(0, |s| s.changes.load(Ordering::SeqCst));
    Mark { changes, own: OWN_LOCKS.get() }
}

thread_local! {
    static PENDING: RefCell<Vec<Pending>> = const { RefCell::new(Vec::new()) };
    /// Stripes this transaction counts itself a writer of, and how often.
    static HELD: RefCell<HashMap<usize, u32>> = RefCell::new(HashMap::new());
    static VALIDATED: RefCell<Validated> = RefCell::new(Validated::default());
    /// Write locks this backend has added to the shared change count.
    static OWN_LOCKS: Cell<u64> = const { Cell::new(0) };
    /// Stripes this transaction counts itself a committing reader of.
    static COMMITTING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Requests the shared memory; from `_PG_init`, while preloading.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests the features of every PostgreSQL version
pub(crate) fn request_shared_memory() {
    pgrx::pg_shmem_init!(SHARED = false);
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether the counters exist: OCC needs `shared_preload_libraries`.
pub(crate) fn available() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// After the commit record, once the transaction's rows are visible and
/// before its locks are released: applies the queued bumps. Must not fail:
/// it only adds to atomics.
pub(crate) fn at_commit() {
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    apply(&pending);
}

fn apply(pending: &[Pending]) {
    let Some(shared) = shared() else { return };
    for change in pending {
        match *change {
            Pending::Write(set) => {
                shared.stripes[set].version.fetch_add(1, Ordering::SeqCst);
            }
            Pending::Split { old, new, object } => {
                let version = shared.stripes[old].version.fetch_add(1, Ordering::SeqCst) + 1;
                shared.stripes[new].version.fetch_max(version, Ordering::SeqCst);
                shared.objects[object].splits.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    // After the bumps: a reader that finds the count unmoved would have
    // found the versions unmoved too.
    if !pending.is_empty() {
        shared.changes.fetch_add(1, Ordering::SeqCst);
    }
}

// A prepared transaction's state as plain numbers (prepared.rs keeps them
// in shared memory): the top two bits say what the rest is.
const HELD_ENTRY: u64 = 0;
const WRITE_ENTRY: u64 = 1 << 62;
const SPLIT_ENTRY: u64 = 2 << 62;
const STRIPE_BITS: u32 = STRIPES.trailing_zeros();

/// How many numbers `take_for_prepare` would return.
pub(crate) fn prepared_len() -> usize {
    HELD.with(|h| h.borrow().len()) + PENDING.with(|p| p.borrow().len())
}

/// At PREPARE: this transaction's writer counts and queued bumps, which
/// it no longer releases or applies itself (`finish_prepared` does).
pub(crate) fn take_for_prepare() -> Vec<u64> {
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let held = held.into_iter().map(|(stripe, count)| HELD_ENTRY | (stripe as u64) << 32 | u64::from(count));
    let pending = pending.into_iter().map(|change| match change {
        Pending::Write(set) => WRITE_ENTRY | set as u64,
        Pending::Split { old, new, object } => {
            SPLIT_ENTRY | old as u64 | (new as u64) << STRIPE_BITS | (object as u64) << (2 * STRIPE_BITS)
        }
    });
    held.chain(pending).collect()
}

/// Once a prepared transaction has ended: its bumps if it committed (its
/// rows are visible by now), then its writer counts.
pub(crate) fn finish_prepared(entries: &[u64], committed: bool) {
    let Some(shared) = shared() else { return };
    let stripe_mask = (1u64 << STRIPE_BITS) - 1;
    let mut pending = Vec::new();
    for entry in entries {
        match entry & (3 << 62) {
            HELD_ENTRY => {}
            WRITE_ENTRY => pending.push(Pending::Write((entry & stripe_mask) as usize)),
            _ => pending.push(Pending::Split {
                old: (entry & stripe_mask) as usize,
                new: (entry >> STRIPE_BITS & stripe_mask) as usize,
                object: (entry >> (2 * STRIPE_BITS) & (OBJECT_STRIPES as u64 - 1)) as usize,
            }),
        }
    }
    if committed {
        apply(&pending);
    }
    for entry in entries.iter().filter(|e| *e & (3 << 62) == HELD_ENTRY) {
        let (stripe, count) = ((entry >> 32) as usize & (STRIPES - 1), *entry as u32);
        shared.stripes[stripe].writers.fetch_sub(count, Ordering::SeqCst);
        wake(shared, stripe);
    }
}

/// After a restart, a prepared transaction's writer counts, from the
/// numbers `take_for_prepare` gave (prepared.rs keeps them on disk): its
/// sets count as written again until it ends.
pub(crate) fn hold_again(entries: &[u64]) {
    let Some(shared) = shared() else { return };
    for entry in entries.iter().filter(|e| *e & (3 << 62) == HELD_ENTRY) {
        let (stripe, count) = ((entry >> 32) as usize & (STRIPES - 1), *entry as u32);
        shared.stripes[stripe].writers.fetch_add(count, Ordering::SeqCst);
    }
}

/// Whether `entries` (as `take_for_prepare` gave them) hold the writer
/// count of `set`'s stripe.
pub(crate) fn holds(entries: &[u64], set: &SetId) -> bool {
    let stripe = stripe(set) as u64;
    entries.iter().any(|e| e & (3 << 62) == HELD_ENTRY && (e >> 32) & (STRIPES as u64 - 1) == stripe)
}

/// How many writer counts (entry-set locks) `entries` hold.
pub(crate) fn held_count(entries: &[u64]) -> usize {
    entries.iter().filter(|e| *e & (3 << 62) == HELD_ENTRY).count()
}

/// A prepared transaction whose sets are unknown (it survived a restart)
/// committed: every version and split count moves on.
pub(crate) fn bump_everything() {
    let Some(shared) = shared() else { return };
    for stripe in &shared.stripes {
        stripe.version.fetch_add(1, Ordering::SeqCst);
    }
    for object in &shared.objects {
        object.splits.fetch_add(1, Ordering::SeqCst);
    }
    shared.changes.fetch_add(1, Ordering::SeqCst);
}

/// At abort (or once prepared): no bumps.
pub(crate) fn at_abort() {
    PENDING.with(|p| p.borrow_mut().clear());
}

/// Once the transaction's locks are released (after its bumps, at
/// commit): stops counting it as a writer and as a committing reader, and
/// forgets what it validated. So a set's lock is never free while no
/// writer is counted: a reader woken here, or one that saw no writer,
/// finds it free at its own commit. (Dropped in the commit callback,
/// before PostgreSQL releases the locks, the count let a woken reader
/// reach its commit first under load and fail: "is locked by a concurrent
/// transaction", by a transaction already committed.)
pub(crate) fn at_locks_released() {
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let committing = COMMITTING.with(|c| std::mem::take(&mut *c.borrow_mut()));
    if let Some(shared) = shared() {
        for (stripe, count) in held {
            shared.stripes[stripe].writers.fetch_sub(count, Ordering::SeqCst);
            wake(shared, stripe);
        }
        for stripe in committing {
            shared.stripes[stripe].committing_readers.fetch_sub(1, Ordering::SeqCst);
            wake(shared, stripe);
        }
    }
    VALIDATED.with(|v| *v.borrow_mut() = Validated::default());
}

/// Wakes the readers waiting for a writer of `stripe` to let go. Must not
/// fail (it runs at commit): a spinlock and setting latches.
fn wake(shared: &Stripes, stripe: usize) {
    shared.wakeups[stripe % WAKEUPS].broadcast();
}

fn shared() -> Option<&'static Stripes> {
    available().then(|| SHARED.get())
}

fn database() -> u64 {
    u64::from(pg::backend::database_id())
}

fn stripe(set: &SetId) -> usize {
    let hash = (lock_key(set) as u64) ^ database().wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (hash % STRIPES as u64) as usize
}

fn object_stripe(object: i64) -> usize {
    let hash = (object as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ database();
    (hash.rotate_left(29) % OBJECT_STRIPES as u64) as usize
}

/// The set's version now (0 without shared memory).
pub(crate) fn version(set: &SetId) -> i64 {
    shared().map_or(0, |s| s.stripes[stripe(set)].version.load(Ordering::SeqCst) as i64)
}

/// How many splits of the object have committed (0 without shared memory).
pub(crate) fn splits(object: i64) -> u64 {
    shared().map_or(0, |s| s.objects[object_stripe(object)].splits.load(Ordering::SeqCst))
}

/// The set's recent conflicts: a count halved at every committed write.
pub(crate) fn conflicts(set: &SetId) -> i64 {
    shared().map_or(0, |s| i64::from(s.stripes[stripe(set)].conflicts.load(Ordering::Relaxed)))
}

/// What one conflict adds to its object's count, and so how many committed
/// writes of the object's sets it takes to forget it. It forgets slowly
/// because a hot object's sets, once split fine, conflict rarely each while
/// the object as a whole still does.
const OBJECT_MEMORY: u32 = 16;

/// A workflow failed validation on this set.
pub(crate) fn count_conflict(set: &SetId) {
    if let Some(s) = shared() {
        s.stripes[stripe(set)].conflicts.fetch_add(1, Ordering::Relaxed);
        let object = &s.objects[object_stripe(set.0)];
        object.conflicts.fetch_add(OBJECT_MEMORY, Ordering::Relaxed);
        object.last_conflict.store(now_seconds(), Ordering::Relaxed);
    }
}

/// How long an object must meet no conflict before its sets are merged.
/// The count `cool_down` keeps forgets too fast for that: a hot object
/// split into a thousand sets conflicts so rarely per write that the count
/// is mostly zero, and merging there (tried: at 1% of writes) held the
/// contention benchmark's object at ~360 sets and 0.77 of the best guard
/// count, against ~650 and 0.96 without merges.
const CALM: u32 = 10;

/// Whether the object has met no conflict for `CALM` seconds (an object
/// that shares its stripe with a contended one waits as if it were).
pub(crate) fn calm(object: i64) -> bool {
    shared().is_none_or(|s| {
        let last = s.objects[object_stripe(object)].last_conflict.load(Ordering::Relaxed);
        now_seconds().saturating_sub(last) >= CALM
    })
}

fn now_seconds() -> u32 {
    (pg::backend::now_unix_micros() / 1_000_000) as u32
}

/// A write to the set committed: halves the set's conflict count and takes
/// one off its object's. Returns the set's count before, and whether the
/// object had met conflicts lately (an object that never did is never
/// split). Heuristic only, so it need not wait for the commit.
pub(crate) fn cool_down(set: &SetId) -> (i64, bool) {
    shared().map_or((0, false), |s| {
        let update = |counter: &AtomicU32, f: fn(u32) -> u32| {
            counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(f(c))).unwrap_or(0)
        };
        let set_count = update(&s.stripes[stripe(set)].conflicts, |c| c / 2);
        let object_count = update(&s.objects[object_stripe(set.0)].conflicts, |c| c.saturating_sub(1));
        (i64::from(set_count), object_count > 0)
    })
}

/// This transaction has just taken the set's exclusive lock: readers of
/// the set fail validation until it ends. (Also after a subtransaction
/// rollback released the lock early: only false conflicts, until the end.)
pub(crate) fn hold(set: &SetId) {
    let stripe = stripe(set);
    if let Some(shared) = shared() {
        shared.stripes[stripe].writers.fetch_add(1, Ordering::SeqCst);
        // After the writer count, for the same reason as the bumps.
        shared.changes.fetch_add(1, Ordering::SeqCst);
        OWN_LOCKS.set(OWN_LOCKS.get() + 1);
        HELD.with(|h| *h.borrow_mut().entry(stripe).or_default() += 1);
    }
}

/// Whether a transaction other than this one holds the set for writing.
pub(crate) fn written_by_others(set: &SetId) -> bool {
    let Some(shared) = shared() else { return false };
    let stripe = stripe(set);
    let ours = HELD.with(|h| h.borrow().get(&stripe).copied().unwrap_or(0));
    shared.stripes[stripe].writers.load(Ordering::SeqCst) > ours
}

/// Whether this transaction holds any entry set for writing on this node.
pub(crate) fn holding_any() -> bool {
    HELD.with(|h| !h.borrow().is_empty())
}

/// Sleeps until a writer of the set's stripe (or of one sharing its
/// condition variable) lets go, or `timeout` passes. The first call only
/// prepares to sleep, so that a wake-up between the caller's check and the
/// sleep is not lost: call it in a loop that checks first, then
/// `stop_waiting`. Shown in `pg_stat_activity` as wait event `Extension`.
pub(crate) fn wait_for_writers(set: &SetId, timeout: std::time::Duration) {
    let Some(shared) = shared() else { return };
    let millis = timeout.as_millis().clamp(1, i64::MAX as u128) as i64;
    shared.wakeups[stripe(set) % WAKEUPS].sleep(millis);
}

/// At COMMIT, before the commit record: waits until no transaction that
/// read a set this one holds for writing is committing (see
/// `mark_committing`), so that this commit record follows theirs. They are
/// past their last wait, so they never wait for this one. Interrupts are
/// checked while it sleeps.
pub(crate) fn wait_for_committing_readers() {
    let Some(shared) = shared() else { return };
    let held: Vec<usize> = HELD.with(|h| h.borrow().keys().copied().collect());
    for stripe in held {
        while shared.stripes[stripe].committing_readers.load(Ordering::SeqCst) > 0 {
            shared.wakeups[stripe % WAKEUPS].sleep(10);
        }
    }
    stop_waiting();
}

/// At COMMIT, after `wait_for_committing_readers` and before validating
/// again: this transaction counts as a committing reader of `reads` until
/// it ends. A writer of one of them either took its lock before (and this
/// transaction's validation, which follows, fails) or waits at its own
/// commit until this one's commit record is written.
pub(crate) fn mark_committing<'a>(reads: impl Iterator<Item = &'a SetId>) {
    let Some(shared) = shared() else { return };
    COMMITTING.with(|c| {
        let mut committing = c.borrow_mut();
        for set in reads {
            let stripe = stripe(set);
            shared.stripes[stripe].committing_readers.fetch_add(1, Ordering::SeqCst);
            committing.push(stripe);
        }
    });
}

/// Ends the waiting `wait_for_writers` began.
pub(crate) fn stop_waiting() {
    pg::backend::cancel_sleep();
}

/// Why a read set is no longer as read.
pub(crate) enum Stale {
    /// Another transaction holds it for writing.
    Written,
    /// Its version has moved to this one.
    Changed(i64),
}

/// Whether a set read at version `seen` is still as read. The writer count
/// is read first: a writer's data becomes visible only while it counts,
/// and it stops counting only after its bump.
pub(crate) fn unchanged(set: &SetId, seen: i64) -> std::result::Result<(), Stale> {
    let Some(shared) = shared() else { return Ok(()) };
    if written_by_others(set) {
        return Err(Stale::Written);
    }
    match shared.stripes[stripe(set)].version.load(Ordering::SeqCst) as i64 {
        now if now == seen => Ok(()),
        now => Err(Stale::Changed(now)),
    }
}

/// Runs `f` on what earlier workflows of this transaction validated.
pub(crate) fn validated<R>(f: impl FnOnce(&mut Validated) -> R) -> R {
    VALIDATED.with(|v| f(&mut v.borrow_mut()))
}

/// The set's version goes up when this transaction commits.
pub(crate) fn bump_at_commit(set: &SetId) {
    let set = stripe(set);
    PENDING.with(|p| p.borrow_mut().push(Pending::Write(set)));
}

/// A guard at `new` splits `old` when this transaction commits.
pub(crate) fn split_at_commit(old: &SetId, new: &SetId) {
    let change = Pending::Split { old: stripe(old), new: stripe(new), object: object_stripe(old.0) };
    PENDING.with(|p| p.borrow_mut().push(change));
}

/// `removed` becomes part of `kept` when this transaction commits: both
/// versions move on, `kept`'s to at least `removed`'s, and so does the
/// object's split count, which fails every workflow that loaded the guards
/// before (it may have filed reads under `removed`).
pub(crate) fn merge_at_commit(kept: &SetId, removed: &SetId) {
    let (kept_stripe, object) = (stripe(kept), object_stripe(kept.0));
    PENDING.with(|p| {
        let mut pending = p.borrow_mut();
        pending.push(Pending::Write(kept_stripe));
        pending.push(Pending::Split { old: stripe(removed), new: kept_stripe, object });
    });
}
