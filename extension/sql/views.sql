-- Views over functions that pgrx generates; created after them.

-- One row of lambdastore.stats: a node's counters for one function
-- (lambdastore._stats(), the node's shared memory) and the node's name.
CREATE TYPE lambdastore.stats_row AS (
    app text, type_name text, function text, calls bigint, commits bigint,
    aborts_conflict bigint, aborts_timeout bigint, aborts_trap bigint, aborts_limit bigint,
    aborts_other bigint, total_ms float8, mean_ms float8, node text);

-- This node's rows on one server ('local', lambdastore.node()); every
-- node's on a distributed Citus cluster, asked over Citus' connections as
-- the extension's owner (SECURITY DEFINER; the view filters the rows by
-- privilege), each node answering with its rows as JSON. A node that does
-- not answer shows no rows.
CREATE FUNCTION lambdastore._stats_everywhere() RETURNS SETOF lambdastore.stats_row
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF lambdastore.node() = 'local' THEN
        RETURN QUERY SELECT s.*, 'local' FROM lambdastore._stats() s;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.*
      FROM run_command_on_all_nodes(
             'SELECT coalesce(json_agg(s), ''[]'') FROM (SELECT *, lambdastore.node() AS node FROM lambdastore._stats()) s') r,
           json_populate_recordset(NULL::lambdastore.stats_row, r.result::json) s
     WHERE r.success;
END
$$;

-- Per node, application, type and function: top-level calls, workflows
-- committed, aborts by reason, execution time. Counted in shared memory
-- since the node's server started (kept across aborted transactions);
-- empty unless lambdastore is in shared_preload_libraries. `node` is the
-- node that ran the calls (lambdastore.node()).
-- Rows of the applications the querying role may invoke or read:
-- _stats_visible (Rust) filters them for the role that calls it, which a
-- SECURITY DEFINER function could not see.
CREATE VIEW lambdastore.stats AS
SELECT s.* FROM lambdastore._stats_visible() v, jsonb_populate_record(NULL::lambdastore.stats_row, v) s;

-- What a role may read of the applications' data: ordinary roles have no
-- privilege on the tables (access.rs). Each app_* view below reads one of
-- the _*_all views (every application's rows, with the application's name;
-- for the tables' owner only) and keeps the rows of the applications the
-- querying role may see: on one server by filtering them as these views
-- are written (functions in a view run as the querying role, and
-- security_barrier keeps the role's own conditions from seeing rows before
-- that filter); on a Citus cluster through lambdastore._visible_rows, which
-- reads them as the tables' owner (Citus reads the workers' shards as the
-- querying role, which may not read them: _views_for_citus, citus.sql).
CREATE VIEW lambdastore._objects_all AS
SELECT o.object_id, o.app, o.type_name, o.created FROM lambdastore.objects o;

CREATE VIEW lambdastore._entries_all AS
SELECT e.object_id, o.app, e.field, e.key, e.value
  FROM lambdastore.entries e JOIN lambdastore.objects o ON o.object_id = e.object_id;

CREATE VIEW lambdastore._entry_sets_all AS
SELECT s.object_id, o.app, s.lower_field, s.lower_key
  FROM lambdastore.entry_sets s JOIN lambdastore.objects o ON o.object_id = s.object_id;

CREATE VIEW lambdastore._jobs_all AS
SELECT j.object_id, j.job_id, j.app, j.method, j.args, j.state, j.attempts, j.result, j.error, j.sqlstate,
       j.idempotency_key, j.submitted_by, j.parent_job_id, j.submitted_at, j.run_after, j.finished_at, j.timer,
       j.schedule
  FROM lambdastore.jobs j;

-- Each schedule (lambdastore.schedule) with the time of its next tick (its
-- queued job).
CREATE VIEW lambdastore._schedules_all AS
SELECT s.object_id, s.name, s.app, s.method AS function, s.args, s.cron, s.time_zone, s.missed,
       s.created_by::regrole AS created_by, s.created_at, min(j.run_after) AS next_tick
  FROM lambdastore.schedules s
  LEFT JOIN lambdastore.jobs j ON j.object_id = s.object_id AND j.schedule = s.name AND j.state = 'queued'
 GROUP BY s.object_id, s.name, s.app, s.method, s.args, s.cron, s.time_zone, s.missed, s.created_by, s.created_at;

