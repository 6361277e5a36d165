//! Helpers for tests with real concurrency: connections in a chosen
//! concurrency-control mode, the client retry loop a serializable database
//! asks for, worker threads under a watchdog, and a small random generator.

use super::{connect, describe, invoke};
use postgres::Client;
use serde_json::Value;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `lambdastore.concurrency_control`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cc {
    /// Serializable workflows (the default).
    Occ,
    /// No locking or validation: what OCC prevents becomes possible.
    Off,
}

impl Cc {
    pub fn name(self) -> &'static str {
        match self {
            Cc::Occ => "occ",
            Cc::Off => "off",
        }
    }
}

impl fmt::Display for Cc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A connection with `lambdastore.concurrency_control = cc`.
///
/// The time limits are safety nets far above what any statement of these
/// tests needs: OCC never waits for a lock, so a statement still waiting
/// after `lock_timeout` (55P03) means transactions wait for each other, and
/// `statement_timeout` (57014) ends anything else that hangs.
pub fn connect_cc(cc: Cc) -> Client {
    let mut c = connect();
    c.batch_execute(&format!(
        "SET lambdastore.concurrency_control = {cc};
         SET lambdastore.timeout = '10s';
         SET lock_timeout = '20s';
         SET statement_timeout = '60s';"
    ))
    .unwrap_or_else(|e| panic!("configure a connection for {cc}: {}", describe(&e)));
    c
}

/// The SQLSTATE of a database error.
pub fn sqlstate(err: &postgres::Error) -> Option<&str> {
    err.code().map(|code| code.code())
}

/// What a worker's transactions did.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Transactions that committed.
    pub committed: u64,
    /// Transactions the application refused (P0001), as the test expects
    /// some to be: "not covered", "insufficient funds".
    pub refused: u64,
    /// Serialization failures (40001), each followed by a retry.
    pub retries: u64,
    /// Deadlocks PostgreSQL detected (40P01); retried under `off` only,
    /// where transactions may wait for each other's row locks.
    pub deadlocks: u64,
    /// The message of the first serialization failure.
    pub first_conflict: Option<String>,
}

impl Tally {
    pub fn sum<'a>(tallies: impl IntoIterator<Item = &'a Tally>) -> Tally {
        let mut total = Tally::default();
        for t in tallies {
            total.committed += t.committed;
            total.refused += t.refused;
            total.retries += t.retries;
            total.deadlocks += t.deadlocks;
            if total.first_conflict.is_none() {
                total.first_conflict.clone_from(&t.first_conflict);
            }
        }
        total
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} committed, {} refused, {} retries (40001)", self.committed, self.refused, self.retries)?;
        if self.deadlocks > 0 {
            write!(f, ", {} deadlocks (40P01)", self.deadlocks)?;
        }
        Ok(())
    }
}

/// Consecutive serialization failures of one transaction after which the
/// test gives up: far more than contention explains, so a livelock.
const MAX_ATTEMPTS: u32 = 2000;

/// Runs `txn` until it does not fail with a serialization failure, as a
/// client of a serializable database must, and returns its outcome (any
/// other error included). `txn` must start its work from scratch each time:
/// a retried transaction re-reads what it decides on.
pub fn retrying<T>(
    cc: Cc,
    tally: &mut Tally,
    rng: &mut Rng,
    mut txn: impl FnMut() -> Result<T, postgres::Error>,
) -> Result<T, postgres::Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match txn() {
            Err(e) if sqlstate(&e) == Some("40001") => {
                tally.retries += 1;
                if tally.first_conflict.is_none() {
                    tally.first_conflict = Some(describe(&e));
                }
                assert!(
                    attempt < MAX_ATTEMPTS,
                    "{attempt} serialization failures in a row (a livelock?), the last: {}",
                    describe(&e)
                );
            }
            Err(e) if cc == Cc::Off && sqlstate(&e) == Some("40P01") => tally.deadlocks += 1,
            outcome => return outcome,
        }
        backoff(attempt, rng);
    }
}

/// `call` for a test's final read, after its workers are done: retried on
/// 40001 like any read. Sets of different objects share version counters
/// (txn/versions.rs), so a read of thousands of sets can fail spuriously
/// while another test of the same binary writes elsewhere.
#[track_caller]
pub fn call_settled(c: &mut Client, object: i64, method: &str, args: Value) -> Value {
    let (mut tally, mut rng) = (Tally::default(), Rng::new(0));
    retrying(Cc::Occ, &mut tally, &mut rng, || invoke(c, object, method, args.clone()))
        .unwrap_or_else(|e| panic!("lambda_invoke({object}, {method}, {args}): {}", describe(&e)))
}

