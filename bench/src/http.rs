//! The HTTP gateway under load, side by side with the same calls made
//! directly over SQL.
//!
//! Closed loop: each of `connections` workers sends one request, waits for
//! the whole response, and sends the next, on one persistent HTTP/1.1
//! connection (or one PostgreSQL connection with prepared statements).
//! Each row runs `warmup` unmeasured, then `duration` measured; a request
//! counts if it started and finished in the measured window. Workloads:
//!
//! - `counter`: `get` and `increment` with one counter per connection (so
//!   that conflicts do not dominate), and `increment` on one shared counter;
//! - `cloudforum`: bench/pgbench/cloudforum-lambdastore.sql's mix, 90%
//!   `get_thread` of a random thread, 10% `add_comment` by a random account
//!   on a random thread (1,000 threads by 200 accounts in 10 communities);
//! - `retwis`: bench/pgbench/retwis-lambdastore.sql's mix, 90%
//!   `get_timeline` (50 newest), 10% `create_post`, delivered to the user's
//!   20 followers (1,000 users, one post each to start with).
//!
//! The gateway retries serialization failures (the `lambdastore-retries`
//! header) and the SQL clients retry them with the gateway's own policy.
//! The two paths of a CloudForum or Retwis row use data sets of their own,
//! made alike, so that the second does not read what the first wrote.

use crate::contention::next;
use crate::cpu;
use crate::histogram;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls, Statement};

pub struct Options {
    pub gateway: String,
    pub workloads: Vec<Workload>,
    pub connections: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// The process trees whose CPU time per request each row reports, the
    /// bench itself first (cpu.rs).
    pub cpu: Vec<cpu::Watched>,
}

/// The applications the gateway is loaded with, each with its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// `counter`: get, increment, increment of one shared counter.
    Counter,
    /// `forum`: 90% Thread.get_thread, 10% Account.add_comment.
    #[value(alias = "forum")]
    Cloudforum,
    /// `retwis`: 90% User.get_timeline, 10% User.create_post.
    Retwis,
}

impl Workload {
    /// The application deployed from `<lambdas>/<app>.wasm`.
    fn app(self) -> &'static str {
        match self {
            Workload::Counter => "counter",
            Workload::Cloudforum => "forum",
            Workload::Retwis => "retwis",
        }
    }
}

/// The gateway's defaults (gateway/src/config.rs), used by the SQL clients
/// too so that the rows with conflicts compare like with like.
const MAX_RETRIES: u32 = 10;
const BASE_BACKOFF: Duration = Duration::from_millis(2);
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// The label of the API keys the run makes (and revokes at its end).
const KEY_LABEL: &str = "lambdastore-bench http";

/// The data of bench-citus.sh's pgbench rows, so that the gateway's rows
/// compare with them.
const COMMUNITIES: i32 = 10;
const ACCOUNTS: i32 = 200;
const THREADS: i32 = 1000;
const USERS: usize = 1000;
const FOLLOWERS: usize = 20;
/// The pgbench scripts' texts.
const COMMENT: &str = "A comment posted by pgbench, about sixty bytes.";
const POST: &str =
    "Just setting up my retwis: a benchmark post of about the length of a typical tweet, the same text every time.";

pub fn run(url: &str, lambdas: &Path, options: &Options) -> Result<()> {
    if options.connections == 0 || options.duration.is_zero() {
        bail!("--connections and --duration must be positive");
    }
    if options.workloads.is_empty() {
        bail!("--workloads must name at least one workload");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run_async(url, lambdas, options))
}

