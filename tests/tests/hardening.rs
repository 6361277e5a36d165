//! What a hostile user of a shared server can no longer do (issue 23): each
//! test is one finding of the review, asserted as the user sees it. Roles
//! here are ordinary roles set up as docs/sql-api.md, "Roles and privileges", says:
//! `USAGE` on the schema, and what an application's owner grants them.

mod common;

use common::*;
use postgres::Client;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

// 1. Privileges: ownership is a role OID, and no role but a superuser
//    touches the tables.

/// The tables an ordinary role has no privilege on, not even `SELECT`.
const TABLES: &[&str] = &[
    "applications",
    "modules",
    "object_types",
    "objects",
    "entries",
    "entry_sets",
    "jobs",
    "api_keys",
    "idempotency_keys",
    "grants",
];

#[test]
fn a_non_owner_cannot_take_over_an_application() {
    let role = TestRole::new("takeover");
    let mut admin = connect();
    let victim = app("takeover");
    deploy_example(&mut admin, &victim, "counter");
    let owner = app_owner(&mut admin, &victim);
    let mut c = role.connect();
    // The role may use LambdaStore: it deploys an application of its own...
    let own = app("takeover_own");
    deploy_example(&mut c, &own, "counter");
    assert_eq!(app_owner(&mut admin, &own), role.oid(&mut admin));

    // ...but cannot write itself into another's row...
    let message = expect_sqlstate(
        c.execute(
            "UPDATE lambdastore.applications SET owner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
              WHERE name = $1",
            &[&victim],
        ),
        "42501",
    );
    assert!(message.contains("permission denied for table applications"), "{message}");
    // ...nor deploy over it.
    let message = expect_sqlstate(deploy(&mut c, &victim, &example("micro")), "42501");
    assert!(message.contains("belongs to role"), "{message}");

    assert_eq!(module_rows(&mut admin, &victim), 1);
    assert_eq!(app_owner(&mut admin, &victim), owner);
    assert!(!has_app_privilege(&mut c, &victim, "owner"));
}

/// A protected function is protected by the module's description, which
/// only a deploy by the owner writes.
#[test]
fn a_non_owner_cannot_make_a_protected_function_public() {
    let role = TestRole::new("unprotect");
    let (mut admin, app, id) = micro_object("unprotect");
    grant(&mut admin, &app, &role.name, "invoke").unwrap();
    let mut c = role.connect();
    call(&mut c, id, "now", json!({})); // the role may invoke the application

    for (table, column) in [("modules", "description"), ("object_types", "functions")] {
        let message = expect_sqlstate(
            c.execute(&format!("UPDATE lambdastore.{table} SET {column} = '[]' WHERE app = $1"), &[&app]),
            "42501",
        );
        assert!(message.contains(&format!("permission denied for table {table}")), "{message}");
    }
    let message = expect_sqlstate(invoke(&mut c, id, "secret", json!({})), "42501");
    assert!(message.contains("protected"), "refused for another reason: {message}");
}

/// A row in `lambdastore.jobs` names the role its call runs as: a role
/// that could insert one could run calls as a superuser. Only `submit`
/// queues a job, and the job runs as the role that submitted it, whose
/// privilege is checked again when it runs.
#[test]
fn a_job_runs_as_the_role_that_submitted_it() {
    let role = TestRole::new("job_role");
    let (mut admin, mine, a) = micro_object("job_role_mine");
    let (_, theirs, b) = micro_object("job_role_theirs");
    call(&mut admin, b, "put", json!({"key": "secret", "value": "theirs"}));
    grant(&mut admin, &mine, &role.name, "invoke").unwrap();
    let mut c = role.connect();
    let jobs_on = |admin: &mut Client, object: i64| -> i64 {
        admin.query_one("SELECT count(*) FROM lambdastore.jobs WHERE object_id = $1", &[&object]).unwrap().get(0)
    };

    let message = expect_sqlstate(
        c.execute(
            "INSERT INTO lambdastore.jobs (object_id, app, method, args, submitted_by)
             VALUES ($1, $2, 'get', '{\"key\": \"secret\"}', (SELECT oid FROM pg_roles WHERE rolsuper LIMIT 1))",
            &[&b, &theirs],
        ),
        "42501",
    );
    assert!(message.contains("permission denied for table jobs"), "{message}");
    expect_sqlstate(submit(&mut c, b, "get", json!({"key": "secret"}), None), "42501");
    assert_eq!(jobs_on(&mut admin, b), 0, "a job was queued on the other application's object");

    // On the application it may invoke, the job runs, as this role.
    let job = submit(&mut c, a, "put", json!({"key": "k", "value": "v"}), None).unwrap();
    assert_eq!(finished(&mut c, job).state, "done");
    let submitted_by: u32 =
        admin.query_one("SELECT submitted_by FROM lambdastore.jobs WHERE job_id = $1", &[&job]).unwrap().get(0);
    assert_eq!(submitted_by, role.oid(&mut admin));

    // Submitted while the role may invoke, committed after a revoke: the
    // job runs as the role, which may no longer invoke.
    let mut tx = c.transaction().unwrap();
    let job = submit(&mut tx, a, "put", json!({"key": "k", "value": "late"}), None).unwrap();
    // The revoke must not wait for the submitting transaction.
    admin.batch_execute("SET lock_timeout = '10s'").unwrap();
    assert!(revoke(&mut admin, &mine, &role.name, "invoke").unwrap());
    tx.commit().unwrap();
    let late = finished(&mut admin, job);
    assert_eq!((late.state.as_str(), late.sqlstate.as_deref()), ("failed", Some("42501")), "{late:?}");
    assert_eq!(call(&mut admin, a, "get", json!({"key": "k"})), json!("v"));
}

