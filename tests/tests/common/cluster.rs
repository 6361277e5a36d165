//! The Citus cluster of tests/tests/citus.rs: a coordinator and two workers,
//! `lambdastore.distribute()` done. Either local processes, started by
//! `scripts/e2e-citus.sh` (scripts/citus.sh) and named by its environment,
//! or, without them, containers of the project's image
//! (`lambdastore/postgres:latest`, `scripts/docker.sh build node`) started
//! here with testcontainers when a Docker engine has that image. The tests
//! are the same either way; each test process says once which it got.
//!
//! Containers share the host's network and process namespace: the nodes
//! listen on 127.0.0.1 (ports 54370–54372) and register each other there,
//! and a backend's `pg_backend_pid()` is a pid the test may `kill -9` from
//! the host. A test process never drops its statics, so its containers
//! outlive it: the next start removes them first, and e2e-citus.sh removes
//! them after each run.

use crate::common::DATABASE;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use testcontainers::core::{CmdWaitFor, ExecCommand, WaitFor};
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

pub const IMAGE: (&str, &str) = ("lambdastore/postgres", "latest");

/// The containers' names are `lambdastore-citus-test-NODE`; e2e-citus.sh
/// reads their logs and removes them by these names.
const NODES: [(&str, u16); 3] = [("coord", 54370), ("w1", 54371), ("w2", 54372)];

/// The API version bollard 0.20 (testcontainers' client) asks for.
const CLIENT_API: &str = "1.52";

pub struct Cluster {
    /// The workers' libpq URLs.
    pub workers: Vec<String>,
    /// A command that restarts a worker as a crash would (every process
    /// killed, the server recovering from its WAL), given the worker's name
    /// (w1, w2) as its last argument.
    pub crash: Option<Vec<String>>,
    containers: Vec<Container<GenericImage>>,
}

/// The cluster, started on first use; None when there is none to be had.
pub fn citus() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            let cluster = local().or_else(containers);
            if let Some(cluster) = &cluster {
                let how = if cluster.containers.is_empty() {
                    "local processes (scripts/citus.sh)".to_string()
                } else {
                    format!("containers of {}:{} (testcontainers)", IMAGE.0, IMAGE.1)
                };
                eprintln!("Citus cluster: {how}, workers {}", cluster.workers.join(", "));
            }
            cluster
        })
        .as_ref()
}

/// The cluster scripts/e2e-citus.sh started, from its environment.
fn local() -> Option<Cluster> {
    let urls = std::env::var("LAMBDASTORE_CITUS_WORKER_URLS").ok()?;
    let crash = std::env::var("LAMBDASTORE_CITUS_CRASH").ok();
    Some(Cluster {
        workers: urls.split(',').map(str::to_string).collect(),
        crash: crash.map(|command| command.split_whitespace().map(str::to_string).collect()),
        containers: Vec::new(),
    })
}

