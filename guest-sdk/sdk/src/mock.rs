//! A native, in-memory stand-in for the database, so an application's
//! `cargo test` runs its lambdas without PostgreSQL.
//!
//! The mock enforces what the real host enforces:
//!
//! - unknown objects, types and functions are [`CallError`]s;
//! - protected functions can only be called from inside a lambda (a nested
//!   call), never from outside;
//! - a readonly function, and everything it calls, may not write or create
//!   objects: trying panics, like the trap it is on the real host;
//! - a field name may not contain a NUL byte (the host refuses it with
//!   SQLSTATE 22023, invalid_parameter_value): using one panics too;
//! - every call, top-level or nested, is a savepoint: if it returns an error,
//!   none of its writes (nor its callees') are kept, and a nested caller gets
//!   `Err` and may go on;
//! - a panic (a trap on the real host) or exceeding the call-depth limit
//!   aborts the whole workflow: the mock undoes everything the top-level call
//!   did and re-raises the panic in the test (use `#[should_panic]` or
//!   [`std::panic::catch_unwind`] to test for it).
//!
//! Time is the workflow's: [`now_micros`](crate::now_micros) is constant
//! during one top-level call and advances by a millisecond between them.
//! Randomness is a seeded PRNG. Logs are captured (and echoed to stderr,
//! which the test harness shows for failing tests).
//!
//! # Examples
//!
//! ```
//! use lambdastore_sdk::mock::MockHost;
//! use lambdastore_sdk::prelude::*;
//! use serde_json::json;
//!
//! #[lambda_object]
//! pub struct Counter {
//!     value: Cell<i64>,
//! }
//!
//! #[lambda_functions]
//! impl Counter {
//!     #[constructor]
//!     fn new(&self, initial: Option<i64>) {
//!         self.value.set(&initial.unwrap_or(0));
//!     }
//!     fn add(&self, n: i64) -> i64 {
//!         let v = self.value.get_or_default() + n;
//!         self.value.set(&v);
//!         v
//!     }
//! }
//!
//! lambdastore_sdk::app!(Counter);
//!
//! let host = MockHost::for_app::<App>();
//! let id = host.create("Counter", json!({"initial": 40})).unwrap();
//! assert_eq!(host.invoke(id, "add", json!([2])).unwrap(), json!(42));
//! assert_eq!(host.cell::<i64>(id, "value"), Some(42));
//! ```

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::rc::Rc;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::desc::{AppDesc, Application, FunctionDesc, FunctionKind};
use crate::host::{Direction, Entry, LogLevel};
use crate::key::{decode_key, OwnedKey};
use crate::{CallError, ObjectId};

/// The signature of [`Application::dispatch`].
pub type DispatchFn = fn(FunctionKind, &str, &str, ObjectId, &str) -> Result<String, CallError>;

/// A message a lambda logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Its level.
    pub level: LogLevel,
    /// Its text.
    pub message: String,
    /// The object whose function logged it (0 for static functions).
    pub object: ObjectId,
}

/// A call a lambda spawned, to run after its workflow commits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpawnedCall {
    /// The object to call.
    pub target: ObjectId,
    /// The method.
    pub function: String,
    /// The JSON arguments.
    pub args: String,
    /// When it is due (microseconds since the Unix epoch, the host's
    /// clock); None: at once.
    pub due_micros: Option<i64>,
    /// The timer of `target` it is, if a timer set it.
    pub timer: Option<String>,
}

impl SpawnedCall {
    fn due_at(&self, now: i64) -> bool {
        self.due_micros.is_none_or(|due| due <= now)
    }
}

/// One stored entry, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    /// The field.
    pub field: String,
    /// The encoded key (empty for a cell).
    pub key: Vec<u8>,
    /// The value bytes (JSON, or empty for a set member).
    pub value: Vec<u8>,
}

/// What a savepoint restores.
#[derive(Clone, Default)]
struct Store {
    entries: BTreeMap<(ObjectId, String, Vec<u8>), Vec<u8>>,
    objects: BTreeMap<ObjectId, String>,
    spawned: Vec<SpawnedCall>,
}

