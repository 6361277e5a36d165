//! Job rows (`lambdastore.jobs`): submitting, claiming, and recording an
//! outcome. The worker's claim and its outcome run in one transaction; see
//! the job runner (runner.rs).

use crate::catalog::{query_at, query_cluster, Place};
use crate::cluster::layout;
use crate::error::{LambdaError, Result};
use crate::jobs::limits::{self, Limits, Taken};
use crate::pg::xact::Subtransaction;
use lambdastore_core::model::Spawned;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::cell::Cell;
use std::time::Duration;

/// A job to insert.
pub(crate) struct NewJob<'a> {
    pub(crate) object: i64,
    pub(crate) app: &'a str,
    pub(crate) method: &'a str,
    /// JSON text.
    pub(crate) args: &'a str,
    pub(crate) idempotency_key: Option<&'a str>,
    /// The job whose lambda spawned this one.
    pub(crate) parent: Option<i64>,
    /// The role the job runs as.
    pub(crate) role: pg_sys::Oid,
    /// When the job is due: None, at once (the transaction's start).
    pub(crate) due: Option<TimestampWithTimeZone>,
    /// The timer of the object the job is (`set_timer`).
    pub(crate) timer: Option<&'a str>,
    /// The schedule of the object the job is a tick of.
    pub(crate) schedule: Option<&'a str>,
}

thread_local! {
    /// Whether this transaction inserted jobs: the workers are woken when
    /// it commits (jobs/mod.rs).
    static INSERTED: Cell<bool> = const { Cell::new(false) };
}

/// Whether this transaction inserted jobs; forgets it.
pub(crate) fn take_inserted() -> bool {
    INSERTED.replace(false)
}

/// The job's id, and whether this call inserted it (false: an earlier
/// submission with the same idempotency key). On a Citus node, the
/// object's shard must be here (`forward` sends submissions there), and
/// the key was claimed in `job_keys` first (`claim_key`).
pub(crate) fn insert(job: &NewJob<'_>) -> Result<(i64, bool)> {
    crate::catalog::grants::stored_roles_are_ours()?; // the job runs as `job.role`
    crate::catalog::note_write();
    let place = layout::place(job.object)?;
    // Without a key there is no conflict to infer, and on a Citus node no
    // index to infer it from.
    let sql = if job.idempotency_key.is_some() && place == Place::Tables {
        "INSERT INTO lambdastore.jobs (object_id, app, method, args, idempotency_key, submitted_by, parent_job_id,
                                       job_id, run_after, timer, schedule)
         VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, coalesce($9, now()), $10, $11)
         ON CONFLICT (app, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
         RETURNING job_id"
    } else {
        "INSERT INTO lambdastore.jobs (object_id, app, method, args, idempotency_key, submitted_by, parent_job_id,
                                       job_id, run_after, timer, schedule)
         VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, coalesce($9, now()), $10, $11)
         RETURNING job_id"
    };
    let inserted = query_at(
        place,
        sql,
        &[INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, OIDOID, INT8OID, INT8OID, TIMESTAMPTZOID, TEXTOID, TEXTOID],
        &[
            job.object.into(),
            job.app.into(),
            job.method.into(),
            job.args.into(),
            job.idempotency_key.into(),
            job.role.into(),
            job.parent.into(),
            next_job_id()?.into(),
            job.due.into(),
            job.timer.into(),
            job.schedule.into(),
        ],
        |rows| Ok(rows.into_iter().next().map(|row| row.get::<i64>(1)).transpose()?.flatten()),
    )?;
    if let Some(id) = inserted {
        INSERTED.set(true);
        return Ok((id, true));
    }
    // The key was taken: by a committed transaction (ON CONFLICT waited for
    // it) or by this one. Its row is visible to this new statement.
    let key = job.idempotency_key.unwrap_or_default();
    let (id, same) = query_at(
        place,
        "SELECT job_id, object_id = $3 AND method = $4 AND args = $5::jsonb
           FROM lambdastore.jobs WHERE app = $1 AND idempotency_key = $2",
        &[TEXTOID, TEXTOID, INT8OID, TEXTOID, TEXTOID],
        &[job.app.into(), key.into(), job.object.into(), job.method.into(), job.args.into()],
        |rows| {
            let row = rows.first();
            Ok((row.get::<i64>(1)?.unwrap_or_default(), row.get::<bool>(2)?.unwrap_or_default()))
        },
    )?;
    if !same {
        return Err(LambdaError::IdempotencyKeyReused { key: key.to_string(), job: id });
    }
    Ok((id, false))
}

