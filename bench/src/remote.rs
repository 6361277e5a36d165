//! The disaggregated baseline: the same compiled lambdas, run by wasmtime in
//! the driver process, with PostgreSQL as remote storage. Every entry read,
//! write, delete and scan is one SQL round trip on the caller's connection;
//! a call is one transaction (`REPEATABLE READ READ ONLY` for a readonly
//! function, `SERIALIZABLE` otherwise), so it keeps the guarantees the
//! extension gives and only the placement of the code differs. This is the
//! paper's "stateless function + external storage" design.
//!
//! Not supported, because no benchmark workload needs them: `create` and
//! `spawn` (a guest gets `not-allowed`), and undoing a failed nested call's
//! writes while its caller goes on (there is no write buffer to discard; a
//! callee's error aborts the whole call instead).

use anyhow::{anyhow, bail, Context, Result};
use postgres::{Client, Statement};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, Store};

use lambdastore_core::model::{self, Description};
use lambdastore_core::wit::{lambdastore, CallError, Direction, Entry, FunctionKind, Lambda, LambdaPre, LogLevel};

/// Nested calls deeper than this are refused, like the extension's default.
const MAX_DEPTH: u32 = 8;

/// A compiled application, shared by every client thread.
pub struct RemoteApp {
    engine: Engine,
    pre: LambdaPre<State>,
    /// What the module's `describe` said, as the extension stores it.
    description: Description,
}

impl RemoteApp {
    pub fn load(wasm: &[u8]) -> Result<RemoteApp> {
        let (engine, component) = compiled(wasm)?;
        let mut linker = Linker::<State>::new(&engine);
        Lambda::add_to_linker::<State, HasSelf<State>>(&mut linker, |state| state)?;
        let pre = LambdaPre::new(linker.instantiate_pre(&component)?)?;
        let mut store = Store::new(&engine, State::detached());
        let description = Description::from(pre.instantiate(&mut store)?.call_describe(&mut store)?);
        Ok(RemoteApp { engine, pre, description })
    }

    fn function(&self, type_name: &str, function: &str, kind: FunctionKind) -> Result<&model::FnDesc, CallError> {
        match self.description.function(type_name, function) {
            Some(f) if f.kind == kind.into() => Ok(f),
            _ => Err(CallError::UnknownFunction(format!("{type_name}.{function}"))),
        }
    }
}

/// The process's engine and `wasm` compiled with it, compiled once per
/// process however many clients load it: each client has its own
/// `RemoteApp` (its host state is not `Send`), but a component and its
/// engine are, and compiling a Python guest or, in a debug build, any guest
/// takes seconds.
fn compiled(wasm: &[u8]) -> Result<(Engine, Component)> {
    static COMPILED: OnceLock<Mutex<(Option<Engine>, HashMap<Vec<u8>, Component>)>> = OnceLock::new();
    let mut compiled = COMPILED.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner());
    let (engine, components) = &mut *compiled;
    let engine = match engine {
        Some(engine) => engine.clone(),
        None => {
            let mut config = Config::new();
            config.wasm_component_model(true);
            engine.insert(Engine::new(&config)?).clone()
        }
    };
    let component = match components.get(wasm) {
        Some(component) => component.clone(),
        None => {
            let component = Component::new(&engine, wasm).context("compile the component")?;
            components.insert(wasm.to_vec(), component.clone());
            component
        }
    };
    Ok((engine, component))
}

/// Why a remote call did not return a result.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// A serialization failure or deadlock: the call may be retried.
    #[error("serialization failure: {0}")]
    Retry(postgres::Error),
    /// The guest returned an error of its own.
    #[error("the lambda failed: {0:?}")]
    Guest(CallError),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// One client's connection to the storage, and what it caches: prepared
/// statements and the (immutable) type of every object it has seen.
pub struct RemoteSession {
    app: Rc<RemoteApp>,
    db: Rc<RefCell<Db>>,
}

struct Db {
    client: Client,
    types: HashMap<i64, String>,
    statements: HashMap<&'static str, Statement>,
}

