//! Support for the code the macros generate. Not a public API.

use std::cell::RefCell;
use std::fmt::Display;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::fields::Field;
use crate::{CallError, Cell};

pub use serde;
pub use serde_json;
pub use wit_bindgen;

pub use crate::wit::{describe as wit_describe, dispatch as wit_dispatch};

thread_local! {
    /// A failure the running function did not see: a stored value that does
    /// not decode, a value that does not encode. Field accessors stay
    /// infallible for authors; the function's call fails when it returns, so
    /// the host undoes everything it wrote (savepoint semantics).
    static DEFERRED_FAILURE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Makes the running function's call fail with `message` once it returns.
/// The first failure wins: it is the cause of the others.
pub(crate) fn fail_later(message: String) {
    DEFERRED_FAILURE.with(|f| {
        f.borrow_mut().get_or_insert(message);
    });
}

/// Runs one guest function, turning a deferred failure into its error.
/// Nested calls run their own `run_function`, so each call sees only its own
/// failures.
pub fn run_function(f: impl FnOnce() -> Result<String, CallError>) -> Result<String, CallError> {
    // Restores the caller's state even if `f` unwinds.
    struct Restore(Option<String>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            DEFERRED_FAILURE.with(|f| *f.borrow_mut() = outer);
        }
    }
    let _restore = Restore(DEFERRED_FAILURE.with(|f| f.borrow_mut().take()));
    let result = f();
    match DEFERRED_FAILURE.with(|f| f.borrow_mut().take()) {
        Some(message) => Err(CallError::Application(message)),
        None => result,
    }
}

/// The arguments of one call, by parameter position.
///
/// JSON convention: an object maps parameters by name, an array by position,
/// `null` means no arguments. A missing parameter decodes from `null`, so
/// `Option<T>` parameters may be omitted.
pub struct Args {
    names: &'static [&'static str],
    values: Vec<Option<Value>>,
}

impl Args {
    /// Parses `json` for a function with parameters `names`.
    pub fn parse(json: &str, names: &'static [&'static str]) -> Result<Args, CallError> {
        let bad = |m: String| CallError::BadArguments(m);
        let json: Value = if json.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(json).map_err(|e| bad(format!("arguments are not valid JSON: {e}")))?
        };
        let mut values: Vec<Option<Value>> = vec![None; names.len()];
        match json {
            Value::Null => {}
            Value::Object(map) => {
                for (name, value) in map {
                    let Some(i) = names.iter().position(|n| *n == name) else {
                        return Err(bad(format!("unknown parameter `{name}` ({})", describe_params(names))));
                    };
                    values[i] = Some(value);
                }
            }
            Value::Array(list) => {
                if list.len() > names.len() {
                    return Err(bad(format!("{} arguments given ({})", list.len(), describe_params(names))));
                }
                for (slot, value) in values.iter_mut().zip(list) {
                    *slot = Some(value);
                }
            }
            other => {
                return Err(bad(format!(
                    "arguments must be a JSON object (by name), an array (by position) or null, not {other}"
                )))
            }
        }
        Ok(Args { names, values })
    }

    /// Decodes parameter `index`.
    pub fn take<T: DeserializeOwned>(&mut self, index: usize) -> Result<T, CallError> {
        let name = self.names[index];
        match self.values[index].take() {
            Some(value) => {
                serde_json::from_value(value).map_err(|e| CallError::BadArguments(format!("parameter `{name}`: {e}")))
            }
            None => serde_json::from_value(Value::Null)
                .map_err(|_| CallError::BadArguments(format!("missing parameter `{name}`"))),
        }
    }
}

fn describe_params(names: &[&str]) -> String {
    if names.is_empty() {
        "the function takes no parameters".to_string()
    } else {
        format!("parameters: {}", names.join(", "))
    }
}

