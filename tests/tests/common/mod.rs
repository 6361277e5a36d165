//! Helpers shared by the end-to-end tests: a connection to the test
//! database (created with the extension on first use), the example
//! components, the SQL API as typed calls, and SQLSTATE assertions.
//!
//! The server is the one `scripts/e2e.sh` starts; its libpq key/value URL is
//! in `LAMBDASTORE_TEST_URL`. Tests run in parallel, so each one deploys its
//! own applications under names from [`app`].
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod concurrent;
pub mod rogue;
pub mod source;

use postgres::{Client, GenericClient, NoTls};
use serde_json::Value;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Once;

/// Tests run against each language's twin of an example: the Rust one and
/// its Python twin (built by componentize-py from
/// guest-sdk/python/examples/<name>), which must be indistinguishable from
/// SQL. Each list names the two examples its tests take; the tests are
/// `rust::<test>` and `python::<test>`.
#[allow(unused_macros)] // used by the suites that run over both languages
macro_rules! in_both_languages {
    ($($rust:literal, $python:literal: [$($test:ident),* $(,)?]),* $(,)?) => {
        mod rust {
            $($(#[test] fn $test() { super::$test($rust) })*)*
        }
        mod python {
            $($(#[test] fn $test() { super::$test($python) })*)*
        }
    };
}
#[allow(unused_imports)] // used by the suites that run over both languages
pub(crate) use in_both_languages;

/// The database the suite works in (created if missing).
pub const DATABASE: &str = "lambdastore_test";

/// Any fixed number: serialises the first-time setup across test processes.
const SETUP_LOCK: i64 = 0x4c53_7465_7374; // "LStest"

fn config(dbname: &str) -> postgres::Config {
    let url = std::env::var("LAMBDASTORE_TEST_URL")
        .expect("LAMBDASTORE_TEST_URL is not set: run the suite with `make test-e2e` or scripts/e2e.sh");
    let mut config: postgres::Config = url.parse().expect("LAMBDASTORE_TEST_URL is a libpq URL");
    config.dbname(dbname).application_name("lambdastore-tests");
    config
}

fn setup() {
    static SETUP: Once = Once::new();
    SETUP.call_once(|| {
        let mut admin = config("postgres").connect(NoTls).expect("connect to the test server");
        admin.execute("SELECT pg_advisory_lock($1)", &[&SETUP_LOCK]).unwrap();
        let exists = admin.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&DATABASE]).unwrap().is_some();
        if !exists {
            admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).unwrap();
        }
        let mut db = config(DATABASE).connect(NoTls).expect("connect to the test database");
        db.batch_execute("CREATE EXTENSION IF NOT EXISTS lambdastore")
            .expect("CREATE EXTENSION lambdastore (is the extension installed?)");
        admin.execute("SELECT pg_advisory_unlock($1)", &[&SETUP_LOCK]).unwrap();
    });
}

/// A new connection to the test database, as the superuser `postgres`.
pub fn connect() -> Client {
    setup();
    config(DATABASE).connect(NoTls).expect("connect to the test database")
}

/// A new connection to another database of the test server (`postgres`),
/// as the superuser.
pub fn connect_to(database: &str) -> Client {
    setup();
    config(database).connect(NoTls).unwrap_or_else(|e| panic!("connect to {database}: {e}"))
}

/// A database of its own, for a test that changes the extension itself
/// (the others share [`DATABASE`]). Dropped when it goes out of scope.
pub struct ScratchDatabase {
    pub name: String,
}

impl ScratchDatabase {
    pub fn new(test: &str) -> ScratchDatabase {
        setup();
        let name = format!("lambdastore_test_{test}_{}", std::process::id());
        let mut admin = config("postgres").connect(NoTls).unwrap();
        // Separate statements: neither may run in a transaction block.
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        ScratchDatabase { name }
    }

    pub fn connect(&self) -> Client {
        config(&self.name).connect(NoTls).expect("connect to the scratch database")
    }

    /// A session of `role` (with `LOGIN`) in this database.
    pub fn connect_as(&self, role: &str) -> Client {
        config(&self.name).user(role).connect(NoTls).unwrap_or_else(|e| panic!("connect as {role}: {e}"))
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        if let Ok(mut admin) = config("postgres").connect(NoTls) {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
        }
    }
}

/// An application name unique to this test and this run, so that tests may
/// run in parallel and be re-run against the same database.
pub fn app(test: &str) -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let name = format!("{test}_{:x}{:04x}", std::process::id(), secs & 0xffff);
    assert!(name.len() <= 63, "application name {name} is too long");
    name
}

pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The bytes of an example application, as `make lambdas` builds them.
pub fn example(name: &str) -> Vec<u8> {
    let path = workspace().join("target/lambdas").join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (build the examples with `make lambdas`)", path.display()))
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("the server returned invalid JSON {text:?}: {e}"))
}

/// `lambdastore.deploy(app, module)`.
pub fn deploy(c: &mut impl GenericClient, app: &str, module: &[u8]) -> Result<Value, postgres::Error> {
    let row = c.query_one("SELECT lambdastore.deploy($1, $2)::text", &[&app, &module])?;
    Ok(json(row.get(0)))
}

/// Deploys the example `name` as application `app`.
#[track_caller]
pub fn deploy_example(c: &mut impl GenericClient, app: &str, name: &str) -> Value {
    deploy(c, app, &example(name)).unwrap_or_else(|e| panic!("deploy {name} as {app}: {}", describe(&e)))
}

/// What `lambdastore.map_call` said about each object: its result, or
/// its failure's (SQLSTATE, message).
pub type Mapped = std::collections::BTreeMap<i64, Result<Value, (String, String)>>;

/// Reads `map_call`'s rows, selected as (object_id, result::text,
/// sqlstate, error).
pub fn mapped(rows: Vec<postgres::Row>) -> Mapped {
    rows.iter()
        .map(|row| {
            let outcome = match row.get::<_, Option<String>>(1) {
                Some(result) => Ok(json(&result)),
                None => Err((row.get(2), row.get(3))),
            };
            (row.get(0), outcome)
        })
        .collect()
}

/// `lambdastore.map_call(app, type, method, args)`.
pub fn map_type(
    c: &mut impl GenericClient,
    app: &str,
    ty: &str,
    method: &str,
    args: Value,
) -> Result<Mapped, postgres::Error> {
    let sql = "SELECT object_id, result::text, sqlstate, error FROM lambdastore.map_call($1, $2, $3, $4::text::jsonb)";
    Ok(mapped(c.query(sql, &[&app, &ty, &method, &args.to_string()])?))
}

/// `lambdastore.map_call(object_ids, method, args)`.
pub fn map_ids(c: &mut impl GenericClient, ids: &[i64], method: &str, args: Value) -> Result<Mapped, postgres::Error> {
    let sql = "SELECT object_id, result::text, sqlstate, error FROM lambdastore.map_call($1, $2, $3::text::jsonb)";
    Ok(mapped(c.query(sql, &[&ids, &method, &args.to_string()])?))
}

/// `lambdastore.create_object(app, type, args)`.
pub fn create_object(c: &mut impl GenericClient, app: &str, ty: &str, args: Value) -> Result<i64, postgres::Error> {
    let row =
        c.query_one("SELECT lambdastore.create_object($1, $2, $3::text::jsonb)", &[&app, &ty, &args.to_string()])?;
    Ok(row.get(0))
}

#[track_caller]
pub fn create(c: &mut impl GenericClient, app: &str, ty: &str, args: Value) -> i64 {
    create_object(c, app, ty, args.clone())
        .unwrap_or_else(|e| panic!("create_object({app}, {ty}, {args}): {}", describe(&e)))
}

/// `lambda_invoke(object, method, args)`.
pub fn invoke(c: &mut impl GenericClient, object: i64, method: &str, args: Value) -> Result<Value, postgres::Error> {
    // The call alone, as applications write it (on Citus, a statement that
    // is one call is delegated to the object's node: cluster/delegate.rs).
    let row = c.query_one("SELECT lambda_invoke($1, $2, $3::text::jsonb)", &[&object, &method, &args.to_string()])?;
    Ok(row.get(0))
}

/// `lambda_invoke(object, method, args)`, which must succeed. On Citus, a
/// call that meets another test's migration holding a node's fence is
/// refused with 40001, nothing done (ARCHITECTURE.md, "The fence"), and
/// is made again here as its client would, for up to a minute; tests of
/// that refusal use `invoke`. (In a transaction block the next try fails
/// with 25P02, which the panic shows.)
#[track_caller]
pub fn call(c: &mut impl GenericClient, object: i64, method: &str, args: Value) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut refusals = 0;
    loop {
        match invoke(c, object, method, args.clone()) {
            Err(e) if refused_by_a_migration(&e) && std::time::Instant::now() < deadline => {
                refusals += 1;
                std::thread::sleep(std::time::Duration::from_millis(20)); // backing off
            }
            result => {
                return result.unwrap_or_else(|e| {
                    let tries = if refusals > 0 { format!(" (try {})", refusals + 1) } else { String::new() };
                    panic!("lambda_invoke({object}, {method}, {args}){tries}: {}", describe(&e))
                })
            }
        }
    }
}

