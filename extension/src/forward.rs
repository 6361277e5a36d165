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
//! caller's `lambdastore.timeout` and `concurrency_control`. The forwarded
//! statement runs as the bootstrap superuser (`access::as_storage`), and
//! `_invoke_here` is for superusers only, so no role can claim to be
//! another.
//!
//! Citus commits a distributed transaction whose statements were all
//! SELECTs with one plain COMMIT per node, not with two-phase commit, and
//! PostgreSQL runs no commit callback for a prepared transaction (OCC's
//! version bumps happen there). So a transaction may write, through
//! lambdastore, on one node only: a second node's write fails the
//! transaction (0A000) before anything commits. Reads on several nodes
//! are fine: each node validates its own, and without a transaction that
//! writes on two nodes there is no cross-node dependency to order.

use crate::access::{as_storage, Caller};
use crate::catalog::{self, shards};
use crate::error::{LambdaError, Result};
use crate::gucs;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::cell::RefCell;

thread_local! {
    /// The node this transaction wrote on through a forwarded call.
    static WROTE_ON: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// At the end of every transaction.
pub(crate) fn at_transaction_end() {
    WROTE_ON.with(|w| w.borrow_mut().take());
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

/// Fails the transaction if it wrote on a node other than `node` (None:
/// this one).
fn note_write(node: Option<&str>) -> Result<()> {
    let elsewhere = WROTE_ON.with(|w| w.borrow().clone());
    let conflict = match (node, elsewhere.as_deref()) {
        (Some(node), Some(before)) if node != before => Some(format!("on {before} and on {node}")),
        (Some(node), None) if wrote_here() => Some(format!("on this node and on {node}")),
        (None, Some(before)) if wrote_here() => Some(format!("on {before} and on this node")),
        _ => None,
    };
    if let Some(nodes) = conflict {
        return Err(LambdaError::CrossNodeWrites(format!(
            "this transaction wrote {nodes}: a transaction may write objects of one node only (atomic commits \
             across nodes are not supported yet)"
        )));
    }
    if let Some(node) = node {
        WROTE_ON.with(|w| *w.borrow_mut() = Some(node.to_string()));
    }
    Ok(())
}

/// After a call ran here: whether it wrote, with forwarded writes before.
pub(crate) fn check_local_write() -> Result<()> {
    note_write(None)
}

/// The result of a statement run by a forwarded call on its node: "w" or
/// "r" (whether that node's part of the transaction has written), then
/// the result.
pub(crate) fn here_result(result: String) -> String {
    let flag = if wrote_here() { 'w' } else { 'r' };
    format!("{flag}{result}")
}

/// Makes Citus open a transaction block on every node this transaction
/// reaches from now on. Citus sends a single-shard SELECT outside a
/// `BEGIN` block as a statement of its own, which the node commits at once:
/// a forwarded call would commit there even if the statement calling it
/// failed afterwards.
fn coordinated() -> Result<()> {
    thread_local! {
        static START: std::cell::OnceCell<Option<unsafe extern "C-unwind" fn()>> = const { std::cell::OnceCell::new() };
    }
    let start = START.with(|s| {
        *s.get_or_init(|| {
            // SAFETY: looks up a symbol of citus.so (loaded: the tables are
            // distributed); signalNotFound false returns NULL instead.
            let f = unsafe {
                pg_sys::load_external_function(
                    c"citus".as_ptr(),
                    c"UseCoordinatedTransaction".as_ptr(),
                    false,
                    std::ptr::null_mut(),
                )
            };
            // SAFETY: Citus declares it `void UseCoordinatedTransaction(void)`.
            (!f.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C-unwind" fn()>(f) })
        })
    });
    let start = start.ok_or_else(|| LambdaError::Internal("citus.so has no UseCoordinatedTransaction".into()))?;
    // SAFETY: inside a transaction, on the main thread, as Citus' executor calls it.
    unsafe { start() };
    Ok(())
}

fn forward(sql: &'static str, object: i64, node: &str, texts: [&str; 3], caller: Caller) -> Result<String> {
    coordinated()?;
    let role = caller.name();
    let timeout = gucs::timeout(caller.is_superuser()).as_millis() as i64;
    let out = as_storage(|_| {
        catalog::query_cluster(
            sql,
            &[INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, BOOLOID],
            &[
                object.into(),
                texts[0].into(),
                texts[1].into(),
                texts[2].into(),
                role.as_str().into(),
                timeout.into(),
                gucs::occ().into(),
            ],
            |rows| rows.first().get_one::<String>(),
        )
    })?
    .unwrap_or_default();
    let (flag, result) = out.split_at(out.len().min(1));
    if flag == "w" {
        note_write(Some(node))?;
    }
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
pub(crate) fn submit(caller: Caller, object: i64, node: &str, method: &str, args: &str) -> Result<i64> {
    let job = forward(
        "SELECT lambdastore._submit_here($1, $2, $3, $4, $5, $6, $7)
           FROM (SELECT count(*) FROM lambdastore.objects WHERE object_id = $1) routed",
        object,
        node,
        [method, args, ""],
        caller,
    )?;
    job.parse().map_err(|_| LambdaError::Internal(format!("a forwarded submit returned {job:?}")))
}

/// `lambdastore.create_object` on a node that holds no shard: on the node
/// of an id drawn here, which then draws one of its own.
pub(crate) fn create(caller: Caller, app: &str, type_name: &str, args: &str) -> Result<i64> {
    let route = as_storage(|_| catalog::objects::draw_id())?;
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
pub(crate) fn arrive(role: &str, timeout_ms: i64, occ: bool) -> Result<Caller> {
    // SAFETY: a syscache lookup by name; missing_ok false raises 42704.
    let caller = Caller(unsafe {
        let name = std::ffi::CString::new(role).map_err(|_| LambdaError::InvalidParameter("a role name".into()))?;
        pg_sys::get_role_oid(name.as_ptr(), false)
    });
    gucs::set_local("lambdastore.timeout", &timeout_ms.to_string());
    gucs::set_local("lambdastore.concurrency_control", if occ { "occ" } else { "off" });
    Ok(caller)
}
