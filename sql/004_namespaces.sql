-- Namespace administration: create, drop, adopt (after a restore), configuration and statistics.

-- Creates a queue namespace explicitly; false when it already existed.
CREATE OR REPLACE FUNCTION s3p.create_queue(queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    existed boolean := EXISTS (SELECT 1 FROM s3p.queues q WHERE q.name = queue);
BEGIN
    PERFORM s3p.ensure_queue_schema(queue);
    RETURN NOT existed;
END
$$;

-- Drops a queue: both views at once (DROP SCHEMA), its catalog row and its job ids. Refused
-- (409) while a running workflow has a step or callback still to run there: its job would go,
-- and its enqueue inside a later ack would make the queue again while holding workflow rows.
-- The catalog row's lock waits for a workflow being made (it holds that row FOR KEY SHARE).
CREATE OR REPLACE FUNCTION s3p.drop_queue(queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    queue_schema text;
    needed_by uuid;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('s3p.queue:' || queue));
    SELECT q.schema_name INTO queue_schema FROM s3p.queues q WHERE q.name = queue FOR UPDATE;
    IF queue_schema IS NULL THEN
        RAISE EXCEPTION 'queue % not found', queue USING ERRCODE = 'PV404';
    END IF;
    SELECT w.id INTO needed_by FROM s3p.workflows w
     WHERE w.state = 'running'
       AND (EXISTS (SELECT 1 FROM s3p.workflow_steps s
                     WHERE s.workflow_id = w.id AND s.state IN ('waiting', 'enqueued')
                       AND s.job->>'queue' = queue)
            OR EXISTS (SELECT 1 FROM jsonb_each(w.callbacks) c WHERE c.value->>'queue' = queue))
     ORDER BY w.id LIMIT 1;
    IF needed_by IS NOT NULL THEN
        RAISE EXCEPTION 'queue % is needed by running workflow %: cancel it or let it finish first', queue, needed_by
              USING ERRCODE = 'PV409';
    END IF;
    EXECUTE format('DROP SCHEMA %I CASCADE', queue_schema);
    DELETE FROM s3p.job_index i WHERE i.queue = drop_queue.queue;
    DELETE FROM s3p.queues q WHERE q.name = queue;
    RETURN true;
END
$$;

-- Registers a queue schema restored from `pg_dump -n s3q_<name>` and rebuilds its job ids.
CREATE OR REPLACE FUNCTION s3p.adopt_queue(queue text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    queue_schema text := s3p.schema_name_for(queue);
    adopted bigint;
BEGIN
    IF to_regnamespace(quote_ident(queue_schema)) IS NULL THEN
        RAISE EXCEPTION 'schema % does not exist', queue_schema USING ERRCODE = 'PV404';
    END IF;
    INSERT INTO s3p.queues (name, schema_name, template_version)
    VALUES (queue, queue_schema, 0)
    ON CONFLICT (name) DO NOTHING;
    PERFORM s3p.ensure_queue_schema(queue);
    -- Ids carrying the queue's tag are found by it (s3p.job_queues); the others need index rows.
    EXECUTE format('INSERT INTO s3p.job_index (id, queue) SELECT id, $1 FROM %I.jobs
                     WHERE s3p.job_id_tag(id) <> s3p.queue_id_tag($1) ON CONFLICT DO NOTHING',
                   queue_schema) USING queue;
    GET DIAGNOSTICS adopted = ROW_COUNT;
    RETURN adopted;
END
$$;

-- Job state counts and stream counts of a queue.
CREATE OR REPLACE FUNCTION s3p.queue_stats(queue text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q s3p.queues;
    counts jsonb;
    stream jsonb;
BEGIN
    SELECT * INTO q FROM s3p.queues WHERE name = queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % not found', queue USING ERRCODE = 'PV404';
    END IF;
    EXECUTE format($f$
        SELECT jsonb_build_object(
            'available', count(*) FILTER (WHERE state = 'available' OR (state IN ('scheduled', 'retryable') AND run_at <= now())),
            'scheduled', count(*) FILTER (WHERE state = 'scheduled' AND run_at > now()),
            'pending', count(*) FILTER (WHERE state = 'pending'),
            'active', count(*) FILTER (WHERE state = 'active'),
            'retryable', count(*) FILTER (WHERE state = 'retryable' AND run_at > now()),
            'completed', count(*) FILTER (WHERE state = 'completed'),
            'cancelled', count(*) FILTER (WHERE state = 'cancelled'),
            'discarded', count(*) FILTER (WHERE state = 'discarded'),
            'dead_letters', count(*) FILTER (WHERE state = 'discarded' AND retry->>'on_exhaustion' = 'dead_letter'),
            'completed_last_hour', count(*) FILTER (WHERE state = 'completed' AND completed_at > now() - interval '1 hour'),
            'failed_last_hour', count(*) FILTER (WHERE state = 'discarded' AND completed_at > now() - interval '1 hour'),
            -- Over the last hour: run time of completed jobs, wait from enqueue to start, completions per second.
            'avg_duration_ms', round(coalesce(avg(extract(epoch FROM completed_at - started_at) * 1000)
                FILTER (WHERE state = 'completed' AND completed_at > now() - interval '1 hour'), 0)::numeric, 3),
            'avg_wait_ms', round(coalesce(avg(extract(epoch FROM started_at - coalesce(enqueued_at, created_at)) * 1000)
                FILTER (WHERE started_at > now() - interval '1 hour'), 0)::numeric, 3),
            'throughput_per_second', round(count(*) FILTER (WHERE state = 'completed'
                AND completed_at > now() - interval '1 hour') / 3600.0, 6))
        FROM %I.jobs $f$, q.schema_name) INTO counts;
    EXECUTE format($f$
        SELECT jsonb_build_object(
            'events', (SELECT count(*) FROM %1$I.stream_events),
            'consumers', (SELECT count(*) FROM %1$I.stream_subscriptions),
            'dead_letters', (SELECT count(*) FROM %1$I.stream_dead_letters),
            'pending_retries', (SELECT count(*) FROM %1$I.stream_retry_events)) $f$, q.schema_name) INTO stream;
    RETURN counts || jsonb_build_object('name', q.name, 'paused', q.paused, 'created_at', q.created_at,
                                        'stream', stream);
END
$$;

-- A queue's whole configuration: catalog settings and the stream's. A read: no locks, no writes,
-- so a gateway on a hot standby serves it.
CREATE OR REPLACE FUNCTION s3p.queue_config_view(queue text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q s3p.queues;
    stream record;
BEGIN
    SELECT * INTO q FROM s3p.queues WHERE name = queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % not found', queue USING ERRCODE = 'PV404';
    END IF;
    EXECUTE format('SELECT max_retries, retention_ms, takeover_ms, tick_max_events, tick_max_bytes FROM %I.stream_config',
                   q.schema_name)
        INTO stream;
    RETURN q.settings || jsonb_build_object('max_retries', stream.max_retries, 'retention_ms', stream.retention_ms,
                                            'takeover_ms', stream.takeover_ms,
                                            'tick_max_events', stream.tick_max_events,
                                            'tick_max_bytes', stream.tick_max_bytes);
END
$$;

-- Reads or updates a queue's configuration. `changes` may hold job_retention_ms, max_jobs,
-- max_stream_events (JSON null clears a quota), autovacuum (storage parameters of the jobs table),
-- max_retries, retention_ms, takeover_ms, tick_max_events and tick_max_bytes (stream). Returns the whole configuration; no changes
-- is a read (`queue_config_view`).
CREATE OR REPLACE FUNCTION s3p.queue_config(queue text, changes jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    q s3p.queues;
    setting record;
    allowed text[] := ARRAY['autovacuum_enabled', 'autovacuum_vacuum_threshold',
                            'autovacuum_vacuum_scale_factor', 'autovacuum_analyze_threshold',
                            'autovacuum_analyze_scale_factor', 'autovacuum_vacuum_cost_delay',
                            'autovacuum_vacuum_cost_limit', 'fillfactor'];
    -- Those PostgreSQL takes as integers: it rounds a fraction given to one (100.4 is stored and
    -- reads as 100), which would pass its range check and be echoed as given.
    whole_numbers text[] := ARRAY['autovacuum_vacuum_threshold', 'autovacuum_analyze_threshold',
                                  'autovacuum_vacuum_cost_limit', 'fillfactor'];
BEGIN
    changes := coalesce(changes, '{}'::jsonb);
    IF changes = '{}'::jsonb THEN
        RETURN s3p.queue_config_view(queue);
    END IF;
    SELECT * INTO q FROM s3p.queues WHERE name = queue FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % not found', queue USING ERRCODE = 'PV404';
    END IF;
    -- One retention serves completed and discarded jobs: a change naming one state alone
    -- (`job_retention_one_state_default_ms`, the server's default retention) must leave the other
    -- as it is, so it is refused unless it equals the retention in force. Checked here, under the
    -- row lock, so a concurrent change cannot slip between the check and the write.
    IF changes ? 'job_retention_one_state_default_ms'
       AND coalesce((q.settings->>'job_retention_ms')::bigint,
                    (changes->>'job_retention_one_state_default_ms')::bigint)
           IS DISTINCT FROM (changes->>'job_retention_ms')::bigint THEN
        RAISE EXCEPTION 'retention: pgvs3 keeps completed and discarded jobs alike (both % now), so naming one alone would change the other: give both the same duration',
              make_interval(secs => coalesce((q.settings->>'job_retention_ms')::bigint,
                                             (changes->>'job_retention_one_state_default_ms')::bigint) / 1000.0)
              USING ERRCODE = 'PV400';
    END IF;
    changes := changes - 'job_retention_one_state_default_ms';
    IF changes ? 'autovacuum' THEN
        FOR setting IN SELECT key, value FROM jsonb_each(changes->'autovacuum') LOOP
            IF NOT setting.key = ANY (allowed) THEN
                RAISE EXCEPTION 'autovacuum setting % is not supported (use one of %)', setting.key, allowed
                    USING ERRCODE = 'PV400';
            END IF;
            IF jsonb_typeof(setting.value) NOT IN ('number', 'boolean') THEN
                RAISE EXCEPTION 'autovacuum setting % must be a number or boolean', setting.key
                    USING ERRCODE = 'PV400';
            END IF;
            IF setting.key = ANY (whole_numbers)
               AND jsonb_typeof(setting.value) = 'number'
               AND (setting.value)::numeric <> trunc((setting.value)::numeric) THEN
                RAISE EXCEPTION 'autovacuum setting % must be a whole number, not %', setting.key, setting.value
                    USING ERRCODE = 'PV400';
            END IF;
            -- PostgreSQL checks each value's range; its refusal is the client's 400.
            BEGIN
                EXECUTE format('ALTER TABLE %I.jobs SET (%s = %s)', q.schema_name, setting.key, setting.value #>> '{}');
            EXCEPTION WHEN invalid_parameter_value OR numeric_value_out_of_range OR syntax_error THEN
                RAISE EXCEPTION 'autovacuum setting %: %', setting.key, SQLERRM USING ERRCODE = 'PV400';
            END;
        END LOOP;
        q.settings := q.settings || jsonb_build_object('autovacuum',
            coalesce(q.settings->'autovacuum', '{}'::jsonb) || (changes->'autovacuum'));
    END IF;
    q.settings := jsonb_strip_nulls(q.settings || (changes - 'autovacuum' - 'max_retries' - 'retention_ms' - 'takeover_ms'
                                                   - 'tick_max_events' - 'tick_max_bytes'));
    UPDATE s3p.queues SET settings = q.settings WHERE name = queue;
    IF changes ?| ARRAY['max_retries', 'retention_ms', 'tick_max_events', 'tick_max_bytes'] THEN
        EXECUTE format('SELECT * FROM %I.stream_configure($1, $2, $3, $4)', q.schema_name)
            USING (changes->>'max_retries')::int, (changes->>'retention_ms')::bigint,
                  (changes->>'tick_max_events')::int, (changes->>'tick_max_bytes')::bigint;
    END IF;
    -- How long a cooperative member's batch stays its own before another member may take it over.
    IF changes ? 'takeover_ms' THEN
        EXECUTE format('UPDATE %I.stream_config SET takeover_ms = $1', q.schema_name)
          USING (changes->>'takeover_ms')::bigint;
    END IF;
    RETURN s3p.queue_config_view(queue);
END
$$;

-- Pauses or resumes delivery of a queue's jobs (enqueue keeps working); creates the queue first
-- if needed, so a queue can be paused before its first job.
CREATE OR REPLACE FUNCTION s3p.set_paused(queue text, pause boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM s3p.ensure_queue_schema(queue);
    UPDATE s3p.queues SET paused = pause WHERE name = queue;
    IF NOT pause THEN
        PERFORM pg_notify('s3p_jobs', queue);
    END IF;
    RETURN pause;
END
$$;
