-- The OJS event log: job lifecycle events in one table, polled with a cursor (the seq).

CREATE TABLE IF NOT EXISTS s3p.events (
    seq      bigserial PRIMARY KEY,
    id       uuid  NOT NULL DEFAULT gen_random_uuid(),
    type     text  NOT NULL,
    job_id   uuid,
    queue    text,
    job_type text,
    data     jsonb NOT NULL,
    time     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS events_time ON s3p.events (time);

-- The standard data fields of a job's lifecycle event (inlined where it is called).
CREATE OR REPLACE FUNCTION s3p.event_data(job_id uuid, job_type text, queue text, state text, attempt int)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('job_id', job_id, 'job_type', job_type, 'queue', queue,
                              'state', state, 'attempt', attempt)
$$;

-- Records one lifecycle event of a job; `extra` joins the standard data fields.
CREATE OR REPLACE FUNCTION s3p.emit(event_type text, job s3p.job, extra jsonb DEFAULT '{}') RETURNS void
LANGUAGE sql AS $$
    INSERT INTO s3p.events (type, job_id, queue, job_type, data)
    VALUES (event_type, job.id, job.queue, job.type,
            s3p.event_data(job.id, job.type, job.queue, job.state, job.attempt) || coalesce(extra, '{}'))
$$;

-- Events after a cursor, filtered (NULL = any), oldest first.
CREATE OR REPLACE FUNCTION s3p.events_page(after bigint, types text[], queues text[], job_types text[], page_size int)
RETURNS SETOF s3p.events
LANGUAGE sql STABLE AS $$
    SELECT * FROM s3p.events e
     WHERE e.seq > coalesce(after, 0)
       AND (types IS NULL OR e.type = ANY (types))
       AND (queues IS NULL OR e.queue = ANY (queues))
       AND (job_types IS NULL OR e.job_type = ANY (job_types))
     ORDER BY e.seq
     LIMIT page_size
$$;

-- Removes events older than the retention, at most `batch` per call.
CREATE OR REPLACE FUNCTION s3p.trim_events(retention_ms bigint, batch int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    removed int;
BEGIN
    DELETE FROM s3p.events WHERE seq IN (
        SELECT seq FROM s3p.events WHERE time < now() - make_interval(secs => retention_ms / 1000.0)
         ORDER BY seq LIMIT batch);
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END
$$;
