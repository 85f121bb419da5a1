-- Workflows (one DAG engine for chain, group, batch and depends_on) and cron registrations.

CREATE TABLE IF NOT EXISTS s3p.workflows (
    id           uuid PRIMARY KEY,
    name         text NOT NULL,
    type         text NOT NULL,
    -- running, completed, failed or cancelled
    state        text NOT NULL DEFAULT 'running',
    -- batch callbacks: {on_complete, on_success, on_failure} as prepared job rows
    callbacks    jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    cancelled_at timestamptz
);

CREATE TABLE IF NOT EXISTS s3p.workflow_steps (
    workflow_id uuid NOT NULL REFERENCES s3p.workflows ON DELETE CASCADE,
    idx         int  NOT NULL,
    step_key    text NOT NULL,
    depends_on  int[] NOT NULL DEFAULT '{}',
    job         jsonb NOT NULL,
    job_id      uuid NOT NULL,
    -- waiting, enqueued, completed, failed or cancelled
    state       text NOT NULL DEFAULT 'waiting',
    result      jsonb,
    PRIMARY KEY (workflow_id, idx)
);
CREATE INDEX IF NOT EXISTS workflow_steps_job ON s3p.workflow_steps (job_id);

-- Enqueues every waiting step whose dependencies all completed (with their results as
-- parent_results, in dependency order), and settles the workflow when nothing can run any more:
-- completed when every step completed, else failed; a batch then enqueues its callbacks.
CREATE OR REPLACE FUNCTION s3p.workflow_advance(wf_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    wf s3p.workflows;
    step record;
    parents jsonb;
    all_completed boolean;
BEGIN
    SELECT * INTO wf FROM s3p.workflows w WHERE w.id = wf_id FOR UPDATE;
    IF NOT FOUND OR wf.state <> 'running' THEN
        RETURN;
    END IF;
    FOR step IN
        SELECT s.* FROM s3p.workflow_steps s
         WHERE s.workflow_id = wf_id AND s.state = 'waiting'
           AND NOT EXISTS (SELECT 1 FROM s3p.workflow_steps d
                            WHERE d.workflow_id = wf_id AND d.idx = ANY (s.depends_on) AND d.state <> 'completed')
         ORDER BY s.idx
    LOOP
        SELECT coalesce(jsonb_agg(d.result ORDER BY array_position(step.depends_on, d.idx)), '[]'::jsonb)
          INTO parents
          FROM s3p.workflow_steps d WHERE d.workflow_id = wf_id AND d.idx = ANY (step.depends_on);
        PERFORM s3p.enqueue(step.job || CASE WHEN cardinality(step.depends_on) > 0
                                             THEN jsonb_build_object('parent_results', parents)
                                             ELSE '{}'::jsonb END);
        UPDATE s3p.workflow_steps s SET state = 'enqueued' WHERE s.workflow_id = wf_id AND s.idx = step.idx;
    END LOOP;

    -- Anything still enqueued, or waiting on steps that may yet complete, keeps the workflow running.
    IF EXISTS (SELECT 1 FROM s3p.workflow_steps s WHERE s.workflow_id = wf_id AND s.state = 'enqueued') THEN
        RETURN;
    END IF;
    all_completed := NOT EXISTS (SELECT 1 FROM s3p.workflow_steps s WHERE s.workflow_id = wf_id AND s.state <> 'completed');
    UPDATE s3p.workflows w SET state = CASE WHEN all_completed THEN 'completed' ELSE 'failed' END,
                                completed_at = now()
     WHERE w.id = wf_id;
    IF wf.type = 'batch' THEN
        IF wf.callbacks ? 'on_complete' THEN
            PERFORM s3p.enqueue(wf.callbacks->'on_complete');
        END IF;
        IF all_completed AND wf.callbacks ? 'on_success' THEN
            PERFORM s3p.enqueue(wf.callbacks->'on_success');
        END IF;
        IF NOT all_completed AND wf.callbacks ? 'on_failure' THEN
            PERFORM s3p.enqueue(wf.callbacks->'on_failure');
        END IF;
    END IF;
END
$$;

-- Called in the transaction that made a workflow step's job terminal.
CREATE OR REPLACE FUNCTION s3p.workflow_step_done(wf_id uuid, step_job uuid, job_state text, job_result jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE s3p.workflow_steps s
       SET state = CASE job_state WHEN 'completed' THEN 'completed'
                                  WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END,
           result = job_result
     WHERE s.workflow_id = wf_id AND s.job_id = step_job AND s.state = 'enqueued';
    IF FOUND THEN
        PERFORM s3p.workflow_advance(wf_id);
    END IF;
END
$$;

-- Tells the workflows of the enqueued steps among `ids` (jobs just cancelled, every job row of
-- the statement already locked) that the steps were cancelled, in workflow id order: the order an
-- ack of many jobs tells its workflows in.
CREATE OR REPLACE FUNCTION s3p.workflow_steps_cancelled(ids uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    step record;
BEGIN
    FOR step IN
        SELECT s.workflow_id, s.job_id FROM s3p.workflow_steps s
         WHERE s.job_id = ANY (ids) AND s.state = 'enqueued'
         ORDER BY s.workflow_id, s.idx
    LOOP
        PERFORM s3p.workflow_step_done(step.workflow_id, step.job_id, 'cancelled', NULL);
    END LOOP;
END
$$;

-- Creates a workflow from prepared steps ([{key, depends_on: [idx], job}]) and enqueues what can run.
-- Every queue its steps and callbacks name is made now, in name order: a later step is enqueued
-- inside an ack that holds workflow rows, where making its queue would wait for the creators'
-- lock (and two such acks deadlocked on it). Then, with no queue made while one is held, each
-- queue's catalog row is held FOR KEY SHARE until commit, in name order, so a drop (FOR UPDATE)
-- waits and then sees the workflow (s3p.drop_queue). A queue dropped between the two is a
-- serialization failure: the store runs the statement again from the start.
CREATE OR REPLACE FUNCTION s3p.create_workflow(wf_id uuid, wf_name text, wf_type text, steps jsonb, wf_callbacks jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    queue text;
    queues text[];
BEGIN
    queues := ARRAY(
        SELECT DISTINCT t.q FROM (
            SELECT s->'job'->>'queue' AS q FROM jsonb_array_elements(steps) AS s
            UNION ALL
            SELECT c.value->>'queue' FROM jsonb_each(coalesce(wf_callbacks, '{}')) AS c) t
         WHERE t.q IS NOT NULL
         ORDER BY 1);
    FOREACH queue IN ARRAY queues LOOP
        PERFORM s3p.ensure_queue_schema(queue);
    END LOOP;
    IF (SELECT count(*) FROM (SELECT 1 FROM s3p.queues q WHERE q.name = ANY (queues)
                               ORDER BY q.name FOR KEY SHARE) held) < cardinality(queues) THEN
        RAISE EXCEPTION 'a queue of workflow % was dropped while it was made', wf_id
              USING ERRCODE = '40001';
    END IF;
    INSERT INTO s3p.workflows (id, name, type, callbacks) VALUES (wf_id, wf_name, wf_type, coalesce(wf_callbacks, '{}'));
    INSERT INTO s3p.workflow_steps (workflow_id, idx, step_key, depends_on, job, job_id)
    SELECT wf_id, (n - 1)::int, s->>'key',
           ARRAY(SELECT jsonb_array_elements_text(coalesce(s->'depends_on', '[]'::jsonb))::int),
           s->'job' || jsonb_build_object('workflow_id', wf_id), (s->'job'->>'id')::uuid
      FROM jsonb_array_elements(steps) WITH ORDINALITY AS t(s, n);
    PERFORM s3p.workflow_advance(wf_id);
    RETURN s3p.workflow_view(wf_id);
END
$$;

-- A workflow with its counters and steps.
CREATE OR REPLACE FUNCTION s3p.workflow_view(wf_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    view jsonb;
BEGIN
    SELECT jsonb_build_object(
               'id', w.id, 'name', w.name, 'type', w.type, 'state', w.state,
               'created_at', w.created_at, 'completed_at', w.completed_at, 'cancelled_at', w.cancelled_at,
               'steps_total', (SELECT count(*) FROM s3p.workflow_steps s WHERE s.workflow_id = w.id),
               'steps_completed', (SELECT count(*) FROM s3p.workflow_steps s WHERE s.workflow_id = w.id AND s.state = 'completed'),
               'steps', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                 'id', s.step_key, 'type', s.job->>'type', 'state', s.state,
                                 'job_id', s.job_id, 'depends_on', to_jsonb(s.depends_on)) ORDER BY s.idx), '[]')
                           FROM s3p.workflow_steps s WHERE s.workflow_id = w.id))
      INTO view
      FROM s3p.workflows w WHERE w.id = wf_id;
    IF view IS NULL THEN
        RAISE EXCEPTION 'workflow % not found', wf_id USING ERRCODE = 'PV404';
    END IF;
    RETURN view;
END
$$;

-- The queues a workflow's jobs land in (its steps' and its callbacks'); a scoped token sees the
-- workflow only when it covers all of them.
CREATE OR REPLACE FUNCTION s3p.workflow_queues(wf_id uuid) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT q), '{}')
      FROM (SELECT s.job->>'queue' AS q FROM s3p.workflow_steps s WHERE s.workflow_id = wf_id
            UNION ALL
            SELECT c.value->>'queue' FROM s3p.workflows w, jsonb_each(w.callbacks) c WHERE w.id = wf_id) t
