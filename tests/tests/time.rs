//! Time and the queue, against the test server's background workers:
//! delayed jobs (`submit`'s `run_at` and `delay`, a lambda's
//! `spawn_after`), `cancel`, timers set by lambdas, cron schedules, and
//! the retention of finished jobs. Times are checked as lower bounds (a job
//! never runs before it is due), never as upper bounds: the machine is
//! shared. Crashes during schedules are in faults.rs.

mod common;

use common::*;
use postgres::{Client, GenericClient};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Polls `done` (every 20 ms) until it holds, for at most a minute.
#[track_caller]
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within a minute");
        std::thread::sleep(Duration::from_millis(20)); // polling interval
    }
}

/// `tallies()` of a Bench: (tag, runs, µs since the epoch of its last run).
fn tallies(c: &mut Client, object: i64) -> Vec<(u64, u32, i64)> {
    // Read while jobs write the object: a tick that commits during the
    // read fails it with 40001, as it would any client's; read again.
    for _ in 0..20 {
        match invoke(c, object, "tallies", json!({})) {
            Ok(tallies) => return serde_json::from_value(tallies).unwrap(),
            Err(e) if common::concurrent::sqlstate(&e) == Some("40001") => continue,
            Err(e) => panic!("tallies of {object}: {}", describe(&e)),
        }
    }
    panic!("tallies of {object}: 20 serialization failures in a row")
}

/// The job's due time, in µs since the Unix epoch.
fn due_micros(c: &mut impl GenericClient, job: i64) -> i64 {
    c.query_one(
        "SELECT (extract(epoch FROM run_after) * 1000000)::bigint FROM lambdastore.app_jobs WHERE job_id = $1",
        &[&job],
    )
    .unwrap()
    .get(0)
}

fn state(c: &mut impl GenericClient, job: i64) -> String {
    c.query_one("SELECT state FROM lambdastore.job($1)", &[&job]).unwrap().get(0)
}

#[test]
fn a_delayed_job_runs_once_due_and_not_before() {
    let (mut c, app, id) = micro_object("time_delayed");
    let submit_in = |c: &mut Client, tag: i64, when: &str| -> i64 {
        c.query_one(
            &format!("SELECT lambdastore.submit($1, 'tally_at', jsonb_build_object('tag', $2::bigint), {when})"),
            &[&id, &tag],
        )
        .unwrap()
        .get(0)
    };
    let delayed = submit_in(&mut c, 1, "delay => interval '4 seconds'");
    let at = submit_in(&mut c, 2, "run_at => now() + interval '3 seconds'");
    let shown: i64 = c
        .query_one("SELECT not_due FROM lambdastore.queue WHERE app = $1 AND function = 'tally_at'", &[&app])
        .unwrap()
        .get(0);
    assert_eq!(shown, 2, "the queue view's not_due");
    // A job due at once runs meanwhile; those not due yet still wait (on a
    // slow machine the one due in 3 s may be due by then).
    let now = submit_in(&mut c, 3, "NULL");
    assert_eq!(finished(&mut c, now).state, "done");
    let row = c
        .query_one(
            "SELECT count(*) FILTER (WHERE state = 'queued'), count(*)
               FROM lambdastore.app_jobs WHERE job_id IN ($1, $2) AND run_after > now()",
            &[&delayed, &at],
        )
        .unwrap();
    let (waiting, not_due): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(waiting, not_due, "a delayed job ran before it was due");
    for job in [delayed, at] {
        assert_eq!(finished(&mut c, job).state, "done");
    }
    let ran = tallies(&mut c, id);
    assert_eq!(ran.iter().map(|(tag, runs, _)| (*tag, *runs)).collect::<Vec<_>>(), [(1, 1), (2, 1), (3, 1)]);
    assert!(ran[0].2 >= due_micros(&mut c, delayed), "the delayed job ran before it was due");
    assert!(ran[1].2 >= due_micros(&mut c, at), "the job with run_at ran before it");

    let both = c.query_one("SELECT lambdastore.submit($1, 'tally', '{}', NULL, now(), interval '1 s')", &[&id]);
    expect_sqlstate(both, "22023");
}

