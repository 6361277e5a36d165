//! The SQL surface: thin wrappers that turn SQL arguments into a workflow
//! call and a `LambdaError` into an `ERROR` with its SQLSTATE. Each runs
//! its work `access::as_storage`: for the calling role, checked against the
//! application's owner and grants, with the tables' owner's privileges.

use crate::access::{self, as_storage, Caller, Privilege};
use crate::cluster::{forward, map, route};
use crate::error::{LambdaError, Result};
use crate::pg::jsonb::JsonText;
use crate::workflow;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::JsonB;

/// Raises `err` once every wasm frame is gone. A cancel or termination is
/// handed back to PostgreSQL so that it reports it its own way (57014
/// "canceling statement due to ...", or FATAL for a terminated backend).
pub(crate) fn raise(err: LambdaError, context: String) -> ! {
    if matches!(err, LambdaError::Canceled) {
        pgrx::check_for_interrupts!();
    }
    err.report(&context)
}

/// A lambda's result; jsonb checks it when it is returned (`JsonText`).
pub(crate) fn json_result(result: Result<String>, context: impl FnOnce() -> String) -> JsonText {
    JsonText(result.unwrap_or_else(|err| raise(err, context())))
}

/// Runs a method of an object inside the caller's transaction, on the
/// node that holds the object (this backend, unless Citus distributes the
/// objects: cluster/forward.rs), and returns its JSON result.
#[pg_extern(volatile, parallel_unsafe)]
fn lambda_invoke(object_id: i64, method: &str, args: default!(JsonText, "'{}'")) -> JsonText {
    json_result(invoke(object_id, method, &args.0), || format!("lambda_invoke({object_id}, '{method}')"))
}

pub(crate) fn invoke(object_id: i64, method: &str, args: &str) -> Result<String> {
    route::at_owner(
        object_id,
        |caller| workflow::invoke_method(caller, object_id, method, args),
        |caller, node| forward::invoke(caller, object_id, node, method, args),
    )
}

/// `invoke` of an object that must be `app`'s, for the gateway: checked
/// where the object is read anyway (from the backend's cache, once seen),
/// or, for an object of another node, by a query of its row there.
fn invoke_for(app: &str, object_id: i64, method: &str, args: &str) -> Result<String> {
    route::at_owner(
        object_id,
        |caller| workflow::invoke_method_of(caller, app, object_id, method, args),
        |caller, node| {
            let owner = crate::jobs::queue::app_of(object_id)?.ok_or(LambdaError::UnknownObject(object_id))?;
            workflow::check_of_app(app, object_id, &owner)?;
            forward::invoke(caller, object_id, node, method, args)
        },
    )
}

#[pg_schema]
mod lambdastore {
    use super::*;

    /// Registers a new version of an application's code and returns what
    /// it registered. Redeploying the same bytes changes nothing.
    #[pg_extern(volatile, parallel_unsafe)]
    fn deploy(app: &str, module: &[u8]) -> JsonB {
        match as_storage(|caller| writing("deploy").and_then(|()| crate::api::deploy::deploy(caller, app, module))) {
            Ok(json) => JsonB(json),
            Err(err) => {
                // PostgreSQL would log the failed statement, with the
                // module's bytes in hex when they were sent as a literal.
                crate::pg::backend::forget_statement_text();
                raise(err, format!("deploy('{app}')"))
            }
        }
    }

    /// Creates an object and runs its type's constructor; returns its id.
    #[pg_extern(volatile, parallel_unsafe)]
    fn create_object(app: &str, type_name: &str, args: default!(JsonText, "'{}'")) -> i64 {
        let outcome = as_storage(|caller| {
            if forward::create_elsewhere()? {
                return forward::create(caller, app, type_name, &args.0);
            }
            let id = workflow::create(caller, app, type_name, &args.0)?;
            route::ran_here()?;
            Ok(id)
        });
        match outcome {
            Ok(id) => id,
            Err(err) => raise(err, format!("create_object('{app}', '{type_name}')")),
        }
    }

