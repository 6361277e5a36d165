//! Nested calls to objects stored on other Citus nodes.
//!
//! The node whose session (or job) started the transaction drives every
//! hop (this file; host/calls.rs hands it, as `Needed`, the host's way of
//! running a call here), as does the node a call was sent to alone, whose
//! transaction it is (route.rs): Citus refuses distributed queries on a
//! node that runs a statement another node sent it in a distributed
//! transaction, so a lambda there cannot reach a third node itself. The
//! driving node sends the call to the object's node (`_call_here`,
//! cluster/route.rs), where it runs as a workflow of its own in the same
//! transaction. If that lambda calls an object on yet another node,
//! its run stops there and answers what it needs (`Reply::Needs`), leaving
//! nothing behind; the driving node makes that call (here, in the calling
//! workflow, or on its node the same way) and sends the first call again
//! with the outcome. The second run replays what the first drew from the
//! host (core/src/txn/tape.rs) and gets the outcome where it asked for it, then goes
//! on; a run that went another way ends the transaction with 40001.
//!
//! Two things keep the result the same as if every object were on one
//! node. A call may not come back to an object that a stopped run touched
//! (it would see it without that run's writes, which come only with the
//! next run): `CallBack`, 0A000. And a call that returns its own error
//! after calls it needed elsewhere had committed their workflows takes
//! them back: the hops run in a subtransaction, which Citus rolls back on
//! every node it reached.

use crate::access::Caller;
use crate::cluster::route::{self, here, Routed};
use crate::error::{LambdaError, Result};
use crate::pg::xact::Subtransaction;
use crate::txn::{occ, Workflow};
use lambdastore_core::model::{CallFailure, Create, Draw, Forwarded, MethodCall, ModuleKey, Nested, Reply, Spawned};
use std::rc::Rc;

pub(crate) const CALL_HERE: Routed = here!("lambdastore._call_here($1, $2, $3, $4, $5, $6, $7)");
const SPAWN_HERE: Routed = here!("lambdastore._spawn_here($1, $2, $3, $4, $5, $6, $7)");

/// How the host runs a call that a run on another node needs, with the
/// code version that run has: in the workflow if its object is stored
/// here, else driven on its node (`drive` again), with `busy` the objects
/// the stopped runs have touched. `Err` inside: the callee's own error.
/// (host/calls.rs, `run_needed`: the host sits above this file.)
pub(crate) type Needed = fn(&Rc<Workflow>, &ModuleKey, MethodCall, &[i64]) -> Result<Result<String, CallFailure>>;

/// Runs `call` on `node`, and every call it needs on other nodes first
/// (through `needed`), for `workflow`, whose code version is `module`
/// (None for a call from SQL: the node runs it as such). `Err` inside: the
/// callee's own error. `busy`: the objects that stopped runs further up
/// have touched. A call that returns its own error takes back what it
/// needed on any node.
pub(crate) fn drive(
    workflow: &Rc<Workflow>,
    module: Option<&ModuleKey>,
    node: &str,
    call: MethodCall,
    busy: &[i64],
    needed: Needed,
) -> Result<Result<String, CallFailure>> {
    let nested = module.map(|module| Nested {
        module: module.clone(),
        readonly: call.readonly,
        depth: call.depth,
        job: workflow.parent_job,
        versions: workflow.versions(),
    });
    drive_with(workflow, node, call, Forwarded { nested, ..Forwarded::default() }, busy, needed)
}

/// `create_object` from SQL on a node that holds no objects: driven as a
/// call from SQL routed by `route`, whose node creates the object; its id.
pub(crate) fn drive_create(
    workflow: &Rc<Workflow>,
    node: &str,
    route: i64,
    create: Create,
    args: &str,
    needed: Needed,
) -> Result<Result<String, CallFailure>> {
    let call = MethodCall { object: route, method: CREATE.into(), args: args.into(), readonly: false, depth: 0 };
    drive_with(workflow, node, call, Forwarded { create: Some(create), ..Forwarded::default() }, &[], needed)
}

/// The method name a forwarded create travels under (no method can have
/// it: names are identifiers).
pub(crate) const CREATE: &str = "(create)";

