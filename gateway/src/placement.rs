//! Where a call runs. Every database call goes through a `Placement`, which
//! picks the pool of the node that owns the object (the target design, shared/DESIGN.md §7). On a
//! single node that is always the one database; with Citus, an
//! implementation maps the object id to its shard and the shard to the
//! worker holding it, from a cache that `stale` refreshes.

use deadpool_postgres::Pool;

pub trait Placement: Send + Sync + 'static {
    /// The pool for a call on `object`, or for a call that names no object
    /// (deploy, create, static functions, jobs).
    fn route(&self, object: Option<i64>) -> &Pool;

    /// Every pool, for readiness and the pool metrics.
    fn pools(&self) -> Vec<(&str, &Pool)>;

    /// Called when a node answered that it does not hold `object` (a shard
    /// moved): the next `route` must not use the cached placement.
    fn stale(&self, _object: i64) {}
}

/// One PostgreSQL server holds every object.
pub struct SingleNode {
    pool: Pool,
}

impl SingleNode {
    pub fn new(pool: Pool) -> Self {
        Self { pool }
    }
}

impl Placement for SingleNode {
    fn route(&self, _object: Option<i64>) -> &Pool {
        &self.pool
    }

    fn pools(&self) -> Vec<(&str, &Pool)> {
        vec![("local", &self.pool)]
    }
}
