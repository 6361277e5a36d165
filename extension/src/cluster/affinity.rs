//! Who calls whom, for `lambdastore.rebalance()`: per object, the calls it
//! received on this node (for top-level calls, the CPU time they took and
//! how many wrote: the light-replica policy's input), and per pair of objects, the nested calls the
//! first made to the second from here, and how many of them went to
//! another node. In shared memory, as the statistics are (a call that
//! aborts still loaded the node), so it needs the library preloaded.
//!
//! Counting takes no lock once an object or a pair has a slot: slots are
//! found by hashing the ids and probing a few neighbours, and counted with
//! an atomic add. Only claiming a free slot takes a lock, so that two
//! backends do not claim two slots for one key. The tables are bounded:
//! what finds them full is counted as untracked, not lost silently, and
//! the rebalancer forgets everything after each run (a window per run).

use crate::pg::shmem::Zeroed;
use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Objects and pairs tracked per node between two runs of the rebalancer.
const OBJECTS: usize = 4096;
const PAIRS: usize = 8192;
/// Slots looked at for a key before it counts as untracked.
const PROBES: usize = 32;

/// The key of a slot; 0 (no object has id 0) marks a free slot.
trait Slot {
    type Key: Copy + Eq;
    fn key(&self) -> Option<Self::Key>;
    /// Publishes `key` with its counts zeroed (under the claim lock).
    fn claim(&self, key: Self::Key);
    fn clear(&self);
}

struct ObjectSlot {
    id: AtomicI64,
    calls: AtomicI64,
    /// CPU microseconds its top-level calls took here, and how many wrote.
    busy_us: AtomicI64,
    writes: AtomicI64,
}

struct PairSlot {
    from: AtomicI64,
    to: AtomicI64,
    calls: AtomicI64,
    cross_node: AtomicI64,
}

impl Slot for ObjectSlot {
    type Key = i64;

    fn key(&self) -> Option<i64> {
        Some(self.id.load(Ordering::Acquire)).filter(|id| *id != 0)
    }

    fn claim(&self, id: i64) {
        self.calls.store(0, Ordering::Relaxed);
        self.busy_us.store(0, Ordering::Relaxed);
        self.writes.store(0, Ordering::Relaxed);
        self.id.store(id, Ordering::Release);
    }

    fn clear(&self) {
        self.id.store(0, Ordering::Release);
    }
}

impl Slot for PairSlot {
    type Key = (i64, i64);

    /// `from` is published last, so a reader that sees it sees `to`.
    fn key(&self) -> Option<(i64, i64)> {
        let from = self.from.load(Ordering::Acquire);
        (from != 0).then(|| (from, self.to.load(Ordering::Relaxed)))
    }

    fn claim(&self, (from, to): (i64, i64)) {
        self.calls.store(0, Ordering::Relaxed);
        self.cross_node.store(0, Ordering::Relaxed);
        self.to.store(to, Ordering::Relaxed);
        self.from.store(from, Ordering::Release);
    }

    fn clear(&self) {
        self.from.store(0, Ordering::Release);
    }
}

struct Tables {
    objects: [ObjectSlot; OBJECTS],
    pairs: [PairSlot; PAIRS],
    /// Calls that found no slot.
    untracked: AtomicI64,
    /// When the window began (Unix µs): at the start of the first call
    /// counted after the counts were last forgotten; 0 before it.
    since_us: AtomicI64,
}

// SAFETY: the names are unique to this extension.
static TABLES: Zeroed<Tables> = Zeroed::new(c"lambdastore_affinity");
#[allow(unsafe_code)] // pgrx's constructor of a named shared lock; the name is unique (above)
static CLAIM: PgLwLock<bool> = unsafe { PgLwLock::new(c"lambdastore_affinity_claim") };
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Requests the shared memory; from `_PG_init`, while preloading.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests the features of every PostgreSQL version
pub(crate) fn request_shared_memory() {
    pgrx::pg_shmem_init!(TABLES = false);
    pgrx::pg_shmem_init!(CLAIM);
    ENABLED.store(true, Ordering::Relaxed);
}

