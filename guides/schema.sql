-- The disposable guide_app schema the guide works in: one order, its outbox and the worker receipts.
-- Dropped and recreated on every run; it holds demo data only.
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS guide_app CASCADE;
CREATE SCHEMA guide_app;

CREATE TABLE guide_app.orders (
    id bigint PRIMARY KEY,
    paid boolean NOT NULL DEFAULT false,
    fulfillment_count int NOT NULL DEFAULT 0
);
INSERT INTO guide_app.orders (id) VALUES (42);

-- From the guide, section 1.
CREATE TABLE guide_app.outbox (
    event_id UUID PRIMARY KEY,
    job JSONB NOT NULL CHECK (job ? 'id' AND job->>'id' = event_id::TEXT),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at TIMESTAMPTZ
);
CREATE INDEX outbox_unsent ON guide_app.outbox (created_at, event_id)
    WHERE published_at IS NULL;
CREATE TABLE guide_app.receipts (
    event_id UUID PRIMARY KEY,
    order_id BIGINT NOT NULL REFERENCES guide_app.orders(id)
);
