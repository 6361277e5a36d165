//! Write LambdaStore lambdas in Rust.
//!
//! A lambda application is a set of object types. Each type is a struct of
//! typed fields ([`Cell`], [`Map`], [`MultiMap`], [`Set`]) marked
//! [`#[lambda_object]`](lambda_object), plus an impl of functions marked
//! [`#[lambda_functions]`](lambda_functions): constructors, methods and
//! static functions. [`app!`] lists the types and exports the application as
//! a WebAssembly component that LambdaStore runs inside PostgreSQL, next to
//! the objects' data.
//!
//! ```
//! use lambdastore_sdk::prelude::*;
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
//!
//!     #[readonly]
//!     fn get(&self) -> i64 {
//!         self.value.get_or_default()
//!     }
//!
//!     fn add(&self, n: i64) -> i64 {
//!         let v = self.value.get_or_default() + n;
//!         self.value.set(&v);
//!         v
//!     }
//! }
//!
//! lambdastore_sdk::app!(Counter);
//! # fn main() {}
//! ```
//!
//! Outside the database (native targets), the host functions are served by
//! the thread's [`mock::MockHost`], so `cargo test` exercises the lambdas
//! with the same call, visibility and savepoint rules as the real host.
//! See `guest-sdk/README.md` for the whole model.
#![deny(missing_docs)]

// Lets generated code name this crate `lambdastore_sdk` from inside it too.
extern crate self as lambdastore_sdk;

pub mod desc;
mod error;
pub mod fields;
mod finite;
pub mod host;
mod json;
pub mod key;
#[cfg(not(target_arch = "wasm32"))]
pub mod mock;
mod wit;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

/// The WIT bindings (`wit_bindgen::generate!` on `guest-sdk/wit`).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)] // `dispatch` has as many parameters as the WIT says.
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "lambda",
        pub_export_macro: true,
        default_bindings_module: "lambdastore_sdk::bindings",
        runtime_path: "lambdastore_sdk::__private::wit_bindgen::rt",
    });
}

pub use desc::{Application, LambdaFunctions, LambdaObject};
pub use error::{CallError, Error, Result};
pub use fields::{Cell, Field, Map, MultiMap, Set};
pub use key::{Key, OwnedKey};

/// Marks a struct of typed fields as an object type.
///
/// Every field must be a [`Cell`], [`Map`], [`MultiMap`] or [`Set`]; each is
/// stored under its Rust name. The struct is left as written; the macro adds
/// an implementation of [`LambdaObject`] (the type's name, how to bind its
/// fields, their descriptions).
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::prelude::*;
///
/// #[lambda_object]
/// pub struct Account {
///     owner: Cell<String>,
///     balance: Cell<i64>,
///     audit: Map<u64, String>,
/// }
///
/// assert_eq!(<Account as LambdaObject>::NAME, "Account");
/// let names: Vec<String> = Account::lambda_fields().into_iter().map(|f| f.name).collect();
/// assert_eq!(names, ["owner", "balance", "audit"]);
/// ```
///
/// Other field types are compile errors:
///
/// ```compile_fail
/// use lambdastore_sdk::prelude::*;
///
/// #[lambda_object]
/// pub struct Account {
///     balance: i64, // not a field type
/// }
/// ```
pub use lambdastore_sdk_macros::lambda_object;

