//! `lambdastore.rebalance()` on the cluster: objects that call partners on
//! the other node are brought together, which cuts the share of
//! cross-node nested calls (measured before and after, by the calls the
//! nodes counted); the hot object of a skewed load moves to the idle node;
//! a run over the same load after that plans nothing; a dry run changes
//! nothing; and `lambdastore.rebalance_interval` makes the coordinator do
//! it by itself.
//!
//! The counts and the runs are the whole cluster's: these tests take
//! turns (`REBALANCING`), and each limits its runs to its own application.
//! The background rebalancer moves any application's objects, so its test
//! runs alone, after the others (scripts/e2e-citus.sh).

use super::{node, spread, workers, CoordinatorReplicas};
use crate::common::*;
use postgres::Client;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Held by every test that reads or forgets the call counts.
pub(crate) static REBALANCING: Mutex<()> = Mutex::new(());

/// `CALL lambdastore.rebalance(...)` for `app`'s objects: the plan.
fn rebalance(c: &mut Client, app: &str, dry_run: bool, max_moves: i32) -> Value {
    // The simple protocol: a procedure's jsonb comes back as text.
    assert!(app.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_'), "{app}");
    let sql = format!("CALL lambdastore.rebalance(dry_run => {dry_run}, max_moves => {max_moves}, app => '{app}')");
    let messages = c.simple_query(&sql).unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
    let plan = messages
        .iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => row.get(0).map(|text| serde_json::from_str(text).unwrap()),
            _ => None,
        })
        .expect("CALL returns the plan");
    eprintln!("rebalance(dry_run => {dry_run}): {plan}");
    plan
}

/// Nested calls among `objects` and how many went to another node, as the
/// nodes counted them since the last run that forgot the counts.
fn nested_calls(c: &mut Client, objects: &[i64]) -> (i64, i64) {
    let row = c
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(cross_node), 0)::bigint FROM lambdastore.affinity()
              WHERE object_id = ANY ($1) AND partner = ANY ($1)",
            &[&objects],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

fn placement(c: &mut Client, objects: &[i64]) -> BTreeMap<i64, String> {
    objects.iter().map(|&id| (id, owner(c, id))).collect()
}

fn moved(plan: &Value) -> Vec<i64> {
    plan["moves"].as_array().unwrap().iter().map(|m| m["object_id"].as_i64().unwrap()).collect()
}

/// Four accounts on one worker, each paired with one on the other: every
/// transfer of a pair is a nested call across the nodes.
fn pairs_across_nodes(c: &mut Client, app: &str) -> Vec<(i64, i64)> {
    let by_node = spread(c, app, "Account", json!({"owner": "rebalance", "initial": 1000}), 4);
    let mut nodes = by_node.values();
    let (first, second) = (nodes.next().unwrap(), nodes.next().unwrap());
    first.iter().zip(second).take(4).map(|(&a, &b)| (a, b)).collect()
}

/// Transfers of 1 along `pairs`, `rounds` times. A transfer that meets a
/// migration holding a fence it needs is refused with 40001 ("may be
/// moving", nothing done: ARCHITECTURE.md, "Moving objects") and made
/// again, as a client would; a few times at most.
fn transfers(c: &mut Client, pairs: &[(i64, i64)], rounds: usize) {
    for _ in 0..rounds {
        for &(from, to) in pairs {
            let mut attempts = 0;
            while let Err(e) = invoke(c, from, "transfer", json!({"to": to, "amount": 1})) {
                attempts += 1;
                let moving = crate::common::concurrent::sqlstate(&e) == Some("40001");
                assert!(moving && attempts < 20, "transfer {from} -> {to}, attempt {attempts}: {}", describe(&e));
            }
        }
    }
}

fn total(c: &mut Client, pairs: &[(i64, i64)]) -> i64 {
    pairs.iter().flat_map(|&(a, b)| [a, b]).map(|id| call(c, id, "balance", json!({})).as_i64().unwrap()).sum()
}

