//! Where rows live once `lambdastore.distribute()` has handed the tables to
//! Citus: the per-object tables (objects, entries, entry_sets, jobs) are
//! hash-distributed by object id and colocated, the application tables are
//! reference tables with a copy on every node.
//!
//! The catalog never lets Citus plan its own statements. On a node, an
//! object's rows are in the local shard relations (`entries_102008`), and a
//! statement the catalog runs for an object names them directly: Citus
//! forbids distributed queries inside a query it sent to a shard (a call
//! forwarded here runs inside one), the primary-key probes bypass the
//! planner altogether, and the shell tables on a node are empty. Reference
//! tables are read from this node's copy and written through Citus, which
//! writes every copy in one distributed transaction.
//!
//! The layout is read from Citus' metadata (`pg_dist_shard`,
//! `pg_dist_placement`, `pg_dist_node`, `pg_dist_local_group`) once per
//! backend and read again after every relcache invalidation, which Citus
//! sends when shards are created or moved.
//!
//! Shards move (`lambdastore.migrate_object`) while calls run, and Citus
//! blocks writes during a move only for statements its own executor
//! plans, never for ours. So every transaction that uses objects holds, on
//! each node it uses them on, a lock on `lambdastore.migrations` until it
//! ends, and looks at the layout once it holds it (`fence`). A migration
//! locks that table exclusively on every node, from before it splits or
//! copies anything until its new metadata commits there: it waits for the
//! transactions using objects, and they wait for it (or fail with a
//! retryable 40001, `fence`) and then find the objects where they went.
//! Readers hold it too, so a read taken before a move has validated
//! before anything is written on the new node (OCC's versions are per
//! node).

use crate::error::{LambdaError, Result};
use crate::pg;
use lambdastore_core::cluster::shards;
use pgrx::pg_sys;
use std::cell::{Cell, OnceCell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// Distributed by object id, colocated: one shard of each per hash range.
const COLOCATED: [&str; 5] = ["objects", "entries", "entry_sets", "jobs", "schedules"];
/// Reference tables: one shard, a placement on every node.
const REFERENCE: [&str; 7] =
    ["applications", "modules", "object_types", "grants", "api_keys", "queue_limits", "light_replicas"];

/// One hash range of the colocated tables.
#[derive(PartialEq)]
struct Shard {
    /// The lowest and highest hash in the range.
    min: i32,
    max: i32,
    /// The node holding it: its group, and host:port for messages.
    group: i32,
    node: String,
    /// The shard id of each of `COLOCATED`, in that order.
    ids: [i64; COLOCATED.len()],
}

/// Statement texts made from a `&'static str`, by its address, its length
/// and what they were made for.
type Texts<K> = RefCell<HashMap<(usize, usize, K), Rc<str>>>;

pub(crate) struct Layout {
    local_group: i32,
    /// Citus' colocation group of the per-object tables (its lock on
    /// placement changes is keyed by it).
    colocation: u32,
    /// `lambdastore.migrations`, whose lock fences calls from migrations.
    fence: pg_sys::Oid,
    /// By `min`, covering the whole int32 hash space.
    shards: Vec<Shard>,
    /// The shard id of each of `REFERENCE`, in that order.
    reference: [i64; REFERENCE.len()],
    /// Statements rewritten so far, by (text address, length, place).
    statements: Texts<Option<usize>>,
    /// Each shard's route key, by index, once looked for (`route_key`).
    route_keys: Vec<OnceCell<Option<i64>>>,
    /// Statements routed so far, by (text address, length, route key).
    routed: Texts<Option<i64>>,
    /// This node's copy of each of `REFERENCE`, once looked up
    /// (`wrote_reference_tables`, at every PREPARE).
    reference_oids: OnceCell<Vec<Option<pg_sys::Oid>>>,
}

/// How many keys, 0 and up, are tried for a shard's route key. A shard of
/// n about equal ones holds the hash of one key in n; an object isolated
/// into a shard of its own holds one hash, which no small key has.
const ROUTE_KEY_TRIES: i64 = 1 << 12;

/// Where an object's rows are, for the statements the catalog runs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Place {
    /// Not distributed: the tables themselves.
    Tables,
    /// Shard `index` of the layout, stored on this node.
    Local(usize),
}

