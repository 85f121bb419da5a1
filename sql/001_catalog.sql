-- pgvs3 catalog: the queue namespaces, the global job-id index and the per-queue schema template.
CREATE SCHEMA IF NOT EXISTS s3p;

-- One row per queue namespace; jobs and streams share it.
CREATE TABLE IF NOT EXISTS s3p.queues (
    name             text PRIMARY KEY,
    schema_name      text NOT NULL UNIQUE,
    template_version int  NOT NULL,
    paused           boolean NOT NULL DEFAULT false,
    settings         jsonb NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- The ids clients gave, whichever queue holds them (ids the server minted carry their queue's tag
-- instead: s3p.queue_id_tag); with those tags, ids are unique across queues (s3p.reserve_job_ids).
CREATE TABLE IF NOT EXISTS s3p.job_index (
    id    uuid PRIMARY KEY,
    queue text NOT NULL
);

-- Unique-job keys: which job holds each key (strong uniqueness, enforced under the key's row lock).
CREATE TABLE IF NOT EXISTS s3p.unique_keys (
    key        text PRIMARY KEY,
    job_id     uuid NOT NULL,
    queue      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS unique_keys_queue ON s3p.unique_keys (queue);

-- The SQL that builds a queue schema; `__SCHEMA__` stands for the quoted schema name.
CREATE TABLE IF NOT EXISTS s3p.queue_templates (
    version int PRIMARY KEY,
    body    text NOT NULL
);

-- The row type of every queue's jobs table (typed tables), so functions share one result type.
DO $$
BEGIN
    IF to_regtype('s3p.job') IS NULL THEN
        CREATE TYPE s3p.job AS (
            id                    uuid,
            queue                 text,
            type                  text,
            args                  jsonb,
            meta                  jsonb,
            extra                 jsonb,
            state                 text,
            previous_state        text,
            priority              int,
            attempt               int,
            max_attempts          int,
            timeout_ms            bigint,
            visibility_timeout_ms bigint,
            retry                 jsonb,
            uniq                  jsonb,
            tags                  jsonb,
            created_at            timestamptz,
            enqueued_at           timestamptz,
            scheduled_at          timestamptz,
            expires_at            timestamptz,
            started_at            timestamptz,
            completed_at          timestamptz,
            cancelled_at          timestamptz,
            run_at                timestamptz,
            lease_token           uuid,
            lease_expires_at      timestamptz,
            worker_id             text,
            result                jsonb,
            error                 jsonb,
            errors                jsonb,
            retry_delay_ms        bigint,
            seq                   bigint,
            unique_key            text,
            workflow_id           uuid,
            parent_results        jsonb
        );
    END IF;
END
$$;

-- The 24-bit tag a queue puts in the ids the server mints for its jobs (the first three bytes of
-- the SHA-256 of its name; model::job::mint_job_id computes the same), so that a minted id leads
-- to its queue without s3p.job_index. Immutable: a database's encoding never changes.
CREATE OR REPLACE FUNCTION s3p.queue_id_tag(queue text) RETURNS int
LANGUAGE sql IMMUTABLE AS $$
    SELECT (get_byte(d, 0) << 16) | (get_byte(d, 1) << 8) | get_byte(d, 2)
      FROM sha256(convert_to(queue, 'UTF8')) AS d
$$;

-- The tag an id carries in its last three bytes (meaningful for ids the server minted).
CREATE OR REPLACE FUNCTION s3p.job_id_tag(id uuid) RETURNS int
LANGUAGE sql IMMUTABLE AS $$
    SELECT (get_byte(b, 13) << 16) | (get_byte(b, 14) << 8) | get_byte(b, 15) FROM uuid_send(id) AS b
$$;

ALTER TABLE s3p.queues ADD COLUMN IF NOT EXISTS id_tag int GENERATED ALWAYS AS (s3p.queue_id_tag(name)) STORED;
CREATE INDEX IF NOT EXISTS queues_id_tag ON s3p.queues (id_tag);

-- Whether `queue` is in a token's scope: `patterns` are its queue patterns in SQL LIKE form
-- (model::access::Scope::like_patterns), NULL for every queue. A row without a queue is in no
-- token's scope.
CREATE OR REPLACE FUNCTION s3p.in_scope(queue text, patterns text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT patterns IS NULL OR coalesce(queue LIKE ANY (patterns), false)
$$;

-- Schema names hold only [a-z0-9._-] and stay within PostgreSQL's 63-byte identifier limit: a
-- long queue name, or one with other characters (a direct SQL caller may send any text), gets a
-- cleaned name with a hash suffix. So the template text never meets a quote or a dollar sign.
CREATE OR REPLACE FUNCTION s3p.schema_name_for(queue text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN queue ~ '^[a-z0-9][a-z0-9._-]*$' AND octet_length('s3q_' || queue) <= 63
                THEN 's3q_' || queue
                ELSE 's3q_' || left(regexp_replace(queue, '[^a-z0-9._-]', '_', 'g'), 50) || '_'
                     || left(md5(queue), 8) END
$$;

-- Creates (or upgrades in place) the schema of a queue and records it in the catalog.
CREATE OR REPLACE FUNCTION s3p.ensure_queue_schema(queue text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    current_schema_name text;
    current_version     int;
    latest_version      int;
    template            text;
BEGIN
    SELECT q.schema_name, q.template_version INTO current_schema_name, current_version
      FROM s3p.queues q WHERE q.name = queue;
    -- The version alone on the way of every enqueue: the body is tens of kB, stored compressed.
    SELECT max(t.version) INTO latest_version FROM s3p.queue_templates t;
    IF latest_version IS NULL THEN
        RAISE EXCEPTION 'no queue template installed' USING ERRCODE = 'PV500';
    END IF;
    IF current_schema_name IS NOT NULL AND current_version >= latest_version THEN
        RETURN current_schema_name;
    END IF;
    SELECT t.body INTO template FROM s3p.queue_templates t WHERE t.version = latest_version;

    -- A new namespace: one creator at a time (the server-wide quota, session setting
    -- s3p.max_queues, counts exactly), and that lock before the queue's own: a batch creating
    -- several queues, in whatever order, then never holds one queue's lock while it waits for
    -- the creators' lock another creator holds waiting for that queue.
    IF current_schema_name IS NULL THEN
        PERFORM pg_advisory_xact_lock(hashtext('s3p.queue_create'));
    END IF;
    -- Serialise creators of the same queue; re-read what a concurrent creator committed.
    PERFORM pg_advisory_xact_lock(hashtext('s3p.queue:' || queue));
    SELECT q.schema_name, q.template_version INTO current_schema_name, current_version
      FROM s3p.queues q WHERE q.name = queue;
    IF current_schema_name IS NOT NULL AND current_version >= latest_version THEN
        RETURN current_schema_name;
    END IF;

    IF current_schema_name IS NULL THEN
        -- Dropped since the first read: the creators' lock, late (left to the rerun if it
        -- deadlocks; a drop racing a create is rare).
        PERFORM pg_advisory_xact_lock(hashtext('s3p.queue_create'));
        IF coalesce(nullif(current_setting('s3p.max_queues', true), '')::bigint, 0) > 0
           AND (SELECT count(*) FROM s3p.queues) >= current_setting('s3p.max_queues', true)::bigint THEN
            RAISE EXCEPTION 'quota max_queues (%) reached: queue % was not created',
                current_setting('s3p.max_queues', true), queue
                USING ERRCODE = 'PV429', DETAIL = 'max_queues';
        END IF;
    END IF;
    current_schema_name := coalesce(current_schema_name, s3p.schema_name_for(queue));
    EXECUTE replace(template, '__SCHEMA__', quote_ident(current_schema_name));
    INSERT INTO s3p.queues (name, schema_name, template_version)
    VALUES (queue, current_schema_name, latest_version)
    ON CONFLICT (name) DO UPDATE SET template_version = excluded.template_version;
    RETURN current_schema_name;
END
$$;

-- Queue schemas are brought to the latest template by the server, one queue per transaction.
DROP FUNCTION IF EXISTS s3p.upgrade_queue_schemas();
