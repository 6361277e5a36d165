//! The example applications end to end: deploy, create, invoke, nested
//! calls, and range scans that come back in order.

mod common;

use common::*;
use postgres::Client;
use serde_json::{json, Value};

/// More items than the SDK fetches in one page of a range scan (128), so
/// that ordered reads have to resume where a page ended.
const MORE_THAN_A_PAGE: i64 = 130;

in_both_languages!(
    "counter", "py_counter": [
        counter_round_trip,
        an_optional_argument_may_be_omitted,
        object_data_is_rows_of_json,
        a_new_object_has_one_entry_set,
        lambdas_run_in_the_callers_transaction,
        a_counters_errors_have_their_sqlstates_and_change_nothing,
        a_lambdas_map_call_reports_each_object_and_rolls_back_only_the_failed_call,
    ],
    "forum", "py_forum": [
        forum_thread_round_trip,
        forum_add_comment_reaches_the_thread_through_a_nested_call,
        forum_add_comment_on_thread_is_protected_from_sql,
        forum_comments_come_back_oldest_first,
        forum_list_threads_is_newest_first,
    ],
);

fn counter_round_trip(example: &str) {
    let (mut c, app) = deployed(&format!("counter_{example}"), example);
    let id = create(&mut c, &app, "Counter", json!({"initial": 5}));

    assert_eq!(call(&mut c, id, "get", json!({})), json!(5));
    assert_eq!(call(&mut c, id, "increment", json!({})), json!(6));
    assert_eq!(call(&mut c, id, "add", json!({"n": 10})), json!(16));
    // Arguments by position.
    assert_eq!(call(&mut c, id, "add", json!([-6])), json!(10));

    // Committed: another session sees it.
    assert_eq!(call(&mut connect(), id, "get", json!({})), json!(10));
}

fn an_optional_argument_may_be_omitted(example: &str) {
    let (mut c, app) = deployed(&format!("counter_default_{example}"), example);
    let id = create(&mut c, &app, "Counter", json!({}));
    assert_eq!(call(&mut c, id, "get", json!({})), json!(0));
}

fn object_data_is_rows_of_json(example: &str) {
    let (mut c, app) = deployed(&format!("counter_rows_{example}"), example);
    let id = create(&mut c, &app, "Counter", json!({"initial": 41}));
    call(&mut c, id, "increment", json!({}));

    // A cell is one entry under the empty key; values are JSON bytes.
    assert_eq!(entries(&mut c, id), vec![("value".to_string(), vec![], b"42".to_vec())]);
    let row = c.query_one("SELECT app, type_name FROM lambdastore.objects WHERE object_id = $1", &[&id]).unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, String>(1)), (app, "Counter".to_string()));
}

fn a_new_object_has_one_entry_set(example: &str) {
    let (mut c, app) = deployed(&format!("counter_entry_set_{example}"), example);
    let id = create(&mut c, &app, "Counter", json!({}));
    let sets: i64 =
        c.query_one("SELECT count(*) FROM lambdastore.entry_sets WHERE object_id = $1", &[&id]).unwrap().get(0);
    assert_eq!(sets, 1);
}

fn lambdas_run_in_the_callers_transaction(example: &str) {
    let (mut c, app) = deployed(&format!("counter_txn_{example}"), example);
    let id = create(&mut c, &app, "Counter", json!({"initial": 1}));

    let mut tx = c.transaction().unwrap();
    call(&mut tx, id, "add", json!({"n": 10}));
    // The next statement of the same transaction sees the write...
    assert_eq!(call(&mut tx, id, "get", json!({})), json!(11));
    // ...another session cannot read it before the commit: the entry set is
    // locked by this open transaction, so the reader must retry (40001)
    // rather than see a value that may still change.
    let mut other = connect();
    expect_sqlstate(invoke(&mut other, id, "get", json!({})), "40001");
    tx.rollback().unwrap();

    assert_eq!(call(&mut other, id, "get", json!({})), json!(1));
    assert_eq!(call(&mut c, id, "get", json!({})), json!(1));
}

