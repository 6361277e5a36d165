//! What a warm call would otherwise ask the catalog every time: each
//! object's application and type, and each application's current module.
//!
//! Objects never change application or type, and module rows are immutable.
//! What can change is which module an application runs (a deploy) and
//! whether an object exists (a delete). A transaction making either change
//! calls `changed`, which bumps a generation counter in shared memory once
//! the transaction has committed, so after its changes are visible; a
//! backend that finds a new generation when it looks something up forgets
//! everything it cached. Rows written by the current transaction are never
//! cached, since they may yet roll back: only transactions without an XID
//! fill the cache.
//!
//! Without `shared_preload_libraries` there is no shared counter, so
//! nothing is cached and every call asks the catalog.
//!
//! A change may also commit in two phases: on a Citus cluster a deploy (or
//! a grant, or a delete sent from another node) reaches each node as a
//! prepared transaction, whose COMMIT PREPARED runs no callback here (it
//! may run in any backend, or after a crash). A deploy or grant made on
//! another node does not even run this extension's code here: Citus writes
//! this node's copy of the reference tables itself, which the transaction's
//! statistics tell (`cluster::layout::wrote_reference_tables`). So at PREPARE the
//! transaction leaves its XID in shared memory instead, and whoever looks
//! at the generation next first finishes the XIDs whose transactions have
//! ended: a committed one bumps the generation, before its XID is cleared,
//! so that no backend can find it gone and the generation not yet moved.
//! After a restart, shared memory starts empty while prepared transactions
//! survive: the first look registers every one still prepared (whatever
//! it changed). The guarantee is the one-node one: once COMMIT (or COMMIT
//! PREPARED) has returned, every call that starts sees the change.

use crate::error::LambdaError;
use crate::pg::shmem::Zeroed;
use lambdastore_core::model::{Guards, ModuleKey, ObjectInfo};
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Prepared transactions that change the catalog, at once per node.
const PREPARED: usize = 128;

pub(crate) struct Shared {
    generation: AtomicU64,
    /// Taken slots of `prepared`: 0 makes the look a single load.
    pending: AtomicU32,
    /// Whether the prepared transactions that survived a restart were
    /// registered since the server started.
    recovered: AtomicBool,
    /// XIDs of prepared transactions whose commit bumps the generation (0:
    /// a free slot; no transaction has XID 0).
    prepared: [AtomicU32; PREPARED],
}

// SAFETY: the name is unique to this extension.
static SHARED: Zeroed<Shared> = Zeroed::new(c"lambdastore_catalog_generation");
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Objects remembered at most; past this the cache starts again empty.
const MAX_OBJECTS: usize = 100_000;

#[derive(Default)]
struct Cached {
    /// The generation and catalog table these entries were read under: a
    /// recreated extension has a new `objects` table (and reuses ids).
    generation: u64,
    objects_table: pg_sys::Oid,
    objects: HashMap<i64, ObjectInfo>,
    modules: HashMap<String, ModuleKey>,
    /// Each object's guards, with its split count when they were read.
    guards: HashMap<i64, (u64, Guards)>,
    /// The application of each valid API key seen, by the key's SHA-256:
    /// `revoke_api_key` changes the catalog, so a revoked key is refused
    /// by every backend's next call. Invalid keys are not remembered.
    api_keys: HashMap<[u8; 32], String>,
}

thread_local! {
    static CACHED: RefCell<Cached> = RefCell::new(Cached::default());
    static BUMP_AT_COMMIT: Cell<bool> = const { Cell::new(false) };
}

/// Requests the shared counter; from `_PG_init`, while preloading.
/// Without it nothing is cached.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests the features of every PostgreSQL version
pub(crate) fn request_shared_memory() {
    pgrx::pg_shmem_init!(SHARED = false);
    ENABLED.store(true, Ordering::Relaxed);
}

