//! The application registry: deployed module versions, loaded and linked
//! against the host interface, and running one function of one in a fresh
//! store. A backend keeps each version it has loaded (module rows are
//! immutable, so a version never goes stale).

use super::lambdastore::lambda::types as wit;
use super::{CallError, Frame, HostState, Lambda, LambdaPre};
use crate::access::Caller;
use crate::catalog;
use crate::error::{LambdaError, Refusal, Result};
use crate::gucs;
use crate::pg;
use crate::runtime::{self, Component, Sandboxed};
use crate::txn::Workflow;
use lambdastore_core::model::{Description, FnDesc, FunctionKind, ModuleKey, TypeDesc};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;
use wasmtime::component::HasSelf;

/// One deployed version of an application, ready to instantiate.
pub(crate) struct AppVersion {
    pub(crate) app: String,
    /// Which version: nested calls on other nodes run the same.
    pub(crate) key: ModuleKey,
    pub(crate) description: Description,
    pre: LambdaPre<Sandboxed<HostState>>,
}

impl AppVersion {
    pub(crate) fn type_desc(&self, type_name: &str) -> Result<&TypeDesc> {
        self.description
            .type_desc(type_name)
            .ok_or_else(|| LambdaError::UnknownType { app: self.app.clone(), ty: type_name.to_string() })
    }

    /// The function `name` of `type_name`, which must be of kind `kind`.
    pub(crate) fn function(&self, type_name: &str, name: &str, kind: FunctionKind) -> Result<&FnDesc> {
        let ty = self.type_desc(type_name)?;
        let unknown =
            |why: String| LambdaError::UnknownFunction { ty: type_name.to_string(), function: name.to_string(), why };
        let f = ty.functions.iter().find(|f| f.name == name).ok_or_else(|| unknown(String::new()))?;
        if f.kind != kind {
            return Err(unknown(format!(" as a {} (it is a {})", kind.name(), f.kind.name())));
        }
        Ok(f)
    }

    /// 42501 if `f` (of `type_name`) is protected: callable only by
    /// lambdas of this application, not from SQL or other applications.
    pub(crate) fn refuse_protected(&self, type_name: &str, f: &FnDesc) -> Result<()> {
        if f.protected {
            return Err(LambdaError::Protected {
                app: self.app.clone(),
                ty: type_name.to_string(),
                function: f.name.clone(),
            });
        }
        Ok(())
    }

    pub(crate) fn constructor(&self, type_name: &str) -> Result<Option<&FnDesc>> {
        Ok(self.type_desc(type_name)?.functions.iter().find(|f| f.kind == FunctionKind::Constructor))
    }
}

thread_local! {
    static APPS: RefCell<HashMap<ModuleKey, Rc<AppVersion>>> = RefCell::new(HashMap::new());
}

/// Loads a module version: from this backend's memory, else from the disk
/// cache (mmap), else by compiling the bytes from `lambdastore.modules`.
pub(crate) fn load(key: &ModuleKey) -> Result<Rc<AppVersion>> {
    if let Some(app) = loaded(key) {
        return Ok(app);
    }
    let module_id = key.module_id;
    let row = catalog::modules::get(module_id)?;
    let started = Instant::now();
    let component = runtime::load(&key.sha256, || catalog::modules::wasm(module_id))?;
    let loaded = started.elapsed();
    let app = Rc::new(AppVersion {
        app: row.app,
        key: key.clone(),
        description: row.description,
        pre: instantiate_pre(&component)?,
    });
    pgrx::debug1!(
        "lambdastore: module {module_id} of {} loaded in {} µs, linked in {} µs",
        app.app,
        loaded.as_micros(),
        (started.elapsed() - loaded).as_micros()
    );
    APPS.with(|apps| {
        let mut apps = apps.borrow_mut();
        if apps.len() >= 256 {
            apps.clear(); // old versions of busy redeployers; reload on demand
        }
        apps.insert(key.clone(), app.clone());
    });
    Ok(app)
}

fn loaded(key: &ModuleKey) -> Option<Rc<AppVersion>> {
    APPS.with(|apps| apps.borrow().get(key).cloned())
}

/// `load`, in a running `workflow`, whose deadline does not count the
/// time a load takes (`Workflow::not_counted`).
pub(crate) fn load_in(workflow: &Workflow, key: &ModuleKey) -> Result<Rc<AppVersion>> {
    if let Some(app) = loaded(key) {
        return Ok(app);
    }
    let started = Instant::now();
    let app = load(key);
    workflow.not_counted(started.elapsed());
    app
}

