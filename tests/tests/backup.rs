//! Nothing lost across a logical backup (issue 42): `pg_dump` keeps every
//! row of the extension's tables (they are marked with
//! `pg_extension_config_dump`, extension/sql/schema.sql), and `pg_restore` (custom
//! format) or `psql` (plain) gives back a database that works.

mod common;

use common::*;
use postgres::Client;
use serde_json::json;
use std::process::Command;

/// The extension's tables and sequences that hold data.
const TABLES: &[&str] = &[
    "applications",
    "modules",
    "object_types",
    "grants",
    "objects",
    "entries",
    "entry_sets",
    "jobs",
    "job_keys",
    "api_keys",
    "idempotency_keys",
];

/// A digest of every row of every table, in key order.
fn contents(c: &mut Client) -> Vec<(String, i64, String)> {
    TABLES
        .iter()
        .map(|table| {
            let row = c
                .query_one(
                    &format!(
                        "SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
                           FROM lambdastore.{table} t"
                    ),
                    &[],
                )
                .unwrap();
            (table.to_string(), row.get(0), row.get(1))
        })
        .collect()
}

/// The test server's connection string for database `name`.
fn conninfo(name: &str) -> String {
    format!("{} dbname={name}", std::env::var("LAMBDASTORE_TEST_URL").unwrap())
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_dump_restores_every_row_and_the_restored_database_works() {
    let role = TestRole::new("dump");
    let source = ScratchDatabase::new("dump_src");
    let mut c = source.connect();
    c.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    deploy(&mut c, "counter", &example("counter")).unwrap();
    deploy(&mut c, "counter", &example("micro")).unwrap(); // a second version
    deploy(&mut c, "counter", &example("counter")).unwrap(); // and back: three rows of modules
    let a = create(&mut c, "counter", "Counter", json!({}));
    let b = create(&mut c, "counter", "Counter", json!({}));
    for _ in 0..3 {
        call(&mut c, a, "increment", json!({}));
    }
    grant(&mut c, "counter", &role.name, "invoke").unwrap();
    let key: String = c.query_one("SELECT api_key FROM lambdastore.create_api_key('counter')", &[]).unwrap().get(0);
    // An idempotency key's stored response, and a job queued (no runner
    // serves this database, so it stays queued through the dump).
    c.query("SELECT * FROM lambdastore._call('counter', 'once', jsonb_build_array('invoke', $1::int8, 'increment', '{}'::jsonb))", &[&b])
        .unwrap();
    let job = submit(&mut c, b, "increment", json!({}), Some("job-key")).unwrap();
    let before = contents(&mut c);
    assert!(before.iter().all(|(table, rows, _)| *rows > 0 || table == "job_keys"), "{before:?}");

    let dump = std::env::temp_dir().join(format!("lambdastore_dump_{}", std::process::id()));
    let dump = dump.to_str().unwrap();
    for format in ["custom", "plain"] {
        let target = ScratchDatabase::new(&format!("dump_{format}"));
        run("pg_dump", &["-d", &conninfo(&source.name), "--format", format, "--file", dump]);
        let warnings = match format {
            "custom" => run("pg_restore", &["-d", &conninfo(&target.name), "--exit-on-error", dump]),
            _ => run("psql", &["-d", &conninfo(&target.name), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", dump]),
        };
        let mut r = target.connect();
        assert_eq!(contents(&mut r), before, "{format}: the restored rows differ ({warnings})");

        // The restored database works: calls, new objects after the
        // restored ids, the key, the idempotency key's answer, the job.
        assert_eq!(call(&mut r, a, "get", json!({})), json!(3), "{format}");
        let c3 = create(&mut r, "counter", "Counter", json!({}));
        assert!(c3 > b, "{format}: a new object got id {c3}, not after the restored {b}");
        let app: String = r.query_one("SELECT lambdastore._api_key_app($1)", &[&key]).unwrap().get(0);
        assert_eq!(app, "counter");
        let replayed: bool = r
            .query_one(
                "SELECT replayed FROM lambdastore._call('counter', 'once', jsonb_build_array('invoke', $1::int8, 'increment', '{}'::jsonb))",
                &[&b],
            )
            .unwrap()
            .get(0);
        assert!(replayed, "{format}: the idempotency key's stored answer was lost");
        let same_job = submit(&mut r, b, "increment", json!({}), Some("job-key")).unwrap();
        assert_eq!(same_job, job, "{format}: the job's idempotency key names another job");
        let state: String =
            r.query_one("SELECT state FROM lambdastore.jobs WHERE job_id = $1", &[&job]).unwrap().get(0);
        assert_eq!(state, "queued", "{format}");
    }
    let _ = std::fs::remove_file(dump);
}

/// A dump restored into another server brings that server's role OIDs
/// (catalog/grants.rs, "roles_from"): here they name other roles or none.
/// Faked on this server: the restored database says it comes from another
/// server (its `roles_from` holds another's identifier), and its OIDs are
/// changed to what the old server had given: alice's is eve's here, and
/// she was renamed there after she took the application (stored under
/// both names); bob's and carol's are each other's; a stranger's is no
/// one's. Until a superuser adopts the roles by name, whatever acts on a
/// stored role refuses (55000), eve first of all, and so it does while a
/// restore has loaded the applications but not `roles_from`, and after an
/// adopt that rolled back. After, everyone is themselves again, the
/// bootstrap superuser's job stays, and the stranger's job is cancelled.
#[test]
fn roles_restored_from_another_server_act_only_once_adopted_by_name() {
    let roles = ["alice", "bob", "carol", "eve"].map(TestRole::new);
    let source = ScratchDatabase::new("roles_src");
    let [alice, bob, carol, eve] = &roles;
    let mut c = source.connect();
    c.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    deploy(&mut c, "counter", &example("counter")).unwrap();
    c.execute("SELECT lambdastore.set_owner('counter', $1::text::regrole)", &[&alice.name]).unwrap();
    grant(&mut c, "counter", &bob.name, "invoke").unwrap();
    grant(&mut c, "counter", &carol.name, "invoke").unwrap();
    let a = create(&mut c, "counter", "Counter", json!({}));
    let later = "SELECT lambdastore.submit($1, 'increment', '{}', run_at => now() + interval '1 hour')";
    // Two jobs of the tests' superuser, the bootstrap one (OID 10 on every
    // server); one of them will come from a role no name is stored for.
    let superusers: i64 = c.query_one(later, &[&a]).unwrap().get(0);
    let strangers: i64 = c.query_one(later, &[&a]).unwrap().get(0);
    let dump = std::env::temp_dir().join(format!("lambdastore_roles_{}", std::process::id()));
    let dump = dump.to_str().unwrap();
    run("pg_dump", &["-d", &conninfo(&source.name), "--format", "custom", "--file", dump]);
    let target = ScratchDatabase::new("roles_dst");
    run("pg_restore", &["-d", &conninfo(&target.name), "--exit-on-error", dump]);
    let _ = std::fs::remove_file(dump);

    let mut r = target.connect();
    let [alice_oid, bob_oid, carol_oid, eve_oid] = roles.each_ref().map(|role| role.oid(&mut r));
    let names: Vec<&str> = roles.iter().map(|role| role.name.as_str()).collect();
    r.batch_execute(&format!("GRANT USAGE ON SCHEMA lambdastore TO {}", names.join(", "))).unwrap();
    let increment = "SELECT lambda_invoke($1, 'increment')::text";
    let refused = |role: &TestRole| {
        let message = expect_sqlstate(target.connect_as(&role.name).query_one(increment, &[&a]), "55000");
        assert!(message.contains("adopt_restored_roles"), "{}: {message}", role.name);
    };
    // Bob's job, queued while he could; then a restore that has loaded the
    // applications but not yet roles_from.
    let bobs: i64 = target.connect_as(&bob.name).query_one(later, &[&a]).unwrap().get(0);
    r.batch_execute("DELETE FROM lambdastore.roles_from").unwrap();
    refused(eve);
    // The other server's identifier and OIDs.
    let nobody = 4_000_000_000u32;
    r.batch_execute(&format!(
        "INSERT INTO lambdastore.roles_from VALUES (42);
         UPDATE lambdastore.applications SET owner = {eve_oid}, owner_name = '{alice}_was';
         INSERT INTO lambdastore.grants VALUES ('counter', {eve_oid}, '{alice}', 'read');
         UPDATE lambdastore.grants SET grantee = {nobody} WHERE grantee = {bob_oid};
         UPDATE lambdastore.grants SET grantee = {bob_oid} WHERE grantee = {carol_oid};
         UPDATE lambdastore.grants SET grantee = {carol_oid} WHERE grantee = {nobody};
         UPDATE lambdastore.jobs SET submitted_by = {carol_oid} WHERE job_id = {bobs};
         UPDATE lambdastore.jobs SET submitted_by = {nobody} WHERE job_id = {strangers};",
        alice = alice.name
    ))
    .unwrap();
    for role in &roles {
        refused(role);
    }
    let adopt = "SELECT role_name::text, restored_oid, local_oid FROM lambdastore.adopt_restored_roles()";
    expect_sqlstate(target.connect_as(&eve.name).query(adopt, &[]), "42501");
    // An adopt rolled back, in a session that saw the roles as this
    // server's inside it.
    r.batch_execute("BEGIN").unwrap();
    r.query(adopt, &[]).unwrap();
    r.query_one(later, &[&a]).unwrap(); // a job queued: its role checked, after the adopt
    r.batch_execute("ROLLBACK").unwrap();
    r.batch_execute(&format!("SET ROLE {}", eve.name)).unwrap();
    let take = "SELECT lambdastore.set_owner('counter', current_user::regrole)";
    expect_sqlstate(r.query_one(take, &[]), "55000");
    r.batch_execute("RESET ROLE").unwrap();

    let adopted: Vec<(String, u32, u32)> =
        r.query(adopt, &[]).unwrap().iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect();
    let bootstrap: String = r.query_one("SELECT rolname::text FROM pg_roles WHERE oid = 10", &[]).unwrap().get(0);
    let mut expected = vec![
        (alice.name.clone(), eve_oid, alice_oid),
        (bob.name.clone(), carol_oid, bob_oid),
        (carol.name.clone(), bob_oid, carol_oid),
        (bootstrap, 10, 10),
    ];
    expected.sort();
    assert_eq!(adopted, expected);

    let owner: String = r.query_one("SELECT owner_name::text FROM lambdastore.applications", &[]).unwrap().get(0);
    assert_eq!(owner, alice.name, "the owner under the name it has here");
    for (n, role) in [alice, bob, carol].into_iter().enumerate() {
        assert_eq!(call(&mut target.connect_as(&role.name), a, "increment", json!({})), json!(n + 1), "{}", role.name);
    }
    expect_sqlstate(target.connect_as(&eve.name).query_one(increment, &[&a]), "42501");
    let job = |r: &mut Client, id: i64| -> (String, u32) {
        let row = r.query_one("SELECT state, submitted_by FROM lambdastore.jobs WHERE job_id = $1", &[&id]).unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(job(&mut r, bobs), ("queued".to_string(), bob_oid), "bob's job runs as bob");
    assert_eq!(job(&mut r, superusers), ("queued".to_string(), 10), "the bootstrap superuser's job");
    assert_eq!(job(&mut r, strangers), ("cancelled".to_string(), 0), "no name was stored for its role");
    assert!(r.query(adopt, &[]).unwrap().is_empty(), "adopted once");

    // PostgreSQL is told again which roles the rows use, which a dump does
    // not carry (catalog/grants.rs, `mark_roles`): alice owns, bob and
    // carol (and alice) were granted, eve is no one here.
    let marked = "SELECT refobjid::regrole::text FROM pg_shdepend
                   WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND objid = 'lambdastore.applications'::regclass ORDER BY 1";
    let marked: Vec<String> = r.query(marked, &[]).unwrap().iter().map(|row| row.get(0)).collect();
    let mut expected = vec![alice.name.clone(), bob.name.clone(), carol.name.clone()];
    expected.sort();
    assert_eq!(marked, expected);
}

/// The name stored beside an owner's and a grantee's OID follows `ALTER
/// ROLE ... RENAME` (catalog/grants.rs, `role_renamed`): it is what maps
/// the OID after a restore into another server, and what decides on a
/// Citus cluster. Before, the old name stayed, and an adopt took whoever
/// had it there.
#[test]
fn a_renamed_owner_and_grantee_are_stored_under_their_new_names() {
    let (owner, grantee) = (TestRole::new("renamed_owner"), TestRole::new("renamed_grantee"));
    let db = ScratchDatabase::new("renamed");
    let mut c = db.connect();
    c.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    deploy(&mut c, "counter", &example("counter")).unwrap();
    c.execute("SELECT lambdastore.set_owner('counter', $1::text::regrole)", &[&owner.name]).unwrap();
    grant(&mut c, "counter", &grantee.name, "invoke").unwrap();
    let stored = |c: &mut Client| -> (String, String) {
        let row = c
            .query_one(
                "SELECT a.owner_name::text, g.grantee_name::text
                   FROM lambdastore.applications a JOIN lambdastore.grants g ON g.app = a.name",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let renamed = [&owner, &grantee].map(|role| format!("{}_x", role.name));
    for (role, new) in [&owner, &grantee].iter().zip(&renamed) {
        c.batch_execute(&format!("ALTER ROLE {} RENAME TO {new}", role.name)).unwrap();
    }
    let after = stored(&mut c);
    for (role, new) in [&owner, &grantee].iter().zip(&renamed) {
        c.batch_execute(&format!("ALTER ROLE {new} RENAME TO {}", role.name)).unwrap();
    }
    assert_eq!(after, (renamed[0].clone(), renamed[1].clone()));
    assert_eq!(stored(&mut c), (owner.name.clone(), grantee.name.clone()), "and back");
}

/// What `adopt_restored_roles()` cannot map, it refuses whole, and until a
/// superuser has adopted the roles, the superuser too is refused what
/// stores a role (a grant, a schedule, a key, a job; catalog/grants.rs,
/// `stored_roles_are_ours`): faked as above, a database that says it comes
/// from another server, whose owner's name is no role here (42704), then
/// whose owner's old OID is stored under two names that are both roles
/// here (42710). Neither refusal changes a row.
#[test]
fn adopt_refuses_what_it_cannot_map_and_nothing_stores_a_role_before_it() {
    let [owner, grantee] = ["adopt_owner", "adopt_grantee"].map(TestRole::new);
    let db = ScratchDatabase::new("adopt_refusals");
    let mut c = db.connect();
    c.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    deploy(&mut c, "counter", &example("counter")).unwrap();
    c.execute("SELECT lambdastore.set_owner('counter', $1::text::regrole)", &[&owner.name]).unwrap();
    let a = create(&mut c, "counter", "Counter", json!({}));
    let owner_oid = owner.oid(&mut c);
    c.batch_execute("UPDATE lambdastore.roles_from SET system_identifier = 42").unwrap();

    let stores_a_role = [
        format!("SELECT lambdastore.grant('counter', '{}', 'invoke')", grantee.name),
        format!("SELECT lambdastore.schedule('tick', '* * * * *', {a}, 'increment')"),
        "SELECT * FROM lambdastore.create_api_key('counter')".to_string(),
        format!("SELECT lambdastore.submit({a}, 'increment')"),
    ];
    let not_refused: Vec<String> = stores_a_role
        .iter()
        .filter_map(|statement| match c.query(statement.as_str(), &[]) {
            Err(e)
                if e.as_db_error()
                    .is_some_and(|db| db.code().code() == "55000" && db.message().contains("adopt_restored_roles")) =>
            {
                None
            }
            other => Some(format!("{statement}: {other:?}")),
        })
        .collect();
    assert!(not_refused.is_empty(), "{not_refused:#?}");

    let adopt = "SELECT role_name::text FROM lambdastore.adopt_restored_roles()";
    let stored = |c: &mut Client| -> (Vec<i64>, String, i64) {
        let row = c
            .query_one(
                "SELECT array_agg(f.system_identifier), a.owner_name::text, count(g.*)
                   FROM lambdastore.roles_from f, lambdastore.applications a
                   LEFT JOIN lambdastore.grants g ON g.app = a.name GROUP BY a.owner_name",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    c.batch_execute("UPDATE lambdastore.applications SET owner_name = 'adopt_nobody_here'").unwrap();
    let before = stored(&mut c);
    let message = expect_sqlstate(c.query(adopt, &[]), "42704");
    assert!(message.contains(&format!("adopt_nobody_here (stored as OID {owner_oid})")), "{message}");
    assert_eq!(stored(&mut c), before, "nothing changed");

    c.batch_execute(&format!(
        "UPDATE lambdastore.applications SET owner_name = '{owner}';
         INSERT INTO lambdastore.grants VALUES ('counter', {owner_oid}, '{grantee}', 'read')",
        owner = owner.name,
        grantee = grantee.name
    ))
    .unwrap();
    let before = stored(&mut c);
    let message = expect_sqlstate(c.query(adopt, &[]), "42710");
    let (first, second) = if owner.name < grantee.name { (&owner, &grantee) } else { (&grantee, &owner) };
    let twice = format!("OID {owner_oid} is stored as {} and {}", first.name, second.name);
    assert!(message.contains(&twice), "{message}");
    assert_eq!(stored(&mut c), before, "nothing changed");

    c.batch_execute("DELETE FROM lambdastore.grants").unwrap();
    let adopted: Vec<String> = c.query(adopt, &[]).unwrap().iter().map(|row| row.get(0)).collect();
    assert!(adopted.contains(&owner.name), "{adopted:?}");
    for statement in &stores_a_role {
        c.query(statement.as_str(), &[]).unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}
