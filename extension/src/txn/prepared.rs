//! OCC across PREPARE TRANSACTION and COMMIT PREPARED: what a node's part
//! of a distributed transaction needs when Citus commits it in two phases.
//!
//! A transaction that wrote counts as the writer of its entry sets until
//! its version bumps are applied, and the bumps wait until its rows are
//! visible (versions.rs). Both happen in the commit callback, which
//! PostgreSQL does not run for a prepared transaction: COMMIT PREPARED may
//! come from any backend, or after a crash. So at PREPARE the transaction
//! first validates its reads again (every node's write locks are taken by
//! then: the point where the whole distributed transaction is serialized),
//! then hands its writer counts and queued bumps to a slot in shared
//! memory, keyed by its XID. Any backend that later finds the XID no
//! longer running (`sweep`, at the start of every workflow and in every
//! job runner's loop) applies the bumps if it committed, then drops the
//! writer counts. Until then readers of those sets fail validation, as
//! they would while the transaction ran: late sweeps cost false conflicts,
//! never missed ones.
//!
//! After a restart, shared memory starts empty while prepared transactions
//! survive with their locks but without their counts. So at PREPARE the
//! slot's numbers are also written to the slot's own file in the data
//! directory (`lambdastore/prepared/slot-<n>`: the XID, the count, the
//! numbers), flushed before the transaction is prepared, and the first
//! sweep after startup gives each transaction still prepared its writer
//! counts back from its file, in the same slot: until it ends, only the
//! sets it wrote fail validation. The files are written over in place, so
//! a PREPARE costs one write and one `fdatasync` (none under `fsync =
//! off`, as PostgreSQL's own files), where a file per transaction cost a
//! create, a rename, an unlink and two flushes: on a node taking part in
//! two-node transactions, more CPU than the call itself. A prepared
//! transaction without a file (its file lost, or prepared by a build
//! without them) is registered as
//! having written everything: every validation on this node fails (40001)
//! until it ends, and when it commits every version moves on. Files of
//! transactions no longer prepared are cleared then. Citus' 2PC recovery
//! (`recover_prepared_transactions()`, run by its maintenance daemon every
//! `citus.recover_2pc_interval`) ends those Citus left behind; an operator
//! ends others with COMMIT PREPARED or ROLLBACK PREPARED, the transactions
//! holding sets being listed by `lambdastore.prepared()`.

use super::versions;
use crate::error::{LambdaError, Result};
use crate::pg;
use crate::pg::shmem::Zeroed;
use pgrx::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Prepared transactions with lambdastore state at once (Citus prepares
/// at most one per node per distributed transaction).
const SLOTS: usize = 128;
/// Writer counts plus queued bumps one prepared transaction may carry.
const ENTRIES: usize = 1024;

/// A slot's state: free, being filled or swept by one backend, or holding
/// the state of the prepared transaction `xid` (`READY | xid << 2`).
const FREE: u64 = 0;
const BUSY: u64 = 1;
const READY: u64 = 2;
/// An XID found prepared after a restart, whose sets are unknown.
const UNKNOWN: u64 = 3;

pub(crate) struct Registry {
    /// Slots not free: 0 makes `sweep` a single load.
    used: AtomicU32,
    /// Whether the prepared transactions that survived a restart were
    /// looked for since the server (re)started.
    recovered: AtomicBool,
    /// Held by the one backend putting them back (`recover`).
    recovering: AtomicBool,
    /// Transactions of `UNKNOWN` slots still running: every validation
    /// fails while there are any.
    unknown: AtomicU32,
    slots: [Slot; SLOTS],
}

struct Slot {
    state: AtomicU64,
    len: AtomicU32,
    entries: [AtomicU64; ENTRIES],
}

// SAFETY: the name is unique to this extension.
static SHARED: Zeroed<Registry> = Zeroed::new(c"lambdastore_prepared_transactions");

/// Requests the shared memory; from `_PG_init`, while preloading.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests the features of every PostgreSQL version
pub(crate) fn request_shared_memory() {
    pgrx::pg_shmem_init!(SHARED = false);
}

fn shared() -> Option<&'static Registry> {
    versions::available().then(|| SHARED.get())
}