/// A time no job can be due at, or one PostgreSQL's arithmetic cannot
/// reach, is refused where it is given (22023), and nothing is queued.
/// An infinite `run_at` was once queued, and then every job worker failed
/// on it at each claim and restarted, so other applications' jobs waited.
#[test]
fn times_no_job_can_be_due_at_are_refused_and_the_workers_run_on() {
    let (mut c, app, id) = micro_object("time_bounds");
    for (when, says) in [
        ("run_at => 'infinity'", "finite"),
        ("run_at => '-infinity'", "finite"),
        ("delay => interval '1000000 years'", "at most 1000 years"),
        ("delay => interval '-1000000 years'", "at most 1000 years"),
        // Months are twelfths of a year here, not PostgreSQL's 30 days.
        ("delay => interval '1000 years 1 day'", "at most 1000 years"),
        // A time as far: 294276 AD was taken, as close to PostgreSQL's
        // last timestamp as its arithmetic goes.
        ("run_at => '200000-01-01'", "at most 1000 years from now"),
        ("run_at => now() - interval '1001 years'", "at most 1000 years from now"),
    ] {
        let sql = format!("SELECT lambdastore.submit($1, 'tally', '{{}}', {when})");
        let message = expect_sqlstate(c.query_one(&sql, &[&id]), "22023");
        assert!(message.contains(says), "{when}: {message}");
    }
    let per = c.execute("SELECT lambdastore.set_queue_limits($1, rate => 1, per => interval '1000000 years')", &[&app]);
    let message = expect_sqlstate(per, "22023");
    assert!(message.contains("per is at most 1000 years"), "{message}");
    // A lambda's spawn of a function its target lacks: the server's words,
    // once (the SDK's error shows them without "unknown function" before).
    let args = json!({"target": id, "method": "nosuch", "args": {}, "delay_ms": 0});
    let message = expect_sqlstate(invoke(&mut c, id, "spawn_after", args), "P0001");
    assert_eq!(message, r#"function "nosuch" of type "Bench" does not exist"#);
    assert_eq!(count(&mut c, &format!("SELECT count(*) FROM lambdastore.app_jobs WHERE object_id = {id}")), 0);
    // A year far ahead is still a time: queued, never due.
    let far: i64 = c
        .query_one("SELECT lambdastore.submit($1, 'tally', '{}', run_at => now() + interval '999 years')", &[&id])
        .unwrap()
        .get(0);
    let now = submit(&mut c, id, "tally", json!({"tag": 1}), None).unwrap();
    assert_eq!(finished(&mut c, now).state, "done");
    assert_eq!(state(&mut c, far), "queued");
    let cancelled: bool = c.query_one("SELECT lambdastore.cancel($1)", &[&far]).unwrap().get(0);
    assert!(cancelled);
}

#[test]
fn a_lambda_spawns_a_job_for_later() {
    let (mut c, app, spawner) = micro_object("time_spawn_after");
    // On a Citus cluster, on another node than the spawner's.
    let local = c.query_one("SELECT lambdastore.node() = 'local'", &[]).unwrap().get::<_, bool>(0);
    let home = if local { String::new() } else { owner(&mut c, spawner) };
    let mut id = create(&mut c, &app, "Bench", json!({"entries": 0}));
    while !local && owner(&mut c, id) == home {
        id = create(&mut c, &app, "Bench", json!({"entries": 0}));
    }
    let args = json!({"target": id, "method": "tally_at", "args": {"tag": 7}, "delay_ms": 1000});
    call(&mut c, spawner, "spawn_after", args);
    let job: i64 = c
        .query_one("SELECT job_id FROM lambdastore.app_jobs WHERE object_id = $1 AND method = 'tally_at'", &[&id])
        .unwrap()
        .get(0);
    assert_eq!(finished(&mut c, job).state, "done");
    let (_, runs, at) = tallies(&mut c, id)[0];
    assert_eq!(runs, 1);
    assert!(at >= due_micros(&mut c, job), "the spawned job ran before it was due");
    // And as the database saw it: committed after it was due.
    let kept: bool = c
        .query_one("SELECT finished_at >= run_after FROM lambdastore.app_jobs WHERE job_id = $1", &[&job])
        .unwrap()
        .get(0);
    assert!(kept, "the spawned job finished before it was due");
    let delayed: bool = c
        .query_one(
            "SELECT run_after >= submitted_at + interval '900 milliseconds' FROM lambdastore.app_jobs WHERE job_id = $1",
            &[&job],
        )
        .unwrap()
        .get(0);
    assert!(delayed, "spawn_after's delay was not kept");
}

#[test]
fn cancel_stops_a_queued_job_and_leaves_others_as_they_ended() {
    let (mut c, app, id) = micro_object("time_cancel");
    let later: i64 = c
        .query_one("SELECT lambdastore.submit($1, 'tally', '{\"tag\": 1}', delay => interval '1 hour')", &[&id])
        .unwrap()
        .get(0);
    // A waiter wakes when the cancel commits.
    let waiter = std::thread::spawn(move || wait_job(&mut connect(), later, 60).unwrap());
    let cancelled: bool = c.query_one("SELECT lambdastore.cancel($1)", &[&later]).unwrap().get(0);
    assert!(cancelled);
    assert_eq!(waiter.join().unwrap().state, "cancelled");
    assert_eq!(state(&mut c, later), "cancelled");
    let again: bool = c.query_one("SELECT lambdastore.cancel($1)", &[&later]).unwrap().get(0);
    assert!(!again, "a cancelled job cancelled twice");

    let done = submit(&mut c, id, "tally", json!({"tag": 2}), None).unwrap();
    assert_eq!(finished(&mut c, done).state, "done");
    let cancelled: bool = c.query_one("SELECT lambdastore.cancel($1)", &[&done]).unwrap().get(0);
    assert!(!cancelled, "a finished job was cancelled");
    assert_eq!(state(&mut c, done), "done");
    assert_eq!(tallies(&mut c, id), [(2, 1, 0)], "the cancelled job ran");
    let shown: i64 = c
        .query_one("SELECT cancelled FROM lambdastore.queue WHERE app = $1 AND function = 'tally'", &[&app])
        .unwrap()
        .get(0);
    assert_eq!(shown, 1);

    expect_sqlstate(c.query_one("SELECT lambdastore.cancel(-1)", &[]), "42704");
    expect_sqlstate(c.query_one("SELECT lambdastore.cancel(NULL)", &[]), "22004");
    let mut tx = c.build_transaction().read_only(true).start().unwrap();
    expect_sqlstate(tx.query_one("SELECT lambdastore.cancel($1)", &[&later]), "25006");
}

/// The object's pending timers: (name, function, args).
fn timers(c: &mut Client, object: i64) -> Vec<(String, String, Value)> {
    c.query("SELECT name, function, args::text FROM lambdastore.timers WHERE object_id = $1 ORDER BY name", &[&object])
        .unwrap()
        .into_iter()
        .map(|row| (row.get(0), row.get(1), serde_json::from_str(&row.get::<_, String>(2)).unwrap()))
        .collect()
}

fn timer_job(c: &mut Client, object: i64, name: &str) -> i64 {
    c.query_one("SELECT job_id FROM lambdastore.timers WHERE object_id = $1 AND name = $2", &[&object, &name])
        .unwrap()
        .get(0)
}

fn set_timer(
    c: &mut impl GenericClient,
    object: i64,
    name: &str,
    delay_ms: u64,
    tag: u64,
    fail: bool,
) -> Result<Value, postgres::Error> {
    let args = json!({"name": name, "delay_ms": delay_ms, "method": "tally_at", "args": {"tag": tag}, "fail": fail});
    invoke(c, object, "set_timer", args)
}

#[test]
fn a_timer_set_again_before_it_fires_is_replaced() {
    let (mut c, _, id) = micro_object("time_timer_replaced");
    set_timer(&mut c, id, "t", 800, 1, false).unwrap();
    set_timer(&mut c, id, "t", 1200, 2, false).unwrap();
    set_timer(&mut c, id, "other", 600, 3, false).unwrap();
    assert_eq!(
        timers(&mut c, id),
        [
            ("other".to_string(), "tally_at".to_string(), json!({"tag": 3})),
            ("t".to_string(), "tally_at".to_string(), json!({"tag": 2})),
        ],
        "one pending timer per name, the last set"
    );
    let (t, other) = (timer_job(&mut c, id, "t"), timer_job(&mut c, id, "other"));
    assert_eq!(finished(&mut c, t).state, "done");
    assert_eq!(finished(&mut c, other).state, "done");
    let ran = tallies(&mut c, id);
    assert_eq!(ran.iter().map(|(tag, runs, _)| (*tag, *runs)).collect::<Vec<_>>(), [(2, 1), (3, 1)], "tag 1 fired");
    assert!(ran[0].2 >= due_micros(&mut c, t), "a timer fired before its time");
    assert!(timers(&mut c, id).is_empty());
}

#[test]
fn a_timer_set_by_a_failed_workflow_never_fires_and_a_cleared_one_neither() {
    let (mut c, _, id) = micro_object("time_timer_rollback");
    expect_sqlstate(set_timer(&mut c, id, "t", 0, 1, true), "P0001");
    assert!(timers(&mut c, id).is_empty(), "a failed workflow's timer is pending");
    let queued = count(&mut c, &format!("SELECT count(*) FROM lambdastore.app_jobs WHERE object_id = {id}"));
    assert_eq!(queued, 0, "a failed workflow's timer was queued");

    set_timer(&mut c, id, "t", 60_000, 2, false).unwrap();
    let job = timer_job(&mut c, id, "t");
    call(&mut c, id, "clear_timer", json!({"name": "t"}));
    assert!(timers(&mut c, id).is_empty());
    assert_eq!(state(&mut c, job), "cancelled");

    // A rolled-back transaction takes its timer with it.
    let mut tx = c.transaction().unwrap();
    set_timer(&mut tx, id, "t", 0, 3, false).unwrap();
    tx.rollback().unwrap();
    assert!(timers(&mut c, id).is_empty());
    let nameless = json!({"name": "", "delay_ms": 0, "method": "tally", "args": {}, "fail": false});
    expect_sqlstate(invoke(&mut c, id, "set_timer", nameless), "22023");
    // A timer as far ahead as a u64 of milliseconds goes was set, due in
    // 294247 AD.
    let endless = json!({"name": "t", "delay_ms": u64::MAX, "method": "tally", "args": {}, "fail": false});
    let message = expect_sqlstate(invoke(&mut c, id, "set_timer", endless), "22023");
    assert!(message.contains("at most 1000 years from now"), "{message}");
    // A NUL in a name was stored in text, shown cut at it (two timers both
    // shown as "a", one not cleared by its shown name); one in arguments,
    // which jsonb cannot store, was a bare 22P05 at the commit.
    let message = expect_sqlstate(invoke(&mut c, id, "set_timer_with_nul", json!({"in_name": true})), "22023");
    assert!(message.contains("without NUL"), "{message}");
    let message = expect_sqlstate(invoke(&mut c, id, "set_timer_with_nul", json!({"in_name": false})), "22023");
    assert!(message.contains("may not hold \\u0000"), "{message}");
    assert!(timers(&mut c, id).is_empty());
    let unknown = json!({"name": "t", "delay_ms": 0, "method": "nothing", "args": {}, "fail": false});
    expect_sqlstate(invoke(&mut c, id, "set_timer", unknown), "P0001");
}

#[test]
fn a_repeating_timer_ticks_once_per_period_in_order() {
    let (mut c, _, id) = micro_object("time_timer_repeats");
    call(&mut c, id, "tick", json!({"name": "beat", "every_ms": 300, "left": 4, "tag": 1}));
    eventually("four ticks", || tallies(&mut c, id).len() == 4 && timers(&mut c, id).is_empty());
    let ran = tallies(&mut c, id);
    assert!(ran.iter().all(|(_, runs, _)| *runs == 1), "a tick ran twice: {ran:?}");
    for pair in ran.windows(2) {
        assert!(pair[1].2 - pair[0].2 >= 300_000, "ticks closer than their period: {ran:?}");
    }
}

fn schedule(
    c: &mut impl GenericClient,
    name: &str,
    cron: &str,
    object: i64,
    missed: &str,
) -> Result<(), postgres::Error> {
    c.query_one(
        "SELECT lambdastore.schedule($1, $2, $3, 'tally_at', '{\"tag\": 0}', 'UTC', $4)",
        &[&name, &cron, &object, &missed],
    )
    .map(|_| ())
}

/// A schedule's done ticks, and their due times in µs.
fn ticks(c: &mut impl GenericClient, object: i64, name: &str) -> Vec<i64> {
    c.query(
        "SELECT (extract(epoch FROM run_after) * 1000000)::bigint FROM lambdastore.app_jobs
          WHERE object_id = $1 AND schedule = $2 AND state = 'done' ORDER BY run_after",
        &[&object, &name],
    )
    .unwrap()
    .into_iter()
    .map(|row| row.get(0))
    .collect()
}

#[test]
fn a_schedule_ticks_each_second_once_until_unscheduled() {
    let (mut c, _, id) = micro_object("time_schedule");
    schedule(&mut c, "every second", "* * * * * *", id, "run_once").unwrap();
    let next: Option<std::time::SystemTime> =
        c.query_one("SELECT next_tick FROM lambdastore.app_schedules WHERE object_id = $1", &[&id]).unwrap().get(0);
    assert!(next.is_some(), "no next tick shown");
    eventually("three ticks", || ticks(&mut c, id, "every second").len() >= 3);
    let removed: bool = c.query_one("SELECT lambdastore.unschedule($1, 'every second')", &[&id]).unwrap().get(0);
    assert!(removed);
    let unscheduled: i64 =
        c.query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint", &[]).unwrap().get(0);
    // A tick running then finishes; the one it queued is cancelled when
    // claimed, without running.
    let queued = format!("SELECT count(*) FROM lambdastore.app_jobs WHERE object_id = {id} AND state = 'queued'");
    eventually("no tick queued", || count(&mut c, &queued) == 0);
    let due = ticks(&mut c, id, "every second");
    assert!(due.iter().all(|at| *at <= unscheduled), "a tick ran after unschedule: {due:?}");
    let mut distinct = due.clone();
    distinct.dedup();
    assert_eq!(distinct, due, "two ticks for one second");
    assert!(due.iter().all(|at| at % 1_000_000 == 0), "ticks off the second: {due:?}");
    let (_, runs, _) = tallies(&mut c, id)[0];
    assert_eq!(runs as usize, due.len(), "ticks done and runs of the method differ");
    let again: bool = c.query_one("SELECT lambdastore.unschedule($1, 'every second')", &[&id]).unwrap().get(0);
    assert!(!again);
}

/// A schedule's queued tick is not cancelled alone (55000): it queues the
/// next tick as it ends, and cancelled, the schedule never ticked again,
/// its name still taken. `unschedule` ends the schedule.
#[test]
fn a_schedules_tick_is_not_cancelled_alone() {
    let (mut c, _, id) = micro_object("time_cancel_tick");
    schedule(&mut c, "new year", "0 0 1 1 *", id, "run_once").unwrap();
    let tick: i64 = c
        .query_one(
            "SELECT job_id FROM lambdastore.app_jobs WHERE object_id = $1 AND schedule = 'new year' AND state = 'queued'",
            &[&id],
        )
        .unwrap()
        .get(0);
    let message = expect_sqlstate(c.query_one("SELECT lambdastore.cancel($1)", &[&tick]), "55000");
    assert!(message.contains(&format!("lambdastore.unschedule({id}, 'new year')")), "{message}");
    assert_eq!(state(&mut c, tick), "queued");
}

#[test]
fn schedule_refuses_bad_input() {
    let (mut c, _, id) = micro_object("time_schedule_input");
    expect_sqlstate(schedule(&mut c, "s", "61 * * * *", id, "run_once"), "22023");
    expect_sqlstate(schedule(&mut c, "s", "not cron", id, "run_once"), "22023");
    // A year field: once past its year the schedule stayed, due never.
    expect_sqlstate(schedule(&mut c, "s", "0 7 8 1 12 * 2026", id, "run_once"), "22023");
    let endless = format!("{}1 * * * *", "1,".repeat(1_000));
    expect_sqlstate(schedule(&mut c, "s", &endless, id, "run_once"), "22023");
    expect_sqlstate(schedule(&mut c, "s", "* * * * *", id, "sometimes"), "22023");
    expect_sqlstate(schedule(&mut c, "", "* * * * *", id, "run_once"), "22023");
    expect_sqlstate(
        c.query_one("SELECT lambdastore.schedule('s', '* * * * *', $1, 'tally', '{}', 'Mars/Olympus')", &[&id]),
        "22023",
    );
    expect_sqlstate(schedule(&mut c, "s", "* * * * *", -1, "run_once"), "42704");
    expect_sqlstate(
        c.query_one("SELECT lambdastore.schedule('s', '* * * * *', $1, 'no_such_method')", &[&id]),
        "42883",
    );
    expect_sqlstate(c.query_one("SELECT lambdastore.schedule(NULL, '* * * * *', $1, 'tally')", &[&id]), "22004");
    let none = count(&mut c, &format!("SELECT count(*) FROM lambdastore.app_schedules WHERE object_id = {id}"));
    assert_eq!(none, 0, "a refused schedule was kept");
    schedule(&mut c, "hourly", "0 * * * *", id, "skip").unwrap();
    expect_sqlstate(schedule(&mut c, "hourly", "0 * * * *", id, "skip"), "42710");
    assert!(c.query_one("SELECT lambdastore.unschedule($1, 'hourly')", &[&id]).unwrap().get::<_, bool>(0));
}

#[test]
fn finished_jobs_past_their_retention_are_deleted_and_no_others() {
    let (mut c, _, id) = micro_object("time_retention");
    let old = submit(&mut c, id, "tally", json!({"tag": 1}), Some("time_retention-old")).unwrap();
    let recent = submit(&mut c, id, "tally", json!({"tag": 2}), None).unwrap();
    let queued: i64 = c
        .query_one("SELECT lambdastore.submit($1, 'tally', '{\"tag\": 3}', delay => interval '1 hour')", &[&id])
        .unwrap()
        .get(0);
    for job in [old, recent] {
        assert_eq!(finished(&mut c, job).state, "done");
    }
    // Aged by hand past the default retention (7 days); a queued job is
    // never finished, however old.
    c.execute(
        "UPDATE lambdastore.jobs SET finished_at = now() - interval '8 days' WHERE object_id = $1 AND job_id = $2",
        &[&id, &old],
    )
    .unwrap();
    c.execute(
        "UPDATE lambdastore.jobs SET submitted_at = now() - interval '30 days' WHERE object_id = $1 AND job_id = $2",
        &[&id, &queued],
    )
    .unwrap();
    // The first worker looks when it wakes: a job wakes it.
    let wake = submit(&mut c, id, "tally", json!({"tag": 4}), None).unwrap();
    finished(&mut c, wake);
    eventually("the old job deleted", || {
        let wake = submit(&mut c, id, "tally", json!({"tag": 5}), None).unwrap();
        finished(&mut c, wake);
        c.query("SELECT 1 FROM lambdastore.job($1)", &[&old]).unwrap().is_empty()
    });
    assert_eq!(state(&mut c, recent), "done", "a recent job was deleted");
    assert_eq!(state(&mut c, queued), "queued", "a queued job was deleted");
    // Its idempotency key went with it: the key queues a new job.
    let again = submit(&mut c, id, "tally", json!({"tag": 1}), Some("time_retention-old")).unwrap();
    assert_ne!(again, old);
    c.query_one("SELECT lambdastore.cancel($1)", &[&queued]).unwrap();
}

/// `n` Bench objects of `app`, without entries, all on one node: queue
/// limits are per node (on a Citus cluster each node's runners enforce
/// them on the jobs of its objects).
/// (With `near`, on that object's node.)
fn benches(c: &mut Client, app: &str, n: usize, near: Option<i64>) -> Vec<i64> {
    let local = c.query_one("SELECT lambdastore.node() = 'local'", &[]).unwrap().get::<_, bool>(0);
    let mut objects: Vec<i64> = Vec::new();
    for _ in 0..20 * n {
        let id = create(c, app, "Bench", json!({"entries": 0}));
        if local || near.or(objects.first().copied()).is_none_or(|first| owner(c, first) == owner(c, id)) {
            objects.push(id);
        }
        if objects.len() == n {
            return objects;
        }
    }
    panic!("{} objects of {app} on one node after {} tries", objects.len(), 20 * n);
}

/// Submits `method(args(i))` on each of `objects` in one transaction and
/// waits for them all; their job ids.
fn run_jobs(c: &mut Client, objects: &[i64], method: &str, args: impl Fn(usize) -> Value) -> Vec<i64> {
    let mut tx = c.transaction().unwrap();
    let jobs: Vec<i64> =
        objects.iter().enumerate().map(|(i, &id)| submit(&mut tx, id, method, args(i), None).unwrap()).collect();
    tx.commit().unwrap();
    for &job in &jobs {
        assert_eq!(finished(c, job).state, "done");
    }
    jobs
}

/// The most `busy` jobs of `objects` that ran at one moment (each kept
/// its start and end in `ran:<i>`).
fn most_at_once(c: &mut Client, objects: &[i64]) -> usize {
    let mut edges: Vec<(i64, i32)> = Vec::new();
    for (i, &id) in objects.iter().enumerate() {
        let ran = call(c, id, "get", json!({"key": format!("ran:{i}")}));
        let (start, end) = ran.as_str().unwrap().split_once(' ').unwrap();
        edges.push((start.parse().unwrap(), 1));
        edges.push((end.parse().unwrap(), -1));
    }
    edges.sort(); // an end before a start at the same microsecond
    let (mut now, mut most) = (0, 0);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// The finish times (µs) of `jobs`, in order.
fn finish_times(c: &mut Client, jobs: &[i64]) -> Vec<i64> {
    let mut times: Vec<i64> = jobs
        .iter()
        .map(|job| {
            c.query_one(
                "SELECT (extract(epoch FROM finished_at) * 1000000)::bigint FROM lambdastore.app_jobs WHERE job_id = $1",
                &[job],
            )
            .unwrap()
            .get(0)
        })
        .collect();
    times.sort();
    times
}

fn set_limits(c: &mut Client, app: &str, max_running: Option<i32>, rate: Option<i32>, priority: i32) {
    c.execute(
        "SELECT lambdastore.set_queue_limits($1, max_running => $2, rate => $3, per => interval '1 second',
                                             priority => $4)",
        &[&app, &max_running, &rate, &priority],
    )
    .unwrap();
}

#[test]
fn a_concurrency_limit_of_one_holds_and_without_it_two_run_at_once() {
    // The test server runs two job runners.
    let (mut c, app) = deployed("time_limit_running", "micro");
    let objects = benches(&mut c, &app, 6, None);
    let busy = |i: usize| json!({"tag": i, "ms": 200});
    set_limits(&mut c, &app, Some(1), None, 0);
    let shown: Option<i32> = c
        .query_one("SELECT max_running FROM lambdastore.queue WHERE app = $1 LIMIT 1", &[&app])
        .map(|row| row.get(0))
        .unwrap_or(Some(1)); // no row before its first job
    assert_eq!(shown, Some(1));
    run_jobs(&mut c, &objects, "busy", busy);
    assert_eq!(most_at_once(&mut c, &objects), 1, "two jobs ran at once under max_running = 1");
    // Switched off, the two runners take two at a time (given a few tries:
    // other tests' jobs share the runners).
    set_limits(&mut c, &app, None, None, 0);
    let overlapped = (0..3).any(|_| {
        run_jobs(&mut c, &objects, "busy", busy);
        most_at_once(&mut c, &objects) == 2
    });
    assert!(overlapped, "without the limit no two jobs ever ran at once: the test shows nothing");
}

#[test]
fn a_rate_limit_holds_over_its_window() {
    let (mut c, app) = deployed("time_limit_rate", "micro");
    let objects = benches(&mut c, &app, 6, None);
    set_limits(&mut c, &app, None, Some(2), 0);
    let jobs = run_jobs(&mut c, &objects, "tally", |i| json!({"tag": i}));
    let done = finish_times(&mut c, &jobs);
    for (i, pair) in done.windows(3).enumerate() {
        assert!(pair[2] - pair[0] >= 1_000_000, "jobs {i} to {} finished within a second: {done:?}", i + 2);
    }
    // Switched off, six quick jobs finish within a second.
    set_limits(&mut c, &app, None, None, 0);
    let jobs = run_jobs(&mut c, &objects, "tally", |i| json!({"tag": i}));
    let done = finish_times(&mut c, &jobs);
    assert!(done[5] - done[0] < 1_000_000, "without the rate limit: {done:?}");
}

#[test]
fn a_higher_priority_application_is_served_first() {
    let (mut c, low) = deployed("time_priority_low", "micro");
    let (_, high) = deployed("time_priority_high", "micro");
    let lows = benches(&mut c, &low, 8, None);
    let highs = benches(&mut c, &high, 8, Some(lows[0]));
    // Low priority's jobs before the high one's in one transaction: the
    // runners find both queued at once.
    let served_late = |c: &mut Client| {
        let mut all = lows.clone();
        all.extend(&highs);
        let jobs = run_jobs(c, &all, "busy", |i| json!({"tag": i % 8, "ms": 20}));
        let (low_jobs, high_jobs) = jobs.split_at(8);
        let last_high = *finish_times(c, high_jobs).last().unwrap();
        finish_times(c, low_jobs).iter().filter(|&&at| at < last_high).count()
    };
    set_limits(&mut c, &high, None, None, 10);
    let before = served_late(&mut c);
    assert!(before <= 2, "{before} low-priority jobs finished before the last high-priority one");
    // Switched off (equal priorities), the runners take turns.
    set_limits(&mut c, &high, None, None, 0);
    let interleaved = (0..3).any(|_| served_late(&mut c) > 2);
    assert!(interleaved, "without priorities the high application still went first: the test shows nothing");
}

#[test]
fn set_queue_limits_refuses_bad_input() {
    let (mut c, app) = deployed("time_limits_input", "micro");
    let set = |c: &mut Client, sql: &str| c.execute(sql, &[&app]).map(|_| ());
    expect_sqlstate(set(&mut c, "SELECT lambdastore.set_queue_limits($1, max_running => 0)"), "22023");
    expect_sqlstate(set(&mut c, "SELECT lambdastore.set_queue_limits($1, rate => -1)"), "22023");
    expect_sqlstate(set(&mut c, "SELECT lambdastore.set_queue_limits($1, rate => 1, per => interval '0')"), "22023");
    // Half a millisecond is not rounded up to one.
    expect_sqlstate(
        set(&mut c, "SELECT lambdastore.set_queue_limits($1, rate => 1, per => interval '0.5 ms')"),
        "22023",
    );
    expect_sqlstate(set(&mut c, "SELECT lambdastore.set_queue_limits($1, priority => NULL)"), "22004");
    expect_sqlstate(c.execute("SELECT lambdastore.set_queue_limits('no_such_app_time')", &[]), "42704");
}

/// An application's owner may lower its priority, but only a superuser
/// may raise one above the default (42501): the workers serve higher
/// priorities first, so any owner could starve every other application.
#[test]
fn only_a_superuser_raises_an_applications_priority() {
    let role = TestRole::new("time_priority_owner");
    let mut owner = role.connect();
    let app = format!("time_priority_owned_{}", std::process::id());
    deploy_example(&mut owner, &app, "micro");
    let message = expect_sqlstate(
        owner.execute("SELECT lambdastore.set_queue_limits($1, priority => 1)", &[&app]).map(|_| ()),
        "42501",
    );
    assert!(message.contains("only a superuser may give an application a priority above 0"), "{message}");
    set_limits(&mut owner, &app, Some(2), None, -5);
    let mut admin = connect();
    set_limits(&mut admin, &app, None, None, 10);
    let priority: i32 =
        admin.query_one("SELECT priority FROM lambdastore.queue_limits WHERE app = $1", &[&app]).unwrap().get(0);
    assert_eq!(priority, 10);
}

/// Two transactions set one timer at once: the second waits for the
/// first's commit (an advisory lock on the object and the name), then
/// replaces its timer, so one is pending. (Without the lock both cancel
/// nothing, and two timers of one name fire.) Skipped on a Citus cluster,
/// whose waiting backend is not the client's.
#[test]
fn two_sessions_setting_one_timer_leave_one_pending() {
    let (mut c, _, id) = micro_object("time_timer_race");
    let mut first = connect();
    let mut tx = first.transaction().unwrap();
    set_timer(&mut tx, id, "t", 60_000, 1, false).unwrap();
    let mut second = connect();
    let pid = backend_pid(&mut second);
    let setter = std::thread::spawn(move || set_timer(&mut second, id, "t", 60_000, 2, false).map(|_| ()));
    // The second waits for the first; without the lock it would be done.
    eventually("the second setter waits or is done", || {
        setter.is_finished()
            || c.query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", &[&pid])
                .unwrap()
                .get::<_, i64>(0)
                == 1
    });
    tx.commit().unwrap();
    setter.join().unwrap().unwrap();
    assert_eq!(timers(&mut c, id), [("t".to_string(), "tally_at".to_string(), json!({"tag": 2}))]);
    call(&mut c, id, "clear_timer", json!({"name": "t"}));
}
