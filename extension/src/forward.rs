//! Calls that reach a Citus node which does not hold their object run on
//! the node that does, inside the caller's transaction.
//!
//! `lambda_invoke`, `create_object` and `submit` on such a node send one
//! statement through Citus, routed by the object id to the shard's node:
//! `SELECT lambdastore._invoke_here(...) FROM (SELECT count(*) FROM
//! lambdastore.objects WHERE object_id = $1) routed`. Citus sends a query
//! whose tables all fall in one shard to that shard's node as it is, so
//! the function runs there, in the backend that holds this distributed
//! transaction's part on that node (the aggregate makes one row whether or
//! not the object exists). There it is an ordinary local workflow: its
//! entry sets are locked and validated in that node's shared memory, its
//! writes go to that node's shards.
//!
//! What does not travel by itself travels as arguments: the caller (by
//! role name: Citus creates roles on every node, their OIDs differ), the
//! caller's `lambdastore.timeout` (capped as the caller's is) and the
//! session's other lambdastore settings (`gucs::travelling`). The forwarded
//! statement runs as the bootstrap superuser (`access::as_storage`), and
//! `_invoke_here` is for superusers only, so no role can claim to be
//! another.
//!
//! Citus takes a call for a SELECT, so a call that wrote marks its node as
//! written with a no-op UPDATE routed there (`engage`): Citus then commits
//! it together with whatever else the transaction modified through Citus.
//! A transaction whose lambdastore calls ran on one node commits as Citus
//! commits it: with a plain COMMIT on that node, whose commit callback
//! applies OCC's version bumps. Once calls of one transaction that writes
//! have run on two nodes, it commits in two phases, every node it ran calls
//! on taking part: each prepared node validates its reads again and hands
//! its writer counts and bumps to shared memory (txn/prepared.rs), the node
//! that commits validates its own again, and Citus' recovery ends what a
//! crash left prepared.

use crate::access::{as_storage, Caller};
use crate::catalog::{self, shards};
use crate::error::{LambdaError, Result};
use crate::gucs;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::PgTryBuilder;
use std::cell::RefCell;

/// Where the current transaction's lambdastore calls ran.
#[derive(Default)]
struct Reach {
    /// Objects of calls forwarded to other nodes, with their node, and
    /// whether that node's part has been marked as written for Citus.
    forwarded: Vec<(i64, String, bool)>,
    /// Whether calls ran on this node.
    here: bool,
    /// Whether any call wrote, here or elsewhere.
    wrote: bool,
    /// Whether the transaction commits in two phases.
    two_phase: bool,
}

impl Reach {
    /// Whether calls ran on two nodes or more (this one counts if calls
    /// ran here).
    fn spread(&self) -> bool {
        let mut nodes: Vec<&str> = self.forwarded.iter().map(|(_, node, _)| node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes.len() + usize::from(self.here) >= 2
    }
}

thread_local! {
    static REACH: RefCell<Reach> = RefCell::new(Reach::default());
}

/// At the end of every transaction.
pub(crate) fn at_transaction_end() {
    REACH.with(|r| *r.borrow_mut() = Reach::default());
}

/// Whether the current transaction ran calls on more than one node.
pub(crate) fn spread() -> bool {
    REACH.with(|r| r.borrow().spread())
}

/// Before this node commits a transaction that ran calls on several
/// nodes and wrote nothing (one that wrote commits in two phases, and
/// each prepared node validates at PREPARE): every other node it ran
/// calls on validates its reads again. Reads on several nodes are one
/// serializable transaction only if they all still hold at one moment;
/// now, after the last read, is that moment if they all still hold.
pub(crate) fn validate_elsewhere() -> Result<()> {
    let objects: Vec<(i64, String)> = REACH.with(|r| {
        let reach = r.borrow();
        if reach.two_phase || !reach.spread() {
            return Vec::new();
        }
        reach.forwarded.iter().map(|(object, node, _)| (*object, node.clone())).collect()
    });
    if objects.is_empty() {
        return Ok(());
    }
    // At pre-commit no statement is running: SPI needs a snapshot. (An
    // error aborts the transaction, which pops it.)
    // SAFETY: inside the transaction, on the main thread.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    for (object, _) in objects {
        let sql = "SELECT lambdastore._validate_here()
                     FROM (SELECT count(*) FROM lambdastore.objects WHERE object_id = $1) routed";
        routed(sql, object, Vec::new())?;
    }
    // SAFETY: pairs with the push above.
    unsafe { pg_sys::PopActiveSnapshot() };
    Ok(())
}

