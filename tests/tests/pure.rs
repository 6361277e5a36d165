//! The extension's pure modules, compiled here from their sources so that
//! their unit tests (`#[cfg(test)] mod tests` in each file) run with plain
//! `cargo test`: the extension itself links against the PostgreSQL server
//! and its tests could only run inside one. These modules use nothing but
//! `crate::model`, so the same paths resolve here.
#![allow(dead_code)]

#[path = "../../extension/src/model.rs"]
mod model;

#[path = "../../extension/src/txn/buffer.rs"]
mod buffer;

#[path = "../../extension/src/txn/entry_sets.rs"]
mod entry_sets;

#[path = "../../extension/src/txn/tape.rs"]
mod tape;

#[path = "../../extension/src/cluster/rebalance.rs"]
mod rebalance;
