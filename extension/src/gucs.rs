//! Every setting of the extension: a private static, its default and why,
//! and a typed accessor. Limits that protect the server from a tenant's
//! lambdas are `SUSET` (only a superuser may raise them), and so is
//! everything that weakens a guarantee (`concurrency_control`). The
//! wall-clock timeout is `USERSET` like PostgreSQL's own
//! `statement_timeout`, but an ordinary role's is capped at
//! `max_timeout`: a lambda holds its write locks while it runs.
//!
//! The doc comments say why; the table users read is docs/settings.md,
//! which tests/tests/docs.rs checks against `define()`: every name, its
//! default, unit and context.

use crate::pg::{self, settings::Rights};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::PostgresGucEnum;
use std::ffi::{CStr, CString};
use std::time::Duration;

/// Upper bound of `lambdastore.workers`.
pub(crate) const MAX_WORKERS: usize = 64;

/// Upper bound of `lambdastore.max_call_depth`; the per-backend instance
/// pool is sized from it (one instance per nested call that is running).
pub(crate) const MAX_CALL_DEPTH_LIMIT: i32 = 32;

/// `lambdastore.timeout` (ms, default 1000): wall time of one top-level
/// invocation including its nested calls. 1 s matches the paper's default
/// job limit: long enough for real work, short enough that a runaway lambda
/// cannot hold locks for long.
static TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// `lambdastore.commit_wait` (ms, default 250): how long a call that is about
/// to read an entry set waits for another transaction that holds the set
/// for writing (committing, or on a Citus cluster prepared and waiting for
/// COMMIT PREPARED) to end, so that it reads what that transaction wrote
/// instead of failing validation with 40001 (txn/occ.rs). A contended
/// cluster workload needed 3.3 retries per operation without it, 1.1 at
/// 50 ms and 1.0 at 250 ms: readers of a hot object wait behind a queue of
/// writers, each holding it for a whole distributed commit. Not longer: a
/// reader beside a transaction left idle after a write, or a cross-node
/// wait cycle (two transactions, each holding on one node what the other
/// reads on the other), waits it out before failing. 0: never wait.
static COMMIT_WAIT_MS: GucSetting<i32> = GucSetting::<i32>::new(250);

/// `lambdastore.max_timeout` (ms, default 10 s, superuser only): the most
/// `lambdastore.timeout` a role that is not a superuser gets, whatever it
/// sets; a superuser's timeout is not capped.
static MAX_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// `lambdastore.max_write_size` (kB, default 64 MB): bytes of field names,
/// keys and values one workflow may write, overwritten values included
/// (the undo journal keeps them). The buffer is host memory, outside the
/// lambda's memory limit.
static MAX_WRITE_KB: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);

/// `lambdastore.max_scan_size` (kB, default 16 MB): bytes of keys and
/// values one scan may return. A scan's rows are host memory until they
/// are copied into the lambda, and stored values may be compressed.
static MAX_SCAN_KB: GucSetting<i32> = GucSetting::<i32>::new(16 * 1024);

/// `lambdastore.max_module_size` (kB, default 32 MB): the largest component
/// `deploy` compiles. Compiling cannot be interrupted; its time grows with
/// the code's size (the Rust examples are 100-300 kB; a Python guest
/// carries the interpreter, 18 MB, compiled in about 13 s here).
static MAX_MODULE_KB: GucSetting<i32> = GucSetting::<i32>::new(32 * 1024);

/// `lambdastore.compiled_functions_size` (kB, default 512 MB): the disk
/// the compiled functions kept for later compiles may take after a
/// compile (runtime/functions.rs trims the oldest past it).
static COMPILED_FUNCTIONS_KB: GucSetting<i32> = GucSetting::<i32>::new(512 * 1024);

/// `lambdastore.max_log_rate` (kB per second, default 64 kB): what the
/// lambdas of one backend may write to the server log per second, over all
/// its workflows (each is also capped on its own: host/mod.rs).
static MAX_LOG_RATE_KB: GucSetting<i32> = GucSetting::<i32>::new(64);
/// `lambdastore.max_spawns` (default 1000): jobs one workflow may spawn.
static MAX_SPAWNS: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// `lambdastore.memory_limit` (kB, default 64 MB): linear memory of one
/// instance. Rust guests reserve 1 MiB of stack in linear memory, so the
/// floor is 2 MB.
static MEMORY_LIMIT_KB: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);

