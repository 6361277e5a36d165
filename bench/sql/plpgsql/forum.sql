-- CloudForum's two hot paths as stored procedures: the baseline a PL/pgSQL
-- author would write against the rows the `forum` lambdas use. Each reads
-- and writes exactly what the lambda does, in the same encodings, so either
-- side sees the other's comments. Idempotent: rerunning replaces them.
--
-- Encodings (guest-sdk/sdk/src/key.rs, fields.rs): a Cell is the empty key
-- of its field; a Map<u64, _> key is 8 bytes big-endian (int8send for ids
-- below 2^63); values are serde_json text, and an object reference (XRef)
-- is its id as a JSON number.
--
-- These functions bypass LambdaStore's concurrency control (entry-set
-- versions): row locks make them correct among themselves at READ
-- COMMITTED, not alongside concurrent lambdas on the same thread.

CREATE SCHEMA IF NOT EXISTS bench_plpgsql;

-- Thread.get_thread(): the jsonb lambda_invoke(thread_id, 'get_thread')
-- returns, that is the serde form of ThreadView:
--   {"id", "author", "community", "title", "text", "comment_count",
--    "comments": [{"id", "author", "text", "at"}, ...]}   (comments by id)
-- CommentView flattens Comment, hence id beside the comment's own fields.
CREATE OR REPLACE FUNCTION bench_plpgsql.forum_get_thread(thread_id bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE STRICT AS $$
DECLARE
    cells jsonb;
    comments jsonb;
BEGIN
    -- One index range scan over the thread's entries: its cells by name,
    -- and its comments in key order, which is id order.
    SELECT jsonb_object_agg(e.field, convert_from(e.value, 'UTF8')::jsonb)
               FILTER (WHERE e.key = '' AND e.field <> 'comments'),
           jsonb_agg(jsonb_build_object('id', ('x' || encode(e.key, 'hex'))::bit(64)::bigint)
                     || convert_from(e.value, 'UTF8')::jsonb ORDER BY e.key)
               FILTER (WHERE e.field = 'comments')
      INTO cells, comments
      FROM lambdastore.entries e
     WHERE e.object_id = thread_id;
    IF cells->'author' IS NULL OR cells->'community' IS NULL THEN
        RAISE EXCEPTION 'thread % is not initialized', thread_id USING ERRCODE = 'no_data_found';
    END IF;
    -- Unset cells read as their type's default, like get_or_default.
    RETURN jsonb_build_object(
        'id', thread_id,
        'author', cells->'author',
        'community', cells->'community',
        'title', coalesce(cells->'title', '""'),
        'text', coalesce(cells->'text', '""'),
        'comment_count', coalesce(cells->'comment_count', '0'),
        'comments', coalesce(comments, '[]'));
END
$$;

-- Account.add_comment(thread, text), with its nested call to the protected
-- Thread.add_comment(author, text): appends the comment under id
-- comment_count + 1, stores the new count, returns the id.
--
-- The count's row lock (the upsert below) serializes concurrent comments on
-- one thread: a second caller waits for the first to commit, then bumps the
-- committed count (READ COMMITTED re-reads the locked row), so ids never
-- collide and no caller has to retry.
CREATE OR REPLACE FUNCTION bench_plpgsql.forum_add_comment(account_id bigint, thread_id bigint, text text)
RETURNS bigint
LANGUAGE plpgsql STRICT AS $$
DECLARE
    id bigint;
BEGIN
    -- What lambda_invoke and the nested call check for the lambda: the
    -- caller is an Account and the target a Thread of the same application.
    PERFORM
       FROM lambdastore.objects a
       JOIN lambdastore.objects t ON t.app = a.app
      WHERE a.object_id = account_id AND a.type_name = 'Account'
        AND t.object_id = thread_id AND t.type_name = 'Thread';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'object % is not an Account or % is not a Thread of its application', account_id, thread_id
            USING ERRCODE = 'no_data_found';
    END IF;
    -- Rust's str::trim: the characters with the Unicode White_Space property.
    IF btrim(forum_add_comment.text,
             E'\t\n\x0b\f\r \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000') = '' THEN
        RAISE EXCEPTION 'comment must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- An unset count is 0 (get_or_default), so the first id is 1.
    INSERT INTO lambdastore.entries AS e (object_id, field, key, value)
    VALUES (thread_id, 'comment_count', '', convert_to('1', 'UTF8'))
    ON CONFLICT ON CONSTRAINT entries_pkey DO UPDATE
        SET value = convert_to((convert_from(e.value, 'UTF8')::bigint + 1)::text, 'UTF8')
    RETURNING convert_from(e.value, 'UTF8')::bigint INTO id;

    -- The bytes serde_json writes for Comment: fields in declaration order,
    -- no spaces; `at` is the wall clock in microseconds since the Unix
    -- epoch, like the host's now_micros (GetCurrentTimestamp).
    INSERT INTO lambdastore.entries AS e (object_id, field, key, value)
    VALUES (thread_id, 'comments', int8send(id),
            convert_to(format('{"author":%s,"text":%s,"at":%s}',
                              account_id, to_json(forum_add_comment.text),
                              (extract(epoch FROM clock_timestamp()) * 1000000)::bigint), 'UTF8'))
    ON CONFLICT ON CONSTRAINT entries_pkey DO UPDATE SET value = EXCLUDED.value;
    RETURN id;
END
$$;
