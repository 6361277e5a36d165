//! Running one call in the database: a pooled connection to the node the
//! placement picks, a prepared statement, retries of serialization failures
//! with jittered backoff, all within the request's deadline.
//!
//! Each call is a single statement in autocommit mode, a function of the
//! `lambdastore_gateway` schema that also checks the API key and, with an
//! Idempotency-Key, stores the response. The effects and the stored response
//! therefore commit together, on the server, whether or not the client (or
//! this gateway) is still there to read the answer.

use crate::config::Config;
use crate::error::ApiError;
use crate::placement::{self, Stale, Target};
use crate::AppState;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use rand::Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

/// What a call returned, how many times it was retried, and the node that
/// answered.
pub struct Outcome {
    pub row: Row,
    pub retries: u32,
    pub node: Arc<str>,
    /// Where the session's last commit ended, when asked for (`call_with`).
    pub commit_lsn: Option<String>,
}

pub type Param<'a> = &'a (dyn ToSql + Sync);

/// The routes whose statement is canceled when its request is dropped
/// unanswered (`Running`): those that change nothing.
const CANCELED_WHEN_ABANDONED: &[&str] = &["wait"];

/// SQLSTATEs after which running the same call again may succeed.
fn retryable(err: &tokio_postgres::Error) -> Option<&'static str> {
    match err.code()?.code() {
        "40001" => Some("40001"),
        "40P01" => Some("40P01"),
        _ => None,
    }
}

/// A pool of connections to the `--database-url` node, or to the node at
/// `node` (host, port) with the same user, password, database and options.
pub fn pool(config: &Config, node: Option<(&str, u16)>) -> anyhow::Result<Pool> {
    pool_of(config, &config.database_url, node)
}

