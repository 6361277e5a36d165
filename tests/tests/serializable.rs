//! Serializable workflows under real concurrency (docs/ARCHITECTURE.md, "Serializable workflows"): many
//! connections, thousands of transactions, and a client that retries on
//! 40001 like any client of a serializable database.
//!
//! Each anomaly test is one scenario run through [`prove`] twice, by two test
//! functions: with `lambdastore.concurrency_control = occ` it must find no
//! anomaly (and must have met contention: serialization failures); with
//! `off` it must find at least one, which proves that the check can fail and
//! that the workers really race. Contention comes from the workers alone
//! (barriers at the start of each round, no sleeps).
//!
//! Run with `-- --nocapture` to see the counts of every run.

mod common;

use common::concurrent::*;
use common::*;
use postgres::{Client, GenericClient};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// Client connections per test.
const THREADS: usize = 8;
/// How long a test's workers may take before they count as hung: several
/// times what they need on a busy 2-core machine.
const WATCHDOG: Duration = Duration::from_secs(180);
/// Runs of a scenario under `off` before concluding that it cannot find
/// its anomaly.
const OFF_ROUNDS: usize = 5;

/// `n` operations times `LAMBDASTORE_TEST_SCALE` (default 1): the suites
/// run again against a Citus coordinator (scripts/e2e-citus.sh --suites)
/// with half as many, where every call crosses nodes and costs several
/// times more; zero anomalies under occ and some under off hold at either
/// size.
fn scaled(n: usize) -> usize {
    let scale: f64 = std::env::var("LAMBDASTORE_TEST_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    ((n as f64 * scale).round() as usize).max(1)
}

// ---------------------------------------------------------------------------
// The harness

/// What one run of a scenario saw.
struct Outcome {
    tally: Tally,
    /// Violations of the scenario's invariant.
    anomalies: u64,
    /// The numbers behind `anomalies`, for the report.
    details: String,
}

/// Runs `scenario` under `cc` and checks what it must show: no anomaly
/// under `occ`, at least one under `off` (repeating the run a few times, as
/// races are races).
fn prove(test: &str, cc: Cc, scenario: impl Fn(Cc) -> Outcome) {
    let report = |run: usize, o: &Outcome| {
        println!("{test} [{cc}] run {run}: {} anomalies; {}; {}", o.anomalies, o.tally, o.details)
    };
    match cc {
        Cc::Occ => {
            let outcome = scenario(cc);
            report(1, &outcome);
            assert_eq!(outcome.anomalies, 0, "{test}: anomalies under occ: {}", outcome.details);
            assert!(
                outcome.tally.retries > 0,
                "{test}: not one serialization failure under occ, so the workers never \
                 contended and the run proves nothing ({})",
                outcome.tally
            );
        }
        Cc::Off => {
            for run in 1..=OFF_ROUNDS {
                let outcome = scenario(cc);
                report(run, &outcome);
                assert_eq!(
                    outcome.tally.retries, 0,
                    "{test}: serialization failures under off, which validates nothing: {:?}",
                    outcome.tally.first_conflict
                );
                if outcome.anomalies > 0 {
                    return;
                }
            }
            panic!(
                "{test}: no anomaly under off in {OFF_ROUNDS} runs, so this test cannot tell \
                 occ from off"
            );
        }
    }
}

/// The result of a call the test expects to succeed (after retries).
#[track_caller]
fn ok<T>(result: Result<T, postgres::Error>, what: impl Display) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {}", describe(&e)))
}

fn as_i64(value: Value) -> i64 {
    value.as_i64().unwrap_or_else(|| panic!("expected an integer, got {value}"))
}

fn balance(c: &mut impl GenericClient, account: i64) -> i64 {
    as_i64(call(c, account, "balance", json!({})))
}

fn counter_value(c: &mut impl GenericClient, counter: i64) -> i64 {
    as_i64(call(c, counter, "get", json!({})))
}

/// Opens `n` accounts with `initial` each, in one transaction.
fn open_accounts(c: &mut Client, bank: &str, n: usize, initial: i64) -> Vec<i64> {
    let mut tx = c.transaction().unwrap();
    let ids = (0..n)
        .map(|i| {
            let owner = format!("owner {i}");
            create(&mut tx, bank, "Account", json!({"owner": owner, "initial": initial}))
        })
        .collect();
    tx.commit().unwrap();
    ids
}

/// The SDK's key encoding of a string (guest-sdk/sdk/src/key.rs): the
/// bytes with 0x00 escaped as 0x00 0xFF, then 0x00 0x01.
fn string_key(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    for &b in s.as_bytes() {
        out.push(b);
        if b == 0 {
            out.push(0xff);
        }
    }
    out.extend([0, 1]);
    out
}

/// One row of `lambdastore.entry_sets(object)`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct EntrySet {
    field: String,
    key: Vec<u8>,
    version: i64,
    conflicts: i64,
}

impl EntrySet {
    fn lower(&self) -> (&str, &[u8]) {
        (&self.field, &self.key)
    }
}

fn entry_sets(c: &mut impl GenericClient, object: i64) -> Vec<EntrySet> {
    c.query("SELECT lower_field, lower_key, version, conflicts FROM lambdastore.entry_sets($1)", &[&object])
        .unwrap()
        .iter()
        .map(|r| EntrySet { field: r.get(0), key: r.get(1), version: r.get(2), conflicts: r.get(3) })
        .collect()
}

/// `lambdastore.split(object, field, key)`: whether a guard was inserted.
fn split(c: &mut impl GenericClient, object: i64, field: &str, key: &[u8]) -> Result<bool, postgres::Error> {
    let row = c.query_one("SELECT lambdastore.split($1, $2, $3)", &[&object, &field, &key])?;
    Ok(row.get(0))
}

// ---------------------------------------------------------------------------
// Lost update

/// Concurrent increments of one counter: the final value must equal the
/// number of increments that committed.
fn lost_update(cc: Cc) -> Outcome {
    let per_thread = scaled(250);
    let mut c = connect();
    let app = app(&format!("lost_update_{cc}"));
    deploy_example(&mut c, &app, "counter");
    let counter = create(&mut c, &app, "Counter", json!({}));

    let tallies = run_workers("lost_update", THREADS, WATCHDOG, move |i| {
        let mut c = connect_cc(cc);
        let (mut rng, mut tally) = (Rng::new(i as u64), Tally::default());
        for _ in 0..per_thread {
            let done = retrying(cc, &mut tally, &mut rng, || invoke(&mut c, counter, "increment", json!({})));
            ok(done, "increment");
            tally.committed += 1;
        }
        tally
    });

    let tally = Tally::sum(&tallies);
    let value = counter_value(&mut c, counter);
    Outcome {
        anomalies: tally.committed.abs_diff(value as u64),
        details: format!("{} increments committed, the counter is at {value}", tally.committed),
        tally,
    }
}

#[test]
fn lost_update_occ() {
    prove("lost_update", Cc::Occ, lost_update);
}

#[test]
fn lost_update_off() {
    prove("lost_update", Cc::Off, lost_update);
}

// ---------------------------------------------------------------------------
// Write skew

/// Pairs of accounts with 100 each; in each round all workers call
/// `withdraw_if_covered(other, 150)` on the same pair, half on each side.
/// Each call checks the sum of both and debits only its own side, so in any
/// serial order exactly one withdrawal succeeds (200 >= 150, then 50 < 150)
/// and the pair ends at 50.
fn write_skew(cc: Cc) -> Outcome {
    let pair_count = scaled(200);
    let mut c = connect();
    let bank = app(&format!("write_skew_{cc}"));
    deploy_example(&mut c, &bank, "bank");
    let accounts = open_accounts(&mut c, &bank, 2 * pair_count, 100);
    let pairs: Arc<Vec<(i64, i64)>> = Arc::new(accounts.chunks(2).map(|p| (p[0], p[1])).collect());
    let (anomalies, example, tally) = withdraw_if_covered(cc, pairs, THREADS, WATCHDOG);
    Outcome {
        anomalies,
        details: format!("{pair_count} pairs, each must end with one withdrawal and a sum of 50{example}"),
        tally,
    }
}

#[test]
fn write_skew_occ() {
    prove("write_skew", Cc::Occ, write_skew);
}

#[test]
fn write_skew_off() {
    prove("write_skew", Cc::Off, write_skew);
}