/// Whether `err` is a call's refusal while a migration holds the fence of
/// a node it needs (`layout::fenced_layout`).
fn refused_by_a_migration(err: &postgres::Error) -> bool {
    err.as_db_error()
        .is_some_and(|e| e.code().code() == "40001" && e.message().contains("a migration holds this node's fence"))
}

/// `lambdastore.invoke_static(app, type, function, args)`.
pub fn invoke_static(
    c: &mut impl GenericClient,
    app: &str,
    ty: &str,
    function: &str,
    args: Value,
) -> Result<Value, postgres::Error> {
    let row = c.query_one(
        "SELECT lambdastore.invoke_static($1, $2, $3, $4::text::jsonb)::text",
        &[&app, &ty, &function, &args.to_string()],
    )?;
    Ok(json(row.get(0)))
}

/// A database error as psql would show it, for failure messages.
pub fn describe(err: &postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => format!(
            "{} {}: {}{}",
            db.severity(),
            db.code().code(),
            db.message(),
            db.detail().map(|d| format!(" (DETAIL: {d})")).unwrap_or_default()
        ),
        None => format!("{err}"),
    }
}

/// Asserts that `result` is a database error with SQLSTATE `code` and
/// returns its message.
#[track_caller]
pub fn expect_sqlstate<T: Debug>(result: Result<T, postgres::Error>, code: &str) -> String {
    match result {
        Ok(value) => {
            panic!("expected SQLSTATE {code}, but the call succeeded and returned {value:?}")
        }
        Err(err) => match err.as_db_error() {
            Some(db) if db.code().code() == code => db.message().to_string(),
            _ => panic!("expected SQLSTATE {code}, got {}", describe(&err)),
        },
    }
}

/// Calls `method` on `object`, expects SQLSTATE `code`, and checks that the
/// object's entries are exactly what they were before. Returns the message.
#[track_caller]
pub fn fails_cleanly(c: &mut Client, object: i64, method: &str, args: Value, code: &str) -> String {
    let before = entries(c, object);
    let message = expect_sqlstate(invoke(c, object, method, args), code);
    assert_eq!(entries(c, object), before, "{method} failed with {code} but changed the object's entries");
    message
}

/// Every entry of an object, as (field, key, value), in key order.
pub type Entries = Vec<(String, Vec<u8>, Vec<u8>)>;