/// Before PREPARE TRANSACTION, for a transaction that changed the catalog:
/// its XID goes to shared memory, for the next look at the generation
/// after it ends (see the module doc). Refused when every slot is taken.
pub(crate) fn at_prepare() -> Result<(), LambdaError> {
    let changed_here = BUMP_AT_COMMIT.replace(false);
    if !changed_here && !crate::cluster::layout::wrote_reference_tables() {
        return Ok(());
    }
    // One that changed the catalog through this extension's functions here
    // holds the rows it changed (a deploy its application's, which a
    // create_object waits for) until someone ends it, after a restart too.
    // (Not one that only may have: a backend that ran none of them counts
    // as having written the reference tables.)
    let superuser = crate::pg::roles::is_superuser(crate::pg::roles::current_user());
    if changed_here && !superuser && !crate::cluster::layout::prepared_by_citus()? {
        return Err(LambdaError::Prepared(
            "only a superuser may prepare a transaction that deployed, deleted objects or changed privileges \
             (Citus prepares its own): a prepared transaction holds the rows it changed until it is committed or \
             rolled back"
                .into(),
        ));
    }
    if !ENABLED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let xid = crate::pg::xact::top_xid(); // a transaction that changed the catalog has one
    let shared = SHARED.get();
    // Slots are otherwise cleared by the next look at the generation, and
    // a node may prepare many transactions without a call looking: those
    // of plain SQL over distributed tables, from backends that ran no
    // lambdastore code and so count as changing the catalog
    // (`wrote_reference_tables`). So
    // the ended ones are cleared here before any slot is found wanting.
    if register(shared, xid) {
        return Ok(());
    }
    finish_ended(shared);
    if register(shared, xid) {
        return Ok(());
    }
    Err(LambdaError::Prepared(format!(
        "{PREPARED} prepared transactions that deploy, delete objects or change privileges are pending on this node"
    )))
}

/// Puts `xid` in a free slot; false if there is none.
fn register(shared: &Shared, xid: u32) -> bool {
    // Counted first: a look that finds the count but not yet the XID
    // skips a transaction that has not even prepared.
    shared.pending.fetch_add(1, Ordering::SeqCst);
    if shared.prepared.iter().any(|slot| slot.compare_exchange(0, xid, Ordering::SeqCst, Ordering::SeqCst).is_ok()) {
        return true;
    }
    shared.pending.fetch_sub(1, Ordering::SeqCst);
    false
}

/// After the commit record: every backend forgets its caches.
pub(crate) fn at_commit() {
    if BUMP_AT_COMMIT.replace(false) && ENABLED.load(Ordering::Relaxed) {
        SHARED.get().generation.fetch_add(1, Ordering::SeqCst);
    }
}

pub(crate) fn at_abort() {
    BUMP_AT_COMMIT.set(false);
}

/// The catalog generation now (None without shared memory, or while the
/// prepared transactions that survived a restart cannot be registered):
/// what the backend caches about the catalog, here and in access.rs, is
/// good only under the generation it was read in. Needs a transaction (it
/// reads the commit log).
pub(crate) fn generation() -> Option<u64> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let shared = SHARED.get();
    if !shared.recovered.load(Ordering::SeqCst) && !recover(shared) {
        return None;
    }
    if shared.pending.load(Ordering::SeqCst) > 0 {
        finish_ended(shared);
    }
    Some(shared.generation.load(Ordering::SeqCst))
}

