//! Where a call runs. Every database call goes through a `Placement`, which
//! picks the node that owns the object (the target design, shared/DESIGN.md
//! §7). On a single server that is always the one database (`SingleNode`);
//! on a Citus cluster `Citus` maps the object id to its shard and the shard
//! to the node holding it, from a copy of Citus' metadata that it reloads
//! when a node turns out not to hold an object it was sent.

mod citus;

pub use citus::{with_check, Citus};

use crate::config::{Config, PlacementMode};
use deadpool_postgres::Pool;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// Where one call goes.
#[derive(Clone)]
pub struct Target {
    /// The node's name: `host:port` as Citus' metadata has it, or `local`.
    pub node: Arc<str>,
    pub pool: Pool,
    /// Set when the node was chosen from the shard map: the call must then
    /// ask the node whether it holds the object, since the map may be
    /// older than a shard move. The number is the map's generation.
    pub map: Option<u64>,
}

/// Why the shard map is reloaded (the `reason` label of
/// `lambdastore_gateway_placement_refreshes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stale {
    /// The node the map named answered that it does not hold the object.
    NotOwner,
    /// The node the map named could not be connected to.
    Unreachable,
}

impl Stale {
    pub fn label(self) -> &'static str {
        match self {
            Stale::NotOwner => "not_owner",
            Stale::Unreachable => "unreachable",
        }
    }
}

pub type Refresh<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

pub trait Placement: Send + Sync + 'static {
    /// The node for a call on `object`, or for a call that names no object
    /// (deploy, create, static functions, jobs).
    fn route(&self, object: Option<i64>) -> Target;

    /// Every node's pool, for readiness and the pool metrics.
    fn pools(&self) -> Vec<(Arc<str>, Pool)>;

    /// Whether objects are spread over the nodes of a Citus cluster.
    fn distributed(&self) -> bool {
        false
    }

    /// `target`, chosen by the map, was wrong (`why`): the next `route`
    /// must not use that map. Concurrent refreshes of one map reload it once.
    fn refresh(&self, _target: &Target, _why: Stale) -> Refresh<'_> {
        Box::pin(async {})
    }
}

/// One PostgreSQL server holds every object.
pub struct SingleNode {
    target: Target,
}

impl SingleNode {
    pub fn new(pool: Pool) -> Self {
        Self { target: Target { node: "local".into(), pool, map: None } }
    }
}

impl Placement for SingleNode {
    fn route(&self, _object: Option<i64>) -> Target {
        self.target.clone()
    }

    fn pools(&self) -> Vec<(Arc<str>, Pool)> {
        vec![(self.target.node.clone(), self.target.pool.clone())]
    }
}

/// The placement `--placement` asks for. `auto` reads Citus' metadata
/// through `entry` (the `--database-url` node): `Citus` when lambdastore's
/// objects are distributed, else `SingleNode`, also when the server cannot
/// be asked (it starts, as it always did, and `/readyz` says 503 until the
/// database answers; `--placement citus` waits for it instead).
pub async fn choose(config: &Config, entry: Pool) -> anyhow::Result<Arc<dyn Placement>> {
    match config.placement {
        PlacementMode::Single => Ok(Arc::new(SingleNode::new(entry))),
        PlacementMode::Auto => match Citus::load(config, entry.clone()).await {
            Ok(Some(citus)) => Ok(Arc::new(citus)),
            Ok(None) => Ok(Arc::new(SingleNode::new(entry))),
            Err(err) => {
                tracing::warn!(error = %err, "could not read the shard map: every call goes to --database-url \
                                               (pass --placement citus to wait for a Citus cluster)");
                Ok(Arc::new(SingleNode::new(entry)))
            }
        },
        PlacementMode::Citus => loop {
            match Citus::load(config, entry.clone()).await {
                Ok(Some(citus)) => return Ok(Arc::new(citus)),
                Ok(None) => anyhow::bail!("--placement citus, but lambdastore.objects is not distributed there"),
                Err(err) => {
                    tracing::warn!(error = %err, "waiting for the database to read the shard map");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        },
    }
}