CREATE VIEW lambdastore._queue_limits_all AS
SELECT l.app, l.max_running, l.rate, l.per, l.priority FROM lambdastore.queue_limits l;

-- Never the hashes.
CREATE VIEW lambdastore._api_keys_all AS
SELECT k.key_id, k.app, k.label, k.prefix, k.created, k.created_by::regrole AS created_by, k.revoked
  FROM lambdastore.api_keys k;

CREATE VIEW lambdastore.app_objects WITH (security_barrier) AS
SELECT o.object_id, o.app, o.type_name, o.created
  FROM lambdastore._objects_all o
 WHERE lambdastore.has_app_privilege(o.app, 'read');

CREATE VIEW lambdastore.app_entries WITH (security_barrier) AS
SELECT e.object_id, e.field, e.key, e.value
  FROM lambdastore._entries_all e
 WHERE lambdastore.has_app_privilege(e.app, 'read');

CREATE VIEW lambdastore.app_entry_sets WITH (security_barrier) AS
SELECT s.object_id, s.lower_field, s.lower_key
  FROM lambdastore._entry_sets_all s
 WHERE lambdastore.has_app_privilege(s.app, 'read');

-- Jobs of the applications a role may invoke or read.
CREATE VIEW lambdastore.app_jobs WITH (security_barrier) AS
SELECT j.object_id, j.job_id, j.app, j.method, j.args, j.state, j.attempts, j.result, j.error, j.sqlstate,
       j.idempotency_key, j.submitted_by, j.parent_job_id, j.submitted_at, j.run_after, j.finished_at, j.timer,
       j.schedule
  FROM lambdastore._jobs_all j
 WHERE lambdastore.has_app_privilege(j.app, 'invoke') OR lambdastore.has_app_privilege(j.app, 'read');

-- The schedules of the applications a role may invoke or read.
CREATE VIEW lambdastore.app_schedules WITH (security_barrier) AS
SELECT s.object_id, s.name, s.app, s.function, s.args, s.cron, s.time_zone, s.missed, s.created_by,
       s.created_at, s.next_tick
  FROM lambdastore._schedules_all s
 WHERE lambdastore.has_app_privilege(s.app, 'invoke') OR lambdastore.has_app_privilege(s.app, 'read');

-- The queue limits of the applications a role may invoke or read (the
-- queue view shows them).
CREATE VIEW lambdastore._app_queue_limits WITH (security_barrier) AS
SELECT l.app, l.max_running, l.rate, l.per, l.priority
  FROM lambdastore._queue_limits_all l
 WHERE lambdastore.has_app_privilege(l.app, 'invoke') OR lambdastore.has_app_privilege(l.app, 'read');

-- The objects' pending timers (set by their lambdas: set_timer), of the
-- applications a role may invoke or read: each is the job that runs it.
CREATE VIEW lambdastore.timers AS
SELECT j.object_id, j.timer AS name, j.run_after AS due, j.method AS function, j.args, j.job_id
  FROM lambdastore.app_jobs j
 WHERE j.timer IS NOT NULL AND j.state = 'queued';

