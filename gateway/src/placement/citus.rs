//! Routing on a Citus cluster: each call on an object goes to the node
//! holding the object's shard, over a pool per node; calls that name no
//! object go to the `--database-url` node (the coordinator).
//!
//! The shard map is `lambdastore.objects`' rows of `pg_dist_shard` (hash
//! ranges, uneven once a tenant was isolated), `pg_dist_placement` and
//! `pg_dist_node`, read on the `--database-url` node with the extension's
//! own query (`lambdastore_core::cluster::shards::SHARD_MAP`); every role
//! may read those catalogs. An object's shard is the range holding Citus' hash of
//! its id (`lambdastore_core::cluster::shards`, shared with the extension).
//!
//! The map goes stale when a shard moves. A call on a node that no longer
//! holds its object still succeeds (the node forwards it to the owner, in
//! the same transaction), so staleness is detected, not guessed: a call
//! routed by the map also asks the node, in the same statement, whether it
//! holds the object's shard (`with_check`). A "no", or a node that refuses
//! connections, reloads the map once for all the calls that saw the same
//! map (`refresh`), and the next call goes where the new map says.
//!
//! An object with light replicas (`lambdastore.add_light_replica`) has its
//! calls spread over its owner and them, in turn: a replica runs them on
//! its copy. The replicas are read every `REPLICAS_EVERY`; a call sent to
//! one is not checked (the replica does not hold the object, and runs the
//! call or sends it on).

use super::{Placement, Refresh, Stale, Target};
use crate::config::{Config, Misplace};
use deadpool_postgres::Pool;
use lambdastore_core::cluster::shards;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The least time between two reloads: a node that keeps refusing
/// connections, or metadata that keeps disagreeing, does not turn every
/// call into a reload (the calls still run: forwarded, or 503).
const RELOAD_FLOOR: Duration = Duration::from_secs(1);

/// How often the light replicas are read again.
const REPLICAS_EVERY: Duration = Duration::from_secs(2);

/// The replicas, by object: the nodes' names.
type Replicas = HashMap<i64, Vec<Arc<str>>>;

/// The `--database-url` node's own name in the metadata.
const ENTRY: &str = "
    SELECT n.nodename::text, n.nodeport FROM pg_dist_node n JOIN pg_dist_local_group g USING (groupid)
     WHERE n.noderole = 'primary'";

/// `sql`, one row, with a last column saying whether the node that ran it
/// holds the shard of the object in parameter `$n`, as the extension there
/// says after the call (`lambdastore.holds`, from the backend's copy of
/// the metadata, re-read after every move). The call runs first (a
/// function scan), so a node that forwarded it still answers.
pub fn with_check(sql: &str, n: usize) -> String {
    format!("SELECT q.*, lambdastore_gateway.holds(${n}) FROM ({sql}) q")
}

/// One hash range of `lambdastore.objects` and the node holding it.
struct Shard {
    min: i32,
    max: i32,
    node: usize,
}

/// A copy of the metadata, replaced whole by a reload.
struct Map {
    /// Counts reloads: a refresh asked with an older map's targets finds
    /// the map reloaded already and does nothing.
    generation: u64,
    /// By `min`; a range whose node is not active is missing.
    shards: Vec<Shard>,
    /// The nodes holding shards, and the entry node (`--database-url`).
    nodes: Vec<Target>,
    entry: usize,
}

impl Map {
    fn target(&self, object: i64) -> Option<&Target> {
        let at = shards::range_of(&self.shards, |s| (s.min, s.max), object)?;
        Some(&self.nodes[self.shards[at].node])
    }
}

pub struct Citus {
    config: Config,
    entry: Pool,
    map: RwLock<Arc<Map>>,
    /// Held while reloading: concurrent refreshes wait, then see the new
    /// map. Holds when the last reload started.
    reloading: tokio::sync::Mutex<Option<Instant>>,
    replicas: Arc<RwLock<Arc<Replicas>>>,
    /// Whose turn it is among an object's owner and replicas.
    turn: AtomicUsize,
}

impl Citus {
    /// The placement for `entry`'s cluster, or None when `entry` is not a
    /// Citus node with lambdastore's objects distributed.
    pub async fn load(config: &Config, entry: Pool) -> anyhow::Result<Option<Citus>> {
        let Some(mut map) = read(config, &entry, None).await? else { return Ok(None) };
        if let Some(misplace) = config.misplace_for_tests {
            spoil(config, &mut map, misplace)?;
        }
        let shards = map.shards.len();
        let nodes: Vec<&str> = map.nodes.iter().map(|n| &*n.node).collect();
        tracing::info!(shards, ?nodes, entry = &*map.nodes[map.entry].node, "routing calls by Citus' shard map");
        let replicas = Arc::new(RwLock::new(Arc::new(read_replicas(&entry).await)));
        tokio::spawn(keep_reading_replicas(entry.clone(), Arc::downgrade(&replicas)));
        Ok(Some(Citus {
            config: config.clone(),
            entry,
            map: RwLock::new(Arc::new(map)),
            reloading: tokio::sync::Mutex::new(None),
            replicas,
            turn: AtomicUsize::new(0),
        }))
    }

