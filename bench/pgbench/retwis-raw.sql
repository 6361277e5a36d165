-- Retwis in raw SQL (bench/sql/raw/retwis_*.sql with the parameters inlined).
-- A random user of first_user..last_user reads the 50 newest posts of their
-- timeline (90%) or posts (10%):
--   pgbench -n -f bench/pgbench/retwis-raw.sql -D first_user=FIRST -D last_user=LAST ...
\set uid random(:first_user, :last_user)
\set r random(1, 100)
\if :r <= 90
SELECT coalesce(jsonb_agg(convert_from(t.value, 'UTF8')::jsonb ORDER BY t.key DESC), '[]'::jsonb)
  FROM (SELECT e.key, e.value
          FROM lambdastore.entries e
         WHERE e.object_id = :uid::bigint AND e.field = 'timeline'
         ORDER BY e.key DESC
         LIMIT 50) t;
\else
WITH counter AS (
    INSERT INTO lambdastore.entries AS e (object_id, field, key, value)
    VALUES (:uid::bigint, 'post_count', '', '1')
    ON CONFLICT (object_id, field, key) DO UPDATE
        SET value = convert_to((convert_from(e.value, 'UTF8')::bigint + 1)::text, 'UTF8')
    RETURNING convert_from(e.value, 'UTF8')::bigint AS id
), post AS (
    SELECT c.id,
           int8send(c.id) AS post_key,
           int8send(clock.micros # (1::bigint << 63)) || int8send(:uid::bigint # (1::bigint << 63))
               || int8send(c.id) AS timeline_key,
           convert_to(jsonb_build_object('author', :uid::bigint, 'id', c.id, 'at', clock.micros,
                                         'text', 'Just setting up my retwis: a benchmark post of about the length of a typical tweet, the same text every time.'::text)::text, 'UTF8') AS value
      FROM counter c,
           (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS micros) clock
), inserted AS (
    INSERT INTO lambdastore.entries (object_id, field, key, value)
    SELECT :uid::bigint, 'posts', p.post_key, p.value FROM post p
    UNION ALL
    SELECT reader.id, 'timeline', p.timeline_key, p.value
      FROM post p,
           (SELECT :uid::bigint AS id
            UNION ALL
            SELECT ('x' || encode(f.key, 'hex'))::bit(64)::bigint # (1::bigint << 63)
              FROM lambdastore.entries f
             WHERE f.object_id = :uid::bigint AND f.field = 'followers') reader
)
SELECT id FROM post;
\endif
