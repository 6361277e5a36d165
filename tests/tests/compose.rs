//! docker-compose.yml brought up for real by `scripts/e2e-compose.sh`
//! (`make test-compose`): the forum application the init deployed, used
//! over HTTP through the gateway container, with calls on the worker
//! containers holding their objects, and a worker container killed and
//! started again. The script passes the gateway's address
//! (`LAMBDASTORE_COMPOSE_GATEWAY`), the API key the init printed
//! (`LAMBDASTORE_COMPOSE_KEY`), the nodes' libpq URLs
//! (`LAMBDASTORE_COMPOSE_URL`, `LAMBDASTORE_COMPOSE_WORKER_URLS`: worker1,
//! worker2) and its compose command (`LAMBDASTORE_COMPOSE`). Without them the
//! tests skip with one line. They run one at a time (one kills a worker).

mod common;

use common::count;
use postgres::{Client, NoTls};
use reqwest::blocking::Client as Http;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

struct Cluster {
    http: Http,
    gateway: String,
    key: String,
    coordinator: Client,
    /// worker1 and worker2, as the compose file names them, with the address
    /// Citus knows each by.
    workers: Vec<(&'static str, String, Client)>,
    compose: Vec<String>,
}

fn cluster() -> Option<Cluster> {
    let Ok(gateway) = std::env::var("LAMBDASTORE_COMPOSE_GATEWAY") else {
        eprintln!("skipped: no compose cluster (run `make test-compose`)");
        return None;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let connect = |url: &str| url.parse::<postgres::Config>().unwrap().connect(NoTls).expect("connect to a node");
    let workers = var("LAMBDASTORE_COMPOSE_WORKER_URLS")
        .split(',')
        .zip(["worker1", "worker2"])
        .map(|(url, service)| {
            let mut c = connect(url);
            let node = c.query_one("SELECT lambdastore.node()", &[]).unwrap().get(0);
            (service, node, c)
        })
        .collect();
    Some(Cluster {
        http: Http::builder().timeout(Duration::from_secs(30)).build().unwrap(),
        gateway,
        key: var("LAMBDASTORE_COMPOSE_KEY"),
        coordinator: connect(&var("LAMBDASTORE_COMPOSE_URL")),
        workers,
        compose: var("LAMBDASTORE_COMPOSE").split_whitespace().map(str::to_string).collect(),
    })
}

impl Cluster {
    /// POST to the gateway with the forum's key: the status and the body.
    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.gateway))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = response.status().as_u16();
        (status, response.json().unwrap_or(Value::Null))
    }

    #[track_caller]
    fn create(&self, ty: &str, args: Value) -> i64 {
        let (status, body) = self.post(&format!("/v1/apps/forum/types/{ty}/objects"), args);
        assert_eq!(status, 201, "create {ty}: {body}");
        body["object_id"].as_i64().unwrap()
    }

    #[track_caller]
    fn call(&self, object: i64, method: &str, args: Value) -> Value {
        let (status, body) = self.post(&format!("/v1/objects/{object}/methods/{method}"), args);
        assert_eq!(status, 200, "{method} on {object}: {body}");
        body["result"].clone()
    }

    /// The node (host:port) holding `object`, from Citus' metadata.
    fn owner(&mut self, object: i64) -> String {
        common::owner(&mut self.coordinator, object)
    }

    /// Objects of `ty` made through the gateway until each worker holds
    /// `per_node` of them, by worker (where an object lives follows from its id).
    fn spread(&mut self, ty: &str, args: Value, per_node: usize) -> BTreeMap<String, Vec<i64>> {
        let mut by_node: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for _ in 0..200 {
            let id = self.create(ty, args.clone());
            by_node.entry(self.owner(id)).or_default().push(id);
            if by_node.len() == self.workers.len() && by_node.values().all(|ids| ids.len() >= per_node) {
                return by_node;
            }
        }
        panic!("200 objects of {ty} did not give every worker {per_node}: {by_node:?}");
    }

    /// A community and two accounts on each worker.
    fn forum_per_worker(&mut self) -> BTreeMap<String, (i64, Vec<i64>)> {
        let communities = self.spread("Community", json!({"name": "compose"}), 1);
        let mut accounts = self.spread("Account", json!({"name": "tester"}), 2);
        communities
            .into_iter()
            .map(|(node, ids)| {
                let two = accounts.remove(&node).unwrap()[..2].to_vec();
                (node, (ids[0], two))
            })
            .collect()
    }

    /// Each account of `accounts` comments `rounds` times on `thread`.
    fn comment(&self, thread: i64, accounts: &[i64], rounds: usize) {
        for round in 0..rounds {
            for &account in accounts {
                self.call(account, "add_comment", json!({"thread": thread, "text": format!("round {round}")}));
            }
        }
    }

    fn compose(&self, args: &[&str]) {
        let status = Command::new(&self.compose[0]).args(&self.compose[1..]).args(args).status().unwrap();
        assert!(status.success(), "{} {}", self.compose.join(" "), args.join(" "));
    }
}

