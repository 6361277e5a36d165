-- Scale-out on Citus (docs/ARCHITECTURE.md, "On a Citus cluster").

-- Every object migration (lambdastore.migrate_object): a log, and the
-- fence that keeps calls and migrations apart. A migration locks this
-- table exclusively on every node (Citus sends a LOCK of a reference
-- table to each node, on the connection that later changes the node's
-- metadata, so the lock ends there when the new metadata commits); every
-- transaction using objects holds it in row-share mode on the nodes it
-- uses them on (catalog/shards.rs, `fence`). A reference table once
-- distributed.
CREATE TABLE lambdastore.migrations (
    migrated   timestamptz NOT NULL DEFAULT now(),
    object_id  bigint NOT NULL,
    shard      bigint NOT NULL,      -- the objects shard it moved with
    source     text NOT NULL,        -- host:port
    target     text NOT NULL,
    isolated   boolean NOT NULL,     -- whether it was split off into that shard first
    reason     text NOT NULL         -- 'manual' or what lambdastore.rebalance() planned
);
SELECT pg_catalog.pg_extension_config_dump('lambdastore.migrations', '');  -- kept by pg_dump (schema.sql)
-- No key: a whole row identifies it, for Citus' logical replication of
-- reference tables to a node added later (replicate_reference_tables).
ALTER TABLE lambdastore.migrations REPLICA IDENTITY FULL;

-- Light replicas (lambdastore.add_light_replica): nodes that run calls of
-- an object they do not store, on a copy of its entries, and have its
-- owner validate and apply what each call read and wrote
-- (cluster/replica.rs). A reference table once distributed, so that each
-- node knows which objects it serves without asking.
CREATE TABLE lambdastore.light_replicas (
    object_id  bigint NOT NULL,
    node       text NOT NULL,        -- host:port
    added      timestamptz NOT NULL DEFAULT now(),
    -- Added by a rebalancing run: only those does one drop as the load
    -- falls; one added by hand stays until dropped by hand.
    by_rebalancer boolean NOT NULL DEFAULT false,
    PRIMARY KEY (object_id, node)
);
SELECT pg_catalog.pg_extension_config_dump('lambdastore.light_replicas', '');

-- Distributes the catalog, on the coordinator of a Citus cluster whose
-- workers have been added: the per-object tables (objects, entries,
-- entry_sets, jobs, schedules) hash-distributed by object id and colocated, so that an
-- object's rows are on one node; the application tables as reference
-- tables, with a copy on every node. Idempotent.
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

-- The app_* views (views.sql) on a Citus cluster: each reads its rows
-- through lambdastore._visible_rows, as the tables' owner, from the _*_all
-- view behind it (each row as the text of its composite type: exact, SQL
-- NULL apart from JSON null), with the columns it has on one server (Citus
-- would read the workers' shards as the querying role, which may not read
-- them: every view failed with 42501 for an ordinary role). On every node,
-- for roles connected to a worker too (where Citus refuses a view's DDL it
-- would propagate); by distribute(), at each call.
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

CREATE FUNCTION lambdastore.distribute(shard_count int DEFAULT 32) RETURNS text
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
REVOKE ALL ON FUNCTION lambdastore.distribute(int) FROM PUBLIC;

-- Every node's copy of the extension's sequences past the ids the tables
-- hold, for distribute() after a restore (README "Backup and restore"):
-- the restored rows carry ids drawn on the old cluster's nodes, where an
-- object or job id has the drawing node's group in its top 16 bits
-- (catalog/shards.rs, unique), while every node's copy of a sequence in a
-- new database starts at 1, so a worker's first new object collided with
-- a restored one (23505). Past the largest id of any group: the new
-- cluster's groups need not be the old one's.
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

-- Run on the node holding the object, for a call forwarded by another
-- node (forward.rs): they trust the role they are given, so only
-- superusers (the forwarding node connects as one) may call them.
REVOKE ALL ON FUNCTION lambdastore._call_here(bigint, text, text, text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lambdastore._spawn_here(bigint, text, text, text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lambdastore._submit_here(bigint, text, text, text, text, bigint, text, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lambdastore._delete_here(bigint, text, text, text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lambdastore._validate_here() FROM PUBLIC;
REVOKE ALL ON FUNCTION lambdastore._split_here(bigint, text, text, text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lambdastore._map_here(bigint, text, text, text, bigint, text) FROM PUBLIC;

-- Whether the catalog is distributed: Citus is there and distribute() ran.
-- (PL/pgSQL: Citus' tables are looked up only when it runs.)
CREATE FUNCTION lambdastore._distributed() RETURNS boolean LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'lambdastore.objects'::regclass);
END
$fn$;

-- Whether this node is the coordinator of a distributed catalog.
CREATE FUNCTION lambdastore._coordinator() RETURNS boolean LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    -- Its own statement: without Citus pg_dist_local_group does not exist
    -- (a bare 42P01 from anyone who called it).
    IF NOT lambdastore._distributed() THEN
        RETURN false;
    END IF;
    RETURN (SELECT groupid FROM pg_dist_local_group) = 0;
END
$fn$;

-- Refuses `what` (55000) anywhere but there.
CREATE FUNCTION lambdastore._require_coordinator(what text) RETURNS void LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    IF NOT lambdastore._distributed() THEN
        RAISE EXCEPTION 'lambdastore.%() needs a distributed catalog', what
            USING ERRCODE = '55000', HINT = 'Run SELECT lambdastore.distribute() on the coordinator first.';
    END IF;
    IF NOT lambdastore._coordinator() THEN
        RAISE EXCEPTION 'lambdastore.%() runs on the coordinator', what USING ERRCODE = '55000';
    END IF;
END
$fn$;

-- Moves an object to `node` (host:port, as in pg_dist_node), on the
-- coordinator: isolates it into a shard of its own, with its rows of every
-- colocated table (Citus' tenant isolation), and moves that shard. Calls
-- keep working meanwhile: the migration waits for the transactions using
-- objects, and calls wait for it (or fail with 40001 to be retried) and
-- then follow the object (docs/ARCHITECTURE.md, "Moving objects").
-- Objects whose ids hash alike share the isolated shard and move along.
-- Migrations queue behind each other and behind Citus' own shard
-- operations on these tables. Logged in lambdastore.migrations.
CREATE FUNCTION lambdastore.migrate_object(object_id bigint, node text,
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
REVOKE ALL ON FUNCTION lambdastore.migrate_object(bigint, text, text, text) FROM PUBLIC;

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
REVOKE ALL ON FUNCTION lambdastore._hold_shard_operations() FROM PUBLIC;

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
CREATE FUNCTION lambdastore._rebalance_plan(max_moves int, app text, forget boolean)
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
REVOKE ALL ON FUNCTION lambdastore._plan_moves(jsonb) FROM PUBLIC;

-- One planned move, in the caller's transaction (Citus isolates a tenant
-- only as the first change of a transaction): 'moved', or why not
-- ('SQLSTATE: message'), so that one object deleted or one node down
-- meanwhile does not end the run.
CREATE FUNCTION lambdastore._rebalance_move(step jsonb) RETURNS text
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM lambdastore.migrate_object((step->>'object_id')::bigint, step->>'to', 'block_writes',
                                       'rebalance: ' || (step->>'reason'));
    RETURN 'moved';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$fn$;
REVOKE ALL ON FUNCTION lambdastore._rebalance_move(jsonb) FROM PUBLIC;

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
CREATE PROCEDURE lambdastore.rebalance(dry_run boolean DEFAULT false, max_moves int DEFAULT NULL,
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
