-- LambdaStore catalog. Everything that holds object data is keyed by
-- object_id first so that Citus can distribute and colocate it.
-- Field names use the "C" collation so that (field, key) order in
-- PostgreSQL is the byte order the runtime uses for ranges.

CREATE SCHEMA IF NOT EXISTS lambdastore;

-- An application: one WebAssembly component, its object types and objects.
CREATE TABLE lambdastore.applications (
    name       text PRIMARY KEY CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_.-]{0,62}$'),
    owner      oid NOT NULL,         -- a role OID: a new role reusing a dropped one's name is not its owner
    owner_name name NOT NULL,        -- its name: what identifies it on every node of a Citus cluster
    module_id  bigint,               -- the current module; NULL until deployed
    created    timestamptz NOT NULL DEFAULT now()
);

-- Every deployed version of an application's code. Rows are immutable:
-- a running invocation keeps using the version it started with.
CREATE TABLE lambdastore.modules (
    module_id    bigserial PRIMARY KEY,
    app          text NOT NULL REFERENCES lambdastore.applications(name) ON DELETE CASCADE,
    version      int NOT NULL,
    sha256       text NOT NULL,
    wasm         bytea NOT NULL,
    description  jsonb NOT NULL,     -- what the module's `describe` export returned
    deployed     timestamptz NOT NULL DEFAULT now(),
    deployed_by  oid NOT NULL,       -- the role that deployed it
    UNIQUE (app, version)
);

-- No foreign key from applications.module_id to modules: with modules.app
-- the two would reference each other, and pg_restore loads each table's
-- rows in a transaction of its own, so that restoring a dump failed on
-- whichever came first. A deploy inserts the module, then points the
-- application at it, in one transaction (catalog/modules.rs).

-- Privileges an application's owner granted to other roles (access.rs):
-- 'invoke' (call its functions, create objects, submit jobs) and 'read'
-- (read its objects' state through the app_* views).
CREATE TABLE lambdastore.grants (
    app        text NOT NULL REFERENCES lambdastore.applications(name) ON DELETE CASCADE,
    grantee    oid NOT NULL,
    grantee_name name NOT NULL,      -- as owner_name
    privilege  text NOT NULL CHECK (privilege IN ('invoke', 'read')),
    PRIMARY KEY (app, grantee, privilege)
);

-- Object types of each module version, for inspection with SQL.
CREATE TABLE lambdastore.object_types (
    module_id  bigint NOT NULL REFERENCES lambdastore.modules(module_id) ON DELETE CASCADE,
    app        text NOT NULL,
    type_name  text NOT NULL,
    fields     jsonb NOT NULL,       -- [{"name", "kind"}]
    functions  jsonb NOT NULL,       -- [{"name", "kind", "protected", "readonly"}]
    PRIMARY KEY (module_id, type_name)
);

CREATE SEQUENCE lambdastore.object_id_seq;

CREATE TABLE lambdastore.objects (
    object_id  bigint PRIMARY KEY,
    app        text NOT NULL REFERENCES lambdastore.applications(name),
    type_name  text NOT NULL,
    created    timestamptz NOT NULL DEFAULT now()
);

-- One row per entry. A Cell is the empty key of its field; a Map key is the
-- SDK's order-preserving encoding; values are opaque to the host (the Rust
-- SDK writes JSON, so `convert_from(value, 'UTF8')` shows them).
CREATE TABLE lambdastore.entries (
    object_id  bigint NOT NULL REFERENCES lambdastore.objects(object_id) ON DELETE CASCADE,
    field      text COLLATE "C" NOT NULL,
    key        bytea NOT NULL,
    value      bytea NOT NULL,
    PRIMARY KEY (object_id, field, key)
);

-- Entry sets: ranges of an object's (field, key) space, the unit of
-- concurrency control; each row is a guard, the lower bound of a set. A new
-- object has one set starting at ('', ''). Versions and conflict counts are
-- in shared memory (see lambdastore.entry_sets() in views.sql).
CREATE TABLE lambdastore.entry_sets (
    object_id    bigint NOT NULL REFERENCES lambdastore.objects(object_id) ON DELETE CASCADE,
    lower_field  text COLLATE "C" NOT NULL DEFAULT '',
    lower_key    bytea NOT NULL DEFAULT '',
    PRIMARY KEY (object_id, lower_field, lower_key)
);


-- Asynchronous jobs: a call of `method` on an object, run by a background
-- worker as its own transaction. A worker claims a queued row (FOR UPDATE
-- SKIP LOCKED), runs the call and records the outcome in one transaction,
-- so a job's effects and its 'done' are committed together or not at all;
-- 'running' is therefore never stored (see lambdastore.queue).
CREATE SEQUENCE lambdastore.job_id_seq;