    /// The node that takes this call of `object`, whose owner is `owner`:
    /// the owner or, in turn, one of its light replicas.
    fn spread(&self, map: &Map, object: i64, owner: &Target) -> Target {
        let replicas = self.replicas.read().expect("the replicas lock is never poisoned").clone();
        let Some(nodes) = replicas.get(&object) else { return owner.clone() };
        let turn = self.turn.fetch_add(1, Ordering::Relaxed) % (nodes.len() + 1);
        let replica = turn.checked_sub(1).and_then(|i| map.nodes.iter().find(|n| n.node == nodes[i]));
        match replica {
            Some(node) => Target { map: None, ..node.clone() },
            None => owner.clone(),
        }
    }

    fn current(&self) -> Arc<Map> {
        self.map.read().expect("the map lock is never poisoned").clone()
    }
}

impl Placement for Citus {
    fn distributed(&self) -> bool {
        true
    }

    fn route(&self, object: Option<i64>) -> Target {
        let map = self.current();
        match object.and_then(|object| Some((object, map.target(object)?))) {
            Some((object, owner)) => self.spread(&map, object, owner),
            // No object, or its range has no active node: the entry node
            // forwards or reports it.
            None => Target { map: None, ..map.nodes[map.entry].clone() },
        }
    }

    fn pools(&self) -> Vec<(Arc<str>, Pool)> {
        self.current().nodes.iter().map(|n| (n.node.clone(), n.pool.clone())).collect()
    }

    fn refresh(&self, target: &Target, why: Stale) -> Refresh<'_> {
        let seen = target.map;
        let node = target.node.clone();
        Box::pin(async move {
            let Some(seen) = seen else { return };
            let mut last = self.reloading.lock().await;
            let old = self.current();
            if old.generation != seen {
                return; // reloaded since that target was chosen
            }
            if last.is_some_and(|at| at.elapsed() < RELOAD_FLOOR) {
                tracing::debug!(reason = why.label(), %node, "the shard map was reloaded less than a second ago");
                return;
            }
            *last = Some(Instant::now());
            metrics::counter!("lambdastore_gateway_placement_refreshes_total", "reason" => why.label()).increment(1);
            match read(&self.config, &self.entry, Some(&old)).await {
                Ok(Some(map)) => {
                    tracing::info!(reason = why.label(), %node, generation = map.generation, "reloaded the shard map");
                    *self.map.write().expect("the map lock is never poisoned") = Arc::new(map);
                }
                Ok(None) => tracing::warn!("lambdastore.objects is no longer distributed: keeping the shard map"),
                Err(err) => tracing::warn!(error = %err, "reloading the shard map failed: keeping it"),
            }
        })
    }
}

/// The light replicas, read through `entry` (none when the extension
/// there has no such function yet, or the read fails: calls go to owners).
async fn read_replicas(entry: &Pool) -> Replicas {
    let rows = match entry.get().await {
        Ok(client) => client.query("SELECT object_id, node FROM lambdastore_gateway.light_replicas()", &[]).await,
        Err(err) => {
            tracing::debug!(error = %err, "no connection to read the light replicas");
            return Replicas::new();
        }
    };
    let mut replicas = Replicas::new();
    match rows {
        Ok(rows) => {
            for row in rows {
                replicas.entry(row.get(0)).or_default().push(row.get::<_, String>(1).into());
            }
        }
        Err(err) => tracing::debug!(error = %err, "reading the light replicas failed"),
    }
    replicas
}

/// Reads the light replicas again every `REPLICAS_EVERY`, until the
/// placement is dropped.
async fn keep_reading_replicas(entry: Pool, replicas: std::sync::Weak<RwLock<Arc<Replicas>>>) {
    loop {
        tokio::time::sleep(REPLICAS_EVERY).await;
        let read = read_replicas(&entry).await;
        let Some(replicas) = replicas.upgrade() else { return };
        *replicas.write().expect("the replicas lock is never poisoned") = Arc::new(read);
    }
}