impl Db {
    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.statements.insert(sql, s.clone());
        Ok(s)
    }

    fn type_of(&mut self, object: i64) -> Result<Option<String>, postgres::Error> {
        if let Some(t) = self.types.get(&object) {
            return Ok(Some(t.clone()));
        }
        let s = self.statement("SELECT type_name FROM lambdastore.objects WHERE object_id = $1")?;
        let row = self.client.query_opt(&s, &[&object])?;
        let t: Option<String> = row.map(|r| r.get(0));
        if let Some(t) = &t {
            self.types.insert(object, t.clone());
        }
        Ok(t)
    }
}

impl RemoteSession {
    pub fn new(app: Rc<RemoteApp>, client: Client) -> RemoteSession {
        let db = Db { client, types: HashMap::new(), statements: HashMap::new() };
        RemoteSession { app, db: Rc::new(RefCell::new(db)) }
    }

    /// Calls method `function` on `object` with JSON `args`, as one
    /// transaction; returns the JSON result.
    pub fn invoke(&mut self, object: i64, function: &str, args: &str) -> Result<String, RemoteError> {
        let type_name = self
            .db
            .borrow_mut()
            .type_of(object)
            .map_err(classify)?
            .ok_or_else(|| anyhow!("object {object} does not exist"))?;
        let info = self.app.function(&type_name, function, FunctionKind::Method).map_err(RemoteError::Guest)?;
        if info.protected {
            return Err(RemoteError::Guest(CallError::NotAllowed(format!("{type_name}.{function} is protected"))));
        }
        let begin = if info.readonly {
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        } else {
            "BEGIN ISOLATION LEVEL SERIALIZABLE"
        };
        self.db.borrow_mut().client.batch_execute(begin).map_err(classify)?;
        let frame = Frame { object, type_name, function: function.to_string(), readonly: info.readonly, depth: 0 };
        let outcome = run(&self.app, &self.db, frame, FunctionKind::Method, args);
        let mut db = self.db.borrow_mut();
        match outcome {
            Ok(result) => {
                db.client.batch_execute("COMMIT").map_err(classify)?;
                Ok(result)
            }
            Err(e) => {
                // After a lost connection there is nothing to roll back.
                let _ = db.client.batch_execute("ROLLBACK");
                Err(e)
            }
        }
    }
}

/// Runs one function in a fresh instance; nested calls recurse through the
/// host functions below on the same connection and transaction.
fn run(
    app: &Rc<RemoteApp>,
    db: &Rc<RefCell<Db>>,
    frame: Frame,
    kind: FunctionKind,
    args: &str,
) -> Result<String, RemoteError> {
    let state = State { app: Some(app.clone()), db: Some(db.clone()), frame };
    let (object, ty, function) = (state.frame.object, state.frame.type_name.clone(), state.frame.function.clone());
    let mut store = Store::new(&app.engine, state);
    let lambda = app.pre.instantiate_checked_once(&mut store)?;
    match lambda.call_dispatch(&mut store, kind, &ty, &function, object, args) {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(guest)) => Err(RemoteError::Guest(guest)),
        Err(trap) => match trap.downcast::<postgres::Error>() {
            Ok(db_error) => Err(classify(db_error)),
            Err(trap) => match trap.downcast::<NestedFailure>() {
                Ok(NestedFailure(inner)) => Err(inner),
                Err(trap) => Err(RemoteError::Other(trap)),
            },
        },
    }
}

fn classify(e: postgres::Error) -> RemoteError {
    match e.code().map(|c| c.code()) {
        Some("40001" | "40P01") => RemoteError::Retry(e),
        _ => RemoteError::Other(e.into()),
    }
}

/// A nested call failed in a way that aborts the whole call; carried through
/// the caller's wasm frames as a trap.
#[derive(Debug)]
struct NestedFailure(RemoteError);

impl std::fmt::Display for NestedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nested call failed: {}", self.0)
    }
}

impl std::error::Error for NestedFailure {}

struct Frame {
    object: i64,
    type_name: String,
    function: String,
    readonly: bool,
    depth: u32,
}

/// A store's data. `app` and `db` are `None` only for `describe` at load.
struct State {
    app: Option<Rc<RemoteApp>>,
    db: Option<Rc<RefCell<Db>>>,
    frame: Frame,
}