/// At PREPARE TRANSACTION, after `occ::validate_again`: moves this
/// transaction's writer counts and queued bumps into a slot. An error
/// leaves it unprepared (the transaction aborts).
///
/// A transaction that queued jobs takes a slot too (maybe with no entry):
/// COMMIT PREPARED runs no callback to wake the job runners, so they poll
/// for the slot's end, and run the jobs then, as they would have when woken.
pub(crate) fn at_prepare(queued_jobs: bool) -> Result<()> {
    let Some(shared) = shared() else { return Ok(()) };
    let len = versions::prepared_len();
    if len == 0 && !queued_jobs {
        return Ok(());
    }
    // A prepared transaction holds its entry sets until someone ends it,
    // after a restart too, so only a superuser may leave one behind, but
    // for the parts Citus prepares (`prepared_by_citus`).
    if versions::prepared_len() > 0
        && !crate::access::Caller::current().is_superuser()
        && !crate::cluster::layout::prepared_by_citus()?
    {
        return Err(LambdaError::Prepared(
            "only a superuser may prepare a transaction that wrote through lambdas (Citus prepares its own): \
             a prepared transaction holds its entry sets until it is committed or rolled back"
                .into(),
        ));
    }
    if len > ENTRIES {
        return Err(LambdaError::Prepared(format!(
            "a prepared transaction may carry {ENTRIES} entry-set locks and version changes; this one has {len}"
        )));
    }
    let xid = pg::xact::top_xid();
    let Some(slot) = shared.slots.iter().find(|s| s.state.compare_exchange(FREE, BUSY, SeqCst, SeqCst).is_ok()) else {
        return Err(LambdaError::Prepared(format!(
            "{SLOTS} prepared transactions already hold lambdastore entry sets on this node"
        )));
    };
    let entries = versions::take_for_prepare();
    let index = shared.slots.iter().position(|s| std::ptr::eq(s, slot)).unwrap_or_default();
    if let Err(err) = persist(index, xid, &entries) {
        // Not prepared after all: the transaction aborts, and these counts
        // are no longer the backend's to release.
        versions::finish_prepared(&entries, false);
        slot.state.store(FREE, SeqCst);
        return Err(err);
    }
    for (entry, value) in slot.entries.iter().zip(&entries) {
        entry.store(*value, SeqCst);
    }
    slot.len.store(entries.len() as u32, SeqCst);
    shared.used.fetch_add(1, SeqCst);
    slot.state.store(READY | u64::from(xid) << 2, SeqCst);
    Ok(())
}

use Ordering::SeqCst;

/// Whether prepared transactions still hold entry sets here.
pub(crate) fn pending() -> bool {
    shared().is_some_and(|s| s.used.load(SeqCst) > 0 || !s.recovered.load(SeqCst))
}

/// Whether validation must fail: prepared transactions whose sets are
/// unknown (found after a restart) are still running.
pub(crate) fn blocked() -> bool {
    shared().is_some_and(|s| s.unknown.load(SeqCst) > 0)
}

/// Finishes the slots of prepared transactions that have ended: their
/// bumps if they committed, then their writer counts. Needs a transaction
/// (it reads the commit log, and after a restart `pg_prepared_xacts`).
pub(crate) fn sweep() -> Result<()> {
    let Some(shared) = shared() else { return Ok(()) };
    // A standby lists the primary's prepared transactions, whose writes it
    // does not show until it replays their COMMIT PREPARED: nothing to
    // hold, and the first sweep after promotion puts them back.
    if pg::standby::in_recovery() {
        return Ok(());
    }
    if !shared.recovered.load(SeqCst) {
        recover(shared)?;
    }
    finish_ended();
    Ok(())
}

