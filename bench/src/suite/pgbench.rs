//! The read-only mix once more through pgbench, LambdaStore and PL/pgSQL
//! alternating on the same objects. Both drivers share the two cores with
//! the server, and ours costs more per call than pgbench's: a blocking
//! thread per connection (a slower call puts it to sleep more often) and
//! JSON encoded and decoded in the client, where pgbench multiplexes the
//! connections on two threads and builds the arguments in SQL. The ratio
//! pgbench measures is therefore closer to the servers' own costs; the
//! report gives both. Skipped, with the reason, when pgbench is not on PATH
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
            self.results.findings.push("rw-mix 0% writes through pgbench: skipped, the objects' ids are not one range".into());
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
        let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let median = crate::contention::median(ratios);
        let verdict = if median >= 0.8 { "met" } else { "missed" };
        let threads = self.clients.min(2);
        self.results.findings.push(format!(
            "rw-mix 0% writes through pgbench ({} clients on {threads} threads, {ROUNDS} alternating runs): lambdastore ÷ plpgsql = {} (median {median:.2}×; goal ≥ 0.8×: {verdict})",
            self.clients,
            shown.join(" / "),
        ));
        Ok(())
    }

    /// `ROUNDS` times LambdaStore then PL/pgSQL; their ratio per round.
    fn alternate(&mut self, dir: &std::path::Path, first: i64, objects: usize) -> Result<Vec<f64>> {
        std::fs::create_dir_all(dir)?;
        for (_, name, script) in SCRIPTS {
            std::fs::write(dir.join(name), script)?;
        }
        let mut ratios = Vec::new();
        for _ in 0..ROUNDS {
            let mut tps = Vec::new();
            for (_, name, _) in SCRIPTS {
                self.settle()?;
                tps.push(self.pgbench(&dir.join(name), first, objects)?);
            }
            println!("  rw-mix 0% writes through pgbench: lambdastore {:.0} tx/s, plpgsql {:.0} tx/s", tps[0], tps[1]);
            ratios.push(tps[0] / tps[1]);
        }
        Ok(ratios)
    }

    /// One pgbench run of `script` over the objects `first` ..; its tx/s.
    fn pgbench(&self, script: &std::path::Path, first: i64, objects: usize) -> Result<f64> {
        let output = Command::new("pgbench")
            .args(["-n", "-M", "prepared"])
            .args(["-c", &self.clients.to_string(), "-j", &self.clients.min(2).to_string()])
            .args(["-T", &self.timing.measure.as_secs().max(1).to_string()])
            .args(["-D", &format!("first_object={first}"), "-D", &format!("objects={objects}"), "-D", "write_percent=0"])
            .arg("-f")
            .arg(script)
            .arg(&self.url)
            .output()
            .context("run pgbench")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!("pgbench failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        tps(&stdout).with_context(|| format!("no tps in pgbench's output: {stdout}"))
    }
}

/// The throughput pgbench reports: `tps = 27601.9 (without initial connection time)`.
fn tps(report: &str) -> Option<f64> {
    report.lines().find_map(|line| line.strip_prefix("tps = ")?.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::tps;

    #[test]
    fn tps_is_read_from_pgbenchs_report() {
        let report = "number of failed transactions: 0 (0.000%)\nlatency average = 0.290 ms\ninitial connection time = 8.966 ms\ntps = 27601.900922 (without initial connection time)\n";
        assert_eq!(tps(report), Some(27601.900922));
        assert_eq!(tps("pgbench: error: connection refused\n"), None);
    }
}