thread_local! {
    /// None: not read since the last invalidation. Some(None): the tables
    /// are not distributed (or Citus is not installed here).
    static LAYOUT: RefCell<Option<Option<Rc<Layout>>>> = const { RefCell::new(None) };
    /// Whether this transaction holds the fence on this node (`fence`).
    static FENCED: Cell<bool> = const { Cell::new(false) };
    /// Whether this backend runs a part of a transaction another node
    /// drives (a call was forwarded here), which may hold the fence there.
    static ARRIVED: Cell<bool> = const { Cell::new(false) };
}

/// Forgets the layout; from the catalog's relcache callback. True when
/// there was one (the catalog then forgets what it cached by it).
pub(crate) fn forget() -> bool {
    matches!(LAYOUT.with(|l| l.borrow_mut().take()), Some(Some(_)))
}

/// At the end of every transaction: its locks are gone.
pub(crate) fn at_transaction_end() {
    FENCED.set(false);
    ARRIVED.set(false);
}

/// This transaction runs a call another node sent here (`cluster::route::arrive`):
/// that node's part may hold the fence there, so this one never waits for
/// it (`fence`).
pub(crate) fn arrive() {
    ARRIVED.set(true);
}

/// Whether a call was sent here by another node in this transaction.
pub(crate) fn arrived() -> bool {
    ARRIVED.get()
}

/// The layout, None when the tables are not distributed.
pub(crate) fn layout() -> Result<Option<Rc<Layout>>> {
    if let Some(known) = LAYOUT.with(|l| l.borrow().clone()) {
        return Ok(known);
    }
    let read = read_layout()?.map(Rc::new);
    LAYOUT.with(|l| *l.borrow_mut() = Some(read.clone()));
    Ok(read)
}

/// Whether the tables are distributed.
pub(crate) fn distributed() -> Result<bool> {
    Ok(layout()?.is_some())
}

fn read_layout() -> Result<Option<Layout>> {
    let citus = query(shards::CITUS_HERE, |rows| rows.first().get_one::<bool>())?;
    if citus != Some(true) {
        return Ok(None);
    }
    // Reference tables have a placement on every node: this node's.
    let rows = query(shards::SHARD_MAP, |rows| {
        rows.into_iter()
            .map(|row| {
                let (host, port) = (row.get::<String>(6)?.unwrap_or_default(), row.get::<i32>(7)?.unwrap_or_default());
                Ok((
                    row.get::<String>(1)?.unwrap_or_default(),
                    row.get::<i64>(2)?.unwrap_or_default(),
                    row.get::<i32>(3)?.unwrap_or_default(),
                    row.get::<i32>(4)?.unwrap_or_default(),
                    row.get::<i32>(5)?.unwrap_or_default(),
                    format!("{host}:{port}"),
                    row.get::<i32>(9)?.unwrap_or_default(),
                ))
            })
            .collect::<pgrx::spi::Result<Vec<_>>>()
    })?;
    let (colocation, fence) = query(
        "SELECT colocationid::bigint, 'lambdastore.migrations'::regclass::oid
           FROM pg_dist_partition WHERE logicalrelid = 'lambdastore.objects'::regclass",
        |rows| rows.first().get_two::<i64, pg_sys::Oid>(),
    )?;
    let mut layout = Layout {
        local_group: 0,
        colocation: colocation.unwrap_or_default() as u32,
        fence: fence.unwrap_or(pg_sys::InvalidOid),
        shards: Vec::new(),
        reference: [0; REFERENCE.len()],
        statements: Default::default(),
        route_keys: Vec::new(),
        routed: Default::default(),
        reference_oids: OnceCell::new(),
    };
    for (table, shard_id, min, max, group, node, local_group) in rows {
        layout.local_group = local_group;
        if let Some(i) = REFERENCE.iter().position(|t| *t == table) {
            layout.reference[i] = shard_id;
        } else if let Some(i) = COLOCATED.iter().position(|t| *t == table) {
            if layout.shards.last().is_none_or(|s| s.min != min) {
                layout.shards.push(Shard { min, max, group, node, ids: [0; COLOCATED.len()] });
            }
            layout.shards.last_mut().expect("just pushed").ids[i] = shard_id;
        }
    }
    if layout.shards.is_empty() {
        return Ok(None);
    }
    layout.route_keys = layout.shards.iter().map(|_| OnceCell::new()).collect();
    let incomplete = layout.shards.iter().any(|s| s.ids.contains(&0)) || layout.reference.contains(&0);
    if incomplete {
        return Err(LambdaError::NotPreloaded(
            "lambdastore's tables are only partly distributed: run SELECT lambdastore.distribute() on the coordinator"
                .into(),
        ));
    }
    if !shards::cover_all(&layout.shards, Shard::bounds) {
        return Err(LambdaError::Internal("the shards of lambdastore.objects do not cover every hash once".into()));
    }
    Ok(Some(layout))
}

