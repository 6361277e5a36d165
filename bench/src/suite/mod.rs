//! `lambdastore-bench suite`: the paper's experiments, each run on every
//! system side by side on the same data in one invocation, written as JSON,
//! a markdown table and SVG and PNG plots (`report`).

mod driver;
#[cfg(test)]
mod equivalence;
mod pgbench;
mod png;
mod report;
mod results;
mod systems;
mod workloads;

use crate::cpu;
use anyhow::{Context, Result};
use postgres::{Client, NoTls};
pub use report::{write_timeline, Span};
pub use results::Run;
use results::{Machine, Results};
use std::path::PathBuf;
use std::time::Duration;
pub use systems::System;
pub use workloads::recovery;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    RwMix,
    JobLength,
    Cloudforum,
    Retwis,
    Faulty,
    ColdStart,
}

pub struct Options {
    pub url: String,
    pub lambdas: PathBuf,
    pub out: PathBuf,
    pub quick: bool,
    pub clients: usize,
    /// Open loop at this many operations per second (over all clients).
    pub rate: Option<f64>,
    pub warmup: Option<Duration>,
    pub duration: Option<Duration>,
    pub workloads: Vec<Workload>,
    pub systems: Vec<System>,
}

pub struct Suite {
    url: String,
    lambdas: PathBuf,
    admin: Client,
    /// CHECKPOINT before each run (superuser or pg_checkpoint).
    may_checkpoint: bool,
    quick: bool,
    clients: usize,
    mode: driver::Mode,
    timing: driver::Timing,
    systems: Vec<System>,
    results: Results,
}

/// Writes the report of an earlier run's `results.json` again into `out`.
pub fn redraw(from: &std::path::Path, out: &std::path::Path) -> Result<()> {
    let json = std::fs::read_to_string(from).with_context(|| format!("read {}", from.display()))?;
    let results: Results = serde_json::from_str(&json).with_context(|| format!("parse {}", from.display()))?;
    for file in report::write(&results, out)? {
        println!("{}", file.display());
    }
    Ok(())
}

/// The server's process tree (its postmaster, the parent of this
/// connection's backend), when it runs on this machine.
fn server_on_this_machine(admin: &mut Client) -> Result<Option<cpu::Watched>> {
    let backend: i32 = admin.query_one("SELECT pg_backend_pid()", &[])?.get(0);
    let parent = procfs::process::Process::new(backend).and_then(|p| p.stat()).map(|stat| stat.ppid);
    // The same PID here may be another program's: check that it is a postgres.
    let postgres = |pid: i32| {
        procfs::process::Process::new(pid).and_then(|p| p.stat()).is_ok_and(|s| s.comm.starts_with("postgres"))
    };
    Ok(parent
        .ok()
        .filter(|&pid| postgres(pid) && postgres(backend))
        .map(|pid| cpu::Watched { name: "server".into(), pid }))
}

