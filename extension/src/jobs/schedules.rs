//! Cron schedules (`lambdastore.schedule`): a method of an object run at
//! the times a cron pattern names. A schedule is a row of
//! `lambdastore.schedules` (colocated with its object on a Citus cluster,
//! so that it moves with it) and one queued job, its next tick
//! (`jobs.schedule`). The worker that runs a tick queues the next one in
//! the transaction that records the tick's outcome: a tick's effects, its
//! 'done' and the next tick commit together or not at all, so every tick
//! runs once across worker crashes and server restarts. The pattern's
//! arithmetic is lambdastore_core::schedule.

use crate::access::{self, Caller, Privilege};
use crate::catalog::{query_at, query_cluster};
use crate::cluster::layout;
use crate::error::{LambdaError, Result};
use crate::jobs::queue::{self, Claimed, NewJob};
use lambdastore_core::schedule::{Missed, Schedule};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::BuiltinOid::*;

/// The longest schedule name, as for timers: a name, not data.
const MAX_NAME: usize = 255;

/// `lambdastore.schedule`, up to its first tick: checks the schedule and
/// records it for `caller`; returns when the first tick is due. The SQL
/// surface then queues that tick as `lambdastore.submit` queues a job
/// (checked as it is, on the object's node), in the caller's transaction.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add(
    caller: Caller,
    name: &str,
    cron: &str,
    object: i64,
    method: &str,
    args: &str,
    zone: &str,
    missed: &str,
) -> Result<TimestampWithTimeZone> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(LambdaError::InvalidParameter(format!(
            "a schedule's name is 1 to {MAX_NAME} bytes, not {}",
            name.len()
        )));
    }
    let pattern = Schedule::parse(cron, zone).map_err(LambdaError::InvalidParameter)?;
    Missed::parse(missed).map_err(LambdaError::InvalidParameter)?;
    let app = queue::app_of(object)?.ok_or(LambdaError::UnknownObject(object))?;
    access::check(caller, &app, Privilege::Invoke)?;
    crate::catalog::grants::stored_roles_are_ours()?; // its ticks run as `caller`
    let first = pattern
        .next_after(crate::pg::backend::now_unix_micros())
        .ok_or_else(|| LambdaError::InvalidParameter(format!("cron pattern {cron:?} names no time to come")))?;
    let inserted = query_cluster(
        "INSERT INTO lambdastore.schedules (object_id, name, app, method, args, cron, time_zone, missed, created_by)
         VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9)
         ON CONFLICT (object_id, name) DO NOTHING RETURNING true",
        &[INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, OIDOID],
        &[
            object.into(),
            name.into(),
            app.as_str().into(),
            method.into(),
            args.into(),
            cron.into(),
            zone.into(),
            missed.into(),
            caller.0.into(),
        ],
        |rows| Ok(!rows.is_empty()),
    )?;
    if !inserted {
        return Err(LambdaError::DuplicateSchedule { object, name: name.into() });
    }
    crate::catalog::grants::mark_roles(&[caller.0])?; // it made a schedule
    queue::due_at(first)
}

