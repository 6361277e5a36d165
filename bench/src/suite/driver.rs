//! The load loop: client threads, each with its own session, run operations
//! closed loop (the next as soon as the last returns) or open loop (at a
//! target rate, latency counted from when the operation was due, so a
//! stalled server is not hidden by clients that wait for it). Serialization
//! failures are retried; the retried operation's latency includes them.

use super::results::{Latency, Run};
use anyhow::Result;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// What one attempt of an operation came to.
pub enum Outcome {
    Done,
    /// 40001 or 40P01: run the same operation again.
    Retry,
}

/// A client: one connection (or remote host) and the workload's choices.
pub trait Client {
    /// Runs the `i`-th operation of this client once.
    fn attempt(&mut self, op: &Op) -> Result<Outcome>;
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

/// Runs `clients` (built on their own threads by `make`) and measures them.
/// `label` names the progress bar.
pub fn drive<C, F>(label: &str, clients: usize, mode: Mode, timing: &Timing, make: F) -> Result<Measured>
where
    C: Client,
    F: Fn(usize) -> Result<C> + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let stop = Arc::new(AtomicBool::new(false));
    // Everyone starts together, after every client has connected.
    let ready = Arc::new(Barrier::new(clients + 1));
    let start_cell: Arc<std::sync::OnceLock<Instant>> = Arc::new(std::sync::OnceLock::new());
    let steps = (timing.measure.as_secs_f64() / timing.step.as_secs_f64()).ceil() as usize;
    let threads: Vec<_> = (0..clients)
        .map(|n| {
            let (make, stop, ready, start_cell, timing) = (make.clone(), stop.clone(), ready.clone(), start_cell.clone(), timing.clone());
            std::thread::spawn(move || -> Result<ClientResult> {
                let client = make(n);
                ready.wait();
                let mut client = client?;
                let started = *start_cell.wait();
                let measured_from = started + timing.warmup;
                let mut result = ClientResult { latency: histogram(), timeline: vec![0; steps], ops: 0, errors: 0, retries: 0 };
                let interval = match mode {
                    Mode::Closed => None,
                    Mode::Open(rate) => Some(Duration::from_secs_f64(clients as f64 / rate)),
                };
                // Open loop: client n's k-th operation is due at
                // started + (k + n/clients) * interval.
                let mut due = started + interval.map_or(Duration::ZERO, |i| i.mul_f64(n as f64 / clients as f64));
                while !stop.load(Ordering::Relaxed) {
                    if interval.is_some() {
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now); // the schedule, not synchronisation
                        }
                    }
                    let op = client.next_op();
                    let began = if interval.is_some() { due } else { Instant::now() };
                    let mut retries = 0;
                    let ok = loop {
                        match client.attempt(&op) {
                            Ok(Outcome::Done) => break true,
                            Ok(Outcome::Retry) if retries < MAX_RETRIES && !stop.load(Ordering::Relaxed) => retries += 1,
                            Ok(Outcome::Retry) => break false,
                            Err(e) => {
                                if began >= measured_from {
                                    result.errors += 1;
                                }
                                if result.errors == 1 {
                                    eprintln!("client {n}: {e:#}");
                                }
                                break false;
                            }
                        }
                    };
                    let finished = Instant::now();
                    if let Some(interval) = interval {
                        due += interval;
                    }
                    if began < measured_from {
                        continue;
                    }
                    let slice = ((finished - measured_from).as_secs_f64() / timing.step.as_secs_f64()) as usize;
                    if slice >= steps {
                        continue; // finished after the end
                    }
                    result.retries += retries as u64;
                    if ok {
                        result.ops += 1;
                        result.timeline[slice] += 1;
                        result.latency.record((finished - began).as_micros().max(1) as u64)?;
                    }
                }
                Ok(result)
            })
        })
        .collect();

    ready.wait();
    let started = Instant::now();
    start_cell.set(started).expect("set once");
    let total = timing.warmup + timing.measure;
    let bar = ProgressBar::new(total.as_millis() as u64).with_message(label.to_string());
    bar.set_style(
        ProgressStyle::with_template("{msg:40} [{bar:30}] {elapsed:>4}/{duration}").expect("valid template").progress_chars("=> "),
    );
    while started.elapsed() < total {
        std::thread::sleep(Duration::from_millis(100)); // the run's duration, not synchronisation
        bar.set_position(started.elapsed().as_millis().min(total.as_millis()) as u64);
        if threads.iter().all(|t| t.is_finished()) {
            break; // every client failed to connect
        }
    }
    stop.store(true, Ordering::Relaxed);
    bar.finish_and_clear();

    let mut merged = ClientResult { latency: histogram(), timeline: vec![0; steps], ops: 0, errors: 0, retries: 0 };
    for t in threads {
        let r = t.join().expect("client thread panicked")?;
        merged.latency.add(&r.latency)?;
        for (a, b) in merged.timeline.iter_mut().zip(&r.timeline) {
            *a += b;
        }
        merged.ops += r.ops;
        merged.errors += r.errors;
        merged.retries += r.retries;
    }
    Ok(Measured { result: merged, seconds: timing.measure.as_secs_f64(), step: timing.step.as_secs_f64(), clients, mode })
}

/// A finished measurement, to be labelled as a `Run`.
pub struct Measured {
    result: ClientResult,
    seconds: f64,
    step: f64,
    clients: usize,
    mode: Mode,
}

impl Measured {
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