/// Committed top-level calls of the forum's `function` on the node `c` is
/// connected to (`lambdastore.stats`; nested calls are not counted).
fn commits(c: &mut Client, function: &str) -> i64 {
    count(c, &format!("SELECT coalesce(sum(commits), 0)::bigint FROM lambdastore.stats WHERE app = 'forum' AND function = '{function}' AND node = lambdastore.node()"))
}

/// A thread on each worker, started by one of its accounts in the other
/// worker's community (the community's index is on the other node), by node.
fn threads(cluster: &Cluster, forum: &BTreeMap<String, (i64, Vec<i64>)>) -> BTreeMap<String, i64> {
    let nodes: Vec<&String> = forum.keys().collect();
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let (author, community) = (forum[*node].1[0], forum[nodes[1 - i]].0);
            let thread =
                cluster.call(author, "create_thread", json!({"community": community, "title": "t", "text": "x"}));
            ((*node).clone(), thread.as_i64().unwrap())
        })
        .collect()
}

fn everyone(forum: &BTreeMap<String, (i64, Vec<i64>)>) -> Vec<i64> {
    forum.values().flat_map(|(_, accounts)| accounts.iter().copied()).collect()
}

#[test]
fn the_forum_runs_through_the_gateway_with_every_call_on_its_objects_worker() {
    let Some(mut cluster) = cluster() else { return };
    let forum = cluster.forum_per_worker();
    let before: Vec<i64> = cluster.workers.iter_mut().map(|(_, _, c)| commits(c, "add_comment")).collect();
    let on_coordinator = commits(&mut cluster.coordinator, "add_comment");

    let threads = threads(&cluster, &forum);
    for (node, &thread) in &threads {
        assert_eq!(&cluster.owner(thread), node, "a thread lives with the account that started it");
        // Two of the four accounts are on the other worker: their nested
        // calls to the thread cross nodes.
        cluster.comment(thread, &everyone(&forum), 3);
        let view = cluster.call(thread, "get_thread", json!({}));
        assert_eq!(view["comment_count"], json!(12), "{view}");
        assert_eq!(view["comments"][11]["text"], json!("round 2"));
        let community = view["community"].as_i64().unwrap();
        let listed = cluster.call(community, "list_threads", json!({}));
        assert_eq!(listed[0]["id"], json!(thread), "the community on the other worker indexes the thread");
    }

    // Every add_comment ran, and was counted, on the worker holding its
    // account: two accounts, two threads, three rounds.
    for ((_, node, c), before) in cluster.workers.iter_mut().zip(before) {
        assert_eq!(commits(c, "add_comment") - before, 12, "add_comment calls run on {node}");
    }
    assert_eq!(commits(&mut cluster.coordinator, "add_comment"), on_coordinator, "the coordinator ran calls itself");
}

#[test]
fn a_killed_worker_container_comes_back_with_every_committed_comment() {
    let Some(mut cluster) = cluster() else { return };
    let forum = cluster.forum_per_worker();
    let threads = threads(&cluster, &forum);
    for &thread in threads.values() {
        cluster.comment(thread, &everyone(&forum), 5);
    }
    let (service, killed) = (cluster.workers[0].0, cluster.workers[0].1.clone());
    let other = threads.keys().find(|node| **node != killed).unwrap().clone();

    // SIGKILL to every process of the worker: nothing is flushed or shut
    // down; committed transactions are in its WAL (synchronous_commit).
    cluster.compose(&["kill", service]);
    // The other worker serves its own accounts' calls to its own objects
    // meanwhile.
    cluster.comment(threads[&other], &forum[&other].1, 1);
    cluster.compose(&["start", service]);

    // Back within a minute (the gateway retries the 40001s of a node that
    // has just recovered), with all twenty comments.
    let thread = threads[&killed];
    let deadline = Instant::now() + Duration::from_secs(60);
    let view = loop {
        let (status, body) = cluster.post(&format!("/v1/objects/{thread}/methods/get_thread"), json!({}));
        if status == 200 {
            break body["result"].clone();
        }
        assert!(Instant::now() < deadline, "{service} does not answer 60 s after its start: {status} {body}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(view["comment_count"], json!(20), "comments were lost: {view}");
    cluster.comment(thread, &everyone(&forum), 1);
    assert_eq!(cluster.call(thread, "get_thread", json!({}))["comment_count"], json!(24));
    assert_eq!(cluster.call(threads[&other], "get_thread", json!({}))["comment_count"], json!(22));
}
