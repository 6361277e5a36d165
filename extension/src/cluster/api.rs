//! The SQL functions that exist only because of Citus: the `_here`
//! functions through which one node runs a call, a spawn, a submission, a
//! delete, a split, a map call's task or a validation on the node holding
//! the object (each sent by route.rs, superusers only: sql/citus.sql), and
//! what the cluster's SQL (sql/citus.sql) and the gateway ask of a node.
//! The public SQL surface, on one node as on many, is api/.

use crate::access::{as_storage, Caller};
use crate::api::raise;
use crate::cluster::{delegate, forward, layout, map, route};
use crate::error::{LambdaError, Result};
use crate::pg::jsonb::JsonText;
use crate::workflow;
use lambdastore_core::cluster::rebalance;
use lambdastore_core::model::{Forwarded, Spawned};
use pgrx::prelude::*;
use pgrx::JsonB;

/// `lambda_invoke` as Citus delegates it (cluster/delegate.rs), with the
/// caller's `settings` in front, distributed by `object_id`. Beside
/// `lambda_invoke` in the extension's schema, which every role that calls
/// may use on every node. Anyone may call it: the settings count only as
/// far as the caller may set them.
#[pg_extern(volatile, parallel_unsafe)]
fn _lambda_invoke_delegated(
    settings: &str,
    object_id: i64,
    method: &str,
    args: default!(JsonText, "'{}'"),
) -> JsonText {
    delegate::arrive(settings);
    crate::api::json_result(crate::api::invoke(object_id, method, &args.0), || {
        format!("lambda_invoke({object_id}, '{method}')")
    })
}

#[pg_schema]
mod lambdastore {
    use super::*;

