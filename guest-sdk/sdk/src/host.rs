//! The raw host interface: entries of the current object, calls, time,
//! randomness, logging.
//!
//! On `wasm32` these call the component's `lambdastore:lambda/host` imports.
//! On native targets they call the [`MockHost`](crate::mock::MockHost)
//! installed on the current thread, so an application's `cargo test` runs
//! without a database. Authors normally use the typed fields and the
//! generated `…Ref` types instead; this module is the escape hatch.

use crate::{CallError, ObjectId};

/// Scan direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Ascending key order.
    Forward,
    /// Descending key order.
    Backward,
}

/// One stored entry of a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The encoded key (empty for a cell).
    pub key: Vec<u8>,
    /// The stored value bytes.
    pub value: Vec<u8>,
}

/// Levels of the PostgreSQL server log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogLevel {
    /// `DEBUG1`.
    Debug,
    /// `LOG`: the server log (not sent to the client).
    Info,
    /// `NOTICE`.
    Notice,
    /// `WARNING`.
    Warning,
}

#[cfg(target_arch = "wasm32")]
use wasm as imp;

#[cfg(not(target_arch = "wasm32"))]
use crate::mock::host as imp;

/// The object the running function was invoked on (0 for static functions).
pub fn self_id() -> ObjectId {
    imp::self_id()
}

/// The value of `key` in `field` of the current object.
pub fn get(field: &str, key: &[u8]) -> Option<Vec<u8>> {
    imp::get(field, key)
}

/// Stores `value` under `key` in `field` of the current object.
pub fn put(field: &str, key: &[u8], value: &[u8]) {
    imp::put(field, key, value)
}

/// Deletes `key` from `field` of the current object; returns whether it was there.
pub fn delete(field: &str, key: &[u8]) -> bool {
    imp::delete(field, key)
}

/// Entries of `field` with `start <= key < end` (a missing bound is open), in
/// key order or reverse, at most `limit` of them.
pub fn scan(field: &str, start: Option<&[u8]>, end: Option<&[u8]>, limit: u32, dir: Direction) -> Vec<Entry> {
    imp::scan(field, start, end, limit, dir)
}

/// Calls `function` on object `target` (same application, same transaction).
/// Arguments and result are JSON text.
pub fn call(target: ObjectId, function: &str, args: &str) -> Result<String, CallError> {
    imp::call(target, function, args)
}

/// [`call`] on each of `targets` (each once, in the order given): each
/// target's outcome, a failed one rolled back alone.
pub fn map_call(targets: &[ObjectId], function: &str, args: &str) -> Vec<(ObjectId, Result<String, CallError>)> {
    imp::map_call(targets, function, args)
}

/// Creates an object of `type_name` and runs its constructor with `args` (JSON).
pub fn create(type_name: &str, args: &str) -> Result<ObjectId, CallError> {
    imp::create(type_name, args)
}

/// Calls a static function of `type_name`. Arguments and result are JSON text.
pub fn call_static(type_name: &str, function: &str, args: &str) -> Result<String, CallError> {
    imp::call_static(type_name, function, args)
}

/// Runs the call as its own transaction after this one commits.
pub fn spawn(target: ObjectId, function: &str, args: &str) -> Result<(), CallError> {
    imp::spawn(target, function, args)
}

/// [`spawn`], due at `at_micros` (microseconds since the Unix epoch) or later.
pub fn spawn_at(target: ObjectId, function: &str, args: &str, at_micros: i64) -> Result<(), CallError> {
    imp::spawn_at(target, function, args, at_micros)
}

/// Sets the timer `name` of the current object: `function` runs once with
/// `args` at `at_micros` or later, replacing the timer's pending run.
pub fn set_timer(name: &str, at_micros: i64, function: &str, args: &str) -> Result<(), CallError> {
    imp::set_timer(name, at_micros, function, args)
}

/// Clears the timer `name` of the current object.
pub fn clear_timer(name: &str) -> Result<(), CallError> {
    imp::clear_timer(name)
}

/// Microseconds since the Unix epoch (the transaction's clock).
pub fn now_micros() -> i64 {
    imp::now_micros()
}

/// Random bits from the host.
pub fn random_u64() -> u64 {
    imp::random_u64()
}

/// Writes `message` to the server log.
pub fn log(level: LogLevel, message: &str) {
    imp::log(level, message)
}

/// The component imports, with SDK types at the boundary.
#[cfg(target_arch = "wasm32")]
mod wasm {
    use super::{Direction, Entry, LogLevel};
    use crate::bindings::lambdastore::lambda::{host, later, types};
    use crate::{CallError, ObjectId};

    pub fn self_id() -> ObjectId {
        host::self_id()
    }
    pub fn get(field: &str, key: &[u8]) -> Option<Vec<u8>> {
        host::get(field, key)
    }
    pub fn put(field: &str, key: &[u8], value: &[u8]) {
        host::put(field, key, value)
    }
    pub fn delete(field: &str, key: &[u8]) -> bool {
        host::delete(field, key)
    }
    pub fn scan(field: &str, start: Option<&[u8]>, end: Option<&[u8]>, limit: u32, dir: Direction) -> Vec<Entry> {
        let dir = match dir {
            Direction::Forward => types::Direction::Forward,
            Direction::Backward => types::Direction::Backward,
        };
        host::scan(field, start, end, limit, dir).into_iter().map(|e| Entry { key: e.key, value: e.value }).collect()
    }
    pub fn call(target: ObjectId, function: &str, args: &str) -> Result<String, CallError> {
        host::call(target, function, args).map_err(Into::into)
    }
    pub fn map_call(targets: &[ObjectId], function: &str, args: &str) -> Vec<(ObjectId, Result<String, CallError>)> {
        host::map_call(targets, function, args)
            .into_iter()
            .map(|(id, outcome)| (id, outcome.map_err(Into::into)))
            .collect()
    }
    pub fn create(type_name: &str, args: &str) -> Result<ObjectId, CallError> {
        host::create(type_name, args).map_err(Into::into)
    }
    pub fn call_static(type_name: &str, function: &str, args: &str) -> Result<String, CallError> {
        host::call_static(type_name, function, args).map_err(Into::into)
    }
    pub fn spawn(target: ObjectId, function: &str, args: &str) -> Result<(), CallError> {
        host::spawn(target, function, args).map_err(Into::into)
    }
    pub fn spawn_at(target: ObjectId, function: &str, args: &str, at_micros: i64) -> Result<(), CallError> {
        later::spawn_at(target, function, args, at_micros).map_err(Into::into)
    }
    pub fn set_timer(name: &str, at_micros: i64, function: &str, args: &str) -> Result<(), CallError> {
        later::set_timer(name, at_micros, function, args).map_err(Into::into)
    }
    pub fn clear_timer(name: &str) -> Result<(), CallError> {
        later::clear_timer(name).map_err(Into::into)
    }
    pub fn now_micros() -> i64 {
        host::now_micros()
    }
    pub fn random_u64() -> u64 {
        host::random_u64()
    }
    pub fn log(level: LogLevel, message: &str) {
        let level = match level {
            LogLevel::Debug => types::LogLevel::Debug,
            LogLevel::Info => types::LogLevel::Info,
            LogLevel::Notice => types::LogLevel::Notice,
            LogLevel::Warning => types::LogLevel::Warning,
        };
        host::log(level, message)
    }
}