    /// Runs a static function of a type (no object).
    #[pg_extern(volatile, parallel_unsafe)]
    fn invoke_static(app: &str, type_name: &str, function: &str, args: default!(JsonText, "'{}'")) -> JsonText {
        json_result(as_storage(|caller| workflow::invoke_static(caller, app, type_name, function, &args.0)), || {
            format!("invoke_static('{app}', '{}', '{function}')", type_name)
        })
    }

    /// Inserts a guard at (field, key): the entry set containing it is split
    /// in two, both halves with versions above the old one. For experiments;
    /// at commit, hot sets are split automatically. False if already a guard.
    #[pg_extern(volatile, parallel_unsafe)]
    fn split(object_id: i64, field: &str, key: &[u8]) -> bool {
        let outcome = writing("split").and_then(|()| {
            route::at_owner(
                object_id,
                |caller| workflow::split(caller, object_id, field, key),
                |caller, node| forward::split(caller, object_id, node, field, key),
            )
        });
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
        // Another application's versions would show its writes as they
        // happen: only a role that may read the object's application sees them.
        let allowed = as_storage(|caller| {
            let (object, _) = crate::catalog::objects::lookup(object_id)?;
            access::check(caller, &object.app, Privilege::Read)
        });
        if let Err(err) = allowed {
            raise(err, format!("entry_sets({object_id})"));
        }
        TableIterator::once(workflow::entry_set_counters(object_id, lower_field, lower_key))
    }