pub fn entries(c: &mut impl GenericClient, object: i64) -> Entries {
    c.query("SELECT field, key, value FROM lambdastore.entries WHERE object_id = $1 ORDER BY field, key", &[&object])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The objects of an application, in id order.
pub fn objects(c: &mut impl GenericClient, app: &str) -> Vec<i64> {
    c.query("SELECT object_id FROM lambdastore.objects WHERE app = $1 ORDER BY 1", &[&app])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `len` hexadecimal digits drawn at random (always the same ones): text
/// that PostgreSQL cannot compress, as it does a long value in an index.
pub fn incompressible(len: usize) -> String {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut text = String::with_capacity(len + 16);
    while text.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push_str(&format!("{state:016x}"));
    }
    text.truncate(len);
    text
}

pub fn count(c: &mut impl GenericClient, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

pub fn backend_pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// Polls from `observer` until backend `pid` runs a call in a statement
/// that contains `needle`, so that a cancel hits the lambda. The backend
/// must not have made a call before: a session's first call reads its
/// module, and holds `lambdastore.modules` locked from before the lambda
/// starts until the statement ends. Being `active` is not enough: a
/// statement with parameters is active while it is parsed, then idle until
/// it is bound, and a signal in that gap ends the session between two
/// requests (the client sees "connection closed", not the error). Polling
/// stops early if `call`, the thread that sent the statement, ends: the
/// test's assertions on its result then say what went wrong. On a Citus
/// coordinator the module is read where the object lives, by a backend
/// working for `pid`: `citus_locks` shows its lock (on a shard of the
/// table) under the caller's global pid, the coordinator's node id times
/// 10^10 plus `pid`.
#[track_caller]
pub fn wait_until_running<T>(observer: &mut Client, pid: i32, needle: &str, call: &std::thread::JoinHandle<T>) {
    let distributed: bool = observer.query_one("SELECT lambdastore._distributed()", &[]).unwrap().get(0);
    let module_read = if distributed {
        "SELECT 1 FROM citus_locks l WHERE l.global_pid = citus_backend_gpid() / 10000000000 * 10000000000 + $1
            AND l.granted AND l.relation_name::text ~ '^lambdastore\\.modules(_[0-9]+)?$'"
    } else {
        "SELECT 1 FROM pg_locks l WHERE l.pid = $1 AND l.granted AND l.relation = 'lambdastore.modules'::regclass"
    };
    let calling = format!(
        "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND position($2 in query) > 0
            AND EXISTS ({module_read})"
    );
    poll_until(&format!("backend {pid} never started running {needle}"), || {
        call.is_finished() || observer.query_opt(&calling, &[&pid, &needle]).unwrap().is_some()
    });
}

/// Polls from `observer` until backend `pid` waits for a heavyweight lock.
#[track_caller]
pub fn wait_until_waiting_for_a_lock(observer: &mut Client, pid: i32) {
    wait_for_backend(observer, pid, "wait_event_type = 'Lock'", None, "waited for a lock");
}

/// Polls from `observer` until backend `pid` waits for a lock on the
/// object-id sequence (held by a test's `ALTER SEQUENCE`): not for any
/// lock, which a concurrent test's migration may make it wait for first.
#[track_caller]
pub fn wait_until_waiting_for_the_id_sequence(observer: &mut Client, pid: i32) {
    let on_sequence = "EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = pg_stat_activity.pid AND NOT l.granted
                               AND l.relation = 'lambdastore.object_id_seq'::regclass)";
    wait_for_backend(observer, pid, on_sequence, None, "waited for the object-id sequence");
}

/// Polls from `observer` until backend `pid` waits for a transaction that
/// holds an entry set it reads (`lambdastore.commit_wait`).
#[track_caller]
pub fn wait_until_waiting_for_a_writer(observer: &mut Client, pid: i32) {
    wait_for_backend(observer, pid, "wait_event_type = 'Extension'", None, "waited for a writer");
}

/// Polls from `observer` until some backend running a statement that
/// contains `needle` waits, with wait event type `event_type`: a call
/// sent to `observer`'s node by another node, whose pid the test does not
/// know.
#[track_caller]
pub fn wait_until_a_statement_waits(observer: &mut Client, needle: &str, event_type: &str) {
    let sql = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = $2 AND position($1 in query) > 0";
    poll_until(&format!("no statement running {needle} waited ({event_type})"), || {
        !observer.query(sql, &[&needle, &event_type]).unwrap().is_empty()
    });
}

/// Polls `done` every 5 ms until it holds, for at most 30 s (then fails
/// the test with `what`): for states another process reaches, which the
/// test can only look at.
#[track_caller]
pub fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(5)); // polling interval, not a wait for an event
    }
}

/// Polls `pg_stat_activity` until backend `pid`'s row meets `condition`
/// (SQL over its columns, with `$2` bound to `needle` if given), for at
/// most 30 s.
#[track_caller]
fn wait_for_backend(observer: &mut Client, pid: i32, condition: &str, needle: Option<&str>, what: &str) {
    let sql = format!("SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND {condition}");
    let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![&pid];
    if let Some(needle) = &needle {
        params.push(needle);
    }
    let failure = format!("backend {pid} never {what} {}", needle.unwrap_or(""));
    poll_until(&failure, || observer.query_opt(&sql, &params).unwrap().is_some());
}

/// Creates role `name` unless it exists (roles outlive test databases).
pub fn create_role(c: &mut impl GenericClient, name: &str) {
    c.batch_execute(&format!("DO $$ BEGIN CREATE ROLE {name}; EXCEPTION WHEN duplicate_object THEN NULL; END $$"))
        .unwrap();
}

/// A new connection to the test database as `role`, which must have
/// `LOGIN` (the test server trusts every local user).
pub fn connect_as(role: &str) -> Client {
    setup();
    config(DATABASE).user(role).connect(NoTls).unwrap_or_else(|e| panic!("connect as {role}: {e}"))
}

/// The notices (and warnings) a connection received, in order.
pub type Notices = std::sync::Arc<std::sync::Mutex<Vec<postgres::error::DbError>>>;

