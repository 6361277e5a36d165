//! The host side of the WIT world `lambdastore:lambda/lambda`
//! (guest-sdk/wit/lambda.wit): what a lambda may do, and nothing else.
//!
//! One `HostState` per store, that is per (nested) call. Errors a lambda
//! cannot handle (limits, refusals, a callee's trap) are returned as traps
//! carrying a `LambdaError`, which unwinds every wasm frame of the workflow
//! before the SQL edge reports it.
#![deny(unsafe_code)] // PostgreSQL's C API only through the pg module

pub(crate) mod calls;
mod entries;
pub(crate) mod registry;

use crate::error::{LambdaError, Result};
use crate::txn::Workflow;
use lambdastore_core::model::{CallFailure, Draw};
use registry::AppVersion;
use std::rc::Rc;

// The bindings wasmtime generates for the WIT world, shared with the bench.
pub(crate) use lambdastore_core::wit::*;

/// The call a store is running.
pub(crate) struct Frame {
    /// The object, or 0 for a static function.
    pub(crate) object: i64,
    pub(crate) type_name: String,
    pub(crate) function: String,
    pub(crate) readonly: bool,
    /// 0 for the top-level call.
    pub(crate) depth: u32,
}

impl Frame {
    /// The frame a module's `describe` runs in at its deploy: no object,
    /// and no type (the only frame without one).
    pub(crate) fn describe() -> Frame {
        Frame { object: 0, type_name: String::new(), function: "describe".into(), readonly: true, depth: 0 }
    }
}

pub(crate) struct HostState {
    pub(crate) workflow: Rc<Workflow>,
    /// The code version the workflow started with; nested calls keep it even
    /// if the application is redeployed meanwhile.
    pub(crate) app: Rc<AppVersion>,
    pub(crate) frame: Frame,
}

impl HostState {
    /// 42P13 when a module's `describe` asks the host for `what`: a
    /// description is static, made at the deploy with no object to read,
    /// and no call, job or timer of the deploying role's may start from
    /// it. (Logging, the clock and randomness stay allowed.)
    /// `what` is formatted only then: entry reads and writes ask on every
    /// call.
    fn refuse_in_describe(&self, what: impl std::fmt::Display) -> Result<()> {
        if self.frame.type_name.is_empty() {
            return Err(LambdaError::InvalidModule(format!(
                "its describe asked the host for {what}, which a description may not"
            )));
        }
        Ok(())
    }
}

/// A callee's own error and a refusal before it ran go back to its caller
/// (`CallFailure`); anything else traps, which unwinds the caller too and
/// aborts the workflow.
fn recoverable<T>(outcome: Result<T>) -> wasmtime::Result<std::result::Result<T, CallError>> {
    match outcome {
        Ok(value) => Ok(Ok(value)),
        Err(failed) => match failed.call_failure() {
            Some(failure) => Ok(Err(call_error(failure))),
            None => Err(failed.into()),
        },
    }
}

fn call_error(failure: CallFailure) -> CallError {
    match failure {
        CallFailure::Application(message) => CallError::Application(message),
        CallFailure::BadArguments(message) => CallError::BadArguments(message),
        CallFailure::UnknownObject(object) => CallError::UnknownObject(object),
        CallFailure::UnknownType(message) | CallFailure::UnknownFunction(message) => {
            CallError::UnknownFunction(message)
        }
        CallFailure::NotAllowed(message) => CallError::NotAllowed(message),
    }
}

impl lambdastore::lambda::types::Host for HostState {}

impl lambdastore::lambda::later::Host for HostState {
    fn spawn_at(
        &mut self,
        target: i64,
        function: String,
        args: String,
        at_micros: i64,
    ) -> wasmtime::Result<Result<(), CallError>> {
        recoverable(calls::spawn(self, target, &function, &args, Some(at_micros)))
    }

    fn set_timer(
        &mut self,
        name: String,
        at_micros: i64,
        function: String,
        args: String,
    ) -> wasmtime::Result<Result<(), CallError>> {
        recoverable(calls::set_timer(self, &name, Some((at_micros, &function, &args))))
    }

    fn clear_timer(&mut self, name: String) -> wasmtime::Result<Result<(), CallError>> {
        recoverable(calls::set_timer(self, &name, None))
    }
}

impl lambdastore::lambda::host::Host for HostState {
    fn self_id(&mut self) -> wasmtime::Result<i64> {
        Ok(self.frame.object)
    }

    fn get(&mut self, field: String, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        Ok(entries::get(self, field, key)?)
    }

    fn put(&mut self, field: String, key: Vec<u8>, value: Vec<u8>) -> wasmtime::Result<()> {
        Ok(entries::put(self, field, key, value)?)
    }

    fn delete(&mut self, field: String, key: Vec<u8>) -> wasmtime::Result<bool> {
        Ok(entries::delete(self, field, key)?)
    }

    fn scan(
        &mut self,
        field: String,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        limit: u32,
        dir: Direction,
    ) -> wasmtime::Result<Vec<Entry>> {
        Ok(entries::scan(self, field, start, end, limit, dir)?)
    }

