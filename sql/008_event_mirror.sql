-- Optional per-queue mirroring of job lifecycle events into the queue's stream. A queue whose
-- configuration sets `mirror_job_events` (s3p.queues.settings, through s3p.queue_config) gets
-- every event recorded for it in the event log (s3p.events, written by s3p.emit) also appended to
-- its stream by the statement that recorded it, so in the transaction of the transition. A
-- trigger on the log rather than a step in the emitter, so that every writer of the log mirrors
-- and the rule lives here only.
--
-- A mirrored event is one stream message: id = the event id, type = the event type (e.g.
-- job.completed), payload = the event log row (seq, id, type, job_id, queue, job_type, data,
-- time), headers = {"pgvs3-event": "job"}. It is an ordinary append (s3p.stream_append): it wakes
-- receivers, and the queue's max_stream_events quota counts it and refuses the transition when
-- the stream is full.
--
-- The trigger exists only while some queue mirrors, so with mirroring off everywhere (the
-- default) recording an event costs nothing more (a disabled trigger would not do: PostgreSQL
-- still collects the transition table of every insert for it). Turning mirroring on for the
-- first queue, or off for the last, creates or drops it, which waits for the job transitions in
-- flight and holds new ones back until the configuration change commits.

-- The queues that mirror (an almost always empty index).
CREATE INDEX IF NOT EXISTS queues_mirror_job_events ON s3p.queues (name)
    WHERE settings @> '{"mirror_job_events": true}';

-- Appends the events a statement recorded to the streams of their queues that mirror: one
-- append per queue, queues in name order (one lock order for concurrent writers). Events that
-- would take more than one receive answers (16 MiB, core::stream::MAX_RESPONSE_BYTES, counted as
-- s3p.stream_event_bytes) refuse the transition (PV413): the append is one transaction, never
-- split across ticks, so no consumer could ever receive it (a job's JSON stores `1e300` as
-- written, and jsonb prints it in 301 digits).
CREATE OR REPLACE FUNCTION s3p.mirror_job_events() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    target record;
    bytes bigint;
BEGIN
    FOR target IN
        SELECT e.queue,
               jsonb_agg(jsonb_build_object('id', x.id, 'type', x.type,
                                            'payload', jsonb_build_object(
                                                'seq', x.seq, 'id', x.id, 'type', x.type, 'job_id', x.job_id,
                                                'queue', e.queue, 'job_type', x.job_type,
                                                'data', x.data, 'time', e.time),
                                            'headers', jsonb_build_object('pgvs3-event', 'job'))
                         ORDER BY x.seq) AS messages
          FROM logged e CROSS JOIN LATERAL s3p.event_items(e) x
         WHERE e.queue IN (SELECT q.name FROM s3p.queues q
                            WHERE q.settings @> '{"mirror_job_events": true}')
         GROUP BY e.queue
         ORDER BY e.queue
    LOOP
        SELECT sum(s3p.stream_event_bytes(m->'payload', m->'headers')) INTO bytes
          FROM jsonb_array_elements(target.messages) m;
        IF bytes > 16777216 THEN
            RAISE EXCEPTION 'the events mirrored to the stream of queue % would take % bytes, more than one receive answers (16777216)',
                target.queue, bytes
                USING ERRCODE = 'PV413', DETAIL = jsonb_build_object('events', jsonb_array_length(target.messages), 'bytes', bytes)::text;
        END IF;
        PERFORM s3p.stream_append(target.queue, target.messages);
    END LOOP;
    RETURN NULL;
END
$$;

-- Creates the mirroring trigger while some queue mirrors, drops it otherwise. Callers of
-- concurrent changes take turns (advisory lock), each deciding from what the others committed.
CREATE OR REPLACE FUNCTION s3p.sync_event_mirror() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    wanted  boolean;
    present boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('s3p.event_mirror'));
    wanted := EXISTS (SELECT 1 FROM s3p.queues q WHERE q.settings @> '{"mirror_job_events": true}');
    present := EXISTS (SELECT 1 FROM pg_trigger t
                        WHERE t.tgrelid = 's3p.events'::regclass AND t.tgname = 'events_mirror_job_events'
                          AND t.tgenabled <> 'D');
    IF wanted AND NOT present THEN
        DROP TRIGGER IF EXISTS events_mirror_job_events ON s3p.events;
        CREATE TRIGGER events_mirror_job_events AFTER INSERT ON s3p.events
            REFERENCING NEW TABLE AS logged
            FOR EACH STATEMENT EXECUTE FUNCTION s3p.mirror_job_events();
    ELSIF present AND NOT wanted THEN
        DROP TRIGGER events_mirror_job_events ON s3p.events;
    ELSIF NOT wanted THEN
        -- A trigger left disabled by an older pgvs3 still costs every insert.
        DROP TRIGGER IF EXISTS events_mirror_job_events ON s3p.events;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION s3p.sync_event_mirror_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM s3p.sync_event_mirror();
    RETURN NULL;
END
$$;

-- Only rows whose mirroring changes (or a mirroring queue dropped) call it.
DROP TRIGGER IF EXISTS queues_sync_event_mirror ON s3p.queues;
CREATE TRIGGER queues_sync_event_mirror AFTER UPDATE OF settings ON s3p.queues
    FOR EACH ROW
    WHEN ((OLD.settings @> '{"mirror_job_events": true}')
          IS DISTINCT FROM (NEW.settings @> '{"mirror_job_events": true}'))
    EXECUTE FUNCTION s3p.sync_event_mirror_trigger();
DROP TRIGGER IF EXISTS queues_sync_event_mirror_drop ON s3p.queues;
CREATE TRIGGER queues_sync_event_mirror_drop AFTER DELETE ON s3p.queues
    FOR EACH ROW
    WHEN (OLD.settings @> '{"mirror_job_events": true}')
    EXECUTE FUNCTION s3p.sync_event_mirror_trigger();

SELECT s3p.sync_event_mirror();
