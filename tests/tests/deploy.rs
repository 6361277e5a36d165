//! `lambdastore.deploy`: what it registers, versions, switching code, and
//! what it refuses.

mod common;

use common::*;
use postgres::Client;
use serde_json::{json, Value};

/// The same component with a custom section appended: other bytes, same
/// code.
fn with_custom_section(mut wasm: Vec<u8>, name: &str, payload: &[u8]) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut contents = Vec::new();
    leb128(name.len(), &mut contents);
    contents.extend_from_slice(name.as_bytes());
    contents.extend_from_slice(payload);
    wasm.push(0); // custom section id
    leb128(contents.len(), &mut wasm);
    wasm.extend_from_slice(&contents);
    wasm
}

fn application_rows(c: &mut postgres::Client, app: &str) -> i64 {
    c.query_one("SELECT count(*) FROM lambdastore.applications WHERE name = $1", &[&app]).unwrap().get(0)
}

fn function<'a>(deployed: &'a Value, ty: &str, name: &str) -> &'a Value {
    let types = deployed["types"].as_array().expect("types is a list");
    let t = types.iter().find(|t| t["name"] == ty).unwrap_or_else(|| panic!("no type {ty} in {deployed}"));
    let functions = t["functions"].as_array().expect("functions is a list");
    functions.iter().find(|f| f["name"] == name).unwrap_or_else(|| panic!("no function {ty}.{name} in {t}"))
}

#[test]
fn deploy_returns_what_it_registered() {
    let mut c = connect();
    let app = app("deploy_returns");
    let deployed = deploy_example(&mut c, &app, "counter");

    assert_eq!(deployed["app"], json!(app));
    assert_eq!(deployed["version"], json!(1));
    assert_eq!(deployed["unchanged"], json!(false));
    assert_eq!(deployed["types_dropped"], json!([]));
    let sha256 = deployed["sha256"].as_str().unwrap();
    assert!(sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()), "{sha256}");
    assert_eq!(
        function(&deployed, "Counter", "new"),
        &json!({"name": "new", "kind": "constructor", "protected": false, "readonly": false})
    );
    assert_eq!(
        function(&deployed, "Counter", "get"),
        &json!({"name": "get", "kind": "method", "protected": false, "readonly": true})
    );
    assert_eq!(function(&deployed, "Counter", "add")["readonly"], json!(false));

    // The catalog says the same.
    let row = c
        .query_one(
            "SELECT a.module_id, m.version, m.sha256 FROM lambdastore.applications a
               JOIN lambdastore.modules m USING (module_id) WHERE a.name = $1",
            &[&app],
        )
        .unwrap();
    assert_eq!(json!(row.get::<_, i64>(0)), deployed["module_id"]);
    assert_eq!(row.get::<_, i32>(1), 1);
    assert_eq!(row.get::<_, String>(2), sha256);
    let types: Vec<String> = c
        .query("SELECT type_name FROM lambdastore.object_types WHERE app = $1", &[&app])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(types, ["Counter"]);
}

#[test]
fn redeploying_the_same_bytes_changes_nothing() {
    let mut c = connect();
    let app = app("deploy_same");
    let first = deploy_example(&mut c, &app, "counter");
    let second = deploy_example(&mut c, &app, "counter");

    assert_eq!(second["unchanged"], json!(true));
    assert_eq!(second["version"], first["version"]);
    assert_eq!(second["module_id"], first["module_id"]);
    assert_eq!(module_rows(&mut c, &app), 1);
}

#[test]
fn other_bytes_of_the_same_code_bump_the_version() {
    let mut c = connect();
    let app = app("deploy_bump");
    let first = deploy_example(&mut c, &app, "counter");
    let id = create(&mut c, &app, "Counter", json!({"initial": 7}));

    // A custom section changes the bytes (and the hash) but not the code.
    let modified = with_custom_section(example("counter"), "lambdastore-test", b"v2");
    let second = deploy(&mut c, &app, &modified).unwrap();

    assert_eq!(second["unchanged"], json!(false));
    assert_eq!(second["version"], json!(2));
    assert_ne!(second["module_id"], first["module_id"]);
    assert_ne!(second["sha256"], first["sha256"]);
    assert_eq!(module_rows(&mut c, &app), 2);
    // Objects keep their data across versions.
    assert_eq!(call(&mut c, id, "get", json!({})), json!(7));
}

