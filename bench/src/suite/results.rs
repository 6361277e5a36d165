//! What a suite run measured: written as JSON, and the input of the
//! markdown table and the plots (see `report`).

use serde::{Deserialize, Serialize};

/// One invocation of `lambdastore-bench suite`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub machine: Machine,
    /// RFC 3339, UTC.
    pub started_at: String,
    /// `--quick`: short runs and scaled-down data.
    pub quick: bool,
    /// The data sizes actually used, e.g. "rw-mix: 2,000 objects x 100 entries x 1 KiB".
    pub scale: Vec<String>,
    /// Derived numbers worth a sentence: ratios against the goals,
    /// recovery times.
    #[serde(default)]
    pub findings: Vec<String>,
    pub runs: Vec<Run>,
}

/// Where the numbers come from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    /// `SELECT version()`.
    pub postgres: String,
}

/// One (workload, variant, system) measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    /// "rw-mix", "job-length", "cloudforum", "retwis", "faulty", "cold-start".
    pub workload: String,
    /// Human label of the variant: "25% writes", "n = 1000", "warm call", …
    pub variant: String,
    /// The variant as a number where it has one (write percent, hash rounds),
    /// for line plots; `None` for categorical variants.
    pub x: Option<f64>,
    /// "lambdastore", "disaggregated", "plpgsql" or "raw-sql".
    pub system: String,
    /// "closed" or "open <rate>/s".
    pub mode: String,
    pub clients: usize,
    /// Measured time (warm-up excluded).
    pub seconds: f64,
    /// Completed operations (transactions that committed, or calls that
    /// returned) in the measured time.
    pub ops: u64,
    /// ops / seconds.
    pub throughput: f64,
    /// Operations that failed for good (after retries, or not retryable).
    pub errors: u64,
    /// Serialization failures retried (each retry is a new attempt of the
    /// same operation; only the final success counts in `ops`).
    pub retries: u64,
    /// Latency of completed operations, from the intended start (open loop)
    /// or the actual start (closed loop) to the reply, retries included.
    pub latency_us: Latency,
    /// Completed operations per `timeline_step_s` slice of the measured time,
    /// as a rate (ops/s); empty where not recorded.
    pub timeline: Vec<f64>,
    pub timeline_step_s: f64,
    /// CPU time per completed operation in the measured window, where the
    /// server runs on the bench's machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_us: Option<CpuPerOp>,
}

/// Microseconds of CPU per operation: this process (the clients, and the
/// disaggregated system's wasmtime host) and the server's processes (its
/// backends and workers, the PL/pgSQL and lambdas run there).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct CpuPerOp {
    pub client: f64,
    pub server: f64,
}

/// Microseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}
