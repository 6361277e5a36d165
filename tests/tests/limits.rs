//! The limits of one invocation: wall time (and query cancel), memory,
//! nested call depth, argument and result size. Each stops the lambda with
//! its SQLSTATE and the backend keeps serving the next call.

mod common;

use common::*;
use postgres::Client;
use serde_json::json;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A fresh `micro` application with one `Bench` object, already called
/// once on this connection so that later calls are warm (engine created,
/// module loaded).
fn bench(test: &str) -> (Client, String, i64) {
    let (mut c, app, id) = micro_object(test);
    call(&mut c, id, "read", json!({"k": 1}));
    (c, app, id)
}

/// Taken by the tests that keep a backend spinning, so that the one that
/// measures how soon a lambda is stopped does not share the (two-core) test
/// machine with other spinning backends.
static ONE_SPINNER: Mutex<()> = Mutex::new(());

fn one_spinner() -> MutexGuard<'static, ()> {
    ONE_SPINNER.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The connection still runs lambdas normally.
#[track_caller]
fn assert_serves_calls(c: &mut Client, id: i64) {
    call(c, id, "put", json!({"key": "after", "value": "ok"}));
    assert_eq!(call(c, id, "get", json!({"key": "after"})), json!("ok"));
}

#[test]
fn spin_is_stopped_by_the_timeout_on_time() {
    let _alone = one_spinner();
    let (mut c, _, id) = bench("spin_timeout");
    // statement_timeout is only a safety net: if lambdastore.timeout did not
    // stop the lambda, this test fails on the message instead of hanging.
    c.batch_execute("SET lambdastore.timeout = '300ms'; SET statement_timeout = '5s'").unwrap();

    let before = entries(&mut c, id);
    let started = Instant::now();
    let result = invoke(&mut c, id, "spin", json!({}));
    let elapsed = started.elapsed();

    let message = expect_sqlstate(result, "57014");
    assert!(message.contains("lambdastore.timeout"), "{message}");
    assert!(elapsed >= Duration::from_millis(300), "stopped before the timeout, after {elapsed:?}");
    assert!(elapsed <= Duration::from_millis(400), "stopped {elapsed:?} after the call, more than 300 ms + 100 ms");
    assert_eq!(entries(&mut c, id), before);
    assert_serves_calls(&mut c, id);
}

/// The backend's epoch ticker thread (runtime/engine.rs), as the kernel
/// reports it: its `/proc` task directory, if the server runs on this
/// machine and the ticker exists.
fn ticker_task(pid: i32) -> Option<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .map(|task| task.path())
        .find(|task| std::fs::read_to_string(task.join("comm")).is_ok_and(|comm| comm.starts_with("lambdastore-epo")))
}

/// The ticker parks after 250 ms without calls, and a call wakes it only if
/// it finds it parked (a flag and the call's counter, both SeqCst). If that
/// handshake failed, the first runaway call after a pause would never be
/// stopped: nothing else interrupts wasm.
#[test]
fn a_runaway_call_after_the_ticker_parked_is_still_stopped() {
    let _alone = one_spinner();
    let (mut c, _, id) = bench("spin_after_park");
    c.batch_execute("SET lambdastore.timeout = '300ms'").unwrap();
    let pid = backend_pid(&mut c);
    let Some(ticker) = ticker_task(pid) else {
        eprintln!("skipped: backend {pid} or its ticker thread is not visible in /proc (remote server?)");
        return;
    };
    // Parked is a futex wait; ticking is a nanosleep.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(ticker.join("wchan")).is_ok_and(|wchan| wchan.contains("futex")) {
        assert!(Instant::now() < deadline, "the ticker never parked");
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait for an event
    }

    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = invoke(&mut c, id, "spin", json!({}));
        let _ = done.send((c, result));
    });
    let (mut c, result) = outcome
        .recv_timeout(Duration::from_secs(30))
        .expect("the runaway call was not stopped within 30 s: the parked ticker was never woken");
    let message = expect_sqlstate(result, "57014");
    assert!(message.contains("lambdastore.timeout"), "{message}");
    assert_serves_calls(&mut c, id);
}

