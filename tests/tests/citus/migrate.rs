//! `lambdastore.migrate_object` while calls run: the object is isolated
//! into a shard of its own and moved, and every call made meanwhile,
//! from any node, either commits once or fails with a 40001 its client
//! retries. Each test migrates only objects of its own.

use super::{
    calls_here, connect_node, counter_to_move, migrate, on_two_nodes, sent_by, shard_mate, shard_of, spread, worker_at,
    workers,
};
use crate::cluster;
use crate::common::concurrent::{random_transfers, sqlstate, Cc};
use crate::common::*;
use postgres::Client;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Far above what the work needs: a statement still waiting then is a hang.
const STATEMENT_TIMEOUT: &str = "SET statement_timeout = '60s'";

/// Connections to the coordinator (`None`) and to each worker, in turn.
fn connect_to(i: usize) -> Client {
    let workers = &cluster::citus().expect("a cluster").workers;
    let mut c = match i % (workers.len() + 1) {
        0 => connect(),
        w => connect_node(&workers[w - 1]),
    };
    c.batch_execute(STATEMENT_TIMEOUT).unwrap();
    c
}

/// Committed calls so far, which the test waits on.
#[derive(Default)]
struct Progress {
    committed: Mutex<u64>,
    moved: Condvar,
}

impl Progress {
    fn add(&self) {
        *self.committed.lock().unwrap() += 1;
        self.moved.notify_all();
    }

    fn now(&self) -> u64 {
        *self.committed.lock().unwrap()
    }

    /// Waits until `n` calls have committed (at most a minute).
    fn wait_for(&self, n: u64) {
        let committed = self.committed.lock().unwrap();
        let (committed, timeout) =
            self.moved.wait_timeout_while(committed, Duration::from_secs(60), |c| *c < n).unwrap();
        assert!(!timeout.timed_out(), "{} calls committed in a minute, waiting for {n}", *committed);
    }
}

/// Sets the flag when dropped: clients stop when the test's main thread
/// fails, and its failure is reported instead of a hang.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `method` on `object`, again after every 40001 (counted in `retries`,
/// after a millisecond's pause, as a client that backs off); any other
/// error fails the test.
fn until_committed(c: &mut Client, object: i64, method: &str, retries: &mut u64) -> i64 {
    for _ in 0..2000 {
        match invoke(c, object, method, json!({})) {
            Ok(value) => return value.as_i64().unwrap(),
            Err(e) if sqlstate(&e) == Some("40001") => *retries += 1,
            Err(e) => panic!("{method} on {object}: {}", describe(&e)),
        }
        std::thread::sleep(Duration::from_millis(1)); // backing off
    }
    panic!("{method} on {object}: 2000 serialization failures in a row");
}

/// Eight clients increment a counter and one of its shard-mates, two
/// read the counter, spread over the coordinator and both workers, while
/// the counter is migrated to the other worker, back, and there again.
/// Every committed increment is in the counters; a reader never sees the
/// counter go back; the counter ends on the target, its shard-mate where it
/// was.
#[test]
fn a_counter_migrated_under_concurrent_increments_keeps_every_one() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_migrate_counter", "counter");
    let (counter, from, to) = counter_to_move(&mut c, &app, 0);
    let at = worker_at(&mut workers, &from);
    let mate = shard_mate(&mut c, &mut workers[at], &app, "Counter", counter);
    c.batch_execute(STATEMENT_TIMEOUT).unwrap();

    let targets = [&to, &from, &to];
    let committed =
        under_increments(&[counter, mate], targets.len(), |i| migrate(&mut c, counter, targets[i]).to_string());
    assert_eq!(call(&mut c, counter, "get", json!({})), json!(committed[0]), "the migrated counter");
    assert_eq!(call(&mut c, mate, "get", json!({})), json!(committed[1]), "its former shard-mate");
    assert_eq!(owner(&mut c, counter), to);
    assert_eq!(owner(&mut c, mate), from);
}

