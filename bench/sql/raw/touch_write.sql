-- rw-mix write (Bench.touch(keys, true)): overwrites the keys $2 of the map
-- `data` of the Bench object $1 with new 1 KiB printable JSON strings (a
-- random md5 hex string repeated 32 times, between quotes, 1026 bytes) in
-- one UPDATE; yields how many of the keys existed.
--   $1 bigint  the object id
--   $2 int[]   the keys (0..99), encoded here with int4send (the SDK's
--              4-byte big-endian u32 key for 0..2^31-1)
-- Unlike the lambda, a missing key is not inserted (a Bench object has all
-- of 0..99). A repeated key is written once and counted once per
-- occurrence, as in the lambda.
--
-- `locked` takes the row locks in key order first: the UPDATE alone locks
-- in its scan's order, which for a bitmap heap scan is the physical order
-- of the row versions it saw, and two writers that saw different versions
-- could deadlock.
WITH locked AS (
    SELECT e.key
      FROM lambdastore.entries e
     WHERE e.object_id = $1::bigint AND e.field = 'data'
       AND e.key = ANY (ARRAY(SELECT int4send(k) FROM unnest($2::int[]) AS k))
     ORDER BY e.key
       FOR UPDATE
), written AS (
    UPDATE lambdastore.entries e
       SET value = convert_to('"' || repeat(md5(random()::text), 32) || '"', 'UTF8')
      FROM locked l
     WHERE e.object_id = $1::bigint AND e.field = 'data' AND e.key = l.key
 RETURNING e.key
)
SELECT count(*)::int AS found
  FROM unnest($2::int[]) AS k
  JOIN written w ON w.key = int4send(k);