/// One running function.
struct Frame {
    object: ObjectId,
    type_name: String,
    function: String,
    readonly: bool,
    /// An object's migration called by a method on it: it writes even
    /// under a readonly caller, as on the server.
    migration: bool,
}

struct State {
    app: AppDesc,
    dispatch: DispatchFn,
    store: RefCell<Store>,
    stack: RefCell<Vec<Frame>>,
    /// Object ids are never reused, even after a rollback (like a sequence).
    next_id: Cell<ObjectId>,
    now_micros: Cell<i64>,
    rng: Cell<u64>,
    max_depth: Cell<usize>,
    logs: RefCell<Vec<LogRecord>>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<State>>> = const { RefCell::new(None) };
}

/// The in-memory host, installed on the current thread for as long as it
/// lives. See the [module documentation](self).
pub struct MockHost {
    state: Rc<State>,
}

/// The longest timer name, as on the server.
const MAX_TIMER_NAME: usize = 255;

/// How far from now a spawned call or a timer may be due, either way, as
/// on the server.
const MAX_DUE_YEARS: u64 = 1_000;

/// The most bytes an entry's field name and key may have together, as on
/// the server (its index holds no more).
const MAX_KEY_BYTES: usize = 2048;

/// Nested calls beyond this depth abort the workflow (the server's
/// `lambdastore.max_call_depth`, whose default this is).
pub const DEFAULT_MAX_DEPTH: usize = 16;

impl MockHost {
    /// A host for application `A` (the `App` that [`app!`](crate::app)
    /// generates), installed on this thread.
    ///
    /// # Panics
    ///
    /// If another `MockHost` is installed on this thread.
    pub fn for_app<A: Application>() -> MockHost {
        MockHost::new(A::describe(), A::dispatch)
    }

    /// A host for the application described by `app` and run by `dispatch`.
    pub fn new(app: AppDesc, dispatch: DispatchFn) -> MockHost {
        let state = Rc::new(State {
            app,
            dispatch,
            store: RefCell::default(),
            stack: RefCell::default(),
            next_id: Cell::new(1),
            now_micros: Cell::new(1_700_000_000_000_000),
            rng: Cell::new(0x1A3B_DA57_0BE5),
            max_depth: Cell::new(DEFAULT_MAX_DEPTH),
            logs: RefCell::default(),
        });
        CURRENT.with(|c| {
            let mut current = c.borrow_mut();
            assert!(current.is_none(), "a MockHost is already installed on this thread");
            *current = Some(state.clone());
        });
        MockHost { state }
    }

    /// A host without an application, whose current object is object 1, so
    /// fields and host functions can be used directly (in examples and
    /// tests of field logic).
    pub fn standalone() -> MockHost {
        fn no_dispatch(
            _: FunctionKind,
            type_name: &str,
            function: &str,
            _: ObjectId,
            _: &str,
        ) -> Result<String, CallError> {
            Err(CallError::UnknownFunction(format!("{type_name}.{function}")))
        }
        let host = MockHost::new(AppDesc { sdk: crate::SDK_VERSION.to_string(), types: Vec::new() }, no_dispatch);
        let id = host.state.new_id();
        host.state.store.borrow_mut().objects.insert(id, "Standalone".into());
        host.state.stack.borrow_mut().push(Frame {
            object: id,
            type_name: "Standalone".into(),
            function: "standalone".into(),
            readonly: false,
            migration: false,
        });
        host
    }

    /// Creates an object of `type_name` and runs its constructor with `args`,
    /// as a client would.
    pub fn create(&self, type_name: &str, args: Value) -> Result<ObjectId, CallError> {
        self.state.workflow(|s| s.create(type_name, &args.to_string()))
    }

    /// Calls method `function` of `object` with `args`, as a client would.
    pub fn invoke(&self, object: ObjectId, function: &str, args: Value) -> Result<Value, CallError> {
        self.state.workflow(|s| s.call(object, function, &args.to_string())).map(|json| parse_result(&json))
    }