/// The same load while Citus moves the counter's shard itself
/// (`citus_move_shard_placement`, as its rebalancer does), there and back
/// again, without `migrate_object`: every committed increment is kept.
/// Citus blocks only the writes its own executor plans; the move now
/// takes the fence first (`layout::fence_shard_operation`). Without it,
/// increments written into the old shard after its copy were lost (671
/// of 30,201 in the sweep that found it).
#[test]
fn a_shard_moved_by_citus_itself_under_concurrent_increments_keeps_every_one() {
    let Some(_workers) = workers() else { return };
    let (mut c, app) = deployed("citus_direct_move", "counter");
    let (counter, from, to) = counter_to_move(&mut c, &app, 0);
    // Isolated where it is: the moves below move no other test's objects.
    migrate(&mut c, counter, &from);
    let shard = shard_of(&mut c, counter);
    c.batch_execute(STATEMENT_TIMEOUT).unwrap();

    let hops = [(&from, &to), (&to, &from)];
    let committed = under_increments(&[counter], hops.len(), |i| {
        let ((source_host, source_port), (target_host, target_port)) = (host_port(hops[i].0), host_port(hops[i].1));
        // Citus fails a move at once while another one (another test's
        // migration) holds its placement lock: tried again, as a user would.
        for tries in 1.. {
            let moved = c.execute(
                "SELECT citus_move_shard_placement($1, $2, $3, $4, $5, 'block_writes')",
                &[&shard, &source_host, &source_port, &target_host, &target_port],
            );
            match moved {
                Ok(_) => return format!("{} to {} ({tries} tries)", hops[i].0, hops[i].1),
                Err(e) if tries < 100 && describe(&e).contains("could not acquire the lock required to move") => {
                    std::thread::sleep(Duration::from_millis(20)); // backing off
                }
                Err(e) => panic!("moving shard {shard}: {}", describe(&e)),
            }
        }
        unreachable!()
    });
    assert_eq!(call(&mut c, counter, "get", json!({})), json!(committed[0]), "the counter whose shard moved");
    assert_eq!(owner(&mut c, counter), from);
}

fn host_port(node: &str) -> (String, i32) {
    let (host, port) = node.rsplit_once(':').expect("host:port");
    (host.to_string(), port.parse().expect("a port"))
}

/// Eight clients increment `counters` (client i the i-th, in turn) and two
/// read the first, spread over the coordinator and both workers, while
/// `make_move(0..moves)` runs, each after 40 more calls committed; the
/// clients stop 40 calls after the last. A reader never sees the counter
/// go back; a call fails only with a 40001, retried. Returns the
/// increments committed to each counter.
fn under_increments(counters: &[i64], moves: usize, mut make_move: impl FnMut(usize) -> String) -> Vec<i64> {
    const INCREMENTERS: usize = 8;
    const READERS: usize = 2;
    const BETWEEN_MOVES: u64 = 40;
    let (stop, progress) = (AtomicBool::new(false), Progress::default());
    let mut timeline = Vec::new();
    let (incremented, read) = std::thread::scope(|s| {
        let incrementers: Vec<_> = (0..INCREMENTERS)
            .map(|i| {
                let (stop, progress) = (&stop, &progress);
                s.spawn(move || {
                    let mut c = connect_to(i);
                    let (mut counts, mut retries) = (vec![0i64; counters.len()], 0);
                    while !stop.load(Ordering::Relaxed) {
                        let which = i % counters.len();
                        until_committed(&mut c, counters[which], "increment", &mut retries);
                        counts[which] += 1;
                        progress.add();
                    }
                    (counts, retries)
                })
            })
            .collect();
        let readers: Vec<_> = (0..READERS)
            .map(|i| {
                let stop = &stop;
                s.spawn(move || {
                    let mut c = connect_to(i + 1);
                    let (mut last, mut reads, mut retries) = (0, 0u64, 0);
                    while !stop.load(Ordering::Relaxed) {
                        let seen = until_committed(&mut c, counters[0], "get", &mut retries);
                        assert!(seen >= last, "a reader saw the counter go back from {last} to {seen}");
                        (last, reads) = (seen, reads + 1);
                    }
                    (reads, retries)
                })
            })
            .collect();

        let _stop = StopOnDrop(&stop);
        let started = Instant::now();
        for i in 0..moves {
            progress.wait_for(progress.now() + BETWEEN_MOVES);
            let begun = started.elapsed();
            let said = make_move(i);
            timeline.push(format!("{said} from {begun:.2?} to {:.2?}", started.elapsed()));
        }
        progress.wait_for(progress.now() + BETWEEN_MOVES);
        stop.store(true, Ordering::Relaxed);
        let incremented: Vec<(Vec<i64>, u64)> = incrementers.into_iter().map(|h| h.join().unwrap()).collect();
        let read: Vec<(u64, u64)> = readers.into_iter().map(|h| h.join().unwrap()).collect();
        (incremented, read)
    });

    let committed: Vec<i64> =
        (0..counters.len()).map(|which| incremented.iter().map(|(counts, _)| counts[which]).sum()).collect();
    let retried = incremented.iter().map(|(_, r)| r).sum::<u64>() + read.iter().map(|(_, r)| r).sum::<u64>();
    println!(
        "moves: {}; {committed:?} increments committed, {} reads, {retried} retried 40001s",
        timeline.join("; "),
        read.iter().map(|(n, _)| n).sum::<u64>(),
    );
    committed
}

