//! Interrupting a lambda from outside, and PostgreSQL errors raised while a
//! lambda is on the stack.
//!
//! Isolated in their own test binary (cargo runs binaries one after
//! another) because done wrong they take the server down: a backend that
//! dies instead of exiting cleanly (a longjmp across wasm frames, an abort)
//! makes the postmaster restart every other backend, which would fail
//! unrelated tests running beside them.

mod common;

use common::*;
use postgres::Client;
use serde_json::json;
use std::path::PathBuf;

fn postmaster_start_time(c: &mut Client) -> String {
    c.query_one("SELECT pg_postmaster_start_time()::text", &[]).unwrap().get(0)
}

/// Runs `setup`, then `statement`, in a new session on the async client;
/// returns the session's pid at once, and the statement's outcome when it
/// ends. Not the blocking client: when the server ends a session with a
/// FATAL error, the error and the end of the connection often arrive
/// together, and the blocking client then reports the end ("connection
/// closed") and drops the error.
fn in_a_session_of_its_own(
    setup: &str,
    statement: &str,
) -> (i32, std::thread::JoinHandle<Result<Vec<tokio_postgres::Row>, postgres::Error>>) {
    let url = std::env::var("LAMBDASTORE_TEST_URL").expect("LAMBDASTORE_TEST_URL is set");
    let mut config: tokio_postgres::Config = url.parse().expect("LAMBDASTORE_TEST_URL is a libpq URL");
    config.dbname(DATABASE).application_name("lambdastore-tests");
    let (setup, statement) = (setup.to_string(), statement.to_string());
    let (pid_sender, pid) = std::sync::mpsc::channel();
    let session = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            client.batch_execute(&setup).await.unwrap();
            pid_sender.send(client.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0)).unwrap();
            client.query(&statement, &[]).await
        })
    });
    (pid.recv().expect("the session started"), session)
}

#[test]
fn terminating_a_running_lambda_ends_only_its_session() {
    let (mut c, app) = deployed("terminate", "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    let mut observer = connect();
    let started = postmaster_start_time(&mut observer);

    // Its first call (wait_until_running).
    let (pid, spinner) = in_a_session_of_its_own(
        "SET lambdastore.timeout = '60s'",
        &format!("SELECT lambda_invoke({id}, 'spin')::text /* terminate_me */"),
    );
    wait_until_running(&mut observer, pid, "terminate_me", &spinner);
    let terminated: bool = observer.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap().get(0);
    assert!(terminated);

    // 57P01: terminating connection due to administrator command.
    expect_sqlstate(spinner.join().unwrap(), "57P01");
    assert_eq!(postmaster_start_time(&mut observer), started, "the server restarted");
    // The observer's session survived, and runs lambdas.
    assert_eq!(call(&mut observer, id, "get", json!({"key": "k"})), json!(null));
}

#[test]
fn an_sql_error_inside_a_host_call_fails_only_the_statement() {
    // Another session holds the entries table locked, and this one waits
    // for a lock at most 100 ms: the lock timeout is raised inside the
    // host's `get`, while the guest is on the stack.
    let (mut c, app) = deployed("spi_error", "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    let started = postmaster_start_time(&mut c);
    let mut locker = connect();
    locker.batch_execute("BEGIN; LOCK TABLE lambdastore.entries IN ACCESS EXCLUSIVE MODE").unwrap();

    let mut tx = c.transaction().unwrap();
    let mut attempt = tx.transaction().unwrap(); // a savepoint
    attempt.batch_execute("SET LOCAL lock_timeout = '100ms'").unwrap();
    let message = expect_sqlstate(invoke(&mut attempt, id, "get", json!({"key": "k"})), "55P03");
    assert!(message.contains("lock timeout"), "{message}");
    attempt.rollback().unwrap();
    locker.batch_execute("ROLLBACK").unwrap();

    // Same session, same transaction, after ROLLBACK TO SAVEPOINT.
    assert_eq!(call(&mut tx, id, "get", json!({"key": "k"})), json!(null));
    tx.rollback().unwrap();
    assert_eq!(postmaster_start_time(&mut c), started, "the server restarted");
}

/// `make install` while a server runs: the server keeps the library it has
/// mapped. Rewriting lambdastore.so in place (as `cargo pgrx install` does)
/// changes the pages every process has mapped, and after a rebuild they
/// crash at their next call into it. So the install must put a new file in
/// place and leave the mapped one (its inode) alone.
#[test]
fn reinstalling_the_extension_leaves_a_running_server_alone() {
    use std::os::unix::fs::MetadataExt;
    let package = workspace().join("target/package");
    let pg_config = std::env::var("PG_CONFIG").unwrap_or("pg_config".into());
    let lib = std::process::Command::new(pg_config)
        .arg("--pkglibdir")
        .output()
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .unwrap_or_default();
    let probe = lib.join(".lambdastore-write-check");
    let writable = std::fs::File::create(&probe).is_ok() && std::fs::remove_file(&probe).is_ok();
    if !package.is_dir() || !writable {
        let why = format!(
            "needs a build from scripts/install.sh in {} and write access to {}",
            package.display(),
            lib.display()
        );
        // CI installs the extension first, so there the test must run.
        assert!(
            std::env::var_os("LAMBDASTORE_REQUIRE_INSTALL").is_none(),
            "LAMBDASTORE_REQUIRE_INSTALL is set but the test {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let library = lib.join("lambdastore.so");
    let mapped = std::fs::metadata(&library).unwrap().ino();
    let (mut c, app) = deployed("reinstall", "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    assert_eq!(call(&mut c, id, "get", json!({"key": "k"})), json!(null));
    let started = postmaster_start_time(&mut c);

    let status = std::process::Command::new(workspace().join("scripts/install.sh"))
        .arg("--no-build")
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run scripts/install.sh");
    assert!(status.success(), "scripts/install.sh --no-build failed");

    assert_ne!(
        std::fs::metadata(&library).unwrap().ino(),
        mapped,
        "the library the server runs was rewritten in place"
    );
    // The same session, and a new one, run lambdas; nothing restarted.
    assert_eq!(call(&mut c, id, "get", json!({"key": "k"})), json!(null));
    let mut fresh = connect();
    assert_eq!(call(&mut fresh, id, "get", json!({"key": "k"})), json!(null));
    assert_eq!(postmaster_start_time(&mut fresh), started, "the server restarted");
}
