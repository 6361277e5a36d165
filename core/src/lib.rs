//! What LambdaStore's parts share and that needs no PostgreSQL: the
//! vocabulary (model), a workflow's pure state (the write buffer, entry-set
//! arithmetic, the tape of a replayed run), the rebalancer's planner (moves and light replicas),
//! Citus' hash and shard ranges, cron schedules' times, and (feature `wasmtime`) the generated
//! host side of the WIT world. The extension, the gateway and the bench
//! use it; its unit tests run under plain `cargo test`.

pub mod model;
pub mod schedule;

/// A workflow's state that is plain data.
pub mod txn {
    pub mod buffer;
    pub mod entry_sets;
    pub mod tape;
}

/// The pure parts of running on a Citus cluster.
pub mod cluster {
    pub mod rebalance;
    pub mod shards;
    pub mod transactions;
}

#[cfg(feature = "wasmtime")]
pub mod wit;
