//! Throughput over time from pgbench's per-transaction logs (`--log`), drawn
//! with the suite's timeline plot and with marked spans shaded (e.g. an
//! object's migration, scripts/bench-citus.sh). pgbench's own
//! `--aggregate-interval` and `--progress` count whole seconds only, too
//! coarse for a stall of a few hundred milliseconds.
//!
//! A log line is `client transaction time script epoch_s epoch_us [retries]`,
//! `time` in µs or `failed` once the retries (`--max-tries`) ran out; a
//! transaction counts in the step its end (`epoch_s.epoch_us`) falls in.

use crate::suite::{self, Run, Span};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Options {
    /// `LABEL=FILE[,FILE...]`: one line per label, from the logs of one
    /// pgbench run (one file per thread).
    pub series: Vec<String>,
    /// `LABEL=START,END` in Unix seconds.
    pub spans: Vec<String>,
    /// Unix seconds of the timeline's zero (when the runs started).
    pub start: f64,
    pub step: Duration,
    pub duration: Duration,
    pub title: String,
    /// The plot's path without its extension.
    pub out: PathBuf,
}

pub fn run(options: &Options) -> Result<()> {
    let step = options.step.as_secs_f64();
    if step <= 0.0 || options.duration < options.step {
        bail!("--step must be positive and --duration at least one step");
    }
    let steps = (options.duration.as_secs_f64() / step).ceil() as usize;
    let spans: Vec<Span> = options
        .spans
        .iter()
        .map(|text| {
            let (label, times) = labelled(text)?;
            let (from, to) = times.split_once(',').with_context(|| format!("--span {text:?}: LABEL=START,END"))?;
            let at = |t: &str| -> Result<f64> {
                Ok(t.trim().parse::<f64>().with_context(|| format!("--span {text:?}: {t:?} is not a time"))?
                    - options.start)
            };
            Ok(Span { label: label.to_string(), from_s: at(from)?, to_s: at(to)? })
        })
        .collect::<Result<_>>()?;
    let mut series = Vec::new();
    for text in &options.series {
        let (label, files) = labelled(text)?;
        let mut counts = Counts::new(steps);
        for file in files.split(',') {
            counts.add_log(Path::new(file), options.start, step)?;
        }
        series.push((label.to_string(), counts));
    }

    let mut runs: Vec<Run> = series.iter().map(|(label, c)| c.run("lambdastore", label, step, &c.done)).collect();
    // The serialization failures retried, all series together: where they fall.
    let mut all = Counts::new(steps);
    for (_, c) in &series {
        all.merge(c);
    }
    runs.push(all.run("40001 retried", "all clients", step, &all.retried));
    let dir = options.out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let stem = options.out.file_name().and_then(|s| s.to_str()).context("--out needs a file name")?;
    let files = suite::write_timeline(dir, stem, &options.title, &runs, &spans)?;

    println!("| series | transactions | 40001 retried | failed (retries ran out) | ops/s before the first span |");
    println!("|---|---:|---:|---:|---:|");
    for (label, c) in &series {
        let first = spans.first().map_or(options.duration.as_secs_f64(), |s| s.from_s);
        println!(
            "| {label} | {} | {} | {} | {:.0} |",
            c.transactions,
            c.retried.iter().sum::<u64>(),
            c.failed,
            level(&rates(&c.done, step), step, 0.0, first)
        );
    }
    println!();
    println!(
        "| span | lasted | series | ops/s before | lowest {} ms step | back to 90% after | 40001 retried in it |",
        options.step.as_millis()
    );
    println!("|---|---:|---|---:|---:|---:|---:|");
    let mut since = 0.0;
    for span in &spans {
        for (label, c) in &series {
            let timeline = rates(&c.done, step);
            // The steps the span touches, and the one after (calls queued
            // behind the move end there).
            let (first, last) = ((span.from_s / step) as usize, ((span.to_s / step) as usize + 1).min(steps - 1));
            let lowest = timeline[first.min(last)..=last].iter().copied().fold(f64::INFINITY, f64::min);
            let back = {
                // The suite's measure of a fault's recovery, from the end of
                // the previous span, so that its dip is not part of the level.
                let offset = (since / step).ceil() as usize;
                suite::recovery(&timeline[offset.min(steps)..], step, span.from_s - offset as f64 * step)
                    .map_or("no step below half".to_string(), |(_, after)| format!("{after:.2} s"))
            };
            println!(
                "| {} | {:.2} s | {label} | {:.0} | {lowest:.0} | {back} | {} |",
                span.label,
                span.to_s - span.from_s,
                level(&timeline, step, since, span.from_s),
                c.retried[first.min(last)..=last].iter().sum::<u64>()
            );
        }
        since = span.to_s + 1.0;
    }
    for f in files {
        println!("wrote {}", f.display());
    }
    Ok(())
}

