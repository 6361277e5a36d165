//! Workflows: a top-level call from SQL (or a job) and the tree of nested
//! calls it makes (host/calls.rs), all in the caller's transaction.
//!
//! Top-level entry points check the caller's privileges and visibility
//! (protected functions are for lambdas only), run the function, and on
//! success validate and apply the buffered writes and queue the spawned
//! calls.
#![deny(unsafe_code)] // PostgreSQL's C API only through the pg module

use crate::access::{self, Caller, Privilege};
use crate::catalog;
use crate::cluster::affinity;
use crate::cluster::remote;
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::host::calls::create_object;
use crate::host::registry::{self, AppVersion};
use crate::host::Frame;
use crate::pg;
use crate::stats;
use crate::txn::copy::ObjectCopy;
use crate::txn::{occ, Workflow};
use lambdastore_core::model::{Draw, FunctionKind, ModuleKey, ObjectInfo, Spawned};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Counts a top-level call in `lambdastore.stats` (not a run of a
/// forwarded call that stopped for a call on another node: it runs again).
fn counted<T>(app: &str, ty: &str, function: &str, started: Instant, outcome: Result<T>) -> Result<T> {
    if !matches!(outcome, Err(LambdaError::Suspended(_))) {
        stats::record(app, ty, function, outcome.as_ref().map(|_| ()), started.elapsed());
    }
    outcome
}

/// A new workflow for `caller` (inside job `job`, if any), with its timeout;
/// for a call forwarded here, replaying `tape` (what earlier runs drew).
/// Every workflow starts here, after `occ::check_isolation`: it refuses
/// snapshot isolation levels and finishes the prepared transactions that
/// have ended, whose writer counts this workflow's validation must not meet
/// (an entry point that skipped it failed with 40001 on a cluster).
pub(crate) fn start(caller: Caller, job: Option<i64>, tape: Option<Vec<Draw>>) -> Result<Rc<Workflow>> {
    let workflow = begin(caller, job)?;
    Ok(Rc::new(match tape {
        Some(tape) => workflow.replaying(tape),
        None => workflow,
    }))
}

/// `start`'s workflow before it is shared: checked and given its timeout.
fn begin(caller: Caller, job: Option<i64>) -> Result<Workflow> {
    occ::check_isolation()?;
    catalog::at_workflow_start();
    Ok(Workflow::new(caller, job, gucs::timeout(caller.is_superuser())))
}

/// A call that returned, and the calls its workflow spawned on objects of
/// other nodes that this node could not queue (it runs a call another node
/// sent: that node queues them).
pub(crate) struct Finished<T> {
    pub(crate) result: T,
    pub(crate) spawned_elsewhere: Vec<Spawned>,
}

/// A workflow that writes cannot run in a READ ONLY transaction: refused
/// before it runs, rather than when its writes are applied.
fn refuse_in_read_only_transaction(readonly: bool, type_name: &str, function: &str) -> Result<()> {
    if !readonly && pg::xact::read_only() {
        return Err(LambdaError::ReadOnlyTransaction(format!(
            "\"{type_name}.{function}\" may write, and the transaction is READ ONLY (only readonly functions can run in it)"
        )));
    }
    Ok(())
}

/// `lambda_invoke(object_id, method, args)`, for `caller`.
pub(crate) fn invoke_method(caller: Caller, object: i64, method: &str, args: &str) -> Result<String> {
    invoke(caller, None, object, method, args, None, None).map(|done| done.result)
}

/// `invoke_method` for the gateway, of an object that must be `app`'s:
/// checked on the object's row as the call reads it anyway (from the
/// backend's cache once seen).
pub(crate) fn invoke_method_of(caller: Caller, app: &str, object: i64, method: &str, args: &str) -> Result<String> {
    invoke(caller, None, object, method, args, None, Some(app)).map(|done| done.result)
}

/// 42501 unless `object`, of application `owner`, is `app`'s: what a
/// gateway key of `app` may call.
pub(crate) fn check_of_app(app: &str, object: i64, owner: &str) -> Result<()> {
    if owner != app {
        return Err(LambdaError::PermissionDenied(format!("object {object} belongs to another application")));
    }
    Ok(())
}

/// Job `job`: its method call, for the role that submitted it.
/// A role dropped since it submitted the job runs nothing (its OID could
/// still match an owner's or a grant's row).
pub(crate) fn run_job(caller: Caller, job: i64, object: i64, method: &str, args: &str) -> Result<String> {
    if !access::role_exists(caller.0) {
        return Err(LambdaError::UnknownRole(caller.0.to_u32()));
    }
    invoke(caller, Some(job), object, method, args, None, None).map(|done| done.result)
}

/// A call another node sent here (cluster/forward.rs), replaying `tape`.
pub(crate) fn invoke_replaying(
    caller: Caller,
    object: i64,
    method: &str,
    args: &str,
    tape: Vec<Draw>,
) -> Result<Finished<String>> {
    invoke(caller, None, object, method, args, Some(tape), None)
}

fn invoke(
    caller: Caller,
    job: Option<i64>,
    object: i64,
    method: &str,
    args: &str,
    tape: Option<Vec<Draw>>,
    of_app: Option<&str>,
) -> Result<Finished<String>> {
    let started = Instant::now();
    let (info, module) = catalog::objects::lookup(object)?;
    if let Some(app) = of_app {
        check_of_app(app, object, &info.app)?;
    }
    access::check(caller, &info.app, Privilege::Invoke)?;
    let app = registry::load(&module)?;
    // Calls refused before they run are not counted: made-up names would
    // fill the statistics' table.
    let readonly = method_callable_from_sql(&app, &info.type_name, method)?;
    refuse_in_read_only_transaction(readonly, &info.type_name, method)?;
    let workflow = start(caller, job, tape)?;
    workflow.remember_object(object, info.clone());
    let running = affinity::cpu_time();
    let outcome = run_method(&workflow, &info, &app, readonly, object, method, args);
    if !matches!(outcome, Err(LambdaError::Suspended(_))) {
        count_ran(&workflow, object, running);
    }
    counted(&info.app, &info.type_name, method, started, outcome)
}

/// A call run on a light replica of `object` (cluster/replica.rs), whose
/// reads come from `copy` and whose end is `finish`: the owner validates
/// the reads and applies the writes (only validates, when told false). A
/// failure computed from the reads is given only once the owner found them
/// still as read. What only the owner
/// can do comes back as `HandOver`, with nothing done.
pub(crate) fn invoke_on_copy(
    caller: Caller,
    info: &ObjectInfo,
    module: &ModuleKey,
    copy: Rc<ObjectCopy>,
    method: &str,
    args: &str,
    finish: impl Fn(&Workflow, bool) -> Result<()>,
) -> Result<String> {
    let started = Instant::now();
    let object = copy.object;
    access::check(caller, &info.app, Privilege::Invoke)?;
    let app = registry::load(module)?;
    let readonly = method_callable_from_sql(&app, &info.type_name, method)?;
    refuse_in_read_only_transaction(readonly, &info.type_name, method)?;
    let workflow = Rc::new(begin(caller, None)?.on_copy(copy));
    workflow.remember_object(object, info.clone());
    let frame = Frame { object, type_name: info.type_name.clone(), function: method.to_string(), readonly, depth: 0 };
    let running = affinity::cpu_time();
    let outcome = match registry::run(&workflow, &app, frame, FunctionKind::Method, args) {
        Err(LambdaError::HandOver(what)) => return Err(LambdaError::HandOver(what)),
        Ok(result) => finish(&workflow, true).map(|_| result),
        Err(failure) if occ::computed_from_reads(&failure) => Err(finish(&workflow, false).err().unwrap_or(failure)),
        Err(failure) => Err(failure),
    };
    count_ran(&workflow, object, running);
    counted(&info.app, &info.type_name, method, started, outcome)
}

/// Counts a top-level call for the rebalancer (cluster/affinity.rs): the
/// CPU time it took here since `running`, loading code aside (on a Citus
/// cluster only: `cpu_time`), and whether it wrote entries.
fn count_ran(workflow: &Workflow, object: i64, running: Option<Duration>) {
    let wrote = workflow.writes().entries().next().is_some();
    let busy = running
        .zip(affinity::cpu_time())
        .map_or(Duration::ZERO, |(start, now)| now.saturating_sub(start).saturating_sub(workflow.loading()));
    affinity::ran(object, busy, wrote);
}

fn run_method(
    workflow: &Rc<Workflow>,
    info: &ObjectInfo,
    app: &Rc<AppVersion>,
    readonly: bool,
    object: i64,
    method: &str,
    args: &str,
) -> Result<Finished<String>> {
    let frame = Frame { object, type_name: info.type_name.clone(), function: method.to_string(), readonly, depth: 0 };
    let result = validated(workflow, registry::run(workflow, app, frame, FunctionKind::Method, args))?;
    Ok(Finished { result, spawned_elsewhere: commit(workflow)? })
}

/// A run's outcome; a failure only once the workflow's reads are still as
/// read (`occ::failed`: else 40001), as a success is at commit.
pub(crate) fn validated<T>(workflow: &Workflow, outcome: Result<T>) -> Result<T> {
    outcome.map_err(|failure| occ::failed(workflow, failure))
}

/// Validates and applies the workflow's writes, then queues the calls it
/// spawned (the outbox: they exist only if this transaction commits),
/// running as the workflow's role, children of the job it runs in if any.
/// Calls spawned on objects of other nodes are queued there; returned
/// when this node cannot send them (a call another node sent runs here).
pub(crate) fn commit(workflow: &Workflow) -> Result<Vec<Spawned>> {
    occ::commit(workflow)?;
    before_answer()?;
    let writes = workflow.writes();
    if writes.spawned().is_empty() {
        return Ok(Vec::new());
    }
    let (here, elsewhere) = remote::by_node(writes.spawned())?;
    crate::jobs::queue::insert_spawned(&here, workflow.caller.0, workflow.parent_job)?;
    remote::queue_or_return(workflow, elsewhere)
}

/// Before a call's answer leaves: inside BEGIN … COMMIT it reaches the
/// client now, not after a COMMIT that validates every node, so what calls
/// read on other nodes must hold now too, as on one node (issue 41; in
/// autocommit the COMMIT right after does it, and an error there replaces
/// the answer). Also for a call that ran only on other nodes, with nothing
/// to commit here (cluster/forward.rs).
pub(crate) fn before_answer() -> Result<()> {
    if pg::xact::in_block() {
        occ::reads_elsewhere_hold()?;
    }
    Ok(())
}

/// What `lambdastore.submit` checks before queueing a job, so that a typo
/// fails now rather than later in a worker: the object exists and the method
/// is one SQL may call. Returns the object's application.
pub(crate) fn check_submittable(caller: Caller, object: i64, method: &str, args: &str) -> Result<String> {
    let (info, module) = catalog::objects::lookup(object)?;
    access::check(caller, &info.app, Privilege::Invoke)?;
    let app = registry::load(&module)?;
    method_callable_from_sql(&app, &info.type_name, method)?;
    registry::check_args_size(args)?;
    Ok(info.app)
}

/// `lambdastore.split(object, field, key)`, by the owner of the object's
/// application. The type must have the field, so that a typo fails
/// instead of adding a guard no entry will ever fall under.
pub(crate) fn split(caller: Caller, object: i64, field: &str, key: &[u8]) -> Result<bool> {
    let (info, module) = catalog::objects::lookup(object)?;
    access::check(caller, &info.app, Privilege::Owner)?;
    let app = registry::load(&module)?;
    if !app.type_desc(&info.type_name)?.fields.iter().any(|f| f.name == field) {
        return Err(LambdaError::UnknownField { ty: info.type_name, field: field.into() });
    }
    catalog::entries::check_key_size(field, key)?;
    occ::split(object, field, key)
}

/// `lambdastore.delete_object`, by the owner of the object's application;
/// false if there is no such object.
pub(crate) fn delete_object(caller: Caller, object: i64) -> Result<bool> {
    let (info, _) = catalog::objects::lookup(object)?;
    access::check(caller, &info.app, Privilege::Owner)?;
    occ::hold_whole_object(object)?;
    let deleted = catalog::objects::delete(object)?;
    crate::jobs::queue::forget_object(object)?;
    Ok(deleted)
}

/// An entry set's version and recent conflicts (`lambdastore.entry_sets`).
pub(crate) fn entry_set_counters(object: i64, lower_field: &str, lower_key: &[u8]) -> (i64, i64) {
    let set = (object, (lower_field.to_string(), lower_key.to_vec()));
    (crate::txn::versions::version(&set), crate::txn::versions::conflicts(&set))
}

/// Refuses, before a map call runs, a method `caller` could not call from
/// SQL on objects of `app`'s type `type_name` (as `lambda_invoke` would
/// on each).
pub(crate) fn check_method(caller: Caller, app_name: &str, type_name: &str, method: &str) -> Result<()> {
    let app = current_version(caller, app_name)?;
    let readonly = method_callable_from_sql(&app, type_name, method)?;
    refuse_in_read_only_transaction(readonly, type_name, method)
}

/// Whether `method` of `type_name` is a method SQL may call (not
/// protected), and if so whether it is readonly.
fn method_callable_from_sql(app: &AppVersion, type_name: &str, method: &str) -> Result<bool> {
    let f = app.function(type_name, method, FunctionKind::Method)?;
    app.refuse_protected(type_name, f)?;
    Ok(f.readonly)
}

/// `lambdastore.invoke_static(app, type, function, args)`, for `caller`.
pub(crate) fn invoke_static(
    caller: Caller,
    app_name: &str,
    type_name: &str,
    function: &str,
    args: &str,
) -> Result<String> {
    let started = Instant::now();
    let app = current_version(caller, app_name)?;
    let f = app.function(type_name, function, FunctionKind::Static)?;
    app.refuse_protected(type_name, f)?; // refused calls are not counted, as above
    let readonly = f.readonly;
    refuse_in_read_only_transaction(readonly, type_name, function)?;
    let outcome = run_static(caller, &app, type_name, function, readonly, args);
    counted(app_name, type_name, function, started, outcome)
}

fn run_static(
    caller: Caller,
    app: &Rc<AppVersion>,
    type_name: &str,
    function: &str,
    readonly: bool,
    args: &str,
) -> Result<String> {
    let workflow = start(caller, None, None)?;
    let frame =
        Frame { object: 0, type_name: type_name.to_string(), function: function.to_string(), readonly, depth: 0 };
    let result = validated(&workflow, registry::run(&workflow, app, frame, FunctionKind::Static, args))?;
    commit(&workflow)?;
    Ok(result)
}

/// `lambdastore.create_object(app, type, args)`, for `caller`.
pub(crate) fn create(caller: Caller, app_name: &str, type_name: &str, args: &str) -> Result<i64> {
    create_with(caller, app_name, type_name, args, None).map(|done| done.result)
}

/// The same, replaying `tape` for a create another node sent.
pub(crate) fn create_with(
    caller: Caller,
    app_name: &str,
    type_name: &str,
    args: &str,
    tape: Option<Vec<Draw>>,
) -> Result<Finished<i64>> {
    let started = Instant::now();
    let app = current_version(caller, app_name)?;
    if let Some(ctor) = app.constructor(type_name)? {
        app.refuse_protected(type_name, ctor)?; // refused calls are not counted, as above
    }
    refuse_in_read_only_transaction(false, type_name, "(create)")?;
    let workflow = start(caller, None, tape)?;
    let outcome = validated(&workflow, create_object(&workflow, &app, type_name, args, 0, false))
        .and_then(|id| Ok(Finished { result: id, spawned_elsewhere: commit(&workflow)? }));
    counted(app_name, type_name, "(create)", started, outcome)
}

/// The code `caller` may invoke now in `app_name`.
fn current_version(caller: Caller, app_name: &str) -> Result<Rc<AppVersion>> {
    let module = catalog::modules::current(app_name)?;
    access::check(caller, app_name, Privilege::Invoke)?;
    registry::load(&module)
}
