-- Retwis get_timeline as one statement: the newest $2 posts of user $1's
-- timeline, newest first, as one jsonb array (what User.get_timeline
-- returns). Layout: bench/sql/plpgsql/retwis.sql. $1 bigint, $2 int.
SELECT coalesce(jsonb_agg(convert_from(t.value, 'UTF8')::jsonb ORDER BY t.key DESC), '[]'::jsonb)
  FROM (SELECT e.key, e.value
          FROM lambdastore.entries e
         WHERE e.object_id = $1::bigint AND e.field = 'timeline'
         ORDER BY e.key DESC
         LIMIT $2::int) t