/// The part of `sweep` that needs no query, so that it may run where no
/// statement can (at PREPARE and COMMIT): the slots of prepared
/// transactions that have ended, finished. Readers waiting for their sets
/// are woken (versions.rs).
pub(crate) fn finish_ended() {
    let Some(shared) = shared() else { return };
    if shared.used.load(SeqCst) == 0 {
        return;
    }
    for slot in &shared.slots {
        let state = slot.state.load(SeqCst);
        let kind = state & 3;
        if kind != READY && kind != UNKNOWN {
            continue;
        }
        let xid = (state >> 2) as u32;
        if pg::xact::in_progress(xid) {
            continue;
        }
        let committed = pg::xact::committed(xid);
        if slot.state.compare_exchange(state, BUSY, SeqCst, SeqCst).is_err() {
            // Another backend (a job runner, woken at PREPARE) is finishing
            // it. Wait until it is done: the validation this sweep precedes
            // must not find the writer counts of a transaction that ended.
            // Between its exchange and FREE the other backend only stores
            // atomics, so this wait is short and always ends.
            while slot.state.load(SeqCst) == BUSY {
                std::thread::yield_now();
            }
            continue;
        }
        if kind == UNKNOWN {
            if committed {
                versions::bump_everything();
            }
            shared.unknown.fetch_sub(1, SeqCst);
        } else {
            versions::finish_prepared(&entries_of(slot), committed);
        }
        slot.state.store(FREE, SeqCst);
        shared.used.fetch_sub(1, SeqCst);
    }
}

/// After a restart: every transaction still prepared gets its writer
/// counts back from its slot's file, in that slot, or, without one, is
/// registered as having written every set (see the module doc); the files
/// of transactions no longer prepared are cleared. Once per startup.
///
/// One backend at a time: the first calls after a restart and the job
/// runners all sweep at once, and a second backend placing the same
/// transactions would find their slots taken and register them as unknown,
/// failing every validation on the node until they end. The others wait
/// for it; what it does after its query is memory and a few small files.
fn recover(shared: &Registry) -> Result<()> {
    let xids = crate::catalog::prepared_transactions()?;
    while shared.recovering.compare_exchange(false, true, SeqCst, SeqCst).is_err() {
        std::thread::yield_now();
    }
    if !shared.recovered.load(SeqCst) {
        place_again(shared, &xids);
        shared.recovered.store(true, SeqCst);
    }
    shared.recovering.store(false, SeqCst);
    Ok(())
}

/// `recover`'s work, given the XIDs prepared now. A transaction already in
/// a slot (prepared since the restart, before this ran) is left there.
fn place_again(shared: &Registry, xids: &[u32]) {
    let held = |xid: u32| {
        shared.slots.iter().any(|slot| {
            let state = slot.state.load(SeqCst);
            state & 3 >= READY && state >> 2 == u64::from(xid)
        })
    };
    for (index, slot) in shared.slots.iter().enumerate() {
        let Some((xid, entries)) = read_slot_file(index) else { continue };
        if !xids.contains(&xid) {
            clear_slot_file(index);
            continue;
        }
        // The slot of its file, so that no PREPARE writes over the file
        // while the transaction it keeps is still prepared.
        if held(xid) || slot.state.compare_exchange(FREE, BUSY, SeqCst, SeqCst).is_err() {
            continue;
        }
        shared.used.fetch_add(1, SeqCst);
        hold(slot, xid, &entries);
    }
    for &xid in xids.iter().filter(|&&xid| !held(xid)) {
        let Some(slot) = shared.slots.iter().find(|s| s.state.compare_exchange(FREE, BUSY, SeqCst, SeqCst).is_ok())
        else {
            break;
        };
        shared.used.fetch_add(1, SeqCst);
        shared.unknown.fetch_add(1, SeqCst);
        slot.state.store(UNKNOWN | u64::from(xid) << 2, SeqCst);
    }
}

/// `slot` holds the writer counts `entries` of the prepared `xid` again.
fn hold(slot: &Slot, xid: u32, entries: &[u64]) {
    versions::hold_again(entries);
    for (entry, value) in slot.entries.iter().zip(entries) {
        entry.store(*value, SeqCst);
    }
    slot.len.store(entries.len() as u32, SeqCst);
    slot.state.store(READY | u64::from(xid) << 2, SeqCst);
}