/// The JSON result of a function that returns a plain value.
///
/// A non-finite float fails the call rather than reach the caller as `null`.
pub fn encode_return<T: Serialize>(value: &T) -> Result<String, CallError> {
    let cannot = |e: &dyn Display| CallError::Application(format!("cannot encode the result as JSON: {e}"));
    let json = serde_json::to_string(value).map_err(|e| cannot(&e))?;
    // serde_json writes non-finite floats as `null`: a result without one
    // needs no second look.
    if json.contains("null") {
        crate::finite::check(value).map_err(|e| cannot(&e))?;
    }
    Ok(json)
}

/// The JSON result of a function that returns `Result<T, E>`: `Err(e)` is
/// the function's own error.
pub fn encode_result<T: Serialize, E: Display>(result: Result<T, E>) -> Result<String, CallError> {
    match result {
        Ok(value) => encode_return(&value),
        Err(e) => Err(CallError::Application(e.to_string())),
    }
}

/// The JSON result of a constructor that returns `Result<(), E>`: `null`.
pub fn encode_constructor_result<E: Display>(result: Result<(), E>) -> Result<String, CallError> {
    match result {
        Ok(()) => Ok("null".to_string()),
        Err(e) => Err(CallError::Application(e.to_string())),
    }
}

/// The cell holding the version of an object's fields, for types with a
/// `#[migrate(N)]` function; no Rust field can have this name. Absent: 1.
const FIELDS_VERSION: &str = "lambdastore.version";

fn fields_version() -> Cell<u32> {
    Cell::bind(FIELDS_VERSION)
}

/// What a constructor of a type with a migration records: the new object's
/// fields are at `version`.
pub fn record_fields_version(version: u32) {
    fields_version().set(&version)
}

/// The version an object's fields are at, which this code (at `version`)
/// can use or migrate from; never a newer one, which it would misread.
fn stored_fields_version(type_name: &str, version: u32) -> Result<u32, CallError> {
    let stored = fields_version().get().unwrap_or(1);
    if stored > version {
        return Err(CallError::Application(format!(
            "the fields of {type_name} object {} are at version {stored}, newer than this code's {version}: \
             deploy the code that wrote them",
            crate::self_id()
        )));
    }
    Ok(stored)
}

/// Before any method of a type whose fields are at `version`: an object
/// still at an older one is migrated first, by its `migrate` function as a
/// nested call (which may write even when the method is readonly). Every
/// call on a behind object migrates it, so no call ever sees old fields.
pub fn ensure_migrated(type_name: &str, version: u32) -> Result<(), CallError> {
    if stored_fields_version(type_name, version)? == version {
        return Ok(());
    }
    // The migration's own error says what failed; any other is the call's.
    crate::host::call(crate::self_id(), crate::desc::MIGRATE, "null").map(|_| ()).map_err(|e| match e {
        CallError::Application(_) => e,
        other => CallError::Application(format!("migrating {type_name} object {}: {other}", crate::self_id())),
    })
}

/// The exported `migrate` function: runs the author's `migrate(from)` if
/// the object is behind `version`, then records `version`. Its result says
/// what it did: `{"from": 1, "to": 2}` (equal when there was nothing to do).
pub fn run_migration<E: Display>(
    type_name: &str,
    version: u32,
    migrate: impl FnOnce(u32) -> Result<(), E>,
) -> Result<String, CallError> {
    let from = stored_fields_version(type_name, version)?;
    if from < version {
        migrate(from).map_err(|e| {
            CallError::Application(format!(
                "migrating {type_name} object {} from version {from} to {version}: {e}",
                crate::self_id()
            ))
        })?;
        record_fields_version(version);
    }
    Ok(serde_json::json!({"from": from, "to": version}).to_string())
}

/// Arguments of a call through a generated `…Ref`, by name.
#[derive(Default)]
pub struct ArgsBuilder(Map<String, Value>);