/// The node holding `object`'s shard when it is not this one (None when
/// the tables are not distributed).
pub(crate) fn owner_elsewhere(object: i64) -> Result<Option<String>> {
    let Some(layout) = shards::layout()? else { return Ok(None) };
    Ok((!layout.is_local(object)).then(|| layout.node_of(object).to_string()))
}

/// Whether this transaction has written object data on this node (not
/// whether it has an XID: `nextval` takes one).
fn wrote_here() -> bool {
    catalog::wrote_data()
}

/// After a call ran on this node.
pub(crate) fn ran_here() -> Result<()> {
    REACH.with(|r| {
        let mut reach = r.borrow_mut();
        reach.here = true;
        reach.wrote |= wrote_here();
    });
    engage(None)
}

/// After a call ran on `node`, for `object`. A call that wrote marks its
/// node as written for Citus at once, whatever else the transaction does:
/// Citus commits the nodes it saw modified together (in two phases when
/// there are several: the gateway's idempotency key and the call it
/// records, say), and the others after them.
fn ran_on(node: &str, object: i64, wrote: bool) -> Result<()> {
    REACH.with(|r| {
        let mut reach = r.borrow_mut();
        reach.wrote |= wrote;
        if !reach.forwarded.iter().any(|(o, _, _)| *o == object) {
            reach.forwarded.push((object, node.to_string(), false));
        }
    });
    engage(wrote.then_some(object))
}

/// Marks `written` (a forwarded call's object) as written for Citus; and
/// once a transaction that writes has run calls on two nodes, asks for
/// two-phase commit, with every node it ran calls on taking part.
fn engage(written: Option<i64>) -> Result<()> {
    let (engaged, unmarked): (bool, Vec<i64>) = REACH.with(|r| {
        let mut reach = r.borrow_mut();
        reach.two_phase |= reach.wrote && reach.spread();
        let two_phase = reach.two_phase;
        let unmarked = reach
            .forwarded
            .iter_mut()
            .filter(|(object, _, marked)| !*marked && (two_phase || Some(*object) == written))
            .map(|(object, _, marked)| {
                *marked = true;
                *object
            })
            .collect();
        (two_phase, unmarked)
    });
    if unmarked.is_empty() {
        return Ok(());
    }
    if engaged {
        citus_function(c"Use2PCForCoordinatedTransaction")?;
    }
    // Citus prepares only the connections that ran a modification; a call
    // is a SELECT to it. A no-op UPDATE routed by the call's object runs on
    // that call's connection (Citus keeps a shard's placements on one
    // connection per transaction).
    for object in unmarked {
        as_storage(|_| {
            catalog::query_cluster(
                "UPDATE lambdastore.objects SET app = app WHERE object_id = $1 AND created IS NULL",
                &[INT8OID],
                &[object.into()],
                |_| Ok(()),
            )
        })?;
    }
    Ok(())
}

/// The result of a statement run by a forwarded call on its node: "w" or
/// "r" (whether that node's part of the transaction has written), then
/// the result.
pub(crate) fn here_result(result: String) -> String {
    let flag = if wrote_here() { 'w' } else { 'r' };
    format!("{flag}{result}")
}