/// Jobs are seen by the roles that may invoke or read their application;
/// to any other role, a job looks like one that does not exist.
#[test]
fn another_applications_jobs_are_invisible() {
    let role = TestRole::new("job_invisible");
    let (mut admin, mine, a) = micro_object("job_invisible_mine");
    let (_, theirs, b) = micro_object("job_invisible_theirs");
    call(&mut admin, b, "put", json!({"key": "secret", "value": "theirs"}));
    let their_job = submit(&mut admin, b, "get", json!({"key": "secret"}), None).unwrap();
    assert_eq!(finished(&mut admin, their_job).result, Some(json!("theirs")));
    grant(&mut admin, &mine, &role.name, "invoke").unwrap();
    let mut c = role.connect();

    let rows = c.query("SELECT state, result::text FROM lambdastore.job($1)", &[&their_job]).unwrap();
    assert!(rows.is_empty(), "lambdastore.job showed another application's job");
    expect_sqlstate(wait_job(&mut c, their_job, 1), "42704");
    for view in ["lambdastore.queue", "lambdastore.app_jobs"] {
        let sql = format!("SELECT count(*) FROM {view} WHERE app = $1");
        let seen: i64 = c.query_one(&sql, &[&theirs]).unwrap().get(0);
        assert_eq!(seen, 0, "{view} showed another application's jobs");
    }
    expect_sqlstate(submit(&mut c, b, "get", json!({"key": "secret"}), None), "42501");
    expect_sqlstate(invoke(&mut c, b, "get", json!({"key": "secret"})), "42501");

    // Its own application's jobs it sees.
    let job = submit(&mut c, a, "now", json!({}), None).unwrap();
    assert_eq!(finished(&mut c, job).state, "done");
    let seen: i64 = c.query_one("SELECT count(*) FROM lambdastore.queue WHERE app = $1", &[&mine]).unwrap().get(0);
    assert_eq!(seen, 1);
}

