//! A real gateway process in front of the suite's real PostgreSQL server.
//!
//! `scripts/e2e.sh` starts the server and sets `LAMBDASTORE_TEST_URL` (a
//! superuser libpq URL). Each test starts its own gateway (the binary cargo
//! built, on a free port, connecting as the least-privilege role docs/gateway.md
//! describes) and works on applications of its own, so tests run in parallel.
#![allow(dead_code)]

use postgres::{Client, NoTls};
use reqwest::blocking::{RequestBuilder, Response};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

mod process;
pub use process::Gateway;

pub const DATABASE: &str = "lambdastore_test";
pub const ROLE: &str = "lambdastore_gateway";

fn config(dbname: &str) -> postgres::Config {
    let url = std::env::var("LAMBDASTORE_TEST_URL")
        .expect("LAMBDASTORE_TEST_URL is not set: run the suite with `make test-e2e` or scripts/e2e.sh");
    let mut config: postgres::Config = url.parse().expect("LAMBDASTORE_TEST_URL is a libpq URL");
    config.dbname(dbname).application_name("lambdastore-gateway-tests");
    config
}

/// The test database's libpq URL for `role`.
pub fn url_as(role: &str) -> String {
    let url = std::env::var("LAMBDASTORE_TEST_URL").unwrap();
    let kept: Vec<&str> =
        url.split_whitespace().filter(|kv| !kv.starts_with("user=") && !kv.starts_with("dbname=")).collect();
    format!("{} user={role} dbname={DATABASE}", kept.join(" "))
}

/// docs/gateway.md's least-privilege role, created once per server.
fn setup() {
    static SETUP: Once = Once::new();
    SETUP.call_once(|| {
        let mut admin = config("postgres").connect(NoTls).expect("connect to the test server");
        admin.execute("SELECT pg_advisory_lock(4242)", &[]).unwrap();
        if admin.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&DATABASE]).unwrap().is_none() {
            admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).unwrap();
        }
        let mut db = config(DATABASE).connect(NoTls).unwrap();
        db.batch_execute("CREATE EXTENSION IF NOT EXISTS lambdastore").unwrap();
        if db.query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&ROLE]).unwrap().is_none() {
            db.batch_execute(&format!(
                "CREATE ROLE {ROLE} LOGIN;
                 GRANT USAGE ON SCHEMA lambdastore_gateway TO {ROLE};
                 GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lambdastore_gateway TO {ROLE};"
            ))
            .unwrap();
        }
        admin.execute("SELECT pg_advisory_unlock(4242)", &[]).unwrap();
    });
}

/// A superuser connection to the test database.
pub fn sql() -> Client {
    setup();
    config(DATABASE).connect(NoTls).expect("connect to the test database")
}

pub fn component(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/lambdas").join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run `make lambdas`)", path.display()))
}

/// A fresh application name and an API key for it.
pub struct App {
    pub name: String,
    pub key: String,
    pub key_id: i64,
}

impl App {
    pub fn new(prefix: &str) -> App {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("{prefix}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let row =
            sql().query_one("SELECT key_id, api_key FROM lambdastore.create_api_key($1, 'tests')", &[&name]).unwrap();
        App { name, key_id: row.get(0), key: row.get(1) }
    }

    /// An application with `component` deployed (over SQL: deploy over HTTP
    /// is tested on its own).
    pub fn deployed(prefix: &str, component_name: &str) -> App {
        let app = App::new(prefix);
        sql().execute("SELECT lambdastore.deploy($1, $2)", &[&app.name, &component(component_name)]).unwrap();
        app
    }

    pub fn create(&self, type_name: &str, args: Value) -> i64 {
        let args = args.to_string();
        sql()
            .query_one("SELECT lambdastore.create_object($1, $2, $3::text::jsonb)", &[&self.name, &type_name, &args])
            .unwrap()
            .get(0)
    }
}

impl Gateway {
    pub fn start() -> Gateway {
        Gateway::start_with(ROLE, &[])
    }

    /// A gateway connecting as `role`, with extra command-line flags.
    pub fn start_with(role: &str, flags: &[&str]) -> Gateway {
        setup();
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_lambdastore-gateway"));
        Gateway::spawn(binary, &url_as(role), &[&["--pool-size", "8"], flags].concat())
    }

    pub fn post(&self, key: &str, path: &str) -> RequestBuilder {
        self.http.post(self.url(path)).bearer_auth(key)
    }

    pub fn get(&self, key: &str, path: &str) -> RequestBuilder {
        self.http.get(self.url(path)).bearer_auth(key)
    }

    /// POST /v1/objects/{id}/methods/{method} with JSON arguments.
    pub fn invoke(&self, key: &str, object: i64, method: &str, args: Value) -> Response {
        self.post(key, &format!("/v1/objects/{object}/methods/{method}")).json(&args).send().unwrap()
    }
}

/// Status, and the error body's code and SQLSTATE, of a response.
pub fn error_of(response: Response) -> (u16, String, Option<String>, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().expect("an error body is JSON");
    let error = &body["error"];
    assert_eq!(error["status"], status, "the body repeats the status: {body}");
    (
        status,
        error["code"].as_str().unwrap().to_string(),
        error["sqlstate"].as_str().map(str::to_string),
        error["message"].as_str().unwrap().to_string(),
    )
}

/// The `result` of a successful call.
pub fn result_of(response: Response) -> Value {
    let status = response.status();
    let body: Value = response.json().unwrap();
    assert_eq!(status, 200, "{body}");
    body["result"].clone()
}

/// Waits (bounded) until `condition` holds, polling: for states another
/// process reaches, such as a backend waiting on a lock.
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The counter's value, read over SQL.
pub fn counter_value(object: i64) -> i64 {
    sql().query_one("SELECT (lambda_invoke($1, 'get'))::text::bigint", &[&object]).unwrap().get(0)
}