#[test]
fn the_rebalancer_brings_partners_on_two_nodes_together_and_cuts_cross_node_calls() {
    let Some(_workers) = workers() else { return };
    let _turn = REBALANCING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (mut c, app) = deployed("citus_rebalance_partners", "bank");
    let pairs = pairs_across_nodes(&mut c, &app);
    let objects: Vec<i64> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    transfers(&mut c, &pairs, 5);
    let (calls, cross) = nested_calls(&mut c, &objects);
    assert_eq!((calls, cross), (20, 20), "every transfer's deposit went to the other node");

    // A dry run shows the plan and its effect, and changes nothing.
    let before = placement(&mut c, &objects);
    let dry = rebalance(&mut c, &app, true, 8);
    assert_eq!(moved(&dry).len(), 4, "one of each pair moves (swaps keep the load even)");
    assert_eq!(
        (dry["cross_node_calls"]["before"].as_i64(), dry["cross_node_calls"]["after"].as_i64()),
        (Some(20), Some(0))
    );
    assert_eq!(placement(&mut c, &objects), before, "a dry run moved objects");
    assert_eq!(nested_calls(&mut c, &objects), (20, 20), "a dry run forgot the counts");

    let run = rebalance(&mut c, &app, false, 8);
    assert_eq!(moved(&run), moved(&dry), "the run made the plan the dry run showed");
    for step in run["moves"].as_array().unwrap() {
        assert_eq!(step["outcome"], "moved", "{step}");
    }
    for &(a, b) in &pairs {
        assert_eq!(owner(&mut c, a), owner(&mut c, b), "pair {a}, {b} apart after the run");
    }
    let after = placement(&mut c, &objects);
    for node in before.values() {
        assert_eq!(after.values().filter(|n| *n == node).count(), 4, "the load is no longer even: {after:?}");
    }

    // The same load again: measured, no call crosses the nodes now.
    assert_eq!(nested_calls(&mut c, &objects), (0, 0), "the run forgets the counts it planned from");
    transfers(&mut c, &pairs, 5);
    assert_eq!(nested_calls(&mut c, &objects), (20, 0));
    assert_eq!(total(&mut c, &pairs), 8 * 1000, "money was made or lost");
    // And a run over that load plans nothing: balanced, partners together.
    assert!(moved(&rebalance(&mut c, &app, true, 8)).is_empty());
}

#[test]
fn the_rebalancer_moves_the_hot_object_of_a_skewed_load_and_then_stops() {
    let Some(_workers) = workers() else { return };
    let _turn = REBALANCING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (mut c, app) = deployed("citus_rebalance_hot", "counter");
    let by_node = spread(&mut c, &app, "Counter", json!({}), 3);
    let mut nodes = by_node.iter();
    let (busy, busy_ones) = nodes.next().unwrap();
    let (idle, _) = nodes.next().unwrap();
    // The idle node's objects receive no calls.
    let (hot, warm) = (busy_ones[0], [busy_ones[1], busy_ones[2]]);
    let load = |c: &mut Client| {
        for _ in 0..60 {
            call(c, hot, "increment", json!({}));
        }
        for &id in &warm {
            for _ in 0..5 {
                call(c, id, "increment", json!({}));
            }
        }
    };
    load(&mut c);

    let run = rebalance(&mut c, &app, false, 4);
    assert_eq!(moved(&run), vec![hot], "the hot object moves, and nothing else");
    assert_eq!(&owner(&mut c, hot), idle);
    let load_after = &run["load"]["after"];
    assert!(
        load_after[busy].as_i64().unwrap().max(load_after[idle].as_i64().unwrap()) < 70,
        "the busiest node's share did not fall: {run}"
    );
    assert_eq!(call(&mut c, hot, "get", json!({})), json!(60), "the hot counter kept its count");

    // The same skewed load again: nothing left to move.
    load(&mut c);
    assert!(moved(&rebalance(&mut c, &app, false, 4)).is_empty(), "a second run moved objects back and forth");
    assert_eq!(&owner(&mut c, hot), idle);
}

#[test]
fn a_rebalance_explains_what_it_refuses() {
    let Some(mut workers) = workers() else { return };
    let _turn = REBALANCING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut c = connect();
    let err = c.execute("CALL lambdastore.rebalance(max_moves => -1)", &[]).unwrap_err();
    assert_eq!(err.code().map(|s| s.code()), Some("22023"), "{}", describe(&err));
    let err = workers[0].execute("CALL lambdastore.rebalance(dry_run => true)", &[]).unwrap_err();
    assert_eq!(err.code().map(|s| s.code()), Some("55000"), "{}", describe(&err));
    // A real run commits each move: not inside a transaction block.
    let mut tx = c.transaction().unwrap();
    let err = tx.execute("CALL lambdastore.rebalance(app => 'no such application')", &[]).unwrap_err();
    assert_eq!(err.code().map(|s| s.code()), Some("2D000"), "{}", describe(&err));
}