/// Reads Citus' metadata (once per backend and after each invalidation)
/// through a plan of its own: the catalog's kept plans are keyed by where
/// the layout puts a statement, so they sit above it. A mutating plan, as
/// the catalog's are: under READ COMMITTED it takes a fresh snapshot, so
/// that a layout read once the fence is held sees what a migration
/// committed before.
fn query<R>(sql: &'static str, read: impl FnOnce(pgrx::spi::SpiTupleTable<'_>) -> pgrx::spi::Result<R>) -> Result<R> {
    pgrx::Spi::connect(|client| {
        let plan = client.prepare_mut(sql, &[])?;
        client.select(&plan, None, &[]).and_then(read)
    })
    .map_err(|e: pgrx::spi::SpiError| LambdaError::Internal(format!("SPI: {e}")))
}

impl Shard {
    fn bounds(&self) -> (i32, i32) {
        (self.min, self.max)
    }
}

impl Layout {
    fn shard_of(&self, object: i64) -> usize {
        shards::range_of(&self.shards, Shard::bounds, object).expect("the shards cover every hash (checked when read)")
    }

    /// `object`'s shard (its index in the layout) and the node holding
    /// it, host:port, when that is not this one.
    pub(crate) fn owner(&self, object: i64) -> (usize, Option<&str>) {
        let shard = self.shard_of(object);
        let at = &self.shards[shard];
        (shard, (at.group != self.local_group).then_some(at.node.as_str()))
    }

    /// A key Citus places in shard `shard` (the first of 0, 1, 2, … whose
    /// hash is in its range), None when none of the first
    /// `ROUTE_KEY_TRIES` is.
    fn route_key(&self, shard: usize) -> Option<i64> {
        *self.route_keys[shard].get_or_init(|| {
            let (min, max) = self.shards[shard].bounds();
            (0..ROUTE_KEY_TRIES).find(|&key| (min..=max).contains(&shards::hashint8(key)))
        })
    }

    /// Whether this node holds any shard (the coordinator usually does not).
    pub(crate) fn holds_shards(&self) -> bool {
        self.shards.iter().any(|s| s.group == self.local_group)
    }

    /// The index of the shard group whose `objects` shard is `id`, if it
    /// is on this node.
    fn local_index(&self, id: i64) -> Option<usize> {
        self.shards.iter().position(|s| s.ids[0] == id && s.group == self.local_group)
    }

    /// The indexes of the shards on this node.
    pub(crate) fn local_shards(&self) -> impl Iterator<Item = usize> + '_ {
        self.shards.iter().enumerate().filter(|(_, s)| s.group == self.local_group).map(|(i, _)| i)
    }

    /// `sql` with each lambdastore table replaced by its relation on this
    /// node: the per-object tables by their shard `shard` (left alone when
    /// None), the reference tables by this node's copy.
    fn physical(&self, sql: &str, shard: Option<usize>) -> String {
        let mut out = sql.to_string();
        if let Some(shard) = shard {
            for (table, id) in COLOCATED.iter().zip(self.shards[shard].ids) {
                out = rename(&out, table, id);
            }
        }
        for (table, id) in REFERENCE.iter().zip(self.reference) {
            out = rename(&out, table, id);
        }
        out
    }

    /// The shard relation `name` of the per-object table or reference
    /// table `table` (its index name `table_pkey` takes the same suffix).
    fn shard_id(&self, table: &str, shard: Option<usize>) -> Option<i64> {
        if let (Some(i), Some(shard)) = (COLOCATED.iter().position(|t| table.starts_with(t)), shard) {
            return Some(self.shards[shard].ids[i]);
        }
        REFERENCE.iter().position(|t| table.starts_with(t)).map(|i| self.reference[i])
    }
}

