//! The read-only mix once more through pgbench, LambdaStore and PL/pgSQL
//! alternating on the same objects. Both drivers share the two cores with
//! the server, and ours still costs more per call than pgbench's C client
//! (JSON encoded and decoded in the client, where pgbench builds the
//! arguments in SQL), which pulls ratios towards 1×. The ratio pgbench
//! measures is therefore closer to the servers' own costs; the report gives
//! both. Like the suite's own runs, each pgbench run has a warm-up that is
//! not measured: pgbench opens new connections, and a new backend's first
//! seconds (its first call of each object, shared buffers faulted into its
//! address space) are slower for both systems. The whole-run ratio is
//! reported as well. Skipped, with the reason, when pgbench is not on PATH
//! or the objects' ids are not one range (the scripts draw from a range).

use super::{Suite, System};
use anyhow::{bail, Context, Result};
use std::process::Command;

const ROUNDS: usize = 3;

/// The scripts of bench/pgbench, written out for pgbench to read.
const SCRIPTS: [(System, &str, &str); 2] = [
    (System::Lambdastore, "rw-mix-lambdastore.sql", include_str!("../../pgbench/rw-mix-lambdastore.sql")),
    (System::Plpgsql, "rw-mix-plpgsql.sql", include_str!("../../pgbench/rw-mix-plpgsql.sql")),
];

impl Suite {
    /// `ids`: the rw-mix objects, created in one go.
    pub(super) fn pgbench_read_only(&mut self, ids: &[i64]) -> Result<()> {
        if !SCRIPTS.iter().all(|(system, _, _)| self.systems.contains(system)) {
            return Ok(());
        }
        let (Some(&first), Some(&last)) = (ids.first(), ids.last()) else { return Ok(()) };
        if last - first + 1 != ids.len() as i64 {
            self.results
                .findings
                .push("rw-mix 0% writes through pgbench: skipped, the objects' ids are not one range".into());
            return Ok(());
        }
        let dir = std::env::temp_dir().join(format!("lambdastore-bench-{}", std::process::id()));
        let measured = self.alternate(&dir, first, ids.len());
        let _ = std::fs::remove_dir_all(&dir);
        let ratios = match measured {
            Ok(ratios) => ratios,
            Err(e) => {
                self.results.findings.push(format!("rw-mix 0% writes through pgbench: skipped ({e:#})"));
                return Ok(());
            }
        };
        let shown = |ratios: &[f64]| ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" / ");
        let (steady, whole): (Vec<f64>, Vec<f64>) = ratios.iter().map(|r| (r.steady, r.whole)).unzip();
        let (steady_shown, whole_shown) = (shown(&steady), shown(&whole));
        let (median, whole_median) = (crate::contention::median(steady), crate::contention::median(whole));
        let verdict = if median >= 0.8 { "met" } else { "missed" };
        let threads = self.clients.min(2);
        self.results.findings.push(format!(
            "rw-mix 0% writes through pgbench ({} clients on {threads} threads, {ROUNDS} alternating runs of {} s warm-up + {} s): lambdastore ÷ plpgsql after the warm-up = {steady_shown} (median {median:.2}×; goal ≥ 0.8×: {verdict}); over whole runs = {whole_shown} (median {whole_median:.2}×)",
            self.clients,
            self.timing.warmup.as_secs(),
            self.timing.measure.as_secs().max(1),
        ));
        Ok(())
    }

    /// `ROUNDS` times LambdaStore then PL/pgSQL; their ratios per round.
    fn alternate(&mut self, dir: &std::path::Path, first: i64, objects: usize) -> Result<Vec<Throughput>> {
        std::fs::create_dir_all(dir)?;
        for (_, name, script) in SCRIPTS {
            std::fs::write(dir.join(name), script)?;
        }
        let mut ratios = Vec::new();
        for _ in 0..ROUNDS {
            let mut runs = Vec::new();
            for (_, name, _) in SCRIPTS {
                self.settle()?;
                runs.push(self.pgbench(&dir.join(name), first, objects)?);
            }
            let [ls, pl] = [&runs[0], &runs[1]];
            println!(
                "  rw-mix 0% writes through pgbench: lambdastore {:.0} tx/s after the warm-up ({:.0} whole run), plpgsql {:.0} ({:.0})",
                ls.steady, ls.whole, pl.steady, pl.whole
            );
            ratios.push(Throughput { steady: ls.steady / pl.steady, whole: ls.whole / pl.whole });
        }
        Ok(ratios)
    }

    /// One pgbench run of `script` over the objects `first` ..: the suite's
    /// warm-up, then its measurement.
    fn pgbench(&self, script: &std::path::Path, first: i64, objects: usize) -> Result<Throughput> {
        let warmup = self.timing.warmup.as_secs();
        let output = Command::new("pgbench")
            .args(["-n", "-M", "prepared", "-P", "1"])
            .args(["-c", &self.clients.to_string(), "-j", &self.clients.min(2).to_string()])
            .args(["-T", &(warmup + self.timing.measure.as_secs().max(1)).to_string()])
            .args([
                "-D",
                &format!("first_object={first}"),
                "-D",
                &format!("objects={objects}"),
                "-D",
                "write_percent=0",
            ])
            .arg("-f")
            .arg(script)
            .arg(&self.url)
            .output()
            .context("run pgbench")?;
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        if !output.status.success() {
            bail!("pgbench failed: {}", stderr.trim());
        }
        let whole = tps(&stdout).with_context(|| format!("no tps in pgbench's output: {stdout}"))?;
        let steady = tps_after(&stderr, warmup)
            .with_context(|| format!("no progress after {warmup} s in pgbench's output: {stderr}"))?;
        Ok(Throughput { steady, whole })
    }
}

