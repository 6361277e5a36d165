//! The load loop: clients, each with its own session, run operations
//! closed loop (the next as soon as the last returns) or open loop (at a
//! target rate, latency counted from when the operation was due, so a
//! stalled server is not hidden by clients that wait for it). Serialization
//! failures are retried; the retried operation's latency includes them.
//!
//! SQL clients are tokio-postgres connections multiplexed on one thread
//! per core, as pgbench multiplexes them on its `-j` threads: with
//! a blocking thread per connection the driver was woken and put to sleep
//! once per call, on the cores the server uses, which cost the longer
//! calls more (the read-only mix measured 0.61× PL/pgSQL through it and
//! 0.79× through pgbench in the same run). Clients that block (the
//! disaggregated baseline runs wasmtime and blocking SQL in this process)
//! get a thread each.

use super::results::{CpuPerOp, Latency, Run};
use crate::cpu;
use anyhow::Result;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

/// What one attempt of an operation came to.
pub enum Outcome {
    Done,
    /// 40001 or 40P01: run the same operation again.
    Retry,
}

/// A client that blocks: one connection (or remote host) and the workload's choices.
pub trait Client {
    /// Runs an operation once.
    fn attempt(&mut self, op: &Op) -> Result<Outcome>;
    /// The next operation to run.
    fn next_op(&mut self) -> Op;
}

/// A client whose calls are futures, run as a task.
pub trait AsyncClient: Send + 'static {
    /// Runs an operation once.
    fn attempt(&mut self, op: &Op) -> impl Future<Output = Result<Outcome>> + Send;
    /// The next operation to run.
    fn next_op(&mut self) -> Op;
}

/// An operation, chosen before its first attempt so retries repeat it.
pub type Op = super::workloads::Op;

#[derive(Clone, Copy)]
pub enum Mode {
    Closed,
    /// Operations per second, over all clients.
    Open(f64),
}

#[derive(Clone)]
pub struct Timing {
    pub warmup: Duration,
    pub measure: Duration,
    /// Width of a timeline slice.
    pub step: Duration,
    /// The client (this process) and the server's processes, whose CPU
    /// time in the measured window each run reports per operation; empty
    /// when the server is not on this machine.
    pub watched: Vec<cpu::Watched>,
}

impl Timing {
    /// Slices of the measured window.
    fn steps(&self) -> usize {
        (self.measure.as_secs_f64() / self.step.as_secs_f64()).ceil() as usize
    }
}

/// Retries of one operation before it counts as an error.
const MAX_RETRIES: u32 = 100;

struct ClientResult {
    latency: Histogram<u64>,
    timeline: Vec<u64>,
    ops: u64,
    errors: u64,
    retries: u64,
}

impl ClientResult {
    fn new(steps: usize) -> Self {
        ClientResult { latency: histogram(), timeline: vec![0; steps], ops: 0, errors: 0, retries: 0 }
    }
}

/// How an operation ended.
enum Ended {
    Done,
    /// Still a serialization failure after `MAX_RETRIES`, or at the end of the run.
    GaveUp,
    Failed,
}

/// One client's schedule and tally, the same for threads and tasks.
struct Pace {
    n: usize,
    /// Whether this client's first error has been printed.
    reported: bool,
    interval: Option<Duration>,
    /// Open loop: when the next operation is due.
    due: Instant,
    measured_from: Instant,
    step: Duration,
    result: ClientResult,
}

impl Pace {
    fn new(n: usize, clients: usize, mode: Mode, timing: &Timing, started: Instant) -> Pace {
        let interval = match mode {
            Mode::Closed => None,
            Mode::Open(rate) => Some(Duration::from_secs_f64(clients as f64 / rate)),
        };
        Pace {
            n,
            reported: false,
            interval,
            // Open loop: client n's k-th operation is due at
            // started + (k + n/clients) * interval.
            due: started + interval.map_or(Duration::ZERO, |i| i.mul_f64(n as f64 / clients as f64)),
            measured_from: started + timing.warmup,
            step: timing.step,
            result: ClientResult::new(timing.steps()),
        }
    }

    /// Open loop: how long until the next operation is due.
    fn until_due(&self) -> Option<Duration> {
        self.interval.map(|_| self.due.saturating_duration_since(Instant::now())).filter(|d| !d.is_zero())
    }

    /// When the next operation counts as started: closed loop, now; open
    /// loop, when it was due, so that waiting for a slow server counts.
    /// After the client itself slept until then, from when it woke: a
    /// timer's lateness is the driver's (tokio's timer ticks in
    /// milliseconds, which put up to 1 ms on every open-loop latency).
    fn began(&self, slept: bool) -> Instant {
        match self.interval {
            None => Instant::now(),
            Some(_) if slept => self.due.max(Instant::now()),
            Some(_) => self.due,
        }
    }

