//! Asynchronous jobs against the real background workers of the test
//! server (`lambdastore.database = 'lambdastore_test'`, two workers): submit,
//! wait, outcomes, idempotency, spawn, and the queue view. Crashes and
//! restarts are in faults.rs, on a server of their own.

mod common;

use common::*;
use postgres::Client;
use serde_json::{json, Value};

#[track_caller]
fn submitted(c: &mut Client, object: i64, method: &str, args: Value) -> i64 {
    submit(c, object, method, args.clone(), None)
        .unwrap_or_else(|e| panic!("submit({object}, {method}, {args}): {}", describe(&e)))
}

fn jobs_of(c: &mut Client, app: &str) -> i64 {
    c.query_one("SELECT count(*) FROM lambdastore.jobs WHERE app = $1", &[&app]).unwrap().get(0)
}

#[test]
fn a_job_runs_in_a_worker_and_keeps_its_result() {
    let (mut c, _, id) = micro_object("job_runs");
    let job = submitted(&mut c, id, "put", json!({"key": "k", "value": "from a job"}));
    let put = finished(&mut c, job);
    assert_eq!(put, Job { state: "done".into(), result: Some(Value::Null), error: None, sqlstate: None, attempts: 1 });
    assert_eq!(call(&mut c, id, "get", json!({"key": "k"})), json!("from a job"));

    let job = submitted(&mut c, id, "get", json!({"key": "k"}));
    assert_eq!(finished(&mut c, job).result, Some(json!("from a job")));
    // lambdastore.job reads the same row without waiting.
    let state: String = c.query_one("SELECT state FROM lambdastore.job($1)", &[&job]).unwrap().get(0);
    assert_eq!(state, "done");
}

#[test]
fn a_queued_job_shows_no_result_and_a_json_null_one_shows_null() {
    let (mut c, _, id) = micro_object("job_no_result_yet");
    let later: i64 = c
        .query_one("SELECT lambdastore.submit($1, 'get', '{\"key\": \"k\"}', delay => interval '1 hour')", &[&id])
        .unwrap()
        .get(0);
    let queued = c.query_one("SELECT state, result IS NULL FROM lambdastore.job($1)", &[&later]).unwrap();
    assert_eq!((queued.get::<_, String>(0), queued.get::<_, bool>(1)), ("queued".into(), true));

    // `put` answers JSON null: a result, unlike the queued job's none.
    let put = submitted(&mut c, id, "put", json!({"key": "k", "value": "v"}));
    finished(&mut c, put);
    let done = c.query_one("SELECT state, result::text FROM lambdastore.job($1)", &[&put]).unwrap();
    assert_eq!((done.get::<_, String>(0), done.get::<_, Option<String>>(1)), ("done".into(), Some("null".into())));
}

#[test]
fn two_job_runners_serve_the_test_database() {
    let mut c = connect();
    let workers = count(&mut c, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'lambdastore job runner'");
    assert_eq!(workers, 2, "lambdastore.workers defaults to 2");
}

#[test]
fn a_failing_job_ends_failed_with_its_error_and_no_effects() {
    let (mut c, _, id) = micro_object("job_fails");
    let before = entries(&mut c, id);
    let job = submitted(&mut c, id, "put_then_fail", json!({"key": "k", "value": "v"}));
    let failed = finished(&mut c, job);
    assert_eq!(failed.state, "failed");
    assert_eq!(failed.sqlstate.as_deref(), Some("P0001"));
    assert!(failed.error.as_deref().unwrap().contains("failing after writing `k`"), "{failed:?}");
    assert_eq!(failed.attempts, 1, "only conflicts are retried");
    assert_eq!(entries(&mut c, id), before, "the failed job's write was kept");

    let job = submitted(&mut c, id, "panic", json!({}));
    let trapped = finished(&mut c, job);
    assert_eq!((trapped.state.as_str(), trapped.sqlstate.as_deref()), ("failed", Some("38000")));
}

#[test]
fn an_async_spin_times_out_and_the_worker_goes_on() {
    let (mut c, _, id) = micro_object("job_spin");
    let spins: Vec<i64> = (0..2).map(|_| submitted(&mut c, id, "spin", json!({}))).collect();
    let after = submitted(&mut c, id, "put", json!({"key": "after", "value": "spin"}));
    for spin in spins {
        let spun = finished(&mut c, spin);
        assert_eq!((spun.state.as_str(), spun.sqlstate.as_deref()), ("failed", Some("57014")));
        assert_eq!(spun.error.as_deref(), Some("lambda exceeded lambdastore.timeout (1000 ms)"));
    }
    assert_eq!(finished(&mut c, after).state, "done");
    assert_eq!(call(&mut c, id, "get", json!({"key": "after"})), json!("spin"));
}

#[test]
fn the_memory_limit_applies_to_jobs() {
    let (mut c, _, id) = micro_object("job_memory");
    let job = submitted(&mut c, id, "alloc", json!({"bytes": 200u64 << 20}));
    let failed = finished(&mut c, job);
    assert_eq!((failed.state.as_str(), failed.sqlstate.as_deref()), ("failed", Some("53200")));
}

#[test]
fn idempotency_keys_dedupe_submissions() {
    let (mut c, app, id) = micro_object("job_idempotency");
    let first = submit(&mut c, id, "tally", json!({"tag": 1}), Some("order-1")).unwrap();
    let again = submit(&mut c, id, "tally", json!({"tag": 1}), Some("order-1")).unwrap();
    assert_eq!(first, again);
    assert_eq!(finished(&mut c, first).state, "done");
    // After it ran, the key still names the same job, which does not run again.
    assert_eq!(submit(&mut c, id, "tally", json!({"tag": 1}), Some("order-1")).unwrap(), first);
    let other = submit(&mut c, id, "tally", json!({"tag": 2}), Some("order-2")).unwrap();
    assert_ne!(other, first);
    assert_eq!(finished(&mut c, other).result, Some(json!(2)), "tally ran once per key");

    // The same key for a different call is a mistake, not a dedupe.
    let message = expect_sqlstate(submit(&mut c, id, "tally", json!({"tag": 3}), Some("order-1")), "23505");
    assert!(message.contains(&format!("job {first}")), "{message}");
    assert_eq!(jobs_of(&mut c, &app), 2);

    // Keys are per application.
    let (mut d, _, elsewhere) = micro_object("job_idempotency_other");
    let theirs = submit(&mut d, elsewhere, "tally", json!({"tag": 1}), Some("order-1")).unwrap();
    assert_ne!(theirs, first);
}

#[test]
fn concurrent_submissions_with_one_key_make_one_job() {
    let (c, app, id) = micro_object("job_idempotency_race");
    drop(c);
    let ids: Vec<i64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let mut c = connect();
                    submit(&mut c, id, "tally", json!({"tag": 1}), Some("same")).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ids.iter().all(|job| *job == ids[0]), "{ids:?}");
    let mut c = connect();
    assert_eq!(jobs_of(&mut c, &app), 1);
}

