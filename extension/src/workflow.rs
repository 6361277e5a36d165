//! Workflows: a top-level call from SQL and the tree of nested calls it
//! makes, all in the caller's transaction.
//!
//! Top-level entry points check visibility (protected functions are for
//! lambdas only), run the function, and on success apply the buffered
//! writes. Nested calls stay inside the application the workflow started
//! in, run on the same code version, and take a savepoint so that a callee
//! returning its own error leaves nothing behind.

use crate::access::{self, Caller, Privilege};
use crate::catalog;
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::host::{Frame, FunctionKind, HostState};
use crate::runtime::{self, AppVersion};
use crate::txn::{occ, ObjectInfo, Spawned, Workflow};
use crate::stats;
use std::rc::Rc;
use std::time::Instant;

/// Counts a top-level call in `lambdastore.stats`.
fn counted<T>(app: &str, ty: &str, function: &str, started: Instant, outcome: Result<T>) -> Result<T> {
    stats::record(app, ty, function, outcome.as_ref().map(|_| ()), started.elapsed());
    outcome
}

/// A new workflow for `caller` (inside job `job`, if any), with its timeout.
fn start(caller: Caller, job: Option<i64>) -> Rc<Workflow> {
    Rc::new(Workflow::new(caller, job, gucs::timeout(caller.is_superuser())))
}

/// A workflow that writes cannot run in a READ ONLY transaction: refused
/// before it runs, rather than when its writes are applied.
fn refuse_in_read_only_transaction(readonly: bool, type_name: &str, function: &str) -> Result<()> {
    // SAFETY: a plain bool of the current transaction, read on the main thread.
    if !readonly && unsafe { pgrx::pg_sys::XactReadOnly } {
        return Err(LambdaError::ReadOnlyTransaction(format!(
            "\"{type_name}.{function}\" may write, and the transaction is READ ONLY (only readonly functions can run in it)"
        )));
    }
    Ok(())
}

/// `lambda_invoke(object_id, method, args)`, for `caller`.
pub fn invoke_method(caller: Caller, object: i64, method: &str, args: &str) -> Result<String> {
    invoke(caller, None, object, method, args)
}

/// Job `job`: its method call, for the role that submitted it.
pub fn run_job(caller: Caller, job: i64, object: i64, method: &str, args: &str) -> Result<String> {
    invoke(caller, Some(job), object, method, args)
}

fn invoke(caller: Caller, job: Option<i64>, object: i64, method: &str, args: &str) -> Result<String> {
    occ::check_isolation()?;
    let started = Instant::now();
    let (info, module) = catalog::objects::lookup(object)?;
    access::check(caller, &info.app, Privilege::Invoke)?;
    let app = runtime::load(&module)?;
    // Calls refused before they run are not counted: made-up names would
    // fill the statistics' table.
    let readonly = method_callable_from_sql(&app, &info.type_name, method)?;
    refuse_in_read_only_transaction(readonly, &info.type_name, method)?;
    let workflow = start(caller, job);
    workflow.remember_object(object, info.clone());
    let outcome = run_method(&workflow, &info, &app, readonly, object, method, args);
    counted(&info.app, &info.type_name, method, started, outcome)
}

fn run_method(
    workflow: &Rc<Workflow>,
    info: &ObjectInfo,
    app: &Rc<AppVersion>,
    readonly: bool,
    object: i64,
    method: &str,
    args: &str,
) -> Result<String> {
    let frame = Frame {
        object,
        type_name: info.type_name.clone(),
        function: method.to_string(),
        readonly,
        depth: 0,
    };
    let result = runtime::run(workflow, app, frame, FunctionKind::Method, args)?;
    commit(workflow)?;
    Ok(result)
}

/// Validates and applies the workflow's writes, then queues the calls it
/// spawned (the outbox: they exist only if this transaction commits),
/// running as the workflow's role, children of the job it runs in if any.
fn commit(workflow: &Workflow) -> Result<()> {
    occ::commit(workflow)?;
    let writes = workflow.writes.borrow();
    if !writes.spawned().is_empty() {
        catalog::jobs::insert_spawned(writes.spawned(), workflow.caller, workflow.parent_job)?;
        crate::jobs::wake_workers_at_commit();
    }
    Ok(())
}

/// What `lambdastore.submit` checks before queueing a job, so that a typo
/// fails now rather than later in a worker: the object exists and the method
/// is one SQL may call. Returns the object's application.
pub fn check_submittable(caller: Caller, object: i64, method: &str, args: &str) -> Result<String> {
    let (info, module) = catalog::objects::lookup(object)?;
    access::check(caller, &info.app, Privilege::Invoke)?;
    let app = runtime::load(&module)?;
    method_callable_from_sql(&app, &info.type_name, method)?;
    runtime::check_args_size(args)?;
    Ok(info.app)
}