fn drive_with(
    workflow: &Rc<Workflow>,
    node: &str,
    call: MethodCall,
    mut forwarded: Forwarded,
    busy: &[i64],
    run_needed: Needed,
) -> Result<Result<String, CallFailure>> {
    occ::hold_written(workflow)?;
    forwarded.holding = occ::holds_sets();
    let savepoint = workflow.savepoint();
    let mut hops: Option<Subtransaction> = None;
    let outcome = loop {
        let reply = match send(workflow, node, &call, &forwarded) {
            Ok(reply) => reply,
            Err(failed) => break Err(failed),
        };
        workflow.not_counted(std::time::Duration::from_micros(reply.loading_micros()));
        match reply {
            Reply::Done { result, spawned, versions, .. } => {
                workflow.pin(&versions);
                break queue(workflow, &spawned).map(|_| Ok(result));
            }
            Reply::Failed { failure, .. } => break Ok(Err(failure)),
            Reply::Needs { call: needed, mut tape, touched, module, versions, .. } => {
                workflow.pin(&versions);
                if let Some(nested) = &mut forwarded.nested {
                    nested.versions = workflow.versions();
                }
                hops.get_or_insert_with(Subtransaction::begin);
                let busy: Vec<i64> = busy.iter().copied().chain(touched).collect();
                match run_needed(workflow, &module, needed.clone(), &busy) {
                    Ok(outcome) => tape.push(Draw::Call { call: needed, outcome }),
                    Err(failed) => break Err(failed),
                }
                forwarded.tape = tape;
            }
        }
    };
    if let Some(hops) = hops {
        match outcome {
            Ok(Ok(_)) => hops.release(),
            _ => hops.roll_back(),
        }
    }
    if matches!(outcome, Ok(Err(_))) {
        workflow.rollback_to(savepoint); // the calls it needed here
    }
    outcome
}

/// Sends `call` with `forwarded`. It gets what is left of the workflow's
/// time, except a call from SQL the first time, which gets the session's
/// timeout as a call on this node would (and its error says so).
fn send(workflow: &Workflow, node: &str, call: &MethodCall, forwarded: &Forwarded) -> Result<Reply> {
    let context = serde_json::to_string(forwarded).map_err(|e| LambdaError::Internal(e.to_string()))?;
    let texts = [call.method.as_str(), call.args.as_str(), context.as_str()];
    let first_from_sql = forwarded.nested.is_none() && forwarded.tape.is_empty();
    let timeout = if first_from_sql { workflow.timeout } else { workflow.time_left() };
    // A created object has no row before its create runs.
    let sql = if forwarded.create.is_some() { CALL_HERE.any_row() } else { CALL_HERE };
    // A lambda that may write marks the node it calls as written at once:
    // should the transaction write, it does so on two nodes, which all
    // take part in the two-phase commit (route.rs).
    let mark = forwarded.nested.as_ref().is_some_and(|nested| !nested.readonly);
    let reply = route::send(sql, call.object, node, texts, Vec::new(), workflow.caller, timeout, mark)?;
    serde_json::from_str(&reply).map_err(|e| LambdaError::Internal(format!("a forwarded call answered {reply:?}: {e}")))
}

/// A call from SQL sent alone (`route::send_alone`): the node holding the
/// object drives and commits it, and answers its result; a failure comes
/// back as that node's error, validated there as a call on one node is
/// before its error leaves.
pub(crate) fn send_alone(caller: Caller, call: &MethodCall) -> Result<String> {
    let forwarded = Forwarded { alone: true, ..Forwarded::default() };
    let context = serde_json::to_string(&forwarded).map_err(|e| LambdaError::Internal(e.to_string()))?;
    let texts = [call.method.as_str(), call.args.as_str(), context.as_str()];
    let timeout = crate::gucs::timeout(caller.is_superuser());
    let reply = route::send_alone(CALL_HERE, call.object, texts, caller, timeout)?;
    match serde_json::from_str(&reply) {
        Ok(Reply::Done { result, spawned, .. }) if spawned.is_empty() => Ok(result),
        _ => Err(LambdaError::Internal(format!("a call sent alone answered {reply:?}"))),
    }
}

/// The calls a committed workflow spawned, by where their objects are:
/// on this node (queued here), on others.
pub(crate) fn by_node(spawned: &[Spawned]) -> Result<(Vec<Spawned>, Vec<Spawned>)> {
    let (mut here, mut elsewhere) = (Vec::new(), Vec::new());
    for call in spawned {
        let list = if route::owner_elsewhere(call.object)?.is_some() { &mut elsewhere } else { &mut here };
        list.push(call.clone());
    }
    Ok((here, elsewhere))
}

/// Queues the calls a committed workflow spawned on objects of other
/// nodes there (`queue`); returns them instead when this node cannot send
/// them (it runs a call another node sent: that node queues them).
pub(crate) fn queue_or_return(workflow: &Workflow, elsewhere: Vec<Spawned>) -> Result<Vec<Spawned>> {
    if route::arrived() {
        return Ok(elsewhere);
    }
    queue(workflow, &elsewhere)?;
    Ok(Vec::new())
}

/// Queues calls a committed workflow spawned on objects of other nodes
/// there, in this transaction, as jobs of `workflow`'s role and job.
pub(crate) fn queue(workflow: &Workflow, spawned: &[Spawned]) -> Result<()> {
    for call in spawned {
        let node = route::owner_elsewhere(call.object)?.unwrap_or_default();
        let context = serde_json::to_string(&(call.app.as_str(), workflow.parent_job, call.due_micros))
            .map_err(|e| LambdaError::Internal(e.to_string()))?;
        let texts = [call.method.as_str(), call.args.as_str(), context.as_str()];
        // A queued job is a write there.
        route::send(SPAWN_HERE, call.object, &node, texts, Vec::new(), workflow.caller, workflow.time_left(), true)?;
    }
    Ok(())
}
