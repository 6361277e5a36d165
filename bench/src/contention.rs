//! Figure 6 of the LambdaStore paper, on one PostgreSQL: a hot object with
//! `entries` entries of 1 KiB; each transaction reads or writes 5 random
//! entries (50/50) through `lambda_invoke(obj, 'touch', ...)`; clients retry
//! serialization failures. Configurations run one after the other on the
//! same data: manual guards (1, 10, 100, 1000 entry sets), adaptive
//! splitting from one set, PostgreSQL SERIALIZABLE with OCC off, and a
//! read-only mix with OCC on and off.
//!
//! Two cores shared with the clients make one run of a configuration vary
//! by 10% or more from the next, so the whole list runs `rounds` times; the
//! report gives each configuration's median and each goal's ratio as the
//! median of the ratios measured within a round.

use anyhow::{Context, Result};
use postgres::{Client, NoTls};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ADAPTIVE: &str = "occ, adaptive, next run";
const SERIALIZABLE: &str = "PostgreSQL SERIALIZABLE, occ off";
const READ_ONLY_OCC: &str = "read-only, occ";
const READ_ONLY_OFF: &str = "read-only, occ off";

struct Config {
    name: String,
    /// Statements run on every client connection first.
    setup: &'static str,
    guards: Option<u32>,
    write_percent: u32,
    /// Run on the previous configuration's object instead of a fresh one.
    same_object: bool,
}

struct Outcome {
    commits: u64,
    aborts: u64,
    elapsed: Duration,
}

pub fn run(url: &str, lambdas: &Path, clients: usize, seconds: u64, entries: u32, rounds: usize) -> Result<()> {
    let micro = std::fs::read(lambdas.join("micro.wasm")).context("read micro.wasm (run make lambdas)")?;
    let mut admin = Client::connect(url, NoTls)?;
    admin.batch_execute("CREATE EXTENSION IF NOT EXISTS lambdastore")?;
    admin.execute("SELECT lambdastore.deploy('bench_micro', $1)", &[&micro])?;

    let mut configs: Vec<Config> = [1, 10, 100, 1000]
        .into_iter()
        .filter(|g| *g <= entries)
        .map(|g| Config {
            name: format!("occ, {g} manual entry sets"),
            setup: "SET lambdastore.split_chance = 0; SET lambdastore.merge_chance = 0",
            guards: Some(g),
            write_percent: 50,
            same_object: false,
        })
        .collect();
    configs.push(Config {
        name: "occ, adaptive from 1 set".into(),
        setup: "",
        guards: None,
        write_percent: 50,
        same_object: false,
    });
    // The same object again: how far splitting got, in steady state.
    configs.push(Config { name: ADAPTIVE.into(), setup: "", guards: None, write_percent: 50, same_object: true });
    configs.push(Config {
        name: SERIALIZABLE.into(),
        setup: "SET lambdastore.concurrency_control = off; SET default_transaction_isolation = 'serializable'",
        guards: Some(1),
        write_percent: 50,
        same_object: false,
    });
    configs.push(Config {
        name: READ_ONLY_OCC.into(),
        setup: "",
        guards: Some(1),
        write_percent: 0,
        same_object: false,
    });
    configs.push(Config {
        name: READ_ONLY_OFF.into(),
        setup: "SET lambdastore.concurrency_control = off",
        guards: Some(1),
        write_percent: 0,
        same_object: false,
    });

    println!(
        "{clients} clients, {seconds} s per configuration, {rounds} rounds, one object of {entries} entries x 1 KiB, 5 entries per transaction"
    );
    println!("  {:<5} {:<36} {:>10} {:>9} {:>12}", "round", "configuration", "commits/s", "abort %", "entry sets");
    // measured[round][configuration], in the order of `configs`.
    let mut measured: Vec<Vec<Measured>> = Vec::new();
    for round in 1..=rounds {
        // The read-only pair (the last two) swaps places every other round,
        // so that neither always runs second.
        let mut order: Vec<usize> = (0..configs.len()).collect();
        if round % 2 == 0 {
            order.swap(configs.len() - 2, configs.len() - 1);
        }
        let mut row: Vec<Option<Measured>> = configs.iter().map(|_| None).collect();
        let mut object = 0;
        for i in order {
            let config = &configs[i];
            if !config.same_object {
                object = fresh_object(&mut admin, entries, config.guards)?;
            }
            let outcome = drive(url, object, config, clients, seconds, entries)?;
            let sets: i64 =
                admin.query_one("SELECT count(*) FROM lambdastore.entry_sets WHERE object_id = $1", &[&object])?.get(0);
            let attempts = outcome.commits + outcome.aborts;
            let run = Measured {
                commits_per_s: outcome.commits as f64 / outcome.elapsed.as_secs_f64(),
                abort_percent: 100.0 * outcome.aborts as f64 / attempts.max(1) as f64,
                sets,
            };
            println!(
                "  {round:<5} {:<36} {:>10.0} {:>8.1}% {:>12}",
                config.name, run.commits_per_s, run.abort_percent, run.sets
            );
            row[i] = Some(run);
        }
        measured.push(row.into_iter().map(|run| run.expect("every configuration ran")).collect());
    }
    report(&configs, &measured);
    Ok(())
}