// ---------------------------------------------------------------------------
// Phantom

/// In each round all workers call `insert_if_fewer` on the same fresh key
/// range of one object with `max` 5, each with its own key: the range scan
/// decides, so in any serial order exactly 5 inserts succeed.
fn phantom(cc: Cc) -> Outcome {
    phantom_on(cc, "phantom", false)
}

/// The same on an object split beforehand at every range's start and every
/// key a worker inserts: more entry sets than a workflow loads at once
/// (1,024), so each set is looked up as it is touched, and each insert
/// lands in a set of its own.
fn phantom_many_sets(cc: Cc) -> Outcome {
    phantom_on(cc, "phantom_many_sets", true)
}

fn phantom_on(cc: Cc, name: &str, presplit: bool) -> Outcome {
    let rounds = scaled(250);
    const MAX: usize = 5;
    let mut c = connect();
    let app = app(&format!("{name}_{cc}"));
    deploy_example(&mut c, &app, "micro");
    let bench = create(&mut c, &app, "Bench", json!({}));
    let range = |round: usize| (format!("r{round:04}/"), format!("r{round:04}0"));
    if presplit {
        let guards: Vec<Vec<u8>> = (0..rounds)
            .flat_map(|round| {
                let start = range(round).0;
                let keys = (0..THREADS).map(move |i| format!("{start}t{i}"));
                std::iter::once(range(round).0).chain(keys).map(|key| string_key(&key))
            })
            .collect();
        for batch in guards.chunks(250) {
            c.execute("SELECT count(lambdastore.split($1, 'kv', k)) FROM unnest($2::bytea[]) AS k", &[&bench, &batch])
                .unwrap();
        }
        let sets = entry_sets(&mut c, bench).len();
        assert!(sets > 1024, "{sets} entry sets: too few to be loaded one by one");
    }
    let barrier = Arc::new(Barrier::new(THREADS));

    let results = run_workers("phantom", THREADS, WATCHDOG, move |i| {
        let mut c = connect_cc(cc);
        let (mut rng, mut tally) = (Rng::new(i as u64), Tally::default());
        let mut inserted = Vec::new();
        for round in 0..rounds {
            let (start, end) = range(round);
            let args = json!({"start": start, "end": end, "max": MAX, "key": format!("{start}t{i}")});
            barrier.wait();
            let result = retrying(cc, &mut tally, &mut rng, || invoke(&mut c, bench, "insert_if_fewer", args.clone()));
            if ok(result, "insert_if_fewer") == json!(true) {
                inserted.push(round);
            }
            tally.committed += 1;
        }
        (tally, inserted)
    });

    let tally = Tally::sum(results.iter().map(|(t, _)| t));
    let mut said_inserted = vec![0usize; rounds];
    for round in results.iter().flat_map(|(_, r)| r) {
        said_inserted[*round] += 1;
    }
    let listing: Vec<(String, String)> =
        serde_json::from_value(call_settled(&mut c, bench, "list", json!({}))).unwrap();
    let mut present = vec![0usize; rounds];
    for (key, _) in &listing {
        present[key[1..5].parse::<usize>().unwrap()] += 1;
    }
    let (mut anomalies, mut example) = (0, String::new());
    for round in 0..rounds {
        if present[round] != MAX || said_inserted[round] != present[round] {
            anomalies += 1;
            if example.is_empty() {
                example = format!(
                    "; e.g. round {round}: {} entries in the range, {} calls returned true",
                    present[round], said_inserted[round]
                );
            }
        }
    }
    Outcome { anomalies, details: format!("{rounds} ranges, each must end with {MAX} entries{example}"), tally }
}

#[test]
fn phantom_occ() {
    prove("phantom", Cc::Occ, phantom);
}

#[test]
fn phantom_off() {
    prove("phantom", Cc::Off, phantom);
}

#[test]
fn phantom_on_an_object_with_more_sets_than_loaded_at_once_occ() {
    prove("phantom_many_sets", Cc::Occ, phantom_many_sets);
}

#[test]
fn phantom_on_an_object_with_more_sets_than_loaded_at_once_off() {
    prove("phantom_many_sets", Cc::Off, phantom_many_sets);
}

// ---------------------------------------------------------------------------
// Read skew

/// One writer moves money back and forth between two accounts (one writer,
/// so that the total stays constant even without OCC: only the readers can
/// go wrong); the other workers read both balances with `total_with`, which
/// reads its own balance, then the other's in a nested call. Each must see
/// the constant total.
fn read_skew(cc: Cc) -> Outcome {
    let transfers = scaled(600);
    const TOTAL: i64 = 2000;
    let mut c = connect();
    let bank = app(&format!("read_skew_{cc}"));
    deploy_example(&mut c, &bank, "bank");
    let ids = open_accounts(&mut c, &bank, 2, TOTAL / 2);
    let (a, b) = (ids[0], ids[1]);
    let writing = Arc::new(AtomicBool::new(true));
    let barrier = Arc::new(Barrier::new(THREADS));

    let results = run_workers("read_skew", THREADS, WATCHDOG, move |i| {
        let mut c = connect_cc(cc);
        let (mut rng, mut tally) = (Rng::new(i as u64), Tally::default());
        let mut skewed: Vec<i64> = Vec::new();
        barrier.wait();
        if i == 0 {
            for _ in 0..transfers {
                let (from, to) = if rng.below(2) == 0 { (a, b) } else { (b, a) };
                let amount = 1 + rng.below(100) as i64;
                let result = retrying(cc, &mut tally, &mut rng, || {
                    invoke(&mut c, from, "transfer", json!({"to": to, "amount": amount}))
                });
                if refused(&result, "insufficient funds", "transfer") {
                    tally.refused += 1;
                } else {
                    tally.committed += 1;
                }
            }
            writing.store(false, Ordering::SeqCst);
        } else {
            while writing.load(Ordering::SeqCst) {
                let (me, other) = if rng.below(2) == 0 { (a, b) } else { (b, a) };
                let total =
                    retrying(cc, &mut tally, &mut rng, || invoke(&mut c, me, "total_with", json!({"other": other})));
                let total = as_i64(ok(total, "total_with"));
                if total != TOTAL {
                    skewed.push(total);
                }
                tally.committed += 1;
            }
        }
        (tally, skewed)
    });

    let reads: u64 = results[1..].iter().map(|(t, _)| t.committed).sum();
    let skewed: Vec<i64> = results.iter().flat_map(|(_, s)| s.clone()).collect();
    let tally = Tally::sum(results.iter().map(|(t, _)| t));
    let after = balance(&mut c, a) + balance(&mut c, b);
    Outcome {
        anomalies: skewed.len() as u64 + u64::from(after != TOTAL),
        details: format!(
            "{reads} reads saw {} totals other than {TOTAL} (e.g. {:?}); total at the end {after}",
            skewed.len(),
            skewed.first()
        ),
        tally,
    }
}

#[test]
fn read_skew_occ() {
    prove("read_skew", Cc::Occ, read_skew);
}

#[test]
fn read_skew_off() {
    prove("read_skew", Cc::Off, read_skew);
}

// ---------------------------------------------------------------------------
// Errors are answers too

/// Accounts a = 100 and b = 0; one writer moves the 100 back and forth, so
/// a + b = 100 in every committed state. Readers ask
/// `withdraw_if_covered(me, other, 100)` in a transaction they roll back:
/// always covered in a serial order, so "not covered" (P0001) is an answer
/// no serial execution gives. It was given under occ too, until a failure
/// was validated like a success (occ::failed): the error was computed from
/// two balances read at different moments.
fn impossible_errors(cc: Cc) -> Outcome {
    impossible_errors_via(cc, false)
}

/// The same with the error handled one level down: a third account's
/// `try_withdraw` calls `withdraw_if_covered` and returns false on its
/// error, committing its workflow. The callee's reads stay in the caller's
/// read set, so a false answer must be one a serial order gives too.
fn impossible_errors_nested(cc: Cc) -> Outcome {
    impossible_errors_via(cc, true)
}