/// Fibonacci hashing: ids on a cluster differ in their high bits (each
/// node draws from its own range) and low bits alike.
fn start(hash: u64, len: usize) -> usize {
    (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % len
}

/// The slot of `key`: found without a lock, or claimed under it. Where
/// every slot it may have is taken by others, None without the lock: once
/// the tables fill, the calls of untracked objects must not all queue on it.
fn slot<S: Slot>(slots: &[S], key: S::Key, hash: u64) -> Option<&S> {
    let first = start(hash, slots.len());
    let probe = || (0..PROBES).map(|i| &slots[(first + i) % slots.len()]);
    let mut free = false;
    for slot in probe() {
        match slot.key() {
            Some(k) if k == key => return Some(slot),
            Some(_) => continue,
            None => {
                free = true;
                break;
            }
        }
    }
    if !free {
        return None;
    }
    // Again under the lock: another backend may have claimed it meanwhile.
    let _claiming = CLAIM.exclusive();
    for slot in probe() {
        match slot.key() {
            Some(k) if k == key => return Some(slot),
            Some(_) => continue,
            None => {
                slot.claim(key);
                return Some(slot);
            }
        }
    }
    None
}

fn count(counter: Option<&AtomicI64>) {
    match counter {
        Some(counter) => counter.fetch_add(1, Ordering::Relaxed),
        None => TABLES.get().untracked.fetch_add(1, Ordering::Relaxed),
    };
}

/// Counts a nested call that `object` received on this node.
pub(crate) fn received(object: i64) {
    if ENABLED.load(Ordering::Relaxed) {
        count(slot(&TABLES.get().objects, object, object as u64).map(|s| &s.calls));
    }
}

/// The CPU time this backend's thread has used: the guest runs on it
/// (wasmtime's epoch ticker is a thread of its own). Wall time would count
/// the waits, for the CPU, for locks, for the owner's answers, which no
/// replica relieves. None off a Citus cluster, where no rebalancer reads
/// it: each reading is a system call (about 0.5 µs here), twice a call.
pub(crate) fn cpu_time() -> Option<Duration> {
    if !ENABLED.load(Ordering::Relaxed) || !super::layout::distributed().unwrap_or(false) {
        return None;
    }
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given, nothing else.
    #[allow(unsafe_code)]
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } == 0;
    ok.then(|| Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
}

/// Counts a top-level call of `object` run on this node (as its owner or
/// a light replica), with the CPU time it took (`cpu_time`) and whether it
/// wrote entries: what the rebalancer's light-replica policy weighs.
pub(crate) fn ran(object: i64, busy: Duration, wrote: bool) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let tables = TABLES.get();
    let busy_us = i64::try_from(busy.as_micros()).unwrap_or(i64::MAX);
    if tables.since_us.load(Ordering::Relaxed) == 0 {
        let began = unix_micros().saturating_sub(busy_us);
        let _ = tables.since_us.compare_exchange(0, began, Ordering::Relaxed, Ordering::Relaxed);
    }
    let Some(slot) = slot(&tables.objects, object, object as u64) else {
        return count(None);
    };
    slot.calls.fetch_add(1, Ordering::Relaxed);
    slot.busy_us.fetch_add(busy_us, Ordering::Relaxed);
    if wrote {
        slot.writes.fetch_add(1, Ordering::Relaxed);
    }
}

fn unix_micros() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(now.as_micros()).unwrap_or(i64::MAX)
}

/// Counts a nested call that `from`, running here, made to `to`.
pub(crate) fn called(from: i64, to: i64, cross_node: bool) {
    if !ENABLED.load(Ordering::Relaxed) || from == to {
        return;
    }
    let hash = (from as u64).rotate_left(17) ^ to as u64;
    let pair = slot(&TABLES.get().pairs, (from, to), hash);
    count(pair.map(|s| &s.calls));
    if cross_node {
        count(pair.map(|s| &s.cross_node));
    }
}

/// One row of `_affinity_here`: (object, partner, calls, cross_node,
/// busy_ms, writes, window_s).
type Row = (Option<i64>, Option<i64>, i64, Option<i64>, Option<f64>, Option<i64>, Option<f64>);

/// This node's counts: (object, None, calls received, None, ms its
/// top-level calls ran, of them calls that wrote, window) and (caller,
/// callee, nested calls, of which to another node, None, None, window); a
/// last row (None, None, untracked calls, None, None, None, window) if any
/// found the tables full. The window is the seconds since the first call
/// counted. `forget` clears them as they are read, under the claim lock:
/// a window of counts.
fn read(forget: bool) -> Vec<Row> {
    if !ENABLED.load(Ordering::Relaxed) {
        pgrx::notice!("lambdastore.affinity needs lambdastore in shared_preload_libraries");
        return Vec::new();
    }
    let tables = TABLES.get();
    let _claiming = CLAIM.exclusive();
    let take =
        |counter: &AtomicI64| if forget { counter.swap(0, Ordering::Relaxed) } else { counter.load(Ordering::Relaxed) };
    let since =
        if forget { tables.since_us.swap(0, Ordering::Relaxed) } else { tables.since_us.load(Ordering::Relaxed) };
    let window = (since != 0).then(|| (unix_micros() - since) as f64 / 1e6);
    let mut rows = Vec::new();
    for slot in &tables.objects {
        if let Some(id) = slot.key() {
            let (busy_ms, writes) = (take(&slot.busy_us) as f64 / 1e3, take(&slot.writes));
            rows.push((Some(id), None, take(&slot.calls), None, Some(busy_ms), Some(writes), window));
            if forget {
                slot.clear();
            }
        }
    }
    for slot in &tables.pairs {
        if let Some((from, to)) = slot.key() {
            rows.push((Some(from), Some(to), take(&slot.calls), Some(take(&slot.cross_node)), None, None, window));
            if forget {
                slot.clear();
            }
        }
    }
    let untracked = take(&tables.untracked);
    if untracked > 0 {
        rows.push((None, None, untracked, None, None, None, window));
    }
    rows
}

#[pg_extern(schema = "lambdastore", name = "_affinity_here")]
fn affinity_here(
    forget: bool,
) -> TableIterator<
    'static,
    (
        name!(object_id, Option<i64>),
        name!(partner, Option<i64>),
        name!(calls, i64),
        name!(cross_node, Option<i64>),
        name!(busy_ms, Option<f64>),
        name!(writes, Option<i64>),
        name!(window_s, Option<f64>),
    ),
> {
    TableIterator::new(read(forget))
}