/// Replaces `lambdastore.<table>` (a whole name) by `lambdastore.<table>_<id>`.
fn rename(sql: &str, table: &str, id: i64) -> String {
    let name = format!("lambdastore.{table}");
    let mut out = String::with_capacity(sql.len() + 16);
    let mut rest = sql;
    while let Some(at) = rest.find(&name) {
        let end = at + name.len();
        let whole = !rest[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        out.push_str(&rest[..end]);
        if whole {
            out.push_str(&format!("_{id}"));
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where `object` is, once this transaction holds the fence on this node
/// (`fence`), whichever node stores it: no migration can move it until the
/// transaction ends. Taken before a call is sent to another node too: a
/// transaction driven from here that waits for a migration waits here,
/// holding nothing yet, and then sends the call where the object went.
pub(crate) fn locate(object: i64) -> Result<Located> {
    let Some(layout) = fenced_layout(|| format!("object {object} may be moving"))? else {
        return Ok(Located::Here(Place::Tables));
    };
    Ok(match layout.owner(object) {
        (shard, None) => Located::Here(Place::Local(shard)),
        (_, Some(node)) => Located::There(node.to_string()),
    })
}

/// The layout, once this transaction holds the fence on this node (as
/// `locate` takes it): no object can move until the transaction ends.
/// `what` says what a migration holding the fence makes uncertain (only
/// then written: every catalog statement for an object comes here).
pub(crate) fn fenced_layout(what: impl FnOnce() -> String) -> Result<Option<Rc<Layout>>> {
    if !fence(true)? {
        return Err(LambdaError::SerializationFailure(format!(
            "{}: a migration holds this node's fence (retry)",
            what()
        )));
    }
    layout()
}

/// Takes the fence on this node for a statement Citus plans from the
/// layout before it runs (cluster/delegate.rs), as `fenced_layout` does:
/// whether no object moved while it was taken (a plan made before would
/// name a shard that may be gone).
pub(crate) fn fence_for_plan() -> Result<bool> {
    let before = layout()?;
    Ok(match (before, fenced_layout(|| "a call Citus delegates".into())?) {
        (Some(before), Some(now)) => Rc::ptr_eq(&before, &now) || before.shards == now.shards,
        (before, now) => before.is_none() && now.is_none(),
    })
}

/// Where an object is (`locate`).
pub(crate) enum Located {
    Here(Place),
    /// On another node, host:port.
    There(String),
}

/// Where the statements for `object` must run: the tables, or the local
/// shard (`locate`). An object stored on another node is refused with
/// 40001 (`Moved`, with its node): the callers route calls to their owner
/// before they get this far (`cluster::route::owner_elsewhere`), so it moved since.
pub(crate) fn place(object: i64) -> Result<Place> {
    match locate(object)? {
        Located::Here(place) => Ok(place),
        Located::There(node) => Err(LambdaError::Moved { object, node }),
    }
}

/// The place of this node's shard `shard` of the layout, once this
/// transaction holds the fence; None when a migration holds it, or the
/// shard has meanwhile moved away or been split (for the job runners,
/// which visit every local shard and come back at their next round).
pub(crate) fn hold_local(shard: usize) -> Result<Option<Place>> {
    let Some(layout) = layout()? else { return Ok(Some(Place::Tables)) };
    let id = layout.shards[shard].ids[0];
    if !fence(false)? {
        return Ok(None);
    }
    let Some(layout) = self::layout()? else { return Ok(Some(Place::Tables)) };
    Ok(layout.local_index(id).map(Place::Local))
}

/// Takes the fence on this node for the rest of the transaction, once: a
/// row-share lock on `lambdastore.migrations`, which a migration locks
/// exclusively on every node (sql/citus.sql) until its new metadata
/// commits there (Citus sends that lock over the connection that then
/// changes the node's metadata). Processes invalidations when it takes
/// it, so that a layout read afterwards includes what the migration
/// committed. True without Citus, and once held.
///
/// While a migration holds or waits for the lock, the transaction's first
/// fence waits when `may_wait` (a client's transaction, holding no fence
/// on any node) and is false otherwise, taking nothing: a transaction
/// that waited while it held the fence on another node could close a
/// cycle with the migration, which locks node after node (Citus' deadlock
/// detector would end it by cancelling the younger, nearly always the
/// call, with 40P01). Failing instead releases what it holds, and the
/// migration goes on.
fn fence(may_wait: bool) -> Result<bool> {
    if FENCED.get() {
        return Ok(true);
    }
    let Some(layout) = layout()? else { return Ok(true) };
    let wait = may_wait && !ARRIVED.get();
    // Owned by the top transaction: a subtransaction rolled back (an
    // exception block, a failed callee's hops) must not release it while
    // `FENCED` says it is held.
    let got = pg::locks::relation_for_transaction(layout.fence, pg_sys::RowShareLock, wait);
    FENCED.set(got);
    Ok(got)
}

/// Citus' own operations that copy shards from node to node: each takes
/// the fence on every node before it starts, as `migrate_object` does, so
/// that a shard moved without it (`citus_move_shard_placement` by hand,
/// the rebalancer's moves, a split) loses none of the writes calls make
/// meanwhile. Citus blocks only the writes its own executor plans; ours
/// went on into the old copy and were lost with it. Any table's shards:
/// the hook does not see which (calls wait for a move of another
/// colocation group too).
const SHARD_OPERATIONS: pg::fmgr::Watch = pg::fmgr::Watch {
    names: &[
        c"citus_move_shard_placement",
        c"master_move_shard_placement",
        c"citus_copy_shard_placement",
        c"master_copy_shard_placement",
        c"citus_split_shard_by_split_points",
        c"isolate_tenant_to_new_shard",
    ],
    before: fence_shard_operation,
};

/// Fences Citus' shard operations in this process (on a server that
/// preloads Citus).
pub(crate) fn init() {
    if pg::settings::current(c"citus.shard_count").is_some() {
        pg::fmgr::watch_calls(&SHARD_OPERATIONS);
    }
}

/// Locks `lambdastore.migrations` exclusively on every node until the
/// transaction ends, as `migrate_object` does, when the tables are
/// distributed and the role may: one that may not cannot move lambdastore's
/// shards either (Citus wants their owner).
fn fence_shard_operation() -> Result<()> {
    if layout()?.is_none() {
        return Ok(());
    }
    let spi = |e: pgrx::spi::SpiError| LambdaError::Internal(format!("SPI: {e}"));
    let may = pgrx::Spi::get_one::<bool>("SELECT pg_catalog.has_table_privilege('lambdastore.migrations', 'UPDATE')")
        .map_err(spi)?;
    if may == Some(true) {
        pgrx::Spi::run("LOCK TABLE lambdastore.migrations IN EXCLUSIVE MODE").map_err(spi)?;
    }
    Ok(())
}

/// Whether the transaction being prepared is named as Citus names its
/// own parts (`citus_<group>_<pid>_<n>_<n>`) with the group of a primary
/// node, whose recovery rolls back one so named that it did not record:
/// an ordinary role's PREPARE under such a name cannot hold rows or entry
/// sets for long, under another one it held them until an operator ended
/// it. (Citus prepares every node's part of a distributed transaction, for
/// any role.)
pub(crate) fn prepared_by_citus() -> Result<bool> {
    let name = pg::xact::preparing_name();
    match name.and_then(|name| lambdastore_core::cluster::transactions::group_of_citus_prepared(&name)) {
        // No statement runs at PREPARE: the queries get a snapshot of their own.
        Some(group) => pg::xact::with_snapshot(|| is_node_group(group)),
        None => Ok(false),
    }
}

/// Whether this node is a Citus cluster's coordinator, or a server alone.
pub(crate) fn on_coordinator() -> Result<bool> {
    Ok(layout()?.is_none_or(|layout| layout.local_group == 0))
}

/// Whether `group` is the group of a primary node of this Citus cluster
/// (false without Citus).
pub(crate) fn is_node_group(group: i32) -> Result<bool> {
    if layout()?.is_none() {
        return Ok(false);
    }
    pgrx::Spi::get_one_with_args::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_node WHERE groupid = $1 AND noderole = 'primary')",
        &[group.into()],
    )
    .map(|found| found == Some(true))
    .map_err(|e| LambdaError::Internal(format!("SPI: {e}")))
}

/// Waits for and takes, for the rest of the transaction, Citus' lock on
/// placement changes of the objects' colocation group
/// (`AcquirePlacementColocationLock`: advisory, class 13) in the modes a
/// split (exclusive) and a move (row exclusive) take it. Citus' own
/// operations only try it, and a try fails while anyone waits for the
/// lock in a conflicting mode, even when the trying transaction holds it:
/// holding both modes first, Citus finds them held. The second is granted
/// at once: PostgreSQL puts a request ahead of the waiters its holder's
/// locks block.
pub(crate) fn hold_shard_operations() -> Result<()> {
    let Some(layout) = layout()? else {
        return Err(LambdaError::NotPreloaded("the tables are not distributed: run lambdastore.distribute()".into()));
    };
    const ADV_LOCKTAG_CLASS_CITUS_REBALANCE_PLACEMENT_COLOCATION: u16 = 13;
    pg::locks::advisory_xact(
        0,
        layout.colocation,
        ADV_LOCKTAG_CLASS_CITUS_REBALANCE_PLACEMENT_COLOCATION,
        &[pg_sys::ExclusiveLock, pg_sys::RowExclusiveLock],
    );
    Ok(())
}

/// A statement's text at `place` (reference tables: this node's copy).
pub(crate) fn statement(sql: &'static str, place: Place) -> Result<Statement> {
    let Some(layout) = layout()? else { return Ok(Statement::Static(sql)) };
    let shard = match place {
        Place::Local(shard) => Some(shard),
        Place::Tables => None,
    };
    let key = (sql.as_ptr() as usize, sql.len(), shard);
    let text = layout.statements.borrow().get(&key).cloned();
    Ok(Statement::Rewritten(text.unwrap_or_else(|| {
        let text: Rc<str> = layout.physical(sql, shard).into();
        layout.statements.borrow_mut().insert(key, text.clone());
        text
    })))
}

/// A key that Citus places in `object`'s shard (`Layout::route_key`), if
/// the shard has one: a statement for the object can be routed by it
/// (`routed_statement`), planned once for every object of the shard.
pub(crate) fn route_key(object: i64) -> Result<Option<i64>> {
    let Some(layout) = layout()? else { return Ok(None) };
    Ok(layout.route_key(layout.owner(object).0))
}

/// `sql` with each `{route}` replaced by `key` (what `route_key` gave): a
/// constant by which Citus routes the statement when it plans it, or
/// without one `$1`. A plan made from it serves only this layout
/// (`Statement::same`): it may name a shard, which a migration may split
/// or move.
pub(crate) fn routed_statement(sql: &'static str, key: Option<i64>) -> Result<Statement> {
    let layout = layout()?.ok_or_else(|| LambdaError::Internal("a routed statement without a layout".into()))?;
    let mut routed = layout.routed.borrow_mut();
    let text = routed.entry((sql.as_ptr() as usize, sql.len(), key)).or_insert_with(|| {
        let by = key.map_or_else(|| "$1".to_string(), |key| key.to_string());
        sql.replace("{route}", &by).into()
    });
    Ok(Statement::Routed(text.clone()))
}

/// The text a kept plan was prepared from.
#[derive(Clone)]
pub(crate) enum Statement {
    Static(&'static str),
    Rewritten(Rc<str>),
    Routed(Rc<str>),
}

impl Statement {
    pub(crate) fn text(&self) -> &str {
        match self {
            Statement::Static(sql) => sql,
            Statement::Rewritten(sql) | Statement::Routed(sql) => sql,
        }
    }

    /// Whether a plan prepared from `self` serves `other`: by address, as
    /// the texts are the same ones each time (a `&'static str`, or the
    /// layout's rewritten copy until the layout is read again); a warm call
    /// compares a statement's text this way at every query.
    pub(crate) fn same(&self, other: &Statement) -> bool {
        match (self, other) {
            (Statement::Static(a), Statement::Static(b)) => std::ptr::eq(*a, *b),
            (Statement::Rewritten(a), Statement::Rewritten(b)) => Rc::ptr_eq(a, b) || a == b,
            (Statement::Routed(a), Statement::Routed(b)) => Rc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// The relation name `name` (a table or its primary key index) at `place`:
/// None for the tables themselves.
pub(crate) fn relation_suffix(name: &str, place: Place) -> Result<Option<i64>> {
    let Some(layout) = layout()? else { return Ok(None) };
    let shard = match place {
        Place::Local(shard) => Some(shard),
        Place::Tables => None,
    };
    Ok(layout.shard_id(name, shard))
}

/// Whether this transaction wrote rows of this node's copy of a reference
/// table (applications, modules, grants...). A deploy or a grant made on
/// another node writes them here through Citus, in statements that run none
/// of this extension's code on this node; PostgreSQL's statistics of the
/// transaction's own writes say so (with `track_counts` off, every
/// transaction is assumed to have). Asked at PREPARE, where no statement
/// runs: so it reads no layout, and a backend that has none in memory (one
/// that ran none of this extension's calls) is assumed to have written.
/// False when not distributed.
pub(crate) fn wrote_reference_tables() -> bool {
    let layout = match LAYOUT.with(|l| l.borrow().clone()) {
        None => return true,
        Some(None) => return false,
        Some(Some(layout)) => layout,
    };
    let oids = layout.reference_oids.get_or_init(|| {
        let copy = |(table, id)| pg::backend::relation_oid(c"lambdastore", &format!("{table}_{id}"));
        REFERENCE.iter().zip(layout.reference).map(copy).collect()
    });
    // Statistics off: nothing can be told, so assume it was.
    oids.iter().flatten().any(|&oid| pg::backend::changed_in_transaction(oid).unwrap_or(true))
}

/// `n`, drawn from one of our sequences on this node, made unique across
/// the cluster as Citus does for the sequences it distributes itself: the
/// node's group id in the top 16 bits. (Citus leaves extension-owned
/// sequences alone, so every node's copy starts at 1.)
pub(crate) fn unique(n: i64) -> Result<i64> {
    let Some(layout) = layout()? else { return Ok(n) };
    if n >= 1 << 48 {
        return Err(LambdaError::Internal(format!("sequence value {n} is past 2^48")));
    }
    Ok((i64::from(layout.local_group) << 48) | n)
}

/// This node as host:port in Citus' metadata; 'local' when the tables
/// are not distributed.
pub(crate) fn this_node() -> Result<String> {
    if !distributed()? {
        return Ok("local".into());
    }
    let node = query(
        "SELECT n.nodename || ':' || n.nodeport FROM pg_dist_node n JOIN pg_dist_local_group g USING (groupid)
          WHERE n.noderole = 'primary'",
        |rows| rows.first().get_one::<String>(),
    )?;
    Ok(node.unwrap_or_else(|| "unknown".into()))
}

#[cfg(test)]
mod tests {
    use super::rename;

    #[test]
    fn renames_whole_table_names_only() {
        let sql = "SELECT 1 FROM lambdastore.objects o JOIN lambdastore.object_types t ON true, lambdastore.objects";
        assert_eq!(
            rename(sql, "objects", 7),
            "SELECT 1 FROM lambdastore.objects_7 o JOIN lambdastore.object_types t ON true, lambdastore.objects_7"
        );
        assert_eq!(rename("lambdastore.entry_sets", "entries", 3), "lambdastore.entry_sets");
    }
}