/// `lambdastore.max_call_depth` (default 16): nested synchronous calls.
static MAX_CALL_DEPTH: GucSetting<i32> = GucSetting::<i32>::new(16);

/// `lambdastore.max_args_size` (kB, default 1 MB): JSON arguments of a call.
static MAX_ARGS_KB: GucSetting<i32> = GucSetting::<i32>::new(1024);

/// `lambdastore.max_result_size` (kB, default 1 MB): JSON result of a call.
static MAX_RESULT_KB: GucSetting<i32> = GucSetting::<i32>::new(1024);

/// How workflows are isolated from each other.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ConcurrencyControl {
    /// Optimistic concurrency control on entry sets: serializable workflows.
    #[name = c"occ"]
    Occ,
    /// No validation: only to show, in tests and benchmarks, what OCC prevents
    /// (or to rely on PostgreSQL's own SERIALIZABLE isolation instead).
    #[name = c"off"]
    Off,
}

/// `lambdastore.concurrency_control` (default `occ`).
static CONCURRENCY_CONTROL: GucSetting<ConcurrencyControl> =
    GucSetting::<ConcurrencyControl>::new(ConcurrencyControl::Occ);

/// `lambdastore.split_chance` (default 0.01): base probability that a
/// commit splits an entry set it wrote, multiplied by (1 + the set's recent
/// conflicts); only objects that have met conflicts lately are split.
static SPLIT_CHANCE: GucSetting<f64> = GucSetting::<f64>::new(0.01);

/// `lambdastore.merge_chance` (default 0.01): probability that a commit
/// folds an entry set it wrote into a neighbour, on an object that has met
/// no conflict for 10 s: splits are undone once contention is gone.
static MERGE_CHANCE: GucSetting<f64> = GucSetting::<f64>::new(0.01);

/// `lambdastore.max_entry_sets` (default 1024): entry sets per object; past
/// it, objects stop splitting.
static MAX_ENTRY_SETS: GucSetting<i32> = GucSetting::<i32>::new(1024);

/// `lambdastore.workers` (default 2, needs a restart): background workers
/// that run asynchronous jobs. Two keeps a 2-core machine responsive to
/// synchronous calls while jobs drain; each worker is one connection.
static WORKERS: GucSetting<i32> = GucSetting::<i32>::new(2);

/// `lambdastore.database` (default `postgres`, needs a restart): the
/// database whose jobs the workers run. A worker connects to one database
/// for its life, as every PostgreSQL background worker does.
static DATABASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"postgres"));

/// `lambdastore.preload_artifacts` (default on, needs a restart): the
/// postmaster maps every compiled module in the disk cache when the server
/// starts, so that each backend inherits them instead of mapping its own at
/// its first call (3–4 ms for a Python guest, runtime/artifacts.rs). Off:
/// nothing of wasmtime runs in the postmaster.
static PRELOAD_ARTIFACTS: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `lambdastore.job_max_attempts` (default 20): runs of a job that keeps
/// failing with a serialization failure (40001), a deadlock (40P01) or,
/// on a Citus cluster, a node it reached being unreachable (class 08)
/// before it is marked failed. Those are transient, so retrying with
/// backoff almost always succeeds; the bound keeps a pathological hot spot
/// (or a node that stays down) from retrying forever.
static JOB_MAX_ATTEMPTS: GucSetting<i32> = GucSetting::<i32>::new(20);

/// `lambdastore.job_retention` (seconds, default 7 days; -1 keeps them;
/// reloadable): how long a finished job (done, failed or cancelled) stays
/// in `lambdastore.jobs` before the workers delete it, with its
/// idempotency key: a retry with that key after that queues a new job.
static JOB_RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(7 * 24 * 3600);