/// Transfers by nested calls between accounts on both workers, while
/// accounts are migrated from one to the other: the bank's total stays,
/// no account goes negative, every committed transfer left its two audit
/// entries, and no call failed with anything but a retried 40001.
#[test]
fn accounts_migrated_during_cross_node_transfers_keep_the_total() {
    const PER_NODE: usize = 3;
    let Some(_workers) = workers() else { return };
    let (mut c, bank) = deployed("citus_migrate_bank", "bank");
    let by_node = spread(&mut c, &bank, "Account", json!({"owner": "x", "initial": 1000}), PER_NODE);
    let nodes: Vec<String> = by_node.keys().cloned().collect();
    let accounts: Vec<i64> = by_node.values().flat_map(|ids| ids[..PER_NODE].to_vec()).collect();
    // Accounts of the first worker go to the second, one after the other.
    let moving: Vec<i64> = by_node[&nodes[0]][..PER_NODE].to_vec();
    c.batch_execute(STATEMENT_TIMEOUT).unwrap();

    let (outcome, during) = std::thread::scope(|s| {
        let transfers =
            s.spawn(|| random_transfers(Cc::Occ, accounts.clone().into(), 1000, 8, 40, Duration::from_secs(300)));
        let mut during = 0;
        for &account in &moving {
            migrate(&mut c, account, &nodes[1]);
            during += usize::from(!transfers.is_finished());
        }
        (transfers.join().unwrap(), during)
    });
    let (anomalies, details, tally) = outcome;
    println!("bank with {during} migrations during its transfers: {details}; {tally}");
    assert_eq!(anomalies, 0, "{details}");
    assert!(during > 0, "the transfers ended before the first migration did: the run proves nothing");
}

