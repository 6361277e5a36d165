-- The HTTP gateway's side of the database: API keys, idempotency keys and
-- the schema lambdastore_gateway, the only thing the gateway's role may use.
--
-- Every function in lambdastore_gateway takes the caller's API key, hashes
-- it and finds its application; a request may only touch that application.
-- They are SECURITY DEFINER (owned by the role that created the extension),
-- so the gateway's role needs no privilege on any table: a stolen gateway
-- password reaches only applications whose keys the thief also has.

-- API keys: an application's credentials at the gateway. Only a SHA-256 of
-- the key is kept (the keys are 244 random bits, so a fast hash is enough).
CREATE TABLE lambdastore.api_keys (
    key_id      bigserial PRIMARY KEY,
    app         text NOT NULL REFERENCES lambdastore.applications(name) ON DELETE CASCADE,
    label       text,
    sha256      bytea NOT NULL UNIQUE,
    prefix      text NOT NULL,              -- the key's first 12 characters, to recognise it
    created     timestamptz NOT NULL DEFAULT now(),
    created_by  oid NOT NULL,                -- the role that created it
    revoked     timestamptz                 -- set by revoke_api_key; the row stays for audit
);

-- Responses of calls made with an Idempotency-Key, written in the same
-- transaction as the call's effects: the key is claimed (inserted) before
-- the call runs, so a concurrent duplicate waits on the row and then reads
-- the response; if the call fails, the claim rolls back with its effects.
CREATE TABLE lambdastore.idempotency_keys (
    app       text NOT NULL,
    key       text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    request   bytea NOT NULL,               -- SHA-256 of the request: a reuse must be the same call
    response  jsonb,
    created   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (app, key)
);
CREATE INDEX idempotency_keys_by_age ON lambdastore.idempotency_keys (created);

