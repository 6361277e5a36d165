//! The HTTP gateway on the cluster: a real gateway process (the binary
//! cargo builds for `lambdastore-gateway`), over real HTTP, connecting to
//! the coordinator as docs/gateway.md's least-privilege role, routing each call
//! on an object to the node holding it (`X-Lambdastore-Node` names the node
//! a call was sent to). The tests that move shards move only shards they
//! made for an object of their own (`lambdastore.migrate_object`), so the
//! other tests' objects stay where they are.

use super::{calls_here, counter_to_move, migrate, node, shard_mate, spread, worker_at, workers};
use crate::common::*;
use postgres::Client;
use reqwest::blocking::Response;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;

const ROLE: &str = "lambdastore_gateway";

/// docs/gateway.md's role for the gateway, on every node: Citus creates the
/// role on the workers but does not repeat grants on an extension's schema
/// and functions there, so they are run on each node.
fn setup_role(c: &mut Client) {
    static ROLE_SETUP: Once = Once::new();
    ROLE_SETUP.call_once(|| {
        change_roles(
            c,
            &format!(
                "DO $$ BEGIN CREATE ROLE {ROLE} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
                 GRANT USAGE ON SCHEMA lambdastore_gateway TO {ROLE};
                 GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lambdastore_gateway TO {ROLE};"
            ),
        )
        .unwrap_or_else(|e| panic!("the gateway's role: {}", describe(&e)));
        for grant in [
            format!("GRANT USAGE ON SCHEMA lambdastore_gateway TO {ROLE}"),
            format!("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lambdastore_gateway TO {ROLE}"),
        ] {
            let failed: i64 = c
                .query_one("SELECT count(*) FROM run_command_on_workers($1) WHERE NOT success", &[&grant])
                .unwrap()
                .get(0);
            assert_eq!(failed, 0, "{grant} on the workers");
        }
    });
}

/// The gateway binary, built once per test process (cargo has released
/// its lock by the time tests run).
fn binary() -> PathBuf {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "lambdastore-gateway"])
            .current_dir(workspace())
            .status()
            .expect("run cargo build -p lambdastore-gateway");
        assert!(status.success(), "cargo build -p lambdastore-gateway failed");
    });
    // The test binary is target/<profile>/deps/citus-<hash>.
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>").join("lambdastore-gateway")
}

#[path = "../../../gateway/tests/harness/process.rs"]
mod process;
use process::Gateway;

/// Gateways in front of the coordinator, as docs/gateway.md's role.
impl Gateway {
    fn start(c: &mut Client, flags: &[&str]) -> Gateway {
        setup_role(c);
        let url = std::env::var("LAMBDASTORE_TEST_URL").unwrap();
        let kept: Vec<&str> =
            url.split_whitespace().filter(|kv| !kv.starts_with("user=") && !kv.starts_with("dbname=")).collect();
        let database_url = format!("{} user={ROLE} dbname={DATABASE}", kept.join(" "));
        Gateway::spawn(&binary(), &database_url, &[&["--pool-size", "4"], flags].concat())
    }

    fn invoke(&self, key: &str, object: i64, method: &str) -> Response {
        self.http
            .post(format!("{}/v1/objects/{object}/methods/{method}", self.base))
            .bearer_auth(key)
            .json(&json!({}))
            .send()
            .unwrap()
    }

    /// Invokes `method` and returns its result and the node the call went to.
    #[track_caller]
    fn call(&self, key: &str, object: i64, method: &str) -> (Value, String) {
        let response = self.invoke(key, object, method);
        let status = response.status();
        let node = response.headers().get("x-lambdastore-node").map(|v| v.to_str().unwrap().to_string());
        let body: Value = response.json().unwrap();
        assert_eq!(status, 200, "{method} on {object}: {body}");
        (body["result"].clone(), node.expect("an X-Lambdastore-Node header"))
    }

    fn refreshes(&self) -> f64 {
        self.metric("lambdastore_gateway_placement_refreshes_total", &[])
    }
}

