//! LambdaStore: data-centric serverless computing inside PostgreSQL.
//!
//! Application code is a WebAssembly component bound to objects (typed fields
//! stored as rows, plus functions). `SELECT lambda_invoke(id, 'method', args)`
//! runs the function in this backend, next to the object's data, sandboxed by
//! wasmtime. See docs/ARCHITECTURE.md for the map of modules.
#![forbid(unsafe_op_in_unsafe_fn)]

use pgrx::prelude::*;

mod access;
mod api;
mod catalog;
mod error;
mod gucs;
mod host;
mod jobs;
mod runtime;
mod shmem;
mod stats;
mod txn;
mod workers;
mod workflow;

pgrx::pg_module_magic!(name, version);

// The catalog (tables, sequences, grants) is plain SQL, shipped in sql/.
pgrx::extension_sql_file!("../../sql/schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!("../../sql/views.sql", name = "views", finalize);
pgrx::extension_sql_file!("../../sql/gateway.sql", name = "gateway", requires = ["schema"]);

/// Runs in the postmaster when preloaded, or in a backend at first use.
/// Only GUCs, (when preloaded) shared memory and the job runners, and the
/// end-of-transaction callback are set up here: the wasmtime engine and its
/// epoch thread are created lazily inside each process, because forked
/// children do not inherit threads.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::define();
    access::init();
    stats::init();
    catalog::cache::init();
    catalog::init();
    workers::init();
    jobs::init();
    // Last: commit callbacks run newest first, so entry-set versions are
    // bumped before the job runners are woken to read them.
    txn::versions::init();
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
