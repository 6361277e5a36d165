//! The rebalancer: a background worker that, every
//! `lambdastore.rebalance_interval`, on the coordinator of a Citus cluster
//! with lambdastore distributed, does what `CALL lambdastore.rebalance()`
//! does (sql/citus.sql): the plan in one transaction, forgetting the
//! counts, then each move in a transaction of its own, then each light
//! replica added or dropped. Elsewhere, and while
//! the setting is 0, it only sleeps on its latch, which a reload sets.

use crate::jobs::runner::{in_subtransaction, Failure};
use crate::jobs::workers::transaction;
use crate::pg::process::{reload_config_if_asked, wait_latch};
use crate::{catalog, gucs};
use pgrx::pg_guard;
use pgrx::pg_sys::{self, BuiltinOid::TEXTOID};
use std::time::{Duration, Instant};

/// Sleep while the setting is 0: a reload wakes the worker anyway.
const OFF: Duration = Duration::from_secs(3600);

/// Whether this node is where rebalancing runs: the extension is created
/// here, and this is the coordinator of a distributed catalog.
const HERE: &str = "SELECT to_regprocedure('lambdastore._coordinator()') IS NOT NULL";
const PLAN: &str = "SELECT lambdastore._rebalance_plan(NULL, NULL, true)::text WHERE lambdastore._coordinator()";
const MOVE: &str = "SELECT lambdastore._rebalance_move($1::jsonb)";
const REPLICA: &str = "SELECT lambdastore._rebalance_replica($1::jsonb)";

/// Entry point, named in the worker's registration (`workers::register`).
#[pg_guard]
#[allow(unsafe_code)] // an exported symbol PostgreSQL starts the worker by; its name is ours alone
#[unsafe(no_mangle)]
pub extern "C-unwind" fn lambdastore_rebalancer_main(_arg: pg_sys::Datum) {
    crate::pg::process::handle_worker_signals();
    crate::jobs::workers::connect_to_database(gucs::workers() == 0);
    let mut last = Instant::now();
    loop {
        let left = gucs::rebalance_interval().map_or(OFF, |interval| interval.saturating_sub(last.elapsed()));
        wait_latch(left);
        reload_config_if_asked();
        match gucs::rebalance_interval() {
            Some(interval) if last.elapsed() >= interval => {
                run();
                last = Instant::now();
            }
            _ => {}
        }
    }
}

/// One run: a failure is logged, and the next run tries again.
fn run() {
    let plan = match transaction(|| in_subtransaction(plan)) {
        Ok(Some(plan)) => plan,
        Ok(None) => return,
        Err(failure) => return pgrx::warning!("lambdastore rebalancer: planning failed: {}", failure.message),
    };
    let steps = plan["moves"].as_array().cloned().unwrap_or_default();
    let mut moved = 0;
    for step in &steps {
        let outcome = transaction(|| in_subtransaction(|| make(MOVE, step)));
        match outcome.as_deref() {
            Ok("moved") => moved += 1,
            Ok(why) => pgrx::warning!("lambdastore rebalancer: object {} not moved: {why}", step["object_id"]),
            Err(failure) => {
                pgrx::warning!("lambdastore rebalancer: moving {} failed: {}", step["object_id"], failure.message)
            }
        }
    }
    if !steps.is_empty() {
        pgrx::log!(
            "lambdastore rebalancer: moved {moved} of {} objects; cross-node share of nested calls {} planned to become {}",
            steps.len(),
            plan["cross_node_share"]["before"],
            plan["cross_node_share"]["after"]
        );
    }
    for step in plan["replicas"].as_array().into_iter().flatten() {
        let (object, node, action) = (&step["object_id"], &step["node"], &step["action"]);
        match transaction(|| in_subtransaction(|| make(REPLICA, step))) {
            Ok(outcome) if outcome == "added" || outcome == "dropped" => {
                pgrx::log!("lambdastore rebalancer: light replica of {object} on {node} {outcome}: {}", step["reason"])
            }
            Ok(why) => pgrx::warning!("lambdastore rebalancer: light replica of {object} on {node} ({action}): {why}"),
            Err(failure) => pgrx::warning!(
                "lambdastore rebalancer: light replica of {object} on {node} ({action}) failed: {}",
                failure.message
            ),
        }
    }
}

fn plan() -> Result<Option<serde_json::Value>, Failure> {
    let here = catalog::query(HERE, &[], &[], |rows| Ok(rows.first().get::<bool>(1)?.unwrap_or(false)))?;
    if !here {
        return Ok(None);
    }
    let plan = catalog::query_cluster(PLAN, &[], &[], |rows| rows.first().get::<String>(1))?;
    Ok(plan.map(|text| serde_json::from_str(&text).expect("the planner writes JSON")))
}

/// One step of the plan, by `statement`: its outcome.
fn make(statement: &'static str, step: &serde_json::Value) -> Result<String, Failure> {
    let text = step.to_string();
    let outcome =
        catalog::query_cluster(statement, &[TEXTOID], &[text.as_str().into()], |rows| rows.first().get::<String>(1))?;
    Ok(outcome.unwrap_or_default())
}
