-- The schema of one queue. `__SCHEMA__` is replaced by the quoted schema name. Every statement is
-- idempotent, so running a newer template over an older queue upgrades it in place.
CREATE SCHEMA IF NOT EXISTS __SCHEMA__;
CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.job_seq;

CREATE TABLE IF NOT EXISTS __SCHEMA__.jobs OF s3p.job (
    id WITH OPTIONS PRIMARY KEY,
    seq WITH OPTIONS NOT NULL DEFAULT nextval('__SCHEMA__.job_seq')
);
-- fillfactor 60: the claim's and the ack's new row versions fit on the page of the old one, where
-- PostgreSQL logs only the bytes that changed and no tuple lock (about 60 fewer WAL bytes a job).
-- Set on new tables and on those of queues made before template 22, unless an operator set one
-- (queue config).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_class c
                    WHERE c.oid = '__SCHEMA__.jobs'::regclass
                      AND EXISTS (SELECT 1 FROM unnest(c.reloptions) o WHERE o LIKE 'fillfactor=%')) THEN
        ALTER TABLE __SCHEMA__.jobs SET (fillfactor = 60);
    END IF;
END
$$;

-- Ready work, in claim order; the partial index keeps the claim scan small.
CREATE INDEX IF NOT EXISTS jobs_ready ON __SCHEMA__.jobs (priority DESC, run_at, seq)
    WHERE state IN ('available', 'scheduled', 'retryable');
-- Active leases by expiry, for reclaiming expired leases.
CREATE INDEX IF NOT EXISTS jobs_leases ON __SCHEMA__.jobs (lease_expires_at)
    WHERE state = 'active';
-- Maintenance scans: jobs with a TTL, and terminal jobs by the time they ended.
CREATE INDEX IF NOT EXISTS jobs_expiring ON __SCHEMA__.jobs (expires_at)
    WHERE expires_at IS NOT NULL;
