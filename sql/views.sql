-- Views over functions that pgrx generates; created after them.

-- Per application, type and function: top-level calls, workflows committed,
-- aborts by reason, execution time. Counted in shared memory since the
-- server started (kept across aborted transactions); empty unless
-- lambdastore is in shared_preload_libraries.
CREATE VIEW lambdastore.stats AS SELECT * FROM lambdastore._stats();

-- An object's entry sets in key order: where its guards are, and each set's
-- version and recent conflicts (shared memory: they restart from 0 with the
-- server, and sets whose counters share a stripe show the same values).
CREATE FUNCTION lambdastore.entry_sets(object_id bigint)
RETURNS TABLE (lower_field text, lower_key bytea, version bigint, conflicts bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT s.lower_field, s.lower_key, c.version, c.conflicts
      FROM lambdastore.entry_sets s,
           lambdastore._entry_set_counters(s.object_id, s.lower_field, s.lower_key) c
     WHERE s.object_id = $1
     ORDER BY s.lower_field, s.lower_key
$$;

-- A job's state and outcome; no row if there is no such job.
CREATE FUNCTION lambdastore.job(id bigint)
RETURNS TABLE (job_id bigint, state text, result jsonb, error text, sqlstate text, attempts int,
               submitted_at timestamptz, finished_at timestamptz)
LANGUAGE sql VOLATILE AS $$
    SELECT j.job_id, j.state, j.result, j.error, j.sqlstate, j.attempts, j.submitted_at, j.finished_at
      FROM lambdastore.jobs j WHERE j.job_id = $1
$$;

-- Blocks until the job is done or failed, or the timeout passes, then
-- returns lambdastore.job(job_id) (state 'queued' after a timeout).
CREATE FUNCTION lambdastore.wait(id bigint, timeout interval DEFAULT '30 seconds')
RETURNS TABLE (job_id bigint, state text, result jsonb, error text, sqlstate text, attempts int,
               submitted_at timestamptz, finished_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM lambdastore._wait_for_job($1, (extract(epoch FROM $2) * 1000)::bigint);
    RETURN QUERY SELECT * FROM lambdastore.job($1);
END
$$;

-- Per application and function: jobs queued (waiting, not running), running
-- now, done and failed, and how long the oldest waiting job has waited.
-- 'running' comes from the workers' shared memory: a claimed job is only
-- row-locked, its 'done' commits with its effects.
CREATE VIEW lambdastore.queue AS
WITH running AS (SELECT job_id FROM lambdastore._running_jobs())
SELECT j.app,
       j.method AS function,
       count(*) FILTER (WHERE j.state = 'queued' AND r.job_id IS NULL) AS depth,
       count(r.job_id) AS running,
       count(*) FILTER (WHERE j.state = 'done') AS done,
       count(*) FILTER (WHERE j.state = 'failed') AS failed,
       now() - min(j.submitted_at) FILTER (WHERE j.state = 'queued' AND r.job_id IS NULL) AS oldest_waiting
  FROM lambdastore.jobs j LEFT JOIN running r ON r.job_id = j.job_id
 GROUP BY j.app, j.method;