/// On a Citus cluster, before a job with an idempotency key is queued:
/// claims the key for `app` in `job_keys` (through Citus, on the key's
/// node). None: claimed now, queue the job (then `record_key_job`).
/// Some(job): the key was taken (by a committed transaction, whose commit
/// the insert waited for, or by this one), for this call (Ok) or another
/// (IdempotencyKeyReused). The job is read from `job_keys`, not from
/// `jobs`: the other transaction's part on the job's node may commit
/// after its part on the key's node.
pub(crate) fn claim_key(app: &str, key: &str, object: i64, method: &str, args: &str) -> Result<Option<i64>> {
    let claimed = query_cluster(
        "INSERT INTO lambdastore.job_keys (idempotency_key, app, object_id, method, args)
         VALUES ($1, $2, $3, $4, $5::jsonb) ON CONFLICT DO NOTHING RETURNING true",
        &[TEXTOID, TEXTOID, INT8OID, TEXTOID, TEXTOID],
        &[key.into(), app.into(), object.into(), method.into(), args.into()],
        |rows| Ok(!rows.is_empty()),
    )?;
    if claimed {
        return Ok(None);
    }
    let existing = query_cluster(
        "SELECT job_id, object_id = $3 AND method = $4 AND args = $5::jsonb
           FROM lambdastore.job_keys WHERE idempotency_key = $1 AND app = $2",
        &[TEXTOID, TEXTOID, INT8OID, TEXTOID, TEXTOID],
        &[key.into(), app.into(), object.into(), method.into(), args.into()],
        |rows| rows.into_iter().next().map(|row| Ok((row.get::<i64>(1)?, row.get::<bool>(2)?))).transpose(),
    )?;
    match existing {
        Some((Some(id), Some(true))) => Ok(Some(id)),
        Some((Some(id), _)) => Err(LambdaError::IdempotencyKeyReused { key: key.to_string(), job: id }),
        _ => Err(LambdaError::Internal(format!("idempotency key \"{key}\" is claimed without its job"))),
    }
}

/// The job queued under a key just claimed (`claim_key`).
pub(crate) fn record_key_job(app: &str, key: &str, job: i64) -> Result<()> {
    query_cluster(
        "UPDATE lambdastore.job_keys SET job_id = $3 WHERE idempotency_key = $1 AND app = $2",
        &[TEXTOID, TEXTOID, INT8OID],
        &[key.into(), app.into(), job.into()],
        |_| Ok(()),
    )
}

/// The application of `object`, read through Citus from any node (None:
/// no such object).
/// The jobs the runners of every node run now, with their applications.
pub(crate) fn running_everywhere() -> Result<Vec<(i64, String)>> {
    query_cluster(
        "SELECT j.job_id, j.app FROM lambdastore.jobs j
          WHERE j.job_id = ANY (ARRAY(SELECT r FROM lambdastore._running_jobs_everywhere() r))",
        &[],
        &[],
        |rows| {
            rows.into_iter()
                .map(|row| Ok((row.get::<i64>(1)?.unwrap_or_default(), row.get::<String>(2)?.unwrap_or_default())))
                .collect()
        },
    )
}

pub(crate) fn app_of(object: i64) -> Result<Option<String>> {
    query_cluster("SELECT app FROM lambdastore.objects WHERE object_id = $1", &[INT8OID], &[object.into()], |rows| {
        rows.into_iter().next().map(|row| row.get::<String>(1)).transpose().map(Option::flatten)
    })
}

/// A new job id, unique across a Citus cluster.
fn next_job_id() -> Result<i64> {
    crate::catalog::unique_id(c"lambdastore.job_id_seq")
}