    /// Behind `lambdastore.stats` (sql/views.sql): every node's counters
    /// (`_stats_everywhere`, which only the extension's owner may call), as
    /// JSON rows, of the applications the caller may invoke or read.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _stats_visible() -> SetOfIterator<'static, JsonB> {
        let rows = as_storage(|caller| {
            let rows = crate::catalog::stats_everywhere()?;
            visible(caller, rows, |row| row.get("app").and_then(|app| app.as_str()).map(str::to_owned))
        });
        SetOfIterator::new(rows.unwrap_or_else(|err| raise(err, "lambdastore.stats".into())).into_iter().map(JsonB))
    }

    /// Behind `lambdastore.entry_sets` (sql/views.sql): the object's entry
    /// sets with their counters, read as the tables' owner on the object's
    /// node; none unless the caller may read its application.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _entry_sets_visible(
        object_id: i64,
    ) -> TableIterator<
        'static,
        (name!(lower_field, String), name!(lower_key, Vec<u8>), name!(version, i64), name!(conflicts, i64)),
    > {
        let rows = as_storage(|caller| {
            let rows = crate::catalog::entry_sets_counted(object_id)?;
            let app = rows.first().map(|row| row.0.clone());
            let may_read = app.map_or(Ok(false), |app| access::allowed(caller, &app, Privilege::Read))?;
            Ok(if may_read { rows } else { Vec::new() })
        });
        let rows = rows.unwrap_or_else(|err| raise(err, format!("entry_sets({object_id})")));
        TableIterator::new(rows.into_iter().map(|(_, field, key, version, conflicts)| (field, key, version, conflicts)))
    }

    /// Behind the `app_*` views on a Citus cluster (`_views_for_citus`,
    /// sql/citus.sql): the rows of `view`, one of the `_*_all` views, of the
    /// applications the caller holds a privilege on that lets it see them,
    /// read as the tables' owner (Citus reads the workers' shards as the
    /// role that asks, which may not read them).
    #[pg_extern(volatile, parallel_unsafe)]
    fn _visible_rows(view: &str) -> SetOfIterator<'static, String> {
        use Privilege::*;
        let Some(behind) = crate::catalog::behind_view(view) else {
            let err = LambdaError::InvalidParameter(format!("\"{view}\" is not one of the views behind app_*"));
            raise(err, format!("_visible_rows('{view}')"))
        };
        let any_of: &[Privilege] = match behind.name {
            "app_objects" | "app_entries" | "app_entry_sets" => &[Read],
            "app_api_keys" => &[Owner],
            _ => &[Invoke, Read],
        };
        let rows = as_storage(|caller| {
            let mut apps = Vec::new();
            if !caller.is_superuser() {
                for app in crate::catalog::application_names()? {
                    if any_of
                        .iter()
                        .try_fold(false, |seen, p| Ok::<_, LambdaError>(seen || access::allowed(caller, &app, *p)?))?
                    {
                        apps.push(app);
                    }
                }
            }
            crate::catalog::all_rows(behind, caller.is_superuser(), apps)
        });
        let rows = rows.unwrap_or_else(|err| raise(err, format!("_visible_rows('{view}')")));
        SetOfIterator::new(rows)
    }

    /// The views `_views_for_citus` (sql/citus.sql) makes read through
    /// `_visible_rows`, each with the `_*_all` view behind it.
    #[pg_extern(immutable, parallel_safe)]
    fn _views_behind() -> TableIterator<'static, (name!(name, &'static str), name!(behind, &'static str))> {
        TableIterator::new(crate::catalog::BEHIND_VIEWS.iter().map(|view| (view.name, view.behind)))
    }

    /// Behind `lambdastore.queue`: the jobs the runners of every node run
    /// now (`_running_jobs_everywhere`, the extension's owner's), of the
    /// applications the caller may invoke or read.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _running_jobs_visible() -> SetOfIterator<'static, i64> {
        let jobs = as_storage(|caller| {
            let jobs = crate::jobs::queue::running_everywhere()?;
            visible(caller, jobs, |(_, app)| Some(app.clone()))
        });
        let jobs = jobs.unwrap_or_else(|err| raise(err, "lambdastore.queue".into()));
        SetOfIterator::new(jobs.into_iter().map(|(job, _)| job))
    }

    /// Queues a call of `method` on the object as a job that a background
    /// worker runs in a transaction of its own; returns the job id. With an
    /// idempotency key already used in this application, returns that job.
    /// The job is due at once, at `run_at`, or `delay` after the
    /// transaction's start, and runs once it is due and committed.
    #[pg_extern(volatile, parallel_unsafe)]
    /// Not strict (the key and the time may be NULL): any other NULL is 22004.
    fn submit(
        object_id: Option<i64>,
        method: Option<&str>,
        args: default!(Option<JsonText>, "'{}'"),
        idempotency_key: default!(Option<&str>, "NULL"),
        run_at: default!(Option<TimestampWithTimeZone>, "NULL"),
        delay: default!(Option<Interval>, "NULL"),
    ) -> i64 {
        let (Some(object_id), Some(method), Some(args)) = (object_id, method, args) else {
            raise(LambdaError::NullArgument("submit's object_id, method and args".into()), String::new())
        };
        let outcome = crate::jobs::due(run_at, delay)
            .and_then(|due| submit_anywhere(object_id, method, &args.0, idempotency_key, due, None));
        match outcome {
            Ok(job) => job,
            Err(err) => raise(err, format!("submit({object_id}, '{method}')")),
        }
    }

    /// Runs `method(args)` of the object at the times the cron pattern
    /// names (5 fields, or 6 with seconds first) in `time_zone`, as the
    /// calling role, each time as a job, until `unschedule`. `missed`: what
    /// a tick found late does ('run_once' or 'skip'). Returns when the first
    /// tick is due.
    #[pg_extern(volatile, parallel_unsafe)]
    fn schedule(
        name: Option<&str>,
        cron: Option<&str>,
        object_id: Option<i64>,
        method: Option<&str>,
        args: default!(Option<JsonText>, "'{}'"),
        time_zone: default!(Option<&str>, "'UTC'"),
        missed: default!(Option<&str>, "'run_once'"),
    ) -> TimestampWithTimeZone {
        let (Some(name), Some(cron), Some(object_id), Some(method), Some(args), Some(zone), Some(missed)) =
            (name, cron, object_id, method, args, time_zone, missed)
        else {
            raise(LambdaError::NullArgument("schedule's arguments".into()), String::new())
        };
        let outcome = writing("schedule").and_then(|()| {
            let first = as_storage(|caller| {
                crate::jobs::schedules::add(caller, name, cron, object_id, method, &args.0, zone, missed)
            })?;
            submit_anywhere(object_id, method, &args.0, None, Some(first), Some(name))?;
            Ok(first)
        });
        outcome.unwrap_or_else(|err| raise(err, format!("schedule('{name}', '{cron}', {object_id}, '{method}')")))
    }

    /// Removes the object's schedule `name` and its queued tick: whether
    /// there was one.
    #[pg_extern(volatile, parallel_unsafe)]
    fn unschedule(object_id: Option<i64>, name: Option<&str>) -> bool {
        let (Some(object_id), Some(name)) = (object_id, name) else {
            raise(LambdaError::NullArgument("unschedule's object_id and name".into()), String::new())
        };
        let outcome = writing("unschedule")
            .and_then(|()| as_storage(|caller| crate::jobs::schedules::unschedule(caller, object_id, name)));
        outcome.unwrap_or_else(|err| raise(err, format!("unschedule({object_id}, '{name}')")))
    }

    /// Limits on `app`'s jobs, set by its owner, which the workers of each
    /// node enforce on the jobs they run: at most `max_running` at once and
    /// `rate` started per `per` (NULL: no limit), and the `priority`
    /// applications are served in (highest first; in turns among equals).
    #[pg_extern(volatile, parallel_unsafe)]
    fn set_queue_limits(
        app: Option<&str>,
        max_running: default!(Option<i32>, "NULL"),
        rate: default!(Option<i32>, "NULL"),
        per: default!(Option<Interval>, "'1 second'"),
        priority: default!(Option<i32>, "0"),
    ) {
        let (Some(app), Some(per), Some(priority)) = (app, per, priority) else {
            raise(LambdaError::NullArgument("set_queue_limits' app, per and priority".into()), String::new())
        };
        let outcome = writing("set_queue_limits").and_then(|()| {
            as_storage(|caller| crate::jobs::set_queue_limits(caller, app, max_running, rate, per, priority))
        });
        outcome.unwrap_or_else(|err| raise(err, format!("set_queue_limits('{app}')")))
    }

    /// Cancels a queued job: whether it was queued (a running job's
    /// attempt is waited for, and finishes).
    #[pg_extern(volatile, parallel_unsafe)]
    fn cancel(job_id: Option<i64>) -> bool {
        let Some(job_id) = job_id else { raise(LambdaError::NullArgument("cancel's job_id".into()), String::new()) };
        let outcome = writing("cancel").and_then(|()| as_storage(|caller| crate::jobs::cancel(caller, job_id)));
        outcome.unwrap_or_else(|err| raise(err, format!("cancel({job_id})")))
    }

    /// Runs `method` with `args` on every object of `app`'s type
    /// `type_name`, each call a workflow of its own in the caller's
    /// transaction (cluster/map.rs); a row per object, by object id: its result,
    /// or the SQLSTATE and message of its failure (that call rolled back
    /// alone). On a Citus cluster, one task per shard on the shard's
    /// node, the nodes in parallel.
    #[pg_extern(volatile, parallel_unsafe, name = "map_call")]
    fn map_call_on_type(
        app: &str,
        type_name: &str,
        method: &str,
        args: default!(JsonText, "'{}'"),
    ) -> TableIterator<
        'static,
        (
            name!(object_id, i64),
            name!(result, Option<JsonText>),
            name!(sqlstate, Option<String>),
            name!(error, Option<String>),
        ),
    > {
        let targets = map::Targets::Type { app, type_name };
        mapped(as_storage(|caller| map::map_call(caller, targets, method, &args.0)), || {
            format!("map_call('{app}', '{type_name}', '{method}')")
        })
    }

    /// The same on the objects `object_ids` (each once; one that does not
    /// exist fails with 42704).
    #[pg_extern(volatile, parallel_unsafe, name = "map_call")]
    fn map_call_on_ids(
        object_ids: Vec<Option<i64>>,
        method: &str,
        args: default!(JsonText, "'{}'"),
    ) -> TableIterator<
        'static,
        (
            name!(object_id, i64),
            name!(result, Option<JsonText>),
            name!(sqlstate, Option<String>),
            name!(error, Option<String>),
        ),
    > {
        let outcome = as_storage(|caller| {
            let mut ids: Vec<i64> = object_ids
                .iter()
                .copied()
                .collect::<Option<_>>()
                .ok_or_else(|| LambdaError::InvalidParameter("object_ids may not hold NULL".into()))?;
            ids.sort_unstable();
            ids.dedup();
            map::map_call(caller, map::Targets::Ids(ids), method, &args.0)
        });
        mapped(outcome, || format!("map_call(object_ids, '{method}')"))
    }

    /// Behind `lambdastore.job` (sql/views.sql): the job as a JSON object,
    /// NULL when there is none the caller may see.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _job(job_id: i64) -> Option<JsonB> {
        as_storage(|caller| crate::jobs::outcome(caller, job_id))
            .unwrap_or_else(|err| raise(err, format!("job({job_id})")))
    }

    /// Behind `lambdastore.wait` (sql/views.sql), which then returns the job.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _wait_for_job(job_id: i64, timeout_ms: i64) {
        let timeout = std::time::Duration::from_millis(timeout_ms.max(0) as u64);
        if let Err(err) = as_storage(|caller| crate::jobs::wait(caller, job_id, timeout)) {
            raise(err, format!("wait({job_id})"));
        }
    }

    /// Behind `lambdastore.prepared()` (sql/views.sql): the prepared
    /// transactions holding entry sets on this node, after a sweep of those
    /// that ended.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _prepared_holders(
    ) -> TableIterator<'static, (name!(xid, i64), name!(entry_set_locks, i32), name!(sets_known, bool))> {
        if let Err(err) = as_storage(|_| crate::txn::prepared::sweep()) {
            raise(err, "lambdastore.prepared()".into());
        }
        let holders = crate::txn::prepared::holders();
        TableIterator::new(holders.into_iter().map(|(xid, locks, known)| (i64::from(xid), locks as i32, known)))
    }

    /// Behind `lambdastore.last_commit_lsn()` (sql/views.sql): where this
    /// session's last commit that wrote ended in the WAL, as a byte
    /// position; NULL before its first.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _last_commit_end() -> Option<i64> {
        let end = crate::pg::standby::last_commit_end();
        (end > 0).then_some(end as i64)
    }

    /// Behind `lambdastore.wait_for_replay(lsn, timeout)` (sql/views.sql):
    /// returns once what committed up to WAL position `lsn` is visible
    /// here. On a standby it waits for replay, at most `timeout_ms`, then
    /// fails with 40001; a primary has it all, unless `lsn` is past its WAL.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _wait_for_replay(lsn: i64, timeout_ms: i64) {
        use crate::pg::standby;
        let (lsn, timeout) = (lsn as u64, std::time::Duration::from_millis(timeout_ms.max(0) as u64));
        let show = |lsn: u64| format!("{:X}/{:X}", lsn >> 32, lsn as u32);
        let refused = if !standby::in_recovery() {
            (lsn > standby::wal_end()).then(|| {
                LambdaError::InvalidParameter(format!(
                    "{} is past the end of this server's WAL ({}): not a position of this server or its primary",
                    show(lsn),
                    show(standby::wal_end())
                ))
            })
        } else {
            (!standby::wait_for_replay(lsn, timeout)).then(|| {
                LambdaError::SerializationFailure(format!(
                    "this standby has replayed up to {}, not yet {} after {timeout_ms} ms: read on the primary, \
                     or try again",
                    show(standby::replayed()),
                    show(lsn)
                ))
            })
        };
        if let Some(err) = refused {
            raise(err, "wait_for_replay".into());
        }
    }

    /// Jobs the background workers are running now (behind `lambdastore.queue`).
    #[pg_extern(volatile, parallel_unsafe)]
    fn _running_jobs() -> TableIterator<'static, (name!(job_id, i64),)> {
        TableIterator::new(crate::jobs::workers::running_jobs().into_iter().map(|job| (job,)))
    }

    /// Deletes an object and all its entries (its application's owner only).
    #[pg_extern(volatile, parallel_unsafe)]
    fn delete_object(object_id: i64) {
        let outcome = writing("delete_object").and_then(|()| {
            route::at_owner(
                object_id,
                |caller| workflow::delete_object(caller, object_id),
                |caller, node| forward::delete(caller, object_id, node),
            )
        });
        match outcome {
            Ok(true) => {}
            Ok(false) => raise(LambdaError::UnknownObject(object_id), String::new()),
            Err(err) => raise(err, format!("delete_object({object_id})")),
        }
    }

    /// Whether the current role may do what `privilege` ('owner', 'invoke'
    /// or 'read') allows with `app`; false for an application that does
    /// not exist (the views filter rows with it).
    #[pg_extern(stable, parallel_restricted)]
    fn has_app_privilege(app: &str, privilege: &str) -> bool {
        let outcome = as_storage(|caller| match access::allowed(caller, app, Privilege::parse(privilege)?) {
            Err(LambdaError::UnknownApplication(_)) => Ok(false),
            other => other,
        });
        outcome.unwrap_or_else(|err| raise(err, format!("has_app_privilege('{app}', '{privilege}')")))
    }

    /// Behind `lambdastore.versions` and `migrate_objects` (sql/views.sql):
    /// raises 42704 unless `app` exists, 42501 unless the calling role
    /// holds one of the privileges `any_of` on it. (Their views show an
    /// application that does not exist, or one the role may not see, as
    /// no rows: an answer where the documentation promises a refusal.)
    #[pg_extern(stable, parallel_safe)]
    fn _check_app(app: &str, any_of: Vec<String>) {
        let outcome = as_storage(|caller| {
            let privileges = any_of.iter().map(|p| Privilege::parse(p)).collect::<Result<Vec<_>, _>>()?;
            access::check_any(caller, app, &privileges)
        });
        if let Err(err) = outcome {
            raise(err, format!("lambdastore.versions or migrate_objects('{app}')"));
        }
    }

    /// Behind `lambdastore.grant(app, role, privilege)` (sql/views.sql).
    #[pg_extern(volatile, parallel_unsafe)]
    fn _grant(app: &str, grantee: pg_sys::Oid, privilege: &str) {
        let outcome = as_storage(|caller| {
            writing("grant")?;
            let privilege = granted_privilege(privilege)?;
            owned(caller, app)?;
            if !access::role_exists(grantee) {
                return Err(LambdaError::UnknownRole(grantee.to_u32()));
            }
            crate::catalog::grants::grant(app, grantee, privilege.name())
        });
        outcome.unwrap_or_else(|err| raise(err, format!("grant('{app}')")))
    }

    /// Behind `lambdastore.revoke(app, role, privilege)`; false if it was
    /// not granted.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _revoke(app: &str, grantee: pg_sys::Oid, privilege: &str) -> bool {
        let outcome = as_storage(|caller| {
            writing("revoke")?;
            let privilege = granted_privilege(privilege)?;
            owned(caller, app)?;
            crate::catalog::grants::revoke(app, grantee, privilege.name())
        });
        outcome.unwrap_or_else(|err| raise(err, format!("revoke('{app}')")))
    }

    /// Behind `lambdastore.adopt_restored_roles()` (sql/views.sql): records
    /// again which roles PostgreSQL must not drop from any database
    /// (`grants::mark_all_roles`), which a dump does not carry.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _mark_roles_in_use() {
        let outcome = as_storage(|_| crate::catalog::grants::mark_all_roles());
        outcome.unwrap_or_else(|err| raise(err, "adopt_restored_roles()".into()))
    }

    /// Behind `lambdastore.set_owner(app, role)`.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _set_owner(app: &str, owner: pg_sys::Oid) {
        let outcome = as_storage(|caller| {
            writing("set_owner")?;
            owned(caller, app)?;
            if !access::role_exists(owner) {
                return Err(LambdaError::UnknownRole(owner.to_u32()));
            }
            // As ALTER ... OWNER TO: the owner's rights are the
            // application's (its code's calls to other applications need
            // them, and its API keys' calls run with them), so handing it
            // to a role the caller may not become would lend the caller
            // that role's rights.
            if !caller.may_become(owner) {
                return Err(LambdaError::PermissionDenied(format!(
                    "role \"{}\" may not hand application \"{app}\" to role \"{}\": only to a role it is a member of",
                    caller.name(),
                    access::role_name(owner)
                )));
            }
            crate::catalog::grants::set_owner(app, owner)
        });
        outcome.unwrap_or_else(|err| raise(err, format!("set_owner('{app}')")))
    }

    /// Creates an API key for `app` and returns it: this is the only time
    /// the key is shown. Creates the application (owned by the current
    /// role) if it does not exist yet, so that its first deploy can come
    /// over HTTP. The application's owner only.
    #[pg_extern(volatile, parallel_unsafe)]
    fn create_api_key(
        app: Option<&str>,
        label: default!(Option<&str>, "NULL"),
    ) -> TableIterator<'static, (name!(key_id, i64), name!(api_key, String))> {
        let Some(app) = app else { raise(LambdaError::NullArgument("create_api_key's app".into()), String::new()) };
        let outcome = as_storage(|caller| {
            writing("create_api_key")?;
            crate::api::deploy::check_app_name(app)?;
            if crate::catalog::grants::lock(app)?.is_none() {
                // Creating an application is a deploy's right.
                crate::api::deploy::claim(caller, app)?;
            }
            access::check(caller, app, Privilege::Owner)?;
            crate::catalog::api_keys::create(app, label, caller.0)
        });
        let (id, key) = outcome.unwrap_or_else(|err| raise(err, format!("create_api_key('{app}')")));
        TableIterator::once((id, key))
    }

    /// The application of a valid, unrevoked API key; 28000 otherwise. For
    /// the gateway's functions (sql/gateway.sql), which check every
    /// request's key with it first; revoked from PUBLIC (sql/views.sql).
    /// In Rust so that a key seen before costs a backend a hash and a
    /// lookup, not a statement (docs/PERFORMANCE.md, "The gateway under
    /// load"). Not parallel safe: it fills this backend's cache and runs
    /// as the tables' owner, which a parallel worker must not do.
    /// Not strict: a NULL key is refused like a wrong one (a strict
    /// function's NULL would have passed the checks that compare with it).
    #[pg_extern(stable, parallel_unsafe)]
    fn _api_key_app(api_key: Option<&str>) -> String {
        let outcome = as_storage(|_| {
            let key = api_key.ok_or(LambdaError::InvalidApiKey)?;
            crate::catalog::api_keys::app_of_key(key)?.ok_or(LambdaError::InvalidApiKey)
        });
        outcome.unwrap_or_else(|err| raise(err, "checking an API key".into()))
    }

    /// `deploy` through the gateway (sql/gateway.sql): for the role that
    /// created the API key, with that role's right to deploy checked now,
    /// as its own deploy from SQL would be; revoked from PUBLIC.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _deploy_for_key(api_key: Option<&str>, app: Option<&str>, module: Option<&[u8]>) -> JsonB {
        let outcome = as_storage(|_| {
            let key = api_key.ok_or(LambdaError::InvalidApiKey)?;
            let (key_app, creator) =
                crate::catalog::api_keys::app_and_creator_of_key(key)?.ok_or(LambdaError::InvalidApiKey)?;
            writing("deploy")?;
            let (Some(app), Some(module)) = (app, module) else {
                return Err(LambdaError::NullArgument("deploy's application and module".into()));
            };
            if key_app != app {
                return Err(LambdaError::PermissionDenied(format!(
                    "the API key does not belong to application \"{app}\""
                )));
            }
            crate::api::deploy::deploy(Caller(creator), app, module)
        });
        match outcome {
            Ok(json) => JsonB(json),
            Err(err) => {
                crate::pg::backend::forget_statement_text(); // the module's bytes stay out of the log
                raise(err, format!("deploy('{}')", app.unwrap_or_default()))
            }
        }
    }

    /// `lambda_invoke` of one of `app`'s objects (42501 for another
    /// application's), for the gateway's functions, which pass the
    /// application of the request's key; revoked from PUBLIC.
    #[pg_extern(volatile, parallel_unsafe)]
    fn _invoke_for(app: &str, object_id: i64, method: &str, args: JsonText) -> JsonText {
        json_result(invoke_for(app, object_id, method, &args.0), || {
            format!("lambda_invoke({object_id}, '{method}') for application \"{app}\"")
        })
    }

    /// Revokes a key at once (the next request with it is refused); false
    /// if it was already revoked. The key's application's owner only.
    #[pg_extern(volatile, parallel_unsafe)]
    fn revoke_api_key(key_id: i64) -> bool {
        let outcome = as_storage(|caller| {
            writing("revoke_api_key")?;
            let app = crate::catalog::api_keys::app_of(key_id)?.ok_or(LambdaError::UnknownApiKey(key_id))?;
            // Another application's key looks like one that does not exist:
            // the refusal would name its application.
            if !access::allowed(caller, &app, Privilege::Owner)? {
                return Err(LambdaError::UnknownApiKey(key_id));
            }
            crate::catalog::api_keys::revoke(key_id)
        });
        outcome.unwrap_or_else(|err| raise(err, format!("revoke_api_key({key_id})")))
    }
}

