//! The SQL entry points (`lambda_invoke`, `create_object`, `submit`,
//! `delete_object`, `split`) on a Citus node that does not hold their
//! object: sent to the node that does (route.rs), inside the caller's
//! transaction. A call's lambda may need calls on other nodes in turn:
//! this node drives them (host/remote.rs).

use crate::access::Caller;
use crate::catalog;
use crate::cluster::layout;
use crate::cluster::route::{self, owner_elsewhere};
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::workflow;

/// Sends one of the `_here` functions for `caller`, with the session's
/// `lambdastore.timeout`.
fn forward(sql: &'static str, object: i64, node: &str, texts: [&str; 3], caller: Caller) -> Result<String> {
    route::send(sql, object, node, texts, caller, gucs::timeout(caller.is_superuser()))
}

/// `lambda_invoke` of an object stored on `node`.
pub(crate) fn invoke(caller: Caller, object: i64, node: &str, method: &str, args: &str) -> Result<String> {
    workflow::invoke_elsewhere(caller, object, node, method, args)
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
    if !layout::distributed()? {
        return Ok(KeyClaim::NotNeeded);
    }
    let Some(app) = crate::jobs::queue::app_of(object)? else { return Ok(KeyClaim::NotNeeded) };
    crate::access::check(caller, &app, crate::access::Privilege::Invoke)?;
    crate::jobs::check_key_length(key)?;
    Ok(match crate::jobs::queue::claim_key(&app, key, object, method, args)? {
        Some(job) => KeyClaim::Existing(job),
        None => KeyClaim::Claimed(app),
    })
}

/// The job queued under a key `claim_job_key` claimed.
pub(crate) fn record_job_key(app: &str, key: &str, job: i64) -> Result<()> {
    crate::jobs::queue::record_key_job(app, key, job)
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
/// of an id drawn here (spreading new objects over the nodes), which then
/// draws one of its own.
pub(crate) fn create(caller: Caller, app: &str, type_name: &str, args: &str) -> Result<i64> {
    let route = catalog::objects::draw_id()?;
    let node = owner_elsewhere(route)?.unwrap_or_default();
    workflow::create_elsewhere(caller, route, &node, app, type_name, args)
}

/// Whether `create_object` must be forwarded: the tables are distributed
/// and this node holds none of their shards (a coordinator).
pub(crate) fn create_elsewhere() -> Result<bool> {
    Ok(layout::layout()?.is_some_and(|layout| !layout.holds_shards()))
}