#[test]
fn pg_cancel_backend_stops_a_running_lambda() {
    let _alone = one_spinner();
    let (_, _, id) = bench("spin_cancel");
    // A session of its own, whose first call this is (wait_until_running).
    let mut c = connect();
    c.batch_execute("SET lambdastore.timeout = '60s'").unwrap();
    let pid = backend_pid(&mut c);

    let spinner = std::thread::spawn(move || {
        let result = c
            .query_one("SELECT lambda_invoke($1, 'spin')::text /* spin_cancel */", &[&id])
            .map(|row| row.get::<_, String>(0));
        (c, result)
    });
    let mut observer = connect();
    wait_until_running(&mut observer, pid, "spin_cancel", &spinner);
    let canceled: bool = observer.query_one("SELECT pg_cancel_backend($1)", &[&pid]).unwrap().get(0);
    assert!(canceled);

    let (mut c, result) = spinner.join().unwrap();
    let message = expect_sqlstate(result, "57014");
    assert!(message.contains("canceling statement due to user request"), "{message}");
    assert_serves_calls(&mut c, id);
}

#[test]
fn statement_timeout_stops_a_running_lambda() {
    let _alone = one_spinner();
    let (mut c, _, id) = bench("spin_statement_timeout");
    c.batch_execute("SET lambdastore.timeout = '60s'; SET statement_timeout = '300ms'").unwrap();

    let message = fails_cleanly(&mut c, id, "spin", json!({}), "57014");
    assert!(message.contains("statement timeout"), "{message}");

    c.batch_execute("RESET statement_timeout").unwrap();
    assert_serves_calls(&mut c, id);
}

#[test]
fn allocating_past_the_memory_limit_is_53200() {
    let (mut c, _, id) = bench("memory_limit");
    c.batch_execute("SET lambdastore.memory_limit = '16MB'").unwrap();

    call(&mut c, id, "alloc", json!({"bytes": 1 << 20}));
    let message = fails_cleanly(&mut c, id, "alloc", json!({"bytes": 32 << 20}), "53200");
    assert!(message.contains("lambdastore.memory_limit"), "{message}");
    assert_serves_calls(&mut c, id);
}

#[test]
fn the_default_memory_limit_holds() {
    // 64 MB by default: a lambda cannot take 256 MB of the server's memory.
    let (mut c, _, id) = bench("memory_default");
    fails_cleanly(&mut c, id, "alloc", json!({"bytes": 256 << 20}), "53200");
    assert_serves_calls(&mut c, id);
}

/// A module deploys under the memory limit its calls run with: one that
/// starts with 20 MB of linear memory (as a Python interpreter's snapshot
/// importing a little more of the standard library does) deploys and runs
/// under the default 64 MB, and under 16 MB its deploy is 53200 naming the
/// limit as set. `describe` had at most 16 MiB, whatever the setting: the
/// module could not be deployed at all.
#[test]
fn a_module_deploys_under_the_memory_limit_of_its_calls() {
    let mut c = connect();
    let (app, low) = (app("memory_at_deploy"), app("memory_at_deploy_low"));
    let module = rogue::with_memory(20 << 20);
    deploy(&mut c, &app, &module).unwrap_or_else(|e| panic!("deploy: {}", describe(&e)));
    let id = create(&mut c, &app, "Rogue", json!(null));
    call(&mut c, id, "put_entry", json!({}));
    c.batch_execute("SET lambdastore.memory_limit = '16MB'").unwrap();
    let message = expect_sqlstate(deploy(&mut c, &low, &module), "53200");
    assert!(message.contains("lambdastore.memory_limit (16777216 bytes)"), "{message}");
}

#[test]
fn nesting_past_max_call_depth_is_54001() {
    // deep(n) makes n nested calls, each one level deeper.
    let (mut c, _, id) = bench("call_depth");
    c.batch_execute("SET lambdastore.max_call_depth = 8").unwrap();

    assert_eq!(call(&mut c, id, "deep", json!({"depth": 8})), json!(8));
    let message = fails_cleanly(&mut c, id, "deep", json!({"depth": 9}), "54001");
    assert!(message.contains("lambdastore.max_call_depth"), "{message}");
    assert_serves_calls(&mut c, id);
}