/// A new connection to the test database, as `postgres`, that keeps every
/// notice the server sends it (a lambda's `log` at NOTICE reaches the
/// client): the client has seen all of a statement's notices when the
/// statement returns.
pub fn connect_keeping_notices() -> (Client, Notices) {
    setup();
    let notices = Notices::default();
    let keep = notices.clone();
    let client = config(DATABASE)
        .notice_callback(move |notice| keep.lock().unwrap().push(notice))
        .connect(NoTls)
        .expect("connect to the test database");
    (client, notices)
}

/// An ordinary role of this test run, with what such a role needs to use
/// LambdaStore and nothing more: `LOGIN` and `USAGE` on the schema. What
/// it may do with an application is up to the application's owner
/// ([`grant`]). Dropped when it goes out of scope (roles outlive the test
/// database, and names are unique per run, see [`app`]).
pub struct TestRole {
    pub name: String,
}

/// Any fixed number: serialises changes to the schema's ACL, which
/// concurrent GRANTs and DROP OWNEDs would otherwise fail ("tuple
/// concurrently updated").
pub const ROLES_LOCK: i64 = 0x4c53_726f_6c65; // "LSrole"

/// Runs `sql`, which creates, drops or grants roles, in a transaction that
/// holds [`ROLES_LOCK`].
pub fn change_roles(c: &mut Client, sql: &str) -> Result<(), postgres::Error> {
    let mut tx = c.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ROLES_LOCK])?;
    tx.batch_execute(sql)?;
    tx.commit()
}

impl TestRole {
    pub fn new(test: &str) -> TestRole {
        let name = app(&format!("ls_{test}"));
        change_roles(
            &mut connect(),
            &format!(
                "CREATE ROLE {name} LOGIN NOSUPERUSER;
                 GRANT USAGE ON SCHEMA lambdastore TO {name};"
            ),
        )
        .unwrap_or_else(|e| panic!("create role {name}: {}", describe(&e)));
        TestRole { name }
    }

    /// A session logged in as the role.
    pub fn connect(&self) -> Client {
        connect_as(&self.name)
    }

    pub fn oid(&self, c: &mut impl GenericClient) -> u32 {
        c.query_one("SELECT oid FROM pg_roles WHERE rolname = $1", &[&self.name]).unwrap().get(0)
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        // As a superuser retires a role: its schedules go (they would tick
        // on as the heir), REASSIGN OWNED hands its applications over and
        // DROP OWNED revokes its grants and the schema privilege; DROP
        // ROLE is refused (2BP01) while lambdastore still depends on it.
        let _ = change_roles(
            &mut connect(),
            &format!(
                "SELECT lambdastore.unschedule(object_id, name) FROM lambdastore.schedules
                  WHERE created_by = (SELECT oid FROM pg_roles WHERE rolname = '{0}');
                 REASSIGN OWNED BY {0} TO current_user; DROP OWNED BY {0}; DROP ROLE {0}",
                self.name
            ),
        );
    }
}

/// `lambdastore.grant(app, role, privilege)`: the owner lets `role`
/// 'invoke' or 'read' the application.
pub fn grant(c: &mut impl GenericClient, app: &str, role: &str, privilege: &str) -> Result<(), postgres::Error> {
    c.execute("SELECT lambdastore.grant($1, $2::text::regrole, $3)", &[&app, &role, &privilege]).map(|_| ())
}

/// `lambdastore.revoke(app, role, privilege)`: whether it had been granted.
pub fn revoke(c: &mut impl GenericClient, app: &str, role: &str, privilege: &str) -> Result<bool, postgres::Error> {
    let row = c.query_one("SELECT lambdastore.revoke($1, $2::text::regrole, $3)", &[&app, &role, &privilege])?;
    Ok(row.get(0))
}

/// `lambdastore.has_app_privilege(app, privilege)` for the current role.
pub fn has_app_privilege(c: &mut impl GenericClient, app: &str, privilege: &str) -> bool {
    c.query_one("SELECT lambdastore.has_app_privilege($1, $2)", &[&app, &privilege])
        .unwrap_or_else(|e| panic!("has_app_privilege({app}, {privilege}): {}", describe(&e)))
        .get(0)
}

/// The OID of the role that owns `app` (the catalog keeps an OID, which
/// survives the role being dropped).
pub fn app_owner(c: &mut impl GenericClient, app: &str) -> u32 {
    c.query_one("SELECT owner FROM lambdastore.applications WHERE name = $1", &[&app])
        .unwrap_or_else(|e| panic!("the owner of {app}: {}", describe(&e)))
        .get(0)
}