/// `lambdastore.rebalance_interval` (ms, default 0: off; reloadable): how
/// often the coordinator's rebalancer runs `lambdastore.rebalance()` by
/// itself. Off by default: every move pauses the cluster's calls briefly
/// (a migration's fence), which is the operator's choice to make.
static REBALANCE_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// `lambdastore.rebalance_max_moves` (default 4): moves one rebalancing run
/// may plan, so that one run's pauses stay short and a bad window of
/// counts cannot reshuffle the cluster.
static REBALANCE_MAX_MOVES: GucSetting<i32> = GucSetting::<i32>::new(4);

/// `lambdastore.rebalance_tolerance` (default 0.2): how far above the mean
/// a node's calls may be before the rebalancer evens them out, and the
/// most that bringing partners together may load a node.
static REBALANCE_TOLERANCE: GucSetting<f64> = GucSetting::<f64>::new(0.2);

/// `lambdastore.light_replica_threshold` (cores, default 0.5): a rebalancing
/// run adds a light replica to an object whose calls, mostly reading, kept
/// each of its servers this busy, and drops one where, with a server fewer,
/// each would be under half of it (core/src/cluster/rebalance/replicas.rs). 0: runs
/// neither add nor drop replicas, except those that can no longer serve.
static LIGHT_REPLICA_THRESHOLD: GucSetting<f64> = GucSetting::<f64>::new(0.5);