fn docker(args: &[&str]) -> Option<String> {
    let output = Command::new("docker").args(args).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// A cluster of containers, when scripts/e2e-citus.sh asks for them
/// (LAMBDASTORE_CITUS_CLUSTER=docker: it runs the fault test alone), an
/// engine answers and has the image. Elsewhere (scripts/e2e.sh runs every
/// test binary) the Citus tests skip.
fn containers() -> Option<Cluster> {
    if std::env::var("LAMBDASTORE_CITUS_CLUSTER").as_deref() != Ok("docker") {
        return None;
    }
    docker(&["image", "inspect", "--format", "{{.Id}}", &format!("{}:{}", IMAGE.0, IMAGE.1)])?;
    let engine_api = docker(&["version", "--format", "{{.Server.APIVersion}}"])?;
    if version(&engine_api) < version(CLIENT_API) {
        std::env::set_var("DOCKER_HOST", relay(&engine_api));
    }
    let names: Vec<String> = NODES.iter().map(|(node, _)| format!("lambdastore-citus-test-{node}")).collect();
    let mut leftovers = vec!["rm", "-f"];
    leftovers.extend(names.iter().map(String::as_str));
    docker(&leftovers);

    // Started side by side: each waits for its server to be ready.
    let containers: Vec<_> = std::thread::scope(|scope| {
        let starting: Vec<_> = NODES
            .iter()
            .zip(&names)
            .map(|((_, port), name)| {
                let request = GenericImage::new(IMAGE.0, IMAGE.1)
                    .with_wait_for(WaitFor::message_on_stderr("database system is ready to accept connections"))
                    .with_container_name(name)
                    .with_network("host")
                    .with_host_config_modifier(|config| config.pid_mode = Some("host".to_string()))
                    .with_env_var("LAMBDASTORE_PORT", port.to_string())
                    .with_env_var("LAMBDASTORE_DATABASE", DATABASE)
                    // A disposable cluster, as scripts/cluster.sh makes them.
                    .with_cmd(["-c", "fsync=off", "-c", "full_page_writes=off"])
                    .with_startup_timeout(Duration::from_secs(60));
                scope.spawn(move || request.start().unwrap_or_else(|e| panic!("starting {name}: {e}")))
            })
            .collect();
        starting.into_iter().map(|thread| thread.join().expect("a container did not start")).collect()
    });
    let addresses: Vec<String> = NODES.iter().map(|(_, port)| format!("127.0.0.1:{port}")).collect();
    let mut init = containers[0]
        .exec(
            ExecCommand::new(["lambdastore-init", "cluster"])
                .with_env_vars([
                    ("LAMBDASTORE_COORDINATOR", addresses[0].clone()),
                    ("LAMBDASTORE_WORKERS", addresses[1..].join(",")),
                    ("LAMBDASTORE_DATABASE", DATABASE.to_string()),
                ])
                .with_cmd_ready_condition(CmdWaitFor::exit()),
        )
        .expect("lambdastore-init cluster");
    if init.exit_code().unwrap() != Some(0) {
        panic!("lambdastore-init cluster failed: {}", String::from_utf8_lossy(&init.stderr_to_vec().unwrap()));
    }

    // The shared helpers (tests/tests/common) connect to the coordinator.
    let url = |port: u16| format!("host=127.0.0.1 port={port} user=postgres");
    std::env::set_var("LAMBDASTORE_TEST_URL", url(NODES[0].1));
    // SIGQUIT is PostgreSQL's immediate shutdown: the postmaster kills every
    // process and exits, and with it the container; started again, the
    // server recovers from its WAL.
    let crash = "docker kill --signal QUIT lambdastore-citus-test-$1 >/dev/null \
                 && docker wait lambdastore-citus-test-$1 >/dev/null \
                 && docker start lambdastore-citus-test-$1 >/dev/null || exit 1; \
                 deadline=$(($(date +%s) + 60)); \
                 until docker exec lambdastore-citus-test-$1 sh -c 'pg_isready -q -h 127.0.0.1 -p $LAMBDASTORE_PORT'; do \
                   [ $(date +%s) -lt $deadline ] || { echo \"$1 is not ready 60 s after its start\" >&2; exit 1; }; \
                   sleep 0.1; \
                 done";
    Some(Cluster {
        workers: NODES[1..].iter().map(|(_, port)| url(*port)).collect(),
        crash: Some(["sh", "-c", crash, "sh"].map(str::to_string).to_vec()),
        containers,
    })
}

fn version(text: &str) -> (u32, u32) {
    let (major, minor) = text.split_once('.').unwrap_or((text, "0"));
    (major.parse().unwrap_or(0), minor.parse().unwrap_or(0))
}

/// testcontainers' client (bollard) asks for the API version it was built
/// for, without negotiating, and an engine refuses a version newer than its
/// own ("client version 1.52 is too new"): Debian 12's Docker 20.10 speaks
/// 1.41. For such an engine, testcontainers talks to this relay, which passes
/// every byte through but the version in each request's path
/// (`POST /v1.52/containers/create` becomes `POST /v1.41/containers/create`).
/// The calls the cluster needs (create, start, logs, exec, inspect) are all
/// in 1.41. Returns the relay's address, for `DOCKER_HOST`.
fn relay(engine_api: &str) -> String {
    let engine = match std::env::var("DOCKER_HOST") {
        Ok(host) => host.strip_prefix("unix://").expect("DOCKER_HOST names a unix socket").to_string(),
        Err(_) => "/var/run/docker.sock".to_string(),
    };
    let path = std::env::temp_dir().join(format!("lambdastore-docker-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).expect("bind the Docker API relay");
    let to = format!("/v{engine_api}/").into_bytes();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let (engine, to) = (engine.clone(), to.clone());
            std::thread::spawn(move || pass(client, &engine, &to));
        }
    });
    format!("unix://{}", path.display())
}

fn pass(mut client: UnixStream, engine: &str, to: &[u8]) -> std::io::Result<()> {
    let mut engine = UnixStream::connect(engine)?;
    let (mut from_engine, mut to_client) = (engine.try_clone()?, client.try_clone()?);
    std::thread::spawn(move || std::io::copy(&mut from_engine, &mut to_client));
    let (mut buffer, mut pending) = (vec![0; 64 * 1024], Vec::new());
    loop {
        let read = client.read(&mut buffer)?;
        if read == 0 {
            engine.write_all(&pending)?;
            return engine.shutdown(std::net::Shutdown::Write);
        }
        pending.extend_from_slice(&buffer[..read]);
        let (rewritten, held) = rewrite(&pending, to);
        engine.write_all(&rewritten)?;
        pending.drain(..pending.len() - held);
    }
}

/// `data` with every ` /vMAJOR.MINOR/` made ` {to}`, and how many bytes at
/// its end could begin one (they wait for the next read).
fn rewrite(data: &[u8], to: &[u8]) -> (Vec<u8>, usize) {
    const START: &[u8] = b" /v";
    let mut out = Vec::with_capacity(data.len());
    let mut at = 0;
    while at < data.len() {
        let rest = &data[at..];
        if rest.len() < START.len() && START.starts_with(rest) {
            return (out, rest.len());
        }
        if rest.starts_with(START) {
            let version = rest[START.len()..].iter().take_while(|b| b.is_ascii_digit() || **b == b'.').count();
            match rest.get(START.len() + version) {
                None => return (out, rest.len()),
                Some(b'/') if version > 0 => {
                    out.push(b' ');
                    out.extend_from_slice(to);
                    at += START.len() + version + 1;
                    continue;
                }
                Some(_) => {}
            }
        }
        out.push(data[at]);
        at += 1;
    }
    (out, 0)
}
