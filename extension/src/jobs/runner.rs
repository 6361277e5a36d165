//! The job runner: a background worker that runs queued jobs, each in one
//! transaction of its own.
//!
//! Exactly once: the worker claims a job (`FOR UPDATE SKIP LOCKED`), runs
//! its workflow and records the outcome in the same transaction. The
//! workflow's writes, the jobs it spawned and the job's `done` commit
//! together; if the worker or the server dies before the commit, none of
//! them exists and the job is still queued for the next worker.
//!
//! The workflow runs in a subtransaction, like a PL/pgSQL exception block,
//! so that its failure (ours or PostgreSQL's) rolls back its effects but
//! not the claim: the outcome is then recorded as `failed`, or, for a
//! serialization failure or a node that could not be reached, as a retry
//! after a backoff.

use super::workers::{attach_worker, set_running, transaction, wake_waiters, wake_workers};
use crate::access::Caller;
use crate::cluster::route;
use crate::error::LambdaError;
use crate::jobs::queue::{self, Claim, Claimed};
use crate::jobs::schedules::{self, Plan};
use crate::pg::process::{reload_config_if_asked, wait_latch};
use crate::pg::{self, backend::sqlstate_text, xact::Subtransaction};
use crate::{gucs, workflow};
use pgrx::pg_sys::{self, panic::CaughtError};
use pgrx::{pg_guard, PgTryBuilder};
use std::panic::AssertUnwindSafe;
use std::time::Duration;

/// Longest sleep without a wake-up: a safety net for jobs queued without
/// one (a `COMMIT PREPARED`, or rows inserted by hand), not the mechanism.
const MAX_IDLE: Duration = Duration::from_secs(60);
/// How often an idle worker looks for prepared transactions that ended.
const PREPARED_POLL: Duration = Duration::from_millis(100);
/// Longest sleep on a Citus node: a shard that a migration (or the
/// rebalancer) moved here brings its queued jobs, timers and ticks along,
/// and nothing wakes this node's workers for them; without this they
/// waited for MAX_IDLE (a timer of a migrated object fired a minute late).
const MOVED_IN_POLL: Duration = Duration::from_secs(1);

/// Entry point, named in the worker's registration (`workers::register`).
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn lambdastore_job_runner_main(arg: pg_sys::Datum) {
    let index = arg.value();
    crate::pg::process::handle_worker_signals();
    pg::backend::hold_cancel(true); // see `run_cancellable`
    super::workers::connect_to_database(index == 0);
    // OCC needs READ COMMITTED, whatever the server's default is.
    pg::settings::set_for_process(c"default_transaction_isolation", c"read committed");
    attach_worker(index);
    // The application served last: workers take turns between them.
    let mut last_app = String::new();
    loop {
        // Sampled before looking for jobs too: a prepared transaction that
        // queued jobs may end (COMMIT PREPARED, in a backend that wakes no
        // one) between the look and this sleep, and its jobs then wait for
        // MAX_IDLE (a minute, seen on a Citus cluster). Whatever ended before
        // the sample is visible to the look; whatever ended after, the next
        // poll finds.
        let prepared_before = crate::txn::prepared::pending();
        let next = run_until_idle(index, &mut last_app);
        // Prepared transactions that hold entry sets are finished by
        // whoever looks next (txn/prepared.rs): soon, on an idle node too.
        let prepared = prepared_before || crate::txn::prepared::pending();
        let idle = if prepared { PREPARED_POLL } else { MAX_IDLE };
        wait_latch(next.map_or(idle, |due| due.min(idle)));
        reload_config_if_asked();
    }
}

/// Runs due jobs until none is left; returns when the next backed-off job
/// is due, if any.
fn run_until_idle(index: usize, last_app: &mut String) -> Option<Duration> {
    if !transaction(crate::catalog::installed) {
        return None; // woken again by the first submit, which needs the extension
    }
    transaction(crate::txn::prepared::sweep).unwrap_or_else(|e| e.report("finishing prepared transactions"));
    if index == 0 {
        delete_expired();
    }
    let distributed = transaction(|| crate::cluster::layout::distributed().unwrap_or(false));
    loop {
        match transaction(|| run_one(index, last_app)) {
            Step::Ran(job, limited) => {
                set_running(index, 0);
                wake_waiters(job);
                if limited {
                    // A slot of its application is free again: a worker
                    // may be idle for it (jobs/limits.rs).
                    wake_workers();
                }
                pgrx::check_for_interrupts!();
                reload_config_if_asked();
            }
            Step::Idle(next) if distributed => return Some(next.map_or(MOVED_IN_POLL, |n| n.min(MOVED_IN_POLL))),
            Step::Idle(next) => return next,
        }
    }
}