/// The owner is kept as an OID: when the owning role is dropped, the
/// application keeps that OID (DROP ROLE is not refused: nothing in
/// PostgreSQL's catalog depends on the role), and a new role that takes
/// the dropped role's name owns nothing. A superuser can hand it over.
#[test]
fn a_new_role_with_a_dropped_owners_name_owns_nothing() {
    let role = TestRole::new("dropped_owner");
    let mut admin = connect();
    let app = app("dropped_owner");
    let mut c = role.connect();
    deploy_example(&mut c, &app, "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    drop(c);
    let dropped = role.oid(&mut admin);
    assert_eq!(app_owner(&mut admin, &app), dropped);

    // Here lambdastore refuses to drop the owner (2BP01), and PostgreSQL in
    // another database (security.rs). A role dropped all the same, as one
    // could be before PostgreSQL was told (a server of 0.1.0, a restore
    // before `adopt_restored_roles`): its record taken away by hand.
    let refused = expect_sqlstate(change_roles(&mut admin, &format!("DROP ROLE {}", role.name)), "2BP01");
    assert!(refused.contains(&format!("it owns the applications {app}")), "{refused}");
    admin.execute("SELECT pg_advisory_lock($1)", &[&ROLES_LOCK]).unwrap();
    admin.batch_execute(&format!("DROP OWNED BY {}", role.name)).unwrap();
    admin
        .execute(
            "DELETE FROM pg_shdepend WHERE objid = 'lambdastore.applications'::regclass AND refobjid = $1::oid",
            &[&dropped],
        )
        .unwrap();
    connect_to("postgres").batch_execute(&format!("DROP ROLE {}", role.name)).unwrap();
    admin.execute("SELECT pg_advisory_unlock($1)", &[&ROLES_LOCK]).unwrap();
    change_roles(
        &mut admin,
        &format!("CREATE ROLE {0} LOGIN NOSUPERUSER; GRANT USAGE ON SCHEMA lambdastore TO {0};", role.name),
    )
    .unwrap();
    assert_ne!(role.oid(&mut admin), dropped);
    assert_eq!(app_owner(&mut admin, &app), dropped);

    let mut c = role.connect();
    assert!(!has_app_privilege(&mut c, &app, "owner"));
    expect_sqlstate(deploy(&mut c, &app, &example("counter")), "42501");
    assert_eq!(module_rows(&mut admin, &app), 1);
    expect_sqlstate(invoke(&mut c, id, "now", json!({})), "42501");

    admin.execute("SELECT lambdastore.set_owner($1, $2::text::regrole)", &[&app, &role.name]).unwrap();
    call(&mut c, id, "now", json!({}));
    assert!(has_app_privilege(&mut c, &app, "owner"));
}

/// No SQL path reaches an application's data without its owner's grant:
/// the tables are closed, the views show nothing and calls are refused,
/// until 'read' opens the views and 'invoke' the calls.
#[test]
fn a_role_without_grants_can_neither_read_nor_change_an_application() {
    let role = TestRole::new("no_grants");
    let (mut admin, app, id) = micro_object("no_grants");
    call(&mut admin, id, "put", json!({"key": "secret", "value": "s3cret"}));
    let mut c = role.connect();

    for table in TABLES {
        let message = expect_sqlstate(c.query(&format!("SELECT * FROM lambdastore.{table} LIMIT 1"), &[]), "42501");
        assert!(message.contains(&format!("permission denied for table {table}")), "{message}");
    }
    for dml in [
        "INSERT INTO lambdastore.entries (object_id, field, key, value) VALUES ($1, 'kv', '\\x00', '\"x\"')",
        "UPDATE lambdastore.entries SET value = '\"x\"' WHERE object_id = $1",
        "DELETE FROM lambdastore.objects WHERE object_id = $1",
    ] {
        expect_sqlstate(c.execute(dml, &[&id]), "42501");
    }
    let visible = |c: &mut Client| -> (i64, i64) {
        let row = c
            .query_one(
                "SELECT (SELECT count(*) FROM lambdastore.app_objects WHERE object_id = $1),
                        (SELECT count(*) FROM lambdastore.app_entries WHERE object_id = $1)",
                &[&id],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(visible(&mut c), (0, 0));
    expect_sqlstate(invoke(&mut c, id, "get", json!({"key": "secret"})), "42501");
    expect_sqlstate(create_object(&mut c, &app, "Bench", json!({})), "42501");
    expect_sqlstate(invoke_static(&mut c, &app, "Bench", "version", json!({})), "42501");
    expect_sqlstate(submit(&mut c, id, "get", json!({"key": "secret"}), None), "42501");

    grant(&mut admin, &app, &role.name, "read").unwrap();
    let (objects_seen, entries_seen) = visible(&mut c);
    assert_eq!(objects_seen, 1);
    assert_eq!(entries_seen, entries(&mut admin, id).len() as i64);
    let secret: String = c
        .query_one(
            "SELECT convert_from(value, 'UTF8') FROM lambdastore.app_entries
              WHERE object_id = $1 AND field = 'kv' AND position('secret'::bytea in key) > 0",
            &[&id],
        )
        .unwrap()
        .get(0);
    assert_eq!(secret, "\"s3cret\"");
    expect_sqlstate(invoke(&mut c, id, "get", json!({"key": "secret"})), "42501"); // read is not invoke

    grant(&mut admin, &app, &role.name, "invoke").unwrap();
    assert_eq!(call(&mut c, id, "get", json!({"key": "secret"})), json!("s3cret"));
    create(&mut c, &app, "Bench", json!({"entries": 1}));
    invoke_static(&mut c, &app, "Bench", "version", json!({})).unwrap();
}

#[test]
fn grants_are_the_owners_to_give() {
    let owner = TestRole::new("grants_owner");
    let other = TestRole::new("grants_other");
    let mut c = owner.connect();
    let app = app("grants");
    // Deploying a new name makes the caller its owner.
    deploy_example(&mut c, &app, "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    for privilege in ["owner", "invoke", "read"] {
        assert!(has_app_privilege(&mut c, &app, privilege), "the owner lacks {privilege}");
    }

    grant(&mut c, &app, &other.name, "invoke").unwrap();
    let message = expect_sqlstate(grant(&mut c, &app, &other.name, "write"), "22023");
    assert!(message.contains("write"), "{message}");
    expect_sqlstate(grant(&mut c, &format!("{app}_missing"), &other.name, "read"), "42704");
    assert!(revoke(&mut c, &app, &other.name, "invoke").unwrap());
    assert!(!revoke(&mut c, &app, &other.name, "invoke").unwrap(), "revoked twice");

    // Another role may not grant, revoke or take the application.
    let mut d = other.connect();
    expect_sqlstate(grant(&mut d, &app, &other.name, "invoke"), "42501");
    expect_sqlstate(revoke(&mut d, &app, &other.name, "read"), "42501");
    expect_sqlstate(d.execute("SELECT lambdastore.set_owner($1, current_user::regrole)", &[&app]), "42501");
    for privilege in ["owner", "invoke", "read"] {
        assert!(!has_app_privilege(&mut d, &app, privilege), "another role has {privilege}");
    }
    expect_sqlstate(invoke(&mut d, id, "now", json!({})), "42501");

    // The owner hands it over, only to a role it may become, as ALTER ...
    // OWNER TO: the owner's rights are the application's calls' (to other
    // applications, with its API keys), so giving it to a superuser or
    // to a role of another tenant lent the giver their rights.
    let set_owner =
        |c: &mut Client, to: &str| c.execute("SELECT lambdastore.set_owner($1, $2::text::regrole)", &[&app, &to]);
    let mut admin = connect();
    let superuser: String = admin.query_one("SELECT current_user::text", &[]).unwrap().get(0);
    for to in [other.name.as_str(), superuser.as_str()] {
        let message = expect_sqlstate(set_owner(&mut c, to), "42501");
        assert!(message.contains("only to a role it is a member of"), "{message}");
    }
    expect_sqlstate(c.execute("SELECT lambdastore._set_owner($1, 4242424)", &[&app]), "42704");
    admin.batch_execute(&format!("ALTER ROLE {0} NOINHERIT; GRANT {1} TO {0}", owner.name, other.name)).unwrap();
    set_owner(&mut c, &other.name).unwrap();
    call(&mut d, id, "now", json!({}));
    assert!(has_app_privilege(&mut d, &app, "owner"));
    expect_sqlstate(invoke(&mut c, id, "now", json!({})), "42501");
}

// 2. Settings that weaken a guarantee are a superuser's.

#[test]
fn only_a_superuser_may_turn_concurrency_control_off() {
    let role = TestRole::new("occ_off");
    let mut c = role.connect();
    let message = expect_sqlstate(c.batch_execute("SET lambdastore.concurrency_control = off"), "42501");
    assert!(message.contains("permission denied to set parameter"), "{message}");

    let mut admin = connect();
    admin.batch_execute("SET lambdastore.concurrency_control = off").unwrap();
    let shown: String = admin.query_one("SHOW lambdastore.concurrency_control", &[]).unwrap().get(0);
    assert_eq!(shown, "off");
}

/// An ordinary role's `lambdastore.timeout` is capped at
/// `lambdastore.max_timeout`; a superuser's is not.
#[test]
fn max_timeout_caps_an_ordinary_roles_timeout() {
    let role = TestRole::new("max_timeout");
    let (mut c, app, id) = micro_object("max_timeout");
    grant(&mut c, &app, &role.name, "invoke").unwrap();
    // Set by the superuser, then kept after SET ROLE (a SUSET setting the
    // role could not change itself); statement_timeout is a safety net.
    c.batch_execute(&format!(
        "SET lambdastore.max_timeout = '300ms'; SET statement_timeout = '20s';
         SET ROLE {}; SET lambdastore.timeout = '1h'",
        role.name
    ))
    .unwrap();
    let started = Instant::now();
    let message = expect_sqlstate(invoke(&mut c, id, "spin", json!({})), "57014");
    let elapsed = started.elapsed();
    assert!(message.contains("(300 ms, as lambdastore.max_timeout caps it"), "{message}");
    assert!(elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(5), "stopped after {elapsed:?}");

    c.batch_execute("RESET ROLE; SET lambdastore.timeout = '1s'").unwrap();
    let started = Instant::now();
    let message = fails_cleanly(&mut c, id, "spin", json!({}), "57014");
    assert!(message.ends_with("(1000 ms)"), "{message}");
    assert!(started.elapsed() >= Duration::from_secs(1), "a superuser's timeout was capped");
}

// 3. A result jsonb cannot hold.

#[test]
fn a_result_jsonb_cannot_hold_is_38000() {
    let (mut c, _, id) = micro_object("poison_result");
    // "a\0b": valid JSON, but jsonb refuses \u0000.
    let message = fails_cleanly(&mut c, id, "chars", json!({"codes": [97, 0, 98]}), "38000");
    assert!(message.contains("result"), "{message}");
    assert_eq!(call(&mut c, id, "chars", json!({"codes": [97, 98]})), json!("ab"));
}

/// Job runners' pids: a runner that dies is restarted with a new pid.
fn job_runners(c: &mut Client) -> Vec<i32> {
    c.query("SELECT pid FROM pg_stat_activity WHERE backend_type = 'lambdastore job runner' ORDER BY pid", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[test]
fn poison_jobs_fail_and_the_workers_live_on() {
    let (mut c, app, id) = micro_object("poison_jobs");
    let other = create(&mut c, &app, "Bench", json!({"entries": 0}));
    let runners = job_runners(&mut c);
    assert!(!runners.is_empty(), "no job runner is running");

    let poison: Vec<i64> =
        (0..3).map(|_| submit(&mut c, id, "chars", json!({"codes": [97, 0, 98]}), None).unwrap()).collect();
    let normal = submit(&mut c, other, "put", json!({"key": "after", "value": "poison"}), None).unwrap();

    let done = wait_job(&mut c, normal, 30).unwrap();
    assert_eq!(done.state, "done", "the job after the poison ones did not run within 30 s: {done:?}");
    for job in poison {
        let failed = finished(&mut c, job);
        assert_eq!((failed.state.as_str(), failed.sqlstate.as_deref()), ("failed", Some("38000")), "{failed:?}");
    }
    assert_eq!(job_runners(&mut c), runners, "a job runner died");
    assert_eq!(call(&mut c, other, "get", json!({"key": "after"})), json!("poison"));
}

// 4. Host memory and time a workflow may use.

#[test]
fn writing_past_max_write_size_is_54000_and_writes_nothing() {
    let (mut c, _, id) = micro_object("write_limit");
    c.batch_execute("SET lambdastore.max_write_size = '1MB'").unwrap();

    // 2,000 values of 1,000 bytes.
    let message = fails_cleanly(&mut c, id, "put_many", json!({"count": 2000, "bytes": 1000}), "54000");
    assert!(message.contains("lambdastore.max_write_size"), "{message}");
    assert_eq!(call(&mut c, id, "list", json!({})), json!([]));
    // One entry written 2,000 times: the values it replaced count too.
    let message = fails_cleanly(&mut c, id, "overwrite", json!({"count": 2000, "bytes": 1000}), "54000");
    assert!(message.contains("lambdastore.max_write_size"), "{message}");
    assert_eq!(call(&mut c, id, "get", json!({"key": "hot"})), json!(null));

    assert_eq!(call(&mut c, id, "put_many", json!({"count": 100, "bytes": 1000})), json!(100));
}

#[test]
fn a_scan_past_max_scan_size_is_54000() {
    let (mut c, _, id) = micro_object("scan_limit");
    // About 3 MB, under the default write limit.
    assert_eq!(call(&mut c, id, "put_many", json!({"count": 3000, "bytes": 1000})), json!(3000));
    c.batch_execute("SET lambdastore.max_scan_size = '1MB'").unwrap();

    let message = fails_cleanly(&mut c, id, "scan_count", json!({}), "54000");
    assert!(message.contains("lambdastore.max_scan_size"), "{message}");
    let first = call(&mut c, id, "list", json!({"limit": 10}));
    assert_eq!(first.as_array().map(Vec::len), Some(10), "{first}");
}

/// Buffering and applying a workflow's writes is host work, outside the
/// guest's epoch checks; it must stop at the deadline too. The bounds are
/// generous: this is a protection, not a speed target. (Without the
/// checks, 200,000 one-byte writes succeeded after 2 s here.)
#[test]
fn applying_many_writes_stops_at_the_timeout() {
    let (mut c, _, id) = micro_object("apply_timeout");
    c.batch_execute("SET lambdastore.timeout = '200ms'; SET statement_timeout = '60s'").unwrap();
    let started = Instant::now();
    let outcome = invoke(&mut c, id, "put_many", json!({"count": 200_000, "bytes": 1}));
    let elapsed = started.elapsed();
    match &outcome {
        // Success means the whole workflow, writes applied, fit in 200 ms.
        Ok(_) => assert!(elapsed < Duration::from_secs(1), "succeeded after {elapsed:?} under a 200 ms timeout"),
        Err(err) => {
            let code = err.as_db_error().map(|db| db.code().code());
            assert_eq!(code, Some("57014"), "{}", describe(err));
            assert!(describe(err).contains("lambdastore.timeout"), "{}", describe(err));
        }
    }
    assert!(elapsed < Duration::from_secs(5), "the call took {elapsed:?} under a 200 ms timeout");
}

// 5. Logging.

#[test]
fn a_workflow_logs_at_most_100_escaped_messages() {
    let (_, _, id) = micro_object("log_limit");
    let (mut c, notices) = connect_keeping_notices();
    call(&mut c, id, "log_many", json!({"count": 10_000, "message": "line\nFAKE: forged"}));

    let messages: Vec<String> = notices.lock().unwrap().iter().map(|n| n.message().to_string()).collect();
    assert!(!messages.is_empty(), "no message reached the client");
    assert!(messages.len() <= 100, "{} messages reached the client", messages.len());
    assert!(
        messages.iter().any(|m| m.contains("dropped")),
        "no message says that further ones were dropped; the last: {:?}",
        messages.last()
    );
    for message in &messages {
        assert!(!message.contains('\n'), "a raw line break reached the client: {message:?}");
        assert!(message.contains("line\\nFAKE: forged"), "not escaped as \\n: {message:?}");
    }
}

// 6. Deploy.

/// The compiled-artifact cache: every file under `$PGDATA/lambdastore/cache`.
fn cached_artifacts(admin: &mut Client) -> Vec<String> {
    let mut files = Vec::new();
    let mut dirs = vec!["lambdastore/cache".to_string()];
    while let Some(dir) = dirs.pop() {
        let rows = admin
            .query(
                "SELECT $1 || '/' || f, (pg_stat_file($1 || '/' || f, true)).isdir FROM pg_ls_dir($1, true, false) f",
                &[&dir],
            )
            .unwrap();
        for row in rows {
            let (path, isdir): (String, Option<bool>) = (row.get(0), row.get(1));
            if isdir == Some(true) {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

/// Dropping a database removes its compiled modules (`$PGDATA/lambdastore/
/// cache/<oid>`, 50 MB a Python guest): nothing else did, they stayed on
/// disk, and the postmaster mapped them at every start.
#[test]
fn dropping_a_database_removes_its_compiled_modules() {
    let scratch = ScratchDatabase::new("dropped_cache");
    let mut c = scratch.connect();
    c.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    deploy_example(&mut c, "dropped", "counter");
    let oid: u32 = c.query_one("SELECT oid FROM pg_database WHERE datname = current_database()", &[]).unwrap().get(0);
    drop(c);
    let mut admin = connect();
    let dir = format!("lambdastore/cache/{oid}");
    assert!(cached_artifacts(&mut admin).iter().any(|f| f.starts_with(&format!("{dir}/"))), "no artifact in {dir}");
    admin.batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", scratch.name)).unwrap();
    let left: Option<bool> = admin.query_one("SELECT (pg_stat_file($1, true)).isdir", &[&dir]).unwrap().get(0);
    assert_eq!(left, None, "{dir} is still there");
}

/// `lambdastore.stats` counts per database: the server's table once
/// showed an application's calls in another database holding an
/// application of the same name, to whoever may read that one.
#[test]
fn stats_of_another_database_are_not_shown() {
    let scratch = ScratchDatabase::new("stats_apart");
    let app = app("stats_apart");
    let mut other = scratch.connect();
    other.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    deploy_example(&mut other, &app, "counter");
    let id = create(&mut other, &app, "Counter", json!({"initial": 0}));
    call(&mut other, id, "get", json!({}));
    let calls = |c: &mut Client| -> i64 {
        let sql = "SELECT coalesce(sum(calls), 0)::bigint FROM lambdastore.stats WHERE app = $1 AND function = 'get'";
        c.query_one(sql, &[&app]).unwrap().get(0)
    };
    assert_eq!(calls(&mut other), 1, "counted where the call ran");
    let mut here = connect();
    deploy_example(&mut here, &app, "counter");
    assert_eq!(calls(&mut here), 0, "the other database's calls");
}

/// Compiling cannot be interrupted, so who may deploy is checked first: a
/// refused deploy compiles nothing and leaves no artifact behind.
#[test]
fn a_deploy_by_a_non_owner_is_refused_before_compiling() {
    let role = TestRole::new("refused_compile");
    let mut admin = connect();
    let target = app("refused_compile");
    deploy_example(&mut admin, &target, "counter");
    // Bytes no test has deployed before.
    let never_seen = app("NeverSeen");
    let module = rogue::describing(&[(&never_seen, rogue::FUNCTIONS)]);
    let sha256: String = admin.query_one("SELECT encode(sha256($1), 'hex')", &[&module]).unwrap().get(0);
    let named = |files: &[String]| files.iter().any(|f| f.rsplit('/').next().unwrap().starts_with(&sha256[..32]));

    let mut c = role.connect();
    expect_sqlstate(deploy(&mut c, &target, &module), "42501");
    assert!(!named(&cached_artifacts(&mut admin)), "the refused module was compiled and cached");

    // The owner's deploy of the same bytes is cached under that name.
    deploy(&mut admin, &target, &module).unwrap();
    assert!(named(&cached_artifacts(&mut admin)), "no artifact named {sha256} in the cache");
}

#[test]
fn a_module_past_max_module_size_is_54000() {
    let mut c = connect();
    let app = app("module_size");
    c.batch_execute("SET lambdastore.max_module_size = '64kB'").unwrap();
    let micro = example("micro");
    assert!(micro.len() > 64 * 1024);
    let message = expect_sqlstate(deploy(&mut c, &app, &micro), "54000");
    assert!(message.contains("lambdastore.max_module_size"), "{message}");
    assert_eq!(module_rows(&mut c, &app), 0);

    c.batch_execute("RESET lambdastore.max_module_size").unwrap();
    deploy_example(&mut c, &app, "micro");
}

#[test]
fn redeploying_the_running_bytes_is_unchanged_and_still_the_owners() {
    let role = TestRole::new("redeploy_same");
    let mut admin = connect();
    let app = app("redeploy_same");
    let first = deploy_example(&mut admin, &app, "micro");
    let again = deploy_example(&mut admin, &app, "micro");
    assert_eq!(again["unchanged"], json!(true));
    assert_eq!((&again["version"], &again["module_id"]), (&first["version"], &first["module_id"]));
    assert_eq!(module_rows(&mut admin, &app), 1);
    // The shortcut comes after the ownership check.
    let mut c = role.connect();
    expect_sqlstate(deploy(&mut c, &app, &example("micro")), "42501");
}

// 7. The size of a description.

/// A module describing `types` types of 50 methods with names of about
/// 120 bytes: about 6.5 kB of names per type.
fn describing_many(types: usize) -> Vec<u8> {
    let functions: &'static [rogue::Function] = (0..50)
        .map(|i| {
            let name: &'static str = format!("method_{i:02}_{}", "x".repeat(110)).leak();
            (name, rogue::Kind::Method, false, false)
        })
        .collect::<Vec<_>>()
        .leak();
    let names: Vec<String> = (0..types).map(|i| format!("Type{i}")).collect();
    let described: Vec<(&str, &[rogue::Function])> = names.iter().map(|n| (n.as_str(), functions)).collect();
    rogue::describing(&described)
}

#[test]
fn a_description_over_1_mib_is_refused() {
    let mut c = connect();
    // Control: 20 types (130 kB of names) are accepted.
    let small = app("description_ok");
    deploy(&mut c, &small, &describing_many(20)).unwrap_or_else(|e| panic!("deploy: {}", describe(&e)));
    // 200 types: 1.3 MB of names.
    let big = app("description_big");
    let message = expect_sqlstate(deploy(&mut c, &big, &describing_many(200)), "42P13");
    assert!(message.contains("description"), "{message}");
    assert_eq!(module_rows(&mut c, &big), 0);
}

// 8. Jobs: spawns per workflow, fairness between applications.

#[test]
fn spawning_past_max_spawns_is_54000_and_spawns_nothing() {
    let (mut c, _, id) = micro_object("spawn_limit");
    let message = fails_cleanly(&mut c, id, "spawn_many", json!({"count": 1001, "method": "now"}), "54000");
    assert!(message.contains("lambdastore.max_spawns"), "{message}");
    assert_eq!(jobs_of(&mut c, id), 0);

    assert_eq!(call(&mut c, id, "spawn_many", json!({"count": 10, "method": "now"})), json!(10));
    assert_eq!(jobs_of(&mut c, id), 10);
}

/// A spawned call's arguments are server memory until the workflow
/// commits, as written values are: they count against max_write_size
/// (54000). Counted only by max_spawns, a thousand spawns of one 1 MB
/// argument took a backend past 3 GB, outside the lambda's memory limit.
#[test]
fn spawned_arguments_past_max_write_size_are_54000_and_spawn_nothing() {
    let (mut c, _, id) = micro_object("spawn_bytes");
    c.batch_execute("SET lambdastore.max_write_size = '100kB'").unwrap();
    let spawn = |pad: usize| json!({"target": id, "method": "now", "args": {"pad": "x".repeat(pad)}, "fail": false});
    let message = fails_cleanly(&mut c, id, "spawn_then", spawn(200_000), "54000");
    assert!(message.contains("spawned calls") && message.contains("lambdastore.max_write_size"), "{message}");
    assert_eq!(jobs_of(&mut c, id), 0);
    call(&mut c, id, "spawn_then", spawn(50_000));
    assert_eq!(jobs_of(&mut c, id), 1);
}

fn jobs_of(c: &mut Client, object: i64) -> i64 {
    c.query_one("SELECT count(*) FROM lambdastore.jobs WHERE object_id = $1", &[&object]).unwrap().get(0)
}

/// Deletes an application's queued jobs when dropped, so that a flood
/// does not outlive its test (and slow the test binaries after it).
struct DropQueued(String);

impl Drop for DropQueued {
    fn drop(&mut self) {
        let _ = connect().execute("DELETE FROM lambdastore.jobs WHERE app = $1 AND state = 'queued'", &[&self.0]);
    }
}

#[test]
fn a_flood_of_jobs_does_not_starve_another_application() {
    let (mut a, flooding, object_a) = micro_object("flood_a");
    let _cleanup = DropQueued(flooding.clone());
    let (mut b, _, object_b) = micro_object("flood_b");
    // `now` writes nothing, so the flood's jobs never conflict (a conflict
    // would push a job back, and let others pass it).
    let queued: i64 = a
        .query_one("SELECT count(lambdastore.submit($1, 'now')) FROM generate_series(1, 3000) g", &[&object_a])
        .unwrap()
        .get(0);
    assert_eq!(queued, 3000);

    let job = submit(&mut b, object_b, "put", json!({"key": "k", "value": "v"}), None).unwrap();
    let outcome = wait_job(&mut b, job, 30).unwrap();
    let depth: i64 = a
        .query_one("SELECT count(*) FROM lambdastore.jobs WHERE app = $1 AND state = 'queued'", &[&flooding])
        .unwrap()
        .get(0);
    assert_eq!(outcome.state, "done", "the other application's job did not run within 30 s: {outcome:?}");
    assert!(depth > 1000, "the other application's job ran only after the flood ({depth} of 3000 jobs left)");
}

// 9, 10. Names with a NUL byte, READ ONLY, PREPARE, overflow.

#[test]
fn a_field_name_with_a_nul_byte_is_22023() {
    let (mut c, _, id) = micro_object("nul_field");
    call(&mut c, id, "put_raw", json!({"field": "kv", "key": "raw", "value": "v"}));
    // "kv\0evil": JSON arguments cannot carry a NUL, so the guest builds it.
    let field = json!({"field_codes": [107, 118, 0, 101, 118, 105, 108], "key": "k", "value": "v"});
    fails_cleanly(&mut c, id, "put_raw", field, "22023");
}

#[test]
fn a_type_name_with_a_nul_byte_is_42p13() {
    let mut c = connect();
    let app = app("nul_type");
    let module = rogue::describing(&[("bad\0type", rogue::FUNCTIONS)]);
    let message = expect_sqlstate(deploy(&mut c, &app, &module), "42P13");
    assert!(message.contains("NUL"), "{message}");
    assert_eq!(module_rows(&mut c, &app), 0);
}

#[test]
fn a_writing_call_in_a_read_only_transaction_is_25006() {
    let (_, _, id) = micro_object("read_only");
    let (mut c, notices) = connect_keeping_notices();
    c.batch_execute("BEGIN READ ONLY").unwrap();
    let err = invoke(&mut c, id, "put", json!({"key": "k", "value": "v"})).expect_err("put in READ ONLY");
    c.batch_execute("ROLLBACK").unwrap();
    let db = err.as_db_error().unwrap_or_else(|| panic!("{err}"));
    assert_eq!(db.code().code(), "25006", "{}", describe(&err));
    // What the user reads, not the extension's insides.
    let detail = db.detail().unwrap_or_default();
    for inside in ["backtrace", "rust_begin_unwind", "at /"] {
        assert!(!detail.contains(inside), "the DETAIL shows {inside:?}: {detail}");
    }
    assert!(detail.len() < 500, "the DETAIL is {} bytes: {detail}", detail.len());

    // Refused before it runs, also when it would not write this time.
    c.batch_execute("BEGIN READ ONLY").unwrap();
    let logged = invoke(&mut c, id, "log_many", json!({"count": 1, "message": "ran"}));
    c.batch_execute("ROLLBACK").unwrap();
    expect_sqlstate(logged, "25006");
    assert!(notices.lock().unwrap().is_empty(), "the refused function ran");

    c.batch_execute("BEGIN READ ONLY").unwrap();
    assert_eq!(call(&mut c, id, "get", json!({"key": "k"})), json!(null));
    c.batch_execute("COMMIT").unwrap();
}

/// Rolls back a prepared transaction that a failed test left behind: it
/// would hold its locks until someone did.
struct RollbackPrepared(String);

impl Drop for RollbackPrepared {
    fn drop(&mut self) {
        let mut admin = connect();
        let left = admin.query_opt("SELECT 1 FROM pg_prepared_xacts WHERE gid = $1", &[&self.0]);
        if matches!(left, Ok(Some(_))) {
            let _ = admin.batch_execute(&format!("ROLLBACK PREPARED '{}'", self.0));
        }
    }
}

/// A prepared transaction keeps counting as the writer of its entry sets
/// until COMMIT PREPARED, which runs no commit callback (txn/prepared.rs):
/// a reader in between fails validation instead of reading the old value
/// as current, and after the commit the reader sees the new one.
#[test]
fn a_prepared_transaction_keeps_its_entry_sets_until_it_commits() {
    let (mut c, _, id) = micro_object("prepare");
    let max: String = c.query_one("SHOW max_prepared_transactions", &[]).unwrap().get(0);
    if max == "0" {
        eprintln!("skipped: max_prepared_transactions = 0, so PREPARE TRANSACTION fails before the extension sees it");
        return;
    }
    let gid = app("prepare_gid");
    let _cleanup = RollbackPrepared(gid.clone());
    c.batch_execute("BEGIN").unwrap();
    call(&mut c, id, "put", json!({"key": "k", "value": "prepared"}));
    c.batch_execute(&format!("PREPARE TRANSACTION '{gid}'")).unwrap();
    let mut reader = connect();
    let message = expect_sqlstate(invoke(&mut reader, id, "get", json!({"key": "k"})), "40001");
    assert!(message.contains(&format!("held by prepared transaction '{gid}'")), "{message}");
    c.batch_execute(&format!("COMMIT PREPARED '{gid}'")).unwrap();
    assert_eq!(call(&mut reader, id, "get", json!({"key": "k"})), json!("prepared"));
    let left: i64 = c.query_one("SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", &[&gid]).unwrap().get(0);
    assert_eq!(left, 0);
}

/// A deploy may be part of a prepared transaction (Citus commits every
/// change that reaches several nodes so). COMMIT PREPARED, run by another
/// session, runs no commit callback here, yet a backend that cached the
/// old code runs the new one from its next call on (catalog/cache.rs).
#[test]
fn a_deploy_committed_by_commit_prepared_reaches_cached_backends() {
    let (mut c, app) = deployed("prepared_deploy", "counter");
    let max: String = c.query_one("SHOW max_prepared_transactions", &[]).unwrap().get(0);
    if max == "0" {
        eprintln!("skipped: max_prepared_transactions = 0, so PREPARE TRANSACTION fails before the extension sees it");
        return;
    }
    let mut other = connect();
    let counter = create(&mut other, &app, "Counter", json!({}));
    assert_eq!(call(&mut other, counter, "get", json!({})), json!(0));

    let gid = format!("{app}_gid");
    let _cleanup = RollbackPrepared(gid.clone());
    c.batch_execute("BEGIN").unwrap();
    deploy_example(&mut c, &app, "micro"); // no type Counter
    c.batch_execute(&format!("PREPARE TRANSACTION '{gid}'")).unwrap();
    assert_eq!(call(&mut other, counter, "get", json!({})), json!(0), "the prepared deploy is not visible yet");
    connect().batch_execute(&format!("COMMIT PREPARED '{gid}'")).unwrap();
    expect_sqlstate(invoke(&mut other, counter, "get", json!({})), "42704");
}

#[test]
fn incrementing_past_i64_max_is_p0001_and_keeps_the_value() {
    let (mut c, app) = deployed("overflow", "counter");
    let counter = create(&mut c, &app, "Counter", json!({"initial": i64::MAX}));
    let message = fails_cleanly(&mut c, counter, "increment", json!({}), "P0001");
    assert!(message.contains("overflow"), "{message}");
    assert_eq!(call(&mut c, counter, "get", json!({})), json!(i64::MAX));
}

// 11. Readers beside an idle writer.

/// Pinned, documented behaviour (docs/sql-api.md, "Readers beside an idle writer"):
/// a transaction that ran a writing call holds its entry sets until it
/// ends, and a workflow reading them meanwhile fails with 40001, even a
/// read-only one and even while the writer sits idle, because the writer's
/// count in shared memory cannot tell an idle writer from one whose commit
/// is under way. Retried after the commit, the read succeeds.
#[test]
fn a_reader_fails_behind_an_idle_writer_until_it_commits() {
    let (mut writer, _, id) = micro_object("idle_writer");
    let mut reader = connect();
    assert_eq!(call(&mut reader, id, "get", json!({"key": "k"})), Value::Null);

    writer.batch_execute("BEGIN").unwrap();
    call(&mut writer, id, "put", json!({"key": "k", "value": "written"}));
    // The writer is now idle in its transaction.
    expect_sqlstate(invoke(&mut reader, id, "get", json!({"key": "k"})), "40001");

    writer.batch_execute("COMMIT").unwrap();
    assert_eq!(call(&mut reader, id, "get", json!({"key": "k"})), json!("written"));
}

/// Privilege answers are cached per backend, so they must never come from
/// rows that may roll back: a role that created an application (and used
/// its ownership) in a transaction that rolled back must not keep it once
/// another role has created that name for real (creating an application
/// through an API key bumps no catalog generation).
#[test]
fn ownership_from_a_rolled_back_transaction_is_not_remembered() {
    let role = TestRole::new("rolled_back_owner");
    let app = app("rolled_back");
    let mut c = role.connect();
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT lambdastore.create_api_key($1)", &[&app]).unwrap();
    grant(&mut tx, &app, &role.name, "read").unwrap(); // checks, and may cache, ownership
    tx.rollback().unwrap();

    connect().execute("SELECT lambdastore.create_api_key($1)", &[&app]).unwrap(); // owned by postgres
    expect_sqlstate(grant(&mut c, &app, &role.name, "invoke"), "42501");
    assert!(!has_app_privilege(&mut c, &app, "owner"));
}
