-- PL/pgSQL reading what the counter application's Counter.get reads (the
-- object's row and its `value` entry): the cold-start comparison, in the
-- suite and in bench/pgbench/cold-start-plpgsql.sql.
CREATE OR REPLACE FUNCTION bench_plpgsql_get(id bigint) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT convert_from(value, 'UTF8')::jsonb
              FROM lambdastore.entries e JOIN lambdastore.objects o USING (object_id)
             WHERE e.object_id = id AND e.field = 'value' AND e.key = '');
END $$;