/// Calls `void f(void)` of citus.so, loaded since the tables are
/// distributed: `UseCoordinatedTransaction` makes Citus open a transaction
/// block on every node this transaction reaches from now on (it sends a
/// single-shard SELECT outside `BEGIN` as a statement of its own, which
/// the node commits at once: a forwarded call would commit there even if
/// the statement calling it failed afterwards); the other marks the
/// transaction for two-phase commit.
fn citus_function(name: &'static std::ffi::CStr) -> Result<()> {
    // SAFETY: looks a symbol up in citus.so; signalNotFound false returns
    // NULL instead of raising. (PostgreSQL caches the library's handle.)
    let f = unsafe { pg_sys::load_external_function(c"citus".as_ptr(), name.as_ptr(), false, std::ptr::null_mut()) };
    if f.is_null() {
        return Err(LambdaError::Internal(format!("citus.so has no {name:?}")));
    }
    // SAFETY: both are `void f(void)` in Citus 13; called inside a
    // transaction on the main thread, as Citus' executor calls them.
    unsafe { std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C-unwind" fn()>(f)() };
    Ok(())
}

/// Runs `sql`, routed by `object` (its $1) to the node holding it, with
/// the other arguments (all text but the fifth, a bigint), and returns its
/// one text value. An error on the other node comes back as an ERROR of
/// the SPI call, which pgrx turns into a panic carrying a Rust backtrace:
/// caught, and raised again as that node's error, which ends the
/// transaction.
fn routed(sql: &'static str, object: i64, args: Vec<pgrx::datum::DatumWithOid<'_>>) -> Result<String> {
    const TYPES: [pg_sys::PgBuiltInOids; 7] = [INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, TEXTOID];
    let mut all = vec![object.into()];
    all.extend(args);
    let run = || catalog::query_cluster(sql, &TYPES[..all.len()], &all, |rows| rows.first().get_one::<String>());
    let out = as_storage(|_| {
        PgTryBuilder::new(run)
            .catch_others(|caught| match caught {
                CaughtError::PostgresError(e)
                | CaughtError::ErrorReport(e)
                | CaughtError::RustPanic { ereport: e, .. } => Err(LambdaError::Remote {
                    code: e.sql_error_code(),
                    message: e.message().to_string(),
                    detail: e.detail().unwrap_or_default().to_string(),
                }),
            })
            .execute()
    })?;
    Ok(out.unwrap_or_default())
}

fn forward(sql: &'static str, object: i64, node: &str, texts: [&str; 3], caller: Caller) -> Result<String> {
    citus_function(c"UseCoordinatedTransaction")?;
    let role = caller.name();
    let timeout = gucs::timeout(caller.is_superuser()).as_millis() as i64;
    let settings = gucs::travelling();
    let out = routed(
        sql,
        object,
        vec![
            texts[0].into(),
            texts[1].into(),
            texts[2].into(),
            role.as_str().into(),
            timeout.into(),
            settings.as_str().into(),
        ],
    )?;
    let (flag, result) = out.split_at(out.len().min(1));
    ran_on(node, object, flag == "w")?;
    Ok(result.to_string())
}

/// `lambda_invoke` of an object stored on `node`.
pub(crate) fn invoke(caller: Caller, object: i64, node: &str, method: &str, args: &str) -> Result<String> {
    forward(
        "SELECT lambdastore._invoke_here($1, $2, $3, $4, $5, $6, $7)
           FROM (SELECT count(*) FROM lambdastore.objects WHERE object_id = $1) routed",
        object,
        node,
        [method, args, ""],
        caller,
    )
}

/// `lambdastore.submit` for an object stored on `node`.
pub(crate) fn submit(
    caller: Caller,
    object: i64,
    node: &str,
    method: &str,
    args: &str,
    key: Option<&str>,
) -> Result<i64> {
    let job = forward(
        "SELECT lambdastore._submit_here($1, $2, $3, $4, $5, $6, $7)
           FROM (SELECT count(*) FROM lambdastore.objects WHERE object_id = $1) routed",
        object,
        node,
        [method, args, key.unwrap_or_default()],
        caller,
    )?;
    job.parse().map_err(|_| LambdaError::Internal(format!("a forwarded submit returned {job:?}")))
}

/// What `claim_job_key` found.
pub(crate) enum KeyClaim {
    /// One server (the jobs' unique index does it), or no such object (the
    /// submission fails with 42704 where it runs).
    NotNeeded,
    /// Claimed for this application: queue the job, then `record_job_key`.
    Claimed(String),
    /// Used already, for this same call: its job.
    Existing(i64),
}

/// On a Citus cluster, a submission's idempotency key, claimed cluster-wide
/// before the job is queued (on this node or forwarded). Refused (42501)
/// to a caller that may not invoke the object's application, as the
/// submission would be.
pub(crate) fn claim_job_key(caller: Caller, object: i64, key: &str, method: &str, args: &str) -> Result<KeyClaim> {
    if !shards::distributed()? {
        return Ok(KeyClaim::NotNeeded);
    }
    let Some(app) = catalog::jobs::app_of(object)? else { return Ok(KeyClaim::NotNeeded) };
    crate::access::check(caller, &app, crate::access::Privilege::Invoke)?;
    crate::jobs::check_key_length(key)?;
    Ok(match catalog::jobs::claim_key(&app, key, object, method, args)? {
        Some(job) => KeyClaim::Existing(job),
        None => KeyClaim::Claimed(app),
    })
}

/// The job queued under a key `claim_job_key` claimed.
pub(crate) fn record_job_key(app: &str, key: &str, job: i64) -> Result<()> {
    catalog::jobs::record_key_job(app, key, job)
}

/// `lambdastore.delete_object` of an object stored on `node`: whether it
/// existed.
pub(crate) fn delete(caller: Caller, object: i64, node: &str) -> Result<bool> {
    let existed = forward(
        "SELECT lambdastore._delete_here($1, $2, $3, $4, $5, $6, $7)
           FROM (SELECT count(*) FROM lambdastore.objects WHERE object_id = $1) routed",
        object,
        node,
        ["", "", ""],
        caller,
    )?;
    Ok(existed == "true")
}

/// `lambdastore.split` on an object stored on `node` (the key as hex).
pub(crate) fn split(caller: Caller, object: i64, node: &str, field: &str, key: &[u8]) -> Result<bool> {
    let split = forward(
        "SELECT lambdastore._split_here($1, $2, $3, $4, $5, $6, $7)
           FROM (SELECT count(*) FROM lambdastore.objects WHERE object_id = $1) routed",
        object,
        node,
        [field, &hex::encode(key), ""],
        caller,
    )?;
    Ok(split == "true")
}

/// `lambdastore.create_object` on a node that holds no shard: on the node
/// of an id drawn here, which then draws one of its own.
pub(crate) fn create(caller: Caller, app: &str, type_name: &str, args: &str) -> Result<i64> {
    let route = catalog::objects::draw_id()?;
    let node = owner_elsewhere(route)?.unwrap_or_default();
    let id = forward(
        "SELECT lambdastore._create_here($1, $2, $3, $4, $5, $6, $7)
           FROM (SELECT count(*) FROM lambdastore.objects WHERE object_id = $1) routed",
        route,
        &node,
        [app, type_name, args],
        caller,
    )?;
    id.parse().map_err(|_| LambdaError::Internal(format!("a forwarded create returned {id:?}")))
}

/// Whether `create_object` must be forwarded: the tables are distributed
/// and this node holds none of their shards (a coordinator).
pub(crate) fn create_elsewhere() -> Result<bool> {
    Ok(shards::layout()?.is_some_and(|layout| !layout.holds_shards()))
}

/// On the node a call was forwarded to: the caller's settings, for this
/// transaction, and the caller.
pub(crate) fn arrive(role: &str, timeout_ms: i64, settings: &str) -> Result<Caller> {
    // SAFETY: a syscache lookup by name; missing_ok false raises 42704.
    let caller = Caller(unsafe {
        let name = std::ffi::CString::new(role).map_err(|_| LambdaError::InvalidParameter("a role name".into()))?;
        pg_sys::get_role_oid(name.as_ptr(), false)
    });
    gucs::set_local("lambdastore.timeout", &timeout_ms.to_string());
    gucs::arrive(settings);
    Ok(caller)
}