#[test]
fn submit_refuses_bad_input_and_queues_nothing() {
    let (mut c, app, id) = micro_object("job_bad_input");
    expect_sqlstate(submit(&mut c, -1, "tally", json!({}), None), "42704");
    expect_sqlstate(submit(&mut c, id, "no_such_method", json!({}), None), "42883");
    expect_sqlstate(submit(&mut c, id, "secret", json!({}), None), "42501");
    expect_sqlstate(submit(&mut c, id, "version", json!({}), None), "42883"); // static, not a method
    let big = "x".repeat(2 << 20);
    expect_sqlstate(submit(&mut c, id, "put", json!({"key": "k", "value": big}), None), "54000");
    // Idempotency keys are 1 to 255 bytes, as the gateway's header. A long
    // random key used to fail inside PostgreSQL's index ("index row
    // requires 9624 bytes").
    let random_key = incompressible(9600);
    for key in ["", &"k".repeat(256), &random_key] {
        let err = expect_sqlstate(submit(&mut c, id, "tally", json!({}), Some(key)), "22023");
        assert!(err.contains("idempotency key must be 1 to 255 bytes"), "{err}");
    }
    assert_eq!(jobs_of(&mut c, &app), 0);
    submit(&mut c, id, "tally", json!({}), Some(&"k".repeat(255))).unwrap();
    assert_eq!(jobs_of(&mut c, &app), 1);
    // Arguments that do not fit the method fail the job, like the call would.
    let job = submitted(&mut c, id, "tally", json!({"tag": "not a number"}));
    let failed = finished(&mut c, job);
    assert_eq!((failed.state.as_str(), failed.sqlstate.as_deref()), ("failed", Some("22023")));
}

#[test]
fn waiting_for_an_unknown_or_uncommitted_job_is_an_error() {
    let (mut c, _, id) = micro_object("job_wait_errors");
    expect_sqlstate(wait_job(&mut c, -5, 1), "42704");
    let mut tx = c.transaction().unwrap();
    let job = submitted_in(&mut tx, id);
    expect_sqlstate(wait_job(&mut tx, job, 5), "55000");
    tx.rollback().unwrap();
    // Rolled back: the job never existed.
    expect_sqlstate(wait_job(&mut c, job, 1), "42704");
}

fn submitted_in(tx: &mut postgres::Transaction<'_>, id: i64) -> i64 {
    submit(tx, id, "tally", json!({"tag": 1}), None).unwrap()
}

#[test]
fn wait_under_repeatable_read_is_refused() {
    let (mut c, _, id) = micro_object("job_wait_rr");
    let job = submitted(&mut c, id, "tally", json!({"tag": 1}));
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    expect_sqlstate(wait_job(&mut c, job, 1), "0A000");
    c.batch_execute("ROLLBACK").unwrap();
}

