//! Map calls (`lambdastore.map_call`): one method run on many objects, in
//! the caller's transaction, with every object's outcome reported.
//!
//! Each object's call is a workflow of its own, as if `lambda_invoke` were
//! called once per object in one SQL transaction: the transaction as a
//! whole is serializable (every workflow validates again what the earlier
//! ones read; on several nodes each node validates again at commit,
//! route.rs), and commits or rolls back as one, in two phases once it has
//! written on two nodes. A call that fails is rolled back alone (a
//! subtransaction) and reported with its SQLSTATE; the others stay. A
//! cancel (`statement_timeout`, `pg_cancel_backend`) is not a call's
//! failure: it ends the statement.
//!
//! On a Citus cluster the objects on other nodes are reached by one query
//! through Citus (`route::send_to_shards`): one task per shard, on the
//! shard's node, each running `_map_here` for its objects one after the
//! other, the nodes in parallel. A run that needs a call on a third node
//! (its lambda calls an object stored elsewhere) stops there, as a
//! forwarded call does, and is driven again from here
//! (`forward::invoke`). The objects on this node run here.

use crate::access::Caller;
use crate::catalog;
use crate::cluster::layout;
use crate::cluster::route;
use crate::cluster::{forward, remote};
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::pg::backend::sqlstate_text;
use crate::pg::xact::Subtransaction;
use crate::txn::occ;
use crate::workflow;
use lambdastore_core::model::{Reply, Spawned};
use pgrx::pg_sys::BuiltinOid::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The objects a map call runs on.
pub(crate) enum Targets<'a> {
    /// Every object of an application's type.
    Type { app: &'a str, type_name: &'a str },
    /// These objects.
    Ids(Vec<i64>),
}

/// Why one object's call failed: its SQLSTATE and message.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Failure {
    pub(crate) sqlstate: String,
    pub(crate) message: String,
}

impl Failure {
    fn of(err: &LambdaError) -> Failure {
        Failure { sqlstate: sqlstate_text(err.sqlstate()), message: err.to_string() }
    }
}

/// What `_map_here` answers for one object.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Answer {
    /// As a forwarded call answers (a run that needs a call on another
    /// node answers `Needs`, and left nothing).
    Reply(Reply),
    /// The call raised an error, and was rolled back.
    Raised(Failure),
}

/// One object's outcome: its result, or why it failed.
pub(crate) type Outcome = std::result::Result<String, Failure>;

/// Runs `method` with `args` on `targets` for `caller`; every object's
/// outcome, by object id.
pub(crate) fn map_call(caller: Caller, targets: Targets<'_>, method: &str, args: &str) -> Result<Vec<(i64, Outcome)>> {
    // Once for the statement, as a single call does: it would refuse each
    // object's call alike.
    occ::check_isolation()?;
    if let Targets::Type { app, type_name } = &targets {
        workflow::check_method(caller, app, type_name, method)?;
    }
    let layout = layout::fenced_layout(|| "objects may be moving".into())?;
    let (here, elsewhere) = split(layout.as_deref(), targets)?;
    let mut outcomes = Vec::new();
    // Here first: subtransactions begun once other nodes have been
    // reached cost a round trip to each.
    for object in here {
        outcomes.push((object, alone(|| here_call(caller, object, method, args))?));
    }
    if let (Some(layout), Some(elsewhere)) = (&layout, elsewhere) {
        outcomes.extend(on_other_nodes(layout, elsewhere, caller, method, args)?);
    }
    outcomes.sort_by_key(|(object, _)| *object);
    Ok(outcomes)
}