/// The function's own error (P0001, its message), arguments that do not
/// decode (22023), an unknown function (42883): each leaves the counter
/// as it was.
fn a_counters_errors_have_their_sqlstates_and_change_nothing(example: &str) {
    let (mut c, app) = deployed(&format!("counter_errors_{example}"), example);
    let id = create(&mut c, &app, "Counter", json!({"initial": i64::MAX}));
    let message = expect_sqlstate(invoke(&mut c, id, "increment", json!({})), "P0001");
    assert!(message.contains(&format!("counter overflow: {} + 1", i64::MAX)), "{message}");
    let message = expect_sqlstate(invoke(&mut c, id, "add", json!({"n": "two"})), "22023");
    assert!(message.contains("parameter `n`"), "{message}");
    let message = expect_sqlstate(invoke(&mut c, id, "add", json!({})), "22023");
    assert!(message.contains("missing parameter `n`"), "{message}");
    expect_sqlstate(invoke(&mut c, id, "reset", json!({})), "42883");
    assert_eq!(call(&mut c, id, "get", json!({})), json!(i64::MAX));
}

#[test]
fn a_statement_may_invoke_many_objects() {
    let (mut c, app) = deployed("counter_many", "counter");
    let ids: Vec<i64> = (0..10).map(|i| create(&mut c, &app, "Counter", json!({"initial": i}))).collect();

    let total: i64 = c
        .query_one(
            "SELECT sum((lambda_invoke(id, 'increment'))::text::bigint)::bigint FROM unnest($1::bigint[]) id",
            &[&ids],
        )
        .unwrap()
        .get(0);
    assert_eq!(total, (1..=10).sum::<i64>());
}

#[test]
fn bank_transfer_moves_money_through_a_nested_deposit() {
    let (mut c, app) = deployed("bank", "bank");
    let alice = create(&mut c, &app, "Account", json!({"owner": "alice", "initial": 100}));
    let bob = create(&mut c, &app, "Account", json!({"owner": "bob"}));

    let balance = call(&mut c, alice, "transfer", json!({"to": bob, "amount": 30}));

    assert_eq!(balance, json!(70));
    assert_eq!(call(&mut c, alice, "balance", json!({})), json!(70));
    assert_eq!(call(&mut c, bob, "balance", json!({})), json!(30));
    // The deposit (a nested call) audited the credit on bob's side.
    let credit = &call(&mut c, bob, "history", json!({}))[0];
    assert_eq!(
        (&credit["kind"], &credit["amount"], &credit["counterparty"]),
        (&json!("credit"), &json!(30), &json!(alice))
    );
}

#[test]
fn bank_history_is_newest_first() {
    let (mut c, app) = deployed("bank_history", "bank");
    let alice = create(&mut c, &app, "Account", json!({"owner": "alice", "initial": 1_000_000}));
    let bob = create(&mut c, &app, "Account", json!({"owner": "bob"}));
    // Transfers of 1, 2, ..., MORE_THAN_A_PAGE, in that order.
    c.execute(
        "SELECT lambda_invoke($1, 'transfer', jsonb_build_object('to', $2::bigint, 'amount', i))
           FROM generate_series(1, $3::bigint) i ORDER BY i",
        &[&alice, &bob, &MORE_THAN_A_PAGE],
    )
    .unwrap();

    let history = call(&mut c, alice, "history", json!({"limit": MORE_THAN_A_PAGE - 1}));
    let amounts: Vec<i64> = history
        .as_array()
        .unwrap_or_else(|| panic!("history is not a list: {history}"))
        .iter()
        .map(|h| h["amount"].as_i64().unwrap_or_else(|| panic!("no amount in {h}")))
        .collect();
    let expected: Vec<i64> = (2..=MORE_THAN_A_PAGE).rev().collect();
    assert_eq!(amounts, expected);
}