    fn call(&mut self, target: i64, function: String, args: String) -> wasmtime::Result<Result<String, CallError>> {
        recoverable(calls::call(self, target, &function, &args))
    }

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
            .map(|target| Ok((target, recoverable(calls::call(self, target, &function, &args))?)))
            .collect()
    }

    fn create(&mut self, type_name: String, args: String) -> wasmtime::Result<Result<i64, CallError>> {
        recoverable(calls::create_nested(self, &type_name, &args))
    }

    fn call_static(
        &mut self,
        type_name: String,
        function: String,
        args: String,
    ) -> wasmtime::Result<Result<String, CallError>> {
        recoverable(calls::call_static(self, &type_name, &function, &args))
    }

    fn spawn(&mut self, target: i64, function: String, args: String) -> wasmtime::Result<Result<(), CallError>> {
        recoverable(calls::spawn(self, target, &function, &args, None))
    }

    fn now_micros(&mut self) -> wasmtime::Result<i64> {
        let now = || Ok(crate::pg::backend::now_unix_micros());
        Ok(self.workflow.draw(Draw::Now, Draw::now, now)?)
    }

    fn random_u64(&mut self) -> wasmtime::Result<u64> {
        // Cryptographic: a Python guest's `os.urandom`, `secrets` and
        // `uuid.uuid4` draw from it.
        let random = || {
            crate::pg::backend::strong_random_u64()
                .ok_or_else(|| LambdaError::Internal("the server's random source gave nothing".into()))
        };
        Ok(self.workflow.draw(Draw::Random, Draw::random, random)?)
    }

    fn log(&mut self, level: LogLevel, message: String) -> wasmtime::Result<()> {
        let (count, bytes) = self.workflow.logged.get();
        if count >= MAX_LOG_MESSAGES || bytes >= MAX_LOG_BYTES {
            return Ok(()); // dropped, as the last message delivered said
        }
        let app = &self.app.app;
        let Frame { object, type_name, function, .. } = &self.frame;
        let message = escaped(&message, MAX_LOG_MESSAGE);
        if !LOG_RATE.with(|rate| rate.borrow_mut().admit(message.len())) {
            return Ok(());
        }
        let (count, bytes) = (count + 1, bytes + message.len());
        self.workflow.logged.set((count, bytes));
        let line = if count >= MAX_LOG_MESSAGES || bytes >= MAX_LOG_BYTES {
            format!(
                "lambdastore {app}: {type_name}.{function} on object {object}: {message} \
                 [log limit reached ({MAX_LOG_MESSAGES} messages or {MAX_LOG_BYTES} bytes per workflow): \
                 further messages of this workflow are dropped]"
            )
        } else {
            format!("lambdastore {app}: {type_name}.{function} on object {object}: {message}")
        };
        // Below ERROR, ereport returns normally: safe to call from host code.
        match level {
            LogLevel::Debug => pgrx::debug1!("{line}"),
            LogLevel::Info => pgrx::log!("{line}"),
            LogLevel::Notice => pgrx::notice!("{line}"),
            LogLevel::Warning => pgrx::warning!("{line}"),
        }
        Ok(())
    }
}

thread_local! {
    /// This backend's lambda log, per second (`lambdastore.max_log_rate`).
    static LOG_RATE: std::cell::RefCell<LogRate> = const { std::cell::RefCell::new(LogRate { second: None, bytes: 0, dropped: 0 }) };
}

/// What a backend's lambdas logged in the current second. The per-workflow
/// caps alone let a session of many short calls write 27 MB of log in 10 s.
struct LogRate {
    second: Option<std::time::Instant>,
    bytes: usize,
    dropped: usize,
}

impl LogRate {
    /// Whether a message of `len` bytes may be written now; when a new
    /// second starts, first says how many the last one dropped.
    fn admit(&mut self, len: usize) -> bool {
        let now = std::time::Instant::now();
        if self.second.is_none_or(|start| now.duration_since(start) >= std::time::Duration::from_secs(1)) {
            if self.dropped > 0 {
                pgrx::log!(
                    "lambdastore: {} lambda log messages of this backend were dropped \
                     (lambdastore.max_log_rate)",
                    self.dropped
                );
            }
            *self = LogRate { second: Some(now), bytes: 0, dropped: 0 };
        }
        if self.bytes + len > crate::gucs::max_log_bytes_per_second() {
            self.dropped += 1;
            return false;
        }
        self.bytes += len;
        true
    }
}

/// Messages one workflow may log, and their bytes: a lambda must not be
/// able to fill the server's log (one call wrote 200 MB in 0.78 s).
const MAX_LOG_MESSAGES: usize = 100;
const MAX_LOG_BYTES: usize = 64 * 1024;
/// Bytes of one message, after escaping.
const MAX_LOG_MESSAGE: usize = 4 * 1024;

/// `message` with line breaks and other control characters escaped (so a
/// lambda cannot write what looks like a line of the server's own), cut
/// to `max` bytes.
fn escaped(message: &str, max: usize) -> String {
    let mut out = String::with_capacity(message.len().min(max));
    for c in message.chars() {
        if out.len() >= max {
            out.push_str(&format!("… ({} bytes in all)", message.len()));
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push(' '),
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out
}
