-- lambdastore 0.1.0 -> 0.2.0 (ALTER EXTENSION lambdastore UPDATE TO '0.2.0').
-- What changed since 0.1.0 (v0.1.0): NULL arguments fail closed, the
-- gateway deploys as the key's creator, the stats and queue views show a
-- role only its applications, pg_dump keeps the tables' rows, and the
-- catalog lost the foreign key that made restores fail; distribute()
-- moves every node's sequences past restored ids; lambdastore.versions(app)
-- and migrate_objects(app) are new, and so are last_commit_lsn() and
-- wait_for_replay(lsn) for reads on hot standbys. The end state is
-- what lambdastore--0.2.0.sql creates: scripts/upgrade.sh compares the two.
\echo Use "ALTER EXTENSION lambdastore UPDATE" to load this file. \quit

-- The catalog (schema.sql): no foreign key from applications to modules,
-- and every table and sequence kept by pg_dump. On a Citus cluster
-- distribute() dropped it already, and the workers run this script too
-- (Citus sends them the update): IF EXISTS.
ALTER TABLE lambdastore.applications DROP CONSTRAINT IF EXISTS applications_module_id_fkey;
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
SELECT pg_catalog.pg_extension_config_dump('lambdastore.api_keys', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.api_keys_key_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.idempotency_keys', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.migrations', '');
-- No key: a whole row identifies it, for Citus' logical replication of
-- reference tables to a node added later (replicate_reference_tables).
-- Once distributed, distribute() sets it (Citus fails to send it to the
-- placements from here: "cannot insert multiple commands into a prepared
-- statement").
DO $$
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        ALTER TABLE lambdastore.migrations REPLICA IDENTITY FULL;
    ELSIF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                       WHERE logicalrelid = 'lambdastore.migrations'::regclass) THEN
        ALTER TABLE lambdastore.migrations REPLICA IDENTITY FULL;
    END IF;
END
$$;

-- lambda_invoke as Citus delegates it (extension/src/cluster/delegate.rs).
CREATE FUNCTION @extschema@."_lambda_invoke_delegated"(
	"settings" TEXT, /* & str */
	"object_id" bigint, /* i64 */
	"method" TEXT, /* & str */
	"args" jsonb DEFAULT '{}' /* JsonText */
) RETURNS jsonb /* JsonText */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_lambda_invoke_delegated_wrapper';