    /// Calls static `function` of `type_name` with `args`, as a client would.
    pub fn invoke_static(&self, type_name: &str, function: &str, args: Value) -> Result<Value, CallError> {
        self.state.workflow(|s| s.call_static(type_name, function, &args.to_string())).map(|json| parse_result(&json))
    }

    /// Runs each spawned call (timers too) that is due at the host's clock
    /// ([`now_micros`](Self::now_micros)) as its own workflow, the earliest
    /// due first and in spawn order among equals (calls they spawn run
    /// too, once due), and returns their results. Calls not due yet stay
    /// queued: move the clock ([`set_now_micros`](Self::set_now_micros))
    /// and run again.
    pub fn run_spawned(&self) -> Vec<Result<Value, CallError>> {
        let mut results = Vec::new();
        while let Some(call) = {
            let mut store = self.state.store.borrow_mut();
            let now = self.state.now_micros.get();
            let next = store
                .spawned
                .iter()
                .enumerate()
                .filter(|(_, call)| call.due_at(now))
                .min_by_key(|(index, call)| (call.due_micros.unwrap_or(i64::MIN), *index))
                .map(|(index, _)| index);
            next.map(|index| store.spawned.remove(index))
        } {
            let args = serde_json::from_str(&call.args).unwrap_or(Value::Null);
            results.push(self.invoke(call.target, &call.function, args));
        }
        results
    }

    /// Calls spawned by committed workflows and not run yet, removed from
    /// the queue.
    pub fn take_spawned(&self) -> Vec<SpawnedCall> {
        std::mem::take(&mut self.state.store.borrow_mut().spawned)
    }

    /// Runs `f` as if inside a method of `object` (without savepoint), so a
    /// test can read or prepare fields with the field types.
    ///
    /// ```
    /// use lambdastore_sdk::mock::MockHost;
    /// use lambdastore_sdk::Cell;
    ///
    /// let host = MockHost::standalone();
    /// host.with_object(1, || Cell::<u32>::new("n").set(&5));
    /// assert_eq!(host.cell::<u32>(1, "n"), Some(5));
    /// ```
    pub fn with_object<T>(&self, object: ObjectId, f: impl FnOnce() -> T) -> T {
        let type_name = self.object_type(object).unwrap_or_default();
        let _frame = self.state.enter(Frame {
            object,
            type_name,
            function: "with_object".into(),
            readonly: false,
            migration: false,
        });
        f()
    }

    /// The type of `object`, if it exists.
    pub fn object_type(&self, object: ObjectId) -> Option<String> {
        self.state.store.borrow().objects.get(&object).cloned()
    }

    /// All objects and their types, by id.
    pub fn objects(&self) -> Vec<(ObjectId, String)> {
        let store = self.state.store.borrow();
        store.objects.iter().map(|(id, t)| (*id, t.clone())).collect()
    }

    /// The stored entries of `object`, by field and key.
    pub fn entries(&self, object: ObjectId) -> Vec<StoredEntry> {
        let store = self.state.store.borrow();
        store
            .entries
            .range((object, String::new(), Vec::new())..)
            .take_while(|((o, _, _), _)| *o == object)
            .map(|((_, field, key), value)| StoredEntry {
                field: field.clone(),
                key: key.clone(),
                value: value.clone(),
            })
            .collect()
    }

    /// The decoded value of cell `field` of `object`.
    ///
    /// # Panics
    ///
    /// If the stored value does not decode as `T`.
    pub fn cell<T: DeserializeOwned>(&self, object: ObjectId, field: &str) -> Option<T> {
        let store = self.state.store.borrow();
        let bytes = store.entries.get(&(object, field.to_string(), Vec::new()))?;
        Some(serde_json::from_slice(bytes).expect("cell value does not decode"))
    }

    /// The decoded entries of map `field` of `object`, in key order.
    ///
    /// # Panics
    ///
    /// If a stored key or value does not decode.
    pub fn map<K: OwnedKey, V: DeserializeOwned>(&self, object: ObjectId, field: &str) -> Vec<(K, V)> {
        self.entries(object)
            .into_iter()
            .filter(|e| e.field == field)
            .map(|e| {
                (
                    decode_key(&e.key).expect("map key does not decode"),
                    serde_json::from_slice(&e.value).expect("map value does not decode"),
                )
            })
            .collect()
    }

