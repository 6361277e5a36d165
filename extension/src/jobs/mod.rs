//! Asynchronous jobs as a session sees them: submitting (with idempotency
//! keys) and waiting for one. The jobs table is queue.rs, the background
//! workers' registration and shared memory workers.rs, the job runner's
//! main loop runner.rs; spawned calls are queued by the workflow's commit.
//!
//! Workers are woken only when a transaction that queued jobs commits: a
//! job's row is invisible to them before that, so waking them earlier would
//! find nothing and lose the wake-up.

pub(crate) mod limits;
pub(crate) mod queue;
pub(crate) mod runner;
pub(crate) mod schedules;
pub(crate) mod workers;

use crate::access::{self, Caller, Privilege};
use crate::error::{LambdaError, Result};
use crate::{gucs, workflow};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys::BuiltinOid::*;
use queue::NewJob;
use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

thread_local! {
    /// Jobs inserted by the current transaction: waiting for one of them
    /// could only time out.
    static UNCOMMITTED: RefCell<Vec<i64>> = const { RefCell::new(Vec::new()) };
    static WARNED_NO_RUNNER: Cell<bool> = const { Cell::new(false) };
    /// Jobs the current transaction cancelled: their waiters are woken
    /// when it commits.
    static CANCELLED: RefCell<Vec<i64>> = const { RefCell::new(Vec::new()) };
}

/// After the commit record: wakes the workers if the transaction queued
/// jobs (submitted or spawned). Must not fail: it only sets latches and
/// clears backend-local state.
pub(crate) fn at_commit() {
    UNCOMMITTED.with(|jobs| jobs.borrow_mut().clear());
    if queue::take_inserted() {
        workers::wake_workers();
    }
    for job in CANCELLED.take() {
        workers::wake_waiters(job);
    }
}

pub(crate) fn at_abort() {
    UNCOMMITTED.with(|jobs| jobs.borrow_mut().clear());
    CANCELLED.take();
    queue::take_inserted();
}

/// `lambdastore.submit`: queues a method call; returns the job id (the
/// earlier job's, for an idempotency key already used by this application).
/// The longest idempotency key, as the gateway's `Idempotency-Key` header
/// allows. A key names a request; a longer one could not be indexed
/// (PostgreSQL failed such inserts with its own index-row-size error).
const MAX_IDEMPOTENCY_KEY: usize = 255;

/// An idempotency key is 1 to `MAX_IDEMPOTENCY_KEY` bytes (22023).
pub(crate) fn check_key_length(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(LambdaError::IdempotencyKeyLength { len: key.len(), max: MAX_IDEMPOTENCY_KEY });
    }
    Ok(())
}

pub(crate) fn submit(
    caller: Caller,
    object: i64,
    method: &str,
    args: &str,
    idempotency_key: Option<&str>,
    due: Option<TimestampWithTimeZone>,
    schedule: Option<&str>,
) -> Result<i64> {
    if let Some(key) = idempotency_key {
        check_key_length(key)?;
    }
    let app = workflow::check_submittable(caller, object, method, args)?;
    let job = NewJob {
        object,
        app: &app,
        method,
        args,
        idempotency_key,
        parent: None,
        role: caller.0,
        due,
        timer: None,
        schedule,
    };
    let (id, inserted) = queue::insert(&job)?;
    if inserted {
        UNCOMMITTED.with(|jobs| jobs.borrow_mut().push(id));
        warn_if_no_runner();
    }
    Ok(id)
}

/// When a submitted job is due: at `run_at`, or `delay` after the
/// transaction's start (`now()`, when an undelayed job is due); None: at
/// once. A time already past is due at once. An infinite time, a delay
/// past `MAX_SPAN_YEARS` or a time as far from now is refused (22023): the
/// workers compute with due times, and PostgreSQL's arithmetic fails on
/// them.
pub(crate) fn due(
    run_at: Option<TimestampWithTimeZone>,
    delay: Option<Interval>,
) -> Result<Option<TimestampWithTimeZone>> {
    match (run_at, delay) {
        (Some(_), Some(_)) => Err(LambdaError::InvalidParameter("submit takes run_at or delay, not both".into())),
        (Some(at), None) if at.is_infinity() || at.is_neg_infinity() => {
            Err(LambdaError::InvalidParameter("submit's run_at must be a finite time".into()))
        }
        (Some(at), None) => queue::due_at(queue::unix_micros(at)).map(Some),
        (None, None) => Ok(None),
        (None, Some(delay)) => {
            check_span("submit's delay", &delay)?;
            crate::catalog::query("SELECT now() + $1", &[INTERVALOID], &[delay.into()], |rows| {
                rows.first().get::<TimestampWithTimeZone>(1)
            })
        }
    }
}