fn impossible_errors_via(cc: Cc, nested: bool) -> Outcome {
    let read_count = scaled(2000);
    const TOTAL: i64 = 100;
    let mut c = connect();
    let bank = app(&format!("impossible_errors_{cc}"));
    deploy_example(&mut c, &bank, "bank");
    let a = create(&mut c, &bank, "Account", json!({"owner": "a", "initial": TOTAL}));
    let b = create(&mut c, &bank, "Account", json!({"owner": "b", "initial": 0}));
    let auditor = create(&mut c, &bank, "Account", json!({"owner": "auditor", "initial": 0}));
    let writing = Arc::new(AtomicBool::new(true));
    let barrier = Arc::new(Barrier::new(THREADS));
    let readers = THREADS - 1;

    let results = run_workers("impossible_errors", THREADS, WATCHDOG, move |i| {
        let mut c = connect_cc(cc);
        let (mut rng, mut tally) = (Rng::new(i as u64), Tally::default());
        let mut impossible = 0u64;
        barrier.wait();
        if i == 0 {
            let mut from_a = true;
            while writing.load(Ordering::SeqCst) {
                let (from, to) = if from_a { (a, b) } else { (b, a) };
                let result = retrying(cc, &mut tally, &mut rng, || {
                    invoke(&mut c, from, "transfer", json!({"to": to, "amount": TOTAL}))
                });
                ok(result, "transfer");
                from_a = !from_a;
            }
        } else {
            for n in 0..read_count.div_ceil(readers) {
                let (me, other) = if n % 2 == 0 { (a, b) } else { (b, a) };
                let result = retrying(cc, &mut tally, &mut rng, || {
                    let mut tx = c.transaction()?;
                    let outcome = if nested {
                        let args = json!({"account": me, "other": other, "amount": TOTAL});
                        invoke(&mut tx, auditor, "try_withdraw", args)
                    } else {
                        invoke(&mut tx, me, "withdraw_if_covered", json!({"other": other, "amount": TOTAL}))
                    };
                    tx.rollback()?;
                    outcome
                });
                let refusal = match nested {
                    true => ok(result, "try_withdraw") == json!(false),
                    false => refused(&result, "not covered", "withdraw_if_covered"),
                };
                if refusal {
                    impossible += 1;
                }
                tally.committed += 1;
            }
            if i == 1 {
                writing.store(false, Ordering::SeqCst);
            }
        }
        (tally, impossible)
    });
    let impossible: u64 = results.iter().map(|(_, n)| n).sum();
    let reads: u64 = results[1..].iter().map(|(t, _)| t.committed).sum();
    Outcome {
        anomalies: impossible,
        details: format!("{impossible} of {reads} withdrawals were refused as not covered"),
        tally: Tally::sum(results.iter().map(|(t, _)| t)),
    }
}

#[test]
fn impossible_errors_occ() {
    prove("impossible_errors", Cc::Occ, impossible_errors);
}

#[test]
fn impossible_errors_off() {
    prove("impossible_errors", Cc::Off, impossible_errors);
}

#[test]
fn impossible_errors_handled_by_a_caller_occ() {
    prove("impossible_errors_nested", Cc::Occ, impossible_errors_nested);
}

#[test]
fn impossible_errors_handled_by_a_caller_off() {
    prove("impossible_errors_nested", Cc::Off, impossible_errors_nested);
}

/// The same check run as jobs: a job that ends `failed` records an error,
/// which must be one a serial order gives (a stale one is retried as a
/// 40001 instead). Jobs run with the server's `occ`.
#[test]
fn a_failed_job_records_no_impossible_error() {
    let job_count = scaled(1000) as i64;
    const TOTAL: i64 = 100;
    let mut c = connect();
    let bank = app("impossible_job_errors");
    deploy_example(&mut c, &bank, "bank");
    let a = create(&mut c, &bank, "Account", json!({"owner": "a", "initial": TOTAL}));
    let b = create(&mut c, &bank, "Account", json!({"owner": "b", "initial": 0}));
    c.execute(
        "SELECT lambdastore.submit(CASE WHEN g % 2 = 0 THEN $1::int8 ELSE $2::int8 END, 'covered',
                                   jsonb_build_object('other', CASE WHEN g % 2 = 0 THEN $2::int8 ELSE $1::int8 END, 'amount', $3::int8))
           FROM generate_series(1, $4::int8) g",
        &[&a, &b, &TOTAL, &job_count],
    )
    .unwrap();
    // Money moves back and forth until the jobs are done.
    let (mut tally, mut rng) = (Tally::default(), Rng::new(7));
    let mut w = connect_cc(Cc::Occ);
    let mut from_a = true;
    let queued = |c: &mut Client| jobs_in_state(c, &bank, "queued").unwrap_or(0);
    while queued(&mut c) > 0 {
        let (from, to) = if from_a { (a, b) } else { (b, a) };
        let transfer = retrying(Cc::Occ, &mut tally, &mut rng, || {
            invoke(&mut w, from, "transfer", json!({"to": to, "amount": TOTAL}))
        });
        ok(transfer, "transfer");
        from_a = !from_a;
    }
    let failed: Vec<(String, i32)> = c
        .query("SELECT error, attempts FROM lambdastore.jobs WHERE app = $1 AND state = 'failed'", &[&bank])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert!(failed.is_empty(), "{} of {job_count} jobs failed, e.g. {:?}", failed.len(), failed.first());
    assert_eq!(jobs_in_state(&mut c, &bank, "done"), Some(job_count));
}

// ---------------------------------------------------------------------------
// Bank invariant

/// Random transfers among 100 accounts: the total (summed with `balance`
/// calls) never changes, no account goes negative, and every committed
/// transfer left its two audit entries.
fn bank_invariant(cc: Cc) -> Outcome {
    const ACCOUNTS: usize = 100;
    const INITIAL: i64 = 1000;
    let per_thread = scaled(300);
    let mut c = connect();
    let bank = app(&format!("bank_invariant_{cc}"));
    deploy_example(&mut c, &bank, "bank");
    let accounts = Arc::new(open_accounts(&mut c, &bank, ACCOUNTS, INITIAL));
    let (anomalies, details, tally) = random_transfers(cc, accounts, INITIAL, THREADS, per_thread, WATCHDOG);
    Outcome { anomalies, details, tally }
}

#[test]
fn bank_invariant_occ() {
    prove("bank_invariant", Cc::Occ, bank_invariant);
}

#[test]
fn bank_invariant_off() {
    prove("bank_invariant", Cc::Off, bank_invariant);
}

// ---------------------------------------------------------------------------
// Lost update across languages

/// Bank transfers from many accounts into one Python wallet
/// (guest-sdk/python/examples/wallet): each is Rust → Python → Rust in one
/// workflow (the wallet's deposit reads the paying account's audit back).
/// The wallet must hold exactly what the committed transfers moved, and
/// the money in all must stay what it was.
fn mixed_language_lost_update(cc: Cc) -> Outcome {
    const ACCOUNTS: usize = 16;
    const INITIAL: i64 = 1000;
    let per_thread = scaled(30);
    let mut c = connect();
    let bank = app(&format!("mixed_bank_{cc}"));
    deploy_example(&mut c, &bank, "bank");
    let wallets = app(&format!("mixed_wallet_{cc}"));
    deploy_example(&mut c, &wallets, "py_wallet");
    let accounts = Arc::new(open_accounts(&mut c, &bank, ACCOUNTS, INITIAL));
    let wallet = create(&mut c, &wallets, "Wallet", json!({"holder": "all"}));

    let paying = Arc::clone(&accounts);
    let tallies = run_workers("mixed_language_lost_update", THREADS, WATCHDOG, move |i| {
        let mut c = connect_cc(cc);
        let (mut rng, mut tally) = (Rng::new(i as u64), Tally::default());
        for _ in 0..per_thread {
            let from = paying[rng.below(ACCOUNTS as u64) as usize];
            let transfer = || invoke(&mut c, from, "transfer", json!({"to": wallet, "amount": 1}));
            match retrying(cc, &mut tally, &mut rng, transfer) {
                Ok(_) => tally.committed += 1,
                // Two transfers from one account that numbered their audit
                // entries alike (a lost update in Rust) meet the wallet's
                // check of each debit, in Python.
                Err(e) if describe(&e).contains("already credited") => tally.refused += 1,
                Err(e) => panic!("transfer to the wallet: {}", describe(&e)),
            }
        }
        tally
    });

    let tally = Tally::sum(&tallies);
    let held = as_i64(call(&mut c, wallet, "balance", json!({})));
    let banked: i64 = accounts.iter().map(|a| balance(&mut c, *a)).sum();
    let total = ACCOUNTS as i64 * INITIAL;
    Outcome {
        anomalies: tally.refused + tally.committed.abs_diff(held as u64) + total.abs_diff(banked + held),
        details: format!(
            "{} transfers committed, {} debits numbered twice, the wallet holds {held}, the bank {banked} of {total}",
            tally.committed, tally.refused
        ),
        tally,
    }
}

