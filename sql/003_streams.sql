-- Stream operations: one call each, dispatching to the queue schema's stream_* functions.
-- PV413 batch_too_large joins the SQLSTATEs of 002_jobs.sql.

-- The schema of an existing queue; raises not_found otherwise (reads never create queues).
CREATE OR REPLACE FUNCTION s3p.existing_queue_schema(queue text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found_schema text := s3p.queue_schema(queue);
BEGIN
    IF found_schema IS NULL THEN
        RAISE EXCEPTION 'queue % not found', queue USING ERRCODE = 'PV404';
    END IF;
    RETURN found_schema;
END
$$;

-- A UUIDv7 (RFC 9562): the Unix time in ms in the first 48 bits, then version 7, the variant and
-- random bits, so ids a SQL caller leaves out still sort by time like the server's own.
CREATE OR REPLACE FUNCTION s3p.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

-- Appends messages given column by column through the queue's own stream_insert (which holds
-- the rules); creates the queue on first use.
CREATE OR REPLACE FUNCTION s3p.stream_append_columns(queue text, ids uuid[], types text[],
                                                     payloads jsonb[], headers jsonb[])
RETURNS TABLE (event_id uuid, seq bigint)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT u.event_id, u.seq FROM %I.stream_insert($1, $2, $3, $4, $5) a,
                                        unnest(a.event_ids, a.seqs) AS u(event_id, seq)',
                                s3p.ensure_queue_schema(queue))
        USING queue, ids, types, payloads, headers;
END
$$;

-- Appends messages given as a JSON array ([{id, type, payload, headers}]) through
-- s3p.stream_append_columns.
CREATE OR REPLACE FUNCTION s3p.stream_append(queue text, messages jsonb)
RETURNS TABLE (event_id uuid, seq bigint)
LANGUAGE sql AS $$
    SELECT a.event_id, a.seq
      FROM (SELECT array_agg((t.m->>'id')::uuid ORDER BY t.n) AS ids,
                   array_agg(t.m->>'type' ORDER BY t.n) AS types,
                   array_agg(t.m->'payload' ORDER BY t.n) AS payloads,
                   array_agg(t.m->'headers' ORDER BY t.n) AS headers
              FROM jsonb_array_elements(messages) WITH ORDINALITY AS t(m, n)) c,
           s3p.stream_append_columns(queue, c.ids, c.types, c.payloads, c.headers) a
$$;

-- Subscribes a consumer; creates the queue on first use.
CREATE OR REPLACE FUNCTION s3p.stream_subscribe(queue text, consumer text, from_tick bigint, cooperative boolean)
RETURNS TABLE (consumer_name text, last_tick bigint, is_cooperative boolean, created boolean)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.stream_subscribe($1, $2, $3)', s3p.ensure_queue_schema(queue))
        USING consumer, from_tick, cooperative;
END
$$;