/// The longest delay of a job, and the longest window of a rate limit,
/// either way: far inside PostgreSQL's timestamps (4713 BC to 294276 AD),
/// so that no sum or product of them overflows.
const MAX_SPAN_YEARS: i128 = 1_000;

/// `span` is within `MAX_SPAN_YEARS` either way (22023).
fn check_span(what: &str, span: &Interval) -> Result<()> {
    const MICROS_PER_DAY: i128 = 24 * 3600 * 1_000_000;
    const MICROS_PER_YEAR: i128 = 365 * MICROS_PER_DAY;
    // A month as a twelfth of a year, not as PostgreSQL's 30 days (by
    // which "1000 years 1 day" was 986 years).
    let micros = i128::from(span.months()) * MICROS_PER_YEAR / 12
        + i128::from(span.days()) * MICROS_PER_DAY
        + i128::from(span.micros());
    if micros.abs() > MAX_SPAN_YEARS * MICROS_PER_YEAR {
        return Err(LambdaError::InvalidParameter(format!("{what} is at most {MAX_SPAN_YEARS} years")));
    }
    Ok(())
}

/// `lambdastore.job`: what a role that may invoke or read the job's
/// application sees of it (`queue::outcome`); to another, or when there is
/// no such job, nothing. Read as the tables' owner, so that on Citus the
/// workers' shards are read with its rights: through the `app_jobs` view,
/// Citus read them as the caller, which an ordinary role may not (42501).
pub(crate) fn outcome(caller: Caller, job: i64) -> Result<Option<pgrx::JsonB>> {
    let Some((app, outcome)) = queue::outcome(job)? else { return Ok(None) };
    let visible = access::allowed(caller, &app, Privilege::Invoke)? || access::allowed(caller, &app, Privilege::Read)?;
    Ok(visible.then_some(outcome))
}

/// `lambdastore.cancel`: whether the queued job `job` was cancelled (it
/// will not run, and ends 'cancelled'). A job that is running holds its
/// row until its attempt ends, and the cancel waits for that: false if it
/// finished, true if it is queued again for a retry. A finished job stays
/// as it ended (false). A role that may not invoke the job's application
/// may not cancel it (42501); to one that may not read it either, the job
/// does not exist (42704), as for `lambdastore.wait`.
pub(crate) fn cancel(caller: Caller, job: i64) -> Result<bool> {
    let Some((object, app, schedule)) = queue::object_of(job)? else { return Err(LambdaError::UnknownJob(job)) };
    if !access::allowed(caller, &app, Privilege::Invoke)? {
        if !access::allowed(caller, &app, Privilege::Read)? {
            return Err(LambdaError::UnknownJob(job));
        }
        access::check(caller, &app, Privilege::Invoke)?;
    }
    // A tick queues the next when it ends: cancelled, its schedule never
    // ticked again, its name still taken.
    if let Some(name) = schedule {
        return Err(LambdaError::ScheduledTick(format!(
            "job {job} is a tick of object {object}'s schedule \"{name}\", which queues its next tick as it ends: \
             lambdastore.unschedule({object}, '{name}') ends the schedule"
        )));
    }
    let cancelled = queue::cancel(object, job)?;
    if cancelled {
        CANCELLED.with(|jobs| jobs.borrow_mut().push(job));
    }
    Ok(cancelled)
}

/// A job this transaction queued on another node (cluster/forward.rs): waiting for
/// it before the commit could only time out, as for one queued here.
pub(crate) fn queued_elsewhere(job: i64) {
    UNCOMMITTED.with(|jobs| jobs.borrow_mut().push(job));
}

