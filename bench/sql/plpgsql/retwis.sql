-- Retwis in PL/pgSQL: the baseline for the `retwis` lambdas
-- (guest-sdk/examples/retwis). The functions read and write the same rows of
-- lambdastore.entries as the lambdas, in the SDK's encodings, so the
-- lambdas and these functions can be run on the same objects and compared:
--
--   field        key                                        value (JSON, UTF-8)
--   post_count   '' (a cell)                                the last post id
--   followers    follower id: i64 big-endian, sign flipped  '' (a set)
--   posts        post id: u64 big-endian                    {"author", "id", "at", "text"}
--   timeline     (at, author, post id): 3 x 8 bytes         {"author", "id", "at", "text"}
--
-- i64 keys are the big-endian bytes of `v # sign_bit` (int8send), so that
-- bytea order is numeric order. Post ids count 1, 2, ... per author.
--
-- Unlike lambda_invoke, these functions do not take part in LambdaStore's
-- concurrency control (no entry-set versions are read or bumped): they are
-- correct among themselves at READ COMMITTED, not when run concurrently
-- with lambdas writing the same objects.

CREATE SCHEMA IF NOT EXISTS bench_plpgsql;

-- The newest `lim` posts of the user's timeline, newest first, as
-- User.get_timeline returns them. One statement, so one snapshot.
CREATE OR REPLACE FUNCTION bench_plpgsql.retwis_get_timeline(user_id bigint, lim int DEFAULT 50)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT coalesce(jsonb_agg(convert_from(t.value, 'UTF8')::jsonb ORDER BY t.key DESC), '[]')
          FROM (SELECT e.key, e.value
                  FROM lambdastore.entries e
                 WHERE e.object_id = user_id AND e.field = 'timeline'
                 ORDER BY e.key DESC
                 LIMIT coalesce(lim, 50)) t);
END
$$;

-- Posts `post_text` as User.create_post does: the next post id, the post in
-- the author's posts and timeline and in every follower's timeline; returns
-- the post id.
--
-- Concurrent posts by one author serialize on the post_count row: the
-- upsert locks it, and at READ COMMITTED a waiting upsert re-reads the
-- committed count, so ids never repeat and no caller has to retry. Timeline
-- keys contain (author, post id), so the inserts never collide.
CREATE OR REPLACE FUNCTION bench_plpgsql.retwis_create_post(user_id bigint, post_text text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    sign_bit constant bigint := -9223372036854775808;
    -- The host's clock (GetCurrentTimestamp), in Unix microseconds.
    now_micros constant bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    post_id bigint;
    post bytea;
    timeline_key bytea;
BEGIN
    INSERT INTO lambdastore.entries AS e (object_id, field, key, value)
    VALUES (user_id, 'post_count', '', '1')
    ON CONFLICT (object_id, field, key) DO UPDATE
        SET value = convert_to((convert_from(e.value, 'UTF8')::bigint + 1)::text, 'UTF8')
    RETURNING convert_from(e.value, 'UTF8')::bigint INTO post_id;

    post := convert_to(jsonb_build_object('author', user_id, 'id', post_id, 'at', now_micros,
                                          'text', post_text)::text, 'UTF8');
    timeline_key := int8send(now_micros # sign_bit) || int8send(user_id # sign_bit) || int8send(post_id);

    INSERT INTO lambdastore.entries (object_id, field, key, value)
    SELECT user_id, 'posts', int8send(post_id), post
    UNION ALL
    SELECT user_id, 'timeline', timeline_key, post
    UNION ALL
    SELECT ('x' || encode(f.key, 'hex'))::bit(64)::bigint # sign_bit, 'timeline', timeline_key, post
      FROM lambdastore.entries f
     WHERE f.object_id = user_id AND f.field = 'followers';

    RETURN post_id;
END
$$;
