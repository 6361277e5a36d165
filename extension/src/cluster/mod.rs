//! Everything that exists only because of Citus: the single-node story
//! (api, workflow, host, txn, catalog) reads without it. On one server the
//! layout is None, every object is here, and only map calls (one workflow
//! per object) and the call counts do any work.
//!
//! The files sit at different levels of docs/ARCHITECTURE.md's "Layers",
//! each beside the single-node layer it serves: `layout` below the catalog
//! (whose statements it places on a node's shards), `route` below `txn`
//! (the one answer to "where does this object run": `owner_elsewhere`),
//! `remote` below `host` (the driver of nested calls on other nodes, handed
//! the host's way of running a call here), and `forward`, `map`,
//! `rebalancer`, `delegate` (calls Citus sends by its own delegation),
//! `replica` (calls run on a light replica of their object) and `api` (the
//! `_here` SQL functions) above the workflow.
#![deny(unsafe_code)] // PostgreSQL's C API only through the pg module

pub(crate) mod affinity;
pub(crate) mod api;
pub(crate) mod delegate;
pub(crate) mod forward;
pub(crate) mod layout;
pub(crate) mod map;
pub(crate) mod rebalancer;
pub(crate) mod remote;
pub(crate) mod replica;
pub(crate) mod route;