#[test]
fn the_largest_max_call_depth_is_reachable() {
    // Nested calls stack wasm and host frames on the backend's stack: the
    // deepest nesting the setting allows must still fit.
    let (mut c, _, id) = bench("call_depth_max");
    c.batch_execute("SET lambdastore.max_call_depth = 32").unwrap();
    assert_eq!(call(&mut c, id, "deep", json!({"depth": 32})), json!(32));
}

#[test]
fn the_default_call_depth_holds() {
    let (mut c, _, id) = bench("call_depth_default");
    fails_cleanly(&mut c, id, "deep", json!({"depth": 100}), "54001");
    assert_serves_calls(&mut c, id);
}

#[test]
fn arguments_past_max_args_size_are_54000() {
    let (mut c, _, id) = bench("args_size");
    c.batch_execute("SET lambdastore.max_args_size = '1kB'").unwrap();

    let big = "x".repeat(2048);
    let message = fails_cleanly(&mut c, id, "put", json!({"key": "big", "value": big}), "54000");
    assert!(message.contains("lambdastore.max_args_size"), "{message}");
}

/// An entry's field name and key go into the primary key's btree, whose
/// entries PostgreSQL caps at 2,704 bytes (after compressing them): a key
/// past 2,048 bytes is refused when the lambda writes it, in words of its
/// own (before, the commit failed with the index's, naming a row of the
/// table, or not, as the key compressed), and so is a split at one.
#[test]
fn an_entry_key_past_what_the_index_holds_is_54000() {
    let (mut c, _, id) = bench("key_size");
    let long = "k".repeat(2000);
    call(&mut c, id, "put", json!({"key": long, "value": "v"}));
    assert_eq!(call(&mut c, id, "get", json!({"key": long})), json!("v"));

    // PostgreSQL compresses an index entry's columns: 3,000 of one letter
    // would fit its btree, and the limit holds anyway.
    let random = incompressible(3000);
    let message = fails_cleanly(&mut c, id, "put", json!({"key": random, "value": "v"}), "54000");
    assert!(message.contains("an entry's field name and key are"), "{message}");
    let split = c.query_one("SELECT lambdastore.split($1, 'kv', $2)", &[&id, &random.as_bytes()]);
    let message = expect_sqlstate(split, "54000");
    assert!(message.contains("an entry's field name and key are"), "{message}");
    assert_serves_calls(&mut c, id);
}

#[test]
fn a_result_past_max_result_size_is_54000() {
    let (mut c, _, id) = bench("result_size");
    c.batch_execute("SET lambdastore.max_result_size = '1kB'").unwrap();

    call(&mut c, id, "big_result", json!({"bytes": 512}));
    let message = fails_cleanly(&mut c, id, "big_result", json!({"bytes": 4096}), "54000");
    assert!(message.contains("lambdastore.max_result_size"), "{message}");
}

#[test]
fn the_default_result_size_holds() {
    // 1 MB by default.
    let (mut c, _, id) = bench("result_size_default");
    fails_cleanly(&mut c, id, "big_result", json!({"bytes": 2 << 20}), "54000");
    assert_serves_calls(&mut c, id);
}

#[test]
fn limits_raised_only_by_a_superuser() {
    // The server-protecting limits are SUSET: a plain role cannot raise them,
    // while lambdastore.timeout is USERSET like statement_timeout.
    let mut c = connect();
    let role = app("ls_limits_role");
    let mut tx = c.transaction().unwrap();
    // Load the extension's library so that its settings are defined.
    tx.batch_execute(&format!(
        "LOAD 'lambdastore'; CREATE ROLE {role} NOSUPERUSER; SET LOCAL ROLE {role}; SET lambdastore.timeout = '5s'"
    ))
    .unwrap();
    expect_sqlstate(tx.batch_execute("SET lambdastore.memory_limit = '1GB'"), "42501");
    tx.rollback().unwrap();
}