    /// What an attempt means for its operation: how it ended, or None to
    /// run it again.
    fn judge(&mut self, attempt: Result<Outcome>, retries: &mut u32, stop: &AtomicBool) -> Option<Ended> {
        match attempt {
            Ok(Outcome::Done) => Some(Ended::Done),
            Ok(Outcome::Retry) if *retries < MAX_RETRIES && !stop.load(Ordering::Relaxed) => {
                *retries += 1;
                None
            }
            Ok(Outcome::Retry) => Some(Ended::GaveUp),
            Err(e) => {
                if !self.reported {
                    self.reported = true;
                    eprintln!("client {}: {e:#}", self.n);
                }
                Some(Ended::Failed)
            }
        }
    }

    /// Counts a finished operation if it began and ended inside the
    /// measured window.
    fn finish(&mut self, began: Instant, ended: Ended, retries: u32) -> Result<()> {
        let finished = Instant::now();
        if let Some(interval) = self.interval {
            self.due += interval;
        }
        if began < self.measured_from {
            return Ok(());
        }
        let slice = ((finished - self.measured_from).as_secs_f64() / self.step.as_secs_f64()) as usize;
        if slice >= self.result.timeline.len() {
            return Ok(()); // finished after the end
        }
        self.result.retries += retries as u64;
        match ended {
            Ended::Done => {
                self.result.ops += 1;
                self.result.timeline[slice] += 1;
                self.result.latency.record((finished - began).as_micros().max(1) as u64)?;
            }
            Ended::Failed => self.result.errors += 1,
            Ended::GaveUp => {}
        }
        Ok(())
    }
}

/// Runs blocking `clients` (each built on its own thread by `make`) and
/// measures them. `label` names the progress bar.
pub fn drive<C, F>(label: &str, clients: usize, mode: Mode, timing: &Timing, make: F) -> Result<Measured>
where
    C: Client,
    F: Fn(usize) -> Result<C> + Send + Sync + 'static,
{
    let load_timing = timing.clone();
    let load = move |(n, mut client): (usize, C), started: Instant, stop: &Arc<AtomicBool>| {
        let mut pace = Pace::new(n, clients, mode, &load_timing, started);
        while !stop.load(Ordering::Relaxed) {
            let wait = pace.until_due();
            if let Some(wait) = wait {
                std::thread::sleep(wait); // the schedule, not synchronisation
            }
            let op = client.next_op();
            let (began, mut retries) = (pace.began(wait.is_some()), 0);
            let ended = loop {
                if let Some(ended) = pace.judge(client.attempt(&op), &mut retries, stop) {
                    break ended;
                }
            };
            pace.finish(began, ended, retries)?;
        }
        Ok(vec![pace.result])
    };
    run_workers(label, clients, mode, timing, clients, move |n| make(n).map(|client| (n, client)), load)
}

/// Runs `clients` as tasks (each built by `make`) and measures them: one
/// thread per core, each with a single-threaded runtime and its share of
/// the connections (client n on thread n % threads), as pgbench's `-j`
/// does, so a connection's task and its client's never cross threads.
pub fn drive_tasks<C, F, Fut>(label: &str, clients: usize, mode: Mode, timing: &Timing, make: F) -> Result<Measured>
where
    C: AsyncClient,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<C>>,
{
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(clients).max(1);
    let connect = move |t: usize| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let connected = runtime.block_on(async {
            let mut connected = Vec::new();
            for n in (t..clients).step_by(threads) {
                connected.push((n, make(n).await?));
            }
            anyhow::Ok(connected)
        })?;
        Ok((runtime, connected))
    };
    let load_timing = timing.clone();
    let load = move |(runtime, connected): (tokio::runtime::Runtime, Vec<(usize, C)>),
                     started: Instant,
                     stop: &Arc<AtomicBool>| {
        runtime.block_on(async {
            let tasks: Vec<_> = connected
                .into_iter()
                .map(|(n, client)| {
                    tokio::spawn(run_task(n, client, clients, mode, load_timing.clone(), started, stop.clone()))
                })
                .collect();
            let mut results = Vec::with_capacity(tasks.len());
            for task in tasks {
                results.push(task.await.expect("client task panicked")?);
            }
            Ok(results)
        })
    };
    run_workers(label, clients, mode, timing, threads, connect, load)
}