/// A call Citus delegates holds the coordinator's fence from before Citus
/// plans it until it ends, so a migration waits for it there. (Without,
/// a migration could commit between Citus' planning and its execution,
/// and the call fail with Citus' XX000 "could not find valid entry for
/// shard": about once in 30 runs of the bank test above.) The call is
/// kept in flight on the worker by a lock on its object's entries there.
/// A kept plan of such a call takes the fence before it runs, and is
/// refused if a migration moved objects while it waited. (Other
/// tests' migrations may hold the fence meanwhile: the call then waits
/// for them first, and the assertions are on this test's own backends.)
#[test]
fn a_migration_waits_on_the_coordinator_for_a_call_citus_delegated_from_there() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_migrate_delegated", "counter");
    let (counter, from, to) = counter_to_move(&mut c, &app, 5);
    let at = worker_at(&mut workers, &from);
    let mut on_worker = connect_node(&cluster::citus().expect("a cluster").workers[at]);
    let mut worker = workers.remove(at);
    let shard: i64 = c
        .query_one("SELECT get_shard_id_for_distribution_column('lambdastore.entries', $1::bigint)", &[&counter])
        .unwrap()
        .get(0);
    let mut blocker = worker.transaction().unwrap();
    blocker
        .batch_execute(&format!(
            "SET LOCAL citus.enable_manual_changes_to_shards = on; LOCK TABLE lambdastore.entries_{shard} IN SHARE MODE"
        ))
        .unwrap();

    // Whether backend `pid` of the coordinator waits for the fence.
    let fence: u32 = c.query_one("SELECT 'lambdastore.migrations'::regclass::oid", &[]).unwrap().get(0);
    let waits_for_the_fence =
        |observer: &mut Client, pid: i32| waiting_for(observer, fence).iter().any(|(waiting, _)| *waiting == pid);
    let mut observer = connect();
    std::thread::scope(|s| {
        let delegated = s.spawn(|| {
            let mut c = connect_to(0);
            invoke(&mut c, counter, "increment", json!({})).map_err(|e| describe(&e))
        });
        wait_until_a_statement_waits(&mut on_worker, "_lambda_invoke_delegated(", "Lock");
        let mut migration = connect_to(0);
        let pid: i32 = migration.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        let migration = s.spawn(move || {
            let mut tx = migration.transaction().unwrap();
            tx.batch_execute("LOCK TABLE lambdastore.migrations IN EXCLUSIVE MODE").unwrap();
            tx.rollback().unwrap();
        });
        // Unprotected, it is granted on the coordinator and waits on the
        // worker, for the delegated call's fence there.
        poll_until("the migration's lock never waited on the coordinator", || waits_for_the_fence(&mut observer, pid));
        blocker.commit().unwrap();
        assert_eq!(delegated.join().unwrap(), Ok(json!(6)));
        migration.join().unwrap();
    });

    // A kept plan (a prepared call with its values written in) takes the
    // fence before it runs: it waits for a migration holding it (here on
    // the coordinator alone), then runs.
    let kept = c.prepare(&format!("SELECT lambda_invoke({counter}, 'increment', '{{}}')")).unwrap();
    assert_eq!(c.query_one(&kept, &[]).unwrap().get::<_, Value>(0), json!(7));
    let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let mut migration = connect();
    let mut tx = migration.transaction().unwrap();
    tx.batch_execute(
        "SET LOCAL citus.enable_ddl_propagation = off; LOCK TABLE lambdastore.migrations IN EXCLUSIVE MODE",
    )
    .unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| c.query_one(&kept, &[]).map(|row| row.get::<_, Value>(0)).map_err(|e| describe(&e)));
        let mut waited = false;
        poll_until("the kept plan neither waited nor ran", || {
            waited = waits_for_the_fence(&mut observer, pid);
            waited || run.is_finished()
        });
        tx.rollback().unwrap();
        assert!(waited, "the kept plan ran while a migration held the fence: {:?}", run.join());
        assert_eq!(run.join().unwrap(), Ok(json!(8)));
    });

    // One that waited for a migration which moved objects is stale:
    // refused with 40001, and planned again at its next run.
    let mut migration = connect_to(0);
    let mut tx = migration.transaction().unwrap();
    tx.batch_execute("LOCK TABLE lambdastore.migrations IN EXCLUSIVE MODE").unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| c.query_one(&kept, &[]));
        poll_until("the kept plan never waited for the migration", || waits_for_the_fence(&mut observer, pid));
        tx.query_one("SELECT lambdastore.migrate_object($1, $2)::text", &[&counter, &to]).unwrap();
        tx.commit().unwrap();
        let refused = expect_sqlstate(run.join().unwrap(), "40001");
        assert!(refused.contains("changed while it waited"), "{refused}");
    });
    assert_eq!(c.query_one(&kept, &[]).unwrap().get::<_, Value>(0), json!(9));
    assert_eq!(owner(&mut c, counter), to);
}

/// A transaction that has read an object on its node holds the object's
/// migration until it ends: its reads then still describe the object when
/// it commits. (Were the object moved meanwhile and written on its new
/// node, the old node's OCC counters, which never see that write, would let
/// the read validate: the second read below would see the new value in the
/// same serializable transaction, and it would commit.)
#[test]
fn a_migration_waits_for_the_transactions_that_read_the_object() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_migrate_read", "counter");
    let (counter, from, to) = counter_to_move(&mut c, &app, 5);
    let at = worker_at(&mut workers, &from);
    let mut observer = connect();

    let mut reader = workers.remove(at);
    let mut tx = reader.transaction().unwrap();
    let first = call(&mut tx, counter, "get", json!({}));
    let (second, written) = std::thread::scope(|s| {
        let mover = s.spawn(|| {
            let mut c = connect();
            c.batch_execute(STATEMENT_TIMEOUT).unwrap();
            migrate(&mut c, counter, &to);
            // (Another test's migration may hold a node's fence when the
            // call reaches it: 40001, retried.)
            until_committed(&mut c, counter, "increment", &mut 0)
        });
        // Until the migration waits for a lock (or, unprotected, is done).
        let deadline = Instant::now() + Duration::from_secs(30);
        while !mover.is_finished() && !migration_waits(&mut observer) {
            assert!(Instant::now() < deadline, "the migration neither waited nor finished in 30 s");
            std::thread::sleep(Duration::from_millis(20)); // polling pg_locks
        }
        let second = call(&mut tx, counter, "get", json!({}));
        tx.commit().unwrap();
        (second, mover.join().unwrap())
    });
    assert_eq!(second, first, "two reads of one serializable transaction differ");
    assert_eq!(written, 6);
    assert_eq!(owner(&mut c, counter), to);
}