/// A compile stops at a cancel (runtime/artifacts.rs,
/// `compile_unless_canceled`): a deploy of bytes never compiled here (a
/// Python guest: 4–16 s) ends at its `statement_timeout` with 57014 while
/// its compile goes on, on a thread of the backend that the statement did
/// not wait for; nothing is registered, and the session goes on. Before,
/// the timeout could only act once the compile was over.
#[test]
fn a_deploy_ends_at_its_statement_timeout_while_it_compiles() {
    let mut c = connect();
    let app = app("deploy_timeout");
    let pid = backend_pid(&mut c);
    let bytes = with_custom_section(example("py_counter"), "lambdastore-test", app.as_bytes());
    c.batch_execute("SET statement_timeout = '1s'").unwrap();
    let message = expect_sqlstate(deploy(&mut c, &app, &bytes), "57014");
    let compiling = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == "lambdastore-com")
        })
        .count();
    assert_eq!(compiling, 1, "the compile goes on without the statement ({message})");
    c.batch_execute("RESET statement_timeout").unwrap();
    assert_eq!(application_rows(&mut c, &app), 0, "nothing registered");
}

/// A version whose code was compiled before takes most of its functions
/// from `lambdastore/functions` (Cranelift's incremental cache) instead of
/// compiling them again; the deploy says how many at DEBUG1.
#[test]
fn a_new_version_takes_the_functions_compiled_for_an_earlier_one() {
    let (mut c, notices) = connect_keeping_notices();
    c.batch_execute("SET client_min_messages = debug1").unwrap();
    let app = app("deploy_functions");
    // Bytes no other test deploys, so that each deploy compiles (the
    // artifact cache would have a module deployed before).
    for version in ["v1", "v2"] {
        let bytes = with_custom_section(example("counter"), "lambdastore-test", format!("{app} {version}").as_bytes());
        deploy(&mut c, &app, &bytes).unwrap();
    }
    let compiles: Vec<(u64, u64)> = notices
        .lock()
        .unwrap()
        .iter()
        .filter_map(|notice| {
            let message = notice.message();
            let counts = message.strip_prefix("lambdastore: module compiled in ")?.split_once(", ")?.1;
            let (reused, total) = counts.strip_suffix(" functions from lambdastore/functions")?.split_once(" of ")?;
            Some((reused.parse().ok()?, total.parse().ok()?))
        })
        .collect();
    assert_eq!(compiles.len(), 2, "one compile per deploy: {compiles:?}");
    // Not all: Cranelift keeps no entry for some (590 of 631 reused here).
    let (reused, total) = compiles[1];
    assert!(total > 0 && reused * 5 >= total * 4, "the second version reused {reused} of {total} functions");
}

#[test]
fn redeploy_switches_the_code_of_new_calls() {
    let (mut c, app) = deployed("deploy_switch", "counter");
    let counter = create(&mut c, &app, "Counter", json!({}));
    assert_eq!(call(&mut c, counter, "increment", json!({})), json!(1));

    // The application now runs micro's code, which has no type Counter:
    // the deploy warns that the counter is left without code.
    let (mut watched, notices) = connect_keeping_notices();
    let deployed = deploy_example(&mut watched, &app, "micro");
    assert_eq!(deployed["version"], json!(2));
    assert_eq!(deployed["types_dropped"], json!([{"type": "Counter", "objects": 1}]));
    let warned = notices.lock().unwrap().iter().any(|notice| {
        notice.code().code() == "01000" && notice.message().contains("has no type \"Counter\": its 1 object(s)")
    });
    assert!(warned, "no warning of the Counter left without code: {:?}", notices.lock().unwrap());

    expect_sqlstate(invoke(&mut c, counter, "get", json!({})), "42704");
    expect_sqlstate(create_object(&mut c, &app, "Counter", json!({})), "42704");
    invoke_static(&mut c, &app, "Bench", "version", json!({}))
        .unwrap_or_else(|e| panic!("Bench.version after the redeploy: {}", describe(&e)));
}

