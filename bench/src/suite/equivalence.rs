//! The baselines are only a comparison if they do what the lambdas do: each
//! workload's operations run on every system against one database, and the
//! results and effects must agree. Runs against the server in
//! `LAMBDASTORE_TEST_URL` (`make test` starts it), in a database of its own.

use super::systems::{self, SqlSession, System};
use super::workloads::Op;
use crate::remote::RemoteSession;
use anyhow::Result;
use postgres::{Client, NoTls};
use serde_json::{json, Value};

const DATABASE: &str = "lambdastore_bench_equivalence";

struct Fixture {
    url: String,
    admin: Client,
}

/// The database, created afresh once per test run, with the three
/// applications deployed and the PL/pgSQL baselines installed.
fn url() -> String {
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| {
        let url = std::env::var("LAMBDASTORE_TEST_URL")
            .expect("LAMBDASTORE_TEST_URL is not set: run with `make test-e2e` or scripts/e2e.sh");
        let mut server = Client::connect(&url, NoTls).expect("connect to the test server");
        server.batch_execute(&format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")).unwrap();
        server.batch_execute(&format!("CREATE DATABASE {DATABASE}")).unwrap();
        let url = format!("{url} dbname={DATABASE}");
        let mut admin = Client::connect(&url, NoTls).unwrap();
        admin.batch_execute("CREATE EXTENSION lambdastore").unwrap();
        for sql in [
            include_str!("../../sql/plpgsql/micro.sql"),
            include_str!("../../sql/plpgsql/forum.sql"),
            include_str!("../../sql/plpgsql/retwis.sql"),
        ] {
            admin.batch_execute(sql).unwrap();
        }
        for app in ["micro", "forum", "retwis"] {
            admin.execute("SELECT lambdastore.deploy($1, $2)", &[&app, &wasm(app)]).unwrap();
        }
        url
    })
    .clone()
}

impl Fixture {
    fn new() -> Fixture {
        let url = url();
        Fixture { admin: Client::connect(&url, NoTls).unwrap(), url }
    }

    fn create(&mut self, app: &str, type_name: &str, args: Value) -> i64 {
        self.admin.query_one("SELECT lambdastore.create_object($1, $2, $3)", &[&app, &type_name, &args]).unwrap().get(0)
    }

    fn invoke(&mut self, object: i64, method: &str, args: Value) -> Value {
        self.admin.query_one("SELECT lambda_invoke($1, $2, $3)", &[&object, &method, &args]).unwrap().get(0)
    }

    /// One session per system, for `app`'s workload.
    fn sessions(&self, app: &str, systems: &[System]) -> Vec<(System, Session)> {
        let wasm = wasm(app);
        let session = |system| -> Result<Session> {
            Ok(match system {
                System::Disaggregated => Session::Remote(systems::connect_remote(&self.url, "", &wasm)?),
                _ => {
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    let sql = runtime.block_on(SqlSession::connect(system, &self.url, ""))?;
                    Session::Sql(Box::new((runtime, sql)))
                }
            })
        };
        systems.iter().map(|&s| (s, session(s).unwrap())).collect()
    }
}

/// A session with any system, its calls run to the end one at a time
/// (a SQL session on a runtime of its own).
enum Session {
    Sql(Box<(tokio::runtime::Runtime, SqlSession)>),
    Remote(RemoteSession),
}

impl Session {
    fn call(&mut self, op: &Op) -> Result<Value> {
        match self {
            Session::Sql(sql) => {
                let (runtime, sql) = &mut **sql;
                runtime.block_on(sql.call(op))
            }
            Session::Remote(remote) => systems::call_remote(remote, op),
        }
    }
}

/// Runs `op` on `system`, retrying serialization failures as the driver
/// does (the other test runs concurrently, and SSI's page-level predicate
/// locks can conflict across objects); names the system if it fails.
fn call(session: &mut Session, system: System, op: &Op) -> Value {
    for _ in 0..100 {
        match session.call(op) {
            Ok(value) => return value,
            Err(e) if systems::is_retryable(&e) => continue,
            Err(e) => panic!("{system:?} {op:?}: {e:#}"),
        }
    }
    panic!("{system:?} {op:?}: 100 serialization failures in a row")
}

fn wasm(app: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../target/lambdas/{app}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {} (run make lambdas): {e}", path.display()))
}

