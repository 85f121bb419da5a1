-- The OJS Admin API's worker registry, maintenance mode and throughput rollup.
--
-- Workers: each gateway notes the worker ids it sees in fetches and heartbeats in memory and
-- hands them over in one statement per tick (s3p.admin_tick, every 500 ms), a worker at most
-- once per 5 s: the fetch path itself never writes here. A worker is `stale` when it was not seen
-- for s3p.worker_stale_ms() (90 s by default, GUC s3p.worker_stale_ms); rows not seen for a day
-- are trimmed.
--
-- Maintenance mode is one row; every gateway reads it with its tick, so a change reaches all of
-- them within one tick.
--
-- Throughput: s3p.stats_rollup follows the event log with its own cursor (as any event reader,
-- only up to s3p.events_horizon(), so a late commit is counted later, never skipped) and adds
-- enqueued / completed / failed counts per queue into per-minute and per-hour rows. History reads
-- those rows, never the jobs. Minutes are kept 24 h, hours 30 days.

CREATE TABLE IF NOT EXISTS s3p.workers (
    id                text PRIMARY KEY,
    queues            text[] NOT NULL DEFAULT '{}',
    state             text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'quiet')),
    started_at        timestamptz NOT NULL DEFAULT now(),
    last_seen_at      timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz,
    quiet_at          timestamptz
);
CREATE INDEX IF NOT EXISTS workers_quiet ON s3p.workers (id) WHERE state = 'quiet';
CREATE INDEX IF NOT EXISTS workers_seen ON s3p.workers (last_seen_at);

CREATE TABLE IF NOT EXISTS s3p.system_state (
    id            boolean PRIMARY KEY DEFAULT true CHECK (id),
    maintenance   boolean NOT NULL DEFAULT false,
    reason        text,
    enabled_at    timestamptz,
    estimated_end timestamptz
);
INSERT INTO s3p.system_state (id) VALUES (true) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS s3p.stats_minute (
    minute    timestamptz NOT NULL,
    queue     text NOT NULL,
    enqueued  bigint NOT NULL DEFAULT 0,
    processed bigint NOT NULL DEFAULT 0,
    failed    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, queue)
);
CREATE TABLE IF NOT EXISTS s3p.stats_hour (
    hour      timestamptz NOT NULL,
    queue     text NOT NULL,
    enqueued  bigint NOT NULL DEFAULT 0,
    processed bigint NOT NULL DEFAULT 0,
    failed    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, queue)
);
-- Where the rollup is in the event log, and when it last trimmed.
CREATE TABLE IF NOT EXISTS s3p.stats_cursor (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    txid       xid8 NOT NULL DEFAULT '0',
    seq        bigint NOT NULL DEFAULT 0,
    trimmed_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO s3p.stats_cursor (id) VALUES (true) ON CONFLICT DO NOTHING;

-- How long a worker may go unseen before it counts as stale.
CREATE OR REPLACE FUNCTION s3p.worker_stale_ms() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('s3p.worker_stale_ms', true), '')::bigint, 90000)
$$;

-- What a reader sees of a worker: `stale` overrides the stored state.
CREATE OR REPLACE FUNCTION s3p.worker_state(w s3p.workers) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN w.last_seen_at < now() - make_interval(secs => s3p.worker_stale_ms() / 1000.0)
                THEN 'stale' ELSE w.state END
$$;