/// `lambdastore.unschedule`: removes `object`'s schedule `name` and
/// cancels its queued tick; whether there was one. A tick running now
/// finishes (the cancel waits for it) and queues no next one: a tick
/// whose schedule is gone when it is claimed is cancelled instead of run.
pub(crate) fn unschedule(caller: Caller, object: i64, name: &str) -> Result<bool> {
    let app = query_cluster(
        "SELECT app FROM lambdastore.schedules WHERE object_id = $1 AND name = $2",
        &[INT8OID, TEXTOID],
        &[object.into(), name.into()],
        |rows| rows.into_iter().next().map(|row| row.get::<String>(1)).transpose().map(Option::flatten),
    )?;
    let Some(app) = app else { return Ok(false) };
    access::check(caller, &app, Privilege::Invoke)?;
    let made_by = query_cluster(
        "DELETE FROM lambdastore.schedules WHERE object_id = $1 AND name = $2 RETURNING created_by",
        &[INT8OID, TEXTOID],
        &[object.into(), name.into()],
        |rows| {
            rows.into_iter()
                .filter_map(|row| row.get::<pgrx::pg_sys::Oid>(1).transpose())
                .collect::<pgrx::spi::Result<Vec<_>>>()
        },
    )?;
    crate::catalog::grants::mark_roles(&made_by)?; // it may have made its last
                                                   // Twice: the first waits for a tick running now, whose transaction
                                                   // may queue the next (it read the schedule before this one's delete);
                                                   // the second, a statement with a new snapshot, sees that one.
    for _ in 0..2 {
        query_cluster(
            "UPDATE lambdastore.jobs SET state = 'cancelled', finished_at = statement_timestamp()
              WHERE object_id = $1 AND schedule = $2 AND state = 'queued'",
            &[INT8OID, TEXTOID],
            &[object.into(), name.into()],
            |_| Ok(()),
        )?;
    }
    Ok(true)
}

/// A schedule as its tick's worker reads it.
struct Row {
    app: String,
    method: String,
    args: String,
    cron: String,
    zone: String,
    missed: String,
}

/// What becomes of a claimed tick of the schedule `name`.
pub(crate) enum Plan {
    /// Its schedule is gone: cancelled, nothing follows.
    Removed,
    /// It runs (or, late under `missed = 'skip'`, does not), and then the
    /// next tick is queued.
    Tick { runs: bool, next: Option<Next> },
}

/// The tick to queue after one.
pub(crate) struct Next {
    due_micros: i64,
    row: Row,
}

/// Reads the schedule of the claimed tick `job` (on this node, with the
/// job's object) and plans the tick at `now_micros`.
pub(crate) fn plan(job: &Claimed, name: &str, now_micros: i64) -> Result<Plan> {
    let row = query_at(
        layout::place(job.object)?,
        "SELECT app, method, args::text, cron, time_zone, missed
           FROM lambdastore.schedules WHERE object_id = $1 AND name = $2",
        &[INT8OID, TEXTOID],
        &[job.object.into(), name.into()],
        |rows| {
            let Some(row) = rows.into_iter().next() else { return Ok(None) };
            Ok(Some(Row {
                app: row.get(1)?.unwrap_or_default(),
                method: row.get(2)?.unwrap_or_default(),
                args: row.get(3)?.unwrap_or_default(),
                cron: row.get(4)?.unwrap_or_default(),
                zone: row.get(5)?.unwrap_or_default(),
                missed: row.get(6)?.unwrap_or_default(),
            }))
        },
    )?;
    let Some(row) = row else { return Ok(Plan::Removed) };
    // Checked when it was made: a failure here is a row changed by hand.
    let pattern = Schedule::parse(&row.cron, &row.zone).map_err(LambdaError::InvalidParameter)?;
    let missed = Missed::parse(&row.missed).map_err(LambdaError::InvalidParameter)?;
    let tick = pattern.tick(job.due_micros, now_micros, missed);
    let next = tick.next_micros.map(|due_micros| Next { due_micros, row });
    Ok(Plan::Tick { runs: tick.runs, next })
}

/// Queues the tick after `job`, of the schedule `name`.
pub(crate) fn queue_next(job: &Claimed, name: &str, next: &Next) -> Result<()> {
    let row = &next.row;
    queue::insert(&NewJob {
        object: job.object,
        app: &row.app,
        method: &row.method,
        args: &row.args,
        idempotency_key: None,
        parent: None,
        // The tick's own role, by this node's OID (the first tick was
        // queued here by name): `created_by` is the OID on the node that
        // made the schedule, another role or none on a Citus worker.
        role: job.role,
        due: Some(queue::due_at(next.due_micros)?),
        timer: None,
        schedule: Some(name),
    })?;
    Ok(())
}
