//! The versioned API. Each handler is one call of a `lambdastore_gateway`
//! SQL function (extension/sql/gateway.sql), which checks the API key itself.

use crate::db::Outcome;
use crate::error::ApiError;
use crate::extract::{ApiKey, Args, IdempotencyKey, MinLsn, Module, PathParams, QueryParams};
use crate::wait_slots::Refused;
use crate::AppState;
use axum::extract::State;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

pub const RETRIES: HeaderName = HeaderName::from_static("lambdastore-retries");
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
pub const NODE: HeaderName = HeaderName::from_static("x-lambdastore-node");
pub const COMMIT_LSN: HeaderName = HeaderName::from_static("lambdastore-commit-lsn");

type Shared = State<Arc<AppState>>;

/// The result of a method or static function.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct CallResult {
    /// What the function returned (any JSON value).
    #[schema(value_type = Value)]
    pub result: Value,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct CreatedObject {
    pub object_id: i64,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct SubmittedJob {
    pub job_id: i64,
}

/// A job's state and outcome.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub job_id: i64,
    /// `queued` until a worker committed its outcome (also after a wait timed out).
    #[schema(pattern = "^(queued|done|failed)$")]
    pub state: String,
    /// The function's result when `done`.
    #[schema(value_type = Value)]
    pub result: Value,
    /// The last error, when `failed` (or while retrying a conflict).
    pub error: Option<String>,
    pub sqlstate: Option<String>,
    pub attempts: i32,
    pub submitted_at: String,
    pub finished_at: Option<String>,
}

/// What a deploy registered.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Deployed {
    pub app: String,
    pub version: i32,
    pub module_id: i64,
    pub sha256: String,
    /// True when these bytes were already the current version.
    pub unchanged: bool,
    #[schema(value_type = Value)]
    pub sdk: Value,
    /// The object types, their fields and functions, as the module described them.
    #[schema(value_type = Value)]
    pub types: Value,
    /// Types of the version before that this one lacks and objects still
    /// are (`[{"type", "objects"}]`): those objects cannot be called until a
    /// version has their type again.
    #[schema(value_type = Value)]
    #[serde(default)]
    pub types_dropped: Value,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitParams {
    /// How long to wait, in milliseconds: at most the gateway's request
    /// timeout less one second, which is also the default if under 30000.
    #[param(minimum = 0)]
    pub timeout_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct Ready {
    pub status: String,
    /// The installed lambdastore extension's version.
    pub extension: String,
}

fn with_headers(status: StatusCode, body: impl Serialize, outcome: &Outcome, replayed: bool) -> Response {
    let mut response = (status, Json(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(RETRIES, HeaderValue::from(outcome.retries));
    if let Ok(node) = HeaderValue::try_from(&*outcome.node) {
        headers.insert(NODE, node);
    }
    if replayed {
        headers.insert(REPLAYED, HeaderValue::from_static("true"));
    }
    if let Some(lsn) = outcome.commit_lsn.as_deref().and_then(|lsn| HeaderValue::try_from(lsn).ok()) {
        headers.insert(COMMIT_LSN, lsn);
    }
    response
}

/// A row of `(result jsonb, replayed boolean)`.
fn replayable(outcome: &Outcome) -> (Value, bool) {
    (outcome.row.get(0), outcome.row.get(1))
}

fn from_db_json<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(|e| {
        tracing::error!(error = %e, "unexpected JSON from the database");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "internal error (logged by the gateway)")
    })
}

/// Invoke a method on an object.
///
/// Runs the method inside PostgreSQL, next to the object's data, as one
/// serializable workflow; nested calls are part of it. Serialization
/// failures are retried by the gateway (`lambdastore-retries` says how often).
#[utoipa::path(
    post, path = "/v1/objects/{object_id}/methods/{method}", tag = "calls",
    params(
        ("object_id" = i64, Path, description = "The object"),
        ("method" = String, Path, description = "A public method of the object's type"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry return the first attempt's response instead of running again (per application, kept for --idempotency-ttl)",
            min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
        ("lambdastore-min-lsn" = Option<String>, Header, description = "With --replica: a `lambdastore-commit-lsn` the answer must include (a standby answers once it has replayed that far, else the primary)",
            pattern = "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"),
    ),
    request_body(content = Option<Value>, content_type = "application/json", description = "The method's arguments (an object by parameter name, or an array); empty means {}"),
    responses((status = 200, description = "The method's result", body = CallResult,
        headers(("lambdastore-retries" = u32, description = "Serialization failures retried"),
                ("idempotent-replayed" = String, description = "`true` when the response is a stored one"),
                ("x-lambdastore-node" = String, description = "The database node the call was sent to: `host:port` in Citus' metadata, `local` on one server, `replica-<n>` for the n-th --replica"),
                ("lambdastore-commit-lsn" = String, description = "With --replica, on an answer of the primary: where the session's last write committed in the WAL, to send back as lambdastore-min-lsn")))),
    security(("api_key" = []))
)]
pub async fn invoke(
    State(state): Shared,
    ApiKey(key): ApiKey,
    IdempotencyKey(idempotency): IdempotencyKey,
    MinLsn(min_lsn): MinLsn,
    PathParams((object_id, method)): PathParams<(i64, String)>,
    Args(args): Args,
) -> Result<Response, ApiError> {
    let outcome = state
        .read_or_call(
            "invoke",
            Some(object_id),
            (&key, &method),
            idempotency.is_some(),
            min_lsn.as_deref(),
            "SELECT result, replayed FROM lambdastore_gateway.invoke($1, $2, $3, $4, $5)",
            &[&key, &object_id, &method, &args, &idempotency],
        )
        .await?;
    let (result, replayed) = replayable(&outcome);
    Ok(with_headers(StatusCode::OK, CallResult { result }, &outcome, replayed))
}

