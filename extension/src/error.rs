//! The one error type of the extension. Host code returns it; only the SQL
//! edge (`api/`) turns it into an `ERROR` with its SQLSTATE, after every
//! wasm frame has been left (never `ereport` across wasm frames).
//!
//! SQLSTATEs are PostgreSQL's standard codes so that generic clients react
//! correctly (40001 is retried, 57014 is a cancel, 53200 is out of memory).
//! The table is part of the public contract: docs/errors.md, which
//! tests/tests/docs.rs keeps listing exactly the codes `sqlstate` returns.

use lambdastore_core::model::CallFailure;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum LambdaError {
    #[error("application \"{0}\" does not exist")]
    UnknownApplication(String),
    #[error("object {0} does not exist")]
    UnknownObject(i64),
    #[error("type \"{ty}\" of application \"{app}\" does not exist")]
    UnknownType { app: String, ty: String },
    #[error("field \"{field}\" of type \"{ty}\" does not exist")]
    UnknownField { ty: String, field: String },
    #[error("function \"{function}\" of type \"{ty}\" does not exist{why}")]
    UnknownFunction { ty: String, function: String, why: String },
    #[error("function \"{ty}.{function}\" is protected: only lambdas of application \"{app}\" may call it")]
    Protected { app: String, ty: String, function: String },
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("bad arguments for \"{ty}.{function}\": {message}")]
    BadArguments { ty: String, function: String, message: String },
    #[error("{message}")]
    Application { message: String },
    /// A refusal a callee (on another node, or through a guest that passed
    /// it on) returned as a value, raised again as it was said
    /// (`model::CallFailure`).
    #[error("{message}")]
    Refused { refusal: Refusal, message: String },
    /// `backtrace` (the wasm frames) goes to the DETAIL, not the message.
    #[error("lambda trapped: {message}")]
    Trap { message: String, backtrace: String },
    /// `capped`: the role asked for longer, and `max_timeout` held it to
    /// this (else a user who set a minute sees ten seconds unexplained).
    #[error("lambda exceeded lambdastore.timeout ({ms} ms{})", if *capped { ", as lambdastore.max_timeout caps it for roles that are not superusers" } else { "" })]
    Timeout { ms: u128, capped: bool },
    #[error("lambda was canceled")]
    Canceled,
    #[error("lambda exceeded lambdastore.memory_limit ({limit} bytes): it asked for {requested} bytes")]
    MemoryLimit { limit: usize, requested: usize },
    #[error("{what} {size} bytes, more than {setting} ({limit} bytes)")]
    TooLarge { what: &'static str, size: usize, limit: usize, setting: &'static str },
    #[error("an entry's field name and key are {size} bytes together, more than the {limit} an index entry holds")]
    KeyTooLong { size: usize, limit: usize },
    #[error("{what} {count}, more than {setting} ({limit})")]
    TooMany { what: &'static str, count: usize, limit: usize, setting: &'static str },
    #[error("nested call depth exceeds lambdastore.max_call_depth ({0})")]
    CallDepth(u32),
    #[error("function \"{ty}.{function}\" is readonly and may not write")]
    ReadonlyWrite { ty: String, function: String },
    #[error("static function \"{ty}.{function}\" has no object whose entries it could {op}")]
    NoObject { ty: String, function: String, op: &'static str },
    #[error("could not serialize access: {0}")]
    SerializationFailure(String),
    #[error("{0}")]
    IsolationLevel(String),
    #[error("{0}")]
    Prepared(String),
    #[error("{0}")]
    InvalidParameter(String),
    #[error("{0} may not be NULL")]
    NullArgument(String),
    #[error("{0}")]
    ReadOnlyTransaction(String),
    #[error("{0}")]
    NotPreloaded(String),
    /// A deploy of code older than its objects' fields (api/deploy.rs).
    #[error("{0}")]
    NewerFields(String),
    /// `cancel` of a schedule's tick (jobs/mod.rs).
    #[error("{0}")]
    ScheduledTick(String),
    /// A role OID stored by another server (catalog/grants.rs).
    #[error(
        "the roles this database stores are another server's (it was restored from a dump of one): \
         a superuser maps them by name with SELECT * FROM lambdastore.adopt_restored_roles()"
    )]
    RolesOfAnotherServer,
    /// `DROP ROLE` of a role that applications, grants or schedules of
    /// this database name: what they are.
    #[error(
        "role \"{role}\" cannot be dropped because lambdastore depends on it: {uses} \
         (REASSIGN OWNED BY it TO another role hands its applications and schedules over, and DROP \
         OWNED BY it revokes its grants; or lambdastore.set_owner, revoke and unschedule)"
    )]
    RoleInUse { role: String, uses: String },
    #[error("{0}")]
    InvalidName(String),
    #[error("invalid module: {0}")]
    InvalidModule(String),
    #[error("job {0} does not exist")]
    UnknownJob(i64),
    #[error("object {object} has a schedule named \"{name}\" already (lambdastore.unschedule removes it)")]
    DuplicateSchedule { object: i64, name: String },
    #[error("API key {0} does not exist")]
    UnknownApiKey(i64),
    #[error("role with OID {0} does not exist")]
    UnknownRole(u32),
    #[error("invalid or revoked API key")]
    InvalidApiKey,
    #[error("idempotency key \"{key}\" was already used for a different call (job {job})")]
    IdempotencyKeyReused { key: String, job: i64 },
    #[error("an idempotency key must be 1 to {max} bytes long, this one is {len}")]
    IdempotencyKeyLength { len: usize, max: usize },
    #[error("job {0} was submitted by this transaction: commit it before waiting for the job")]
    JobNotCommitted(i64),
    #[error("object {object} is stored on {node}: this node holds no objects")]
    Elsewhere { object: i64, node: String },
    /// An object that is not on this node, met where it was expected here:
    /// it moved (`lambdastore.migrate_object`) while the call was on its
    /// way or the transaction ran. Retrying finds it where it is now.
    #[error("object {object} is now stored on {node}: it moved while this transaction ran; retry")]
    Moved { object: i64, node: String },
    #[error("object {0} is in use by an unfinished call on another node of this workflow: a workflow's calls across nodes may not come back to it")]
    CallBack(i64),
    /// A forwarded call's run stopped for a call on another node (core/src/txn/tape.rs):
    /// what to answer the node that drives the transaction. Never reaches a client.
    #[error("a call forwarded to this node needs a call on another node first")]
    Suspended(String),
    /// A light replica's run did what only the object's owner can do (a
    /// nested call, a spawn, a timer, a new object: `what`); the call is
    /// handed to the owner (cluster/replica.rs). Never reaches a client.
    #[error("a light replica cannot run this call ({0}): its owner runs it")]
    HandOver(&'static str),
    /// Raised on the node a call was forwarded to (cluster/forward.rs): its code
    /// and words, without what the forwarding node's SPI call added.
    #[error("{message}")]
    Remote { code: PgSqlErrorCode, message: String, detail: String },
    #[error("internal error: {0}")]
    Internal(String),
}

