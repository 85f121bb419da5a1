-- The OJS Admin API's job reads and actions (/ojs/v1/admin/jobs, bulk, purge, queue detail):
-- listings across the queues of a scope, filtered and sorted, and actions on the jobs a filter
-- matches, bounded per call. Each listing or action is one statement over the queues' schemas.

-- A job's state as a reader sees it (the rule of each queue's `get`): due scheduled and retryable
-- jobs, and expired leases with attempts left, read as available.
CREATE OR REPLACE FUNCTION s3p.visible_state(state text, run_at timestamptz, lease_expires_at timestamptz,
                                             attempt int, max_attempts int) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN state IN ('scheduled', 'retryable') AND run_at <= now() THEN 'available'
                WHEN state = 'active' AND lease_expires_at <= now() AND attempt < max_attempts THEN 'available'
                ELSE state END
$$;

-- The schemas of the queues a listing reads: the one named (NULL: all) among those in `scope`
-- (s3p.in_scope), in name order.
CREATE OR REPLACE FUNCTION s3p.admin_job_schemas(queue text, scope text[]) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(q.schema_name ORDER BY q.name), '{}')
      FROM s3p.queues q WHERE (queue IS NULL OR q.name = queue) AND s3p.in_scope(q.name, scope)
$$;

-- The WHERE clause of a job filter over alias `j`, with parameters $1 state (visible state),
-- $2 exact type, $3 type prefix, $4 created at or after, $5 created before; NULL skips each.
CREATE OR REPLACE FUNCTION s3p.admin_job_filter() RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '($1::text IS NULL OR s3p.visible_state(j.state, j.run_at, j.lease_expires_at, j.attempt, j.max_attempts) = $1)
        AND ($2::text IS NULL OR j.type = $2)
        AND ($3::text IS NULL OR left(j.type, length($3)) = $3)
        AND ($4::timestamptz IS NULL OR j.created_at >= $4)
        AND ($5::timestamptz IS NULL OR j.created_at < $5)'
$$;

-- ORDER BY text of a listing: `sort` one of created_at, scheduled_at, priority; ties by id.
-- Only scheduled_at has NULLs (jobs never scheduled), which go last; the others keep the default
-- NULL order.
CREATE OR REPLACE FUNCTION s3p.admin_job_order(sort text, descending boolean) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF sort NOT IN ('created_at', 'scheduled_at', 'priority') THEN
        RAISE EXCEPTION 'sort % is not created_at, scheduled_at or priority', sort USING ERRCODE = 'PV400';
    END IF;
    RETURN format('%1$I %2$s%3$s, id %2$s', sort, CASE WHEN descending THEN 'DESC' ELSE 'ASC' END,
                  CASE WHEN sort = 'scheduled_at' THEN ' NULLS LAST' ELSE '' END);
END
$$;

-- A page of the jobs matching a filter across the queues of `scope` (or the one named), in the
-- order asked, `skip` rows in, at most `take`, each in its visible state. Each queue gives its
-- first skip+take rows in that order (a top-N sort of its matching rows; since/until narrow them
-- through `jobs_created_brin`), and the page is cut from their merge.
CREATE OR REPLACE FUNCTION s3p.admin_jobs(queue text, scope text[], state text, type_exact text,
                                          type_prefix text, since timestamptz, until timestamptz,
                                          sort text, descending boolean, skip int, take int)
RETURNS SETOF s3p.job
LANGUAGE plpgsql STABLE AS $$
DECLARE
    schemas text[] := s3p.admin_job_schemas(queue, scope);
    ordering text := s3p.admin_job_order(sort, descending);
    parts text;
BEGIN
    IF cardinality(schemas) = 0 THEN
        RETURN;
    END IF;
    SELECT string_agg(format(
               '(SELECT j.id, j.queue, j.type, j.args, j.meta, j.extra,
                        s3p.visible_state(j.state, j.run_at, j.lease_expires_at, j.attempt, j.max_attempts) AS state,
                        j.previous_state, j.priority, j.attempt, j.max_attempts, j.timeout_ms,
                        j.visibility_timeout_ms, j.retry, j.uniq, j.tags, j.created_at, j.enqueued_at,
                        j.scheduled_at, j.expires_at, j.started_at, j.completed_at, j.cancelled_at, j.run_at,
                        j.lease_token, j.lease_expires_at, j.worker_id, j.result, j.error, j.errors,
                        j.retry_delay_ms, j.seq, j.unique_key, j.workflow_id, j.parent_results
                   FROM %I.jobs j WHERE %s ORDER BY %s LIMIT $6 + $7)',
               s, s3p.admin_job_filter(), replace(ordering, 'id', 'j.id')), ' UNION ALL ')
      INTO parts FROM unnest(schemas) AS s;
    RETURN QUERY EXECUTE format('SELECT * FROM (%s) p ORDER BY %s OFFSET $6 LIMIT $7', parts, ordering)
        USING state, type_exact, type_prefix, since, until, skip, take;