/// Finished jobs deleted per transaction: small, so that no batch holds
/// much WAL or many locks.
const RETENTION_BATCH: i64 = 500;
/// How often the first worker of a node looks for jobs past
/// `lambdastore.job_retention`, when it wakes.
const RETENTION_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    static RETENTION_LOOKED: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// Deletes the finished jobs past `lambdastore.job_retention`, a batch per
/// transaction, at most every `RETENTION_EVERY`.
fn delete_expired() {
    let Some(retention) = gucs::job_retention() else { return };
    if RETENTION_LOOKED.get().is_some_and(|at| at.elapsed() < RETENTION_EVERY) {
        return;
    }
    RETENTION_LOOKED.set(Some(std::time::Instant::now()));
    // A failure is logged and tried again later: the queue matters more.
    let batch = || {
        transaction(|| queue::delete_finished(retention, RETENTION_BATCH)).unwrap_or_else(|e| {
            pgrx::warning!("lambdastore: deleting finished jobs failed: {e}");
            0
        })
    };
    while batch() >= RETENTION_BATCH {
        pgrx::check_for_interrupts!();
    }
}

enum Step {
    /// A job, and whether its application has queue limits.
    Ran(i64, bool),
    Idle(Option<Duration>),
}

/// One job, in the caller's transaction: claim, run, record.
fn run_one(index: usize, last_app: &mut String) -> Step {
    // A cancel of the worker while no job ran cancels nothing.
    pg::backend::clear_query_cancel();
    let (job, limited) = match queue::claim(last_app).unwrap_or_else(|e| e.report("claiming a job")) {
        Claim::Job(job, limited) => (job, limited),
        Claim::None(held) => {
            let next = queue::next_backoff_ms().unwrap_or_else(|e| e.report("looking for backed-off jobs"));
            let next = next.map(|ms| Duration::from_millis(ms.max(1) as u64));
            return Step::Idle(next.into_iter().chain(held).min());
        }
    };
    set_running(index, job.job);
    last_app.clone_from(&job.app);
    // A schedule's tick: whether it runs, and the tick after it.
    let (runs, next) = match job.schedule.as_deref() {
        None => (true, None),
        Some(name) => {
            let now = pg::backend::now_unix_micros();
            match schedules::plan(&job, name, now).unwrap_or_else(|e| e.report("reading a tick's schedule")) {
                Plan::Removed => {
                    queue::finish_cancelled(&job, "its schedule was removed")
                        .unwrap_or_else(|e| e.report("cancelling a tick"));
                    return Step::Ran(job.job, limited);
                }
                Plan::Tick { runs, next } => (runs, next.map(|next| (name, next))),
            }
        }
    };
    let ended = if runs {
        // Recording can fail too (a result or an error PostgreSQL will not
        // store): that fails the job, never the worker, which would
        // otherwise die, restart and claim the same job first, forever.
        // The workflow and its record share a subtransaction, so a failed
        // record undoes the workflow's effects too: a job `failed` with its
        // effects committed would run twice when its client submits it
        // again.
        let ran = in_subtransaction(|| {
            let outcome = run_cancellable(&job);
            record(&job, outcome).map_err(Failure::from)
        });
        pg::backend::hold_cancel(true); // an ERROR caught above ended the hold
        match ran {
            Ok(ended) => ended,
            Err(failure) => {
                let message = format!("recording the job's outcome failed: {}", failure.message);
                queue::finish_failed(&job, &message, "38000").unwrap_or_else(|e| e.report("recording a job's failure"));
                true
            }
        }
    } else {
        queue::finish_cancelled(&job, "skipped: its time had passed with its next tick's (missed = 'skip')")
            .unwrap_or_else(|e| e.report("skipping a tick"));
        true
    };
    // In the transaction that records this tick: the next one exists if
    // and only if this one's outcome commits.
    if let (true, Some((name, next))) = (ended, &next) {
        schedules::queue_next(&job, name, next).unwrap_or_else(|e| e.report("queueing a schedule's next tick"));
    }
    Step::Ran(job.job, limited)
}

