-- Reads of the dashboard (/ui) that the API has no operation for: a job's retained events, a
-- bounded page.

-- The job list moved to s3p.admin_jobs (012_admin_jobs.sql), which the Admin API shares.
DROP FUNCTION IF EXISTS s3p.jobs_page(text, text, uuid, int);

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