#[test]
fn a_redeploy_is_seen_by_other_connections() {
    let mut c = connect();
    let mut other = connect();
    let app = app("deploy_other_conn");
    deploy_example(&mut c, &app, "counter");
    // `other` loads version 1 into its backend's cache first.
    let counter = create(&mut other, &app, "Counter", json!({}));
    assert_eq!(call(&mut other, counter, "get", json!({})), json!(0));

    deploy_example(&mut c, &app, "micro");

    expect_sqlstate(invoke(&mut other, counter, "get", json!({})), "42704");
    invoke_static(&mut other, &app, "Bench", "version", json!({}))
        .unwrap_or_else(|e| panic!("Bench.version from another connection: {}", describe(&e)));
}

/// Backends cache each object's application and type and each
/// application's module; a delete committed elsewhere must reach them.
/// A workflow pins the code version of every application it calls at
/// its first call there: a redeploy of that application in the middle of
/// the workflow (here, one that drops the type) reaches only new workflows.
#[test]
fn a_workflow_runs_one_version_of_each_application_it_calls() {
    let (mut c, _, caller) = micro_object("pinned_caller");
    let counters = app("pinned_counters");
    deploy_example(&mut c, &counters, "counter");
    let counter = create(&mut c, &counters, "Counter", json!({"initial": 7}));

    // The workflow waits for the object-id sequence between its two calls.
    let mut sequence = connect();
    sequence.batch_execute("BEGIN; ALTER SEQUENCE lambdastore.object_id_seq INCREMENT BY 1").unwrap();
    let mut workflow = connect();
    let pid = backend_pid(&mut workflow);
    let twice = json!({"target": counter, "method": "get", "args": {}});
    let running = std::thread::spawn(move || invoke(&mut workflow, caller, "relay_twice", twice));
    wait_until_waiting_for_the_id_sequence(&mut connect(), pid);
    deploy_example(&mut c, &counters, "bank"); // no type Counter any more
    sequence.batch_execute("ROLLBACK").unwrap();

    let result = running.join().unwrap().unwrap_or_else(|e| panic!("relay_twice: {}", describe(&e)));
    assert_eq!(result, json!([7, 7]), "the second call ran another version");
    let message = expect_sqlstate(
        invoke(&mut c, caller, "relay", json!({"target": counter, "method": "get", "args": {}})),
        "P0001",
    );
    assert!(message.contains("Counter"), "a new workflow runs the new version: {message}");
}

#[test]
fn an_object_deleted_by_another_connection_is_gone() {
    let mut c = connect();
    let mut other = connect();
    let app = app("deploy_cache_delete");
    deploy_example(&mut c, &app, "counter");
    let counter = create(&mut c, &app, "Counter", json!({"initial": 3}));
    // `other` remembers the object.
    assert_eq!(call(&mut other, counter, "get", json!({})), json!(3));

    c.execute("SELECT lambdastore.delete_object($1)", &[&counter]).unwrap();

    expect_sqlstate(invoke(&mut other, counter, "get", json!({})), "42704");
}

/// The cache skips the catalog query, not the privilege check: after
/// `SET ROLE` to a role the owner has not granted 'invoke', a call that
/// reads no entries is refused as it was before anything was cached, and a
/// grant or revoke changes the answer at the next call.
#[test]
fn a_cached_object_is_still_refused_to_a_role_without_privileges() {
    let role = TestRole::new("cache_role");
    let (mut c, app) = deployed("deploy_cache_role", "micro");
    let bench = create(&mut c, &app, "Bench", json!({}));
    // Filled by this connection's superuser: `now` reads no entries.
    call(&mut c, bench, "now", json!({}));

    c.batch_execute(&format!("SET ROLE {}", role.name)).unwrap();
    expect_sqlstate(invoke(&mut c, bench, "now", json!({})), "42501");
    c.batch_execute("RESET ROLE").unwrap();
    grant(&mut c, &app, &role.name, "invoke").unwrap();
    c.batch_execute(&format!("SET ROLE {}", role.name)).unwrap();
    call(&mut c, bench, "now", json!({}));
    c.batch_execute("RESET ROLE").unwrap();
    assert!(revoke(&mut c, &app, &role.name, "invoke").unwrap());
    c.batch_execute(&format!("SET ROLE {}", role.name)).unwrap();
    expect_sqlstate(invoke(&mut c, bench, "now", json!({})), "42501");
    c.batch_execute("RESET ROLE").unwrap();
    call(&mut c, bench, "now", json!({}));
}