/// Whether a migration waits on some worker for the fence (Citus sends
/// it there as a `LOCK` of lambdastore.migrations), which the reader's
/// transaction holds.
fn migration_waits(observer: &mut Client) -> bool {
    let waiting: i64 = observer
        .query_one(
            "SELECT count(*) FROM run_command_on_workers($$
                 SELECT count(*) FROM pg_stat_activity
                  WHERE wait_event_type = 'Lock' AND query LIKE '%LOCK lambdastore.migrations%'$$) r
              WHERE r.result::int > 0",
            &[],
        )
        .unwrap()
        .get(0);
    waiting > 0
}

/// Moving an object back waits for a transaction that still holds the
/// shard the last move left on the node (Citus drops it first, and on its
/// own gives up after one second with XX000 "could not be cleaned up").
#[test]
fn moving_an_object_back_waits_for_a_transaction_holding_what_the_last_move_left() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_migrate_leftover", "counter");
    let (counter, from, to) = counter_to_move(&mut c, &app, 7);
    let at = worker_at(&mut workers, &from);
    let (mut holder, mut observer) = (workers.remove(at), connect_node(&cluster::citus().unwrap().workers[at]));
    // Another test's move may drop the leftover before it is held: then
    // the object goes round again.
    let mut leftover = None;
    for _ in 0..3 {
        migrate(&mut c, counter, &to);
        let shard = shard_of(&mut c, counter).to_string();
        let name: String = c.query_one("SELECT 'lambdastore.objects_' || $1", &[&shard]).unwrap().get(0);
        holder.batch_execute("BEGIN").unwrap();
        if holder.batch_execute(&format!("SELECT count(*) FROM {name}")).is_ok() {
            leftover = Some(holder.query_one("SELECT $1::text::regclass::oid", &[&name]).unwrap().get::<_, u32>(0));
            break;
        }
        holder.batch_execute("ROLLBACK").unwrap();
        migrate(&mut c, counter, &from);
    }
    let leftover = leftover.expect("three moves' leftovers were dropped before they could be held");

    let moved_back = std::thread::scope(|s| {
        let mover = s.spawn(|| {
            let mut c = connect();
            c.batch_execute(STATEMENT_TIMEOUT).unwrap();
            c.query_one("SELECT lambdastore.migrate_object($1, $2)", &[&counter, &from]).map(|_| ())
        });
        // Until a second drop waits (the first gave up), or the move ended.
        // Waits, not backends: Citus may send every try through one cached
        // connection, whose backend then waits again under the same pid
        // (counting pids, the holder never let go, and the move gave up
        // after its ten tries: seen in CI).
        let mut waits = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !mover.is_finished() && waits.len() < 2 {
            assert!(Instant::now() < deadline, "the move neither waited twice nor ended in 30 s");
            waits.extend(waiting_for(&mut observer, leftover));
            std::thread::sleep(Duration::from_millis(20)); // polling pg_locks
        }
        holder.batch_execute("COMMIT").unwrap();
        mover.join().unwrap()
    });
    moved_back.unwrap_or_else(|e| panic!("moving {counter} back to {from}: {}", describe(&e)));
    assert_eq!(owner(&mut c, counter), from);
    assert_eq!(call(&mut c, counter, "get", json!({})), json!(7));
}

/// The waits for a lock on relation `oid` on the observer's node: each
/// backend waiting, with when its wait began.
fn waiting_for(observer: &mut Client, oid: u32) -> Vec<(i32, String)> {
    let waiting =
        "SELECT pid, waitstart::text FROM pg_locks WHERE relation = $1 AND NOT granted AND waitstart IS NOT NULL";
    observer.query(waiting, &[&oid]).unwrap().iter().map(|row| (row.get(0), row.get(1))).collect()
}

