-- The per-queue figures /metrics exports, for up to `page_size` queues named after `after` (all
-- from the start when NULL), in name order: jobs by state, stream events, dead letters,
-- rotations, and each consumer's lag (ticks and events behind its cursor). A page at a time, each
-- its own statement, because reading a queue locks its tables until the transaction ends: one
-- call over ~1,000 queues ran out of PostgreSQL's shared lock table.
-- `scope` (s3p.in_scope) keeps to the queues of a token's scope.
DROP FUNCTION IF EXISTS s3p.metrics_snapshot();
DROP FUNCTION IF EXISTS s3p.metrics_snapshot(text, int);
CREATE OR REPLACE FUNCTION s3p.metrics_snapshot(after text, page_size int, scope text[] DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q record;
    jobs jsonb;
    stream jsonb;
    out jsonb := '[]'::jsonb;
BEGIN
    FOR q IN SELECT name, schema_name FROM s3p.queues
              WHERE (after IS NULL OR name > after) AND s3p.in_scope(name, scope)
              ORDER BY name LIMIT page_size LOOP
        EXECUTE format('SELECT coalesce(jsonb_object_agg(state, n), ''{}'') FROM
                          (SELECT state, count(*) AS n FROM %I.jobs GROUP BY state) s', q.schema_name)
            INTO jobs;
        EXECUTE format($f$
            SELECT jsonb_build_object(
                'events', (SELECT count(*) FROM %1$I.stream_events),
                'dead_letters', (SELECT count(*) FROM %1$I.stream_dead_letters),
                'rotations', (SELECT rotations FROM %1$I.stream_config),
                'consumers', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                  'consumer', s.consumer,
                                  'ticks_behind', (SELECT count(*) FROM %1$I.stream_ticks t WHERE t.tick_id > s.last_tick),
                                  'events_behind', greatest(0,
                                      coalesce((SELECT max(seq) FROM %1$I.stream_events), 0)
                                      - coalesce((SELECT t.max_seq FROM %1$I.stream_ticks t WHERE t.tick_id = s.last_tick), 0)))), '[]')
                                FROM %1$I.stream_subscriptions s)) $f$, q.schema_name)
            INTO stream;
        out := out || jsonb_build_object('queue', q.name, 'jobs', jobs, 'stream', stream);
    END LOOP;
    RETURN jsonb_build_object('queues', out);
END
$$;