/// Each backend remembers its privilege answers (access.rs); a privilege
/// taken away in another session, by `lambdastore.revoke` or by revoking
/// membership in the group role it was granted to, must refuse the very
/// next call.
#[test]
fn revoked_privileges_refuse_the_next_call() {
    let group = TestRole::new("revoke_group");
    let member = TestRole::new("revoke_member");
    let mut admin = connect();
    let app = app("deploy_revoke");
    deploy_example(&mut admin, &app, "micro");
    let bench = create(&mut admin, &app, "Bench", json!({}));
    grant(&mut admin, &app, &group.name, "invoke").unwrap();
    let join = format!("GRANT {} TO {}", group.name, member.name);
    admin.batch_execute(&join).unwrap();
    let mut c = connect();
    c.batch_execute(&format!("SET ROLE {}", member.name)).unwrap();
    call(&mut c, bench, "now", json!({}));

    // Out of the group: the group's grant no longer reaches the member.
    admin.batch_execute(&format!("REVOKE {} FROM {}", group.name, member.name)).unwrap();
    expect_sqlstate(invoke(&mut c, bench, "now", json!({})), "42501");

    // Back in the group, then the owner revokes the group's privilege.
    admin.batch_execute(&join).unwrap();
    call(&mut c, bench, "now", json!({}));
    assert!(revoke(&mut admin, &app, &group.name, "invoke").unwrap());
    expect_sqlstate(invoke(&mut c, bench, "now", json!({})), "42501");

    // Granted to the member itself, then revoked.
    grant(&mut admin, &app, &member.name, "invoke").unwrap();
    call(&mut c, bench, "now", json!({}));
    assert!(revoke(&mut admin, &app, &member.name, "invoke").unwrap());
    expect_sqlstate(invoke(&mut c, bench, "now", json!({})), "42501");

    c.batch_execute("RESET ROLE").unwrap();
    call(&mut c, bench, "now", json!({}));
}

/// Rows a transaction wrote itself may roll back, so they are never
/// cached: after the rollback the object is unknown again.
#[test]
fn an_object_of_a_rolled_back_transaction_is_unknown() {
    let (mut c, app) = deployed("deploy_cache_rollback", "counter");

    let mut tx = c.transaction().unwrap();
    let counter = create(&mut tx, &app, "Counter", json!({"initial": 4}));
    assert_eq!(call(&mut tx, counter, "get", json!({})), json!(4));
    tx.rollback().unwrap();

    expect_sqlstate(invoke(&mut c, counter, "get", json!({})), "42704");
}

/// Deleting an object and calling it in the same transaction: the call
/// sees the delete, and after a rollback the object is back.
#[test]
fn a_delete_is_seen_by_its_own_transaction_and_undone_by_rollback() {
    let (mut c, app) = deployed("deploy_cache_own_delete", "counter");
    let counter = create(&mut c, &app, "Counter", json!({"initial": 5}));
    assert_eq!(call(&mut c, counter, "get", json!({})), json!(5));

    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT lambdastore.delete_object($1)", &[&counter]).unwrap();
    let mut inner = tx.transaction().unwrap(); // a savepoint: the error must not end `tx`
    expect_sqlstate(invoke(&mut inner, counter, "get", json!({})), "42704");
    drop(inner);
    tx.rollback().unwrap();

    assert_eq!(call(&mut c, counter, "get", json!({})), json!(5));
}

#[test]
fn a_deploy_takes_effect_when_its_transaction_commits() {
    let mut c = connect();
    let mut other = connect();
    let app = app("deploy_txn");
    deploy_example(&mut c, &app, "counter");
    let counter = create(&mut c, &app, "Counter", json!({"initial": 2}));

    let mut tx = c.transaction().unwrap();
    deploy(&mut tx, &app, &example("micro")).unwrap();
    // Not committed: other sessions still run version 1.
    assert_eq!(call(&mut other, counter, "get", json!({})), json!(2));
    tx.commit().unwrap();

    expect_sqlstate(invoke(&mut other, counter, "get", json!({})), "42704");
}

#[test]
fn a_rolled_back_deploy_leaves_nothing() {
    let (mut c, app) = deployed("deploy_rollback", "counter");
    let counter = create(&mut c, &app, "Counter", json!({}));

    let mut tx = c.transaction().unwrap();
    deploy(&mut tx, &app, &example("micro")).unwrap();
    tx.rollback().unwrap();

    assert_eq!(module_rows(&mut c, &app), 1);
    assert_eq!(call(&mut c, counter, "get", json!({})), json!(0));
    // The next deploy is version 2, as if the rolled-back one never happened.
    assert_eq!(deploy_example(&mut c, &app, "micro")["version"], json!(2));
}