/// Runs alone (scripts/e2e-citus.sh): the coordinator's rebalancer moves
/// every application's objects.
#[test]
fn background_rebalancer_brings_partners_together_by_itself() {
    let Some(_workers) = workers() else { return };
    let _turn = REBALANCING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (mut c, app) = deployed("citus_rebalance_background", "bank");
    let pairs = pairs_across_nodes(&mut c, &app);
    let objects: Vec<i64> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    c.execute("SELECT count(*) FROM lambdastore.affinity(forget => true)", &[]).unwrap();
    let set_interval = |c: &mut Client, interval: &str| {
        c.execute(&format!("ALTER SYSTEM SET lambdastore.rebalance_interval = '{interval}'"), &[]).unwrap();
        c.execute("SELECT pg_reload_conf()", &[]).unwrap();
    };
    set_interval(&mut c, "200ms");
    // Load until every pair shares a node, for at most a minute.
    let deadline = Instant::now() + Duration::from_secs(60);
    let together = |c: &mut Client| pairs.iter().all(|&(a, b)| owner(c, a) == owner(c, b));
    let back: Vec<(i64, i64)> = pairs.iter().map(|&(a, b)| (b, a)).collect();
    while !together(&mut c) && Instant::now() < deadline {
        transfers(&mut c, &pairs, 1);
        transfers(&mut c, &back, 1);
    }
    set_interval(&mut c, "0");
    assert!(together(&mut c), "the pairs are still apart after a minute: {:?}", placement(&mut c, &objects));
    let by_rebalancer: i64 = c
        .query_one(
            "SELECT count(*) FROM lambdastore.migrations WHERE object_id = ANY ($1) AND reason LIKE 'rebalance: %'",
            &[&objects],
        )
        .unwrap()
        .get(0);
    assert!(by_rebalancer >= 4, "{by_rebalancer} moves logged by the rebalancer");
    assert_eq!(total(&mut c, &pairs), 8 * 1000, "money was made or lost");
}

/// Runs alone (scripts/e2e-citus.sh): the coordinator's rebalancer, by
/// itself, gives an object whose calls read and compute a light replica,
/// and takes it back once the calls stop; a replica placed by hand on an
/// idle object stays through every run (the steps rebalancer.rs applies).
#[test]
fn background_rebalancer_adds_and_drops_light_replicas_by_itself() {
    let Some(_workers) = workers() else { return };
    let _turn = REBALANCING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (mut c, app) = deployed("citus_rebalance_background_replicas", "micro");
    let by_node = spread(&mut c, &app, "Bench", json!({"entries": 10}), 1);
    let reader = by_node.values().next().unwrap()[0];
    // On the coordinator, which stores no objects.
    let (idle, idle_at) = (create(&mut c, &app, "Bench", json!({"entries": 1})), node(&mut c));
    let mut on_coordinator = CoordinatorReplicas::new(&mut c);
    on_coordinator.add(&mut c, idle).unwrap();
    c.execute("SELECT count(*) FROM lambdastore.affinity(forget => true)", &[]).unwrap();
    let configure = |c: &mut Client, interval: &str, threshold: &str| {
        // One statement each: ALTER SYSTEM runs in no transaction block.
        c.batch_execute(&format!("ALTER SYSTEM SET lambdastore.rebalance_interval = '{interval}'")).unwrap();
        c.batch_execute(&format!("ALTER SYSTEM SET lambdastore.light_replica_threshold = {threshold}")).unwrap();
        c.batch_execute("SELECT pg_reload_conf()").unwrap();
    };
    // Low enough that one client's hashing makes the object hot.
    configure(&mut c, "200ms", "0.001");
    let deadline = Instant::now() + Duration::from_secs(60);
    while light_replicas(&mut c, reader).is_empty() && Instant::now() < deadline {
        call(&mut c, reader, "hash", json!({"n": 500}));
    }
    let added = light_replicas(&mut c, reader);
    // No more calls: the load falls, and each run drops one it added.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !light_replicas(&mut c, reader).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50)); // polling the runs' outcome
    }
    let left = light_replicas(&mut c, reader);
    let kept = light_replicas(&mut c, idle);
    configure(&mut c, "0", "DEFAULT");
    assert!(!added.is_empty(), "no light replica within a minute of load");
    assert!(left.is_empty(), "still replicas {left:?} 30 s after the calls stopped");
    assert_eq!(kept, vec![idle_at], "the replica placed by hand stays");
}