/// Throughput (or the ratio of two): after the warm-up, and over the whole run.
struct Throughput {
    steady: f64,
    whole: f64,
}

/// The throughput pgbench reports: `tps = 27601.9 (without initial connection time)`.
fn tps(report: &str) -> Option<f64> {
    report.lines().find_map(|line| line.strip_prefix("tps = ")?.split_whitespace().next()?.parse().ok())
}

/// The mean of pgbench's per-second progress reports (`-P 1`) for the
/// seconds after `warmup`: `progress: 3.0 s, 31685.1 tps, lat 0.240 ms ...`.
fn tps_after(progress: &str, warmup: u64) -> Option<f64> {
    let measured: Vec<f64> = progress
        .lines()
        .filter_map(|line| {
            let (at, rest) = line.strip_prefix("progress: ")?.split_once(" s, ")?;
            let tps: f64 = rest.split_once(" tps")?.0.parse().ok()?;
            (at.parse::<f64>().ok()? > warmup as f64).then_some(tps)
        })
        .collect();
    (!measured.is_empty()).then(|| measured.iter().sum::<f64>() / measured.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::{tps, tps_after};

    #[test]
    fn tps_is_read_from_pgbenchs_report() {
        let report = "number of failed transactions: 0 (0.000%)\nlatency average = 0.290 ms\ninitial connection time = 8.966 ms\ntps = 27601.900922 (without initial connection time)\n";
        assert_eq!(tps(report), Some(27601.900922));
        assert_eq!(tps("pgbench: error: connection refused\n"), None);
    }

    #[test]
    fn tps_after_the_warm_up_is_the_mean_of_the_later_seconds() {
        let progress = "progress: 1.0 s, 20000.0 tps, lat 0.400 ms stddev 0.2, 0 failed\n\
                        progress: 2.0 s, 24000.0 tps, lat 0.330 ms stddev 0.1, 0 failed\n\
                        progress: 3.0 s, 30000.0 tps, lat 0.260 ms stddev 0.1, 0 failed\n\
                        progress: 4.0 s, 32000.0 tps, lat 0.250 ms stddev 0.1, 0 failed\n";
        assert_eq!(tps_after(progress, 2), Some(31000.0));
        assert_eq!(tps_after(progress, 0), Some(26500.0));
        assert_eq!(tps_after(progress, 4), None, "nothing after the warm-up");
        assert_eq!(tps_after("pgbench: error: connection refused\n", 0), None);
    }
}
