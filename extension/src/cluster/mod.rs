//! Everything that exists only because of Citus: on one PostgreSQL server
//! none of it does anything, and the rest of the extension reads without it.
//!
//! The files are listed bottom to top in docs/ARCHITECTURE.md ("Layers"),
//! each at the level of the single-node modules it sits between.

pub(crate) mod affinity;
pub(crate) mod api;
pub(crate) mod forward;
pub(crate) mod layout;
pub(crate) mod map;
pub(crate) mod rebalance;
pub(crate) mod rebalancer;
pub(crate) mod remote;
pub(crate) mod route;
