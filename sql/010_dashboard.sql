-- Reads of the dashboard (/ui) that the API has no operation for: a queue's jobs in one state
-- and a job's retained events. Each is a bounded page.

-- Up to `page_size` jobs of a queue in `state` (every state when NULL), newest first, after the
-- job `after_id` of the previous page when given. No index serves the state filter (one would
-- cost every transition), so a page scans the queue's jobs newest first until it has filled.
CREATE OR REPLACE FUNCTION s3p.jobs_page(queue text, state text, after_id uuid, page_size int)
RETURNS SETOF s3p.job
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE format(
        'SELECT * FROM %1$I.jobs j WHERE ($1 IS NULL OR j.state = $1) AND ($2 IS NULL OR j.seq < (SELECT p.seq FROM %1$I.jobs p WHERE p.id = $2))
          ORDER BY j.seq DESC LIMIT $3', s3p.existing_queue_schema(queue))
        USING state, after_id, page_size;
END
$$;

-- The retained lifecycle events of one job, oldest first, at most `page_size`. The log has no
-- job index (the trim and every transition would pay for it): this scans the retained log.
CREATE OR REPLACE FUNCTION s3p.job_events(wanted uuid, page_size int)
RETURNS TABLE (txid bigint, seq bigint, id uuid, type text, job_id uuid, queue text, job_type text,
               data jsonb, "time" timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT e.txid::text::bigint, x.seq, x.id, x.type, x.job_id, e.queue, x.job_type, x.data, e.time
      FROM s3p.events e CROSS JOIN LATERAL s3p.event_items(e) x
     WHERE (e.job_id = wanted OR wanted = ANY (e.job_ids))
       AND x.job_id = wanted
     ORDER BY e.txid, e.seq, x.seq
     LIMIT page_size
$$;

-- The workflow list moved to s3p.workflows_list (012_admin_jobs.sql), which the Admin API shares.
DROP FUNCTION IF EXISTS s3p.workflows_page(int);