/// Jobs spawned by `object`'s lambdas (children of a submitted job or of a
/// synchronous call), by state.
fn spawned(c: &mut Client, object: i64) -> Vec<(i64, String)> {
    c.query(
        "SELECT job_id, state FROM lambdastore.jobs WHERE object_id = $1 AND method = 'tally' ORDER BY job_id",
        &[&object],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

#[test]
fn spawned_children_exist_only_for_committed_parents() {
    let (mut c, _, id) = micro_object("job_spawn");
    let child = |tag: i32, fail: bool| json!({"target": id, "method": "tally", "args": {"tag": tag}, "fail": fail});

    // A failed workflow, a failed callee, a rolled-back transaction: no child.
    expect_sqlstate(invoke(&mut c, id, "spawn_then", child(1, true)), "P0001");
    let recovered =
        call(&mut c, id, "spawn_in_failed_callee", json!({"target": id, "method": "tally", "args": {"tag": 2}}));
    assert_eq!(recovered, json!(true));
    let mut tx = c.transaction().unwrap();
    invoke(&mut tx, id, "spawn_then", child(3, false)).unwrap();
    tx.rollback().unwrap();
    assert!(spawned(&mut c, id).is_empty(), "an aborted parent left a child");

    // A committed parent: exactly one child, which runs.
    call(&mut c, id, "spawn_then", child(4, false));
    let children = spawned(&mut c, id);
    assert_eq!(children.len(), 1);
    assert_eq!(finished(&mut c, children[0].0).result, Some(json!(1)));
}

#[test]
fn a_job_can_spawn_jobs_which_name_their_parent() {
    let (mut c, _, id) = micro_object("job_spawn_chain");
    let parent = submitted(
        &mut c,
        id,
        "spawn_then",
        json!({"target": id, "method": "tally", "args": {"tag": 9}, "fail": false}),
    );
    assert_eq!(finished(&mut c, parent).state, "done");
    let row = c.query_one("SELECT job_id FROM lambdastore.jobs WHERE parent_job_id = $1", &[&parent]).unwrap();
    assert_eq!(finished(&mut c, row.get(0)).result, Some(json!(1)));
}

/// Across applications the role's privilege decides (security.rs shows
/// a spawn granted and refused); an unknown object is refused.
#[test]
fn spawn_to_an_unknown_object_is_refused() {
    let (mut c, _, id) = micro_object("job_spawn_refused");
    let to = |target: i64| json!({"target": target, "method": "tally", "args": {"tag": 1}, "fail": false});
    // The refusal comes back to spawn_then, which passes it on with `?`.
    // On a Citus coordinator (the suites run there too) a target stored on
    // another node is checked there when the workflow commits, and the
    // refusal fails the statement with its own code (docs/ARCHITECTURE.md).
    let distributed: bool = c.query_one("SELECT lambdastore._distributed()", &[]).unwrap().get(0);
    let err = invoke(&mut c, id, "spawn_then", to(-7)).unwrap_err();
    let expected = if distributed && err.code().is_some_and(|s| s.code() == "42704") { "42704" } else { "P0001" };
    let refused = expect_sqlstate(Err::<(), _>(err), expected);
    assert!(refused.contains("-7"), "{refused}");
    assert!(spawned(&mut c, id).is_empty());
}

#[test]
fn the_queue_view_counts_per_application_and_function() {
    let (mut c, app, id) = micro_object("job_queue_view");
    let done: Vec<i64> = (0..3).map(|tag| submitted(&mut c, id, "tally", json!({"tag": tag}))).collect();
    let failed = submitted(&mut c, id, "fail", json!({"message": "no"}));
    for job in done.iter().chain([&failed]) {
        finished(&mut c, *job);
    }
    let row = c
        .query_one(
            "SELECT depth, running, done, failed FROM lambdastore.queue WHERE app = $1 AND function = 'tally'",
            &[&app],
        )
        .unwrap();
    let counts: (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(counts, (0, 0, 3, 0));
    let failures: i64 = c
        .query_one("SELECT failed FROM lambdastore.queue WHERE app = $1 AND function = 'fail'", &[&app])
        .unwrap()
        .get(0);
    assert_eq!(failures, 1);

    // A spinning job shows as running (not waiting) while a worker has it.
    let spin = submitted(&mut c, id, "spin", json!({}));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let row = c
            .query_one("SELECT depth, running FROM lambdastore.queue WHERE app = $1 AND function = 'spin'", &[&app])
            .unwrap();
        if (row.get::<_, i64>(0), row.get::<_, i64>(1)) == (0, 1) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the spin job never showed as running");
        std::thread::sleep(std::time::Duration::from_millis(5)); // polling interval
    }
    assert_eq!(finished(&mut c, spin).state, "failed");
}

#[test]
fn a_component_without_the_sdk_spawns_through_the_raw_host_call() {
    let mut c = connect();
    let app = app("job_rogue_spawn");
    deploy(&mut c, &app, &rogue::component()).unwrap_or_else(|e| panic!("deploy rogue: {}", describe(&e)));
    let id = create(&mut c, &app, "Rogue", json!({}));
    call(&mut c, id, "spawn", json!({}));
    let child: i64 = c
        .query_one("SELECT job_id FROM lambdastore.jobs WHERE object_id = $1 AND method = 'put_entry'", &[&id])
        .unwrap()
        .get(0);
    assert_eq!(finished(&mut c, child).state, "done");
    assert_eq!(entries(&mut c, id).len(), 1, "the spawned put_entry wrote log[k]");
}