/// Inserts the calls a workflow spawned, in spawn order, to run as `role`;
/// a timer's replaces the pending job of its timer (`set_timer`).
pub(crate) fn insert_spawned(spawned: &[Spawned], role: pg_sys::Oid, parent: Option<i64>) -> Result<()> {
    for call in spawned {
        let due = call.due_micros.map(due_at).transpose()?;
        if let Some(timer) = &call.timer {
            cancel_timer(call.object, timer, parent)?;
            if call.method.is_empty() {
                continue; // cleared
            }
        }
        let job = NewJob {
            object: call.object,
            app: &call.app,
            method: &call.method,
            args: &call.args,
            idempotency_key: None,
            parent,
            role,
            due,
            timer: call.timer.as_deref(),
            schedule: None,
        };
        insert(&job)?;
    }
    Ok(())
}

/// How far from now a job may be due, either way, as far as a delay may
/// put it (jobs/mod.rs, `MAX_SPAN_YEARS`): a timer set `u64::MAX` µs ahead
/// was due in 294247 AD, and a `run_at` in 294276 AD was taken.
const MAX_DUE_YEARS: u64 = 1_000;

/// PostgreSQL's counting from 2000-01-01, 946,684,800 seconds after 1970.
const UNIX_EPOCH_IN_POSTGRES: i64 = -946_684_800_000_000;

/// `at` in microseconds since the Unix epoch.
pub(crate) fn unix_micros(at: TimestampWithTimeZone) -> i64 {
    at.into_inner().saturating_sub(UNIX_EPOCH_IN_POSTGRES)
}

/// A time in microseconds since the Unix epoch, as PostgreSQL's, at most
/// `MAX_DUE_YEARS` from now (22023), where a lambda's `spawn_at` or
/// `set_timer`, a schedule or a `run_at` may point.
pub(crate) fn due_at(micros: i64) -> Result<TimestampWithTimeZone> {
    const MICROS_PER_YEAR: u64 = 365 * 24 * 3600 * 1_000_000;
    if micros.abs_diff(crate::pg::backend::now_unix_micros()) > MAX_DUE_YEARS * MICROS_PER_YEAR {
        return Err(LambdaError::InvalidParameter(format!(
            "a job is due at most {MAX_DUE_YEARS} years from now, not at {micros} µs after 1970"
        )));
    }
    micros
        .checked_add(UNIX_EPOCH_IN_POSTGRES)
        .and_then(|at| TimestampWithTimeZone::try_from(at).ok())
        .filter(|at| !at.is_infinity() && !at.is_neg_infinity())
        .ok_or_else(|| {
            LambdaError::InvalidParameter(format!(
                "a job's due time of {micros} µs after 1970 is outside PostgreSQL's timestamps"
            ))
        })
}

/// Cancels the pending job of `object`'s timer `timer`, but not `running`
/// (the timer's own job, setting itself again: it finishes). Setters of
/// one timer take turns (a transaction-level advisory lock on the object
/// and name), so that a second one sees the first's job and replaces it.
fn cancel_timer(object: i64, timer: &str, running: Option<i64>) -> Result<()> {
    // Its own statement: the UPDATE's snapshot, taken after the wait,
    // sees what the setter before committed.
    crate::catalog::query(
        "SELECT pg_advisory_xact_lock(hashtextextended($2, $1))",
        &[INT8OID, TEXTOID],
        &[object.into(), timer.into()],
        |_| Ok(()),
    )?;
    query_at(
        layout::place(object)?,
        "UPDATE lambdastore.jobs SET state = 'cancelled', finished_at = clock_timestamp()
          WHERE object_id = $1 AND timer = $2 AND state = 'queued' AND job_id IS DISTINCT FROM $3",
        &[INT8OID, TEXTOID, INT8OID],
        &[object.into(), timer.into(), running.into()],
        |_| Ok(()),
    )
}

/// A queued job, claimed (row-locked) by this transaction.
pub(crate) struct Claimed {
    pub(crate) object: i64,
    pub(crate) job: i64,
    pub(crate) app: String,
    pub(crate) method: String,
    pub(crate) args: String,
    pub(crate) attempts: i32,
    pub(crate) role: pg_sys::Oid,
    /// When it was due, in microseconds since the Unix epoch.
    pub(crate) due_micros: i64,
    /// The schedule of the object it is a tick of.
    pub(crate) schedule: Option<String>,
}

