//! Queue limits per application (`lambdastore.queue_limits`, set by its
//! owner with `lambdastore.set_queue_limits`, jobs/mod.rs): at most `max_running` of its
//! jobs at once, at most `rate` started per `per`, and a `priority` the
//! workers serve applications in. Enforced by the job runners of each node
//! for that node's jobs; on a Citus cluster every node enforces them on its
//! own (the limits are per node).
//!
//! A running job holds one of its application's slots: a transaction-level
//! advisory lock (key: the application, slot number), taken with the
//! job's claim in a subtransaction (both given back if no job could be
//! claimed) and released when the job's transaction ends, whoever ends it
//! (a commit, an abort, a killed worker). So the number of slots held is
//! the number of the application's jobs running on the node, without a
//! count to keep right. The rate counts the jobs finished within `per` and
//! those running, under a session-level lock per application held only
//! while a worker decides, so that two workers cannot both take the last
//! place.

use crate::catalog::{query, query_at, Place};
use crate::error::Result;
use pgrx::pg_sys::BuiltinOid::*;
use std::time::Duration;

/// The advisory lock "slot" a worker takes while it decides about an
/// application's rate; running slots are 0 to `max_running`.
const DECIDING: i32 = i32::MAX;
/// Slots of an application that sets a rate but no `max_running`: more
/// than there can be workers.
const ANY_NUMBER: i32 = 1024;

/// An application's limits, as the candidates' query reads them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Limits {
    pub(crate) max_running: Option<i32>,
    pub(crate) rate: Option<i32>,
    pub(crate) per_ms: i64,
}

impl Limits {
    pub(crate) fn limited(&self) -> bool {
        self.max_running.is_some() || self.rate.is_some()
    }
}

/// What taking a slot found.
pub(crate) enum Taken {
    /// One was taken (or none is needed): the claim may go on.
    Yes,
    /// All `max_running` are held.
    Full,
    /// The rate is used up until this much later.
    RateUntil(Duration),
}

/// The advisory lock key of `app`'s slots.
fn key(app: &str) -> Result<i32> {
    query("SELECT hashtext('lambdastore queue ' || $1)", &[TEXTOID], &[app.into()], |rows| {
        Ok(rows.first().get::<i32>(1)?.unwrap_or_default())
    })
}

/// Takes one of `app`'s running slots for the rest of the current
/// (sub)transaction, if its limits allow another job now on this node,
/// whose jobs are at `places`.
pub(crate) fn take_slot(app: &str, limits: Limits, places: &[Place]) -> Result<Taken> {
    if !limits.limited() {
        return Ok(Taken::Yes);
    }
    let key = key(app)?;
    let Some(rate) = limits.rate else { return try_slots(key, limits.max_running.unwrap_or(ANY_NUMBER)) };
    lock(key, true)?;
    let decided = decide(app, key, rate, limits, places);
    lock(key, false)?;
    decided
}

fn decide(app: &str, key: i32, rate: i32, limits: Limits, places: &[Place]) -> Result<Taken> {
    let running = query(
        "SELECT count(*) FROM pg_catalog.pg_locks
          WHERE locktype = 'advisory' AND granted AND objsubid = 2
            AND classid::int8 = ($1::int8 & 4294967295) AND objid::int8 < $2",
        &[INT4OID, INT8OID],
        &[key.into(), i64::from(DECIDING).into()],
        |rows| Ok(rows.first().get::<i64>(1)?.unwrap_or_default()),
    )?;
    // The jobs finished within `per`, and the soonest one of them leaves it.
    let (mut finished, mut leaves_ms) = (0i64, i64::MAX);
    for &place in places {
        let (count, first_leaves) = query_at(
            place,
            "SELECT count(*), ceil(extract(epoch FROM min(finished_at) - clock_timestamp()) * 1000 + $2)::bigint
               FROM lambdastore.jobs
              WHERE app = $1 AND state IN ('done', 'failed')
                AND finished_at > clock_timestamp() - $2 * interval '1 millisecond'",
            &[TEXTOID, INT8OID],
            &[app.into(), limits.per_ms.into()],
            |rows| {
                let row = rows.first();
                Ok((row.get::<i64>(1)?.unwrap_or_default(), row.get::<i64>(2)?))
            },
        )?;
        finished += count;
        leaves_ms = leaves_ms.min(first_leaves.unwrap_or(i64::MAX));
    }
    if running + finished >= i64::from(rate) {
        // Running jobs end by themselves, and wake the workers then.
        let wait = if finished > 0 { leaves_ms.clamp(1, limits.per_ms.max(1)) } else { limits.per_ms.max(1) };
        return Ok(Taken::RateUntil(Duration::from_millis(wait as u64)));
    }
    try_slots(key, limits.max_running.unwrap_or(ANY_NUMBER))
}

fn try_slots(key: i32, slots: i32) -> Result<Taken> {
    for slot in 0..slots {
        let taken = query(
            "SELECT pg_try_advisory_xact_lock($1, $2)",
            &[INT4OID, INT4OID],
            &[key.into(), slot.into()],
            |rows| Ok(rows.first().get::<bool>(1)?.unwrap_or(false)),
        )?;
        if taken {
            return Ok(Taken::Yes);
        }
    }
    Ok(Taken::Full)
}

/// Takes (or gives back) the session-level lock under which a worker
/// decides about `key`'s rate.
fn lock(key: i32, take: bool) -> Result<()> {
    let sql = if take { "SELECT 1 FROM pg_advisory_lock($1, $2)" } else { "SELECT pg_advisory_unlock($1, $2)" };
    query(sql, &[INT4OID, INT4OID], &[key.into(), DECIDING.into()], |_| Ok(()))
}
