//! A logical backup of a cluster (issue 42): `pg_dump` of the
//! coordinator's database holds every row of the distributed tables (Citus
//! answers the dump's COPY from the shards), and it restores into a
//! database of a cluster: the database and `citus` on every node, the
//! workers added, `pg_restore` on the coordinator (the tables come back
//! as local tables with their rows), then `lambdastore.distribute()`,
//! which spreads the rows over the workers' shards.

use super::{cluster, node, spread, workers};
use crate::common::*;
use postgres::{Client, NoTls};
use serde_json::json;
use std::process::Command;

/// A database named `name` on every node, dropped at the end.
struct ClusterDatabase {
    name: String,
    nodes: Vec<String>,
}

impl ClusterDatabase {
    fn new(name: String, nodes: Vec<String>) -> ClusterDatabase {
        for url in &nodes {
            let mut admin = node_database(url, "postgres");
            admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
            admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
            node_database(url, &name)
                .batch_execute("SET client_min_messages = warning; CREATE EXTENSION citus")
                .unwrap();
        }
        ClusterDatabase { name, nodes }
    }
}

impl Drop for ClusterDatabase {
    fn drop(&mut self) {
        for url in &self.nodes {
            if let Ok(mut admin) = try_node_database(url, "postgres") {
                let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
            }
        }
    }
}

fn try_node_database(url: &str, database: &str) -> Result<Client, postgres::Error> {
    let mut config: postgres::Config = url.parse().expect("a libpq URL");
    config.dbname(database).connect(NoTls)
}

fn node_database(url: &str, database: &str) -> Client {
    try_node_database(url, database).unwrap_or_else(|e| panic!("connect to {database} at {url}: {e}"))
}

/// host and port of a libpq URL.
fn host_port(url: &str) -> (String, i32) {
    let config: postgres::Config = url.parse().expect("a libpq URL");
    let host = match &config.get_hosts()[0] {
        postgres::config::Host::Tcp(host) => host.clone(),
        postgres::config::Host::Unix(path) => path.display().to_string(),
    };
    (host, config.get_ports().first().copied().unwrap_or(5432) as i32)
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The state of `app`'s objects: (id, type, fields) in id order.
fn objects_of(c: &mut Client, app: &str) -> Vec<(i64, String, String)> {
    c.query(
        "SELECT o.object_id, o.type_name, coalesce(string_agg(e.field || '/' || encode(e.key, 'hex') || '=' || encode(e.value, 'hex'), ',' ORDER BY e.field, e.key), '')
           FROM lambdastore.objects o LEFT JOIN lambdastore.entries e USING (object_id)
          WHERE o.app = $1 GROUP BY 1, 2 ORDER BY 1",
        &[&app],
    )
    .unwrap()
    .iter()
    .map(|row| (row.get(0), row.get(1), row.get(2)))
    .collect()
}

#[test]
fn a_dump_of_the_coordinator_restores_into_a_new_database_of_the_cluster() {
    let Some(_) = workers() else { return };
    let cluster = cluster::citus().unwrap();
    let coordinator_url = std::env::var("LAMBDASTORE_TEST_URL").unwrap();
    let (mut c, app) = deployed("dump", "counter");
    let by_node = spread(&mut c, &app, "Counter", json!({}), 2);
    let counters: Vec<i64> = by_node.values().flatten().copied().collect();
    for (i, &id) in counters.iter().enumerate() {
        for _ in 0..=i {
            call(&mut c, id, "increment", json!({}));
        }
    }
    let job = submit(&mut c, counters[0], "increment", json!({}), Some("dump-job")).unwrap();
    assert_eq!(finished(&mut c, job).state, "done");
    let key: String = c.query_one("SELECT api_key FROM lambdastore.create_api_key($1)", &[&app]).unwrap().get(0);
    let before = objects_of(&mut c, &app);
    assert_eq!(before.len(), counters.len());

    let dump = std::env::temp_dir().join(format!("lambdastore_citus_dump_{}", std::process::id()));
    let dump = dump.to_str().unwrap();
    let source = format!("{coordinator_url} dbname={DATABASE}");
    run("pg_dump", &["-d", &source, "--format", "custom", "--file", dump]);

    // The restore's cluster: a new database on every node, citus in each,
    // the workers added, then the dump, then distribute().
    let name = format!("lambdastore_restored_{}", std::process::id());
    let mut nodes = vec![coordinator_url.clone()];
    nodes.extend(cluster.workers.iter().cloned());
    let restored = ClusterDatabase::new(name.clone(), nodes);
    let mut r = node_database(&coordinator_url, &restored.name);
    let (host, port) = host_port(&coordinator_url);
    r.execute("SELECT citus_set_coordinator_host($1, $2)", &[&host, &port]).unwrap();
    for worker in &cluster.workers {
        let (host, port) = host_port(worker);
        r.execute("SELECT citus_add_node($1, $2)", &[&host, &port]).unwrap();
    }
    let target = format!("{coordinator_url} dbname={name}");
    run("pg_restore", &["-d", &target, "--exit-on-error", dump]);
    let _ = std::fs::remove_file(dump);
    let mut r = node_database(&coordinator_url, &name);
    r.batch_execute("SET client_min_messages = warning").unwrap();
    r.query_one("SELECT lambdastore.distribute()", &[]).unwrap();

    assert_eq!(objects_of(&mut r, &app), before, "the restored objects and entries differ");
    // Calls run on the object's new owner, wherever distribute() put it.
    for (i, &id) in counters.iter().enumerate() {
        let expected = i as i64 + 1 + i64::from(i == 0); // the job's increment on the first
        assert_eq!(call(&mut r, id, "get", json!({})), json!(expected), "counter {id}");
        assert_eq!(call(&mut r, id, "increment", json!({})), json!(expected + 1), "counter {id}");
    }
    let owners: std::collections::BTreeSet<String> = counters.iter().map(|&id| owner(&mut r, id)).collect();
    assert!(owners.len() > 1, "the restored objects are all on {owners:?}");
    // An id has its node's group in the top 16 bits, its node's sequence
    // below: every node's sequence is past every restored id's.
    let drawn = |id: i64| id & ((1 << 48) - 1);
    let fresh = create(&mut r, &app, "Counter", json!({}));
    assert!(
        drawn(fresh) > counters.iter().copied().map(drawn).max().unwrap(),
        "a new object got id {fresh}, not after the restored ones ({counters:?})"
    );
    let app_of_key: String = r.query_one("SELECT lambdastore._api_key_app($1)", &[&key]).unwrap().get(0);
    assert_eq!(app_of_key, app);
    let same = submit(&mut r, counters[0], "increment", json!({}), Some("dump-job")).unwrap();
    assert_eq!(same, job, "the job's idempotency key names another job after the restore");
    // A worker of the restored database serves a call on an object it holds.
    let holder = owner(&mut r, counters[1]);
    let worker = cluster.workers.iter().find(|url| {
        let (host, port) = host_port(url);
        format!("{host}:{port}") == holder
    });
    let mut w = node_database(worker.expect("the owner is a worker"), &name);
    assert_eq!(node(&mut w), holder);
    assert_eq!(call(&mut w, counters[1], "get", json!({})), json!(3));
}