/// Reads the map through `entry`, keeping the pools of `old`'s nodes.
async fn read(config: &Config, entry: &Pool, old: Option<&Map>) -> anyhow::Result<Option<Map>> {
    let client = entry.get().await?;
    if !client.query_one(shards::CITUS_HERE, &[]).await?.get::<_, bool>(0) {
        return Ok(None);
    }
    // `lambdastore.objects`' ranges on active nodes (the extension reads
    // the same map; a range whose node is not active is left out).
    let rows: Vec<_> = client
        .query(shards::SHARD_MAP, &[])
        .await?
        .into_iter()
        .filter(|row| row.get::<_, &str>(0) == "objects" && row.get::<_, bool>(7))
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    let entry_name = match client.query_opt(ENTRY, &[]).await? {
        Some(row) => format!("{}:{}", row.get::<_, String>(0), row.get::<_, i32>(1)),
        None => "entry".to_string(), // a coordinator not registered in pg_dist_node
    };
    drop(client);

    let generation = old.map_or(1, |old| old.generation + 1);
    let mut known: HashMap<&str, &Pool> =
        old.map(|o| o.nodes.iter().map(|n| (&*n.node, &n.pool)).collect()).unwrap_or_default();
    known.insert(&entry_name, entry);
    let mut nodes = vec![Target { node: entry_name.as_str().into(), pool: entry.clone(), map: Some(generation) }];
    let mut index: HashMap<String, usize> = HashMap::from([(entry_name.clone(), 0)]);
    let mut shards = Vec::with_capacity(rows.len());
    for row in rows {
        let (host, port): (String, i32) = (row.get(5), row.get(6));
        let name = format!("{host}:{port}");
        let node = match index.get(&name) {
            Some(&i) => i,
            None => {
                let pool = match known.get(name.as_str()) {
                    Some(&pool) => pool.clone(),
                    None => crate::db::pool(config, Some((&host, port as u16)))?,
                };
                nodes.push(Target { node: name.as_str().into(), pool, map: Some(generation) });
                index.insert(name, nodes.len() - 1);
                nodes.len() - 1
            }
        };
        shards.push(Shard { min: row.get(2), max: row.get(3), node });
    }
    Ok(Some(Map { generation, shards, nodes, entry: 0 }))
}

/// `--misplace-for-tests`: each shard on another node holding shards, or on
/// a node nothing listens on, so that the first calls meet a wrong map.
fn spoil(config: &Config, map: &mut Map, misplace: Misplace) -> anyhow::Result<()> {
    let mut holders: Vec<usize> = map.shards.iter().map(|s| s.node).collect();
    holders.sort_unstable();
    holders.dedup();
    let nowhere = match misplace {
        Misplace::Shifted => None,
        Misplace::Unreachable => {
            let pool = crate::db::pool(config, Some(("127.0.0.1", 1)))?;
            map.nodes.push(Target { node: "127.0.0.1:1".into(), pool, map: Some(map.generation) });
            Some(map.nodes.len() - 1)
        }
    };
    for shard in &mut map.shards {
        shard.node = nowhere.unwrap_or_else(|| {
            let at = holders.iter().position(|&h| h == shard.node).expect("a holder");
            holders[(at + 1) % holders.len()]
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use lambdastore_core::cluster::shards::hashint8;

    /// Against a live server, when the suite has one: many ids, both signs,
    /// small and large; with Citus there, also against its `worker_hash`.
    /// (The shared hash's own tests compare a few fixed values.)
    #[test]
    fn hashes_many_ids_as_a_live_server_does() {
        let Ok(url) = std::env::var("LAMBDASTORE_TEST_URL") else {
            eprintln!("skipped: LAMBDASTORE_TEST_URL is not set");
            return;
        };
        let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connect to LAMBDASTORE_TEST_URL");
        let mut ids: Vec<i64> = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..20_000_i64 {
            // A 64-bit LCG: ids spread over the whole range, and small ones.
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ids.extend([x as i64, (x >> 40) as i64, -((x >> 40) as i64), i - 10_000, (1 << 48) + i]);
        }
        let citus: bool = client.query_one("SELECT to_regproc('worker_hash') IS NOT NULL", &[]).unwrap().get(0);
        let sql = if citus {
            "SELECT x, hashint8(x), worker_hash(x) FROM unnest($1::bigint[]) x"
        } else {
            "SELECT x, hashint8(x), hashint8(x) FROM unnest($1::bigint[]) x"
        };
        let rows = client.query(sql, &[&ids]).unwrap();
        assert_eq!(rows.len(), ids.len());
        for row in rows {
            let (x, postgres, citus): (i64, i32, i32) = (row.get(0), row.get(1), row.get(2));
            assert_eq!(hashint8(x), postgres, "hashint8({x})");
            assert_eq!(hashint8(x), citus, "worker_hash({x})");
        }
    }
}