/// The job's workflow, in a subtransaction of its own: the one stretch of
/// the worker's life where a cancel (`pg_cancel_backend`) acts, stopping
/// the lambda and failing the job (57014). Anywhere else it stays pending
/// and is dropped: before, it raised an ERROR outside the worker's
/// handling, which ended the process (its jobs waited for the postmaster
/// to start another), or failed the recording of a job that had run.
fn run_cancellable(job: &Claimed) -> Result<String, Failure> {
    pg::backend::hold_cancel(false);
    let outcome = in_subtransaction(|| run_workflow(job));
    pg::backend::hold_cancel(true);
    if outcome.is_ok() {
        // Came too late to stop the job, which has run.
        pg::backend::clear_query_cancel();
    }
    outcome
}

/// Runs the job's call as the role that submitted it, as a synchronous call
/// of that role would have run (its privileges are checked again), and
/// checks that jsonb can hold the result, where a bad one fails the job.
fn run_workflow(job: &Claimed) -> Result<String, Failure> {
    let result = workflow::run_job(Caller(job.role), job.job, job.object, &job.method, &job.args)?;
    crate::pg::jsonb::result_jsonb(&result)?;
    Ok(result)
}

/// Records the job's outcome; whether it ended (false: queued again, to
/// retry after a backoff).
fn record(job: &Claimed, outcome: Result<String, Failure>) -> crate::error::Result<bool> {
    let failure = match outcome {
        Ok(result) => {
            queue::finish_done(job, &result)?;
            // `done` is written here, as a session's call is: if the
            // workflow wrote on other nodes, Citus must commit there in two
            // phases with this node. Otherwise it commits them first, in
            // its pre-commit, and a crash before this node's commit ran the
            // job again with its effects elsewhere already committed.
            route::ran_here()?;
            return Ok(true);
        }
        Err(failure) => failure,
    };
    if failure.canceled {
        // SIGTERM: leave the job queued; processing the interrupt ends this
        // process and aborts the claim. A cancel (pg_cancel_backend) of the
        // worker fails the job instead.
        pgrx::check_for_interrupts!();
        pg::backend::clear_query_cancel();
    }
    if failure.retryable() && job.attempts + 1 < gucs::job_max_attempts() {
        queue::retry_later(job, &failure.message, &failure.sqlstate, backoff_ms(job.attempts))?;
        return Ok(false);
    }
    queue::finish_failed(job, &failure.message, &failure.sqlstate)?;
    Ok(true)
}

/// Exponential from 10 ms, capped at 1 s, with jitter so that two jobs
/// that conflicted do not meet again at the same instant.
fn backoff_ms(attempts: i32) -> i64 {
    let base = 10i64.saturating_mul(1 << attempts.clamp(0, 7)).min(1000);
    let jitter = pg::backend::random_f64();
    (base as f64 * (0.5 + jitter)) as i64
}

/// Why a job's workflow failed, from our error or PostgreSQL's.
pub(crate) struct Failure {
    pub(crate) message: String,
    sqlstate: String,
    canceled: bool,
}

impl Failure {
    /// Transient: a conflict (40001, 40P01), or, on a Citus cluster, a node
    /// the workflow reached that was down or restarting (class 08, as
    /// Citus reports it). Failing the job there would make a node's restart
    /// lose the work of every job that reached it meanwhile.
    fn retryable(&self) -> bool {
        matches!(self.sqlstate.as_str(), "40001" | "40P01") || self.sqlstate.starts_with("08")
    }
}

impl From<LambdaError> for Failure {
    fn from(err: LambdaError) -> Self {
        let canceled = matches!(err, LambdaError::Canceled);
        Failure { sqlstate: sqlstate_text(err.sqlstate()), canceled, message: crate::error::bounded(err.to_string()) }
    }
}

impl From<CaughtError> for Failure {
    fn from(caught: CaughtError) -> Self {
        let report = match &caught {
            CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) => report,
            CaughtError::RustPanic { ereport, .. } => ereport,
        };
        let message = crate::error::bounded(report.message().to_string());
        Failure { message, sqlstate: sqlstate_text(report.sql_error_code()), canceled: false }
    }
}

/// Runs `body` in a subtransaction: on any error, everything it did is
/// rolled back and the error returned, and the enclosing transaction goes on.
pub(crate) fn in_subtransaction<T>(body: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    let sub = Subtransaction::begin();
    let outcome = PgTryBuilder::new(AssertUnwindSafe(body))
        .catch_others(|caught| Err(Failure::from(caught)))
        .catch_rust_panic(|caught| Err(Failure::from(caught)))
        .execute();
    if outcome.is_ok() {
        sub.release();
    } else {
        sub.roll_back();
    }
    outcome
}