impl ArgsBuilder {
    /// Adds one argument.
    pub fn arg<T: Serialize>(mut self, name: &str, value: &T) -> Result<Self, CallError> {
        let value = serde_json::to_value(value)
            .map_err(|e| CallError::BadArguments(format!("cannot encode argument `{name}`: {e}")))?;
        self.0.insert(name.to_string(), value);
        Ok(self)
    }

    /// The JSON text.
    pub fn finish(self) -> String {
        Value::Object(self.0).to_string()
    }
}

/// Decodes the JSON result of a nested call.
pub fn decode_return<T: DeserializeOwned>(function: &str, json: &str) -> Result<T, CallError> {
    serde_json::from_str(json)
        .map_err(|e| CallError::Application(format!("cannot decode the result of `{function}`: {e}")))
}

/// The error of a dispatch to a function this type does not have.
pub fn unknown_function(type_name: &str, function: &str) -> CallError {
    CallError::UnknownFunction(format!("{type_name}.{function}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &["to", "amount", "memo"];

    fn parse(json: &str) -> Result<(i64, i64, Option<String>), CallError> {
        let mut args = Args::parse(json, NAMES)?;
        Ok((args.take(0)?, args.take(1)?, args.take(2)?))
    }

    #[test]
    fn arguments_by_name_and_by_position() {
        assert_eq!(parse(r#"{"amount": 5, "to": 2}"#).unwrap(), (2, 5, None));
        assert_eq!(parse(r#"[2, 5, "rent"]"#).unwrap(), (2, 5, Some("rent".into())));
        assert_eq!(parse(r#"{"to": 2, "amount": 5, "memo": null}"#).unwrap(), (2, 5, None));
        // A repeated name: the last one counts, as in a JSON object.
        assert_eq!(parse(r#"{"to": 1, "amount": 5, "to": 2}"#).unwrap(), (2, 5, None));
        // Escapes in names and nested values are decoded as usual.
        assert_eq!(
            parse(r#"{"t\u006f": 2, "amount": 5, "memo": "a \"b\" [c]"}"#).unwrap(),
            (2, 5, Some("a \"b\" [c]".into()))
        );
    }

    #[test]
    fn argument_mistakes_are_bad_arguments() {
        let err = |json| match parse(json) {
            Err(CallError::BadArguments(m)) => m,
            other => panic!("expected bad arguments for {json}, got {other:?}"),
        };
        assert_eq!(err(r#"{"to": 2}"#), "missing parameter `amount`");
        assert_eq!(err(r#"[2]"#), "missing parameter `amount`");
        assert_eq!(err("null"), "missing parameter `to`");
        assert!(err(r#"{"to": 2, "amount": 5, "x": 1}"#).starts_with("unknown parameter `x`"));
        assert!(err(r#"[1, 2, "m", 4]"#).starts_with("4 arguments given"));
        assert_eq!(err(r#"{"to": "two", "amount": 5}"#), "parameter `to`: invalid type: string \"two\", expected i64");
        assert_eq!(err(r#"[2, "x"]"#), "parameter `amount`: invalid type: string \"x\", expected i64");
        assert!(err("5").ends_with("or null, not 5"));
        assert!(err("5").starts_with("arguments must be a JSON object"));
        assert!(err("{").starts_with("arguments are not valid JSON"));
    }

    #[test]
    fn no_parameters_accept_null_empty_object_and_empty_array() {
        for json in ["null", "{}", "[]", ""] {
            Args::parse(json, &[]).unwrap();
        }
        assert!(Args::parse("[1]", &[]).is_err());
    }

    #[test]
    fn deferred_failures_fail_only_their_own_call() {
        let outer = run_function(|| {
            let inner = run_function(|| {
                fail_later("inner broke".into());
                Ok("1".into())
            });
            assert_eq!(inner, Err(CallError::Application("inner broke".into())));
            Ok("2".into())
        });
        assert_eq!(outer, Ok("2".into()));
    }
}