impl State {
    fn detached() -> State {
        State {
            app: None,
            db: None,
            frame: Frame { object: 0, type_name: String::new(), function: "describe".into(), readonly: true, depth: 0 },
        }
    }

    fn db(&self) -> wasmtime::Result<std::cell::RefMut<'_, Db>> {
        let db = self.db.as_ref().ok_or_else(|| anyhow!("no storage while describing the application"))?;
        Ok(db.borrow_mut())
    }

    fn object(&self) -> wasmtime::Result<i64> {
        if self.frame.object == 0 {
            bail!("{}.{} has no object to read or write", self.frame.type_name, self.frame.function);
        }
        Ok(self.frame.object)
    }

    fn writable(&self) -> wasmtime::Result<i64> {
        if self.frame.readonly {
            bail!("{}.{} is readonly", self.frame.type_name, self.frame.function);
        }
        self.object()
    }

    /// A nested call: its own instance, the same transaction.
    fn nested(
        &mut self,
        object: i64,
        type_name: String,
        function: String,
        kind: FunctionKind,
        args: &str,
    ) -> wasmtime::Result<Result<String, CallError>> {
        let app = self.app.clone().ok_or_else(|| anyhow!("no calls while describing the application"))?;
        let info = match app.function(&type_name, &function, kind) {
            Ok(info) => info,
            Err(e) => return Ok(Err(e)),
        };
        if self.frame.depth + 1 > MAX_DEPTH {
            bail!("nested calls deeper than {MAX_DEPTH}");
        }
        let frame = Frame {
            object,
            type_name,
            function,
            readonly: info.readonly || self.frame.readonly,
            depth: self.frame.depth + 1,
        };
        let db = self.db.clone().expect("app and db are set together");
        match run(&app, &db, frame, kind, args) {
            Ok(result) => Ok(Ok(result)),
            Err(e) => Err(NestedFailure(e).into()),
        }
    }
}

fn sql_error(e: postgres::Error) -> wasmtime::Error {
    wasmtime::Error::from(e)
}

impl lambdastore::lambda::types::Host for State {}

/// The baseline runs no jobs, so nothing for later either.
impl lambdastore::lambda::later::Host for State {
    fn spawn_at(&mut self, _: i64, function: String, _: String, _: i64) -> wasmtime::Result<Result<(), CallError>> {
        Ok(Err(CallError::NotAllowed(format!("the disaggregated baseline cannot spawn jobs ({function})"))))
    }

    fn set_timer(&mut self, name: String, _: i64, _: String, _: String) -> wasmtime::Result<Result<(), CallError>> {
        Ok(Err(CallError::NotAllowed(format!("the disaggregated baseline has no timers ({name})"))))
    }

    fn clear_timer(&mut self, name: String) -> wasmtime::Result<Result<(), CallError>> {
        Ok(Err(CallError::NotAllowed(format!("the disaggregated baseline has no timers ({name})"))))
    }
}

impl lambdastore::lambda::host::Host for State {
    fn self_id(&mut self) -> wasmtime::Result<i64> {
        Ok(self.frame.object)
    }

    fn get(&mut self, field: String, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        let object = self.object()?;
        let mut db = self.db()?;
        let s = db
            .statement("SELECT value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key = $3")
            .map_err(sql_error)?;
        let row = db.client.query_opt(&s, &[&object, &field, &key]).map_err(sql_error)?;
        Ok(row.map(|r| r.get(0)))
    }

    fn put(&mut self, field: String, key: Vec<u8>, value: Vec<u8>) -> wasmtime::Result<()> {
        let object = self.writable()?;
        let mut db = self.db()?;
        let s = db
            .statement(
                "INSERT INTO lambdastore.entries (object_id, field, key, value) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (object_id, field, key) DO UPDATE SET value = EXCLUDED.value",
            )
            .map_err(sql_error)?;
        db.client.execute(&s, &[&object, &field, &key, &value]).map_err(sql_error)?;
        Ok(())
    }

