//! The SQL entry points (`lambda_invoke`, `create_object`, `submit`,
//! `delete_object`, `split`) on a Citus node that does not hold their
//! object: sent to the node that does (route.rs), inside the caller's
//! transaction. A call's lambda may need calls on other nodes in turn:
//! this node drives them (remote.rs). And their other end: what the node
//! holding the object runs when one arrives (`run_forwarded`, behind the
//! `_here` functions of api.rs).

use crate::access::Caller;
use crate::catalog;
use crate::cluster::layout;
use crate::cluster::route::{self, here, owner_elsewhere, Routed};
use crate::cluster::{remote, replica};
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::host::{calls, registry};
use crate::txn::Workflow;
use crate::workflow::{self, commit, start, validated, Finished};
use lambdastore_core::model::{CallFailure, Create, Draw, Forwarded, MethodCall, Reply, Spawned};
use pgrx::datum::TimestampWithTimeZone;
use std::rc::Rc;
use std::time::Duration;

/// Sends one of the `_here` functions for `caller`, with the session's
/// `lambdastore.timeout`.
fn forward(sql: Routed, object: i64, node: &str, texts: [&str; 3], caller: Caller) -> Result<String> {
    route::send(sql, object, node, texts, Vec::new(), caller, gucs::timeout(caller.is_superuser()), false)
}

/// `lambda_invoke` of an object stored on `node`: sent there, with the
/// calls its lambda needs on other nodes made from here; those on objects
/// of this node run in a workflow of this node, committed after it.
pub(crate) fn invoke(caller: Caller, object: i64, node: &str, method: &str, args: &str) -> Result<String> {
    if let Some(result) = replica::invoke(caller, object, node, method, args)? {
        return Ok(result);
    }
    let call = MethodCall { object, method: method.into(), args: args.into(), readonly: false, depth: 0 };
    if route::may_send_alone()? {
        return remote::send_alone(caller, &call);
    }
    drive_from_sql(caller, |workflow| remote::drive(workflow, None, node, call, &[], calls::run_needed))
}

/// A call from SQL sent to another node by `drive`, in a workflow of this
/// node that commits the calls it needed here.
fn drive_from_sql(
    caller: Caller,
    drive: impl FnOnce(&Rc<Workflow>) -> Result<Result<String, CallFailure>>,
) -> Result<String> {
    let workflow = start(caller, None, None)?;
    let result = validated(&workflow, drive(&workflow)?.map_err(LambdaError::from))?;
    if !workflow.touched().is_empty() {
        commit(&workflow)?;
        route::ran_here()?;
    } else {
        // Nothing to commit here; the nodes the calls ran on still validate
        // (skipped, an answer from reads at two moments went unchecked).
        workflow::before_answer()?;
    }
    Ok(result)
}