$$;

-- Whether every queue of a workflow is in `scope` (s3p.in_scope).
CREATE OR REPLACE FUNCTION s3p.workflow_in_scope(wf_id uuid, scope text[]) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT scope IS NULL OR NOT EXISTS (
        SELECT 1 FROM unnest(s3p.workflow_queues(wf_id)) q WHERE NOT s3p.in_scope(q, scope))
$$;

-- Locks a job's row, wherever its queue is; false when the job is gone.
CREATE OR REPLACE FUNCTION s3p.lock_job(job_id uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    found_schema text;
    locked boolean;
BEGIN
    found_schema := s3p.find_job_schema(job_id);
    IF found_schema IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('SELECT true FROM %I.jobs WHERE id = $1 FOR UPDATE', found_schema) INTO locked USING job_id;
    RETURN coalesce(locked, false);
END
$$;

-- Cancels a running workflow: its enqueued steps are cancelled, waiting steps never run.
-- Lock order, as every job transition takes it (ack, nack, cancel, maintenance): the job rows by
-- queue name, then id (as heartbeats, bulk actions and acks of several queues take them), then
-- the workflow row. So the enqueued steps' jobs are locked before the workflow.
CREATE OR REPLACE FUNCTION s3p.cancel_workflow(wf_id uuid) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    wf s3p.workflows;
    step record;
    cancelled int := 0;
    done int;
BEGIN
    SELECT * INTO wf FROM s3p.workflows w WHERE w.id = wf_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'workflow % not found', wf_id USING ERRCODE = 'PV404';
    END IF;
    IF wf.state <> 'running' THEN
        RAISE EXCEPTION 'workflow % is already %', wf_id, wf.state USING ERRCODE = 'PV409';
    END IF;
    FOR step IN
        SELECT q.id FROM s3p.job_queues(ARRAY(
            SELECT s.job_id FROM s3p.workflow_steps s WHERE s.workflow_id = wf_id AND s.state = 'enqueued')) q
         ORDER BY q.queue, q.id
    LOOP
        PERFORM s3p.lock_job(step.id);
    END LOOP;
    SELECT * INTO wf FROM s3p.workflows w WHERE w.id = wf_id FOR UPDATE;
    IF wf.state <> 'running' THEN
        RAISE EXCEPTION 'workflow % is already %', wf_id, wf.state USING ERRCODE = 'PV409';
    END IF;
    UPDATE s3p.workflows w SET state = 'cancelled', cancelled_at = now(), completed_at = now() WHERE w.id = wf_id;
    FOR step IN SELECT s.* FROM s3p.workflow_steps s WHERE s.workflow_id = wf_id AND s.state IN ('enqueued', 'waiting') LOOP
        IF step.state = 'enqueued' THEN
            BEGIN
                PERFORM s3p.cancel(step.job_id);
            EXCEPTION WHEN sqlstate 'PV409' OR sqlstate 'PV404' THEN
                NULL; -- the job finished meanwhile (or was removed)
            END;
        END IF;
        UPDATE s3p.workflow_steps s SET state = 'cancelled' WHERE s.workflow_id = wf_id AND s.idx = step.idx;
        cancelled := cancelled + 1;
    END LOOP;
    SELECT count(*) INTO done FROM s3p.workflow_steps s WHERE s.workflow_id = wf_id AND s.state = 'completed';
    RETURN s3p.workflow_view(wf_id) || jsonb_build_object('steps_cancelled', cancelled, 'steps_already_completed', done);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Cron: registrations fire in the maintenance pass; a compare-and-set on next_run_at makes each
-- slot fire once even when several gateways run passes.

CREATE TABLE IF NOT EXISTS s3p.cron_jobs (
    name           text PRIMARY KEY,
    expression     text NOT NULL,
    timezone       text NOT NULL DEFAULT 'UTC',
    -- allow, skip or cancel
    overlap_policy text NOT NULL DEFAULT 'skip',
    job_template   jsonb NOT NULL,
    enabled        boolean NOT NULL DEFAULT true,
    next_run_at    timestamptz,
    last_run_at    timestamptz,
    last_job_id    uuid,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS cron_jobs_due ON s3p.cron_jobs (next_run_at) WHERE enabled;

CREATE OR REPLACE FUNCTION s3p.cron_register(
    cron_name text, cron_expression text, cron_timezone text, overlap text, template jsonb, first_run timestamptz
) RETURNS SETOF s3p.cron_jobs
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    INSERT INTO s3p.cron_jobs (name, expression, timezone, overlap_policy, job_template, next_run_at)
    VALUES (cron_name, cron_expression, cron_timezone, overlap, template, first_run)
    ON CONFLICT (name) DO NOTHING
    RETURNING *;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'a cron job named % exists', cron_name USING ERRCODE = 'PV411', DETAIL = cron_name;
    END IF;
END
$$;

-- The queue a cron entry's jobs land in (its template's `options.queue`, else `default`).
CREATE OR REPLACE FUNCTION s3p.cron_queue(c s3p.cron_jobs) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(c.job_template->'options'->>'queue', 'default')
$$;

-- Removes a cron entry; one whose queue is outside `scope` (s3p.in_scope) is not found.
DROP FUNCTION IF EXISTS s3p.cron_unregister(text);
CREATE OR REPLACE FUNCTION s3p.cron_unregister(cron_name text, scope text[] DEFAULT NULL)
RETURNS SETOF s3p.cron_jobs
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY DELETE FROM s3p.cron_jobs c
                  WHERE c.name = cron_name AND s3p.in_scope(s3p.cron_queue(c), scope) RETURNING *;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cron job % not found', cron_name USING ERRCODE = 'PV404';
    END IF;
END
$$;

-- A page of the cron entries whose queue is in `scope` (s3p.in_scope): at most `page_size` (NULL:
-- all) named after `after` (NULL: from the first), in name order. The primary key's order, so only
-- the page (and entries of other scopes between its rows) is read.
DROP FUNCTION IF EXISTS s3p.cron_list();
DROP FUNCTION IF EXISTS s3p.cron_list(text[]);
CREATE OR REPLACE FUNCTION s3p.cron_list(scope text[] DEFAULT NULL, after text DEFAULT NULL,
                                         page_size int DEFAULT NULL) RETURNS SETOF s3p.cron_jobs
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Two statements, so the cached plan of each is a range scan of the key.
    IF after IS NULL THEN
        RETURN QUERY SELECT * FROM s3p.cron_jobs c WHERE s3p.in_scope(s3p.cron_queue(c), scope)
                      ORDER BY c.name LIMIT page_size;
    ELSE
        RETURN QUERY SELECT * FROM s3p.cron_jobs c WHERE c.name > after AND s3p.in_scope(s3p.cron_queue(c), scope)
                      ORDER BY c.name LIMIT page_size;
    END IF;
END
$$;

-- How many cron entries have their queue in `scope` (the total of cron_list's pages).
CREATE OR REPLACE FUNCTION s3p.cron_count(scope text[] DEFAULT NULL) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM s3p.cron_jobs c WHERE s3p.in_scope(s3p.cron_queue(c), scope)
$$;

CREATE OR REPLACE FUNCTION s3p.cron_due(max int) RETURNS SETOF s3p.cron_jobs
LANGUAGE sql STABLE AS $$
    SELECT * FROM s3p.cron_jobs WHERE enabled AND next_run_at <= now() ORDER BY next_run_at LIMIT max
$$;

-- Fires one due slot if nobody else did: moves next_run_at from `expected` to `following` and,
-- unless the overlap policy says skip while the last job is unfinished, enqueues `job`. Returns
-- the enqueued job id, or NULL (skipped, or another gateway fired the slot).
CREATE OR REPLACE FUNCTION s3p.cron_fire(cron_name text, expected timestamptz, following timestamptz, job jsonb)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    c s3p.cron_jobs;
    last_state text;
    last_schema text;
    fired uuid;
BEGIN
    UPDATE s3p.cron_jobs SET next_run_at = following, last_run_at = now()
     WHERE name = cron_name AND next_run_at = expected
    RETURNING * INTO c;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF c.last_job_id IS NOT NULL THEN
        last_schema := s3p.find_job_schema(c.last_job_id);
        IF last_schema IS NOT NULL THEN
            EXECUTE format('SELECT state FROM %I.jobs WHERE id = $1', last_schema) INTO last_state USING c.last_job_id;
        END IF;
    END IF;
    IF last_state IN ('available', 'active', 'scheduled', 'retryable', 'pending') THEN
        IF c.overlap_policy = 'skip' THEN
            RETURN NULL;
        ELSIF c.overlap_policy = 'cancel' THEN
            PERFORM s3p.cancel(c.last_job_id);
        END IF;
    END IF;
    SELECT id INTO fired FROM s3p.enqueue(job);
    UPDATE s3p.cron_jobs SET last_job_id = fired WHERE name = cron_name;
    RETURN fired;
END
$$;
