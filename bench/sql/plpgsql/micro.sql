-- The `micro` application's benchmark functions as stored procedures: the
-- baseline a PL/pgSQL author would write against the same rows the lambdas
-- use (lambdastore.entries of a `Bench` object), for the rw-mix and
-- job-length workloads. Idempotent: rerunning replaces the functions.
--
-- These functions bypass LambdaStore's concurrency control (entry-set
-- versions): they rely on PostgreSQL's row locks alone. Run them against
-- objects that no lambda touches at the same time.

CREATE SCHEMA IF NOT EXISTS bench_plpgsql;

-- digest(bytea, 'sha512') for `hash`.
CREATE EXTENSION IF NOT EXISTS pgcrypto;

-- Bench.touch(keys, write): reads the entries `keys` of the map `data` and,
-- if `write`, overwrites each with a new 1 KiB printable JSON string
-- (inserting it if it was missing, as the lambda's Map::insert does);
-- returns how many of `keys` existed, counting a repeated key once per
-- occurrence like the lambda (a repeat sees this call's own write).
--
-- Map<u32, _> keys are 4-byte big-endian, which int4send is for 0..2^31-1.
-- The new value is one random md5 hex string repeated 32 times: 1024
-- printable characters, a 1026-byte JSON string, made as the lambda makes
-- its own (32 characters drawn from another generator, repeated 32 times;
-- only the length and alphabet matter here).
CREATE OR REPLACE FUNCTION bench_plpgsql.touch(object_id bigint, keys int[], write boolean)
RETURNS int
LANGUAGE plpgsql STRICT AS $$
DECLARE
    k int;
    v bytea;
    found_count int := 0;
BEGIN
    -- In key order, so that concurrent writers lock the rows in one order
    -- and never deadlock; the count does not depend on the order.
    FOREACH k IN ARRAY (SELECT coalesce(array_agg(x ORDER BY x), '{}') FROM unnest(keys) x) LOOP
        SELECT e.value INTO v
          FROM lambdastore.entries e
         WHERE e.object_id = touch.object_id AND e.field = 'data' AND e.key = int4send(k);
        IF FOUND THEN
            found_count := found_count + 1;
        END IF;
        IF write THEN
            INSERT INTO lambdastore.entries AS e (object_id, field, key, value)
            VALUES (touch.object_id, 'data', int4send(k),
                    convert_to('"' || repeat(md5(random()::text), 32) || '"', 'UTF8'))
            ON CONFLICT ON CONSTRAINT entries_pkey DO UPDATE SET value = EXCLUDED.value;
        END IF;
    END LOOP;
    RETURN found_count;
END
$$;

-- Bench.hash(n): n chained rounds of SHA-512 over a 1 KiB zero buffer, each
-- digest overwriting the buffer's first 64 bytes; the hex of the last
-- digest (n = 0: the initial all-zero digest, 128 zeros). Needs no object.
CREATE OR REPLACE FUNCTION bench_plpgsql.hash(n int)
RETURNS text
LANGUAGE plpgsql STRICT AS $$
DECLARE
    buffer bytea := decode(repeat('00', 1024), 'hex');
    last bytea := decode(repeat('00', 64), 'hex');
BEGIN
    IF n < 0 THEN
        RAISE EXCEPTION 'n must be at least 0, got %', n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 1 .. n LOOP
        last := digest(buffer, 'sha512');
        buffer := overlay(buffer PLACING last FROM 1 FOR 64);
    END LOOP;
    RETURN encode(last, 'hex');
END
$$;