    /// On a Citus node a map call reached (map.rs): one object's call, as
    /// `_call_here` runs a call, rolled back alone if it fails. Superusers
    /// only (sql/citus.sql); returns "w" or "r", then `map::Answer`.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _map_here(object_id: i64, method: &str, args: &str, role: &str, timeout_ms: i64, settings: &str) -> String {
        let run = |caller| {
            let answer = map::run_here(caller, object_id, method, args)?;
            serde_json::to_string(&answer).map_err(|e| LambdaError::Internal(e.to_string()))
        };
        here(role, timeout_ms, settings, run, || format!("map_call({object_id}, '{method}')"))
    }

    /// On the Citus node holding the object: a call sent by another node
    /// (route.rs), from SQL or from a lambda there, for `role` with its
    /// settings; `context` is what travels with it (`model::Forwarded`).
    /// Superusers only (sql/citus.sql); returns "w" or "r" (whether this
    /// node's part of the transaction wrote), then the answer
    /// (`model::Reply`).
    #[pg_extern(volatile, parallel_unsafe)]
    fn _call_here(
        object_id: i64,
        method: &str,
        args: &str,
        context: &str,
        role: &str,
        timeout_ms: i64,
        settings: &str,
    ) -> String {
        let sent = sent_context::<Forwarded>(context);
        if sent.as_ref().is_ok_and(|sent| sent.alone) {
            route::arrive_alone();
        }
        let describe = match sent.as_ref().ok().and_then(|sent| sent.create.as_ref()) {
            Some(create) => format!("create_object('{}', '{}')", create.app, create.type_name),
            None => format!("lambda_invoke({object_id}, '{method}')"),
        };
        let call = |caller| forward::run_forwarded(caller, object_id, method, args, sent?);
        here(role, timeout_ms, settings, call, || describe)
    }

    /// The same for a call a lambda on another node spawned on an object
    /// stored here; `context` is `[application, parent job, due]` (due in
    /// microseconds since the Unix epoch, or null).
    #[pg_extern(volatile, parallel_unsafe)]
    fn _spawn_here(
        object_id: i64,
        method: &str,
        args: &str,
        context: &str,
        role: &str,
        timeout_ms: i64,
        settings: &str,
    ) -> String {
        let spawn = |caller| {
            let (app, parent, due_micros): (String, Option<i64>, Option<i64>) = sent_context(context)?;
            let spawned =
                Spawned { object: object_id, app, method: method.into(), args: args.into(), due_micros, timer: None };
            forward::queue_spawned(caller, spawned, parent).map(|_| String::new())
        };
        here(role, timeout_ms, settings, spawn, || format!("spawn({object_id}, '{method}')"))
    }

    /// The same for `lambdastore.submit` (its key claimed by the sending
    /// node, '' for none; when it is due, NULL for at once; the schedule it
    /// is a tick of, if any); the result is the job id.
    #[pg_extern(volatile, parallel_unsafe)]
    #[allow(clippy::too_many_arguments)]
    fn _submit_here(
        object_id: i64,
        method: &str,
        args: &str,
        idempotency_key: &str,
        role: &str,
        timeout_ms: i64,
        settings: &str,
        due: Option<TimestampWithTimeZone>,
        schedule: Option<&str>,
    ) -> String {
        let key = Some(idempotency_key).filter(|key| !key.is_empty());
        let submit = |caller| {
            crate::jobs::submit(caller, object_id, method, args, key, due, schedule).map(|job| job.to_string())
        };
        here(role, timeout_ms, settings, submit, || format!("submit({object_id}, '{method}')"))
    }

    /// The same for `lambdastore.delete_object`: "true" if it existed.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _delete_here(
        object_id: i64,
        _a: &str,
        _b: &str,
        _c: &str,
        role: &str,
        timeout_ms: i64,
        settings: &str,
    ) -> String {
        let delete = |caller| workflow::delete_object(caller, object_id).map(|existed| existed.to_string());
        here(role, timeout_ms, settings, delete, || format!("delete_object({object_id})"))
    }

    /// The same for `lambdastore.split` (the key in hex): "true" if split.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _split_here(
        object_id: i64,
        field: &str,
        key: &str,
        _c: &str,
        role: &str,
        timeout_ms: i64,
        settings: &str,
    ) -> String {
        let split = |caller| {
            let key = hex::decode(key).map_err(|e| LambdaError::InvalidParameter(format!("a hex key: {e}")))?;
            workflow::split(caller, object_id, field, &key).map(|split| split.to_string())
        };
        here(role, timeout_ms, settings, split, || format!("split({object_id})"))
    }

    /// On a node a read-only transaction spanning several nodes ran calls
    /// on, before it commits (forward.rs): validates this node's reads
    /// again (40001 if one changed). Superusers only (sql/citus.sql).
    #[pg_extern(volatile, parallel_unsafe)]
    fn _validate_here() -> String {
        crate::txn::occ::validate_again().unwrap_or_else(|err| raise(err, "COMMIT".into()));
        "r".into()
    }

    /// Behind `lambdastore.add_light_replica` and `drop_light_replica`
    /// (sql/citus.sql): which objects a node replicates is cached under the
    /// catalog generation (replica.rs), which this transaction's commit
    /// moves. The nodes Citus prepares the change on move theirs at COMMIT
    /// PREPARED (catalog/cache.rs), but the node running the function
    /// writes its copy of the table itself and commits without PREPARE.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _catalog_changed() {
        crate::catalog::cache::changed();
    }

    /// The node this session runs on, as host:port in Citus' metadata (or
    /// 'local' when the tables are not distributed): which node ran a call.
    #[pg_extern(volatile, parallel_unsafe)]
    fn node() -> String {
        as_storage(|_| layout::this_node()).unwrap_or_else(|err| raise(err, "node()".into()))
    }

    /// Whether this node stores `object_id`'s shard (true when the tables
    /// are not distributed), from the backend's copy of Citus' metadata,
    /// re-read after every shard move: the gateway asks it after each call
    /// it routed by its own copy (gateway/src/placement/citus.rs).
    #[pg_extern(volatile, parallel_unsafe)]
    fn holds(object_id: i64) -> bool {
        as_storage(|_| route::owner_elsewhere(object_id))
            .map(|elsewhere| elsewhere.is_none())
            .unwrap_or_else(|err| raise(err, format!("holds({object_id})")))
    }

    /// Behind `lambdastore.migrate_object` (sql/citus.sql): waits for and
    /// holds, to the end of the transaction, the lock with which Citus
    /// keeps one split or move at a time in the objects' colocation group.
    /// Citus only tries it, and fails at once while another operation holds
    /// it or waits for it; holding it first makes migrations queue.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _hold_shard_operations() {
        if let Err(err) = layout::hold_shard_operations() {
            raise(err, "migrate_object".into());
        }
    }

    /// Behind `lambdastore.rebalance` (sql/citus.sql): the plan from the
    /// counts every node gathered (core/src/cluster/rebalance.rs), with the settings'
    /// tolerance, and their bound on moves unless `max_moves` is given.
    #[pg_extern(stable, parallel_safe)]
    fn _plan_moves(counts: JsonB) -> JsonB {
        let mut counts = counts.0;
        if !counts.is_object() {
            raise(LambdaError::InvalidParameter("the counts are a JSON object".into()), "_plan_moves".into());
        }
        if counts.get("max_moves").is_none_or(|m| m.is_null()) {
            counts["max_moves"] = crate::gucs::rebalance_max_moves().into();
        }
        counts["tolerance"] = crate::gucs::rebalance_tolerance().into();
        counts["replica_threshold"] = crate::gucs::light_replica_threshold().into();
        let input: rebalance::Input = serde_json::from_value(counts).unwrap_or_else(|err| {
            raise(LambdaError::InvalidParameter(format!("unexpected counts: {err}")), "_plan_moves".into())
        });
        JsonB(serde_json::to_value(rebalance::plan(&input)).expect("a plan is plain data"))
    }
}

/// The body of a call forwarded here (`_invoke_here` and its kind): the
/// caller and its settings, the work as storage, the result for
/// `route::here_result`.
fn here(
    role: &str,
    timeout_ms: i64,
    settings: &str,
    work: impl FnOnce(Caller) -> Result<String>,
    context: impl FnOnce() -> String,
) -> String {
    let outcome = route::arrive(role, timeout_ms, settings).and_then(|caller| as_storage(|_| work(caller)));
    route::here_result(outcome.unwrap_or_else(|err| raise(err, context())))
}

/// What travels with a call another node sent (`_call_here`, `_spawn_here`).
fn sent_context<T: serde::de::DeserializeOwned>(context: &str) -> Result<T> {
    serde_json::from_str(context)
        .map_err(|e| LambdaError::InvalidParameter(format!("the context of a call from another node: {e}")))
}