/// What `claim` found: a job, and whether its application has limits
/// (its end then wakes the workers: one may wait for its slot); or none,
/// with how soon a rate limit lets a held-back job start.
pub(crate) enum Claim {
    Job(Claimed, bool),
    None(Option<Duration>),
}

/// Locks a due job no other worker holds, until the transaction ends
/// (which is also when its outcome commits), with a running slot of its
/// application if it has limits (jobs/limits.rs). Applications are served
/// by priority, highest first, and among equals in turns: the first after
/// `after` in name order, wrapping around, so that one application's flood
/// of jobs cannot starve another's. One at its limits, or whose due jobs
/// other workers hold, is passed over for the next.
pub(crate) fn claim(after: &str) -> Result<Claim> {
    match crate::catalog::grants::stored_roles_are_ours() {
        // A job runs as the role that queued it, stored by OID: after a
        // restore from another server, another role's or none. The jobs
        // wait (a submit wakes the runners once the roles are adopted).
        Err(refused @ LambdaError::RolesOfAnotherServer) => {
            warn_once(&refused);
            return Ok(Claim::None(None));
        }
        other => other?,
    }
    let places = held_here()?;
    let mut candidates: Vec<(String, i32, Limits)> = Vec::new();
    for &place in &places {
        for due in due_apps(place)? {
            if !candidates.iter().any(|known| known.0 == due.0) {
                candidates.push(due);
            }
        }
    }
    candidates.sort_by(|a, b| {
        let turn = |name: &str| (name <= after, name.to_string());
        b.1.cmp(&a.1).then_with(|| turn(&a.0).cmp(&turn(&b.0)))
    });
    let mut held: Option<Duration> = None;
    for (app, _, limits) in candidates {
        if !limits.limited() {
            if let Some(job) = oldest_due(&places, &app)? {
                return Ok(Claim::Job(job, false));
            }
            continue;
        }
        // The slot and the claim together, or neither: a slot taken for a
        // job another worker took first would idle until this job's end.
        let both = Subtransaction::begin();
        let job = limits::take_slot(&app, limits, &places).and_then(|taken| match taken {
            Taken::Yes => oldest_due(&places, &app),
            Taken::Full => Ok(None), // woken when a slot is given back
            Taken::RateUntil(wait) => {
                held = Some(held.map_or(wait, |h| h.min(wait)));
                Ok(None)
            }
        });
        match job {
            Ok(Some(job)) => {
                both.release();
                return Ok(Claim::Job(job, true));
            }
            Ok(None) => both.roll_back(),
            Err(err) => {
                both.roll_back();
                return Err(err);
            }
        }
    }
    Ok(Claim::None(held))
}