/// After the second failure in a row, a random pause of up to 20 µs × 2^n
/// (at most about 5 ms), as clients of optimistic systems do: transactions
/// that abort each other (each holding a read lock the other needs to
/// write) would otherwise retry in step.
fn backoff(attempt: u32, rng: &mut Rng) {
    if attempt >= 2 {
        let ceiling = 20u64 << attempt.min(8);
        std::thread::sleep(Duration::from_micros(rng.below(ceiling)));
    }
}

/// Runs `work(0)`, …, `work(n - 1)` on `n` threads and returns their
/// results in that order. A worker that panics fails the test with its
/// message; one still running after `bound` fails it as a hang (a deadlock or
/// a livelock: `bound` is far above what the work needs).
pub fn run_workers<T, F>(what: &str, n: usize, bound: Duration, work: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> T + Send + Sync + 'static,
{
    let work = Arc::new(work);
    let (done, finished) = mpsc::channel();
    for i in 0..n {
        let (work, done) = (work.clone(), done.clone());
        std::thread::Builder::new()
            .name(format!("{what}-{i}"))
            .spawn(move || {
                let outcome = catch_unwind(AssertUnwindSafe(|| work(i)));
                let _ = done.send((i, outcome));
            })
            .expect("spawn a worker thread");
    }
    drop(done);

    let deadline = Instant::now() + bound;
    let mut results: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        match finished.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, Ok(result))) => results[i] = Some(result),
            Ok((i, Err(panic))) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{what}: worker {i} failed: {message}");
            }
            Err(_) => {
                let running: Vec<usize> = (0..n).filter(|i| results[*i].is_none()).collect();
                panic!("{what}: workers {running:?} still running after {bound:?}: a hang");
            }
        }
    }
    results.into_iter().map(Option::unwrap).collect()
}

/// SplitMix64: enough randomness for choosing keys and amounts, without a
/// dependency. Seeded from the clock, so each run contends differently.
pub struct Rng(u64);

