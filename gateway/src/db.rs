//! Running one call in the database: a pooled connection, a prepared
//! statement, retries of serialization failures with jittered backoff, all
//! within the request's deadline.
//!
//! Each call is a single statement in autocommit mode, a function of the
//! `lambdastore_gateway` schema that also checks the API key and, with an
//! Idempotency-Key, stores the response. The effects and the stored response
//! therefore commit together, on the server, whether or not the client (or
//! this gateway) is still there to read the answer.

use crate::error::ApiError;
use crate::AppState;
use rand::Rng;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

/// What a call returned, and how many times it was retried.
pub struct Outcome {
    pub row: Row,
    pub retries: u32,
}

pub type Param<'a> = &'a (dyn ToSql + Sync);

/// SQLSTATEs after which running the same call again may succeed.
fn retryable(err: &tokio_postgres::Error) -> Option<&'static str> {
    match err.code()?.code() {
        "40001" => Some("40001"),
        "40P01" => Some("40P01"),
        _ => None,
    }
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
        let deadline = Instant::now() + self.config.request_timeout;
        match tokio::time::timeout_at(deadline.into(), self.attempts(route, object, sql, params, deadline)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(ApiError::timeout(self.config.request_timeout)),
        }
    }

    async fn attempts(
        &self,
        route: &'static str,
        object: Option<i64>,
        sql: &str,
        params: &[Param<'_>],
        deadline: Instant,
    ) -> Result<Outcome, ApiError> {
        let mut retries = 0;
        loop {
            let client = self.placement.route(object).get().await.map_err(|err| {
                tracing::warn!(error = %err, "no database connection");
                ApiError::unavailable("no database connection available; retry later")
            })?;
            let result = match client.prepare_cached(sql).await {
                Ok(statement) => client.query_one(&statement, params).await,
                Err(err) => Err(err),
            };
            drop(client);
            let err = match result {
                Ok(row) => return Ok(Outcome { row, retries }),
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