fn api_key(c: &mut Client, app: &str) -> String {
    c.query_one("SELECT api_key FROM lambdastore.create_api_key($1, 'citus gateway tests')", &[&app]).unwrap().get(0)
}

fn coordinator(c: &mut Client) -> String {
    c.query_one("SELECT nodename || ':' || nodeport FROM pg_dist_node WHERE groupid = 0", &[]).unwrap().get(0)
}

#[test]
fn calls_on_objects_are_sent_to_the_node_holding_them() {
    let Some(_workers) = workers() else { return };
    let (mut c, app) = deployed("citus_gw_owner", "counter");
    let by_node = spread(&mut c, &app, "Counter", json!({"initial": 10}), 3);
    let key = api_key(&mut c, &app);
    let gw = Gateway::start(&mut c, &[]);
    for (node, ids) in &by_node {
        for &id in ids {
            let (result, served_by) = gw.call(&key, id, "increment");
            assert_eq!(result, json!(11));
            assert_eq!(&served_by, node, "object {id} lives on {node}");
        }
    }
    for (node, ids) in &by_node {
        let calls = gw.metric("lambdastore_gateway_calls_total", &[&format!("node=\"{node}\"")]);
        assert_eq!(calls, ids.len() as f64, "calls sent to {node}");
    }
    // Calls that name no object go to the coordinator.
    let created = gw
        .http
        .post(format!("{}/v1/apps/{app}/types/Counter/objects", gw.base))
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .unwrap();
    assert_eq!(created.status(), 201);
    assert_eq!(created.headers()["x-lambdastore-node"].to_str().unwrap(), coordinator(&mut c));
    assert_eq!(gw.refreshes(), 0.0, "the map was right from the start");
}

/// An object with a light replica has its calls spread in turn over its
/// owner and the replica, which runs them itself (its statistics count
/// them); the counter stays exact, and no call makes the gateway think its
/// map is stale.
#[test]
fn calls_on_an_object_with_a_light_replica_are_spread_over_it_and_its_owner() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_gw_replica", "counter");
    let counter = create(&mut c, &app, "Counter", json!({}));
    let owner_at = worker_at(&mut workers, &owner(&mut c, counter));
    let replica = node(&mut workers[1 - owner_at]);
    c.query_one("SELECT lambdastore.add_light_replica($1, $2)", &[&counter, &replica]).unwrap();
    let key = api_key(&mut c, &app);
    let gw = Gateway::start(&mut c, &[]);
    let mut served: BTreeMap<String, u32> = BTreeMap::new();
    for n in 1..=6 {
        let (result, node) = gw.call(&key, counter, "increment");
        assert_eq!(result, json!(n));
        *served.entry(node).or_default() += 1;
    }
    let owner_node = owner(&mut c, counter);
    assert_eq!(served, BTreeMap::from([(owner_node, 3), (replica.clone(), 3)]));
    assert_eq!(calls_here(&mut workers[1 - owner_at], &app, "increment"), 3, "the replica ran its calls");
    assert_eq!(gw.refreshes(), 0.0);
}

/// After `migrate_object`, a call routed by the old map reaches the old node, which
/// says it no longer holds the object (and forwards the call, which runs
/// once, on the new owner); the gateway reloads the map once, however many
/// calls saw the old one, and the next call goes to the new owner.
#[test]
fn after_a_migration_one_refresh_sends_the_next_call_to_the_new_owner() {
    let Some(_workers) = workers() else { return };
    let (mut c, app) = deployed("citus_gw_move", "counter");
    let (object, from, to) = counter_to_move(&mut c, &app, 0);
    let key = api_key(&mut c, &app);
    // The calls below conflict on one object: they are retried until they pass.
    let gw = Gateway::start(&mut c, &["--max-retries", "1000"]);
    assert_eq!(gw.call(&key, object, "increment"), (json!(1), from.clone()));

    migrate(&mut c, object, &to);
    // Calls at once, all routed by the old map.
    let results: Vec<(Value, String)> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..6).map(|_| s.spawn(|| gw.call(&key, object, "increment"))).collect();
        calls.into_iter().map(|call| call.join().unwrap()).collect()
    });
    let mut counts: Vec<i64> = results.iter().map(|(value, _)| value.as_i64().unwrap()).collect();
    counts.sort();
    assert_eq!(counts, (2..=7).collect::<Vec<_>>(), "each call ran once");
    assert_eq!(gw.refreshes(), 1.0, "one reload for every call that saw the old map");
    assert_eq!(gw.metric("lambdastore_gateway_placement_refreshes_total", &["reason=\"not_owner\""]), 1.0);

    assert_eq!(gw.call(&key, object, "increment"), (json!(8), to.clone()));
    assert_eq!(gw.refreshes(), 1.0);
}

