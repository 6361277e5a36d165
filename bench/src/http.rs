//! The HTTP gateway under load, side by side with the same calls made
//! directly over SQL.
//!
//! Closed loop: each of `connections` workers sends one request, waits for
//! the whole response, and sends the next, on one persistent HTTP/1.1
//! connection (or one PostgreSQL connection with prepared statements).
//! Each row runs `warmup` unmeasured, then `duration` measured; a request
//! counts if it started and finished in the measured window. Workloads:
//! `get` and `increment` with one counter per connection (so that conflicts
//! do not dominate), and `increment` on one shared counter, where the
//! gateway retries serialization failures (the `lambdastore-retries`
//! header) and the SQL clients retry them with the gateway's own policy.

use crate::histogram;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls, Statement};

pub struct Options {
    pub gateway: String,
    pub key: String,
    pub connections: usize,
    pub duration: Duration,
    pub warmup: Duration,
}

/// The application the API key must belong to.
const APP: &str = "counter";

/// The gateway's defaults (gateway/src/config.rs), used by the SQL clients
/// too so that the shared-counter rows compare like with like.
const MAX_RETRIES: u32 = 10;
const BASE_BACKOFF: Duration = Duration::from_millis(2);
const MAX_BACKOFF: Duration = Duration::from_millis(200);

pub fn run(url: &str, lambdas: &Path, options: &Options) -> Result<()> {
    if options.connections == 0 || options.duration.is_zero() {
        bail!("--connections and --duration must be positive");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run_async(url, lambdas, options))
}

async fn run_async(url: &str, lambdas: &Path, options: &Options) -> Result<()> {
    let n = options.connections;
    let counter = std::fs::read(lambdas.join("counter.wasm")).context("read counter.wasm (run make lambdas)")?;
    let admin = connect(url).await?;
    admin.batch_execute("CREATE EXTENSION IF NOT EXISTS lambdastore").await?;
    // The same bytes again change nothing.
    admin.execute("SELECT lambdastore.deploy($1, $2)", &[&APP, &counter]).await?;
    // One counter per connection, then a shared one for each path.
    let ids: Vec<i64> = admin
        .query(
            "SELECT lambdastore.create_object($1, 'Counter', '{}') FROM generate_series(1, $2::bigint)",
            &[&APP, &(n as i64 + 2)],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (own, shared_http, shared_sql) = (ids[..n].to_vec(), ids[n], ids[n + 1]);

    let base = options.gateway.trim_end_matches('/').to_string();
    let http: Vec<reqwest::Client> = (0..n).map(|_| http_client()).collect::<Result<_>>()?;
    let ready = http[0].get(format!("{base}/readyz")).send().await.with_context(|| format!("GET {base}/readyz"))?;
    if !ready.status().is_success() {
        bail!("{base}/readyz: {} {}", ready.status(), ready.text().await.unwrap_or_default());
    }
    let auth = format!("Bearer {}", options.key);
    http_call(&http[0], &format!("{base}/v1/objects/{}/methods/get", own[0]), &auth).await.map_err(|e| {
        anyhow::anyhow!(
            "a first call through the gateway failed: {e}\n(--key must be an API key of the application {APP:?}: \
                 SELECT api_key FROM lambdastore.create_api_key('{APP}'))"
        )
    })?;
    let mut sql = Vec::with_capacity(n);
    for _ in 0..n {
        let client = connect(url).await?;
        let get = client.prepare("SELECT lambda_invoke($1, 'get', '{}')").await?;
        let increment = client.prepare("SELECT lambda_invoke($1, 'increment', '{}')").await?;
        sql.push(Arc::new(SqlConnection { client, get, increment }));
    }

    println!(
        "HTTP gateway {base} against direct SQL (lambda_invoke, prepared), {n} connections each, closed loop, \
         {} warm-up + {} measured per row",
        humantime::format_duration(options.warmup),
        humantime::format_duration(options.duration)
    );
    let workloads: [(&str, &'static str, Vec<i64>, Vec<i64>); 3] = [
        ("get", "get", own.clone(), own.clone()),
        ("increment", "increment", own.clone(), own.clone()),
        ("increment, one shared counter", "increment", vec![shared_http; n], vec![shared_sql; n]),
    ];
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (label, method, http_objects, sql_objects) in &workloads {
        let method: &'static str = method;
        for via in [Via::Http, Via::Sql] {
            let objects = if via == Via::Http { http_objects } else { sql_objects };
            let before = committed(&admin, method, objects).await?;
            let tally = match via {
                Via::Http => {
                    let calls = http.iter().zip(objects).map(|(client, id)| {
                        (client.clone(), format!("{base}/v1/objects/{id}/methods/{method}"), auth.clone())
                    });
                    drive(options, calls, |(client, url, auth)| async move { http_call(&client, &url, &auth).await })
                        .await?
                }
                Via::Sql => {
                    let calls = sql.iter().zip(objects).map(|(conn, id)| (conn.clone(), *id));
                    drive(options, calls, move |(conn, id)| async move {
                        let statement = if method == "get" { &conn.get } else { &conn.increment };
                        sql_call(&conn.client, statement, id).await
                    })
                    .await?
                }
            };
            // Every successful increment (warm-up included) must be in the database.
            let after = committed(&admin, method, objects).await?;
            if method == "increment" && after - before != tally.succeeded as i64 {
                failures.push(format!(
                    "{label}, {via}: the counters advanced by {} but {} increments succeeded",
                    after - before,
                    tally.succeeded
                ));
            }
            if let Some(error) = &tally.first_error {
                eprintln!("{label}, {via}: {} errors in the measured window; first error: {error}", tally.errors);
            }
            rows.push((format!("{label}, {via}"), tally));
        }
    }

    println!();
    println!("| what | connections | requests/s | p50 | p99 | errors | retries |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (what, t) in &rows {
        println!(
            "| {what} | {n} | {:.0} | {} | {} | {} | {} |",
            t.ok as f64 / options.duration.as_secs_f64(),
            ms(&t.latency, 0.5),
            ms(&t.latency, 0.99),
            t.errors,
            t.retries
        );
    }
    println!();
    println!(
        "requests/s and latency count successful requests in the measured window (latency: client-side, request sent to \
         response read, retries included); retries: serialization failures retried, by the gateway (lambdastore-retries \
         header) or by the SQL client with the gateway's policy ({MAX_RETRIES} retries, full-jitter backoff {}..{})",
        humantime::format_duration(BASE_BACKOFF),
        humantime::format_duration(MAX_BACKOFF)
    );
    if !failures.is_empty() {
        bail!("lost or extra increments:\n  {}", failures.join("\n  "));
    }
    println!("checked: every successful increment, and nothing else, is in the database");
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Via {
    Http,
    Sql,
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Via::Http => "HTTP gateway",
            Via::Sql => "direct SQL",
        })
    }
}