#[test]
fn mixed_language_lost_update_occ() {
    prove("mixed_language_lost_update", Cc::Occ, mixed_language_lost_update);
}

#[test]
fn mixed_language_lost_update_off() {
    prove("mixed_language_lost_update", Cc::Off, mixed_language_lost_update);
}

// ---------------------------------------------------------------------------
// A transaction of several invocations

/// Write skew again, but decided by the client across statements of one SQL
/// transaction: BEGIN; read counter A; read counter B; if A + B >= 150,
/// subtract 150 from one of them; COMMIT. Each invocation is a workflow of
/// its own, so only read locks kept until COMMIT make the whole transaction
/// serializable: exactly one subtraction per pair.
fn multi_statement(cc: Cc) -> Outcome {
    let pair_count = scaled(150);
    let mut c = connect();
    let app = app(&format!("multi_statement_{cc}"));
    deploy_example(&mut c, &app, "counter");
    let pairs: Arc<Vec<(i64, i64)>> = Arc::new(
        (0..pair_count)
            .map(|_| {
                let a = create(&mut c, &app, "Counter", json!({"initial": 100}));
                let b = create(&mut c, &app, "Counter", json!({"initial": 100}));
                (a, b)
            })
            .collect(),
    );
    let (anomalies, example, tally) = subtract_if_covered(cc, pairs, THREADS, WATCHDOG);
    Outcome {
        anomalies,
        details: format!("{pair_count} pairs, each must end with one subtraction and a sum of 50{example}"),
        tally,
    }
}

#[test]
fn multi_statement_transaction_occ() {
    prove("multi_statement_transaction", Cc::Occ, multi_statement);
}

#[test]
fn multi_statement_transaction_off() {
    prove("multi_statement_transaction", Cc::Off, multi_statement);
}

// ---------------------------------------------------------------------------
// Write locks held until the transaction ends, never waited for; reads
// validated again by every later call of the transaction

#[test]
fn a_transaction_holds_its_write_locks_and_revalidates_its_reads_until_it_ends() {
    let (mut c, app) = deployed("locks_held", "counter");
    let counter = create(&mut c, &app, "Counter", json!({}));
    let (mut first, mut second) = (connect_cc(Cc::Occ), connect_cc(Cc::Occ));

    // A read takes no lock: a writer commits under an open reader, and the
    // reader's transaction then fails at its next call, which validates
    // the earlier read again (reading 0 then 1 would not be serializable).
    first.batch_execute("BEGIN").unwrap();
    assert_eq!(call(&mut first, counter, "get", json!({})), json!(0));
    assert_eq!(call(&mut second, counter, "increment", json!({})), json!(1));
    let started = Instant::now();
    let message = expect_sqlstate(invoke(&mut first, counter, "get", json!({})), "40001");
    assert!(started.elapsed() < Duration::from_secs(5), "the reader waited {:?} before failing", started.elapsed());
    assert!(
        message.contains(&format!("object {counter}")) && message.contains("entry set"),
        "a serialization failure names the object and the entry set: {message}"
    );
    first.batch_execute("ROLLBACK").unwrap();
    // A reader that commits after its only call is serialized before the
    // writer: nothing fails.
    first.batch_execute("BEGIN").unwrap();
    assert_eq!(call(&mut first, counter, "get", json!({})), json!(1));
    assert_eq!(call(&mut second, counter, "increment", json!({})), json!(2));
    first.batch_execute("COMMIT").unwrap();

    // A write keeps its entry set locked exclusively: a reader cannot
    // validate against the uncommitted version.
    first.batch_execute("BEGIN").unwrap();
    assert_eq!(call(&mut first, counter, "increment", json!({})), json!(3));
    expect_sqlstate(invoke(&mut second, counter, "get", json!({})), "40001");
    // The writer's own transaction goes on reading and writing the set.
    assert_eq!(call(&mut first, counter, "get", json!({})), json!(3));
    assert_eq!(call(&mut first, counter, "increment", json!({})), json!(4));
    first.batch_execute("COMMIT").unwrap();
    assert_eq!(call(&mut second, counter, "get", json!({})), json!(4));

    // A rolled-back transaction releases its locks and leaves nothing.
    first.batch_execute("BEGIN").unwrap();
    call(&mut first, counter, "increment", json!({}));
    first.batch_execute("ROLLBACK").unwrap();
    assert_eq!(call(&mut second, counter, "increment", json!({})), json!(5));

    // A savepoint rolled back over a writing call takes the write with it
    // (PostgreSQL also releases the set's lock then); the transaction goes
    // on, and its next write locks the set again. Until it ends it still
    // counts as a writer of the set: others get false conflicts, never a
    // second writer.
    first.batch_execute("BEGIN; SAVEPOINT s").unwrap();
    assert_eq!(call(&mut first, counter, "increment", json!({})), json!(6));
    first.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    assert_eq!(call(&mut first, counter, "get", json!({})), json!(5));
    expect_sqlstate(invoke(&mut second, counter, "increment", json!({})), "40001");
    // The client has the error before the server has aborted the failed
    // transaction and released the lock its write took; the next statement
    // on that connection runs only after the abort.
    second.batch_execute("SELECT 1").unwrap();
    assert_eq!(call(&mut first, counter, "increment", json!({})), json!(6));
    let held: i64 = first
        .query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    assert_eq!(held, 1, "the write after the rollback holds the set's lock again");
    expect_sqlstate(invoke(&mut second, counter, "increment", json!({})), "40001");
    first.batch_execute("COMMIT").unwrap();
    assert_eq!(call(&mut second, counter, "increment", json!({})), json!(7));
}

/// A reader that meets a transaction committing a set it reads waits for
/// that transaction to end (`lambdastore.commit_wait`) and reads what it
/// committed, instead of failing with 40001: after a write in an open
/// transaction and after PREPARE TRANSACTION (a Citus node's part waiting
/// for COMMIT PREPARED). With the wait off, the same read fails at once.
#[test]
fn a_reader_waits_for_a_committing_writer_and_reads_what_it_committed() {
    let (mut c, app) = deployed("commit_wait", "counter");
    let counter = create(&mut c, &app, "Counter", json!({}));
    let mut writer = connect_cc(Cc::Occ);
    let reader_pid = |reader: &mut Client| backend_pid(reader);
    // The reader's call, in a thread of its own; the writer ends as soon as
    // the reader is seen waiting.
    let read_while_held = |end_writer: &dyn Fn(), wait: &str| {
        let mut reader = connect_cc(Cc::Occ);
        // A long timeout: the wait is capped at half the call's time left.
        reader
            .batch_execute(&format!("SET lambdastore.timeout = '10min'; SET lambdastore.commit_wait = '{wait}'"))
            .unwrap();
        let pid = reader_pid(&mut reader);
        let read = std::thread::spawn(move || invoke(&mut reader, counter, "get", json!({})).map_err(|e| describe(&e)));
        wait_until_waiting_for_a_writer(&mut connect(), pid);
        end_writer();
        read.join().unwrap()
    };

    // A write held open: the reader waits, then reads the committed value.
    writer.batch_execute("BEGIN").unwrap();
    assert_eq!(call(&mut writer, counter, "increment", json!({})), json!(1));
    let writer = Mutex::new(writer);
    let commit = || writer.lock().unwrap().batch_execute("COMMIT").unwrap();
    assert_eq!(read_while_held(&commit, "1min"), Ok(json!(1)), "the reader reads what the writer committed");

    // A write rolled back: the reader reads the value from before it.
    let mut w = writer.into_inner().unwrap();
    w.batch_execute("BEGIN").unwrap();
    call(&mut w, counter, "increment", json!({}));
    let writer = Mutex::new(w);
    let rollback = || writer.lock().unwrap().batch_execute("ROLLBACK").unwrap();
    assert_eq!(read_while_held(&rollback, "1min"), Ok(json!(1)));

    // A prepared transaction (as Citus leaves each node's part until
    // COMMIT PREPARED, sent from another connection): the reader waits for
    // it as well.
    let mut w = writer.into_inner().unwrap();
    let max: String = w.query_one("SHOW max_prepared_transactions", &[]).unwrap().get(0);
    assert_ne!(max, "0", "the test cluster allows prepared transactions (scripts/cluster.sh)");
    w.batch_execute("BEGIN").unwrap();
    call(&mut w, counter, "increment", json!({}));
    w.batch_execute("PREPARE TRANSACTION 'commit_wait_test'").unwrap();
    let commit_prepared = || connect().batch_execute("COMMIT PREPARED 'commit_wait_test'").unwrap();
    assert_eq!(read_while_held(&commit_prepared, "1min"), Ok(json!(2)));

    // The protection off: the same read fails at once, and a bounded wait
    // fails when its bound passes.
    for wait in ["0", "100ms"] {
        w.batch_execute("BEGIN").unwrap();
        call(&mut w, counter, "increment", json!({}));
        let mut reader = connect_cc(Cc::Occ);
        reader.batch_execute(&format!("SET lambdastore.commit_wait = '{wait}'")).unwrap();
        expect_sqlstate(invoke(&mut reader, counter, "get", json!({})), "40001");
        w.batch_execute("ROLLBACK").unwrap();
    }
    // A transaction that holds a set itself does not wait (two of them
    // could wait for each other): it fails at once whatever the setting.
    let mut other = connect_cc(Cc::Occ);
    let second = create(&mut c, &app, "Counter", json!({}));
    other.batch_execute("SET lambdastore.timeout = '10min'; SET lambdastore.commit_wait = '1min'; BEGIN").unwrap();
    call(&mut other, second, "increment", json!({}));
    w.batch_execute("BEGIN").unwrap();
    call(&mut w, counter, "increment", json!({}));
    let started = Instant::now();
    expect_sqlstate(invoke(&mut other, counter, "get", json!({})), "40001");
    assert!(started.elapsed() < Duration::from_secs(30), "a transaction holding a set waited {:?}", started.elapsed());
    w.batch_execute("ROLLBACK").unwrap();
}

