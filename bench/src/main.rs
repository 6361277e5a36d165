//! Workload drivers. `foundation` measures what a single call costs:
//! warm latency of `lambda_invoke`, cold start in a new connection, and how
//! far past its deadline a runaway lambda is stopped. `http` loads the HTTP
//! gateway and compares it with the same calls over SQL. `timeline` draws
//! throughput over time from pgbench's logs.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use postgres::{Client, NoTls};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod contention;
mod cpu;
mod http;
mod jobs;
mod remote;
mod suite;
mod timeline;

#[derive(Parser)]
#[command(about = "LambdaStore benchmarks")]
struct Cli {
    /// libpq connection string of a server with the extension installed
    /// (every command but `report`).
    #[arg(long, env = "LAMBDASTORE_URL")]
    url: Option<String>,
    /// Directory with the built components (make lambdas).
    #[arg(long, default_value = "target/lambdas")]
    lambdas: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Warm latency, cold start and timeout overshoot of single calls.
    Foundation {
        /// Calls per warm measurement.
        #[arg(long, default_value_t = 5000)]
        calls: u64,
        /// New connections for the cold-start measurement.
        #[arg(long, default_value_t = 200)]
        connections: u64,
        /// Runaway calls for the overshoot measurement.
        #[arg(long, default_value_t = 10)]
        spins: u64,
    },
    /// The paper's Figure 6: one hot object, 50% read / 50% write
    /// transactions of 5 entries, under manual guards, adaptive splitting,
    /// and PostgreSQL's SERIALIZABLE; plus read-only OCC overhead.
    Contention {
        /// Concurrent clients.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Seconds per configuration.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Entries of the hot object (1 KiB each).
        #[arg(long, default_value_t = 1000)]
        entries: u32,
        /// Times the whole list of configurations runs; the report gives medians.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
    },
    /// Asynchronous jobs: pool throughput against the same calls made
    /// synchronously, and submit-to-done latency. Connects to the database
    /// in `lambdastore.database`.
    Jobs {
        /// Jobs (and synchronous calls) in the throughput measurement.
        #[arg(long, default_value_t = 20000)]
        jobs: i64,
        /// Counters the calls are spread over.
        #[arg(long, default_value_t = 64)]
        objects: i64,
        /// Jobs submitted and waited for one at a time.
        #[arg(long, default_value_t = 1000)]
        latency_samples: u64,
    },
    /// The paper's experiments on every system side by side (lambdastore,
    /// disaggregated, PL/pgSQL, raw SQL): JSON, markdown, SVG and PNG plots in --out.
    Suite {
        /// Scaled-down data and short runs: minutes on 2 cores.
        #[arg(long)]
        quick: bool,
        /// Concurrent clients per run.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Open loop: start this many operations per second over all clients
        /// (latency counted from when each was due). Default: closed loop.
        #[arg(long)]
        rate: Option<f64>,
        /// Unmeasured time before each run (default 2s, 1s with --quick).
        #[arg(long, value_parser = humantime::parse_duration)]
        warmup: Option<Duration>,
        /// Measured time of each run (default 10s, 3s with --quick).
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
        /// Workloads to run, in this order.
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "rw-mix,job-length,cloudforum,retwis,faulty,cold-start"
        )]
        workloads: Vec<suite::Workload>,
        /// Systems to measure.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "lambdastore,disaggregated,plpgsql,raw-sql")]
        systems: Vec<suite::System>,
        /// Where results.json, results.md and the plots go.
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
    },
    /// Redraws the markdown and the plots of a suite's results.json (no
    /// database needed), e.g. after a change to the report.
    Report {
        /// The results.json a suite run wrote.
        #[arg(long, default_value = "bench/results/results.json")]
        from: PathBuf,
        /// Where results.json, results.md and the plots go.
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
    },
    /// The HTTP gateway under a closed-loop load of counter's get and
    /// increment, CloudForum's or Retwis' mix, side by side with the same
    /// calls over SQL. Deploys the applications, creates their objects and
    /// an API key each through --url (the keys are revoked at the end).
    Http {
        /// The gateway's base URL, e.g. http://127.0.0.1:8080.
        #[arg(long)]
        gateway: String,
        /// Workloads to run, in this order.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "counter")]
        workloads: Vec<http::Workload>,
        /// Concurrent connections, for the gateway and for SQL alike.
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Measured time per row.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Unmeasured time before it, per row.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        /// NAME=PID: report the CPU time this process and its descendants
        /// spend per request in each row, beside the bench's own (e.g.
        /// gateway=PID, server=the postmaster's PID); repeatable.
        #[arg(long = "cpu-of")]
        cpu_of: Vec<cpu::Watched>,
    },
    /// Throughput over time from pgbench's per-transaction logs (pgbench
    /// --log --max-tries N), with spans such as a migration shaded: an SVG
    /// and PNG plot, and a table of each span's dip (no database needed).
    Timeline {
        /// LABEL=FILE[,FILE...]: a line of the plot, from the log files of one
        /// pgbench run (one per thread); repeat for more lines.
        #[arg(long, required = true)]
        series: Vec<String>,
        /// LABEL=START,END in Unix seconds: a span to shade; repeatable.
        #[arg(long)]
        span: Vec<String>,
        /// Unix seconds of the timeline's zero, when the runs started.
        #[arg(long)]
        start: f64,
        /// Length of a step of the timeline.
        #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
        step: Duration,
        /// Length of the timeline.
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long)]
        title: String,
        /// The plot's path without extension: OUT.svg and OUT.png.
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let url = || cli.url.as_deref().context("--url (or LAMBDASTORE_URL) is required by this command");
    match cli.command {
        Command::Foundation { calls, connections, spins } => {
            foundation(url()?, &cli.lambdas, calls, connections, spins)
        }
        Command::Contention { clients, seconds, entries, rounds } => {
            contention::run(url()?, &cli.lambdas, clients, seconds, entries, rounds as usize)
        }
        Command::Jobs { jobs, objects, latency_samples } => {
            jobs::run(url()?, &cli.lambdas, jobs, objects, latency_samples)
        }
        Command::Suite { quick, clients, rate, warmup, duration, workloads, systems, out } => {
            suite::run(suite::Options {
                url: url()?.to_string(),
                lambdas: cli.lambdas.clone(),
                out,
                quick,
                clients,
                rate,
                warmup,
                duration,
                workloads,
                systems,
            })
        }
        Command::Report { from, out } => suite::redraw(&from, &out),
        Command::Http { gateway, workloads, connections, duration, warmup, cpu_of } => {
            let cpu = cpu::with_client(&cpu_of);
            http::run(url()?, &cli.lambdas, &http::Options { gateway, workloads, connections, duration, warmup, cpu })
        }
        Command::Timeline { series, span, start, step, duration, title, out } => {
            timeline::run(&timeline::Options { series, spans: span, start, step, duration, title, out })
        }
    }
}