/// Exports the functions of an object type.
///
/// On an `impl X` block (once per type; `X` is a [`#[lambda_object]`](lambda_object)):
///
/// - functions taking `&self` are **methods**, run on an existing object;
/// - `#[constructor]` marks the **constructor** (at most one per type; it
///   takes `&self`, the new object, and returns nothing or `Result<(), E>`);
/// - functions without receiver are **static**;
/// - `#[protected]` makes a function callable only by lambdas of the same
///   application (nested calls), never by clients;
/// - `#[readonly]` promises that the function (and what it calls) does not
///   write; the host enforces it.
///
/// Parameters are decoded from JSON arguments (an object by name, an array
/// by position, `null` for none; `Option` parameters may be omitted) and
/// must be `DeserializeOwned`. The result is encoded as JSON and must be
/// `Serialize`; a result holding NaN or an infinity, which JSON cannot
/// represent, fails the call with [`CallError::Application`] instead of
/// becoming `null`. If the declared return type is `Result<T, E>` (any `Result`
/// path, including [`Result<T>`](crate::Result)) with `E: Display`, `Err(e)` is the function's own
/// error, [`CallError::Application`] with `e.to_string()`.
///
/// The macro leaves the impl as written (minus these three attributes) and
/// adds the dispatcher, the descriptions and a typed reference `XRef`
/// (`Copy`, serialized as the plain object id) whose functions call the
/// host: `XRef::ctor(args) -> Result<XRef, CallError>` creates an object,
/// `x_ref.method(args) -> Result<T, CallError>` calls a method,
/// `XRef::function(args) -> Result<T, CallError>` a static function.
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::prelude::*;
///
/// #[lambda_object]
/// pub struct Account {
///     balance: Cell<i64>,
/// }
///
/// #[lambda_functions]
/// impl Account {
///     #[constructor]
///     fn open(&self, initial: Option<i64>) {
///         self.balance.set(&initial.unwrap_or(0));
///     }
///
///     #[readonly]
///     fn balance(&self) -> i64 {
///         self.balance.get_or_default()
///     }
///
///     #[protected]
///     fn deposit(&self, amount: i64) {
///         self.balance.set(&(self.balance.get_or_default() + amount));
///     }
///
///     fn transfer(&self, to: AccountRef, amount: i64) -> Result<()> {
///         let balance = self.balance.get_or_default();
///         if amount > balance {
///             bail!("insufficient funds: balance {balance}, amount {amount}");
///         }
///         self.balance.set(&(balance - amount));
///         to.deposit(amount)?; // a nested call through the generated reference
///         Ok(())
///     }
///
///     fn version() -> &'static str {
///         "1"
///     }
/// }
///
/// lambdastore_sdk::app!(Account);
///
/// # use lambdastore_sdk::mock::MockHost;
/// # use serde_json::json;
/// let host = MockHost::for_app::<App>();
/// let a = host.create("Account", json!({"initial": 10})).unwrap();
/// let b = host.create("Account", json!([])).unwrap();
/// host.invoke(a, "transfer", json!({"to": b, "amount": 4})).unwrap();
/// assert_eq!(host.invoke(b, "balance", json!(null)).unwrap(), json!(4));
/// // Protected: clients may not call it.
/// assert!(matches!(
///     host.invoke(b, "deposit", json!([1])),
///     Err(CallError::NotAllowed(_))
/// ));
/// ```
///
/// Mistakes are compile errors pointing at the offending code:
///
/// ```compile_fail
/// use lambdastore_sdk::prelude::*;
///
/// #[lambda_object]
/// pub struct Counter { value: Cell<i64> }
///
/// #[lambda_functions]
/// impl Counter {
///     fn add(&mut self, n: i64) {} // fields are written through the host: `&self`
/// }
/// ```
pub use lambdastore_sdk_macros::lambda_functions;

/// Object identifiers are PostgreSQL `bigint`s.
pub type ObjectId = i64;

/// Version of this SDK, reported by `describe`.
pub const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The object the running function was invoked on (0 in a static function).
pub fn self_id() -> ObjectId {
    host::self_id()
}

/// Microseconds since the Unix epoch: the transaction's clock, so it does not
/// advance during a workflow.
pub fn now_micros() -> i64 {
    host::now_micros()
}

/// 64 cryptographically random bits (a ChaCha12 stream the server seeds from
/// the operating system's source), drawn for the workflow: a run replayed on
/// another Citus node draws the same.
pub fn random_u64() -> u64 {
    host::random_u64()
}

/// Calls method `function` of `target` with `args` (serialized as JSON) in
/// its own transaction after this one commits, exactly once. Returns an error
/// if the host cannot accept it.
pub fn spawn<A: serde::Serialize + ?Sized>(
    target: impl Into<ObjectId>,
    function: &str,
    args: &A,
) -> Result<(), CallError> {
    host::spawn(target.into(), function, &encode_args(args)?)
}