/// Logs `refused` as a WARNING, once per process.
fn warn_once(refused: &LambdaError) {
    thread_local!(static WARNED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if !WARNED.replace(true) {
        pgrx::warning!("jobs wait: {refused}");
    }
}

/// Where this node's jobs are: the table, or (on a Citus node) each of its
/// shards of it. A worker runs the jobs of the objects stored on its node.
fn here() -> Result<Vec<Place>> {
    Ok(match layout::layout()? {
        None => vec![Place::Tables],
        Some(layout) => layout.local_shards().map(Place::Local).collect(),
    })
}

/// `here`, each shard held against a move until the transaction ends
/// (one that moved away meanwhile left out).
fn held_here() -> Result<Vec<Place>> {
    let mut places = Vec::new();
    for place in here()? {
        match place {
            Place::Local(shard) => places.extend(layout::hold_local(shard)?),
            tables => places.push(tables),
        }
    }
    Ok(places)
}

/// The applications with due jobs at `place`, with their priority and
/// limits. A subquery with LIMIT, not EXISTS: PostgreSQL turns an EXISTS
/// into a semi-join that reads every due job (0.75 ms with 2,000 due),
/// where this probes `jobs_queued_by_app` once per application (0.07 ms).
/// Its ORDER BY is that index's: without it, with statistics saying half
/// the rows are another application's, the generic plan read the table
/// sequentially (2.9 ms against 0.03 with 10,000 pending jobs), and a
/// drain of 10,000 jobs ran at a quarter of its speed.
fn due_apps(place: Place) -> Result<Vec<(String, i32, Limits)>> {
    query_at(
        place,
        "SELECT a.name, coalesce(l.priority, 0), l.max_running, l.rate,
                (extract(epoch FROM coalesce(l.per, interval '1 second')) * 1000)::bigint
           FROM lambdastore.applications a LEFT JOIN lambdastore.queue_limits l ON l.app = a.name
          WHERE (SELECT true FROM lambdastore.jobs j
                  WHERE j.app = a.name AND j.state = 'queued' AND j.run_after <= now()
                  ORDER BY j.app, j.run_after LIMIT 1)",
        &[],
        &[],
        |rows| {
            rows.into_iter()
                .map(|row| {
                    let limits =
                        Limits { max_running: row.get(3)?, rate: row.get(4)?, per_ms: row.get(5)?.unwrap_or(1000) };
                    Ok((row.get::<String>(1)?.unwrap_or_default(), row.get::<i32>(2)?.unwrap_or_default(), limits))
                })
                .collect()
        },
    )
}

/// Row-locks the oldest due job of `app` that no other worker holds, at
/// the first of `places` that has one.
fn oldest_due(places: &[Place], app: &str) -> Result<Option<Claimed>> {
    for &place in places {
        let claimed = query_at(
            place,
            "SELECT object_id, job_id, app, method, args::text, attempts, submitted_by,
                    (extract(epoch FROM run_after) * 1000000)::bigint, schedule
               FROM lambdastore.jobs
              WHERE app = $1 AND state = 'queued' AND run_after <= now()
              ORDER BY run_after, job_id
              LIMIT 1
                FOR UPDATE SKIP LOCKED",
            &[TEXTOID],
            &[app.into()],
            first_claimed,
        )?;
        if claimed.is_some() {
            return Ok(claimed);
        }
    }
    Ok(None)
}

fn first_claimed(rows: pgrx::spi::SpiTupleTable<'_>) -> pgrx::spi::Result<Option<Claimed>> {
    let Some(row) = rows.into_iter().next() else { return Ok(None) };
    Ok(Some(Claimed {
        object: row.get(1)?.unwrap_or_default(),
        job: row.get(2)?.unwrap_or_default(),
        app: row.get(3)?.unwrap_or_default(),
        method: row.get(4)?.unwrap_or_default(),
        args: row.get(5)?.unwrap_or_default(),
        attempts: row.get(6)?.unwrap_or_default(),
        role: row.get(7)?.unwrap_or(pg_sys::InvalidOid),
        due_micros: row.get(8)?.unwrap_or_default(),
        schedule: row.get(9)?,
    }))
}

/// Milliseconds until the next job that is waiting out a backoff becomes
/// due; `None` if none is. Jobs already due are either claimable (the
/// caller just found none) or held by another worker, who will finish them.
pub(crate) fn next_backoff_ms() -> Result<Option<i64>> {
    let mut next: Option<i64> = None;
    for place in here()? {
        let at = query_at(
            place,
            "SELECT ceil(extract(epoch FROM min(run_after) - clock_timestamp()) * 1000)::bigint
               FROM lambdastore.jobs WHERE state = 'queued' AND run_after > now()",
            &[],
            &[],
            |rows| Ok(rows.first().get::<i64>(1)?),
        )?;
        next = next.into_iter().chain(at).min();
    }
    Ok(next)
}

/// Deletes up to `batch` of this node's jobs that finished more than
/// `retention` ago (oldest first, through `jobs_finished`), with their
/// idempotency keys; how many. Finished rows are locked by no one (a
/// running job's row is queued), so the queue never waits for this.
pub(crate) fn delete_finished(retention: std::time::Duration, batch: i64) -> Result<i64> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let mut deleted = 0;
    for place in held_here()? {
        let keys: Vec<(String, String)> = query_at(
            place,
            "DELETE FROM lambdastore.jobs j
              WHERE (j.object_id, j.job_id) IN (
                    SELECT object_id, job_id FROM lambdastore.jobs
                     WHERE state <> 'queued'
                       AND finished_at < clock_timestamp() - $1 * interval '1 millisecond'
                     ORDER BY finished_at LIMIT $2)
             RETURNING j.app, j.idempotency_key",
            &[INT8OID, INT8OID],
            &[retention_ms.into(), (batch - deleted).into()],
            |rows| {
                rows.into_iter()
                    .map(|row| Ok((row.get::<String>(1)?.unwrap_or_default(), row.get::<String>(2)?)))
                    .filter_map(|key| key.map(|(app, key)| key.map(|key| (app, key))).transpose())
                    .collect()
            },
        )?;
        deleted += keys.len() as i64;
        // On a Citus cluster a key's uniqueness is held in job_keys, on the
        // key's node: it goes with its job (on one server, in the row).
        if place != Place::Tables {
            for (app, key) in keys {
                query_cluster(
                    "DELETE FROM lambdastore.job_keys WHERE idempotency_key = $1 AND app = $2",
                    &[TEXTOID, TEXTOID],
                    &[key.as_str().into(), app.as_str().into()],
                    |_| Ok(()),
                )?;
            }
        }
        if deleted >= batch {
            break;
        }
    }
    Ok(deleted)
}