fn micros(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn time_calls(n: u64, mut call: impl FnMut() -> Result<()>) -> Result<Histogram<u64>> {
    let mut h = histogram();
    for _ in 0..n {
        let start = Instant::now();
        call()?;
        h.record(start.elapsed().as_micros().max(1) as u64)?;
    }
    Ok(h)
}

fn deploy(client: &mut Client, app: &str, wasm: &[u8]) -> Result<()> {
    client.execute("SELECT lambdastore.deploy($1, $2)", &[&app, &wasm])?;
    Ok(())
}

fn foundation(url: &str, lambdas: &Path, calls: u64, connections: u64, spins: u64) -> Result<()> {
    let counter = std::fs::read(lambdas.join("counter.wasm")).context("read counter.wasm (run make lambdas)")?;
    let micro = std::fs::read(lambdas.join("micro.wasm")).context("read micro.wasm")?;
    let mut client = Client::connect(url, NoTls)?;
    client.batch_execute("CREATE EXTENSION IF NOT EXISTS lambdastore")?;
    deploy(&mut client, "bench_counter", &counter)?;
    deploy(&mut client, "bench_micro", &micro)?;
    let id: i64 = client.query_one("SELECT lambdastore.create_object('bench_counter', 'Counter', '{}')", &[])?.get(0);

    println!("warm calls on one connection ({calls} each, latency in µs, client-side, loopback):");
    let select1 = client.prepare("SELECT 1")?;
    let increment = client.prepare("SELECT lambda_invoke($1, 'increment')")?;
    let get = client.prepare("SELECT lambda_invoke($1, 'get')")?;
    for _ in 0..200 {
        client.query_one(&increment, &[&id])?; // warm the backend: engine, module, plans
    }
    let rows: Vec<(&str, Histogram<u64>)> = vec![
        ("SELECT 1", time_calls(calls, || client.query_one(&select1, &[]).map(|_| ()).map_err(Into::into))?),
        (
            "lambda_invoke(counter, 'get')",
            time_calls(calls, || client.query_one(&get, &[&id]).map(|_| ()).map_err(Into::into))?,
        ),
        (
            "lambda_invoke(counter, 'increment')",
            time_calls(calls, || client.query_one(&increment, &[&id]).map(|_| ()).map_err(Into::into))?,
        ),
    ];
    println!("  {:<38} {:>8} {:>8} {:>8}", "statement", "p50", "p90", "p99");
    for (name, h) in &rows {
        println!("  {name:<38} {:>8.0} {:>8.0} {:>8.0}", micros(h, 0.5), micros(h, 0.9), micros(h, 0.99));
    }

    // Cold start: the first call in a brand-new backend after a deploy pays
    // for the wasmtime engine, the epoch thread and mapping the compiled
    // module from the disk cache; the second call is warm. A new backend's
    // first statement also loads PostgreSQL's catalog caches and plans,
    // whatever runs it, so a PL/pgSQL function reading the same row runs
    // side by side in its own new connections: the difference of the two
    // extras is what the sandbox adds.
    client.batch_execute(PLPGSQL_GET)?;
    let mut lambda = ColdStart::default();
    let mut plpgsql = ColdStart::default();
    let mut redeployed = counter.clone();
    for i in 0..connections {
        if i % 20 == 0 {
            // A fresh version now and then: its artifact was written at deploy.
            redeployed.extend_from_slice(&custom_section(&format!("v{i}")));
            deploy(&mut client, "bench_counter", &redeployed)?;
        }
        lambda.measure(url, "SELECT lambda_invoke($1, 'get')", id)?;
        plpgsql.measure(url, "SELECT bench_plpgsql_get($1)", id)?;
    }
    println!("cold start over {connections} new connections each (µs, p50):");
    for (name, c) in [("lambda_invoke(counter, 'get')", &lambda), ("PL/pgSQL reading the same row", &plpgsql)] {
        println!(
            "  {name:<32} first call {:>6.0}, second {:>5.0}, extra {:>6.0} (p90 {:.0})",
            micros(&c.first, 0.5),
            micros(&c.second, 0.5),
            micros(&c.extra, 0.5),
            micros(&c.extra, 0.9)
        );
    }
    println!(
        "  added by the sandbox (difference of the p50 extras): {:.0} µs",
        micros(&lambda.extra, 0.5) - micros(&plpgsql.extra, 0.5)
    );

    // Timeout overshoot: how long past lambdastore.timeout a spinning
    // lambda keeps the statement.
    let bench: i64 = client.query_one("SELECT lambdastore.create_object('bench_micro', 'Bench', '{}')", &[])?.get(0);
    client.batch_execute("SET lambdastore.timeout = '1s'")?;
    let mut over = histogram();
    for _ in 0..spins {
        let t = Instant::now();
        match client.query_one("SELECT lambda_invoke($1, 'spin')", &[&bench]) {
            Ok(_) => bail!("spin returned"),
            Err(e) if e.code().map(|c| c.code()) == Some("57014") => {}
            Err(e) => bail!("spin failed unexpectedly: {e}"),
        }
        let elapsed = t.elapsed();
        over.record((elapsed.saturating_sub(Duration::from_secs(1))).as_micros().max(1) as u64)?;
    }
    println!(
        "spin() with lambdastore.timeout = 1s, {spins} runs: stopped after the deadline by p50 {:.1} ms, max {:.1} ms",
        micros(&over, 0.5) / 1000.0,
        over.max() as f64 / 1000.0
    );
    Ok(())
}

/// PL/pgSQL reading what `counter.get` reads: the cold-start comparison.
pub(crate) const PLPGSQL_GET: &str = include_str!("../sql/plpgsql/counter.sql");

pub(crate) struct ColdStart {
    pub first: Histogram<u64>,
    pub second: Histogram<u64>,
    pub extra: Histogram<u64>,
}

impl Default for ColdStart {
    fn default() -> Self {
        ColdStart { first: histogram(), second: histogram(), extra: histogram() }
    }
}

impl ColdStart {
    /// One new connection: the backend is up (`SELECT 1`), then `sql` twice.
    pub fn measure(&mut self, url: &str, sql: &str, id: i64) -> Result<()> {
        let mut fresh = Client::connect(url, NoTls)?;
        let stmt = fresh.prepare(sql)?;
        fresh.query_one("SELECT 1", &[])?;
        let t = Instant::now();
        fresh.query_one(&stmt, &[&id])?;
        let a = t.elapsed().as_micros().max(1) as u64;
        let t = Instant::now();
        fresh.query_one(&stmt, &[&id])?;
        let b = t.elapsed().as_micros().max(1) as u64;
        self.first.record(a)?;
        self.second.record(b)?;
        self.extra.record(a.saturating_sub(b).max(1))?;
        Ok(())
    }
}

/// A custom section: changes a component's bytes (so its hash and version)
/// without changing its code.
pub(crate) fn custom_section(name: &str) -> Vec<u8> {
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name.as_bytes());
    let mut section = vec![0u8, payload.len() as u8];
    section.extend(payload);
    section
}