    /// Everything lambdas logged, oldest first (rolled-back calls included:
    /// the server log is not transactional either).
    pub fn logs(&self) -> Vec<LogRecord> {
        self.state.logs.borrow().clone()
    }

    /// The application's description.
    pub fn app(&self) -> &AppDesc {
        &self.state.app
    }

    /// The clock of the next workflow.
    pub fn now_micros(&self) -> i64 {
        self.state.now_micros.get()
    }

    /// Sets the clock of the next workflow.
    pub fn set_now_micros(&self, micros: i64) {
        self.state.now_micros.set(micros);
    }

    /// Reseeds the random number generator.
    pub fn set_seed(&self, seed: u64) {
        self.state.rng.set(seed);
    }

    /// Sets how deep nested calls may go before the workflow is aborted.
    pub fn set_max_depth(&self, depth: usize) {
        self.state.max_depth.set(depth);
    }
}

impl Drop for MockHost {
    fn drop(&mut self) {
        CURRENT.with(|c| c.borrow_mut().take());
    }
}

impl fmt::Debug for MockHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockHost")
            .field("types", &self.state.app.types.len())
            .field("objects", &self.state.store.borrow().objects.len())
            .finish_non_exhaustive()
    }
}

fn parse_result(json: &str) -> Value {
    serde_json::from_str(json).expect("the SDK always returns JSON")
}

/// Pops a frame when dropped, also when unwinding.
struct FrameGuard<'a>(&'a State);

impl Drop for FrameGuard<'_> {
    fn drop(&mut self) {
        self.0.stack.borrow_mut().pop();
    }
}

impl State {
    /// Runs one top-level call as a workflow: all or nothing.
    fn workflow<T>(&self, f: impl FnOnce(&State) -> Result<T, CallError>) -> Result<T, CallError> {
        let depth = self.stack.borrow().len();
        let before = self.store.borrow().clone();
        let result = panic::catch_unwind(AssertUnwindSafe(|| f(self)));
        // The next workflow is a later transaction.
        self.now_micros.set(self.now_micros.get() + 1_000);
        match result {
            Ok(result) => result,
            Err(panic) => {
                *self.store.borrow_mut() = before;
                self.stack.borrow_mut().truncate(depth);
                panic::resume_unwind(panic)
            }
        }
    }

    /// A call from test code (no lambda running) is a client's call: a
    /// workflow of its own. From a lambda it is a nested call.
    fn entry<T>(&self, f: impl FnOnce(&State) -> Result<T, CallError>) -> Result<T, CallError> {
        if self.stack.borrow().is_empty() {
            self.workflow(f)
        } else {
            f(self)
        }
    }

    fn new_id(&self) -> ObjectId {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    fn enter(&self, frame: Frame) -> FrameGuard<'_> {
        self.stack.borrow_mut().push(frame);
        FrameGuard(self)
    }

    fn function(&self, type_name: &str, function: &str, kind: FunctionKind) -> Result<&FunctionDesc, CallError> {
        self.app
            .type_desc(type_name)
            .and_then(|t| t.function(function))
            .filter(|f| f.kind == kind)
            .ok_or_else(|| CallError::UnknownFunction(format!("{type_name}.{function}")))
    }

    /// Protected functions are for lambdas of the application only.
    fn check_visibility(&self, type_name: &str, f: &FunctionDesc) -> Result<(), CallError> {
        if f.protected && self.stack.borrow().is_empty() {
            return Err(CallError::NotAllowed(format!(
                "{type_name}.{} is protected: only lambdas of its application may call it",
                f.name
            )));
        }
        Ok(())
    }

    /// Runs `f` as the function of `frame` inside a savepoint.
    fn run(&self, frame: Frame, f: impl FnOnce() -> Result<String, CallError>) -> Result<String, CallError> {
        let max_depth = self.max_depth.get();
        // As the server's `lambdastore.max_call_depth`: that many calls
        // nested in the top-level one.
        if self.stack.borrow().len() > max_depth {
            panic!("call depth limit ({max_depth}) exceeded calling {}.{}", frame.type_name, frame.function);
        }
        let savepoint = self.store.borrow().clone();
        let result = {
            let _frame = self.enter(frame);
            f()
        };
        if result.is_err() {
            *self.store.borrow_mut() = savepoint;
        }
        result
    }

