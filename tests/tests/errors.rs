//! Every error a user can cause has its SQLSTATE (docs/errors.md) and
//! leaves nothing of the failed workflow behind.

mod common;

use common::*;
use postgres::Client;
use serde_json::{json, Value};

/// A fresh application running the hand-written `rogue` component, with
/// one `Rogue` object.
fn rogue(test: &str) -> (Client, String, i64) {
    let mut c = connect();
    let app = app(test);
    deploy(&mut c, &app, &rogue::component())
        .unwrap_or_else(|e| panic!("deploy the rogue component: {}", describe(&e)));
    let id = create(&mut c, &app, "Rogue", json!({}));
    (c, app, id)
}

/// A nested call's failures that its caller may handle come back to it as
/// values, as on the mock host: the same probes give the same kinds
/// (micro's `probe_failures`, whose unit test checks the mock against the
/// same file). Before, every refusal aborted the whole workflow on the
/// server (42704, 42883, 22023) while the mock returned it.
#[test]
fn a_callee_refusal_reaches_its_caller_as_on_the_mock_host() {
    let (mut c, app) = deployed("probe_failures", "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    let expected: Value =
        serde_json::from_str(include_str!("../../guest-sdk/examples/micro/probed_failures.json")).unwrap();
    assert_eq!(call(&mut c, id, "probe_failures", json!({"missing": -42})), expected);

    // The server alone has other applications: their objects are refused
    // to a role that may not invoke them (security.rs has the rest).
    let (_, other_app) = deployed("probe_other", "micro");
    let foreign = create(&mut c, &other_app, "Bench", json!({}));
    let role = TestRole::new("probe_failures");
    grant(&mut c, &app, &role.name, "invoke").unwrap();
    let mut with_foreign = expected.as_array().unwrap().clone();
    with_foreign.push(json!("not-allowed"));
    let probed = call(&mut role.connect(), id, "probe_failures", json!({"missing": -42, "foreign": foreign}));
    assert_eq!(probed, json!(with_foreign));

    // Passed on with `?` (into the SDK's error), a refusal is the caller's
    // own error, as on the mock.
    let passed_on =
        expect_sqlstate(invoke(&mut c, id, "relay", json!({"target": -42, "method": "get", "args": {}})), "P0001");
    assert!(passed_on.contains("unknown object -42"), "{passed_on}");
}

#[test]
fn an_unknown_object_is_42704() {
    let mut c = connect();
    expect_sqlstate(invoke(&mut c, -42, "get", json!({})), "42704");
    expect_sqlstate(c.execute("SELECT lambdastore.delete_object(-42)", &[]), "42704");
}

#[test]
fn an_unknown_application_is_42704() {
    let mut c = connect();
    let missing = app("never_deployed");
    expect_sqlstate(create_object(&mut c, &missing, "Bench", json!({})), "42704");
    expect_sqlstate(invoke_static(&mut c, &missing, "Bench", "version", json!({})), "42704");
}

#[test]
fn an_unknown_type_is_42704() {
    let (mut c, app, _) = micro_object("unknown_type");
    expect_sqlstate(create_object(&mut c, &app, "Nope", json!({})), "42704");
    expect_sqlstate(invoke_static(&mut c, &app, "Nope", "version", json!({})), "42704");
}

#[test]
fn an_unknown_function_is_42883() {
    let (mut c, app, id) = micro_object("unknown_function");
    fails_cleanly(&mut c, id, "no_such_method", json!({}), "42883");
    expect_sqlstate(invoke_static(&mut c, &app, "Bench", "no_such_function", json!({})), "42883");
}

/// Errors quote what the caller sent, which can be megabytes: the report
/// keeps the first 8 KiB of the message and of the detail and says how
/// much it left out.
#[test]
fn an_error_quoting_huge_input_is_cut_short() {
    let (mut c, _, id) = micro_object("huge_name");
    let method = format!("{}é", "m".repeat(100_000));
    let err = invoke(&mut c, id, &method, json!({})).expect_err("no such method");
    let db = err.as_db_error().expect("an error from the server");
    assert_eq!(db.code().code(), "42883", "{}", db.message());
    for (what, text) in [("message", db.message()), ("detail", db.detail().unwrap_or_default())] {
        assert!(text.len() < 8_300, "the {what} is {} bytes long", text.len());
        assert!(text.contains("mmm") && text.ends_with("more bytes)"), "the {what}: {}", &text[text.len() - 40..]);
    }
    assert_eq!(call(&mut c, id, "get", json!({"key": "k"})), json!(null));
}

#[test]
fn a_function_called_as_the_wrong_kind_is_42883() {
    let (mut c, app, id) = micro_object("wrong_kind");
    // `version` is static, `hash` a method, `new` the constructor.
    fails_cleanly(&mut c, id, "version", json!({}), "42883");
    fails_cleanly(&mut c, id, "new", json!({}), "42883");
    expect_sqlstate(invoke_static(&mut c, &app, "Bench", "hash", json!({"n": 1})), "42883");
}

#[test]
fn a_protected_function_called_from_sql_is_42501() {
    let (mut c, _, id) = micro_object("protected");
    fails_cleanly(&mut c, id, "secret", json!({}), "42501");
}

#[test]
fn bad_arguments_are_22023() {
    let (mut c, _, id) = micro_object("bad_arguments");
    fails_cleanly(&mut c, id, "hash", json!({"n": "many"}), "22023"); // wrong type
    fails_cleanly(&mut c, id, "hash", json!({}), "22023"); // missing
    fails_cleanly(&mut c, id, "hash", json!({"n": 1, "m": 2}), "22023"); // unknown name
    fails_cleanly(&mut c, id, "hash", json!([1, 2]), "22023"); // too many
    fails_cleanly(&mut c, id, "hash", json!(5), "22023"); // neither object nor array
                                                          // jsonb prints this in full, 309 digits; reading it back must not fail with XX000.
    fails_cleanly(&mut c, id, "hash", json!({"n": -f64::MAX}), "22023");
}

#[test]
fn arguments_for_a_type_without_constructor_are_22023() {
    let mut c = connect();
    let app = app("no_ctor_args");
    deploy(&mut c, &app, &rogue::component()).unwrap();
    expect_sqlstate(create_object(&mut c, &app, "Rogue", json!({"x": 1})), "22023");
    assert_eq!(objects(&mut c, &app), Vec::<i64>::new());
}

#[test]
fn an_application_error_is_p0001_with_its_message() {
    let (mut c, _, id) = micro_object("app_error");
    let message = fails_cleanly(&mut c, id, "fail", json!({"message": "out of coffee"}), "P0001");
    assert!(message.contains("out of coffee"), "{message}");
}

#[test]
fn writes_before_an_application_error_are_not_kept() {
    let (mut c, _, id) = micro_object("put_then_fail");
    fails_cleanly(&mut c, id, "put_then_fail", json!({"key": "k", "value": "v"}), "P0001");
    assert_eq!(call(&mut c, id, "get", json!({"key": "k"})), Value::Null);
}

#[test]
fn a_guest_panic_is_38000() {
    let (mut c, _, id) = micro_object("panic");
    fails_cleanly(&mut c, id, "panic", json!({}), "38000");
}

#[test]
fn a_result_that_is_not_json_is_38000() {
    let (mut c, _, id) = rogue("bad_json");
    fails_cleanly(&mut c, id, "bad_json", json!({}), "38000");
}

#[test]
fn the_rogue_component_runs() {
    // Control for the tests below: the hand-written guest works when it
    // keeps the rules (methods that write are not declared readonly).
    let (mut c, _, id) = rogue("rogue_runs");
    let written = vec![("log".to_string(), b"k".to_vec(), b"1".to_vec())];
    assert_eq!(call(&mut c, id, "put_entry", json!({})), Value::Null);
    assert_eq!(entries(&mut c, id), written);

    let (mut c, _, id) = rogue("rogue_runs_nested");
    assert_eq!(call(&mut c, id, "calls_put_entry", json!({})), Value::Null);
    assert_eq!(entries(&mut c, id), written);
}

#[test]
fn a_readonly_function_that_writes_is_38002() {
    let (mut c, _, id) = rogue("readonly_write");
    fails_cleanly(&mut c, id, "write_readonly", json!({}), "38002");
}

#[test]
fn a_readonly_function_cannot_write_through_a_nested_call() {
    // The callee is not readonly, but its caller is: the whole call tree is.
    let (mut c, _, id) = rogue("readonly_nested");
    fails_cleanly(&mut c, id, "readonly_calls_put_entry", json!({}), "38002");
}

#[test]
fn a_static_function_that_touches_entries_is_38002() {
    let (mut c, app, _) = rogue("static_put");
    expect_sqlstate(invoke_static(&mut c, &app, "Rogue", "static_put", json!({})), "38002");
}

#[test]
fn an_error_aborts_the_sql_transaction() {
    let (mut c, _, id) = micro_object("abort_txn");
    let mut tx = c.transaction().unwrap();
    call(&mut tx, id, "put", json!({"key": "before", "value": "1"}));
    expect_sqlstate(invoke(&mut tx, id, "fail", json!({"message": "no"})), "P0001");
    // 25P02: current transaction is aborted.
    expect_sqlstate(tx.query_one("SELECT 1", &[]), "25P02");
    tx.rollback().unwrap();
    assert_eq!(call(&mut c, id, "get", json!({"key": "before"})), Value::Null);
}

#[test]
fn a_callee_error_is_rolled_back_and_the_caller_goes_on() {
    // call_and_recover calls put_then_fail on the target, which writes and
    // then returns its own error: the caller sees the error, the write is
    // undone (savepoint), and the caller's call succeeds.
    let (mut c, app, caller) = micro_object("savepoint");
    let target = create(&mut c, &app, "Bench", json!({}));
    let target_before = entries(&mut c, target);

    let saw_error = call(&mut c, caller, "call_and_recover", json!({"target": target, "key": "k", "value": "v"}));

    assert_eq!(saw_error, json!(true));
    assert_eq!(call(&mut c, target, "get", json!({"key": "k"})), Value::Null);
    assert_eq!(entries(&mut c, target), target_before);
}

#[test]
fn a_refused_nested_call_comes_back_to_its_caller() {
    // Like a callee's own error, a refusal (here: the target belongs to
    // another application) is handed back to the caller, which recovers;
    // the refused object is untouched. (It aborted the whole workflow
    // before, unlike on the mock host.)
    let (mut c, _, caller) = micro_object("refusal_returns");
    let other_app = app("refusal_returns_other");
    deploy_example(&mut c, &other_app, "micro");
    let foreign = create(&mut c, &other_app, "Bench", json!({}));
    let foreign_before = entries(&mut c, foreign);

    let saw_error = call(&mut c, caller, "call_and_recover", json!({"target": foreign, "key": "k", "value": "v"}));
    assert_eq!(saw_error, json!(true));
    assert_eq!(entries(&mut c, foreign), foreign_before);
}

#[test]
fn a_nested_call_to_an_unknown_object_comes_back_to_its_caller() {
    let (mut c, _, caller) = micro_object("nested_unknown");
    let saw_error = call(&mut c, caller, "call_and_recover", json!({"target": -42, "key": "k", "value": "v"}));
    assert_eq!(saw_error, json!(true));
}

/// Another bank's `deposit` is protected: only its own application's
/// lambdas may call it, whoever invokes the transfer.
#[test]
fn a_transfer_to_another_applications_account_is_refused_and_moves_nothing() {
    let mut c = connect();
    let (bank_a, bank_b) = (app("bank_a"), app("bank_b"));
    deploy_example(&mut c, &bank_a, "bank");
    deploy_example(&mut c, &bank_b, "bank");
    let alice = create(&mut c, &bank_a, "Account", json!({"owner": "alice", "initial": 100}));
    let bob = create(&mut c, &bank_b, "Account", json!({"owner": "bob", "initial": 5}));
    let (alice_before, bob_before) = (entries(&mut c, alice), entries(&mut c, bob));

    // The refusal comes back to `transfer`, which fails with it (its own error).
    let refused = expect_sqlstate(invoke(&mut c, alice, "transfer", json!({"to": bob, "amount": 30})), "P0001");
    assert!(refused.contains(&format!("is protected: only lambdas of application \"{bank_b}\"")), "{refused}");

    assert_eq!(call(&mut c, alice, "balance", json!({})), json!(100));
    assert_eq!(call(&mut c, bob, "balance", json!({})), json!(5));
    assert_eq!(entries(&mut c, alice), alice_before);
    assert_eq!(entries(&mut c, bob), bob_before);
}

#[test]
fn deposit_is_protected_from_sql() {
    let mut c = connect();
    let bank = app("bank_protected");
    deploy_example(&mut c, &bank, "bank");
    let alice = create(&mut c, &bank, "Account", json!({"owner": "alice", "initial": 10}));

    expect_sqlstate(invoke(&mut c, alice, "deposit", json!({"amount": 1000})), "42501");
    assert_eq!(call(&mut c, alice, "balance", json!({})), json!(10));
}

#[test]
fn an_overdraft_is_refused_with_p0001_and_moves_nothing() {
    let mut c = connect();
    let bank = app("bank_overdraft");
    deploy_example(&mut c, &bank, "bank");
    let alice = create(&mut c, &bank, "Account", json!({"owner": "alice", "initial": 10}));
    let bob = create(&mut c, &bank, "Account", json!({"owner": "bob"}));
    let (alice_before, bob_before) = (entries(&mut c, alice), entries(&mut c, bob));

    expect_sqlstate(invoke(&mut c, alice, "transfer", json!({"to": bob, "amount": 11})), "P0001");
    expect_sqlstate(invoke(&mut c, alice, "transfer", json!({"to": bob, "amount": 0})), "P0001");
    expect_sqlstate(invoke(&mut c, alice, "transfer", json!({"to": bob, "amount": -5})), "P0001");

    assert_eq!(entries(&mut c, alice), alice_before);
    assert_eq!(entries(&mut c, bob), bob_before);
}

in_both_languages!("forum", "py_forum": [a_failed_workflow_creates_no_objects]);

fn a_failed_workflow_creates_no_objects(example: &str) {
    // create_thread creates a Thread (nested constructor), then indexes it
    // in the community: when either step fails, the Thread must not exist.
    let mut c = connect();
    let forum = app(&format!("forum_no_orphans_{example}"));
    deploy_example(&mut c, &forum, example);
    let ada = create(&mut c, &forum, "Account", json!({"name": "ada"}));
    let rust = create(&mut c, &forum, "Community", json!({"name": "rust"}));
    let before = objects(&mut c, &forum);

    // The community does not exist: the refusal comes back to
    // create_thread, which fails with it after creating the Thread.
    let args = json!({"community": -42, "title": "t", "text": ""});
    let refused = expect_sqlstate(invoke(&mut c, ada, "create_thread", args), "P0001");
    assert!(refused.contains("unknown object -42"), "{refused}");
    // The Thread constructor refuses an empty title: an application error.
    let args = json!({"community": rust, "title": " ", "text": ""});
    expect_sqlstate(invoke(&mut c, ada, "create_thread", args), "P0001");

    assert_eq!(objects(&mut c, &forum), before);
    assert_eq!(call(&mut c, rust, "list_threads", json!({})), json!([]));
}

/// A delete holds the whole object until it commits, as a write holds
/// what it wrote: a call on the object meanwhile fails at once with 40001
/// (it does not wait on the deleted rows, nor meet their foreign key to an
/// object gone, 23503), and once the delete commits it is 42704. The
/// object's schedules, timers and queued jobs go with it.
#[test]
fn a_call_racing_a_delete_conflicts_and_the_objects_jobs_go_with_it() {
    let (mut c, app, id) = micro_object("delete_race");
    c.execute("SELECT lambdastore.schedule('tick', '0 0 1 1 *', $1, 'get', '{\"key\": \"k\"}')", &[&id]).unwrap();
    call(
        &mut c,
        id,
        "set_timer",
        json!({"name": "later", "delay_ms": 3_600_000, "method": "get", "args": {}, "fail": false}),
    );
    let delayed: i64 =
        c.query_one("SELECT lambdastore.submit($1, 'get', '{}', delay => interval '1 hour')", &[&id]).unwrap().get(0);
    let queued = |c: &mut Client| {
        count(c, &format!("SELECT count(*) FROM lambdastore.jobs WHERE object_id = {id} AND state = 'queued'"))
    };
    assert_eq!(queued(&mut c), 3, "the tick, the timer and the delayed job");

    let mut deleter = connect();
    deleter.batch_execute("BEGIN").unwrap();
    deleter.execute("SELECT lambdastore.delete_object($1)", &[&id]).unwrap();
    // The safety net: a call that waited on the delete would end here.
    c.batch_execute("SET statement_timeout = '30s'").unwrap();
    expect_sqlstate(invoke(&mut c, id, "put", json!({"key": "k", "value": "v"})), "40001");
    expect_sqlstate(invoke(&mut c, id, "get", json!({"key": "k"})), "40001");
    deleter.batch_execute("COMMIT").unwrap();

    expect_sqlstate(invoke(&mut c, id, "put", json!({"key": "k", "value": "v"})), "42704");
    assert_eq!(queued(&mut c), 0, "a job of the deleted object is still queued");
    let cancelled: String =
        c.query_one("SELECT state || ': ' || error FROM lambdastore.job($1)", &[&delayed]).unwrap().get(0);
    assert_eq!(cancelled, "cancelled: its object was deleted");
    assert_eq!(count(&mut c, &format!("SELECT count(*) FROM lambdastore.app_schedules WHERE app = '{app}'")), 0);
}

/// A delete that commits while a call on the object runs, after the call
/// found the object: the call's write fails with 40001, as a conflict with
/// the delete, and a retry finds no object (42704). It met the entries'
/// foreign key instead (23503, "violates foreign key constraint
/// entries_object_id_fkey"). The write makes a new entry here, and changes
/// one the delete took with the object in the next test.
#[test]
fn a_call_whose_object_is_deleted_while_it_runs_conflicts() {
    call_deleted_while_running("delete_while_running", false);
}

#[test]
fn a_call_whose_entry_goes_with_its_object_while_it_runs_conflicts() {
    call_deleted_while_running("delete_entry_while_running", true);
}

fn call_deleted_while_running(test: &str, entry_exists: bool) {
    let (mut c, _, id) = micro_object(test);
    if entry_exists {
        invoke(&mut c, id, "busy", json!({"tag": 1, "ms": 0})).unwrap();
    }
    let mut caller = connect();
    caller.batch_execute("SET lambdastore.timeout = '10s'").unwrap();
    let pid = backend_pid(&mut caller);
    let statement = format!("SELECT lambda_invoke($1, 'busy', $2::text::jsonb)::text /* {test} */");
    let running = std::thread::spawn(move || {
        let busy = r#"{"tag": 1, "ms": 3000}"#;
        caller.query_one(&statement, &[&id, &busy]).map(|_| ()).map_err(|e| describe(&e))
    });
    wait_until_running(&mut c, pid, test, &running);
    c.execute("SELECT lambdastore.delete_object($1)", &[&id]).unwrap();
    let refused = running.join().unwrap().expect_err("the call's write outlived its object");
    assert!(refused.contains("40001") && refused.contains("deleted by a concurrent transaction"), "{refused}");
    expect_sqlstate(invoke(&mut c, id, "busy", json!({"tag": 2, "ms": 0})), "42704");
    assert_eq!(count(&mut c, &format!("SELECT count(*) FROM lambdastore.entries WHERE object_id = {id}")), 0);
}

#[test]
fn a_deleted_object_is_gone() {
    let (mut c, app, id) = micro_object("delete");
    c.execute("SELECT lambdastore.delete_object($1)", &[&id]).unwrap();

    assert_eq!(objects(&mut c, &app), Vec::<i64>::new());
    assert_eq!(entries(&mut c, id), Entries::new());
    expect_sqlstate(invoke(&mut c, id, "read", json!({"k": 1})), "42704");
    expect_sqlstate(c.execute("SELECT lambdastore.delete_object($1)", &[&id]), "42704");
}
