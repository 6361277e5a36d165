//! The catalog tables (sql/schema.sql) through SPI: applications and their
//! module versions, objects, and entries.
//!
//! Statements run through prepared plans kept for the life of the backend.
//! They are mutating plans (`prepare_mut`), so under READ COMMITTED every
//! statement takes a fresh snapshot and sees the transaction's own writes.

pub(crate) mod api_keys;
pub(crate) mod cache;
pub(crate) mod entries;
pub(crate) mod grants;
pub(crate) mod guards;
mod in_place;
pub(crate) mod modules;
pub(crate) mod objects;
mod probe;

use crate::error::{LambdaError, Result};
use crate::pg;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{PgBuiltInOids, PgOid};
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::ManuallyDrop;

pub(crate) use crate::cluster::layout::Place;
use crate::cluster::layout::{self, Statement};

thread_local! {
    // ManuallyDrop: plans live as long as the backend; freeing them from a
    // thread-local destructor during process exit would touch memory
    // contexts that are already gone.
    // Keyed by the statement's address and length, not by hashing its text:
    // a `&'static str` at one address with one length is one text (two
    // statements may start at one address if one is a prefix of the other).
    // With the text each was prepared from: on a Citus node the text names
    // shard relations, which change when the layout does.
    static PLANS: RefCell<HashMap<PlanKey, (Statement, ManuallyDrop<OwnedPreparedStatement>)>> =
        RefCell::new(HashMap::new());
}

