//! Exactly-once jobs under faults: workers killed with SIGKILL and the
//! server restarted with `pg_ctl restart -m immediate` while thousands of
//! jobs run; and a clean stop while a job runs.
//!
//! These tests kill the server, so they are `#[ignore]`d in the main suite
//! and run by scripts/faults.sh on a cluster of their own, named in
//! `LAMBDASTORE_CLUSTER`.

mod common;

use common::*;
use postgres::{Client, NoTls};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

fn cluster(command: &str) -> String {
    let name = std::env::var("LAMBDASTORE_CLUSTER").expect("LAMBDASTORE_CLUSTER: run these with scripts/faults.sh");
    let script = workspace().join("scripts/cluster.sh");
    let out = Command::new(&script).args([command, &name]).output().expect("run scripts/cluster.sh");
    assert!(out.status.success(), "cluster.sh {command} {name}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Connects, retrying while the server is restarting or recovering.
fn reconnect() -> Client {
    let url = std::env::var("LAMBDASTORE_TEST_URL").unwrap();
    let mut config: postgres::Config = url.parse().unwrap();
    config.dbname(DATABASE);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(mut c) = config.connect(NoTls) {
            if c.simple_query("SELECT 1").is_ok() {
                return c;
            }
        }
        assert!(Instant::now() < deadline, "the server did not come back within two minutes");
        std::thread::sleep(Duration::from_millis(50)); // retry interval while it recovers
    }
}

fn runner_pids(c: &mut Client) -> Vec<i32> {
    c.query("SELECT pid FROM pg_stat_activity WHERE backend_type = 'lambdastore job runner'", &[])
        .map(|rows| rows.iter().map(|r| r.get(0)).collect())
        .unwrap_or_default()
}

/// A schedule's ticks that ended `done`, with their due times (µs), or
/// None while the server cannot answer.
fn done_ticks(c: &mut Client, object: i64) -> Option<Vec<i64>> {
    let rows = c
        .query(
            "SELECT (extract(epoch FROM run_after) * 1000000)::bigint FROM lambdastore.jobs
              WHERE object_id = $1 AND schedule IS NOT NULL AND state = 'done' ORDER BY run_after",
            &[&object],
        )
        .ok()?;
    Some(rows.iter().map(|row| row.get(0)).collect())
}

#[test]
#[ignore = "kills the server: run by scripts/faults.sh"]
fn a_schedule_runs_each_tick_once_across_worker_kills_and_a_restart() {
    const TICKS: usize = 20;
    let (mut c, app) = deployed("faults_schedule", "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    c.query_one("SELECT lambdastore.schedule('beat', '* * * * * *', $1, 'tally', '{\"tag\": 0}')", &[&id]).unwrap();
    // Three SIGKILLs of a worker, then an immediate restart, by progress.
    let mut faults = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    let ticks = loop {
        let Some(ticks) = done_ticks(&mut c, id) else {
            c = reconnect();
            continue;
        };
        if ticks.len() >= TICKS {
            break ticks;
        }
        assert!(Instant::now() < deadline, "{} ticks done after five minutes", ticks.len());
        if faults.len() < 4 && ticks.len() >= 4 * (faults.len() + 1) {
            if faults.len() < 3 {
                let Some(pid) = runner_pids(&mut c).first().copied() else { continue };
                assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
                faults.push(format!("SIGKILL worker {pid} at {} ticks", ticks.len()));
            } else {
                cluster("crash");
                faults.push(format!("restart -m immediate at {} ticks", ticks.len()));
            }
            c = reconnect();
            continue;
        }
        std::thread::sleep(Duration::from_millis(50)); // progress polling interval
    };
    eprintln!("faults injected: {faults:#?}");
    assert_eq!(faults.len(), 4, "the run ended before every fault was injected: {faults:?}");
    let removed: bool = c.query_one("SELECT lambdastore.unschedule($1, 'beat')", &[&id]).unwrap().get(0);
    assert!(removed);
    // Read after unschedule: no tick runs any more.
    let ticks_then = done_ticks(&mut c, id).unwrap();
    assert!(ticks_then.len() >= ticks.len());
    let mut distinct = ticks_then.clone();
    distinct.dedup();
    assert_eq!(distinct, ticks_then, "a tick ran twice");
    let count: String = c
        .query_one(
            "SELECT convert_from(value, 'UTF8') FROM lambdastore.entries WHERE object_id = $1 AND field = 'count'",
            &[&id],
        )
        .unwrap()
        .get(0);
    assert_eq!(count, ticks_then.len().to_string(), "the method ran a different number of times than ticks ended done");
    assert_eq!(jobs_in_state(&mut c, &app, "failed"), Some(0));
}

#[test]
#[ignore = "kills the server: run by scripts/faults.sh"]
fn every_job_is_applied_exactly_once_across_kills_and_restarts() {
    const JOBS: i64 = 5000;
    let (mut c, app) = deployed("faults", "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    // One transaction: the workers start when all jobs are visible.
    c.execute(
        "SELECT lambdastore.submit($1, 'tally', jsonb_build_object('tag', g)) FROM generate_series(1, $2::bigint) g",
        &[&id, &JOBS],
    )
    .unwrap();

    // A fault each time another ninth of the jobs is done, alternating a
    // SIGKILL of a worker (the postmaster then resets every process) and an
    // immediate restart of the whole server. By progress, not by the clock:
    // timed faults let faster workers finish before enough faults landed.
    // Where in a job each fault lands is chaos, not synchronisation.
    const FAULTS: usize = 8;
    let milestone = |fault: usize| (fault as i64 + 1) * JOBS / (FAULTS as i64 + 1);
    let mut faults = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = jobs_in_state(&mut c, &app, "done");
        let queued = jobs_in_state(&mut c, &app, "queued");
        let (Some(done), Some(queued)) = (done, queued) else {
            c = reconnect(); // a fault killed this session too
            continue;
        };
        if queued == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{queued} jobs still queued after ten minutes: stuck");
        if faults.len() < FAULTS && done >= milestone(faults.len()) {
            if faults.len() % 2 == 0 {
                let Some(pid) = runner_pids(&mut c).first().copied() else { continue };
                let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
                assert!(killed.success());
                faults.push(format!("SIGKILL worker {pid} at {done} done"));
            } else {
                cluster("crash");
                faults.push(format!("restart -m immediate at {done} done"));
            }
            c = reconnect();
            continue;
        }
        std::thread::sleep(Duration::from_millis(50)); // progress polling interval
    }
    eprintln!("faults injected: {faults:#?}");
    assert!(faults.len() >= 4, "the run ended before enough faults were injected: {faults:?}");

    // Every job done, none failed, and its effects applied once.
    assert_eq!(jobs_in_state(&mut c, &app, "done"), Some(JOBS));
    assert_eq!(jobs_in_state(&mut c, &app, "failed"), Some(0));
    assert_tallied_once(&mut c, id, JOBS);
}

#[test]
#[ignore = "stops the server: run by scripts/faults.sh"]
fn workers_stop_cleanly_on_shutdown_and_an_interrupted_job_runs_again() {
    let (mut c, app) = deployed("shutdown", "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    let spin = submit(&mut c, id, "spin", json!({}), None).unwrap();
    // Stop while a worker is inside the spinning lambda.
    until_running(&mut c, &app, "spin");
    let log = std::fs::read_to_string(cluster("log").trim()).unwrap_or_default();
    let stopping = Instant::now();
    cluster("stop");
    let took = stopping.elapsed();
    let log_after = std::fs::read_to_string(cluster("log").trim()).unwrap_or_default();
    let new_lines = &log_after[log.len().min(log_after.len())..];
    assert!(
        new_lines.contains("terminating background worker \"lambdastore job runner\" due to administrator command"),
        "the workers did not stop on SIGTERM:\n{new_lines}"
    );
    assert!(!new_lines.contains("terminated by signal"), "a process crashed on shutdown:\n{new_lines}");
    eprintln!("fast shutdown with a spinning job took {took:?}");

    cluster("start");
    let mut c = reconnect();
    let job = finished(&mut c, spin);
    // The interrupted run was rolled back with its claim: it is not counted.
    assert_eq!((job.state.as_str(), job.sqlstate.as_deref(), job.attempts), ("failed", Some("57014"), 1));
}

/// Waits until a job of `app`'s `function` runs.
fn until_running(c: &mut Client, app: &str, function: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while c
        .query_one("SELECT running FROM lambdastore.queue WHERE app = $1 AND function = $2", &[&app, &function])
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(0)
        == 0
    {
        assert!(Instant::now() < deadline, "the {function} job never started");
        std::thread::sleep(Duration::from_millis(5)); // polling interval
    }
}

/// A cancel of the job runners (`pg_cancel_backend`) stops the lambda a
/// runner is running, whose job fails with the cancel's 57014 and none of
/// its effects, and nothing else: no runner exits (an idle one, or one
/// recording an outcome, exited: "canceling statement due to user
/// request", the queue unserved until the postmaster started another),
/// and no job ends failed for a cancel that came after its lambda ran.
#[test]
#[ignore = "cancels every job runner: run by scripts/faults.sh"]
fn cancelling_the_job_runners_stops_the_running_lambda_and_no_runner() {
    let mut c = reconnect();
    let (_, app) = deployed("cancel_runners", "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    let workers: String = c.query_one("SHOW lambdastore.workers", &[]).unwrap().get(0);
    let sorted_pids = |c: &mut Client| {
        let mut pids = runner_pids(c);
        pids.sort();
        pids
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while sorted_pids(&mut c).len().to_string() != workers {
        assert!(Instant::now() < deadline, "the {workers} job runners did not start");
        std::thread::sleep(Duration::from_millis(5)); // polling interval
    }
    let runners = sorted_pids(&mut c);
    let cancel_all = "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
                       WHERE backend_type = 'lambdastore job runner'";
    c.query_one(cancel_all, &[]).unwrap();
    let put = submit(&mut c, id, "put", json!({"key": "k", "value": "after an idle cancel"}), None).unwrap();
    assert_eq!(finished(&mut c, put).state, "done");

    let spin = submit(&mut c, id, "spin", json!({}), None).unwrap();
    until_running(&mut c, &app, "spin");
    c.query_one(cancel_all, &[]).unwrap();
    let spun = finished(&mut c, spin);
    assert_eq!(
        (spun.state.as_str(), spun.sqlstate.as_deref(), spun.error.as_deref()),
        ("failed", Some("57014"), Some("lambda was canceled"))
    );
    assert_eq!(sorted_pids(&mut c), runners, "a job runner exited on a cancel");
}

/// A job whose outcome cannot be recorded (here a trigger refuses its
/// `done`) fails with none of its effects: the workflow and the record of
/// its outcome are undone together. Before, the workflow's effects were
/// committed with the job `failed`, and a client submitting it again
/// applied it twice.
#[test]
#[ignore = "puts a trigger on lambdastore.jobs: run by scripts/faults.sh"]
fn a_job_whose_outcome_cannot_be_recorded_fails_with_none_of_its_effects() {
    let mut c = reconnect();
    let (_, app) = deployed("record_fails", "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    c.batch_execute(&format!(
        "CREATE FUNCTION public.refuse_done() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'no done here'; END $$;
         CREATE TRIGGER refuse_done BEFORE UPDATE ON lambdastore.jobs FOR EACH ROW
           WHEN (NEW.object_id = {id} AND NEW.state = 'done') EXECUTE FUNCTION public.refuse_done();"
    ))
    .unwrap();
    let put = submit(&mut c, id, "put", json!({"key": "k", "value": "recorded?"}), None).unwrap();
    let failed = finished(&mut c, put);
    c.batch_execute("DROP TRIGGER refuse_done ON lambdastore.jobs; DROP FUNCTION public.refuse_done()").unwrap();
    assert_eq!((failed.state.as_str(), failed.sqlstate.as_deref()), ("failed", Some("38000")), "{failed:?}");
    assert!(failed.error.as_deref().unwrap_or_default().contains("no done here"), "{failed:?}");
    assert_eq!(call(&mut c, id, "get", json!({"key": "k"})), json!(null), "the failed job's write was kept");
}

/// A prepared transaction that survives a restart holds only the entry
/// sets it wrote (kept on disk at PREPARE, txn/prepared.rs): calls on
/// other objects go on, calls reading its sets fail with 40001 naming its
/// gid, `lambdastore.prepared()` lists it, and COMMIT PREPARED ends it.
/// Before, every call on every object failed until it ended. The files
/// are kept per slot and written over: one prepared after the first
/// restart must not take the place of the one still prepared from before.
#[test]
#[ignore = "restarts the server: run by scripts/faults.sh"]
fn after_a_restart_a_prepared_transaction_holds_only_what_it_wrote() {
    let (mut c, app) = deployed("prepared_restart", "micro");
    let written = create(&mut c, &app, "Bench", json!({ "entries": 0 }));
    let later = create(&mut c, &app, "Bench", json!({ "entries": 0 }));
    let other = create(&mut c, &app, "Bench", json!({ "entries": 0 }));
    call(&mut c, other, "put", json!({"key": "k", "value": "other"}));
    let prepare = |c: &mut Client, object: i64, gid: &str| {
        c.batch_execute("BEGIN").unwrap();
        call(c, object, "put", json!({"key": "k", "value": gid}));
        c.batch_execute(&format!("PREPARE TRANSACTION '{gid}'")).unwrap();
    };
    let (gid, later_gid) = (format!("{app}_gid"), format!("{app}_later"));
    let _end = RollBackPrepared(vec![gid.clone(), later_gid.clone()]);
    prepare(&mut c, written, &gid);

    let held = |c: &mut Client| -> Vec<(String, i32, bool)> {
        c.query("SELECT gid, entry_set_locks, sets_known FROM lambdastore.prepared()", &[])
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    };
    let holds_only_its_own = |c: &mut Client, moment: &str, object: i64, gid: &str| {
        let message = expect_sqlstate(invoke(c, object, "get", json!({"key": "k"})), "40001");
        assert!(message.contains(&format!("prepared transaction '{gid}'")), "{moment}: {message}");
        assert_eq!(call(c, other, "get", json!({"key": "k"})), json!("other"), "{moment}");
        let holders = held(c);
        assert!(holders.iter().any(|(g, locks, known)| g == gid && *locks >= 1 && *known), "{moment}: {holders:?}");
    };
    // The first calls after a restart all put the prepared transactions
    // back at once (and the job runners with them): only one of them may,
    // or the others register them as unknown and every call fails.
    let first_calls_at_once = || {
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    let mut c = reconnect();
                    start.wait();
                    assert_eq!(call(&mut c, other, "get", json!({"key": "k"})), json!("other"), "a first call");
                });
            }
        });
        reconnect()
    };
    holds_only_its_own(&mut c, "before the restart", written, &gid);
    cluster("crash");
    c = first_calls_at_once();
    holds_only_its_own(&mut c, "after the restart", written, &gid);
    prepare(&mut c, later, &later_gid);
    cluster("crash");
    c = first_calls_at_once();
    for (object, gid) in [(written, &gid), (later, &later_gid)] {
        holds_only_its_own(&mut c, "after a second restart", object, gid);
    }
    for (object, gid) in [(written, &gid), (later, &later_gid)] {
        c.batch_execute(&format!("COMMIT PREPARED '{gid}'")).unwrap();
        assert_eq!(call(&mut c, object, "get", json!({"key": "k"})), json!(gid));
    }
    assert!(held(&mut c).iter().all(|(g, _, _)| g != &gid && g != &later_gid));
}

