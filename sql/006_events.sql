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
-- The trim walks the log in log order, so a time index would only cost every insert.
DROP INDEX IF EXISTS s3p.events_time;

-- Log order is (txid, seq): the writing transaction's id, then the sequence number. A reader
-- passes only events of transactions older than every transaction still in progress (its
-- snapshot's xmin), whose set is final, so an event whose transaction commits late is delivered
-- later, never skipped (a seq is taken before commit, so seq order alone would skip it). Rows
-- written before this column existed get txid 0 and come first.
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS txid xid8 NOT NULL DEFAULT '0';
ALTER TABLE s3p.events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();
DO $$
BEGIN
    -- One index, in log order: the primary key moves from (seq) to (txid, seq).
    IF EXISTS (SELECT 1 FROM pg_constraint c
                WHERE c.conrelid = 's3p.events'::regclass AND c.contype = 'p'
                  AND c.conkey = ARRAY[(SELECT a.attnum FROM pg_attribute a
                                         WHERE a.attrelid = 's3p.events'::regclass AND a.attname = 'seq')]) THEN
        ALTER TABLE s3p.events DROP CONSTRAINT events_pkey;
        ALTER TABLE s3p.events ADD CONSTRAINT events_pkey PRIMARY KEY (txid, seq);
    END IF;
END
$$;

-- Grouped rows: a claim, an ack or an enqueue of many jobs records its events in one row (one
-- heap tuple and one index entry for the statement instead of one per job). Such a row lists its
-- jobs in `job_ids`, with `job_types`, `attempts`, `extras` and, where they differ from the row's
-- `type` / `state`, `types` / `states` at the same positions. Where all of a row's jobs share a
-- job type, attempt or extra (the usual case: one worker's claim of one type), the row holds it
-- once in `job_type` / `attempt` / `extra` and leaves that array NULL: ten claimed jobs' repeated
-- `{"worker_id": ...}` were most of the bytes such a row wrote to the WAL. Event k (1-based) of a
-- row is at seq `seq + k - 1`: the sequence steps by s3p.event_span(), so a row's events never
-- share a seq with another row's, and log order stays (txid, seq) event by event.
-- s3p.event_items expands a row; every reader goes through it.
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS job_ids uuid[];
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS job_types text[];
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS types text[];
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS states text[];
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS attempts int[];
ALTER TABLE s3p.events ADD COLUMN IF NOT EXISTS extras jsonb[];
-- A row of many jobs holds their ids out of line as they are (STORAGE EXTERNAL): UUIDs barely
-- compress, and pglz spent 0.6 ms trying and failing on each row of 1,000 ids (a batch
-- enqueue's), about a tenth of that statement's time. Checked first: ALTER TABLE locks the log.
DO $$
BEGIN
    IF (SELECT a.attstorage FROM pg_attribute a
         WHERE a.attrelid = 's3p.events'::regclass AND a.attname = 'job_ids') <> 'e' THEN
        ALTER TABLE s3p.events ALTER COLUMN job_ids SET STORAGE EXTERNAL;
    END IF;
END
$$;

-- The most events one row holds, and the step of the event sequence.
CREATE OR REPLACE FUNCTION s3p.event_span() RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT 1024 $$;

DO $$
BEGIN
    IF (SELECT s.seqincrement FROM pg_sequence s
         WHERE s.seqrelid = pg_get_serial_sequence('s3p.events', 'seq')::regclass) <> s3p.event_span() THEN
        EXECUTE format('ALTER SEQUENCE %s INCREMENT BY %s',
                       pg_get_serial_sequence('s3p.events', 'seq'), s3p.event_span());
    END IF;
END
$$;

-- The id of event k of a grouped row: the row's id for the first, a stable one derived from it
-- for the others.
CREATE OR REPLACE FUNCTION s3p.event_item_id(row_id uuid, k bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN k = 1 THEN row_id
                ELSE overlay(overlay(md5(row_id::text || ':' || k) PLACING '4' FROM 13) PLACING '8' FROM 17)::uuid
           END
$$;

-- Where a reader may go up to: the oldest transaction in progress in this reader's snapshot,
-- leaving out those still running in another database of the cluster (their events are not
-- this log's); a transaction that ended since the snapshot counts, so the answer never passes one
-- that may have committed events this snapshot does not see. Without any: the snapshot's xmax.
CREATE OR REPLACE FUNCTION s3p.events_horizon() RETURNS xid8
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
               (SELECT min(x) FROM pg_snapshot_xip(snap.s) AS x
                 WHERE NOT EXISTS (
                     SELECT 1 FROM pg_stat_activity a
                      WHERE a.backend_xid IS NOT NULL
                        AND a.backend_xid::text = (x::text::numeric % 4294967296)::text
                        AND a.datid <> (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()))),
               pg_snapshot_xmax(snap.s))
      FROM (SELECT pg_current_snapshot() AS s) snap
$$;

-- The position of the newest event a reader may pass now ((0, 0) for an empty log): where a
-- follower that wants only what happens from now on starts.
CREATE OR REPLACE FUNCTION s3p.events_end(OUT txid bigint, OUT seq bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(e.txid::text::bigint), 0), coalesce(max(e.seq + coalesce(cardinality(e.job_ids), 1) - 1), 0)
      FROM (SELECT e.txid, e.seq, e.job_ids FROM s3p.events e, (SELECT s3p.events_horizon() AS horizon OFFSET 0) h
             WHERE e.txid < h.horizon
             ORDER BY e.txid DESC, e.seq DESC LIMIT 1) e
$$;

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

-- Records the lifecycle events of one statement's jobs of one queue, in the order given: one
-- event as one narrow row, more as grouped rows of up to s3p.event_span() events. `per_types` /
-- `per_states`, when given, are each event's type and state (else `event_type` and `state` for
-- all). `job_types`, `attempts` and `extras` hold one element per job, or one for every job (which
-- spares a caller that knows them equal building and comparing arrays of a thousand). Returns the
-- events recorded.
CREATE OR REPLACE FUNCTION s3p.record_events(queue text, event_type text, state text, ids uuid[],
                                             job_types text[], attempts int[], extras jsonb[],
                                             per_types text[] DEFAULT NULL, per_states text[] DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(cardinality(ids), 0);
    span int := s3p.event_span();
    first int;
    last int;
    row_type text;
    row_state text;
    span_types text[];
    span_attempts int[];
    span_extras jsonb[];
    same_type boolean;
    same_attempt boolean;
    same_extra boolean;
BEGIN
    IF n = 1 THEN
        INSERT INTO s3p.events (type, job_id, queue, job_type, state, attempt, extra)
        VALUES (coalesce(per_types[1], event_type), ids[1], queue, job_types[1],
                coalesce(per_states[1], state), attempts[1], nullif(extras[1], '{}'));
        RETURN 1;
    END IF;
    first := 1;
    WHILE first <= n LOOP
        last := least(first + span - 1, n);
        row_type := coalesce(per_types[first], event_type);
        row_state := coalesce(per_states[first], state);
        span_types := CASE WHEN cardinality(job_types) = 1 THEN job_types ELSE job_types[first:last] END;
        span_attempts := CASE WHEN cardinality(attempts) = 1 THEN attempts ELSE attempts[first:last] END;
        span_extras := CASE WHEN cardinality(extras) = 1 THEN extras ELSE extras[first:last] END;
        -- Array equality counts NULL elements equal, so all-NULL spans fold too.
        same_type := span_types = array_fill(span_types[1], ARRAY[coalesce(cardinality(span_types), 0)]);
        same_attempt := span_attempts = array_fill(span_attempts[1], ARRAY[coalesce(cardinality(span_attempts), 0)]);
        same_extra := span_extras = array_fill(span_extras[1], ARRAY[coalesce(cardinality(span_extras), 0)]);
        INSERT INTO s3p.events (type, queue, state, job_ids, job_type, job_types, attempt, attempts,
                                extra, extras, types, states)
        VALUES (row_type, queue, row_state, ids[first:last],
                CASE WHEN same_type THEN span_types[1] END, CASE WHEN same_type IS NOT TRUE THEN span_types END,
                CASE WHEN same_attempt THEN span_attempts[1] END,
                CASE WHEN same_attempt IS NOT TRUE THEN span_attempts END,
                CASE WHEN same_extra THEN nullif(span_extras[1], '{}') END,
                CASE WHEN same_extra IS NOT TRUE THEN span_extras END,
                CASE WHEN EXISTS (SELECT 1 FROM unnest(per_types[first:last]) t WHERE t IS DISTINCT FROM row_type)
                     THEN per_types[first:last] END,
                CASE WHEN EXISTS (SELECT 1 FROM unnest(per_states[first:last]) t WHERE t IS DISTINCT FROM row_state)
                     THEN per_states[first:last] END);
        first := last + 1;
    END LOOP;
    RETURN n;
END
$$;

-- The data of a recorded event: stored whole (older rows), or built from its narrow columns.
CREATE OR REPLACE FUNCTION s3p.event_row_data(e s3p.events) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(e.data, s3p.event_data(e.job_id, e.job_type, e.queue, e.state, e.attempt)
                            || coalesce(e.extra, '{}'))
$$;

-- The events of a log row, in order: a row of one event as it is, a grouped row expanded.
CREATE OR REPLACE FUNCTION s3p.event_items(e s3p.events)
RETURNS TABLE (seq bigint, id uuid, type text, job_id uuid, job_type text, data jsonb)
LANGUAGE sql STABLE AS $$
    SELECT e.seq, e.id, e.type, e.job_id, e.job_type, s3p.event_row_data(e)
     WHERE e.job_ids IS NULL
    UNION ALL
    SELECT e.seq + i.k - 1, s3p.event_item_id(e.id, i.k), coalesce(i.type, e.type), i.job_id,
           coalesce(i.job_type, e.job_type),
           s3p.event_data(i.job_id, coalesce(i.job_type, e.job_type), e.queue, coalesce(i.state, e.state),
                          coalesce(i.attempt, e.attempt))
               || coalesce(i.extra, e.extra, '{}')
      FROM unnest(e.job_ids, e.job_types, e.types, e.states, e.attempts, e.extras)
               WITH ORDINALITY AS i(job_id, job_type, type, state, attempt, extra, k)
     WHERE e.job_ids IS NOT NULL
$$;

-- Events after a cursor (after_txid, after_seq), filtered (NULL = any), in log order, up to the
-- horizon given (else this statement's s3p.events_horizon()). Rows that may hold events past the
-- cursor start at most a span before it. `scope` (s3p.in_scope) leaves out the events of queues
-- outside a token's scope.
DROP FUNCTION IF EXISTS s3p.events_page(bigint, text[], text[], text[], int);
DROP FUNCTION IF EXISTS s3p.events_page(bigint, bigint, text[], text[], text[], int);
DROP FUNCTION IF EXISTS s3p.events_page(bigint, bigint, text[], text[], text[], int, text[]);
CREATE OR REPLACE FUNCTION s3p.events_page(after_txid bigint, after_seq bigint, types text[], queues text[],
                                           job_types text[], page_size int, scope text[] DEFAULT NULL,
                                           horizon xid8 DEFAULT NULL)
RETURNS TABLE (txid bigint, seq bigint, id uuid, type text, job_id uuid, queue text, job_type text,
               data jsonb, "time" timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT e.txid::text::bigint, x.seq, x.id, x.type, x.job_id, e.queue, x.job_type, x.data, e.time
      FROM s3p.events e
           CROSS JOIN LATERAL s3p.event_items(e) x,
           (SELECT coalesce(events_page.horizon, s3p.events_horizon()) AS horizon OFFSET 0) h
     WHERE (e.txid, e.seq) > (coalesce(after_txid, 0)::text::xid8, coalesce(after_seq, 0) - s3p.event_span())
       AND (e.txid, x.seq) > (coalesce(after_txid, 0)::text::xid8, coalesce(after_seq, 0))
       AND e.txid < h.horizon
       -- Qualified: the log has columns named `types` and `job_types` too.
       AND (events_page.types IS NULL OR x.type = ANY (events_page.types))
       AND (events_page.queues IS NULL OR e.queue = ANY (events_page.queues))
       AND (events_page.job_types IS NULL OR x.job_type = ANY (events_page.job_types))
       AND s3p.in_scope(e.queue, events_page.scope)
     ORDER BY e.txid, e.seq, x.seq
     LIMIT page_size
$$;

-- A page of s3p.events_page and the horizon it stopped at, in one statement so both see one
-- snapshot: `horizon` on every row, and one row of NULL events when the page is empty.
CREATE OR REPLACE FUNCTION s3p.events_read(after_txid bigint, after_seq bigint, types text[], queues text[],
                                           job_types text[], page_size int, scope text[] DEFAULT NULL)
RETURNS TABLE (horizon bigint, txid bigint, seq bigint, id uuid, type text, job_id uuid, queue text,
               job_type text, data jsonb, "time" timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT h.horizon::text::bigint, p.*
      FROM (SELECT s3p.events_horizon() AS horizon OFFSET 0) h
           LEFT JOIN LATERAL s3p.events_page(after_txid, after_seq, types, queues, job_types, page_size,
                                             scope, h.horizon) p ON true
     ORDER BY p.txid, p.seq
$$;

-- The newest transaction holding events after the cursor at or past `horizon`, the one a page
-- stopped at, or NULL when there are none. Those events were held back then, and either still
-- wait behind a transaction in progress or may be read now: a reader reads again, after a moment,
-- until a page's horizon has passed that transaction. Judged by the page's own horizon, not a new
-- one: a holder that ended between the page and this check must not make the short page look
-- whole; and only what was held then is waited for, not events that arrive while it waits.
DROP FUNCTION IF EXISTS s3p.events_held(bigint, bigint, bigint);
CREATE OR REPLACE FUNCTION s3p.events_held_through(after_txid bigint, after_seq bigint, horizon bigint)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT max(e.txid)::text::bigint FROM s3p.events e
     WHERE (e.txid, e.seq) > (coalesce(after_txid, 0)::text::xid8, coalesce(after_seq, 0) - s3p.event_span())
       AND (e.txid, e.seq + coalesce(cardinality(e.job_ids), 1) - 1)
           > (coalesce(after_txid, 0)::text::xid8, coalesce(after_seq, 0))
       AND e.txid >= events_held_through.horizon::text::xid8
$$;

-- The check as gateways of an earlier build ask it during a rolling upgrade: against a new horizon.
CREATE OR REPLACE FUNCTION s3p.events_held(after_txid bigint, after_seq bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT s3p.events_held_through(after_txid, after_seq, s3p.events_horizon()::text::bigint) IS NOT NULL
$$;

-- Removes events older than the retention, at most `batch` per call: among the oldest `batch`
-- in log order, those past the retention (time follows log order but for commits out of order, so a
-- straggler waits for a later pass and never makes the trim scan the whole log).
CREATE OR REPLACE FUNCTION s3p.trim_events(retention_ms bigint, batch int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    removed int;
BEGIN
    -- Nothing to do while the oldest event is within the retention: one index probe per pass.
    IF NOT EXISTS (SELECT 1 FROM (SELECT e.time FROM s3p.events e ORDER BY e.txid, e.seq LIMIT 1) o
                    WHERE o.time < now() - make_interval(secs => retention_ms / 1000.0)) THEN
        RETURN 0;
    END IF;
    DELETE FROM s3p.events d WHERE (d.txid, d.seq) IN (
        SELECT o.txid, o.seq
          FROM (SELECT e.txid, e.seq, e.time FROM s3p.events e ORDER BY e.txid, e.seq LIMIT batch) o
         WHERE o.time < now() - make_interval(secs => retention_ms / 1000.0));
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END
$$;