thread_local! {
    /// Whether the current transaction has written object data (objects,
    /// entries, entry sets, jobs) through the catalog.
    static WROTE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes that the current transaction writes object data.
pub(crate) fn note_write() {
    WROTE.set(true);
}

/// Whether the current transaction has written object data here.
pub(crate) fn wrote_data() -> bool {
    WROTE.get()
}

/// At the end of every transaction.
pub(crate) fn at_transaction_end() {
    WROTE.set(false);
    in_place::forget_rows();
    layout::at_transaction_end();
}

/// When a workflow starts: it writes over no row another one read
/// (in_place.rs, `READ_AT`).
pub(crate) fn at_workflow_start() {
    in_place::forget_rows();
}

thread_local! {
    /// Relation OIDs by name, and whether the current user may read them:
    /// a warm call would otherwise pay four syscache lookups and an ACL
    /// check per entry it reads. Emptied (`forget_relations`) on every
    /// relcache invalidation, which a DROP, a re-created extension or a
    /// GRANT/REVOKE on a relation sends, and on every change of a role or
    /// of role membership (a revoked role must take its privileges along).
    /// Invalidations are processed at the latest when a transaction starts
    /// or takes a lock, as for PostgreSQL's own caches.
    static RELATIONS: RefCell<Relations> = RefCell::new(Relations::default());
}

/// A handful of entries each, looked up several times per warm call, so
/// they are scanned rather than hashed; names are keyed by their address.
/// A `&'static` C string at one address is one name (it ends at its NUL),
/// and two copies of one name only take two slots. A `CStr` key cost `strlen`, SipHash and
/// `memcmp` at every lookup, several times per call.
#[derive(Default)]
struct Relations {
    oids: Vec<((usize, Place), pgrx::pg_sys::Oid)>,
    /// (relation, user, rights) and whether the user holds those rights.
    allowed: Vec<((pgrx::pg_sys::Oid, pgrx::pg_sys::Oid, u32), bool)>,
    /// Tables and which writes may go straight to their heap (in_place.rs,
    /// `plain`): a trigger, index or constraint added since sent an
    /// invalidation, which emptied this.
    plain: Vec<(pgrx::pg_sys::Oid, in_place::Plain)>,
}

fn find<K: PartialEq, V: Copy>(entries: &[(K, V)], key: &K) -> Option<V> {
    entries.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// Registers the invalidation callbacks of `RELATIONS`; once per process,
/// from `_PG_init`.
pub(crate) fn init() {
    crate::pg::backend::on_relation_change(forget_relations);
    crate::pg::roles::on_role_change(forget_roles);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_relations(_arg: pgrx::pg_sys::Datum, _relation: pgrx::pg_sys::Oid) {
    forget();
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_roles(_arg: pgrx::pg_sys::Datum, _cache: i32, _hash: u32) {
    forget();
}

fn forget() {
    // No PostgreSQL function runs while the cache is borrowed, so no
    // invalidation can arrive then.
    RELATIONS.with(|r| *r.borrow_mut() = Relations::default());
    if layout::forget() {
        cache::forget_guards();
    }
}

/// The OID of relation `name` in schema lambdastore at `place` (on a Citus
/// node, its shard relation there), InvalidOid if there is none (the
/// extension is being dropped or recreated).
pub(crate) fn relation(name: &'static std::ffi::CStr, place: Place) -> Result<pgrx::pg_sys::Oid> {
    use pgrx::pg_sys;
    let key = (name.as_ptr() as usize, place);
    if let Some(oid) = RELATIONS.with(|r| find(&r.borrow().oids, &key)) {
        return Ok(oid);
    }
    let suffix = layout::relation_suffix(name.to_str().unwrap_or_default(), place)?;
    let name = match suffix {
        Some(id) => format!("{}_{id}", name.to_string_lossy()),
        None => name.to_string_lossy().into_owned(),
    };
    let oid = crate::pg::backend::relation_oid(c"lambdastore", &name).unwrap_or(pg_sys::InvalidOid);
    if oid != pg_sys::InvalidOid {
        RELATIONS.with(|r| r.borrow_mut().oids.push((key, oid)));
    }
    Ok(oid)
}

/// The next value of `sequence` (one of ours) made unique across a Citus
/// cluster (`cluster::layout::unique`): every node's copy of a sequence starts at 1,
/// and rows of reference tables are written from any node.
pub(crate) fn unique_id(sequence: &std::ffi::CStr) -> Result<i64> {
    let name = sequence.to_str().map_err(|e| LambdaError::Internal(e.to_string()))?;
    let n = query("SELECT nextval($1::regclass)", &[PgBuiltInOids::TEXTOID], &[name.into()], |rows| {
        rows.first().get_one::<i64>()
    })?;
    layout::unique(n.unwrap_or_default())
}

/// The XIDs of the transactions prepared now, in every database.
pub(crate) fn prepared_transactions() -> Result<Vec<u32>> {
    query_cluster("SELECT transaction::text::bigint FROM pg_prepared_xacts", &[], &[], |rows| {
        rows.into_iter().map(|row| Ok(row.get::<i64>(1)?.unwrap_or_default() as u32)).collect()
    })
}

/// A bytea column read through SPI (`row.get::<Bytes>(n)`). Not
/// `Vec<u8>`: pgrx detoasts into the parent of SPI's context, which for
/// our (atomic) connections is the transaction's context, and leaves the
/// copy there, so every value read stayed in memory until the transaction
/// ended (a call that scanned a 15 MB range again and again grew by 15 MB
/// a scan). This conversion frees its copy at once (`bytea_bytes`).
pub(crate) struct Bytes(pub Vec<u8>);

impl pgrx::FromDatum for Bytes {
    unsafe fn from_polymorphic_datum(datum: pgrx::pg_sys::Datum, is_null: bool, _: pgrx::pg_sys::Oid) -> Option<Self> {
        // SAFETY: a bytea datum of a row SPI holds (the caller's promise).
        (!is_null).then(|| Bytes(unsafe { bytea_bytes(datum) }))
    }
}

impl pgrx::IntoDatum for Bytes {
    fn into_datum(self) -> Option<pgrx::pg_sys::Datum> {
        self.0.into_datum()
    }

    fn type_oid() -> pgrx::pg_sys::Oid {
        pgrx::pg_sys::BYTEAOID
    }
}

/// Column `ordinal` of `row`, a bytea, as bytes (see `Bytes`).
pub(crate) fn bytes(row: &pgrx::spi::SpiHeapTupleData<'_>, ordinal: usize) -> pgrx::spi::Result<Option<Vec<u8>>> {
    Ok(row.get::<Bytes>(ordinal)?.map(|bytes| bytes.0))
}

/// A copy of a bytea datum's bytes; the detoasted copy PostgreSQL makes
/// of a compressed or out-of-line value is freed at once, not left in the
/// current memory context until it is reset.
///
/// # Safety
/// `datum` is a non-NULL bytea datum that stays valid during the call.
pub(crate) unsafe fn bytea_bytes(datum: pgrx::pg_sys::Datum) -> Vec<u8> {
    use pgrx::pg_sys;
    // SAFETY: the caller's promise; `plain` is ours to free when it is a copy.
    unsafe {
        let stored = datum.cast_mut_ptr::<pg_sys::varlena>();
        let plain = pg_sys::pg_detoast_datum_packed(stored);
        let bytes = pgrx::varlena::varlena_to_byte_slice(plain).to_vec();
        if plain != stored {
            pg_sys::pfree(plain.cast());
        }
        bytes
    }
}

/// Every node's rows of `lambdastore._stats_everywhere()`, as JSON.
pub(crate) fn stats_everywhere() -> Result<Vec<serde_json::Value>> {
    let rows = query_cluster("SELECT to_jsonb(s)::text FROM lambdastore._stats_everywhere() s", &[], &[], |rows| {
        rows.into_iter().map(|row| Ok(row.get::<String>(1)?.unwrap_or_default())).collect::<pgrx::spi::Result<Vec<_>>>()
    })?;
    rows.iter()
        .map(|row| serde_json::from_str(row).map_err(|e| LambdaError::Internal(format!("a stats row: {e}"))))
        .collect()
}

/// Whether the extension's tables are in this database (a process of
/// another database, or one before CREATE EXTENSION, finds none).
pub(crate) fn installed() -> bool {
    query("SELECT to_regclass('lambdastore.jobs') IS NOT NULL", &[], &[], |rows| {
        Ok(rows.first().get::<bool>(1)?.unwrap_or(false))
    })
    .unwrap_or(false)
}

/// Every application's name.
pub(crate) fn application_names() -> Result<Vec<String>> {
    query("SELECT name FROM lambdastore.applications", &[], &[], |rows| {
        rows.into_iter().map(|row| Ok(row.get::<String>(1)?.unwrap_or_default())).collect()
    })
}

/// A view an ordinary role reads, on a Citus cluster, through
/// `_visible_rows` (`_views_for_citus`, sql/citus.sql): its name, the
/// `_*_all` view behind it (sql/views.sql), and the statement reading that
/// one's rows of some applications.
pub(crate) struct BehindView {
    pub(crate) name: &'static str,
    pub(crate) behind: &'static str,
    rows: &'static str,
}

macro_rules! behind {
    ($name:literal, $behind:literal) => {
        BehindView {
            name: $name,
            behind: $behind,
            // Each row as the text of its composite type, which the view
            // casts back (exact: JSON's numbers are not, nor its null apart
            // from SQL's), made after Citus has gathered the rows (a CTE it
            // runs first).
            rows: concat!(
                "WITH rows AS MATERIALIZED (SELECT * FROM lambdastore.",
                $behind,
                " v WHERE $1 OR v.app = ANY ($2)) SELECT r::text FROM rows r"
            ),
        }
    };
}

/// Every view `_visible_rows` reads, the one list of them.
pub(crate) const BEHIND_VIEWS: [BehindView; 8] = [
    behind!("app_objects", "_objects_all"),
    behind!("app_entries", "_entries_all"),
    behind!("app_entry_sets", "_entry_sets_all"),
    behind!("app_jobs", "_jobs_all"),
    behind!("app_schedules", "_schedules_all"),
    behind!("_app_queue_limits", "_queue_limits_all"),
    behind!("app_api_keys", "_api_keys_all"),
    behind!("app_versions", "_versions_all"),
];

/// The view behind whose name is `behind`, if it is one.
pub(crate) fn behind_view(behind: &str) -> Option<&'static BehindView> {
    BEHIND_VIEWS.iter().find(|view| view.behind == behind)
}

/// The rows of `view`'s `_*_all` view, as text, of the applications
/// `apps` (of every one if `every_app`).
pub(crate) fn all_rows(view: &BehindView, every_app: bool, apps: Vec<String>) -> Result<Vec<String>> {
    query_cluster(
        view.rows,
        &[PgBuiltInOids::BOOLOID, PgBuiltInOids::TEXTARRAYOID],
        &[every_app.into(), apps.into()],
        |rows| rows.into_iter().map(|row| Ok(row.get::<String>(1)?.unwrap_or_default())).collect(),
    )
}

/// Object `object_id`'s application and its entry sets in key order, each
/// with its version and recent conflicts (the node's shared memory): one
/// statement, which Citus runs on the object's node, counters included.
pub(crate) fn entry_sets_counted(object_id: i64) -> Result<Vec<(String, String, Vec<u8>, i64, i64)>> {
    query_cluster(
        "SELECT o.app, s.lower_field, s.lower_key, c.version, c.conflicts
           FROM lambdastore.objects o JOIN lambdastore.entry_sets s ON s.object_id = o.object_id,
                lambdastore._entry_set_counters(s.object_id, s.lower_field, s.lower_key) c
          WHERE o.object_id = $1 AND s.object_id = $1
          ORDER BY s.lower_field, s.lower_key",
        &[PgBuiltInOids::INT8OID],
        &[object_id.into()],
        |rows| {
            rows.into_iter()
                .map(|row| {
                    Ok((
                        row.get::<String>(1)?.unwrap_or_default(),
                        row.get::<String>(2)?.unwrap_or_default(),
                        row.get::<Vec<u8>>(3)?.unwrap_or_default(),
                        row.get::<i64>(4)?.unwrap_or_default(),
                        row.get::<i64>(5)?.unwrap_or_default(),
                    ))
                })
                .collect()
        },
    )
}

/// The GID of prepared transaction `xid`, if it is still prepared.
pub(crate) fn prepared_gid(xid: u32) -> Result<Option<String>> {
    query(
        "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE transaction::text = $1",
        &[PgBuiltInOids::TEXTOID],
        &[xid.to_string().into()],
        |rows| rows.into_iter().next().map(|row| row.get::<String>(1)).transpose().map(Option::flatten),
    )
}

/// `in_place::plain`'s verdict on table `oid`, worked out by `judge` on a
/// miss. Asked with the table open, so invalidations have been taken in.
fn remembered_plain(oid: pgrx::pg_sys::Oid, judge: impl FnOnce() -> in_place::Plain) -> in_place::Plain {
    if let Some(plain) = RELATIONS.with(|r| find(&r.borrow().plain, &oid)) {
        return plain;
    }
    let plain = judge();
    RELATIONS.with(|r| r.borrow_mut().plain.push((oid, plain)));
    plain
}

/// Whether the current user may read relation `oid`: the check SPI makes
/// on every statement, for the paths that skip SPI (probes, the cache).
pub(crate) fn may_select(oid: pgrx::pg_sys::Oid) -> bool {
    may(oid, pgrx::pg_sys::ACL_SELECT)
}

/// Whether the current user holds every right of `mode` on relation `oid`,
/// remembered until the next invalidation (`RELATIONS`).
pub(crate) fn may(oid: pgrx::pg_sys::Oid, mode: u32) -> bool {
    let key = (oid, crate::pg::roles::current_user(), mode);
    if let Some(allowed) = RELATIONS.with(|r| find(&r.borrow().allowed, &key)) {
        return allowed;
    }
    let allowed = crate::pg::roles::may(key.0, key.1, mode);
    RELATIONS.with(|r| {
        let known = &mut r.borrow_mut().allowed;
        // A backend that switches between many roles starts again.
        if known.len() >= 64 {
            known.clear();
        }
        known.push((key, allowed));
    });
    allowed
}

/// A statement's address and length, and where it runs: a `&'static str`
/// at one address with one length is one text (two statements may start at
/// one address if one is a prefix of the other).
type PlanKey = (usize, usize, Target);

/// Where a statement's tables are.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Target {
    /// As written: on a Citus node, planned by Citus (cluster-wide reads,
    /// writes of reference tables).
    Cluster,
    /// At a place: the tables, or this node's shard relations.
    At(Place),
    /// Planned by Citus, routed by its `{route}`s: a constant key of one
    /// shard, or (None) `$1` (`layout::routed_statement`).
    Routed(Option<i64>),
}

/// The kept plan of `sql` at `target`, taken out of the map while in use
/// (so that a nested use of the same statement, a trigger calling back
/// into us, prepares its own); prepared again when its text changed.
fn take_plan(
    client: &SpiClient<'_>,
    sql: &'static str,
    target: Target,
    types: &[PgBuiltInOids],
) -> Result<(PlanKey, Statement, ManuallyDrop<OwnedPreparedStatement>)> {
    let key = (sql.as_ptr() as usize, sql.len(), target);
    let text = match target {
        Target::Cluster => Statement::Static(sql),
        Target::At(place) => layout::statement(sql, place)?,
        Target::Routed(key) => layout::routed_statement(sql, key)?,
    };
    if let Some((kept, plan)) = PLANS.with(|plans| plans.borrow_mut().remove(&key)) {
        if kept.same(&text) {
            return Ok((key, kept, plan));
        }
        drop(ManuallyDrop::into_inner(plan));
    }
    let plan = prepare(client, text.text(), types).map_err(spi_error)?;
    Ok((key, text, ManuallyDrop::new(plan)))
}

fn spi_error(e: pgrx::spi::SpiError) -> LambdaError {
    LambdaError::Internal(format!("SPI: {e}"))
}

/// Runs the kept plan of `sql` (preparing it on first use) and hands the
/// rows to `read` while the SPI connection is open. Reference tables are
/// this node's copy; for the per-object tables use `query_at`.
pub(crate) fn query<R>(
    sql: &'static str,
    types: &[PgBuiltInOids],
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(SpiTupleTable<'_>) -> pgrx::spi::Result<R>,
) -> Result<R> {
    run(Target::At(Place::Tables), sql, types, args, read)
}

/// `query` for the rows of one object: on a Citus node, its shard there.
pub(crate) fn query_at<R>(
    place: Place,
    sql: &'static str,
    types: &[PgBuiltInOids],
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(SpiTupleTable<'_>) -> pgrx::spi::Result<R>,
) -> Result<R> {
    run(Target::At(place), sql, types, args, read)
}

/// `query` through Citus on a Citus node: writes of the reference tables
/// (every copy, in one distributed transaction) and reads of every shard.
/// Never from a call forwarded to this node (Citus forbids it there).
pub(crate) fn query_cluster<R>(
    sql: &'static str,
    types: &[PgBuiltInOids],
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(SpiTupleTable<'_>) -> pgrx::spi::Result<R>,
) -> Result<R> {
    run(Target::Cluster, sql, types, args, read)
}

/// `query_cluster` for a statement Citus routes by `key` (its `{route}`s):
/// a constant of one shard (`layout::route_key`), whichever of the shard's
/// objects the statement is for, so that Citus plans it once per shard; or,
/// for a shard without one, `$1`, the object, planned at every run.
pub(crate) fn query_routed<R>(
    sql: &'static str,
    key: Option<i64>,
    types: &[PgBuiltInOids],
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(SpiTupleTable<'_>) -> pgrx::spi::Result<R>,
) -> Result<R> {
    run(Target::Routed(key), sql, types, args, read)
}

fn run<R>(
    target: Target,
    sql: &'static str,
    types: &[PgBuiltInOids],
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(SpiTupleTable<'_>) -> pgrx::spi::Result<R>,
) -> Result<R> {
    Spi::connect(|client| {
        let (key, text, plan) = take_plan(client, sql, target, types)?;
        // `select` runs the mutating plan all the same (a fresh snapshot per
        // statement), but unlike `update` does not force an XID on the
        // transaction: a read-only call must stay a read-only transaction,
        // with no commit record to write and flush.
        let select = || client.select(&*plan, None, args);
        // Routed by a constant key, Citus plans the statement once: its
        // generic plan, which Citus itself would price above custom ones.
        let outcome = match target {
            Target::Routed(Some(_)) => pg::settings::with_generic_plans(select),
            _ => select(),
        }
        .and_then(read);
        PLANS.with(|plans| plans.borrow_mut().insert(key, (text, plan)));
        outcome.map_err(spi_error)
    })
}

/// Runs the kept plan of `sql` as a cursor and hands its rows to `read`,
/// `chunk` rows at a time, until they run out or `read` returns an error
/// of ours: a large result is never held whole, and `read` can stop early.
pub(crate) fn query_chunks(
    place: Place,
    sql: &'static str,
    types: &[PgBuiltInOids],
    args: &[DatumWithOid<'_>],
    chunk: i64,
    mut read: impl FnMut(SpiTupleTable<'_>) -> pgrx::spi::Result<Result<()>>,
) -> Result<()> {
    Spi::connect(|client| {
        let (key, text, plan) = take_plan(client, sql, Target::At(place), types)?;
        let mut fetch_all = || -> pgrx::spi::Result<Result<()>> {
            // An index range scan whatever the bounds and limit.
            let mut cursor = pg::settings::with_generic_plans(|| client.try_open_cursor(&*plan, args))?;
            loop {
                let rows = cursor.fetch(chunk)?;
                if rows.is_empty() {
                    return Ok(Ok(()));
                }
                if let Err(stop) = read(rows)? {
                    return Ok(Err(stop));
                }
            }
        };
        let outcome = fetch_all();
        PLANS.with(|plans| plans.borrow_mut().insert(key, (text, plan)));
        outcome.map_err(spi_error)?
    })
}

fn prepare(client: &SpiClient<'_>, sql: &str, types: &[PgBuiltInOids]) -> pgrx::spi::Result<OwnedPreparedStatement> {
    let oids: Vec<PgOid> = types.iter().map(|t| PgOid::BuiltIn(*t)).collect();
    Ok(client.prepare_mut(sql, &oids)?.keep())
}