/// Invoke a static function of a type.
#[utoipa::path(
    post, path = "/v1/apps/{app}/types/{type_name}/functions/{function}", tag = "calls",
    params(
        ("app" = String, Path, description = "The application (the API key's)"),
        ("type_name" = String, Path),
        ("function" = String, Path, description = "A static function of the type"),
        ("Idempotency-Key" = Option<String>, Header, description = "As for methods",
            min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
        ("lambdastore-min-lsn" = Option<String>, Header, description = "As for methods", pattern = "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"),
    ),
    request_body(content = Option<Value>, content_type = "application/json", description = "The function's arguments; empty means {}"),
    responses((status = 200, description = "The function's result", body = CallResult,
        headers(("lambdastore-retries" = u32), ("idempotent-replayed" = String), ("x-lambdastore-node" = String),
                ("lambdastore-commit-lsn" = String)))),
    security(("api_key" = []))
)]
pub async fn invoke_static(
    State(state): Shared,
    ApiKey(key): ApiKey,
    IdempotencyKey(idempotency): IdempotencyKey,
    MinLsn(min_lsn): MinLsn,
    PathParams((app, type_name, function)): PathParams<(String, String, String)>,
    Args(args): Args,
) -> Result<Response, ApiError> {
    let outcome = state
        .read_or_call(
            "invoke_static",
            None,
            (&key, &format!("{type_name}.{function}")),
            idempotency.is_some(),
            min_lsn.as_deref(),
            "SELECT result, replayed FROM lambdastore_gateway.invoke_static($1, $2, $3, $4, $5, $6)",
            &[&key, &app, &type_name, &function, &args, &idempotency],
        )
        .await?;
    let (result, replayed) = replayable(&outcome);
    Ok(with_headers(StatusCode::OK, CallResult { result }, &outcome, replayed))
}

/// Create an object: runs its type's constructor.
#[utoipa::path(
    post, path = "/v1/apps/{app}/types/{type_name}/objects", tag = "objects",
    params(
        ("app" = String, Path, description = "The application (the API key's)"),
        ("type_name" = String, Path),
        ("Idempotency-Key" = Option<String>, Header, description = "A retry returns the object the first attempt created",
            min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
    ),
    request_body(content = Option<Value>, content_type = "application/json", description = "The constructor's arguments; empty means {}"),
    responses((status = 201, description = "Created", body = CreatedObject,
        headers(("location" = String, description = "/v1/objects/{object_id}"), ("lambdastore-retries" = u32), ("idempotent-replayed" = String),
                ("x-lambdastore-node" = String)))),
    security(("api_key" = []))
)]
pub async fn create_object(
    State(state): Shared,
    ApiKey(key): ApiKey,
    IdempotencyKey(idempotency): IdempotencyKey,
    PathParams((app, type_name)): PathParams<(String, String)>,
    Args(args): Args,
) -> Result<Response, ApiError> {
    let outcome = state
        .call(
            "create_object",
            None,
            "SELECT result, replayed FROM lambdastore_gateway.create_object($1, $2, $3, $4, $5)",
            &[&key, &app, &type_name, &args, &idempotency],
        )
        .await?;
    let (result, replayed) = replayable(&outcome);
    let object_id: i64 = from_db_json(result)?;
    let mut response = with_headers(StatusCode::CREATED, CreatedObject { object_id }, &outcome, replayed);
    response.headers_mut().insert(header::LOCATION, location("objects", object_id));
    Ok(response)
}