/// After a tenant isolation the hash ranges are uneven: the isolated
/// object's shard is one hash wide, between the two halves of the range
/// it came from. Moved to the other worker, it is found there, and an
/// object of those halves still on the first worker.
#[test]
fn an_isolated_object_is_found_in_its_one_hash_shard() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_gw_isolated", "counter");
    let (object, from, to) = counter_to_move(&mut c, &app, 0);
    // A neighbour: another object of the same shard, made on its node.
    let at = worker_at(&mut workers, &from);
    let neighbour = shard_mate(&mut c, &mut workers[at], &app, "Counter", object);

    migrate(&mut c, object, &to);
    let key = api_key(&mut c, &app);
    let gw = Gateway::start(&mut c, &[]);
    assert_eq!(gw.call(&key, object, "increment"), (json!(1), to.clone()));
    assert_eq!(gw.call(&key, neighbour, "increment"), (json!(1), from.clone()));
    assert_eq!(gw.refreshes(), 0.0, "the map read after the isolation was right");
}

/// A gateway whose first map sends every shard to the other worker: each
/// call still runs once (the node forwards it), the first one reloads the
/// map, and every call after it goes to the owner.
#[test]
fn a_placement_wrong_on_purpose_is_corrected_by_one_refresh() {
    let Some(_workers) = workers() else { return };
    let (mut c, app) = deployed("citus_gw_wrong", "counter");
    let by_node = spread(&mut c, &app, "Counter", json!({"initial": 0}), 2);
    let key = api_key(&mut c, &app);
    let gw = Gateway::start(&mut c, &["--misplace-for-tests", "shifted"]);
    let (first_node, ids) = by_node.iter().next().unwrap();
    let (result, served_by) = gw.call(&key, ids[0], "increment");
    assert_eq!(result, json!(1));
    assert_ne!(&served_by, first_node, "the first call went by the wrong map");
    assert_eq!(gw.metric("lambdastore_gateway_placement_refreshes_total", &["reason=\"not_owner\""]), 1.0);
    for (node, ids) in &by_node {
        for &id in ids {
            let (_, served_by) = gw.call(&key, id, "increment");
            assert_eq!(&served_by, node, "object {id} lives on {node}");
        }
    }
    assert_eq!(gw.call(&key, ids[0], "get").0, json!(2), "each call ran once");
    assert_eq!(gw.refreshes(), 1.0);
}

/// A gateway whose first map names a node that refuses connections: the
/// call was provably not sent, so the gateway reloads the map and sends it
/// again, once, to the owner.
#[test]
fn a_node_that_refuses_connections_is_replaced_by_a_refresh_and_one_retry() {
    let Some(_workers) = workers() else { return };
    let (mut c, app) = deployed("citus_gw_refused", "counter");
    let by_node = spread(&mut c, &app, "Counter", json!({"initial": 0}), 1);
    let key = api_key(&mut c, &app);
    let gw = Gateway::start(&mut c, &["--misplace-for-tests", "unreachable"]);
    for (node, ids) in &by_node {
        assert_eq!(gw.call(&key, ids[0], "increment"), (json!(1), node.clone()));
    }
    assert_eq!(gw.metric("lambdastore_gateway_placement_refreshes_total", &["reason=\"unreachable\""]), 1.0);
    assert_eq!(gw.refreshes(), 1.0);
    let ready = gw.http.get(format!("{}/readyz", gw.base)).send().unwrap();
    assert_eq!(ready.status(), 200, "the unreachable node is gone from the map");
}
