-- rw-mix as raw SQL, one statement per transaction: bench/sql/raw/
-- touch_read.sql or touch_write.sql with $1 = :object and $2 = the keys
-- (keep them in sync). 5 distinct random keys of a random Bench object,
-- writing in write_percent% of the transactions. Row locks taken in key
-- order: no deadlocks, nothing to retry (the report should show 0 retries).
--
--   pgbench -n -M prepared -c 4 -j 4 -T 5 --max-tries=0 \
--     -D first_object=ID -D objects=N -D write_percent=P \
--     -f bench/pgbench/rw-mix-raw.sql "$URL"
--
-- first_object .. first_object+objects-1 must all be Bench objects.

\set object random(:first_object, :first_object + :objects - 1)
-- Floyd's sampling: a uniformly random set of 5 distinct keys of 0..99.
\set k1 random(0, 95)
\set t random(0, 96)
\set k2 case when :t = :k1 then 96 else :t end
\set t random(0, 97)
\set k3 case when :t = :k1 or :t = :k2 then 97 else :t end
\set t random(0, 98)
\set k4 case when :t = :k1 or :t = :k2 or :t = :k3 then 98 else :t end
\set t random(0, 99)
\set k5 case when :t = :k1 or :t = :k2 or :t = :k3 or :t = :k4 then 99 else :t end
\if random(1, 100) <= :write_percent
WITH locked AS (
    SELECT e.key
      FROM lambdastore.entries e
     WHERE e.object_id = :object::bigint AND e.field = 'data'
       AND e.key = ANY (ARRAY(SELECT int4send(k) FROM unnest(ARRAY[:k1::int, :k2::int, :k3::int, :k4::int, :k5::int]) AS k))
     ORDER BY e.key
       FOR UPDATE
), written AS (
    UPDATE lambdastore.entries e
       SET value = convert_to('"' || repeat(md5(random()::text), 32) || '"', 'UTF8')
      FROM locked l
     WHERE e.object_id = :object::bigint AND e.field = 'data' AND e.key = l.key
 RETURNING e.key
)
SELECT count(*)::int AS found
  FROM unnest(ARRAY[:k1::int, :k2::int, :k3::int, :k4::int, :k5::int]) AS k
  JOIN written w ON w.key = int4send(k);
\else
SELECT count(e.value)::int AS found
  FROM unnest(ARRAY[:k1::int, :k2::int, :k3::int, :k4::int, :k5::int]) AS k
  JOIN lambdastore.entries e
    ON e.object_id = :object::bigint AND e.field = 'data' AND e.key = int4send(k);
\endif