fn location(kind: &str, id: i64) -> HeaderValue {
    HeaderValue::try_from(format!("/v1/{kind}/{id}")).expect("an ASCII path")
}

/// Deploy a new version of the application's code.
///
/// The body is a WebAssembly component built with the guest SDK. The same
/// bytes again change nothing (`unchanged: true`).
#[utoipa::path(
    put, path = "/v1/apps/{app}/module", tag = "apps",
    params(("app" = String, Path, description = "The application (the API key's)")),
    request_body(content(("application/wasm"), ("application/octet-stream")), description = "The component's bytes"),
    responses((status = 200, description = "Deployed", body = Deployed)),
    security(("api_key" = []))
)]
pub async fn deploy(
    State(state): Shared,
    ApiKey(key): ApiKey,
    PathParams(app): PathParams<String>,
    Module(module): Module,
) -> Result<Json<Deployed>, ApiError> {
    let module: &[u8] = &module;
    let outcome =
        state.call("deploy", None, "SELECT lambdastore_gateway.deploy($1, $2, $3)", &[&key, &app, &module]).await?;
    Ok(Json(from_db_json(outcome.row.get(0))?))
}

/// Submit an asynchronous call: a background worker runs it exactly once.
#[utoipa::path(
    post, path = "/v1/objects/{object_id}/methods/{method}/jobs", tag = "jobs",
    params(
        ("object_id" = i64, Path),
        ("method" = String, Path),
        ("Idempotency-Key" = Option<String>, Header, description = "The same key returns the same job (per application); a different call with it is 409",
            min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
    ),
    request_body(content = Option<Value>, content_type = "application/json", description = "The method's arguments; empty means {}"),
    responses((status = 202, description = "Queued", body = SubmittedJob,
        headers(("location" = String, description = "/v1/jobs/{job_id}"), ("lambdastore-retries" = u32), ("x-lambdastore-node" = String)))),
    security(("api_key" = []))
)]
pub async fn submit(
    State(state): Shared,
    ApiKey(key): ApiKey,
    IdempotencyKey(idempotency): IdempotencyKey,
    PathParams((object_id, method)): PathParams<(i64, String)>,
    Args(args): Args,
) -> Result<Response, ApiError> {
    let outcome = state
        .call(
            "submit",
            Some(object_id),
            "SELECT lambdastore_gateway.submit($1, $2, $3, $4, $5)",
            &[&key, &object_id, &method, &args, &idempotency],
        )
        .await?;
    let job_id: i64 = outcome.row.get(0);
    let mut response = with_headers(StatusCode::ACCEPTED, SubmittedJob { job_id }, &outcome, false);
    response.headers_mut().insert(header::LOCATION, location("jobs", job_id));
    Ok(response)
}

/// A job's state and outcome.
#[utoipa::path(
    get, path = "/v1/jobs/{job_id}", tag = "jobs",
    params(("job_id" = i64, Path)),
    responses((status = 200, description = "The job", body = Job)),
    security(("api_key" = []))
)]
pub async fn job(
    State(state): Shared,
    ApiKey(key): ApiKey,
    PathParams(job_id): PathParams<i64>,
) -> Result<Json<Job>, ApiError> {
    let outcome = state.call("job", None, "SELECT lambdastore_gateway.job($1, $2)", &[&key, &job_id]).await?;
    Ok(Json(from_db_json(outcome.row.get(0))?))
}

