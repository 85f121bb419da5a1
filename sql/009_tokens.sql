-- API tokens: only a SHA-256 of each token is stored. Every gateway on the database reads the
-- same table and drops its cache when s3p_tokens is notified (a token created or revoked).

CREATE TABLE IF NOT EXISTS s3p.tokens (
    name        text PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE,
    roles       text[] NOT NULL,
    queues      text[] NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- Stores a new token; a revoked token's name may be used again, a live one's may not (PV409).
CREATE OR REPLACE FUNCTION s3p.token_create(p_name text, p_hash bytea, p_roles text[], p_queues text[])
RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
    v_created timestamptz;
BEGIN
    DELETE FROM s3p.tokens WHERE name = p_name AND revoked_at IS NOT NULL;
    INSERT INTO s3p.tokens (name, token_hash, roles, queues)
    VALUES (p_name, p_hash, p_roles, coalesce(p_queues, '{}'))
    ON CONFLICT (name) DO NOTHING
    RETURNING created_at INTO v_created;
    IF v_created IS NULL THEN
        RAISE EXCEPTION 'token % already exists', p_name USING ERRCODE = 'PV409';
    END IF;
    -- A new token can only be among the unknown hashes a cache holds: gateways forget those.
    PERFORM pg_notify('s3p_tokens', 'created:' || p_name);
    RETURN v_created;
END $$;

-- Revokes a live token by name; false when there is none.
CREATE OR REPLACE FUNCTION s3p.token_revoke(p_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE s3p.tokens SET revoked_at = now() WHERE name = p_name AND revoked_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('s3p_tokens', 'revoked:' || p_name);
    RETURN true;
END $$;
