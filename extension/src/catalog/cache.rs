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
//! nothing is cached and every call asks the catalog. Nor on a Citus
//! cluster (yet): a deploy on the coordinator reaches the workers as a
//! prepared transaction, whose COMMIT PREPARED runs no callback that could
//! bump their counters.

use crate::error::LambdaError;
use crate::model::{Guards, ModuleKey, ObjectInfo};
use pgrx::prelude::*;
use pgrx::PgAtomic;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

// SAFETY: the name is unique to this extension.
static GENERATION: PgAtomic<AtomicU64> = unsafe { PgAtomic::new(c"lambdastore_catalog_generation") };
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
}

thread_local! {
    static CACHED: RefCell<Cached> = RefCell::new(Cached::default());
    static BUMP_AT_COMMIT: Cell<bool> = const { Cell::new(false) };
}

/// Requests the shared counter; from `_PG_init`, while preloading.
/// Without it nothing is cached.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests the features of every PostgreSQL version
pub(crate) fn request_shared_memory() {
    pgrx::pg_shmem_init!(GENERATION);
    ENABLED.store(true, Ordering::Relaxed);
}

/// Before PREPARE TRANSACTION: a prepared transaction becomes visible at
/// COMMIT PREPARED, in another session, where nothing would bump the
/// generation.
pub(crate) fn refuse_prepare() -> Result<(), LambdaError> {
    if BUMP_AT_COMMIT.replace(false) {
        return Err(LambdaError::Prepared(
            "lambdastore.deploy, delete_object, grant, revoke and set_owner cannot be part of a prepared transaction"
                .into(),
        ));
    }
    Ok(())
}

/// After the commit record: every backend forgets its caches.
pub(crate) fn at_commit() {
    if BUMP_AT_COMMIT.replace(false) && ENABLED.load(Ordering::Relaxed) {
        GENERATION.get().fetch_add(1, Ordering::SeqCst);
    }
}

pub(crate) fn at_abort() {
    BUMP_AT_COMMIT.set(false);
}

/// The catalog generation now (None without shared memory): what the
/// backend caches about the catalog, here and in access.rs, is good only
/// under the generation it was read in.
pub(crate) fn generation() -> Option<u64> {
    enabled().then(|| GENERATION.get().load(Ordering::SeqCst))
}

/// Whether caching is on: with the shared counter, and not on a Citus
/// cluster (see the module doc).
fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed) && !super::shards::distributed().unwrap_or(true)
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
    if !enabled() {
        return None;
    }
    let generation = GENERATION.get().load(Ordering::SeqCst);
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
    // SAFETY: reads the current transaction's state on the main thread.
    unsafe { pg_sys::GetTopTransactionIdIfAny() == pg_sys::InvalidTransactionId }
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

/// Forgets an object this transaction deletes, so that its later calls
/// find it gone (other backends forget it when the delete commits).
pub(crate) fn forget_object(id: i64) {
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        cached.objects.remove(&id);
        cached.guards.remove(&id);
    });
}