/// The light replicas of `object`, by node.
fn light_replicas(c: &mut Client, object: i64) -> Vec<String> {
    c.query("SELECT node FROM lambdastore.light_replicas WHERE object_id = $1 ORDER BY node", &[&object])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The plan's light-replica steps: (object, node, action, outcome).
fn replica_steps(plan: &Value) -> Vec<(i64, String, String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    plan["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["object_id"].as_i64().unwrap(), text(&s["node"]), text(&s["action"]), text(&s["outcome"])))
        .collect()
}

/// A hot object whose calls read and compute gets a light replica, one
/// as hot whose calls write gets none (replicas spread compute, not
/// writes), and when the load falls the replica goes; so does one left on
/// the node its object was moved to. One added by hand stays through both.
#[test]
fn the_rebalancer_gives_a_hot_object_whose_calls_read_a_light_replica_and_takes_it_back() {
    let Some(_workers) = workers() else { return };
    let _turn = REBALANCING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (mut c, app) = deployed("citus_rebalance_replicas", "micro");
    let by_node = spread(&mut c, &app, "Bench", json!({"entries": 10}), 2);
    let mut nodes = by_node.iter();
    let ((a, on_a), (b, on_b)) = (nodes.next().unwrap(), nodes.next().unwrap());
    let (reader, writer, moving) = (on_a[0], on_a[1], on_b[0]);
    // Placed by hand on the writer, which the counts below would never justify.
    c.execute("SELECT lambdastore.add_light_replica($1, $2)", &[&writer, b]).unwrap();
    // Low enough that a test's few calls make an object hot (this
    // session's runs only).
    c.batch_execute("SET lambdastore.light_replica_threshold = 0.001").unwrap();
    let forget = |c: &mut Client| c.execute("SELECT count(*) FROM lambdastore.affinity(forget => true)", &[]).unwrap();
    forget(&mut c);
    for _ in 0..20 {
        call(&mut c, reader, "hash", json!({"n": 500}));
        call(&mut c, writer, "write", json!({"k": 3}));
    }
    let added = rebalance(&mut c, &app, false, 0);
    let steps = replica_steps(&added);
    assert_eq!(steps.len(), 1, "one replica, for the reader: {added}");
    let (object, node, action, outcome) = steps[0].clone();
    assert_eq!((object, action.as_str(), outcome.as_str()), (reader, "add", "added"), "{added}");
    assert_ne!(&node, a, "not on its owner");
    assert_eq!(light_replicas(&mut c, reader), vec![node.clone()]);
    assert_eq!(light_replicas(&mut c, writer), vec![b.clone()], "the replica placed by hand stays");
    assert_eq!(call(&mut c, reader, "hash", json!({"n": 1})).as_str().map(str::len), Some(128));

    // A replica left on the node its object then moves to serves nothing.
    c.execute("SELECT lambdastore.add_light_replica($1, $2)", &[&moving, a]).unwrap();
    c.execute("SELECT lambdastore.migrate_object($1, $2)", &[&moving, a]).unwrap();
    // No more calls: the load fell.
    forget(&mut c);
    let dropped = rebalance(&mut c, &app, false, 0);
    let mut steps = replica_steps(&dropped);
    steps.sort();
    let drop = |object: i64, node: &str| (object, node.to_string(), "drop".to_string(), "dropped".to_string());
    let mut expected = vec![drop(reader, &node), drop(moving, a)];
    expected.sort();
    assert_eq!(steps, expected, "{dropped}");
    assert!(light_replicas(&mut c, reader).is_empty());
    assert!(light_replicas(&mut c, moving).is_empty());
    assert_eq!(light_replicas(&mut c, writer), vec![b.clone()], "the replica placed by hand stays");
}