/// Refuses (25006) `what`, a write, in a READ ONLY transaction, before it
/// reaches another node, which would not know.
fn writing(what: &str) -> Result<()> {
    if crate::pg::xact::read_only() {
        return Err(LambdaError::ReadOnlyTransaction(format!("{what} is a write: the transaction is READ ONLY")));
    }
    Ok(())
}

/// `lambdastore.submit`, on the node holding the object; on a Citus
/// cluster with its idempotency key claimed cluster-wide first.
fn submit_anywhere(
    object_id: i64,
    method: &str,
    args: &str,
    key: Option<&str>,
    due: Option<TimestampWithTimeZone>,
    schedule: Option<&str>,
) -> Result<i64> {
    use forward::KeyClaim;
    writing("submit")?;
    let claim = match key {
        Some(key) => as_storage(|caller| forward::claim_job_key(caller, object_id, key, method, args))?,
        None => KeyClaim::NotNeeded,
    };
    if let KeyClaim::Existing(job) = claim {
        return Ok(job);
    }
    let job = route::at_owner(
        object_id,
        |caller| crate::jobs::submit(caller, object_id, method, args, key, due, schedule),
        |caller, node| {
            let job = forward::submit(caller, object_id, node, method, args, key, due, schedule)?;
            crate::jobs::queued_elsewhere(job);
            Ok(job)
        },
    )?;
    if let (KeyClaim::Claimed(app), Some(key)) = (claim, key) {
        as_storage(|_| forward::record_job_key(&app, key, job))?;
    }
    Ok(job)
}