pub(crate) fn finish_done(claimed: &Claimed, result: &str) -> Result<()> {
    query_at(
        layout::place(claimed.object)?,
        "UPDATE lambdastore.jobs
            SET state = 'done', result = $3::jsonb, error = NULL, sqlstate = NULL,
                attempts = attempts + 1, finished_at = clock_timestamp()
          WHERE object_id = $1 AND job_id = $2",
        &[INT8OID, INT8OID, TEXTOID],
        &[claimed.object.into(), claimed.job.into(), result.into()],
        |_| Ok(()),
    )
}

pub(crate) fn finish_failed(claimed: &Claimed, error: &str, sqlstate: &str) -> Result<()> {
    query_at(
        layout::place(claimed.object)?,
        "UPDATE lambdastore.jobs
            SET state = 'failed', error = $3, sqlstate = $4,
                attempts = attempts + 1, finished_at = clock_timestamp()
          WHERE object_id = $1 AND job_id = $2",
        &[INT8OID, INT8OID, TEXTOID, TEXTOID],
        &[claimed.object.into(), claimed.job.into(), error.into(), sqlstate.into()],
        |_| Ok(()),
    )
}

/// Ends the job as 'cancelled', with `why` as its error, without running it.
pub(crate) fn finish_cancelled(claimed: &Claimed, why: &str) -> Result<()> {
    query_at(
        layout::place(claimed.object)?,
        "UPDATE lambdastore.jobs SET state = 'cancelled', error = $3, finished_at = clock_timestamp()
          WHERE object_id = $1 AND job_id = $2",
        &[INT8OID, INT8OID, TEXTOID],
        &[claimed.object.into(), claimed.job.into(), why.into()],
        |_| Ok(()),
    )
}

/// When `object` is deleted, in its transaction, on its node: its
/// schedules go (they queue its ticks), and its queued jobs (timers and
/// ticks too) are cancelled, saying why. One a worker runs now (locked)
/// ends as it would have: it fails, its object gone, or its commit
/// conflicts with the delete's hold on the object.
pub(crate) fn forget_object(object: i64) -> Result<()> {
    let place = layout::place(object)?;
    let made_by = query_at(
        place,
        "DELETE FROM lambdastore.schedules WHERE object_id = $1 RETURNING created_by",
        &[INT8OID],
        &[object.into()],
        |rows| {
            rows.into_iter()
                .filter_map(|row| row.get::<pg_sys::Oid>(1).transpose())
                .collect::<pgrx::spi::Result<Vec<_>>>()
        },
    )?;
    crate::catalog::grants::mark_roles(&made_by)?; // they may have made their last
    query_at(
        place,
        "UPDATE lambdastore.jobs SET state = 'cancelled', error = 'its object was deleted',
                finished_at = statement_timestamp()
          WHERE object_id = $1 AND job_id IN (SELECT job_id FROM lambdastore.jobs
                                               WHERE object_id = $1 AND state = 'queued' FOR UPDATE SKIP LOCKED)",
        &[INT8OID],
        &[object.into()],
        |_| Ok(()),
    )
}