/// What `lambdastore.split` checks first: the caller owns the object's
/// application, the object exists and its type has the field, so that a
/// typo fails instead of adding a guard no entry will ever fall under.
pub fn check_field(caller: Caller, object: i64, field: &str) -> Result<()> {
    let (info, module) = catalog::objects::lookup(object)?;
    access::check(caller, &info.app, Privilege::Owner)?;
    let app = runtime::load(&module)?;
    if !app.type_desc(&info.type_name)?.fields.iter().any(|f| f.name == field) {
        return Err(LambdaError::UnknownField { ty: info.type_name, field: field.into() });
    }
    Ok(())
}

/// Whether `method` of `type_name` is a method SQL may call (not
/// protected), and if so whether it is readonly.
fn method_callable_from_sql(app: &AppVersion, type_name: &str, method: &str) -> Result<bool> {
    let f = app.function(type_name, method, FunctionKind::Method)?;
    refuse_protected(app, type_name, f)?;
    Ok(f.readonly)
}

/// `lambdastore.invoke_static(app, type, function, args)`, for `caller`.
pub fn invoke_static(caller: Caller, app_name: &str, type_name: &str, function: &str, args: &str) -> Result<String> {
    occ::check_isolation()?;
    let started = Instant::now();
    let app = current_version(caller, app_name)?;
    let f = app.function(type_name, function, FunctionKind::Static)?;
    refuse_protected(&app, type_name, f)?; // refused calls are not counted, as above
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
    let workflow = start(caller, None);
    let frame = Frame {
        object: 0,
        type_name: type_name.to_string(),
        function: function.to_string(),
        readonly,
        depth: 0,
    };
    let result = runtime::run(&workflow, app, frame, FunctionKind::Static, args)?;
    commit(&workflow)?;
    Ok(result)
}

/// `lambdastore.create_object(app, type, args)`, for `caller`.
pub fn create(caller: Caller, app_name: &str, type_name: &str, args: &str) -> Result<i64> {
    occ::check_isolation()?;
    let started = Instant::now();
    let app = current_version(caller, app_name)?;
    if let Some(ctor) = app.constructor(type_name)? {
        refuse_protected(&app, type_name, ctor)?; // refused calls are not counted, as above
    }
    refuse_in_read_only_transaction(false, type_name, "(create)")?;
    let outcome = run_create(caller, &app, type_name, args);
    counted(app_name, type_name, "(create)", started, outcome)
}

fn run_create(caller: Caller, app: &Rc<AppVersion>, type_name: &str, args: &str) -> Result<i64> {
    let workflow = start(caller, None);
    let id = create_object(&workflow, app, type_name, args, 0, false)?;
    commit(&workflow)?;
    Ok(id)
}

/// The code `caller` may invoke now in `app_name`.
fn current_version(caller: Caller, app_name: &str) -> Result<Rc<AppVersion>> {
    let module = catalog::modules::current(app_name)?;
    access::check(caller, app_name, Privilege::Invoke)?;
    runtime::load(&module)
}

fn refuse_protected(app: &AppVersion, type_name: &str, f: &runtime::FnDesc) -> Result<()> {
    if f.protected {
        return Err(LambdaError::Protected {
            app: app.app.clone(),
            ty: type_name.to_string(),
            function: f.name.clone(),
        });
    }
    Ok(())
}

fn create_object(
    workflow: &Rc<Workflow>,
    app: &Rc<AppVersion>,
    type_name: &str,
    args: &str,
    depth: u32,
    caller_readonly: bool,
) -> Result<i64> {
    let ctor = app.constructor(type_name)?.cloned();
    if caller_readonly {
        return Err(LambdaError::ReadonlyWrite { ty: type_name.to_string(), function: "(create)".into() });
    }
    let id = catalog::objects::next_id()?;
    let savepoint = workflow.writes.borrow().savepoint();
    workflow.writes.borrow_mut().create_object(id, app.app.clone(), type_name.to_string());
    workflow.remember_object(id, ObjectInfo { app: app.app.clone(), type_name: type_name.to_string() });
    let outcome = match ctor {
        Some(ctor) => {
            let frame = Frame {
                object: id,
                type_name: type_name.to_string(),
                function: ctor.name.clone(),
                readonly: ctor.readonly,
                depth,
            };
            runtime::run(workflow, app, frame, FunctionKind::Constructor, args).map(|_| id)
        }
        None if no_arguments(args) => Ok(id),
        None => Err(LambdaError::BadArguments {
            ty: type_name.to_string(),
            function: "(create)".into(),
            message: "the type has no constructor, so it takes no arguments".into(),
        }),
    };
    if outcome.is_err() {
        workflow.rollback_to(savepoint);
    }
    outcome
}