CREATE TABLE lambdastore.jobs (
    object_id        bigint NOT NULL,
    job_id           bigint NOT NULL DEFAULT nextval('lambdastore.job_id_seq'),
    app              text NOT NULL,
    method           text NOT NULL,
    args             jsonb NOT NULL DEFAULT '{}',
    state            text NOT NULL DEFAULT 'queued'
                     CONSTRAINT jobs_state_check CHECK (state IN ('queued', 'done', 'failed', 'cancelled')),
    attempts         int NOT NULL DEFAULT 0,   -- runs started, including retried conflicts
    result           jsonb,
    error            text,                     -- the last error, also kept while retrying
    sqlstate         text,
    idempotency_key  text,
    submitted_by     oid NOT NULL,             -- the role the job runs as
    parent_job_id    bigint,                   -- set when a job's lambda spawned it
    submitted_at     timestamptz NOT NULL DEFAULT now(),
    run_after        timestamptz NOT NULL DEFAULT now(),  -- later when delayed, or while backing off
    finished_at      timestamptz,
    timer            text,                     -- the object's timer it is (a lambda's set_timer)
    schedule         text,                     -- the object's schedule it is a tick of
    PRIMARY KEY (object_id, job_id)
);
CREATE INDEX jobs_by_id ON lambdastore.jobs (job_id);
CREATE INDEX jobs_queued ON lambdastore.jobs (run_after, job_id) WHERE state = 'queued';
-- Every finished job leaves a dead entry in jobs_queued, and each claim's
-- index scan steps over the dead entries left of the queue's head until a
-- vacuum removes them; the default scale factor (20% of a table that keeps
-- every finished job) would let them pile up without bound.
ALTER TABLE lambdastore.jobs SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000);
-- Workers take turns between applications (catalog/jobs.rs: claim): one
-- application's flood of jobs must not starve another's.
CREATE INDEX jobs_queued_by_app ON lambdastore.jobs (app, run_after, job_id) WHERE state = 'queued';
-- "The same idempotency key on the same application returns the same job."
-- An object's pending timers (set_timer replaces the one of its name).
CREATE INDEX jobs_timers ON lambdastore.jobs (object_id, timer) WHERE timer IS NOT NULL AND state = 'queued';
-- Finished jobs by age, for the workers' retention (lambdastore.job_retention).
CREATE INDEX jobs_finished ON lambdastore.jobs (finished_at) WHERE state <> 'queued';
CREATE UNIQUE INDEX jobs_idempotency ON lambdastore.jobs (app, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Cron schedules (lambdastore.schedule): a method of an object run at the
-- times a cron pattern names, as the role that made the schedule. Each
-- tick is a job of the object (jobs.schedule), and the transaction that
-- records a tick's outcome queues the next tick, so that every tick runs
-- once, across crashes and restarts. Named per object, as timers are; on a
-- Citus cluster colocated with the object, so that it moves with it.
CREATE TABLE lambdastore.schedules (
    object_id   bigint NOT NULL,
    name        text NOT NULL,
    app         text NOT NULL,
    method      text NOT NULL,
    args        jsonb NOT NULL DEFAULT '{}',
    cron        text NOT NULL,
    time_zone   text NOT NULL,
    -- What a tick found late (its next tick due too) does: runs once, or not.
    missed      text NOT NULL CHECK (missed IN ('run_once', 'skip')),
    created_by  oid NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (object_id, name)
);

-- Limits on an application's jobs (lambdastore.set_queue_limits), which
-- each node's job runners enforce on the jobs they run: at most
-- max_running at once, at most rate started per `per` (NULL: no limit),
-- and the priority applications are served in (highest first; in turns
-- among equals). A reference table on a Citus cluster.
CREATE TABLE lambdastore.queue_limits (
    app          text PRIMARY KEY,
    max_running  int CHECK (max_running > 0),
    rate         int CHECK (rate > 0),
    per          interval NOT NULL DEFAULT '1 second',
    priority     int NOT NULL DEFAULT 0
);

-- On a Citus cluster, the idempotency keys of jobs: the jobs are spread
-- over the nodes by object, so a unique index on them cannot span the
-- cluster; this table, distributed by key, does (forward.rs). Unused on a
-- single server, where jobs_idempotency does the same.
CREATE TABLE lambdastore.job_keys (
    idempotency_key  text NOT NULL,
    app              text NOT NULL,
    -- The call, to tell a retry from a reuse for another call; and its job,
    -- set in the transaction that claimed the key (its row is on the
    -- object's node, which may commit after this one's).
    object_id        bigint NOT NULL,
    method           text NOT NULL,
    args             jsonb NOT NULL,
    job_id           bigint,
    PRIMARY KEY (idempotency_key, app)
);

-- The server whose role OIDs the tables hold (owners, grantees, the roles
-- jobs run as, API keys' and schedules' makers): its system identifier,
-- written when the first application is made. A dump carries it: in
-- another server the old OIDs name other roles, or none, and until
-- lambdastore.adopt_restored_roles() maps them by the stored names,
-- everything that acts on a stored role refuses (55000; catalog/grants.rs),
-- also while a restore has loaded applications but not this table yet.
CREATE TABLE lambdastore.roles_from (
    system_identifier bigint NOT NULL
);

-- What pg_dump keeps: the tables of an extension are its members, and a
-- dump skips their rows unless marked (a logical backup held none of the
-- applications, modules or objects). Every table and sequence here is
-- data; caches and counters live outside tables (shared memory, the
-- compiled-module cache on disk). gateway.sql and citus.sql mark theirs.
-- (One statement each: two in one statement update one catalog row twice.)
SELECT pg_catalog.pg_extension_config_dump('lambdastore.applications', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.modules', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.modules_module_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.grants', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.object_types', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.object_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.objects', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.entries', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.entry_sets', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.job_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.jobs', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.job_keys', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.schedules', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.queue_limits', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.roles_from', '');

-- Ordinary roles get no privilege on any of these: every change and every
-- read of application data goes through the extension's functions, which
-- check the caller (access.rs). What a role may read is in the app_* views
-- (views.sql).
REVOKE ALL ON ALL TABLES IN SCHEMA lambdastore FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA lambdastore FROM PUBLIC;