/// Transactions that take the same entry sets in opposite orders (several
/// invocations each, plus single-call transfers that lock two accounts
/// through a nested call) must all finish: OCC try-locks, and waits for a
/// writer only while its own transaction holds no set on the node and at
/// most `lambdastore.commit_wait`, so nothing deadlocks. A monitor also
/// checks that no backend of the test ever waits in PostgreSQL's lock
/// manager for another's row or advisory lock.
#[test]
fn transactions_locking_in_opposite_orders_never_hang() {
    let per_thread = scaled(60);
    const INITIAL: i64 = 10_000;
    let mut c = connect();
    let (counters, bank) = (app("opposite_counters"), app("opposite_bank"));
    deploy_example(&mut c, &counters, "counter");
    deploy_example(&mut c, &bank, "bank");
    let p = create(&mut c, &counters, "Counter", json!({}));
    let q = create(&mut c, &counters, "Counter", json!({}));
    let xy = open_accounts(&mut c, &bank, 2, INITIAL);
    let (x, y) = (xy[0], xy[1]);

    let pids = Arc::new(Mutex::new(Vec::<i32>::new()));
    let finished = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    #[derive(Default)]
    struct Moved {
        tally: Tally,
        x_to_y: i64,
        y_to_x: i64,
        waits: Vec<String>,
    }

    let results = run_workers("opposite_orders", THREADS + 1, WATCHDOG, move |i| {
        let mut c = connect_cc(Cc::Occ);
        let mut moved = Moved::default();
        if i == THREADS {
            // The monitor: polls pg_locks while the workers run.
            barrier.wait();
            let pids = pids.lock().unwrap().clone();
            while finished.load(Ordering::SeqCst) < THREADS {
                for row in c
                    .query(
                        "SELECT locktype, mode, pid FROM pg_locks
                          WHERE NOT granted AND pid = ANY($1)
                            AND locktype IN ('transactionid', 'tuple', 'advisory')",
                        &[&pids],
                    )
                    .unwrap()
                {
                    let (kind, mode, pid): (String, String, i32) = (row.get(0), row.get(1), row.get(2));
                    moved.waits.push(format!("backend {pid} waits for a {mode} {kind} lock"));
                }
                // A polling interval, not a wait for an event.
                std::thread::sleep(Duration::from_millis(5));
            }
            return moved;
        }
        pids.lock().unwrap().push(backend_pid(&mut c));
        barrier.wait();
        let mut rng = Rng::new(i as u64);
        for _ in 0..per_thread {
            let kind = i % 4;
            let result = retrying(Cc::Occ, &mut moved.tally, &mut rng, || {
                let mut tx = c.transaction()?;
                match kind {
                    0 => {
                        invoke(&mut tx, p, "increment", json!({}))?;
                        invoke(&mut tx, q, "increment", json!({}))?;
                    }
                    1 => {
                        invoke(&mut tx, q, "increment", json!({}))?;
                        invoke(&mut tx, p, "increment", json!({}))?;
                    }
                    2 => {
                        invoke(&mut tx, x, "transfer", json!({"to": y, "amount": 1}))?;
                        invoke(&mut tx, p, "increment", json!({}))?;
                        invoke(&mut tx, q, "increment", json!({}))?;
                    }
                    _ => {
                        invoke(&mut tx, q, "increment", json!({}))?;
                        invoke(&mut tx, y, "transfer", json!({"to": x, "amount": 1}))?;
                        invoke(&mut tx, p, "increment", json!({}))?;
                    }
                }
                tx.commit()
            });
            ok(result, format!("transaction of kind {kind}"));
            moved.tally.committed += 1;
            match kind {
                2 => moved.x_to_y += 1,
                3 => moved.y_to_x += 1,
                _ => {}
            }
        }
        finished.fetch_add(1, Ordering::SeqCst);
        moved
    });

    let tally = Tally::sum(results.iter().map(|m| &m.tally));
    let x_to_y: i64 = results.iter().map(|m| m.x_to_y).sum();
    let y_to_x: i64 = results.iter().map(|m| m.y_to_x).sum();
    let waits: Vec<&String> = results.iter().flat_map(|m| &m.waits).collect();
    println!("opposite_orders [occ]: {tally}; {x_to_y} transfers x->y, {y_to_x} y->x; {} lock waits seen", waits.len());
    let committed = tally.committed as i64;
    assert_eq!(committed, (THREADS * per_thread) as i64);
    assert_eq!(counter_value(&mut c, p), committed);
    assert_eq!(counter_value(&mut c, q), committed);
    assert_eq!(balance(&mut c, x), INITIAL - x_to_y + y_to_x);
    assert_eq!(balance(&mut c, y), INITIAL + x_to_y - y_to_x);
    assert!(waits.is_empty(), "{} times a backend waited for another's lock, e.g. {}", waits.len(), waits[0]);
}

// ---------------------------------------------------------------------------
// Isolation levels

#[test]
fn repeatable_read_and_serializable_are_refused_under_occ_and_run_under_off() {
    let (mut c, app) = deployed("isolation_levels", "counter");
    let counter = create(&mut c, &app, "Counter", json!({}));

    let mut c = connect_cc(Cc::Occ);
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}")).unwrap();
        let message = expect_sqlstate(invoke(&mut c, counter, "get", json!({})), "0A000");
        assert!(
            message.contains("lambdastore.concurrency_control"),
            "the refusal says how to run under {level}: {message}"
        );
        c.batch_execute("ROLLBACK").unwrap();

        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}")).unwrap();
        expect_sqlstate(create_object(&mut c, &app, "Counter", json!({})), "0A000");
        c.batch_execute("ROLLBACK").unwrap();

        // A map call too, as one refusal (not a row of it per object).
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}")).unwrap();
        expect_sqlstate(map_ids(&mut c, &[counter], "get", json!({})), "0A000");
        c.batch_execute("ROLLBACK").unwrap();
    }
    // The level of statements outside a transaction block counts too.
    c.batch_execute("SET default_transaction_isolation = 'repeatable read'").unwrap();
    expect_sqlstate(invoke(&mut c, counter, "increment", json!({})), "0A000");
    c.batch_execute("RESET default_transaction_isolation").unwrap();
    assert_eq!(counter_value(&mut c, counter), 0);

    // Under off, PostgreSQL's own isolation is the user's choice.
    let mut c = connect_cc(Cc::Off);
    for (level, expected) in [("REPEATABLE READ", 1), ("SERIALIZABLE", 2)] {
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}")).unwrap();
        assert_eq!(call(&mut c, counter, "increment", json!({})), json!(expected));
        c.batch_execute("COMMIT").unwrap();
    }
    assert_eq!(counter_value(&mut connect(), counter), 2);
}