/// `lambdastore.submit` for an object stored on `node` (a schedule's
/// first tick too).
#[allow(clippy::too_many_arguments)]
pub(crate) fn submit(
    caller: Caller,
    object: i64,
    node: &str,
    method: &str,
    args: &str,
    key: Option<&str>,
    due: Option<TimestampWithTimeZone>,
    schedule: Option<&str>,
) -> Result<i64> {
    let job = route::send(
        here!("lambdastore._submit_here($1, $2, $3, $4, $5, $6, $7, $8, $9)"),
        object,
        node,
        [method, args, key.unwrap_or_default()],
        vec![due.into(), schedule.into()],
        caller,
        gucs::timeout(caller.is_superuser()),
        true, // a submission writes
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
    let existed =
        forward(here!("lambdastore._delete_here($1, $2, $3, $4, $5, $6, $7)"), object, node, ["", "", ""], caller)?;
    Ok(existed == "true")
}

/// `lambdastore.split` on an object stored on `node` (the key as hex).
pub(crate) fn split(caller: Caller, object: i64, node: &str, field: &str, key: &[u8]) -> Result<bool> {
    let split = forward(
        here!("lambdastore._split_here($1, $2, $3, $4, $5, $6, $7)"),
        object,
        node,
        [field, &hex::encode(key), ""],
        caller,
    )?;
    Ok(split == "true")
}

/// `lambdastore.create_object` on a node that holds no shard: on the node
/// of an id drawn here (spreading new objects over the nodes), which then
/// draws one of its own; driven as `invoke` drives a call, so that its
/// constructor may reach any node.
pub(crate) fn create(caller: Caller, app: &str, type_name: &str, args: &str) -> Result<i64> {
    let route = catalog::objects::draw_id()?;
    let node = owner_elsewhere(route)?.unwrap_or_default();
    let create = Create { app: app.into(), type_name: type_name.into() };
    let id = drive_from_sql(caller, |workflow| {
        remote::drive_create(workflow, &node, route, create, args, calls::run_needed)
    })?;
    id.parse().map_err(|_| LambdaError::Internal(format!("a forwarded create returned {id:?}")))
}

/// Whether `create_object` must be forwarded: the tables are distributed
/// and this node holds none of their shards (a coordinator).
pub(crate) fn create_elsewhere() -> Result<bool> {
    Ok(layout::layout()?.is_some_and(|layout| !layout.holds_shards()))
}

/// A call another node sent to this one (`_call_here`), whose object is
/// stored here: from SQL (checked as `lambda_invoke` is) or nested (run as
/// a callee of the sender's workflow). Its answer as JSON: `Reply`.
pub(crate) fn run_forwarded(caller: Caller, object: i64, method: &str, args: &str, sent: Forwarded) -> Result<String> {
    if sent.holding {
        route::sender_holds_sets();
    }
    if sent.alone {
        return run_alone(caller, object, method, args, sent.tape);
    }
    if let Some(ask) = sent.replica {
        return replica::serve(caller, object, ask);
    }
    let (mut versions, mut loading) = (Vec::new(), Duration::ZERO);
    let outcome = match (sent.create, sent.nested) {
        (Some(create), _) => workflow::create_with(caller, &create.app, &create.type_name, args, Some(sent.tape))
            .map(|done| Finished { result: done.result.to_string(), spawned_elsewhere: done.spawned_elsewhere }),
        (None, None) => workflow::invoke_replaying(caller, object, method, args, sent.tape),
        (None, Some(nested)) => {
            let workflow = start(caller, nested.job, Some(sent.tape))?;
            workflow.pin(&nested.versions);
            let app = registry::load_in(&workflow, &nested.module)?;
            let call = MethodCall {
                object,
                method: method.into(),
                args: args.into(),
                readonly: nested.readonly,
                depth: nested.depth,
            };
            let outcome = validated(&workflow, calls::method_here(&workflow, &app, &call))
                .and_then(|result| Ok(Finished { result, spawned_elsewhere: commit(&workflow)? }));
            (versions, loading) = (workflow.versions(), workflow.loading());
            outcome
        }
    };
    if let Err(LambdaError::Suspended(needs)) = outcome {
        return Ok(needs);
    }
    let mut reply = reply(outcome)?;
    match &mut reply {
        Reply::Done { versions: ran, loading_micros, .. } => (*ran, *loading_micros) = (versions, micros(loading)),
        Reply::Failed { loading_micros, .. } | Reply::Needs { loading_micros, .. } => *loading_micros = micros(loading),
    }
    serde_json::to_string(&reply).map_err(|e| LambdaError::Internal(e.to_string()))
}

/// A call sent alone: this node drives its transaction (cluster/route.rs).
/// Its failure ends the transaction here with its error, which the sender
/// raises again: the calls it made on other nodes are rolled back with it.
fn run_alone(caller: Caller, object: i64, method: &str, args: &str, tape: Vec<Draw>) -> Result<String> {
    let done = workflow::invoke_replaying(caller, object, method, args, tape)?;
    route::ran_here()?;
    let reply =
        Reply::Done { result: done.result, spawned: done.spawned_elsewhere, versions: Vec::new(), loading_micros: 0 };
    serde_json::to_string(&reply).map_err(|e| LambdaError::Internal(e.to_string()))
}

fn micros(spent: Duration) -> u64 {
    spent.as_micros() as u64
}

/// What a forwarded call answers (a run that stopped for a call on
/// another node answers that: `Suspended`).
pub(crate) fn reply(outcome: Result<Finished<String>>) -> Result<Reply> {
    match outcome {
        Ok(done) => Ok(Reply::Done {
            result: done.result,
            spawned: done.spawned_elsewhere,
            versions: Vec::new(),
            loading_micros: 0,
        }),
        Err(failed) => match failed.call_failure() {
            Some(failure) => Ok(Reply::Failed { failure, loading_micros: 0 }),
            None => Err(failed),
        },
    }
}

/// A call a lambda on another node spawned on an object stored here
/// (`_spawn_here`): queued as a job of `caller`, child of `parent`.
pub(crate) fn queue_spawned(caller: Caller, mut spawned: Spawned, parent: Option<i64>) -> Result<()> {
    calls::check_spawned_here(caller, &mut spawned)?;
    crate::jobs::queue::insert_spawned(std::slice::from_ref(&spawned), caller.0, parent)
}