/// The rows of applications `caller` may invoke or read (`app_of` a row);
/// an application dropped since shows to no one but a superuser.
fn visible<T>(caller: Caller, rows: Vec<T>, app_of: impl Fn(&T) -> Option<String>) -> Result<Vec<T>> {
    let may_see = |app: &str| -> Result<bool> {
        match access::allowed(caller, app, Privilege::Invoke) {
            Ok(true) => Ok(true),
            Ok(false) => access::allowed(caller, app, Privilege::Read),
            Err(LambdaError::UnknownApplication(_)) => Ok(caller.is_superuser()),
            Err(err) => Err(err),
        }
    };
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        if app_of(&row).map(|app| may_see(&app)).transpose()?.unwrap_or(false) {
            out.push(row);
        }
    }
    Ok(out)
}

/// A row of `map_call`'s result.
type MapRow = (i64, Option<JsonText>, Option<String>, Option<String>);

/// `map_call`'s rows, or its error raised.
fn mapped(
    outcome: Result<Vec<(i64, map::Outcome)>>,
    context: impl FnOnce() -> String,
) -> TableIterator<'static, MapRow> {
    let rows = outcome.unwrap_or_else(|err| raise(err, context()));
    TableIterator::new(rows.into_iter().map(|(object, outcome)| match outcome {
        Ok(result) => (object, Some(JsonText(result)), None, None),
        Err(failure) => (object, None, Some(failure.sqlstate), Some(failure.message)),
    }))
}

/// 'invoke' or 'read': what `grant` and `revoke` take.
fn granted_privilege(name: &str) -> Result<Privilege> {
    match Privilege::parse(name)? {
        Privilege::Owner => Err(LambdaError::InvalidParameter(
            "'owner' is not granted: use lambdastore.set_owner to hand an application over".into(),
        )),
        privilege => Ok(privilege),
    }
}

/// Locks `app`'s row (so that owner changes and grants are serialized)
/// and checks that `caller` owns it.
fn owned(caller: Caller, app: &str) -> Result<()> {
    crate::catalog::grants::lock(app)?.ok_or_else(|| LambdaError::UnknownApplication(app.to_string()))?;
    access::check(caller, app, Privilege::Owner)
}

mod deploy;
