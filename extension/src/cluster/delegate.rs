//! A call from SQL sent by Citus' own function delegation. A statement
//! that is one call, `SELECT lambda_invoke(id, method, args)`, committing
//! on its own, is planned as `SELECT _lambda_invoke_delegated(settings, id,
//! method, args)` (pg/planner.rs), a function `distribute()` made
//! Citus distribute by `id`, colocated with the objects. Citus' planner
//! then sends it, as it is, to the node holding the object, in one round
//! trip and without a distributed transaction: this node runs no call
//! and no routed statement for it. There it runs as a call made on that
//! node: the node drives its transaction (`route::arrive_alone`), so it
//! may call objects elsewhere, and a call that finds its object gone
//! (moved meanwhile) is sent on as any call there would be. A call whose
//! object is stored on this node is not rewritten (`stored_here`). Where
//! Citus does not delegate anyway (the object moved here since, or the
//! function is not distributed yet), it runs here as `lambda_invoke` does.
//!
//! This node holds its fence, though, from before Citus plans until the
//! statement ends (`layout::fence_for_plan`): a migration committing
//! between Citus' planning and its execution leaves the plan naming a
//! shard that is gone, and Citus fails with XX000 "could not find valid
//! entry for shard". It waits for a migration that holds the fence, as
//! any client's call does, and is planned after it. On the node it was
//! sent to, the fence is then a second one, only tried, as for a call
//! sent alone.
//!
//! What makes a call's outcome depend on the session travels as the first
//! argument: `lambdastore.timeout` and the settings other forwarded calls
//! take along (`gucs::delegated`). A transaction block, READ ONLY, an
//! isolation level above the default, or an XID already taken are never
//! rewritten: those calls need the distributed transaction
//! (`route::may_send_alone` says the same of calls sent alone). A plan
//! kept by a prepared statement is checked before each run against the
//! session as it is then (pg/planner.rs).

use crate::access::Caller;
use crate::cluster::{layout, replica, route};
use crate::gucs;
use crate::pg::{self, planner};
use pgrx::pg_sys;

static REWRITER: planner::Rewriter = planner::Rewriter { instead_of, text, hold: layout::fence_for_plan };

/// Has this process's top-level calls rewritten (once per process).
pub(crate) fn init() {
    planner::rewrite_calls(&REWRITER);
}

/// `_lambda_invoke_delegated` for a call of `lambda_invoke` on a Citus cluster.
fn instead_of(function: pg_sys::Oid) -> Option<pg_sys::Oid> {
    // Any statement's planning comes here (Citus' own on a node where the
    // extension does not exist yet): nothing more than a syscache lookup
    // for any other function.
    if !pg::backend::function_is_named(function, c"lambda_invoke") {
        return None;
    }
    let (lambda_invoke, delegated) = route::call_functions().ok()?;
    let ours = function == lambda_invoke && delegated != pg_sys::InvalidOid;
    (ours && layout::distributed().unwrap_or(false)).then_some(delegated)
}

/// The settings a call of `object` delegated takes along, when this
/// transaction may send one and the object is elsewhere.
fn text(object: Option<i64>) -> Option<String> {
    // A light replica runs calls of the objects it replicates itself.
    (route::transaction_may_go_alone() && !replica::may_run_here(object) && !object.is_some_and(stored_here))
        .then(|| gucs::delegated(Caller::current().is_superuser()))
}

/// Whether `object` is stored on this node, as far as the layout known now
/// says. Such a call is left as it is: Citus would run it here anyway, after
/// finding the function's placement (and the settings' text written for
/// nothing), a tenth of a `balance` on its own node. Should the object move
/// before the call runs, `lambda_invoke` sends it on, as any call here.
fn stored_here(object: i64) -> bool {
    layout::layout().ok().flatten().is_some_and(|layout| layout.owner(object).1.is_none())
}

/// On the node running a delegated call, before the call: the caller's
/// settings (as far as the caller may set them here), and, when Citus
/// sent it from another node, this node drives the transaction.
pub(crate) fn arrive(settings: &str) {
    if !pg::settings::current(c"application_name").is_some_and(|name| name.starts_with("citus_internal")) {
        // Run where it was planned: the settings are this session's own.
        return;
    }
    gucs::arrive_delegated(settings, Caller::current().is_superuser());
    route::arrive_alone();
}