fn instantiate_pre(component: &Component) -> Result<LambdaPre<Sandboxed<HostState>>> {
    let mut linker = runtime::linker::<HostState>();
    Lambda::add_to_linker::<Sandboxed<HostState>, HasSelf<HostState>>(&mut linker, |state| &mut state.data)
        .map_err(|e| LambdaError::Internal(format!("linking the host interface: {e:#}")))?;
    let pre = linker.instantiate_pre(component).map_err(|e| LambdaError::InvalidModule(format!("{e:#}")))?;
    LambdaPre::new(pre)
        .map_err(|e| LambdaError::InvalidModule(format!("it does not export the lambdastore:lambda world: {e:#}")))
}

/// The largest description a module may give (names and kinds, in bytes).
const MAX_DESCRIPTION: usize = 1 << 20;

/// Validates a module for deployment: compiles it (or maps the artifact a
/// version with the same bytes left, `sha256`), links it against the host
/// interface and asks it to describe itself (for `caller`, within its
/// timeout). The caller caches the component (`runtime::cache_compiled`)
/// once the version is registered, so a refused deploy leaves nothing on disk.
pub(crate) fn validate(caller: Caller, sha256: &str, wasm: &[u8]) -> Result<(Description, Component)> {
    let component = runtime::compile_or_cached(sha256, wasm)?;
    let probe = Rc::new(AppVersion {
        app: String::new(),
        key: ModuleKey { module_id: 0, app: String::new(), sha256: String::new() },
        description: Description { sdk: String::new(), types: Vec::new() },
        pre: instantiate_pre(&component)?,
    });
    let workflow = Rc::new(Workflow::new(caller, None, gucs::timeout(caller.is_superuser())));
    // The memory of a call: a Python interpreter's snapshot alone is 13 MB or
    // more, and a module that deploys must be able to run. What the host
    // lifts is bounded by it, as a call's result is.
    let memory = gucs::memory_limit_bytes();
    let desc =
        with_instance(&workflow, &probe, Frame::describe(), memory, |store, lambda| lambda.call_describe(store))?;
    check_description_size(&desc)?;
    let description = Description::from(desc);
    check_description(&description)?;
    Ok((description, component))
}

/// 42P13 for a description past `MAX_DESCRIPTION`, counted before it is
/// converted or stored: every backend that runs the application keeps it.
fn check_description_size(desc: &wit::AppDesc) -> Result<()> {
    let size: usize = desc.sdk.len()
        + desc
            .types
            .iter()
            .map(|t| {
                t.name.len()
                    + t.fields.iter().map(|f| f.name.len() + 16).sum::<usize>()
                    + t.functions.iter().map(|f| f.name.len() + 32).sum::<usize>()
            })
            .sum::<usize>();
    if size > MAX_DESCRIPTION {
        return Err(LambdaError::InvalidModule(format!(
            "its description is about {size} bytes, more than {MAX_DESCRIPTION}: {} types, {} functions",
            desc.types.len(),
            desc.types.iter().map(|t| t.functions.len()).sum::<usize>()
        )));
    }
    Ok(())
}

fn check_description(d: &Description) -> Result<()> {
    let invalid = |m: String| Err(LambdaError::InvalidModule(m));
    if d.types.is_empty() {
        return invalid("it describes no object types".into());
    }
    // PostgreSQL's text cannot hold a NUL: the name stored would not be
    // the name described.
    let names = d.types.iter().flat_map(|t| {
        std::iter::once(&t.name).chain(t.fields.iter().map(|f| &f.name)).chain(t.functions.iter().map(|f| &f.name))
    });
    if let Some(name) = names.chain(std::iter::once(&d.sdk)).find(|name| name.contains('\0')) {
        return invalid(format!("the name {name:?} in its description contains a NUL byte"));
    }
    let mut types = std::collections::HashSet::new();
    for t in &d.types {
        if t.name.is_empty() || !types.insert(&t.name) {
            return invalid(format!("type name \"{}\" is empty or repeated", t.name));
        }
        let mut names = std::collections::HashSet::new();
        for f in &t.fields {
            if f.name.is_empty() || !names.insert(&f.name) {
                return invalid(format!("field \"{}.{}\" is empty or repeated", t.name, f.name));
            }
        }
        let mut names = std::collections::HashSet::new();
        for f in &t.functions {
            if f.name.is_empty() || !names.insert(&f.name) {
                return invalid(format!("function \"{}.{}\" is empty or repeated", t.name, f.name));
            }
        }
        if t.functions.iter().filter(|f| f.kind == FunctionKind::Constructor).count() > 1 {
            return invalid(format!("type \"{}\" has more than one constructor", t.name));
        }
    }
    Ok(())
}