fn no_arguments(args: &str) -> bool {
    use serde_json::Value;
    match serde_json::from_str::<Value>(args) {
        Ok(Value::Null) => true,
        Ok(Value::Object(map)) => map.is_empty(),
        Ok(Value::Array(list)) => list.is_empty(),
        _ => false,
    }
}

/// Depth of a new nested call, refused past `lambdastore.max_call_depth` or
/// when the backend's stack is running out (wasm runs on it).
fn enter(caller: &HostState) -> Result<u32> {
    let depth = caller.frame.depth + 1;
    let max = gucs::max_call_depth();
    // SAFETY: reads the stack pointer and PostgreSQL's stack base.
    if depth > max || unsafe { pgrx::pg_sys::stack_is_too_deep() } {
        return Err(LambdaError::CallDepth(max));
    }
    Ok(depth)
}

fn object_info(workflow: &Workflow, id: i64) -> Result<ObjectInfo> {
    if let Some(info) = workflow.known_object(id) {
        return Ok(info);
    }
    let (info, _) = catalog::objects::lookup(id)?;
    workflow.remember_object(id, info.clone());
    Ok(info)
}

/// An object a lambda may reach: one of its own application's.
fn same_application_object(caller: &HostState, target: i64) -> Result<ObjectInfo> {
    let info = object_info(&caller.workflow, target)?;
    if info.app != caller.app.app {
        return Err(LambdaError::CrossApplication { object: target, caller: caller.app.app.clone(), target: info.app });
    }
    Ok(info)
}

/// Runs a nested call under a savepoint of the write buffer.
fn nested(caller: &HostState, frame: Frame, kind: FunctionKind, args: &str) -> Result<String> {
    let savepoint = caller.workflow.writes.borrow().savepoint();
    let outcome = runtime::run(&caller.workflow, &caller.app, frame, kind, args);
    if outcome.is_err() {
        caller.workflow.rollback_to(savepoint);
    }
    outcome
}

/// Host `call`: a method of another object of the same application.
pub fn call(caller: &HostState, target: i64, function: &str, args: &str) -> Result<String> {
    let depth = enter(caller)?;
    let info = same_application_object(caller, target)?;
    let f = caller.app.function(&info.type_name, function, FunctionKind::Method)?;
    let frame = Frame {
        object: target,
        type_name: info.type_name,
        function: function.to_string(),
        // A readonly caller stays readonly through its callees.
        readonly: f.readonly || caller.frame.readonly,
        depth,
    };
    nested(caller, frame, FunctionKind::Method, args)
}

/// Host `call-static`.
pub fn call_static(caller: &HostState, type_name: &str, function: &str, args: &str) -> Result<String> {
    let depth = enter(caller)?;
    let f = caller.app.function(type_name, function, FunctionKind::Static)?;
    let frame = Frame {
        object: 0,
        type_name: type_name.to_string(),
        function: function.to_string(),
        readonly: f.readonly || caller.frame.readonly,
        depth,
    };
    nested(caller, frame, FunctionKind::Static, args)
}

/// Host `create`: a new object of this application, through its constructor.
pub fn create_nested(caller: &HostState, type_name: &str, args: &str) -> Result<i64> {
    let depth = enter(caller)?;
    create_object(&caller.workflow, &caller.app, type_name, args, depth, caller.frame.readonly)
}

/// Host `spawn`: a method call on an object of this application, queued as
/// a job when the workflow commits. A callee's spawns are undone with its
/// savepoint, like its writes.
pub fn spawn(caller: &HostState, target: i64, function: &str, args: &str) -> Result<()> {
    if caller.frame.readonly {
        return Err(LambdaError::ReadonlyWrite {
            ty: caller.frame.type_name.clone(),
            function: caller.frame.function.clone(),
        });
    }
    let info = same_application_object(caller, target)?;
    // Protected methods are allowed: the call comes from a lambda.
    caller.app.function(&info.type_name, function, FunctionKind::Method)?;
    runtime::check_args_size(args)?;
    let spawned = caller.workflow.writes.borrow().spawned().len() + 1;
    if spawned > gucs::max_spawns() {
        return Err(LambdaError::TooMany {
            what: "the workflow spawns calls:",
            count: spawned,
            limit: gucs::max_spawns(),
            setting: "lambdastore.max_spawns",
        });
    }
    caller.workflow.writes.borrow_mut().spawn(Spawned {
        object: target,
        app: info.app,
        method: function.to_string(),
        args: args.to_string(),
    });
    Ok(())
}