/// Rolls back the test's prepared transactions still there when it ends,
/// so that a failed test leaves no locks behind for the next ones.
struct RollBackPrepared(Vec<String>);

impl Drop for RollBackPrepared {
    fn drop(&mut self) {
        let mut c = reconnect();
        for gid in &self.0 {
            let _ = c.batch_execute(&format!("ROLLBACK PREPARED '{gid}'")); // committed by the test if it passed
        }
    }
}

/// Connects to `database` of the faults cluster.
fn connect_to(database: &str) -> Client {
    let mut config: postgres::Config = std::env::var("LAMBDASTORE_TEST_URL").unwrap().parse().unwrap();
    config.dbname(database).connect(NoTls).unwrap_or_else(|e| panic!("connect to {database}: {e}"))
}

fn restart() {
    cluster("stop");
    cluster("start");
}

/// Puts a server setting back and restarts, also when the test fails.
struct Restored(&'static str);

impl Drop for Restored {
    fn drop(&mut self) {
        reconnect().batch_execute(&format!("ALTER SYSTEM RESET {}", self.0)).unwrap();
        restart();
    }
}

/// The server log's lines written from now on, each time it is called.
fn log_from_now() -> impl Fn() -> String {
    let path = cluster("log").trim().to_string();
    let seen = std::fs::read_to_string(&path).unwrap_or_default().len();
    move || std::fs::read_to_string(&path).unwrap_or_default().get(seen..).unwrap_or_default().to_string()
}

/// Polls `new_lines` until they hold `needle`, for at most a minute.
#[track_caller]
fn wait_for_log(new_lines: &impl Fn() -> String, needle: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !new_lines().contains(needle) {
        assert!(Instant::now() < deadline, "{what}:\n{}", new_lines());
        std::thread::sleep(Duration::from_millis(50)); // polling the log
    }
}

/// Background workers whose `lambdastore.database` does not exist yet:
/// the first one's connection fails (one FATAL line), one warning says
/// they wait, and once the database is created they run its jobs. Before,
/// every worker failed again at each restart (every 5 s) until then.
#[test]
#[ignore = "restarts the server: run by scripts/faults.sh"]
fn workers_wait_quietly_for_a_database_that_does_not_exist_yet() {
    const LATER: &str = "lambdastore_created_later";
    let mut c = reconnect();
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {LATER} WITH (FORCE)")).unwrap();
    c.batch_execute(&format!("ALTER SYSTEM SET lambdastore.database = '{LATER}'")).unwrap();
    let _reset = Restored("lambdastore.database");
    cluster("stop");
    // As on a fresh cluster: no shared relcache init file yet, so a process
    // connected to no database cannot open pg_database's indexes.
    let _ = std::fs::remove_file(format!("{}/data/global/pg_internal.init", cluster("dir").trim()));
    let new_lines = log_from_now();
    cluster("start");

    let waiting = "the background workers wait for it to be created";
    wait_for_log(&new_lines, waiting, "no worker said it waits for the database");
    // Three restart times (5 s each): the window in which every worker
    // used to fail again. This sleep is what is observed, not a wait for
    // an event.
    std::thread::sleep(Duration::from_secs(15));
    let log = new_lines();
    let failures: Vec<&str> = log.lines().filter(|l| l.contains("FATAL")).collect();
    assert_eq!(failures.len(), 1, "expected the first worker's FATAL line alone in 15 s:\n{log}");
    assert!(failures[0].contains(&format!("\"{LATER}\" does not exist")), "{log}");
    assert_eq!(log.matches(waiting).count(), 1, "{log}");

    reconnect().batch_execute(&format!("CREATE DATABASE {LATER}")).unwrap();
    let mut later = connect_to(LATER);
    later.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    deploy(&mut later, "counter", &example("counter")).unwrap();
    let id = create(&mut later, "counter", "Counter", json!({}));
    let job = submit(&mut later, id, "increment", json!({}), None).unwrap();
    assert_eq!(finished(&mut later, job).state, "done", "the workers did not start on the new database");
    drop(later);
    reconnect().batch_execute(&format!("DROP DATABASE {LATER} WITH (FORCE)")).unwrap();
}

/// Job runners of a database restored from another server (catalog/grants.rs,
/// `roles_from`) run none of its jobs, each of which runs as a role stored
/// by OID, another's or no one's there: every claim refuses, and one
/// warning per runner says why. Once a superuser adopts the roles, a submit
/// wakes them and both jobs run. Faked on this server as in backup.rs: the
/// other server's identifier beside this one's, and the owner's OID no
/// one's.
#[test]
#[ignore = "restarts the server: run by scripts/faults.sh"]
fn job_runners_wait_for_restored_roles_to_be_adopted() {
    const RESTORED: &str = "lambdastore_restored";
    let mut c = reconnect();
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {RESTORED} WITH (FORCE)")).unwrap();
    c.batch_execute(&format!("CREATE DATABASE {RESTORED}")).unwrap();
    let mut r = connect_to(RESTORED);
    r.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    deploy(&mut r, "counter", &example("counter")).unwrap();
    let id = create(&mut r, "counter", "Counter", json!({}));
    let first = submit(&mut r, id, "increment", json!({}), None).unwrap();
    r.batch_execute(
        "INSERT INTO lambdastore.roles_from VALUES (42);
         UPDATE lambdastore.applications SET owner = 4000000000;",
    )
    .unwrap();
    drop(r);

    // The runners serve the restored database from the restart on.
    c.batch_execute(&format!("ALTER SYSTEM SET lambdastore.database = '{RESTORED}'")).unwrap();
    let _reset = Restored("lambdastore.database");
    let new_lines = log_from_now();
    restart();
    let waiting = "jobs wait: the roles this database stores are another server's";
    wait_for_log(&new_lines, waiting, "no runner said its jobs wait");
    let mut r = connect_to(RESTORED);
    let state = |r: &mut Client, job: i64| -> String {
        r.query_one("SELECT state FROM lambdastore.jobs WHERE job_id = $1", &[&job]).unwrap().get(0)
    };
    assert_eq!(state(&mut r, first), "queued", "a runner ran a job as a role of another server");

    let adopted = r.query("SELECT restored_oid, local_oid FROM lambdastore.adopt_restored_roles()", &[]).unwrap();
    let owner = adopted.iter().map(|row| (row.get::<_, u32>(0), row.get::<_, u32>(1))).find(|&(old, _)| old != 10);
    assert_eq!(owner, Some((4_000_000_000, 10)), "the owner, by name");
    let second = submit(&mut r, id, "increment", json!({}), None).unwrap();
    assert_eq!(finished(&mut r, second).state, "done");
    assert_eq!(finished(&mut r, first).state, "done");
    assert_eq!(call(&mut r, id, "get", json!({})), json!(2));
    drop(r);
    drop(_reset);
    reconnect().batch_execute(&format!("DROP DATABASE {RESTORED} WITH (FORCE)")).unwrap();
}

/// A new session's three `scribble`s of `probe` (each must find none of the
/// last one's pages written), and the DEBUG1 lines saying where its module
/// came from.
fn scribble_in_a_new_session(probe: i64) -> Vec<String> {
    let (mut c, notices) = connect_keeping_notices();
    c.batch_execute("SET client_min_messages = debug1").unwrap();
    for call_number in 1..=3 {
        assert_eq!(call(&mut c, probe, "scribble", json!({})), json!(0), "call {call_number}");
    }
    let notices = notices.lock().unwrap();
    notices.iter().map(|n| n.message().to_string()).filter(|m| m.starts_with("lambdastore: module")).collect()
}

/// Writes two files the postmaster cannot map into this database's cache,
/// named as this engine's artifacts are: one not an artifact at all, one
/// the first half of a real one. Returns their names.
fn damage_the_cache(c: &mut Client) -> [String; 2] {
    let data: String = c.query_one("SHOW data_directory", &[]).unwrap().get(0);
    let database: u32 =
        c.query_one("SELECT oid FROM pg_database WHERE datname = current_database()", &[]).unwrap().get(0);
    let dir = std::path::Path::new(&data).join("lambdastore/cache").join(database.to_string());
    let artifact = std::fs::read_dir(&dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("a deployed module's artifact");
    let name = artifact.file_name().unwrap().to_string_lossy().into_owned();
    let suffix = &name[name.find('-').unwrap()..];
    let bytes = std::fs::read(&artifact).unwrap();
    let damaged = [format!("{}{suffix}", "0".repeat(32)), format!("{}{suffix}", "1".repeat(32))];
    std::fs::write(dir.join(&damaged[0]), b"not an artifact").unwrap();
    std::fs::write(dir.join(&damaged[1]), &bytes[..bytes.len() / 2]).unwrap();
    damaged
}

/// The postmaster maps the disk cache's compiled modules at start, and every
/// backend inherits them with its wasmtime engine (runtime/artifacts.rs):
/// after a restart, a session's first call says its module came from the
/// postmaster, and a Python guest's calls still each start from the
/// snapshot, so the memory reset reads the backend's own page map, not the
/// postmaster's. Files in the cache that wasmtime refuses are logged and
/// skipped: the server starts. With `lambdastore.preload_artifacts` off,
/// the backend maps the module itself.
#[test]
#[ignore = "restarts the server: run by scripts/faults.sh"]
fn after_a_restart_a_session_calls_the_module_the_postmaster_mapped() {
    let (mut c, app) = deployed("faults_preload", "py_sandbox");
    let probe = create(&mut c, &app, "Probe", json!(null));
    let damaged = damage_the_cache(&mut c);
    drop(c);

    let log_before = std::fs::read_to_string(cluster("log").trim()).unwrap_or_default();
    restart();
    let log = std::fs::read_to_string(cluster("log").trim()).unwrap_or_default();
    let new_lines = &log[log_before.len().min(log.len())..];
    for name in &damaged {
        let refused = new_lines.lines().any(|l| l.contains("lambdastore: not preloading") && l.contains(name.as_str()));
        assert!(refused, "no line says {name} was not preloaded:\n{new_lines}");
    }
    let lines = scribble_in_a_new_session(probe);
    assert!(lines.iter().any(|l| l.ends_with("mapped by the postmaster")), "{lines:?}");

    let _reset = Restored("lambdastore.preload_artifacts");
    connect().batch_execute("ALTER SYSTEM SET lambdastore.preload_artifacts = off").unwrap();
    restart();
    let lines = scribble_in_a_new_session(probe);
    assert!(!lines.iter().any(|l| l.ends_with("mapped by the postmaster")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains(&format!(" of {app} loaded in "))), "{lines:?}");
}