-- since/until ranges of admin listings (/ojs/v1/admin/jobs). BRIN, not a B-tree: every transition
-- changes `state` (in the partial indexes' predicates), so no update is HOT and a B-tree would
-- take a new entry at the claim and at the ack too (about 210 WAL bytes a job); a BRIN index is
-- only touched when a page range's summary must widen.
DROP INDEX IF EXISTS __SCHEMA__.jobs_created;
CREATE INDEX IF NOT EXISTS jobs_created_brin ON __SCHEMA__.jobs USING brin (created_at);
CREATE INDEX IF NOT EXISTS jobs_terminal ON __SCHEMA__.jobs ((coalesce(completed_at, cancelled_at, created_at)))
    WHERE state IN ('completed', 'cancelled', 'discarded');

-- The claim rate limiter (a token bucket) of queues with a rate limit.
CREATE TABLE IF NOT EXISTS __SCHEMA__.rate_limiter (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    tokens     float8 NOT NULL,
    updated_at timestamptz NOT NULL
);

-- How many claims the rate limit allows now (taking them), or `wanted` without a limit.
CREATE OR REPLACE FUNCTION __SCHEMA__.rate_allowance(wanted int, per_second float8) RETURNS int
LANGUAGE plpgsql AS $fn$
DECLARE
    bucket __SCHEMA__.rate_limiter;
    capacity float8;
    available float8;
    granted int;
BEGIN
    IF per_second IS NULL OR per_second <= 0 THEN
        RETURN wanted;
    END IF;
    capacity := greatest(1, floor(per_second));
    INSERT INTO __SCHEMA__.rate_limiter (tokens, updated_at) VALUES (capacity, now())
    ON CONFLICT (singleton) DO NOTHING;
    SELECT * INTO bucket FROM __SCHEMA__.rate_limiter FOR UPDATE;
    available := least(capacity, bucket.tokens + extract(epoch FROM now() - bucket.updated_at) * per_second);
    -- least() first: a rate set before rates were bounded may hold more tokens than an int.
    granted := least(wanted, floor(available))::int;
    UPDATE __SCHEMA__.rate_limiter SET tokens = available - granted, updated_at = now();
    RETURN granted;
END
$fn$;

-- Stores new jobs of this queue, given column by column (element k of every array belongs to job
-- k; a NULL array means NULL for every job), all or none, in the order given: the ids clients
-- gave (`given`) reserved (s3p.reserve_job_ids; minted ids need nothing), the quota checked, the
-- jobs stored, their events recorded, and one NOTIFY when any is available now. Each state follows
-- from `pending` and `scheduled_at`. Every path that stores a new job ends here. Answers one row:
-- when the jobs were stored (their created_at), and each job's state, enqueued_at and run_at in
-- the order given, or NULL arrays when every job is available from that moment (then that moment
-- is also each job's enqueued_at and run_at), so a batch's answer is one row, not a row per job.
DROP FUNCTION IF EXISTS __SCHEMA__.enqueue_plain(text, jsonb);
DROP FUNCTION IF EXISTS __SCHEMA__.insert_jobs(text, uuid[], uuid[], text[], jsonb[], jsonb[],
    jsonb[], text[], int[], int[], bigint[], bigint[], jsonb[], jsonb[], text[], jsonb[],
    timestamptz[], timestamptz[], jsonb[], uuid[], jsonb[]);
CREATE OR REPLACE FUNCTION __SCHEMA__.insert_jobs(
    queue_name text, given uuid[], ids uuid[], types text[], job_args jsonb[], metas jsonb[],
    extras jsonb[], requested text[], priorities int[], attempts_allowed int[], timeouts bigint[],
    leases bigint[], retries jsonb[], uniqs jsonb[], unique_keys text[], tag_lists jsonb[],
    scheduled timestamptz[], expiries timestamptz[], histories jsonb[], workflow_ids uuid[],
    parents jsonb[],
    OUT stored_at timestamptz, OUT stored_states text[], OUT stored_enqueued_ats timestamptz[],
    OUT stored_run_ats timestamptz[])
LANGUAGE plpgsql AS $fn$
DECLARE
    n int := coalesce(cardinality(ids), 0);
    states text[];
    event_extras jsonb[];
BEGIN
    stored_at := now();
    IF cardinality(given) > 0 THEN
        PERFORM s3p.reserve_job_ids(queue_name, given);
    END IF;
    PERFORM s3p.check_job_quota(queue_name, NULL, n);
    IF n = 0 THEN
        RETURN;
    END IF;
    -- The one place a new job's state is decided.
    IF scheduled IS NULL AND NOT ('pending' = ANY (requested)) THEN
        states := array_fill('available'::text, ARRAY[n]);
    ELSE
        states := ARRAY(SELECT CASE WHEN u.wanted = 'pending' THEN 'pending'
                                    WHEN u.scheduled_at > now() THEN 'scheduled'
                                    ELSE 'available' END
                          FROM unnest(ids, requested, scheduled) WITH ORDINALITY AS u(id, wanted, scheduled_at, k)
                         ORDER BY u.k);
        stored_states := states;
        stored_enqueued_ats := ARRAY(SELECT CASE s.state WHEN 'available' THEN now() END
                                       FROM unnest(states) WITH ORDINALITY AS s(state, k) ORDER BY s.k);
        stored_run_ats := ARRAY(SELECT CASE s.state WHEN 'available' THEN now() ELSE coalesce(scheduled[s.k], now()) END
                                  FROM unnest(states) WITH ORDINALITY AS s(state, k) ORDER BY s.k);
    END IF;
    -- NULL answer arrays: every job is available, enqueued and runs from now.
    INSERT INTO __SCHEMA__.jobs AS j (
            id, queue, type, args, meta, extra, state, priority, attempt, max_attempts, timeout_ms,
            visibility_timeout_ms, retry, uniq, tags, created_at, enqueued_at, scheduled_at,
            expires_at, run_at, errors, seq, unique_key, workflow_id, parent_results)
        -- nextval runs after the sort, so seq follows the order given.
        SELECT g.id, queue_name, g.type, g.args, g.meta, g.extra, states[g.k], g.priority, 0,
               g.max_attempts, g.timeout_ms, g.visibility_timeout_ms, g.retry, g.uniq, g.tags, now(),
               CASE WHEN stored_states IS NULL THEN now() ELSE stored_enqueued_ats[g.k] END,
               g.scheduled_at, g.expires_at, coalesce(stored_run_ats[g.k], now()),
               g.errors, nextval('__SCHEMA__.job_seq'), g.unique_key, g.workflow_id, g.parent_results
          FROM unnest(ids, types, job_args, metas, extras, priorities, attempts_allowed, timeouts,
                      leases, retries, uniqs, unique_keys, tag_lists, scheduled, expiries,
                      histories, workflow_ids, parents)
               WITH ORDINALITY AS g(id, type, args, meta, extra, priority, max_attempts,
                                    timeout_ms, visibility_timeout_ms, retry, uniq, unique_key, tags,
                                    scheduled_at, expires_at, errors, workflow_id, parent_results, k)
         ORDER BY g.k;

    -- The events, in the order given (which is seq order), straight from the input columns: what
    -- each job was stored with. Jobs of one priority, none scheduled, share one extra.
    IF scheduled IS NULL AND priorities = array_fill(priorities[1], ARRAY[n]) THEN
        event_extras := ARRAY[jsonb_build_object('priority', priorities[1], 'scheduled_at', NULL)];
    ELSE
        event_extras := ARRAY(SELECT jsonb_build_object('priority', u.priority, 'scheduled_at', u.scheduled_at)
                                FROM unnest(ids, priorities, scheduled) WITH ORDINALITY AS u(id, priority, scheduled_at, k)
                               ORDER BY u.k);
    END IF;
    PERFORM s3p.record_events(
        queue_name, 'job.enqueued', 'available', ids, types, ARRAY[0], event_extras,
        CASE WHEN 'scheduled' = ANY (states)
             THEN ARRAY(SELECT CASE s.state WHEN 'scheduled' THEN 'job.scheduled' ELSE 'job.enqueued' END
                          FROM unnest(states) WITH ORDINALITY AS s(state, k) ORDER BY s.k) END,
        states);
    IF 'available' = ANY (states) THEN
        PERFORM pg_notify('s3p_jobs', queue_name);
    END IF;
END
$fn$;

-- Stores new jobs given as a JSON array with s3p.job field names (ids the server minted say
-- `id_minted`) through insert_jobs, and answers them whole, in the order given: the path of
-- jobs that need the catalog's checks first (unique keys, workflows, cron, mixed batches).
DROP FUNCTION IF EXISTS __SCHEMA__.enqueue_many(s3p.job[]);
CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue_many(new_jobs jsonb) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $fn$
DECLARE
    stored uuid[];
BEGIN
    -- insert_jobs stores them all in the order given, or raises.
    SELECT c.ids INTO stored
      FROM (SELECT min(r.queue) AS queue, array_agg(r.id ORDER BY r.ordinality) AS ids, array_agg(r.type ORDER BY r.ordinality) AS types,
                   array_agg(r.args ORDER BY r.ordinality) AS job_args, array_agg(r.meta ORDER BY r.ordinality) AS metas,
                   array_agg(r.extra ORDER BY r.ordinality) AS extras, array_agg(r.state ORDER BY r.ordinality) AS requested,
                   array_agg(r.priority ORDER BY r.ordinality) AS priorities,
                   array_agg(r.max_attempts ORDER BY r.ordinality) AS attempts_allowed,
                   array_agg(r.timeout_ms ORDER BY r.ordinality) AS timeouts,
                   array_agg(r.visibility_timeout_ms ORDER BY r.ordinality) AS leases,
                   array_agg(r.retry ORDER BY r.ordinality) AS retries, array_agg(r.uniq ORDER BY r.ordinality) AS uniqs,
                   array_agg(r.unique_key ORDER BY r.ordinality) AS unique_keys,
                   array_agg(r.tags ORDER BY r.ordinality) AS tag_lists,
                   array_agg(r.scheduled_at ORDER BY r.ordinality) AS scheduled,
                   array_agg(r.expires_at ORDER BY r.ordinality) AS expiries,
                   array_agg(r.errors ORDER BY r.ordinality) AS histories,
                   array_agg(r.workflow_id ORDER BY r.ordinality) AS workflow_ids,
                   array_agg(r.parent_results ORDER BY r.ordinality) AS parents
              FROM jsonb_populate_recordset(NULL::s3p.job, new_jobs) WITH ORDINALITY AS r) c,
           __SCHEMA__.insert_jobs(
               c.queue, s3p.given_job_ids(new_jobs), c.ids, c.types, c.job_args, c.metas, c.extras,
               c.requested, c.priorities, c.attempts_allowed, c.timeouts, c.leases, c.retries,
               c.uniqs, c.unique_keys, c.tag_lists, c.scheduled, c.expiries, c.histories,
               c.workflow_ids, c.parents) n;
    RETURN QUERY
    SELECT j.* FROM unnest(stored) WITH ORDINALITY AS s(id, ord)
      JOIN __SCHEMA__.jobs j ON j.id = s.id
     ORDER BY s.ord;
END
$fn$;

DROP FUNCTION IF EXISTS __SCHEMA__.enqueue(s3p.job);

-- One job, with the state a reader should see: due scheduled/retryable work and expired leases
-- with attempts left read as available.
CREATE OR REPLACE FUNCTION __SCHEMA__.get(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE sql STABLE AS $fn$
    SELECT id, queue, type, args, meta, extra,
           CASE WHEN state IN ('scheduled', 'retryable') AND run_at <= now() THEN 'available'
                WHEN state = 'active' AND lease_expires_at <= now() AND attempt < max_attempts THEN 'available'
                ELSE state END,
           previous_state, priority, attempt, max_attempts, timeout_ms, visibility_timeout_ms, retry, uniq,
           tags, created_at, enqueued_at, scheduled_at, expires_at, started_at, completed_at,
           cancelled_at, run_at, lease_token, lease_expires_at, worker_id, result, error, errors,
           retry_delay_ms, seq, unique_key, workflow_id, parent_results
      FROM __SCHEMA__.jobs WHERE id = job_id
$fn$;

-- Claims jobs of the queue named `queue_name` (this schema's), one per entry of `owners` (the
-- worker id each claimed job gets; several fetches may share one claim), unless the queue is
-- paused or its rate limit says no: expired leases with attempts left first, then ready work by
-- priority and age. Jobs come back in the order of `owners` (fewer when fewer are ready). Each
-- claim mints a new lease token and records `job.started` in the same statement.
DROP FUNCTION IF EXISTS __SCHEMA__.claim(int, text, bigint, bigint, float8);
DROP FUNCTION IF EXISTS __SCHEMA__.claim(text, int, text, bigint, bigint);
CREATE OR REPLACE FUNCTION __SCHEMA__.claim(
    queue_name text, owners text[], visibility_ms bigint, default_visibility_ms bigint
) RETURNS SETOF s3p.job
LANGUAGE plpgsql
-- The claim's LIMIT is a parameter, so the plan cache would re-plan a custom plan on every call;
-- the generic plan walks the ready index in claim order, the plan for any LIMIT. The claimed ids
-- reach the UPDATE through an array: joined to the LIMIT's rows instead, a generic plan expects
-- a tenth of the table and hashes all of it.
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    wanted int := coalesce(cardinality(owners), 0);
    got int := 0;
    is_paused boolean;
    per_second float8;
BEGIN
    -- Maintenance mode (the Admin API's, s3p.system_state) holds every queue, read in the same
    -- statement as the queue's own pause: a claim that starts after it is turned on gets nothing,
    -- on every gateway at once.
    SELECT q.paused OR coalesce((SELECT s.maintenance FROM s3p.system_state s WHERE s.id), false),
           (q.settings->>'rate_limit_per_second')::float8 INTO is_paused, per_second
      FROM s3p.queues q WHERE q.name = queue_name;
    IF NOT FOUND OR is_paused OR wanted = 0 THEN
        RETURN;
    END IF;
    IF per_second > 0 THEN
        wanted := __SCHEMA__.rate_allowance(wanted, per_second);
        IF wanted <= 0 THEN
            RETURN;
        END IF;
    END IF;
    -- Expired leases first; the lease index says at its first entry whether there are any.
    IF EXISTS (SELECT 1 FROM __SCHEMA__.jobs WHERE state = 'active' AND lease_expires_at <= now()) THEN
        RETURN QUERY
        WITH expired AS (
            SELECT id FROM __SCHEMA__.jobs
             WHERE state = 'active' AND lease_expires_at <= now() AND attempt < max_attempts
               AND (expires_at IS NULL OR expires_at > now())
             ORDER BY lease_expires_at
             LIMIT wanted
             FOR UPDATE SKIP LOCKED
        ), slots AS (
            SELECT u.id, u.slot FROM unnest(ARRAY(SELECT e.id FROM expired e)) WITH ORDINALITY AS u(id, slot)
        ), reclaimed AS (
            UPDATE __SCHEMA__.jobs j
               SET attempt = j.attempt + 1,
                   started_at = now(),
                   lease_token = gen_random_uuid(),
                   lease_expires_at = now() + make_interval(secs => least(
                       coalesce(visibility_ms, j.visibility_timeout_ms, default_visibility_ms),
                       coalesce(j.timeout_ms, 9223372036854775807)) / 1000.0),
                   worker_id = owners[s.slot],
                   errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_object(
                       'code', 'timeout', 'type', 'timeout', 'message', 'lease expired before ack',
                       'attempt', j.attempt, 'occurred_at', now()),
                   error = jsonb_build_object('code', 'timeout', 'type', 'timeout',
                       'message', 'lease expired before ack', 'attempt', j.attempt, 'occurred_at', now())
              FROM slots s
             WHERE j.id = s.id
            RETURNING j AS job, s.slot
        ), recorded AS (
            SELECT s3p.record_events(
                       queue_name, 'job.started', 'active',
                       array_agg((r.job).id ORDER BY r.slot), array_agg((r.job).type ORDER BY r.slot),
                       array_agg((r.job).attempt ORDER BY r.slot),
                       array_agg(jsonb_build_object('worker_id', (r.job).worker_id) ORDER BY r.slot)) AS events
              FROM reclaimed r
        )
        SELECT (r.job).* FROM reclaimed r, recorded ORDER BY r.slot;
        GET DIAGNOSTICS got = ROW_COUNT;
        IF got >= wanted THEN
            RETURN;
        END IF;
    END IF;

    RETURN QUERY
    WITH ready AS (
        SELECT id FROM __SCHEMA__.jobs
         WHERE state IN ('available', 'scheduled', 'retryable') AND run_at <= now()
           AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, run_at, seq
         LIMIT wanted - got
         FOR UPDATE SKIP LOCKED
    ), slots AS (
        SELECT u.id, got + u.slot AS slot FROM unnest(ARRAY(SELECT r.id FROM ready r)) WITH ORDINALITY AS u(id, slot)
    ), claimed AS (
        UPDATE __SCHEMA__.jobs j
           SET state = 'active',
               attempt = j.attempt + 1,
               started_at = now(),
               enqueued_at = coalesce(j.enqueued_at, now()),
               lease_token = gen_random_uuid(),
               lease_expires_at = now() + make_interval(secs => least(
                   coalesce(visibility_ms, j.visibility_timeout_ms, default_visibility_ms),
                   coalesce(j.timeout_ms, 9223372036854775807)) / 1000.0),
               worker_id = owners[s.slot]
          FROM slots s
         WHERE j.id = s.id
        RETURNING j.*
    ), recorded AS (
        SELECT s3p.record_events(
                   queue_name, 'job.started', 'active',
                   array_agg(c.id ORDER BY c.priority DESC, c.run_at, c.seq),
                   array_agg(c.type ORDER BY c.priority DESC, c.run_at, c.seq),
                   array_agg(c.attempt ORDER BY c.priority DESC, c.run_at, c.seq),
                   array_agg(jsonb_build_object('worker_id', c.worker_id) ORDER BY c.priority DESC, c.run_at, c.seq)
               ) AS events
          FROM claimed c
    )
    -- The slots' order: the claim leaves priority, run_at and seq as they were.
    SELECT c.* FROM claimed c, recorded ORDER BY c.priority DESC, c.run_at, c.seq;
END
$fn$;

-- Tells the job's workflow, if any, that the job reached a terminal state.
CREATE OR REPLACE FUNCTION __SCHEMA__.settled(job s3p.job) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF job.workflow_id IS NOT NULL AND job.state IN ('completed', 'cancelled', 'discarded') THEN
        PERFORM s3p.workflow_step_done(job.workflow_id, job.id, job.state, job.result);
    END IF;
END
$fn$;

-- Locks an active job for a worker's answer, checking state and lease token. Only a job that
-- passes is locked: PostgreSQL sends an error before it releases the failed statement's locks, so
-- a refused answer that had locked an available job would make the next claim skip it.
CREATE OR REPLACE FUNCTION __SCHEMA__.lock_active(job_id uuid, token uuid) RETURNS s3p.job
LANGUAGE plpgsql AS $fn$
DECLARE
    current s3p.job;
BEGIN
    LOOP
        SELECT * INTO current FROM __SCHEMA__.jobs
         WHERE id = job_id AND state = 'active' AND (token IS NULL OR lease_token = token)
           FOR UPDATE;
        IF FOUND THEN
            RETURN current;
        END IF;
        SELECT * INTO current FROM __SCHEMA__.jobs WHERE id = job_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'job % not found', job_id USING ERRCODE = 'PV404';
        END IF;
        IF token IS NOT NULL AND token IS DISTINCT FROM current.lease_token THEN
            RAISE EXCEPTION 'lease token is not the current lease of job %', job_id USING ERRCODE = 'PV410';
        END IF;
        IF current.state <> 'active' THEN
            RAISE EXCEPTION 'job % is %, not active', job_id, current.state USING ERRCODE = 'PV409';
        END IF;
        -- Claimed between the two reads: lock it now.
    END LOOP;
END
$fn$;

-- Completes an active job with its result.
CREATE OR REPLACE FUNCTION __SCHEMA__.ack(job_id uuid, token uuid, job_result jsonb)
RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $fn$
BEGIN
    -- The completion is the batch path's; only a job it left alone is looked at again, to raise
    -- the precise error (not found, stale lease, not active).
    RETURN QUERY SELECT * FROM __SCHEMA__.ack_many(ARRAY[job_id], ARRAY[token], ARRAY[job_result]);
    IF NOT FOUND THEN
        PERFORM __SCHEMA__.lock_active(job_id, token);
        RAISE EXCEPTION 'job % was not completed', job_id USING ERRCODE = 'PV409';
    END IF;
END
$fn$;

-- Completes the active jobs among `ids` whose lease token matches (a NULL token matches any), in
-- one statement, and returns those it completed. Ids it skips (unknown, stale lease, not active)
-- are left unchanged for the caller to ack one by one, which raises the precise error. Rows are
-- locked in id order, as every statement that waits for many jobs' locks takes them
-- (cancel_workflow, heartbeat, the admin bulk actions): the UPDATE locks rows in its plan's order,
-- and on a small table a sequential scan's order deadlocked against a workflow cancel. With the
-- input sorted by id and sequential and bitmap scans off, the only way to the rows is the primary
-- key, so whichever side of the join leads (the input, or the key scanned in order), rows come in
-- id order (a lock statement first would cost a WAL record a job). The completed jobs' workflows
-- are told after every job row is locked, in workflow id order (`settle` false: the caller tells
-- them, after the jobs of its other queues).
DROP FUNCTION IF EXISTS __SCHEMA__.ack_many(uuid[], uuid[], jsonb[]);
CREATE OR REPLACE FUNCTION __SCHEMA__.ack_many(ids uuid[], tokens uuid[], results jsonb[],
                                               settle boolean DEFAULT true)
RETURNS SETOF s3p.job
LANGUAGE plpgsql
-- Its statements look rows up by id: the generic plan is always right, and re-planning a custom
-- plan on every call (the plan cache's choice for small arrays) costs more than the statement.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $fn$
DECLARE
    job s3p.job;
BEGIN
    -- One statement: complete, record the events.
    FOR job IN
        WITH input AS (
            SELECT i.id, i.token, i.result FROM unnest(ids, tokens, results) AS i(id, token, result)
             ORDER BY i.id
        ), completed AS (
            -- coalesce(state): written as `state = 'active'` it matches the lease index's predicate,
            -- and a generic plan may then walk every active lease instead of looking the ids up.
            UPDATE __SCHEMA__.jobs j
               SET state = 'completed', previous_state = 'active', completed_at = now(), result = i.result,
                   error = NULL, lease_token = NULL, lease_expires_at = NULL
              FROM input i
             WHERE j.id = i.id AND coalesce(j.state, '') = 'active'
               AND (i.token IS NULL OR i.token = j.lease_token)
            RETURNING j.*
        ), recorded AS (
            SELECT s3p.record_events(
                       min(c.queue), 'job.completed', 'completed',
                       array_agg(c.id ORDER BY c.seq), array_agg(c.type ORDER BY c.seq),
                       array_agg(c.attempt ORDER BY c.seq),
                       array_agg(jsonb_build_object(
                           'duration_ms', round(extract(epoch FROM c.completed_at - c.started_at) * 1000),
                           'result', c.result) ORDER BY c.seq)) AS events
              FROM completed c
        )
        SELECT c.* FROM completed c, recorded ORDER BY c.workflow_id, c.seq
    LOOP
        IF settle AND job.workflow_id IS NOT NULL THEN
            PERFORM __SCHEMA__.settled(job);
        END IF;
        RETURN NEXT job;
    END LOOP;
END
$fn$;

-- Fails an active job. `requeue` puts it straight back; otherwise it is retried after its backoff
-- while attempts remain and the failure is retryable, else discarded.
CREATE OR REPLACE FUNCTION __SCHEMA__.nack(job_id uuid, token uuid, failure jsonb, requeue boolean)
RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $fn$
DECLARE
    stored s3p.job;
    current s3p.job := __SCHEMA__.lock_active(job_id, token);
    failure_entry jsonb := failure || jsonb_build_object('attempt', current.attempt, 'occurred_at', now());
    history jsonb;
    delay bigint;
BEGIN
    -- Keep the 20 most recent failures.
    history := coalesce(current.errors, '[]'::jsonb) || failure_entry;
    IF jsonb_array_length(history) > 20 THEN
        history := history - 0;
    END IF;

    IF requeue THEN
        UPDATE __SCHEMA__.jobs
           SET state = 'available', previous_state = 'active', run_at = now(), started_at = NULL,
               worker_id = NULL, lease_token = NULL, lease_expires_at = NULL,
               error = failure_entry, errors = history
         WHERE id = job_id
        RETURNING * INTO stored;
    ELSIF current.attempt < current.max_attempts AND s3p.failure_is_retryable(current.retry, failure) THEN
        delay := s3p.retry_delay_ms(current.retry, current.attempt);
        UPDATE __SCHEMA__.jobs
           SET state = 'retryable', previous_state = 'active',
               run_at = now() + make_interval(secs => delay / 1000.0),
               retry_delay_ms = delay, lease_token = NULL, lease_expires_at = NULL,
               error = failure_entry, errors = history
         WHERE id = job_id
        RETURNING * INTO stored;
    ELSE
        UPDATE __SCHEMA__.jobs
           SET state = 'discarded', previous_state = 'active', completed_at = now(),
               lease_token = NULL, lease_expires_at = NULL, error = failure_entry, errors = history
         WHERE id = job_id
        RETURNING * INTO stored;
    END IF;
    PERFORM s3p.emit('job.failed', stored, jsonb_build_object('error', failure_entry));
    IF stored.state = 'retryable' THEN
        PERFORM s3p.emit('job.retrying', stored, jsonb_build_object(
            'next_attempt_at', stored.run_at, 'retry_delay_ms', stored.retry_delay_ms));
    ELSIF stored.state = 'discarded' THEN
        PERFORM s3p.emit(CASE WHEN stored.retry->>'on_exhaustion' = 'dead_letter' THEN 'job.dead' ELSE 'job.discarded' END,
                         stored, '{}');
    END IF;
    PERFORM __SCHEMA__.settled(stored);
    RETURN NEXT stored;
END
$fn$;

-- Cancels a job that is not terminal; its lease (if any) is void from now on.
CREATE OR REPLACE FUNCTION __SCHEMA__.cancel(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $fn$
DECLARE
    current s3p.job;
BEGIN
    SELECT * INTO current FROM __SCHEMA__.jobs WHERE id = job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % not found', job_id USING ERRCODE = 'PV404';
    END IF;
    IF current.state IN ('completed', 'cancelled', 'discarded') THEN
        RAISE EXCEPTION 'job % is already %', job_id, current.state USING ERRCODE = 'PV409';
    END IF;
    UPDATE __SCHEMA__.jobs
       SET state = 'cancelled', previous_state = current.state, cancelled_at = now(),
           lease_token = NULL, lease_expires_at = NULL
     WHERE id = job_id
    RETURNING * INTO current;
    PERFORM s3p.emit('job.cancelled', current, '{}');
    PERFORM __SCHEMA__.settled(current);
    RETURN NEXT current;
END
$fn$;

-- Extends the leases of active jobs this worker holds (or that carry `token`), never past the job's
-- timeout_ms bound; returns each extended job with its test directive, if any.
CREATE OR REPLACE FUNCTION __SCHEMA__.heartbeat(
    ids uuid[], worker text, token uuid, visibility_ms bigint, default_visibility_ms bigint
) RETURNS TABLE (id uuid, directive text, lease_expires_at timestamptz)
LANGUAGE sql AS $fn$
    -- Rows locked in id order, as acks lock them: an UPDATE over `id = ANY` may visit them in
    -- the heap's order, and a heartbeat racing a batch ack of the same jobs could deadlock.
    WITH held AS (
        SELECT j.id FROM __SCHEMA__.jobs j
         WHERE j.id = ANY (ids)
           AND j.state = 'active'
           AND (token IS NULL OR j.lease_token = token)
           AND (worker IS NULL OR j.worker_id IS NULL OR j.worker_id = worker)
         ORDER BY j.id
           FOR UPDATE
    )
    UPDATE __SCHEMA__.jobs j
       SET lease_expires_at = CASE
               WHEN j.timeout_ms IS NULL THEN now() + make_interval(secs =>
                   coalesce(visibility_ms, j.visibility_timeout_ms, default_visibility_ms) / 1000.0)
               ELSE least(
                   now() + make_interval(secs =>
                       coalesce(visibility_ms, j.visibility_timeout_ms, default_visibility_ms) / 1000.0),
                   j.started_at + make_interval(secs => j.timeout_ms / 1000.0))
           END
      FROM held h
     WHERE j.id = h.id
    RETURNING j.id, j.meta->>'test_directive', j.lease_expires_at
$fn$;

-- Makes a pending job available.
CREATE OR REPLACE FUNCTION __SCHEMA__.activate(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $fn$
DECLARE
    current s3p.job;
BEGIN
    -- Only a pending job is locked (see lock_active: a refusal must leave no lock behind).
    RETURN QUERY
    UPDATE __SCHEMA__.jobs
       SET state = 'available', previous_state = 'pending', run_at = now(), enqueued_at = now()
     WHERE id = job_id AND state = 'pending'
    RETURNING *;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO current FROM __SCHEMA__.jobs WHERE id = job_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % not found', job_id USING ERRCODE = 'PV404';
    END IF;
    -- Not pending: a job never becomes pending again once it was something else.
    RAISE EXCEPTION 'job % is %, not pending', job_id, current.state USING ERRCODE = 'PV409';
END
$fn$;

-- Dead letters: discarded jobs whose policy says dead_letter, newest first.
CREATE OR REPLACE FUNCTION __SCHEMA__.dead_letters() RETURNS SETOF s3p.job
LANGUAGE sql STABLE AS $fn$
    SELECT * FROM __SCHEMA__.jobs
     WHERE state = 'discarded' AND retry->>'on_exhaustion' = 'dead_letter'
$fn$;

-- Puts a dead letter back as a fresh available job (attempts reset, history kept).
CREATE OR REPLACE FUNCTION __SCHEMA__.retry_dead_letter(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY
    UPDATE __SCHEMA__.jobs
       SET state = 'available', previous_state = 'discarded', attempt = 0, run_at = now(),
           enqueued_at = now(), started_at = NULL, completed_at = NULL, worker_id = NULL,
           lease_token = NULL, lease_expires_at = NULL, retry_delay_ms = NULL
     WHERE id = job_id AND state = 'discarded' AND retry->>'on_exhaustion' = 'dead_letter'
    RETURNING *;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dead letter % not found', job_id USING ERRCODE = 'PV404';
    END IF;
END
$fn$;

-- Deletes a dead letter for good; its id may be used again.
CREATE OR REPLACE FUNCTION __SCHEMA__.delete_dead_letter(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY
    DELETE FROM __SCHEMA__.jobs
     WHERE id = job_id AND state = 'discarded' AND retry->>'on_exhaustion' = 'dead_letter'
    RETURNING *;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dead letter % not found', job_id USING ERRCODE = 'PV404';
    END IF;
    DELETE FROM s3p.job_index WHERE id = job_id;
END
$fn$;

-- One bounded maintenance step for this queue: release expired leases (attempts left: available
-- with a timeout error; exhausted: discarded), discard jobs past expires_at that never started, and
-- remove terminal jobs older than the retention (dead letters stay). At most `batch` rows each.
CREATE OR REPLACE FUNCTION __SCHEMA__.maintain(retention_ms bigint, batch int)
RETURNS TABLE (released int, expired int, removed int)
LANGUAGE plpgsql AS $fn$
DECLARE
    n_released int := 0;
    n_expired int := 0;
    n_removed int;
    changed s3p.job;
    ended s3p.job[] := '{}';
BEGIN
    FOR changed IN
        WITH due AS (
            SELECT id FROM __SCHEMA__.jobs
             WHERE state = 'active' AND lease_expires_at <= now()
             ORDER BY lease_expires_at
             LIMIT batch
             FOR UPDATE SKIP LOCKED
        ), failure AS (
            SELECT jsonb_build_object('code', 'timeout', 'type', 'timeout',
                                      'message', 'lease expired before ack', 'occurred_at', now()) AS f
        )
        UPDATE __SCHEMA__.jobs j
           SET state = CASE WHEN j.attempt < j.max_attempts THEN 'available' ELSE 'discarded' END,
               previous_state = 'active',
               run_at = now(),
               completed_at = CASE WHEN j.attempt < j.max_attempts THEN NULL ELSE now() END,
               lease_token = NULL, lease_expires_at = NULL,
               error = failure.f || jsonb_build_object('attempt', j.attempt),
               errors = coalesce(j.errors, '[]'::jsonb) || (failure.f || jsonb_build_object('attempt', j.attempt))
          FROM due, failure
         WHERE j.id = due.id
        RETURNING j.*
    LOOP
        n_released := n_released + 1;
        IF changed.workflow_id IS NOT NULL THEN
            ended := ended || changed;
        END IF;
    END LOOP;

    FOR changed IN
        WITH due AS (
            SELECT id FROM __SCHEMA__.jobs
             WHERE state IN ('available', 'scheduled', 'retryable', 'pending') AND expires_at <= now()
             LIMIT batch
             FOR UPDATE SKIP LOCKED
        )
        UPDATE __SCHEMA__.jobs j
           SET state = 'discarded', previous_state = j.state,
               error = jsonb_build_object('code', 'expired', 'type', 'expired',
                                          'message', 'job expired before it started', 'occurred_at', now())
          FROM due
         WHERE j.id = due.id
        RETURNING j.*
    LOOP
        n_expired := n_expired + 1;
        IF changed.workflow_id IS NOT NULL THEN
            ended := ended || changed;
        END IF;
    END LOOP;
    -- Workflows after every job row, in workflow id order, as an ack of many jobs tells them.
    FOR changed IN SELECT * FROM unnest(ended) ORDER BY workflow_id, seq LOOP
        PERFORM __SCHEMA__.settled(changed);
    END LOOP;

    WITH gone AS (
        DELETE FROM __SCHEMA__.jobs
         WHERE id IN (
             SELECT id FROM __SCHEMA__.jobs
              WHERE state IN ('completed', 'cancelled', 'discarded')
                AND coalesce(completed_at, cancelled_at, created_at) < now() - make_interval(secs => retention_ms / 1000.0)
                AND NOT (state = 'discarded' AND retry->>'on_exhaustion' = 'dead_letter')
              LIMIT batch
              FOR UPDATE SKIP LOCKED)
        RETURNING id
    ), unindexed AS (
        -- Only ids clients gave have index rows.
        DELETE FROM s3p.job_index i USING gone WHERE i.id = gone.id
    )
    SELECT count(*) INTO n_removed FROM gone;

    RETURN QUERY SELECT n_released, n_expired, n_removed;
END
$fn$;