-- Functions in Rust (api/): NULL arguments fail closed inside them now,
-- and the functions behind the views and the gateway's deploy.
CREATE OR REPLACE FUNCTION lambdastore."_api_key_app"(
	"api_key" TEXT /* Option < & str > */
) RETURNS TEXT /* String */
STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_api_key_app_wrapper';
CREATE OR REPLACE FUNCTION lambdastore."create_api_key"(
	"app" TEXT, /* Option < & str > */
	"label" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS TABLE (
	"key_id" bigint,  /* i64 */
	"api_key" TEXT  /* String */
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'create_api_key_wrapper';
CREATE OR REPLACE FUNCTION lambdastore."submit"(
	"object_id" bigint, /* Option < i64 > */
	"method" TEXT, /* Option < & str > */
	"args" jsonb DEFAULT '{}', /* Option < JsonText > */
	"idempotency_key" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS bigint /* i64 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'submit_wrapper';
CREATE  FUNCTION lambdastore."_deploy_for_key"(
	"api_key" TEXT, /* Option < & str > */
	"app" TEXT, /* Option < & str > */
	"module" bytea /* Option < & [u8] > */
) RETURNS jsonb /* JsonB */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_deploy_for_key_wrapper';
CREATE  FUNCTION lambdastore."_prepared_holders"() RETURNS TABLE (
	"xid" bigint,  /* i64 */
	"entry_set_locks" INT,  /* i32 */
	"sets_known" bool  /* bool */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_prepared_holders_wrapper';
CREATE  FUNCTION lambdastore."_running_jobs_visible"() RETURNS SETOF bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_running_jobs_visible_wrapper';
CREATE  FUNCTION lambdastore."_stats_visible"() RETURNS SETOF jsonb /* JsonB */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_stats_visible_wrapper';
-- Which roles PostgreSQL must not drop from any database (grants.rs), recorded
-- again by adopt_restored_roles() after a restore.
CREATE  FUNCTION lambdastore."_mark_roles_in_use"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_mark_roles_in_use_wrapper';

-- The gateway (gateway.sql).
CREATE OR REPLACE FUNCTION lambdastore._check_key_app(api_key text, app text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF lambdastore._api_key_app($1) IS DISTINCT FROM $2 THEN
        RAISE EXCEPTION 'the API key does not belong to application "%"', $2 USING ERRCODE = '42501';
    END IF;
    RETURN $2;
END
$$;
CREATE FUNCTION lambdastore._no_nulls(function text, nulls int) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF nulls IS DISTINCT FROM 0 THEN
        RAISE EXCEPTION 'the arguments of lambdastore_gateway.% may not be NULL', function USING ERRCODE = '22004';
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION lambdastore._check_key_owns(api_key text, kind text, id bigint) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    app text := lambdastore._api_key_app($1);
    owner text;
BEGIN
    IF kind = 'object' THEN
        SELECT o.app INTO owner FROM lambdastore.objects o WHERE o.object_id = id;
    ELSE
        SELECT j.app INTO owner FROM lambdastore.jobs j WHERE j.job_id = id;
    END IF;
    IF owner IS NULL THEN
        RAISE EXCEPTION '% % does not exist', kind, id USING ERRCODE = '42704';
    END IF;
    IF owner IS DISTINCT FROM app THEN
        RAISE EXCEPTION '% % belongs to another application', kind, id USING ERRCODE = '42501';
    END IF;
    RETURN app;
END
$$;
CREATE OR REPLACE FUNCTION lambdastore_gateway.invoke(api_key text, object_id bigint, method text, args jsonb,
                                           idempotency_key text DEFAULT NULL)
RETURNS TABLE (result jsonb, replayed boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    app text := lambdastore._api_key_app($1);
BEGIN
    IF num_nulls($2, $3, $4) > 0 THEN  -- _no_nulls, inline on the hot path
        RAISE EXCEPTION 'the arguments of lambdastore_gateway.invoke may not be NULL' USING ERRCODE = '22004';
    END IF;
    IF $5 IS NULL THEN
        result := lambdastore._invoke_for(app, $2, $3, $4);
        replayed := false;
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM lambdastore._call(app, $5, jsonb_build_array('invoke', $2, $3, $4));
END
$$;
CREATE OR REPLACE FUNCTION lambdastore_gateway.create_object(api_key text, app text, type_name text, args jsonb,
                                                  idempotency_key text DEFAULT NULL)
RETURNS TABLE (result jsonb, replayed boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('create_object', num_nulls($2, $3, $4));
    RETURN QUERY SELECT * FROM lambdastore._call(lambdastore._check_key_app($1, $2), $5,
                                                 jsonb_build_array('create', $3, $4));
END
$$;
CREATE OR REPLACE FUNCTION lambdastore_gateway.invoke_static(api_key text, app text, type_name text, function text,
                                                  args jsonb, idempotency_key text DEFAULT NULL)
RETURNS TABLE (result jsonb, replayed boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('invoke_static', num_nulls($2, $3, $4, $5));
    RETURN QUERY SELECT * FROM lambdastore._call(lambdastore._check_key_app($1, $2), $6,
                                                 jsonb_build_array('static', $3, $4, $5));
END
$$;
CREATE OR REPLACE FUNCTION lambdastore_gateway.deploy(api_key text, app text, module bytea) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('deploy', num_nulls($2, $3));
    RETURN lambdastore._deploy_for_key($1, $2, $3);
END
$$;
CREATE OR REPLACE FUNCTION lambdastore_gateway.submit(api_key text, object_id bigint, method text, args jsonb,
                                           idempotency_key text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('submit', num_nulls($2, $3, $4));
    PERFORM lambdastore._check_key_owns($1, 'object', $2);
    RETURN lambdastore.submit($2, $3, $4, $5);
END
$$;
CREATE OR REPLACE FUNCTION lambdastore_gateway.job(api_key text, job_id bigint) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('job', num_nulls($2));
    PERFORM lambdastore._check_key_owns($1, 'job', $2);
    RETURN (SELECT to_jsonb(j) FROM lambdastore.job($2) j);
END
$$;
CREATE OR REPLACE FUNCTION lambdastore_gateway.wait(api_key text, job_id bigint, timeout_ms bigint) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('wait', num_nulls($2, $3));
    PERFORM lambdastore._check_key_owns($1, 'job', $2);
    RETURN (SELECT to_jsonb(j) FROM lambdastore.wait($2, make_interval(secs => greatest($3, 0) / 1000.0)) j);
END
$$;
CREATE OR REPLACE FUNCTION lambdastore_gateway.holds(object_id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._no_nulls('holds', num_nulls($1));
    RETURN lambdastore.holds($1);
END
$$;
CREATE OR REPLACE FUNCTION lambdastore_gateway.purge_idempotency_keys(older_than interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._no_nulls('purge_idempotency_keys', num_nulls($1));
    RETURN lambdastore.purge_idempotency_keys($1);
END
$$;
REVOKE ALL ON FUNCTION lambdastore._no_nulls(text, int) FROM PUBLIC;

-- The views (views.sql): rows of what the querying role may see.
CREATE OR REPLACE VIEW lambdastore.stats AS
SELECT s.* FROM lambdastore._stats_visible() v, jsonb_populate_record(NULL::lambdastore.stats_row, v) s;
CREATE OR REPLACE VIEW lambdastore.queue AS
WITH running AS (SELECT job_id FROM lambdastore._running_jobs_visible() job_id)
SELECT j.app,
       j.method AS function,
       count(*) FILTER (WHERE j.state = 'queued' AND r.job_id IS NULL) AS depth,
       count(r.job_id) AS running,
       count(*) FILTER (WHERE j.state = 'done') AS done,
       count(*) FILTER (WHERE j.state = 'failed') AS failed,
       now() - min(j.submitted_at) FILTER (WHERE j.state = 'queued' AND r.job_id IS NULL) AS oldest_waiting
  FROM lambdastore.app_jobs j LEFT JOIN running r ON r.job_id = j.job_id
 GROUP BY j.app, j.method;
CREATE VIEW lambdastore.app_api_keys WITH (security_barrier) AS
SELECT k.key_id, k.app, k.label, k.prefix, k.created, k.created_by::regrole AS created_by, k.revoked
  FROM lambdastore.api_keys k
 WHERE lambdastore.has_app_privilege(k.app, 'owner');
GRANT SELECT ON lambdastore.app_api_keys TO PUBLIC;
CREATE FUNCTION lambdastore.prepared()
RETURNS TABLE (gid text, transaction xid, owner name, database name, prepared timestamptz,
               entry_set_locks int, sets_known boolean)
LANGUAGE sql VOLATILE AS $$
    SELECT p.gid, p.transaction, p.owner, p.database, p.prepared, h.entry_set_locks, h.sets_known
      FROM lambdastore._prepared_holders() h
      JOIN pg_catalog.pg_prepared_xacts p ON p.transaction::text = h.xid::text
     ORDER BY p.prepared
$$;
REVOKE ALL ON FUNCTION lambdastore._stats(), lambdastore._stats_everywhere(), lambdastore._running_jobs(),
    lambdastore._running_jobs_everywhere() FROM PUBLIC;
REVOKE ALL ON FUNCTION lambdastore._deploy_for_key(text, text, bytea) FROM PUBLIC;

-- Citus (citus.sql).
CREATE OR REPLACE FUNCTION lambdastore.migrate_object(object_id bigint, node text,
                                           transfer_mode text DEFAULT 'block_writes',
                                           reason text DEFAULT 'manual')
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    -- Records, not pg_dist_node: a type that does not exist without Citus
    -- failed (42704) before _require_coordinator could say what is wrong.
    target record;
    source record;
    shard bigint;
    isolated boolean := false;
BEGIN
    PERFORM lambdastore._require_coordinator('migrate_object');
    SELECT * INTO target FROM pg_dist_node n
     WHERE n.nodename || ':' || n.nodeport = node AND n.noderole = 'primary' AND n.isactive;
    IF NOT FOUND OR NOT target.shouldhaveshards THEN
        RAISE EXCEPTION 'no node % holds shards in this cluster', node USING ERRCODE = '22023',
            HINT = 'The nodes: SELECT nodename || '':'' || nodeport FROM pg_dist_node WHERE shouldhaveshards.';
    END IF;
    PERFORM lambdastore._hold_shard_operations();
    -- Before moving a shard group again, Citus drops what its last move left
    -- on the old node, waiting 1 s (lock_timeout) for any transaction there
    -- that still holds it, and fails the move (XX000) if one does (a routed
    -- call opens its shard before it waits for the fence below). Dropped
    -- here first, before the fence: each try waits that second, at most ten.
    FOR attempt IN 1..10 LOOP
        EXIT WHEN NOT EXISTS (
            SELECT 1 FROM pg_dist_cleanup c,
                   unnest(get_colocated_shard_array(
                       get_shard_id_for_distribution_column('lambdastore.objects', object_id))) AS s(shardid)
             WHERE c.object_name LIKE '%\_' || s.shardid);
        PERFORM run_command_on_coordinator('CALL citus_cleanup_orphaned_resources()');
    END LOOP;
    -- The fence, on every node (see lambdastore.migrations).
    LOCK TABLE lambdastore.migrations IN EXCLUSIVE MODE;
    IF NOT EXISTS (SELECT 1 FROM lambdastore.objects o WHERE o.object_id = migrate_object.object_id) THEN
        RAISE EXCEPTION 'no object %', object_id USING ERRCODE = '42704';
    END IF;
    shard := get_shard_id_for_distribution_column('lambdastore.objects', object_id);
    IF (SELECT shardminvalue <> shardmaxvalue FROM pg_dist_shard WHERE shardid = shard) THEN
        PERFORM isolate_tenant_to_new_shard('lambdastore.objects', object_id, 'CASCADE',
                                            shard_transfer_mode => transfer_mode::citus.shard_transfer_mode);
        shard := get_shard_id_for_distribution_column('lambdastore.objects', object_id);
        isolated := true;
    END IF;
    SELECT n.* INTO source FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
     WHERE p.shardid = shard AND n.noderole = 'primary';
    IF source.groupid <> target.groupid THEN
        PERFORM citus_move_shard_placement(shard, source.nodename, source.nodeport,
                                           target.nodename, target.nodeport,
                                           shard_transfer_mode => transfer_mode::citus.shard_transfer_mode);
        INSERT INTO lambdastore.migrations (object_id, shard, source, target, isolated, reason)
        VALUES (object_id, shard, source.nodename || ':' || source.nodeport, node, isolated, reason);
    END IF;
    RETURN jsonb_build_object('object_id', object_id, 'shard', shard, 'isolated', isolated,
                              'from', source.nodename || ':' || source.nodeport, 'to', node,
                              'moved', source.groupid <> target.groupid);
END
$fn$;
-- lambda_invoke as Citus delegates it (extension/src/cluster/delegate.rs):
-- distributed by the object id, colocated with the objects, so that Citus
-- sends a call that is a whole statement to the node holding its object.
CREATE FUNCTION lambdastore._distribute_calls() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_dist_object
                    WHERE objid = '@extschema@._lambda_invoke_delegated(text,bigint,text,jsonb)'::regprocedure
                      AND distribution_argument_index IS NOT NULL) THEN
        PERFORM create_distributed_function('@extschema@._lambda_invoke_delegated(text,bigint,text,jsonb)', 'object_id',
                                            colocate_with := 'lambdastore.objects');
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION lambdastore._distribute_calls() FROM PUBLIC;

CREATE OR REPLACE FUNCTION lambdastore.distribute(shard_count int DEFAULT 32) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    fk record;
    reference text[] := ARRAY['applications', 'modules', 'object_types', 'grants', 'api_keys', 'migrations',
                              'queue_limits', 'light_replicas'];
    colocated text[] := ARRAY['entries', 'entry_sets', 'jobs', 'schedules'];
    t text;
    added int := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'lambdastore.distribute() needs the citus extension in this database'
            USING ERRCODE = '55000',
                  HINT = 'Install Citus 13, CREATE EXTENSION citus, add the workers (citus_add_node), then call it again.';
    END IF;
    IF (SELECT groupid FROM pg_dist_local_group) <> 0 THEN
        RAISE EXCEPTION 'lambdastore.distribute() runs on the coordinator' USING ERRCODE = '55000';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'lambdastore.objects'::regclass) THEN
        -- Tables a later version added: ALTER EXTENSION ... UPDATE made them
        -- on every node, not distributed.
        FOREACH t IN ARRAY reference LOOP
            IF NOT EXISTS (SELECT 1 FROM pg_dist_partition
                            WHERE logicalrelid = format('lambdastore.%I', t)::regclass) THEN
                PERFORM create_reference_table(format('lambdastore.%I', t));
                added := added + 1;
            END IF;
        END LOOP;
        FOREACH t IN ARRAY colocated LOOP
            IF NOT EXISTS (SELECT 1 FROM pg_dist_partition
                            WHERE logicalrelid = format('lambdastore.%I', t)::regclass) THEN
                PERFORM create_distributed_table(format('lambdastore.%I', t), 'object_id',
                                                 colocate_with => 'lambdastore.objects');
                added := added + 1;
            END IF;
        END LOOP;
        PERFORM lambdastore._distribute_calls();
        -- A node added since (citus_add_node) gets its copies of the
        -- reference tables only once Citus is asked (or at a shard's first
        -- move there); until then the extension refuses calls on it (55000,
        -- "only partly distributed", which names this function).
        -- Set by the update to 0.2.0 only where the table was not yet
        -- distributed (Citus does not take it from an extension's script).
        IF (SELECT relreplident FROM pg_class WHERE oid = 'lambdastore.migrations'::regclass) <> 'f' THEN
            ALTER TABLE lambdastore.migrations REPLICA IDENTITY FULL;
        END IF;
        PERFORM replicate_reference_tables('block_writes');
        PERFORM lambdastore._views_for_citus();
        RETURN CASE WHEN added = 0 THEN 'already distributed'
                    ELSE format('already distributed; %s new tables distributed', added) END;
    END IF;
    IF shard_count < 1 THEN
        RAISE EXCEPTION 'shard_count must be positive, not %', shard_count USING ERRCODE = '22023';
    END IF;
    -- A dump restored from another cluster holds its role OIDs: mapped by
    -- name here first (views.sql), as they cannot be once distributed.
    PERFORM lambdastore.adopt_restored_roles();
    -- Foreign keys to reference tables need one connection per node.
    SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
    -- Citus converts a table's whole foreign-key graph at once, and would
    -- create the extension's tables again on the workers, where CREATE
    -- EXTENSION made them already: drop the keys (everywhere), distribute
    -- table by table, then add the keys back (Citus adds them to the
    -- shards too).
    CREATE TEMP TABLE lambdastore_fks ON COMMIT DROP AS
        SELECT conrelid::regclass AS rel, conname, pg_get_constraintdef(oid) AS def
          FROM pg_constraint WHERE contype = 'f' AND connamespace = 'lambdastore'::regnamespace;
    FOR fk IN SELECT * FROM lambdastore_fks LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fk.rel, fk.conname);
        PERFORM run_command_on_workers(format('ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I', fk.rel, fk.conname));
    END LOOP;
    FOREACH t IN ARRAY reference LOOP
        PERFORM create_reference_table(format('lambdastore.%I', t));
    END LOOP;
    -- A sequence that a distributed table's default uses is distributed
    -- with it: each node draws from its own range, so object ids stay
    -- unique across the cluster.
    ALTER TABLE lambdastore.objects ALTER object_id SET DEFAULT nextval('lambdastore.object_id_seq');
    PERFORM create_distributed_table('lambdastore.objects', 'object_id', shard_count => shard_count);
    -- A unique index of a distributed table must include its distribution
    -- column: job_keys, distributed by key, holds the keys' uniqueness.
    DROP INDEX IF EXISTS lambdastore.jobs_idempotency;
    FOREACH t IN ARRAY colocated LOOP
        PERFORM create_distributed_table(format('lambdastore.%I', t), 'object_id',
                                         colocate_with => 'lambdastore.objects');
    END LOOP;
    PERFORM create_distributed_table('lambdastore.idempotency_keys', 'key', shard_count => shard_count);
    PERFORM create_distributed_table('lambdastore.job_keys', 'idempotency_key', shard_count => shard_count);
    FOR fk IN SELECT * FROM lambdastore_fks LOOP
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I %s', fk.rel, fk.conname, fk.def);
    END LOOP;
    PERFORM lambdastore._distribute_calls();
    PERFORM lambdastore._advance_sequences();
    PERFORM lambdastore._views_for_citus();
    RETURN format('distributed over %s shards', shard_count);
END
$fn$;
CREATE FUNCTION lambdastore._advance_sequences() RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    seq record;
    advance text;
BEGIN
    FOR seq IN
        SELECT * FROM (VALUES
            ('lambdastore.object_id_seq', (SELECT max(object_id & 281474976710655) FROM lambdastore.objects)),
            ('lambdastore.job_id_seq', (SELECT max(job_id & 281474976710655) FROM lambdastore.jobs)),
            ('lambdastore.modules_module_id_seq', (SELECT max(module_id) FROM lambdastore.modules)),
            ('lambdastore.api_keys_key_id_seq', (SELECT max(key_id) FROM lambdastore.api_keys))) s(name, used)
         WHERE used IS NOT NULL
    LOOP
        advance := format('SELECT setval(%L, %s) WHERE coalesce(pg_sequence_last_value(%L), 0) < %s',
                          seq.name, seq.used, seq.name, seq.used);
        EXECUTE advance;
        IF EXISTS (SELECT FROM run_command_on_workers(advance) WHERE NOT success) THEN
            RAISE EXCEPTION 'could not advance % on every worker', seq.name USING ERRCODE = '55000';
        END IF;
    END LOOP;
END
$fn$;
REVOKE ALL ON FUNCTION lambdastore._advance_sequences() FROM PUBLIC;

-- Redeploys (views.sql): the versions of an application, and migrating
-- its objects' fields ahead of their calls.
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

-- Delayed and cancelled jobs, timers, schedules, and the workers' retention
-- of finished jobs (schema.sql, views.sql). On a Citus cluster, Citus would
-- send this whole script to the workers as the text of each ALTER TABLE of
-- a distributed table (the statement's text in an extension script), which
-- they refuse ("cannot insert multiple commands into a prepared
-- statement"): here each node changes its own tables (the workers run this
-- script after the coordinator), and the coordinator the shards, below.
SET LOCAL citus.enable_ddl_propagation TO off;
ALTER TABLE lambdastore.jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
ALTER TABLE lambdastore.jobs
    ADD CONSTRAINT jobs_state_check CHECK (state IN ('queued', 'done', 'failed', 'cancelled'));
CREATE INDEX IF NOT EXISTS jobs_finished ON lambdastore.jobs (finished_at) WHERE state <> 'queued';
-- Timers and schedules' ticks: jobs of their object, by name. (On a
-- Citus cluster, lambdastore.distribute() distributes the new table.)
ALTER TABLE lambdastore.jobs ADD COLUMN IF NOT EXISTS timer text;
ALTER TABLE lambdastore.jobs ADD COLUMN IF NOT EXISTS schedule text;
CREATE TABLE IF NOT EXISTS lambdastore.schedules (
    object_id   bigint NOT NULL,
    name        text NOT NULL,
    app         text NOT NULL,
    method      text NOT NULL,
    args        jsonb NOT NULL DEFAULT '{}',
    cron        text NOT NULL,
    time_zone   text NOT NULL,
    missed      text NOT NULL CHECK (missed IN ('run_once', 'skip')),
    created_by  oid NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (object_id, name)
);
SELECT pg_catalog.pg_extension_config_dump('lambdastore.schedules', '');
REVOKE ALL ON lambdastore.schedules FROM PUBLIC;
CREATE TABLE IF NOT EXISTS lambdastore.queue_limits (
    app          text PRIMARY KEY,
    max_running  int CHECK (max_running > 0),
    rate         int CHECK (rate > 0),
    per          interval NOT NULL DEFAULT '1 second',
    priority     int NOT NULL DEFAULT 0
);
SELECT pg_catalog.pg_extension_config_dump('lambdastore.queue_limits', '');
REVOKE ALL ON lambdastore.queue_limits FROM PUBLIC;
CREATE INDEX IF NOT EXISTS jobs_timers ON lambdastore.jobs (object_id, timer)
    WHERE timer IS NOT NULL AND state = 'queued';
CREATE OR REPLACE VIEW lambdastore.app_jobs WITH (security_barrier) AS
SELECT j.object_id, j.job_id, j.app, j.method, j.args, j.state, j.attempts, j.result, j.error, j.sqlstate,
       j.idempotency_key, j.submitted_by, j.parent_job_id, j.submitted_at, j.run_after, j.finished_at, j.timer,
       j.schedule
  FROM lambdastore.jobs j
 WHERE lambdastore.has_app_privilege(j.app, 'invoke') OR lambdastore.has_app_privilege(j.app, 'read');
CREATE OR REPLACE VIEW lambdastore.timers AS
SELECT j.object_id, j.timer AS name, j.run_after AS due, j.method AS function, j.args, j.job_id
  FROM lambdastore.app_jobs j
 WHERE j.timer IS NOT NULL AND j.state = 'queued';
CREATE OR REPLACE VIEW lambdastore.app_schedules WITH (security_barrier) AS
SELECT s.object_id, s.name, s.app, s.method AS function, s.args, s.cron, s.time_zone, s.missed,
       s.created_by::regrole AS created_by, s.created_at, min(j.run_after) AS next_tick
  FROM lambdastore.schedules s
  LEFT JOIN lambdastore.jobs j ON j.object_id = s.object_id AND j.schedule = s.name AND j.state = 'queued'
 WHERE lambdastore.has_app_privilege(s.app, 'invoke') OR lambdastore.has_app_privilege(s.app, 'read')
 GROUP BY s.object_id, s.name, s.app, s.method, s.args, s.cron, s.time_zone, s.missed, s.created_by, s.created_at;
GRANT SELECT ON lambdastore.timers, lambdastore.app_schedules TO PUBLIC;
DROP FUNCTION lambdastore."submit"(bigint, text, jsonb, text);
CREATE FUNCTION lambdastore."submit"(
	"object_id" bigint, /* Option < i64 > */
	"method" TEXT, /* Option < & str > */
	"args" jsonb DEFAULT '{}', /* Option < JsonText > */
	"idempotency_key" TEXT DEFAULT NULL, /* Option < & str > */
	"run_at" timestamp with time zone DEFAULT NULL, /* Option < TimestampWithTimeZone > */
	"delay" interval DEFAULT NULL /* Option < Interval > */
) RETURNS bigint /* i64 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'submit_wrapper';
CREATE FUNCTION lambdastore."schedule"(
	"name" TEXT, /* Option < & str > */
	"cron" TEXT, /* Option < & str > */
	"object_id" bigint, /* Option < i64 > */
	"method" TEXT, /* Option < & str > */
	"args" jsonb DEFAULT '{}', /* Option < JsonText > */
	"time_zone" TEXT DEFAULT 'UTC', /* Option < & str > */
	"missed" TEXT DEFAULT 'run_once' /* Option < & str > */
) RETURNS timestamp with time zone /* TimestampWithTimeZone */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'schedule_wrapper';
CREATE FUNCTION lambdastore."unschedule"(
	"object_id" bigint, /* Option < i64 > */
	"name" TEXT /* Option < & str > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'unschedule_wrapper';
CREATE FUNCTION lambdastore."set_queue_limits"(
	"app" TEXT, /* Option < & str > */
	"max_running" INT DEFAULT NULL, /* Option < i32 > */
	"rate" INT DEFAULT NULL, /* Option < i32 > */
	"per" interval DEFAULT '1 second', /* Option < Interval > */
	"priority" INT DEFAULT 0 /* Option < i32 > */
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_queue_limits_wrapper';
CREATE FUNCTION lambdastore."cancel"(
	"job_id" bigint /* Option < i64 > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'cancel_wrapper';
DROP FUNCTION lambdastore."_submit_here"(bigint, text, text, text, text, bigint, text);
CREATE FUNCTION lambdastore."_submit_here"(
	"object_id" bigint, /* i64 */
	"method" TEXT, /* &str */
	"args" TEXT, /* &str */
	"idempotency_key" TEXT, /* &str */
	"role" TEXT, /* &str */
	"timeout_ms" bigint, /* i64 */
	"settings" TEXT, /* &str */
	"due" timestamp with time zone, /* Option < TimestampWithTimeZone > */
	"schedule" TEXT /* Option < & str > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_submit_here_wrapper';
REVOKE ALL ON FUNCTION lambdastore._submit_here(bigint, text, text, text, text, bigint, text, timestamptz, text) FROM PUBLIC;

-- The shards of jobs on a Citus cluster, from the coordinator: each in its
-- own transaction on its node (run_command_on_shards), so that every step
-- may run again. Citus names a shard's constraints and indexes after its
-- shard id.
DO $upgrade$
DECLARE
    failed text;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = 'lambdastore.jobs'::regclass)
       OR (SELECT groupid FROM pg_catalog.pg_dist_local_group) <> 0 THEN
        RETURN;
    END IF;
    SELECT string_agg(format('shard %s: %s', r.shardid, r.result), '; ') INTO failed
      FROM run_command_on_shards('lambdastore.jobs', $shard$
DO $do$
DECLARE
    c text;
    id text := substring('%1$s' FROM '_(\d+)$');
BEGIN
    ALTER TABLE %1$s ADD COLUMN IF NOT EXISTS timer text, ADD COLUMN IF NOT EXISTS schedule text;
    FOR c IN SELECT conname FROM pg_catalog.pg_constraint
              WHERE conrelid = '%1$s'::regclass AND contype = 'c' AND conname LIKE 'jobs\_state\_check%%' LOOP
        EXECUTE format('ALTER TABLE %1$s DROP CONSTRAINT %%I', c);
    END LOOP;
    EXECUTE format('ALTER TABLE %1$s ADD CONSTRAINT %%I CHECK (state IN (''queued'', ''done'', ''failed'', ''cancelled''))',
                   'jobs_state_check_' || id);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %%I ON %1$s (finished_at) WHERE state <> ''queued''',
                   'jobs_finished_' || id);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %%I ON %1$s (object_id, timer) WHERE timer IS NOT NULL AND state = ''queued''',
                   'jobs_timers_' || id);
END
$do$
$shard$) r
     WHERE NOT r.success;
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'updating the shards of lambdastore.jobs failed: %', failed;
    END IF;
END
$upgrade$;

-- Read-your-writes on hot standbys (views.sql).
CREATE  FUNCTION lambdastore."_last_commit_end"() RETURNS bigint /* core::option::Option<i64> */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_last_commit_end_wrapper';
CREATE  FUNCTION lambdastore."_wait_for_replay"(
	"lsn" bigint, /* i64 */
	"timeout_ms" bigint /* i64 */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_wait_for_replay_wrapper';
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


-- The gateway's (gateway.sql).
-- Read-your-writes with hot standbys (the gateway's --replica): where the
-- session's last commit ended, asked after a writing call on the primary;
-- and on a standby, the wait for it before a read (views.sql).
CREATE FUNCTION lambdastore_gateway.last_commit_lsn() RETURNS pg_lsn
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT lambdastore.last_commit_lsn()
$$;

CREATE FUNCTION lambdastore_gateway.wait_for_replay(lsn pg_lsn, timeout interval) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT lambdastore.wait_for_replay(lsn, timeout)
$$;

REVOKE ALL ON FUNCTION lambdastore_gateway.last_commit_lsn(), lambdastore_gateway.wait_for_replay(pg_lsn, interval)
    FROM PUBLIC;

-- Only whether the key is valid (28000 if not): the gateway asks before it
-- reads a large body, so that a request with a made-up key costs little.
CREATE FUNCTION lambdastore_gateway.check_key(api_key text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
END
$$;
REVOKE ALL ON FUNCTION lambdastore_gateway.check_key(text) FROM PUBLIC;


-- Light replicas (citus.sql).
-- Light replicas (lambdastore.add_light_replica): nodes that run calls of
-- an object they do not store, on a copy of its entries, and have its
-- owner validate and apply what each call read and wrote
-- (cluster/replica.rs). A reference table once distributed, so that each
-- node knows which objects it serves without asking.
CREATE TABLE IF NOT EXISTS lambdastore.light_replicas (
    object_id  bigint NOT NULL,
    node       text NOT NULL,        -- host:port
    added      timestamptz NOT NULL DEFAULT now(),
    -- Added by a rebalancing run: only those does one drop as the load
    -- falls; one added by hand stays until dropped by hand.
    by_rebalancer boolean NOT NULL DEFAULT false,
    PRIMARY KEY (object_id, node)
);
SELECT pg_catalog.pg_extension_config_dump('lambdastore.light_replicas', '');

-- Moves the catalog generation at commit (extension/src/cluster/api.rs).
CREATE  FUNCTION lambdastore."_catalog_changed"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_catalog_changed_wrapper';

-- Makes `node` a light replica of object `object_id`: calls of the object
-- made on that node run there, on a copy (docs/sql-api.md, "Light
-- replicas"); false if it was one already. On the coordinator, superusers.
CREATE FUNCTION lambdastore.add_light_replica(object_id bigint, node text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    owner text;
BEGIN
    IF object_id IS NULL OR node IS NULL THEN
        RAISE EXCEPTION 'the arguments of lambdastore.add_light_replica may not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM lambdastore._require_coordinator('add_light_replica');
    -- Any node, the coordinator too: a replica needs only the reference tables.
    IF NOT EXISTS (SELECT 1 FROM pg_dist_node n WHERE n.nodename || ':' || n.nodeport = node
                      AND n.noderole = 'primary' AND n.isactive) THEN
        RAISE EXCEPTION 'no node % in this cluster', node USING ERRCODE = '22023',
            HINT = 'The nodes: SELECT nodename || '':'' || nodeport FROM pg_dist_node.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM lambdastore.objects o WHERE o.object_id = add_light_replica.object_id) THEN
        RAISE EXCEPTION 'no object %', object_id USING ERRCODE = '42704';
    END IF;
    SELECT n.nodename || ':' || n.nodeport INTO owner
      FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
     WHERE p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', object_id)
       AND n.noderole = 'primary';
    IF owner = node THEN
        RAISE EXCEPTION 'object % is stored on %: its owner cannot be its light replica', object_id, node
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO lambdastore.light_replicas (object_id, node) VALUES (object_id, node) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM lambdastore._catalog_changed();
    RETURN true;
END
$fn$;

-- Stops `node` serving calls of `object_id` as a light replica; whether it did.
CREATE FUNCTION lambdastore.drop_light_replica(object_id bigint, node text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    IF object_id IS NULL OR node IS NULL THEN
        RAISE EXCEPTION 'the arguments of lambdastore.drop_light_replica may not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM lambdastore._require_coordinator('drop_light_replica');
    DELETE FROM lambdastore.light_replicas r WHERE r.object_id = drop_light_replica.object_id AND r.node = drop_light_replica.node;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM lambdastore._catalog_changed();
    RETURN true;
END
$fn$;
REVOKE ALL ON FUNCTION lambdastore.add_light_replica(bigint, text), lambdastore.drop_light_replica(bigint, text),
    lambdastore._catalog_changed() FROM PUBLIC;

-- The light replicas (citus.sql), which the gateway reads every few
-- seconds to spread an object's calls over its owner and them.
CREATE FUNCTION lambdastore_gateway.light_replicas() RETURNS TABLE (object_id bigint, node text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT r.object_id, r.node FROM lambdastore.light_replicas r ORDER BY 1, 2;
END
$$;
REVOKE ALL ON FUNCTION lambdastore_gateway.light_replicas() FROM PUBLIC;

-- The rebalancer adds and drops light replicas (issue 47): the counts
-- gain the CPU time each object's calls took and how many wrote, and the plan
-- its light-replica steps. A table function's columns cannot be replaced
-- in place.
DROP FUNCTION lambdastore.affinity(boolean);
DROP FUNCTION lambdastore._affinity_here(boolean);
-- lambdastore::cluster::affinity::_affinity_here (pgrx-generated)
CREATE FUNCTION lambdastore."_affinity_here"(
	"forget" bool /* bool */
) RETURNS TABLE (
	"object_id" bigint,  /* Option < i64 > */
	"partner" bigint,  /* Option < i64 > */
	"calls" bigint,  /* i64 */
	"cross_node" bigint,  /* Option < i64 > */
	"busy_ms" double precision,  /* Option < f64 > */
	"writes" bigint,  /* Option < i64 > */
	"window_s" double precision  /* Option < f64 > */
)
STRICT
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'affinity_here_wrapper';

-- Calls per object and between objects on every node, counted since the
-- last rebalancing run (extension/src/cluster/affinity.rs): a row with no
-- partner is the calls `object_id` received on `node`, with the CPU time
-- its top-level calls took there (`busy_ms`) and how many of those wrote
-- (`writes`); one with a partner, the nested calls `object_id`, running on
-- `node`, made to it, `cross_node` of them to an object on another node; a
-- row with no object, the calls that found the node's tables full.
-- `window_s` is the seconds since the node counted its first call.
-- `forget` clears the counts as they are read.
CREATE FUNCTION lambdastore.affinity(forget boolean DEFAULT false)
RETURNS TABLE (node text, object_id bigint, partner bigint, calls bigint, cross_node bigint,
               busy_ms double precision, writes bigint, window_s double precision)
LANGUAGE plpgsql AS $fn$
DECLARE
    failed record;
BEGIN
    IF NOT lambdastore._distributed() THEN
        RETURN QUERY SELECT 'local'::text, a.* FROM lambdastore._affinity_here(forget) a;
        RETURN;
    END IF;
    -- As Citus' own citus_stat_tenants gathers its per-node counts.
    CREATE TEMP TABLE lambdastore_affinity ON COMMIT DROP AS
    SELECT * FROM run_command_on_all_nodes(
        format('SELECT coalesce(jsonb_agg(a), ''[]'') FROM lambdastore._affinity_here(%L) a', forget));
    SELECT * INTO failed FROM lambdastore_affinity WHERE NOT success LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'reading the call counts of node % failed: %', failed.nodeid, failed.result
            USING ERRCODE = '08006';
    END IF;
    RETURN QUERY
    SELECT n.nodename || ':' || n.nodeport, a.*
      FROM lambdastore_affinity r JOIN pg_dist_node n USING (nodeid),
           jsonb_to_recordset(r.result::jsonb) AS a(object_id bigint, partner bigint, calls bigint, cross_node bigint,
                                                    busy_ms double precision, writes bigint, window_s double precision);
    DROP TABLE lambdastore_affinity;
END
$fn$;
REVOKE ALL ON FUNCTION lambdastore.affinity(boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION lambdastore._affinity_here(boolean) FROM PUBLIC;

-- The plan of a rebalancing run (core/src/cluster/rebalance.rs and
-- rebalance/replicas.rs), from the counts of every node, for the objects of `app`
-- (all if NULL) that still exist, on the nodes that hold shards, and for
-- their light replicas and those of objects that no longer exist.
CREATE OR REPLACE FUNCTION lambdastore._rebalance_plan(max_moves int, app text, forget boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    ids bigint[];
    replicated bigint[];
    still_there bigint[];
    untracked bigint;
    plan jsonb;
BEGIN
    PERFORM lambdastore._require_coordinator('rebalance');
    IF max_moves < 0 THEN
        RAISE EXCEPTION 'max_moves must not be negative, not %', max_moves USING ERRCODE = '22023';
    END IF;
    CREATE TEMP TABLE lambdastore_counts ON COMMIT DROP AS SELECT * FROM lambdastore.affinity(forget);
    SELECT coalesce(sum(calls), 0) INTO untracked FROM lambdastore_counts WHERE object_id IS NULL;
    SELECT coalesce(array_agg(r.object_id), '{}') INTO replicated FROM lambdastore.light_replicas r;
    -- Arrays, not subqueries: Citus plans no subquery that correlates a
    -- reference table with the distributed objects.
    SELECT coalesce(array_agg(o.object_id), '{}') INTO still_there FROM lambdastore.objects o
     WHERE o.object_id = ANY (replicated);
    SELECT array_agg(o.object_id) INTO ids FROM lambdastore.objects o
     WHERE (o.object_id IN (SELECT c.object_id FROM lambdastore_counts c UNION SELECT c.partner FROM lambdastore_counts c)
            OR o.object_id = ANY (replicated))
       AND (_rebalance_plan.app IS NULL OR o.app = _rebalance_plan.app);
    plan := lambdastore._plan_moves(jsonb_build_object(
        'nodes', (SELECT coalesce(jsonb_agg(nodename || ':' || nodeport ORDER BY nodeid), '[]') FROM pg_dist_node
                   WHERE shouldhaveshards AND isactive AND noderole = 'primary'),
        'objects', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                               'id', id,
                               'node', (SELECT n.nodename || ':' || n.nodeport FROM pg_dist_placement p
                                          JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'
                                         WHERE p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', id)),
                               'calls', c.calls, 'writes', c.writes, 'busy_ms', c.busy_ms)), '[]')
                      FROM unnest(ids) id,
                           LATERAL (SELECT coalesce(sum(c.calls), 0) AS calls, coalesce(sum(c.writes), 0) AS writes,
                                           coalesce(sum(c.busy_ms), 0) AS busy_ms
                                      FROM lambdastore_counts c WHERE c.object_id = id AND c.partner IS NULL) c),
        'pairs', (SELECT coalesce(jsonb_agg(jsonb_build_object('from', c.object_id, 'to', c.partner, 'calls', c.calls)), '[]')
                    FROM (SELECT c.object_id, c.partner, sum(c.calls) AS calls FROM lambdastore_counts c
                           WHERE c.object_id = ANY (ids) AND c.partner = ANY (ids) GROUP BY 1, 2) c),
        'replicas', (SELECT coalesce(jsonb_agg(jsonb_build_object('object_id', r.object_id, 'node', r.node,
                                                                  'by_rebalancer', r.by_rebalancer)
                                               ORDER BY r.added, r.node), '[]')
                       FROM lambdastore.light_replicas r
                      WHERE r.object_id = ANY (ids) OR NOT r.object_id = ANY (still_there)),
        'replica_nodes', (SELECT coalesce(jsonb_agg(nodename || ':' || nodeport ORDER BY nodeid), '[]') FROM pg_dist_node
                           WHERE isactive AND noderole = 'primary'),
        'busy_ms_by_node', (SELECT coalesce(jsonb_object_agg(b.node, b.busy_ms), '{}')
                              FROM (SELECT c.node, sum(c.busy_ms) AS busy_ms FROM lambdastore_counts c
                                     WHERE c.busy_ms IS NOT NULL GROUP BY 1) b),
        'window_s', (SELECT max(c.window_s) FROM lambdastore_counts c),
        'max_moves', max_moves));
    DROP TABLE lambdastore_counts;
    RETURN plan || jsonb_build_object('app', app, 'untracked_calls', untracked);
END
$fn$;
REVOKE ALL ON FUNCTION lambdastore._rebalance_plan(int, text, boolean) FROM PUBLIC;

-- One planned light-replica step: 'added', 'dropped', or why not.
CREATE FUNCTION lambdastore._rebalance_replica(step jsonb) RETURNS text
LANGUAGE plpgsql AS $fn$
BEGIN
    IF step->>'action' = 'add' THEN
        IF NOT lambdastore.add_light_replica((step->>'object_id')::bigint, step->>'node') THEN
            RETURN 'a replica already';  -- added by hand meanwhile: it stays one by hand
        END IF;
        UPDATE lambdastore.light_replicas r SET by_rebalancer = true
         WHERE r.object_id = (step->>'object_id')::bigint AND r.node = step->>'node';
        RETURN 'added';
    END IF;
    PERFORM lambdastore.drop_light_replica((step->>'object_id')::bigint, step->>'node');
    RETURN 'dropped';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$fn$;
REVOKE ALL ON FUNCTION lambdastore._rebalance_replica(jsonb) FROM PUBLIC;

-- Moves objects so that objects that call each other share a node and
-- load is even across nodes, and adds and drops light replicas of hot
-- objects, planned from the calls counted since the last run
-- (docs/ARCHITECTURE.md, "Rebalancing"). At most `max_moves`
-- (lambdastore.rebalance_max_moves if NULL); `app` limits it to one
-- application's objects. A dry run only returns the plan and its expected
-- effect, and forgets nothing. A real run forgets the counts (the next run
-- plans from calls made after this one) and makes each move a transaction
-- of its own, so CALL it outside a transaction block; the plan returned
-- says how each move went.
CREATE OR REPLACE PROCEDURE lambdastore.rebalance(dry_run boolean DEFAULT false, max_moves int DEFAULT NULL,
                                       app text DEFAULT NULL, INOUT plan jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
DECLARE
    step jsonb;
    done jsonb := '[]';
BEGIN
    IF NOT dry_run THEN
        COMMIT; -- here, inside a transaction block, it fails before the counts are forgotten
    END IF;
    plan := lambdastore._rebalance_plan(max_moves, app, NOT dry_run) || jsonb_build_object('dry_run', dry_run);
    IF dry_run THEN
        RETURN;
    END IF;
    COMMIT;
    FOR step IN SELECT * FROM jsonb_array_elements(plan->'moves') LOOP
        done := done || jsonb_build_array(step || jsonb_build_object('outcome', lambdastore._rebalance_move(step)));
        COMMIT;
    END LOOP;
    plan := jsonb_set(plan, '{moves}', done);
    done := '[]';
    FOR step IN SELECT * FROM jsonb_array_elements(plan->'replicas') LOOP
        done := done || jsonb_build_array(step || jsonb_build_object('outcome', lambdastore._rebalance_replica(step)));
    END LOOP;
    COMMIT;
    plan := jsonb_set(plan, '{replicas}', done);
END
$fn$;
REVOKE ALL ON PROCEDURE lambdastore.rebalance(boolean, int, text, jsonb) FROM PUBLIC;

-- An idempotency key of the wrong length: 22023, as lambdastore.submit says it.
CREATE OR REPLACE FUNCTION lambdastore._claim_idempotency_key(app text, key text, request jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    fingerprint bytea := sha256(convert_to(request::text, 'UTF8'));
    stored record;
BEGIN
    -- As lambdastore.submit says it, rather than the table's CHECK.
    IF octet_length($2) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'an idempotency key must be 1 to 255 bytes long, this one is %', octet_length($2)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO lambdastore.idempotency_keys (app, key, request) VALUES ($1, $2, fingerprint)
        ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    SELECT i.request, i.response INTO stored FROM lambdastore.idempotency_keys i WHERE i.app = $1 AND i.key = $2;
    IF stored.request <> fingerprint THEN
        RAISE EXCEPTION 'idempotency key "%" was already used for a different request', $2 USING ERRCODE = '23505';
    END IF;
    RETURN stored.response;
END
$$;

-- A NULL timeout is 22004 (it returned at once, as if it were 0).
CREATE OR REPLACE FUNCTION lambdastore.wait(id bigint, timeout interval DEFAULT '30 seconds')
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

-- versions and migrate_objects refuse an application that does not exist
-- (42704) or one the role may not see (42501), instead of answering no rows.
CREATE FUNCTION lambdastore."_check_app"(
	"app" TEXT, /* & str */
	"any_of" TEXT[] /* Vec < String > */
) RETURNS void
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_check_app_wrapper';

-- lambdastore.job reads the job as the tables' owner (extension/src/jobs/mod.rs
-- outcome): on Citus, through app_jobs, the workers' shards were read with
-- the role's rights, which an ordinary role lacks (42501).
CREATE FUNCTION lambdastore."_job"(
	"job_id" bigint /* i64 */
) RETURNS jsonb /* Option < JsonB > */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_job_wrapper';

CREATE OR REPLACE FUNCTION lambdastore.job(id bigint)
RETURNS TABLE (job_id bigint, state text, result jsonb, error text, sqlstate text, attempts int,
               submitted_at timestamptz, finished_at timestamptz)
LANGUAGE sql VOLATILE AS $$
SELECT (j->>'job_id')::bigint, j->>'state', j->'result'->0, j->>'error', j->>'sqlstate', (j->>'attempts')::int,
       (j->>'submitted_at')::timestamptz, (j->>'finished_at')::timestamptz
  FROM lambdastore._job($1) AS j
 WHERE j IS NOT NULL
$$;

-- The app_* views read the _*_all views (every application's rows, for the
-- tables' owner only), and on a Citus cluster through _visible_rows as the
-- tables' owner (views.sql, citus.sql): through the old views, Citus read
-- the workers' shards as the querying role, and an ordinary role got 42501.
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

CREATE VIEW lambdastore._schedules_all AS
SELECT s.object_id, s.name, s.app, s.method AS function, s.args, s.cron, s.time_zone, s.missed,
       s.created_by::regrole AS created_by, s.created_at, min(j.run_after) AS next_tick
  FROM lambdastore.schedules s
  LEFT JOIN lambdastore.jobs j ON j.object_id = s.object_id AND j.schedule = s.name AND j.state = 'queued'
 GROUP BY s.object_id, s.name, s.app, s.method, s.args, s.cron, s.time_zone, s.missed, s.created_by, s.created_at;

CREATE VIEW lambdastore._queue_limits_all AS
SELECT l.app, l.max_running, l.rate, l.per, l.priority FROM lambdastore.queue_limits l;

CREATE VIEW lambdastore._api_keys_all AS
SELECT k.key_id, k.app, k.label, k.prefix, k.created, k.created_by::regrole AS created_by, k.revoked
  FROM lambdastore.api_keys k;

CREATE OR REPLACE VIEW lambdastore.app_objects WITH (security_barrier) AS
SELECT o.object_id, o.app, o.type_name, o.created
  FROM lambdastore._objects_all o
 WHERE lambdastore.has_app_privilege(o.app, 'read');

CREATE OR REPLACE VIEW lambdastore.app_entries WITH (security_barrier) AS
SELECT e.object_id, e.field, e.key, e.value
  FROM lambdastore._entries_all e
 WHERE lambdastore.has_app_privilege(e.app, 'read');

CREATE OR REPLACE VIEW lambdastore.app_entry_sets WITH (security_barrier) AS
SELECT s.object_id, s.lower_field, s.lower_key
  FROM lambdastore._entry_sets_all s
 WHERE lambdastore.has_app_privilege(s.app, 'read');

CREATE OR REPLACE VIEW lambdastore.app_jobs WITH (security_barrier) AS
SELECT j.object_id, j.job_id, j.app, j.method, j.args, j.state, j.attempts, j.result, j.error, j.sqlstate,
       j.idempotency_key, j.submitted_by, j.parent_job_id, j.submitted_at, j.run_after, j.finished_at, j.timer,
       j.schedule
  FROM lambdastore._jobs_all j
 WHERE lambdastore.has_app_privilege(j.app, 'invoke') OR lambdastore.has_app_privilege(j.app, 'read');

CREATE OR REPLACE VIEW lambdastore.app_schedules WITH (security_barrier) AS
SELECT s.object_id, s.name, s.app, s.function, s.args, s.cron, s.time_zone, s.missed, s.created_by,
       s.created_at, s.next_tick
  FROM lambdastore._schedules_all s
 WHERE lambdastore.has_app_privilege(s.app, 'invoke') OR lambdastore.has_app_privilege(s.app, 'read');

CREATE OR REPLACE VIEW lambdastore.app_api_keys WITH (security_barrier) AS
SELECT k.key_id, k.app, k.label, k.prefix, k.created, k.created_by, k.revoked
  FROM lambdastore._api_keys_all k
 WHERE lambdastore.has_app_privilege(k.app, 'owner');

CREATE VIEW lambdastore._app_queue_limits WITH (security_barrier) AS
SELECT l.app, l.max_running, l.rate, l.per, l.priority
  FROM lambdastore._queue_limits_all l
 WHERE lambdastore.has_app_privilege(l.app, 'invoke') OR lambdastore.has_app_privilege(l.app, 'read');

-- Per application and function: jobs due and waiting (not running),
-- running now, done and failed, how long the oldest waiting job has been
-- due, jobs not due yet (delayed, or backing off after a conflict),
-- cancelled; then the application's queue limits, and its waiting jobs
-- held back because it runs max_running jobs (counted on one server: on a
-- Citus cluster each node applies max_running to its own jobs). 'running'
-- comes from the runners' shared memory (of every node): a claimed job is
-- only row-locked, its 'done' commits with its effects.
CREATE OR REPLACE VIEW lambdastore.queue AS
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

CREATE  FUNCTION lambdastore."_visible_rows"(
	"view" TEXT /* & str */
) RETURNS SETOF TEXT /* String */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_visible_rows_wrapper';

CREATE  FUNCTION lambdastore."_views_behind"() RETURNS TABLE (
	"name" TEXT,  /* & '_ str */
	"behind" TEXT  /* & '_ str */
)
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_views_behind_wrapper';

CREATE FUNCTION lambdastore._views_for_citus() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET citus.enable_ddl_propagation = off AS $fn$
DECLARE
    v record;
    columns text;
    failed text;
BEGIN
    FOR v IN SELECT * FROM lambdastore._views_behind()
    LOOP
        SELECT string_agg(format('r.%I', attname), ', ' ORDER BY attnum) INTO columns
          FROM pg_attribute
         WHERE attrelid = format('lambdastore.%I', v.name)::regclass AND attnum > 0 AND NOT attisdropped;
        EXECUTE format('CREATE OR REPLACE VIEW lambdastore.%I AS SELECT %s FROM lambdastore._visible_rows(%L) v, '
                       'LATERAL (SELECT (v::lambdastore.%I).*) r', v.name, columns, v.behind, v.behind);
    END LOOP;
    IF (SELECT groupid FROM pg_dist_local_group) = 0 THEN
        SELECT string_agg(format('%s:%s: %s', r.nodename, r.nodeport, r.result), '; ') INTO failed
          FROM run_command_on_workers('SELECT lambdastore._views_for_citus()') r
         WHERE NOT r.success;
        IF failed IS NOT NULL THEN
            RAISE EXCEPTION 'the app_* views could not be made on every worker: %', failed USING ERRCODE = '55000';
        END IF;
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION lambdastore._views_for_citus() FROM PUBLIC;

-- entry_sets reads as the tables' owner, on the object's node on Citus.
CREATE  FUNCTION lambdastore."_entry_sets_visible"(
	"object_id" bigint /* i64 */
) RETURNS TABLE (
	"lower_field" TEXT,  /* String */
	"lower_key" bytea,  /* Vec < u8 > */
	"version" bigint,  /* i64 */
	"conflicts" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_entry_sets_visible_wrapper';

CREATE OR REPLACE FUNCTION lambdastore.entry_sets(object_id bigint)
RETURNS TABLE (lower_field text, lower_key bytea, version bigint, conflicts bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM lambdastore._entry_sets_visible($1)
$$;

-- The server whose role OIDs the tables hold (schema.sql): this one, for a
-- database made here; a dump restored from elsewhere adds the other's.
CREATE TABLE lambdastore.roles_from (
    system_identifier bigint NOT NULL
);
INSERT INTO lambdastore.roles_from SELECT system_identifier FROM pg_catalog.pg_control_system();
SELECT pg_catalog.pg_extension_config_dump('lambdastore.roles_from', '');
REVOKE ALL ON lambdastore.roles_from FROM PUBLIC;

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

-- Internal helpers that answered a bare error or a wrong value (a sweep):
-- _coordinator() without Citus (42P01), purge_idempotency_keys(NULL) (0).
CREATE OR REPLACE FUNCTION lambdastore._coordinator() RETURNS boolean LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    -- Its own statement: without Citus pg_dist_local_group does not exist
    -- (a bare 42P01 from anyone who called it).
    IF NOT lambdastore._distributed() THEN
        RETURN false;
    END IF;
    RETURN (SELECT groupid FROM pg_dist_local_group) = 0;
END
$fn$;
CREATE OR REPLACE FUNCTION lambdastore.purge_idempotency_keys(older_than interval DEFAULT '24 hours') RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    gone bigint;
BEGIN
    IF $1 IS NULL THEN -- it purged nothing and said 0
        RAISE EXCEPTION 'older_than may not be NULL' USING ERRCODE = '22004';
    END IF;
    DELETE FROM lambdastore.idempotency_keys WHERE created < now() - $1;
    GET DIAGNOSTICS gone = ROW_COUNT;
    RETURN gone;
END
$$;