/// Rows of `lambdastore.modules` for `app`: its deployed versions.
pub fn module_rows(c: &mut impl GenericClient, app: &str) -> i64 {
    c.query_one("SELECT count(*) FROM lambdastore.modules WHERE app = $1", &[&app]).unwrap().get(0)
}

/// A connection and a fresh application `test_...` running `example`.
pub fn deployed(test: &str, example: &str) -> (Client, String) {
    let mut c = connect();
    let app = app(test);
    deploy_example(&mut c, &app, example);
    (c, app)
}

/// A fresh `micro` application with one `Bench` object (100 entries).
pub fn micro_object(test: &str) -> (Client, String, i64) {
    let (mut c, app) = deployed(test, "micro");
    let id = create(&mut c, &app, "Bench", serde_json::json!({}));
    (c, app, id)
}

/// `lambdastore.submit(object, method, args, idempotency_key)`.
pub fn submit(
    c: &mut impl GenericClient,
    object: i64,
    method: &str,
    args: Value,
    key: Option<&str>,
) -> Result<i64, postgres::Error> {
    let row = c.query_one(
        "SELECT lambdastore.submit($1, $2, $3::text::jsonb, $4)",
        &[&object, &method, &args.to_string(), &key],
    )?;
    Ok(row.get(0))
}

/// A row of `lambdastore.job` / `lambdastore.wait`.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub state: String,
    pub result: Option<Value>,
    pub error: Option<String>,
    pub sqlstate: Option<String>,
    pub attempts: i32,
}

/// `lambdastore.wait(job, timeout)`: the job once finished, or as it is
/// when the timeout passes.
pub fn wait_job(c: &mut impl GenericClient, job: i64, timeout_secs: u32) -> Result<Job, postgres::Error> {
    let row = c.query_one(
        "SELECT state, result::text, error, sqlstate, attempts
           FROM lambdastore.wait($1, make_interval(secs => $2::int))",
        &[&job, &(timeout_secs as i32)],
    )?;
    Ok(Job {
        state: row.get(0),
        result: row.get::<_, Option<String>>(1).map(|text| json(&text)),
        error: row.get(2),
        sqlstate: row.get(3),
        attempts: row.get(4),
    })
}

/// Waits for a job that must finish within a minute.
#[track_caller]
pub fn finished(c: &mut impl GenericClient, job: i64) -> Job {
    let job_row = wait_job(c, job, 60).unwrap_or_else(|e| panic!("wait({job}): {}", describe(&e)));
    assert_ne!(job_row.state, "queued", "job {job} did not finish within a minute");
    job_row
}

/// The job queued on `object` to run `method`: its id and application.
pub fn job_on(c: &mut impl GenericClient, object: i64, method: &str) -> (i64, String) {
    c.query_one("SELECT job_id, app FROM lambdastore.jobs WHERE object_id = $1 AND method = $2", &[&object, &method])
        .map(|row| (row.get(0), row.get(1)))
        .unwrap_or_else(|e| panic!("the {method} job on {object}: {}", describe(&e)))
}

/// The node (host:port) holding `object`'s shard, from Citus' metadata.
pub fn owner(c: &mut impl GenericClient, object: i64) -> String {
    c.query_one(
        "SELECT n.nodename || ':' || n.nodeport
           FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
          WHERE p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', $1::bigint)",
        &[&object],
    )
    .unwrap()
    .get(0)
}

/// Jobs of `app` in `state`, or None while the server (or a node of a
/// cluster) cannot answer: the fault tests poll through restarts.
pub fn jobs_in_state(c: &mut Client, app: &str, state: &str) -> Option<i64> {
    c.query_one("SELECT count(*) FROM lambdastore.jobs WHERE app = $1 AND state = $2", &[&app, &state])
        .ok()
        .map(|row| row.get(0))
}

/// A micro `Bench` object after `n` `tally` calls with distinct tags: its
/// counter is `n` and each tag was counted exactly once.
pub fn assert_tallied_once(c: &mut Client, object: i64, n: i64) {
    let values = |c: &mut Client, field: &str| -> Vec<String> {
        c.query(
            "SELECT convert_from(value, 'UTF8') FROM lambdastore.entries WHERE object_id = $1 AND field = $2",
            &[&object, &field],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    assert_eq!(values(c, "count"), vec![n.to_string()], "the counter is not the number of tallies");
    let seen = values(c, "seen");
    assert_eq!(seen.len() as i64, n, "some tag was never counted");
    let twice: Vec<&String> = seen.iter().filter(|times| *times != "1").collect();
    assert!(twice.is_empty(), "tallies applied more than once: {twice:?}");
}