/// [`spawn`], due `delay` after the workflow's clock ([`now_micros`]) or
/// later: the job runs then, not earlier, exactly once.
pub fn spawn_after<A: serde::Serialize + ?Sized>(
    target: impl Into<ObjectId>,
    function: &str,
    args: &A,
    delay: std::time::Duration,
) -> Result<(), CallError> {
    spawn_at(target, function, args, now_micros().saturating_add(micros(delay)))
}

/// [`spawn`], due at `at_micros` (microseconds since the Unix epoch, as
/// [`now_micros`] counts) or later; a time already past is due at once.
pub fn spawn_at<A: serde::Serialize + ?Sized>(
    target: impl Into<ObjectId>,
    function: &str,
    args: &A,
    at_micros: i64,
) -> Result<(), CallError> {
    host::spawn_at(target.into(), function, &encode_args(args)?, at_micros)
}

/// Sets the timer `name` of the current object: its method `function`
/// runs once with `args` (serialized as JSON), as a job, at `at_micros`
/// (microseconds since the Unix epoch) or later. Setting a timer again
/// before it fires replaces it; any number of named timers per object.
/// Like every effect of a workflow, it exists only if the workflow commits.
pub fn set_timer<A: serde::Serialize + ?Sized>(
    name: &str,
    at_micros: i64,
    function: &str,
    args: &A,
) -> Result<(), CallError> {
    host::set_timer(name, at_micros, function, &encode_args(args)?)
}

/// [`set_timer`], `delay` after the workflow's clock.
pub fn set_timer_after<A: serde::Serialize + ?Sized>(
    name: &str,
    delay: std::time::Duration,
    function: &str,
    args: &A,
) -> Result<(), CallError> {
    set_timer(name, now_micros().saturating_add(micros(delay)), function, args)
}

/// Clears the timer `name` of the current object (its pending run does
/// not happen), when the workflow commits.
pub fn clear_timer(name: &str) -> Result<(), CallError> {
    host::clear_timer(name)
}

fn micros(delay: std::time::Duration) -> i64 {
    i64::try_from(delay.as_micros()).unwrap_or(i64::MAX)
}

fn encode_args<A: serde::Serialize + ?Sized>(args: &A) -> Result<String, CallError> {
    serde_json::to_string(args).map_err(|e| CallError::BadArguments(format!("cannot encode arguments: {e}")))
}

/// Calls method `function` of each of `targets` (each once, in the order
/// given) with `args` (serialized as JSON), in this transaction, as nested
/// calls: each target's result, decoded as `R`. A call that fails with its
/// own error is rolled back alone and reported in its place; the others
/// stay. As with a single nested call, a trap, the timeout or an unknown
/// object aborts the whole workflow. On a Citus cluster each call runs on
/// its object's node. The SQL counterpart is `lambdastore.map_call`.
///
/// # Examples
///
/// ```
/// # use lambdastore_sdk::{map_call, ObjectId};
/// # fn example(counters: &[ObjectId]) -> Result<(), lambdastore_sdk::CallError> {
/// for (id, outcome) in map_call::<i64, _>(counters, "add", &serde_json::json!({"n": 5}))? {
///     match outcome {
///         Ok(value) => lambdastore_sdk::log::info(format!("{id} is now {value}")),
///         Err(err) => lambdastore_sdk::log::warning(format!("{id} unchanged: {err}")),
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub fn map_call<R: serde::de::DeserializeOwned, A: serde::Serialize + ?Sized>(
    targets: &[ObjectId],
    function: &str,
    args: &A,
) -> Result<Vec<(ObjectId, Result<R, CallError>)>, CallError> {
    let outcomes = host::map_call(targets, function, &encode_args(args)?);
    Ok(outcomes
        .into_iter()
        .map(|(id, outcome)| (id, outcome.and_then(|json| __private::decode_return(function, &json))))
        .collect())
}