CREATE OR REPLACE FUNCTION s3p.stream_unsubscribe(queue text, consumer text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    done boolean;
BEGIN
    EXECUTE format('SELECT %I.stream_unsubscribe($1)', s3p.existing_queue_schema(queue)) INTO done USING consumer;
    RETURN done;
END
$$;

-- For each cursor tick in `cursors`: how many ticks of the queue schema's stream come after it,
-- and its own max_seq (the events it covers). Tick ids have gaps (rolled-back ticks, ticks dropped
-- between cursors), so this counts, but in one pass: the ticks from the lowest cursor on, sorted
-- together with the cursors, instead of a count per cursor (cursors x ticks).
CREATE OR REPLACE FUNCTION s3p.stream_cursor_lag(queue_schema text, cursors bigint[])
RETURNS TABLE (tick bigint, ticks_behind bigint, max_seq bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Descending, each cursor just before its own tick: the ticks counted so far are those after
    -- it, and the next row is its tick.
    RETURN QUERY EXECUTE format($f$
        SELECT m.at, m.behind, CASE WHEN m.next_at = m.at THEN m.next_seq END
          FROM (SELECT u.at, u.is_cursor,
                       count(*) FILTER (WHERE NOT u.is_cursor) OVER w AS behind,
                       lead(u.at) OVER w AS next_at, lead(u.max_seq) OVER w AS next_seq
                  FROM (SELECT t.tick_id AS at, false AS is_cursor, t.max_seq FROM %I.stream_ticks t
                         WHERE t.tick_id >= (SELECT min(c) FROM unnest($1) c)
                        UNION ALL
                        SELECT DISTINCT c, true, NULL::bigint FROM unnest($1) c WHERE c IS NOT NULL) u
                WINDOW w AS (ORDER BY u.at DESC, u.is_cursor DESC)) m
         WHERE m.is_cursor $f$, queue_schema)
        USING cursors;
END
$$;

-- A page of a stream's consumers: at most `page_size` named after `after` (NULL: from the first),
-- in name order, each with its cursor, the ticks after it and its active batches. Reads the page's
-- subscriptions by the primary key, and the ticks after the page's lowest cursor once.
DROP FUNCTION IF EXISTS s3p.stream_consumers(text);
CREATE OR REPLACE FUNCTION s3p.stream_consumers(queue text, after text, page_size int)
RETURNS TABLE (consumer text, last_tick bigint, next_tick bigint, cooperative boolean,
               created_at timestamptz, ticks_behind bigint, active_batches jsonb)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    queue_schema text := s3p.existing_queue_schema(queue);
    -- The condition is spelled out per case, so each plan is a range scan of the key.
    after_cursor text := CASE WHEN after IS NULL THEN '' ELSE 'WHERE s.consumer > $1' END;
BEGIN
    RETURN QUERY EXECUTE format($f$
        WITH page AS MATERIALIZED (
            SELECT s.* FROM %1$I.stream_subscriptions s %2$s ORDER BY s.consumer LIMIT $2)
        SELECT p.consumer, p.last_tick, p.next_tick, p.cooperative, p.created_at,
               coalesce(l.ticks_behind, 0),
               coalesce((SELECT jsonb_agg(jsonb_build_object('batch_id', b.batch_id, 'member', b.member,
                                                             'start_tick', b.start_tick, 'end_tick', b.end_tick,
                                                             'created_at', b.created_at) ORDER BY b.start_tick)
                           FROM %1$I.stream_batches b
                          WHERE b.consumer = p.consumer AND b.state = 'active'), '[]'::jsonb)
          FROM page p
          LEFT JOIN s3p.stream_cursor_lag(%1$L, ARRAY(SELECT q.last_tick FROM page q)) l
                 ON l.tick = p.last_tick
         ORDER BY p.consumer $f$, queue_schema, after_cursor)
        USING after, page_size;
END
$$;

-- How many consumers a stream has (the total of stream_consumers' pages).
CREATE OR REPLACE FUNCTION s3p.stream_consumer_count(queue text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM %I.stream_subscriptions', s3p.existing_queue_schema(queue)) INTO n;
    RETURN n;
END
$$;

-- What an event counts against a receive's byte budget: its payload and headers as JSON text,
-- about what the answer carries for it (no headers, or JSON null, count nothing).
CREATE OR REPLACE FUNCTION s3p.stream_event_bytes(payload jsonb, headers jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT octet_length(payload::text)::bigint
           + coalesce(octet_length(nullif(headers, 'null'::jsonb)::text), 0)
$$;

-- The most ticks one maintenance transaction cuts (each about 1.5 ms for 1,000 events, under the
-- tick lock a receive that needs a tick waits for): the gateway's pass cuts a backlog in
-- transactions of this many (s3p.stream_tick_some), and each queue's step cuts no more.
CREATE OR REPLACE FUNCTION s3p.stream_ticks_per_transaction() RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT 4 $$;

-- Cuts up to s3p.stream_ticks_per_transaction() ticks of the queue's un-ticked events in this
-- transaction (the queue's stream_tick_some); true when none are left. The maintenance pass calls
-- it, each call its own transaction, until then. A queue dropped meanwhile has nothing left (the
-- drop takes the queue's lock exclusively).
DROP FUNCTION IF EXISTS s3p.stream_tick_some(text, int);
CREATE OR REPLACE FUNCTION s3p.stream_tick_some(queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    schema text;
    done boolean;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('s3p.queue:' || queue));
    SELECT q.schema_name INTO schema FROM s3p.queues q WHERE q.name = queue;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    EXECUTE format('SELECT %I.stream_tick_some(false, s3p.stream_ticks_per_transaction())', schema)
        INTO done;
    RETURN done;
END
$$;

-- `max_bytes` last, with its default (16 MiB), so SQL callers of the older signature still work.
-- A NULL `max_events` is the stream's tick_max_events.
-- The batch comes as one row with its events' columns in arrays (the queue's
-- stream_batch_contents): element k of each array is the same event, and the arrays are not in
-- seq order (`ORDER BY` the unnested seqs where order matters; the gateway sorts them).
DROP FUNCTION IF EXISTS s3p.stream_receive(text, text, text, int, uuid);
DROP FUNCTION IF EXISTS s3p.stream_receive(text, text, text, int, uuid, bigint);
CREATE OR REPLACE FUNCTION s3p.stream_receive(queue text, consumer text, member text, max_events int,
                                              new_batch uuid, max_bytes bigint DEFAULT 16777216)
RETURNS TABLE (batch_id uuid, consumer_name text, member_name text, start_tick bigint, end_tick bigint,
               state text, batch_created_at timestamptz, seqs bigint[], event_ids uuid[],
               types text[], payloads jsonb[], headers jsonb[], retry_counts int[],
               created_ats timestamptz[])
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.stream_receive($1, $2, $3, $4, $5)', s3p.existing_queue_schema(queue))
        USING consumer, member, max_events, new_batch, max_bytes;
END
$$;

-- A batch's state alone (active, acked, taken_over), without its events; NULL when there is no
-- such batch.
CREATE OR REPLACE FUNCTION s3p.stream_batch_state(queue text, id uuid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found_state text;
BEGIN
    EXECUTE format('SELECT b.state FROM %I.stream_batches b WHERE b.batch_id = $1', s3p.existing_queue_schema(queue))
        INTO found_state USING id;
    RETURN found_state;
END
$$;

DROP FUNCTION IF EXISTS s3p.stream_batch(text, uuid);
CREATE OR REPLACE FUNCTION s3p.stream_batch(queue text, id uuid)
RETURNS TABLE (batch_id uuid, consumer_name text, member_name text, start_tick bigint, end_tick bigint,
               state text, batch_created_at timestamptz, seqs bigint[], event_ids uuid[],
               types text[], payloads jsonb[], headers jsonb[], retry_counts int[],
               created_ats timestamptz[])
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.stream_batch_contents($1)', s3p.existing_queue_schema(queue))
        USING id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batch % not found', id USING ERRCODE = 'PV404';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION s3p.stream_ack(queue text, id uuid, consumer text)
RETURNS TABLE (consumer_name text, cursor_tick bigint)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.stream_ack($1, $2)', s3p.existing_queue_schema(queue))
        USING id, consumer;
END
$$;

CREATE OR REPLACE FUNCTION s3p.stream_nack(queue text, id uuid, consumer text, message uuid, retry_after_ms bigint, reason text)
RETURNS TABLE (outcome text, retry_count int, due_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.stream_nack($1, $2, $3, $4, $5)', s3p.existing_queue_schema(queue))
        USING id, consumer, message, retry_after_ms, reason;
END
$$;

CREATE OR REPLACE FUNCTION s3p.stream_info(queue text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    info jsonb;
BEGIN
    EXECUTE format('SELECT %I.stream_info()', s3p.existing_queue_schema(queue)) INTO info;
    RETURN info;
END
$$;

-- The tick bounds last, with NULL defaults, so SQL callers of the older signature still work.
DROP FUNCTION IF EXISTS s3p.stream_configure(text, int, bigint);
CREATE OR REPLACE FUNCTION s3p.stream_configure(queue text, max_retries int, retention_ms bigint,
                                                tick_max_events int DEFAULT NULL,
                                                tick_max_bytes bigint DEFAULT NULL)
RETURNS TABLE (max_retries_now int, retention_ms_now bigint, tick_max_events_now int, tick_max_bytes_now bigint)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.stream_configure($1, $2, $3, $4)', s3p.existing_queue_schema(queue))
        USING max_retries, retention_ms, tick_max_events, tick_max_bytes;
END
$$;

DROP FUNCTION IF EXISTS s3p.stream_dead_letters(text, int, int);
CREATE OR REPLACE FUNCTION s3p.stream_dead_letters(queue text, page_size int, page_offset int,
                                                   max_bytes bigint DEFAULT 16777216)
RETURNS TABLE (id uuid, event_id uuid, consumer text, type text, payload jsonb, headers jsonb,
               retry_count int, reason text, failed_at timestamptz, cut boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.stream_dead_letter_page($1, $2, $3)', s3p.existing_queue_schema(queue))
        USING page_size, page_offset, max_bytes;
END
$$;

CREATE OR REPLACE FUNCTION s3p.stream_replay(queue text, id uuid) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    replayed int;
BEGIN
    EXECUTE format('SELECT %I.stream_replay($1, $2)', s3p.existing_queue_schema(queue)) INTO replayed USING queue, id;
    IF replayed > 0 THEN
        PERFORM pg_notify('s3p_streams', queue);
    END IF;
    RETURN replayed;
END
$$;

CREATE OR REPLACE FUNCTION s3p.stream_purge_dead_letters(queue text, older_than_ms bigint) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    purged int;
BEGIN
    EXECUTE format('SELECT %I.stream_purge_dead_letters($1)', s3p.existing_queue_schema(queue))
        INTO purged USING older_than_ms;
    RETURN purged;
END
$$;