pub(crate) fn define() {
    GucRegistry::define_int_guc(
        c"lambdastore.workers",
        c"Number of background workers that run asynchronous jobs.",
        c"Needs lambdastore in shared_preload_libraries; 0 turns the job runners off.",
        &WORKERS,
        0,
        MAX_WORKERS as i32,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"lambdastore.database",
        c"Database whose jobs the background workers run.",
        c"",
        &DATABASE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"lambdastore.preload_artifacts",
        c"Whether the postmaster maps the compiled modules of the disk cache at server start.",
        c"Needs lambdastore in shared_preload_libraries; every backend then inherits them.",
        &PRELOAD_ARTIFACTS,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lambdastore.job_max_attempts",
        c"Runs of a job failing with serialization failures or unreachable nodes before it is marked failed.",
        c"",
        &JOB_MAX_ATTEMPTS,
        1,
        1000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lambdastore.job_retention",
        c"How long finished jobs are kept before the workers delete them (-1: kept).",
        c"Their idempotency keys go with them.",
        &JOB_RETENTION_S,
        -1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_enum_guc(
        c"lambdastore.concurrency_control",
        c"How concurrent workflows are isolated: occ (serializable) or off.",
        c"off skips validation; use it only to show what OCC prevents, or under PostgreSQL's SERIALIZABLE isolation.",
        &CONCURRENCY_CONTROL,
        // `off` in one session lets its commits skip everyone's locks and
        // versions: other sessions' updates are lost. Superusers only.
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lambdastore.rebalance_interval",
        c"How often the coordinator rebalances objects by itself (0: never).",
        c"Needs lambdastore in shared_preload_libraries; each run is lambdastore.rebalance().",
        &REBALANCE_INTERVAL_MS,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"lambdastore.rebalance_max_moves",
        c"Most objects one rebalancing run moves.",
        c"",
        &REBALANCE_MAX_MOVES,
        0,
        10_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"lambdastore.rebalance_tolerance",
        c"How far above the mean a node's calls may be before rebalancing evens them out.",
        c"Also the most that bringing objects that call each other together may load a node.",
        &REBALANCE_TOLERANCE,
        0.0,
        10.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"lambdastore.light_replica_threshold",
        c"Cores an object's calls must keep each of its servers busy before rebalancing adds a light replica.",
        c"A replica is dropped when, with one server fewer, each would be busy under half of it; 0 leaves replicas alone.",
        &LIGHT_REPLICA_THRESHOLD,
        0.0,
        1000.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"lambdastore.split_chance",
        c"Base probability that a commit splits an entry set it wrote.",
        c"Multiplied by (1 + the entry set's recent conflicts); only objects that have met conflicts lately are split.",
        &SPLIT_CHANCE,
        0.0,
        1.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"lambdastore.merge_chance",
        c"Probability that a commit merges an entry set it wrote with a neighbour.",
        c"Only on objects that have met no conflict for 10 s: every set costs each call that touches it.",
        &MERGE_CHANCE,
        0.0,
        1.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lambdastore.max_entry_sets",
        c"Maximum number of entry sets per object.",
        c"",
        &MAX_ENTRY_SETS,
        1,
        1 << 20,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lambdastore.timeout",
        c"Wall-clock limit of one lambda invocation, nested calls included.",
        c"Enforced by wasmtime epoch interruption; query cancel and statement_timeout also stop a running lambda.",
        &TIMEOUT_MS,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"lambdastore.commit_wait",
        c"How long a call waits for a transaction holding an entry set it reads for writing to end.",
        c"Waiting reads what that transaction committed instead of failing with 40001; 0 never waits.",
        &COMMIT_WAIT_MS,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"lambdastore.max_timeout",
        c"The most lambdastore.timeout a role that is not a superuser gets.",
        c"",
        &MAX_TIMEOUT_MS,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    for (name, description, setting, max) in [
        (
            c"lambdastore.max_write_size",
            c"Bytes one workflow may write (field names, keys, values).",
            &MAX_WRITE_KB,
            1024 * 1024 * 1024,
        ),
        (
            c"lambdastore.max_scan_size",
            c"Bytes of keys and values one range scan may return.",
            &MAX_SCAN_KB,
            1024 * 1024,
        ),
        (
            c"lambdastore.max_module_size",
            c"The largest component lambdastore.deploy compiles.",
            &MAX_MODULE_KB,
            1024 * 1024,
        ),
        (
            c"lambdastore.compiled_functions_size",
            c"The disk the compiled functions kept in lambdastore/functions may take after a compile.",
            &COMPILED_FUNCTIONS_KB,
            i32::MAX,
        ),
    ] {
        GucRegistry::define_int_guc(name, description, c"", setting, 1, max, GucContext::Suset, GucFlags::UNIT_KB);
    }
    GucRegistry::define_int_guc(
        c"lambdastore.max_log_rate",
        c"Bytes of lambda log messages one backend may write per second.",
        c"Messages past it are dropped; a line says how many once the second is over.",
        &MAX_LOG_RATE_KB,
        1,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"lambdastore.max_spawns",
        c"Jobs one workflow may spawn.",
        c"",
        &MAX_SPAWNS,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lambdastore.memory_limit",
        c"Linear memory one lambda instance may use.",
        c"Growing memory past this limit traps the lambda with SQLSTATE 53200.",
        &MEMORY_LIMIT_KB,
        2 * 1024,
        // What a memory slot reserves (runtime/engine.rs): 4 GiB - 64 KiB.
        4 * 1024 * 1024 - 64,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"lambdastore.max_call_depth",
        c"Maximum depth of nested synchronous lambda calls.",
        c"",
        &MAX_CALL_DEPTH,
        1,
        MAX_CALL_DEPTH_LIMIT,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lambdastore.max_args_size",
        c"Maximum size of the JSON arguments of a lambda call.",
        c"",
        &MAX_ARGS_KB,
        1,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"lambdastore.max_result_size",
        c"Maximum size of the JSON result of a lambda call.",
        c"",
        &MAX_RESULT_KB,
        1,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
}

pub(crate) fn occ() -> bool {
    CONCURRENCY_CONTROL.get() == ConcurrencyControl::Occ
}

pub(crate) fn split_chance() -> f64 {
    SPLIT_CHANCE.get()
}

pub(crate) fn merge_chance() -> f64 {
    MERGE_CHANCE.get()
}

pub(crate) fn max_entry_sets() -> usize {
    MAX_ENTRY_SETS.get() as usize
}

/// The workflow timeout of a role: capped at `max_timeout` unless it is a
/// superuser's.
pub(crate) fn timeout(superuser: bool) -> Duration {
    let ms = if superuser { TIMEOUT_MS.get() } else { TIMEOUT_MS.get().min(MAX_TIMEOUT_MS.get()) };
    Duration::from_millis(ms.max(1) as u64)
}

/// Whether a workflow's timeout of `ms` is less than the role set:
/// `max_timeout` cut it.
pub(crate) fn timeout_capped(ms: u128) -> bool {
    (TIMEOUT_MS.get().max(1) as u128) > ms
}

pub(crate) fn commit_wait() -> Duration {
    Duration::from_millis(COMMIT_WAIT_MS.get().max(0) as u64)
}

pub(crate) fn max_write_bytes() -> usize {
    MAX_WRITE_KB.get() as usize * 1024
}

pub(crate) fn max_scan_bytes() -> usize {
    MAX_SCAN_KB.get() as usize * 1024
}

pub(crate) fn max_module_bytes() -> usize {
    MAX_MODULE_KB.get() as usize * 1024
}

pub(crate) fn compiled_functions_bytes() -> u64 {
    COMPILED_FUNCTIONS_KB.get().max(1) as u64 * 1024
}

pub(crate) fn max_log_bytes_per_second() -> usize {
    MAX_LOG_RATE_KB.get().max(1) as usize * 1024
}

pub(crate) fn max_spawns() -> usize {
    MAX_SPAWNS.get().max(0) as usize
}

pub(crate) fn memory_limit_bytes() -> usize {
    MEMORY_LIMIT_KB.get() as usize * 1024
}

pub(crate) fn max_call_depth() -> u32 {
    MAX_CALL_DEPTH.get() as u32
}

pub(crate) fn max_args_bytes() -> usize {
    MAX_ARGS_KB.get() as usize * 1024
}

pub(crate) fn max_result_bytes() -> usize {
    MAX_RESULT_KB.get() as usize * 1024
}

pub(crate) fn preload_artifacts() -> bool {
    PRELOAD_ARTIFACTS.get()
}

pub(crate) fn workers() -> usize {
    WORKERS.get().max(0) as usize
}

pub(crate) fn database() -> String {
    DATABASE.get().map(|name| name.to_string_lossy().into_owned()).unwrap_or_else(|| "postgres".into())
}

/// None when off.
pub(crate) fn rebalance_interval() -> Option<Duration> {
    let ms = REBALANCE_INTERVAL_MS.get();
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

pub(crate) fn rebalance_max_moves() -> i32 {
    REBALANCE_MAX_MOVES.get()
}

pub(crate) fn rebalance_tolerance() -> f64 {
    REBALANCE_TOLERANCE.get()
}

pub(crate) fn light_replica_threshold() -> f64 {
    LIGHT_REPLICA_THRESHOLD.get()
}

pub(crate) fn job_max_attempts() -> i32 {
    JOB_MAX_ATTEMPTS.get()
}

/// How long finished jobs are kept; None: for ever.
pub(crate) fn job_retention() -> Option<std::time::Duration> {
    u64::try_from(JOB_RETENTION_S.get()).ok().map(std::time::Duration::from_secs)
}

/// The settings a call runs with, which travel with it to the node that
/// runs it on a Citus cluster (cluster/forward.rs): all but the node's own
/// (workers, database, job_max_attempts, job_retention) and `timeout`, which travels as
/// the caller's capped value; and whether the transaction is READ ONLY
/// (Citus does not say so to the nodes it reaches). Each with its value as
/// `SET` takes it (integers in their base unit), read from the variable:
/// through the GUC machinery by name, fourteen such look-ups were 4% of a
/// coordinator's work per forwarded call.
const TRAVELLING: [(&str, fn() -> String); 15] = [
    ("transaction_read_only", || if pg::xact::read_only() { "on" } else { "off" }.into()),
    ("lambdastore.concurrency_control", || {
        match CONCURRENCY_CONTROL.get() {
            ConcurrencyControl::Occ => "occ",
            ConcurrencyControl::Off => "off",
        }
        .into()
    }),
    ("lambdastore.commit_wait", || COMMIT_WAIT_MS.get().to_string()),
    ("lambdastore.split_chance", || SPLIT_CHANCE.get().to_string()),
    ("lambdastore.merge_chance", || MERGE_CHANCE.get().to_string()),
    ("lambdastore.max_entry_sets", || MAX_ENTRY_SETS.get().to_string()),
    ("lambdastore.max_timeout", || MAX_TIMEOUT_MS.get().to_string()),
    ("lambdastore.max_write_size", || MAX_WRITE_KB.get().to_string()),
    ("lambdastore.max_scan_size", || MAX_SCAN_KB.get().to_string()),
    ("lambdastore.max_module_size", || MAX_MODULE_KB.get().to_string()),
    ("lambdastore.max_spawns", || MAX_SPAWNS.get().to_string()),
    ("lambdastore.memory_limit", || MEMORY_LIMIT_KB.get().to_string()),
    ("lambdastore.max_call_depth", || MAX_CALL_DEPTH.get().to_string()),
    ("lambdastore.max_args_size", || MAX_ARGS_KB.get().to_string()),
    ("lambdastore.max_result_size", || MAX_RESULT_KB.get().to_string()),
];

/// This session's values of the travelling settings, one `name=value` a
/// line.
pub(crate) fn travelling() -> String {
    let mut out = String::with_capacity(512);
    for (name, value) in TRAVELLING {
        out.push_str(name);
        out.push('=');
        out.push_str(&value());
        out.push('\n');
    }
    out
}

/// The lines of `settings` (as `travelling` wrote them) that differ from
/// this session's values, as (name, value); `timeout` too when asked.
fn differing(settings: &str, with_timeout: bool) -> impl Iterator<Item = (&str, &str)> {
    settings.lines().filter_map(move |line| {
        let (name, value) = line.split_once('=')?;
        let now = if with_timeout && name == "lambdastore.timeout" {
            TIMEOUT_MS.get().to_string()
        } else {
            (TRAVELLING.iter().find(|(known, _)| *known == name)?.1)()
        };
        (now != value).then_some((name, value))
    })
}

/// Takes `settings` (as `travelling` wrote them) for the rest of the
/// transaction, with a superuser's rights: the node forwarding a call
/// checked who may set what where the session runs.
pub(crate) fn arrive(settings: &str) {
    // Usually the same here: setting it anyway pushes a GUC stack entry
    // per setting per call (a third of a forwarded read).
    for (name, value) in differing(settings, false) {
        set_local(name, value);
    }
}

/// What a call delegated by Citus carries (cluster/delegate.rs): the
/// session's `timeout` as `caller` may have it, then `travelling`.
pub(crate) fn delegated(superuser: bool) -> String {
    format!("lambdastore.timeout={}\n{}", timeout(superuser).as_millis(), travelling())
}

/// Takes what `delegated` wrote for the rest of the transaction, each
/// setting only as far as the caller (`superuser` or not) may change it
/// here: anyone may send this function any text. A setting the caller may
/// not change keeps this node's value.
pub(crate) fn arrive_delegated(settings: &str, superuser: bool) {
    let rights = if superuser { Rights::Superuser } else { Rights::User };
    for (name, value) in differing(settings, true) {
        if let (Ok(name), Ok(value)) = (CString::new(name), CString::new(value)) {
            pg::settings::set_local_if_allowed(&name, &value, rights);
        }
    }
}

/// Sets one of our settings for the rest of the transaction, as
/// `SET LOCAL` would with a superuser's rights: a call forwarded to another
/// Citus node takes its caller's settings along (cluster/forward.rs).
pub(crate) fn set_local(name: &str, value: &str) {
    let (name, value) = (std::ffi::CString::new(name), std::ffi::CString::new(value));
    let (Ok(name), Ok(value)) = (name, value) else { return };
    pg::settings::set_local(&name, &value, Rights::Superuser);
}

/// Runs `body` with `settings` (name, value) set (a superuser's rights),
/// as a function's `SET` clause does: restored when `body` returns.
pub(crate) fn with_settings<T>(settings: &[(&CStr, &CStr)], body: impl FnOnce() -> T) -> T {
    pg::settings::with(settings, Rights::Superuser, body)
}