#[test]
fn reinstalling_the_extension_forgets_the_old_code() {
    // Module ids start again at 1 after DROP/CREATE EXTENSION: a backend
    // that ran the old module 1 must not run its code for the new one.
    let db = ScratchDatabase::new("reinstall");
    let mut c = db.connect();
    c.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    deploy_example(&mut c, "old_app", "counter");
    let counter = create(&mut c, "old_app", "Counter", json!({"initial": 7}));
    assert_eq!(call(&mut c, counter, "get", json!({})), json!(7));

    c.batch_execute("DROP EXTENSION lambdastore CASCADE; CREATE EXTENSION lambdastore").unwrap();
    deploy_example(&mut c, "new_app", "micro");

    let version = invoke_static(&mut c, "new_app", "Bench", "version", json!({}));
    version.unwrap_or_else(|e| panic!("Bench.version after reinstalling: {}", describe(&e)));
}

/// Asserts that deploying `module` is refused as an invalid module and that
/// nothing was registered for the application.
#[track_caller]
fn assert_refused(module: &[u8], test: &str) -> String {
    assert_refused_in(&mut connect(), module, test)
}

#[track_caller]
fn assert_refused_in(c: &mut Client, module: &[u8], test: &str) -> String {
    let app = app(test);
    let message = expect_sqlstate(deploy(c, &app, module), "42P13");
    assert_eq!(application_rows(c, &app), 0, "an application row was left behind");
    assert_eq!(module_rows(c, &app), 0, "a module row was left behind");
    message
}

/// A component compiled and then refused (it does not export the
/// lambdastore world) leaves the compiled functions kept for later
/// compiles within `lambdastore.compiled_functions_size`: its deploy trims
/// them (a DEBUG1 line says what is left). They were trimmed only after a
/// deploy that succeeded, so refused ones, repeated, filled the data
/// directory's disk. (Other tests compile meanwhile: what the directory
/// holds once the deploy has returned is theirs too.)
#[test]
fn a_component_refused_after_its_compile_leaves_the_kept_functions_within_their_limit() {
    const LIMIT: u64 = 16 * 1024;
    let (mut c, notices) = connect_keeping_notices();
    c.batch_execute(&format!(
        "SET lambdastore.compiled_functions_size = '{}kB'; SET client_min_messages = debug1",
        LIMIT / 1024
    ))
    .unwrap();
    // Functions of their own (the salt), so none are kept already: 300 of
    // some 150 bytes each, a block each on disk, are over the limit.
    let salt = std::process::id();
    let functions: String = (0..300)
        .map(|i| format!("(func (export \"f{i}\") (result i32) i32.const {salt} i32.const {i} i32.add)"))
        .collect();
    let component = wat::parse_str(format!("(component (core module {functions}))")).unwrap();
    let message = assert_refused_in(&mut c, &component, "refuse_other_world");
    assert!(message.contains("lambdastore:lambda"), "{message}");
    let left: Vec<u64> = notices
        .lock()
        .unwrap()
        .iter()
        .filter_map(|n| {
            n.message().strip_prefix("lambdastore: removed ")?.split(", ").nth(1)?.split(' ').next()?.parse().ok()
        })
        .collect();
    assert!(!left.is_empty(), "the refused deploy trimmed nothing");
    assert!(left.iter().all(|&bytes| bytes <= LIMIT), "left over the limit: {left:?}");
}

#[test]
fn garbage_bytes_are_refused() {
    assert_refused(b"this is not WebAssembly at all", "refuse_garbage");
}

#[test]
fn empty_bytes_are_refused() {
    assert_refused(b"", "refuse_empty");
}

