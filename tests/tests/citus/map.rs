//! `lambdastore.map_call` on the cluster: every object's call runs on its
//! node, the results are those of calls made one by one, and the map call
//! is one serializable transaction across nodes, whose failed calls are
//! reported and rolled back alone.

use super::{calls_here, left_prepared, node, on_two_nodes, prove, read_skew, spread, workers};
use crate::common::concurrent::{sqlstate, Cc, Tally};
use crate::common::*;
use postgres::Client;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The objects each node holds, as `spread` made them.
fn owned_by(by_node: &BTreeMap<String, Vec<i64>>, node: &str) -> i64 {
    by_node.get(node).map_or(0, Vec::len) as i64
}

#[test]
fn a_map_call_runs_each_objects_call_on_its_node_as_calls_one_by_one_would() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_map_nodes", "counter");
    let by_node = spread(&mut c, &app, "Counter", json!({"initial": 7}), 3);
    let ids: Vec<i64> = by_node.values().flatten().copied().collect();

    // From the coordinator, which holds no objects.
    let mapped = map_type(&mut c, &app, "Counter", "add", json!({"n": 5})).unwrap();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(mapped.keys().copied().collect::<Vec<_>>(), sorted);
    for &id in &ids {
        assert_eq!(mapped[&id], Ok(json!(12)), "object {id}");
        assert_eq!(call(&mut c, id, "get", json!({})), json!(12), "object {id} one by one");
    }
    assert_eq!(calls_here(&mut c, &app, "add"), 0, "the coordinator ran calls itself");
    for worker in &mut workers {
        let here = node(worker);
        assert_eq!(calls_here(worker, &app, "add"), owned_by(&by_node, &here), "calls run on {here}");
    }

    // From a worker: its own objects run there, the others on their node.
    let mapped = map_type(&mut workers[0], &app, "Counter", "increment", json!({})).unwrap();
    assert!(mapped.values().all(|outcome| *outcome == Ok(json!(13))), "{mapped:?}");
    for worker in &mut workers {
        let here = node(worker);
        assert_eq!(calls_here(worker, &app, "increment"), owned_by(&by_node, &here), "calls run on {here}");
    }

    // By id, from the other worker: each once, an unknown one reported.
    let some = [ids[0], *ids.last().unwrap(), ids[0], 77];
    let mapped = map_ids(&mut workers[1], &some, "get", json!({})).unwrap();
    assert_eq!(mapped.len(), 3);
    assert_eq!((&mapped[&ids[0]], &mapped[ids.last().unwrap()]), (&Ok(json!(13)), &Ok(json!(13))));
    assert_eq!(mapped[&77].as_ref().unwrap_err().0, "42704");
}

#[test]
fn a_map_call_across_nodes_commits_or_rolls_back_as_one_transaction() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_map_atomic", "counter");
    let (a, b) = on_two_nodes(&mut c, &app, "Counter", json!({"initial": 0}));
    let values = |c: &mut Client| (call(c, a, "get", json!({})), call(c, b, "get", json!({})));

    let mut tx = c.transaction().unwrap();
    map_type(&mut tx, &app, "Counter", "increment", json!({})).unwrap();
    tx.rollback().unwrap();
    assert_eq!(values(&mut c), (json!(0), json!(0)));

    // A statement that fails after the map call: nothing of it stays.
    let failing = "SELECT (SELECT count(*) FROM lambdastore.map_call($1, 'Counter', 'increment')) / 0";
    expect_sqlstate(c.query(failing, &[&app]), "22012");
    assert_eq!(values(&mut c), (json!(0), json!(0)));

    let mut tx = c.transaction().unwrap();
    map_type(&mut tx, &app, "Counter", "increment", json!({})).unwrap();
    tx.commit().unwrap();
    assert_eq!(values(&mut c), (json!(1), json!(1)));
    let pid = backend_pid(&mut c);
    for c in std::iter::once(&mut c).chain(workers.iter_mut()) {
        assert_eq!(left_prepared(c, pid), 0, "a transaction was left prepared");
    }
}

#[test]
fn a_map_calls_failed_calls_are_reported_and_rolled_back_alone_on_every_node() {
    let Some(_workers) = workers() else { return };
    let (mut c, app) = deployed("citus_map_failures", "counter");
    let near_max = on_two_nodes(&mut c, &app, "Counter", json!({"initial": i64::MAX - 1}));
    let small = on_two_nodes(&mut c, &app, "Counter", json!({"initial": 1}));
    let mapped = map_type(&mut c, &app, "Counter", "add", json!({"n": 2})).unwrap();
    for id in [near_max.0, near_max.1] {
        let (code, message) = mapped[&id].clone().unwrap_err();
        assert_eq!(code, "P0001", "object {id}: {message}");
        assert_eq!(call(&mut c, id, "get", json!({})), json!(i64::MAX - 1));
    }
    for id in [small.0, small.1] {
        assert_eq!(mapped[&id], Ok(json!(3)));
        assert_eq!(call(&mut c, id, "get", json!({})), json!(3));
    }
    // An error raised (not returned by the lambda) is reported per object
    // too, on every node: here arguments the method cannot take.
    let mapped = map_type(&mut c, &app, "Counter", "add", json!({"n": "two"})).unwrap();
    assert_eq!(mapped.len(), objects(&mut c, &app).len());
    for (id, outcome) in &mapped {
        assert_eq!(outcome.as_ref().unwrap_err().0, "22023", "object {id}");
    }
    assert_eq!(call(&mut c, small.1, "get", json!({})), json!(3));
}