/// Bad arguments are refused with a stable SQLSTATE, and nothing moves.
/// A timer and a schedule belong to their object: they are jobs in its
/// shard, so a migration takes them along, and they fire once, on the
/// object's new node.
#[test]
fn a_timer_and_a_schedule_survive_their_objects_migration_and_fire_once_on_its_new_node() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_migrate_time", "micro");
    let by_node = spread(&mut c, &app, "Bench", json!({}), 1);
    let nodes: Vec<&String> = by_node.keys().collect();
    let (bench, from, to) = (by_node[nodes[0]][0], nodes[0].clone(), nodes[1].clone());
    let timer = json!({"name": "t", "delay_ms": 8000, "method": "tally_at", "args": {"tag": 1}, "fail": false});
    call(&mut c, bench, "set_timer", timer);
    let timer_job: i64 =
        c.query_one("SELECT job_id FROM lambdastore.timers WHERE object_id = $1", &[&bench]).unwrap().get(0);
    c.query_one("SELECT lambdastore.schedule('beat', '* * * * * *', $1, 'tally', '{\"tag\": 0}')", &[&bench]).unwrap();
    migrate(&mut c, bench, &to);
    let done_ticks = |c: &mut Client| {
        count(c, &format!("SELECT count(*) FROM lambdastore.jobs WHERE object_id = {bench} AND schedule IS NOT NULL AND state = 'done'"))
    };
    let moved_at = done_ticks(&mut c);
    assert_eq!(finished(&mut c, timer_job).state, "done");
    let deadline = Instant::now() + Duration::from_secs(60);
    while done_ticks(&mut c) < moved_at + 2 {
        assert!(Instant::now() < deadline, "no two ticks on the new node within a minute");
        std::thread::sleep(Duration::from_millis(50)); // polling interval
    }
    assert!(c.query_one("SELECT lambdastore.unschedule($1, 'beat')", &[&bench]).unwrap().get::<_, bool>(0));
    let (old, new) = (worker_at(&mut workers, &from), worker_at(&mut workers, &to));
    assert_eq!(calls_here(&mut workers[old], &app, "tally_at"), 0, "the timer fired on the old node");
    assert_eq!(calls_here(&mut workers[new], &app, "tally_at"), 1, "the timer did not fire once on the new node");
    assert!(calls_here(&mut workers[new], &app, "tally") >= 2, "no tick ran on the new node");
    let ticks: Vec<(u64, u32, i64)> = serde_json::from_value(call(&mut c, bench, "tallies", json!({}))).unwrap();
    let runs = |tag| ticks.iter().find(|t| t.0 == tag).map_or(0, |t| t.1);
    assert_eq!(runs(1), 1, "the timer fired {} times", runs(1));
    assert_eq!(i64::from(runs(0)), done_ticks(&mut c), "ticks done and runs differ");
}

/// On the node holding the object, a call is planned as the
/// `lambda_invoke` it is, not rewritten for Citus' delegation
/// (cluster/delegate.rs): Citus would only find that the object is here
/// and run the rewritten function here. So a plan kept there carries no
/// settings' text: it is not refused (0A000) after the session changes a
/// setting, as a rewritten one is. And it still reaches the object once
/// the object has moved.
#[test]
fn a_call_on_its_objects_node_is_planned_as_it_is() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_call_here", "micro");
    let (x, y) = on_two_nodes(&mut c, &app, "Bench", json!({"entries": 0}));
    let (here, there) = (owner(&mut c, x), owner(&mut c, y));
    let w = worker_at(&mut workers, &here);
    let s = &mut workers[w];
    call(s, x, "put", json!({"key": "k", "value": "here"}));
    // A bare call (a cast around it is never rewritten), kept.
    let get = s.prepare(&format!("SELECT lambda_invoke({x}, 'get', '{{\"key\": \"k\"}}')")).unwrap();
    let got = |s: &mut Client| s.query_one(&get, &[]).map(|row| row.get::<_, serde_json::Value>(0));
    assert_eq!(got(s).unwrap(), json!("here"));
    s.batch_execute("SET lambdastore.memory_limit = '16MB'").unwrap();
    assert_eq!(got(s).unwrap_or_else(|e| panic!("the kept plan after SET: {}", describe(&e))), json!("here"));
    migrate(&mut c, x, &there);
    assert_eq!(got(s).unwrap(), json!("here"), "the kept plan, the object moved");
}