/// `LABEL=REST`, split at the first `=`.
fn labelled(text: &str) -> Result<(&str, &str)> {
    text.split_once('=')
        .filter(|(label, rest)| !label.is_empty() && !rest.is_empty())
        .with_context(|| format!("{text:?}: LABEL=..."))
}

/// What one series' logs hold, per step of the timeline.
struct Counts {
    /// Transactions that ended in each step.
    done: Vec<u64>,
    /// Their serialization failures retried (40001, and 40P01 deadlocks).
    retried: Vec<u64>,
    transactions: u64,
    failed: u64,
}

impl Counts {
    fn new(steps: usize) -> Self {
        Counts { done: vec![0; steps], retried: vec![0; steps], transactions: 0, failed: 0 }
    }

    fn add_log(&mut self, file: &Path, start: f64, step: f64) -> Result<()> {
        let text = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        for (n, line) in text.lines().enumerate() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let parsed = (|| -> Option<(bool, f64, u64)> {
                let failed = *fields.get(2)? == "failed";
                let end = fields.get(4)?.parse::<f64>().ok()? + fields.get(5)?.parse::<f64>().ok()? / 1e6;
                let retries = fields.get(6).map_or(Some(0), |r| r.parse().ok())?;
                Some((failed, end - start, retries))
            })();
            let (failed, at, retries) =
                parsed.with_context(|| format!("{}:{}: not a pgbench log line: {line:?}", file.display(), n + 1))?;
            let Some(i) = (at >= 0.0).then(|| (at / step) as usize).filter(|i| *i < self.done.len()) else {
                continue;
            };
            self.retried[i] += retries;
            if failed {
                self.failed += 1;
            } else {
                self.transactions += 1;
                self.done[i] += 1;
            }
        }
        Ok(())
    }

    fn merge(&mut self, other: &Counts) {
        for (a, b) in self.done.iter_mut().zip(&other.done) {
            *a += b;
        }
        for (a, b) in self.retried.iter_mut().zip(&other.retried) {
            *a += b;
        }
        self.transactions += other.transactions;
        self.failed += other.failed;
    }

    /// A suite run whose timeline is `per_step` as a rate, for the plot.
    fn run(&self, system: &str, variant: &str, step: f64, per_step: &[u64]) -> Run {
        let seconds = step * self.done.len() as f64;
        Run {
            workload: "timeline".into(),
            variant: variant.into(),
            x: None,
            system: system.into(),
            mode: "closed".into(),
            clients: 0,
            seconds,
            ops: self.transactions,
            throughput: self.transactions as f64 / seconds,
            errors: self.failed,
            retries: self.retried.iter().sum(),
            latency_us: Default::default(),
            timeline: rates(per_step, step),
            timeline_step_s: step,
            cpu_us: None,
        }
    }
}

fn rates(per_step: &[u64], step: f64) -> Vec<f64> {
    per_step.iter().map(|n| *n as f64 / step).collect()
}

/// The mean rate of the steps from `from_s` to `to_s` (seconds).
fn level(timeline: &[f64], step: f64, from_s: f64, to_s: f64) -> f64 {
    let (a, b) = ((from_s / step).ceil() as usize, ((to_s / step) as usize).min(timeline.len()));
    let slice = &timeline[a.min(b)..b];
    if slice.is_empty() {
        return 0.0;
    }
    slice.iter().sum::<f64>() / slice.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_counts_in_the_step_it_ended_in_with_its_retries() {
        let dir = std::env::temp_dir().join(format!("lambdastore-timeline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        // Start at 100.0 s: ends at 100.1, 100.3 (2 retries), 100.35
        // (failed after 5), 99.9 (before the start: left out).
        std::fs::write(
            &log,
            "0 1 500 0 100 100000 0\n0 2 900 0 100 300000 2\n1 1 failed 0 100 350000 5\n1 2 70 0 99 900000 0\n",
        )
        .unwrap();
        let mut counts = Counts::new(2);
        counts.add_log(&log, 100.0, 0.25).unwrap();
        assert_eq!(counts.done, [1, 1]);
        assert_eq!(counts.retried, [0, 7]);
        assert_eq!((counts.transactions, counts.failed), (2, 1));
        std::fs::write(&log, "progress: 1.0 s\n").unwrap();
        assert!(Counts::new(2).add_log(&log, 100.0, 0.25).is_err(), "not a log line");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_level_is_the_mean_rate_between_two_times() {
        let timeline = [10.0, 20.0, 30.0, 0.0];
        assert_eq!(level(&timeline, 0.5, 0.0, 1.5), 20.0);
        assert_eq!(level(&timeline, 0.5, 0.5, 1.0), 20.0);
        assert_eq!(level(&timeline, 0.5, 1.0, 1.0), 0.0, "nothing between");
    }
}
