-- rw-mix read (Bench.touch(keys, false)): how many of the keys $2 exist in
-- the map `data` of the Bench object $1, reading their values.
--   $1 bigint  the object id
--   $2 int[]   the keys (0..99), encoded here: int4send is the SDK's
--              4-byte big-endian u32 key for 0..2^31-1
-- A repeated key counts once per occurrence, as in the lambda.
SELECT count(e.value)::int AS found
  FROM unnest($2::int[]) AS k
  JOIN lambdastore.entries e
    ON e.object_id = $1::bigint AND e.field = 'data' AND e.key = int4send(k);
