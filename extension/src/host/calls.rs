//! Nested calls: what a lambda asks of the host to reach other objects
//! (`call`, `call-static`, `create`, `spawn`). Calls and spawns may reach
//! another application's objects (`callee`); each application runs the
//! code version the workflow pinned for it. A nested call takes a
//! savepoint of the write buffer, so that a callee returning its own error
//! leaves nothing behind. A call or spawn for an object stored on
//! another Citus node goes there (cluster/remote.rs drives it).

use super::registry::{self, AppVersion};
use super::{Frame, HostState};
use crate::access::{self, Caller};
use crate::catalog;
use crate::cluster::{affinity, remote, route};
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::jobs::queue::due_at;
use crate::pg;
use crate::txn::Workflow;
use lambdastore_core::model::{CallFailure, Draw, FunctionKind, MethodCall, ModuleKey, ObjectInfo, Spawned};
use std::rc::Rc;

/// Creates an object of `type_name` in the workflow and runs its
/// constructor (at `depth`); a readonly caller may not.
pub(crate) fn create_object(
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
    let id = workflow.draw(Draw::ObjectId, Draw::object_id, catalog::objects::next_id)?;
    let savepoint = workflow.savepoint();
    workflow.create_object(id, ObjectInfo { app: app.app.clone(), type_name: type_name.to_string() });
    let outcome = match ctor {
        Some(ctor) => {
            let frame = Frame {
                object: id,
                type_name: type_name.to_string(),
                function: ctor.name.clone(),
                readonly: ctor.readonly,
                depth,
            };
            registry::run(workflow, app, frame, FunctionKind::Constructor, args).map(|_| id)
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

/// A run on a light replica reads and writes its own object only: what
/// else a lambda asks for (`what`) hands the whole call to the object's
/// owner, which runs it again from the start (cluster/replica.rs). A
/// module's `describe` may ask for none of it.
fn owner_only(caller: &HostState, what: &'static str) -> Result<()> {
    caller.refuse_in_describe(what)?;
    if caller.workflow.on_replica() {
        return Err(LambdaError::HandOver(what));
    }
    Ok(())
}

/// Depth of a new nested call, refused past `lambdastore.max_call_depth` or
/// when the backend's stack is running out (wasm runs on it).
fn enter(caller: &HostState) -> Result<u32> {
    owner_only(caller, "a nested call")?;
    let depth = caller.frame.depth + 1;
    let max = gucs::max_call_depth();
    if depth > max || pg::backend::stack_too_deep() {
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

/// Object `target` and the code that runs its method `function` for a
/// lambda of `app`: `app` itself for an object of its own application.
/// Another application's object may be called when its application may be
/// invoked by both the role the workflow runs for and `app`'s owner (whose
/// code makes the call: a gateway call runs as the extension's owner), and
/// not through a protected function. It runs the code version the
/// workflow pinned for its application, else the current one.
fn callee(
    workflow: &Workflow,
    app: &Rc<AppVersion>,
    target: i64,
    function: &str,
) -> Result<(ObjectInfo, Rc<AppVersion>)> {
    let info = object_info(workflow, target)?;
    if info.app == app.app {
        // Protected methods are allowed: the call comes from a lambda.
        app.function(&info.type_name, function, FunctionKind::Method)?;
        return Ok((info, Rc::clone(app)));
    }
    access::check_call_across(workflow.caller, &app.app, &info.app)?;
    let key = match workflow.version_of(&info.app) {
        Some(pinned) => pinned,
        None => catalog::modules::current(&info.app)?,
    };
    // Both sides pinned: a call back into the caller's application runs
    // the version it runs now. (Within one application nothing is pinned:
    // every frame runs the version its caller passes down.)
    workflow.pin([&app.key, &key]);
    let version = registry::load_in(workflow, &key)?;
    version.refuse_protected(&info.type_name, version.function(&info.type_name, function, FunctionKind::Method)?)?;
    Ok((info, version))
}

/// Runs a nested call under a savepoint of the write buffer.
fn nested(
    workflow: &Rc<Workflow>,
    app: &Rc<AppVersion>,
    frame: Frame,
    kind: FunctionKind,
    args: &str,
) -> Result<String> {
    let savepoint = workflow.savepoint();
    let outcome = registry::run(workflow, app, frame, kind, args);
    if outcome.is_err() {
        workflow.rollback_to(savepoint);
    }
    outcome
}

/// Host `call`: a method of another object of the same application, on
/// this node or on the one holding it.
pub(crate) fn call(caller: &HostState, target: i64, function: &str, args: &str) -> Result<String> {
    let depth = enter(caller)?;
    let migrating = migrates_itself(caller, target, function);
    if migrating && caller.frame.readonly && pg::xact::read_only() {
        // Said here, before the migration's writes fail at the commit with
        // PostgreSQL's own words about a DELETE.
        return Err(LambdaError::ReadOnlyTransaction(format!(
            "object {target} was stored by an older version of \"{}\", and migrating it writes: the \
             transaction is READ ONLY (lambdastore.migrate_objects('{}') migrates every object beforehand)",
            caller.frame.type_name, caller.app.app
        )));
    }
    let call = MethodCall {
        object: target,
        method: function.to_string(),
        args: args.to_string(),
        readonly: caller.frame.readonly && !migrating,
        depth,
    };
    let owner = route::owner_elsewhere(target)?;
    let outcome = match &owner {
        Some(node) => call_elsewhere(caller, node, call),
        None => method_here(&caller.workflow, &caller.app, &call),
    };
    // A run stopped for a call on a third node makes it again when it runs again.
    if !matches!(outcome, Err(LambdaError::Suspended(_))) {
        affinity::called(caller.frame.object, target, owner.is_some());
    }
    outcome
}

/// Host `call` for an object stored on `node`. On a node that was sent a
/// call itself, it is the outcome an earlier run got, or the run stops
/// for the driving node to make the call.
fn call_elsewhere(caller: &HostState, node: &str, call: MethodCall) -> Result<String> {
    let outcome = if route::arrived() {
        caller.workflow.replay_call(call, &caller.app.key)?
    } else {
        remote::drive(&caller.workflow, Some(&caller.app.key), node, call, &[], run_needed)?
    };
    outcome.map_err(LambdaError::from)
}

/// A call a run on another node needs (`remote::Needed`), with that run's
/// code version `module`: in `workflow` if its object is stored here, else
/// driven on its node.
pub(crate) fn run_needed(
    workflow: &Rc<Workflow>,
    module: &ModuleKey,
    call: MethodCall,
    busy: &[i64],
) -> Result<Result<String, CallFailure>> {
    if busy.contains(&call.object) {
        return Err(LambdaError::CallBack(call.object));
    }
    let app = registry::load_in(workflow, module)?;
    match route::owner_elsewhere(call.object)? {
        Some(node) => remote::drive(workflow, Some(&app.key), &node, call, busy, run_needed),
        None => match method_here(workflow, &app, &call) {
            Ok(result) => Ok(Ok(result)),
            Err(failed) => failed.call_failure().map(Err).ok_or(failed),
        },
    }
}

/// Whether a method calls its own object's migration, which the SDK does
/// before any method on an object whose fields are behind its code
/// (`#[migrate(N)]`): that call may write even when the method is
/// readonly, or a readonly function could never run on an old object.
fn migrates_itself(caller: &HostState, target: i64, function: &str) -> bool {
    target == caller.frame.object && function == MIGRATE
}

/// The method name of an object's migration (the SDK's `desc::MIGRATE`).
pub(crate) const MIGRATE: &str = "migrate";

/// A nested method call on an object stored on this node, in `workflow`
/// (run by `app`): from a lambda here, or needed by one on another node.
pub(crate) fn method_here(workflow: &Rc<Workflow>, app: &Rc<AppVersion>, call: &MethodCall) -> Result<String> {
    let max = gucs::max_call_depth();
    if call.depth > max {
        return Err(LambdaError::CallDepth(max));
    }
    let (info, app) = callee(workflow, app, call.object, &call.method)?;
    let f = app.function(&info.type_name, &call.method, FunctionKind::Method)?;
    let frame = Frame {
        object: call.object,
        type_name: info.type_name,
        function: call.method.clone(),
        // A readonly caller stays readonly through its callees.
        readonly: f.readonly || call.readonly,
        depth: call.depth,
    };
    affinity::received(call.object);
    nested(workflow, &app, frame, FunctionKind::Method, &call.args)
}

/// Host `call-static`.
pub(crate) fn call_static(caller: &HostState, type_name: &str, function: &str, args: &str) -> Result<String> {
    let depth = enter(caller)?;
    let f = caller.app.function(type_name, function, FunctionKind::Static)?;
    let frame = Frame {
        object: 0,
        type_name: type_name.to_string(),
        function: function.to_string(),
        readonly: f.readonly || caller.frame.readonly,
        depth,
    };
    nested(&caller.workflow, &caller.app, frame, FunctionKind::Static, args)
}

/// Host `create`: a new object of this application, through its constructor.
pub(crate) fn create_nested(caller: &HostState, type_name: &str, args: &str) -> Result<i64> {
    let depth = enter(caller)?;
    create_object(&caller.workflow, &caller.app, type_name, args, depth, caller.frame.readonly)
}

/// Host `spawn`: a method call on an object of this application, queued as
/// a job when the workflow commits. A callee's spawns are undone with its
/// savepoint, like its writes. For an object stored on another node, the
/// node queuing the job checks the object and the method then.
pub(crate) fn spawn(
    caller: &HostState,
    target: i64,
    function: &str,
    args: &str,
    due_micros: Option<i64>,
) -> Result<()> {
    owner_only(caller, "a spawn")?;
    check_writable(caller)?;
    if let Some(at) = due_micros {
        due_at(at)?;
    }
    // The job is the object's application's (its queue and limits); one on
    // another node is checked, and given its application, there.
    let app = match route::owner_elsewhere(target)? {
        None => callee(&caller.workflow, &caller.app, target, function)?.0.app,
        Some(_) => caller.app.app.clone(),
    };
    check_queued_args(args)?;
    let call =
        Spawned { object: target, app, method: function.to_string(), args: args.to_string(), due_micros, timer: None };
    caller.workflow.spawn(call, gucs::max_spawns(), gucs::max_write_bytes())
}

/// Host `set-timer` (`call` is when, what and with what) and
/// `clear-timer` (None): a change of the running object's timer `name`,
/// made when the workflow commits (jobs/queue.rs), undone with a callee's
/// savepoint like a spawn. A timer is a job of its object, which is
/// stored on this node.
pub(crate) fn set_timer(caller: &HostState, name: &str, call: Option<(i64, &str, &str)>) -> Result<()> {
    owner_only(caller, "a timer")?;
    check_writable(caller)?;
    let object = caller.frame.object;
    if object == 0 {
        return Err(LambdaError::InvalidParameter(format!(
            "{}.{} is static: timers belong to an object",
            caller.frame.type_name, caller.frame.function
        )));
    }
    if name.is_empty() || name.len() > MAX_TIMER_NAME || name.contains('\0') {
        return Err(LambdaError::InvalidParameter(format!(
            "a timer's name is 1 to {MAX_TIMER_NAME} bytes without NUL, not {} bytes{}",
            name.len(),
            if name.contains('\0') { " with one" } else { "" }
        )));
    }
    let (due_micros, method, args) = match call {
        Some((at, function, args)) => {
            due_at(at)?;
            caller.app.function(&caller.frame.type_name, function, FunctionKind::Method)?;
            check_queued_args(args)?;
            (Some(at), function.to_string(), args.to_string())
        }
        None => (None, String::new(), String::new()),
    };
    let change =
        Spawned { object, app: caller.app.app.clone(), method, args, due_micros, timer: Some(name.to_string()) };
    caller.workflow.spawn(change, gucs::max_spawns(), gucs::max_write_bytes())
}

/// The arguments of a call queued as a job: within `max_args_size`, and
/// storable as jsonb, which holds no `\u0000` (22023; at the commit it
/// was a bare 22P05 naming nothing).
fn check_queued_args(args: &str) -> Result<()> {
    registry::check_args_size(args)?;
    fn has_nul(value: &serde_json::Value) -> bool {
        match value {
            serde_json::Value::String(text) => text.contains('\0'),
            serde_json::Value::Array(items) => items.iter().any(has_nul),
            serde_json::Value::Object(map) => map.iter().any(|(key, value)| key.contains('\0') || has_nul(value)),
            _ => false,
        }
    }
    // Only text with an escape can hold one.
    if args.contains("\\u0000") && serde_json::from_str(args).is_ok_and(|value| has_nul(&value)) {
        return Err(LambdaError::InvalidParameter(
            "a queued call's arguments may not hold \\u0000: PostgreSQL's jsonb cannot store it".into(),
        ));
    }
    Ok(())
}

/// The longest timer name: a name, not data.
const MAX_TIMER_NAME: usize = 255;

/// Spawns and timers are writes: not from a readonly function.
fn check_writable(caller: &HostState) -> Result<()> {
    if caller.frame.readonly {
        return Err(LambdaError::ReadonlyWrite {
            ty: caller.frame.type_name.clone(),
            function: caller.frame.function.clone(),
        });
    }
    Ok(())
}

/// A spawned call for an object of this node, queued by a lambda of
/// application `spawned.app` on another node (`_spawn_here`) for
/// `caller`: checked as a spawn on this node is; the job is the object's
/// application's.
pub(crate) fn check_spawned_here(caller: Caller, spawned: &mut Spawned) -> Result<()> {
    let (info, module) = catalog::objects::lookup(spawned.object)?;
    let version = registry::load(&module)?;
    let f = version.function(&info.type_name, &spawned.method, FunctionKind::Method)?;
    if info.app != spawned.app {
        access::check_call_across(caller, &spawned.app, &info.app)?;
        version.refuse_protected(&info.type_name, f)?;
        spawned.app = info.app;
    }
    registry::check_args_size(&spawned.args)
}
