//! Light replicas (cluster/replica.rs): a node that does not store an
//! object runs its calls on a copy, and the owner validates and applies
//! what each call read and wrote, in the caller's transaction.

use super::{calls_here, connect_node, node, sent_by, worker_at, workers, CoordinatorReplicas};
use crate::cluster;
use crate::common::concurrent::{retrying, subtract_if_covered, Cc, Rng, Tally};
use crate::common::*;
use postgres::Client;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn add_replica(c: &mut Client, object: i64, node: &str) -> Result<bool, postgres::Error> {
    c.query_one("SELECT lambdastore.add_light_replica($1, $2)", &[&object, &node]).map(|row| row.get(0))
}

/// A counter of a fresh `counter` application, connections to the node
/// that stores it, to the other worker and to the coordinator, both made
/// its light replicas, and the coordinator's replica (dropped at the end
/// of the test): (app, counter, owner, replica worker, coordinator, its replica).
fn replicated_counter(test: &str) -> Option<(String, i64, Client, Client, Client, CoordinatorReplicas)> {
    let mut workers = workers()?;
    let (mut c, app) = deployed(test, "counter");
    let counter = create(&mut c, &app, "Counter", json!({}));
    let owner = worker_at(&mut workers, &owner(&mut c, counter));
    let mut replica = workers.remove(1 - owner);
    let owner = workers.remove(0);
    let worker = node(&mut replica);
    assert!(add_replica(&mut c, counter, &worker).unwrap(), "{worker} was a replica already");
    let mut on_coordinator = CoordinatorReplicas::new(&mut c);
    assert!(on_coordinator.add(&mut c, counter).unwrap(), "the coordinator was a replica already");
    Some((app, counter, owner, replica, c, on_coordinator))
}

#[test]
fn counters_incremented_through_the_owner_and_two_light_replicas_stay_exact() {
    let Some((app, counter, owner, replica, coordinator, _replica)) = replicated_counter("replica_exact") else {
        return;
    };
    drop((owner, replica, coordinator));
    let urls: Vec<String> = {
        let cluster = cluster::citus().expect("a cluster");
        let mut urls = cluster.workers.clone();
        urls.push(std::env::var("LAMBDASTORE_TEST_URL").unwrap());
        urls
    };
    const THREADS: usize = 8;
    const PER_THREAD: usize = 40;
    let workers: Vec<_> = (0..THREADS)
        .map(|i| {
            let url = urls[i % urls.len()].clone();
            std::thread::spawn(move || {
                let mut c = connect_node(&url);
                let (mut rng, mut tally) = (Rng::new(i as u64), Tally::default());
                for _ in 0..PER_THREAD {
                    let done =
                        retrying(Cc::Occ, &mut tally, &mut rng, || invoke(&mut c, counter, "increment", json!({})));
                    done.unwrap_or_else(|e| panic!("increment: {}", describe(&e)));
                    tally.committed += 1;
                }
                tally
            })
        })
        .collect();
    let tallies: Vec<Tally> = workers.into_iter().map(|w| w.join().expect("a client")).collect();
    let tally = Tally::sum(&tallies);
    let mut c = connect();
    assert_eq!(call(&mut c, counter, "get", json!({})), json!(tally.committed), "{tally}");
    assert_eq!(tally.committed, (THREADS * PER_THREAD) as u64);
    // Each replica ran calls itself (its own statistics count them).
    for url in &urls {
        let mut node = connect_node(url);
        assert!(calls_here(&mut node, &app, "increment") > 0, "no increment ran on {url}");
    }
}

/// Write skew through light replicas: the serializable suite's
/// multi-statement transaction (read two counters, take 150 from one if
/// they hold 150 together, commit) from 4 clients at once per pair, on the
/// coordinator, a light replica of every counter. Each pair ends with
/// exactly one taking: every read a replica made is validated by its owner
/// again at the transaction's commit.
#[test]
fn write_skew_through_light_replicas_is_prevented() {
    let Some(_workers) = workers() else { return };
    let (mut c, app) = deployed("replica_skew", "counter");
    let mut on_coordinator = CoordinatorReplicas::new(&mut c);
    let pairs: Vec<(i64, i64)> = (0..40)
        .map(|_| {
            let pair = [(); 2].map(|_| create(&mut c, &app, "Counter", json!({"initial": 100})));
            for counter in pair {
                on_coordinator.add(&mut c, counter).unwrap();
            }
            (pair[0], pair[1])
        })
        .collect();
    let (anomalies, example, tally) = subtract_if_covered(Cc::Occ, Arc::new(pairs), 4, Duration::from_secs(180));
    assert_eq!(anomalies, 0, "pairs broken{example}; {tally}");
    assert!(tally.retries > 0, "not one conflict, so the run proves nothing: {tally}");
    assert!(calls_here(&mut c, &app, "add") > 0, "no taking ran on the replica");
}

