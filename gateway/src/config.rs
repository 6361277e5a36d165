//! Command-line and environment configuration.

use clap::builder::RangedU64ValueParser;
use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::time::Duration;

fn duration(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text)
}

/// The LambdaStore HTTP gateway: a small stateless service in front of
/// PostgreSQL servers with the lambdastore extension.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub struct Config {
    /// PostgreSQL connection string (URL or `key=value` form) of the
    /// gateway's least-privilege role; see docs/gateway.md.
    #[arg(long, env = "LAMBDASTORE_DATABASE_URL")]
    pub database_url: String,

    /// Address to listen on.
    #[arg(long, env = "LAMBDASTORE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Database connections in the pool (per node).
    #[arg(long, env = "LAMBDASTORE_POOL_SIZE", default_value_t = 16)]
    pub pool_size: usize,

    /// Longest time a request may take, retries and waiting for a pooled
    /// connection included; also each connection's `statement_timeout`.
    #[arg(long, env = "LAMBDASTORE_REQUEST_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub request_timeout: Duration,

    /// How long a request's headers may take to arrive, and then its body:
    /// a client sending slowly would otherwise hold its connection for as
    /// long as it likes. A connection whose headers are late is closed (as is
    /// a keep-alive connection idle this long); a late body is 408.
    #[arg(long, env = "LAMBDASTORE_READ_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub read_timeout: Duration,

    /// Waits (`/v1/jobs/{id}/wait`) one API key may have in flight; more are
    /// 429. Each holds a pooled connection until the job finishes, so without
    /// a bound one application could hold the whole pool. Default: a quarter
    /// of `--pool-size`, at least 1.
    #[arg(long, env = "LAMBDASTORE_MAX_WAITS_PER_KEY", value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_waits_per_key: Option<usize>,

    /// Waits all API keys together may have in flight; more are 429. An
    /// application may hold many keys, so the bound per key alone would
    /// not keep the pool for other calls. Default: half of `--pool-size`,
    /// at least 1.
    #[arg(long, env = "LAMBDASTORE_MAX_WAITS", value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_waits: Option<usize>,

    /// Largest request body accepted, but a deploy's: the server's default
    /// `lambdastore.max_args_size`, past which it refuses a call's
    /// arguments anyway (after parsing them). Raise both together.
    #[arg(long, env = "LAMBDASTORE_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Largest module a deploy uploads (whole, in one body): the server's
    /// default `lambdastore.max_module_size`, which a Python component (18
    /// MB) needs.
    #[arg(long, env = "LAMBDASTORE_MAX_MODULE_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_module_bytes: usize,

    /// Re-runs of a call that failed with a serialization failure (40001)
    /// or a deadlock (40P01) before the client gets 409.
    #[arg(long, env = "LAMBDASTORE_MAX_RETRIES", default_value_t = 10)]
    pub max_retries: u32,

    /// Backoff before the first retry; it doubles per retry up to
    /// `--retry-max-backoff`, and each sleep is drawn uniformly below it.
    #[arg(long, default_value = "2ms", value_parser = duration)]
    pub retry_base_backoff: Duration,

    #[arg(long, default_value = "200ms", value_parser = duration)]
    pub retry_max_backoff: Duration,

    /// How long a stored Idempotency-Key response is kept.
    #[arg(long, env = "LAMBDASTORE_IDEMPOTENCY_TTL", default_value = "24h", value_parser = duration)]
    pub idempotency_ttl: Duration,

    /// After SIGTERM or Ctrl-C, how long in-flight requests may still run.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub shutdown_timeout: Duration,

    /// Log as JSON lines instead of text (filter with RUST_LOG).
    #[arg(long, env = "LAMBDASTORE_LOG_JSON")]
    pub log_json: bool,

    /// Where calls go: `auto` sends each call on an object to the Citus
    /// node holding it when `--database-url` is a Citus node with
    /// lambdastore distributed, else everything to `--database-url`;
    /// `single` always the latter; `citus` waits for the database at
    /// startup and refuses to start if lambdastore is not distributed.
    #[arg(long, env = "LAMBDASTORE_PLACEMENT", value_enum, default_value_t = PlacementMode::Auto)]
    pub placement: PlacementMode,

    /// A hot standby of the `--database-url` server (repeat, or separate
    /// with commas): calls of methods and static functions that only read
    /// go to the standbys in turn, everything else to the primary, whose
    /// answers to writing calls carry `lambdastore-commit-lsn`. One server
    /// only: refused with a Citus placement.
    #[arg(long = "replica", env = "LAMBDASTORE_REPLICAS", value_delimiter = ',')]
    pub replicas: Vec<String>,

    /// How long a read that carries `lambdastore-min-lsn` waits for a
    /// standby to replay that far before it is sent to the primary.
    #[arg(long, env = "LAMBDASTORE_REPLICA_WAIT", default_value = "1s", value_parser = duration)]
    pub replica_wait: Duration,

    /// For tests only: the first shard map read is wrong on purpose.
    #[arg(long, hide = true, value_enum)]
    pub misplace_for_tests: Option<Misplace>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementMode {
    Auto,
    Single,
    Citus,
}

/// How `--misplace-for-tests` spoils the first shard map.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misplace {
    /// Each shard on the next node holding shards (another worker).
    Shifted,
    /// Each shard on a node that refuses connections.
    Unreachable,
}

impl Config {
    pub fn max_waits_per_key(&self) -> usize {
        self.max_waits_per_key.unwrap_or((self.pool_size / 4).max(1))
    }

    pub fn max_waits(&self) -> usize {
        self.max_waits.unwrap_or((self.pool_size / 2).max(1))
    }

    /// The longest `timeout_ms` a wait request may ask for: the request's
    /// own deadline, less a margin for the round trip around the wait.
    pub fn max_wait(&self) -> Duration {
        self.request_timeout.saturating_sub(Duration::from_secs(1)).max(Duration::from_millis(100))
    }
}