/// Starts `workers` threads and measures what they report: each connects
/// (`connect`, given its index), then all start together once every one
/// has connected or failed to, and each runs its clients (`load`, given
/// the common start and the stop flag) until the run's time is up.
fn run_workers<T, Connect, Load>(
    label: &str,
    clients: usize,
    mode: Mode,
    timing: &Timing,
    workers: usize,
    connect: Connect,
    load: Load,
) -> Result<Measured>
where
    Connect: Fn(usize) -> Result<T> + Send + Sync + 'static,
    Load: Fn(T, Instant, &Arc<AtomicBool>) -> Result<Vec<ClientResult>> + Send + Sync + 'static,
{
    let (connect, load) = (Arc::new(connect), Arc::new(load));
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(workers + 1));
    let start_cell: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let (connect, load, stop, ready, start_cell) =
                (connect.clone(), load.clone(), stop.clone(), ready.clone(), start_cell.clone());
            std::thread::spawn(move || {
                let connected = connect(w);
                ready.wait(); // even after a failed connection, or the others would wait forever
                load(connected?, *start_cell.wait(), &stop)
            })
        })
        .collect();

    ready.wait();
    let started = Instant::now();
    start_cell.set(started).expect("set once");
    let mut warm = None;
    watch(
        label,
        timing,
        started,
        || handles.iter().all(|h| h.is_finished()),
        || warm = Some(cpu::sample(&timing.watched)),
    );
    let cpu = match warm {
        Some(before) => Some((before?, cpu::sample(&timing.watched)?)),
        None => None,
    };
    stop.store(true, Ordering::Relaxed);
    let mut results = Vec::new();
    for h in handles {
        match h.join().expect("driver thread panicked") {
            Ok(done) => results.extend(done.into_iter().map(Ok)),
            Err(e) => results.push(Err(e)),
        }
    }
    let mut measured = Measured::merge(results.into_iter(), timing, clients, mode)?;
    if let (Some((before, after)), false) = (cpu, timing.watched.is_empty()) {
        let per_op =
            |i: usize| after[i].saturating_sub(before[i]).as_secs_f64() * 1e6 / measured.result.ops.max(1) as f64;
        measured.cpu_us = Some(CpuPerOp { client: per_op(0), server: per_op(1) });
    }
    Ok(measured)
}

/// One task's load loop: the same as a client thread's (in `drive`),
/// awaiting calls. The two cannot be one: the blocking clients use the
/// `postgres` crate, which runs its own runtime and panics inside another
/// ("Cannot start a runtime from within a runtime"), so they cannot run as
/// tasks.
async fn run_task<C: AsyncClient>(
    n: usize,
    mut client: C,
    clients: usize,
    mode: Mode,
    timing: Timing,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> Result<ClientResult> {
    let mut pace = Pace::new(n, clients, mode, &timing, started);
    while !stop.load(Ordering::Relaxed) {
        let wait = pace.until_due();
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await; // the schedule, not synchronisation
        }
        let op = client.next_op();
        let (began, mut retries) = (pace.began(wait.is_some()), 0);
        let ended = loop {
            if let Some(ended) = pace.judge(client.attempt(&op).await, &mut retries, &stop) {
                break ended;
            }
        };
        pace.finish(began, ended, retries)?;
    }
    Ok(pace.result)
}

