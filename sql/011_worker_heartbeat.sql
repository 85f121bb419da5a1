-- A heartbeat naming only its worker (the JS SDK's gRPC transport sends these) extends the lease of
-- every job that worker holds, in every queue, each as a heartbeat naming the job would. Each
-- queue's active jobs are found through its partial lease index, so the cost grows with the
-- number of queues and of jobs in flight, not with the jobs stored.
-- `scope` (s3p.in_scope) keeps to the queues of the caller's token.
DROP FUNCTION IF EXISTS s3p.heartbeat_worker(text, bigint, bigint);
CREATE OR REPLACE FUNCTION s3p.heartbeat_worker(worker text, visibility_ms bigint, default_visibility_ms bigint,
                                                scope text[] DEFAULT NULL)
RETURNS TABLE (id uuid, directive text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    queue_schema text;
    held uuid[];
BEGIN
    -- Queues in name order, like every statement that locks jobs of several queues.
    FOR queue_schema IN SELECT q.schema_name FROM s3p.queues q WHERE s3p.in_scope(q.name, scope)
                          ORDER BY q.name LOOP
        EXECUTE format('SELECT array_agg(j.id) FROM %I.jobs j WHERE j.state = ''active'' AND j.worker_id = $1',
                       queue_schema)
            INTO held USING worker;
        CONTINUE WHEN held IS NULL;
        RETURN QUERY EXECUTE format('SELECT * FROM %I.heartbeat($1, $2, NULL, $3, $4)', queue_schema)
            USING held, worker, visibility_ms, default_visibility_ms;
    END LOOP;
END
$$;