/// Wait for a job to finish, up to `timeout_ms`, then return it.
///
/// After a timeout the job is returned with state `queued`.
#[utoipa::path(
    get, path = "/v1/jobs/{job_id}/wait", tag = "jobs",
    params(("job_id" = i64, Path), WaitParams),
    responses((status = 200, description = "The job, finished or (after the timeout) still queued", body = Job)),
    security(("api_key" = []))
)]
pub async fn wait(
    State(state): Shared,
    ApiKey(key): ApiKey,
    PathParams(job_id): PathParams<i64>,
    QueryParams(params): QueryParams<WaitParams>,
) -> Result<Json<Job>, ApiError> {
    let max = state.config.max_wait();
    let timeout = params.timeout_ms.map_or(max.min(Duration::from_secs(30)), Duration::from_millis);
    if timeout > max {
        return Err(ApiError::bad_request(format!("timeout_ms may be at most {} on this gateway", max.as_millis())));
    }
    let _slot = state.waits.acquire(&key).map_err(|refused| {
        ApiError::too_many_requests(match refused {
            Refused::Key { limit } => format!(
                "this API key has {limit} waits in flight already, the most this gateway allows; retry when one has finished"
            ),
            Refused::All { limit } => format!(
                "this gateway has {limit} waits in flight already, the most it allows for all keys together; retry when one has finished"
            ),
        })
    })?;
    let timeout_ms = timeout.as_millis() as i64;
    let outcome =
        state.call("wait", None, "SELECT lambdastore_gateway.wait($1, $2, $3)", &[&key, &job_id, &timeout_ms]).await?;
    Ok(Json(from_db_json(outcome.row.get(0))?))
}

/// Liveness: the process serves requests.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "Alive", body = String, content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: every database is reachable, has the extension, and lets the
/// gateway's role use it.
#[utoipa::path(get, path = "/readyz", tag = "operations", responses((status = 200, description = "Ready", body = Ready)))]
pub async fn readyz(State(state): Shared) -> Result<Json<Ready>, ApiError> {
    let mut extension = String::new();
    for (node, pool) in state.placement.pools() {
        let client = pool.get().await.map_err(|e| {
            tracing::warn!(%node, error = %e, "not ready: no database connection");
            ApiError::unavailable(format!("node {node}: the database is unreachable"))
        })?;
        // Ready where calls would work: the role may execute every function
        // of the gateway (a role that lost one answered 403 to every
        // client), and the database takes writes (a standby, or a primary
        // demoted by a failover, answered 500 to every write).
        let row = client
            .query_one(
                "SELECT lambdastore_gateway.ready(), pg_catalog.current_setting('transaction_read_only') = 'on',
                        NOT EXISTS (SELECT FROM pg_catalog.pg_proc p
                                     WHERE p.pronamespace = 'lambdastore_gateway'::pg_catalog.regnamespace
                                       AND NOT pg_catalog.has_function_privilege(p.oid, 'EXECUTE'))",
                &[],
            )
            .await
            .map_err(|e| {
                tracing::warn!(%node, error = %e, "not ready");
                ApiError::unavailable(format!(
                    "node {node}: the lambdastore extension is missing or this role may not use it"
                ))
            })?;
        extension = row
            .get::<_, Option<String>>(0)
            .ok_or_else(|| ApiError::unavailable(format!("node {node}: lambdastore is not installed")))?;
        if row.get::<_, bool>(1) {
            return Err(ApiError::unavailable(format!("node {node}: the database is read-only")));
        }
        if !row.get::<_, bool>(2) {
            return Err(ApiError::unavailable(format!(
                "node {node}: this role may not execute every function of lambdastore_gateway (docs/gateway.md, the role)"
            )));
        }
    }
    Ok(Json(Ready { status: "ready".into(), extension }))
}

/// Prometheus metrics: requests by route and status, latency histograms,
/// retries, pool usage.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): Shared) -> impl IntoResponse {
    let replicas = state.replicas.pools().iter().cloned();
    for (node, pool) in state.placement.pools().into_iter().chain(replicas) {
        let status = pool.status();
        let node = node.to_string();
        metrics::gauge!("lambdastore_gateway_pool_connections", "node" => node.clone(), "state" => "open")
            .set(status.size as f64);
        metrics::gauge!("lambdastore_gateway_pool_connections", "node" => node.clone(), "state" => "idle")
            .set(status.available as f64);
        metrics::gauge!("lambdastore_gateway_pool_connections_max", "node" => node.clone()).set(status.max_size as f64);
        metrics::gauge!("lambdastore_gateway_pool_waiting_requests", "node" => node).set(status.waiting as f64);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.prometheus.render())
}

/// The OpenAPI 3.1 description of this API.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, description = "OpenAPI 3.1 document", body = Object)))]
pub async fn openapi(State(state): Shared) -> impl IntoResponse {
    Json(crate::openapi::document(state.config.max_wait()))
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route; see /openapi.json")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that HTTP method; see /openapi.json",
    )
}