impl Rng {
    pub fn new(stream: u64) -> Rng {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        Rng(nanos ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), up to a negligible bias.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Whether `result` is the application's refusal (P0001) with a message
/// containing `expected`; any other error fails the test.
#[track_caller]
pub fn refused<T>(result: &Result<T, postgres::Error>, expected: &str, what: impl fmt::Display) -> bool {
    match result {
        Ok(_) => false,
        Err(e) if sqlstate(e) == Some("P0001") => {
            let message = describe(e);
            assert!(message.contains(expected), "{what}: {message}");
            true
        }
        Err(e) => panic!("{what}: {}", describe(e)),
    }
}

/// Write skew decided by the client across statements of one SQL
/// transaction, on pairs of counters that start at 100: BEGIN; read
/// counter A; read counter B; if A + B >= 150, subtract 150 from one of
/// them (even workers from A, odd ones from B); COMMIT. Each call is a
/// workflow of its own, so only the transaction's reads validated until
/// COMMIT make it serializable: exactly one subtraction per pair.
pub fn subtract_if_covered(
    cc: Cc,
    pairs: Arc<Vec<(i64, i64)>>,
    threads: usize,
    bound: Duration,
) -> (u64, String, Tally) {
    fn act(c: &mut Client, cc: Cc, tally: &mut Tally, rng: &mut Rng, mine: i64, other: i64) -> bool {
        use serde_json::json;
        let wrote = retrying(cc, tally, rng, || {
            let mut tx = c.transaction()?;
            let v_mine = super::invoke(&mut tx, mine, "get", json!({}))?.as_i64().unwrap_or_default();
            let v_other = super::invoke(&mut tx, other, "get", json!({}))?.as_i64().unwrap_or_default();
            let covered = v_mine + v_other >= 150;
            if covered {
                super::invoke(&mut tx, mine, "add", json!({"n": -150}))?;
            }
            tx.commit()?;
            Ok(covered)
        });
        tally.committed += 1;
        wrote.unwrap_or_else(|e| panic!("the transaction: {}", describe(&e)))
    }
    one_per_pair(cc, pairs, threads, bound, "get", act)
}

/// Write skew decided by a lambda, on pairs of bank accounts that start
/// at 100: even workers call a.withdraw_if_covered(b, 150), odd ones
/// b.withdraw_if_covered(a, 150). The lambda reads the other account with
/// a nested call and writes only its own: exactly one withdrawal per pair.
pub fn withdraw_if_covered(
    cc: Cc,
    pairs: Arc<Vec<(i64, i64)>>,
    threads: usize,
    bound: Duration,
) -> (u64, String, Tally) {
    fn act(c: &mut Client, cc: Cc, tally: &mut Tally, rng: &mut Rng, mine: i64, other: i64) -> bool {
        let args = serde_json::json!({"other": other, "amount": 150});
        let result = retrying(cc, tally, rng, || super::invoke(c, mine, "withdraw_if_covered", args.clone()));
        let refusal = refused(&result, "not covered", "withdraw_if_covered");
        if refusal {
            tally.refused += 1;
        } else {
            tally.committed += 1;
        }
        !refusal
    }
    one_per_pair(cc, pairs, threads, bound, "balance", act)
}

/// Pairs of objects at 100 each, and workers acting on each pair at once,
/// even ones for its first object, odd ones for its second: `act` returns
/// whether it took 150 from its object. Exactly one taking per pair is
/// serializable, which leaves 50 in all (`read` reads an object's value).
/// Returns the pairs broken, an example, and what the workers did.
fn one_per_pair(
    cc: Cc,
    pairs: Arc<Vec<(i64, i64)>>,
    threads: usize,
    bound: Duration,
    read: &'static str,
    act: fn(&mut Client, Cc, &mut Tally, &mut Rng, i64, i64) -> bool,
) -> (u64, String, Tally) {
    use serde_json::json;
    let barrier = Arc::new(std::sync::Barrier::new(threads));
    let results = run_workers("one_per_pair", threads, bound, {
        let pairs = pairs.clone();
        move |i| {
            let mut c = connect_cc(cc);
            let (mut rng, mut tally) = (Rng::new(i as u64), Tally::default());
            let mut took = Vec::new();
            for (p, &(a, b)) in pairs.iter().enumerate() {
                let (mine, other) = if i % 2 == 0 { (a, b) } else { (b, a) };
                barrier.wait();
                if act(&mut c, cc, &mut tally, &mut rng, mine, other) {
                    took.push(p);
                }
            }
            (tally, took)
        }
    });
    let tally = Tally::sum(results.iter().map(|(t, _)| t));
    let mut takings = vec![0i64; pairs.len()];
    for p in results.iter().flat_map(|(_, took)| took) {
        takings[*p] += 1;
    }
    let mut c = connect();
    let (mut anomalies, mut example) = (0, String::new());
    for (p, &(a, b)) in pairs.iter().enumerate() {
        let va = super::call(&mut c, a, read, json!({})).as_i64().unwrap_or_default();
        let vb = super::call(&mut c, b, read, json!({})).as_i64().unwrap_or_default();
        let n = takings[p];
        if n != 1 || va + vb != 200 - 150 * n {
            anomalies += 1;
            if example.is_empty() {
                example = format!("; e.g. pair {p}: 150 taken {n} times, values {va} and {vb}");
            }
        }
    }
    (anomalies, example, tally)
}

/// Transfers between random pairs of bank `accounts` (each opened with
/// `initial`), `per_thread` per worker, retried on 40001; then the bank's
/// invariant: the total stays, no account is negative, and each committed
/// transfer left two audit entries. Returns the anomalies, what was found,
/// and what the workers did.
pub fn random_transfers(
    cc: Cc,
    accounts: Arc<Vec<i64>>,
    initial: i64,
    threads: usize,
    per_thread: usize,
    bound: Duration,
) -> (u64, String, Tally) {
    use serde_json::json;
    let tallies = run_workers("random_transfers", threads, bound, {
        let accounts = accounts.clone();
        move |i| {
            let mut c = connect_cc(cc);
            let (mut rng, mut tally) = (Rng::new(i as u64), Tally::default());
            let n = accounts.len();
            for _ in 0..per_thread {
                let from = rng.below(n as u64) as usize;
                let to = (from + 1 + rng.below(n as u64 - 1) as usize) % n;
                let (from, to) = (accounts[from], accounts[to]);
                let amount = 1 + rng.below(300) as i64;
                let result = retrying(cc, &mut tally, &mut rng, || {
                    super::invoke(&mut c, from, "transfer", json!({"to": to, "amount": amount}))
                });
                if refused(&result, "insufficient funds", "transfer") {
                    tally.refused += 1;
                } else {
                    tally.committed += 1;
                }
            }
            tally
        }
    });
    let tally = Tally::sum(&tallies);
    let mut c = connect();
    let balances: Vec<i64> =
        accounts.iter().map(|&a| super::call(&mut c, a, "balance", json!({})).as_i64().unwrap_or_default()).collect();
    let total: i64 = balances.iter().sum();
    let negative = balances.iter().filter(|b| **b < 0).count() as u64;
    let ids = accounts.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let audit = super::count(
        &mut c,
        &format!("SELECT count(*) FROM lambdastore.entries WHERE field = 'audit' AND object_id IN ({ids})"),
    );
    let (expected_total, expected_audit) = (initial * accounts.len() as i64, 2 * tally.committed as i64);
    let anomalies = u64::from(total != expected_total) + negative + u64::from(audit != expected_audit);
    let details = format!(
        "total {total} (must be {expected_total}), {negative} negative accounts, \
         {audit} audit entries (must be {expected_audit})"
    );
    (anomalies, details, tally)
}
