//! Asynchronous jobs: throughput of the worker pool against the same calls
//! made synchronously, and submit-to-done latency.
//!
//! The work is `increment` on one of `objects` counters, round robin, so
//! that jobs rarely conflict and the pool, not OCC, is measured. The
//! synchronous baseline runs the same calls with as many client
//! connections as there are workers, side by side in the same run.

use crate::{histogram, micros};
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use postgres::{Client, NoTls};
use std::path::Path;
use std::time::Instant;

pub fn run(url: &str, lambdas: &Path, jobs: i64, objects: i64, latency_samples: u64) -> Result<()> {
    let counter = std::fs::read(lambdas.join("counter.wasm")).context("read counter.wasm (run make lambdas)")?;
    let (config, mut client) = workers_database(url)?;
    let workers: i64 = client
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'lambdastore job runner'", &[])?
        .get(0);
    if workers == 0 {
        bail!("no lambdastore job runner is connected to this database (shared_preload_libraries, lambdastore.workers, lambdastore.database)");
    }
    client.execute("SELECT lambdastore.deploy('bench_jobs', $1)", &[&counter])?;
    let ids: Vec<i64> = client
        .query(
            "SELECT lambdastore.create_object('bench_jobs', 'Counter', '{}') FROM generate_series(1, $1::bigint)",
            &[&objects],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    println!("{jobs} increments over {objects} counters; {workers} workers, {workers} synchronous clients");

    // Synchronous: `workers` connections, each taking its share.
    let started = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (config, ids) = (config.clone(), &ids);
                s.spawn(move || -> Result<()> {
                    let mut c = config.connect(NoTls)?;
                    let call = c.prepare("SELECT lambda_invoke($1, 'increment')")?;
                    for i in (w..jobs).step_by(workers as usize) {
                        c.query_one(&call, &[&ids[(i % objects) as usize]])?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("client thread"))
    })?;
    let sync_rate = jobs as f64 / started.elapsed().as_secs_f64();

    // Through the pool: all submitted in one transaction, timed from its
    // commit to the last job done. Starts from a vacuumed queue, as
    // autovacuum keeps it in a steady state (see extension/sql/schema.sql): earlier
    // runs' dead index entries would slow every claim.
    client.batch_execute("VACUUM lambdastore.jobs")?;
    let mut tx = client.transaction()?;
    let submitted: Vec<i64> = tx
        .query(
            "SELECT lambdastore.submit(($1::bigint[])[1 + (g % array_length($1::bigint[], 1))], 'increment')
               FROM generate_series(0, $2::bigint - 1) g",
            &[&ids, &jobs],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    tx.commit()?;
    let committed = Instant::now();
    drain(&mut client, &submitted)?;
    let pool_rate = jobs as f64 / committed.elapsed().as_secs_f64();
    println!("  synchronous lambda_invoke:   {sync_rate:>8.0} calls/s");
    println!("  through the worker pool:     {pool_rate:>8.0} jobs/s  ({:.2}x synchronous)", pool_rate / sync_rate);

    // Latency of one job at a time on an idle pool: server-side
    // submitted_at -> finished_at, and client-side submit + wait.
    let submit = client.prepare("SELECT lambdastore.submit($1, 'increment')")?;
    let wait = client.prepare(
        "SELECT state, extract(epoch FROM finished_at - submitted_at)::float8 * 1e6 FROM lambdastore.wait($1, '10 seconds')",
    )?;
    let (mut server, mut round_trip) = (histogram(), histogram());
    for i in 0..latency_samples {
        let t = Instant::now();
        let job: i64 = client.query_one(&submit, &[&ids[(i as i64 % objects) as usize]])?.get(0);
        let row = client.query_one(&wait, &[&job])?;
        round_trip.record(t.elapsed().as_micros().max(1) as u64)?;
        let state: String = row.get(0);
        if state != "done" {
            bail!("job {job} ended {state}");
        }
        let us: f64 = row.get(1);
        server.record(us.max(1.0) as u64)?;
    }
    println!("  submit-to-done, one job at a time ({latency_samples} jobs, µs):");
    print_percentiles("server (submitted_at -> finished_at)", &server);
    print_percentiles("client (submit + wait round trip)", &round_trip);
    Ok(())
}

/// Blocks until every job is done, waiting on each in turn (most are done
/// by the time their turn comes).
fn drain(client: &mut Client, jobs: &[i64]) -> Result<()> {
    let wait = client.prepare("SELECT state FROM lambdastore.wait($1, '60 seconds')")?;
    for job in jobs {
        let state: String = client.query_one(&wait, &[job])?.get(0);
        if state != "done" {
            bail!("job {job} ended {state}");
        }
    }
    Ok(())
}

/// A connection to the database the workers serve (`lambdastore.database`),
/// whatever database `url` names.
fn workers_database(url: &str) -> Result<(postgres::Config, Client)> {
    let mut config: postgres::Config = url.parse()?;
    let mut client = config.connect(NoTls)?;
    let row = client.query_one("SELECT current_setting('lambdastore.database', true), current_database()", &[])?;
    let (wanted, current): (Option<String>, String) = (row.get(0), row.get(1));
    let Some(wanted) = wanted else { bail!("lambdastore is not loaded in this server (shared_preload_libraries)") };
    if wanted != current {
        config.dbname(&wanted);
        client = config.connect(NoTls)?;
    }
    client.batch_execute("CREATE EXTENSION IF NOT EXISTS lambdastore")?;
    Ok((config, client))
}

fn print_percentiles(label: &str, h: &Histogram<u64>) {
    println!("    {label:<36} p50 {:>6.0}  p90 {:>6.0}  p99 {:>6.0}", micros(h, 0.5), micros(h, 0.9), micros(h, 0.99));
}
