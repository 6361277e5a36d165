//! The LambdaStore HTTP gateway: a stateless axum service that turns HTTP
//! requests into calls of the `lambdastore_gateway` SQL functions, over a
//! pool of connections per database node. See docs/gateway.md for the
//! API and docs/ARCHITECTURE.md for the design.

mod config;
mod db;
mod error;
mod extract;
mod openapi;
mod placement;
mod replicas;
mod routes;
mod server;
mod wait_slots;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post, put};
use axum::Router;
use clap::Parser;
use config::Config;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use placement::Placement;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use wait_slots::WaitSlots;

pub struct AppState {
    pub config: Config,
    pub placement: Arc<dyn Placement>,
    pub prometheus: PrometheusHandle,
    /// The waits in flight, per API key and in all.
    pub waits: WaitSlots,
    /// Hot standbys for calls that only read (`--replica`).
    pub replicas: replicas::Replicas,
}

fn router(state: Arc<AppState>) -> Router {
    // Bodies are read, within their limits, by the extractors (extract.rs).
    let api = Router::new()
        .route("/v1/apps/{app}/module", put(routes::deploy))
        .route("/v1/apps/{app}/types/{type_name}/objects", post(routes::create_object))
        .route("/v1/apps/{app}/types/{type_name}/functions/{function}", post(routes::invoke_static))
        .route("/v1/objects/{object_id}/methods/{method}", post(routes::invoke))
        .route("/v1/objects/{object_id}/methods/{method}/jobs", post(routes::submit))
        .route("/v1/jobs/{job_id}", get(routes::job))
        .route("/v1/jobs/{job_id}/wait", get(routes::wait))
        .route("/healthz", get(routes::healthz))
        .route("/readyz", get(routes::readyz))
        .route("/metrics", get(routes::metrics))
        .route("/openapi.json", get(routes::openapi))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(middleware::from_fn(track))
        .with_state(state);
    let request_id = axum::http::HeaderName::from_static("x-request-id");
    api.layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(TraceLayer::new_for_http().make_span_with(|request: &Request| {
            let id = request.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("");
            tracing::info_span!("request", method = %request.method(), uri = %request.uri(), id)
        }))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .layer(middleware::map_request(drop_unusable_request_id))
}

/// A client's own `x-request-id` is kept (logged with the request and
/// echoed) when it is one value of 1-128 visible ASCII characters; any
/// other is replaced by a new one, so that a client cannot write what it
/// likes into the gateway's log lines.
async fn drop_unusable_request_id(mut request: Request) -> Request {
    let ids = request.headers().get_all("x-request-id");
    let usable = |id: &HeaderValue| (1..=128).contains(&id.len()) && id.as_bytes().iter().all(u8::is_ascii_graphic);
    if ids.iter().count() > 1 || !ids.iter().all(usable) {
        request.headers_mut().remove("x-request-id");
    }
    request
}

/// Counts requests by route template and status, times them, and tracks
/// how many are in flight (graceful shutdown drains them).
async fn track(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched".to_string(), |p| p.as_str().to_string());
    let method = method_label(request.method()).to_string();
    let started = Instant::now();
    let in_flight = InFlight::start();
    let response = next.run(request).await;
    drop(in_flight);
    let status = response.status().as_u16().to_string();
    metrics::counter!("lambdastore_gateway_requests_total", "route" => route.clone(), "method" => method.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("lambdastore_gateway_request_duration_seconds", "route" => route, "method" => method)
        .record(started.elapsed().as_secs_f64());
    response
}

/// A request's method as a metric label: the standard ones, else "other".
/// hyper takes any token as a method, and each new label is a series kept
/// for good: 50 requests with 60 KB methods made `/metrics` 59 MB.
fn method_label(method: &axum::http::Method) -> &str {
    use axum::http::Method;
    let standard =
        [Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::DELETE, Method::PATCH, Method::OPTIONS];
    if standard.contains(method) {
        method.as_str()
    } else {
        "other"
    }
}

/// One request in `lambdastore_gateway_requests_in_flight`, until it ends
/// however it ends: a request whose client went away is dropped unanswered.
struct InFlight(metrics::Gauge);

impl InFlight {
    fn start() -> InFlight {
        let gauge = metrics::gauge!("lambdastore_gateway_requests_in_flight");
        gauge.increment(1);
        InFlight(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1);
    }
}

fn prometheus() -> anyhow::Result<PrometheusHandle> {
    const BUCKETS: &[f64] = &[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full("lambdastore_gateway_request_duration_seconds".into()), BUCKETS)?
        .install_recorder()?)
}

/// Forgets stored Idempotency-Key responses older than the TTL, every
/// tenth of it (at most hourly). One statement on the entry node: on a
/// Citus cluster it reaches every shard of the keys' table.
async fn purge_idempotency_keys(state: Arc<AppState>) {
    let ttl = state.config.idempotency_ttl;
    let every = (ttl / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600));
    let older_than = format!("{} seconds", ttl.as_secs());
    loop {
        tokio::time::sleep(every).await;
        let target = state.placement.route(None);
        let purged = async {
            let client = target.pool.get().await?;
            let row = client
                .query_one("SELECT lambdastore_gateway.purge_idempotency_keys($1::text::interval)", &[&older_than])
                .await?;
            anyhow::Ok(row.get::<_, i64>(0))
        };
        match purged.await {
            Ok(n) => tracing::debug!(node = %target.node, n, "purged idempotency keys"),
            Err(e) => tracing::warn!(node = %target.node, error = %e, "purging idempotency keys failed"),
        }
    }
}

async fn shutdown_signal(notify: Arc<Notify>) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutting down: no new connections, draining in-flight requests");
    notify.notify_waiters();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if config.log_json {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let placement = placement::choose(&config, db::pool(&config, None)?).await?;
    let waits = WaitSlots::new(config.max_waits_per_key(), config.max_waits());
    let replicas = replicas::Replicas::new(&config)?;
    if replicas.any() && placement.distributed() {
        anyhow::bail!("--replica names standbys of a single server, and --database-url is a Citus cluster");
    }
    let state = Arc::new(AppState { config: config.clone(), placement, prometheus: prometheus()?, waits, replicas });
    tokio::spawn(purge_idempotency_keys(state.clone()));

    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    tracing::info!(listen = %listener.local_addr()?, pool_size = config.pool_size, "lambdastore gateway listening");
    let stopping = Arc::new(Notify::new());
    let stopped = stopping.notified();
    let server = server::serve(listener, router(state), config.read_timeout, shutdown_signal(stopping.clone()));
    tokio::select! {
        () = server => {},
        _ = async { stopped.await; tokio::time::sleep(config.shutdown_timeout).await } => {
            tracing::warn!(timeout = ?config.shutdown_timeout, "requests still in flight after the shutdown timeout; exiting");
        }
    }
    tracing::info!("stopped");
    Ok(())
}