async fn run_async(url: &str, lambdas: &Path, options: &Options) -> Result<()> {
    let admin = connect(url).await?;
    admin.batch_execute("CREATE EXTENSION IF NOT EXISTS lambdastore").await?;
    let base = options.gateway.trim_end_matches('/').to_string();
    let ready =
        http_client()?.get(format!("{base}/readyz")).send().await.with_context(|| format!("GET {base}/readyz"))?;
    if !ready.status().is_success() {
        bail!("{base}/readyz: {} {}", ready.status(), ready.text().await.unwrap_or_default());
    }
    // A key per application, made here: the gateway takes a key of the
    // called object's application only.
    let mut keys = Vec::new();
    let outcome = measure(url, &admin, lambdas, options, &base, &mut keys).await;
    for key in keys {
        admin.execute("SELECT lambdastore.revoke_api_key($1)", &[&key]).await?;
    }
    outcome
}

async fn measure(
    url: &str,
    admin: &Client,
    lambdas: &Path,
    options: &Options,
    base: &str,
    keys: &mut Vec<i64>,
) -> Result<()> {
    let n = options.connections;
    let http: Vec<reqwest::Client> = (0..n).map(|_| http_client()).collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for &workload in &options.workloads {
        let app = workload.app();
        let file = lambdas.join(format!("{app}.wasm"));
        let wasm = std::fs::read(&file).with_context(|| format!("read {} (run make lambdas)", file.display()))?;
        // The same bytes again change nothing.
        admin.execute("SELECT lambdastore.deploy($1, $2)", &[&app, &wasm]).await?;
        let key = admin
            .query_one("SELECT key_id, api_key FROM lambdastore.create_api_key($1, $2)", &[&app, &KEY_LABEL])
            .await?;
        keys.push(key.get(0));
        let auth: Arc<str> = format!("Bearer {}", key.get::<_, String>(1)).into();
        let started = std::time::Instant::now();
        let setup = match workload {
            Workload::Counter => counter(admin, n).await?,
            Workload::Cloudforum => cloudforum(admin).await?,
            Workload::Retwis => retwis(admin).await?,
        };
        println!("{app}: objects created in {:.1} s", started.elapsed().as_secs_f64());
        let first = &setup.first;
        http_call(&http[0], &first.url(base), &auth, first.body()).await.map_err(|e| {
            anyhow::anyhow!(
                "a first call through the gateway failed: {e}\n(the gateway must serve the database of --url)"
            )
        })?;
        rows.extend(setup.rows.into_iter().map(|row| (row, auth.clone())));
    }
    let mut sql = Vec::with_capacity(n);
    for _ in 0..n {
        let client = connect(url).await?;
        let invoke = client.prepare("SELECT lambda_invoke($1, $2, $3)").await?;
        sql.push(Arc::new(SqlConnection { client, invoke }));
    }

    println!(
        "HTTP gateway {base} against direct SQL (lambda_invoke, prepared), {n} connections each, closed loop, \
         {} warm-up + {} measured per row",
        humantime::format_duration(options.warmup),
        humantime::format_duration(options.duration)
    );
    let mut table = Vec::new();
    let mut failures = Vec::new();
    let mut checked = Vec::new();
    for (row, auth) in &rows {
        if let Some(method) = row.counted {
            if !checked.contains(&method) {
                checked.push(method);
            }
        }
        for via in [Via::Http, Via::Sql] {
            let side = if via == Via::Http { &row.http } else { &row.sql };
            let before = side.measure_checks(admin).await?;
            let (mix, counted) = (side.mix.clone(), row.counted);
            let tally = match via {
                Via::Http => {
                    let (base, auth) = (Arc::<str>::from(base), auth.clone());
                    drive(options, http.iter().cloned(), move |client, worker, draw| {
                        let (call, base, auth) = (mix(worker, draw), base.clone(), auth.clone());
                        async move {
                            let retries = http_call(&client, &call.url(&base), &auth, call.body()).await?;
                            Ok(Done { retries, counted: Some(call.method) == counted })
                        }
                    })
                    .await?
                }
                Via::Sql => {
                    drive(options, sql.iter().cloned(), move |conn, worker, draw| {
                        let call = mix(worker, draw);
                        async move {
                            let retries = sql_call(&conn, &call).await?;
                            Ok(Done { retries, counted: Some(call.method) == counted })
                        }
                    })
                    .await?
                }
            };
            // Every successful counted call (warm-up included), and nothing
            // else, must be in the database.
            let after = side.measure_checks(admin).await?;
            for ((check, before), after) in side.checks.iter().zip(before).zip(after) {
                let expected = check.per_call * tally.counted as i64;
                if after - before != expected {
                    failures.push(format!(
                        "{}, {via}: {} grew by {} where {} successful {} calls make {expected}",
                        row.label,
                        check.what,
                        after - before,
                        tally.counted,
                        row.counted.unwrap_or_default()
                    ));
                }
            }
            if let Some(error) = &tally.first_error {
                eprintln!(
                    "{}, {via}: {} errors in the measured window; the run's first error, warm-up included: {error}",
                    row.label, tally.errors
                );
            }
            table.push((format!("{}, {via}", row.label), tally));
        }
    }

    println!();
    println!("| what | connections | requests/s | p50 | p99 | errors | retries | CPU µs per request |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for (what, t) in &table {
        println!(
            "| {what} | {n} | {:.0} | {} | {} | {} | {} | {} |",
            t.ok as f64 / options.duration.as_secs_f64(),
            ms(&t.latency, 0.5),
            ms(&t.latency, 0.99),
            t.errors,
            t.retries,
            t.cpu
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
        bail!("lost or extra writes:\n  {}", failures.join("\n  "));
    }
    if !checked.is_empty() {
        println!("checked: every successful {}, and nothing else, is in the database", checked.join(", "));
    }
    Ok(())
}

/// One lambda call: the object, the method, its JSON arguments.
struct Call {
    object: i64,
    method: &'static str,
    args: Value,
}

impl Call {
    fn new(object: i64, method: &'static str, args: Value) -> Self {
        Call { object, method, args }
    }

    fn url(&self, base: &str) -> String {
        format!("{base}/v1/objects/{}/methods/{}", self.object, self.method)
    }

    fn body(&self) -> String {
        self.args.to_string()
    }
}

/// What a row's workers call: a function of the worker (0..connections)
/// and a random number, of which each worker draws its own sequence.
type Mix = Arc<dyn Fn(usize, u64) -> Call + Send + Sync>;

/// A row of the table: one mix of calls through the gateway, then over SQL.
struct Row {
    label: &'static str,
    /// The method whose successful calls the checks count, if any.
    counted: Option<&'static str>,
    http: Side,
    sql: Side,
}

/// The calls of one path of a row, and what they must leave in the database.
struct Side {
    mix: Mix,
    checks: Vec<Check>,
}

impl Side {
    /// The same calls and checks for both paths.
    fn both(mix: Mix, checks: Vec<Check>) -> (Side, Side) {
        (Side { mix: mix.clone(), checks: checks.clone() }, Side { mix, checks })
    }

    async fn measure_checks(&self, admin: &Client) -> Result<Vec<i64>> {
        let mut values = Vec::with_capacity(self.checks.len());
        for check in &self.checks {
            values.push(admin.query_one(check.query, &[&*check.objects]).await?.get(0));
        }
        Ok(values)
    }
}

/// A number in the database that each successful counted call grows by
/// `per_call`, and nothing else changes.
#[derive(Clone)]
struct Check {
    /// What is counted, for the report.
    what: &'static str,
    /// Counts it among `objects` ($1), as a bigint.
    query: &'static str,
    objects: Arc<Vec<i64>>,
    per_call: i64,
}

impl Check {
    /// The sum of counters (distinct objects).
    fn counters(objects: Vec<i64>) -> Check {
        Check {
            what: "the counters",
            query: "SELECT coalesce(sum(lambda_invoke(id, 'get')::bigint), 0)::bigint \
                    FROM (SELECT DISTINCT unnest($1::bigint[]) AS id) o",
            objects: Arc::new(objects),
            per_call: 1,
        }
    }

    /// Rows of one field of the objects, as stored (the layouts of
    /// bench/sql/plpgsql/forum.sql and retwis.sql): one per comment, post,
    /// or post in a timeline. One query, not a call per object: on a
    /// cluster, calls from the coordinator are forwarded one by one.
    fn entries(what: &'static str, query: &'static str, objects: &Arc<Vec<i64>>, per_call: i64) -> Check {
        Check { what, query, objects: objects.clone(), per_call }
    }
}

/// An application's rows, and a call that reads, tried through the gateway
/// before any row runs.
struct Setup {
    rows: Vec<Row>,
    first: Call,
}

/// One counter per connection, then a shared one for each path.
async fn counter(admin: &Client, n: usize) -> Result<Setup> {
    let ids: Vec<i64> = admin
        .query(
            "SELECT lambdastore.create_object('counter', 'Counter', '{}') FROM generate_series(1, $1::bigint)",
            &[&(n as i64 + 2)],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let own = Arc::new(ids[..n].to_vec());
    let each = |method: &'static str| -> Mix {
        let own = own.clone();
        Arc::new(move |worker, _| Call::new(own[worker], method, json!({})))
    };
    let one = |id: i64| -> Mix { Arc::new(move |_, _| Call::new(id, "increment", json!({}))) };
    let (get_http, get_sql) = Side::both(each("get"), vec![]);
    let (own_http, own_sql) = Side::both(each("increment"), vec![Check::counters(own.to_vec())]);
    let (shared_http, shared_sql) = (ids[n], ids[n + 1]);
    Ok(Setup {
        rows: vec![
            Row { label: "get", counted: None, http: get_http, sql: get_sql },
            Row { label: "increment", counted: Some("increment"), http: own_http, sql: own_sql },
            Row {
                label: "increment, one shared counter",
                counted: Some("increment"),
                http: Side { mix: one(shared_http), checks: vec![Check::counters(vec![shared_http])] },
                sql: Side { mix: one(shared_sql), checks: vec![Check::counters(vec![shared_sql])] },
            },
        ],
        first: Call::new(own[0], "get", json!({})),
    })
}

/// CloudForum: two forums alike, one per path.
async fn cloudforum(admin: &Client) -> Result<Setup> {
    let side = |threads: Arc<Vec<i64>>, accounts: Vec<i64>| -> Side {
        let checks = vec![Check::entries(
            "the comments",
            "SELECT count(*) FROM lambdastore.entries WHERE object_id = ANY($1) AND field = 'comments'",
            &threads,
            1,
        )];
        // cloudforum-lambdastore.sql: a thread, then 90% read it, 10% an
        // account comments on it.
        let mix: Mix = Arc::new(move |_, draw| {
            let mut rng = draw;
            let thread = pick(&mut rng, &threads);
            if next(&mut rng) % 100 < 90 {
                Call::new(thread, "get_thread", json!({}))
            } else {
                Call::new(pick(&mut rng, &accounts), "add_comment", json!({"thread": thread, "text": COMMENT}))
            }
        });
        Side { mix, checks }
    };
    let (http_threads, http_accounts) = forum(admin).await?;
    let (sql_threads, sql_accounts) = forum(admin).await?;
    let first = Call::new(http_threads[0], "get_thread", json!({}));
    Ok(Setup {
        rows: vec![Row {
            label: "CloudForum: 90% get_thread, 10% add_comment",
            counted: Some("add_comment"),
            http: side(Arc::new(http_threads), http_accounts),
            sql: side(Arc::new(sql_threads), sql_accounts),
        }],
        first,
    })
}

/// A forum as bench-citus.sh makes it: accounts, communities, and threads
/// made by their authors' create_thread (on a cluster, on the author's
/// node, indexed by a community that may be on another). (threads, accounts)
async fn forum(admin: &Client) -> Result<(Vec<i64>, Vec<i64>)> {
    let create = |type_name: &'static str, count: i32| async move {
        let rows = admin
            .query(
                "SELECT lambdastore.create_object('forum', $1, jsonb_build_object('name', lower($1) || ' ' || k)) \
                 FROM generate_series(1, $2::int) k",
                &[&type_name, &count],
            )
            .await?;
        anyhow::Ok(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>())
    };
    let accounts = create("Account", ACCOUNTS).await?;
    let communities = create("Community", COMMUNITIES).await?;
    let threads = admin
        .query(
            "SELECT lambda_invoke(($1::bigint[])[1 + g % $3::int], 'create_thread',
                                  jsonb_build_object('community', ($2::bigint[])[1 + g % $4::int],
                                                     'title', 'thread ' || g, 'text', repeat('x', 200)))::bigint
               FROM generate_series(1, $5::int) g",
            &[&accounts, &communities, &ACCOUNTS, &COMMUNITIES, &THREADS],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok((threads, accounts))
}