    fn call(&self, object: ObjectId, function: &str, args: &str) -> Result<String, CallError> {
        let type_name = self.store.borrow().objects.get(&object).cloned().ok_or(CallError::UnknownObject(object))?;
        let f = self.function(&type_name, function, FunctionKind::Method)?;
        self.check_visibility(&type_name, f)?;
        let migration = function == crate::desc::MIGRATE
            && self.stack.borrow().last().is_some_and(|caller| caller.object == object);
        let frame = Frame {
            object,
            type_name: type_name.clone(),
            function: function.to_string(),
            readonly: f.readonly,
            migration,
        };
        self.run(frame, || (self.dispatch)(FunctionKind::Method, &type_name, function, object, args))
    }

    fn call_static(&self, type_name: &str, function: &str, args: &str) -> Result<String, CallError> {
        let f = self.function(type_name, function, FunctionKind::Static)?;
        self.check_visibility(type_name, f)?;
        let frame = Frame {
            object: 0,
            type_name: type_name.to_string(),
            function: function.to_string(),
            readonly: f.readonly,
            migration: false,
        };
        self.run(frame, || (self.dispatch)(FunctionKind::Static, type_name, function, 0, args))
    }

    fn create(&self, type_name: &str, args: &str) -> Result<ObjectId, CallError> {
        let ty = self.app.type_desc(type_name).ok_or_else(|| CallError::UnknownFunction(type_name.to_string()))?;
        self.check_write(&format!("create a {type_name}"));
        let id = self.new_id();
        let Some(ctor) = ty.constructor() else {
            let no_args = match serde_json::from_str::<Value>(args) {
                Ok(Value::Null) => true,
                Ok(Value::Array(list)) => list.is_empty(),
                Ok(Value::Object(map)) => map.is_empty(),
                _ => false,
            };
            if !no_args {
                return Err(CallError::BadArguments(format!(
                    "{type_name} has no constructor, so it takes no arguments"
                )));
            }
            self.store.borrow_mut().objects.insert(id, type_name.to_string());
            return Ok(id);
        };
        self.check_visibility(type_name, ctor)?;
        let frame = Frame {
            object: id,
            type_name: type_name.to_string(),
            function: ctor.name.clone(),
            readonly: false,
            migration: false,
        };
        self.run(frame, || {
            // Inside the savepoint: a failed constructor leaves no object.
            self.store.borrow_mut().objects.insert(id, type_name.to_string());
            (self.dispatch)(FunctionKind::Constructor, type_name, &ctor.name, id, args)
        })?;
        Ok(id)
    }

    /// The object whose `field` a host function reads or writes. The host
    /// checks the name first and refuses it with an error that aborts the
    /// workflow: PostgreSQL's text ends at a NUL, so the stored name would not
    /// be the one written.
    fn field_object(&self, what: &str, field: &str) -> ObjectId {
        if field.contains('\0') {
            let running = match self.stack.borrow().last() {
                Some(frame) => format!(" of \"{}.{}\"", frame.type_name, frame.function),
                None => String::new(),
            };
            panic!("field name {field:?}{running} contains a NUL byte");
        }
        self.current_object(what)
    }

    fn current_object(&self, what: &str) -> ObjectId {
        match self.stack.borrow().last() {
            Some(frame) if frame.object != 0 => frame.object,
            Some(frame) => panic!("{what}: static function {}.{} has no object", frame.type_name, frame.function),
            None => panic!(
                "{what}: no lambda is running; call functions through MockHost::create/invoke, \
                 or use MockHost::with_object"
            ),
        }
    }