-- Kept by pg_dump (see schema.sql).
SELECT pg_catalog.pg_extension_config_dump('lambdastore.api_keys', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.api_keys_key_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('lambdastore.idempotency_keys', '');

-- lambdastore.create_api_key(app, label) and lambdastore.revoke_api_key(key_id)
-- are in Rust (api/mod.rs): they check the caller against the
-- application's owner, which a SECURITY DEFINER function here could not see.

-- Forgets idempotency keys older than `older_than`; returns how many. The
-- gateway calls it periodically (--idempotency-ttl). This and the functions
-- below that read the tables are PL/pgSQL: on a Citus cluster the tables
-- are distributed, and Citus cannot plan an SQL function's parameters.
CREATE FUNCTION lambdastore.purge_idempotency_keys(older_than interval DEFAULT '24 hours') RETURNS bigint
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


-- Helpers of the gateway's functions, in the lambdastore schema so that
-- the gateway's role (which may only use lambdastore_gateway) cannot call
-- them directly. They run with the privileges of the functions calling them.

-- The application of a valid, unrevoked key, or 28000, is
-- lambdastore._api_key_app(api_key) (Rust, api/mod.rs: a key seen before
-- is remembered by the backend until the catalog changes, as a revocation
-- does).

-- `app`, if the key is valid (28000) and belongs to it (42501). Every
-- comparison here fails closed: a NULL key is 28000 (_api_key_app is not
-- strict), a NULL anywhere else 22004 (_no_nulls).
CREATE FUNCTION lambdastore._check_key_app(api_key text, app text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF lambdastore._api_key_app($1) IS DISTINCT FROM $2 THEN
        RAISE EXCEPTION 'the API key does not belong to application "%"', $2 USING ERRCODE = '42501';
    END IF;
    RETURN $2;
END
$$;

-- 22004 when `nulls` (num_nulls of a gateway function's required
-- arguments) is not 0: a NULL must never reach a check as "unknown".
CREATE FUNCTION lambdastore._no_nulls(function text, nulls int) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF nulls IS DISTINCT FROM 0 THEN
        RAISE EXCEPTION 'the arguments of lambdastore_gateway.% may not be NULL', function USING ERRCODE = '22004';
    END IF;
END
$$;

-- The key's application, if the object or job (`kind`) `id` exists (42704)
-- and is that application's (42501). The owner is read by a statement of
-- its own: on a Citus cluster, a statement that reads one shard is sent to
-- that shard's node whole, and reading api_keys there (through Citus, from
-- inside a shard's query) is refused.
CREATE FUNCTION lambdastore._check_key_owns(api_key text, kind text, id bigint) RETURNS text
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

-- Claims an idempotency key for `request`, or returns the response stored
-- under it. NULL means "claimed: make the call and store its response" (_call).
-- A concurrent claim of the same key waits here until the first commits
-- (then reads its response) or rolls back (then claims the key itself).
CREATE FUNCTION lambdastore._claim_idempotency_key(app text, key text, request jsonb) RETURNS jsonb
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

-- Makes the call `request` describes (['invoke', object, method, args],
-- ['create', type, args] or ['static', type, function, args]) for `app`.
-- With an idempotency key, the key is claimed first and the response
-- stored after, in this transaction; an earlier identical request's stored
-- response is returned instead (replayed).
CREATE FUNCTION lambdastore._call(app text, idempotency_key text, request jsonb)
RETURNS TABLE (result jsonb, replayed boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF $2 IS NOT NULL THEN
        result := lambdastore._claim_idempotency_key($1, $2, $3);
        IF result IS NOT NULL THEN
            replayed := true;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    result := CASE $3->>0
        WHEN 'invoke' THEN lambdastore._invoke_for($1, ($3->>1)::bigint, $3->>2, $3->3)
        WHEN 'create' THEN to_jsonb(lambdastore.create_object($1, $3->>1, $3->2))
        WHEN 'static' THEN lambdastore.invoke_static($1, $3->>1, $3->>2, $3->3)
    END;
    IF $2 IS NOT NULL THEN
        UPDATE lambdastore.idempotency_keys i SET response = result WHERE i.app = $1 AND i.key = $2;
    END IF;
    replayed := false;
    RETURN NEXT;
END
$$;


-- What the gateway's role may call. SECURITY DEFINER, with a fixed
-- search_path; each function checks the key before anything else.
-- Calls that take an idempotency key return (result, replayed): with a key
-- already used for the same request, the stored result and true.
CREATE SCHEMA lambdastore_gateway;

-- Runs a method of one of the key's application's objects. PL/pgSQL, not
-- SQL: an SQL function that is SECURITY DEFINER is never inlined, so it
-- was parsed and planned again on every call (a quarter of the backend's
-- time per call under the gateway's load, docs/PERFORMANCE.md); PL/pgSQL
-- keeps its plans for the session. Without an idempotency key the method
-- is called here, without _call's request array. Whether the object is
-- the key's application's is checked by _invoke_for (Rust, api/mod.rs)
-- where the call reads the object anyway.
--
-- Each function checks the key first (28000 for a NULL one too), then
-- that no required argument is NULL (22004); the idempotency key alone
-- may be NULL.
CREATE FUNCTION lambdastore_gateway.invoke(api_key text, object_id bigint, method text, args jsonb,
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

-- Creates an object of one of the application's types; result is its id.
CREATE FUNCTION lambdastore_gateway.create_object(api_key text, app text, type_name text, args jsonb,
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

-- Runs a static function of one of the application's types.
CREATE FUNCTION lambdastore_gateway.invoke_static(api_key text, app text, type_name text, function text,
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

-- Deploys a new version of the application's code, as the role that
-- created the key: its right to deploy is checked as for its own deploy
-- from SQL (api/deploy.rs, claim).
CREATE FUNCTION lambdastore_gateway.deploy(api_key text, app text, module bytea) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('deploy', num_nulls($2, $3));
    RETURN lambdastore._deploy_for_key($1, $2, $3);
END
$$;

-- Queues a job; the idempotency key is the job's own (lambdastore.submit).
CREATE FUNCTION lambdastore_gateway.submit(api_key text, object_id bigint, method text, args jsonb,
                                           idempotency_key text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('submit', num_nulls($2, $3, $4));
    PERFORM lambdastore._check_key_owns($1, 'object', $2);
    RETURN lambdastore.submit($2, $3, $4, $5);
END
$$;

-- Only whether the key is valid (28000 if not): the gateway asks before it
-- reads a large body, so that a request with a made-up key costs little.
CREATE FUNCTION lambdastore_gateway.check_key(api_key text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
END
$$;

-- A job of the key's application as JSON (lambdastore.job's columns).
CREATE FUNCTION lambdastore_gateway.job(api_key text, job_id bigint) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('job', num_nulls($2));
    PERFORM lambdastore._check_key_owns($1, 'job', $2);
    RETURN (SELECT to_jsonb(j) FROM lambdastore.job($2) j);
END
$$;

-- Waits up to `timeout_ms` for a job to finish, then returns it as job() does.
CREATE FUNCTION lambdastore_gateway.wait(api_key text, job_id bigint, timeout_ms bigint) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._api_key_app($1);
    PERFORM lambdastore._no_nulls('wait', num_nulls($2, $3));
    PERFORM lambdastore._check_key_owns($1, 'job', $2);
    RETURN (SELECT to_jsonb(j) FROM lambdastore.wait($2, make_interval(secs => greatest($3, 0) / 1000.0)) j);
END
$$;

-- Whether this node stores the object's shard: asked after each call the
-- gateway routed by its copy of Citus' metadata, which a move makes stale.
CREATE FUNCTION lambdastore_gateway.holds(object_id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._no_nulls('holds', num_nulls($1));
    RETURN lambdastore.holds($1);
END
$$;

-- The light replicas (citus.sql), which the gateway reads every few
-- seconds to spread an object's calls over its owner and them.
CREATE FUNCTION lambdastore_gateway.light_replicas() RETURNS TABLE (object_id bigint, node text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT r.object_id, r.node FROM lambdastore.light_replicas r ORDER BY 1, 2;
END
$$;

-- For /readyz: the extension's version (the role may use the gateway's functions).
CREATE FUNCTION lambdastore_gateway.ready() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT extversion FROM pg_extension WHERE extname = 'lambdastore'
$$;

CREATE FUNCTION lambdastore_gateway.purge_idempotency_keys(older_than interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lambdastore._no_nulls('purge_idempotency_keys', num_nulls($1));
    RETURN lambdastore.purge_idempotency_keys($1);
END
$$;

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

-- Only roles granted it may call the gateway's functions (the README's
-- "HTTP gateway" section shows the role to create).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA lambdastore_gateway FROM PUBLIC;
-- The helpers above run only inside the gateway's SECURITY DEFINER
-- functions; purging every application's idempotency keys is the
-- gateway's (or a superuser's) business.
REVOKE ALL ON FUNCTION lambdastore._check_key_app(text, text), lambdastore._no_nulls(text, int),
    lambdastore._check_key_owns(text, text, bigint), lambdastore._claim_idempotency_key(text, text, jsonb),
    lambdastore._call(text, text, jsonb), lambdastore.purge_idempotency_keys(interval) FROM PUBLIC;