/// A Python lambda (guest-sdk/python/examples/sandbox, a `Probe`) is held
/// to the same limits as a Rust one (`micro`'s `Bench`), with the same
/// SQLSTATEs: a loop is stopped by the timeout (57014), an allocation by
/// the memory limit (53200), its own error is P0001 (an uncaught Python
/// exception too, as what a Rust guest cannot reach at all is an error it
/// gets: a file, a socket, a module the component lacks; the component's
/// WASI imports are stubs that trap, which the SDK keeps a lambda from
/// reaching). The environment is empty; `print` returns normally (to the
/// lambda log); the clock (`time.time()`, `datetime.now()`) and random
/// numbers are the host's.
#[test]
fn a_python_lambda_is_held_to_the_limits_of_a_rust_one() {
    let _alone = one_spinner();
    let (mut c, _, rust) = bench("limits_rust");
    let draws_app = app("limits_python_draws");
    let app = app("limits_python");
    deploy_example(&mut c, &app, "py_sandbox");
    let python = create(&mut c, &app, "Probe", json!(null));
    deploy_example(&mut c, &draws_app, "py_draws");
    let draws = create(&mut c, &draws_app, "Draws", json!(null));
    c.batch_execute("SET lambdastore.timeout = '500ms'; SET statement_timeout = '10s'").unwrap();
    for (id, label) in [(rust, "rust"), (python, "python")] {
        let message = expect_sqlstate(invoke(&mut c, id, "spin", json!({})), "57014");
        assert!(message.contains("lambdastore.timeout"), "{label}: {message}");
        let message = expect_sqlstate(invoke(&mut c, id, "alloc", json!({"bytes": 1u64 << 30})), "53200");
        assert!(message.contains("lambdastore.memory_limit"), "{label}: {message}");
        let message = expect_sqlstate(invoke(&mut c, id, "fail", json!({"message": "refused"})), "P0001");
        assert!(message.contains("refused"), "{label}: {message}");
    }
    expect_sqlstate(invoke(&mut c, rust, "panic", json!({})), "38000");
    let message = expect_sqlstate(invoke(&mut c, python, "divide", json!({"n": 0})), "P0001");
    assert!(message.contains("ZeroDivisionError: division by zero"), "{message}");
    // A file, or a module the component lacks (`socket`, imported in the
    // call), is a Python exception: the function's error unless caught.
    let message = expect_sqlstate(invoke(&mut c, python, "read_file", json!({"path": "/etc/passwd"})), "P0001");
    assert!(message.starts_with("PermissionError: a lambda has no files: '/etc/passwd'"), "{message}");
    let connect = invoke(&mut c, python, "connect", json!({"host": "127.0.0.1", "port": 5432}));
    let message = expect_sqlstate(connect, "P0001");
    assert!(message.starts_with("ModuleNotFoundError: No module named 'socket' in this component"), "{message}");
    assert_eq!(call(&mut c, python, "optional", json!({"module": "fractions"})), json!("ModuleNotFoundError"));
    assert_eq!(call(&mut c, python, "optional", json!({"module": "json"})), json!("imported"));
    assert_eq!(call(&mut c, python, "environment", json!({})), json!({}));
    assert_eq!(call(&mut c, python, "say", json!({"text": "hello"})), json!("hello"));
    let now: f64 = c.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap().get(0);
    for clock in ["clock", "utc_now"] {
        let read = call(&mut c, python, clock, json!({})).as_f64().unwrap();
        assert!((read - now).abs() < 5.0, "{clock}, the host's clock: {read} against {now}");
    }
    // The sandbox binds no name from `random`: its generator is seeded at
    // a call's first draw, so a call that draws nothing does not pay for
    // it. `draws` binds one before the snapshot: its generator is seeded at
    // the start of every call.
    for (id, seeding) in [(python, "first draw"), (draws, "every call")] {
        assert_eq!(call(&mut c, id, "seeding", json!({})), json!(seeding));
        let drawn: Vec<_> = (0..3).map(|_| call(&mut c, id, "draw", json!({}))).collect();
        assert!(drawn[0] != drawn[1] && drawn[1] != drawn[2], "a new seed for each call: {drawn:?}");
    }
    // What the standard library asks WASI for (each trapped, 38000): the
    // workflow's draws and clock, or an exception the lambda catches.
    let first = call(&mut c, python, "standard_library", json!({}));
    let second = call(&mut c, python, "standard_library", json!({}));
    for drawn in ["uuid4", "token", "urandom", "unseeded"] {
        assert_ne!(first[drawn], second[drawn], "{drawn}: a new draw for each call");
    }
    let uuid = first["uuid4"].as_str().unwrap();
    assert!(uuid.len() == 36 && uuid.as_bytes()[14] == b'4', "{uuid}");
    assert_eq!(first["token"].as_str().unwrap().len(), 16, "{first}");
    assert_eq!(first["urandom"].as_str().unwrap().len(), 10, "{first}");
    let today: String = c.query_one("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')", &[]).unwrap().get(0);
    let expected = json!({
        "exists": false, "stat": "PermissionError", "write": "OSError", "isatty": false, "input": "EOFError",
        "sleep": "PermissionError", "today": today, "warn": null, "tempdir": "FileNotFoundError",
    });
    for (key, value) in expected.as_object().unwrap() {
        assert_eq!(&first[key], value, "{key} in {first}");
    }
    assert!(first["stack"].as_u64().unwrap() > 0, "a traceback without its source lines: {first}");
    // Where the component trapped (38000): a BaseException, a message no
    // UTF-8 can hold, a keyword-only parameter, arguments nested past
    // serde_json's 128 (the Rust guest's answer: 22023).
    let message = expect_sqlstate(invoke(&mut c, python, "raise_base", json!({})), "P0001");
    assert!(message.starts_with("KeyboardInterrupt"), "{message}");
    let message = expect_sqlstate(invoke(&mut c, python, "fail_surrogate", json!({})), "P0001");
    assert!(message.starts_with("bad \\ud800 message"), "{message}");
    assert_eq!(call(&mut c, python, "log_surrogate", json!({})), json!("logged"));
    assert_eq!(call(&mut c, python, "keyword_only", json!({"a": 1})), json!(12));
    let nested = (0..900).fold(json!("x"), |inner, _| json!([inner]));
    let relayed = json!({"target": rust, "method": "get", "args": nested});
    for (id, function, args) in [(python, "say", json!({"text": nested})), (rust, "relay", relayed)] {
        let message = expect_sqlstate(invoke(&mut c, id, function, args), "22023");
        assert!(message.contains("recursion limit exceeded"), "{function}: {message}");
    }
    // `draws` has no `from __future__ import annotations`: CPython 3.14
    // defers a class's annotations, and its field was not found (P0001
    // "AttributeError: 'Draws' object has no attribute 'calls'").
    assert_eq!(call(&mut c, draws, "count", json!({})), json!(1));
    assert_eq!(call(&mut c, draws, "count", json!({})), json!(2));
    let seeded = call(&mut c, python, "draw_seeded", json!({"seed": 42}));
    assert_eq!(call(&mut c, python, "draw_seeded", json!({"seed": 42})), seeded, "a seed the lambda sets holds");
    assert_serves_calls(&mut c, rust);
}

/// Every call runs in a fresh instance: nothing a call wrote into its
/// linear memory is there for the next one, although the next instance
/// reuses the slot and keeps what the last one wrote mapped, copied back
/// from the snapshot (runtime/engine.rs, `KEEP_RESIDENT_SCANNED`). The
/// sandbox's `scribble` writes 256 separate runs of pages besides the
/// interpreter's own, far more than the 32 one PAGEMAP_SCAN reports
/// (third_party/README.md); each call must still find none written.
#[test]
fn a_python_call_finds_nothing_the_last_call_wrote_in_its_memory() {
    let mut c = connect();
    let app = app("fresh_python");
    deploy_example(&mut c, &app, "py_sandbox");
    let probe = create(&mut c, &app, "Probe", json!(null));
    for call_number in 1..=3 {
        assert_eq!(call(&mut c, probe, "scribble", json!({})), json!(0), "call {call_number}");
    }
}
