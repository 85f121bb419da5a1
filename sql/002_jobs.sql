-- Job operations: one call each. These dispatch to the functions of the queue's own schema.
-- Errors carry SQLSTATEs the store maps to OJS codes:
--   PV400 invalid_request, PV404 not_found, PV409 conflict, PV410 stale_lease, PV411 duplicate.

-- The schema of an existing queue, or NULL.
CREATE OR REPLACE FUNCTION s3p.queue_schema(queue text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT q.schema_name FROM s3p.queues q WHERE q.name = queue
$$;

-- The jobs among `ids` stored in a queue whose tag they carry (s3p.queue_id_tag), with that queue:
-- one probe of each such queue's jobs. Where the server's minted ids are.
CREATE OR REPLACE FUNCTION s3p.tagged_jobs(ids uuid[]) RETURNS TABLE (id uuid, queue text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    part record;
BEGIN
    FOR part IN
        SELECT q.name, q.schema_name, array_agg(u.id) AS tagged
          FROM unnest(ids) AS u(id)
          JOIN s3p.queues q ON q.id_tag = s3p.job_id_tag(u.id)
         GROUP BY q.name, q.schema_name
    LOOP
        RETURN QUERY EXECUTE format('SELECT j.id, $2 FROM %I.jobs j WHERE j.id = ANY ($1)', part.schema_name)
            USING part.tagged, part.name;
    END LOOP;
END
$$;

-- Where the jobs among `ids` are: ids clients gave through s3p.job_index, the others (minted) by
-- their tag. Ids not stored are left out.
CREATE OR REPLACE FUNCTION s3p.job_queues(ids uuid[]) RETURNS TABLE (id uuid, queue text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    unindexed uuid[];
BEGIN
    RETURN QUERY SELECT i.id, i.queue FROM s3p.job_index i WHERE i.id = ANY (ids);
    unindexed := ARRAY(SELECT u.id FROM unnest(ids) AS u(id)
                        WHERE NOT EXISTS (SELECT 1 FROM s3p.job_index i WHERE i.id = u.id));
    IF cardinality(unindexed) > 0 THEN
        RETURN QUERY SELECT * FROM s3p.tagged_jobs(unindexed);
    END IF;
END
$$;

-- The schema of the queue holding a job, or NULL.
CREATE OR REPLACE FUNCTION s3p.find_job_schema(job_id uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT q.schema_name FROM s3p.job_queues(ARRAY[job_id]) f JOIN s3p.queues q ON q.name = f.queue LIMIT 1
$$;

-- The schema of the queue holding a job; raises not_found for an unknown id.
CREATE OR REPLACE FUNCTION s3p.job_schema(job_id uuid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found_schema text := s3p.find_job_schema(job_id);
BEGIN
    IF found_schema IS NULL THEN
        RAISE EXCEPTION 'job % not found', job_id USING ERRCODE = 'PV404';
    END IF;
    RETURN found_schema;
END
$$;

-- The ids of `jobs` (a JSON array of s3p.job fields) that clients gave: every one the server did
-- not mint (`id_minted`, set by the core), in the order given.
CREATE OR REPLACE FUNCTION s3p.given_job_ids(jobs jsonb) RETURNS uuid[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg((e.value->>'id')::uuid ORDER BY e.ord), '{}')
      FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord)
     WHERE e.value->>'id_minted' IS DISTINCT FROM 'true'
$$;

-- Reserves ids clients gave for jobs of `queue`: each in s3p.job_index (whose key serialises
-- concurrent writers of one id), and none a minted id already stored; raises duplicate (PV411)
-- naming an id given twice or already taken. Minted ids need neither: they are new, and carry
-- their queue.
CREATE OR REPLACE FUNCTION s3p.reserve_job_ids(queue text, ids uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    inserted uuid[];
    clash    uuid;
BEGIN
    IF coalesce(cardinality(ids), 0) = 0 THEN
        RETURN;
    END IF;
    WITH indexed AS (
        INSERT INTO s3p.job_index (id, queue)
        SELECT i.id, reserve_job_ids.queue FROM unnest(ids) AS i(id)
        ON CONFLICT (id) DO NOTHING
        RETURNING id
    )
    SELECT array_agg(x.id) INTO inserted FROM indexed x;
    IF coalesce(cardinality(inserted), 0) < cardinality(ids) THEN
        SELECT i.id INTO clash FROM unnest(ids) AS i(id) GROUP BY i.id HAVING count(*) > 1 LIMIT 1;
        IF clash IS NULL THEN
            SELECT i.id INTO clash FROM unnest(ids) AS i(id)
             WHERE i.id <> ALL (coalesce(inserted, '{}')) LIMIT 1;
        END IF;
    ELSE
        -- Not given before: the server may still have minted it.
        SELECT f.id INTO clash FROM s3p.tagged_jobs(ids) f LIMIT 1;
    END IF;
    IF clash IS NOT NULL THEN
        RAISE EXCEPTION 'a job with id % already exists', clash
            USING ERRCODE = 'PV411', DETAIL = clash::text;
    END IF;
END
$$;

-- Raises PV429 when `adding` more non-terminal jobs would pass the queue's max_jobs quota
-- (`queue_schema` NULL: the queue's own, looked up with the quota).
CREATE OR REPLACE FUNCTION s3p.check_job_quota(queue text, queue_schema text, adding int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    quota bigint;
    present bigint;
    own_schema text;
BEGIN
    SELECT (q.settings->>'max_jobs')::bigint, q.schema_name INTO quota, own_schema
      FROM s3p.queues q WHERE q.name = queue;
    IF quota IS NULL THEN
        RETURN;
    END IF;
    -- Count-then-insert is exact only one writer at a time: the lock lasts until this commit, and
    -- the next writer's count (a later snapshot) sees what this one added.
    PERFORM pg_advisory_xact_lock(hashtext('s3p.quota.jobs:' || queue));
    EXECUTE format('SELECT count(*) FROM %I.jobs WHERE state NOT IN (''completed'', ''cancelled'', ''discarded'')',
                   coalesce(queue_schema, own_schema)) INTO present;
    IF present + adding > quota THEN
        RAISE EXCEPTION 'quota max_jobs (%) of queue % reached: % jobs are not terminal', quota, queue, present
            USING ERRCODE = 'PV429', DETAIL = 'max_jobs';
    END IF;
END
$$;

-- The advisory lock id of a unique key (s3p.enqueue_batch takes a batch's in this order).
CREATE OR REPLACE FUNCTION s3p.unique_key_lock(key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtextextended('s3p.unique_key:' || key, 0)
$$;

-- Settles a unique key for a new job: `free` (the key is now the new job's), `ignore` (answer with
-- `existing`), `replaced` (the holder was cancelled), or raises duplicate (reject). The key's row
-- lock makes this strong: concurrent enqueues of one key are serialised.
CREATE OR REPLACE FUNCTION s3p.settle_unique_key(new_job s3p.job, OUT outcome text, OUT existing s3p.job)
LANGUAGE plpgsql AS $$
DECLARE
    holder s3p.unique_keys;
    holder_schema text;
    states text[];
    period_ms bigint;
    action text := coalesce(new_job.uniq->>'on_conflict', 'reject');
BEGIN
    INSERT INTO s3p.unique_keys (key, job_id, queue) VALUES (new_job.unique_key, new_job.id, new_job.queue)
    ON CONFLICT (key) DO NOTHING;
    IF FOUND THEN
        outcome := 'free';
        RETURN;
    END IF;
    SELECT * INTO holder FROM s3p.unique_keys k WHERE k.key = new_job.unique_key FOR UPDATE;
    holder_schema := s3p.find_job_schema(holder.job_id);
    IF holder_schema IS NOT NULL THEN
        EXECUTE format('SELECT * FROM %I.get($1)', holder_schema) INTO existing USING holder.job_id;
    END IF;
    states := ARRAY(SELECT jsonb_array_elements_text(coalesce(new_job.uniq->'states',
                    '["available","active","scheduled","retryable","pending"]'::jsonb)));
    period_ms := (new_job.uniq->>'period_ms')::bigint;
    IF existing.id IS NULL
       OR NOT (existing.state = ANY (states))
       OR (period_ms IS NOT NULL AND existing.created_at + make_interval(secs => period_ms / 1000.0) <= now()) THEN
        UPDATE s3p.unique_keys k SET job_id = new_job.id, queue = new_job.queue, created_at = now()
         WHERE k.key = new_job.unique_key;
        outcome := 'free';
        existing := NULL;
        RETURN;
    END IF;
    IF action = 'ignore' THEN
        outcome := 'ignore';
        RETURN;
    END IF;
    IF action IN ('replace', 'replace_except_schedule') THEN
        IF existing.state NOT IN ('completed', 'cancelled', 'discarded') THEN
            PERFORM s3p.cancel(existing.id);
        END IF;
        UPDATE s3p.unique_keys k SET job_id = new_job.id, queue = new_job.queue, created_at = now()
         WHERE k.key = new_job.unique_key;
        outcome := 'replaced';
        RETURN;
    END IF;
    RAISE EXCEPTION 'a job with the same unique key exists: %', existing.id
        USING ERRCODE = 'PV411', DETAIL = existing.id::text;
END
$$;

-- The set form of s3p.emit had no caller left once claims record their events themselves.
DROP FUNCTION IF EXISTS s3p.emit_all(text[], s3p.job[], jsonb[]);

-- Enqueues one job given as JSON with s3p.job field names; creates the queue on first use. A
-- unique job that hits `ignore` returns the existing job instead (the caller sees another id).
-- `rate_limit_per_second`, when present, becomes the queue's claim rate.
CREATE OR REPLACE FUNCTION s3p.enqueue(job jsonb) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
DECLARE
    new_job     s3p.job := jsonb_populate_record(NULL::s3p.job, job);
    queue_schema text := s3p.ensure_queue_schema(new_job.queue);
    stored      s3p.job;
    settled     record;
BEGIN
    IF job ? 'rate_limit_per_second' THEN
        UPDATE s3p.queues q
           SET settings = q.settings || jsonb_build_object('rate_limit_per_second', job->'rate_limit_per_second')
         WHERE q.name = new_job.queue
           AND q.settings->'rate_limit_per_second' IS DISTINCT FROM job->'rate_limit_per_second';
    END IF;
    IF new_job.unique_key IS NOT NULL THEN
        SELECT * INTO settled FROM s3p.settle_unique_key(new_job);
        IF settled.outcome = 'ignore' THEN
            RETURN NEXT settled.existing;
            RETURN;
        END IF;
        IF settled.outcome = 'replaced' AND new_job.uniq->>'on_conflict' = 'replace_except_schedule' THEN
            new_job.scheduled_at := (settled.existing).scheduled_at;
        END IF;
    END IF;
    -- The queue's enqueue_many reserves a given id, checks the quota and wakes workers.
    EXECUTE format('SELECT * FROM %I.enqueue_many($1)', queue_schema) INTO stored
      USING jsonb_build_array(to_jsonb(new_job) || jsonb_strip_nulls(jsonb_build_object('id_minted', job->'id_minted')));
    RETURN NEXT stored;
END
$$;

-- Enqueues a JSON array of jobs atomically: all or none. Jobs of one queue are stored with one
-- statement (jobs, events) plus one index insert and one NOTIFY; the answer lists the queues in
-- the order they first appear, each queue's jobs in the order given. Unique jobs and rate-limit
-- settings take the single path, job by job, for their per-job checks.
CREATE OR REPLACE FUNCTION s3p.enqueue_batch(jobs jsonb) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
DECLARE
    job          jsonb;
    part         record;
    first_pass   record;
BEGIN
    -- One pass over the array says whether any job needs the single path and whether all share
    -- a queue (the usual batch), which then goes as it is, without regrouping.
    SELECT bool_or(e.value ? 'rate_limit_per_second' OR e.value->>'unique_key' IS NOT NULL) AS per_job,
           min(e.value->>'queue') AS first_queue, max(e.value->>'queue') AS last_queue
      INTO first_pass
      FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord);
    IF first_pass.per_job THEN
        -- The batch's unique keys locked first, in one order for every transaction (the lock
        -- ids'), so batches naming the same keys in other orders wait instead of deadlocking on
        -- their key rows. A single enqueue takes its one key in s3p.settle_unique_key.
        PERFORM pg_advisory_xact_lock(k.lock_id)
           FROM (SELECT DISTINCT s3p.unique_key_lock(e.value->>'unique_key') AS lock_id
                   FROM jsonb_array_elements(jobs) AS e(value)
                  WHERE e.value->>'unique_key' IS NOT NULL
                  ORDER BY 1) k;
        FOR job IN SELECT value FROM jsonb_array_elements(jobs) WITH ORDINALITY ORDER BY ordinality LOOP
            RETURN QUERY SELECT * FROM s3p.enqueue(job);
        END LOOP;
        RETURN;
    END IF;
    IF first_pass.first_queue = first_pass.last_queue THEN
        RETURN QUERY SELECT * FROM s3p.enqueue_part(first_pass.first_queue, jobs);
        RETURN;
    END IF;
    FOR part IN
        SELECT e.value->>'queue' AS queue,
               jsonb_agg(e.value ORDER BY e.ord) AS rows
          FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord)
         GROUP BY e.value->>'queue'
         ORDER BY min(e.ord)
    LOOP
        RETURN QUERY SELECT * FROM s3p.enqueue_part(part.queue, part.rows);
    END LOOP;
END
$$;

-- Stores the jobs of one queue of a batch with the queue's enqueue_many (ids reserved, quota
-- checked, jobs and events stored, workers woken), creating the queue on first use.
DROP FUNCTION IF EXISTS s3p.enqueue_part(text, jsonb, uuid[], boolean);
DROP FUNCTION IF EXISTS s3p.enqueue_part(text, jsonb, boolean);
CREATE OR REPLACE FUNCTION s3p.enqueue_part(queue text, part_jobs jsonb)
RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.enqueue_many($1)', s3p.ensure_queue_schema(queue))
      USING part_jobs;
END
$$;

-- One job in its effective state.
CREATE OR REPLACE FUNCTION s3p.get_job(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.get($1)', s3p.job_schema(job_id)) USING job_id;
END
$$;

-- Claims up to `wanted` jobs from the queues in the order given; unknown and paused queues are skipped.
CREATE OR REPLACE FUNCTION s3p.fetch(
    queues text[], wanted int, worker text, visibility_ms bigint, default_visibility_ms bigint
) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
DECLARE
    queue_name   text;
    queue_schema text;
    claimed      s3p.job;
    got          int := 0;
BEGIN
    FOREACH queue_name IN ARRAY queues LOOP
        EXIT WHEN got >= wanted;
        queue_schema := s3p.queue_schema(queue_name);
        CONTINUE WHEN queue_schema IS NULL;
        -- The claim skips a paused queue and applies the rate limit itself.
        FOR claimed IN EXECUTE format('SELECT * FROM %I.claim($1, $2, $3, $4)', queue_schema)
            USING queue_name, array_fill(worker, ARRAY[wanted - got]), visibility_ms, default_visibility_ms
        LOOP
            got := got + 1;
            RETURN NEXT claimed;
        END LOOP;
    END LOOP;
END
$$;

-- Completes an active job.
CREATE OR REPLACE FUNCTION s3p.ack(job_id uuid, token uuid, job_result jsonb) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.ack($1, $2, $3)', s3p.job_schema(job_id))
        USING job_id, token, job_result;
END
$$;

-- Completes many active jobs in one transaction (one commit for all): the jobs it completed, in
-- no particular order. Ids it leaves out were unknown, stale or not active; the caller acks those
-- one by one for their precise error. Lock order: each queue's jobs (queues by name, as every
-- statement that locks jobs of several queues takes them), then the workflows of the completed
-- steps in workflow id order, after every job row.
CREATE OR REPLACE FUNCTION s3p.ack_many(ids uuid[], tokens uuid[], results jsonb[]) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
DECLARE
    part record;
    job s3p.job;
    steps s3p.job[] := '{}';
BEGIN
    FOR part IN
        SELECT min(q.name) AS name, q.schema_name, array_agg(u.ord ORDER BY u.ord) AS ords
          FROM unnest(ids) WITH ORDINALITY AS u(id, ord)
          JOIN s3p.job_queues(ids) i ON i.id = u.id
          JOIN s3p.queues q ON q.name = i.queue
         GROUP BY q.schema_name
         ORDER BY 1
    LOOP
        FOR job IN EXECUTE format('SELECT * FROM %I.ack_many($1, $2, $3, false)', part.schema_name)
            USING ARRAY(SELECT ids[o] FROM unnest(part.ords) AS o),
                  ARRAY(SELECT tokens[o] FROM unnest(part.ords) AS o),
                  ARRAY(SELECT results[o] FROM unnest(part.ords) AS o)
        LOOP
            IF job.workflow_id IS NOT NULL THEN
                steps := steps || job;
            END IF;
            RETURN NEXT job;
        END LOOP;
    END LOOP;
    FOR job IN SELECT * FROM unnest(steps) ORDER BY workflow_id, seq LOOP
        PERFORM s3p.workflow_step_done(job.workflow_id, job.id, job.state, job.result);
    END LOOP;
END
$$;

-- Fails an active job: retry with backoff, requeue, or discard.
CREATE OR REPLACE FUNCTION s3p.nack(job_id uuid, token uuid, failure jsonb, requeue boolean)
RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.nack($1, $2, $3, $4)', s3p.job_schema(job_id))
        USING job_id, token, failure, requeue;
END
$$;

-- Cancels a job that is not terminal.
CREATE OR REPLACE FUNCTION s3p.cancel(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.cancel($1)', s3p.job_schema(job_id)) USING job_id;
END
$$;

-- Whether a failure may be retried under a policy: `retryable: false` and the policy's
-- non_retryable_errors (exact, or `prefix.*`) matched against the error's code, type or error_class.
CREATE OR REPLACE FUNCTION s3p.failure_is_retryable(policy jsonb, failure jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((failure->>'retryable')::boolean, true)
       AND NOT EXISTS (
           SELECT 1
             FROM jsonb_array_elements_text(coalesce(policy->'non_retryable_errors', '[]')) AS p(pattern),
                  unnest(ARRAY[failure->>'code', failure->>'type', failure#>>'{details,error_class}']) AS e(name)
            WHERE e.name IS NOT NULL
              AND (e.name = p.pattern
                   OR (right(p.pattern, 2) = '.*' AND left(e.name, length(p.pattern) - 1) = left(p.pattern, length(p.pattern) - 1)))
       )
$$;

-- Backoff before retry number `retry` (1 = first retry): the strategy, capped at max_interval
-- before and after jitter, which multiplies by a uniform factor in [0.5, 1.5).
CREATE OR REPLACE FUNCTION s3p.retry_delay_ms(policy jsonb, retry int) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    initial  float8 := coalesce((policy->>'initial_interval_ms')::float8, 1000);
    coeff    float8 := coalesce((policy->>'backoff_coefficient')::float8, 2.0);
    max_ms   float8 := coalesce((policy->>'max_interval_ms')::float8, 300000);
    delay    float8;
BEGIN
    delay := CASE coalesce(policy->>'backoff_type', 'exponential')
                 WHEN 'constant' THEN initial
                 WHEN 'linear'   THEN initial * retry
                 -- Compared in logs first: power() overflows float8 long before the cap
                 -- matters (a coefficient of 2 after ~1,000 retries), and the cap wins anyway.
                 ELSE CASE WHEN ln(greatest(coeff, 1)) * greatest(retry - 1, 0)
                                >= ln(greatest(max_ms, 1)) - ln(greatest(initial, 1))
                           THEN max_ms
                           ELSE initial * power(coeff, greatest(retry - 1, 0))
                      END
             END;
    delay := least(delay, max_ms);
    IF coalesce((policy->>'jitter')::boolean, true) THEN
        delay := least(delay * (0.5 + random()), max_ms);
    END IF;
    RETURN round(delay)::bigint;
END
$$;

-- Queue namespaces, by name.
DROP FUNCTION IF EXISTS s3p.list_queues();
DROP FUNCTION IF EXISTS s3p.list_queues(boolean);
DROP FUNCTION IF EXISTS s3p.list_queues(boolean, text, int);
-- Queues by name after `after` (NULL: from the first), at most `page_size` (NULL: all), of those
-- in `scope` (s3p.in_scope; NULL: all); with `count_available`, also the jobs a fetch could claim
-- now (a count per listed queue, so only when asked).
CREATE OR REPLACE FUNCTION s3p.list_queues(count_available boolean, after text DEFAULT NULL,
                                           page_size int DEFAULT NULL, scope text[] DEFAULT NULL)
RETURNS TABLE (name text, paused boolean, created_at timestamptz, available bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q s3p.queues;
BEGIN
    FOR q IN SELECT * FROM s3p.queues WHERE (after IS NULL OR s3p.queues.name > after)
                                          AND s3p.in_scope(s3p.queues.name, scope)
              ORDER BY s3p.queues.name LIMIT page_size LOOP
        name := q.name;
        paused := q.paused;
        created_at := q.created_at;
        available := NULL;
        IF count_available THEN
            -- Claimable now, as a fetch would see it (the ready index's rows that are due).
            EXECUTE format('SELECT count(*) FROM %I.jobs WHERE state IN (''available'', ''scheduled'', ''retryable'')
                              AND run_at <= now()', q.schema_name) INTO available;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Extends leases of the listed active jobs (in any queues); returns extended ids and directives.
CREATE OR REPLACE FUNCTION s3p.heartbeat(
    ids uuid[], worker text, token uuid, visibility_ms bigint, default_visibility_ms bigint
) RETURNS TABLE (id uuid, directive text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    queue_schema text;
BEGIN
    -- Queues in name order, like every statement that locks jobs of several queues.
    FOR queue_schema IN
        SELECT q.schema_name FROM s3p.queues q
         WHERE q.name IN (SELECT f.queue FROM s3p.job_queues(ids) f)
         ORDER BY q.name
    LOOP
        RETURN QUERY EXECUTE format('SELECT * FROM %I.heartbeat($1, $2, $3, $4, $5)', queue_schema)
            USING ids, worker, token, visibility_ms, default_visibility_ms;
    END LOOP;
END
$$;

-- Makes a pending job available.
CREATE OR REPLACE FUNCTION s3p.activate(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.activate($1)', s3p.job_schema(job_id)) USING job_id;
END
$$;

-- SQL selecting the dead letters of one queue or of all queues in `scope` (s3p.in_scope), or
-- NULL when there are none.
DROP FUNCTION IF EXISTS s3p.dead_letter_source(text);
CREATE OR REPLACE FUNCTION s3p.dead_letter_source(queue text, scope text[]) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT string_agg(format('SELECT * FROM %I.dead_letters()', q.schema_name), ' UNION ALL ')
      FROM s3p.queues q WHERE (queue IS NULL OR q.name = queue) AND s3p.in_scope(q.name, scope)
$$;

-- A page of dead letters across queues (or of one queue), newest first. `skip` is a bigint: a
-- client's offset may be anything a page cursor can say.
DROP FUNCTION IF EXISTS s3p.dead_letters(text, int, int);
DROP FUNCTION IF EXISTS s3p.dead_letters(text, int, bigint);
CREATE OR REPLACE FUNCTION s3p.dead_letters(queue text, max int, skip bigint, scope text[] DEFAULT NULL)
RETURNS SETOF s3p.job
LANGUAGE plpgsql STABLE AS $$
DECLARE
    source text := s3p.dead_letter_source(queue, scope);
BEGIN
    IF source IS NOT NULL THEN
        RETURN QUERY EXECUTE format(
            'SELECT * FROM (%s) d ORDER BY completed_at DESC, id LIMIT $1 OFFSET $2', source)
            USING max, skip;
    END IF;
END
$$;

-- How many dead letters there are (in one queue, or in all in `scope`).
DROP FUNCTION IF EXISTS s3p.dead_letter_count(text);
CREATE OR REPLACE FUNCTION s3p.dead_letter_count(queue text, scope text[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    source text := s3p.dead_letter_source(queue, scope);
    total bigint := 0;
BEGIN
    IF source IS NOT NULL THEN
        EXECUTE format('SELECT count(*) FROM (%s) d', source) INTO total;
    END IF;
    RETURN total;
END
$$;

-- Puts a dead letter back as available with its attempts reset.
CREATE OR REPLACE FUNCTION s3p.retry_dead_letter(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.retry_dead_letter($1)', s3p.job_schema(job_id))
        USING job_id;
END
$$;

-- Deletes a dead letter.
CREATE OR REPLACE FUNCTION s3p.delete_dead_letter(job_id uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT * FROM %I.delete_dead_letter($1)', s3p.job_schema(job_id))
        USING job_id;
END
$$;

-- How long the queue `q` keeps its terminal jobs (ms): its own `job_retention_ms`, else the
-- gateway's default.
CREATE OR REPLACE FUNCTION s3p.job_retention_ms(q s3p.queues, default_retention_ms bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((q.settings->>'job_retention_ms')::bigint, default_retention_ms)
$$;

-- One queue's maintenance step, in its own transaction when called alone: stream ticks,
-- retries, seal and rotation, then the job steps (leases, TTL, retention), whose row locks last
-- only until this queue's step commits — a fetch skips locked rows. NOTIFYs wake what it freed.
-- A queue dropped meanwhile is skipped (the drop takes the queue's lock exclusively).
CREATE OR REPLACE FUNCTION s3p.maintain_queue(queue text, default_retention_ms bigint, batch int)
RETURNS TABLE (released bigint, expired bigint, removed bigint, retries_moved bigint, rotated boolean)
LANGUAGE plpgsql AS $$
DECLARE
    q s3p.queues;
    r record;
    s record;
    due timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('s3p.queue:' || queue));
    SELECT * INTO q FROM s3p.queues x WHERE x.name = queue;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 0::bigint, 0::bigint, 0::bigint, 0::bigint, false;
        RETURN;
    END IF;
    EXECUTE format('SELECT * FROM %I.stream_maintain()', q.schema_name) INTO s;
    IF s.retries_moved > 0 THEN
        PERFORM pg_notify('s3p_streams', q.name);
    END IF;
    EXECUTE format('SELECT * FROM %I.maintain($1, $2)', q.schema_name)
        INTO r
        USING s3p.job_retention_ms(q, default_retention_ms), batch;
    IF r.released > 0 THEN
        PERFORM pg_notify('s3p_jobs', q.name);
    END IF;
    EXECUTE format('SELECT %I.next_due($1)', q.schema_name) INTO due
        USING s3p.job_retention_ms(q, default_retention_ms);
    UPDATE s3p.queues x
       SET maintain_after = least(due, now() + interval '20 minutes' + random() * interval '20 minutes')
     WHERE x.name = queue;
    RETURN QUERY SELECT r.released::bigint, r.expired::bigint, r.removed::bigint,
                        s.retries_moved::bigint, s.rotated;
END
$$;

-- The quoted jobs table of `queue` when enough dead row versions have piled up that claims pay
-- for walking past them in the ready index: at least 10,000 and 5 % of the live rows, unless the
-- queue turned autovacuum off. The maintenance pass then vacuums it (VACUUM cannot run inside a
-- function); autovacuum alone waits for 20 % of the table, checked once a minute.
-- The vacuum rule itself, for one jobs table (its oid and storage options).
CREATE OR REPLACE FUNCTION s3p.jobs_vacuum_wanted(rel oid, reloptions text[]) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_stat_get_dead_tuples(rel) >= greatest(10000, 0.05 * pg_stat_get_live_tuples(rel))
       AND NOT coalesce(reloptions @> ARRAY['autovacuum_enabled=false'], false)
$$;

CREATE OR REPLACE FUNCTION s3p.jobs_vacuum_due(queue text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format('%I.jobs', q.schema_name)
      FROM s3p.queues q
      JOIN pg_class c ON c.oid = to_regclass(format('%I.jobs', q.schema_name))
     WHERE q.name = queue
       AND s3p.jobs_vacuum_wanted(c.oid, c.reloptions)
$$;

-- When each queue next needs its maintenance step (NULL: now). The step sets it from what the
-- queue holds (`next_due`), at most 20-40 minutes ahead, so work no gateway marked (direct SQL
-- callers) is found within 40 minutes at the latest; gateways mark queues their requests gave work
-- (`s3p.mark_queues_due`). A pass steps only through due queues.
ALTER TABLE s3p.queues ADD COLUMN IF NOT EXISTS maintain_after timestamptz;

-- Brings the due time of each named queue forward to its mark (never back), one row at a time in
-- name order, so concurrent markers take the rows in one order. A mark is a time (`dues`), or the
-- time a job ended (`finished`): due when the queue's retention removes it, so a stream of acks
-- does not step the queue on every pass.
DROP FUNCTION IF EXISTS s3p.mark_queues_due(text[], timestamptz[]);
CREATE OR REPLACE FUNCTION s3p.mark_queues_due(names text[], dues timestamptz[], finished timestamptz[],
                                               default_retention_ms bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    m record;
BEGIN
    FOR m IN SELECT c.name,
                    least(min(t.due), min(t.finished) + make_interval(
                        secs => s3p.job_retention_ms(c, default_retention_ms) / 1000.0)) AS due
               FROM unnest(names, dues, finished) AS t(name, due, finished)
               JOIN s3p.queues c ON c.name = t.name
              GROUP BY c.name ORDER BY c.name LOOP
        UPDATE s3p.queues q SET maintain_after = m.due
         WHERE q.name = m.name AND q.maintain_after > m.due;
    END LOOP;
END
$$;

-- Makes every queue due now; a gateway calls it when it starts. A gateway keeps its marks in
-- memory until its next pass, so those of one that died (lease ends, ended jobs, TTLs) are lost:
-- each start has every queue stepped once instead of leaving that work to the 20-40 minute look.
CREATE OR REPLACE FUNCTION s3p.mark_every_queue_due() RETURNS void
LANGUAGE sql AS $$
    SELECT s3p.mark_queues_due(array_agg(q.name), array_agg(now()), array_agg(NULL::timestamptz), 0)
      FROM s3p.queues q WHERE q.maintain_after > now()
$$;

-- The queues a pass steps through: due ones, and (`with_vacuum`) those whose jobs table waits
-- for a vacuum (see s3p.jobs_vacuum_due).
DROP FUNCTION IF EXISTS s3p.due_queues(boolean);
CREATE OR REPLACE FUNCTION s3p.due_queues(with_vacuum boolean) RETURNS SETOF text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF with_vacuum THEN
        -- s3p.jobs_vacuum_wanted, set-based over every queue's jobs table.
        RETURN QUERY SELECT q.name FROM s3p.queues q
                      WHERE q.maintain_after IS NULL OR q.maintain_after <= now()
                     UNION
                     SELECT q.name FROM s3p.queues q
                       JOIN pg_namespace n ON n.nspname = q.schema_name
                       JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'jobs'
                      WHERE s3p.jobs_vacuum_wanted(c.oid, c.reloptions)
                     ORDER BY 1;
    ELSE
        RETURN QUERY SELECT q.name FROM s3p.queues q
                      WHERE q.maintain_after IS NULL OR q.maintain_after <= now()
                      ORDER BY q.name;
    END IF;
END
$$;

-- The database-wide maintenance step: old events, and unique keys whose job is gone.
CREATE OR REPLACE FUNCTION s3p.maintain_shared(batch int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    q record;
BEGIN
    PERFORM s3p.trim_events(coalesce(nullif(current_setting('s3p.event_retention_ms', true), '')::bigint, 3600000), batch);
    -- A key's queue is its job's (set together), so each queue's keys are checked against its
    -- own jobs; keys of dropped queues go as well.
    FOR q IN SELECT c.name, c.schema_name FROM s3p.queues c
              WHERE EXISTS (SELECT 1 FROM s3p.unique_keys u WHERE u.queue = c.name) LOOP
        EXECUTE format('DELETE FROM s3p.unique_keys k WHERE k.key IN (
                            SELECT u.key FROM s3p.unique_keys u
                             WHERE u.queue = $1 AND NOT EXISTS (SELECT 1 FROM %I.jobs j WHERE j.id = u.job_id)
                             LIMIT $2)', q.schema_name) USING q.name, batch;
    END LOOP;
    DELETE FROM s3p.unique_keys k
     WHERE k.key IN (SELECT u.key FROM s3p.unique_keys u
                      WHERE NOT EXISTS (SELECT 1 FROM s3p.queues c WHERE c.name = u.queue)
                      LIMIT batch);
END
$$;

-- A whole maintenance pass in one transaction, for SQL callers (pgvs3 itself runs
-- s3p.maintain_queue per queue, each in its own transaction, under the same lock held for the
-- session). Skipped at once (ran = false) while another pass holds the lock.
CREATE OR REPLACE FUNCTION s3p.maintain(default_retention_ms bigint, batch int)
RETURNS TABLE (ran boolean, released bigint, expired bigint, removed bigint,
               retries_moved bigint, rotations bigint)
LANGUAGE plpgsql AS $$
DECLARE
    q record;
    r record;
    total_released bigint := 0;
    total_expired bigint := 0;
    total_removed bigint := 0;
    total_moved bigint := 0;
    total_rotations bigint := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('s3p.maintain')) THEN
        RETURN QUERY SELECT false, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    FOR q IN SELECT name FROM s3p.queues ORDER BY name LOOP
        SELECT * INTO r FROM s3p.maintain_queue(q.name, default_retention_ms, batch);
        total_released := total_released + r.released;
        total_expired := total_expired + r.expired;
        total_removed := total_removed + r.removed;
        total_moved := total_moved + r.retries_moved;
        total_rotations := total_rotations + r.rotated::int;
    END LOOP;
    PERFORM s3p.maintain_shared(batch);
    RETURN QUERY SELECT true, total_released, total_expired, total_removed, total_moved, total_rotations;
END
$$;