END
$$;

-- How many jobs match a filter (as s3p.admin_jobs), counting at most `cap`: an exact count up
-- to the cap, so a listing over a large queue never counts it whole.
CREATE OR REPLACE FUNCTION s3p.admin_jobs_count(queue text, scope text[], state text, type_exact text,
                                                type_prefix text, since timestamptz, until timestamptz,
                                                cap int)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    schemas text[] := s3p.admin_job_schemas(queue, scope);
    parts text;
    total bigint;
BEGIN
    IF cardinality(schemas) = 0 THEN
        RETURN 0;
    END IF;
    SELECT string_agg(format('(SELECT 1 FROM %I.jobs j WHERE %s LIMIT $6)', s, s3p.admin_job_filter()),
                      ' UNION ALL ')
      INTO parts FROM unnest(schemas) AS s;
    EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM (%s) p LIMIT $6) c', parts)
        INTO total USING state, type_exact, type_prefix, since, until, cap;
    RETURN total;
END
$$;

-- The oldest job a fetch could claim now in a queue (its ready time), or NULL.
CREATE OR REPLACE FUNCTION s3p.oldest_available_at(queue text) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found timestamptz;
    own_schema text := s3p.queue_schema(queue);
BEGIN
    IF own_schema IS NULL THEN
        RAISE EXCEPTION 'queue % not found', queue USING ERRCODE = 'PV404';
    END IF;
    -- The ready index holds these rows; min(run_at) over it is one short scan.
    EXECUTE format('SELECT min(run_at) FROM %I.jobs WHERE state IN (''available'', ''scheduled'', ''retryable'')
                      AND run_at <= now()', own_schema) INTO found;
    RETURN found;
END
$$;

-- The states each bulk action applies to.
CREATE OR REPLACE FUNCTION s3p.admin_action_states(action text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE action WHEN 'retry' THEN ARRAY['discarded', 'cancelled']
                       WHEN 'cancel' THEN ARRAY['available', 'scheduled', 'pending', 'active', 'retryable']
                       WHEN 'delete' THEN ARRAY['completed', 'cancelled', 'discarded'] END
$$;

-- One action on one queue's jobs among `ids`: each row is locked in id order (as acks lock them)
-- and changed only if its state still allows the action, checked on the locked row, so a job a
-- worker acked meanwhile is left alone and one this action changed refuses the worker's answer.
-- Returns every id with NULL (done) or why not. The workflows of cancelled steps are the
-- caller's to tell (s3p.workflow_steps_cancelled), after every queue's jobs.
CREATE OR REPLACE FUNCTION s3p.admin_act(action text, queue_schema text, ids uuid[])
RETURNS TABLE (job_id uuid, error text)
LANGUAGE plpgsql AS $$
DECLARE
    done uuid[] := '{}';
    changed s3p.job;
    allowed text[] := s3p.admin_action_states(action);
BEGIN
    IF action = 'retry' THEN
        EXECUTE format($f$
            WITH held AS (
                SELECT j.id FROM %1$I.jobs j WHERE j.id = ANY ($1) AND j.state = ANY ($2) ORDER BY j.id FOR UPDATE
            ), moved AS (
                UPDATE %1$I.jobs j
                   SET state = 'available', previous_state = j.state, attempt = 0, run_at = now(),
                       enqueued_at = now(), started_at = NULL, completed_at = NULL, cancelled_at = NULL,
                       worker_id = NULL, lease_token = NULL, lease_expires_at = NULL, retry_delay_ms = NULL
                  FROM held h WHERE j.id = h.id
                RETURNING j.id
            )
            SELECT coalesce(array_agg(id), '{}') FROM moved $f$, queue_schema)
            INTO done USING ids, allowed;
        IF cardinality(done) > 0 THEN
            PERFORM pg_notify('s3p_jobs', (SELECT q.name FROM s3p.queues q WHERE q.schema_name = queue_schema));
        END IF;
    ELSIF action = 'cancel' THEN
        FOR changed IN EXECUTE format($f$
            WITH held AS (
                SELECT j.id FROM %1$I.jobs j WHERE j.id = ANY ($1) AND j.state = ANY ($2) ORDER BY j.id FOR UPDATE
            )
            UPDATE %1$I.jobs j
               SET state = 'cancelled', previous_state = j.state, cancelled_at = now(),
                   lease_token = NULL, lease_expires_at = NULL
              FROM held h WHERE j.id = h.id
            RETURNING j.* $f$, queue_schema) USING ids, allowed
        LOOP
            done := done || changed.id;
            PERFORM s3p.emit('job.cancelled', changed, '{}');
        END LOOP;
    ELSIF action = 'delete' THEN
        EXECUTE format($f$
            WITH held AS (
                SELECT j.id FROM %1$I.jobs j WHERE j.id = ANY ($1) AND j.state = ANY ($2) ORDER BY j.id FOR UPDATE
            ), gone AS (
                DELETE FROM %1$I.jobs j USING held h WHERE j.id = h.id RETURNING j.id
            )
            SELECT coalesce(array_agg(id), '{}') FROM gone $f$, queue_schema)
            INTO done USING ids, allowed;
        -- Only ids clients gave have index rows.
        DELETE FROM s3p.job_index i WHERE i.id = ANY (done);
    ELSE
        RAISE EXCEPTION 'bulk action % is not retry, cancel or delete', action USING ERRCODE = 'PV400';
    END IF;
    RETURN QUERY EXECUTE format($f$
        SELECT w.id, CASE WHEN w.id = ANY ($2) THEN NULL
                          WHEN j.id IS NULL THEN 'job not found'
                          ELSE format('job is %%s and cannot be %%s', j.state,
                                      CASE $3 WHEN 'retry' THEN 'retried' WHEN 'cancel' THEN 'cancelled' ELSE 'deleted' END) END
          FROM unnest($1) AS w(id) LEFT JOIN %1$I.jobs j ON j.id = w.id $f$, queue_schema)
        USING ids, done, action;
END
$$;

-- A bulk action on the jobs matching a filter (as s3p.admin_jobs) whose states the action
-- applies to, oldest first, at most `max` of them; each queue's in one statement (s3p.admin_act).
-- Returns the ids looked at with NULL (done) or why not, and whether more jobs matched.
CREATE OR REPLACE FUNCTION s3p.admin_bulk(action text, queue text, scope text[], state text, type_exact text,
                                          type_prefix text, since timestamptz, until timestamptz, max int)
RETURNS TABLE (job_id uuid, error text, more boolean)
LANGUAGE plpgsql AS $$
DECLARE
    schemas text[] := s3p.admin_job_schemas(queue, scope);
    allowed text[] := s3p.admin_action_states(action);
    parts text;
    picked uuid[];
    picked_schemas text[];
    part record;
    outcome record;
    cancelled uuid[] := '{}';
    has_more boolean;
BEGIN
    IF allowed IS NULL THEN
        RAISE EXCEPTION 'bulk action % is not retry, cancel or delete', action USING ERRCODE = 'PV400';
    END IF;
    IF cardinality(schemas) = 0 THEN
        RETURN;
    END IF;
    SELECT string_agg(format(
               '(SELECT j.id, j.created_at, %L AS schema_name FROM %I.jobs j WHERE %s AND j.state = ANY ($8)
                  ORDER BY j.created_at, j.id LIMIT $6 + 1)', s, s, s3p.admin_job_filter()), ' UNION ALL ')
      INTO parts FROM unnest(schemas) AS s;
    -- The first max+1 candidates by creation: the last one only says that more matched.
    EXECUTE format('SELECT array_agg(c.id ORDER BY c.created_at, c.id), array_agg(c.schema_name ORDER BY c.created_at, c.id)
                      FROM (SELECT * FROM (%s) p ORDER BY created_at, id LIMIT $6 + 1) c', parts)
        INTO picked, picked_schemas USING state, type_exact, type_prefix, since, until, max, NULL::int, allowed;
    has_more := coalesce(cardinality(picked), 0) > max;
    -- Queues in name order, like every statement that locks jobs of several queues.
    FOR part IN SELECT u.s AS schema_name, array_agg(u.i ORDER BY u.i) AS ids
                  FROM unnest(picked[1:max], picked_schemas[1:max]) AS u(i, s)
                  JOIN s3p.queues q ON q.schema_name = u.s
                 GROUP BY u.s ORDER BY min(q.name) LOOP
        FOR outcome IN SELECT a.job_id AS id, a.error AS why FROM s3p.admin_act(action, part.schema_name, part.ids) a LOOP
            IF outcome.why IS NULL THEN
                cancelled := cancelled || outcome.id;
            END IF;
            job_id := outcome.id;
            error := outcome.why;
            more := has_more;
            RETURN NEXT;
        END LOOP;
    END LOOP;
    -- Workflows after every queue's jobs, in workflow id order.
    IF action = 'cancel' THEN
        PERFORM s3p.workflow_steps_cancelled(cancelled);
    END IF;
END
$$;

-- Deletes up to `batch` jobs of a queue in `states` whose end (completion, cancellation, else
-- creation) is before `older_than` (NULL: any); never active ones (their workers hold leases).
-- Locked rows are skipped. Returns how many it deleted; the caller repeats while it gets `batch`.
CREATE OR REPLACE FUNCTION s3p.purge_queue_jobs(queue text, states text[], older_than timestamptz, batch int)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    own_schema text := s3p.queue_schema(queue);
    removed int;
BEGIN
    IF own_schema IS NULL THEN
        RAISE EXCEPTION 'queue % not found', queue USING ERRCODE = 'PV404';
    END IF;
    IF 'active' = ANY (states) THEN
        RAISE EXCEPTION 'active jobs are not purged: cancel them first' USING ERRCODE = 'PV400';
    END IF;
    EXECUTE format($f$
        WITH gone AS (
            DELETE FROM %1$I.jobs WHERE id IN (
                SELECT j.id FROM %1$I.jobs j
                 WHERE j.state = ANY ($1)
                   AND ($2::timestamptz IS NULL OR coalesce(j.completed_at, j.cancelled_at, j.created_at) < $2)
                 LIMIT $3
                 FOR UPDATE SKIP LOCKED)
            RETURNING id
        ), unindexed AS (
            -- Only ids clients gave have index rows.
            DELETE FROM s3p.job_index i USING gone WHERE i.id = gone.id
        )
        SELECT count(*) FROM gone $f$, own_schema)
        INTO removed USING states, older_than, batch;
    RETURN removed;
END
$$;

-- Puts a discarded or cancelled job back as available with its attempts reset (history kept);
-- conflict for any other state.
CREATE OR REPLACE FUNCTION s3p.admin_retry_job(wanted uuid) RETURNS SETOF s3p.job
LANGUAGE plpgsql AS $$
DECLARE
    outcome record;
BEGIN
    SELECT * INTO outcome FROM s3p.admin_act('retry', s3p.job_schema(wanted), ARRAY[wanted]);
    IF outcome.error IS NOT NULL THEN
        RAISE EXCEPTION '%', outcome.error USING ERRCODE = CASE WHEN outcome.error = 'job not found' THEN 'PV404' ELSE 'PV409' END;
    END IF;
    RETURN QUERY SELECT * FROM s3p.get_job(wanted);
END
$$;

-- A page of the workflows whose queues are all in `scope` (s3p.workflow_in_scope), newest first,
-- `skip` in, at most `take`, in `state` (NULL: any), each with its step counts; and how many
-- there are. The dashboard and the Admin API both list through it.
DROP FUNCTION IF EXISTS s3p.workflows_page(int, text[]);
CREATE OR REPLACE FUNCTION s3p.workflows_list(scope text[], wanted_state text, skip int, take int)
RETURNS TABLE (items jsonb, total bigint)
LANGUAGE sql STABLE AS $$
    WITH listed AS (
        SELECT w.* FROM s3p.workflows w
         WHERE (wanted_state IS NULL OR w.state = wanted_state) AND s3p.workflow_in_scope(w.id, scope)
    ), paged AS (
        SELECT * FROM listed ORDER BY created_at DESC, id OFFSET skip LIMIT take
    )
    SELECT (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'id', w.id, 'name', w.name, 'type', w.type, 'state', w.state,
                       'created_at', w.created_at, 'completed_at', w.completed_at,
                       'steps_total', (SELECT count(*) FROM s3p.workflow_steps s WHERE s.workflow_id = w.id),
                       'steps_completed', (SELECT count(*) FROM s3p.workflow_steps s
                                            WHERE s.workflow_id = w.id AND s.state = 'completed'))
                   ORDER BY w.created_at DESC, w.id), '[]')
              FROM paged w),
           (SELECT count(*) FROM listed)
$$;
