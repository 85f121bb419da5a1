
-- ---------------------------------------------------------------------------------------------
-- Streams: an append-only event log in three TRUNCATE-rotated partitions, snapshot-delimited
-- batches and fan-out cursors (PgQue's model). Appended to the queue template.
-- Mutations that append events or allocate a cursor position hold the shared advisory lock of the
-- queue; rotation holds it exclusively.

CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_config (
    singleton           boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_retries         int    NOT NULL DEFAULT 5,
    retention_ms        bigint NOT NULL DEFAULT 604800000,
    takeover_ms         bigint NOT NULL DEFAULT 300000,
    current_segment     int    NOT NULL DEFAULT 0,
    segment_started_at  timestamptz NOT NULL DEFAULT now(),
    rotations           bigint NOT NULL DEFAULT 0
);
INSERT INTO __SCHEMA__.stream_config DEFAULT VALUES ON CONFLICT DO NOTHING;
-- The most events and bytes (s3p.stream_event_bytes) one tick may add: ticks are cut to them,
-- except that one transaction's events are never split (a batch is a snapshot diff).
ALTER TABLE __SCHEMA__.stream_config ADD COLUMN IF NOT EXISTS tick_max_events int NOT NULL DEFAULT 1000;
ALTER TABLE __SCHEMA__.stream_config ADD COLUMN IF NOT EXISTS tick_max_bytes bigint NOT NULL DEFAULT 4194304;

CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.stream_tick_seq;
CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_ticks (
    tick_id    bigint PRIMARY KEY DEFAULT nextval('__SCHEMA__.stream_tick_seq'),
    snapshot   pg_snapshot NOT NULL,
    max_seq    bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- What a tick added over the tick before it (`prev_tick`): all its events, and those targeted at
-- one consumer. A receive reads a batch's size from here instead of counting it (NULL: unknown).
ALTER TABLE __SCHEMA__.stream_ticks ADD COLUMN IF NOT EXISTS prev_tick bigint;
ALTER TABLE __SCHEMA__.stream_ticks ADD COLUMN IF NOT EXISTS added bigint;
ALTER TABLE __SCHEMA__.stream_ticks ADD COLUMN IF NOT EXISTS targeted bigint;
-- The size of the events it added (s3p.stream_event_bytes), for the receive's byte budget.
ALTER TABLE __SCHEMA__.stream_ticks ADD COLUMN IF NOT EXISTS added_bytes bigint;

-- Per physical segment: when it stopped being current and its seal (a snapshot xmax taken in a
-- later transaction, so every writer of the segment is below it).
CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_segments (
    segment     int PRIMARY KEY CHECK (segment BETWEEN 0 AND 2),
    switched_at timestamptz,
    sealed_xid  xid8,
    sealed_at   timestamptz
);
INSERT INTO __SCHEMA__.stream_segments (segment) VALUES (0), (1), (2) ON CONFLICT DO NOTHING;

CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.stream_seq;
CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_events (
    seq         bigint NOT NULL DEFAULT nextval('__SCHEMA__.stream_seq'),
    segment     int    NOT NULL,
    event_id    uuid   NOT NULL,
    txid        xid8   NOT NULL DEFAULT pg_current_xact_id(),
    type        text   NOT NULL,
    payload     jsonb  NOT NULL,
    headers     jsonb,
    retry_count int    NOT NULL DEFAULT 0,
    -- A retried or replayed event belongs to the consumer (or group) that nacked it.
    target      text,
    created_at  timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (segment);
CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_events_0 PARTITION OF __SCHEMA__.stream_events FOR VALUES IN (0);
CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_events_1 PARTITION OF __SCHEMA__.stream_events FOR VALUES IN (1);
CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_events_2 PARTITION OF __SCHEMA__.stream_events FOR VALUES IN (2);
CREATE INDEX IF NOT EXISTS stream_events_txid ON __SCHEMA__.stream_events (txid);
CREATE INDEX IF NOT EXISTS stream_events_seq ON __SCHEMA__.stream_events (seq);

CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_subscriptions (
    consumer    text PRIMARY KEY,
    -- The fan-out cursor: every event visible in this tick's snapshot is done.
    last_tick   bigint NOT NULL,
    -- Cooperative groups: the allocation frontier (last_tick is the contiguous acked prefix).
    next_tick   bigint NOT NULL,
    cooperative boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_batches (
    batch_id   uuid PRIMARY KEY,
    consumer   text NOT NULL REFERENCES __SCHEMA__.stream_subscriptions ON DELETE CASCADE,
    member     text NOT NULL DEFAULT '',
    start_tick bigint NOT NULL,
    end_tick   bigint NOT NULL,
    -- active, acked or taken_over
    state      text NOT NULL DEFAULT 'active',
    created_at timestamptz NOT NULL DEFAULT now(),
    acked_at   timestamptz
);
CREATE UNIQUE INDEX IF NOT EXISTS stream_batches_one_active
    ON __SCHEMA__.stream_batches (consumer, member) WHERE state = 'active';
CREATE INDEX IF NOT EXISTS stream_batches_by_start ON __SCHEMA__.stream_batches (consumer, start_tick);

-- A batch's events are not copied: they are recomputed from its two tick snapshots (events never
-- change, and cursors keep their segment from rotating away), so receive and ack write no row per
-- event. Only a nacked message is recorded, so it cannot be nacked twice in one batch.
DROP TABLE IF EXISTS __SCHEMA__.stream_batch_events;
CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_batch_nacks (
    batch_id uuid   NOT NULL REFERENCES __SCHEMA__.stream_batches ON DELETE CASCADE,
    seq      bigint NOT NULL,
    PRIMARY KEY (batch_id, seq)
);

CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_retry_events (
    id          bigserial PRIMARY KEY,
    event_id    uuid  NOT NULL,
    consumer    text  NOT NULL,
    type        text  NOT NULL,
    payload     jsonb NOT NULL,
    headers     jsonb,
    retry_count int   NOT NULL,
    reason      text,
    due_at      timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS stream_retry_events_due ON __SCHEMA__.stream_retry_events (due_at);

CREATE TABLE IF NOT EXISTS __SCHEMA__.stream_dead_letters (
    id          uuid PRIMARY KEY,
    event_id    uuid  NOT NULL,
    consumer    text  NOT NULL,
    type        text  NOT NULL,
    payload     jsonb NOT NULL,
    headers     jsonb,
    retry_count int   NOT NULL,
    reason      text,
    failed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS stream_dead_letters_failed ON __SCHEMA__.stream_dead_letters (failed_at);


-- The current snapshot with this transaction itself counted as in progress. PostgreSQL leaves the
-- own xid out of a snapshot's in-progress list, so a plain pg_current_snapshot() taken after this
-- transaction appended would count its uncommitted events as visible once a later xid commits.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_snapshot() RETURNS pg_snapshot
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    snap pg_snapshot := pg_current_snapshot();
    own xid8 := pg_current_xact_id_if_assigned();
    in_progress text;
BEGIN
    IF own IS NULL OR NOT pg_visible_in_snapshot(own, snap) THEN
        RETURN snap;
    END IF;
    SELECT string_agg(x::text, ',' ORDER BY x) INTO in_progress
      FROM (SELECT pg_snapshot_xip(snap) AS x UNION SELECT own) t;
    RETURN format('%s:%s:%s', least(pg_snapshot_xmin(snap), own), pg_snapshot_xmax(snap), in_progress)::pg_snapshot;
END
$fn$;

-- The shared (writers, cursor allocation) or exclusive (rotation) stream lock of this queue.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_lock(exclusive boolean) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF exclusive THEN
        PERFORM pg_advisory_xact_lock(hashtext('s3p.stream:__SCHEMA__'));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(hashtext('s3p.stream:__SCHEMA__'));
    END IF;
END
$fn$;

-- The exclusive stream lock, waiting at most 50 ms for the transactions that hold the stream lock
-- now (this one's own shared hold does not count); false when they still hold it. Short holders
-- (appends, receives) finish within that, so a busy stream still rotates; a writer holding an
-- uncommitted append for longer makes the rotation give up until a later pass, and the writers
-- queued behind the attempt wait at most those 50 ms.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_try_lock_exclusive() RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    previous text := current_setting('lock_timeout');
    got boolean;
BEGIN
    PERFORM set_config('lock_timeout', '50ms', true);
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('s3p.stream:__SCHEMA__'));
        got := true;
    EXCEPTION WHEN lock_not_available THEN
        got := false;
    END;
    PERFORM set_config('lock_timeout', previous, true);
    RETURN got;
END
$fn$;

-- Events visible in snapshot `upto` and not in `since`, for `consumer` (txid range scan).
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_between(since pg_snapshot, upto pg_snapshot, consumer text)
RETURNS SETOF __SCHEMA__.stream_events
LANGUAGE sql STABLE AS $fn$
    SELECT * FROM __SCHEMA__.stream_events e
     WHERE e.txid >= pg_snapshot_xmin(since) AND e.txid < pg_snapshot_xmax(upto)
       AND pg_visible_in_snapshot(e.txid, upto) AND NOT pg_visible_in_snapshot(e.txid, since)
       AND (e.target IS NULL OR e.target = consumer)
$fn$;

-- Refuses (PV429) adding `adding` events to the stream of the queue named `queue_name` (this
-- schema's) when its `max_stream_events` quota would be passed. Every path that adds events at a
-- client's request (appends, replays) checks here, before the stream lock; retries moved back by
-- maintenance are messages already accepted and do not.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_check_quota(queue_name text, adding bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    quota bigint;
    present bigint;
BEGIN
    SELECT (q.settings->>'max_stream_events')::bigint INTO quota FROM s3p.queues q WHERE q.name = queue_name;
    IF quota IS NOT NULL THEN
        -- One quota-checked writer at a time until commit, so the count is exact (see check_job_quota).
        PERFORM pg_advisory_xact_lock(hashtext('s3p.quota.stream:' || queue_name));
        SELECT count(*) INTO present FROM __SCHEMA__.stream_events;
        IF present + adding > quota THEN
            RAISE EXCEPTION 'quota max_stream_events (%) of queue % reached: % events are retained',
                quota, queue_name, present
                USING ERRCODE = 'PV429', DETAIL = 'max_stream_events';
        END IF;
    END IF;
END
$fn$;

-- Appends messages given column by column (element k of every array is message k; a NULL id
-- becomes a UUIDv7, a NULL array means NULL for every message) to the current segment of the
-- queue named `queue_name` (this schema's), in the order given, within its `max_stream_events`
-- quota, and wakes its long-polling receivers. Answers one row: the events' ids and seqs in the
-- order given (a row per event cost a batch's caller more than the arrays). Every append ends
-- here: gateways that know the schema call it directly, the rest through
-- s3p.stream_append_columns.
DROP FUNCTION IF EXISTS __SCHEMA__.stream_append(jsonb);
DROP FUNCTION IF EXISTS __SCHEMA__.stream_insert(uuid[], text[], jsonb[], jsonb[]);
DROP FUNCTION IF EXISTS __SCHEMA__.stream_insert(text, uuid[], text[], jsonb[], jsonb[]);
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_insert(queue_name text, ids uuid[], types text[],
                                                    payloads jsonb[], headers jsonb[],
                                                    OUT event_ids uuid[], OUT seqs bigint[])
LANGUAGE plpgsql AS $fn$
DECLARE
    segment_now int;
BEGIN
    PERFORM __SCHEMA__.stream_check_quota(queue_name, coalesce(cardinality(types), 0));
    PERFORM __SCHEMA__.stream_lock(false);
    SELECT current_segment INTO segment_now FROM __SCHEMA__.stream_config;
    -- nextval runs after the sort, so seq order is the order given.
    WITH appended AS (
        INSERT INTO __SCHEMA__.stream_events AS e (segment, event_id, type, payload, headers)
        SELECT segment_now, coalesce(u.id, s3p.uuid_v7()), u.type, u.payload, u.header
          FROM unnest(ids, types, payloads, headers) WITH ORDINALITY AS u(id, type, payload, header, n)
         ORDER BY u.n
        RETURNING e.event_id, e.seq
    )
    SELECT coalesce(array_agg(a.event_id ORDER BY a.seq), '{}'), coalesce(array_agg(a.seq ORDER BY a.seq), '{}')
      INTO event_ids, seqs
      FROM appended a;
    PERFORM pg_notify('s3p_streams', queue_name);
END
$fn$;

-- Subscribes a consumer at the latest tick (NULL), the oldest retained tick (0) or a given tick.
-- An existing subscription is returned unchanged.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_subscribe(name text, from_tick bigint, is_cooperative boolean)
RETURNS TABLE (consumer text, last_tick bigint, cooperative boolean, created boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    start bigint;
BEGIN
    PERFORM __SCHEMA__.stream_lock(false);
    IF EXISTS (SELECT 1 FROM __SCHEMA__.stream_subscriptions s WHERE s.consumer = name) THEN
        RETURN QUERY SELECT s.consumer, s.last_tick, s.cooperative, false
                       FROM __SCHEMA__.stream_subscriptions s WHERE s.consumer = name;
        RETURN;
    END IF;
    IF from_tick IS NULL THEN
        SELECT max(t.tick_id) INTO start FROM __SCHEMA__.stream_ticks t;
    ELSIF from_tick = 0 THEN
        SELECT min(t.tick_id) INTO start FROM __SCHEMA__.stream_ticks t;
    ELSE
        SELECT t.tick_id INTO start FROM __SCHEMA__.stream_ticks t WHERE t.tick_id = from_tick;
        IF start IS NULL THEN
            RAISE EXCEPTION 'tick % is not retained', from_tick USING ERRCODE = 'PV400';
        END IF;
    END IF;
    RETURN QUERY
    INSERT INTO __SCHEMA__.stream_subscriptions AS s (consumer, last_tick, next_tick, cooperative)
    VALUES (name, start, start, coalesce(is_cooperative, false))
    ON CONFLICT ON CONSTRAINT stream_subscriptions_pkey DO NOTHING
    RETURNING s.consumer, s.last_tick, s.cooperative, true;
END
$fn$;

-- Removes a consumer, its batches and its pending retries.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_unsubscribe(name text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM __SCHEMA__.stream_subscriptions s WHERE s.consumer = name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer % not found', name USING ERRCODE = 'PV404';
    END IF;
    DELETE FROM __SCHEMA__.stream_retry_events r WHERE r.consumer = name;
    RETURN true;
END
$fn$;

-- The events of an active batch, unordered (callers order by seq): those visible in its end tick
-- and not in its start tick. An acked or taken-over batch has none (its segment may since have
-- rotated away).
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_batch_events(id uuid)
RETURNS TABLE (seq bigint, event_id uuid, type text, payload jsonb, headers jsonb, retry_count int,
               created_at timestamptz)
LANGUAGE sql STABLE AS $fn$
    SELECT e.seq, e.event_id, e.type, e.payload, e.headers, e.retry_count, e.created_at
      FROM __SCHEMA__.stream_batches b
      JOIN __SCHEMA__.stream_ticks since ON since.tick_id = b.start_tick
      JOIN __SCHEMA__.stream_ticks upto ON upto.tick_id = b.end_tick
     CROSS JOIN LATERAL __SCHEMA__.stream_between(since.snapshot, upto.snapshot, b.consumer) e
     WHERE b.batch_id = id AND b.state = 'active'
$fn$;

-- A batch as one row: its own columns, then its events' columns as arrays, element k of each
-- array the same event (NULL when it has none). The arrays are not sorted here: every aggregate
-- with its own ORDER BY sorted the events again (seven sorts of 1,000 rows cost more than the
-- rows saved); the reader puts them in log order (store::stream::batch sorts by seq). One row of
-- arrays, not a row per event: the rows' materialization and per-row decoding were a third of
-- the gateway's cost of a 1,000-event receive.
DROP FUNCTION IF EXISTS __SCHEMA__.stream_batch_contents(uuid);
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_batch_contents(id uuid)
RETURNS TABLE (batch_id uuid, consumer text, member text, start_tick bigint, end_tick bigint,
               state text, batch_created_at timestamptz, seqs bigint[], event_ids uuid[],
               types text[], payloads jsonb[], headers jsonb[], retry_counts int[],
               created_ats timestamptz[])
LANGUAGE sql STABLE AS $fn$
    SELECT b.batch_id, b.consumer, b.member, b.start_tick, b.end_tick, b.state, b.created_at,
           e.seqs, e.event_ids, e.types, e.payloads, e.headers, e.retry_counts, e.created_ats
      FROM __SCHEMA__.stream_batches b
     CROSS JOIN LATERAL (
           SELECT array_agg(x.seq) AS seqs, array_agg(x.event_id) AS event_ids,
                  array_agg(x.type) AS types, array_agg(x.payload) AS payloads,
                  array_agg(x.headers) AS headers, array_agg(x.retry_count) AS retry_counts,
                  array_agg(x.created_at) AS created_ats
             FROM __SCHEMA__.stream_batch_events(id) x) e
     WHERE b.batch_id = id
$fn$;

-- The stream's tick lock: one transaction at a time cuts ticks, and holds it until it commits, so
-- tick ids, snapshots and commits follow one order and a cutter sees the ticks cut before it.
-- Taken after the stream lock and the consumer's subscription row (see "Lock order"). Without
-- `wait`, false when another transaction holds it.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_lock_ticks(wait boolean) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    IF wait THEN
        PERFORM pg_advisory_xact_lock(hashtext('s3p.stream.ticks:__SCHEMA__'));
        RETURN true;
    END IF;
    RETURN pg_try_advisory_xact_lock(hashtext('s3p.stream.ticks:__SCHEMA__'));
END
$fn$;

-- Cuts one tick after the latest: the transactions visible in `now_snap` and not in the latest
-- tick, in txid order, while their events stay within `max_events` and `max_bytes` (a first
-- transaction over either bound is taken alone: its events are never split). When all of them
-- fit, the tick is `now_snap`; else it is a snapshot showing what the latest tick showed plus the
-- transactions taken, and hiding the rest. Its visible set lies between the two real snapshots,
-- so ticks stay ordered, and a transaction left out or still in progress shows in a later tick:
-- never skipped. `tick` is NULL when nothing new is visible (unless `force`); `complete` says
-- whether the tick reached `now_snap`. The caller holds the tick lock and took `now_snap` after
-- it (stream_snapshot()).
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_cut(max_events bigint, max_bytes bigint, now_snap pg_snapshot,
                                                 force boolean, OUT tick bigint, OUT complete boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    latest record;
    late xid8[];
    g record;
    n bigint := 0;
    n_targeted bigint := 0;
    n_bytes bigint := 0;
    top bigint;
    cut xid8;
    upto xid8;
    hidden xid8[];
    snap pg_snapshot := now_snap;
    groups refcursor;
    past_latest boolean := false;
    overflows boolean;
BEGIN
    complete := true;
    SELECT t.tick_id, t.snapshot, t.max_seq INTO latest
      FROM __SCHEMA__.stream_ticks t ORDER BY t.tick_id DESC LIMIT 1;
    IF latest.tick_id IS NULL THEN
        INSERT INTO __SCHEMA__.stream_ticks (snapshot, max_seq)
        VALUES (now_snap, coalesce((SELECT max(e.seq) FROM __SCHEMA__.stream_events e), 0))
        RETURNING tick_id INTO tick;
        RETURN;
    END IF;

    -- What the latest tick left out, one transaction's events at a time in txid order: first the
    -- late commits (in progress at the latest tick, finished now; all below its xmax), then the
    -- transactions from its xmax on, up to the first that overflows. One pass over about one
    -- tick's events and the next transaction's, each event's size computed once. FETCH, not a FOR
    -- loop: that reads ten transactions ahead.
    late := ARRAY(SELECT x FROM pg_snapshot_xip(latest.snapshot) x
                   WHERE pg_visible_in_snapshot(x, now_snap) ORDER BY x);
    OPEN groups FOR
        SELECT e.txid, count(*) AS n, count(e.target) AS targeted,
               sum(s3p.stream_event_bytes(e.payload, e.headers)) AS bytes, max(e.seq) AS top
          FROM __SCHEMA__.stream_events e WHERE e.txid = ANY (late)
         GROUP BY e.txid ORDER BY e.txid;
    LOOP
        FETCH groups INTO g;
        IF NOT FOUND THEN
            CLOSE groups;
            EXIT WHEN past_latest;
            past_latest := true;
            OPEN groups FOR
                SELECT e.txid, count(*) AS n, count(e.target) AS targeted,
                       sum(s3p.stream_event_bytes(e.payload, e.headers)) AS bytes, max(e.seq) AS top
                  FROM __SCHEMA__.stream_events e
                 WHERE e.txid >= pg_snapshot_xmax(latest.snapshot) AND e.txid < pg_snapshot_xmax(now_snap)
                   AND pg_visible_in_snapshot(e.txid, now_snap)
                 GROUP BY e.txid ORDER BY e.txid;
            CONTINUE;
        END IF;
        overflows := n + g.n > max_events OR n_bytes + g.bytes > max_bytes;
        IF overflows AND n > 0 THEN
            cut := g.txid;
            EXIT;
        END IF;
        n := n + g.n;
        n_targeted := n_targeted + g.targeted;
        n_bytes := n_bytes + g.bytes;
        top := greatest(top, g.top);
        IF overflows THEN
            -- A first transaction over either bound is taken alone.
            cut := (g.txid::text::numeric + 1)::text::xid8;
            EXIT;
        END IF;
    END LOOP;
    IF cut IS NOT NULL THEN
        CLOSE groups;
    END IF;

    IF cut IS NOT NULL THEN
        -- Visible: below `upto` and neither in progress now nor a late commit from `cut` on.
        complete := false;
        upto := greatest(pg_snapshot_xmax(latest.snapshot), cut);
        hidden := ARRAY(SELECT h.x FROM (
                            SELECT x FROM pg_snapshot_xip(latest.snapshot) x WHERE x >= cut
                            UNION SELECT x FROM pg_snapshot_xip(now_snap) x WHERE x < upto) h
                         ORDER BY h.x);
        snap := format('%s:%s:%s', least(hidden[1], upto), upto, array_to_string(hidden, ','))::pg_snapshot;
    END IF;
    -- n, n_targeted, n_bytes and top now count what `snap` shows beyond the latest tick: the late
    -- commits and the transactions before `cut` taken above.

    IF n = 0 AND NOT force THEN
        RETURN;
    END IF;
    INSERT INTO __SCHEMA__.stream_ticks (snapshot, max_seq, prev_tick, added, targeted, added_bytes)
    VALUES (snap,
            CASE WHEN complete THEN coalesce((SELECT max(e.seq) FROM __SCHEMA__.stream_events e), 0)
                 ELSE greatest(latest.max_seq, top) END,
            latest.tick_id, n, n_targeted, n_bytes)
    RETURNING tick_id INTO tick;
END
$fn$;

-- Cuts ticks after the latest, each within `cut_events` events and `cut_bytes` bytes (the first
-- even when nothing is new, with `force`), until they cover what is visible now (then true), or
-- `max_ticks` ticks are cut, or the ticks cut add up to `want_events` events or `want_bytes` bytes
-- (NULL: no such limit). The caller holds the stream's lock and its tick lock.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_cut_some(cut_events bigint, cut_bytes bigint, force boolean,
                                                      max_ticks int, want_events bigint, want_bytes bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    now_snap pg_snapshot := __SCHEMA__.stream_snapshot();
    made record;
    added record;
    cut int := 0;
    n bigint := 0;
    bytes bigint := 0;
BEGIN
    LOOP
        SELECT * INTO made FROM __SCHEMA__.stream_cut(cut_events, cut_bytes, now_snap, force);
        IF made.tick IS NULL OR made.complete THEN
            RETURN true;
        END IF;
        force := false;
        cut := cut + 1;
        IF want_events IS NOT NULL OR want_bytes IS NOT NULL THEN
            SELECT t.added, t.added_bytes INTO added FROM __SCHEMA__.stream_ticks t WHERE t.tick_id = made.tick;
            n := n + coalesce(added.added, 0);
            bytes := bytes + coalesce(added.added_bytes, 0);
        END IF;
        IF cut >= max_ticks OR n >= want_events OR bytes >= want_bytes THEN
            RETURN false;
        END IF;
    END LOOP;
END
$fn$;

-- Cuts ticks of what is visible now and the latest tick does not cover, each within the stream's
-- tick_max_events and tick_max_bytes (or one empty tick with `force`), at most `max_ticks` of them
-- (NULL: no limit); true when nothing visible is left un-ticked. The tick lock is held until this
-- transaction commits, so maintenance cuts a backlog a few ticks per transaction
-- (s3p.stream_ticks_per_transaction): a receive that needs a tick then waits behind those, not
-- behind the whole backlog (100 ticks in one transaction held it about 110 ms). The snapshot never
-- counts this transaction's own appends as visible.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_tick_some(force boolean, max_ticks int) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    cfg __SCHEMA__.stream_config;
BEGIN
    PERFORM __SCHEMA__.stream_lock(false);
    PERFORM __SCHEMA__.stream_lock_ticks(true);
    SELECT * INTO cfg FROM __SCHEMA__.stream_config;
    RETURN __SCHEMA__.stream_cut_some(cfg.tick_max_events, cfg.tick_max_bytes, force, max_ticks, NULL, NULL);
END
$fn$;

-- Ticks everything visible now that the latest tick does not cover (stream_tick_some without a
-- limit); returns the latest tick.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_tick(force boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM __SCHEMA__.stream_tick_some(force, NULL);
    RETURN (SELECT max(t.tick_id) FROM __SCHEMA__.stream_ticks t);
END
$fn$;

-- A receive's bounds: the most events it takes (`max_events`, NULL: the stream's tick_max_events),
-- and the ticks it cuts, within those and the stream's tick bounds (whether the receive cuts them
-- itself or stream_tick_for does for it).
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_receive_bounds(cfg __SCHEMA__.stream_config, max_events int,
                                                            max_bytes bigint, OUT limit_events bigint,
                                                            OUT cut_events bigint, OUT cut_bytes bigint)
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT coalesce(max_events, cfg.tick_max_events)::bigint,
           least(coalesce(max_events, cfg.tick_max_events), cfg.tick_max_events)::bigint,
           least(max_bytes, cfg.tick_max_bytes)
$fn$;

-- Cuts ticks for a receive that answered 'tick_needed', in this transaction of its own: while
-- the ticks after `after` hold fewer than `max_events` events (NULL: the stream's
-- tick_max_events) and `max_bytes` bytes, each tick within those bounds and the stream's (as a
-- receive cuts them), at most 100. Nothing when another transaction cut past `after` meanwhile.
-- Its commit need not wait for the WAL flush: a receive that delivers from these ticks commits
-- later with a flush, which covers this commit (the WAL is flushed in order), and nothing else
-- reads them before a restart.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_tick_for(after bigint, max_events int, max_bytes bigint)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    cfg __SCHEMA__.stream_config;
    bounds record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM __SCHEMA__.stream_lock(false);
    PERFORM __SCHEMA__.stream_lock_ticks(true);
    IF EXISTS (SELECT 1 FROM __SCHEMA__.stream_ticks t WHERE t.tick_id > after) THEN
        RETURN;
    END IF;
    SELECT * INTO cfg FROM __SCHEMA__.stream_config;
    SELECT * INTO bounds FROM __SCHEMA__.stream_receive_bounds(cfg, max_events, max_bytes);
    PERFORM __SCHEMA__.stream_cut_some(bounds.cut_events, bounds.cut_bytes, false, 100,
                                       bounds.limit_events, max_bytes);
END
$fn$;

-- The row a receive answers instead of cutting a tick itself (see stream_receive): no batch id,
-- state 'tick_needed', and the tick after which one is needed as its start tick.
DROP FUNCTION IF EXISTS __SCHEMA__.stream_tick_needed(text, text, bigint);
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_tick_needed(name text, who text, after bigint)
RETURNS TABLE (batch_id uuid, consumer text, member text, start_tick bigint, end_tick bigint,
               state text, batch_created_at timestamptz, seqs bigint[], event_ids uuid[],
               types text[], payloads jsonb[], headers jsonb[], retry_counts int[],
               created_ats timestamptz[])
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT NULL::uuid, name, who, after, NULL::bigint, 'tick_needed'::text, NULL::timestamptz,
           NULL::bigint[], NULL::uuid[], NULL::text[], NULL::jsonb[], NULL::jsonb[], NULL::int[],
           NULL::timestamptz[]
$fn$;

-- Receives the next batch for a consumer (or a cooperative member): the active batch again if
-- there is one; else the events from the cursor tick to the next tick, merging further ticks while
-- the total stays within `max_events` events (NULL: the stream's tick_max_events) and `max_bytes`
-- bytes (s3p.stream_event_bytes). A next tick alone over either raises PV413 (DETAIL: its events
-- and bytes as JSON) and changes nothing. Past the newest tick it cuts ticks on demand, each
-- within the receive's bounds and the stream's tick bounds. Empty ranges move the cursor. Returns
-- no rows when there is nothing to deliver. Without `cut_ticks`, on a stream with other
-- subscriptions, it cuts none: where it would cut one it answers a single row with state
-- 'tick_needed' (no batch id) instead, and the caller cuts in a transaction of its own
-- (stream_tick_for) and asks again, so the other consumers of that tick wait for the cut only,
-- not for this receive's read and commit.
DROP FUNCTION IF EXISTS __SCHEMA__.stream_receive(text, text, int, uuid);
DROP FUNCTION IF EXISTS __SCHEMA__.stream_receive(text, text, int, uuid, bigint);
DROP FUNCTION IF EXISTS __SCHEMA__.stream_receive(text, text, int, uuid, bigint, boolean);
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_receive(name text, member_name text, max_events int, new_batch uuid,
                                                     max_bytes bigint DEFAULT 16777216,
                                                     cut_ticks boolean DEFAULT true)
RETURNS TABLE (batch_id uuid, consumer text, member text, start_tick bigint, end_tick bigint,
               state text, batch_created_at timestamptz, seqs bigint[], event_ids uuid[],
               types text[], payloads jsonb[], headers jsonb[], retry_counts int[],
               created_ats timestamptz[])
LANGUAGE plpgsql AS $fn$
DECLARE
    sub         __SCHEMA__.stream_subscriptions;
    who         text := coalesce(member_name, '');
    existing    uuid;
    cursor_tick bigint;
    cursor_snap pg_snapshot;
    next_tick   record;
    end_tick_id bigint;
    end_snap    pg_snapshot;
    n           bigint;
    bytes       bigint;
    merged      int := 0;
    cfg         __SCHEMA__.stream_config;
    limit_events bigint;
    cut_events  bigint;
    cut_bytes   bigint;
    made        record;
    -- What is visible now, taken into a variable before stream_between reads it: a volatile call
    -- among its arguments keeps that function from being inlined, and it then read every event
    -- past the cursor (tens of ms on a backlog) where the txid index finds the first.
    now_snapshot pg_snapshot;
BEGIN
    PERFORM __SCHEMA__.stream_lock(false);
    SELECT * INTO cfg FROM __SCHEMA__.stream_config;
    SELECT b.limit_events, b.cut_events, b.cut_bytes INTO limit_events, cut_events, cut_bytes
      FROM __SCHEMA__.stream_receive_bounds(cfg, max_events, max_bytes) b;
    SELECT * INTO sub FROM __SCHEMA__.stream_subscriptions s WHERE s.consumer = name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer % not found', name USING ERRCODE = 'PV404';
    END IF;
    IF who <> '' AND NOT sub.cooperative THEN
        RAISE EXCEPTION 'consumer % is not cooperative; receive without member', name USING ERRCODE = 'PV400';
    END IF;

    SELECT b.batch_id INTO existing FROM __SCHEMA__.stream_batches b
     WHERE b.consumer = name AND b.member = who AND b.state = 'active';
    IF FOUND THEN
        RETURN QUERY SELECT * FROM __SCHEMA__.stream_batch_contents(existing);
        RETURN;
    END IF;

    IF sub.cooperative THEN
        -- Take over the oldest batch another member left unacked past the takeover interval.
        SELECT b.batch_id INTO existing FROM __SCHEMA__.stream_batches b
         WHERE b.consumer = name AND b.state = 'active'
           AND b.created_at < now() - make_interval(secs => cfg.takeover_ms / 1000.0)
         ORDER BY b.start_tick LIMIT 1 FOR UPDATE;
        IF FOUND THEN
            UPDATE __SCHEMA__.stream_batches b SET state = 'taken_over' WHERE b.batch_id = existing;
            INSERT INTO __SCHEMA__.stream_batches (batch_id, consumer, member, start_tick, end_tick)
            SELECT new_batch, b.consumer, who, b.start_tick, b.end_tick
              FROM __SCHEMA__.stream_batches b WHERE b.batch_id = existing;
            UPDATE __SCHEMA__.stream_batch_nacks n SET batch_id = new_batch WHERE n.batch_id = existing;
            RETURN QUERY SELECT * FROM __SCHEMA__.stream_batch_contents(new_batch);
            RETURN;
        END IF;
        cursor_tick := sub.next_tick;
    ELSE
        cursor_tick := sub.last_tick;
    END IF;
    -- With no other subscription, no other consumer waits for a tick this receive cuts: it cuts
    -- here (a transaction of its own would only add two statements to this consumer's path).
    cut_ticks := cut_ticks OR NOT EXISTS (SELECT 1 FROM __SCHEMA__.stream_subscriptions s WHERE s.consumer <> name);

    LOOP
        SELECT t.snapshot INTO cursor_snap FROM __SCHEMA__.stream_ticks t WHERE t.tick_id = cursor_tick;
        SELECT t.tick_id, t.snapshot, t.prev_tick, t.added, t.targeted, t.added_bytes INTO next_tick
          FROM __SCHEMA__.stream_ticks t
         WHERE t.tick_id > cursor_tick ORDER BY t.tick_id LIMIT 1;
        IF NOT FOUND THEN
            -- On-demand tick: only when there is something new to deliver, and unless another
            -- receive cut one while this one waited for the tick lock.
            now_snapshot := __SCHEMA__.stream_snapshot();
            IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.stream_between(cursor_snap, now_snapshot, name)) THEN
                RETURN;
            END IF;
            IF NOT cut_ticks THEN
                RETURN QUERY SELECT * FROM __SCHEMA__.stream_tick_needed(name, who, cursor_tick);
                RETURN;
            END IF;
            PERFORM __SCHEMA__.stream_lock_ticks(true);
            IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.stream_ticks t WHERE t.tick_id > cursor_tick) THEN
                SELECT * INTO made FROM __SCHEMA__.stream_cut(cut_events, cut_bytes, __SCHEMA__.stream_snapshot(), false);
                IF made.tick IS NULL THEN
                    RETURN;
                END IF;
            END IF;
            CONTINUE;
        END IF;

        IF next_tick.prev_tick = cursor_tick AND next_tick.targeted = 0 AND next_tick.added_bytes IS NOT NULL THEN
            -- The tick follows the cursor and holds no targeted event: its size is this batch's.
            n := next_tick.added;
            bytes := next_tick.added_bytes;
        ELSE
            SELECT count(*), coalesce(sum(s3p.stream_event_bytes(e.payload, e.headers)), 0) INTO n, bytes
              FROM __SCHEMA__.stream_between(cursor_snap, next_tick.snapshot, name) e;
        END IF;
        IF n = 0 THEN
            -- An empty range: the cursor moves past it (recorded as an acked batch for groups).
            IF sub.cooperative THEN
                INSERT INTO __SCHEMA__.stream_batches (batch_id, consumer, member, start_tick, end_tick, state, acked_at)
                VALUES (gen_random_uuid(), name, who, cursor_tick, next_tick.tick_id, 'acked', now());
                UPDATE __SCHEMA__.stream_subscriptions s SET next_tick = next_tick.tick_id WHERE s.consumer = name;
                PERFORM __SCHEMA__.stream_advance_group(name);
            ELSE
                UPDATE __SCHEMA__.stream_subscriptions s SET last_tick = next_tick.tick_id, next_tick = next_tick.tick_id
                 WHERE s.consumer = name;
            END IF;
            cursor_tick := next_tick.tick_id;
            CONTINUE;
        END IF;
        IF n > limit_events THEN
            RAISE EXCEPTION 'the next batch holds % events, more than max %', n, limit_events
                USING ERRCODE = 'PV413', DETAIL = jsonb_build_object('events', n, 'bytes', bytes)::text;
        END IF;
        IF bytes > max_bytes THEN
            RAISE EXCEPTION 'the next batch holds % bytes of events, more than max_bytes %', bytes, max_bytes
                USING ERRCODE = 'PV413', DETAIL = jsonb_build_object('events', n, 'bytes', bytes)::text;
        END IF;

        end_tick_id := next_tick.tick_id;
        end_snap := next_tick.snapshot;
        -- Merge further consecutive ticks while the batch stays within max_events and max_bytes.
        -- A tick that follows the batch's end adds at most its `added` events and `added_bytes`
        -- (fewer when some are targeted at other consumers), so those bounds stand in for a count.
        LOOP
            EXIT WHEN merged >= 100;
            SELECT t.tick_id, t.snapshot, t.prev_tick, t.added, t.targeted, t.added_bytes INTO next_tick
              FROM __SCHEMA__.stream_ticks t
             WHERE t.tick_id > end_tick_id ORDER BY t.tick_id LIMIT 1;
            IF NOT FOUND THEN
                -- Past the newest tick with room left: cut the next one, unless another
                -- transaction is cutting (then this batch ends here). Without `cut_ticks`, ask the
                -- caller to cut it when there is something to cut.
                EXIT WHEN n >= limit_events OR bytes >= max_bytes;
                IF NOT cut_ticks THEN
                    now_snapshot := __SCHEMA__.stream_snapshot();
                    EXIT WHEN NOT EXISTS (SELECT 1 FROM __SCHEMA__.stream_between(end_snap, now_snapshot, name));
                    RETURN QUERY SELECT * FROM __SCHEMA__.stream_tick_needed(name, who, end_tick_id);
                    RETURN;
                END IF;
                EXIT WHEN NOT __SCHEMA__.stream_lock_ticks(false);
                SELECT * INTO made FROM __SCHEMA__.stream_cut(cut_events, cut_bytes, __SCHEMA__.stream_snapshot(), false);
                EXIT WHEN made.tick IS NULL;
                CONTINUE;
            END IF;
            IF next_tick.prev_tick = end_tick_id AND next_tick.added IS NOT NULL AND next_tick.added_bytes IS NOT NULL THEN
                n := n + next_tick.added;
                bytes := bytes + next_tick.added_bytes;
            ELSE
                SELECT count(*), coalesce(sum(s3p.stream_event_bytes(e.payload, e.headers)), 0) INTO n, bytes
                  FROM __SCHEMA__.stream_between(cursor_snap, next_tick.snapshot, name) e;
            END IF;
            EXIT WHEN n > limit_events OR bytes > max_bytes;
            end_tick_id := next_tick.tick_id;
            end_snap := next_tick.snapshot;
            merged := merged + 1;
        END LOOP;

        INSERT INTO __SCHEMA__.stream_batches (batch_id, consumer, member, start_tick, end_tick)
        VALUES (new_batch, name, who, cursor_tick, end_tick_id);
        IF sub.cooperative THEN
            UPDATE __SCHEMA__.stream_subscriptions s SET next_tick = end_tick_id WHERE s.consumer = name;
        END IF;
        RETURN QUERY SELECT * FROM __SCHEMA__.stream_batch_contents(new_batch);
        RETURN;
    END LOOP;
END
$fn$;

-- Moves a group's cursor over the contiguous prefix of acked batches.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_advance_group(name text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    cursor_tick bigint;
    following bigint;
BEGIN
    SELECT s.last_tick INTO cursor_tick FROM __SCHEMA__.stream_subscriptions s WHERE s.consumer = name;
    LOOP
        SELECT b.end_tick INTO following FROM __SCHEMA__.stream_batches b
         WHERE b.consumer = name AND b.start_tick = cursor_tick AND b.state = 'acked'
         ORDER BY b.end_tick DESC LIMIT 1;
        EXIT WHEN NOT FOUND;
        cursor_tick := following;
    END LOOP;
    UPDATE __SCHEMA__.stream_subscriptions s SET last_tick = cursor_tick WHERE s.consumer = name;
    RETURN cursor_tick;
END
$fn$;

-- Locks an active batch for an answer; PV404 unknown, PV409 no longer active or not this consumer's.
-- Lock order (as receive and unsubscribe take them): the consumer's subscription row, then the
-- batch row.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_lock_batch(id uuid, name text)
RETURNS __SCHEMA__.stream_batches
LANGUAGE plpgsql AS $fn$
DECLARE
    batch __SCHEMA__.stream_batches;
    owner text;
BEGIN
    SELECT b.consumer INTO owner FROM __SCHEMA__.stream_batches b WHERE b.batch_id = id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batch % not found', id USING ERRCODE = 'PV404';
    END IF;
    PERFORM 1 FROM __SCHEMA__.stream_subscriptions s WHERE s.consumer = owner FOR UPDATE;
    SELECT * INTO batch FROM __SCHEMA__.stream_batches b WHERE b.batch_id = id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batch % not found', id USING ERRCODE = 'PV404';
    END IF;
    IF batch.state <> 'active' THEN
        RAISE EXCEPTION 'batch % is no longer active (%)', id, batch.state USING ERRCODE = 'PV409';
    END IF;
    IF name IS NOT NULL AND batch.consumer <> name THEN
        RAISE EXCEPTION 'batch % belongs to another consumer', id USING ERRCODE = 'PV409';
    END IF;
    RETURN batch;
END
$fn$;

-- Acknowledges a batch: the cursor moves to its end (groups: over the contiguous acked prefix).
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_ack(id uuid, name text)
RETURNS TABLE (consumer text, cursor_tick bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    batch __SCHEMA__.stream_batches := __SCHEMA__.stream_lock_batch(id, name);
    sub __SCHEMA__.stream_subscriptions;
BEGIN
    SELECT * INTO sub FROM __SCHEMA__.stream_subscriptions s WHERE s.consumer = batch.consumer FOR UPDATE;
    UPDATE __SCHEMA__.stream_batches b SET state = 'acked', acked_at = now() WHERE b.batch_id = id;
    IF sub.cooperative THEN
        RETURN QUERY SELECT batch.consumer, __SCHEMA__.stream_advance_group(batch.consumer);
    ELSE
        UPDATE __SCHEMA__.stream_subscriptions s SET last_tick = batch.end_tick, next_tick = batch.end_tick
         WHERE s.consumer = batch.consumer;
        RETURN QUERY SELECT batch.consumer, batch.end_tick;
    END IF;
END
$fn$;

-- Nacks one message of an active batch: a retry due after `retry_after_ms` for this consumer, or a
-- dead letter once max_retries is exhausted, whose reason says so (and adds `why` when given).
-- The batch stays active for the rest.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_nack(id uuid, name text, message uuid, retry_after_ms bigint, why text)
RETURNS TABLE (outcome text, retry_count int, due_at timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
    batch __SCHEMA__.stream_batches := __SCHEMA__.stream_lock_batch(id, name);
    ev record;
    cfg __SCHEMA__.stream_config;
    attempts int;
BEGIN
    SELECT e.* INTO ev FROM __SCHEMA__.stream_batch_events(id) e
     WHERE e.event_id = message ORDER BY e.seq LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'message % is not in batch %', message, id USING ERRCODE = 'PV404';
    END IF;
    INSERT INTO __SCHEMA__.stream_batch_nacks (batch_id, seq) VALUES (id, ev.seq) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'message % was already nacked in batch %', message, id USING ERRCODE = 'PV409';
    END IF;
    SELECT * INTO cfg FROM __SCHEMA__.stream_config;
    attempts := ev.retry_count + 1;
    IF attempts > cfg.max_retries THEN
        INSERT INTO __SCHEMA__.stream_dead_letters (id, event_id, consumer, type, payload, headers, retry_count, reason)
        VALUES (gen_random_uuid(), ev.event_id, batch.consumer, ev.type, ev.payload, ev.headers, ev.retry_count,
                concat_ws(': ', format('retries exhausted after %s retries (max_retries %s)', ev.retry_count, cfg.max_retries),
                          nullif(why, '')));
        RETURN QUERY SELECT 'dead_letter'::text, ev.retry_count, NULL::timestamptz;
    ELSE
        INSERT INTO __SCHEMA__.stream_retry_events (event_id, consumer, type, payload, headers, retry_count, reason, due_at)
        VALUES (ev.event_id, batch.consumer, ev.type, ev.payload, ev.headers, attempts, why,
                now() + make_interval(secs => greatest(coalesce(retry_after_ms, 0), 0) / 1000.0));
        RETURN QUERY SELECT 'retry'::text, attempts, now() + make_interval(secs => greatest(coalesce(retry_after_ms, 0), 0) / 1000.0);
    END IF;
END
$fn$;

-- Consumers with their cursors and active batches (JSON per consumer).
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_consumers()
RETURNS TABLE (consumer text, last_tick bigint, next_tick bigint, cooperative boolean,
               created_at timestamptz, ticks_behind bigint, active_batches jsonb)
LANGUAGE sql STABLE AS $fn$
    SELECT s.consumer, s.last_tick, s.next_tick, s.cooperative, s.created_at,
           (SELECT count(*) FROM __SCHEMA__.stream_ticks t WHERE t.tick_id > s.last_tick),
           coalesce((SELECT jsonb_agg(jsonb_build_object('batch_id', b.batch_id, 'member', b.member,
                                                         'start_tick', b.start_tick, 'end_tick', b.end_tick,
                                                         'created_at', b.created_at) ORDER BY b.start_tick)
                       FROM __SCHEMA__.stream_batches b
                      WHERE b.consumer = s.consumer AND b.state = 'active'), '[]'::jsonb)
      FROM __SCHEMA__.stream_subscriptions s ORDER BY s.consumer
$fn$;

-- Counts, watermarks, segment and rotation facts of the stream.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_info() RETURNS jsonb
LANGUAGE sql STABLE AS $fn$
    SELECT jsonb_build_object(
        'events', (SELECT count(*) FROM __SCHEMA__.stream_events),
        'consumers', (SELECT count(*) FROM __SCHEMA__.stream_subscriptions),
        'dead_letters', (SELECT count(*) FROM __SCHEMA__.stream_dead_letters),
        'pending_retries', (SELECT count(*) FROM __SCHEMA__.stream_retry_events),
        'active_batches', (SELECT count(*) FROM __SCHEMA__.stream_batches WHERE state = 'active'),
        'min_seq', (SELECT min(seq) FROM __SCHEMA__.stream_events),
        'max_seq', (SELECT max(seq) FROM __SCHEMA__.stream_events),
        'oldest_tick', (SELECT min(tick_id) FROM __SCHEMA__.stream_ticks),
        'latest_tick', (SELECT max(tick_id) FROM __SCHEMA__.stream_ticks),
        'ticks', (SELECT count(*) FROM __SCHEMA__.stream_ticks),
        'current_segment', c.current_segment,
        'segment_started_at', c.segment_started_at,
        'rotations', c.rotations,
        'retention_ms', c.retention_ms,
        'rotation_period_ms', c.retention_ms / 2,
        'max_retries', c.max_retries,
        'tick_max_events', c.tick_max_events,
        'tick_max_bytes', c.tick_max_bytes,
        'segments', (SELECT jsonb_agg(jsonb_build_object('segment', g.segment,
                         'events', (SELECT count(*) FROM __SCHEMA__.stream_events e WHERE e.segment = g.segment),
                         'switched_at', g.switched_at, 'sealed_at', g.sealed_at) ORDER BY g.segment)
                       FROM __SCHEMA__.stream_segments g))
      FROM __SCHEMA__.stream_config c
$fn$;

-- Updates max_retries, retention and/or the tick bounds (NULL leaves one as it is); returns the
-- config. Nothing to change is a read: no row lock, no write (a hot standby serves it).
DROP FUNCTION IF EXISTS __SCHEMA__.stream_configure(int, bigint);
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_configure(new_max_retries int, new_retention_ms bigint,
                                                       new_tick_max_events int DEFAULT NULL,
                                                       new_tick_max_bytes bigint DEFAULT NULL)
RETURNS TABLE (max_retries int, retention_ms bigint, tick_max_events int, tick_max_bytes bigint)
LANGUAGE plpgsql AS $fn$
BEGIN
    IF new_max_retries IS NULL AND new_retention_ms IS NULL AND new_tick_max_events IS NULL
       AND new_tick_max_bytes IS NULL THEN
        RETURN QUERY SELECT c.max_retries, c.retention_ms, c.tick_max_events, c.tick_max_bytes
                       FROM __SCHEMA__.stream_config c;
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE __SCHEMA__.stream_config c
       SET max_retries = coalesce(new_max_retries, c.max_retries),
           retention_ms = coalesce(new_retention_ms, c.retention_ms),
           tick_max_events = coalesce(new_tick_max_events, c.tick_max_events),
           tick_max_bytes = coalesce(new_tick_max_bytes, c.tick_max_bytes)
    RETURNING c.max_retries, c.retention_ms, c.tick_max_events, c.tick_max_bytes;
END
$fn$;

-- Dead letters, oldest first.
-- A page of dead letters, oldest first, cut short where the entries' bytes (s3p.stream_event_bytes)
-- pass `max_bytes` (the first entry always comes); `cut` on every row says whether it was.
DROP FUNCTION IF EXISTS __SCHEMA__.stream_dead_letter_page(int, int);
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_dead_letter_page(page_size int, page_offset int,
                                                              max_bytes bigint DEFAULT 16777216)
RETURNS TABLE (id uuid, event_id uuid, consumer text, type text, payload jsonb, headers jsonb,
               retry_count int, reason text, failed_at timestamptz, cut boolean)
LANGUAGE sql STABLE AS $fn$
    WITH page AS (
        SELECT d.*, row_number() OVER (ORDER BY d.failed_at, d.id) AS n,
               sum(s3p.stream_event_bytes(d.payload, d.headers)) OVER (ORDER BY d.failed_at, d.id) AS running
          FROM (SELECT * FROM __SCHEMA__.stream_dead_letters x
                 ORDER BY x.failed_at, x.id LIMIT page_size OFFSET page_offset) d
    ), kept AS (
        SELECT p.*, count(*) OVER () AS kept_rows, (SELECT count(*) FROM page) AS page_rows
          FROM page p WHERE p.n = 1 OR p.running <= max_bytes
    )
    SELECT k.id, k.event_id, k.consumer, k.type, k.payload, k.headers, k.retry_count, k.reason,
           k.failed_at, k.kept_rows < k.page_rows
      FROM kept k ORDER BY k.n
$fn$;

-- Whether the first `n` events, of `bytes` bytes (s3p.stream_event_bytes), of rows moved into the
-- log in one transaction (replays, due retries) fit one tick of `cfg`; the first always does. A
-- transaction's events are never split across ticks, so a larger one could never be received.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_fits_one_tick(n bigint, bytes numeric,
                                                           cfg __SCHEMA__.stream_config)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $fn$
    SELECT n = 1 OR (n <= cfg.tick_max_events AND bytes <= cfg.tick_max_bytes)
$fn$;

-- Replays dead letters (one, or the oldest when `id` is NULL) as fresh events for their consumer,
-- within the stream's quota: at most one tick's worth (stream_fits_one_tick). Callers replaying
-- all call again until it returns 0.
DROP FUNCTION IF EXISTS __SCHEMA__.stream_replay(uuid);
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_replay(queue_name text, id uuid) RETURNS int
LANGUAGE plpgsql AS $fn$
DECLARE
    cfg __SCHEMA__.stream_config;
    picked uuid[];
    replayed int;
BEGIN
    -- The quota's lock first (as appends take it), so that the count below stays exact.
    PERFORM __SCHEMA__.stream_check_quota(queue_name, 0);
    PERFORM __SCHEMA__.stream_lock(false);
    SELECT * INTO cfg FROM __SCHEMA__.stream_config;
    picked := ARRAY(
        SELECT p.id FROM (
            SELECT d.id, d.failed_at, count(*) OVER w AS n,
                   sum(s3p.stream_event_bytes(d.payload, d.headers)) OVER w AS bytes
              FROM __SCHEMA__.stream_dead_letters d
             WHERE stream_replay.id IS NULL OR d.id = stream_replay.id
            WINDOW w AS (ORDER BY d.failed_at, d.id ROWS UNBOUNDED PRECEDING)) p
         WHERE __SCHEMA__.stream_fits_one_tick(p.n, p.bytes, cfg)
         ORDER BY p.failed_at, p.id);
    PERFORM __SCHEMA__.stream_check_quota(queue_name, cardinality(picked));
    WITH gone AS (
        DELETE FROM __SCHEMA__.stream_dead_letters d WHERE d.id = ANY (picked)
        RETURNING d.*
    )
    INSERT INTO __SCHEMA__.stream_events (segment, event_id, type, payload, headers, retry_count, target)
    SELECT cfg.current_segment, g.event_id, g.type, g.payload, g.headers, g.retry_count, g.consumer
      FROM gone g ORDER BY g.failed_at, g.id;
    GET DIAGNOSTICS replayed = ROW_COUNT;
    IF stream_replay.id IS NOT NULL AND replayed = 0 THEN
        RAISE EXCEPTION 'dead letter % not found', id USING ERRCODE = 'PV404';
    END IF;
    RETURN replayed;
END
$fn$;

-- Purges dead letters older than `older_than_ms`.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_purge_dead_letters(older_than_ms bigint) RETURNS int
LANGUAGE plpgsql AS $fn$
DECLARE
    purged int;
BEGIN
    DELETE FROM __SCHEMA__.stream_dead_letters d
     WHERE d.failed_at < now() - make_interval(secs => older_than_ms / 1000.0);
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END
$fn$;

-- One maintenance step of the stream, in this order: cut a few ticks of un-ticked events (before
-- this transaction appends anything; s3p.stream_ticks_per_transaction, as the gateway's pass cuts
-- a backlog beforehand in transactions of their own, so no step holds the tick lock for a whole
-- backlog), seal segments switched in an earlier pass, move the due retries
-- into the log (one tick's worth), rotate when the current segment is older than retention / 2 and the next one is
-- safe to truncate, and clean up old ticks and acked batches.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_maintain()
RETURNS TABLE (ticked boolean, retries_moved int, rotated boolean, ticks_removed int)
LANGUAGE plpgsql AS $fn$
DECLARE
    cfg __SCHEMA__.stream_config;
    latest_before bigint;
    latest_after bigint;
    moved int := 0;
    did_rotate boolean := false;
    removed int := 0;
    next_segment int;
    seg __SCHEMA__.stream_segments;
    safe boolean;
    floor_tick bigint;
BEGIN
    SELECT max(tick_id) INTO latest_before FROM __SCHEMA__.stream_ticks;
    PERFORM __SCHEMA__.stream_tick_some(false, s3p.stream_ticks_per_transaction());

    UPDATE __SCHEMA__.stream_segments g
       SET sealed_xid = pg_snapshot_xmax(pg_current_snapshot()), sealed_at = now()
     WHERE g.switched_at IS NOT NULL AND g.sealed_xid IS NULL;

    -- A sealed segment waits for cursors to pass its seal; an idle stream creates no ticks, so give
    -- caught-up consumers a newer (empty) tick to move to on their next receive.
    IF EXISTS (
        SELECT 1 FROM __SCHEMA__.stream_segments g, __SCHEMA__.stream_ticks t
         WHERE g.sealed_xid IS NOT NULL
           AND t.tick_id = (SELECT max(tick_id) FROM __SCHEMA__.stream_ticks)
           AND pg_snapshot_xmin(t.snapshot) < g.sealed_xid)
    THEN
        PERFORM __SCHEMA__.stream_tick_some(true, s3p.stream_ticks_per_transaction());
    END IF;
    SELECT max(tick_id) INTO latest_after FROM __SCHEMA__.stream_ticks;

    -- Moving retries into the log is a write like any append: the shared lock. Only a rotation
    -- needs the exclusive one, and it never waits for it (see below).
    PERFORM __SCHEMA__.stream_lock(false);
    SELECT * INTO cfg FROM __SCHEMA__.stream_config;

    -- At most one tick's worth per step (stream_fits_one_tick); the rest are still due at the
    -- next pass.
    WITH picked AS (
        SELECT p.id FROM (
            SELECT r.id, count(*) OVER w AS n,
                   sum(s3p.stream_event_bytes(r.payload, r.headers)) OVER w AS bytes
              FROM __SCHEMA__.stream_retry_events r WHERE r.due_at <= now()
            WINDOW w AS (ORDER BY r.due_at, r.id ROWS UNBOUNDED PRECEDING)) p
         WHERE __SCHEMA__.stream_fits_one_tick(p.n, p.bytes, cfg)
    ), due AS (
        DELETE FROM __SCHEMA__.stream_retry_events r WHERE r.id IN (SELECT p.id FROM picked p)
        RETURNING r.*
    )
    INSERT INTO __SCHEMA__.stream_events (segment, event_id, type, payload, headers, retry_count, target)
    SELECT cfg.current_segment, d.event_id, d.type, d.payload, d.headers, d.retry_count, d.consumer
      FROM due d ORDER BY d.due_at, d.id;
    GET DIAGNOSTICS moved = ROW_COUNT;

    IF cfg.segment_started_at <= now() - make_interval(secs => cfg.retention_ms / 2000.0) THEN
        next_segment := (cfg.current_segment + 1) % 3;
        SELECT * INTO seg FROM __SCHEMA__.stream_segments g WHERE g.segment = next_segment;
        IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.stream_events e WHERE e.segment = next_segment) THEN
            safe := true;
        ELSE
            safe := seg.sealed_xid IS NOT NULL
                AND NOT EXISTS (
                    SELECT 1 FROM __SCHEMA__.stream_batches b
                      JOIN __SCHEMA__.stream_ticks t ON t.tick_id = b.start_tick
                     WHERE b.state = 'active' AND pg_snapshot_xmin(t.snapshot) < seg.sealed_xid)
                AND NOT EXISTS (
                    SELECT 1 FROM __SCHEMA__.stream_subscriptions s
                      JOIN __SCHEMA__.stream_ticks t ON t.tick_id = s.last_tick
                     WHERE pg_snapshot_xmin(t.snapshot) < seg.sealed_xid);
        END IF;
        -- Rotate only under the exclusive stream lock, waiting for it at most briefly (see
        -- stream_try_lock_exclusive): queuing behind a writer's long uncommitted append would
        -- queue every later writer behind us. A later pass retries.
        IF safe AND __SCHEMA__.stream_try_lock_exclusive() THEN
            BEGIN
                EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE NOWAIT',
                               '__SCHEMA__.stream_events_' || next_segment);
                EXECUTE format('TRUNCATE %s', '__SCHEMA__.stream_events_' || next_segment);
                UPDATE __SCHEMA__.stream_segments g
                   SET switched_at = now(), sealed_xid = NULL, sealed_at = NULL
                 WHERE g.segment = cfg.current_segment;
                UPDATE __SCHEMA__.stream_segments g
                   SET switched_at = NULL, sealed_xid = NULL, sealed_at = NULL
                 WHERE g.segment = next_segment;
                UPDATE __SCHEMA__.stream_config c
                   SET current_segment = next_segment, segment_started_at = now(), rotations = c.rotations + 1;
                did_rotate := true;
            EXCEPTION WHEN lock_not_available THEN
                did_rotate := false;
            END;
        END IF;
    END IF;

    -- Ticks older than the retention that no cursor or batch uses go, except the newest of them,
    -- which stays as the floor for from_tick 0.
    SELECT max(t.tick_id) INTO floor_tick FROM __SCHEMA__.stream_ticks t
     WHERE t.created_at < now() - make_interval(secs => cfg.retention_ms / 1000.0);
    IF floor_tick IS NOT NULL THEN
        DELETE FROM __SCHEMA__.stream_ticks t
         WHERE t.tick_id < floor_tick
           AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.stream_subscriptions s
                            WHERE s.last_tick = t.tick_id OR s.next_tick = t.tick_id)
           AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.stream_batches b
                            WHERE b.start_tick = t.tick_id OR b.end_tick = t.tick_id);
        GET DIAGNOSTICS removed = ROW_COUNT;
    END IF;
    DELETE FROM __SCHEMA__.stream_batches b
     WHERE b.state <> 'active' AND b.acked_at < now() - interval '1 hour'
       AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.stream_subscriptions s
                        WHERE s.cooperative AND s.consumer = b.consumer AND b.start_tick >= s.last_tick);

    RETURN QUERY SELECT latest_after IS DISTINCT FROM latest_before, moved, did_rotate, removed;
END
$fn$;

-- When the stream next needs maintenance as things stand (NULL: nothing is waiting): now while
-- events wait for a tick or a switched segment for its seal; the first retry due; the rotation,
-- while there are events; the cleanup of old ticks and of acked batches.
CREATE OR REPLACE FUNCTION __SCHEMA__.stream_next_due() RETURNS timestamptz
LANGUAGE sql STABLE AS $fn$
    SELECT least(
        CASE WHEN coalesce((SELECT max(e.seq) FROM __SCHEMA__.stream_events e), 0)
                  > coalesce((SELECT t.max_seq FROM __SCHEMA__.stream_ticks t ORDER BY t.tick_id DESC LIMIT 1), 0)
               OR EXISTS (SELECT 1 FROM __SCHEMA__.stream_segments g
                           WHERE g.switched_at IS NOT NULL AND g.sealed_xid IS NULL)
             THEN now() END,
        (SELECT min(r.due_at) FROM __SCHEMA__.stream_retry_events r),
        CASE WHEN EXISTS (SELECT 1 FROM __SCHEMA__.stream_events)
             THEN (SELECT c.segment_started_at + make_interval(secs => c.retention_ms / 2000.0)
                     FROM __SCHEMA__.stream_config c) END,
        (SELECT min(t.created_at) FROM __SCHEMA__.stream_ticks t
          WHERE t.tick_id < (SELECT max(x.tick_id) FROM __SCHEMA__.stream_ticks x))
          + (SELECT make_interval(secs => c.retention_ms / 1000.0) FROM __SCHEMA__.stream_config c),
        (SELECT min(b.acked_at) FROM __SCHEMA__.stream_batches b WHERE b.state <> 'active')
          + interval '1 hour')
$fn$;

-- When this queue next needs maintenance as things stand: the earliest lease end, TTL or
-- retention cutoff of its jobs, or what its stream needs (NULL: nothing is waiting). Each job term
-- reads one partial index. (Here, after stream_next_due, which it calls.)
CREATE OR REPLACE FUNCTION __SCHEMA__.next_due(retention_ms bigint) RETURNS timestamptz
LANGUAGE sql STABLE AS $fn$
    SELECT least(
        (SELECT min(j.lease_expires_at) FROM __SCHEMA__.jobs j WHERE j.state = 'active'),
        (SELECT min(j.expires_at) FROM __SCHEMA__.jobs j
          WHERE j.expires_at IS NOT NULL AND j.state IN ('available', 'scheduled', 'retryable', 'pending')),
        (SELECT min(coalesce(j.completed_at, j.cancelled_at, j.created_at)) FROM __SCHEMA__.jobs j
          WHERE j.state IN ('completed', 'cancelled', 'discarded')
            AND NOT (j.state = 'discarded' AND j.retry->>'on_exhaustion' = 'dead_letter'))
          + make_interval(secs => retention_ms / 1000.0),
        __SCHEMA__.stream_next_due())
$fn$;

-- The floor tick, taken when the stream is created: from_tick 0 starts here, before every event.
SELECT __SCHEMA__.stream_tick(true) WHERE NOT EXISTS (SELECT 1 FROM __SCHEMA__.stream_ticks);