    /// Writes inside a readonly function (or its callees, up to an
    /// object's migration) trap on the real host, which aborts the workflow.
    fn check_write(&self, what: &str) {
        let stack = self.stack.borrow();
        if let Some(frame) = stack.iter().rev().take_while(|f| !f.migration).find(|f| f.readonly) {
            panic!("readonly function {}.{} may not write (tried to {what})", frame.type_name, frame.function);
        }
    }

    fn get(&self, field: &str, key: &[u8]) -> Option<Vec<u8>> {
        let object = self.field_object("get", field);
        let store = self.store.borrow();
        store.entries.get(&(object, field.to_string(), key.to_vec())).cloned()
    }

    fn put(&self, field: &str, key: &[u8], value: &[u8]) {
        let object = self.field_object("put", field);
        self.check_write(&format!("put into field `{field}`"));
        // As the server: a longer key aborts the workflow (54000 there).
        let size = field.len() + key.len();
        assert!(
            size <= MAX_KEY_BYTES,
            "an entry's field name and key are {size} bytes together, more than the {MAX_KEY_BYTES} an index entry holds"
        );
        self.store.borrow_mut().entries.insert((object, field.to_string(), key.to_vec()), value.to_vec());
    }

    fn delete(&self, field: &str, key: &[u8]) -> bool {
        let object = self.field_object("delete", field);
        self.check_write(&format!("delete from field `{field}`"));
        self.store.borrow_mut().entries.remove(&(object, field.to_string(), key.to_vec())).is_some()
    }

    fn scan(&self, field: &str, start: Option<&[u8]>, end: Option<&[u8]>, limit: u32, dir: Direction) -> Vec<Entry> {
        let object = self.field_object("scan", field);
        let store = self.store.borrow();
        let lo = (object, field.to_string(), start.unwrap_or_default().to_vec());
        let hi = match end {
            Some(end) => (object, field.to_string(), end.to_vec()),
            // `field\0` is the first field name after `field`.
            None => (object, format!("{field}\0"), Vec::new()),
        };
        if lo >= hi {
            return Vec::new();
        }
        let range = store.entries.range(lo..hi);
        let to_entry = |((_, _, key), value): (&(ObjectId, String, Vec<u8>), &Vec<u8>)| Entry {
            key: key.clone(),
            value: value.clone(),
        };
        match dir {
            Direction::Forward => range.take(limit as usize).map(to_entry).collect(),
            Direction::Backward => range.rev().take(limit as usize).map(to_entry).collect(),
        }
    }

    /// As the server: a time past `MAX_DUE_YEARS` aborts the workflow
    /// (22023 there).
    fn check_due(&self, at: i64) {
        const MICROS_PER_YEAR: u64 = 365 * 24 * 3600 * 1_000_000;
        assert!(
            at.abs_diff(self.now_micros.get()) <= MAX_DUE_YEARS * MICROS_PER_YEAR,
            "a job is due at most {MAX_DUE_YEARS} years from now, not at {at} µs after 1970"
        );
    }

    fn spawn(&self, target: ObjectId, function: &str, args: &str, due_micros: Option<i64>) -> Result<(), CallError> {
        self.current_object("spawn");
        self.check_write(&format!("spawn {function}"));
        if let Some(at) = due_micros {
            self.check_due(at);
        }
        let mut store = self.store.borrow_mut();
        if !store.objects.contains_key(&target) {
            return Err(CallError::UnknownObject(target));
        }
        let call = SpawnedCall { target, function: function.into(), args: args.into(), due_micros, timer: None };
        store.spawned.push(call);
        Ok(())
    }

    /// Sets (with a call) or clears the timer `name` of the current object:
    /// its pending run, if any, is replaced, as on the server.
    fn set_timer(&self, name: &str, call: Option<(i64, &str, &str)>) -> Result<(), CallError> {
        let target = self.current_object("set a timer");
        self.check_write(&format!("set or clear timer `{name}`"));
        // As the server: a bad name aborts the workflow (22023 there).
        assert!(
            !name.is_empty() && name.len() <= MAX_TIMER_NAME,
            "a timer's name is 1 to {MAX_TIMER_NAME} bytes, not {}",
            name.len()
        );
        if let Some((at, function, _)) = call {
            self.check_due(at);
            let type_name = self.store.borrow().objects.get(&target).cloned().unwrap_or_default();
            self.function(&type_name, function, FunctionKind::Method)?;
        }
        let mut store = self.store.borrow_mut();
        store.spawned.retain(|pending| !(pending.target == target && pending.timer.as_deref() == Some(name)));
        if let Some((at, function, args)) = call {
            let timer = Some(name.to_string());
            store.spawned.push(SpawnedCall {
                target,
                function: function.into(),
                args: args.into(),
                due_micros: Some(at),
                timer,
            });
        }
        Ok(())
    }

