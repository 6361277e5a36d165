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
mod cluster;
mod error;
mod gucs;
mod host;
mod jobs;
mod pg;
mod runtime;
mod stats;
mod txn;
mod workflow;
mod xact;

pgrx::pg_module_magic!(name, version);

// The catalog (tables, sequences, grants) is plain SQL, shipped in sql/.
pgrx::extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!("../sql/views.sql", name = "views", finalize);
pgrx::extension_sql_file!("../sql/gateway.sql", name = "gateway", requires = ["schema"]);
pgrx::extension_sql_file!("../sql/citus.sql", name = "citus", requires = ["views"]);

/// Runs in the postmaster when preloaded, or in a backend at first use, in
/// this order: settings; then, only when preloaded, all shared memory and
/// the job runners (background workers can only be registered then); then
/// the callbacks. The wasmtime engine and its epoch thread are created
/// lazily inside each process, because forked children do not inherit
/// threads.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::define();
    if pg::backend::preloading() {
        catalog::cache::request_shared_memory();
        txn::versions::request_shared_memory();
        txn::prepared::request_shared_memory();
        stats::request_shared_memory();
        cluster::affinity::request_shared_memory();
        jobs::workers::request_shared_memory();
        jobs::workers::register();
        if gucs::preload_artifacts() {
            runtime::preload_artifacts();
        }
    }
    access::init();
    catalog::init();
    xact::init();
    // The names PREPARE TRANSACTION gives (txn::prepared asks), the
    // compiled modules of a dropped database, which nothing else removes,
    // the names stored beside owners' and grantees' OIDs, and the roles
    // that own or were granted applications.
    pg::xact::watch_statements(pg::xact::StatementWatchers {
        database_dropped: runtime::forget_database,
        role_renamed: access::role_renamed,
        roles_dropping: access::roles_dropping,
        owned_reassigned: access::owned_reassigned,
        owned_dropped: access::owned_dropped,
    });
    cluster::delegate::init();
    cluster::layout::init();
}