    fn delete(&mut self, field: String, key: Vec<u8>) -> wasmtime::Result<bool> {
        let object = self.writable()?;
        let mut db = self.db()?;
        let s = db
            .statement("DELETE FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key = $3")
            .map_err(sql_error)?;
        Ok(db.client.execute(&s, &[&object, &field, &key]).map_err(sql_error)? > 0)
    }

    fn scan(
        &mut self,
        field: String,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        limit: u32,
        dir: Direction,
    ) -> wasmtime::Result<Vec<Entry>> {
        let object = self.object()?;
        let mut db = self.db()?;
        // One statement per shape, so that each bound is an index condition.
        let sql = match (start.is_some(), end.is_some(), dir) {
            (false, false, Direction::Forward) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 ORDER BY key LIMIT $3",
            (false, false, Direction::Backward) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 ORDER BY key DESC LIMIT $3",
            (true, false, Direction::Forward) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key >= $4 ORDER BY key LIMIT $3",
            (true, false, Direction::Backward) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key >= $4 ORDER BY key DESC LIMIT $3",
            (false, true, Direction::Forward) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key < $4 ORDER BY key LIMIT $3",
            (false, true, Direction::Backward) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key < $4 ORDER BY key DESC LIMIT $3",
            (true, true, Direction::Forward) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key >= $4 AND key < $5 ORDER BY key LIMIT $3",
            (true, true, Direction::Backward) => "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = $2 AND key >= $4 AND key < $5 ORDER BY key DESC LIMIT $3",
        };
        let s = db.statement(sql).map_err(sql_error)?;
        let limit = i64::from(limit);
        let bounds: Vec<&Vec<u8>> = start.iter().chain(end.iter()).collect();
        let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![&object, &field, &limit];
        for b in &bounds {
            params.push(*b);
        }
        let rows = db.client.query(&s, &params).map_err(sql_error)?;
        Ok(rows.into_iter().map(|r| Entry { key: r.get(0), value: r.get(1) }).collect())
    }

    fn call(&mut self, target: i64, function: String, args: String) -> wasmtime::Result<Result<String, CallError>> {
        let type_name = self.db()?.type_of(target).map_err(sql_error)?;
        let Some(type_name) = type_name else {
            return Ok(Err(CallError::UnknownObject(target)));
        };
        self.nested(target, type_name, function, FunctionKind::Method, &args)
    }

    /// As the extension does it: `call` on each target, once each.
    fn map_call(
        &mut self,
        targets: Vec<i64>,
        function: String,
        args: String,
    ) -> wasmtime::Result<Vec<(i64, Result<String, CallError>)>> {
        let mut seen = std::collections::HashSet::new();
        targets
            .into_iter()
            .filter(|target| seen.insert(*target))
            .map(|target| Ok((target, self.call(target, function.clone(), args.clone())?)))
            .collect()
    }

    fn create(&mut self, type_name: String, _args: String) -> wasmtime::Result<Result<i64, CallError>> {
        Ok(Err(CallError::NotAllowed(format!("the disaggregated baseline cannot create objects ({type_name})"))))
    }

    fn call_static(
        &mut self,
        type_name: String,
        function: String,
        args: String,
    ) -> wasmtime::Result<Result<String, CallError>> {
        self.nested(0, type_name, function, FunctionKind::Static, &args)
    }

    fn spawn(&mut self, _target: i64, function: String, _args: String) -> wasmtime::Result<Result<(), CallError>> {
        Ok(Err(CallError::NotAllowed(format!("the disaggregated baseline cannot spawn jobs ({function})"))))
    }

    fn now_micros(&mut self) -> wasmtime::Result<i64> {
        Ok(SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros() as i64)
    }

    fn random_u64(&mut self) -> wasmtime::Result<u64> {
        thread_local! {
            static STATE: std::cell::Cell<u64> = std::cell::Cell::new(
                SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64));
        }
        Ok(STATE.with(|s| {
            let mut x = s.get();
            let value = crate::contention::next(&mut x);
            s.set(x);
            value
        }))
    }

    fn log(&mut self, _level: LogLevel, message: String) -> wasmtime::Result<()> {
        eprintln!("lambda {}.{} on {}: {message}", self.frame.type_name, self.frame.function, self.frame.object);
        Ok(())
    }
}