#[test]
fn a_core_module_is_refused() {
    // A valid WebAssembly module, but not a component.
    let core = wat::parse_str(r#"(module (func (export "describe") (result i32) i32.const 0))"#).unwrap();
    assert_refused(&core, "refuse_core");
}

#[test]
fn a_component_without_the_exports_is_refused() {
    assert_refused(&wat::parse_str("(component)").unwrap(), "refuse_no_exports");
}

/// Exports named as the world's but of other types: refused when the
/// module loads, by `LambdaPre::new`'s type check ("type-checking export
/// func `describe`: expected `record` found `u32`"), the one check a
/// call's instance relies on, since it takes `describe` and `dispatch`
/// without checking them again (`instantiate_checked_once`).
#[test]
fn a_component_exporting_the_worlds_names_with_other_types_is_refused() {
    let component = wat::parse_str(
        r#"(component
             (core module $m (func (export "f") (result i32) i32.const 0))
             (core instance $i (instantiate $m))
             (func (export "describe") (result u32) (canon lift (core func $i "f")))
             (func (export "dispatch") (result u32) (canon lift (core func $i "f"))))"#,
    )
    .unwrap();
    let message = assert_refused(&component, "refuse_other_types");
    assert!(message.contains("type-checking export func `describe`"), "{message}");
}

#[test]
fn a_component_with_a_bad_description_is_refused() {
    use rogue::Kind::{Constructor, Method};
    let f = |name, kind| (name, kind, false, false);
    let cases: [&[(&str, &[rogue::Function])]; 5] = [
        &[],                                                   // no types
        &[("T", &[]), ("T", &[])],                             // repeated type
        &[("", &[])],                                          // empty type name
        &[("T", &[f("f", Method), f("f", Method)])],           // repeated function
        &[("T", &[f("a", Constructor), f("b", Constructor)])], // two constructors
    ];
    for (i, types) in cases.iter().enumerate() {
        assert_refused(&rogue::describing(types), &format!("refuse_desc{i}"));
    }
}

/// A description is static: a `describe` that reads or writes entries or
/// calls an object (as the deploying role, at every deploy) is refused,
/// and the object it called is untouched.
#[test]
fn a_describe_that_asks_the_host_for_entries_or_calls_is_refused() {
    let mut c = connect();
    let target_app = app("describe_target");
    deploy(&mut c, &target_app, &rogue::component()).unwrap();
    let target = create(&mut c, &target_app, "Rogue", json!({}));
    for (i, (asks, what)) in
        [(rogue::DescribeAsks::Put, "an entry to write"), (rogue::DescribeAsks::Call(target), "a nested call")]
            .into_iter()
            .enumerate()
    {
        let module = rogue::describing_after(&[("Rogue", rogue::FUNCTIONS)], asks);
        let message = assert_refused_in(&mut c, &module, &format!("describe_asks{i}"));
        assert!(message.contains(&format!("its describe asked the host for {what}")), "{message}");
    }
    assert_eq!(entries(&mut c, target), Vec::new(), "describe's call wrote");
}

#[test]
fn a_truncated_component_is_refused() {
    let counter = example("counter");
    assert_refused(&counter[..counter.len() / 2], "refuse_truncated");
}

#[test]
fn a_refused_module_leaves_the_current_version_running() {
    let (mut c, app) = deployed("refuse_keeps_current", "counter");
    let counter = create(&mut c, &app, "Counter", json!({"initial": 3}));

    expect_sqlstate(deploy(&mut c, &app, b"garbage"), "42P13");

    assert_eq!(module_rows(&mut c, &app), 1);
    assert_eq!(call(&mut c, counter, "get", json!({})), json!(3));
}

#[test]
fn only_the_owner_may_redeploy() {
    let mut c = connect();
    let app = app("owner_app");
    let own = app.replace("owner_app", "owner_own");
    let role = app.replace("owner_app", "ls_role");
    deploy_example(&mut c, &app, "counter"); // owned by postgres

    // Everything below happens in one transaction that is rolled back, so
    // the role disappears whatever the outcome.
    let mut tx = c.transaction().unwrap();
    // Until the rollback: other tests grant on the schema too.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ROLES_LOCK]).unwrap();
    tx.batch_execute(&format!(
        "CREATE ROLE {role} NOSUPERUSER;
         -- All a role needs to use LambdaStore: no table privileges.
         GRANT USAGE ON SCHEMA lambdastore TO {role};
         SET LOCAL ROLE {role};"
    ))
    .unwrap();
    // The role may deploy an application of its own...
    deploy(&mut tx, &own, &example("counter"))
        .unwrap_or_else(|e| panic!("a non-superuser deploying its own application: {}", describe(&e)));
    assert!(has_app_privilege(&mut tx, &own, "owner"));
    // ...but not over one that belongs to another role.
    let mut attempt = tx.transaction().unwrap(); // a savepoint
    let message = expect_sqlstate(deploy(&mut attempt, &app, &example("micro")), "42501");
    assert!(message.contains("belongs to role"), "refused for another reason: {message}");
    attempt.rollback().unwrap();
    tx.batch_execute("RESET ROLE").unwrap();
    assert_eq!(module_rows(&mut tx, &app), 1);
    tx.rollback().unwrap();
}