struct SqlConnection {
    client: Client,
    get: Statement,
    increment: Statement,
}

async fn connect(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.context("connect to --url")?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("database connection: {e}");
        }
    });
    Ok(client)
}

/// The sum of the counters (distinct objects), to check increments against.
async fn committed(admin: &Client, method: &str, objects: &[i64]) -> Result<i64> {
    if method != "increment" {
        return Ok(0);
    }
    let row = admin
        .query_one(
            "SELECT coalesce(sum(lambda_invoke(id, 'get')::bigint), 0)::bigint FROM (SELECT DISTINCT unnest($1::bigint[]) AS id) o",
            &[&objects],
        )
        .await?;
    Ok(row.get(0))
}

/// One persistent HTTP/1.1 connection: a worker sends one request at a
/// time, so its client's pool holds exactly one keep-alive connection.
fn http_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(60))
        .build()?)
}

/// One call through the gateway; Ok(the gateway's retries).
async fn http_call(client: &reqwest::Client, url: &str, auth: &str) -> Result<u64, String> {
    let response = client
        .post(url)
        .header(reqwest::header::AUTHORIZATION, auth)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body("{}")
        .send()
        .await
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
    let status = response.status();
    let retries = response
        .headers()
        .get("lambdastore-retries")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Read the whole body: the connection is reused only once it is.
    let body = response.bytes().await.map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    Ok(retries)
}

/// One call over SQL, retrying serialization failures and deadlocks as the
/// gateway does; Ok(retries).
async fn sql_call(client: &Client, statement: &Statement, object: i64) -> Result<u64, String> {
    static CALLS: AtomicU64 = AtomicU64::new(1);
    let mut rng = CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut retries = 0;
    loop {
        match client.query_one(statement, &[&object]).await {
            Ok(_) => return Ok(retries as u64),
            Err(e) if matches!(e.code().map(|c| c.code()), Some("40001" | "40P01")) && retries < MAX_RETRIES => {
                let cap = BASE_BACKOFF.saturating_mul(1 << retries.min(16)).min(MAX_BACKOFF);
                let uniform = (crate::contention::next(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
                retries += 1;
                tokio::time::sleep(cap.mul_f64(uniform)).await;
            }
            Err(e) => {
                return Err(match e.as_db_error() {
                    Some(db) => format!("{}: {}", db.code().code(), db.message()),
                    None => format!("{:#}", anyhow::Error::from(e)),
                })
            }
        }
    }
}

/// What one row measured, summed over its workers.
struct Tally {
    latency: Histogram<u64>,
    /// Successful requests in the measured window.
    ok: u64,
    errors: u64,
    retries: u64,
    /// Successful requests from the start, warm-up included.
    succeeded: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Self {
        Tally { latency: histogram(), ok: 0, errors: 0, retries: 0, succeeded: 0, first_error: None }
    }

    fn merge(&mut self, other: Tally) -> Result<()> {
        self.latency.add(&other.latency)?;
        self.ok += other.ok;
        self.errors += other.errors;
        self.retries += other.retries;
        self.succeeded += other.succeeded;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        Ok(())
    }
}

/// Runs one closed-loop worker per element of `workers` for warm-up plus
/// duration, `call` being one request (Ok: retries it took).
async fn drive<W, F, Fut>(options: &Options, workers: impl Iterator<Item = W>, call: F) -> Result<Tally>
where
    W: Clone + Send + 'static,
    F: Fn(W) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let start = Instant::now();
    let (measure_from, until) = (start + options.warmup, start + options.warmup + options.duration);
    let tasks: Vec<_> = workers
        .map(|worker| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut tally = Tally::new();
                while Instant::now() < until {
                    let started = Instant::now();
                    let outcome = call(worker.clone()).await;
                    let done = Instant::now();
                    let measured = started >= measure_from && done <= until;
                    match outcome {
                        Ok(retries) => {
                            tally.succeeded += 1;
                            if measured {
                                tally.ok += 1;
                                tally.retries += retries;
                                tally.latency.saturating_record((done - started).as_micros().max(1) as u64);
                            }
                        }
                        Err(error) => {
                            if measured {
                                tally.errors += 1;
                            }
                            if tally.first_error.is_none() {
                                tally.first_error = Some(error);
                            }
                            // Do not spin on a refused connection or a dead server.
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::new();
    for task in tasks {
        total.merge(task.await?)?;
    }
    Ok(total)
}

fn ms(h: &Histogram<u64>, q: f64) -> String {
    if h.is_empty() {
        return "-".into();
    }
    format!("{:.2} ms", h.value_at_quantile(q) as f64 / 1000.0)
}
