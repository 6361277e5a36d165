//! The Citus cluster of tests/tests/citus.rs: a coordinator and two workers,
//! `lambdastore.distribute()` done. Either local processes, started by
//! `scripts/e2e-citus.sh` (scripts/citus.sh) and named by its environment,
//! or, without them, containers of the project's image
//! (`lambdastore/postgres:latest`, `scripts/docker.sh build node`) started
//! here with testcontainers when a Docker engine has that image. The tests
//! are the same either way; each test process says once which it got.
//!
//! Containers share the host's network and process namespace: the nodes
//! listen on 127.0.0.1, on ports free when the cluster starts
//! ([`free_ports`]), and register each other there, and a backend's
//! `pg_backend_pid()` is a pid the test may `kill -9` from the host. Their
//! names carry the run's name, so that two checkouts (or CI jobs) testing on
//! one machine at once do not meet. A test process never drops its statics,
//! so its containers outlive it: e2e-citus.sh removes its own after each
//! test process.

use crate::common::DATABASE;
use std::hash::{BuildHasher, RandomState};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use testcontainers::core::{CmdWaitFor, ExecCommand, WaitFor};
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

pub const IMAGE: (&str, &str) = ("lambdastore/postgres", "latest");

/// The containers are `lambdastore-citus-test-RUN-NODE`, RUN from
/// `LAMBDASTORE_CITUS_RUN` (e2e-citus.sh sets it, and reads their logs and
/// removes them by these names) or made up for this process, whose
/// containers are then left for whoever ran it (the line it prints names
/// them).
const NODES: [&str; 3] = ["coord", "w1", "w2"];

/// The API version bollard 0.20 (testcontainers' client) asks for.
const CLIENT_API: &str = "1.52";

pub struct Cluster {
    /// The workers' libpq URLs.
    pub workers: Vec<String>,
    /// A command that restarts a worker as a crash would (every process
    /// killed, the server recovering from its WAL), given the worker's name
    /// (w1, w2) as its last argument.
    pub crash: Option<Vec<String>>,
    /// What the cluster is, for the line each test process prints.
    how: String,
    /// Held for the process's life (a static is never dropped).
    _containers: Vec<Container<GenericImage>>,
}

/// The cluster, started on first use; None when there is none to be had.
pub fn citus() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            let cluster = local().or_else(containers);
            if let Some(cluster) = &cluster {
                eprintln!("Citus cluster: {}, workers {}", cluster.how, cluster.workers.join(", "));
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
        how: "local processes (scripts/citus.sh)".to_string(),
        _containers: Vec::new(),
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
    let run = std::env::var("LAMBDASTORE_CITUS_RUN")
        .unwrap_or_else(|_| format!("{:06x}", RandomState::new().hash_one(std::process::id()) & 0xff_ffff));
    let prefix = format!("lambdastore-citus-test-{run}");
    let names: Vec<String> = NODES.iter().map(|node| format!("{prefix}-{node}")).collect();
    // This run's own, should an earlier test process of it have left them.
    let mut leftovers = vec!["rm", "-f"];
    leftovers.extend(names.iter().map(String::as_str));
    docker(&leftovers);
    let ports = match std::env::var("LAMBDASTORE_CITUS_PORTS") {
        Ok(ports) => {
            ports.split(',').map(|port| port.trim().parse().expect("LAMBDASTORE_CITUS_PORTS: a port")).collect()
        }
        Err(_) => free_ports(NODES.len()),
    };
    assert_eq!(ports.len(), NODES.len(), "LAMBDASTORE_CITUS_PORTS names a port per node (coord,w1,w2)");

    // Started side by side: each waits for its server to be ready.
    let containers: Vec<_> = std::thread::scope(|scope| {
        let starting: Vec<_> = ports
            .iter()
            .zip(&names)
            .map(|(port, name)| {
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
                // A port taken since it was picked fails the start here.
                scope.spawn(move || request.start().unwrap_or_else(|e| panic!("starting {name} on port {port}: {e}")))
            })
            .collect();
        starting.into_iter().map(|thread| thread.join().expect("a container did not start")).collect()
    });
    let addresses: Vec<String> = ports.iter().map(|port| format!("127.0.0.1:{port}")).collect();
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
    std::env::set_var("LAMBDASTORE_TEST_URL", url(ports[0]));
    // SIGQUIT is PostgreSQL's immediate shutdown: the postmaster kills every
    // process and exits, and with it the container; started again, the
    // server recovers from its WAL. $1 is the containers' prefix, $2 the
    // worker; the server listens on the same port again.
    let crash = "c=$1-$2; docker kill --signal QUIT $c >/dev/null \
                 && docker wait $c >/dev/null \
                 && docker start $c >/dev/null || exit 1; \
                 deadline=$(($(date +%s) + 60)); \
                 until docker exec $c sh -c 'pg_isready -q -h 127.0.0.1 -p $LAMBDASTORE_PORT'; do \
                   [ $(date +%s) -lt $deadline ] || { echo \"$2 is not ready 60 s after its start\" >&2; exit 1; }; \
                   sleep 0.1; \
                 done";
    Some(Cluster {
        workers: ports[1..].iter().map(|port| url(*port)).collect(),
        crash: Some(["sh", "-c", crash, "sh", &prefix].map(str::to_string).to_vec()),
        how: format!("containers {prefix}-{} of {}:{} (testcontainers)", NODES.join("/"), IMAGE.0, IMAGE.1),
        _containers: containers,
    })
}

/// `n` ports free on 127.0.0.1 now, picked as the compose test picks its
/// own (`scripts/docker.sh free-ports`, which says from where and the race
/// that remains); `LAMBDASTORE_CITUS_PORTS` settles a lost race.
fn free_ports(n: usize) -> Vec<u16> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/docker.sh");
    let output = Command::new(script).args(["free-ports", &n.to_string()]).output().expect("running docker.sh");
    assert!(output.status.success(), "docker.sh free-ports {n}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().split(',').map(|port| port.parse().expect("a port")).collect()
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