/// A nested call that writes on another node goes there in a statement
/// that marks the node written (Citus then commits it in two phases),
/// routed by a key of the callee's shard rather than by the callee, so
/// that Citus plans it once for all the shard's objects (cluster/route.rs,
/// `Routed::marked`). An object isolated into a shard of its own, as a
/// migration leaves it, has no such key: its calls are routed by itself,
/// and those of the objects beside it by keys of the shards the split
/// left.
#[test]
fn a_nested_call_is_routed_by_its_callees_shard_and_by_the_callee_once_isolated() {
    let Some(mut workers) = workers() else { return };
    let (mut c, bank) = deployed("citus_routed_by_shard", "bank");
    let account = json!({"owner": "x", "initial": 100});
    let (a, b) = on_two_nodes(&mut c, &bank, "Account", account.clone());
    let there = owner(&mut c, b);
    let shard = shard_of(&mut c, b);
    let mate = (0..2000)
        .find_map(|_| {
            let id = create(&mut c, &bank, "Account", account.clone());
            (shard_of(&mut c, id) == shard).then_some(id)
        })
        .expect("an account of b's shard in 2000");
    // A session on a's node: it drives the transfer and sends the deposit.
    let url = cluster::citus().expect("a cluster").workers[worker_at(&mut workers, &owner(&mut c, a))].clone();
    let notices = Notices::default();
    let keep = notices.clone();
    let mut config: postgres::Config = url.parse().expect("a libpq URL");
    config.dbname(DATABASE).notice_callback(move |notice| keep.lock().unwrap().push(notice));
    let mut s = config.connect(postgres::NoTls).expect("connect to a's node");
    s.batch_execute("SET citus.log_remote_commands = on").unwrap();
    // The key the deposit was routed by, after a transfer of 1 to `to`,
    // and whether that node's part was prepared (two-phase commit).
    let mut transfer = |to: i64| {
        call(&mut s, a, "transfer", json!({"to": to, "amount": 1}));
        let sent = sent_by(&notices);
        let deposit = sent.iter().find(|m| m.contains("_call_here(")).unwrap_or_else(|| panic!("no deposit: {sent:?}"));
        // The last condition on object_id: `... = 22)` or `... = '562949953421313'::bigint)`.
        let key = deposit.rsplit("OPERATOR(pg_catalog.=) ").next().unwrap().split(')').next().unwrap();
        let key: i64 =
            key.replace("::bigint", "").trim_matches('\'').parse().unwrap_or_else(|e| panic!("{e}: {deposit}"));
        (key, sent.iter().any(|m| m.starts_with("issuing PREPARE TRANSACTION")))
    };
    for to in [b, mate] {
        let (key, prepared) = transfer(to);
        assert!(key != to && (0..4096).contains(&key), "{to} routed by {key}, not by a key of its shard");
        assert!(prepared, "the deposit to {to}, not prepared");
    }
    migrate(&mut c, b, &there);
    assert_eq!(transfer(b), (b, true), "b isolated: routed by itself, prepared");
    let (key, prepared) = transfer(mate);
    assert!(key != mate && (0..4096).contains(&key) && prepared, "b's shard mate after the split: {key}, {prepared}");
    assert_eq!(call(&mut c, b, "balance", json!({})), json!(102));
    assert_eq!(call(&mut c, mate, "balance", json!({})), json!(102));
    assert_eq!(call(&mut c, a, "balance", json!({})), json!(96));
}

#[test]
fn migrate_object_refuses_bad_input() {
    let Some(mut workers) = workers() else { return };
    let (mut c, app) = deployed("citus_migrate_refused", "counter");
    let (counter, from, to) = counter_to_move(&mut c, &app, 0);
    let migrate = |c: &mut Client, object: i64, node: &str, mode: &str| {
        c.query_one("SELECT lambdastore.migrate_object($1, $2, $3)", &[&object, &node, &mode])
    };
    expect_sqlstate(migrate(&mut c, counter, "127.0.0.1:1", "block_writes"), "22023");
    expect_sqlstate(migrate(&mut c, -1, &to, "block_writes"), "42704");
    expect_sqlstate(migrate(&mut c, counter, &to, "no_such_mode"), "22P02");
    expect_sqlstate(migrate(&mut workers[0], counter, &to, "block_writes"), "55000");
    assert_eq!(owner(&mut c, counter), from, "a refused migration moved nothing");
}