/// Redeploying while jobs are queued and clients call (issue 42): the rule
/// is that a workflow (a call from SQL, a job's run) runs on the version
/// that is current when it starts and keeps it to its end, so a redeploy
/// never fails a call or a job; queued jobs run on whatever version is
/// current when they run. Here 200 queued jobs and 8 clients tally four
/// objects while the application is redeployed five times: every job runs
/// once, every client call commits (after retried 40001s at most), and
/// each object counts each tag exactly once.
#[test]
fn a_redeploy_under_load_fails_no_call_and_runs_every_job_once() {
    use common::concurrent::{retrying, Cc, Rng, Tally};
    const JOBS: i64 = 200;
    const CLIENTS: usize = 8;
    const CALLS: i64 = 25;
    let (mut c, app) = deployed("redeploy_load", "micro");
    let objects: Vec<i64> = (0..4).map(|_| create(&mut c, &app, "Bench", json!({"entries": 0}))).collect();
    let jobs: Vec<i64> = (0..JOBS)
        .map(|tag| submit(&mut c, objects[tag as usize % 4], "tally", json!({"tag": tag}), None).unwrap())
        .collect();

    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let objects = objects.clone();
            std::thread::spawn(move || {
                let mut c = connect();
                let (mut tally, mut rng) = (Tally::default(), Rng::new(client as u64));
                for call in 0..CALLS {
                    let tag = 1_000_000 + (client as i64) * 1000 + call;
                    let object = objects[(call as usize + client) % 4];
                    retrying(Cc::Occ, &mut tally, &mut rng, || invoke(&mut c, object, "tally", json!({"tag": tag})))
                        .unwrap_or_else(|e| {
                            panic!("client {client}: a call failed during the redeploys: {}", describe(&e))
                        });
                }
                tally.retries
            })
        })
        .collect();
    let micro = example("micro");
    let mut versions = Vec::new();
    for round in 0..5 {
        let deployed = deploy(&mut c, &app, &with_custom_section(micro.clone(), "round", &[round])).unwrap();
        versions.push(deployed["version"].as_i64().unwrap());
    }
    let retries: u64 = clients.into_iter().map(|client| client.join().expect("a client panicked")).sum();
    for job in jobs {
        let job = finished(&mut c, job);
        assert_eq!(job.state, "done", "{job:?}");
    }
    let per_object = (JOBS + CLIENTS as i64 * CALLS) / 4;
    for object in objects {
        assert_tallied_once(&mut c, object, per_object);
    }
    assert!(versions.windows(2).all(|pair| pair[1] == pair[0] + 1), "each redeploy is a new version: {versions:?}");
    eprintln!("200 jobs and {} calls across 5 redeploys, {retries} retried 40001s", CLIENTS as i64 * CALLS);
}

/// The fields each object has, by name (entries of cells have the empty key).
fn field_names(c: &mut postgres::Client, object: i64) -> Vec<String> {
    let mut names: Vec<String> = entries(c, object).into_iter().map(|(field, _, _)| field).collect();
    names.dedup();
    names
}