    fn random_u64(&self) -> u64 {
        // SplitMix64.
        let seed = self.rng.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.rng.set(seed);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn log(&self, level: LogLevel, message: &str) {
        let object = self.stack.borrow().last().map_or(0, |f| f.object);
        eprintln!("[lambda {object} {level:?}] {message}");
        self.logs.borrow_mut().push(LogRecord { level, message: message.to_string(), object });
    }
}

/// The host functions, backed by the thread's [`MockHost`].
pub(crate) mod host {
    use super::*;

    fn with<T>(f: impl FnOnce(&State) -> T) -> T {
        // Clone the Rc out so that no borrow of the thread-local is held
        // while a nested call re-enters the host.
        let state = CURRENT.with(|c| c.borrow().clone()).expect(
            "no host: outside the database, lambdastore_sdk needs a MockHost installed \
             on this thread (lambdastore_sdk::mock::MockHost::for_app::<App>())",
        );
        f(&state)
    }

    pub fn self_id() -> ObjectId {
        with(|s| s.stack.borrow().last().map_or(0, |f| f.object))
    }
    pub fn get(field: &str, key: &[u8]) -> Option<Vec<u8>> {
        with(|s| s.get(field, key))
    }
    pub fn put(field: &str, key: &[u8], value: &[u8]) {
        with(|s| s.put(field, key, value))
    }
    pub fn delete(field: &str, key: &[u8]) -> bool {
        with(|s| s.delete(field, key))
    }
    pub fn scan(field: &str, start: Option<&[u8]>, end: Option<&[u8]>, limit: u32, dir: Direction) -> Vec<Entry> {
        with(|s| s.scan(field, start, end, limit, dir))
    }
    pub fn call(target: ObjectId, function: &str, args: &str) -> Result<String, CallError> {
        with(|s| s.entry(|s| s.call(target, function, args)))
    }
    /// As the host does it: `call`, each target once.
    pub fn map_call(targets: &[ObjectId], function: &str, args: &str) -> Vec<(ObjectId, Result<String, CallError>)> {
        let mut seen = std::collections::HashSet::new();
        targets.iter().filter(|t| seen.insert(**t)).map(|&t| (t, call(t, function, args))).collect()
    }
    pub fn create(type_name: &str, args: &str) -> Result<ObjectId, CallError> {
        with(|s| s.entry(|s| s.create(type_name, args)))
    }
    pub fn call_static(type_name: &str, function: &str, args: &str) -> Result<String, CallError> {
        with(|s| s.entry(|s| s.call_static(type_name, function, args)))
    }
    pub fn spawn(target: ObjectId, function: &str, args: &str) -> Result<(), CallError> {
        with(|s| s.spawn(target, function, args, None))
    }
    pub fn spawn_at(target: ObjectId, function: &str, args: &str, at_micros: i64) -> Result<(), CallError> {
        with(|s| s.spawn(target, function, args, Some(at_micros)))
    }
    pub fn set_timer(name: &str, at_micros: i64, function: &str, args: &str) -> Result<(), CallError> {
        with(|s| s.set_timer(name, Some((at_micros, function, args))))
    }
    pub fn clear_timer(name: &str) -> Result<(), CallError> {
        with(|s| s.set_timer(name, None))
    }
    pub fn now_micros() -> i64 {
        with(|s| s.now_micros.get())
    }
    pub fn random_u64() -> u64 {
        with(|s| s.random_u64())
    }
    pub fn log(level: LogLevel, message: &str) {
        with(|s| s.log(level, message))
    }
}