#[test]
fn a_light_replica_never_answers_from_a_stale_copy() {
    let Some((app, counter, mut owner, mut replica, _c, _replica)) = replicated_counter("replica_fresh") else {
        return;
    };
    assert_eq!(call(&mut replica, counter, "get", json!({})), json!(0));
    call(&mut owner, counter, "add", json!({"n": 5}));
    // The copy the replica's backend holds is behind: the owner's versions say so.
    assert_eq!(call(&mut replica, counter, "get", json!({})), json!(5));
    assert_eq!(call(&mut replica, counter, "add", json!({"n": 2})), json!(7));
    assert_eq!(call(&mut owner, counter, "get", json!({})), json!(7));
    assert!(calls_here(&mut replica, &app, "get") >= 2);

    // A transaction that read 7 on the replica, then meets the owner's
    // next write, cannot commit: 40001, not an answer from two moments.
    replica.batch_execute("BEGIN").unwrap();
    assert_eq!(call(&mut replica, counter, "get", json!({})), json!(7));
    call(&mut owner, counter, "increment", json!({}));
    let second = invoke(&mut replica, counter, "increment", json!({}));
    let commit = second.and_then(|_| replica.batch_execute("COMMIT"));
    expect_sqlstate(commit, "40001");
    replica.batch_execute("ROLLBACK").ok();
    assert_eq!(call(&mut owner, counter, "get", json!({})), json!(8));

    // Its own writes, a transaction sees on the replica too.
    replica.batch_execute("BEGIN").unwrap();
    assert_eq!(call(&mut replica, counter, "add", json!({"n": 10})), json!(18));
    assert_eq!(call(&mut replica, counter, "get", json!({})), json!(18));
    replica.batch_execute("ROLLBACK").unwrap();
    assert_eq!(call(&mut replica, counter, "get", json!({})), json!(8));
}

/// What only the owner can do (here a map call, which makes nested calls)
/// hands the whole call to the owner: it runs there once.
#[test]
fn a_call_a_replica_cannot_run_runs_on_the_owner() {
    let Some((app, counter, mut owner, mut replica, mut c, _replica)) = replicated_counter("replica_hand_over") else {
        return;
    };
    let other = create(&mut c, &app, "Counter", json!({"initial": 1}));
    let outcomes = call(&mut replica, counter, "add_to_each", json!({"counters": [other], "n": 2}));
    assert_eq!(outcomes, json!([[other, {"Ok": 3}]]));
    assert_eq!(call(&mut replica, counter, "get", json!({})), json!(1));
    assert_eq!(calls_here(&mut replica, &app, "add_to_each"), 0);
    assert_eq!(calls_here(&mut owner, &app, "add_to_each"), 1);
}

/// A node that is a light replica of an object runs that object's calls
/// itself, and still hands the calls of every other object to Citus'
/// delegation (cluster/delegate.rs). A plan kept from before the replica
/// was added is refused once (0A000), then planned again to run here.
#[test]
fn a_replica_runs_its_objects_calls_and_hands_the_others_to_delegation() {
    let Some(_workers) = workers() else { return };
    let (mut c, app) = deployed("replica_delegation", "counter");
    let [replicated, other] = [(); 2].map(|_| create(&mut c, &app, "Counter", json!({})));
    let mut on_coordinator = CoordinatorReplicas::new(&mut c);
    assert!(on_coordinator.add(&mut c, replicated).unwrap());
    let (mut s, notices) = connect_keeping_notices();
    s.batch_execute("SET citus.log_remote_commands = on").unwrap();
    let delegated = |notices: &Notices| sent_by(notices).iter().any(|m| m.contains("_lambda_invoke_delegated("));
    let ran_here = |c: &mut Client| calls_here(c, &app, "get");
    let before = ran_here(&mut c);

    // Calls with the object as a parameter, planned for its value.
    call(&mut s, replicated, "get", json!({}));
    assert!(!delegated(&notices), "the replicated object's call was delegated");
    assert_eq!(ran_here(&mut c), before + 1, "the replica did not run its object's call");
    call(&mut s, other, "get", json!({}));
    assert!(delegated(&notices), "the other object's call was not delegated");
    assert_eq!(ran_here(&mut c), before + 1);

    // A kept plan (the object a constant), run in two transactions, then
    // after its object got a replica here.
    let kept = s.prepare(&format!("SELECT lambda_invoke({other}, 'get', '{{}}')")).unwrap();
    for _ in 0..2 {
        s.query_one(&kept, &[]).unwrap();
        assert!(delegated(&notices), "the kept plan was not delegated");
    }
    assert!(on_coordinator.add(&mut c, other).unwrap());

    expect_sqlstate(s.query_one(&kept, &[]), "0A000");
    s.query_one(&kept, &[]).unwrap();
    assert!(!delegated(&notices), "the kept plan was delegated after its object got a replica here");
    assert_eq!(ran_here(&mut c), before + 2, "the replica did not run the kept plan's call");
}

#[test]
fn adding_a_light_replica_checks_its_arguments() {
    let Some((_, counter, mut owner, _, mut c, _replica)) = replicated_counter("replica_checks") else { return };
    let owner_node = node(&mut owner);
    let replica_node = node(&mut c);
    expect_sqlstate(add_replica(&mut c, counter, &owner_node), "22023");
    expect_sqlstate(add_replica(&mut c, counter, "nowhere:1"), "22023");
    expect_sqlstate(add_replica(&mut c, -5, &replica_node), "42704");
    expect_sqlstate(c.query_one("SELECT lambdastore.add_light_replica(NULL, 'x')", &[]), "22004");
    assert!(!add_replica(&mut c, counter, &replica_node).unwrap(), "added twice");
    let dropped = |c: &mut Client| -> bool {
        c.query_one("SELECT lambdastore.drop_light_replica($1, $2)", &[&counter, &replica_node]).unwrap().get(0)
    };
    assert!(dropped(&mut c));
    assert!(!dropped(&mut c));
    let role = TestRole::new("replica_checks");
    expect_sqlstate(add_replica(&mut role.connect(), counter, &replica_node), "42501");
}
