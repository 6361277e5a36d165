//! Hot standbys of a single server (`--replica`): a call that may only read
//! is tried on one of them, in turn; everything else runs on the primary.
//!
//! The gateway does not know which functions write: a standby refuses a
//! writing call before it runs (25006), and the call then runs on the
//! primary, which it does from then on for that function of that API key's
//! application. A call with an Idempotency-Key stores its answer, a write:
//! primary. A read that carries `lambdastore-min-lsn` (the
//! `lambdastore-commit-lsn` of an earlier answer) first waits on the
//! standby until it has replayed that far, at most `--replica-wait`, and
//! runs on the primary if it has not: the client reads its own writes.

use crate::config::Config;
use crate::db::{self, Outcome, Param};
use crate::error::ApiError;
use crate::AppState;
use deadpool_postgres::Pool;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Functions remembered as writing, at most: beyond, a writing call costs
/// one refused round trip to a standby more.
const REMEMBERED: usize = 10_000;

pub struct Replicas {
    pools: Vec<(Arc<str>, Pool)>,
    next: AtomicUsize,
    /// (API key, function) pairs a standby refused as writing.
    writing: Mutex<HashSet<(String, String)>>,
}

impl Replicas {
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        let pools = config
            .replicas
            .iter()
            .enumerate()
            .map(|(n, url)| Ok((format!("replica-{}", n + 1).into(), db::pool_of(config, url, None)?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { pools, next: AtomicUsize::new(0), writing: Mutex::new(HashSet::new()) })
    }

    pub fn any(&self) -> bool {
        !self.pools.is_empty()
    }

    /// Every standby's pool, for the pool metrics.
    pub fn pools(&self) -> &[(Arc<str>, Pool)] {
        &self.pools
    }

    fn writes(&self, key: &str, function: &str) -> bool {
        self.writing.lock().expect("not poisoned").contains(&(key.to_string(), function.to_string()))
    }

    fn remember_writing(&self, key: &str, function: &str) {
        let mut writing = self.writing.lock().expect("not poisoned");
        if writing.len() < REMEMBERED {
            writing.insert((key.to_string(), function.to_string()));
        }
    }
}

/// What a standby made of a call.
enum Tried {
    Answered(Outcome),
    /// Refused as writing (25006): the primary runs it, from now on.
    Writes,
    /// A read the standby could not answer yet (it has not replayed
    /// `lambdastore-min-lsn`): the primary answers it.
    Lagging,
    /// The standby is down or failed: the primary runs it.
    Primary,
}

impl AppState {
    /// Runs `sql` (one row expected) on a standby if the call may only
    /// read, else on the primary, noting the commit's LSN there. `function`
    /// names what is called, for remembering that it writes; `writes` says
    /// it does for certain (an Idempotency-Key).
    #[allow(clippy::too_many_arguments)]
    pub async fn read_or_call(
        &self,
        route: &'static str,
        object: Option<i64>,
        (key, function): (&str, &str),
        writes: bool,
        min_lsn: Option<&str>,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Outcome, ApiError> {
        if !self.replicas.any() {
            return self.call(route, object, sql, params).await;
        }
        if !writes && !self.replicas.writes(key, function) {
            match self.on_a_standby(sql, params, min_lsn).await? {
                Tried::Answered(outcome) => return Ok(outcome),
                Tried::Writes => self.replicas.remember_writing(key, function),
                Tried::Lagging => return self.call(route, object, sql, params).await,
                Tried::Primary => {}
            }
        }
        self.call_with(route, object, sql, params, true).await
    }

    async fn on_a_standby(&self, sql: &str, params: &[Param<'_>], min_lsn: Option<&str>) -> Result<Tried, ApiError> {
        let replicas = &self.replicas;
        let (node, pool) = &replicas.pools[replicas.next.fetch_add(1, Ordering::Relaxed) % replicas.pools.len()];
        let client = match pool.get().await {
            Ok(client) => client,
            Err(err) => {
                tracing::warn!(node = %node, error = %err, "a standby is unreachable: calling the primary");
                return Ok(Tried::Primary);
            }
        };
        let call = client.prepare_cached(sql).await;
        let called = match (call, min_lsn) {
            (Err(err), _) => Err(err),
            (Ok(call), None) => client.query_one(&call, params).await,
            (Ok(call), Some(lsn)) => {
                // Pipelined, each its own transaction: the call's snapshot
                // is taken after the wait. If the wait fails, the call's
                // answer (read before the LSN) is dropped.
                let wait = "SELECT lambdastore_gateway.wait_for_replay($1::text::pg_lsn, $2::text::interval)";
                let timeout = format!("{} ms", self.config.replica_wait.as_millis());
                let waited = async {
                    let wait = client.prepare_cached(wait).await?;
                    client.execute(&wait, &[&lsn, &timeout]).await
                };
                let (waited, called) = tokio::join!(waited, client.query_one(&call, params));
                match waited {
                    Ok(_) => called,
                    Err(err) if sqlstate(&err) == Some("40001") => {
                        if called.as_ref().is_err_and(|err| sqlstate(err) == Some("25006")) {
                            return Ok(Tried::Writes);
                        }
                        metrics::counter!("lambdastore_gateway_replica_lagging_total").increment(1);
                        return Ok(Tried::Lagging);
                    }
                    Err(err) => Err(err),
                }
            }
        };
        metrics::counter!("lambdastore_gateway_calls_total", "node" => node.to_string()).increment(1);
        match called {
            Ok(row) => Ok(Tried::Answered(Outcome { row, retries: 0, node: node.clone(), commit_lsn: None })),
            Err(err) if sqlstate(&err) == Some("25006") => Ok(Tried::Writes),
            // A standby going away or in trouble: the primary answers.
            Err(err) if err.as_db_error().is_none() || sqlstate(&err) == Some("40001") => {
                tracing::warn!(node = %node, error = %err, "a standby failed the call: calling the primary");
                Ok(Tried::Primary)
            }
            Err(err) => Err(ApiError::from_db(&err)),
        }
    }
}

fn sqlstate(err: &tokio_postgres::Error) -> Option<&str> {
    err.code().map(|code| code.code())
}