pub fn run(options: Options) -> Result<()> {
    let mut admin = Client::connect(&options.url, NoTls).context("connect to --url")?;
    admin.batch_execute("CREATE EXTENSION IF NOT EXISTS lambdastore")?;
    let postgres: String = admin.query_one("SELECT version()", &[])?.get(0);
    let may_checkpoint: bool = admin
        .query_one("SELECT rolsuper OR pg_has_role(current_user, 'pg_checkpoint', 'MEMBER') FROM pg_roles WHERE rolname = current_user", &[])?
        .get(0);
    if !may_checkpoint {
        println!("note: this role may not run CHECKPOINT, so a checkpoint may fall inside a run");
    }
    let (warmup, measure) = if options.quick {
        (Duration::from_secs(1), Duration::from_secs(3))
    } else {
        (Duration::from_secs(2), Duration::from_secs(10))
    };
    let watched = server_on_this_machine(&mut admin)?.map_or_else(Vec::new, |server| cpu::with_client(&[server]));
    let mut suite = Suite {
        url: options.url.clone(),
        lambdas: options.lambdas.clone(),
        admin,
        may_checkpoint,
        quick: options.quick,
        clients: options.clients,
        mode: options.rate.map_or(driver::Mode::Closed, driver::Mode::Open),
        timing: driver::Timing {
            warmup: options.warmup.unwrap_or(warmup),
            measure: options.duration.unwrap_or(measure),
            step: Duration::from_millis(100),
            watched,
        },
        systems: options.systems.clone(),
        results: Results {
            machine: machine(postgres),
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            quick: options.quick,
            scale: Vec::new(),
            findings: Vec::new(),
            runs: Vec::new(),
        },
    };
    println!(
        "{} clients ({}), {:?} warm-up + {:?} measured per run, systems: {}",
        suite.clients,
        options.rate.map_or("closed loop".to_string(), |r| format!("open loop, {r} ops/s")),
        suite.timing.warmup,
        suite.timing.measure,
        suite.systems.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
    );
    for workload in &options.workloads {
        println!("== {workload:?}");
        match workload {
            Workload::RwMix => suite.rw_mix(),
            Workload::JobLength => suite.job_length(),
            Workload::Cloudforum => suite.cloudforum(),
            Workload::Retwis => suite.retwis(),
            Workload::Faulty => suite.faulty(),
            Workload::ColdStart => suite.cold_start(),
        }
        .with_context(|| format!("workload {workload:?}"))?;
    }
    let goals = goals(&suite.results);
    suite.results.findings.extend(goals);
    std::fs::create_dir_all(&options.out)?;
    let files = report::write(&suite.results, &options.out)?;
    println!("\n{}", report::markdown(&suite.results));
    for f in files {
        println!("wrote {}", f.display());
    }
    Ok(())
}

impl Suite {
    fn wasm(&self, app: &str) -> Result<Vec<u8>> {
        let path = self.lambdas.join(format!("{app}.wasm"));
        std::fs::read(&path).with_context(|| format!("read {} (run make lambdas)", path.display()))
    }

    /// Deploys `app` under its own name (a no-op when the bytes are unchanged).
    fn deploy(&mut self, app: &str) -> Result<()> {
        let wasm = self.wasm(app)?;
        self.admin.execute("SELECT lambdastore.deploy($1, $2)", &[&app, &wasm])?;
        Ok(())
    }
}

/// The goals, as ratios measured in this run.
fn goals(results: &Results) -> Vec<String> {
    let find = |workload: &str, variant: &str, system: &str| {
        results.runs.iter().find(|r| r.workload == workload && r.variant == variant && r.system == system)
    };
    let ratio = |workload: &str, variant: &str, a: &str, b: &str| match (
        find(workload, variant, a),
        find(workload, variant, b),
    ) {
        (Some(a), Some(b)) if b.throughput > 0.0 => Some(a.throughput / b.throughput),
        _ => None,
    };
    let mut out = Vec::new();
    let goals =
        [("0% writes", "disaggregated", 10.0), ("0% writes", "plpgsql", 0.8), ("100% writes", "disaggregated", 1.0)];
    for (variant, baseline, goal) in goals {
        if let Some(r) = ratio("rw-mix", variant, "lambdastore", baseline) {
            let verdict = if r >= goal { "met" } else { "missed" };
            out.push(format!("rw-mix {variant}: lambdastore ÷ {baseline} = {r:.2}× (goal ≥ {goal}×: {verdict})"));
        }
    }
    let extra = |system| find("cold-start", "first minus second", system).map(|r| r.latency_us.p50);
    if let (Some(lambda), Some(plpgsql)) = (extra("lambdastore"), extra("plpgsql")) {
        let added = (lambda - plpgsql) / 1000.0;
        let verdict = if added < 1.0 { "met" } else { "missed" };
        out.push(format!("cold start: the sandbox adds {added:.2} ms to a new connection's first call beyond what PL/pgSQL's first call costs (p50; goal < 1 ms: {verdict})"));
    }
    out
}

fn machine(postgres: String) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Machine {
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib: memory_kib / (1024.0 * 1024.0),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        postgres,
    }
}
