//! The one boundary to PostgreSQL's C API: small safe functions for what
//! the rest of the extension asks of the server beyond SPI and pgrx's own
//! safe wrappers (transaction state, locks, the backend's PRNG and clock,
//! condition variables, table statistics, shared memory, jsonb as text,
//! a process's latch and signals, a planner hook, a hook before calls of
//! named functions). Each `unsafe` block here says
//! why it holds; the modules above it (txn, host, workflow, the cluster
//! wing) deny `unsafe` altogether.
//!
//! Everything here runs on the backend's main thread, which is the only
//! thread that may call into PostgreSQL.

pub(crate) mod backend;
pub(crate) mod fmgr;
pub(crate) mod jsonb;
pub(crate) mod locks;
pub(crate) mod planner;
pub(crate) mod process;
pub(crate) mod roles;
pub(crate) mod settings;
pub(crate) mod shmem;
pub(crate) mod standby;
pub(crate) mod xact;