pub(crate) type Result<T, E = LambdaError> = std::result::Result<T, E>;

/// A callee's failure as its caller receives it (`model::CallFailure`).
impl LambdaError {
    /// The failure a caller may handle, if this is one.
    pub(crate) fn call_failure(&self) -> Option<CallFailure> {
        use LambdaError as E;
        Some(match self {
            E::Application { message } => CallFailure::Application(message.clone()),
            E::UnknownObject(object) => CallFailure::UnknownObject(*object),
            E::BadArguments { .. } | E::Refused { refusal: Refusal::BadArguments, .. } => {
                CallFailure::BadArguments(self.to_string())
            }
            E::UnknownType { .. } | E::Refused { refusal: Refusal::UnknownType, .. } => {
                CallFailure::UnknownType(self.to_string())
            }
            E::UnknownFunction { .. } | E::Refused { refusal: Refusal::UnknownFunction, .. } => {
                CallFailure::UnknownFunction(self.to_string())
            }
            E::Protected { .. } | E::PermissionDenied(_) | E::Refused { refusal: Refusal::NotAllowed, .. } => {
                CallFailure::NotAllowed(self.to_string())
            }
            _ => return None,
        })
    }
}

/// A failure where nothing handles it (a call from SQL): the error, with
/// the message and SQLSTATE it had.
impl From<CallFailure> for LambdaError {
    fn from(failure: CallFailure) -> LambdaError {
        let refused = |refusal, message| LambdaError::Refused { refusal, message };
        match failure {
            CallFailure::Application(message) => LambdaError::Application { message },
            CallFailure::UnknownObject(object) => LambdaError::UnknownObject(object),
            CallFailure::BadArguments(message) => refused(Refusal::BadArguments, message),
            CallFailure::UnknownType(message) => refused(Refusal::UnknownType, message),
            CallFailure::UnknownFunction(message) => refused(Refusal::UnknownFunction, message),
            CallFailure::NotAllowed(message) => refused(Refusal::NotAllowed, message),
        }
    }
}

/// What kind of refusal a `Refused` is: its SQLSTATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    BadArguments,
    UnknownType,
    UnknownFunction,
    NotAllowed,
}

