//! A narrow wrapper around wasmtime: one engine per backend, compiled
//! components cached on disk and in memory (an `InstancePre` per module
//! version), and `run`, which executes one function in a fresh store with
//! the invocation's limits. Nothing else of wasmtime is used elsewhere.

mod cache;
mod engine;

use crate::error::{from_wasmtime, LambdaError, Result};
use crate::gucs;
use crate::host::{CallError, Frame, FunctionKind, HostState, Lambda, LambdaPre, Limits};
use engine::runtime;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Store, UpdateDeadline};

use crate::access::Caller;
use crate::catalog::modules::ModuleKey;
use crate::txn::Workflow;

/// What a module's `describe` export says, as stored in `modules.description`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Description {
    pub sdk: String,
    pub types: Vec<TypeDesc>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TypeDesc {
    pub name: String,
    pub fields: Vec<FieldDesc>,
    pub functions: Vec<FnDesc>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FieldDesc {
    pub name: String,
    pub kind: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FnDesc {
    pub name: String,
    /// "constructor", "method" or "static".
    pub kind: String,
    pub protected: bool,
    pub readonly: bool,
}

impl FnDesc {
    pub fn kind(&self) -> FunctionKind {
        match self.kind.as_str() {
            "constructor" => FunctionKind::Constructor,
            "static" => FunctionKind::Static,
            _ => FunctionKind::Method,
        }
    }
}

/// One deployed version of an application, ready to instantiate.
pub struct AppVersion {
    pub app: String,
    pub description: Description,
    pre: LambdaPre<HostState>,
}

impl AppVersion {
    pub fn type_desc(&self, type_name: &str) -> Result<&TypeDesc> {
        self.description
            .types
            .iter()
            .find(|t| t.name == type_name)
            .ok_or_else(|| LambdaError::UnknownType { app: self.app.clone(), ty: type_name.to_string() })
    }

    /// The function `name` of `type_name`, which must be of kind `kind`.
    pub fn function(&self, type_name: &str, name: &str, kind: FunctionKind) -> Result<&FnDesc> {
        let ty = self.type_desc(type_name)?;
        let unknown = |why: String| LambdaError::UnknownFunction {
            ty: type_name.to_string(),
            function: name.to_string(),
            why,
        };
        let f = ty.functions.iter().find(|f| f.name == name).ok_or_else(|| unknown(String::new()))?;
        if f.kind() != kind {
            return Err(unknown(format!(" as a {} (it is a {})", kind_name(kind), f.kind)));
        }
        Ok(f)
    }

    pub fn constructor(&self, type_name: &str) -> Result<Option<&FnDesc>> {
        Ok(self.type_desc(type_name)?.functions.iter().find(|f| f.kind() == FunctionKind::Constructor))
    }
}

pub fn kind_name(kind: FunctionKind) -> &'static str {
    match kind {
        FunctionKind::Constructor => "constructor",
        FunctionKind::Method => "method",
        FunctionKind::Static => "static function",
    }
}

thread_local! {
    /// Module rows are immutable, so a version never goes stale.
    static APPS: RefCell<HashMap<ModuleKey, Rc<AppVersion>>> = RefCell::new(HashMap::new());
}

/// Loads a module version: from this backend's memory, else from the disk
/// cache (mmap), else by compiling the bytes from `lambdastore.modules`.
pub fn load(key: &ModuleKey) -> Result<Rc<AppVersion>> {
    if let Some(app) = APPS.with(|apps| apps.borrow().get(key).cloned()) {
        return Ok(app);
    }
    let module_id = key.module_id;
    let row = crate::catalog::modules::get(module_id)?;
    let engine = &runtime().engine;
    let started = Instant::now();
    let component = cache::load(engine, &key.sha256, || crate::catalog::modules::wasm(module_id))?;
    let loaded = started.elapsed();
    let app = Rc::new(AppVersion {
        app: row.app,
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

fn instantiate_pre(component: &wasmtime::component::Component) -> Result<LambdaPre<HostState>> {
    let mut linker = Linker::<HostState>::new(&runtime().engine);
    Lambda::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
        .map_err(|e| LambdaError::Internal(format!("linking the host interface: {e:#}")))?;
    let pre = linker
        .instantiate_pre(component)
        .map_err(|e| LambdaError::InvalidModule(format!("{e:#}")))?;
    LambdaPre::new(pre).map_err(|e| {
        LambdaError::InvalidModule(format!("it does not export the lambdastore:lambda world: {e:#}"))
    })
}

/// Validates a module for deployment: compiles it, links it against the
/// host interface and asks it to describe itself (for `caller`, within its
/// timeout). The compiled component is cached by `cache_compiled` once the
/// version is registered, so a refused deploy leaves nothing on disk.
pub fn validate(caller: Caller, wasm: &[u8]) -> Result<(Description, wasmtime::component::Component)> {
    let engine = &runtime().engine;
    let component = cache::compile(engine, wasm)?;
    let pre = instantiate_pre(&component)?;
    let probe = AppVersion {
        app: String::new(),
        description: Description { sdk: String::new(), types: Vec::new() },
        pre,
    };
    let workflow = Rc::new(Workflow::new(caller, None, gucs::timeout(caller.is_superuser())));
    let frame = Frame { object: 0, type_name: String::new(), function: "describe".into(), readonly: true, depth: 0 };
    // A description is a few kB: at most DESCRIBE_MEMORY of the lambda's
    // memory, so that a module cannot make the host lift a huge one.
    let memory = gucs::memory_limit_bytes().min(DESCRIBE_MEMORY);
    let desc = with_store(&workflow, &Rc::new(probe), frame, memory, |store, lambda| lambda.call_describe(store))?;
    check_description_size(&desc)?;
    let description = Description {
        sdk: desc.sdk,
        types: desc
            .types
            .into_iter()
            .map(|t| TypeDesc {
                name: t.name,
                fields: t
                    .fields
                    .into_iter()
                    .map(|f| FieldDesc { name: f.name, kind: field_kind_name(f.kind).into() })
                    .collect(),
                functions: t
                    .functions
                    .into_iter()
                    .map(|f| FnDesc {
                        name: f.name,
                        kind: match f.kind {
                            FunctionKind::Constructor => "constructor",
                            FunctionKind::Method => "method",
                            FunctionKind::Static => "static",
                        }
                        .into(),
                        protected: f.protected,
                        readonly: f.readonly,
                    })
                    .collect(),
            })
            .collect(),
    };
    check_description(&description)?;
    Ok((description, component))
}

/// Stores the compiled artifact of a version just registered, and removes
/// this database's artifacts of modules no version uses (`in_use`: those of
/// aborted deploys, or of a dropped extension).
pub fn cache_compiled(sha256: &str, component: &wasmtime::component::Component, in_use: Vec<String>) {
    let engine = &runtime().engine;
    cache::store_and_retain(engine, sha256, component, in_use.into_iter().collect());
}

/// Linear memory the `describe` call may use at most.
const DESCRIBE_MEMORY: usize = 16 << 20;
/// The largest description a module may give (names and kinds, in bytes).
const MAX_DESCRIPTION: usize = 1 << 20;

/// 42P13 for a description past `MAX_DESCRIPTION`, counted before it is
/// converted or stored: every backend that runs the application keeps it.
fn check_description_size(desc: &crate::host::lambdastore::lambda::types::AppDesc) -> Result<()> {
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

fn field_kind_name(kind: crate::host::lambdastore::lambda::types::FieldKind) -> &'static str {
    use crate::host::lambdastore::lambda::types::FieldKind::*;
    match kind {
        Cell => "cell",
        Map => "map",
        MultiMap => "multi-map",
        Set => "set",
    }
}

fn check_description(d: &Description) -> Result<()> {
    let invalid = |m: String| Err(LambdaError::InvalidModule(m));
    if d.types.is_empty() {
        return invalid("it describes no object types".into());
    }
    let mut types = std::collections::HashSet::new();
    // PostgreSQL's text cannot hold a NUL: the name stored would not be
    // the name described.
    let names = d.types.iter().flat_map(|t| {
        std::iter::once(&t.name).chain(t.fields.iter().map(|f| &f.name)).chain(t.functions.iter().map(|f| &f.name))
    });
    if let Some(name) = names.chain(std::iter::once(&d.sdk)).find(|name| name.contains('\0')) {
        return invalid(format!("the name {name:?} in its description contains a NUL byte"));
    }
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
        if t.functions.iter().filter(|f| f.kind() == FunctionKind::Constructor).count() > 1 {
            return invalid(format!("type \"{}\" has more than one constructor", t.name));
        }
    }
    Ok(())
}

/// Runs `function` of `type_name` on `object` (0 for static functions) in a
/// fresh store. A guest's error for its caller is `Err(Application)`.
pub fn run(
    workflow: &Rc<Workflow>,
    app: &Rc<AppVersion>,
    frame: Frame,
    kind: FunctionKind,
    args: &str,
) -> Result<String> {
    check_args_size(args)?;
    let (object, ty, function) = (frame.object, frame.type_name.clone(), frame.function.clone());
    let outcome = with_store(workflow, app, frame, gucs::memory_limit_bytes(), |store, lambda| {
        lambda.call_dispatch(store, kind, &ty, &function, object, args)
    })?;
    match outcome {
        Ok(result) => {
            check_size("the result is", result.len(), gucs::max_result_bytes(), "lambdastore.max_result_size")?;
            Ok(result)
        }
        Err(err) => Err(guest_error(err, &ty, &function)),
    }
}

/// What a guest's `call-error` means for the workflow.
fn guest_error(err: CallError, ty: &str, function: &str) -> LambdaError {
    match err {
        CallError::Application(message) => LambdaError::Application { message },
        CallError::BadArguments(message) => {
            LambdaError::BadArguments { ty: ty.into(), function: function.into(), message }
        }
        CallError::UnknownObject(id) => LambdaError::UnknownObject(id),
        CallError::UnknownFunction(why) => LambdaError::UnknownFunction {
            ty: ty.into(),
            function: function.into(),
            why: format!(" in the module ({why})"),
        },
        CallError::NotAllowed(message) => LambdaError::PermissionDenied(message),
    }
}

/// Arguments past `lambdastore.max_args_size` are refused before any call
/// (or job) is made with them.
pub fn check_args_size(args: &str) -> Result<()> {
    check_size("the arguments are", args.len(), gucs::max_args_bytes(), "lambdastore.max_args_size")
}

fn check_size(what: &'static str, size: usize, limit: usize, setting: &'static str) -> Result<()> {
    if size > limit {
        return Err(LambdaError::TooLarge { what, size, limit, setting });
    }
    Ok(())
}

fn with_store<R>(
    workflow: &Rc<Workflow>,
    app: &Rc<AppVersion>,
    frame: Frame,
    memory_limit: usize,
    f: impl FnOnce(&mut Store<HostState>, &Lambda) -> wasmtime::Result<R>,
) -> Result<R> {
    let rt = runtime();
    let state = HostState {
        workflow: workflow.clone(),
        app: app.clone(),
        frame,
        limits: Limits { memory_limit },
    };
    let mut store = Store::new(&rt.engine, state);
    store.limiter(|state| &mut state.limits);
    // With epoch interruption on, every store needs a deadline: here, every
    // tick, where the callback decides whether to go on.
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|ctx| {
        ctx.data().workflow.keep_going()?;
        Ok(UpdateDeadline::Continue(1))
    });
    let _running = rt.start();
    let lambda = app.pre.instantiate(&mut store).map_err(from_wasmtime)?;
    f(&mut store, &lambda).map_err(from_wasmtime)
}