#[test]
fn a_map_calls_runs_may_call_objects_on_other_nodes() {
    let Some(_workers) = workers() else { return };
    let (mut c, app) = deployed("citus_map_nested", "micro");
    let by_node = spread(&mut c, &app, "Bench", json!({"entries": 0}), 2);
    let target = by_node.values().next().unwrap()[0];
    let relays = by_node.values().flatten().count() as i64;
    // Every object relays one tally to `target`: those on the other node
    // stop for it there and are driven again from the coordinator. A
    // session may ask Citus for a connection per task: two tasks of the
    // target's node would then be two writers of it in one transaction.
    c.batch_execute("SET citus.force_max_query_parallelization = on").unwrap();
    let mapped =
        map_type(&mut c, &app, "Bench", "relay", json!({"target": target, "method": "tally", "args": {"tag": 1}}))
            .unwrap();
    let mut counts: Vec<i64> = mapped.values().map(|outcome| outcome.clone().unwrap().as_i64().unwrap()).collect();
    counts.sort_unstable();
    assert_eq!(counts, (1..=relays).collect::<Vec<_>>(), "each relay counted once, in some order");
    assert_eq!(call(&mut c, target, "tally", json!({"tag": 2})), json!(relays + 1));
}

/// Transfers between two counters on different nodes beside readers that
/// read both with one map call (its own transaction): every reader must
/// see the same total.
fn read_skew_by_map_calls(cc: Cc) -> (u64, Tally) {
    read_skew(cc, "read skew by map calls", "citus_map_skew", |c, _, tally, _, a, b| {
        // A call that failed its own validation is reported in its row
        // (40001): the reader retries as for the statement's.
        loop {
            match map_ids(c, &[a, b], "get", json!({})) {
                Err(e) if sqlstate(&e) == Some("40001") => tally.retries += 1,
                Err(e) => panic!("a read failed: {}", describe(&e)),
                Ok(rows) if rows.values().any(|row| matches!(row, Err((code, _)) if code == "40001")) => {
                    tally.retries += 1
                }
                Ok(rows) => return rows.values().map(|row| row.clone().unwrap().as_i64().unwrap()).sum(),
            }
        }
    })
}

#[test]
fn read_skew_by_map_calls_occ() {
    prove(read_skew_by_map_calls, Cc::Occ);
}

#[test]
fn read_skew_by_map_calls_off() {
    prove(read_skew_by_map_calls, Cc::Off);
}

/// The host call: a lambda's map call reaches objects on both workers,
/// each call on its object's node, from a session on the coordinator.
#[test]
fn a_lambdas_map_call_runs_each_call_on_its_objects_node() {
    let Some(_workers) = workers() else { return };
    // The node identity below reads the call counts, which rebalancing forgets.
    let _turn = super::rebalance::REBALANCING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (mut c, app) = deployed("citus_lambda_map", "counter");
    let by_node = spread(&mut c, &app, "Counter", json!({"initial": 1}), 3);
    let mut nodes = by_node.values();
    let (here, there) = (nodes.next().unwrap(), nodes.next().unwrap());
    let me = here[0];
    let targets: Vec<i64> = here[1..].iter().chain(there).copied().collect();
    let my_node = owner(&mut c, me);
    let full = (0..200)
        .find_map(|_| {
            let id = create(&mut c, &app, "Counter", json!({"initial": i64::MAX}));
            (owner(&mut c, id) != my_node).then_some(id)
        })
        .expect("a counter on the other worker");

    let all: Vec<i64> = targets.iter().copied().chain([full]).collect();
    let outcomes = call(&mut c, me, "add_to_each", json!({"counters": all, "n": 2}));
    let mut expected: Vec<Value> = targets.iter().map(|&id| json!([id, {"Ok": 3}])).collect();
    expected.push(json!([full, {"Err": format!("counter overflow: {} + 2", i64::MAX)}]));
    assert_eq!(outcomes, Value::Array(expected));
    for &id in &targets {
        assert_eq!(call(&mut c, id, "get", json!({})), json!(3), "object {id}");
        let nodes: Vec<String> = c
            .query("SELECT DISTINCT node FROM lambdastore.affinity() WHERE object_id = $1 AND partner IS NULL", &[&id])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(nodes, vec![owner(&mut c, id)], "object {id}'s calls ran elsewhere");
    }
    assert_eq!(call(&mut c, full, "get", json!({})), json!(i64::MAX));
    assert_eq!(call(&mut c, me, "get", json!({})), json!(1 + targets.len() as i64));
}