/// The objects of `targets` that run on this node, and those on other
/// nodes (`layout`, None when the tables are not distributed).
fn split<'a>(layout: Option<&layout::Layout>, targets: Targets<'a>) -> Result<(Vec<i64>, Option<Targets<'a>>)> {
    Ok(match (layout, targets) {
        (None, Targets::Type { app, type_name }) => (list(app, type_name, false)?, None),
        (None, Targets::Ids(ids)) => (ids, None),
        (Some(layout), Targets::Type { app, type_name }) if !layout.holds_shards() => {
            (Vec::new(), Some(Targets::Type { app, type_name }))
        }
        (Some(layout), targets) => {
            let ids = match targets {
                Targets::Type { app, type_name } => list(app, type_name, true)?,
                Targets::Ids(ids) => ids,
            };
            let (here, there): (Vec<i64>, Vec<i64>) = ids.into_iter().partition(|id| layout.owner(*id).1.is_none());
            (here, (!there.is_empty()).then_some(Targets::Ids(there)))
        }
    })
}

/// Runs the map call on `targets`, on their nodes; drives
/// again from here the runs that need a call on a third node, and queues
/// the calls the runs spawned there.
fn on_other_nodes(
    layout: &layout::Layout,
    targets: Targets<'_>,
    caller: Caller,
    method: &str,
    args: &str,
) -> Result<Vec<(i64, Outcome)>> {
    let mut missing: BTreeSet<i64> = match &targets {
        Targets::Ids(ids) => ids.iter().copied().collect(),
        Targets::Type { .. } => BTreeSet::new(),
    };
    let mut spawned: Vec<Spawned> = Vec::new();
    let mut outcomes = Vec::new();
    for (object, answer) in send(layout, &targets, caller, method, args)? {
        missing.remove(&object);
        let answer: Answer = serde_json::from_str(&answer)
            .map_err(|e| LambdaError::Internal(format!("a map call's run answered {answer:?}: {e}")))?;
        let outcome = match answer {
            Answer::Reply(Reply::Done { result, spawned: more, .. }) => {
                spawned.extend(more);
                Ok(result)
            }
            Answer::Reply(Reply::Failed { failure, .. }) => Err(Failure::of(&LambdaError::from(failure))),
            Answer::Reply(Reply::Needs { .. }) => {
                let node = layout.owner(object).1.unwrap_or_default().to_string();
                alone(|| as_jsonb(forward::invoke(caller, object, &node, method, args)?))?
            }
            Answer::Raised(failure) => Err(failure),
        };
        outcomes.push((object, outcome));
    }
    queue_spawned_elsewhere(caller, &spawned)?;
    outcomes.extend(missing.into_iter().map(|id| (id, Err(Failure::of(&LambdaError::UnknownObject(id))))));
    Ok(outcomes)
}

/// The objects of `app`'s type `type_name`; on a Citus cluster through
/// Citus (every node's shards).
fn list(app: &str, type_name: &str, cluster: bool) -> Result<Vec<i64>> {
    const SQL: &str = "SELECT object_id FROM lambdastore.objects WHERE app = $1 AND type_name = $2";
    let read =
        |rows: pgrx::spi::SpiTupleTable<'_>| rows.map(|row| row.get::<i64>(1).map(Option::unwrap_or_default)).collect();
    let args = [app.into(), type_name.into()];
    if cluster {
        catalog::query_cluster(SQL, &[TEXTOID, TEXTOID], &args, read)
    } else {
        catalog::query(SQL, &[TEXTOID, TEXTOID], &args, read)
    }
}

/// One object's call on this node, as `lambda_invoke` runs it.
fn here_call(caller: Caller, object: i64, method: &str, args: &str) -> Result<String> {
    let result = as_jsonb(workflow::invoke_method(caller, object, method, args)?)?;
    route::ran_here()?;
    Ok(result)
}

/// A call's result, which must become jsonb: checked while its call can
/// still be rolled back alone (`lambda_invoke` fails the statement).
fn as_jsonb(result: String) -> Result<String> {
    crate::pg::jsonb::result_jsonb(&result)?;
    Ok(result)
}