#[test]
fn every_system_does_what_the_lambdas_do() {
    let mut fx = Fixture::new();

    // rw-mix: the same counts; every system's writes are 1 KiB values the
    // lambda reads back.
    let bench = fx.create("micro", "Bench", json!({}));
    let keys = [3, 14, 15, 92, 65];
    for (system, mut session) in fx.sessions("micro", &System::ALL) {
        let read = call(&mut session, system, &Op::Touch { object: bench, keys, write: false });
        assert_eq!(read, json!(5), "{system:?} read");
        let written = call(&mut session, system, &Op::Touch { object: bench, keys, write: true });
        assert_eq!(written, json!(5), "{system:?} write");
        assert_eq!(fx.invoke(bench, "read", json!({"k": 100})), json!(100 * 1024), "after {system:?} wrote");
    }

    // job length: the same digest.
    let expected = fx.invoke(bench, "hash", json!({"n": 3}));
    assert_eq!(expected.as_str().map(str::len), Some(128));
    for (system, mut session) in fx.sessions("micro", &[System::Disaggregated, System::Plpgsql]) {
        assert_eq!(call(&mut session, system, &Op::Hash { object: bench, n: 3 }), expected, "{system:?} hash");
    }

    // CloudForum: a comment through each system; every reader sees all of
    // them, identically.
    let account = fx.create("forum", "Account", json!({"name": "ada"}));
    let community = fx.create("forum", "Community", json!({"name": "db"}));
    let thread = fx.invoke(account, "create_thread", json!({"community": community, "title": "t", "text": "body"}));
    let thread = thread.as_i64().unwrap();
    for (n, (system, mut session)) in fx.sessions("forum", &System::ALL).into_iter().enumerate() {
        let text = format!("from {system:?}: \"quoted\" \\ é");
        let id = call(&mut session, system, &Op::AddComment { account, thread, text });
        assert_eq!(id, json!(n + 1), "{system:?} comment id");
    }
    let view = fx.invoke(thread, "get_thread", json!({}));
    assert_eq!(view["comment_count"], json!(4));
    assert_eq!(view["comments"].as_array().unwrap().len(), 4);
    assert_eq!(view["comments"][2]["text"], json!("from Plpgsql: \"quoted\" \\ é"));
    for (system, mut session) in fx.sessions("forum", &[System::Disaggregated, System::Plpgsql]) {
        assert_eq!(call(&mut session, system, &Op::GetThread { thread }), view, "{system:?} get_thread");
    }

    // Retwis: a post through each system reaches both followers' timelines;
    // every reader returns the same timeline.
    let users: Vec<i64> = (0..3).map(|i| fx.create("retwis", "User", json!({"name": format!("u{i}")}))).collect();
    fx.invoke(users[0], "add_followers", json!({"followers": [users[1], users[2]]}));
    for (system, mut session) in fx.sessions("retwis", &System::ALL) {
        call(&mut session, system, &Op::Post { user: users[0], text: format!("by {system:?}") });
    }
    let timeline = fx.invoke(users[2], "get_timeline", json!({"limit": 50}));
    let texts: Vec<&str> = timeline.as_array().unwrap().iter().map(|p| p["text"].as_str().unwrap()).collect();
    assert_eq!(texts, ["by RawSql", "by Plpgsql", "by Disaggregated", "by Lambdastore"], "newest first");
    for (system, mut session) in fx.sessions("retwis", &[System::Disaggregated, System::Plpgsql, System::RawSql]) {
        assert_eq!(call(&mut session, system, &Op::Timeline { user: users[2] }), timeline, "{system:?} get_timeline");
    }
}

/// The disaggregated host keeps the extension's isolation: concurrent
/// read-modify-writes through it lose nothing (its transactions are
/// SERIALIZABLE, and retried on 40001).
#[test]
fn disaggregated_calls_are_transactions() {
    let fx = url();
    let bench = {
        let mut admin = Client::connect(&fx, NoTls).unwrap();
        admin
            .query_one("SELECT lambdastore.create_object('micro', 'Bench', '{\"entries\": 0}')", &[])
            .unwrap()
            .get::<_, i64>(0)
    };
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let url = fx.clone();
            std::thread::spawn(move || {
                let app = std::rc::Rc::new(crate::remote::RemoteApp::load(&wasm("micro")).unwrap());
                let mut session = crate::remote::RemoteSession::new(app, Client::connect(&url, NoTls).unwrap());
                let mut retries = 0;
                for i in 0..50u64 {
                    loop {
                        match session.invoke(bench, "tally", &json!({"tag": t * 1000 + i}).to_string()) {
                            Ok(_) => break,
                            Err(crate::remote::RemoteError::Retry(_)) => retries += 1,
                            Err(e) => panic!("tally: {e}"),
                        }
                    }
                }
                retries
            })
        })
        .collect();
    let retries: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let mut admin = Client::connect(&fx, NoTls).unwrap();
    let count = admin
        .query_one("SELECT lambda_invoke($1, 'tally', '{\"tag\": 999999}')", &[&bench])
        .unwrap()
        .get::<_, Value>(0);
    assert_eq!(count, json!(201), "200 tallies and this one, after {retries} retries");
}