/// Where the slots' numbers are kept on disk, relative to the data
/// directory (every backend's working directory).
const DIRECTORY: &str = "lambdastore/prepared";

fn slot_path(index: usize) -> std::path::PathBuf {
    std::path::Path::new(DIRECTORY).join(format!("slot-{index}"))
}

/// A slot file starts with this, the XID and the count of numbers (each
/// a little-endian u32), then the numbers (u64).
const MAGIC: u32 = 0x4c53_5031; // "LSP1"

/// Writes `entries` for `xid` to the file of slot `index`, durably before
/// PREPARE writes its record: written over in place (a file created the
/// first time, and its directory, are flushed then) and flushed as
/// PostgreSQL flushes its own files (`pg_fdatasync`: not at all under
/// `fsync = off`). A crash in the middle leaves the file of a transaction
/// that never prepared, which recovery ignores.
fn persist(index: usize, xid: u32, entries: &[u64]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let failed = |e: std::io::Error| {
        LambdaError::Prepared(format!("could not keep the prepared transaction's entry sets in {DIRECTORY}: {e}"))
    };
    let file = match std::fs::OpenOptions::new().write(true).open(slot_path(index)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_slot_file(index).map_err(failed)?,
        Err(e) => return Err(failed(e)),
    };
    let mut bytes = Vec::with_capacity(12 + entries.len() * 8);
    for word in [MAGIC, xid, entries.len() as u32] {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    bytes.extend(entries.iter().flat_map(|e| e.to_le_bytes()));
    file.write_all_at(&bytes, 0).and_then(|_| pg::backend::flush_data(&file)).map_err(failed)
}

/// Creates slot `index`'s file, empty, its name made durable.
fn create_slot_file(index: usize) -> std::io::Result<std::fs::File> {
    std::fs::create_dir_all(DIRECTORY)?;
    let file = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(slot_path(index))?;
    pg::backend::flush(&file)?;
    pg::backend::flush(&std::fs::File::open(DIRECTORY)?)?;
    Ok(file)
}

/// The XID and numbers in slot `index`'s file, if it holds a whole record.
fn read_slot_file(index: usize) -> Option<(u32, Vec<u64>)> {
    let bytes = std::fs::read(slot_path(index)).ok()?;
    let word = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let (magic, xid, len) = (word(0)?, word(4)?, word(8)? as usize);
    if magic != MAGIC || len > ENTRIES {
        return None;
    }
    let numbers = bytes.get(12..12 + len * 8)?;
    Some((xid, numbers.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()))
}

/// Clears a slot file whose transaction is no longer prepared, so that
/// its XID, once reused after wraparound, is never taken for it.
fn clear_slot_file(index: usize) {
    use std::os::unix::fs::FileExt;
    if let Ok(file) = std::fs::OpenOptions::new().write(true).open(slot_path(index)) {
        let _ = file.write_all_at(&[0; 4], 0);
    }
}

/// The slots of transactions prepared now: (XID, entry-set locks held,
/// whether its sets are known).
pub(crate) fn holders() -> Vec<(u32, usize, bool)> {
    let Some(shared) = shared() else { return Vec::new() };
    shared
        .slots
        .iter()
        .filter_map(|slot| {
            let state = slot.state.load(SeqCst);
            let xid = (state >> 2) as u32;
            match state & 3 {
                READY => Some((xid, versions::held_count(&entries_of(slot)), true)),
                UNKNOWN => Some((xid, 0, false)),
                _ => None,
            }
        })
        .collect()
}

/// The XID of a prepared transaction that holds `set` for writing.
pub(crate) fn holder_of(set: &lambdastore_core::txn::entry_sets::SetId) -> Option<u32> {
    let shared = shared()?;
    shared.slots.iter().find_map(|slot| {
        let state = slot.state.load(SeqCst);
        (state & 3 == READY && versions::holds(&entries_of(slot), set)).then_some((state >> 2) as u32)
    })
}

fn entries_of(slot: &Slot) -> Vec<u64> {
    let len = (slot.len.load(SeqCst) as usize).min(ENTRIES);
    slot.entries[..len].iter().map(|e| e.load(SeqCst)).collect()
}