-- Whether a scoped token sees a worker: one of its queues is in scope (all tokens see all).
CREATE OR REPLACE FUNCTION s3p.worker_in_scope(w s3p.workers, scope text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT scope IS NULL OR EXISTS (SELECT 1 FROM unnest(w.queues) q WHERE s3p.in_scope(q, scope))
$$;

-- Notes the workers a gateway saw: `seen` is [{id, queues: [..], at, heartbeat}]. Queues are
-- the union of those seen (at most 64).
CREATE OR REPLACE FUNCTION s3p.workers_seen(seen jsonb) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO s3p.workers AS w (id, queues, started_at, last_seen_at, last_heartbeat_at)
    SELECT s.id,
           ARRAY(SELECT DISTINCT q FROM jsonb_array_elements_text(coalesce(s.queues, '[]')) q ORDER BY q LIMIT 64),
           s.at, s.at, CASE WHEN s.heartbeat THEN s.at END
      FROM jsonb_to_recordset(seen) AS s(id text, queues jsonb, at timestamptz, heartbeat boolean)
     WHERE s.id IS NOT NULL
     ORDER BY s.id
    ON CONFLICT (id) DO UPDATE
       SET queues = ARRAY(SELECT DISTINCT q FROM unnest(w.queues || excluded.queues) q ORDER BY q LIMIT 64),
           last_seen_at = greatest(w.last_seen_at, excluded.last_seen_at),
           last_heartbeat_at = coalesce(greatest(w.last_heartbeat_at, excluded.last_heartbeat_at),
                                        w.last_heartbeat_at, excluded.last_heartbeat_at)
$$;

-- One page of the workers a token sees, in id order, with the total and the counts by state.
DROP FUNCTION IF EXISTS s3p.workers_page(int, int, text[]);
CREATE OR REPLACE FUNCTION s3p.workers_page(page_offset int, page_size int, scope text[] DEFAULT NULL)
RETURNS TABLE (id text, queues text[], state text, started_at timestamptz, last_seen_at timestamptz,
               last_heartbeat_at timestamptz, total bigint, running bigint, quiet bigint, stale bigint)
LANGUAGE sql STABLE AS $$
    WITH visible AS MATERIALIZED (
        SELECT w.id, w.queues, s3p.worker_state(w) AS state, w.started_at, w.last_seen_at,
               w.last_heartbeat_at
          FROM s3p.workers w WHERE s3p.worker_in_scope(w, scope)),
    summary AS (
        SELECT count(*) AS total, count(*) FILTER (WHERE v.state = 'running') AS running,
               count(*) FILTER (WHERE v.state = 'quiet') AS quiet,
               count(*) FILTER (WHERE v.state = 'stale') AS stale
          FROM visible v)
    SELECT p.id, p.queues, p.state, p.started_at, p.last_seen_at, p.last_heartbeat_at,
           s.total, s.running, s.quiet, s.stale
      FROM summary s
      LEFT JOIN LATERAL (SELECT * FROM visible v ORDER BY v.id OFFSET page_offset LIMIT page_size) p ON true
$$;

-- One worker a token sees (no row otherwise).
CREATE OR REPLACE FUNCTION s3p.worker_get(worker text, scope text[] DEFAULT NULL)
RETURNS TABLE (id text, queues text[], state text, started_at timestamptz, last_seen_at timestamptz,
               last_heartbeat_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT w.id, w.queues, s3p.worker_state(w), w.started_at, w.last_seen_at, w.last_heartbeat_at
      FROM s3p.workers w WHERE w.id = worker AND s3p.worker_in_scope(w, scope)
$$;

-- The active jobs (leases) of some workers, in the queues they fetch from that a token sees:
-- each worker's count and its first `per_worker` jobs by start. Each queue is read through its
-- partial lease index (active jobs only), so the cost follows the jobs in flight, not the jobs
-- stored.
CREATE OR REPLACE FUNCTION s3p.worker_leases(workers text[], per_worker int, scope text[] DEFAULT NULL)
RETURNS TABLE (worker text, active bigint, jobs jsonb)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q record;
    found jsonb;
    acc jsonb := '[]'::jsonb;
BEGIN
    FOR q IN SELECT c.name, c.schema_name FROM s3p.queues c
              WHERE s3p.in_scope(c.name, scope)
                AND c.name IN (SELECT unnest(w.queues) FROM s3p.workers w WHERE w.id = ANY (workers))
              ORDER BY c.name LOOP
        EXECUTE format($f$
            SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'worker', k.worker_id, 'id', k.id, 'queue', %L, 'type', k.type,
                       'started_at', k.started_at, 'lease_expires_at', k.lease_expires_at)), '[]')
              FROM %I.jobs k
             WHERE k.state = 'active' AND k.worker_id = ANY ($1) $f$, q.name, q.schema_name)
            INTO found USING workers;
        acc := acc || found;
    END LOOP;
    RETURN QUERY
        SELECT e.w, count(*)::bigint,
               (jsonb_agg(e.j - 'worker' ORDER BY e.j->>'started_at', e.j->>'id')
                    FILTER (WHERE e.n <= per_worker))
          FROM (SELECT j->>'worker' AS w, j,
                       row_number() OVER (PARTITION BY j->>'worker' ORDER BY j->>'started_at', j->>'id') AS n
                  FROM jsonb_array_elements(acc) j) e
         GROUP BY e.w;
