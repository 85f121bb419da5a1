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
-- Narrow rows: a transition records the job's state and attempt and only what is particular to
-- the event (`extra`); the event's JSON data is built when it is read (s3p.event_row). Rows
-- written before carry their data whole in `data`.
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS state text;
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS attempt int;
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS extra jsonb;
ALTER TABLE s3p.events ALTER COLUMN data DROP NOT NULL;
-- The trim walks the log in seq order, so a time index would only cost every insert.
DROP INDEX IF EXISTS s3p.events_time;

-- The standard data fields of a job's lifecycle event. STABLE like jsonb_build_object, so that
-- it is inlined where it is called.
CREATE OR REPLACE FUNCTION s3p.event_data(job_id uuid, job_type text, queue text, state text, attempt int)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('job_id', job_id, 'job_type', job_type, 'queue', queue,
                              'state', state, 'attempt', attempt)
$$;

-- Records one lifecycle event of a job; `extra` joins the standard data fields.
CREATE OR REPLACE FUNCTION s3p.emit(event_type text, job s3p.job, extra jsonb DEFAULT '{}') RETURNS void
LANGUAGE sql AS $$
    INSERT INTO s3p.events (type, job_id, queue, job_type, state, attempt, extra)
    VALUES (event_type, job.id, job.queue, job.type, job.state, job.attempt, nullif(extra, '{}'))
$$;

-- The data of a recorded event: stored whole (older rows), or built from its narrow columns.
CREATE OR REPLACE FUNCTION s3p.event_row_data(e s3p.events) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(e.data, s3p.event_data(e.job_id, e.job_type, e.queue, e.state, e.attempt)
                            || coalesce(e.extra, '{}'))
$$;

-- Events after a cursor, filtered (NULL = any), oldest first.
DROP FUNCTION IF EXISTS s3p.events_page(bigint, text[], text[], text[], int);
CREATE OR REPLACE FUNCTION s3p.events_page(after bigint, types text[], queues text[], job_types text[], page_size int)
RETURNS TABLE (seq bigint, id uuid, type text, job_id uuid, queue text, job_type text, data jsonb,
               "time" timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT e.seq, e.id, e.type, e.job_id, e.queue, e.job_type, s3p.event_row_data(e), e.time
      FROM s3p.events e
     WHERE e.seq > coalesce(after, 0)
       AND (types IS NULL OR e.type = ANY (types))
       AND (queues IS NULL OR e.queue = ANY (queues))
       AND (job_types IS NULL OR e.job_type = ANY (job_types))
     ORDER BY e.seq
     LIMIT page_size
$$;

-- Removes events older than the retention, at most `batch` per call: among the oldest `batch`
-- in log order, those past the retention (time follows seq but for commits out of order, so a
-- straggler waits for a later pass and never makes the trim scan the whole log).
CREATE OR REPLACE FUNCTION s3p.trim_events(retention_ms bigint, batch int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    removed int;
BEGIN
    DELETE FROM s3p.events WHERE seq IN (
        SELECT o.seq FROM (SELECT e.seq, e.time FROM s3p.events e ORDER BY e.seq LIMIT batch) o
         WHERE o.time < now() - make_interval(secs => retention_ms / 1000.0));
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END
$$;
