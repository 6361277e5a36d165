//! The SQL surface: thin wrappers that turn SQL arguments into a workflow
//! call and a `LambdaError` into an `ERROR` with its SQLSTATE.

use crate::error::{LambdaError, Result};
use crate::workflow;
use json_text::JsonText;
use pgrx::prelude::*;
use pgrx::JsonB;

/// Raises `err` once every wasm frame is gone. A cancel or termination is
/// handed back to PostgreSQL so that it reports it its own way (57014
/// "canceling statement due to ...", or FATAL for a terminated backend).
fn raise(err: LambdaError, context: String) -> ! {
    if matches!(err, LambdaError::Canceled) {
        pgrx::check_for_interrupts!();
    }
    err.report(&context)
}

/// A lambda's result as jsonb; text that is not JSON is the lambda's fault
/// (a trap), not the caller's bad input.
fn json_result(result: Result<String>, context: impl FnOnce() -> String) -> JsonText {
    let checked = result.and_then(|text| match serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        Ok(_) => Ok(JsonText(text)),
        Err(e) => Err(LambdaError::Trap { message: format!("the result is not JSON: {e}"), backtrace: String::new() }),
    });
    checked.unwrap_or_else(|err| raise(err, context()))
}

/// Runs a method of an object in this backend, inside the caller's
/// transaction, and returns its JSON result.
#[pg_extern(volatile, parallel_unsafe)]
fn lambda_invoke(object_id: i64, method: &str, args: default!(JsonText, "'{}'")) -> JsonText {
    json_result(workflow::invoke_method(object_id, method, &args.0), || {
        format!("lambda_invoke({object_id}, '{method}')")
    })
}

#[pg_schema]
mod lambdastore {
    use super::*;

    /// Registers a new version of an application's code and returns what
    /// it registered. Redeploying the same bytes changes nothing.
    #[pg_extern(volatile, parallel_unsafe)]
    fn deploy(app: &str, module: &[u8]) -> JsonB {
        match crate::api::deploy::deploy(app, module) {
            Ok(json) => JsonB(json),
            Err(err) => raise(err, format!("deploy('{app}')")),
        }
    }

    /// Creates an object and runs its type's constructor; returns its id.
    #[pg_extern(volatile, parallel_unsafe)]
    fn create_object(app: &str, type_name: &str, args: default!(JsonText, "'{}'")) -> i64 {
        match workflow::create(app, type_name, &args.0) {
            Ok(id) => id,
            Err(err) => raise(err, format!("create_object('{app}', '{type_name}')")),
        }
    }

    /// Runs a static function of a type (no object).
    #[pg_extern(volatile, parallel_unsafe)]
    fn invoke_static(app: &str, type_name: &str, function: &str, args: default!(JsonText, "'{}'")) -> JsonText {
        json_result(workflow::invoke_static(app, type_name, function, &args.0), || {
            format!("invoke_static('{app}', '{}', '{function}')", type_name)
        })
    }

    /// Inserts a guard at (field, key): the entry set containing it is split
    /// in two, both halves with versions above the old one. For experiments;
    /// at commit, hot sets are split automatically. False if already a guard.
    #[pg_extern(volatile, parallel_unsafe)]
    fn split(object_id: i64, field: &str, key: &[u8]) -> bool {
        let outcome = crate::workflow::check_field(object_id, field).and_then(|_| crate::txn::occ::split(object_id, field, key));
        match outcome {
            Ok(split) => split,
            Err(err) => raise(err, format!("split({object_id})")),
        }
    }

    /// Behind `lambdastore.entry_sets` (sql/views.sql): a set's version and
    /// recent conflicts, kept in shared memory.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _entry_set_counters(
        object_id: i64,
        lower_field: &str,
        lower_key: &[u8],
    ) -> TableIterator<'static, (name!(version, i64), name!(conflicts, i64))> {
        let set = (object_id, (lower_field.to_string(), lower_key.to_vec()));
        TableIterator::once((crate::txn::versions::version(&set), crate::txn::versions::conflicts(&set)))
    }

    /// Queues a call of `method` on the object as a job that a background
    /// worker runs in a transaction of its own; returns the job id. With an
    /// idempotency key already used in this application, returns that job.
    #[pg_extern(volatile, parallel_unsafe)]
    fn submit(
        object_id: i64,
        method: &str,
        args: default!(JsonText, "'{}'"),
        idempotency_key: default!(Option<&str>, "NULL"),
    ) -> i64 {
        match crate::jobs::submit(object_id, method, &args.0, idempotency_key) {
            Ok(job) => job,
            Err(err) => raise(err, format!("submit({object_id}, '{method}')")),
        }
    }

    /// Behind `lambdastore.wait` (sql/views.sql), which then returns the job.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _wait_for_job(job_id: i64, timeout_ms: i64) {
        let timeout = std::time::Duration::from_millis(timeout_ms.max(0) as u64);
        if let Err(err) = crate::jobs::wait(job_id, timeout) {
            raise(err, format!("wait({job_id})"));
        }
    }

    /// Jobs the background workers are running now (behind `lambdastore.queue`).
    #[pg_extern(volatile, parallel_unsafe)]
    fn _running_jobs() -> TableIterator<'static, (name!(job_id, i64),)> {
        TableIterator::new(crate::workers::running_jobs().into_iter().map(|job| (job,)))
    }

    /// Deletes an object and all its entries.
    #[pg_extern(volatile, parallel_unsafe)]
    fn delete_object(object_id: i64) {
        match crate::catalog::objects::delete(object_id) {
            Ok(true) => {}
            Ok(false) => raise(LambdaError::UnknownObject(object_id), String::new()),
            Err(err) => raise(err, format!("delete_object({object_id})")),
        }
    }
}

mod deploy;
mod json_text;