/// The Python wallet (guest-sdk/python/examples/wallet) and the Rust bank:
/// a bank transfer to a wallet runs Rust → Python → Rust, a top-up Python
/// → Rust → Python → Rust, each one workflow that commits or changes
/// nothing, on both sides.
#[test]
fn a_python_wallet_and_the_rust_bank_share_one_workflow() {
    let (mut c, bank) = deployed("mixed_bank", "bank");
    let wallets = app("mixed_wallet");
    deploy_example(&mut c, &wallets, "py_wallet");
    let alice = create(&mut c, &bank, "Account", json!({"owner": "alice", "initial": 100}));
    let wallet = create(&mut c, &wallets, "Wallet", json!({"holder": "alice"}));
    // On a Citus coordinator (the suites run there too) a top-up comes back
    // to the account a stopped run on its node touched, which a workflow
    // may not do across nodes (0A000, docs/ARCHITECTURE.md "On a Citus
    // cluster"): the wallet lives with its holder's account.
    let distributed: bool = c.query_one("SELECT lambdastore._distributed()", &[]).unwrap().get(0);
    if distributed && owner(&mut c, wallet) != owner(&mut c, alice) {
        let to = owner(&mut c, alice);
        c.query_one("SELECT lambdastore.migrate_object($1, $2)::text", &[&wallet, &to]).unwrap();
    }
    let balances = |c: &mut Client| (call(c, alice, "balance", json!({})), call(c, wallet, "balance", json!({})));

    assert_eq!(call(&mut c, alice, "transfer", json!({"to": wallet, "amount": 30})), json!(70));
    assert_eq!(call(&mut c, wallet, "top_up", json!({"account": alice, "amount": 20})), json!(50));
    assert_eq!(balances(&mut c), (json!(50), json!(50)));
    let debits: Vec<Value> = call(&mut c, alice, "history", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .map(|h| json!([h["kind"], h["amount"], h["counterparty"]]))
        .collect();
    assert_eq!(debits, [json!(["debit", 20, wallet]), json!(["debit", 30, wallet])]);

    // A deposit with no transfer behind it, an overdraft and a debit
    // credited twice fail in Python or in Rust, and change nothing anywhere.
    let refused = expect_sqlstate(invoke(&mut c, wallet, "deposit", json!({"amount": 5, "from": alice})), "P0001");
    assert!(refused.contains("no transfer of 5"), "{refused}");
    let overdraft = expect_sqlstate(invoke(&mut c, wallet, "top_up", json!({"account": alice, "amount": 51})), "P0001");
    assert!(overdraft.contains("insufficient funds"), "{overdraft}");
    let again = expect_sqlstate(invoke(&mut c, wallet, "deposit", json!({"amount": 20, "from": alice})), "P0001");
    assert!(again.contains("already credited"), "{again}");
    assert_eq!(balances(&mut c), (json!(50), json!(50)));
}

/// A forum (the Rust or the Python `example`) with one account and one community.
fn forum(test: &str, example: &str) -> (Client, String, i64, i64) {
    let (mut c, app) = deployed(&format!("{test}_{example}"), example);
    let ada = create(&mut c, &app, "Account", json!({"name": "ada"}));
    let rust = create(&mut c, &app, "Community", json!({"name": "rust"}));
    (c, app, ada, rust)
}

fn new_thread(c: &mut Client, account: i64, community: i64, title: &str) -> i64 {
    let thread = call(c, account, "create_thread", json!({"community": community, "title": title, "text": "hello"}));
    thread.as_i64().unwrap_or_else(|| panic!("create_thread returned {thread}, not a thread id"))
}

fn forum_thread_round_trip(example: &str) {
    let (mut c, _, ada, rust) = forum("forum", example);
    let thread = new_thread(&mut c, ada, rust, "First post");

    let got = call(&mut c, thread, "get_thread", json!({}));
    assert_eq!(got["id"], json!(thread));
    assert_eq!(got["author"], json!(ada));
    assert_eq!(got["community"], json!(rust));
    assert_eq!(got["title"], json!("First post"));
    assert_eq!(got["text"], json!("hello"));
    assert_eq!(got["comment_count"], json!(0));
    assert_eq!(got["comments"], json!([]));
}

fn forum_add_comment_reaches_the_thread_through_a_nested_call(example: &str) {
    let (mut c, app, ada, rust) = forum("forum_comment", example);
    let grace = create(&mut c, &app, "Account", json!({"name": "grace"}));
    let thread = new_thread(&mut c, ada, rust, "Questions");

    let comment = call(&mut c, grace, "add_comment", json!({"thread": thread, "text": "me first"}));

    let got = call(&mut c, thread, "get_thread", json!({}));
    assert_eq!(got["comment_count"], json!(1));
    let comments = got["comments"].as_array().unwrap();
    assert_eq!(comments.len(), 1);
    assert_eq!(comments[0]["id"], comment);
    assert_eq!(comments[0]["author"], json!(grace));
    assert_eq!(comments[0]["text"], json!("me first"));
}

fn forum_add_comment_on_thread_is_protected_from_sql(example: &str) {
    let (mut c, _, ada, rust) = forum("forum_protected", example);
    let thread = new_thread(&mut c, ada, rust, "Closed");
    let before = entries(&mut c, thread);

    expect_sqlstate(invoke(&mut c, thread, "add_comment", json!({"author": ada, "text": "sneaky"})), "42501");
    assert_eq!(entries(&mut c, thread), before);
}

fn forum_comments_come_back_oldest_first(example: &str) {
    let (mut c, _, ada, rust) = forum("forum_order", example);
    let thread = new_thread(&mut c, ada, rust, "Long thread");
    c.execute(
        "SELECT lambda_invoke($1, 'add_comment', jsonb_build_object('thread', $2::bigint, 'text', 'c' || i))
           FROM generate_series(1, $3::bigint) i ORDER BY i",
        &[&ada, &thread, &MORE_THAN_A_PAGE],
    )
    .unwrap();

    let got = call(&mut c, thread, "get_thread", json!({}));
    assert_eq!(got["comment_count"], json!(MORE_THAN_A_PAGE));
    let texts: Vec<&str> = got["comments"].as_array().unwrap().iter().map(|x| x["text"].as_str().unwrap()).collect();
    let expected: Vec<String> = (1..=MORE_THAN_A_PAGE).map(|i| format!("c{i}")).collect();
    assert_eq!(texts, expected);
}

fn forum_list_threads_is_newest_first(example: &str) {
    let (mut c, _, ada, rust) = forum("forum_threads", example);
    c.execute(
        "SELECT lambda_invoke($1, 'create_thread', jsonb_build_object('community', $2::bigint, 'title', 't' || i, 'text', ''))
           FROM generate_series(1, $3::bigint) i ORDER BY i",
        &[&ada, &rust, &MORE_THAN_A_PAGE],
    )
    .unwrap();

    let listed = call(&mut c, rust, "list_threads", json!({"limit": MORE_THAN_A_PAGE - 1}));
    let titles: Vec<&str> = listed
        .as_array()
        .unwrap_or_else(|| panic!("list_threads is not a list: {listed}"))
        .iter()
        .map(|t| t["title"].as_str().unwrap_or_else(|| panic!("no title in {t}")))
        .collect();
    let expected: Vec<String> = (2..=MORE_THAN_A_PAGE).rev().map(|i| format!("t{i}")).collect();
    assert_eq!(titles, expected);
}

/// A `micro` application with one `Bench` object.
fn bench(test: &str) -> (Client, String, i64) {
    let (mut c, app) = deployed(test, "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    (c, app, id)
}

#[test]
fn micro_constructor_fills_100_entries_of_1_kib() {
    let (mut c, _, id) = bench("micro_new");
    let stored = entries(&mut c, id);
    let kib: Vec<_> = stored.iter().filter(|(_, _, v)| v.len() >= 1024).collect();
    assert_eq!(kib.len(), 100, "fields: {:?}", stored.iter().map(|e| &e.0).collect::<Vec<_>>());
}

#[test]
fn micro_functions_run() {
    let (mut c, app, id) = bench("micro_run");
    call(&mut c, id, "hash", json!({"n": 10}));
    call(&mut c, id, "read", json!({"k": 100}));
    call(&mut c, id, "write", json!({"k": 10}));
    call(&mut c, id, "alloc", json!({"bytes": 1 << 20}));
    let version = invoke_static(&mut c, &app, "Bench", "version", json!({})).unwrap();
    assert!(!version.is_null());
}

#[test]
fn micro_map_put_then_get() {
    let (mut c, _, id) = bench("micro_map");
    assert_eq!(call(&mut c, id, "get", json!({"key": "k"})), Value::Null);
    call(&mut c, id, "put", json!({"key": "k", "value": "v"}));
    assert_eq!(call(&mut c, id, "get", json!({"key": "k"})), json!("v"));
}

#[test]
fn micro_deep_nests_calls_on_itself() {
    // deep(n) calls itself n levels down on the same object and returns n.
    let (mut c, _, id) = bench("micro_deep");
    assert_eq!(call(&mut c, id, "deep", json!({"depth": 5})), json!(5));
}

#[test]
fn a_protected_function_may_be_called_by_its_own_application() {
    // ask_secret calls the protected secret of another Bench.
    let (mut c, app, id) = bench("micro_ask_secret");
    let other = create(&mut c, &app, "Bench", json!({}));
    assert_eq!(call(&mut c, id, "ask_secret", json!({"target": other})), json!("the secret"));
}

#[test]
fn micro_list_scans_in_key_order_within_bounds() {
    let (mut c, _, id) = bench("micro_list");
    for key in ["b", "d", "a", "c", "bb"] {
        call(&mut c, id, "put", json!({"key": key, "value": key.to_uppercase()}));
    }

    let all = call(&mut c, id, "list", json!({}));
    assert_eq!(all, json!([["a", "A"], ["b", "B"], ["bb", "BB"], ["c", "C"], ["d", "D"]]));
    let bounded = call(&mut c, id, "list", json!({"start": "b", "end": "c"}));
    assert_eq!(bounded, json!([["b", "B"], ["bb", "BB"]]));
    let newest = call(&mut c, id, "list", json!({"limit": 2, "reverse": true}));
    assert_eq!(newest, json!([["d", "D"], ["c", "C"]]));
}

#[test]
fn a_scan_sees_the_calls_own_pending_writes_in_key_order() {
    // Stored: a, c, e. In one call: overwrite c, add b and f, delete e, then
    // scan. The host merges its write buffer with the table: the scan must
    // show the new values, the new keys in order, and not the deleted one —
    // also when a limit cuts the merged list and in reverse.
    let (mut c, _, id) = bench("micro_write_then_list");
    for key in ["a", "c", "e"] {
        call(&mut c, id, "put", json!({"key": key, "value": "stored"}));
    }
    let puts = json!([["c", "new"], ["b", "new"], ["f", "new"]]);
    let merged = call(&mut c, id, "write_then_list", json!({"puts": puts, "deletes": ["e"]}));
    assert_eq!(merged, json!([["a", "stored"], ["b", "new"], ["c", "new"], ["f", "new"]]));
    let newest = call(
        &mut c,
        id,
        "write_then_list",
        json!({"puts": [["d", "new"]], "deletes": ["f"], "limit": 2, "reverse": true}),
    );
    assert_eq!(newest, json!([["d", "new"], ["c", "new"]]));
    // And the writes of both calls were applied.
    assert_eq!(call(&mut c, id, "list", json!({})), json!([["a", "stored"], ["b", "new"], ["c", "new"], ["d", "new"]]));
}

#[test]
fn stats_count_calls_commits_and_aborts_by_reason() {
    // The test cluster preloads lambdastore, so the counters are in shared
    // memory and survive the aborted calls.
    let (mut c, app, id) = bench("micro_stats");
    call(&mut c, id, "get", json!({"key": "k"}));
    call(&mut c, id, "get", json!({"key": "k"}));
    c.batch_execute("SET lambdastore.timeout = '50ms'").unwrap();
    expect_sqlstate(invoke(&mut c, id, "spin", json!({})), "57014");
    expect_sqlstate(invoke(&mut c, id, "panic", json!({})), "38000");
    expect_sqlstate(invoke(&mut c, id, "alloc", json!({"bytes": 1u64 << 30})), "53200");
    expect_sqlstate(invoke(&mut c, id, "fail", json!({"message": "no"})), "P0001");
    // A key past what an index entry holds is a limit too (54000).
    expect_sqlstate(invoke(&mut c, id, "put", json!({"key": "k".repeat(3000), "value": "v"})), "54000");

    let mut row = |function: &str| -> Vec<i64> {
        let r = c
            .query_one(
                "SELECT calls, commits, aborts_conflict, aborts_timeout, aborts_trap, aborts_limit, aborts_other
                   FROM lambdastore.stats WHERE app = $1 AND type_name = 'Bench' AND function = $2",
                &[&app, &function],
            )
            .unwrap();
        (0..7).map(|i| r.get::<_, i64>(i)).collect()
    };
    assert_eq!(row("get"), vec![2, 2, 0, 0, 0, 0, 0]);
    assert_eq!(row("spin"), vec![1, 0, 0, 1, 0, 0, 0]);
    assert_eq!(row("panic"), vec![1, 0, 0, 0, 1, 0, 0]);
    assert_eq!(row("alloc"), vec![1, 0, 0, 0, 0, 1, 0]);
    assert_eq!(row("fail"), vec![1, 0, 0, 0, 0, 0, 1]);
    assert_eq!(row("put"), vec![1, 0, 0, 0, 0, 1, 0]);
    drop(row);
    let mean: f64 = c
        .query_one("SELECT mean_ms FROM lambdastore.stats WHERE app = $1 AND function = 'spin'", &[&app])
        .unwrap()
        .get(0);
    assert!(mean >= 50.0, "spin ran for its 50 ms timeout, mean {mean} ms");

    // Calls of functions, types or applications that do not exist are not
    // counted: made-up names would take the table's slots.
    expect_sqlstate(invoke(&mut c, id, "no_such_method", json!({})), "42883");
    expect_sqlstate(invoke_static(&mut c, &app, "Bench", "no_such_function", json!({})), "42883");
    expect_sqlstate(c.query_one("SELECT lambdastore.create_object($1, 'NoSuchType', '{}')", &[&app]), "42704");
    let rows = count(
        &mut c,
        &format!("SELECT count(*) FROM lambdastore.stats WHERE app = '{app}' AND function LIKE 'no_such%'"),
    );
    assert_eq!(rows, 0, "unknown functions got rows in lambdastore.stats");
    assert_eq!(
        count(
            &mut c,
            &format!("SELECT count(*) FROM lambdastore.stats WHERE app = '{app}' AND type_name = 'NoSuchType'")
        ),
        0
    );
}

/// Names as long as they may be: an application's 63 bytes are kept whole
/// (so its owner, and a role it granted, find its rows), and two functions
/// whose long names begin alike are counted apart, each shown cut with "…".
#[test]
fn stats_keep_long_names_apart_and_whole_applications_visible() {
    use rogue::Kind::Method;
    const LONG_A: &str = "a_function_name_long_enough_to_be_cut_in_the_stats_table_of_names_a";
    const LONG_B: &str = "a_function_name_long_enough_to_be_cut_in_the_stats_table_of_names_bb";
    let mut c = connect();
    let app = app("stats_keep_the_whole_name_of_a_long_application");
    assert!(app.len() > 48, "{app} is not long");
    deploy(
        &mut c,
        &app,
        &rogue::describing(&[("Rogue", &[(LONG_A, Method, false, false), (LONG_B, Method, false, false)])]),
    )
    .unwrap();
    let id = create(&mut c, &app, "Rogue", json!({}));
    for (function, times) in [(LONG_A, 1), (LONG_B, 2)] {
        for _ in 0..times {
            call(&mut c, id, function, json!({}));
        }
    }
    let reader = TestRole::new("stats_reader");
    grant(&mut c, &app, &reader.name, "read").unwrap();
    c.batch_execute(&format!("SET ROLE {}", reader.name)).unwrap();
    let rows: Vec<(String, i64)> = c
        .query("SELECT function, calls FROM lambdastore.stats WHERE app = $1 ORDER BY calls, function", &[&app])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    c.batch_execute("RESET ROLE").unwrap();
    let cut = |name: &str| format!("{}…", &name[..61]);
    assert_eq!(rows, vec![("(create)".into(), 1), (cut(LONG_A), 1), (cut(LONG_B), 2)]);
}

#[test]
fn stats_count_every_call_of_concurrent_backends() {
    // The counters take no lock: each backend adds to them with atomics,
    // which must not lose a call.
    let (_c, app, id) = bench("micro_stats_concurrent");
    let (threads, calls) = (4, 250);
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = connect();
                for _ in 0..calls {
                    call(&mut c, id, "get", json!({"key": "k"}));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let mut c = connect();
    let row = c
        .query_one(
            "SELECT calls, commits FROM lambdastore.stats WHERE app = $1 AND type_name = 'Bench' AND function = 'get'",
            &[&app],
        )
        .unwrap();
    let expected = (threads * calls) as i64;
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (expected, expected));
}

#[test]
fn a_map_call_runs_a_method_on_every_object_of_a_type_as_calls_one_by_one_would() {
    let (mut c, app) = deployed("map_type", "counter");
    let ids: Vec<i64> = (0..12).map(|i| create(&mut c, &app, "Counter", json!({"initial": i * 10}))).collect();
    let mut twin = connect();
    let twins: Vec<i64> = (0..12).map(|i| create(&mut twin, &app, "Counter", json!({"initial": i * 10}))).collect();
    let mapped = map_ids(&mut c, &ids, "add", json!({"n": 5})).unwrap();
    let one_by_one: Vec<Value> = twins.iter().map(|&id| call(&mut twin, id, "add", json!({"n": 5}))).collect();
    // (On a Citus cluster ids do not grow in the order they were made.)
    let expected: Mapped = ids.iter().zip(&one_by_one).map(|(id, result)| (*id, Ok(result.clone()))).collect();
    assert_eq!(mapped, expected);

    // Over the whole type: every object once, its result.
    let all = map_type(&mut c, &app, "Counter", "get", json!({})).unwrap();
    assert_eq!(all.len(), 24);
    for (id, expected) in ids.iter().chain(&twins).zip(one_by_one.iter().chain(&one_by_one)) {
        assert_eq!(all[id].as_ref().unwrap(), expected, "object {id}");
    }
    // Ids given twice run once; an unknown one is reported, not fatal.
    let repeated = map_ids(&mut c, &[ids[0], ids[0], 424242], "increment", json!({})).unwrap();
    assert_eq!(repeated[&ids[0]], Ok(json!(6)));
    assert_eq!(repeated[&424242].as_ref().unwrap_err().0, "42704");
    assert_eq!(call(&mut c, ids[0], "get", json!({})), json!(6));
}

fn a_lambdas_map_call_reports_each_object_and_rolls_back_only_the_failed_call(example: &str) {
    let (mut c, app) = deployed(&format!("lambda_map_call_{example}"), example);
    let me = create(&mut c, &app, "Counter", json!({}));
    let a = create(&mut c, &app, "Counter", json!({"initial": 1}));
    let b = create(&mut c, &app, "Counter", json!({"initial": 10}));
    let full = create(&mut c, &app, "Counter", json!({"initial": i64::MAX}));
    let outcomes = call(&mut c, me, "add_to_each", json!({"counters": [a, full, b, a], "n": 2}));
    let overflow = format!("counter overflow: {} + 2", i64::MAX);
    assert_eq!(outcomes, json!([[a, {"Ok": 3}], [full, {"Err": overflow}], [b, {"Ok": 12}]]));
    for (id, value) in [(a, 3), (b, 12), (full, i64::MAX), (me, 2)] {
        assert_eq!(call(&mut c, id, "get", json!({})), json!(value), "object {id}");
    }
    // An unknown object is that object's failure, as for a single nested
    // call (and on the mock host): the others' calls stay.
    let outcomes = call(&mut c, me, "add_to_each", json!({"counters": [a, -1], "n": 2}));
    assert_eq!(outcomes, json!([[a, {"Ok": 5}], [-1, {"Err": "unknown object -1"}]]));
    assert_eq!(call(&mut c, a, "get", json!({})), json!(5));
}

#[test]
fn lambdastore_affinity_counts_the_calls_objects_receive_and_make_to_each_other() {
    let (mut c, app) = deployed("affinity", "bank");
    let a = create(&mut c, &app, "Account", json!({"owner": "a", "initial": 100}));
    let b = create(&mut c, &app, "Account", json!({"owner": "b", "initial": 100}));
    // A window of its own (on a Citus coordinator, every node's).
    c.execute("SELECT count(*) FROM lambdastore.affinity(forget => true)", &[]).unwrap();
    for _ in 0..3 {
        call(&mut c, a, "transfer", json!({"to": b, "amount": 1}));
    }
    call(&mut c, b, "balance", json!({}));
    let counts = |c: &mut Client, partner: Option<i64>| -> (i64, i64) {
        let row = c
            .query_one(
                "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(cross_node), 0)::bigint
                   FROM lambdastore.affinity() WHERE object_id = $1 AND partner IS NOT DISTINCT FROM $2",
                &[&a, &partner],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(counts(&mut c, None).0, 3, "calls a received");
    let (to_b, cross_node) = counts(&mut c, Some(b));
    assert_eq!(to_b, 3, "nested calls a made to b");
    assert!(cross_node <= to_b);
    let received_by_b: i64 = c
        .query_one(
            "SELECT sum(calls)::bigint FROM lambdastore.affinity() WHERE object_id = $1 AND partner IS NULL",
            &[&b],
        )
        .unwrap()
        .get(0);
    assert_eq!(received_by_b, 4, "3 deposits and a balance");
}

#[test]
fn a_failed_call_of_a_map_call_is_reported_and_rolled_back_alone() {
    let (mut c, app) = deployed("map_failures", "counter");
    let near_max = create(&mut c, &app, "Counter", json!({"initial": i64::MAX - 1}));
    let small = create(&mut c, &app, "Counter", json!({"initial": 1}));
    let outcomes = map_type(&mut c, &app, "Counter", "add", json!({"n": 2})).unwrap();
    let (code, message) = outcomes[&near_max].clone().unwrap_err();
    assert_eq!(code, "P0001");
    assert!(message.contains("overflow"), "{message}");
    assert_eq!(outcomes[&small], Ok(json!(3)));
    assert_eq!(call(&mut c, near_max, "get", json!({})), json!(i64::MAX - 1));
    assert_eq!(call(&mut c, small, "get", json!({})), json!(3));

    // The map call is part of the caller's transaction.
    let mut tx = c.transaction().unwrap();
    map_type(&mut tx, &app, "Counter", "increment", json!({})).unwrap();
    tx.rollback().unwrap();
    assert_eq!(call(&mut c, small, "get", json!({})), json!(3));

    // What the whole call cannot do is its error (nothing ran).
    expect_sqlstate(map_type(&mut c, &app, "Counter", "nope", json!({})), "42883");
    expect_sqlstate(map_type(&mut c, &app, "Nope", "get", json!({})), "42704");
    expect_sqlstate(map_type(&mut c, "no_such_app", "Counter", "get", json!({})), "42704");
    expect_sqlstate(c.query("SELECT * FROM lambdastore.map_call(ARRAY[1, NULL]::bigint[], 'get')", &[]), "22023");
    let mut tx = c.transaction().unwrap();
    tx.batch_execute("SET TRANSACTION READ ONLY").unwrap();
    expect_sqlstate(map_type(&mut tx, &app, "Counter", "increment", json!({})), "25006");
}