/// A redeploy that changes a type's fields (issue 42): `counter` keeps its
/// count in `value`, `counter_v2` in `count` (and `changed`), with
/// `#[migrate(2)]` moving one to the other. Old objects are migrated by
/// their first call under the new code, a readonly one included, in that
/// call's transaction; `lambdastore.migrate_objects` migrates the rest; no
/// call ever reads the old layout as the new one.
#[test]
fn a_field_changing_redeploy_migrates_old_objects_on_their_first_call_or_ahead() {
    let (mut c, app) = deployed("migrate_fields", "counter");
    let old: Vec<i64> = (0..5).map(|i| create(&mut c, &app, "Counter", json!({"initial": i * 10}))).collect();
    assert_eq!(call(&mut c, old[0], "increment", json!(null)), json!(1));
    let v2 = deploy(&mut c, &app, &example("counter_v2")).unwrap();

    let versions =
        c.query("SELECT version, current, migrating_types, objects FROM lambdastore.versions($1)", &[&app]).unwrap();
    let listed: Vec<(i32, bool, Vec<String>, i64)> =
        versions.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    let (first, second) = (v2["version"].as_i64().unwrap() as i32 - 1, v2["version"].as_i64().unwrap() as i32);
    assert_eq!(listed, vec![(first, false, vec![], 0), (second, true, vec!["Counter".to_string()], 5)]);

    // A readonly function on an old object: migrated first, then read.
    assert_eq!(field_names(&mut c, old[0]), ["value"]);
    assert_eq!(call(&mut c, old[0], "get", json!(null)), json!(1));
    assert_eq!(field_names(&mut c, old[0]), ["changed", "count", "lambdastore.version"]);
    assert_eq!(call(&mut c, old[1], "increment", json!(null)), json!(11));
    // The migration is part of the call: rolled back with it.
    let mut tx = c.transaction().unwrap();
    assert_eq!(call(&mut tx, old[2], "get", json!(null)), json!(20));
    tx.rollback().unwrap();
    assert_eq!(field_names(&mut c, old[2]), ["value"]);
    // A READ ONLY transaction cannot store the migration, and says so.
    let mut tx = c.build_transaction().read_only(true).start().unwrap();
    let message = expect_sqlstate(invoke(&mut tx, old[2], "get", json!(null)), "25006");
    assert!(message.contains("migrating it writes"), "{message}");
    tx.rollback().unwrap();

    let migrated: i64 = c.query_one("CALL lambdastore.migrate_objects($1)", &[&app]).unwrap().get(0);
    assert_eq!(migrated, 3, "objects 2, 3 and 4 were behind");
    let again: i64 = c.query_one("CALL lambdastore.migrate_objects($1)", &[&app]).unwrap().get(0);
    assert_eq!(again, 0);
    for (i, object) in old.iter().enumerate() {
        let expected = i as i64 * 10 + i64::from(i < 2);
        assert_eq!(call(&mut c, *object, "get", json!(null)), json!(expected), "object {i}");
        assert_eq!(field_names(&mut c, *object), ["changed", "count", "lambdastore.version"], "object {i}");
    }
    let new = create(&mut c, &app, "Counter", json!({"initial": 7}));
    assert_eq!(call(&mut c, new, "migrate", json!(null)), json!({"from": 2, "to": 2}));

    // The code before the migration again: refused (55000), since it would
    // read the migrated fields as empty and write beside them (a `get`
    // answered 0, and an increment made then was lost once the migrated
    // version came back). Version 2 stays.
    let message = expect_sqlstate(deploy(&mut c, &app, &example("counter")), "55000");
    assert!(message.contains("6 object(s) of type \"Counter\""), "{message}");
    assert_eq!(call(&mut c, old[0], "get", json!(null)), json!(1));

    // Only the application's owner migrates its objects ahead of their calls
    // (in a transaction rolled back, so the role disappears).
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ROLES_LOCK]).unwrap();
    let role = app.replace("migrate_fields", "migrate_stranger");
    tx.batch_execute(&format!(
        "CREATE ROLE {role} NOSUPERUSER; GRANT USAGE ON SCHEMA lambdastore TO {role}; SET LOCAL ROLE {role};"
    ))
    .unwrap();
    let mut refused = tx.transaction().unwrap();
    let message = expect_sqlstate(refused.query_one("CALL lambdastore.migrate_objects($1)", &[&app]), "42501");
    assert!(message.contains("is not the owner of application"), "{message}");
    refused.rollback().unwrap();
    // Nor may it see the versions: refused, not shown as none.
    let message = expect_sqlstate(tx.query("SELECT * FROM lambdastore.versions($1)", &[&app]), "42501");
    assert!(message.contains("may not read application"), "{message}");
    tx.rollback().unwrap();
    expect_sqlstate(c.query("SELECT * FROM lambdastore.versions(NULL)", &[]), "22004");
    expect_sqlstate(c.query("CALL lambdastore.migrate_objects(NULL)", &[]), "22004");
    // An application that does not exist is one, for a superuser too.
    expect_sqlstate(c.query("SELECT * FROM lambdastore.versions('no_such_app')", &[]), "42704");
    expect_sqlstate(c.query("CALL lambdastore.migrate_objects('no_such_app')", &[]), "42704");
}