/// `pool`, to the server at `url` (a `--replica`).
pub fn pool_of(config: &Config, url: &str, node: Option<(&str, u16)>) -> anyhow::Result<Pool> {
    let url: tokio_postgres::Config = url.parse()?;
    let mut pg = match node {
        None => url.clone(),
        Some((host, port)) => {
            let mut pg = tokio_postgres::Config::new();
            pg.host(host).port(port).ssl_mode(url.get_ssl_mode()).channel_binding(url.get_channel_binding());
            pg.keepalives(url.get_keepalives()).keepalives_idle(url.get_keepalives_idle());
            if let Some(user) = url.get_user() {
                pg.user(user);
            }
            if let Some(password) = url.get_password() {
                pg.password(password);
            }
            if let Some(dbname) = url.get_dbname() {
                pg.dbname(dbname);
            }
            if let Some(timeout) = url.get_connect_timeout() {
                pg.connect_timeout(*timeout);
            }
            pg
        }
    };
    // The server enforces the request deadline too: a statement still
    // running when the client has been told 504 is canceled there.
    let timeout_ms = config.request_timeout.as_millis();
    let options = format!("{} -c statement_timeout={timeout_ms}", url.get_options().unwrap_or(""));
    pg.options(options.trim()).application_name("lambdastore-gateway");
    let manager =
        Manager::from_config(pg, tokio_postgres::NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Ok(Pool::builder(manager)
        .max_size(config.pool_size)
        .wait_timeout(Some(config.request_timeout))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()?)
}

impl AppState {
    /// Runs `sql` (one row expected) on the node owning `object`.
    pub async fn call(
        &self,
        route: &'static str,
        object: Option<i64>,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Outcome, ApiError> {
        self.call_with(route, object, sql, params, false).await
    }

    /// `call`; with `note_lsn`, the outcome's `commit_lsn`: where the
    /// call's commit ended in the WAL, asked in the same round trip (two
    /// statements pipelined on the connection, each its own transaction),
    /// so that the client can read it back from a standby (`replicas.rs`).
    pub async fn call_with(
        &self,
        route: &'static str,
        object: Option<i64>,
        sql: &str,
        params: &[Param<'_>],
        note_lsn: bool,
    ) -> Result<Outcome, ApiError> {
        let deadline = Instant::now() + self.config.request_timeout;
        let attempts = self.attempts(route, object, sql, params, note_lsn, deadline);
        let (outcome, misrouted) = match tokio::time::timeout_at(deadline.into(), attempts).await {
            Ok(outcome) => outcome?,
            Err(_) => return Err(ApiError::timeout(self.config.request_timeout)),
        };
        if let Some(target) = misrouted {
            // The call ran: the node forwarded it to the owner. The map is
            // reloaded before the answer, so that the client's next call
            // goes to the owner; in a task of its own, so that a client
            // going away does not stop it halfway.
            let placement = self.placement.clone();
            let reload = tokio::spawn(async move { placement.refresh(&target, Stale::NotOwner).await });
            if let Err(err) = reload.await {
                tracing::warn!(error = %err, "reloading the shard map failed");
            }
        }
        Ok(outcome)
    }

    async fn attempts(
        &self,
        route: &'static str,
        object: Option<i64>,
        sql: &str,
        params: &[Param<'_>],
        note_lsn: bool,
        deadline: Instant,
    ) -> Result<(Outcome, Option<Target>), ApiError> {
        let mut retries = 0;
        let mut rerouted = false;
        loop {
            let target = self.placement.route(object);
            let client = match target.pool.get().await {
                Ok(client) => client,
                // Nothing was sent: a node the map named that refuses
                // connections may be gone from the cluster. Once per call.
                Err(PoolError::Backend(err)) if target.map.is_some() && !rerouted => {
                    tracing::warn!(node = %target.node, error = %err, "a node of the shard map is unreachable");
                    rerouted = true;
                    self.placement.refresh(&target, Stale::Unreachable).await;
                    continue;
                }
                Err(err) => {
                    tracing::warn!(node = %target.node, error = %err, "no database connection");
                    return Err(ApiError::unavailable("no database connection available; retry later"));
                }
            };
            // A node chosen by the map says whether it holds the object.
            let checked = object.filter(|_| target.map.is_some());
            let checked_sql;
            let (sql, params) = match &checked {
                Some(object) => {
                    checked_sql = placement::with_check(sql, params.len() + 1);
                    (checked_sql.as_str(), [params, &[object as Param]].concat())
                }
                None => (sql, params.to_vec()),
            };
            let running = Running { client: Some(client), cancel: CANCELED_WHEN_ABANDONED.contains(&route) };
            let client = running.client();
            let (result, commit_lsn) = match client.prepare_cached(sql).await {
                Ok(statement) if note_lsn => {
                    let (called, lsn) = tokio::join!(client.query_one(&statement, &params), commit_lsn(client));
                    (called, lsn)
                }
                Ok(statement) => (client.query_one(&statement, &params).await, None),
                Err(err) => (Err(err), None),
            };
            running.answered();
            metrics::counter!("lambdastore_gateway_calls_total", "node" => target.node.to_string()).increment(1);
            let err = match result {
                Ok(row) => {
                    let held = checked.is_none() || row.get::<_, Option<bool>>(row.len() - 1) == Some(true);
                    let misrouted = (!held).then(|| target.clone());
                    if !held {
                        tracing::debug!(node = %target.node, object = checked, "the node does not hold the object");
                    }
                    return Ok((Outcome { row, retries, node: target.node, commit_lsn }, misrouted));
                }
                Err(err) => err,
            };
            let Some(sqlstate) = retryable(&err).filter(|_| retries < self.config.max_retries) else {
                return Err(ApiError::from_db(&err));
            };
            let backoff = self.backoff(retries);
            if Instant::now() + backoff >= deadline {
                return Err(ApiError::from_db(&err));
            }
            retries += 1;
            metrics::counter!("lambdastore_gateway_retries_total", "route" => route, "sqlstate" => sqlstate)
                .increment(1);
            tracing::debug!(retries, sqlstate, ?backoff, "retrying");
            tokio::time::sleep(backoff).await;
        }
    }

    /// "Full jitter": uniform in [0, min(max, base · 2^retry)], so that
    /// clients that collided do not collide again in lockstep.
    fn backoff(&self, retry: u32) -> Duration {
        let cap = self.config.retry_base_backoff.saturating_mul(1 << retry.min(16)).min(self.config.retry_max_backoff);
        cap.mul_f64(rand::rng().random::<f64>())
    }
}

/// A pooled connection while a request's statements run on it, until they
/// answer. A request can be dropped before that: its client went away, or
/// its deadline passed. Given back to the pool then, the connection looked
/// idle while the server still ran the statement, so the next request
/// queued behind it there and the pool opened no other connection: a
/// client abandoning long waits held up every application's calls. Now:
/// - a wait (`cancel`: it changes nothing) is canceled on the server and
///   its connection closed, outside the pool;
/// - any other statement finishes, as a retry with its idempotency key
///   expects (docs/gateway.md), and its connection returns to the pool only
///   then, counted against `--pool-size` meanwhile.
struct Running {
    client: Option<deadpool_postgres::Object>,
    cancel: bool,
}

impl Running {
    fn client(&self) -> &deadpool_postgres::Object {
        self.client.as_ref().expect("a connection until it is given back")
    }

    /// The statements answered: the connection goes back to the pool.
    fn answered(mut self) {
        drop(self.client.take());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else { return };
        let ending = if self.cancel { "canceled" } else { "finished" };
        metrics::counter!("lambdastore_gateway_abandoned_statements_total", "ending" => ending).increment(1);
        // Outside a runtime (the gateway shutting down) the connection just
        // closes, and the server ends the statement when it notices.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if self.cancel {
            let cancel = client.cancel_token();
            let client = deadpool_postgres::Object::take(client);
            runtime.spawn(async move {
                if let Err(err) = cancel.cancel_query(tokio_postgres::NoTls).await {
                    tracing::warn!(error = %err, "canceling an abandoned statement failed");
                }
                drop(client);
            });
        } else {
            runtime.spawn(async move {
                // Answered after the abandoned statement: the connection is
                // idle once this returns.
                if let Err(err) = client.simple_query("").await {
                    tracing::warn!(error = %err, "a connection's abandoned statement failed");
                }
                drop(client);
            });
        }
    }
}

/// Where the session's last commit ended (NULL before its first that
/// wrote); None, logged, if the server cannot say.
async fn commit_lsn(client: &deadpool_postgres::Object) -> Option<String> {
    let asked = async {
        let statement = client.prepare_cached("SELECT lambdastore_gateway.last_commit_lsn()::text").await?;
        client.query_one(&statement, &[]).await?.try_get::<_, Option<String>>(0)
    };
    asked.await.unwrap_or_else(|err| {
        tracing::warn!(error = %err, "asking for the commit LSN failed");
        None
    })
}
