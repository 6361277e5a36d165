-- Retwis create_post as one statement: user $1 (bigint) posts $2 (text);
-- returns the post id. Layout: bench/sql/plpgsql/retwis.sql.
-- The upsert of post_count locks the author's counter row, so concurrent
-- posts by one author get consecutive ids at READ COMMITTED without retries;
-- then one INSERT writes the post to the author's posts, the author's
-- timeline and every follower's timeline. (Data-modifying CTEs run exactly
-- once, and `post`, read twice, is computed once: one clock reading.)
WITH counter AS (
    INSERT INTO lambdastore.entries AS e (object_id, field, key, value)
    VALUES ($1::bigint, 'post_count', '', '1')
    ON CONFLICT (object_id, field, key) DO UPDATE
        SET value = convert_to((convert_from(e.value, 'UTF8')::bigint + 1)::text, 'UTF8')
    RETURNING convert_from(e.value, 'UTF8')::bigint AS id
), post AS (
    SELECT c.id,
           int8send(c.id) AS post_key,
           int8send(clock.micros # (1::bigint << 63)) || int8send($1::bigint # (1::bigint << 63))
               || int8send(c.id) AS timeline_key,
           convert_to(jsonb_build_object('author', $1::bigint, 'id', c.id, 'at', clock.micros,
                                         'text', $2::text)::text, 'UTF8') AS value
      FROM counter c,
           (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS micros) clock
), inserted AS (
    INSERT INTO lambdastore.entries (object_id, field, key, value)
    SELECT $1::bigint, 'posts', p.post_key, p.value FROM post p
    UNION ALL
    SELECT reader.id, 'timeline', p.timeline_key, p.value
      FROM post p,
           (SELECT $1::bigint AS id
            UNION ALL
            SELECT ('x' || encode(f.key, 'hex'))::bit(64)::bigint # (1::bigint << 63)
              FROM lambdastore.entries f
             WHERE f.object_id = $1::bigint AND f.field = 'followers') reader
)
SELECT id FROM post