/// Retwis: two sets of users alike, one per path.
async fn retwis(admin: &Client) -> Result<Setup> {
    let side = |users: Arc<Vec<i64>>| -> Side {
        let checks = vec![
            Check::entries(
                "the posts",
                "SELECT count(*) FROM lambdastore.entries WHERE object_id = ANY($1) AND field = 'posts'",
                &users,
                1,
            ),
            // The author's timeline and each follower's.
            Check::entries(
                "the timelines",
                "SELECT count(*) FROM lambdastore.entries WHERE object_id = ANY($1) AND field = 'timeline'",
                &users,
                1 + FOLLOWERS as i64,
            ),
        ];
        // retwis-lambdastore.sql: a user reads their timeline (90%) or posts.
        let mix: Mix = Arc::new(move |_, draw| {
            let mut rng = draw;
            let user = pick(&mut rng, &users);
            if next(&mut rng) % 100 < 90 {
                Call::new(user, "get_timeline", json!({"limit": 50}))
            } else {
                Call::new(user, "create_post", json!({"text": POST}))
            }
        });
        Side { mix, checks }
    };
    let (http_users, sql_users) = (Arc::new(users(admin).await?), Arc::new(users(admin).await?));
    let first = Call::new(http_users[0], "get_timeline", json!({"limit": 50}));
    Ok(Setup {
        rows: vec![Row {
            label: "Retwis: 90% get_timeline, 10% create_post",
            counted: Some("create_post"),
            http: side(http_users),
            sql: side(sql_users),
        }],
        first,
    })
}