impl LambdaError {
    pub(crate) fn sqlstate(&self) -> PgSqlErrorCode {
        use LambdaError::*;
        use PgSqlErrorCode::*;
        match self {
            UnknownApplication(_)
            | UnknownObject(_)
            | UnknownType { .. }
            | UnknownJob(_)
            | UnknownApiKey(_)
            | UnknownRole(_) => ERRCODE_UNDEFINED_OBJECT,
            InvalidApiKey => ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            IdempotencyKeyReused { .. } => ERRCODE_UNIQUE_VIOLATION,
            DuplicateSchedule { .. } => ERRCODE_DUPLICATE_OBJECT,
            IdempotencyKeyLength { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            JobNotCommitted(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            UnknownFunction { .. } => ERRCODE_UNDEFINED_FUNCTION,
            UnknownField { .. } => ERRCODE_UNDEFINED_COLUMN,
            Protected { .. } | PermissionDenied(_) => ERRCODE_INSUFFICIENT_PRIVILEGE,
            BadArguments { .. } | Refused { refusal: Refusal::BadArguments, .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            Refused { refusal: Refusal::UnknownFunction, .. } => ERRCODE_UNDEFINED_FUNCTION,
            Refused { refusal: Refusal::UnknownType, .. } => ERRCODE_UNDEFINED_OBJECT,
            Refused { refusal: Refusal::NotAllowed, .. } => ERRCODE_INSUFFICIENT_PRIVILEGE,
            Application { .. } => ERRCODE_RAISE_EXCEPTION,
            Trap { .. } => ERRCODE_EXTERNAL_ROUTINE_EXCEPTION,
            Timeout { .. } | Canceled => ERRCODE_QUERY_CANCELED,
            MemoryLimit { .. } => ERRCODE_OUT_OF_MEMORY,
            TooLarge { .. } | TooMany { .. } | KeyTooLong { .. } => ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            InvalidParameter(_) => ERRCODE_INVALID_PARAMETER_VALUE,
            NullArgument(_) => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            ReadOnlyTransaction(_) => ERRCODE_READ_ONLY_SQL_TRANSACTION,
            CallDepth(_) => ERRCODE_STATEMENT_TOO_COMPLEX,
            ReadonlyWrite { .. } | NoObject { .. } => ERRCODE_E_R_E_MODIFYING_SQL_DATA_NOT_PERMITTED,
            IsolationLevel(_) | Prepared(_) | Elsewhere { .. } | CallBack(_) => ERRCODE_FEATURE_NOT_SUPPORTED,
            NotPreloaded(_) | NewerFields(_) | ScheduledTick(_) | RolesOfAnotherServer => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            RoleInUse { .. } => ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
            SerializationFailure(_) | Moved { .. } => ERRCODE_T_R_SERIALIZATION_FAILURE,
            InvalidName(_) => ERRCODE_INVALID_NAME,
            InvalidModule(_) => ERRCODE_INVALID_FUNCTION_DEFINITION,
            Internal(_) | Suspended(_) | HandOver(_) => ERRCODE_INTERNAL_ERROR,
            Remote { code, .. } => *code,
        }
    }

    /// Raises the error as a PostgreSQL `ERROR`. Call only from the SQL edge.
    pub(crate) fn report(self, context: &str) -> ! {
        let code = self.sqlstate();
        let mut detail = context.to_string();
        if let LambdaError::Trap { backtrace, .. } = &self {
            detail = format!("{detail}\n{backtrace}").trim().to_string();
        }
        if let LambdaError::Remote { detail: remote, .. } = &self {
            detail.clone_from(remote);
        }
        let mut report = ErrorReport::new(code, bounded(self.to_string()), "lambdastore");
        if !detail.is_empty() {
            report = report.set_detail(bounded(detail));
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("ERROR does not return")
    }
}

/// The most of a message or a detail an error reports. Both quote what the
/// caller sent (a method name, the call) or what a lambda said, which can
/// be megabytes; a backtrace of deep recursion has thousands of lines.
const MAX_REPORTED: usize = 8 * 1024;

/// `text` cut to `MAX_REPORTED` bytes (on a character boundary), saying how
/// much was left out, with any NUL byte (a lambda's message may hold one;
/// PostgreSQL's strings cannot) written as `\0`.
pub(crate) fn bounded(text: String) -> String {
    let text = if text.contains('\0') { text.replace('\0', "\\0") } else { text };
    if text.len() <= MAX_REPORTED {
        return text;
    }
    let end = (0..=MAX_REPORTED).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
}

/// Turns the error of a wasmtime call (a trap, or one of ours carried
/// through the guest as a trap) back into a `LambdaError`.
pub(crate) fn from_wasmtime(err: wasmtime::Error) -> LambdaError {
    let err = match err.downcast::<LambdaError>() {
        Ok(ours) => return ours,
        Err(other) => other,
    };
    let backtrace = err.downcast_ref::<wasmtime::WasmBacktrace>().map(|bt| bt.to_string()).unwrap_or_default();
    let message = match err.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => format!("{err:#}"),
    };
    LambdaError::Trap { message, backtrace }
}