/// Leaves the job queued, due again after `backoff_ms`.
pub(crate) fn retry_later(claimed: &Claimed, error: &str, sqlstate: &str, backoff_ms: i64) -> Result<()> {
    query_at(
        layout::place(claimed.object)?,
        "UPDATE lambdastore.jobs
            SET error = $3, sqlstate = $4, attempts = attempts + 1,
                run_after = clock_timestamp() + $5 * interval '1 millisecond'
          WHERE object_id = $1 AND job_id = $2",
        &[INT8OID, INT8OID, TEXTOID, TEXTOID, INT8OID],
        &[claimed.object.into(), claimed.job.into(), error.into(), sqlstate.into(), backoff_ms.into()],
        |_| Ok(()),
    )
}

/// The object and application of `job`, through Citus from any node.
pub(crate) fn object_of(job: i64) -> Result<Option<(i64, String, Option<String>)>> {
    query_cluster(
        "SELECT object_id, app, schedule FROM lambdastore.jobs WHERE job_id = $1",
        &[INT8OID],
        &[job.into()],
        |rows| {
            let Some(row) = rows.into_iter().next() else { return Ok(None) };
            Ok(Some((row.get::<i64>(1)?.unwrap_or_default(), row.get::<String>(2)?.unwrap_or_default(), row.get(3)?)))
        },
    )
}

/// Cancels `job` of `object` if it is queued (waiting for the worker
/// that runs it, if one does); whether it was. Routed by the object on a
/// Citus cluster, which takes no VOLATILE function in an UPDATE of a
/// distributed table (so not clock_timestamp()).
pub(crate) fn cancel(object: i64, job: i64) -> Result<bool> {
    query_cluster(
        "UPDATE lambdastore.jobs SET state = 'cancelled', finished_at = statement_timestamp()
          WHERE object_id = $1 AND job_id = $2 AND state = 'queued'
         RETURNING true",
        &[INT8OID, INT8OID],
        &[object.into(), job.into()],
        |rows| Ok(!rows.is_empty()),
    )
}

/// The job's application, and what `lambdastore.job` shows of it, as
/// committed now; `None` if there is no such job.
pub(crate) fn outcome(job: i64) -> Result<Option<(String, pgrx::JsonB)>> {
    query_cluster(
        // The result in an array: a JSON null result is not no result. No
        // key while there is none (SQL NULL): a JSON null scalar's `-> 0` is
        // itself, so `job()` would show it as a JSON null result.
        "SELECT app, jsonb_build_object('job_id', job_id, 'state', state,
                                        'error', error, 'sqlstate', sqlstate, 'attempts', attempts,
                                        'submitted_at', submitted_at, 'finished_at', finished_at)
                     || CASE WHEN result IS NULL THEN '{}'::jsonb
                             ELSE jsonb_build_object('result', jsonb_build_array(result)) END
           FROM lambdastore.jobs WHERE job_id = $1",
        &[INT8OID],
        &[job.into()],
        |rows| {
            let Some(row) = rows.into_iter().next() else { return Ok(None) };
            let outcome = row.get::<pgrx::JsonB>(2)?.unwrap_or(pgrx::JsonB(serde_json::Value::Null));
            Ok(Some((row.get::<String>(1)?.unwrap_or_default(), outcome)))
        },
    )
}

/// The job's application and state as committed now; `None` if there is
/// no such job.
pub(crate) fn state(job: i64) -> Result<Option<(String, String)>> {
    query_cluster("SELECT app, state FROM lambdastore.jobs WHERE job_id = $1", &[INT8OID], &[job.into()], |rows| {
        let Some(row) = rows.into_iter().next() else { return Ok(None) };
        Ok(Some((row.get::<String>(1)?.unwrap_or_default(), row.get::<String>(2)?.unwrap_or_default())))
    })
}