/// Sends the map call to the shards holding `targets`.
fn send(
    layout: &layout::Layout,
    targets: &Targets<'_>,
    caller: Caller,
    method: &str,
    args: &str,
) -> Result<Vec<(i64, String)>> {
    const RUN: &str = "SELECT object_id, lambdastore._map_here(object_id, $1, $2, $3, $4, $5) FROM lambdastore.objects";
    let timeout = gucs::timeout(caller.is_superuser());
    match targets {
        Targets::Type { app, type_name } => route::send_to_shards(
            layout,
            &format!("{RUN} WHERE app = $6 AND type_name = $7"),
            [method, args],
            &[app, type_name],
            caller,
            timeout,
        ),
        // Written out: Citus prunes shards by constants.
        Targets::Ids(ids) => {
            let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
            let sql = format!("{RUN} WHERE object_id = ANY ('{{{}}}'::bigint[])", ids.join(","));
            route::send_to_shards(layout, &sql, [method, args], &[], caller, timeout)
        }
    }
}

/// On a node a map call reached (`_map_here`): one object's call, alone.
pub(crate) fn run_here(caller: Caller, object: i64, method: &str, args: &str) -> Result<Answer> {
    let sub = Subtransaction::begin();
    let outcome = catching(|| match run_mapped(caller, object, method, args)? {
        Reply::Done { result, spawned, versions, loading_micros } => {
            Ok(Reply::Done { result: as_jsonb(result)?, spawned, versions, loading_micros })
        }
        reply => Ok(reply),
    });
    Ok(match outcome? {
        Ok(reply @ Reply::Done { .. }) => {
            sub.release();
            Answer::Reply(reply)
        }
        Ok(reply) => {
            sub.roll_back();
            Answer::Reply(reply)
        }
        Err(failure) => {
            sub.roll_back();
            Answer::Raised(failure)
        }
    })
}

/// Runs one object's call in a subtransaction of its own: kept if it
/// succeeds, rolled back (here and on every node it reached) if it
/// fails, the failure returned. A cancel is raised.
fn alone(call: impl FnOnce() -> Result<String>) -> Result<Outcome> {
    let sub = Subtransaction::begin();
    let outcome = catching(call);
    match &outcome {
        Ok(Ok(_)) => sub.release(),
        _ => sub.roll_back(),
    }
    outcome
}

/// Runs `call`, with its error (ours, or an ERROR raised inside it) as
/// a `Failure`; a cancel of the statement is an error of the map call
/// itself (a lambda's own timeout is the call's failure).
fn catching<T>(call: impl FnOnce() -> Result<T>) -> Result<std::result::Result<T, Failure>> {
    let call = std::panic::AssertUnwindSafe(call);
    let outcome = route::caught(move || Ok(call()));
    match outcome {
        Ok(Ok(value)) => Ok(Ok(value)),
        Ok(Err(LambdaError::Canceled)) => Err(LambdaError::Canceled),
        Ok(Err(failed)) => Ok(Err(Failure::of(&failed))),
        Err(raised) if raised.sqlstate() == pgrx::PgSqlErrorCode::ERRCODE_QUERY_CANCELED => Err(raised),
        Err(raised) => Ok(Err(Failure::of(&raised))),
    }
}

/// One object's call of a map call another node sent here
/// (`_map_here`): run as `lambda_invoke` runs it, answered as
/// `forward::run_forwarded` answers.
fn run_mapped(caller: Caller, object: i64, method: &str, args: &str) -> Result<Reply> {
    match workflow::invoke_replaying(caller, object, method, args, Vec::new()) {
        Err(LambdaError::Suspended(needs)) => serde_json::from_str(&needs)
            .map_err(|e| LambdaError::Internal(format!("a stopped run answered {needs:?}: {e}"))),
        outcome => forward::reply(outcome),
    }
}

/// Queues, from the node driving a map call, the calls its runs on other
/// nodes spawned on objects of yet other nodes (as `forward::invoke`
/// queues those of one call).
fn queue_spawned_elsewhere(caller: Caller, spawned: &[Spawned]) -> Result<()> {
    if spawned.is_empty() {
        return Ok(());
    }
    remote::queue(&*workflow::start(caller, None, None)?, spawned)
}