/// Jobs queue in any database, but only `lambdastore.database` has workers.
fn warn_if_no_runner() {
    if WARNED_NO_RUNNER.get() {
        return;
    }
    let database = crate::pg::backend::database_name();
    if workers::running_for(&database) {
        return;
    }
    WARNED_NO_RUNNER.set(true);
    pgrx::warning!(
        "no lambdastore background worker runs the jobs of database \"{database}\": jobs stay queued \
         (workers need lambdastore in shared_preload_libraries, lambdastore.workers > 0 and \
         lambdastore.database = '{database}'; it is '{}')",
        gucs::database()
    );
}

/// `lambdastore.wait`: returns when the job is done or failed, or when
/// `timeout` has passed (the caller then reads the job's state either way).
/// Only jobs of an application `caller` may invoke or read can be waited
/// for; others look as if they did not exist.
pub(crate) fn wait(caller: Caller, job: i64, timeout: Duration) -> Result<()> {
    if crate::pg::xact::has_transaction_snapshot() {
        return Err(LambdaError::IsolationLevel(
            "lambdastore.wait needs READ COMMITTED isolation: under a transaction snapshot it would never \
             see the job finish"
                .into(),
        ));
    }
    let deadline = Instant::now() + timeout;
    // Registered before the first look, so a worker finishing the job
    // after that look still sets our latch. On a Citus cluster the job may
    // run on another node, whose workers cannot set it: look again often.
    let waiter = workers::Waiter::register(job);
    let nap = if crate::cluster::layout::distributed()? { CLUSTER_WAIT_POLL } else { Duration::MAX };
    loop {
        let Some((app, state)) = queue::state(job)? else { return Err(LambdaError::UnknownJob(job)) };
        if !access::allowed(caller, &app, Privilege::Invoke)? && !access::allowed(caller, &app, Privilege::Read)? {
            return Err(LambdaError::UnknownJob(job));
        }
        if state != "queued" {
            return Ok(());
        }
        if UNCOMMITTED.with(|jobs| jobs.borrow().contains(&job)) {
            return Err(LambdaError::JobNotCommitted(job));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        waiter.sleep(left.min(nap));
    }
}

/// How often `wait` looks at a job's state on a Citus cluster.
const CLUSTER_WAIT_POLL: Duration = Duration::from_millis(20);

/// `lambdastore.set_queue_limits`, by the application's owner: NULL for
/// no limit; `per` of at least a millisecond.
pub(crate) fn set_queue_limits(
    caller: Caller,
    app: &str,
    max_running: Option<i32>,
    rate: Option<i32>,
    per: Interval,
    priority: i32,
) -> Result<()> {
    // A superuser passes any check: the application must exist all the same.
    crate::catalog::grants::owner(app)?.ok_or_else(|| LambdaError::UnknownApplication(app.to_string()))?;
    access::check(caller, app, Privilege::Owner)?;
    // The workers serve higher priorities first: one above the default
    // takes from every other application on the server, whose owners the
    // fairness between applications is for.
    if priority > 0 && !caller.is_superuser() {
        return Err(LambdaError::PermissionDenied(
            "only a superuser may give an application a priority above 0: its jobs would be served before \
             every other application's"
                .into(),
        ));
    }
    check_span("per", &per)?;
    // In µs, so that half a millisecond is not rounded up to a valid one;
    // the workers count whole milliseconds (a fraction is dropped).
    let per_us = crate::catalog::query(
        "SELECT (extract(epoch FROM $1) * 1000000)::bigint",
        &[INTERVALOID],
        &[per.into()],
        |rows| Ok(rows.first().get::<i64>(1)?.unwrap_or_default()),
    )?;
    let per_ms = per_us / 1000;
    if max_running.is_some_and(|n| n < 1) || rate.is_some_and(|n| n < 1) || per_us < 1000 {
        return Err(LambdaError::InvalidParameter(
            "max_running and rate are at least 1 (or NULL: no limit), and per at least 1 millisecond".into(),
        ));
    }
    crate::catalog::query_cluster(
        "INSERT INTO lambdastore.queue_limits (app, max_running, rate, per, priority)
         VALUES ($1, $2, $3, $4 * interval '1 millisecond', $5)
         ON CONFLICT (app) DO UPDATE
            SET max_running = excluded.max_running, rate = excluded.rate, per = excluded.per,
                priority = excluded.priority",
        &[TEXTOID, INT4OID, INT4OID, INT8OID, INT4OID],
        &[app.into(), max_running.into(), rate.into(), per_ms.into(), priority.into()],
        |_| Ok(()),
    )
}