// ---------------------------------------------------------------------------
// Entry sets and splits

#[test]
fn entry_sets_show_versions_rising_with_writes_and_splits() {
    let mut c = connect_cc(Cc::Occ);
    // No adaptive splits or merges: this test places every guard itself.
    c.batch_execute("SET lambdastore.split_chance = 0; SET lambdastore.merge_chance = 0").unwrap();
    let app = app("entry_sets");
    deploy_example(&mut c, &app, "micro");
    let bench = create(&mut c, &app, "Bench", json!({}));

    // A new object is one set covering everything.
    let sets = entry_sets(&mut c, bench);
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert_eq!(sets[0].lower(), ("", &[][..]));
    let v0 = sets[0].version;

    call(&mut c, bench, "put", json!({"key": "m", "value": "1"}));
    let v1 = entry_sets(&mut c, bench)[0].version;
    assert!(v1 > v0, "a write raises the version: {v0} -> {v1}");

    // Reads and failed workflows change nothing.
    call(&mut c, bench, "get", json!({"key": "m"}));
    call(&mut c, bench, "list", json!({}));
    expect_sqlstate(invoke(&mut c, bench, "put_then_fail", json!({"key": "n", "value": "2"})), "P0001");
    assert_eq!(entry_sets(&mut c, bench)[0].version, v1);

    // A guard splits the set; both halves get versions above the old one.
    let m = string_key("m");
    assert!(ok(split(&mut c, bench, "kv", &m), "split"));
    let sets = entry_sets(&mut c, bench);
    let lowers: Vec<_> = sets.iter().map(EntrySet::lower).collect();
    assert_eq!(lowers, [("", &[][..]), ("kv", &m[..])]);
    assert!(sets.iter().all(|s| s.version > v1), "after a split at version {v1}: {sets:?}");
    // The same guard again is not a new split.
    assert!(!ok(split(&mut c, bench, "kv", &m), "split again"));
    assert_eq!(entry_sets(&mut c, bench), sets);
    // A field the type does not have is refused and adds no guard.
    let message = expect_sqlstate(split(&mut c, bench, "kvv", &m), "42703");
    assert_eq!(message, r#"field "kvv" of type "Bench" does not exist"#);
    assert_eq!(entry_sets(&mut c, bench), sets);

    // A write raises the version of its own set only.
    let versions = |c: &mut Client| -> Vec<i64> { entry_sets(c, bench).iter().map(|s| s.version).collect() };
    let before = versions(&mut c);
    call(&mut c, bench, "put", json!({"key": "z", "value": "1"}));
    let after = versions(&mut c);
    assert!(after[0] == before[0] && after[1] > before[1], "write above the guard: {before:?} -> {after:?}");
    let before = after;
    call(&mut c, bench, "put", json!({"key": "a", "value": "1"}));
    call(&mut c, bench, "write", json!({"k": 3})); // field "data" < "kv"
    let after = versions(&mut c);
    assert!(after[0] > before[0] && after[1] == before[1], "writes below the guard: {before:?} -> {after:?}");
    // The entries are all there, in order.
    let listing = call(&mut c, bench, "list", json!({}));
    assert_eq!(listing, json!([["a", "1"], ["m", "1"], ["z", "1"]]));
}

#[test]
fn adaptive_splitting_puts_guards_at_written_keys_up_to_the_limit() {
    let mut c = connect_cc(Cc::Occ);
    let app = app("adaptive_split");
    deploy_example(&mut c, &app, "micro");

    // A set that has met no conflicts is never split, however often it is
    // written and however high the split chance.
    c.batch_execute("SET lambdastore.split_chance = 1; SET lambdastore.max_entry_sets = 4").unwrap();
    let calm = create(&mut c, &app, "Bench", json!({}));
    for i in 0..20 {
        call(&mut c, calm, "put", json!({"key": format!("k{i}"), "value": "v"}));
    }
    assert_eq!(entry_sets(&mut c, calm).len(), 1);

    // With a split chance of 1, a commit after one conflict splits the set
    // at the key written, until the object has max_entry_sets sets. The
    // conflict: a rival transaction holds the set for writing.
    let mut rival = connect_cc(Cc::Occ);
    let hot = create(&mut c, &app, "Bench", json!({}));
    let mut expected = vec![(String::new(), vec![])];
    for key in ["k1", "k2", "k3", "k4", "k5"] {
        let before = entry_sets(&mut c, hot);
        let args = json!({"key": key, "value": "v"});
        let mut held = rival.transaction().unwrap();
        call(&mut held, hot, "put", json!({"key": key, "value": "rival"}));
        expect_sqlstate(invoke(&mut c, hot, "put", args.clone()), "40001");
        held.rollback().unwrap();
        call(&mut c, hot, "put", args);
        if expected.len() < 4 {
            expected.push(("kv".to_string(), string_key(key)));
        }
        let sets = entry_sets(&mut c, hot);
        let lowers: Vec<_> = sets.iter().map(|s| (s.field.clone(), s.key.clone())).collect();
        assert_eq!(lowers, expected, "after writing {key}");
        let old = before.last().unwrap().version;
        assert!(
            sets[before.len() - 1..].iter().all(|s| s.version > old),
            "the halves of a split set get versions above its old one ({old}): {sets:?}"
        );
    }
    let listing = call(&mut c, hot, "list", json!({}));
    assert_eq!(listing, json!([["k1", "v"], ["k2", "v"], ["k3", "v"], ["k4", "v"], ["k5", "v"]]));
}

#[test]
fn splitting_an_unknown_object_is_42704() {
    let mut c = connect();
    expect_sqlstate(split(&mut c, -42, "kv", &string_key("k")), "42704");
}

/// The lower bounds of `sets`, as (field, key).
fn lowers(sets: &[EntrySet]) -> Vec<(String, Vec<u8>)> {
    sets.iter().map(|s| (s.field.clone(), s.key.clone())).collect()
}

fn kv_guard(key: &str) -> (String, Vec<u8>) {
    ("kv".to_string(), string_key(key))
}

#[test]
fn a_calm_object_merges_its_sets_back_one_write_at_a_time() {
    let mut c = connect_cc(Cc::Occ);
    c.batch_execute("SET lambdastore.split_chance = 0; SET lambdastore.merge_chance = 0").unwrap();
    let app = app("merges");
    deploy_example(&mut c, &app, "micro");
    let bench = create(&mut c, &app, "Bench", json!({}));
    for key in ["a", "c", "e", "g"] {
        call(&mut c, bench, "put", json!({"key": key, "value": key}));
    }
    for guard in ["b", "d", "f"] {
        assert!(ok(split(&mut c, bench, "kv", &string_key(guard)), "split"));
    }
    let origin = (String::new(), vec![]);

    // On an object that has met no conflicts, a write folds its set into
    // the one before: the guard at d goes, and the merged set's version
    // ends above both old ones.
    c.batch_execute("SET lambdastore.merge_chance = 1").unwrap();
    let before = entry_sets(&mut c, bench);
    call(&mut c, bench, "put", json!({"key": "e", "value": "e2"}));
    let sets = entry_sets(&mut c, bench);
    assert_eq!(lowers(&sets), [origin.clone(), kv_guard("b"), kv_guard("f")]);
    assert!(
        sets[1].version > before[1].version && sets[1].version > before[2].version,
        "merged b and d ({before:?}) into {sets:?}"
    );
    // A write in the first set folds the next one into it.
    call(&mut c, bench, "put", json!({"key": "a", "value": "a2"}));
    assert_eq!(lowers(&entry_sets(&mut c, bench)), [origin.clone(), kv_guard("f")]);
    call(&mut c, bench, "put", json!({"key": "g", "value": "g2"}));
    assert_eq!(lowers(&entry_sets(&mut c, bench)), [origin.clone()]);
    // One set: nothing left to merge.
    call(&mut c, bench, "put", json!({"key": "h", "value": "h"}));
    assert_eq!(lowers(&entry_sets(&mut c, bench)), [origin.clone()]);
    let listing = call(&mut c, bench, "list", json!({}));
    assert_eq!(listing, json!([["a", "a2"], ["c", "c"], ["e", "e2"], ["g", "g2"], ["h", "h"]]));

    // An object that has just met a conflict keeps its sets, for 10 s: a
    // rival transaction holds m's set for writing. The conflict count
    // that gates splits is spent after 16 writes of one set; the 20 writes
    // after it are well within the 10 s (txn/versions.rs, `calm`).
    let hot = create(&mut c, &app, "Bench", json!({}));
    assert!(ok(split(&mut c, hot, "kv", &string_key("m")), "split"));
    let mut rival = connect_cc(Cc::Occ);
    let mut held = rival.transaction().unwrap();
    call(&mut held, hot, "put", json!({"key": "z", "value": "rival"}));
    expect_sqlstate(invoke(&mut c, hot, "put", json!({"key": "z", "value": "v"})), "40001");
    held.rollback().unwrap();
    for i in 0..20 {
        call(&mut c, hot, "put", json!({"key": format!("z{i}"), "value": "v"}));
    }
    assert_eq!(lowers(&entry_sets(&mut c, hot)), [origin, kv_guard("m")]);
}

/// A workflow learns an object's entry sets, a split commits, and the
/// workflow then reads a key the split moved to a new set: by its old
/// guards it files the read under the set the key used to be in, whose
/// version a writer of the new set never bumps. Only the object's split
/// count shows the workflow that its guards went stale.
///
/// The history is a write skew, run step by step (`stale_guards`): T reads
/// `a` and stops; the split commits; W reads `a` and writes `t`, and holds
/// it; T reads the old `t` and stops again; W commits; T writes the old `t`
/// to `a`. Each copied the other's old value, which no serial order gives:
/// without the split count (txn/occ.rs) both commit. (Were W still open
/// when T validates, W's own check at COMMIT would refuse it instead.)
#[test]
fn a_workflow_whose_guards_a_split_made_stale_fails() {
    let origin = (String::new(), vec![]);
    stale_guards(
        "stale_split",
        &["m"],
        |c, object| assert!(ok(split(c, object, "kv", &string_key("t")), "split at t")),
        [origin, kv_guard("m"), kv_guard("t")],
    );
}

/// The same with a merge: T learns the sets {"", m, t}; a write in t's set
/// merges it into m's, which moves the split count too; T reads `t` under
/// its stale set t, which nobody writes again.
#[test]
fn a_workflow_whose_guards_a_merge_made_stale_fails() {
    let origin = (String::new(), vec![]);
    stale_guards(
        "stale_merge",
        &["m", "t"],
        |_, object| {
            let mut merger = connect_cc(Cc::Occ);
            merger.batch_execute("SET lambdastore.split_chance = 0; SET lambdastore.merge_chance = 1").unwrap();
            call(&mut merger, object, "put", json!({"key": "u", "value": "U0"}));
        },
        [origin, kv_guard("m")],
    );
}

/// The write skew of the two tests above: `a` and `t` in an object split
/// at `guards`, `change` of its sets while T has stopped after reading `a`
/// (its `create` waits for the object-id sequence, which the test holds),
/// leaving the sets `after`; T's second stop is a read of another object's
/// key that a transaction holds for writing.
fn stale_guards<const N: usize>(
    test: &str,
    guards: &[&str],
    change: impl FnOnce(&mut Client, i64),
    after: [(String, Vec<u8>); N],
) {
    let (mut c, app) = deployed(test, "micro");
    c.batch_execute("SET lambdastore.split_chance = 0; SET lambdastore.merge_chance = 0").unwrap();
    let object = create(&mut c, &app, "Bench", json!({"entries": 0}));
    let other = create(&mut c, &app, "Bench", json!({"entries": 0}));
    call(&mut c, object, "put", json!({"key": "a", "value": "A0"}));
    call(&mut c, object, "put", json!({"key": "t", "value": "T0"}));
    for guard in guards {
        assert!(ok(split(&mut c, object, "kv", &string_key(guard)), "split at {guard}"));
    }

    let mut sequence = connect();
    sequence.batch_execute("BEGIN; ALTER SEQUENCE lambdastore.object_id_seq INCREMENT BY 1").unwrap();
    let mut holder = connect_cc(Cc::Occ);
    holder.batch_execute("BEGIN").unwrap();
    call(&mut holder, other, "put", json!({"key": "k", "value": "held"}));
    let mut t = connect_cc(Cc::Occ);
    t.batch_execute("SET lambdastore.commit_wait = 60000; SET lambdastore.timeout = 120000").unwrap();
    let t_pid = backend_pid(&mut t);
    let skewed = std::thread::spawn(move || {
        let args = json!({"first": "a", "from": "t", "to": "a", "wait": other, "key": "k"});
        invoke(&mut t, object, "read_pause_copy_wait", args)
    });
    let mut observer = connect();
    wait_until_waiting_for_the_id_sequence(&mut observer, t_pid);

    change(&mut c, object);
    assert_eq!(lowers(&entry_sets(&mut c, object)), after, "the sets after the change");
    let mut w = connect_cc(Cc::Occ);
    w.batch_execute("BEGIN").unwrap();
    assert_eq!(call(&mut w, object, "copy", json!({"from": "a", "to": "t"})), json!("A0"));
    sequence.batch_execute("ROLLBACK").unwrap();
    wait_until_waiting_for_a_writer(&mut observer, t_pid);
    w.batch_execute("COMMIT").unwrap();
    holder.batch_execute("ROLLBACK").unwrap();

    let t_outcome = skewed.join().expect("T's thread");
    let (a, t) = (call(&mut c, object, "get", json!({"key": "a"})), call(&mut c, object, "get", json!({"key": "t"})));
    let message = match t_outcome {
        Ok(result) => panic!(
            "T committed ({result}) next to W: a write skew (a = {a}, t = {t}: each copied the \
             other's old value)"
        ),
        Err(e) => expect_sqlstate(Err::<(), _>(e), "40001"),
    };
    assert!(message.contains("was split or merged by a concurrent transaction"), "T fails on the change: {message}");
    assert_eq!((a, t), (json!("A0"), json!("A0")), "only W's copy is there");
}

/// Writers insert distinct keys into one object (with adaptive splitting
/// turned up) while another worker inserts guards at random keys and readers
/// list, scan and read: no entry may ever be lost or hidden. Every key whose
/// write committed before a read started must be seen by that read, listings
/// must be in key order, and at the end every key and every guard is there.
#[test]
fn splits_during_reads_and_writes_never_lose_or_hide_an_entry() {
    const WRITERS: usize = 4;
    const KEYS: usize = 200;
    const MAX_SPLITS: usize = 300;
    let (mut c, app) = deployed("splits_concurrent", "micro");
    let bench = create(&mut c, &app, "Bench", json!({}));
    let key = |w: usize, n: usize| format!("w{w}-{n:04}");
    let value = |k: &str| format!("{k}=v");

    let committed = Arc::new(Mutex::new(BTreeMap::<String, String>::new()));
    let writers_done = Arc::new(AtomicUsize::new(0));
    // The key each writer is writing now.
    let progress: Arc<Vec<AtomicUsize>> = Arc::new((0..WRITERS).map(|_| AtomicUsize::new(0)).collect());
    let barrier = Arc::new(Barrier::new(THREADS));

    #[derive(Default)]
    struct Work {
        tally: Tally,
        guards: Vec<(String, Vec<u8>)>,
        checks: u64,
    }

    let results = run_workers("splits_concurrent", THREADS, WATCHDOG, {
        let committed = committed.clone();
        move |i| {
            let mut c = connect_cc(Cc::Occ);
            let mut rng = Rng::new(i as u64);
            let mut work = Work::default();
            barrier.wait();
            if i < WRITERS {
                // No merges: every guard the splitter adds must stay.
                c.batch_execute("SET lambdastore.split_chance = 0.1; SET lambdastore.merge_chance = 0").unwrap();
                for n in 0..KEYS {
                    progress[i].store(n, Ordering::SeqCst);
                    let k = key(i, n);
                    let args = json!({"key": k, "value": value(&k)});
                    let result =
                        retrying(Cc::Occ, &mut work.tally, &mut rng, || invoke(&mut c, bench, "put", args.clone()));
                    ok(result, format!("put {k}"));
                    work.tally.committed += 1;
                    committed.lock().unwrap().insert(k.clone(), value(&k));
                }
                writers_done.fetch_add(1, Ordering::SeqCst);
            } else if i == WRITERS {
                // The splitter: half its guards at the keys the writers
                // are about to write (so that writes land in sets split
                // under them), the others between random keys (a `+` sorts
                // after a key and before the next) or in the `data` field
                // the readers read too.
                while writers_done.load(Ordering::SeqCst) < WRITERS && work.guards.len() < MAX_SPLITS {
                    let w = rng.below(WRITERS as u64) as usize;
                    let (field, guard) = match rng.below(8) {
                        0 => ("data", (rng.below(100) as u32).to_be_bytes().to_vec()),
                        1..=4 => {
                            let n = progress[w].load(Ordering::SeqCst) + rng.below(3) as usize;
                            ("kv", string_key(&key(w, n.min(KEYS - 1))))
                        }
                        _ => {
                            let k = key(w, rng.below(KEYS as u64) as usize);
                            ("kv", string_key(&format!("{k}+")))
                        }
                    };
                    let result = retrying(Cc::Occ, &mut work.tally, &mut rng, || split(&mut c, bench, field, &guard));
                    if ok(result, "lambdastore.split") {
                        work.guards.push((field.to_string(), guard));
                    }
                    work.tally.committed += 1;
                }
            } else {
                while writers_done.load(Ordering::SeqCst) < WRITERS {
                    // Committed before the read starts, so it must be seen.
                    let before = committed.lock().unwrap().clone();
                    let w = rng.below(WRITERS as u64) as usize;
                    let (method, args, prefix) = match rng.below(4) {
                        0 => ("list", json!({}), String::new()),
                        1 => {
                            // One writer's keys: "w1-" up to "w1." ('.' follows '-').
                            let args = json!({"start": format!("w{w}-"), "end": format!("w{w}.")});
                            ("list", args, format!("w{w}-"))
                        }
                        2 => {
                            let Some((k, _)) = before.iter().nth(rng.below(before.len().max(1) as u64) as usize) else {
                                continue;
                            };
                            ("get", json!({"key": k}), k.clone())
                        }
                        _ => ("read", json!({"k": 20}), String::new()),
                    };
                    let result =
                        retrying(Cc::Occ, &mut work.tally, &mut rng, || invoke(&mut c, bench, method, args.clone()));
                    let result = ok(result, format!("{method} {args}"));
                    work.tally.committed += 1;
                    work.checks += 1;
                    match method {
                        "list" => {
                            let listing: Vec<(String, String)> = serde_json::from_value(result).unwrap();
                            check_listing(&listing, &before, &prefix, &value);
                        }
                        "get" => assert_eq!(result, json!(before[&prefix]), "get {prefix} after its write committed"),
                        _ => assert_eq!(result, json!(20 * 1024), "read 20 entries of data"),
                    }
                }
            }
            work
        }
    });

    let tally = Tally::sum(results.iter().map(|w| &w.tally));
    let guards: Vec<&(String, Vec<u8>)> = results.iter().flat_map(|w| &w.guards).collect();
    let checks: u64 = results.iter().map(|w| w.checks).sum();
    let committed = committed.lock().unwrap().clone();
    assert_eq!(committed.len(), WRITERS * KEYS);

    // Every key is there, in order, through the lambda and in the table.
    let listing: Vec<(String, String)> =
        serde_json::from_value(call_settled(&mut c, bench, "list", json!({}))).unwrap();
    let expected: Vec<(String, String)> = committed.clone().into_iter().collect();
    assert_eq!(listing, expected, "the final listing");
    let stored: Vec<Vec<u8>> =
        entries(&mut c, bench).into_iter().filter(|(field, _, _)| field == "kv").map(|(_, key, _)| key).collect();
    let expected_keys: Vec<Vec<u8>> = committed.keys().map(|k| string_key(k)).collect();
    assert_eq!(stored, expected_keys, "the kv rows of lambdastore.entries");
    assert_eq!(call(&mut c, bench, "read", json!({"k": 100})), json!(100 * 1024));

    // Every guard is there, and the sets are in strictly increasing order.
    let sets = entry_sets(&mut c, bench);
    assert!(sets.windows(2).all(|w| w[0].lower() < w[1].lower()), "entry sets out of order: {sets:?}");
    assert_eq!(sets[0].lower(), ("", &[][..]));
    for (field, guard) in &guards {
        assert!(
            sets.iter().any(|s| s.lower() == (field.as_str(), guard.as_slice())),
            "the guard at {field} {guard:?} is gone"
        );
    }
    println!(
        "splits_concurrent [occ]: {tally}; {} manual splits, {} entry sets at the end, \
         {checks} reads checked",
        guards.len(),
        sets.len()
    );
    assert!(sets.len() > guards.len(), "{} sets for {} guards", sets.len(), guards.len());
}

/// A listing (all of `kv`, or the keys starting with `prefix`) is in strict
/// key order, holds only the keys' own values, and holds every key of
/// `before` in its range.
fn check_listing(
    listing: &[(String, String)],
    before: &BTreeMap<String, String>,
    prefix: &str,
    value: &impl Fn(&str) -> String,
) {
    assert!(listing.windows(2).all(|w| w[0].0 < w[1].0), "a listing out of order or with duplicates: {listing:?}");
    for (k, v) in listing {
        assert!(k.starts_with(prefix), "{k} listed for prefix {prefix:?}");
        assert_eq!(*v, value(k), "the value of {k}");
    }
    let listed: BTreeSet<&str> = listing.iter().map(|(k, _)| k.as_str()).collect();
    let hidden: Vec<&String> =
        before.keys().filter(|k| k.starts_with(prefix) && !listed.contains(k.as_str())).collect();
    assert!(
        hidden.is_empty(),
        "a listing of {prefix:?} missed {} committed keys, e.g. {:?} ({} listed)",
        hidden.len(),
        hidden.first(),
        listing.len()
    );
}

/// Commit records come in the serial order, which a hot standby shows (it
/// makes each transaction visible as it replays its commit record): a
/// transaction that read x and wrote y is serialized before one that
/// overwrites x later, so once that one has committed, the first may not
/// commit after it. Its COMMIT fails with 40001 (txn/occ.rs,
/// `before_commit`) and nothing of it is kept. Before, it committed: the
/// primary stayed serializable, but a standby replaying between the two
/// commits showed the new x beside the old y, a state no serial order has.
/// Through a Citus coordinator the nodes' commits are Citus' (standbys of
/// its nodes are not read from): with x and y on two nodes, x's node
/// validates again at PREPARE (40001), on one node it commits, as before.
#[test]
fn a_transaction_that_read_what_a_later_commit_overwrote_fails_at_its_own_commit() {
    let (mut c, app) = deployed("commit_order", "counter");
    let x = create(&mut c, &app, "Counter", json!({}));
    let y = create(&mut c, &app, "Counter", json!({}));
    let citus: bool =
        c.query_one("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')", &[]).unwrap().get(0);
    let mut first = connect();
    first.batch_execute("BEGIN").unwrap();
    assert_eq!(call(&mut first, x, "get", json!({})), json!(0));
    assert_eq!(call(&mut first, y, "increment", json!({})), json!(1));
    assert_eq!(call(&mut c, x, "increment", json!({})), json!(1), "the later writer of x commits");
    if citus {
        let committed = first.batch_execute("COMMIT").map_err(|err| expect_sqlstate::<()>(Err(err), "40001")).is_ok();
        assert_eq!(call(&mut c, y, "get", json!({})), json!(i64::from(committed)), "all or nothing of it");
        return;
    }
    let message = expect_sqlstate(first.batch_execute("COMMIT"), "40001");
    assert!(message.contains("changed"), "{message}");
    assert_eq!(call(&mut c, y, "get", json!({})), json!(0), "the first transaction's write was kept");

    // Without a writer in between, the same transaction commits.
    first.batch_execute("BEGIN").unwrap();
    assert_eq!(call(&mut first, x, "get", json!({})), json!(1));
    assert_eq!(call(&mut first, y, "increment", json!({})), json!(1));
    first.batch_execute("COMMIT").unwrap();
    assert_eq!(call(&mut c, y, "get", json!({})), json!(1));
}