/// Shows the run's progress until its time is up (or `all_failed`), and
/// calls `warm` once, when the warm-up is over.
fn watch(label: &str, timing: &Timing, started: Instant, all_failed: impl Fn() -> bool, warm: impl FnOnce()) {
    let mut warm = Some(warm);
    let total = timing.warmup + timing.measure;
    let bar = ProgressBar::new(total.as_millis() as u64).with_message(label.to_string());
    bar.set_style(
        ProgressStyle::with_template("{msg:40} [{bar:30}] {elapsed:>4}/{duration}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    while started.elapsed() < total {
        if started.elapsed() >= timing.warmup {
            if let Some(warm) = warm.take() {
                warm();
            }
        }
        // Woken at the end of the warm-up too, to sample there.
        let to_warm = timing.warmup.checked_sub(started.elapsed()).filter(|left| !left.is_zero());
        let tick = to_warm.map_or(Duration::from_millis(100), |left| left.min(Duration::from_millis(100)));
        std::thread::sleep(tick); // the run's duration, not synchronisation
        bar.set_position(started.elapsed().as_millis().min(total.as_millis()) as u64);
        if all_failed() {
            break; // every client failed
        }
    }
    bar.finish_and_clear();
}

/// A finished measurement, to be labelled as a `Run`.
pub struct Measured {
    result: ClientResult,
    seconds: f64,
    step: f64,
    clients: usize,
    mode: Mode,
    cpu_us: Option<CpuPerOp>,
}

impl Measured {
    fn merge(
        results: impl Iterator<Item = Result<ClientResult>>,
        timing: &Timing,
        clients: usize,
        mode: Mode,
    ) -> Result<Measured> {
        let mut merged = ClientResult::new(timing.steps());
        for r in results {
            let r = r?;
            merged.latency.add(&r.latency)?;
            for (a, b) in merged.timeline.iter_mut().zip(&r.timeline) {
                *a += b;
            }
            merged.ops += r.ops;
            merged.errors += r.errors;
            merged.retries += r.retries;
        }
        Ok(Measured {
            result: merged,
            seconds: timing.measure.as_secs_f64(),
            step: timing.step.as_secs_f64(),
            clients,
            mode,
            cpu_us: None,
        })
    }

    pub fn into_run(self, workload: &str, variant: &str, x: Option<f64>, system: &str) -> Run {
        let h = &self.result.latency;
        Run {
            workload: workload.into(),
            variant: variant.into(),
            x,
            system: system.into(),
            mode: match self.mode {
                Mode::Closed => "closed".into(),
                Mode::Open(rate) => format!("open {rate:.0}/s"),
            },
            clients: self.clients,
            seconds: self.seconds,
            ops: self.result.ops,
            throughput: self.result.ops as f64 / self.seconds,
            errors: self.result.errors,
            retries: self.result.retries,
            latency_us: latency(h),
            timeline: self.result.timeline.iter().map(|&n| n as f64 / self.step).collect(),
            timeline_step_s: self.step,
            cpu_us: self.cpu_us,
        }
    }
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

pub fn latency(h: &Histogram<u64>) -> Latency {
    if h.is_empty() {
        return Latency::default();
    }
    Latency {
        p50: h.value_at_quantile(0.5) as f64,
        p90: h.value_at_quantile(0.9) as f64,
        p99: h.value_at_quantile(0.99) as f64,
        max: h.max() as f64,
        mean: h.mean(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation is retried once, then succeeds, except every tenth,
    /// which then fails.
    struct Scripted {
        op: u64,
        retried: bool,
    }

    impl Scripted {
        fn step(&mut self) -> Result<Outcome> {
            if !self.retried {
                self.retried = true;
                return Ok(Outcome::Retry);
            }
            self.retried = false;
            self.op += 1;
            if self.op.is_multiple_of(10) {
                anyhow::bail!("scripted failure");
            }
            Ok(Outcome::Done)
        }
    }

    impl Client for Scripted {
        fn attempt(&mut self, _: &Op) -> Result<Outcome> {
            self.step()
        }
        fn next_op(&mut self) -> Op {
            Op::Spin { object: 0 }
        }
    }

    impl AsyncClient for Scripted {
        async fn attempt(&mut self, _: &Op) -> Result<Outcome> {
            tokio::task::yield_now().await;
            self.step()
        }
        fn next_op(&mut self) -> Op {
            Op::Spin { object: 0 }
        }
    }

    fn check(measured: Measured, clients: u64) {
        let r = &measured.result;
        assert!(r.ops > 100, "{} operations", r.ops);
        // Each operation counted, done or failed, was retried once.
        let finished = r.ops + r.errors;
        assert_eq!(r.retries, finished);
        let expected_errors = finished / 10;
        assert!(r.errors.abs_diff(expected_errors) <= clients, "{} errors of {finished}", r.errors);
        assert_eq!(r.timeline.iter().sum::<u64>(), r.ops);
        assert_eq!(r.latency.len(), r.ops);
    }

    fn timing() -> Timing {
        Timing {
            warmup: Duration::ZERO,
            measure: Duration::from_millis(300),
            step: Duration::from_millis(100),
            watched: Vec::new(),
        }
    }

    #[test]
    fn open_loop_latency_starts_when_due_unless_the_client_slept_past_it() {
        let timing = timing();
        let started = Instant::now() - Duration::from_millis(50);
        let pace = Pace::new(0, 1, Mode::Open(1000.0), &timing, started);
        // Overdue (the last call ran long): counted from when it was due.
        assert_eq!(pace.began(false), started);
        // The client slept until it was due and woke late: from waking.
        assert!(pace.began(true) >= started + Duration::from_millis(50));
        // Closed loop: from now.
        let closed = Pace::new(0, 1, Mode::Closed, &timing, started);
        assert!(closed.began(false) >= started + Duration::from_millis(50));
    }

    #[test]
    fn threads_count_operations_retries_and_errors() {
        let measured = drive("test", 3, Mode::Closed, &timing(), |_| Ok(Scripted { op: 0, retried: false })).unwrap();
        check(measured, 3);
    }

    #[test]
    fn tasks_count_operations_retries_and_errors() {
        let measured =
            drive_tasks("test", 3, Mode::Closed, &timing(), |_| async { Ok(Scripted { op: 0, retried: false }) })
                .unwrap();
        check(measured, 3);
    }
}
