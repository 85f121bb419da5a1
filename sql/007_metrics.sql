-- The per-queue figures /metrics exports, for up to `page_size` queues named after `after` (all
-- from the start when NULL), in name order: jobs by state, stream events, dead letters,
-- rotations, the number of consumers, the largest lag, and the lag (ticks and events behind the
-- cursor) of the 100 consumers furthest behind (lowest cursor tick, then name), so what one
-- scrape reads and exports per queue is bounded however many consumers there are. A page at a
-- time, each its own statement, because reading a queue locks its tables until the transaction
-- ends: one call over ~1,000 queues ran out of PostgreSQL's shared lock table.
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
        -- One pass over the subscriptions (the count rides on the top-100 sort), then the ticks
        -- from the lowest of those cursors on, once (s3p.stream_cursor_lag).
        EXECUTE format($f$
            WITH lagging AS MATERIALIZED (
                SELECT s.consumer, s.last_tick, count(*) OVER () AS consumers
                  FROM %1$I.stream_subscriptions s ORDER BY s.last_tick, s.consumer LIMIT 100),
            head AS (SELECT coalesce(max(e.seq), 0) AS seq FROM %1$I.stream_events e),
            lag AS (
                SELECT l.consumer, coalesce(c.ticks_behind, 0) AS ticks_behind,
                       greatest(0, h.seq - coalesce(c.max_seq, 0)) AS events_behind
                  FROM lagging l
                 CROSS JOIN head h
                  LEFT JOIN s3p.stream_cursor_lag(%1$L, ARRAY(SELECT x.last_tick FROM lagging x)) c
                         ON c.tick = l.last_tick)
            SELECT jsonb_build_object(
                'events', (SELECT count(*) FROM %1$I.stream_events),
                'dead_letters', (SELECT count(*) FROM %1$I.stream_dead_letters),
                'rotations', (SELECT rotations FROM %1$I.stream_config),
                'consumer_count', coalesce((SELECT max(l.consumers) FROM lagging l), 0),
                'max_ticks_behind', coalesce((SELECT max(g.ticks_behind) FROM lag g), 0),
                'max_events_behind', coalesce((SELECT max(g.events_behind) FROM lag g), 0),
                'consumers', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                  'consumer', g.consumer, 'ticks_behind', g.ticks_behind,
                                  'events_behind', g.events_behind)
                                  ORDER BY g.ticks_behind DESC, g.consumer), '[]')
                                FROM lag g)) $f$, q.schema_name)
            INTO stream;
        out := out || jsonb_build_object('queue', q.name, 'jobs', jobs, 'stream', stream);
    END LOOP;
    RETURN jsonb_build_object('queues', out);
END
$$;