struct Measured {
    commits_per_s: f64,
    abort_percent: f64,
    sets: i64,
}

/// Medians per configuration, then the goals as medians of the
/// ratios within each round.
fn report(configs: &[Config], measured: &[Vec<Measured>]) {
    let index = |name: &str| configs.iter().position(|c| c.name == name).expect("a configured name");
    let throughput = |round: &[Measured], name: &str| round[index(name)].commits_per_s;
    println!("\nmedians of {} rounds:", measured.len());
    println!("  {:<36} {:>10} {:>9} {:>12}", "configuration", "commits/s", "abort %", "entry sets");
    for (i, config) in configs.iter().enumerate() {
        let commits = median(measured.iter().map(|round| round[i].commits_per_s).collect());
        let aborts = median(measured.iter().map(|round| round[i].abort_percent).collect());
        let sets = median(measured.iter().map(|round| round[i].sets as f64).collect());
        println!("  {:<36} {:>10.0} {:>8.1}% {:>12.0}", config.name, commits, aborts, sets);
    }
    let ratios = |f: &dyn Fn(&[Measured]) -> f64| {
        let all: Vec<f64> = measured.iter().map(|round| f(round)).collect();
        let shown: Vec<String> = all.iter().map(|r| format!("{r:.2}")).collect();
        (median(all), shown.join(" / "))
    };
    let best_manual = |round: &[Measured]| {
        configs
            .iter()
            .zip(round)
            .filter(|(c, _)| c.name.contains("manual"))
            .map(|(_, m)| m.commits_per_s)
            .fold(0.0, f64::max)
    };
    let (adaptive, each) = ratios(&|round| throughput(round, ADAPTIVE) / best_manual(round));
    println!("adaptive (steady state) / best manual guard count: {adaptive:.2} (rounds: {each}; goal >= 0.80)");
    let (serializable, each) = ratios(&|round| throughput(round, ADAPTIVE) / throughput(round, SERIALIZABLE));
    println!("adaptive (steady state) / PostgreSQL SERIALIZABLE: {serializable:.2}x (rounds: {each}; goal >= 2x)");
    let (overhead, each) =
        ratios(&|round| 100.0 * (1.0 - throughput(round, READ_ONLY_OCC) / throughput(round, READ_ONLY_OFF)));
    println!("read-only OCC overhead against off: {overhead:.1}% (rounds: {each}; goal <= 10%)");
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// A new hot object, split into `guards` evenly spaced entry sets.
fn fresh_object(admin: &mut Client, entries: u32, guards: Option<u32>) -> Result<i64> {
    let object: i64 = admin
        .query_one(
            "SELECT lambdastore.create_object('bench_micro', 'Bench', jsonb_build_object('entries', $1::int))",
            &[&(entries as i32)],
        )?
        .get(0);
    if let Some(guards) = guards {
        for i in 1..guards {
            let key = i * entries / guards;
            // Map keys are the SDK's order-preserving u32 encoding: big-endian.
            admin.execute("SELECT lambdastore.split($1, 'data', $2)", &[&object, &key.to_be_bytes().to_vec()])?;
        }
    }
    Ok(object)
}

fn drive(url: &str, object: i64, config: &Config, clients: usize, seconds: u64, entries: u32) -> Result<Outcome> {
    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicU64::new(0));
    let aborts = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|n| {
            let (stop, commits, aborts) = (stop.clone(), commits.clone(), aborts.clone());
            let (url, setup, write_percent) = (url.to_string(), config.setup, config.write_percent);
            std::thread::spawn(move || -> Result<()> {
                let mut client = Client::connect(&url, NoTls)?;
                client.batch_execute(setup)?;
                let touch = client.prepare("SELECT lambda_invoke($1, 'touch', $2::jsonb)")?;
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (n as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                while !stop.load(Ordering::Relaxed) {
                    let write = next(&mut rng) % 100 < write_percent as u64;
                    let keys: Vec<u32> = (0..5).map(|_| (next(&mut rng) % entries as u64) as u32).collect();
                    let args = serde_json::json!({"keys": keys, "write": write});
                    // Retry the transaction until it commits (or time is up).
                    loop {
                        match client.query_one(&touch, &[&object, &args]) {
                            Ok(_) => {
                                commits.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Err(e) if e.code().map(|c| c.code()) == Some("40001") => {
                                aborts.fetch_add(1, Ordering::Relaxed);
                                if stop.load(Ordering::Relaxed) {
                                    break;
                                }
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds)); // the run's duration, not synchronisation
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().expect("client thread")?;
    }
    Ok(Outcome {
        commits: commits.load(Ordering::Relaxed),
        aborts: aborts.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
    })
}

/// splitmix64: the drivers' own deterministic key choice.
pub(crate) fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