/// Clears the slots of prepared transactions that have ended, bumping
/// the generation first for each that committed. Two backends at it at
/// once may both bump: a spurious bump only empties caches.
fn finish_ended(shared: &Shared) {
    for slot in &shared.prepared {
        let xid = slot.load(Ordering::SeqCst);
        if xid == 0 {
            continue;
        }
        if crate::pg::xact::in_progress(xid) {
            continue;
        }
        if crate::pg::xact::committed(xid) {
            shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        if slot.compare_exchange(xid, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            shared.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Registers every transaction still prepared after a (re)start; false
/// (caching stays off, and the next look tries again) if they do not fit
/// or cannot be read. Two backends at it at once register some twice:
/// that only costs slots.
fn recover(shared: &Shared) -> bool {
    let Ok(xids) = super::prepared_transactions() else { return false };
    for xid in xids {
        if shared.prepared.iter().any(|slot| slot.load(Ordering::SeqCst) == xid) {
            continue;
        }
        if !register(shared, xid) {
            return false;
        }
    }
    shared.recovered.store(true, Ordering::SeqCst);
    true
}

/// The current transaction changes an application's module, owner or
/// grants, or deletes an object: every backend forgets its caches once it
/// commits.
pub(crate) fn changed() {
    BUMP_AT_COMMIT.set(true);
}

/// The cache, emptied first if the catalog changed since it was filled;
/// None when caching is off, or when the current user may not read the
/// catalog (a `SET ROLE` after the cache was filled): the query then
/// raises the permission error it always did.
fn with_valid<R>(f: impl FnOnce(&mut Cached) -> R) -> Option<R> {
    let generation = generation()?;
    let objects_table = super::relation(c"objects", super::Place::Tables).ok()?;
    if !super::may_select(objects_table) {
        return None;
    }
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.generation != generation || cached.objects_table != objects_table {
            *cached = Cached { generation, objects_table, ..Cached::default() };
        }
        Some(f(&mut cached))
    })
}

/// Whether rows read now may be cached: not if this transaction has
/// written anything, since what it read may be its own uncommitted rows.
pub(crate) fn may_fill() -> bool {
    crate::pg::xact::top_xid() == 0
}

/// An object's application and type, with the application's module.
pub(crate) fn object(id: i64) -> Option<(ObjectInfo, ModuleKey)> {
    with_valid(|cached| {
        let info = cached.objects.get(&id)?;
        let module = cached.modules.get(&info.app)?;
        Some((info.clone(), module.clone()))
    })
    .flatten()
}

pub(crate) fn remember_object(id: i64, info: &ObjectInfo, module: &ModuleKey) {
    if !may_fill() {
        return;
    }
    with_valid(|cached| {
        if cached.objects.len() >= MAX_OBJECTS {
            cached.objects.clear();
        }
        cached.objects.insert(id, info.clone());
        cached.modules.insert(module.app.clone(), module.clone());
    });
}

/// The module an application runs now.
pub(crate) fn module(app: &str) -> Option<ModuleKey> {
    with_valid(|cached| cached.modules.get(app).cloned()).flatten()
}

pub(crate) fn remember_module(module: &ModuleKey) {
    if may_fill() {
        with_valid(|cached| cached.modules.insert(module.app.clone(), module.clone()));
    }
}

/// The application of the valid API key whose SHA-256 is `digest`.
pub(crate) fn api_key(digest: &[u8; 32]) -> Option<String> {
    with_valid(|cached| cached.api_keys.get(digest).cloned()).flatten()
}

pub(crate) fn remember_api_key(digest: [u8; 32], app: &str) {
    if may_fill() {
        with_valid(|cached| {
            // Keys are few; a bound keeps a flood of distinct valid keys
            // from growing the backend.
            if cached.api_keys.len() >= 1024 {
                cached.api_keys.clear();
            }
            cached.api_keys.insert(digest, app.to_string())
        });
    }
}

/// An object's guards, if cached under the split count `splits`: guards
/// change only by splits, which bump the count once they are visible.
pub(crate) fn guards(object: i64, splits: u64) -> Option<Guards> {
    with_valid(|cached| cached.guards.get(&object).filter(|(at, _)| *at == splits).map(|(_, g)| g.clone())).flatten()
}

pub(crate) fn remember_guards(object: i64, splits: u64, guards: &Guards) {
    if !may_fill() {
        return;
    }
    with_valid(|cached| {
        if cached.guards.len() >= MAX_OBJECTS {
            cached.guards.clear();
        }
        cached.guards.insert(object, (splits, guards.clone()));
    });
}

/// Forgets every object's guards; when the layout changes. An object that
/// comes back to a node finds there the split count it left with, while
/// its guards may have been split on the node it was on meanwhile.
pub(super) fn forget_guards() {
    CACHED.with(|cached| cached.borrow_mut().guards.clear());
}

/// Forgets an object this transaction deletes, so that its later calls
/// find it gone (other backends forget it when the delete commits).
pub(crate) fn forget_object(id: i64) {
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        cached.objects.remove(&id);
        cached.guards.remove(&id);
    });
}
