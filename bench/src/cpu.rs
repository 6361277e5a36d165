//! Where a request's CPU goes: the CPU time that named processes, each with
//! its descendants, spend in a measured window, read from /proc (utime +
//! stime). On two shared cores throughput moves with whatever else runs;
//! CPU time per request moves much less, so it is what shows whether a
//! target is reachable at all (`http --cpu-of gateway=PID --cpu-of
//! server=POSTMASTER_PID`: the server's backends are the postmaster's
//! children).

use anyhow::{anyhow, bail, Context, Result};
use procfs::process::{all_processes, Process};
use std::collections::HashMap;
use std::time::Duration;

/// A process tree to watch, named for the report.
#[derive(Clone, Debug)]
pub struct Watched {
    pub name: String,
    pub pid: i32,
}

impl std::str::FromStr for Watched {
    type Err = anyhow::Error;

    /// `NAME=PID`.
    fn from_str(spec: &str) -> Result<Watched> {
        let (name, pid) = spec.split_once('=').ok_or_else(|| anyhow!("expected NAME=PID, got {spec:?}"))?;
        let pid: i32 = pid.parse().with_context(|| format!("the PID in {spec:?}"))?;
        if name.is_empty() {
            bail!("expected NAME=PID, got {spec:?}");
        }
        Process::new(pid).with_context(|| format!("process {pid} ({name})"))?;
        Ok(Watched { name: name.to_string(), pid })
    }
}

/// This process and the watched ones: the client comes first.
pub fn with_client(watched: &[Watched]) -> Vec<Watched> {
    let me = Watched { name: "client".into(), pid: std::process::id() as i32 };
    std::iter::once(me).chain(watched.iter().cloned()).collect()
}

/// The CPU time each tree has used so far: the live processes' own time,
/// plus what the root's exited children used (counted once the root has
/// waited for them; a backend that ends inside a window counts only then).
pub fn sample(trees: &[Watched]) -> Result<Vec<Duration>> {
    let ticks = procfs::ticks_per_second() as f64;
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let mut own: HashMap<i32, u64> = HashMap::new();
    let mut reaped: HashMap<i32, u64> = HashMap::new();
    for process in all_processes()? {
        // A process may end between the listing and the read.
        let Ok(stat) = process.and_then(|p| p.stat()) else { continue };
        children.entry(stat.ppid).or_default().push(stat.pid);
        own.insert(stat.pid, stat.utime + stat.stime);
        reaped.insert(stat.pid, (stat.cutime + stat.cstime).max(0) as u64);
    }
    trees
        .iter()
        .map(|tree| {
            if !own.contains_key(&tree.pid) {
                bail!("process {} ({}) is gone", tree.pid, tree.name);
            }
            let (mut total, mut stack) = (reaped[&tree.pid], vec![tree.pid]);
            while let Some(pid) = stack.pop() {
                total += own.get(&pid).copied().unwrap_or(0);
                stack.extend(children.get(&pid).into_iter().flatten());
            }
            Ok(Duration::from_secs_f64(total as f64 / ticks))
        })
        .collect()
}

/// Microseconds of CPU per request of each tree between two samples, as
/// `client 31 · gateway 54 · server 218`.
pub fn per_request(trees: &[Watched], before: &[Duration], after: &[Duration], requests: u64) -> String {
    trees
        .iter()
        .zip(before.iter().zip(after))
        .map(|(tree, (b, a))| {
            let micros = a.saturating_sub(*b).as_secs_f64() * 1e6 / requests.max(1) as f64;
            format!("{} {micros:.0}", tree.name)
        })
        .collect::<Vec<_>>()
        .join(" · ")
}