/// Runs `function` of `type_name` on `object` (0 for static functions) in a
/// fresh store. A guest's error for its caller is `Err(Application)`.
pub(crate) fn run(
    workflow: &Rc<Workflow>,
    app: &Rc<AppVersion>,
    frame: Frame,
    kind: FunctionKind,
    args: &str,
) -> Result<String> {
    check_args_size(args)?;
    let (object, ty, function) = (frame.object, frame.type_name.clone(), frame.function.clone());
    let outcome = with_instance(workflow, app, frame, gucs::memory_limit_bytes(), |store, lambda| {
        lambda.call_dispatch(store, kind.into(), &ty, &function, object, args)
    })?;
    match outcome {
        Ok(result) => {
            check_size("the result is", result.len(), gucs::max_result_bytes(), "lambdastore.max_result_size")?;
            Ok(result)
        }
        Err(err) => Err(guest_error(err, &ty, &function)),
    }
}

/// What a guest's `call-error` means for the workflow. It is either the
/// guest's own (its dispatcher found no such function, the arguments did
/// not decode) or a callee's failure the guest passed on with `?`, which
/// keeps the callee's message (the host wrote it: `CallFailure`).
fn guest_error(err: CallError, ty: &str, function: &str) -> LambdaError {
    let passed_on = |refusal, message| LambdaError::Refused { refusal, message };
    match err {
        CallError::Application(message) => LambdaError::Application { message },
        CallError::BadArguments(message) if message.starts_with("bad arguments for ") => {
            passed_on(Refusal::BadArguments, message)
        }
        CallError::BadArguments(message) => {
            LambdaError::BadArguments { ty: ty.into(), function: function.into(), message }
        }
        CallError::UnknownObject(id) => LambdaError::UnknownObject(id),
        // The SDK's dispatcher names the function it was asked for.
        CallError::UnknownFunction(why) if why == format!("{ty}.{function}") => LambdaError::UnknownFunction {
            ty: ty.into(),
            function: function.into(),
            why: format!(" in the module ({why})"),
        },
        CallError::UnknownFunction(message) => passed_on(Refusal::UnknownFunction, message),
        CallError::NotAllowed(message) => passed_on(Refusal::NotAllowed, message),
    }
}

/// Arguments past `lambdastore.max_args_size` are refused before any call
/// (or job) is made with them.
pub(crate) fn check_args_size(args: &str) -> Result<()> {
    check_size("the arguments are", args.len(), gucs::max_args_bytes(), "lambdastore.max_args_size")
}

fn check_size(what: &'static str, size: usize, limit: usize, setting: &'static str) -> Result<()> {
    if size > limit {
        return Err(LambdaError::TooLarge { what, size, limit, setting });
    }
    Ok(())
}

/// Instantiates `app` in a fresh store for `frame` and hands it to `f`;
/// the workflow's deadline and cancels stop it at every epoch tick.
fn with_instance<R>(
    workflow: &Rc<Workflow>,
    app: &Rc<AppVersion>,
    frame: Frame,
    memory_limit: usize,
    f: impl FnOnce(&mut wasmtime::Store<Sandboxed<HostState>>, &Lambda) -> wasmtime::Result<R>,
) -> Result<R> {
    let state = HostState { workflow: workflow.clone(), app: app.clone(), frame };
    runtime::call(
        state,
        memory_limit,
        |state| state.workflow.keep_going(),
        |store| {
            // What `make bench-python` reads: the cost of a fresh instance
            // per call and of the run in it (the guest and its host calls),
            // timed only when the line will go somewhere.
            let started = pg::backend::debug2_wanted().then(Instant::now);
            let lambda = app.pre.instantiate_checked_once(&mut *store)?;
            let made = started.map(|started| started.elapsed());
            let result = f(store, &lambda);
            if let (Some(started), Some(made)) = (started, made) {
                pgrx::debug2!(
                    "lambdastore: an instance of {} made in {} µs, ran in {} µs, its linear memory {} bytes at most",
                    app.app,
                    made.as_micros(),
                    started.elapsed().saturating_sub(made).as_micros(),
                    store.data().memory_size()
                );
            }
            result
        },
    )
}