/// Retwis users as bench-citus.sh makes them: each followed by the 20 users
/// k + 47j around the ring (so, on a cluster, by users on every node), then
/// one post each, so that timelines are not empty.
async fn users(admin: &Client) -> Result<Vec<i64>> {
    let users: Vec<i64> = admin
        .query(
            "SELECT lambdastore.create_object('retwis', 'User', jsonb_build_object('name', 'user ' || k)) \
             FROM generate_series(1, $1::bigint) k",
            &[&(USERS as i64)],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let followers = |i: usize| -> Vec<i64> { (1..=FOLLOWERS).map(|j| users[(i + 47 * j) % USERS]).collect() };
    invoke_all(admin, &users, "add_followers", |i| json!({"followers": followers(i)})).await?;
    invoke_all(admin, &users, "create_post", |i| json!({"text": format!("hello from user {}", i + 1)})).await?;
    Ok(users)
}

/// Runs `method` with `args(i)` on `objects[i]` for every i, a few calls per
/// transaction: on a cluster, a prepared transaction may carry 1,024 entry
/// locks per node, and a post takes one on each of 21 timelines.
async fn invoke_all(admin: &Client, objects: &[i64], method: &str, args: impl Fn(usize) -> Value) -> Result<()> {
    const PER_STATEMENT: usize = 25;
    for (c, chunk) in objects.chunks(PER_STATEMENT).enumerate() {
        let args: Vec<Value> = (0..chunk.len()).map(|i| args(c * PER_STATEMENT + i)).collect();
        admin
            .execute(
                "SELECT count(lambda_invoke(o, $1, a)) \
                 FROM unnest($2::bigint[], ARRAY(SELECT jsonb_array_elements($3::jsonb))) AS t(o, a)",
                &[&method, &chunk, &Value::Array(args)],
            )
            .await
            .with_context(|| format!("{method} on objects {}..", chunk[0]))?;
    }
    Ok(())
}

fn pick(rng: &mut u64, ids: &[i64]) -> i64 {
    ids[(next(rng) % ids.len() as u64) as usize]
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
    invoke: Statement,
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
async fn http_call(client: &reqwest::Client, url: &str, auth: &str, body: String) -> Result<u64, String> {
    let response = client
        .post(url)
        .header(reqwest::header::AUTHORIZATION, auth)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
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
async fn sql_call(conn: &SqlConnection, call: &Call) -> Result<u64, String> {
    static CALLS: AtomicU64 = AtomicU64::new(1);
    let mut rng = CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut retries = 0;
    loop {
        match conn.client.query_one(&conn.invoke, &[&call.object, &call.method, &call.args]).await {
            Ok(_) => return Ok(retries as u64),
            Err(e) if matches!(e.code().map(|c| c.code()), Some("40001" | "40P01")) && retries < MAX_RETRIES => {
                let cap = BASE_BACKOFF.saturating_mul(1 << retries.min(16)).min(MAX_BACKOFF);
                let uniform = (next(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
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

/// A successful call: the retries it took, and whether the row's checks
/// count it.
struct Done {
    retries: u64,
    counted: bool,
}

/// What one row measured, summed over its workers.
struct Tally {
    latency: Histogram<u64>,
    /// Successful requests in the measured window.
    ok: u64,
    errors: u64,
    retries: u64,
    /// Successful counted calls from the start, warm-up included.
    counted: u64,
    first_error: Option<String>,
    /// CPU per request of the watched processes in the measured window.
    cpu: String,
}

impl Tally {
    fn new() -> Self {
        Tally { latency: histogram(), ok: 0, errors: 0, retries: 0, counted: 0, first_error: None, cpu: String::new() }
    }

    fn merge(&mut self, other: Tally) -> Result<()> {
        self.latency.add(&other.latency)?;
        self.ok += other.ok;
        self.errors += other.errors;
        self.retries += other.retries;
        self.counted += other.counted;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        Ok(())
    }
}

/// Runs one closed-loop worker per element of `workers` for warm-up plus
/// duration, `call(worker, its index, a random number)` being one request.
/// Worker i draws the same numbers in every row, whichever the path.
async fn drive<W, F, Fut>(options: &Options, workers: impl Iterator<Item = W>, call: F) -> Result<Tally>
where
    W: Clone + Send + 'static,
    F: Fn(W, usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Done, String>> + Send,
{
    let start = Instant::now();
    let (measure_from, until) = (start + options.warmup, start + options.warmup + options.duration);
    // The CPU clocks at both ends of the measured window, read by a task of
    // its own (a read of /proc takes well under a millisecond).
    let trees = options.cpu.clone();
    let clocks = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from).await;
        let before = cpu::sample(&trees)?;
        tokio::time::sleep_until(until).await;
        anyhow::Ok((trees.clone(), before, cpu::sample(&trees)?))
    });
    let tasks: Vec<_> = workers
        .enumerate()
        .map(|(index, worker)| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut tally = Tally::new();
                let mut rng = (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                while Instant::now() < until {
                    let started = Instant::now();
                    let outcome = call(worker.clone(), index, next(&mut rng)).await;
                    let done = Instant::now();
                    let measured = started >= measure_from && done <= until;
                    match outcome {
                        Ok(Done { retries, counted }) => {
                            tally.counted += counted as u64;
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
    let (trees, before, after) = clocks.await??;
    total.cpu = cpu::per_request(&trees, &before, &after, total.ok);
    Ok(total)
}

fn ms(h: &Histogram<u64>, q: f64) -> String {
    if h.is_empty() {
        return "-".into();
    }
    format!("{:.2} ms", h.value_at_quantile(q) as f64 / 1000.0)
}