END
$$;

-- Asks a worker to stop fetching: its next heartbeat answer says `quiet`.
CREATE OR REPLACE FUNCTION s3p.worker_quiet(worker text, scope text[] DEFAULT NULL)
RETURNS TABLE (id text, queues text[], state text, started_at timestamptz, last_seen_at timestamptz,
               last_heartbeat_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE s3p.workers w SET state = 'quiet', quiet_at = coalesce(w.quiet_at, now())
     WHERE w.id = worker AND s3p.worker_in_scope(w, scope);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'worker % not found', worker USING ERRCODE = 'PV404';
    END IF;
    RETURN QUERY SELECT * FROM s3p.worker_get(worker, scope);
END
$$;

-- Removes a stale worker (409 while it is seen, unless `force`) and releases its leases: their
-- lease end becomes now, so the next fetch reclaims them (a new attempt, as for any expired
-- lease) and the queue's maintenance step is due at once. Returns the leases released.
CREATE OR REPLACE FUNCTION s3p.worker_deregister(worker text, force boolean, scope text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    w s3p.workers;
    q record;
    n bigint;
    released bigint := 0;
BEGIN
    SELECT * INTO w FROM s3p.workers x WHERE x.id = worker FOR UPDATE;
    IF NOT FOUND OR NOT s3p.worker_in_scope(w, scope) THEN
        RAISE EXCEPTION 'worker % not found', worker USING ERRCODE = 'PV404';
    END IF;
    IF s3p.worker_state(w) <> 'stale' AND NOT force THEN
        RAISE EXCEPTION 'worker % is not stale (seen %); only a worker unseen for % ms can be deregistered',
            worker, w.last_seen_at, s3p.worker_stale_ms() USING ERRCODE = 'PV409';
    END IF;
    -- Queues in name order and jobs in id order, like every statement that locks many jobs.
    FOR q IN SELECT c.name, c.schema_name FROM s3p.queues c
              WHERE c.name = ANY (w.queues) AND s3p.in_scope(c.name, scope) ORDER BY c.name LOOP
        EXECUTE format('UPDATE %1$I.jobs SET lease_expires_at = now()
                         WHERE id IN (SELECT id FROM %1$I.jobs
                                       WHERE state = ''active'' AND worker_id = $1 AND lease_expires_at > now()
                                       ORDER BY id FOR UPDATE)',
                       q.schema_name) USING worker;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN
            UPDATE s3p.queues c SET maintain_after = now() WHERE c.name = q.name AND c.maintain_after > now();
        END IF;
        released := released + n;
    END LOOP;
    DELETE FROM s3p.workers x WHERE x.id = worker;
    RETURN released;
END
$$;

-- Maintenance mode: on with a reason and an expected end, or off.
CREATE OR REPLACE FUNCTION s3p.set_maintenance(enabled boolean, why text, expected_end timestamptz)
RETURNS SETOF s3p.system_state
LANGUAGE sql AS $$
    UPDATE s3p.system_state s
       SET maintenance = enabled,
           reason = CASE WHEN enabled THEN why END,
           enabled_at = CASE WHEN NOT enabled THEN NULL
                             WHEN s.maintenance THEN s.enabled_at ELSE now() END,
           estimated_end = CASE WHEN enabled THEN expected_end END
     WHERE s.id
    RETURNING s.*
$$;

-- Adds the events after the cursor (up to `batch` log rows) to the per-minute and per-hour
-- counts. One gateway at a time: another finds the cursor row locked and leaves. Trims rows past
-- their retention once a minute. Returns the events counted.
CREATE OR REPLACE FUNCTION s3p.stats_rollup(batch int) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    cur s3p.stats_cursor;
    last_txid xid8;
    last_seq bigint;
    counted bigint := 0;
BEGIN
    SELECT * INTO cur FROM s3p.stats_cursor c WHERE c.id FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    SELECT e.txid, e.seq INTO last_txid, last_seq
      FROM (SELECT e.txid, e.seq FROM s3p.events e, (SELECT s3p.events_horizon() AS horizon OFFSET 0) h
             WHERE (e.txid, e.seq) > (cur.txid, cur.seq) AND e.txid < h.horizon
             ORDER BY e.txid, e.seq LIMIT batch) e
     ORDER BY e.txid DESC, e.seq DESC LIMIT 1;
    IF last_txid IS NOT NULL THEN
        WITH per_minute AS MATERIALIZED (
            SELECT date_trunc('minute', e.time) AS minute, e.queue,
                   count(*) FILTER (WHERE x.type IN ('job.enqueued', 'job.scheduled')) AS enqueued,
                   count(*) FILTER (WHERE x.type = 'job.completed') AS processed,
                   count(*) FILTER (WHERE x.type = 'job.failed') AS failed
              FROM s3p.events e CROSS JOIN LATERAL s3p.event_items(e) x
             WHERE (e.txid, e.seq) > (cur.txid, cur.seq) AND (e.txid, e.seq) <= (last_txid, last_seq)
               AND e.queue IS NOT NULL
               AND x.type IN ('job.enqueued', 'job.scheduled', 'job.completed', 'job.failed')
             GROUP BY 1, 2),
        minutes AS (
            INSERT INTO s3p.stats_minute AS s (minute, queue, enqueued, processed, failed)
            SELECT p.minute, p.queue, p.enqueued, p.processed, p.failed FROM per_minute p
             ORDER BY p.minute, p.queue
            ON CONFLICT (minute, queue) DO UPDATE
               SET enqueued = s.enqueued + excluded.enqueued, processed = s.processed + excluded.processed,
                   failed = s.failed + excluded.failed),
        hours AS (
            INSERT INTO s3p.stats_hour AS s (hour, queue, enqueued, processed, failed)
            SELECT date_trunc('hour', p.minute), p.queue, sum(p.enqueued), sum(p.processed), sum(p.failed)
              FROM per_minute p GROUP BY 1, 2 ORDER BY 1, 2
            ON CONFLICT (hour, queue) DO UPDATE
               SET enqueued = s.enqueued + excluded.enqueued, processed = s.processed + excluded.processed,
                   failed = s.failed + excluded.failed)
        SELECT coalesce(sum(p.enqueued + p.processed + p.failed), 0) INTO counted FROM per_minute p;
        UPDATE s3p.stats_cursor c SET txid = last_txid, seq = last_seq WHERE c.id;
    END IF;
    IF cur.trimmed_at < now() - interval '1 minute' THEN
        DELETE FROM s3p.stats_minute s WHERE s.minute < now() - interval '24 hours';
        DELETE FROM s3p.stats_hour s WHERE s.hour < now() - interval '30 days';
        DELETE FROM s3p.workers w WHERE w.last_seen_at < now() - interval '24 hours';
        UPDATE s3p.stats_cursor c SET trimmed_at = now() WHERE c.id;
    END IF;
    RETURN counted;
END
$$;

-- A gateway's tick: hands over the workers it saw, steps the rollup, and reads what every
-- gateway must follow: maintenance mode and the workers asked to be quiet.
CREATE OR REPLACE FUNCTION s3p.admin_tick(seen jsonb, batch int)
RETURNS TABLE (maintenance boolean, reason text, enabled_at timestamptz, estimated_end timestamptz,
               quiet text[])
LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_array_length(coalesce(seen, '[]')) > 0 THEN
        PERFORM s3p.workers_seen(seen);
    END IF;
    IF batch > 0 THEN
        PERFORM s3p.stats_rollup(batch);
    END IF;
    RETURN QUERY
        SELECT s.maintenance, s.reason, s.enabled_at, s.estimated_end,
               ARRAY(SELECT w.id FROM s3p.workers w WHERE w.state = 'quiet' ORDER BY w.id LIMIT 10000)
          FROM s3p.system_state s WHERE s.id;
END
$$;

-- Throughput buckets of `period_s` seconds from `since` to `until` (empty buckets as zeros), of
-- one queue or all in scope: per-minute rows for periods under an hour, per-hour rows otherwise.
CREATE OR REPLACE FUNCTION s3p.stats_history(period_s int, since timestamptz, until timestamptz,
                                             only_queue text, scope text[] DEFAULT NULL)
RETURNS TABLE (bucket timestamptz, enqueued bigint, processed bigint, failed bigint)
LANGUAGE sql STABLE AS $$
    WITH rows AS (
        SELECT m.minute AS at, m.enqueued, m.processed, m.failed, m.queue
          FROM s3p.stats_minute m
         WHERE period_s < 3600 AND m.minute >= since - make_interval(secs => period_s) AND m.minute <= until
        UNION ALL
        SELECT h.hour, h.enqueued, h.processed, h.failed, h.queue
          FROM s3p.stats_hour h
         WHERE period_s >= 3600 AND h.hour >= since - make_interval(secs => period_s) AND h.hour <= until),
    buckets AS (
        SELECT generate_series(to_timestamp(floor(extract(epoch FROM since) / period_s) * period_s),
                               until, make_interval(secs => period_s)) AS bucket)
    SELECT b.bucket, coalesce(sum(r.enqueued), 0)::bigint, coalesce(sum(r.processed), 0)::bigint,
           coalesce(sum(r.failed), 0)::bigint
      FROM buckets b
      LEFT JOIN rows r
        ON r.at >= b.bucket AND r.at < b.bucket + make_interval(secs => period_s)
       AND (only_queue IS NULL OR r.queue = only_queue) AND s3p.in_scope(r.queue, scope)
     GROUP BY b.bucket
     ORDER BY b.bucket
$$;

-- Completions and failures of the last `minutes` whole minutes and the current one, in scope.
CREATE OR REPLACE FUNCTION s3p.stats_recent(minutes int, scope text[] DEFAULT NULL)
RETURNS TABLE (processed bigint, failed bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(m.processed), 0)::bigint, coalesce(sum(m.failed), 0)::bigint
      FROM s3p.stats_minute m
     WHERE m.minute >= date_trunc('minute', now()) - make_interval(mins => minutes)
       AND s3p.in_scope(m.queue, scope)
$$;

-- Cron entries as the admin UI pages them (page numbers): at most `page_size` from `page_offset`
-- in name order, of the queues in `scope`.
CREATE OR REPLACE FUNCTION s3p.cron_page_at(scope text[], page_offset int, page_size int)
RETURNS SETOF s3p.cron_jobs
LANGUAGE sql STABLE AS $$
    SELECT * FROM s3p.cron_jobs c WHERE s3p.in_scope(s3p.cron_queue(c), scope)
     ORDER BY c.name OFFSET page_offset LIMIT page_size
$$;

-- One cron entry of a queue in `scope` (404 otherwise).
CREATE OR REPLACE FUNCTION s3p.cron_get(cron_name text, scope text[] DEFAULT NULL)
RETURNS SETOF s3p.cron_jobs
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT * FROM s3p.cron_jobs c
                  WHERE c.name = cron_name AND s3p.in_scope(s3p.cron_queue(c), scope);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cron job % not found', cron_name USING ERRCODE = 'PV404';
    END IF;
END
$$;

-- Pauses (enabled false) or resumes a cron entry; resuming sets its next run (`next_run`, the
-- caller's next slot after now) so slots missed while paused are not fired.
CREATE OR REPLACE FUNCTION s3p.cron_set_enabled(cron_name text, on_off boolean, next_run timestamptz,
                                                scope text[] DEFAULT NULL)
RETURNS SETOF s3p.cron_jobs
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY UPDATE s3p.cron_jobs c
                    SET enabled = on_off,
                        next_run_at = CASE WHEN on_off AND NOT c.enabled THEN next_run ELSE c.next_run_at END
                  WHERE c.name = cron_name AND s3p.in_scope(s3p.cron_queue(c), scope)
                 RETURNING *;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cron job % not found', cron_name USING ERRCODE = 'PV404';
    END IF;
END
$$;