-- An object's entry sets in key order: where its guards are, and each set's
-- version and recent conflicts (shared memory: they restart from 0 with the
-- server, and sets whose counters share a stripe show the same values).
-- None unless the role may read the object's application. Read as the
-- tables' owner (_entry_sets_visible): on a Citus cluster, on the object's
-- node, where its counters are.
CREATE FUNCTION lambdastore.entry_sets(object_id bigint)
RETURNS TABLE (lower_field text, lower_key bytea, version bigint, conflicts bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM lambdastore._entry_sets_visible($1)
$$;

-- A job's state and outcome; no row if there is no such job, or none the role
-- may invoke or read (read by the tables' owner: on Citus, through app_jobs
-- the workers' shards were read with the role's rights, which it lacks).
CREATE FUNCTION lambdastore.job(id bigint)
RETURNS TABLE (job_id bigint, state text, result jsonb, error text, sqlstate text, attempts int,
               submitted_at timestamptz, finished_at timestamptz)
LANGUAGE sql VOLATILE AS $$
SELECT (j->>'job_id')::bigint, j->>'state', j->'result'->0, j->>'error', j->>'sqlstate', (j->>'attempts')::int,
       (j->>'submitted_at')::timestamptz, (j->>'finished_at')::timestamptz
  FROM lambdastore._job($1) AS j
 WHERE j IS NOT NULL
$$;

-- Blocks until the job is done or failed, or the timeout passes, then
-- returns lambdastore.job(job_id) (state 'queued' after a timeout).
CREATE FUNCTION lambdastore.wait(id bigint, timeout interval DEFAULT '30 seconds')
RETURNS TABLE (job_id bigint, state text, result jsonb, error text, sqlstate text, attempts int,
               submitted_at timestamptz, finished_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- A NULL timeout returned at once, as if it were 0.
    IF id IS NULL OR timeout IS NULL THEN
        RAISE EXCEPTION 'the arguments of lambdastore.wait may not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM lambdastore._wait_for_job($1, (extract(epoch FROM $2) * 1000)::bigint);
    RETURN QUERY SELECT * FROM lambdastore.job($1);
END
$$;

-- The jobs the runners of every node run now (lambdastore._running_jobs(),
-- the node's shared memory), asked as lambdastore._stats_everywhere() asks.
-- Job ids only: the queue view joins them to the jobs the role may see.
CREATE FUNCTION lambdastore._running_jobs_everywhere() RETURNS SETOF bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF lambdastore.node() = 'local' THEN
        RETURN QUERY SELECT job_id FROM lambdastore._running_jobs();
        RETURN;
    END IF;
    RETURN QUERY
    SELECT unnest(r.result::bigint[])
      FROM run_command_on_all_nodes('SELECT coalesce(array_agg(job_id), ''{}'') FROM lambdastore._running_jobs()') r
     WHERE r.success;
END
$$;

-- Per application and function: jobs due and waiting (not running),
-- running now, done and failed, how long the oldest waiting job has been
-- due, jobs not due yet (delayed, or backing off after a conflict),
-- cancelled; then the application's queue limits, and its waiting jobs
-- held back because it runs max_running jobs (counted on one server: on a
-- Citus cluster each node applies max_running to its own jobs). 'running'
-- comes from the runners' shared memory (of every node): a claimed job is
-- only row-locked, its 'done' commits with its effects.
CREATE VIEW lambdastore.queue AS
WITH running AS (SELECT job_id FROM lambdastore._running_jobs_visible() job_id),
functions AS (
SELECT j.app,
       j.method AS function,
       count(*) FILTER (WHERE j.state = 'queued' AND r.job_id IS NULL AND j.run_after <= now()) AS depth,
       count(r.job_id) AS running,
       count(*) FILTER (WHERE j.state = 'done') AS done,
       count(*) FILTER (WHERE j.state = 'failed') AS failed,
       now() - min(j.run_after) FILTER (WHERE j.state = 'queued' AND r.job_id IS NULL AND j.run_after <= now())
           AS oldest_waiting,
       count(*) FILTER (WHERE j.state = 'queued' AND r.job_id IS NULL AND j.run_after > now()) AS not_due,
       count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled
  FROM lambdastore.app_jobs j LEFT JOIN running r ON r.job_id = j.job_id
 GROUP BY j.app, j.method)
SELECT f.app, f.function, f.depth, f.running, f.done, f.failed, f.oldest_waiting, f.not_due, f.cancelled,
       l.max_running, l.rate, l.per, coalesce(l.priority, 0) AS priority,
       CASE WHEN l.max_running <= sum(f.running) OVER (PARTITION BY f.app) THEN f.depth ELSE 0 END AS held_back
  FROM functions f LEFT JOIN lambdastore._app_queue_limits l ON l.app = f.app;

-- The API keys of the applications a role owns.
CREATE VIEW lambdastore.app_api_keys WITH (security_barrier) AS
SELECT k.key_id, k.app, k.label, k.prefix, k.created, k.created_by, k.revoked
  FROM lambdastore._api_keys_all k
 WHERE lambdastore.has_app_privilege(k.app, 'owner');

GRANT SELECT ON lambdastore.stats, lambdastore.app_objects, lambdastore.app_entries, lambdastore.app_entry_sets,
    lambdastore.app_jobs, lambdastore.app_schedules, lambdastore.timers, lambdastore.queue, lambdastore.app_api_keys
    TO PUBLIC;

-- The prepared transactions that hold entry sets on this node, for an
-- operator to end (README "Prepared transactions"): until one is committed
-- or rolled back, calls that read the sets it wrote fail with 40001 naming
-- its gid. sets_known is false for one prepared before a restart whose
-- sets were not kept: while it lasts, every call on this node fails.
CREATE FUNCTION lambdastore.prepared()
RETURNS TABLE (gid text, transaction xid, owner name, database name, prepared timestamptz,
               entry_set_locks int, sets_known boolean)
LANGUAGE sql VOLATILE AS $$
    SELECT p.gid, p.transaction, p.owner, p.database, p.prepared, h.entry_set_locks, h.sets_known
      FROM lambdastore._prepared_holders() h
      JOIN pg_catalog.pg_prepared_xacts p ON p.transaction::text = h.xid::text
     ORDER BY p.prepared
$$;

-- Read-your-writes on hot standbys (README "Hot standbys"): on the
-- primary, after a transaction that wrote, last_commit_lsn() is where its
-- commit record ended; on a standby, wait_for_replay(lsn) returns once
-- what committed up to there is visible (40001 after `timeout`). Run it
-- as a statement of its own before the read, which then starts with a
-- snapshot taken after it. NULL is refused: a read that waits for nothing
-- would look like one that waited.
CREATE FUNCTION lambdastore.last_commit_lsn() RETURNS pg_lsn
LANGUAGE sql VOLATILE AS $$ SELECT '0/0'::pg_lsn + lambdastore._last_commit_end() $$;

CREATE FUNCTION lambdastore.wait_for_replay(lsn pg_lsn, timeout interval DEFAULT '5 seconds') RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF lsn IS NULL OR timeout IS NULL THEN
        RAISE EXCEPTION 'the arguments of lambdastore.wait_for_replay may not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM lambdastore._wait_for_replay((lsn - '0/0'::pg_lsn)::bigint,
                                         (extract(epoch FROM timeout) * 1000)::bigint);
END
$$;

-- An application's deployed versions (every one is kept): when and by whom,
-- the module's digest and size, its types and those that migrate their
-- objects' fields (the SDK's #[migrate(N)]). A workflow, and each run of a
-- job, keeps the version current when it starts; every object and every
-- queued job runs on the current one (README, "Redeploying"), so only it
-- counts objects and queued jobs.
CREATE VIEW lambdastore._versions_all AS
SELECT m.app, m.version, m.module_id = a.module_id AS current, m.deployed, m.deployed_by::regrole AS deployed_by,
       m.sha256, octet_length(m.wasm) AS bytes,
       ARRAY(SELECT t.type_name FROM lambdastore.object_types t
              WHERE t.module_id = m.module_id ORDER BY t.type_name) AS types,
       ARRAY(SELECT t.type_name FROM lambdastore.object_types t
              WHERE t.module_id = m.module_id AND t.functions @> '[{"name": "migrate", "kind": "method"}]'
              ORDER BY t.type_name) AS migrating_types,
       CASE WHEN m.module_id = a.module_id THEN coalesce(o.n, 0) ELSE 0 END AS objects,
       CASE WHEN m.module_id = a.module_id THEN coalesce(j.n, 0) ELSE 0 END AS queued_jobs
  FROM lambdastore.modules m
  JOIN lambdastore.applications a ON a.name = m.app
  -- Joined, not correlated: on Citus these tables are distributed.
  LEFT JOIN (SELECT app, count(*) AS n FROM lambdastore.objects GROUP BY app) o ON o.app = m.app
  LEFT JOIN (SELECT app, count(*) AS n FROM lambdastore.jobs WHERE state = 'queued' GROUP BY app) j ON j.app = m.app
;

CREATE VIEW lambdastore.app_versions WITH (security_barrier) AS
SELECT v.app, v.version, v.current, v.deployed, v.deployed_by, v.sha256, v.bytes, v.types, v.migrating_types,
       v.objects, v.queued_jobs
  FROM lambdastore._versions_all v
 WHERE lambdastore.has_app_privilege(v.app, 'read') OR lambdastore.has_app_privilege(v.app, 'invoke');
GRANT SELECT ON lambdastore.app_versions TO PUBLIC;

CREATE FUNCTION lambdastore.versions(app text) RETURNS SETOF lambdastore.app_versions
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'the application of lambdastore.versions may not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM lambdastore._check_app($1, ARRAY['read', 'invoke']);
    RETURN QUERY SELECT * FROM lambdastore.app_versions v WHERE v.app = $1 ORDER BY v.version;
END
$$;

-- The objects of `app` whose type has a migration in the current version:
-- what migrate_objects calls. By the application's owner.
CREATE FUNCTION lambdastore._objects_to_migrate(app text) RETURNS SETOF bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    migrating text[];
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'the application of lambdastore.migrate_objects may not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM lambdastore._check_app($1, ARRAY['owner']);
    SELECT v.migrating_types INTO migrating FROM lambdastore.app_versions v WHERE v.app = $1 AND v.current;
    RETURN QUERY
    SELECT o.object_id FROM lambdastore.app_objects o
     WHERE o.app = $1 AND o.type_name = ANY (migrating)
     ORDER BY o.object_id;
END
$$;

-- Migrates every object of `app` whose type has a migration (#[migrate(N)])
-- by calling its `migrate` function: a call migrates an object that is
-- behind anyway, so this only does ahead of time what calls would. One
-- transaction per object, so that it runs beside live traffic and a
-- failure keeps what was done; a 40001 is tried again (up to 100 times).
-- `migrated`: how many objects were behind. CALL it outside BEGIN … COMMIT.
-- No SET search_path: a procedure with one cannot COMMIT; it runs with the
-- caller's rights, and names its objects in full.
CREATE PROCEDURE lambdastore.migrate_objects(app text, INOUT migrated bigint DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    object bigint;
    outcome jsonb;
    tries int;
    conflicted boolean;
BEGIN
    migrated := 0;
    FOR object IN SELECT o FROM lambdastore._objects_to_migrate(app) o LOOP
        tries := 0;
        LOOP
            conflicted := false;
            BEGIN
                outcome := @extschema@.lambda_invoke(object, 'migrate');
            EXCEPTION
                WHEN serialization_failure THEN
                    conflicted := true;
                    tries := tries + 1;
                    IF tries >= 100 THEN
                        RAISE;
                    END IF;
                WHEN undefined_object THEN
                    outcome := NULL; -- deleted since it was listed
            END;
            COMMIT;
            EXIT WHEN NOT conflicted;
        END LOOP;
        IF (outcome ->> 'from')::int < (outcome ->> 'to')::int THEN
            migrated := migrated + 1;
        END IF;
    END LOOP;
END
$$;

-- An application's owner grants other roles 'invoke' (call its functions,
-- create objects, submit jobs and see them) or 'read' (its objects' state
-- through the app_* views above), takes them back, or hands the
-- application over (access.rs).
CREATE FUNCTION lambdastore.grant(app text, grantee regrole, privilege text) RETURNS void
LANGUAGE sql VOLATILE AS $$ SELECT lambdastore._grant($1, $2::oid, $3) $$;

CREATE FUNCTION lambdastore.revoke(app text, grantee regrole, privilege text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$ SELECT lambdastore._revoke($1, $2::oid, $3) $$;

CREATE FUNCTION lambdastore.set_owner(app text, new_owner regrole) RETURNS void
LANGUAGE sql VOLATILE AS $$ SELECT lambdastore._set_owner($1, $2::oid) $$;

-- After a restore of another server's dump (operations.md, "Roles after a
-- restore into another server"): maps each role OID the tables hold to the
-- role of the same name here, by the names stored beside owners and
-- grantees (of an OID stored under several names, after a rename, the one
-- that is a role here), and the bootstrap superuser by its OID. A role only
-- an OID names (one that queued jobs or made schedules or API keys without
-- being an owner or grantee) cannot be found: its queued jobs are
-- cancelled, its schedules dropped, and its keys still call but deploy no
-- more. With keep_oids, after pg_upgrade (which keeps role OIDs), nothing
-- is mapped. Superusers only; afterwards the tables hold this server's OIDs.
CREATE FUNCTION lambdastore.adopt_restored_roles(keep_oids boolean DEFAULT false)
RETURNS TABLE (role_name name, restored_oid oid, local_oid oid)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    here bigint := (SELECT system_identifier FROM pg_control_system());
    refused text;
    distributed boolean;
    cancelled bigint;
    dropped bigint;
BEGIN
    IF keep_oids IS NULL THEN
        RAISE EXCEPTION 'keep_oids may not be NULL' USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT FROM lambdastore.roles_from WHERE system_identifier <> here)
       AND (EXISTS (SELECT FROM lambdastore.roles_from) OR NOT EXISTS (SELECT FROM lambdastore.applications)) THEN
        PERFORM lambdastore._mark_roles_in_use(); -- a restore into this server
        RETURN; -- the OIDs are this server's
    END IF;
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                                 WHERE logicalrelid = ''lambdastore.objects''::regclass)' INTO distributed;
        IF distributed THEN
            RAISE EXCEPTION 'adopt_restored_roles() runs before lambdastore.distribute()' USING ERRCODE = '55000',
                HINT = 'On a Citus cluster roles are found by name on each node.';
        END IF;
    END IF;
    IF keep_oids THEN
        DELETE FROM lambdastore.roles_from;
        INSERT INTO lambdastore.roles_from VALUES (here);
        PERFORM lambdastore._mark_roles_in_use();
        RETURN;
    END IF;
    CREATE TEMP TABLE lambdastore_found ON COMMIT DROP AS
        SELECT s.restored, s.name, r.oid AS local
          FROM (SELECT owner, owner_name FROM lambdastore.applications
                UNION SELECT grantee, grantee_name FROM lambdastore.grants) s (restored, name)
          LEFT JOIN pg_roles r ON r.rolname = s.name;
    SELECT string_agg(format('%s (stored as OID %s)', names, restored), ', ') INTO refused
      FROM (SELECT restored, string_agg(format('%I', name), ' or ' ORDER BY name) AS names
              FROM lambdastore_found GROUP BY restored HAVING count(local) = 0) none;
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'no role here is named %', refused USING ERRCODE = '42704',
            HINT = 'Create the roles (pg_dumpall --roles-only on the old server), then call it again.';
    END IF;
    SELECT string_agg(format('OID %s is stored as %s', restored, names), '; ') INTO refused
      FROM (SELECT restored, string_agg(format('%I', name), ' and ' ORDER BY name) AS names
              FROM lambdastore_found WHERE local IS NOT NULL GROUP BY restored HAVING count(*) > 1) twice;
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'one restored role has several names that are roles here: %', refused USING ERRCODE = '42710',
            HINT = 'It was renamed on the old server: rename the roles here that are not it while this runs.';
    END IF;
    -- The bootstrap superuser is OID 10 on every server: the one that
    -- installed the extension there (and, often, queued jobs).
    CREATE TEMP TABLE lambdastore_adopted ON COMMIT DROP AS
        SELECT restored, name, local FROM lambdastore_found WHERE local IS NOT NULL
        UNION
        SELECT 10, rolname, 10 FROM pg_roles
         WHERE oid = 10 AND 10 NOT IN (SELECT restored FROM lambdastore_found);
    -- What no name can be found for acts as no one (OID 0); first, while
    -- the OIDs are still the old server's.
    UPDATE lambdastore.jobs SET state = 'cancelled', finished_at = now(),
           error = 'cancelled by adopt_restored_roles(): the role that queued it is not known here'
     WHERE state = 'queued' AND submitted_by NOT IN (SELECT restored FROM lambdastore_adopted);
    GET DIAGNOSTICS cancelled = ROW_COUNT;
    DELETE FROM lambdastore.schedules WHERE created_by NOT IN (SELECT restored FROM lambdastore_adopted);
    GET DIAGNOSTICS dropped = ROW_COUNT;
    IF cancelled + dropped > 0 THEN
        RAISE NOTICE 'adopt_restored_roles(): % queued jobs cancelled and % schedules dropped, their roles unknown here',
            cancelled, dropped;
    END IF;
    UPDATE lambdastore.api_keys SET created_by = 0 WHERE created_by NOT IN (SELECT restored FROM lambdastore_adopted);
    UPDATE lambdastore.jobs SET submitted_by = 0 WHERE submitted_by NOT IN (SELECT restored FROM lambdastore_adopted);
    UPDATE lambdastore.modules SET deployed_by = 0 WHERE deployed_by NOT IN (SELECT restored FROM lambdastore_adopted);
    -- One statement per table: an old OID that is another role's here is
    -- never read as that role. The grants' key holds the grantee, and one
    -- grant's new OID may be another's old one: written again whole.
    UPDATE lambdastore.applications t SET owner = m.local, owner_name = m.name
      FROM lambdastore_adopted m WHERE t.owner = m.restored;
    CREATE TEMP TABLE lambdastore_grants ON COMMIT DROP AS
        SELECT g.app, m.local AS grantee, m.name AS grantee_name, g.privilege
          FROM lambdastore.grants g JOIN lambdastore_adopted m ON m.restored = g.grantee;
    DELETE FROM lambdastore.grants;
    INSERT INTO lambdastore.grants (app, grantee, grantee_name, privilege)
        SELECT * FROM lambdastore_grants ON CONFLICT DO NOTHING;
    UPDATE lambdastore.jobs t SET submitted_by = m.local FROM lambdastore_adopted m WHERE t.submitted_by = m.restored;
    UPDATE lambdastore.schedules t SET created_by = m.local FROM lambdastore_adopted m WHERE t.created_by = m.restored;
    UPDATE lambdastore.api_keys t SET created_by = m.local FROM lambdastore_adopted m WHERE t.created_by = m.restored;
    UPDATE lambdastore.modules t SET deployed_by = m.local FROM lambdastore_adopted m WHERE t.deployed_by = m.restored;
    DELETE FROM lambdastore.roles_from;
    INSERT INTO lambdastore.roles_from VALUES (here);
    PERFORM lambdastore._mark_roles_in_use();
    RETURN QUERY SELECT m.name, m.restored, m.local FROM lambdastore_adopted m ORDER BY 1, 2;
END
$fn$;
REVOKE ALL ON FUNCTION lambdastore.adopt_restored_roles(boolean), lambdastore._mark_roles_in_use() FROM PUBLIC;

-- The gateway's key check and its call of a key's application's object
-- (api/mod.rs) run only inside the gateway's SECURITY DEFINER functions
-- (sql/gateway.sql), like the helpers there.
-- The node-wide counters and running jobs of every application are the
-- extension's owner's; roles see their applications' rows through the
-- views (_stats_visible, _running_jobs_visible).
REVOKE ALL ON FUNCTION lambdastore._stats(), lambdastore._stats_everywhere(), lambdastore._running_jobs(),
    lambdastore._running_jobs_everywhere() FROM PUBLIC;
REVOKE ALL ON FUNCTION lambdastore._api_key_app(text), lambdastore._invoke_for(text, bigint, text, jsonb),
    lambdastore._deploy_for_key(text, text, bytea) FROM PUBLIC;