/// Writes to the PostgreSQL server log.
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::log;
/// # let host = lambdastore_sdk::mock::MockHost::standalone();
///
/// log::info(format!("balance is {}", 5));
/// log::warning("audit map is large");
/// # assert_eq!(host.logs().len(), 2);
/// ```
pub mod log {
    use crate::host::{self, LogLevel};

    /// Logs at `DEBUG1`.
    pub fn debug(message: impl AsRef<str>) {
        host::log(LogLevel::Debug, message.as_ref())
    }

    /// Logs at `LOG`: to the server log (not sent to the client).
    pub fn info(message: impl AsRef<str>) {
        host::log(LogLevel::Info, message.as_ref())
    }

    /// Logs at `NOTICE`.
    pub fn notice(message: impl AsRef<str>) {
        host::log(LogLevel::Notice, message.as_ref())
    }

    /// Logs at `WARNING`.
    pub fn warning(message: impl AsRef<str>) {
        host::log(LogLevel::Warning, message.as_ref())
    }
}

/// What a lambda module usually needs: `use lambdastore_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::{
        bail, lambda_functions, lambda_object, now_micros, random_u64, self_id, CallError, Cell, Error, Field,
        LambdaObject, Map, MultiMap, ObjectId, Result, Set,
    };
}

/// Declares the application: its object types, once per crate.
///
/// It defines `pub struct App`, which implements [`Application`] (describe
/// and dispatch by type name) and the WIT `Guest` trait, and on `wasm32`
/// exports it as the component's `describe` and `dispatch`. Tests run it
/// with [`MockHost::for_app::<App>()`](crate::mock::MockHost::for_app).
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::prelude::*;
///
/// #[lambda_object]
/// pub struct Counter { value: Cell<i64> }
///
/// #[lambda_functions]
/// impl Counter {
///     fn get(&self) -> i64 { self.value.get_or_default() }
/// }
///
/// lambdastore_sdk::app!(Counter);
///
/// use lambdastore_sdk::Application;
/// let app = App::describe();
/// assert_eq!(app.sdk, lambdastore_sdk::SDK_VERSION);
/// assert_eq!(app.types[0].name, "Counter");
/// assert_eq!(app.types[0].functions[0].name, "get");
/// ```
#[macro_export]
macro_rules! app {
    ($($ty:ty),+ $(,)?) => {
        /// This application's types, as declared with `lambdastore_sdk::app!`:
        /// the component's exports, and what `MockHost::for_app::<App>()` runs.
        pub struct App;

        impl $crate::Application for App {
            fn describe() -> $crate::desc::AppDesc {
                $crate::desc::AppDesc {
                    sdk: ::std::string::String::from($crate::SDK_VERSION),
                    types: ::std::vec![$($crate::desc::type_desc::<$ty>()),+],
                }
            }

            fn dispatch(
                kind: $crate::desc::FunctionKind,
                type_name: &str,
                function: &str,
                object: $crate::ObjectId,
                args: &str,
            ) -> ::core::result::Result<::std::string::String, $crate::CallError> {
                $(
                    if type_name == <$ty as $crate::LambdaObject>::NAME {
                        return <$ty as $crate::LambdaFunctions>::lambda_dispatch(
                            kind, function, object, args,
                        );
                    }
                )+
                ::core::result::Result::Err($crate::CallError::UnknownFunction(
                    ::std::string::ToString::to_string(type_name),
                ))
            }
        }

        impl $crate::bindings::Guest for App {
            fn describe() -> $crate::bindings::AppDesc {
                $crate::__private::wit_describe::<App>()
            }

            fn dispatch(
                kind: $crate::bindings::FunctionKind,
                type_name: ::std::string::String,
                function: ::std::string::String,
                object: $crate::ObjectId,
                args: ::std::string::String,
            ) -> ::core::result::Result<::std::string::String, $crate::bindings::CallError> {
                $crate::__private::wit_dispatch::<App>(kind, &type_name, &function, object, &args)
            }
        }

        #[cfg(target_arch = "wasm32")]
        $crate::bindings::export!(App with_types_in $crate::bindings);
    };
}
